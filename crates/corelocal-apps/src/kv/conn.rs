//! One memcached-protocol connection: lines, storage data, and the data of refused values.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corelocal::runtime::{CloseReason, ConnInfo, Handler, Next, Notifier, Output, Step};
use corelocal_proto::memcache::meta::{self as mp, MetaOp};
use corelocal_proto::memcache::{
    self, data_chunk_ok, expiry_unix, line_overflow, next_line, parse_line, write_line,
    write_value, Command, Overflow, StoreOp,
};

use super::admin::Auth;
use super::conns::{ConnState, Registration};
use super::meta::{write_ms_reply, MetaAnswer};
use super::store::{Arith, Now, Put, Stored};
use super::watch::{self, Watcher};
use super::{takeover, Inner};

/// A storage command line (text `set`… or meta `ms`), before its data.
struct StoreLine<'a> {
    op: StoreOp,
    key: &'a [u8],
    flags: u32,
    exptime: i32,
    bytes: usize,
    cas: u64,
    noreply: bool,
    invalidate: bool,
    /// `ms`: how to reply (`None`: the text protocol's STORED…).
    meta: Option<MetaAnswer>,
}

impl<'a> StoreLine<'a> {
    fn text(st: &memcache::Store<'a>) -> StoreLine<'a> {
        StoreLine {
            op: st.op,
            key: st.key,
            flags: st.flags,
            exptime: st.exptime,
            bytes: st.bytes,
            cas: st.cas,
            noreply: st.noreply,
            invalidate: false,
            meta: None,
        }
    }

    fn meta(req: &'a mp::MetaRequest<'_>) -> StoreLine<'a> {
        StoreLine {
            op: req.store_op,
            key: req.key.bytes(),
            flags: req.flags.client_flags,
            exptime: req.flags.ttl.unwrap_or(0),
            bytes: req.datalen,
            cas: req.flags.cas.unwrap_or(0),
            noreply: false,
            invalidate: req.flags.invalidate,
            meta: Some(MetaAnswer::new(req)),
        }
    }
}

/// A storage command whose data is still arriving.
struct Pending {
    op: StoreOp,
    key: Vec<u8>,
    flags: u32,
    exp: u64,
    cas: u64,
    noreply: bool,
    invalidate: bool,
    meta: Option<MetaAnswer>,
    /// Data plus its `\r\n` (capacity reserved up front: bounded by the item size limit).
    chunk: Vec<u8>,
    chunk_len: usize,
}

/// Where the connection is in the input stream.
enum State {
    /// Expecting a command line.
    Line,
    /// Reading a storage command's data.
    Data(Box<Pending>),
    /// Discarding the data of a refused (too large) value.
    Swallow(u64),
}

/// Per-connection state.
pub struct KvConn {
    inner: Arc<Inner>,
    state: State,
    /// The worker serving it (its byte counters).
    worker: usize,
    /// memcached `-Y`: where the connection is in the authentication exchange.
    auth: Auth,
    /// Over the connection limit (memcached `-c`): answered and closed at accept.
    rejected: bool,
    /// Its entry in `stats conns`.
    registration: Registration,
    /// When input last came (for counting idle kicks).
    last_input: Instant,
    /// A UDP endpoint's: each call runs one command, so that each command's reply goes out in
    /// its own message as memcached sends them (`udp`).
    one_command: bool,
    /// No byte of the request stream read yet (of the datagram, over UDP): the first one
    /// decides the protocol (memcached `-B`).
    at_start: bool,
    /// What `watch` needs to write without input (`None` over UDP and with `-W`).
    notifier: Option<Notifier>,
    /// Set by `watch`: the connection is a log stream from then on.
    watcher: Option<Arc<Watcher>>,
    /// Closed for a protocol error (`watch connevents`: `reason=error`).
    closed_for_error: bool,
}

