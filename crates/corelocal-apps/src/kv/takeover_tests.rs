//! The cache and the connections moving to a successor process at a binary upgrade.

use super::store::{Put, SnapshotItem};
use super::tests::{conn, service, WALL};
use super::*;
use corelocal::runtime::handoff::StateError;
use corelocal::runtime::{Handler, Output, OutputFront};
use corelocal_proto::memcache::StoreOp;

/// A small seeded generator (xorshift64*): the tests repeat exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A service whose wall clock reads `WALL + secs_later` now.
fn service_later(config: KvConfig, secs_later: u64) -> KvService {
    let wall = Duration::from_secs(WALL + secs_later);
    KvService::with_clock(config, wall, Instant::now()).unwrap()
}

fn now_of(svc: &KvService) -> store::Now {
    svc.inner.now(Instant::now())
}

fn set(svc: &KvService, key: &[u8], value: &[u8], flags: u32, exp: u64) {
    let put = Put {
        op: StoreOp::Set,
        key,
        flags,
        exp,
        data: value,
        cas: 0,
        invalidate: false,
        key_binary: false,
    };
    assert_eq!(svc.store().store(&put, now_of(svc)), store::Stored::Stored);
}

/// Sends `input` on `c` at once; the reply.
fn talk(c: &mut KvConn, input: &[u8]) -> String {
    let mut out = Output::new();
    let step = c.on_input(input, &mut out, Instant::now());
    assert_eq!(step.consumed, input.len(), "all of {input:?} consumed");
    let mut reply = Vec::new();
    while let OutputFront::Bytes(b) = out.front() {
        let n = b.len();
        reply.extend_from_slice(b);
        out.advance(n);
    }
    String::from_utf8(reply).unwrap()
}

/// The whole export of `svc`, chunk by chunk, each asked with `bytes_max()`.
fn export(svc: &KvService, mut bytes_max: impl FnMut() -> usize) -> Vec<Vec<u8>> {
    let mut exp = Arc::new(svc.clone()).export_state().expect("kv exports");
    let mut chunks = Vec::new();
    loop {
        let mut chunk = Vec::new();
        let max = bytes_max();
        let more = exp.next_chunk(&mut chunk, max).unwrap();
        assert!(
            chunk.len() <= max,
            "{} bytes asked, {} given",
            max,
            chunk.len()
        );
        chunks.push(chunk);
        if !more {
            return chunks;
        }
    }
}

/// Feeds `chunks` to `svc`'s import as the runtime does; the first error, or finish's answer.
fn import(svc: &KvService, chunks: &[Vec<u8>]) -> Result<String, StateError> {
    let mut imp = Arc::new(svc.clone()).import_state().expect("kv imports");
    for c in chunks {
        imp.chunk(c)?;
    }
    imp.finish()
}

fn move_cache(from: &KvService, to: &KvService) -> Result<String, StateError> {
    import(to, &export(from, || 64 << 10))
}

/// An owned [`SnapshotItem`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    key: Vec<u8>,
    value: Vec<u8>,
    flags: u32,
    exp: u64,
    cas: u64,
    marks: [bool; 4],
}

/// Every live item, stripe by stripe, oldest first.
fn items(svc: &KvService) -> Vec<Item> {
    let store = svc.store();
    let now = now_of(svc);
    let mut all = Vec::new();
    for stripe in 0..store.stripe_count() {
        let order = store.export_order(stripe, now);
        store.export_items(stripe, &order, now, |it: &SnapshotItem<'_>| {
            all.push(Item {
                key: it.key.to_vec(),
                value: it.value.to_vec(),
                flags: it.flags,
                exp: it.exp,
                cas: it.cas,
                marks: [it.fetched, it.stale, it.token_sent, it.key_binary],
            });
            true
        });
    }
    all
}

/// `n` items of sizes up to `value_max` (a few large ones to straddle chunks), expiries
/// mixed, some fetched, stale, binary-keyed.
fn fill(svc: &KvService, rng: &mut Rng, n: usize, value_max: u64) {
    for i in 0..n {
        let key = format!("key:{i}:{}", rng.below(1000));
        let len = if i % 97 == 0 {
            150_000
        } else {
            rng.below(value_max)
        };
        let value: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let exp = [0, WALL + 100 + rng.below(1000)][i % 2];
        let put = Put {
            op: StoreOp::Set,
            key: key.as_bytes(),
            flags: rng.next() as u32,
            exp,
            data: &value,
            cas: 0,
            invalidate: false,
            key_binary: i % 11 == 0,
        };
        svc.store().store(&put, now_of(svc));
        let mut locked = svc.store().lock(key.as_bytes(), now_of(svc));
        match i % 5 {
            0 => locked.bump(),
            1 => locked.invalidate(),
            2 => locked.set_token_sent(),
            _ => {}
        }
    }
}

