//! Parser tests for the meta commands (replies checked against memcached 1.6.18 by the kv
//! server's differential test; here: every flag and every refusal, in memcached's order).

use super::*;

fn ok(op: MetaOp, line: &str) -> MetaRequest<'_> {
    parse(op, line.as_bytes()).unwrap_or_else(|e| panic!("{line:?}: {e:?}"))
}

fn err(op: MetaOp, line: &str) -> (&'static str, usize) {
    match parse(op, line.as_bytes()) {
        Err(e) => (e.reply, e.swallow),
        Ok(r) => panic!("{line:?} parsed as {r:?}"),
    }
}

#[test]
fn dispatch_from_parse_line() {
    use super::super::{parse_line, Command};
    for (name, op) in [
        ("mg", MetaOp::Get),
        ("ms", MetaOp::Set),
        ("md", MetaOp::Delete),
        ("ma", MetaOp::Arith),
        ("me", MetaOp::Debug),
    ] {
        let line = format!("{name} k v");
        match parse_line(line.as_bytes()) {
            Ok(Command::Meta { op: o, line: l }) => {
                assert_eq!(o, op);
                assert_eq!(l, line.as_bytes());
            }
            other => panic!("{line}: {other:?}"),
        }
    }
    assert_eq!(parse_line(b"mn"), Ok(Command::MetaNoop));
    assert!(
        parse_line(b"mx k").is_err(),
        "unknown meta commands are ERROR"
    );
    assert!(parse_line(b"mgg k").is_err());
}

#[test]
fn get_flags() {
    let r = ok(
        MetaOp::Get,
        "mg foo s v t c f l h k Oabc q u T30 N60 R10 P/x Lpath",
    );
    assert_eq!(r.key.bytes(), b"foo");
    assert!(!r.key.binary());
    let f = r.flags;
    assert!(f.value && f.quiet && f.no_bump);
    assert_eq!((f.ttl, f.vivify, f.recache), (Some(30), Some(60), Some(10)));
    let firsts: Vec<u8> = r.tokens().iter().map(|t| t[0]).collect();
    assert_eq!(firsts, b"svtcflhkOquTNRPL");
    assert_eq!(r.tokens()[8], b"Oabc");
    // Flags may carry trailing bytes memcached ignores.
    assert!(ok(MetaOp::Get, "mg foo vxyz").flags.value);
    // No flags at all.
    assert_eq!(ok(MetaOp::Get, "mg foo").tokens().len(), 0);
    // Negative times are kept as sent (the server expires them at once).
    assert_eq!(ok(MetaOp::Get, "mg foo T-1").flags.ttl, Some(-1));
}

#[test]
fn get_refusals_in_memcacheds_order() {
    assert_eq!(err(MetaOp::Get, "mg"), ("ERROR", 0));
    let long = format!("mg {} v", "k".repeat(251));
    assert_eq!(err(MetaOp::Get, &long), (BAD_FORMAT, 0));
    let k250 = format!("mg {} v", "k".repeat(250));
    assert_eq!(ok(MetaOp::Get, &k250).key.bytes().len(), 250);
    // 17 flags are fine, 18 are too many (memcached counts 20 tokens with its terminal).
    let flags: Vec<String> = (b'A'..=b'Z').map(|c| format!("O{}", c as char)).collect();
    let line17 = format!(
        "mg k {}",
        ["s", "v", "t", "c", "f", "l", "h", "k", "q", "u", "O1", "T1", "N1", "R1", "P", "L", "b"]
            [..16]
            .join(" ")
    );
    assert!(parse(MetaOp::Get, line17.as_bytes()).is_ok());
    let line18 = format!("mg k {}", flags[..18].join(" "));
    assert_eq!(err(MetaOp::Get, &line18), (MG_TOO_MANY_FLAGS, 0));
    assert_eq!(err(MetaOp::Get, "mg k v v"), (DUPLICATE_FLAG, 0));
    assert_eq!(err(MetaOp::Get, "mg k \u{7f}"), (DUPLICATE_FLAG, 0));
    assert_eq!(err(MetaOp::Get, "mg k m o o o"), (INVALID_FLAG, 0));
    assert_eq!(err(MetaOp::Get, "mg k Tx"), (BAD_TOKEN, 0));
    assert_eq!(err(MetaOp::Get, "mg k N"), (BAD_TOKEN, 0));
    assert_eq!(err(MetaOp::Get, "mg k R1x"), (BAD_TOKEN, 0));
    // A later error message replaces an earlier one; a bad F keeps the previous message.
    assert_eq!(err(MetaOp::Get, "mg k Tx Jy"), (BAD_INITIAL, 0));
    assert_eq!(err(MetaOp::Get, "mg k Fx"), (BAD_FORMAT, 0));
    assert_eq!(err(MetaOp::Get, "mg k Tx Fx"), (BAD_TOKEN, 0));
    // A duplicate stops at once, even after another error.
    assert_eq!(err(MetaOp::Get, "mg k Tx v v"), (DUPLICATE_FLAG, 0));
    let o32 = format!("mg k O{}", "x".repeat(31));
    assert!(parse(MetaOp::Get, o32.as_bytes()).is_ok());
    let o33 = format!("mg k O{}", "x".repeat(32));
    assert_eq!(err(MetaOp::Get, &o33), (OPAQUE_TOO_LONG, 0));
}

