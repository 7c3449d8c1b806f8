//! The memcached handler over a small store, fed fuzzer bytes in fuzzer-chosen chunks: never
//! panics, never consumes more than it was given, the store stays within its memory budget.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use corelocal::runtime::{ConnInfo, Handler, Next, Output, Service};
use corelocal_apps::kv::{KvConfig, KvService};
use libfuzzer_sys::fuzz_target;

const MEMORY: u64 = 1 << 20;

fn service() -> &'static (KvService, Instant) {
    static S: OnceLock<(KvService, Instant)> = OnceLock::new();
    S.get_or_init(|| {
        let base = Instant::now();
        let config = KvConfig {
            memory_bytes_max: MEMORY,
            item_bytes_max: 64 * 1024,
            stripes: 4,
            ..KvConfig::default()
        };
        let svc = KvService::with_clock(config, Duration::from_secs(1 << 30), base).unwrap();
        (svc, base)
    })
}

fuzz_target!(|data: &[u8]| {
    let (svc, base) = service();
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut conn = svc.connect(&ConnInfo {
        listener: 0,
        worker: 0,
        peer: None,
        now: *base,
        notify: None,
    });
    let mut buf = Vec::new();
    let mut out = Output::new();
    let mut t = *base;
    for piece in input.chunks(chunk) {
        buf.extend_from_slice(piece);
        t += Duration::from_secs(u64::from(piece[0] % 4));
        let step = conn.on_input(&buf, &mut out, t);
        assert!(step.consumed <= buf.len());
        buf.drain(..step.consumed);
        out.clear();
        if step.next != Next::Read || buf.len() > 256 * 1024 {
            break;
        }
    }
    assert!(svc.store().totals().bytes <= MEMORY);
});
