//! sockperf framing, fed fuzzer bytes: the server rules over the whole input and the stream
//! decoder over fuzzer-chosen chunks never panic, never consume more than given, agree on the
//! messages and on where the framing breaks, and every answer is a whole message of the input.
#![no_main]

use corelocal_proto::sockperf::{serve, Decoded, Decoder, Header, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

/// Keeps lengths small enough that the fuzzer reaches many messages.
const MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut out = Vec::new();
    let served = serve(input, MAX, &mut out);
    assert!(served.consumed <= input.len() && out.len() <= served.consumed);
    let mut d = Decoder::new(MAX);
    let (mut pos, mut messages, mut failed) = (0, 0u32, false);
    'outer: for piece in input.chunks(chunk) {
        let mut at = 0;
        while at < piece.len() {
            match d.feed(&piece[at..]) {
                Ok(Decoded::NeedMore) => at = piece.len(),
                Ok(Decoded::Message { consumed, header }) => {
                    assert!(consumed > 0 && consumed <= piece.len() - at);
                    at += consumed;
                    messages += 1;
                    assert!(header.len as usize >= HEADER_LEN && header.len as usize <= MAX);
                }
                Err(_) => {
                    failed = true;
                    break 'outer;
                }
            }
        }
        pos += piece.len();
    }
    assert!(pos <= input.len());
    assert_eq!(messages, served.messages);
    assert_eq!(failed, served.error.is_some());
    // Answers are whole messages with the client flag cleared.
    let mut at = 0;
    while at < out.len() {
        let h = Header::decode(out[at..at + HEADER_LEN].try_into().unwrap());
        assert_eq!(h.flags & 1, 0);
        at += h.len as usize;
    }
    assert_eq!(at, out.len());
});
