//! Tests of the protocol clients: every parser fed at every split point.

use super::*;
use corelocal_proto::sockperf;

/// Feeds `input` split at every possible point pair and checks the same outcome.
fn all_splits(make: impl Fn() -> Parser, input: &[u8]) -> (usize, RespInfo) {
    let mut whole = make();
    let (consumed, info) = match whole.feed(input).unwrap() {
        Progress::Done { consumed, info } => (consumed, info),
        Progress::NeedMore => panic!("incomplete"),
    };
    for a in 0..=input.len() {
        for b in a..=input.len() {
            let mut p = make();
            let mut off = 0;
            let mut got = None;
            for chunk in [&input[..a], &input[a..b], &input[b..]] {
                if got.is_some() {
                    break;
                }
                match p.feed(chunk).unwrap() {
                    Progress::Done { consumed: c, info } => got = Some((off + c, info)),
                    Progress::NeedMore => off += chunk.len(),
                }
            }
            assert_eq!(got, Some((consumed, info)), "split {a} {b}");
        }
    }
    (consumed, info)
}

#[test]
fn rpc_fixed_size_and_pipelined_leftover() {
    assert_eq!(rpc_request(64).len(), 64);
    assert_eq!(*rpc_request(3).last().unwrap(), b'\n');
    let (c, info) = all_splits(|| Parser::Rpc(RpcParser::new(5)), b"hello");
    assert_eq!((c, info.body), (5, 5));
    let mut p = RpcParser::new(4);
    assert_eq!(
        p.feed(b"abcdef"),
        Progress::Done {
            consumed: 4,
            info: RespInfo {
                body: 4,
                ..Default::default()
            }
        }
    );
}

#[test]
fn sockperf_pong_any_split_and_mismatches_are_errors() {
    let mut req = Vec::new();
    sockperf::encode_request(7, 64, true, &mut req);
    let mut pong = req.clone();
    pong[9] = 2; // the server clears the client flag
    pong.extend_from_slice(b"NEXT");
    let (c, info) = all_splits(|| Parser::Sockperf(SockperfParser::new(7, 64)), &pong);
    assert_eq!((c, info.body), (64, 64));
    let bad = |seq: u64, len: usize, reply: &[u8]| {
        SockperfParser::new(seq, len).feed(reply).unwrap_err().0
    };
    assert!(bad(8, 64, &pong).contains("seq 8"));
    assert!(bad(7, 65, &pong).contains("65 bytes"));
    assert!(
        bad(7, 64, &req).contains("flags 0x3"),
        "an unanswered echo of the request"
    );
    let mut huge = pong.clone();
    huge[10..14].copy_from_slice(&100_000u32.to_be_bytes());
    assert!(bad(7, 64, &huge).contains("exceeds"));
}

#[test]
fn http_content_length_any_split() {
    let r = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\nEXTRA";
    let (c, info) = all_splits(|| Parser::Http(HttpParser::new()), r);
    assert_eq!(c, r.len() - 5);
    assert_eq!(info.status, 200);
    assert_eq!(info.body, 6);
    assert!(info.server_closes);
}

#[test]
fn http_chunked_any_split() {
    let r = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n1\r\n!\r\n0\r\nX-T: 1\r\n\r\n";
    let (c, info) = all_splits(|| Parser::Http(HttpParser::new()), r);
    assert_eq!(c, r.len());
    assert_eq!(info.status, 404);
    assert_eq!(info.body, 6);
    assert!(!info.server_closes);
}

