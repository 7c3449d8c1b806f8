//! Workload scripts, sans-IO: what one client session sends and when.
//!
//! The engine calls [`Script::next`] when a session starts and after every completed
//! response; the script appends the request bytes and pushes the parsers of the responses it
//! expects, and answers what to do next ([`Step`]).

use crate::proto::{self, KvExpect, KvParser, Parser, RpcParser, SockperfParser};
use std::collections::VecDeque;
use std::sync::Arc;

/// A small, fast, seeded PRNG (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Where a step's request goes and what it expects.
pub struct StepIo<'a> {
    /// Request bytes to send are appended here.
    pub out: &'a mut Vec<u8>,
    /// One parser per expected response, in order.
    pub expect: &'a mut VecDeque<Parser>,
    /// The session's random source.
    pub rng: &'a mut Rng,
}

/// What a session does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send what was appended to `out` (connecting first if not connected) and await the
    /// responses pushed to `expect`.
    Send,
    /// Wait this many nanoseconds, then ask again.
    Think(u64),
    /// Close this connection (the session goes on: ask again).
    Disconnect,
    /// The session is over: the client closes the connection.
    Close,
    /// The session is over once the server closes the connection (await EOF).
    AwaitClose,
}

/// One session's behaviour.
pub trait Script: Send {
    /// The next step; called at session start and whenever every expected response is complete.
    fn next(&mut self, io: StepIo<'_>) -> Step;
    /// Resets to the start of a new session.
    fn reset(&mut self);
}

/// Which side closes a connection at the end of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
pub enum CloseBy {
    /// The client closes right after the last response (like crr_client and wrk).
    Client,
    /// The client waits for the server's FIN, then closes.
    Server,
}

/// Response shape of a [`FixedScript`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Exactly this many bytes (RPC).
    Fixed(usize),
    /// An HTTP response.
    Http,
}

/// The same request `txns` times on one connection, then close (rpc, crr, http keep-alive).
#[derive(Debug, Clone)]
pub struct FixedScript {
    req: Arc<[u8]>,
    reply: Reply,
    per_conn: PerConn,
}

/// Transactions on one connection, then who closes it: what every request/response script
/// counts the same way.
#[derive(Debug, Clone, Copy)]
struct PerConn {
    /// 0: never close.
    txns: u64,
    done: u64,
    close: CloseBy,
}

impl PerConn {
    fn new(txns: u64, close: CloseBy) -> PerConn {
        PerConn {
            txns,
            done: 0,
            close,
        }
    }

    /// The number of the next transaction (from 1), or the step that ends the connection.
    fn next_txn(&mut self) -> Result<u64, Step> {
        if self.txns > 0 && self.done >= self.txns {
            return Err(match self.close {
                CloseBy::Client => Step::Close,
                CloseBy::Server => Step::AwaitClose,
            });
        }
        self.done += 1;
        Ok(self.done)
    }
}

impl FixedScript {
    /// `txns` = 0: never close.
    pub fn new(req: Arc<[u8]>, reply: Reply, txns: u64, close: CloseBy) -> Self {
        FixedScript {
            req,
            reply,
            per_conn: PerConn::new(txns, close),
        }
    }
}

impl Script for FixedScript {
    fn next(&mut self, io: StepIo<'_>) -> Step {
        if let Err(end) = self.per_conn.next_txn() {
            return end;
        }
        io.out.extend_from_slice(&self.req);
        io.expect.push_back(match self.reply {
            Reply::Fixed(n) => Parser::Rpc(RpcParser::new(n)),
            Reply::Http => Parser::Http(proto::HttpParser::new()),
        });
        Step::Send
    }

    fn reset(&mut self) {
        self.per_conn.done = 0;
    }
}

/// sockperf ping-pong: `txns` messages of `len` bytes on one connection, sequence numbers
/// 1, 2, … (as `sockperf ping-pong --tcp -m LEN` sends), each awaiting its pong; then close.
#[derive(Debug, Clone)]
pub struct SockperfScript {
    template: Arc<[u8]>,
    per_conn: PerConn,
}

impl SockperfScript {
    /// `len` bytes per message, header included (clamped to sockperf's 14..=65,507); `txns` = 0:
    /// never close.
    pub fn new(len: usize, txns: u64, close: CloseBy) -> Self {
        let mut template = Vec::new();
        corelocal_proto::sockperf::encode_request(0, len, true, &mut template);
        SockperfScript {
            template: template.into(),
            per_conn: PerConn::new(txns, close),
        }
    }
}

