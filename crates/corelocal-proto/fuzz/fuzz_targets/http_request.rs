//! HTTP request-head parser: never panics; incremental parsing (split at a fuzzer-chosen
//! point) agrees with one-shot parsing; path normalisation never yields an escape.
#![no_main]

use corelocal_proto::http::range::{if_none_match, if_range, parse_range, RangeAnswer};
use corelocal_proto::http::{date, normalize_target, Limits, Parse, Parser};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, buf)) = data.split_first() else {
        return;
    };
    let limits = Limits {
        request_line_bytes_max: 256,
        header_bytes_max: 1024,
        header_count_max: 16,
        body_bytes_max: 4096,
    };
    let whole = Parser::new().parse(buf, &limits);
    let cut = (cut as usize * buf.len() / 255).min(buf.len());
    let mut p = Parser::new();
    let first = p.parse(&buf[..cut], &limits);
    let again = match first {
        Ok(Parse::Partial) => p.parse(buf, &limits),
        _ => Parser::new().parse(buf, &limits),
    };
    if first == Ok(Parse::Partial) {
        assert_eq!(again, whole, "incremental parse differs");
    }
    if let Ok(Parse::Complete { request, head_len }) = whole {
        assert!(head_len <= buf.len());
        assert!(request.header_count <= limits.header_count_max);
        assert_eq!(request.headers().count(), request.header_count);
        if let Ok(p) = normalize_target(request.target) {
            let rel: &[u8] = &p.rel;
            assert!(!rel.starts_with(b"/"));
            assert!(!rel.contains(&0));
            for seg in rel.split(|&b| b == b'/') {
                assert!(seg != b".." && seg != b".", "dot segment survived");
            }
        }
        for (_, v) in request.headers() {
            if let RangeAnswer::Part { start, end } = parse_range(v, 1000) {
                assert!(start < end && end <= 1000);
            }
            let _ = if_none_match(v, b"\"abc\"");
            let _ = if_range(v, b"\"abc\"", b"Thu, 01 Jan 1970 00:00:00 GMT");
            if let Some(t) = date::parse_http_date(v) {
                let _ = date::format_imf_fixdate(t);
            }
        }
    }
});