#[test]
fn http_close_delimited_and_no_body() {
    let mut p = HttpParser::new();
    assert_eq!(
        p.feed(b"HTTP/1.0 200 OK\r\n\r\nabc").unwrap(),
        Progress::NeedMore
    );
    let info = p.eof().unwrap();
    assert_eq!((info.status, info.body, info.server_closes), (200, 3, true));
    let mut p = HttpParser::new();
    assert!(matches!(
        p.feed(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap(),
        Progress::Done { consumed: 27, .. }
    ));
    let mut p = HttpParser::new();
    p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab")
        .unwrap();
    assert!(p.eof().is_err());
}

#[test]
fn http_bad_input_is_an_error() {
    assert!(HttpParser::new().feed(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
    assert!(HttpParser::new().feed(b"HTTP/1.1 abc OK\r\n\r\n").is_err());
    assert!(HttpParser::new()
        .feed(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
        .is_err());
    assert!(HttpParser::new()
        .feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        .is_err());
    let mut p = HttpParser::new();
    let big = vec![b'a'; MAX_HEADER + 10];
    let _ = p.feed(b"HTTP/1.1 200 OK\r\nX: ");
    assert!(p.feed(&big).is_err());
}

#[test]
fn http_request_shape() {
    let r = String::from_utf8(http_get("h", "/x", false)).unwrap();
    assert!(r.starts_with("GET /x HTTP/1.1\r\nHost: h\r\n"));
    assert!(r.contains("Connection: close\r\n"));
    assert!(r.ends_with("\r\n\r\n"));
    assert!(!String::from_utf8(http_get("h", "/", true))
        .unwrap()
        .contains("close"));
}

#[test]
fn kv_get_hit_miss_and_store() {
    let r = b"VALUE k1 0 5\r\nhe\r\nl\r\nEND\r\n";
    let (c, info) = all_splits(|| Parser::Kv(KvParser::new(KvExpect::Get)), r);
    assert_eq!((c, info.hit, info.body), (r.len(), Some(true), 5));
    let (_, info) = all_splits(|| Parser::Kv(KvParser::new(KvExpect::Get)), b"END\r\n");
    assert_eq!(info.hit, Some(false));
    let (c, _) = all_splits(
        || Parser::Kv(KvParser::new(KvExpect::Store)),
        b"STORED\r\nEND\r\n",
    );
    assert_eq!(c, 8);
    assert!(KvParser::new(KvExpect::Get)
        .feed(b"SERVER_ERROR out of memory\r\n")
        .is_err());
    assert!(KvParser::new(KvExpect::Store).feed(b"ERROR\r\n").is_err());
    assert_eq!(kv_set("k", 3), b"set k 0 0 3\r\nabc\r\n");
    assert_eq!(kv_get("k"), b"get k\r\n");
}

#[test]
fn kv_meta_get_hit_miss_and_store() {
    let r = b"VA 5\r\nhe\r\nl\r\nEN\r\n";
    let (c, info) = all_splits(|| Parser::Kv(KvParser::new(KvExpect::MetaGet)), r);
    assert_eq!((c, info.hit, info.body), (13, Some(true), 5));
    let (c, info) = all_splits(
        || Parser::Kv(KvParser::new(KvExpect::MetaGet)),
        b"EN\r\nHD\r\n",
    );
    assert_eq!((c, info.hit), (4, Some(false)));
    for reply in [&b"HD\r\n"[..], b"NS\r\n", b"EX\r\n", b"NF\r\n"] {
        let (c, _) = all_splits(|| Parser::Kv(KvParser::new(KvExpect::MetaStore)), reply);
        assert_eq!(c, 4);
    }
    assert!(KvParser::new(KvExpect::MetaStore)
        .feed(b"STORED\r\n")
        .is_err());
    assert!(KvParser::new(KvExpect::MetaGet).feed(b"END\r\n").is_err());
    assert!(KvParser::new(KvExpect::MetaGet)
        .feed(b"CLIENT_ERROR bad command line format\r\n")
        .is_err());
    assert_eq!(kv_ms("k", 3), b"ms k 3\r\nabc\r\n");
    assert_eq!(kv_mg("k"), b"mg k v\r\n");
}

#[test]
fn kv_line_get_hit_miss_and_store() {
    let (c, info) = all_splits(
        || Parser::Kv(KvParser::new(KvExpect::LineGet)),
        b"VALUE hello\nSTORED\n",
    );
    assert_eq!((c, info.hit, info.body), (12, Some(true), 5));
    let (c, info) = all_splits(
        || Parser::Kv(KvParser::new(KvExpect::LineGet)),
        b"NOT_FOUND\r\n",
    );
    assert_eq!((c, info.hit), (11, Some(false)));
    let (c, _) = all_splits(
        || Parser::Kv(KvParser::new(KvExpect::LineStore)),
        b"STORED\n",
    );
    assert_eq!(c, 7);
    assert!(KvParser::new(KvExpect::LineGet)
        .feed(b"ERROR unknown command\n")
        .is_err());
    assert!(KvParser::new(KvExpect::LineStore)
        .feed(b"ERROR store full\n")
        .is_err());
    assert!(KvParser::new(KvExpect::LineGet).feed(b"END\r\n").is_err());
    assert_eq!(kv_line_set("k", 3), b"SET k abc\n");
    assert_eq!(kv_line_get("k"), b"GET k\n");
}