impl Script for SockperfScript {
    fn next(&mut self, io: StepIo<'_>) -> Step {
        let seq = match self.per_conn.next_txn() {
            Ok(seq) => seq,
            Err(end) => return end,
        };
        let at = io.out.len();
        io.out.extend_from_slice(&self.template);
        io.out[at..at + 8].copy_from_slice(&seq.to_be_bytes());
        io.expect.push_back(Parser::Sockperf(SockperfParser::new(
            seq,
            self.template.len(),
        )));
        Step::Send
    }

    fn reset(&mut self) {
        self.per_conn.done = 0;
    }
}

/// httperf-style session: bursts of requests separated by think time (Affinity-Accept §6.2:
/// bursts 1,2,3 with 100 ms think = 6 files per connection).
#[derive(Debug, Clone)]
pub struct HttpSession {
    host: Arc<str>,
    urls: Arc<[String]>,
    bursts: Arc<[u32]>,
    think_ns: u64,
    keep_alive: bool,
    pipeline: bool,
    burst: usize,
    sent: u32,
    done: u32,
    thought: bool,
    used_conn: bool,
}

impl HttpSession {
    /// A session over `urls` (paths), chosen uniformly at random.
    pub fn new(
        host: Arc<str>,
        urls: Arc<[String]>,
        bursts: Arc<[u32]>,
        think_ns: u64,
        keep_alive: bool,
        pipeline: bool,
    ) -> Self {
        HttpSession {
            host,
            urls,
            bursts,
            think_ns,
            keep_alive,
            pipeline,
            burst: 0,
            sent: 0,
            done: 0,
            thought: true,
            used_conn: false,
        }
    }

    /// Requests in one session.
    pub fn requests_per_session(bursts: &[u32]) -> u64 {
        bursts.iter().map(|&b| b as u64).sum()
    }
}

impl Script for HttpSession {
    fn next(&mut self, io: StepIo<'_>) -> Step {
        // The engine asks only when every expected response is complete.
        self.done = self.sent;
        loop {
            let Some(&size) = self.bursts.get(self.burst) else {
                return if self.keep_alive {
                    Step::Close
                } else {
                    Step::AwaitClose
                };
            };
            if self.done >= size {
                self.burst += 1;
                self.sent = 0;
                self.done = 0;
                self.thought = false;
                if self.burst >= self.bursts.len() {
                    continue;
                }
                if !self.keep_alive && self.used_conn {
                    self.used_conn = false;
                    return Step::Disconnect;
                }
                continue;
            }
            if !self.thought {
                self.thought = true;
                if self.think_ns > 0 {
                    return Step::Think(self.think_ns);
                }
            }
            if !self.keep_alive && self.used_conn {
                self.used_conn = false;
                return Step::Disconnect;
            }
            let n = if self.pipeline && self.keep_alive {
                size - self.sent
            } else {
                1
            };
            for _ in 0..n {
                let path = &self.urls[io.rng.below(self.urls.len() as u64) as usize];
                io.out
                    .extend_from_slice(&proto::http_get(&self.host, path, self.keep_alive));
                io.expect.push_back(Parser::Http(proto::HttpParser::new()));
            }
            self.sent += n;
            self.used_conn = true;
            return Step::Send;
        }
    }

    fn reset(&mut self) {
        self.burst = 0;
        self.sent = 0;
        self.done = 0;
        self.thought = true;
        self.used_conn = false;
    }
}

/// memcached get/set mix over a key space.
#[derive(Debug, Clone)]
pub struct KvScript {
    keys: u64,
    get_ratio: f64,
    value_size: usize,
    prefix: Arc<str>,
    per_conn: PerConn,
    dialect: KvDialect,
}

/// Which request language a kv client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDialect {
    /// memcached's text protocol: `get`/`set`.
    #[default]
    Text,
    /// memcached's meta protocol: `mg <key> v`/`ms <key> <len>`.
    Meta,
    /// The line protocol of corelocal's `kv` example (`crates/corelocal/examples/kv.rs`):
    /// `GET key` / `SET key value`, one answer line each.
    Line,
}

impl KvScript {
    /// `txns` per connection (0: never close).
    pub fn new(keys: u64, get_ratio: f64, value_size: usize, prefix: Arc<str>, txns: u64) -> Self {
        KvScript {
            keys: keys.max(1),
            get_ratio,
            value_size,
            prefix,
            per_conn: PerConn::new(txns, CloseBy::Client),
            dialect: KvDialect::Text,
        }
    }