#[test]
fn base64_keys() {
    // "tesuto" in katakana (memcached's t/metaget.t).
    let r = ok(MetaOp::Get, "mg 44OG44K544OI b v");
    assert_eq!(r.key.bytes(), "テスト".as_bytes());
    assert!(r.key.binary());
    assert_eq!(err(MetaOp::Get, "mg abc b"), (BAD_KEY_ENCODING, 0));
    assert_eq!(err(MetaOp::Get, "mg ==== b"), (BAD_KEY_ENCODING, 0));
    assert_eq!(err(MetaOp::Set, "ms abc 2 b"), (BAD_KEY_ENCODING, 4));
    assert_eq!(
        err(MetaOp::Delete, "md abc b"),
        (INVALID_OR_DUPLICATE_FLAG, 0)
    );
    let mut out = [0u8; 16];
    // memcached's decoder skips bytes outside the alphabet and stops after padding.
    assert_eq!(base64_decode(b"Zm9v", &mut out), Some(3));
    assert_eq!(&out[..3], b"foo");
    assert_eq!(base64_decode(b"Zm!9v", &mut out), Some(3));
    assert_eq!(base64_decode(b"Zg==Zm9v", &mut out), Some(1));
    assert_eq!(base64_decode(b"Zm8=", &mut out), Some(2));
    assert_eq!(base64_decode(b"Z===", &mut out), None);
    assert_eq!(base64_decode(b"Zm9", &mut out), None);
    assert_eq!(base64_decode(b"", &mut out), None);
    let mut enc = Vec::new();
    base64_encode(b"fo", &mut enc);
    assert_eq!(enc, b"Zm8=");
    let mut k = Vec::new();
    write_key_flag(&mut k, "テスト".as_bytes(), true);
    assert_eq!(k, b" k44OG44K544OI b");
    let mut k = Vec::new();
    write_key_flag(&mut k, b"foo", false);
    assert_eq!(k, b" kfoo");
}

