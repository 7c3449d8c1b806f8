use super::*;

fn ok(line: &str) -> Command<'_> {
    parse_line(line.as_bytes()).unwrap_or_else(|e| panic!("{line:?}: {e:?}"))
}

fn rej(line: &str) -> (&'static str, bool) {
    match parse_line(line.as_bytes()) {
        Err(r) => (r.reply, r.silent),
        Ok(c) => panic!("{line:?} parsed as {c:?}"),
    }
}

#[test]
fn lines_are_framed_like_memcached() {
    assert_eq!(next_line(b"get k\r\nrest"), Some((&b"get k"[..], 7)));
    assert_eq!(next_line(b"get k\nrest"), Some((&b"get k"[..], 6)));
    assert_eq!(next_line(b"\r\n"), Some((&b"\r"[..], 2)), "a lone CR stays");
    assert_eq!(next_line(b"get k\r\r\n"), Some((&b"get k\r"[..], 8)));
    assert_eq!(next_line(b"get k"), None);
}

#[test]
fn long_lines_close_unless_get() {
    let l = Limits::default();
    assert_eq!(line_overflow(&[b'x'; 2048], &l), None);
    assert_eq!(line_overflow(&[b'x'; 2049], &l), Some(Overflow::Hangup));
    let get = [b"get ".to_vec(), vec![b'k'; 3000]].concat();
    assert_eq!(line_overflow(&get, &l), None);
    let gat = [b"gat 1 ".to_vec(), vec![b'k'; 3000]].concat();
    assert_eq!(
        line_overflow(&gat, &l),
        Some(Overflow::Hangup),
        "memcached closes long gat lines too"
    );
    let spaced = [vec![b' '; 101], b"get ".to_vec(), vec![b'k'; 3000]].concat();
    assert_eq!(line_overflow(&spaced, &l), Some(Overflow::Hangup));
    let spaced = [vec![b' '; 100], b"get ".to_vec(), vec![b'k'; 3000]].concat();
    assert_eq!(line_overflow(&spaced, &l), None);
}

/// memcached's t/getset.t sends a 128 KiB key list (18,725 keys) and expects every one
/// answered; a longer one than the limit gets memcached's out-of-memory reply, not a hangup.
#[test]
fn multiget_key_lists_up_to_the_limit() {
    let l = Limits::default();
    let suite = [b"get ".to_vec(), b"foobarbaz ".repeat(18_725)].concat();
    assert_eq!(line_overflow(&suite, &l), None);
    let Ok(Command::Get { keys, .. }) = parse_line(&suite) else {
        panic!("the suite's multiget does not parse")
    };
    assert_eq!(keys.count(), 18_725);
    let at = [b"gets ".to_vec(), vec![b'k'; l.get_line_bytes_max - 5]].concat();
    assert_eq!(line_overflow(&at, &l), None);
    let over = [b"gets ".to_vec(), vec![b'k'; l.get_line_bytes_max - 4]].concat();
    assert_eq!(line_overflow(&over, &l), Some(Overflow::TooLarge));
    let small = Limits {
        get_line_bytes_max: 4096,
        ..l
    };
    let over = [b"get ".to_vec(), vec![b'k'; 4093]].concat();
    assert_eq!(line_overflow(&over, &small), Some(Overflow::TooLarge));
    // A limit below memcached's 2048: the line is refused with the reply, whatever it is.
    let tiny = Limits {
        get_line_bytes_max: 1000,
        ..l
    };
    assert_eq!(line_overflow(&[b'x'; 1000], &tiny), None);
    assert_eq!(
        line_overflow(&[b'x'; 1001], &tiny),
        Some(Overflow::TooLarge)
    );
    assert_eq!(line_overflow(&[b'x'; 2049], &tiny), Some(Overflow::Hangup));
}