    /// Speaks `dialect` instead of memcached's text protocol.
    pub fn with_dialect(mut self, dialect: KvDialect) -> Self {
        self.dialect = dialect;
        self
    }
}

impl Script for KvScript {
    fn next(&mut self, io: StepIo<'_>) -> Step {
        if let Err(end) = self.per_conn.next_txn() {
            return end;
        }
        let key = format!("{}{}", self.prefix, io.rng.below(self.keys));
        let get = io.rng.unit() < self.get_ratio;
        let (request, expect) = match (get, self.dialect) {
            (true, KvDialect::Text) => (proto::kv_get(&key), KvExpect::Get),
            (false, KvDialect::Text) => (proto::kv_set(&key, self.value_size), KvExpect::Store),
            (true, KvDialect::Meta) => (proto::kv_mg(&key), KvExpect::MetaGet),
            (false, KvDialect::Meta) => (proto::kv_ms(&key, self.value_size), KvExpect::MetaStore),
            (true, KvDialect::Line) => (proto::kv_line_get(&key), KvExpect::LineGet),
            (false, KvDialect::Line) => (
                proto::kv_line_set(&key, self.value_size),
                KvExpect::LineStore,
            ),
        };
        io.out.extend_from_slice(&request);
        io.expect.push_back(Parser::Kv(KvParser::new(expect)));
        Step::Send
    }

    fn reset(&mut self) {
        self.per_conn.done = 0;
    }
}

/// Open-loop arrival process: the intended start times of units of work.
#[derive(Debug, Clone)]
pub struct Arrivals {
    next_ns: u64,
    mean_gap_ns: f64,
    exponential: bool,
    rng: Rng,
}

impl Arrivals {
    /// `rate` arrivals per second from `start_ns`, evenly spaced or Poisson (exponential gaps).
    pub fn new(rate: f64, exponential: bool, start_ns: u64, seed: u64) -> Self {
        let mut a = Arrivals {
            next_ns: start_ns,
            mean_gap_ns: 1e9 / rate.max(1e-9),
            exponential,
            rng: Rng::new(seed),
        };
        a.next_ns += a.gap();
        a
    }

    fn gap(&mut self) -> u64 {
        if self.exponential {
            (-(1.0 - self.rng.unit()).ln() * self.mean_gap_ns) as u64
        } else {
            self.mean_gap_ns as u64
        }
    }

    /// The next intended time (may be in the past: a backlog).
    pub fn peek(&self) -> u64 {
        self.next_ns
    }

