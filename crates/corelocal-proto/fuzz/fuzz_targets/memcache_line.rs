//! memcached line framing and parsing: never panics; parsed keys respect the key limit;
//! storage lengths are within memcached's range.
#![no_main]

use corelocal_proto::memcache::{
    line_overflow, next_line, parse_line, safe_strtol, safe_strtoull, value_number, Command,
    Limits, KEY_BYTES_MAX,
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
            Ok(_) => {}
            Err(r) => assert!(!r.reply.is_empty()),
        }
        rest = &rest[n..];
    }
    let _ = line_overflow(rest, &limits);
    let _ = (safe_strtoull(data), safe_strtol(data), value_number(data));
});
