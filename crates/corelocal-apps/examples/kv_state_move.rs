//! Throughput of kv's cache move at a binary upgrade, in one process: a store filled with
//! `--items` values of `--value-bytes`, exported in 64 KiB chunks each handed straight to a
//! second store's import (as the runtime does over its unix socket, without the socket).
//! Export and import are timed apart; prints one JSON object.
//!
//! ```text
//! cargo run --release -p corelocal-apps --example kv_state_move -- --items 1000000 --value-bytes 1024 --rounds 3
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use corelocal::runtime::Service;
use corelocal_apps::kv::store::{Now, Put, Stored};
use corelocal_apps::kv::{KvConfig, KvService};
use corelocal_proto::memcache::StoreOp;

/// The runtime's chunk size.
const CHUNK_BYTES: usize = 64 << 10;

struct Args {
    items: u64,
    value_bytes: usize,
    rounds: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        items: 1_000_000,
        value_bytes: 1024,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--items" => args.items = value.parse().expect("--items N"),
            "--value-bytes" => args.value_bytes = value.parse().expect("--value-bytes N"),
            "--rounds" => args.rounds = value.parse().expect("--rounds N"),
            _ => panic!("unknown flag {flag}"),
        }
    }
    args
}

fn config(args: &Args) -> KvConfig {
    // Room for every item without evictions: a stripe gets 1/64 of the memory and the keys
    // do not spread perfectly, so twice the items' charged size.
    let per_item = args.value_bytes as u64 + 200;
    KvConfig {
        memory_bytes_max: (2 * args.items * per_item).next_power_of_two(),
        item_bytes_max: (args.value_bytes as u64 + 1024).next_power_of_two(),
        lru_crawler: false,
        ..KvConfig::default()
    }
}

fn now() -> Now {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    Now {
        unix: wall.as_secs(),
        ns: 0,
    }
}

fn fill(svc: &KvService, args: &Args) {
    let mut value = vec![0u8; args.value_bytes];
    let now = now();
    for i in 0..args.items {
        let key = format!("key:{i:012}");
        value[..8].copy_from_slice(&i.to_le_bytes());
        let put = Put {
            op: StoreOp::Set,
            key: key.as_bytes(),
            flags: i as u32,
            exp: if i % 2 == 0 { 0 } else { now.unix + 3600 },
            data: &value,
            cas: 0,
            invalidate: false,
            key_binary: false,
        };
        assert_eq!(svc.store().store(&put, now), Stored::Stored);
    }
}

/// One move; (export time, import time, stream bytes, the import's report).
fn move_once(old: &KvService, new: &KvService) -> (Duration, Duration, u64, String) {
    // Making the export plans it (a walk over every stripe's LRU list): counted.
    let t = Instant::now();
    let mut export = Arc::new(old.clone()).export_state().expect("kv exports");
    let mut export_time = t.elapsed();
    let t = Instant::now();
    let mut import = Arc::new(new.clone()).import_state().expect("kv imports");
    let (mut import_time, mut bytes) = (t.elapsed(), 0);
    let mut chunk = Vec::with_capacity(CHUNK_BYTES);
    loop {
        chunk.clear();
        let t = Instant::now();
        let more = export.next_chunk(&mut chunk, CHUNK_BYTES).expect("export");
        export_time += t.elapsed();
        let t = Instant::now();
        import.chunk(&chunk).expect("import");
        import_time += t.elapsed();
        bytes += chunk.len() as u64;
        if !more {
            break;
        }
    }
    let t = Instant::now();
    let report = import.finish().expect("finish");
    import_time += t.elapsed();
    (export_time, import_time, bytes, report)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The CPU model and how many CPUs this process may use.
fn machine() -> serde_json::Value {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    serde_json::json!({ "cpu_model": model, "cpus": cpus })
}

fn main() {
    let args = parse_args();
    let config = config(&args);
    let old = KvService::new(config.clone()).expect("service");
    let t = Instant::now();
    fill(&old, &args);
    let fill_s = t.elapsed().as_secs_f64();
    let load_before = load_average();
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        let new = KvService::new(config.clone()).expect("service");
        let (export, import, bytes, report) = move_once(&old, &new);
        let items = new.store().totals().curr_items;
        assert_eq!(items, args.items, "{report}");
        let gb = bytes as f64 / 1e9;
        rounds.push(serde_json::json!({
            "stream_bytes": bytes,
            "export_s": export.as_secs_f64(),
            "export_gb_per_s": gb / export.as_secs_f64(),
            "import_s": import.as_secs_f64(),
            "import_gb_per_s": gb / import.as_secs_f64(),
            "import_report": report,
        }));
        eprintln!("{}", rounds.last().unwrap());
    }
    let command: Vec<String> = std::env::args().collect();
    let out = serde_json::json!({
        "command": command.join(" "),
        "machine": machine(),
        "items": args.items,
        "value_bytes": args.value_bytes,
        "chunk_bytes": CHUNK_BYTES,
        "memory_bytes_max": config.memory_bytes_max,
        "stripes": old.config().stripes,
        "fill_s": fill_s,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "rounds": rounds,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