impl KvConn {
    pub(super) fn new(
        inner: Arc<Inner>,
        info: &ConnInfo,
        rejected: bool,
        registration: Registration,
    ) -> KvConn {
        let inner_watch = inner.config.watch_enabled;
        let auth = if inner.config.auth.is_empty() {
            Auth::Done
        } else {
            Auth::Line
        };
        KvConn {
            inner,
            state: State::Line,
            worker: info.worker,
            auth,
            rejected,
            registration,
            last_input: info.now,
            one_command: false,
            at_start: true,
            notifier: if inner_watch { info.notifier() } else { None },
            watcher: None,
            closed_for_error: false,
        }
    }

    /// The engine of a UDP socket (`udp`): counted in `curr_connections` and listed in `stats
    /// conns` as memcached counts and lists its UDP connections, never refused, no
    /// authentication (UDP is refused with it), one command per [`Handler::on_input`].
    pub(super) fn udp(inner: Arc<Inner>, worker: usize, registration: Registration) -> KvConn {
        inner.curr_connections.fetch_add(1, Ordering::Relaxed);
        inner.total_connections.fetch_add(1, Ordering::Relaxed);
        KvConn {
            inner,
            state: State::Line,
            worker,
            auth: Auth::Done,
            rejected: false,
            registration,
            last_input: Instant::now(),
            one_command: true,
            at_start: true,
            notifier: None,
            watcher: None,
            closed_for_error: false,
        }
    }

    /// The end of a UDP request: a request is one datagram, so a storage command whose data
    /// did not all come in it is answered `CLIENT_ERROR bad data chunk` (unless `noreply`)
    /// and the discarding of a refused value ends; the next datagram starts with a command.
    pub(super) fn end_of_request(&mut self, out: &mut Output) {
        match std::mem::replace(&mut self.state, State::Line) {
            State::Data(p) => answer_store(
                out,
                ChunkResult::BadChunk,
                &p.key,
                p.noreply,
                p.meta.as_ref(),
            ),
            State::Line | State::Swallow(_) => {}
        }
        self.registration.set(ConnState::Read, None);
        // memcached negotiates each datagram's protocol by its first byte.
        self.at_start = true;
    }

    fn now(&self, now: Instant) -> Now {
        self.inner.now(now)
    }

    /// Handles a storage line; `after` is the input following it. Returns bytes consumed.
    fn begin_store(
        &mut self,
        st: StoreLine<'_>,
        after: &[u8],
        out: &mut Output,
        now: Now,
    ) -> usize {
        let store = &self.inner.store;
        let chunk_len = st.bytes + 2;
        if st.meta.is_none() && self.inner.stats.detail_on() {
            self.inner
                .stats
                .record_prefix(self.inner.config.prefix_delimiter, st.key, 2, false);
        }
        if store.too_large(st.key, st.flags, st.bytes) {
            store.count_too_large(st.key);
            // Meta commands always answer errors.
            reply(out, memcache::TOO_LARGE, st.noreply && st.meta.is_none());
            // memcached drops the old value of a failed set rather than leave it stale (`ms`:
            // whatever its mode).
            if st.op == StoreOp::Set || st.meta.is_some() {
                store.delete(st.key, now);
            }
            let taken = chunk_len.min(after.len());
            if taken < chunk_len {
                self.state = State::Swallow((chunk_len - taken) as u64);
            }
            return taken;
        }
        let exp = expiry_unix(st.exptime, now.unix, self.inner.started_unix);
        if after.len() >= chunk_len {
            let put = Put {
                op: st.op,
                key: st.key,
                flags: st.flags,
                exp,
                data: &after[..chunk_len],
                cas: self.inner.cas_of(st.cas),
                invalidate: st.invalidate,
                key_binary: st.meta.as_ref().is_some_and(|m| m.key_binary),
            };
            let r = watch::log_store(&self.inner, self.cfd(), put, st.meta.is_none(), now);
            answer_store(out, r, st.key, st.noreply, st.meta.as_ref());
            return chunk_len;
        }
        let mut chunk = Vec::with_capacity(chunk_len);
        chunk.extend_from_slice(after);
        self.state = State::Data(Box::new(Pending {
            op: st.op,
            key: st.key.to_vec(),
            flags: st.flags,
            exp,
            cas: self.inner.cas_of(st.cas),
            noreply: st.noreply,
            invalidate: st.invalidate,
            meta: st.meta,
            chunk,
            chunk_len,
        }));
        after.len()
    }

