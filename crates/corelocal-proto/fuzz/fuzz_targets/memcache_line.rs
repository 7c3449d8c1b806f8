//! memcached line framing and parsing (text and meta commands): never panics; parsed keys
//! respect the key limit; storage lengths are within memcached's range; meta flags are
//! unique and bounded.
#![no_main]

use corelocal_proto::memcache::{
    line_overflow, meta, next_line, parse_line, safe_strtol, safe_strtoull, value_number,
    Command, Limits, KEY_BYTES_MAX,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let mut rest = data;
    while let Some((line, n)) = next_line(rest) {
        assert!(n <= rest.len() && line.len() < n);
        match parse_line(line) {
            Ok(Command::Get { keys, .. }) => {
                for k in keys {
                    assert!(!k.is_empty() && k.len() <= KEY_BYTES_MAX && !k.contains(&b' '));
                }
            }
            Ok(Command::Store(s)) => {
                assert!(s.key.len() <= KEY_BYTES_MAX);
                assert!(s.bytes <= i32::MAX as usize - 2);
            }
            Ok(Command::Meta { op, line }) => match meta::parse(op, line) {
                Ok(r) => {
                    assert!(r.key.bytes().len() <= KEY_BYTES_MAX);
                    assert!(r.tokens().len() <= meta::FLAGS_MAX);
                    let mut seen = [false; 256];
                    for t in r.tokens() {
                        assert!(!t.is_empty() && !seen[usize::from(t[0])]);
                        seen[usize::from(t[0])] = true;
                    }
                    assert!(r.datalen <= i32::MAX as usize - 2);
                }
                Err(e) => assert!(e.reply.starts_with("CLIENT_ERROR") || e.reply == "ERROR"),
            },
            Ok(_) => {}
            Err(r) => assert!(!r.reply.is_empty()),
        }
        rest = &rest[n..];
    }
    let _ = line_overflow(rest, &limits);
    let _ = (safe_strtoull(data), safe_strtol(data), value_number(data));
});