#[test]
fn round_trip_keeps_every_item_field_and_the_lru_order() {
    let mut rng = Rng(0x5eed);
    let (old, base) = service(KvConfig::default());
    fill(&old, &mut rng, 3000, 3000);
    let before = items(&old);
    assert!(before.len() > 2500, "{}", before.len());
    // Chunks of any size, from one byte up, so that records straddle them everywhere.
    let chunks = export(&old, || [1, 7, 100, 4096, 65536][rng.below(5) as usize]);
    // On the old one's clock, as two processes of one host read one wall clock: a successor
    // whose clock reads behind the export's takes it as time stepped back and may end items up
    // to that much earlier (a loaded CI machine took over a second to fill the cache, and an
    // expiry came back a second early).
    let wall = Duration::from_secs(WALL);
    let new = KvService::with_clock(KvConfig::default(), wall, base).unwrap();
    let report = import(&new, &chunks).unwrap();
    assert!(
        report.starts_with(&format!("imported {} items", before.len())),
        "{report}"
    );
    assert_eq!(items(&new), before);
}

#[test]
fn an_item_whose_time_runs_out_during_the_move_is_gone() {
    let (old, _) = service(KvConfig::default());
    set(&old, b"short", b"1", 0, WALL + 5);
    set(&old, b"long", b"2", 0, WALL + 100);
    set(&old, b"never", b"3", 0, 0);
    let new = service_later(KvConfig::default(), 10);
    let report = move_cache(&old, &new).unwrap();
    assert!(report.contains("1 expired during the move"), "{report}");
    let exps: Vec<(Vec<u8>, u64)> = items(&new).into_iter().map(|i| (i.key, i.exp)).collect();
    assert_eq!(exps.len(), 2);
    assert!(exps.contains(&(b"long".to_vec(), WALL + 100)), "{exps:?}");
    assert!(exps.contains(&(b"never".to_vec(), 0)), "{exps:?}");
}

#[test]
fn an_item_under_a_pending_flush_dies_at_its_deadline() {
    let (old, _) = service(KvConfig::default());
    set(&old, b"k", b"v", 0, 0);
    let mut c = conn(&old, Instant::now());
    assert_eq!(talk(&mut c, b"flush_all 30\r\n"), "OK\r\n");
    let soon = service_later(KvConfig::default(), 20);
    move_cache(&old, &soon).unwrap();
    assert_eq!(items(&soon)[0].exp, WALL + 30);
    let late = service_later(KvConfig::default(), 31);
    move_cache(&old, &late).unwrap();
    assert!(items(&late).is_empty());
}

fn gets_unique(reply: &str) -> u64 {
    let line = reply.lines().next().unwrap();
    line.split(' ').nth(4).unwrap().parse().unwrap()
}

#[test]
fn a_gets_token_from_before_is_accepted_once_after_and_new_ones_are_larger() {
    let (old, _) = service(KvConfig::default());
    for i in 0..500 {
        set(&old, format!("filler{i}").as_bytes(), b"x", 0, 0);
    }
    let mut c = conn(&old, Instant::now());
    let token = gets_unique(&talk(&mut c, b"set k 0 0 1\r\nx\r\ngets k\r\n")[8..]);
    let old_max = items(&old).iter().map(|i| i.cas).max().unwrap();
    let (new, _) = service(KvConfig::default());
    move_cache(&old, &new).unwrap();
    let mut c = conn(&new, Instant::now());
    let cas = format!("cas k 0 0 1 {token}\r\ny\r\n");
    assert_eq!(talk(&mut c, cas.as_bytes()), "STORED\r\n");
    assert_eq!(talk(&mut c, cas.as_bytes()), "EXISTS\r\n");
    let fresh = gets_unique(&talk(&mut c, b"set n 0 0 1\r\nz\r\ngets n\r\n")[8..]);
    assert!(
        fresh > old_max,
        "new unique {fresh}, predecessor's up to {old_max}"
    );
    let k = talk(&mut c, b"gets k\r\n");
    assert!(gets_unique(&k) > old_max, "{k}");
}