/// memcached hangs up on an unknown command whose last token (of at most 23) starts with
/// `HTTP/` (t/malicious-commands.t); a command it knows is answered as usual.
#[test]
fn http_request_lines_are_hung_up_on() {
    for line in [
        "GET / HTTP/1.0",
        "PUT /asdf/asd/fasdfasdf/sadf HTTP/1.1",
        "DELETE HTTP/1.1",
        "POST /x HTTP/2",
        "HTTP/1.1",
    ] {
        assert_eq!(ok(line), Command::CrossProtocol, "{line}");
    }
    let long = format!("GET {}HTTP/1.1", "a ".repeat(21));
    assert_eq!(ok(&long), Command::CrossProtocol, "the 23rd token");
    let longer = format!("GET {}HTTP/1.1", "a ".repeat(22));
    assert_eq!(rej(&longer), (ERROR, false), "past memcached's 23 tokens");
    assert_eq!(rej("GET / HTTP"), (ERROR, false));
    assert_eq!(rej("GET HTTP/1.1 x"), (ERROR, false));
    // Names memcached dispatches on are never taken for HTTP.
    assert_eq!(rej("set HTTP/1.1"), (ERROR, false));
    assert_eq!(rej("gXt / HTTP/1.1"), (ERROR, false));
    assert_eq!(rej("dump / HTTP/1.1"), (ERROR, false));
    assert_eq!(rej("mz HTTP/1.1"), (ERROR, false));
    assert_eq!(rej("lru HTTP/1.1"), (ERROR, false));
    assert_eq!(ok("version HTTP/1.1"), Command::Version);
    assert!(matches!(ok("get / HTTP/1.1"), Command::Get { .. }));
}

#[test]
fn retrievals() {
    let Command::Get { keys, cas, touch } = ok("get a  b c") else {
        panic!()
    };
    assert_eq!(keys.collect::<Vec<_>>(), [&b"a"[..], b"b", b"c"]);
    assert!(!cas && touch.is_none());
    assert!(matches!(
        ok("gets a"),
        Command::Get {
            cas: true,
            touch: None,
            ..
        }
    ));
    assert!(matches!(
        ok("gat 10 a"),
        Command::Get {
            cas: false,
            touch: Some(10),
            ..
        }
    ));
    assert!(matches!(
        ok("gats -1 a"),
        Command::Get {
            cas: true,
            touch: Some(-1),
            ..
        }
    ));
    let Command::Get { keys, .. } = ok("gat 10") else {
        panic!()
    };
    assert_eq!(keys.count(), 0);
    assert_eq!(rej("get"), (ERROR, false));
    assert_eq!(rej("gat"), (ERROR, false));
    assert_eq!(rej("gat x k"), (BAD_EXPTIME, false));
    let long = format!("get a {} b", "k".repeat(251));
    assert_eq!(rej(&long), (BAD_FORMAT, false));
    let max = format!("get {}", "k".repeat(250));
    assert!(matches!(ok(&max), Command::Get { .. }));
}

#[test]
fn storage_lines() {
    assert_eq!(
        ok("set k 5 10 3"),
        Command::Store(Store {
            op: StoreOp::Set,
            key: b"k",
            flags: 5,
            exptime: 10,
            bytes: 3,
            cas: 0,
            noreply: false
        })
    );
    let Command::Store(s) = ok("cas k 0 0 1 77 noreply") else {
        panic!()
    };
    assert_eq!((s.op, s.cas, s.noreply), (StoreOp::Cas, 77, true));
    let Command::Store(s) = ok("set k 0 0 1 garbage") else {
        panic!()
    };
    assert!(!s.noreply, "a sixth token other than noreply is ignored");
    let Command::Store(s) = ok("set k 4294967296 0 1") else {
        panic!()
    };
    assert_eq!(s.flags, 0, "flags are truncated to 32 bits like memcached");
    let Command::Store(s) = ok("set k 0 0 4294967297") else {
        panic!()
    };
    assert_eq!(s.bytes, 1, "lengths are truncated to int32 like memcached");
    assert_eq!(rej("set k 0 0"), (ERROR, false));
    assert_eq!(rej("set k 0 0 1 noreply extra"), (ERROR, false));
    assert_eq!(rej("cas k 0 0 1"), (ERROR, false));
    assert_eq!(rej("set k 0 0 -1"), (BAD_FORMAT, false));
    assert_eq!(rej("set k 0 0 2147483646"), (BAD_FORMAT, false));
    assert_eq!(rej("set k -1 0 1"), (BAD_FORMAT, false));
    assert_eq!(rej("set k 0 0 0x1"), (BAD_FORMAT, false));
    assert_eq!(rej("set k abc 0 1 noreply"), (BAD_FORMAT, true));
    assert_eq!(rej("cas k 0 0 1 abc"), (BAD_FORMAT, false));
    assert_eq!(
        rej(&format!("set {} 0 0 1", "k".repeat(251))),
        (BAD_FORMAT, false)
    );
    assert_eq!(
        rej("set\tk 0 0 1"),
        (ERROR, false),
        "tabs do not separate tokens"
    );
}

