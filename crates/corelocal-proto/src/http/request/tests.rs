use super::*;

const GET: &[u8] = b"GET /a/b.html?x=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: t/1\r\n\
If-None-Match: \"x\"\r\nRange: bytes=0-9\r\n\r\n";

fn lim() -> Limits {
    Limits::default()
}

fn complete(buf: &[u8]) -> (Request<'_>, usize) {
    match parse(buf, &lim()) {
        Ok(Parse::Complete { request, head_len }) => (request, head_len),
        other => panic!("{other:?} for {:?}", String::from_utf8_lossy(buf)),
    }
}

fn err(buf: &[u8]) -> Error {
    parse(buf, &lim()).expect_err(&String::from_utf8_lossy(buf))
}

#[test]
fn parses_a_get() {
    let (r, n) = complete(GET);
    assert_eq!(n, GET.len());
    assert_eq!(r.method, Method::Get);
    assert_eq!(r.method_bytes, b"GET");
    assert_eq!(r.target, b"/a/b.html?x=1");
    assert_eq!(r.version, Version::Http11);
    assert!(r.keep_alive);
    assert!(!r.keep_alive_explicit);
    assert_eq!(r.host, Some(&b"example.com"[..]));
    assert_eq!(r.user_agent, Some(&b"t/1"[..]));
    assert_eq!(r.if_none_match, Some(&b"\"x\""[..]));
    assert_eq!(r.range, Some(&b"bytes=0-9"[..]));
    assert_eq!(r.header_count, 4);
    let names: Vec<&[u8]> = r.headers().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [&b"Host"[..], b"User-Agent", b"If-None-Match", b"Range"]
    );
}

#[test]
fn every_split_point_is_partial_then_complete() {
    for cut in 0..GET.len() {
        let mut p = Parser::new();
        assert_eq!(
            p.parse(&GET[..cut], &lim()),
            Ok(Parse::Partial),
            "cut {cut}"
        );
        // Feeding the rest in one more step gives the same result as one shot.
        assert_eq!(p.parse(GET, &lim()), parse(GET, &lim()), "cut {cut}");
    }
}

#[test]
fn byte_by_byte_feeding_matches_one_shot() {
    let mut p = Parser::new();
    for end in 1..GET.len() {
        assert_eq!(p.parse(&GET[..end], &lim()), Ok(Parse::Partial));
    }
    assert_eq!(p.parse(GET, &lim()), parse(GET, &lim()));
}