    /// Continues a Data or Swallow state; returns bytes consumed (the state is Line again once
    /// the data is complete).
    fn continue_data(&mut self, rest: &[u8], out: &mut Output, now: Now) -> usize {
        match &mut self.state {
            State::Line => 0,
            State::Swallow(left) => {
                let n = (*left).min(rest.len() as u64);
                *left -= n;
                if *left == 0 {
                    self.state = State::Line;
                }
                n as usize
            }
            State::Data(p) => {
                let n = (p.chunk_len - p.chunk.len()).min(rest.len());
                p.chunk.extend_from_slice(&rest[..n]);
                if p.chunk.len() == p.chunk_len {
                    let put = Put {
                        op: p.op,
                        key: &p.key,
                        flags: p.flags,
                        exp: p.exp,
                        data: &p.chunk,
                        cas: p.cas,
                        invalidate: p.invalidate,
                        key_binary: p.meta.as_ref().is_some_and(|m| m.key_binary),
                    };
                    let text = p.meta.is_none();
                    let cfd = self.registration.id();
                    let r = watch::log_store(&self.inner, cfd, put, text, now);
                    answer_store(out, r, &p.key, p.noreply, p.meta.as_ref());
                    self.state = State::Line;
                }
                n
            }
        }
    }

    /// A meta command line; `after` is the input following it (an `ms`'s data). Returns the
    /// bytes of `after` consumed.
    fn meta_line(
        &mut self,
        op: MetaOp,
        line: &[u8],
        after: &[u8],
        out: &mut Output,
        now: Now,
    ) -> usize {
        match mp::parse(op, line) {
            Err(e) => {
                write_line(out.bytes_mut(), e.reply);
                let taken = e.swallow.min(after.len());
                if taken < e.swallow {
                    self.state = State::Swallow((e.swallow - taken) as u64);
                }
                taken
            }
            Ok(req) if op == MetaOp::Set => {
                self.begin_store(StoreLine::meta(&req), after, out, now)
            }
            Ok(req) => {
                self.inner.meta(&req, out.bytes_mut(), now);
                0
            }
        }
    }

