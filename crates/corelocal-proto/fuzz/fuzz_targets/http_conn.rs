//! The HTTP handler over the built-in site, fed fuzzer bytes in fuzzer-chosen chunks: never
//! panics, never consumes more than it was given, output stays bounded per input byte.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use corelocal::runtime::{ConnInfo, Handler, Next, Output, Service};
use corelocal_apps::http::{HttpConfig, HttpService};
use libfuzzer_sys::fuzz_target;

fn service() -> &'static (HttpService, Instant) {
    static S: OnceLock<(HttpService, Instant)> = OnceLock::new();
    S.get_or_init(|| {
        let base = Instant::now();
        let svc =
            HttpService::with_clock(HttpConfig::default(), Duration::from_secs(1 << 30), base)
                .unwrap();
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
        t += Duration::from_millis(u64::from(piece[0]) * 20);
        let step = conn.on_input(&buf, &mut out, t);
        assert!(step.consumed <= buf.len());
        buf.drain(..step.consumed);
        // Every response is at most a head plus the largest generated file (the file list).
        assert!(
            out.total_len() < 4 << 20,
            "output grew to {}",
            out.total_len()
        );
        out.clear();
        if step.next != Next::Read {
            break;
        }
        // Mirror a runtime input cap: no progress on a full buffer closes the connection.
        if buf.len() > 64 * 1024 {
            break;
        }
    }
});
