//! The RPC microbenchmark server (MegaPipe §2.2; one-shot mode for seed 004's services).

use corelocal::runtime::{CloseReason, ConnInfo, Handler, Output, Service, Step};
pub use corelocal_proto::rpc::RpcConfig;
use corelocal_proto::rpc::{RpcState, Violation};
use std::sync::Arc;
use std::time::Instant;

/// The RPC service: shared config and the response bytes.
#[derive(Debug)]
pub struct RpcService {
    config: RpcConfig,
    response: Arc<[u8]>,
}

impl RpcService {
    /// A service answering per `config`.
    pub fn new(config: RpcConfig) -> Result<RpcService, String> {
        config.validate()?;
        Ok(RpcService {
            response: config.response().into(),
            config,
        })
    }
}

/// One RPC connection.
#[derive(Debug)]
pub struct RpcConn {
    state: RpcState,
    response: Arc<[u8]>,
}

impl Handler for RpcConn {
    /// Requests are consumed byte by byte: the bytes of a request not complete yet are in
    /// the state (and the count answered, for one-shot mode).
    fn handoff(&self) -> Option<Vec<u8>> {
        let (partial, answered) = self.state.progress();
        let mut state = vec![HANDOFF_VERSION];
        state.extend_from_slice(&(partial as u32).to_le_bytes());
        state.extend_from_slice(&answered.to_le_bytes());
        Some(state)
    }

    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
        // Answer only as many requests as the output has room for (at least one past the
        // limit); the rest stay in the input until the output drains.
        let room = out.room();
        let fed = if room == u64::MAX {
            self.state.feed(input)
        } else {
            let fit = room.div_ceil(self.response.len() as u64);
            self.state.feed_at_most(input, fit)
        };
        if let Some(Violation::Oversized) = fed.violation {
            return Step::close(0, 0, CloseReason::TooLarge);
        }
        // One allocation for the batch (no doubling: resident memory stays what is queued).
        let bytes = fed.responses as usize * self.response.len();
        out.bytes_mut().reserve(bytes);
        for _ in 0..fed.responses {
            out.write(&self.response);
        }
        if fed.done {
            Step::close(fed.consumed, fed.responses, CloseReason::Done)
        } else {
            Step::read(fed.consumed, fed.responses)
        }
    }
}

/// The version byte of [`RpcConn::handoff`]'s state.
const HANDOFF_VERSION: u8 = 1;

impl RpcService {
    /// The state [`RpcConn::handoff`] gave, if it is one this build reads.
    fn resumed_state(&self, state: &[u8]) -> Option<RpcState> {
        let [HANDOFF_VERSION, rest @ ..] = state else {
            return None;
        };
        let partial = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?);
        let answered = u64::from_le_bytes(rest.get(4..12)?.try_into().ok()?);
        Some(RpcState::resume(self.config, partial as usize, answered))
    }
}

impl Service for RpcService {
    type Conn = RpcConn;

    fn resume(&self, info: &ConnInfo, state: &[u8]) -> RpcConn {
        match self.resumed_state(state) {
            Some(state) => RpcConn {
                state,
                response: self.response.clone(),
            },
            None => self.connect(info),
        }
    }

    fn name(&self) -> &'static str {
        "rpc"
    }

    fn connect(&self, _info: &ConnInfo) -> RpcConn {
        RpcConn {
            state: RpcState::new(self.config),
            response: self.response.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> RpcService {
        RpcService::new(RpcConfig {
            request_bytes: 8,
            response_bytes: 4,
            one_shot: false,
        })
        .unwrap()
    }

    fn info() -> ConnInfo<'static> {
        ConnInfo {
            listener: 0,
            worker: 0,
            peer: None,
            now: Instant::now(),
            notify: None,
        }
    }

    #[test]
    fn a_request_half_read_before_an_upgrade_is_answered_once_after_it() {
        let svc = service();
        let mut old = svc.connect(&info());
        let mut out = Output::new();
        let step = old.on_input(b"12345678abc", &mut out, Instant::now());
        assert_eq!((step.consumed, step.requests), (11, 1));
        let state = old.handoff().expect("rpc moves between any two reads");
        let mut new = svc.resume(&info(), &state);
        let mut out = Output::new();
        let step = new.on_input(b"defgh", &mut out, Instant::now());
        assert_eq!(
            step.requests, 1,
            "3 bytes before the move + 5 after = one request"
        );
        assert_eq!(out.byte_len(), 4);
        let fresh = svc.resume(&info(), b"\x09garbage");
        assert_eq!(
            fresh.state.progress(),
            (0, 0),
            "an unknown state starts fresh"
        );
    }
}