#[test]
fn other_commands() {
    assert_eq!(
        ok("incr k 5"),
        Command::Arith {
            incr: true,
            key: b"k",
            delta: 5,
            noreply: false
        }
    );
    assert_eq!(rej("incr k -1"), (BAD_DELTA, false));
    assert_eq!(rej("decr k x noreply"), (BAD_DELTA, true));
    assert_eq!(rej("incr k"), (ERROR, false));
    assert_eq!(
        ok("delete k"),
        Command::Delete {
            key: b"k",
            noreply: false
        }
    );
    assert_eq!(
        ok("delete k 0"),
        Command::Delete {
            key: b"k",
            noreply: false
        }
    );
    assert_eq!(
        ok("delete k 0 noreply"),
        Command::Delete {
            key: b"k",
            noreply: true
        }
    );
    assert_eq!(
        ok("delete k noreply"),
        Command::Delete {
            key: b"k",
            noreply: true
        }
    );
    assert_eq!(rej("delete k 1"), (BAD_DELETE, false));
    assert_eq!(rej("delete k 1 noreply"), (BAD_DELETE, true));
    assert_eq!(rej("delete k noreply x"), (BAD_DELETE, false));
    assert_eq!(rej("delete"), (ERROR, false));
    assert_eq!(
        ok("touch k 10"),
        Command::Touch {
            key: b"k",
            exptime: 10,
            noreply: false
        }
    );
    assert_eq!(rej("touch k abc"), (BAD_EXPTIME, false));
    assert_eq!(
        ok("flush_all"),
        Command::FlushAll {
            delay: Some(0),
            noreply: false
        }
    );
    assert_eq!(
        ok("flush_all 10"),
        Command::FlushAll {
            delay: Some(10),
            noreply: false
        }
    );
    assert_eq!(
        ok("flush_all noreply"),
        Command::FlushAll {
            delay: Some(0),
            noreply: true
        }
    );
    assert_eq!(
        ok("flush_all 1 2"),
        Command::FlushAll {
            delay: Some(1),
            noreply: false
        }
    );
    // A bad delay is answered by the server: memcached checks `-F` before the argument.
    assert_eq!(
        ok("flush_all abc"),
        Command::FlushAll {
            delay: None,
            noreply: false
        }
    );
    assert_eq!(
        ok("flush_all noreply x"),
        Command::FlushAll {
            delay: None,
            noreply: false
        }
    );
    assert_eq!(ok("version x"), Command::Version);
    assert_eq!(ok("quit"), Command::Quit);
    assert_eq!(ok("mn"), Command::MetaNoop);
    assert_eq!(
        ok("verbosity 1 noreply"),
        Command::Verbosity {
            level: 1,
            noreply: true
        }
    );
    assert_eq!(rej("verbosity x"), (BAD_FORMAT, false));
    assert_eq!(rej("verbosity"), (ERROR, false));
    assert_eq!(ok("stats"), Command::Stats(Stats::General));
    assert_eq!(ok("stats settings extra"), Command::Stats(Stats::Settings));
    assert_eq!(rej("stats foo"), (ERROR, false));
    for (line, which) in [
        ("stats items", Stats::Items),
        ("stats slabs", Stats::Slabs),
        ("stats sizes", Stats::Sizes),
        ("stats sizes_enable", Stats::SizesEnable),
        ("stats sizes_disable", Stats::SizesDisable),
        ("stats conns", Stats::Conns),
        ("stats detail on", Stats::Detail(Some(Detail::On))),
        ("stats detail off x", Stats::Detail(Some(Detail::Off))),
        ("stats detail dump", Stats::Detail(Some(Detail::Dump))),
        ("stats detail", Stats::Detail(None)),
        ("stats detail x", Stats::Detail(None)),
        ("stats cachedump 1 100", Stats::Cachedump(Ok((1, 100)))),
        ("stats cachedump 63 0", Stats::Cachedump(Ok((63, 0)))),
        (
            "stats cachedump 64 0",
            Stats::Cachedump(Err("CLIENT_ERROR Illegal slab id")),
        ),
        ("stats cachedump x 0", Stats::Cachedump(Err(BAD_FORMAT))),
        (
            "stats cachedump 1",
            Stats::Cachedump(Err("CLIENT_ERROR bad command line")),
        ),
    ] {
        assert_eq!(ok(line), Command::Stats(which), "{line}");
    }
    for bad in ["", "\r", "s", "GET k", "foo", "mx k", "\0\x01"] {
        assert_eq!(rej(bad), (ERROR, false), "{bad:?}");
    }
}

