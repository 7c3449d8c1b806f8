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

impl Service for RpcService {
    type Conn = RpcConn;

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