    fn execute(&self, cmd: Command<'_>, out: &mut Output, now: Now) {
        let inner = &self.inner;
        let store = &inner.store;
        match cmd {
            Command::Get { keys, cas, touch } => {
                let touch_exp = touch.map(|e| expiry_unix(e, now.unix, inner.started_unix));
                let buf = out.bytes_mut();
                let start = buf.len();
                let detail = inner.stats.detail_on();
                let log = inner.watch.wants(watch::FETCHERS);
                for key in keys {
                    let mut found = None;
                    let hit = store.get(key, now, touch_exp, |flags, value, unique| {
                        write_value(buf, key, flags, value, cas.then_some(unique));
                        if log {
                            found = Some((value.len(), store.class_of(key, flags, value)));
                        }
                    });
                    if log {
                        watch::log_get(inner, self.cfd(), key, found);
                    }
                    if detail {
                        inner
                            .stats
                            .record_prefix(inner.config.prefix_delimiter, key, 0, hit);
                    }
                    if (buf.len() - start) as u64 > inner.config.get_response_bytes_max {
                        buf.truncate(start);
                        write_line(buf, memcache::GET_TOO_LARGE);
                        return;
                    }
                }
                write_line(buf, "END");
            }
            Command::Store(_) => unreachable!("storage commands are handled by begin_store"),
            Command::Delete { key, noreply } => {
                if inner.stats.detail_on() {
                    inner
                        .stats
                        .record_prefix(inner.config.prefix_delimiter, key, 3, false);
                }
                let found = store.delete(key, now);
                reply(out, if found { "DELETED" } else { "NOT_FOUND" }, noreply);
            }
            Command::Arith {
                incr,
                key,
                delta,
                noreply,
            } => match store.arith(key, incr, delta, now) {
                Arith::Value(n) if !noreply => {
                    let _ = write!(out.bytes_mut(), "{n}\r\n");
                }
                Arith::Value(_) => {}
                Arith::NotFound => reply(out, "NOT_FOUND", noreply),
                Arith::NonNumeric => reply(out, memcache::NON_NUMERIC, noreply),
            },
            Command::Touch {
                key,
                exptime,
                noreply,
            } => {
                let exp = expiry_unix(exptime, now.unix, inner.started_unix);
                let found = store.touch(key, exp, now);
                reply(out, if found { "TOUCHED" } else { "NOT_FOUND" }, noreply);
            }
            Command::FlushAll { delay, noreply } => {
                inner.cmd_flush.fetch_add(1, Ordering::Relaxed);
                // memcached refuses a disabled flush_all before it looks at the delay.
                if !inner.config.flush_enabled {
                    reply(out, memcache::FLUSH_DISABLED, noreply);
                } else if let Some(delay) = delay {
                    inner.flush(delay, now);
                    reply(out, "OK", noreply);
                } else {
                    reply(out, memcache::BAD_EXPTIME, noreply);
                }
            }
            Command::Version => {
                write_line(out.bytes_mut(), &format!("VERSION {}", memcache::VERSION));
            }
            Command::CacheMemlimit { mb, noreply } => {
                inner.cache_memlimit(mb, noreply, out.bytes_mut())
            }
            Command::Watch { .. } => unreachable!("watch is handled by the input loop"),
            Command::Slabs { cmd, noreply } => {
                let reply = match cmd {
                    // We have no slab pages to move: memcached's reply when it may not.
                    memcache::Slabs::Reassign => "CLIENT_ERROR slab reassignment disabled",
                    // Kept for `stats settings`; nothing to move.
                    memcache::Slabs::Automove(level) => {
                        inner.stats.slab_automove.store(level, Ordering::Relaxed);
                        "OK"
                    }
                    memcache::Slabs::AutomoveRatio => "OK",
                    memcache::Slabs::Bad(reply) => reply,
                };
                reply_str(out, reply, noreply);
            }
            Command::DebugTime(delta) => {
                // Forward only: our clock is monotonic.
                let reply = match delta {
                    Some(d) if inner.config.debug_time && d >= 0 => {
                        inner
                            .stats
                            .time_offset
                            .fetch_add(d as u64, Ordering::Relaxed);
                        "OK"
                    }
                    _ => "ERROR",
                };
                write_line(out.bytes_mut(), reply);
            }
            Command::RefreshCerts => inner.refresh_certs(out.bytes_mut()),
            Command::Shutdown(_) | Command::LruCrawler(_) => {
                unreachable!("handled by the input loop")
            }
            Command::Verbosity { level, noreply } => {
                // memcached caps it at its MAX_VERBOSITY_LEVEL, 2; we print nothing more for
                // it, but report it in `stats settings`.
                inner.stats.verbosity.store(level.min(2), Ordering::Relaxed);
                reply(out, "OK", noreply);
            }
            Command::Stats(which) => {
                if matches!(which, memcache::Stats::Conns) {
                    // The asking connection is listed as running a command.
                    self.registration.set(ConnState::ParseCmd, Some(now.unix));
                }
                inner.stats(which, out.bytes_mut(), now)
            }
            Command::MetaNoop => write_line(out.bytes_mut(), "MN"),
            Command::Meta { .. } => unreachable!("meta commands are handled by meta_line"),
            Command::Quit | Command::CrossProtocol => {}
        }
    }
}

/// Writes a reply line unless `noreply` was given.
fn reply_str(out: &mut Output, line: &str, noreply: bool) {
    if !noreply {
        write_line(out.bytes_mut(), line);
    }
}

/// Writes a reply line unless `noreply` was given.
fn reply(out: &mut Output, line: impl Into<&'static str>, noreply: bool) {
    if !noreply {
        write_line(out.bytes_mut(), line.into());
    }
}

