//! The RPC client (MegaPipe microbenchmark): fixed-size request builder and response parser.

use super::{Progress, RespInfo};

/// Builds an RPC request: exactly `size` bytes (a repeating pattern ending in `\n`).
pub fn rpc_request(size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    if let Some(last) = v.last_mut() {
        *last = b'\n';
    }
    v
}

/// Parser for a fixed-size response.
#[derive(Debug, Clone)]
pub struct RpcParser {
    want: usize,
    got: usize,
}

impl RpcParser {
    /// Expects exactly `size` bytes.
    pub fn new(size: usize) -> Self {
        RpcParser { want: size, got: 0 }
    }

    /// Feeds bytes; never fails (the protocol has no framing).
    pub fn feed(&mut self, data: &[u8]) -> Progress {
        let take = (self.want - self.got).min(data.len());
        self.got += take;
        if self.got == self.want {
            Progress::Done {
                consumed: take,
                info: RespInfo {
                    body: self.want,
                    ..RespInfo::default()
                },
            }
        } else {
            Progress::NeedMore
        }
    }
}