#[test]
fn other_limits_or_format_start_empty_and_say_why() {
    let (old, _) = service(KvConfig::default());
    set(&old, b"k", b"v", 0, 0);
    let bigger = KvConfig {
        memory_bytes_max: 128 << 20,
        ..KvConfig::default()
    };
    let (new, _) = service(bigger);
    assert_eq!(
        move_cache(&old, &new),
        Err(StateError::Incompatible(
            "starting with an empty cache: the running server has --memory-mb 64, this one 128"
                .into()
        ))
    );
    assert!(items(&new).is_empty());
    let items_2m = KvConfig {
        item_bytes_max: 2 << 20,
        ..KvConfig::default()
    };
    let (new, _) = service(items_2m);
    let why = move_cache(&old, &new).unwrap_err();
    assert_eq!(
        why,
        StateError::Incompatible(
            "starting with an empty cache: the running server has --item-max 1048576, this one \
             2097152"
                .into()
        )
    );
    assert!(items(&new).is_empty());
    // Another format version: the rest of the stream is skipped, whatever it holds.
    let mut chunks = export(&old, || 16);
    chunks[0][4] = 129;
    chunks[3] = b"garbage".to_vec();
    let (new, _) = service(KvConfig::default());
    let why = import(&new, &chunks).unwrap_err();
    assert!(matches!(why, StateError::Incompatible(_)), "{why:?}");
    let why = why.to_string();
    assert!(why.starts_with("starting with an empty cache: the running server writes cache format 129, this one reads 1"), "{why}");
    assert!(items(&new).is_empty());
}

/// The export of 200 items of 100 bytes, as one stream.
fn stream_of_200() -> (Vec<Item>, Vec<u8>) {
    let (old, _) = service(KvConfig::default());
    for i in 0..200u32 {
        set(&old, format!("k{i}").as_bytes(), &[i as u8; 100], i, 0);
    }
    (items(&old), export(&old, || 64 << 10).concat())
}

/// Whether every item of `svc` is one of `before`, whole.
fn all_whole(svc: &KvService, before: &[Item]) -> usize {
    let now = items(svc);
    for it in &now {
        let orig = before
            .iter()
            .find(|b| b.key == it.key)
            .expect("a known key");
        assert_eq!(it.value, orig.value);
        assert_eq!((it.flags, it.cas), (orig.flags, orig.cas));
    }
    now.len()
}

#[test]
fn a_corrupt_stream_is_refused_keeping_whole_items_only() {
    let (before, mut stream) = stream_of_200();
    let at = stream.len() * 3 / 5;
    stream[at] ^= 0x10;
    let chunks: Vec<Vec<u8>> = stream.chunks(1000).map(<[u8]>::to_vec).collect();
    let (new, _) = service(KvConfig::default());
    let why = import(&new, &chunks).unwrap_err();
    assert!(matches!(why, StateError::Broken(_)), "{why:?}");
    let why = why.to_string();
    let kept = all_whole(&new, &before);
    assert!(kept > 0 && kept < 200, "{kept}");
    assert!(
        why.ends_with(&format!("kept the {kept} whole items imported before it")),
        "{why}"
    );
}

#[test]
fn a_cut_stream_is_refused_keeping_whole_items_only() {
    let (before, stream) = stream_of_200();
    let cut = &stream[..stream.len() * 7 / 10];
    let chunks: Vec<Vec<u8>> = cut.chunks(333).map(<[u8]>::to_vec).collect();
    let (new, _) = service(KvConfig::default());
    let why = import(&new, &chunks).unwrap_err();
    assert!(matches!(why, StateError::Broken(_)), "{why:?}");
    let why = why.to_string();
    let kept = all_whole(&new, &before);
    assert!(kept > 100 && kept < 200, "{kept}");
    assert!(why.starts_with("cache stream cut short after"), "{why}");
    assert!(
        why.ends_with(&format!("kept the {kept} whole items imported before it")),
        "{why}"
    );
}

#[test]
fn import_leaves_items_already_present_alone() {
    let (old, _) = service(KvConfig::default());
    set(&old, b"k", b"theirs", 1, 0);
    set(&old, b"j", b"theirs", 1, 0);
    let (new, _) = service(KvConfig::default());
    set(&new, b"k", b"mine", 2, 0);
    let report = move_cache(&old, &new).unwrap();
    assert!(
        report.contains("1 kept the item already present"),
        "{report}"
    );
    let mut c = conn(&new, Instant::now());
    assert_eq!(
        talk(&mut c, b"get k j\r\n"),
        "VALUE k 2 4\r\nmine\r\nVALUE j 1 6\r\ntheirs\r\nEND\r\n"
    );
}