impl From<Stored> for &'static str {
    fn from(s: Stored) -> &'static str {
        match s {
            Stored::Stored => "STORED",
            Stored::NotStored => "NOT_STORED",
            Stored::Exists => "EXISTS",
            Stored::NotFound => "NOT_FOUND",
            Stored::NoMemory => memcache::OUT_OF_MEMORY,
        }
    }
}

/// What a complete data chunk yields: a store outcome (and the new CAS unique), or a bad
/// chunk.
pub(super) enum ChunkResult {
    Stored(Stored, u64),
    BadChunk,
}

/// Answers a storage command: the text protocol's line (unless `noreply`), or `ms`'s reply.
fn answer_store(
    out: &mut Output,
    r: ChunkResult,
    key: &[u8],
    noreply: bool,
    meta: Option<&MetaAnswer>,
) {
    match meta {
        None => reply(out, r, noreply),
        Some(m) => {
            let (result, cas) = match r {
                ChunkResult::Stored(s, cas) => (Ok(s), cas),
                ChunkResult::BadChunk => (Err(memcache::BAD_CHUNK), 0),
            };
            write_ms_reply(out.bytes_mut(), result, cas, key, m);
        }
    }
}

impl From<ChunkResult> for &'static str {
    fn from(r: ChunkResult) -> &'static str {
        match r {
            ChunkResult::Stored(s, _) => s.into(),
            ChunkResult::BadChunk => memcache::BAD_CHUNK,
        }
    }
}

impl Inner {
    /// The unique a `cas` command compares: 0 when CAS is off (memcached `-C` keeps none, so
    /// the command's number is dropped and compared as 0 against the item's 0).
    fn cas_of(&self, cas: u64) -> u64 {
        if self.config.cas_enabled {
            cas
        } else {
            0
        }
    }

    /// Stores a complete chunk: `put.data` is the data plus its `\r\n`.
    pub(super) fn store_chunk(&self, mut put: Put<'_>, now: Now) -> ChunkResult {
        if !data_chunk_ok(put.data) {
            return ChunkResult::BadChunk;
        }
        put.data = &put.data[..put.data.len() - 2];
        let (stored, cas) = self.store.store_cas(&put, now);
        ChunkResult::Stored(stored, cas)
    }

    fn flush(&self, delay: i32, now: Now) {
        let at = if delay <= 0 {
            now.unix
        } else {
            expiry_unix(delay, now.unix, self.started_unix).max(now.unix)
        };
        self.stats.oldest_unix.store(at, Ordering::Relaxed);
        if !self.config.cas_enabled {
            // memcached -C: items stored in or before the flush's second die once that second
            // has come; there are no uniques to tell apart those stored just after the flush.
            let second = if delay <= 0 {
                now.unix
            } else {
                expiry_unix(delay, now.unix, self.started_unix).max(now.unix)
            };
            if delay <= 0 {
                self.store.flush(None);
            }
            self.store.flush(Some(self.second_start_ns(second).max(1)));
            return;
        }
        if delay <= 0 {
            self.store.flush(None);
            return;
        }
        let at_unix = expiry_unix(delay, now.unix, self.started_unix);
        match at_unix.checked_sub(now.unix) {
            Some(secs) if secs > 0 => {
                let at_ns = now.ns.saturating_add(secs.saturating_mul(1_000_000_000));
                self.store.flush(Some(at_ns));
            }
            _ => self.store.flush(None),
        }
    }
}

impl Handler for KvConn {
    fn on_input(&mut self, input: &[u8], out: &mut Output, now: Instant) -> Step {
        let before = out.total_len();
        self.last_input = now;
        // Read once per call, for the commands and for `stats conns`.
        let now = self.now(now);
        let step = self.input(input, out, now);
        if matches!(step.next, Next::Close(r) if r != CloseReason::Done) {
            self.closed_for_error = true;
        }
        let written = out.total_len().saturating_sub(before);
        self.inner
            .stats
            .count_io(self.worker, step.consumed as u64, written);
        let state = match self.state {
            State::Line => ConnState::Read,
            State::Data(_) => ConnState::Nread,
            State::Swallow(_) => ConnState::Swallow,
        };
        let command_at = (step.requests > 0).then_some(now.unix);
        self.registration.set(state, command_at);
        step
    }