#[test]
fn set_flags_and_modes() {
    let r = ok(MetaOp::Set, "ms k 5 T30 F7 c k Oq I q");
    assert_eq!(r.datalen, 5);
    assert_eq!(r.flags.ttl, Some(30));
    assert_eq!(r.flags.client_flags, 7);
    assert!(r.flags.invalidate && r.flags.quiet);
    assert_eq!(r.store_op, StoreOp::Set);
    for (mode, op) in [
        ("MS", StoreOp::Set),
        ("ME", StoreOp::Add),
        ("MA", StoreOp::Append),
        ("MP", StoreOp::Prepend),
        ("MR", StoreOp::Replace),
    ] {
        assert_eq!(ok(MetaOp::Set, &format!("ms k 1 {mode}")).store_op, op);
    }
    // C turns set and replace into cas; add, append and prepend keep their mode.
    assert_eq!(ok(MetaOp::Set, "ms k 1 C5").store_op, StoreOp::Cas);
    assert_eq!(ok(MetaOp::Set, "ms k 1 C5 MR").store_op, StoreOp::Cas);
    assert_eq!(ok(MetaOp::Set, "ms k 1 C5 ME").store_op, StoreOp::Add);
    assert_eq!(ok(MetaOp::Set, "ms k 1 MA C5").store_op, StoreOp::Append);
    assert_eq!(ok(MetaOp::Set, "ms k 1 C5").flags.cas, Some(5));
    // The length is not a flag: "ms k 1 1" has a flag '1', which is unknown.
    assert_eq!(err(MetaOp::Set, "ms k 1 1"), (INVALID_FLAG, 3));
    assert_eq!(ok(MetaOp::Set, "ms k 0").datalen, 0);
}

#[test]
fn set_refusals_and_what_they_swallow() {
    assert_eq!(err(MetaOp::Set, "ms"), ("ERROR", 0));
    assert_eq!(err(MetaOp::Set, "ms k"), (BAD_FORMAT, 0));
    let long = format!("ms {} 1", "k".repeat(251));
    assert_eq!(err(MetaOp::Set, &long), (BAD_FORMAT, 0));
    // A bad length: nothing to swallow (the data line is read as a command).
    assert_eq!(err(MetaOp::Set, "ms k x"), (BAD_FORMAT, 0));
    assert_eq!(err(MetaOp::Set, "ms k -1"), (BAD_FORMAT, 0));
    assert_eq!(err(MetaOp::Set, "ms k 2147483646"), (BAD_FORMAT, 0));
    assert_eq!(ok(MetaOp::Set, "ms k 2147483645").datalen, 2_147_483_645);
    // Refused after the length: the data and its CRLF are swallowed.
    assert_eq!(err(MetaOp::Set, "ms k 3 MZ"), (MS_BAD_MODE, 5));
    assert_eq!(err(MetaOp::Set, "ms k 3 MEE"), (BAD_MODE_LENGTH, 5));
    assert_eq!(err(MetaOp::Set, "ms k 3 T1 T2"), (DUPLICATE_FLAG, 5));
    assert_eq!(err(MetaOp::Set, "ms k 3 Fx"), (BAD_FORMAT, 5));
    assert_eq!(err(MetaOp::Set, "ms k 3 Cx"), (BAD_TOKEN, 5));
    let o33 = format!("ms k 3 O{}", "x".repeat(32));
    assert_eq!(err(MetaOp::Set, &o33), (OPAQUE_TOO_LONG, 5));
    // The mode error is reported over a long opaque (memcached checks it later).
    let both = format!("ms k 3 O{} MZ", "x".repeat(32));
    assert_eq!(err(MetaOp::Set, &both), (MS_BAD_MODE, 5));
    // 16 flags after the length are fine, 17 too many.
    let fl: Vec<String> = (0..17).map(|i| format!("{}", (b'a' + i) as char)).collect();
    let line = format!("ms k 1 {}", fl[..16].join(" "));
    assert_eq!(
        parse(MetaOp::Set, line.as_bytes()).unwrap_err().reply,
        INVALID_FLAG
    );
    let line = format!("ms k 1 {}", fl.join(" "));
    assert_eq!(err(MetaOp::Set, &line), (TOO_MANY_FLAGS, 0));
}