#[test]
fn pipelined_requests_are_parsed_one_at_a_time() {
    let two = [
        GET,
        b"HEAD / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    ]
    .concat();
    let (_, n) = complete(&two);
    assert_eq!(n, GET.len());
    let (r, m) = complete(&two[n..]);
    assert_eq!(r.method, Method::Head);
    assert!(!r.keep_alive);
    assert_eq!(n + m, two.len());
}

#[test]
fn bare_lf_and_leading_empty_lines_are_accepted() {
    let (r, n) = complete(b"\r\n\nGET / HTTP/1.0\nHost: h\n\n");
    assert_eq!(r.target, b"/");
    assert_eq!(n, 27);
    assert_eq!(parse(b"\r\n\r\n", &lim()), Ok(Parse::Partial));
}

#[test]
fn keep_alive_rules() {
    let ka = |s: &[u8]| complete(s).0.keep_alive;
    assert!(ka(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"));
    assert!(!ka(
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n"
    ));
    assert!(!ka(
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, close\r\n\r\n"
    ));
    assert!(!ka(b"GET / HTTP/1.0\r\n\r\n"));
    let (r, _) = complete(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    assert!(r.keep_alive && r.keep_alive_explicit);
    assert!(ka(b"GET / HTTP/1.9\r\nHost: h\r\n\r\n"));
}

#[test]
fn malformed_heads_are_bad_requests() {
    for bad in [
        &b"GET / HTTP/1.1\r\n\r\n"[..], // no Host
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET / HTTP/1.1 \r\nHost: h\r\n\r\n",
        b"GET /\r\nHost: h\r\n\r\n",
        b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET / HTTX/1.1\r\nHost: h\r\n\r\n",
        b"GET / HTTP/1.10\r\nHost: h\r\n\r\n",
        b"GET /\x01 HTTP/1.1\r\nHost: h\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost : h\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nX: a\0b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nno colon\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1\r\nRange: bytes=2-3\r\n\r\n",
    ] {
        assert!(
            matches!(err(bad), Error::Bad(_)),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
        assert_eq!(err(bad).status(), Status::BadRequest);
    }
}

#[test]
fn version_and_transfer_encoding() {
    assert_eq!(err(b"GET / HTTP/2.0\r\n\r\n"), Error::Version);
    assert_eq!(err(b"GET / HTTP/0.9\r\n\r\n"), Error::Version);
    assert_eq!(Error::Version.status().code(), 505);
    let te = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(err(te), Error::TransferEncoding);
    assert_eq!(Error::TransferEncoding.status().code(), 501);
}

#[test]
fn bodies_are_framed_and_bounded() {
    let (r, _) =
        complete(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n");
    assert_eq!(r.method, Method::Other);
    assert_eq!(r.content_length, 5);
    let big = format!(
        "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n",
        64 * 1024 + 1
    );
    assert_eq!(err(big.as_bytes()), Error::BodyTooLarge);
    assert_eq!(Error::BodyTooLarge.status().code(), 413);
}

#[test]
fn request_line_limit() {
    let l = Limits {
        request_line_bytes_max: 32,
        ..lim()
    };
    let ok = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(18));
    assert!(matches!(
        parse(ok.as_bytes(), &l),
        Ok(Parse::Complete { .. })
    ));
    let long = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(19));
    assert_eq!(parse(long.as_bytes(), &l), Err(Error::LineTooLong));
    // Without its end in sight, too: a partial line over the limit is refused at once.
    assert_eq!(parse(&long.as_bytes()[..33], &l), Err(Error::LineTooLong));
    assert_eq!(parse(&long.as_bytes()[..32], &l), Ok(Parse::Partial));
    assert_eq!(Error::LineTooLong.status().code(), 414);
}

#[test]
fn header_section_limits() {
    let l = Limits {
        header_bytes_max: 64,
        header_count_max: 3,
        ..lim()
    };
    let big = format!("GET / HTTP/1.1\r\nHost: h\r\nX: {}\r\n\r\n", "v".repeat(60));
    assert_eq!(parse(big.as_bytes(), &l), Err(Error::HeadersTooLarge));
    let partial = format!("GET / HTTP/1.1\r\nHost: h\r\nX: {}", "v".repeat(60));
    assert_eq!(parse(partial.as_bytes(), &l), Err(Error::HeadersTooLarge));
    let many = b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
    assert_eq!(parse(many, &l), Err(Error::HeadersTooLarge));
    assert_eq!(Error::HeadersTooLarge.status().code(), 431);
}

#[test]
fn garbage_never_completes_silently() {
    let junk: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    assert!(parse(&junk, &lim()).is_err());
}

/// The tchar table holds exactly RFC 9110's `tchar`: ALPHA, DIGIT and the fifteen marks.
#[test]
fn the_tchar_table_is_rfc_9110s() {
    for b in 0..=255u8 {
        let rfc = b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        assert_eq!(is_tchar(b), rfc, "byte {b:#04x}");
    }
}

/// `lines` splits as `split_inclusive` on `\n` with the `\n` and one `\r` trimmed.
#[test]
fn lines_split_like_split_inclusive() {
    for block in [
        &b""[..],
        b"\n",
        b"a",
        b"a\n",
        b"a\r\nb",
        b"a\r\n\r\n",
        b"\r\r\n\n\nx\r",
    ] {
        let ours: Vec<&[u8]> = lines(block).collect();
        let theirs: Vec<&[u8]> = block
            .split_inclusive(|&b| b == b'\n')
            .map(|l| trim_cr(l.strip_suffix(b"\n").unwrap_or(l)))
            .collect();
        assert_eq!(ours, theirs, "{:?}", String::from_utf8_lossy(block));
    }
}