#[test]
fn import_stays_within_the_memory_limit() {
    let small = KvConfig {
        memory_bytes_max: 1 << 20,
        item_bytes_max: 1024,
        stripes: 1,
        ..KvConfig::default()
    };
    let (old, _) = service(small.clone());
    for i in 0..2000 {
        set(&old, format!("old{i}").as_bytes(), &[1; 500], 0, 0);
    }
    let (new, _) = service(small);
    for i in 0..1000 {
        set(&new, format!("new{i}").as_bytes(), &[2; 500], 0, 0);
    }
    move_cache(&old, &new).unwrap();
    let totals = new.store().totals();
    assert!(totals.bytes <= 1 << 20, "{} bytes", totals.bytes);
    assert!(totals.counters.evictions > 0);
}

#[test]
fn export_chunks_stay_within_bytes_max() {
    let (old, _) = service(KvConfig::default());
    set(&old, b"big", &[7; 300_000], 0, 0);
    set(&old, b"small", b"s", 0, 0);
    let mut exp = Arc::new(old.clone()).export_state().unwrap();
    let mut chunks = vec![Vec::new()];
    while exp.next_chunk(chunks.last_mut().unwrap(), 1000).unwrap() {
        assert_eq!(
            chunks.last().unwrap().len(),
            1000,
            "full chunks until the last"
        );
        chunks.push(Vec::new());
    }
    assert!(chunks.last().unwrap().len() <= 1000);
    assert!(chunks.len() > 300);
    let stream_bytes: usize = chunks.iter().map(Vec::len).sum();
    assert_eq!(
        exp.summary(),
        format!("2 items, {:.1} KiB", stream_bytes as f64 / 1024.0)
    );
    let (new, _) = service(KvConfig::default());
    import(&new, &chunks).unwrap();
    assert_eq!(items(&new), items(&old));
}

#[test]
fn a_connection_moves_only_between_commands() {
    let (svc, _) = service(KvConfig::default());
    let mut c = conn(&svc, Instant::now());
    assert_eq!(c.handoff(), Some(vec![1, 0]));
    assert_eq!(talk(&mut c, b"set k 0 0 10\r\nabc"), "");
    assert_eq!(c.handoff(), None, "half a data block");
    assert_eq!(talk(&mut c, b"defghij\r\n"), "STORED\r\n");
    assert!(c.handoff().is_some());
    let too_large = format!("set k 0 0 {}\r\nxx", 2 << 20);
    assert_eq!(
        talk(&mut c, too_large.as_bytes()),
        "SERVER_ERROR object too large for cache\r\n"
    );
    assert_eq!(c.handoff(), None, "swallowing a refused value");
}

fn with_auth() -> KvConfig {
    KvConfig {
        auth: parse_auth_file(b"foo:bar\n").unwrap(),
        ..KvConfig::default()
    }
}

fn resumed(svc: &KvService, state: &[u8]) -> KvConn {
    let info = ConnInfo {
        listener: 0,
        worker: 0,
        peer: None,
        now: Instant::now(),
        notify: None,
    };
    svc.resume(&info, state)
}

#[test]
fn a_resumed_connection_keeps_its_authentication() {
    const UNAUTH: &str = "CLIENT_ERROR unauthenticated\r\n";
    let (old, _) = service(with_auth());
    let mut c = conn(&old, Instant::now());
    assert_eq!(talk(&mut c, b"set a b c 7\r\nfoo bar\r\n"), "STORED\r\n");
    let authenticated = c.handoff().unwrap();
    let (new, _) = service(with_auth());
    assert_eq!(talk(&mut conn(&new, Instant::now()), b"get k\r\n"), UNAUTH);
    assert_eq!(
        talk(&mut resumed(&new, &authenticated), b"get k\r\n"),
        "END\r\n"
    );
    // Half way: the `set` line read, the token to come.
    let mut c = conn(&old, Instant::now());
    assert_eq!(talk(&mut c, b"set a b c 7\r\n"), "");
    let mut r = resumed(&new, &c.handoff().unwrap());
    assert_eq!(talk(&mut r, b"foo bar\r\nget k\r\n"), "STORED\r\nEND\r\n");
    // A server without authentication, or a state this build does not know: a fresh start.
    let (open, _) = service(KvConfig::default());
    let open_state = conn(&open, Instant::now()).handoff().unwrap();
    assert_eq!(talk(&mut resumed(&new, &open_state), b"get k\r\n"), UNAUTH);
    let unknown = [2, authenticated[1]];
    assert_eq!(talk(&mut resumed(&new, &unknown), b"get k\r\n"), UNAUTH);
}
