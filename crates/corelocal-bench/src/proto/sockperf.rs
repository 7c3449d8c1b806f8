//! The sockperf client: the parser of the pong that answers one request.

use super::{err, Progress, ProtoError, RespInfo};
use corelocal_proto::sockperf;

/// Parser of the pong answering one sockperf request (`corelocal_proto::sockperf`): the same
/// sequence number and length, the client flag cleared; anything else is an error.
#[derive(Debug, Clone)]
pub struct SockperfParser {
    decoder: sockperf::Decoder,
    seq: u64,
    len: usize,
}

impl SockperfParser {
    /// Expects the pong of request `seq` of `len` bytes (header included).
    pub fn new(seq: u64, len: usize) -> Self {
        SockperfParser {
            decoder: sockperf::Decoder::new(sockperf::MAX_MESSAGE_LEN),
            seq,
            len,
        }
    }

    /// Feeds bytes.
    pub fn feed(&mut self, data: &[u8]) -> Result<Progress, ProtoError> {
        let (header, consumed) = match self.decoder.feed(data) {
            Ok(sockperf::Decoded::NeedMore) => return Ok(Progress::NeedMore),
            Ok(sockperf::Decoded::Message { header, consumed }) => (header, consumed),
            Err(e) => return err(e.to_string()),
        };
        if header.seq != self.seq || header.len as usize != self.len || header.is_client() {
            return err(format!(
                "sockperf: expected the pong of seq {} ({} bytes), got seq {} flags {:#x} ({} bytes)",
                self.seq, self.len, header.seq, header.flags, header.len
            ));
        }
        Ok(Progress::Done {
            consumed,
            info: RespInfo {
                body: self.len,
                ..RespInfo::default()
            },
        })
    }
}