#[test]
fn delete_and_arith() {
    let r = ok(MetaOp::Delete, "md k I T30 C9 q Oo k");
    assert!(r.flags.invalidate && r.flags.quiet);
    assert_eq!((r.flags.ttl, r.flags.cas), (Some(30), Some(9)));
    assert_eq!(err(MetaOp::Delete, "md"), ("ERROR", 0));
    assert_eq!(
        err(MetaOp::Delete, "md k x"),
        (INVALID_OR_DUPLICATE_FLAG, 0)
    );
    assert_eq!(
        err(MetaOp::Delete, "md k q q"),
        (INVALID_OR_DUPLICATE_FLAG, 0)
    );
    let line = format!("md k {}", ["q"; 18].join(" "));
    assert_eq!(err(MetaOp::Delete, &line), (TOO_MANY_FLAGS, 0));

    let r = ok(MetaOp::Arith, "ma k");
    assert_eq!((r.flags.delta, r.flags.initial, r.incr), (1, 0, true));
    let r = ok(MetaOp::Arith, "ma k D5 J9 N30 MD v t c");
    assert_eq!((r.flags.delta, r.flags.initial, r.incr), (5, 9, false));
    assert_eq!(r.flags.vivify, Some(30));
    for (m, incr) in [("MI", true), ("M+", true), ("MD", false), ("M-", false)] {
        assert_eq!(ok(MetaOp::Arith, &format!("ma k {m}")).incr, incr);
    }
    assert_eq!(err(MetaOp::Arith, "ma k MX"), (MA_BAD_MODE, 0));
    assert_eq!(
        err(MetaOp::Arith, "ma k Dx"),
        (INVALID_OR_DUPLICATE_FLAG, 0)
    );
    assert_eq!(
        err(MetaOp::Arith, "ma k D-1"),
        (INVALID_OR_DUPLICATE_FLAG, 0)
    );
    assert_eq!(
        ok(MetaOp::Arith, "ma k D18446744073709551615").flags.delta,
        u64::MAX
    );
}

#[test]
fn debug() {
    assert_eq!(err(MetaOp::Debug, "me"), (BAD_FORMAT, 0));
    let r = ok(MetaOp::Debug, "me foo");
    assert_eq!(r.key.bytes(), b"foo");
    // Only an exact "b" as the first flag decodes.
    let r = ok(MetaOp::Debug, "me Zm9v b");
    assert_eq!((r.key.bytes(), r.key.binary()), (&b"foo"[..], true));
    assert_eq!(ok(MetaOp::Debug, "me Zm9v bx").key.bytes(), b"Zm9v");
    assert_eq!(err(MetaOp::Debug, "me abc b"), (BAD_FORMAT, 0));
    let long = format!("me {}", "k".repeat(251));
    assert_eq!(err(MetaOp::Debug, &long), (BAD_FORMAT, 0));
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn base64_roundtrips(data in prop::collection::vec(any::<u8>(), 1..187)) {
            let mut enc = Vec::new();
            base64_encode(&data, &mut enc);
            let mut out = [0u8; 250];
            prop_assert_eq!(base64_decode(&enc, &mut out), Some(data.len()));
            prop_assert_eq!(&out[..data.len()], &data[..]);
        }

        #[test]
        fn never_panics_and_bounds_hold(line in prop::collection::vec(
            prop::sample::select(b"mgsdaek vqutcflhOPLNTRFCMJDIb0123456789-+xyz= ".to_vec()), 0..120),
            which in 0usize..5) {
            let op = [MetaOp::Get, MetaOp::Set, MetaOp::Delete, MetaOp::Arith, MetaOp::Debug][which];
            match parse(op, &line) {
                Ok(r) => {
                    prop_assert!(r.key.bytes().len() <= KEY_BYTES_MAX);
                    prop_assert!(r.tokens().len() <= FLAGS_MAX);
                    prop_assert!(r.tokens().iter().all(|t| !t.is_empty() && !t.contains(&b' ')));
                    let mut seen = std::collections::HashSet::new();
                    prop_assert!(r.tokens().iter().all(|t| seen.insert(t[0])), "flags are unique");
                    prop_assert!(r.datalen <= i32::MAX as usize - 2);
                }
                Err(e) => {
                    prop_assert!(e.reply == "ERROR" || e.reply.starts_with("CLIENT_ERROR"));
                    if op != MetaOp::Set {
                        prop_assert_eq!(e.swallow, 0);
                    }
                }
            }
        }
    }
}