    fn handoff(&self) -> Option<Vec<u8>> {
        // A storage command's data (or a refused one's) is half in this state, half still on
        // its way: wait until it is whole.
        if !matches!(self.state, State::Line) {
            return None;
        }
        let auth_configured = !self.inner.config.auth.is_empty();
        Some(takeover::conn_state(self.auth, auth_configured))
    }

    fn on_notify(&mut self, out: &mut Output, _now: Instant) -> Next {
        if let Some(w) = &self.watcher {
            w.drain_into(out);
        }
        Next::Read
    }

    fn on_connect(&mut self, out: &mut Output, _now: Instant) -> Next {
        if self.rejected {
            // memcached's answer at accept, then the close.
            out.write(b"ERROR Too many open connections\r\n");
            return Next::Close(CloseReason::Done);
        }
        Next::Read
    }
}

impl KvConn {
    /// memcached's `cfd`: the connection's number in `stats conns`.
    pub(super) fn cfd(&self) -> u64 {
        self.registration.id()
    }

    /// `watch connevents`: a new connection (one a worker serves).
    pub(super) fn log_connect(&self) {
        if self.notifier.is_some() && self.inner.watch.wants(watch::CONNEVENTS) {
            let peer = self.registration.peer();
            watch::log_conn(&self.inner, "conn_new", peer, self.cfd(), false);
        }
    }

    /// `watch …`: whether the connection became a watcher (its `OK` comes through the log
    /// stream, as memcached's).
    fn start_watch(&mut self, noreply: bool, events: Option<u8>, out: &mut Output) -> bool {
        let Some(notifier) = self.notifier.clone() else {
            reply(out, "CLIENT_ERROR watch commands not allowed", noreply);
            return false;
        };
        if out.total_len() > 0 {
            reply(
                out,
                "ERROR cannot pipeline other commands before watch",
                noreply,
            );
            return false;
        }
        let Some(events) = events else {
            reply(out, "ERROR", noreply);
            return false;
        };
        match self.inner.watch.add(events, notifier) {
            Ok(w) => {
                self.watcher = Some(w);
                true
            }
            Err(watch::Refused::TooMany) => {
                reply(out, "WATCHER_TOO_MANY log watcher limit reached", noreply);
                false
            }
        }
    }

    /// Picks up what the predecessor's connection handed over ([`Handler::handoff`]).
    pub(super) fn resume(&mut self, state: &[u8]) {
        if let Some(auth) = takeover::resumed_auth(state, &self.inner) {
            self.auth = auth;
        }
        // Its protocol was settled by the predecessor.
        self.at_start = false;
    }
}

