//! A server speaking `sockperf server --tcp`'s protocol (see [`corelocal_proto::sockperf`]):
//! every whole message from a client that asks for a pong is answered with the same bytes, the
//! client flag cleared; other messages are taken and not answered.

use corelocal::runtime::{CloseReason, ConnInfo, Handler, Output, Service, Step};
use corelocal_proto::sockperf::{self, FrameError};
use std::time::Instant;

/// Configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockperfConfig {
    /// Largest message accepted, header included (sockperf server's `-m`); a longer one closes
    /// the connection, as sockperf does.
    pub max_message_bytes: usize,
}

impl Default for SockperfConfig {
    fn default() -> Self {
        SockperfConfig {
            max_message_bytes: sockperf::MAX_MESSAGE_LEN,
        }
    }
}

impl SockperfConfig {
    /// Checks the limit is within sockperf's range (14..=65,507 bytes).
    pub fn validate(&self) -> Result<(), String> {
        let range = sockperf::HEADER_LEN..=sockperf::MAX_MESSAGE_LEN;
        if !range.contains(&self.max_message_bytes) {
            return Err(format!(
                "largest message must be within {}..={} bytes, got {}",
                range.start(),
                range.end(),
                self.max_message_bytes
            ));
        }
        Ok(())
    }
}

/// The sockperf service (stateless: the rules need nothing across connections).
#[derive(Debug)]
pub struct SockperfService {
    config: SockperfConfig,
}

impl SockperfService {
    /// A service per `config`.
    pub fn new(config: SockperfConfig) -> Result<SockperfService, String> {
        config.validate()?;
        Ok(SockperfService { config })
    }
}

/// One sockperf connection.
#[derive(Debug)]
pub struct SockperfConn {
    max_message_bytes: usize,
}

impl Handler for SockperfConn {
    fn on_input(&mut self, input: &[u8], out: &mut Output, _now: Instant) -> Step {
        let served = sockperf::serve(input, self.max_message_bytes, out.bytes_mut());
        match served.error {
            None => Step::read(served.consumed, served.messages),
            Some(FrameError::TooLong { .. }) => {
                Step::close(served.consumed, served.messages, CloseReason::TooLarge)
            }
            Some(FrameError::TooShort(_)) => {
                Step::close(served.consumed, served.messages, CloseReason::BadRequest)
            }
        }
    }
}

impl Service for SockperfService {
    type Conn = SockperfConn;

    fn name(&self) -> &'static str {
        "sockperf"
    }

    fn connect(&self, _info: &ConnInfo) -> SockperfConn {
        SockperfConn {
            max_message_bytes: self.config.max_message_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelocal::runtime::Next;
    use corelocal_proto::sockperf::{encode_request, Header, HEADER_LEN};

    fn conn(max: usize) -> SockperfConn {
        let svc = SockperfService::new(SockperfConfig {
            max_message_bytes: max,
        })
        .unwrap();
        svc.connect(&ConnInfo {
            listener: 0,
            worker: 0,
            peer: None,
            now: Instant::now(),
            notify: None,
        })
    }

    #[test]
    fn answers_pong_requests_and_keeps_partial_input() {
        let mut c = conn(sockperf::MAX_MESSAGE_LEN);
        let mut input = Vec::new();
        encode_request(1, 64, true, &mut input);
        encode_request(2, 32, false, &mut input);
        encode_request(3, 100, true, &mut input);
        let mut out = Output::new();
        let step = c.on_input(&input[..150], &mut out, Instant::now());
        assert_eq!(step, Step::read(96, 2));
        let mut want = input[..64].to_vec();
        want[9] = 2; // flags 3 → 2
        assert_eq!(out.bytes_mut().as_slice(), want.as_slice());
        let step = c.on_input(&input[96..], &mut out, Instant::now());
        assert_eq!(step, Step::read(100, 1));
        assert_eq!(out.byte_len(), 164);
    }

    #[test]
    fn bad_lengths_close_after_the_answers() {
        let mut input = Vec::new();
        encode_request(1, 20, true, &mut input);
        let mut long = input.clone();
        long.extend(
            Header {
                seq: 2,
                flags: 3,
                len: 101,
            }
            .encode(),
        );
        let mut out = Output::new();
        let step = conn(100).on_input(&long, &mut out, Instant::now());
        assert_eq!(step, Step::close(20, 1, CloseReason::TooLarge));
        assert_eq!(out.byte_len(), 20);
        input.extend(
            Header {
                seq: 2,
                flags: 3,
                len: 5,
            }
            .encode(),
        );
        let step = conn(100).on_input(&input, &mut Output::new(), Instant::now());
        assert_eq!(step.next, Next::Close(CloseReason::BadRequest));
        assert_eq!(step.consumed, 20);
    }

    #[test]
    fn config_limits() {
        assert!(SockperfService::new(SockperfConfig::default()).is_ok());
        for bad in [0, HEADER_LEN - 1, sockperf::MAX_MESSAGE_LEN + 1] {
            let e = SockperfService::new(SockperfConfig {
                max_message_bytes: bad,
            })
            .unwrap_err();
            assert!(e.contains("65507"), "{e}");
        }
    }
}