#[test]
fn item_sizes_match_memcached_boundaries() {
    // Measured on memcached 1.6.18 with -I 1m: key "k" takes values up to 1,048,516 bytes,
    // key "kkkkkkkkkk" up to 1,048,507, and non-zero flags cost 4 bytes more.
    let max = 1 << 20;
    assert!(item_size(1, 0, 1_048_516) <= max);
    assert!(item_size(1, 0, 1_048_517) > max);
    assert!(item_size(10, 0, 1_048_507) <= max);
    assert!(item_size(10, 0, 1_048_508) > max);
    assert!(item_size(1, 123_456, 1_048_516) > max);
}

#[test]
fn expiry_times() {
    let (now, started) = (1_700_000_000, 1_699_999_000);
    assert_eq!(expiry_unix(0, now, started), 0);
    assert_eq!(expiry_unix(-1, now, started), 1);
    assert_eq!(expiry_unix(10, now, started), now + 10);
    assert_eq!(expiry_unix(2_592_000, now, started), now + 2_592_000);
    assert_eq!(
        expiry_unix(2_592_001, now, started),
        1,
        "absolute, long past"
    );
    assert_eq!(expiry_unix(1_700_000_100, now, started), 1_700_000_100);
}

#[test]
fn arithmetic_values_pad_like_memcached() {
    assert_eq!(arith_value(99, 3), b"99 ");
    assert_eq!(arith_value(0, 3), b"0  ");
    assert_eq!(arith_value(1000, 3), b"1000");
    assert_eq!(value_number(b"99 "), Some(99));
    assert_eq!(value_number(b""), None);
}

#[test]
fn values_are_formatted() {
    let mut out = Vec::new();
    write_value(&mut out, b"k", 5, b"abc", None);
    write_value(&mut out, b"k", 0, b"", Some(9));
    write_line(&mut out, "END");
    assert_eq!(out, b"VALUE k 5 3\r\nabc\r\nVALUE k 0 0 9\r\n\r\nEND\r\n");
}

mod props {
    use super::super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = Vec<u8>> {
        // Any bytes but space, CR and LF; memcached keys are tokens.
        prop::collection::vec(
            any::<u8>().prop_filter("sep", |b| ![b' ', b'\n', b'\r'].contains(b)),
            1..=KEY_BYTES_MAX,
        )
    }