    /// Takes the next arrival if it is due at `now`.
    pub fn take_due(&mut self, now: u64) -> Option<u64> {
        if self.next_ns <= now {
            let t = self.next_ns;
            self.next_ns += self.gap().max(1);
            Some(t)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(script: &mut dyn Script, limit: usize) -> Vec<(Step, usize)> {
        let mut out = Vec::new();
        let mut expect = VecDeque::new();
        let mut rng = Rng::new(1);
        let mut steps = Vec::new();
        for _ in 0..limit {
            let s = script.next(StepIo {
                out: &mut out,
                expect: &mut expect,
                rng: &mut rng,
            });
            steps.push((s, expect.len()));
            // the engine completes every expected response before asking again
            expect.clear();
            out.clear();
            if matches!(s, Step::Close | Step::AwaitClose) {
                break;
            }
        }
        steps
    }

    #[test]
    fn fixed_script_counts_then_closes() {
        let mut s = FixedScript::new(
            proto::rpc_request(64).into(),
            Reply::Fixed(64),
            3,
            CloseBy::Client,
        );
        let steps = run(&mut s, 10);
        assert_eq!(
            steps,
            vec![
                (Step::Send, 1),
                (Step::Send, 1),
                (Step::Send, 1),
                (Step::Close, 0)
            ]
        );
        s.reset();
        assert_eq!(run(&mut s, 10).len(), 4);
        let mut s = FixedScript::new(
            proto::rpc_request(8).into(),
            Reply::Fixed(8),
            1,
            CloseBy::Server,
        );
        assert_eq!(
            run(&mut s, 10),
            vec![(Step::Send, 1), (Step::AwaitClose, 0)]
        );
        let mut s = FixedScript::new(
            proto::rpc_request(8).into(),
            Reply::Fixed(8),
            0,
            CloseBy::Client,
        );
        assert!(run(&mut s, 100).iter().all(|s| s.0 == Step::Send));
    }

    fn session(keep_alive: bool, pipeline: bool) -> HttpSession {
        HttpSession::new(
            "h".into(),
            vec!["/a".to_string(), "/b".to_string()].into(),
            vec![1, 2, 3].into(),
            100_000_000,
            keep_alive,
            pipeline,
        )
    }

    #[test]
    fn http_session_keep_alive_is_six_requests_two_thinks() {
        let steps = run(&mut session(true, false), 50);
        let t = Step::Think(100_000_000);
        let s = (Step::Send, 1);
        assert_eq!(
            steps,
            vec![s, (t, 0), s, s, (t, 0), s, s, s, (Step::Close, 0)]
        );
        assert_eq!(HttpSession::requests_per_session(&[1, 2, 3]), 6);
    }

    #[test]
    fn http_session_close_mode_reconnects_per_request() {
        let steps = run(&mut session(false, false), 50);
        let sends = steps.iter().filter(|s| s.0 == Step::Send).count();
        let disc = steps.iter().filter(|s| s.0 == Step::Disconnect).count();
        let thinks = steps
            .iter()
            .filter(|s| matches!(s.0, Step::Think(_)))
            .count();
        assert_eq!((sends, disc, thinks), (6, 5, 2));
        assert_eq!(steps.last().unwrap().0, Step::AwaitClose);
    }

    #[test]
    fn http_session_pipelined_bursts() {
        let mut s = session(true, true);
        let mut out = Vec::new();
        let mut expect = VecDeque::new();
        let mut rng = Rng::new(1);
        let mut io = || {
            let st = s.next(StepIo {
                out: &mut out,
                expect: &mut expect,
                rng: &mut rng,
            });
            (st, expect.len())
        };
        assert_eq!(io(), (Step::Send, 1));
        assert_eq!(io().0, Step::Think(100_000_000));
        assert_eq!(io(), (Step::Send, 3)); // 1 old (not cleared here) + 2 pipelined
    }

    #[test]
    fn sockperf_script_numbers_messages_from_one_per_connection() {
        use corelocal_proto::sockperf::Header;
        let mut s = SockperfScript::new(64, 3, CloseBy::Client);
        let (mut out, mut expect, mut rng) = (Vec::new(), VecDeque::new(), Rng::new(1));
        let mut seqs = Vec::new();
        for _ in 0..4 {
            let step = s.next(StepIo {
                out: &mut out,
                expect: &mut expect,
                rng: &mut rng,
            });
            if step == Step::Send {
                let h = Header::decode(out[out.len() - 64..][..14].try_into().unwrap());
                assert_eq!((h.flags, h.len), (3, 64));
                seqs.push(h.seq);
            } else {
                assert_eq!(step, Step::Close);
            }
        }
        assert_eq!((seqs, out.len(), expect.len()), (vec![1, 2, 3], 192, 3));
        s.reset();
        out.clear();
        s.next(StepIo {
            out: &mut out,
            expect: &mut expect,
            rng: &mut rng,
        });
        assert_eq!(out[..8], 1u64.to_be_bytes());
        assert_eq!(
            SockperfScript::new(3, 0, CloseBy::Client).template.len(),
            14
        );
    }

    #[test]
    fn kv_mix_follows_ratio() {
        let mut s = KvScript::new(100, 0.9, 10, "k".into(), 0);
        let mut out = Vec::new();
        let mut expect = VecDeque::new();
        let mut rng = Rng::new(7);
        let mut gets = 0;
        for _ in 0..10_000 {
            s.next(StepIo {
                out: &mut out,
                expect: &mut expect,
                rng: &mut rng,
            });
            if out.starts_with(b"get ") {
                gets += 1;
            }
            out.clear();
            expect.clear();
        }
        assert!((8_700..9_300).contains(&gets), "{gets}");
    }

    #[test]
    fn arrivals_deterministic_and_poisson_rates() {
        let mut a = Arrivals::new(1000.0, false, 0, 1);
        let n = (0..)
            .take_while(|_| a.take_due(1_000_000_000).is_some())
            .count();
        assert_eq!(n, 1000);
        let mut a = Arrivals::new(1000.0, true, 0, 1);
        let n = (0..)
            .take_while(|_| a.take_due(10_000_000_000).is_some())
            .count();
        assert!((9_500..10_500).contains(&n), "{n}");
        assert!(a.peek() > 10_000_000_000);
    }

    #[test]
    fn rng_below_is_in_range() {
        let mut r = Rng::new(3);
        assert!((0..1000).all(|_| r.below(7) < 7));
    }
}