impl KvConn {
    fn input(&mut self, input: &[u8], out: &mut Output, now: Now) -> Step {
        if self.rejected {
            // Answered at accept (`on_connect`); nothing more is read.
            return Step::close(input.len(), 0, CloseReason::Done);
        }
        if self.watcher.is_some() {
            // memcached stops reading a watcher's commands.
            return Step::read(input.len(), 0);
        }
        if self.at_start && !input.is_empty() {
            self.at_start = false;
            if self.inner.config.protocol.refuses(input[0]) {
                // A binary request (or, with `-B binary`, any): no protocol here to answer
                // it in, so the connection is closed without a reply, as memcached closes one
                // that speaks the protocol it was not started with.
                return Step::close(input.len(), 0, CloseReason::BadRequest);
            }
        }
        let limits = self.inner.config.limits;
        let mut consumed = 0;
        let mut requests = 0;
        while self.auth != Auth::Done {
            let (n, close) =
                self.inner
                    .authenticate(&mut self.auth, &input[consumed..], out.bytes_mut());
            if close {
                return Step::close(input.len(), requests, CloseReason::TooLarge);
            }
            if n == 0 {
                return Step::read(consumed, requests);
            }
            consumed += n;
            requests += 1;
        }
        loop {
            consumed += self.continue_data(&input[consumed..], out, now);
            let rest = &input[consumed..];
            if !matches!(self.state, State::Line) || rest.is_empty() {
                return Step::read(consumed, requests);
            }
            if requests >= self.inner.config.report.reqs_per_event {
                // memcached's `-R`: the rest waits for the worker's next turn.
                self.inner.stats.conn_yields.fetch_add(1, Ordering::Relaxed);
                return Step::yielded(consumed, requests);
            }
            // Back-pressure: leave further pipelined commands in the input until output drains.
            if out.total_len() >= self.inner.config.output_bytes_max || out.room() == 0 {
                return Step::read(consumed, requests);
            }
            let Some((line, n)) = next_line(rest) else {
                match line_overflow(rest, &limits) {
                    None => return Step::read(consumed, requests),
                    // A line that cannot be a command: memcached closes without a reply too.
                    Some(Overflow::Hangup) => {}
                    // A multiget over our limit (memcached's is its memory): say so, as
                    // memcached does when its read buffer cannot grow, rather than vanish.
                    Some(Overflow::TooLarge) => {
                        write_line(out.bytes_mut(), memcache::READ_TOO_LARGE)
                    }
                }
                return Step::close(input.len(), requests, CloseReason::TooLarge);
            };
            consumed += n;
            requests += 1;
            match parse_line(line) {
                Err(r) => {
                    if !r.silent {
                        write_line(out.bytes_mut(), r.reply);
                    }
                }
                // What follows `quit` stays unconsumed: the close then lingers, so the
                // answers before it reach a client that pipelined more behind it.
                Ok(Command::Quit) => return Step::close(consumed, requests, CloseReason::Done),
                Ok(Command::CrossProtocol) => {
                    return Step::close(input.len(), requests, CloseReason::BadRequest);
                }
                Ok(Command::Store(st)) => {
                    consumed +=
                        self.begin_store(StoreLine::text(&st), &input[consumed..], out, now);
                }
                Ok(Command::Meta { op, line }) => {
                    consumed += self.meta_line(op, line, &input[consumed..], out, now);
                }
                Ok(Command::Shutdown(mode)) => {
                    if self.inner.shutdown(mode, out.bytes_mut()) {
                        return Step::close(input.len(), requests, CloseReason::Done);
                    }
                }
                Ok(Command::Watch { noreply, events }) => {
                    if self.start_watch(noreply, events, out) {
                        // A log stream from now on: what follows is not read.
                        return Step::read(input.len(), requests);
                    }
                }
                Ok(Command::LruCrawler(c)) => {
                    let pipelined = out.total_len() > 0;
                    self.inner.lru_crawler(c, out.bytes_mut(), now, pipelined);
                }
                Ok(cmd) => self.execute(cmd, out, now),
            }
            if self.one_command {
                return Step::read(consumed, requests);
            }
        }
    }
}

impl Drop for KvConn {
    fn drop(&mut self) {
        if let Some(w) = self.watcher.take() {
            self.inner.watch.remove(&w);
        }
        if self.notifier.is_some() && self.inner.watch.wants(watch::CONNEVENTS) {
            let error = self.closed_for_error;
            let peer = self.registration.peer();
            watch::log_conn(&self.inner, "conn_close", peer, self.cfd(), error);
        }
        self.inner.curr_connections.fetch_sub(1, Ordering::Relaxed);
        self.inner.conns.remove(&self.registration);
        let idle = self.inner.config.report.idle_timeout_secs;
        // A connection closed after at least the idle timeout without input was closed for
        // it (memcached's idle_kicks); the clock is read only when the stat is reported.
        if idle > 0 && self.last_input.elapsed() >= Duration::from_secs(idle) {
            self.inner.stats.idle_kicks.fetch_add(1, Ordering::Relaxed);
        }
    }
}