    fn op() -> impl Strategy<Value = (&'static str, StoreOp)> {
        prop::sample::select(vec![
            ("set", StoreOp::Set),
            ("add", StoreOp::Add),
            ("replace", StoreOp::Replace),
            ("append", StoreOp::Append),
            ("prepend", StoreOp::Prepend),
            ("cas", StoreOp::Cas),
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Any bytes: framing and parsing never panic, and whatever parses respects the limits.
        #[test]
        fn arbitrary_lines(buf in prop::collection::vec(any::<u8>(), 0..600)) {
            let mut rest = &buf[..];
            while let Some((line, n)) = next_line(rest) {
                prop_assert!(n <= rest.len());
                match parse_line(line) {
                    Ok(Command::Get { keys, .. }) => {
                        for k in keys {
                            prop_assert!(!k.is_empty() && k.len() <= KEY_BYTES_MAX);
                        }
                    }
                    Ok(Command::Store(s)) => prop_assert!(s.key.len() <= KEY_BYTES_MAX),
                    _ => {}
                }
                rest = &rest[n..];
            }
            let _ = line_overflow(rest, &Limits::default());
        }

        /// Unfinished lines against memcached's rule: past 2048 bytes only a multiget (at
        /// most 100 leading spaces, then `get `/`gets `) may keep growing, and only up to the
        /// multiget limit, past which it gets the reply rather than a hangup.
        #[test]
        fn unfinished_lines_follow_memcached(
            spaces in 0usize..130, kind in 0u8..4, len in 0usize..9000,
            get_max in 500usize..8000,
        ) {
            let head: &[u8] = [&b"get "[..], b"gets ", b"gat 1 ", b"set "][kind as usize];
            let mut buf = vec![b' '; spaces];
            buf.extend_from_slice(head);
            buf.resize(buf.len().max(len), b'k');
            let limits = Limits { get_line_bytes_max: get_max, ..Limits::default() };
            let is_get = kind < 2 && spaces <= 100;
            let want = if !is_get && buf.len() > 2048 {
                Some(Overflow::Hangup)
            } else if buf.len() > get_max {
                Some(Overflow::TooLarge)
            } else {
                None
            };
            prop_assert_eq!(line_overflow(&buf, &limits), want);
        }

        /// Generated storage lines parse back to their fields.
        #[test]
        fn storage_lines_round_trip(
            (name, op) in op(), k in key(), flags in any::<u32>(), exptime in any::<i32>(),
            bytes in 0usize..2_000_000, cas in any::<u64>(), noreply in any::<bool>(),
        ) {
            let mut line = [name.as_bytes(), b" ", &k].concat();
            line.extend_from_slice(format!(" {flags} {exptime} {bytes}").as_bytes());
            if op == StoreOp::Cas {
                line.extend_from_slice(format!(" {cas}").as_bytes());
            }
            if noreply {
                line.extend_from_slice(b" noreply");
            }
            let want = Store { op, key: &k, flags, exptime, bytes, cas: if op == StoreOp::Cas { cas } else { 0 }, noreply };
            prop_assert_eq!(parse_line(&line), Ok(Command::Store(want)));
        }

        /// Generated retrieval lines give back their keys.
        #[test]
        fn get_lines_round_trip(keys in prop::collection::vec(key(), 1..30), gets in any::<bool>()) {
            let mut line = if gets { b"gets".to_vec() } else { b"get".to_vec() };
            for k in &keys {
                line.push(b' ');
                line.extend_from_slice(k);
            }
            let Ok(Command::Get { keys: got, cas, touch: None }) = parse_line(&line) else {
                return Err(TestCaseError::fail("did not parse"));
            };
            prop_assert_eq!(cas, gets);
            prop_assert_eq!(got.map(<[u8]>::to_vec).collect::<Vec<_>>(), keys);
        }

        /// Numbers print and parse back.
        #[test]
        fn numbers_round_trip(u in any::<u64>(), i in any::<i32>()) {
            prop_assert_eq!(safe_strtoull(u.to_string().as_bytes()), Some(u));
            prop_assert_eq!(safe_strtol(i.to_string().as_bytes()), Some(i));
            prop_assert_eq!(value_number(&arith_value(u, 20)), Some(u));
        }
    }
}
