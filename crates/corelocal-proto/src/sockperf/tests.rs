use super::*;
use proptest::prelude::*;

fn msg(seq: u64, flags: u16, len: u32, fill: u8) -> Vec<u8> {
    let mut v = Header { seq, flags, len }.encode().to_vec();
    v.resize(len as usize, fill);
    v
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn header_layout_matches_the_captured_bytes() {
    // `sockperf server --tcp` 3.7 answering seq 13, flags 3, 64 bytes (probe capture).
    let wire = hex("000000000000000d000200000040");
    let h = Header::decode(wire.as_slice().try_into().unwrap());
    assert_eq!(
        h,
        Header {
            seq: 13,
            flags: 2,
            len: 64
        }
    );
    assert_eq!(h.encode().as_slice(), wire.as_slice());
    let h = Header {
        seq: 0x0102_0304_0506_0708,
        flags: 0xa1b2,
        len: 0xc1d2_e3f4,
    };
    assert_eq!(
        h.encode(),
        [1, 2, 3, 4, 5, 6, 7, 8, 0xa1, 0xb2, 0xc1, 0xd2, 0xe3, 0xf4]
    );
}

#[test]
fn request_is_what_sockperf_ping_pong_sends() {
    let mut out = Vec::new();
    encode_request(1, 64, true, &mut out);
    assert_eq!(out.len(), 64);
    assert_eq!(&out[..14], hex("0000000000000001000300000040").as_slice());
    encode_request(2, 3, false, &mut out);
    assert_eq!(out.len(), 64 + HEADER_LEN, "clamped to the header size");
    assert_eq!(Header::decode(out[64..78].try_into().unwrap()).flags, 1);
}

#[test]
fn server_answers_by_sockperfs_rules() {
    // (flags, answered flags) as `sockperf server --tcp` 3.7 did in the probes.
    let cases = [
        (0, None),
        (1, None),
        (2, None),
        (3, Some(2)),
        (5, None),
        (7, None),
        (0x13, Some(0x12)),
        (0xff03, Some(0xff02)),
        (0x8003, Some(0x8002)),
    ];
    for (flags, want) in cases {
        let m = msg(10, flags, 64, 0xab);
        let mut out = Vec::new();
        let s = serve(&m, MAX_MESSAGE_LEN, &mut out);
        assert_eq!((s.consumed, s.messages, s.error), (64, 1, None));
        match want {
            None => assert!(out.is_empty() && s.replies == 0, "flags {flags:#x}"),
            Some(f) => {
                assert_eq!(out, msg(10, f, 64, 0xab), "flags {flags:#x}");
                assert_eq!(s.replies, 1);
            }
        }
    }
}

#[test]
fn serve_takes_whole_messages_only_and_echoes_payload() {
    let mut stream = msg(1, 3, 20, 1);
    stream.extend(msg(2, 3, 30, 2));
    stream.extend(msg(3, 1, 40, 3));
    stream.extend(msg(4, 3, 14, 4));
    let partial = msg(5, 3, 100, 5);
    stream.extend(&partial[..50]);
    let mut out = Vec::new();
    let s = serve(&stream, MAX_MESSAGE_LEN, &mut out);
    assert_eq!((s.consumed, s.messages, s.replies), (104, 4, 3));
    let mut want = msg(1, 2, 20, 1);
    want.extend(msg(2, 2, 30, 2));
    want.extend(msg(4, 2, 14, 4));
    assert_eq!(out, want);
    out.clear();
    let s = serve(&stream[..10], MAX_MESSAGE_LEN, &mut out);
    assert_eq!((s.consumed, s.messages), (0, 0));
}

#[test]
fn bad_lengths_are_errors_after_the_good_messages() {
    for (len, err) in [
        (0, FrameError::TooShort(0)),
        (13, FrameError::TooShort(13)),
        (
            65_508,
            FrameError::TooLong {
                len: 65_508,
                max: MAX_MESSAGE_LEN,
            },
        ),
        (
            u32::MAX,
            FrameError::TooLong {
                len: u32::MAX,
                max: MAX_MESSAGE_LEN,
            },
        ),
    ] {
        let mut stream = msg(1, 3, 14, 0);
        stream.extend(
            Header {
                seq: 2,
                flags: 3,
                len,
            }
            .encode(),
        );
        let mut out = Vec::new();
        let s = serve(&stream, MAX_MESSAGE_LEN, &mut out);
        assert_eq!((s.consumed, s.replies, s.error), (14, 1, Some(err)));
        assert_eq!(Decoder::new(MAX_MESSAGE_LEN).feed(&stream[14..]), Err(err));
        assert!(!err.to_string().is_empty());
    }
    // The limit is the caller's, within sockperf's range.
    let mut out = Vec::new();
    assert!(serve(&msg(1, 3, 100, 0), 99, &mut out).error.is_some());
    assert_eq!(serve(&msg(1, 3, 100, 0), 100, &mut out).replies, 1);
    assert_eq!(clamp_max_len(1 << 30), MAX_MESSAGE_LEN);
    assert_eq!(clamp_max_len(0), HEADER_LEN);
}

#[test]
fn largest_message_passes() {
    let m = msg(7, 3, MAX_MESSAGE_LEN as u32, 9);
    let mut out = Vec::new();
    assert_eq!(serve(&m, MAX_MESSAGE_LEN, &mut out).replies, 1);
    assert_eq!(out.len(), MAX_MESSAGE_LEN);
    let mut d = Decoder::new(MAX_MESSAGE_LEN);
    assert!(matches!(
        d.feed(&m),
        Ok(Decoded::Message { consumed, .. }) if consumed == MAX_MESSAGE_LEN
    ));
}

#[test]
fn decoder_byte_by_byte_then_next_message() {
    let mut stream = msg(1, 2, 17, 0);
    stream.extend(msg(2, 2, 14, 0));
    let mut d = Decoder::new(MAX_MESSAGE_LEN);
    let mut got = Vec::new();
    for (i, b) in stream.iter().enumerate() {
        assert_eq!(d.is_idle(), i == 0 || i == 17);
        if let Decoded::Message { header, consumed } = d.feed(&[*b]).unwrap() {
            assert_eq!(consumed, 1);
            got.push((i, header.seq));
        }
    }
    assert_eq!(got, vec![(16, 1), (30, 2)]);
    assert!(d.is_idle());
    assert_eq!(d.feed(&[]), Ok(Decoded::NeedMore));
}

/// Every message of `stream` through a [`Decoder`] fed in `chunks`-sized pieces:
/// (header, payload) pairs.
fn decode_all(stream: &[u8], cuts: &[usize]) -> Result<Vec<(Header, Vec<u8>)>, FrameError> {
    let mut d = Decoder::new(MAX_MESSAGE_LEN);
    let (mut out, mut start, mut pos) = (Vec::new(), 0, 0);
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    bounds.push(stream.len());
    bounds.sort_unstable();
    for end in bounds {
        while pos < end {
            match d.feed(&stream[pos..end])? {
                Decoded::NeedMore => pos = end,
                Decoded::Message { header, consumed } => {
                    pos += consumed;
                    out.push((header, stream[start + HEADER_LEN..pos].to_vec()));
                    start = pos;
                }
            }
        }
    }
    Ok(out)
}

fn arb_message() -> impl Strategy<Value = (Header, Vec<u8>)> {
    (
        any::<u64>(),
        any::<u16>(),
        proptest::collection::vec(any::<u8>(), 0..200),
    )
        .prop_map(|(seq, flags, payload)| {
            let len = (HEADER_LEN + payload.len()) as u32;
            (Header { seq, flags, len }, payload)
        })
}

proptest! {
    #[test]
    fn any_split_decodes_the_same_messages(
        msgs in proptest::collection::vec(arb_message(), 0..20),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let mut stream = Vec::new();
        for (h, p) in &msgs {
            stream.extend_from_slice(&h.encode());
            stream.extend_from_slice(p);
        }
        prop_assert_eq!(decode_all(&stream, &cuts).unwrap(), msgs);
    }

    #[test]
    fn serve_in_any_pieces_answers_as_over_the_whole_stream(
        msgs in proptest::collection::vec(arb_message(), 0..20),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let mut stream = Vec::new();
        for (h, p) in &msgs {
            stream.extend_from_slice(&h.encode());
            stream.extend_from_slice(p);
        }
        let mut whole = Vec::new();
        let all = serve(&stream, MAX_MESSAGE_LEN, &mut whole);
        prop_assert_eq!(all.consumed, stream.len());
        prop_assert_eq!(all.replies as usize, msgs.iter().filter(|m| m.0.server_answers()).count());
        // As the runtime does: unconsumed bytes stay and more are appended.
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        bounds.push(stream.len());
        bounds.sort_unstable();
        let (mut pieces, mut from) = (Vec::new(), 0);
        for end in bounds {
            let s = serve(&stream[from..end], MAX_MESSAGE_LEN, &mut pieces);
            prop_assert!(s.error.is_none());
            from += s.consumed;
        }
        prop_assert_eq!(from, stream.len());
        prop_assert_eq!(pieces, whole);
    }

    #[test]
    fn garbage_never_panics_and_never_overconsumes(
        data in proptest::collection::vec(any::<u8>(), 0..300),
        max in 0usize..100_000,
    ) {
        let mut out = Vec::new();
        let s = serve(&data, max, &mut out);
        prop_assert!(s.consumed <= data.len());
        prop_assert!(out.len() <= s.consumed);
        let mut d = Decoder::new(max);
        let mut pos = 0;
        while pos < data.len() {
            match d.feed(&data[pos..]) {
                Ok(Decoded::Message { consumed, .. }) => {
                    prop_assert!(consumed > 0 && consumed <= data.len() - pos);
                    pos += consumed;
                }
                Ok(Decoded::NeedMore) | Err(_) => break,
            }
        }
    }
}
