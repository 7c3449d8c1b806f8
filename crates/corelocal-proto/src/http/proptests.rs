//! Property tests for the request parser and path normalisation (the in-tree fuzz harness;
//! cargo-fuzz targets with the same properties are in `crates/corelocal-proto/fuzz`).

use proptest::prelude::*;

use super::path::{normalize_target, PathError};
use super::request::{Limits, Method, Parse, Parser, Version};

fn small_limits() -> Limits {
    Limits {
        request_line_bytes_max: 256,
        header_bytes_max: 1024,
        header_count_max: 16,
        body_bytes_max: 4096,
    }
}

/// Header names the parser interprets are left out so each generated field is inert.
fn header_name() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z0-9-]{0,15}".prop_filter("interpreted header", |n| {
        let l = n.to_ascii_lowercase();
        ![
            "host",
            "connection",
            "content-length",
            "transfer-encoding",
            "range",
        ]
        .contains(&l.as_str())
    })
}

prop_compose! {
    fn request()(
        method in prop::sample::select(vec!["GET", "HEAD", "POST", "OPTIONS"]),
        segs in prop::collection::vec("[a-zA-Z0-9._~-]{1,12}", 0..6),
        query in prop::option::of("[a-z0-9=&]{0,10}"),
        v11 in any::<bool>(),
        close in any::<bool>(),
        headers in prop::collection::vec((header_name(), "[!-~]([ -~]{0,28}[!-~])?"), 0..10),
    ) -> (String, String, String, bool, bool, Vec<(String, String)>) {
        let mut target = format!("/{}", segs.join("/"));
        if let Some(q) = query {
            target = format!("{target}?{q}");
        }
        (method.to_string(), target, if v11 { "HTTP/1.1" } else { "HTTP/1.0" }.into(), v11, close, headers)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any bytes: no panic, a complete head never claims more than the buffer, and parsing
    /// in two steps gives what parsing in one gives.
    #[test]
    fn arbitrary_bytes_parse_consistently(buf in prop::collection::vec(any::<u8>(), 0..1500), cut in 0usize..1500) {
        let limits = small_limits();
        let whole = Parser::new().parse(&buf, &limits);
        let cut = cut.min(buf.len());
        let mut p = Parser::new();
        if p.parse(&buf[..cut], &limits) == Ok(Parse::Partial) {
            prop_assert_eq!(p.parse(&buf, &limits), whole);
        }
        if let Ok(Parse::Complete { head_len, request }) = whole {
            prop_assert!(head_len <= buf.len());
            prop_assert_eq!(request.headers().count(), request.header_count);
        }
    }

    /// Text-like input (more likely to get past the request line): same properties.
    #[test]
    fn near_miss_requests_parse_consistently(
        s in "(GET|HEAD|PUT) [ -~]{0,20} HTTP/[0-9].[0-9]\r?\n([ -~]{0,30}\r?\n){0,5}\r?\n",
        cut in 0usize..200,
    ) {
        let buf = s.as_bytes();
        let limits = small_limits();
        let whole = Parser::new().parse(buf, &limits);
        let mut p = Parser::new();
        let cut = cut.min(buf.len());
        if p.parse(&buf[..cut], &limits) == Ok(Parse::Partial) {
            prop_assert_eq!(p.parse(buf, &limits), whole);
        }
    }

    /// Generated valid requests parse back to what was generated, at every split.
    #[test]
    fn valid_requests_round_trip(r in request()) {
        let (method, target, version, v11, close, headers) = r;
        let mut text = format!("{method} {target} {version}\r\nHost: example\r\n");
        for (n, v) in &headers {
            text.push_str(&format!("{n}: {v}\r\n"));
        }
        if close {
            text.push_str("Connection: close\r\n");
        }
        text.push_str("\r\n");
        let buf = text.as_bytes();
        let limits = Limits::default();
        let Ok(Parse::Complete { request, head_len }) = Parser::new().parse(buf, &limits) else {
            return Err(TestCaseError::fail(format!("did not parse: {text:?}")));
        };
        prop_assert_eq!(head_len, buf.len());
        prop_assert_eq!(request.method_bytes, method.as_bytes());
        let kind = match method.as_str() { "GET" => Method::Get, "HEAD" => Method::Head, _ => Method::Other };
        prop_assert_eq!(request.method, kind);
        prop_assert_eq!(request.target, target.as_bytes());
        prop_assert_eq!(request.version, if v11 { Version::Http11 } else { Version::Http10 });
        prop_assert_eq!(request.keep_alive, v11 && !close);
        let got: Vec<(Vec<u8>, Vec<u8>)> = request.headers().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
        prop_assert_eq!(got.len(), headers.len() + 1 + usize::from(close));
        for ((n, v), (gn, gv)) in headers.iter().zip(got.iter().skip(1)) {
            prop_assert_eq!(n.as_bytes(), &gn[..]);
            prop_assert_eq!(v.as_bytes(), &gv[..]);
        }
        for cut in 0..buf.len() {
            let mut p = Parser::new();
            prop_assert_eq!(p.parse(&buf[..cut], &limits), Ok(Parse::Partial));
            prop_assert_eq!(p.parse(buf, &limits), Ok(Parse::Complete { request, head_len }));
        }
    }

    /// Normalisation never yields a path that leaves the root, names a dot segment or holds
    /// NUL, and agrees with a straightforward reference resolver.
    #[test]
    fn normalised_paths_stay_under_the_root(t in "/([a-z]{1,3}|\\.|\\.\\.|%2[eE]|%2[fF]|%00|/){0,12}[a-z]{0,3}/?") {
        let got = normalize_target(t.as_bytes());
        let expect = reference_resolve(&t);
        match (&got, &expect) {
            (Ok(p), Ok(segs)) => {
                let rel: &[u8] = &p.rel;
                let want = segs.join("/");
                let rel_trimmed = rel.strip_suffix(b"/").unwrap_or(rel);
                prop_assert_eq!(rel_trimmed, want.as_bytes());
                prop_assert!(!rel.starts_with(b"/"));
                prop_assert!(rel.split(|&b| b == b'/').all(|s| s != b"." && s != b".."));
            }
            (Err(e), Err(f)) => prop_assert_eq!(e, f),
            _ => return Err(TestCaseError::fail(format!("{t:?}: got {got:?}, reference {expect:?}"))),
        }
    }
}

/// Decode, then resolve segments one by one.
fn reference_resolve(t: &str) -> Result<Vec<String>, PathError> {
    let mut decoded = Vec::new();
    let b = t.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let v = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap(), 16).unwrap();
            if v == 0 {
                return Err(PathError::Nul);
            }
            decoded.push(v);
            i += 3;
        } else {
            decoded.push(b[i]);
            i += 1;
        }
    }
    let mut segs: Vec<String> = Vec::new();
    for s in String::from_utf8(decoded).unwrap().split('/') {
        match s {
            "" | "." => {}
            ".." => {
                segs.pop().ok_or(PathError::Escape)?;
            }
            s => segs.push(s.to_string()),
        }
    }
    Ok(segs)
}
