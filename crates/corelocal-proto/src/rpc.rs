//! MegaPipe's RPC microbenchmark protocol (seed 001 §2.2), sans-IO.
//!
//! The client sends requests of exactly `request_bytes`; for each whole request the server
//! answers `response_bytes`: `response_bytes - 1` bytes of `x` then `\n`, so line-oriented
//! clients (and `shared/tools/rr_client` with terminator `\n`) can find the end. Keep-alive
//! repeats; in one-shot mode (the connection-rate services of seed 004) the server answers one
//! request and closes, and any byte past that request is an oversized request.

/// Message sizes and mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcConfig {
    /// Bytes per request (≥ 1).
    pub request_bytes: usize,
    /// Bytes per response (≥ 1).
    pub response_bytes: usize,
    /// Close after the first response.
    pub one_shot: bool,
}

impl RpcConfig {
    /// Checks sizes are usable.
    pub fn validate(&self) -> Result<(), String> {
        if self.request_bytes == 0 || self.response_bytes == 0 {
            return Err("request and response sizes must be at least 1 byte".into());
        }
        Ok(())
    }

    /// The response every request gets.
    pub fn response(&self) -> Vec<u8> {
        let mut r = vec![b'x'; self.response_bytes];
        if let Some(last) = r.last_mut() {
            *last = b'\n';
        }
        r
    }
}

/// What feeding input produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// Bytes consumed (always all of them unless `violation` is set).
    pub consumed: usize,
    /// Whole requests completed: send that many responses.
    pub responses: u32,
    /// The connection is done (one-shot answered).
    pub done: bool,
    /// The client broke the protocol.
    pub violation: Option<Violation>,
}

/// A protocol violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// More bytes than one request on a one-shot connection.
    Oversized,
}

/// One connection's parser state.
#[derive(Debug, Clone)]
pub struct RpcState {
    config: RpcConfig,
    partial_bytes: usize,
    answered: u64,
}

impl RpcState {
    /// A new connection.
    pub fn new(config: RpcConfig) -> RpcState {
        assert!(config.validate().is_ok(), "invalid RPC config");
        RpcState {
            config,
            partial_bytes: 0,
            answered: 0,
        }
    }

    /// What a connection carries between reads: bytes of a request not complete yet, and
    /// requests answered (one-shot mode answers one). A binary upgrade moves them with the
    /// connection ([`RpcState::resume`]).
    pub fn progress(&self) -> (usize, u64) {
        (self.partial_bytes, self.answered)
    }

    /// A connection that continues from [`RpcState::progress`] (a partial request longer than
    /// a request is cut to it).
    pub fn resume(config: RpcConfig, partial_bytes: usize, answered: u64) -> RpcState {
        let mut state = RpcState::new(config);
        state.partial_bytes = partial_bytes.min(config.request_bytes);
        state.answered = answered;
        state
    }

    /// Consumes at most `max_responses` whole requests of `input` in keep-alive mode, leaving
    /// the rest unconsumed (the caller's output is full: back-pressure). One-shot mode ignores
    /// the cap ([`feed`](RpcState::feed)).
    pub fn feed_at_most(&mut self, input: &[u8], max_responses: u64) -> Fed {
        if self.config.one_shot {
            return self.feed(input);
        }
        let req = self.config.request_bytes as u64;
        let cap = max_responses
            .saturating_mul(req)
            .saturating_sub(self.partial_bytes as u64);
        let take = (input.len() as u64).min(cap) as usize;
        self.feed(&input[..take])
    }

    /// Consumes `input`.
    pub fn feed(&mut self, input: &[u8]) -> Fed {
        let req = self.config.request_bytes;
        if self.config.one_shot {
            let room = req - self.partial_bytes;
            if self.answered > 0 || input.len() > room {
                return Fed {
                    consumed: 0,
                    responses: 0,
                    done: false,
                    violation: Some(Violation::Oversized),
                };
            }
            self.partial_bytes += input.len();
            let complete = self.partial_bytes == req;
            if complete {
                self.answered = 1;
            }
            return Fed {
                consumed: input.len(),
                responses: complete as u32,
                done: complete,
                violation: None,
            };
        }
        let total = self.partial_bytes + input.len();
        let responses = (total / req).min(u32::MAX as usize) as u32;
        self.partial_bytes = total - responses as usize * req;
        self.answered += responses as u64;
        Fed {
            consumed: input.len(),
            responses,
            done: false,
            violation: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(one_shot: bool) -> RpcConfig {
        RpcConfig {
            request_bytes: 4,
            response_bytes: 3,
            one_shot,
        }
    }

    #[test]
    fn response_ends_with_newline() {
        assert_eq!(cfg(false).response(), b"xx\n");
    }

    #[test]
    fn keep_alive_counts_whole_requests_across_splits() {
        let mut s = RpcState::new(cfg(false));
        assert_eq!(s.feed(b"abc").responses, 0);
        assert_eq!(s.feed(b"de").responses, 1);
        assert_eq!(s.feed(b"fghijklmnop").responses, 3);
    }

    #[test]
    fn one_shot_answers_once_and_rejects_more() {
        let mut s = RpcState::new(cfg(true));
        let f = s.feed(b"ab");
        assert_eq!((f.responses, f.done), (0, false));
        let f = s.feed(b"cd");
        assert_eq!((f.responses, f.done), (1, true));
        assert_eq!(s.feed(b"e").violation, Some(Violation::Oversized));
        let mut s = RpcState::new(cfg(true));
        assert_eq!(s.feed(b"abcde").violation, Some(Violation::Oversized));
    }

    #[test]
    fn feed_at_most_leaves_the_requests_past_the_cap() {
        let mut s = RpcState::new(cfg(false));
        let f = s.feed_at_most(b"ab", 0);
        assert_eq!((f.consumed, f.responses), (0, 0));
        let f = s.feed_at_most(b"abcdefghij", 2);
        assert_eq!((f.consumed, f.responses), (8, 2));
        assert_eq!(s.feed_at_most(b"ij", 1).consumed, 2);
        let f = s.feed_at_most(b"klmnop", 1);
        assert_eq!(
            (f.consumed, f.responses),
            (2, 1),
            "completes the partial request"
        );
        let mut s = RpcState::new(cfg(true));
        assert_eq!(
            s.feed_at_most(b"abcd", 0).responses,
            1,
            "one-shot ignores the cap"
        );
    }

    proptest! {
        #[test]
        fn responses_equal_whole_requests_whatever_the_split(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..30)
        ) {
            let mut s = RpcState::new(cfg(false));
            let total: usize = chunks.iter().map(Vec::len).sum();
            let responses: u32 = chunks.iter().map(|c| s.feed(c).responses).sum();
            prop_assert_eq!(responses as usize, total / 4);
        }
    }
}
