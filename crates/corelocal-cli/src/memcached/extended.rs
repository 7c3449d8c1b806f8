//! memcached's `-o`: a comma-separated list of `NAME` or `NAME=VALUE` (getsubopt), each
//! mapped onto `serve kv`, accepted with no effect (memcached's own allocator, hash table,
//! LRU tuning and privileges: nothing of ours to tune), or refused.

use super::parse::{refused, Settings};
use super::Refusal;

/// `-o` suboptions that tune memcached's own machinery, with why they do nothing here.
const NO_EFFECT: &[(&str, &str)] = &[
    ("maxconns_fast", "connections over -c are answered `ERROR Too many open connections` and closed (memcached's default)"),
    ("no_maxconns_fast", "connections over -c are answered `ERROR Too many open connections` and closed all the same"),
    ("hashpower", HASH),
    ("no_hashexpand", HASH),
    ("hash_algorithm", HASH),
    ("tail_repair_time", "no item is ever locked for long enough to need repair"),
    ("lru_crawler_sleep", CRAWLER),
    ("lru_crawler_tocrawl", CRAWLER),
    ("lru_maintainer", LRU),
    ("no_lru_maintainer", LRU),
    ("lru_segmented", LRU),
    ("no_lru_segmented", LRU),
    ("hot_lru_pct", LRU),
    ("warm_lru_pct", LRU),
    ("hot_max_factor", LRU),
    ("warm_max_factor", LRU),
    ("temp_lru", LRU),
    ("temporary_ttl", LRU),
    ("slab_reassign", SLABS),
    ("no_slab_reassign", SLABS),
    ("slab_automove", SLABS),
    ("no_slab_automove", SLABS),
    ("slab_automove_ratio", SLABS),
    ("slab_automove_window", SLABS),
    ("slab_automove_freeratio", SLABS),
    ("slab_chunk_max", SLABS),
    ("slab_sizes", SLABS),
    ("no_chunked_items", SLABS),
    ("worker_logbuf_size", "watchers' lines are buffered per watcher only (watcher_logbuf_size)"),
    ("read_buf_mem_limit", BUFFERS),
    ("resp_obj_mem_limit", BUFFERS),
    ("inline_ascii_resp", BUFFERS),
    ("no_inline_ascii_resp", BUFFERS),
    ("inline_ascii_response", BUFFERS),
    ("no_inline_ascii_response", BUFFERS),
    ("modern", "the defaults are memcached 1.6's"),
    ("sock_cookie_id", "no socket cookie is set"),
    ("drop_privileges", PRIVILEGES),
    ("no_drop_privileges", PRIVILEGES),
    ("relaxed_privileges", PRIVILEGES),
];

const HASH: &str = "the hash table is not memcached's and sizes itself";
const CRAWLER: &str = "the crawler's pace is its own";
const LRU: &str = "one LRU per cache, no hot/warm/cold segments";
const SLABS: &str = "items are allocated to their size, not in slab classes";
const BUFFERS: &str = "per-connection buffers are bounded by --input-limit and --output-limit";
const PRIVILEGES: &str = "the service's sandbox is systemd's (the unit's settings)";

/// Values the no-effect suboptions must still have to be accepted, as memcached checks them.
fn check_value(name: &str, value: Option<&str>) -> Result<(), Refusal> {
    let numeric = [
        "hashpower",
        "tail_repair_time",
        "lru_crawler_sleep",
        "lru_crawler_tocrawl",
        "hot_lru_pct",
        "warm_lru_pct",
        "temporary_ttl",
        "slab_automove",
        "slab_automove_window",
        "slab_chunk_max",
        "worker_logbuf_size",
        "read_buf_mem_limit",
        "resp_obj_mem_limit",
    ];
    if name == "hash_algorithm" {
        return match value {
            Some("jenkins" | "murmur3" | "xxh3") => Ok(()),
            _ => Err(Refusal::new(
                1,
                "Unknown hash_algorithm option (jenkins, murmur3, xxh3)".into(),
            )),
        };
    }
    if !numeric.contains(&name) {
        return Ok(());
    }
    let n = number(name, value)?;
    if name == "hashpower" && n < 12 {
        return Err(Refusal::new(
            1,
            format!("Initial hashtable multiplier of {n} is too low"),
        ));
    }
    if name == "hashpower" && n > 32 {
        return Err(Refusal::new(
            1,
            format!(
                "Initial hashtable multiplier of {n} is too high\nChoose a value based on \
                 \"STAT hash_power_level\" from a running instance"
            ),
        ));
    }
    Ok(())
}

/// A suboption's number, with memcached's messages when it is missing or not one.
fn number(name: &str, value: Option<&str>) -> Result<u64, Refusal> {
    let v = value.ok_or_else(|| Refusal::new(1, format!("Missing numeric argument for {name}")))?;
    v.parse::<u64>()
        .map_err(|_| Refusal::new(1, format!("Invalid numeric argument for {name}: {v}")))
}

/// Applies one `-o` list.
pub(super) fn apply(s: &mut Settings, list: &str) -> Result<(), Refusal> {
    for sub in list.split(',').filter(|sub| !sub.is_empty()) {
        let (name, value) = match sub.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (sub, None),
        };
        one(s, name, value)?;
    }
    Ok(())
}

fn one(s: &mut Settings, name: &str, value: Option<&str>) -> Result<(), Refusal> {
    match name {
        "idle_timeout" => s.idle_timeout_secs = number(name, value)?,
        "lru_crawler" => s.crawler = true,
        // memcached 1.6's no_modern turns its crawler off too.
        "no_lru_crawler" | "no_modern" => s.crawler = false,
        "track_sizes" => s.track_sizes = true,
        "watcher_logbuf_size" => {
            let kib = number(name, value)?;
            if kib == 0 || kib > 64 << 10 {
                return Err(Refusal::new(
                    super::EX_USAGE,
                    format!("-o watcher_logbuf_size={kib}: 1 to 65536 (KiB)"),
                ));
            }
            s.watcher_buf_bytes = Some(kib << 10);
        }
        _ if name.starts_with("ssl_") => super::tls::apply(s, name, value)?,
        _ => no_effect(s, name, value)?,
    }
    Ok(())
}

fn no_effect(s: &mut Settings, name: &str, value: Option<&str>) -> Result<(), Refusal> {
    if let Some((_, why)) = NO_EFFECT.iter().find(|(n, _)| *n == name) {
        check_value(name, value)?;
        let shown = match value {
            Some(v) => format!("-o {name}={v}"),
            None => format!("-o {name}"),
        };
        s.note(&format!("o:{name}"), format!("{shown}: no effect: {why}"));
        return Ok(());
    }
    let given = super::getopt::Given {
        letter: 'o',
        value: value.map(str::to_string),
        spelled: format!("-o {name}"),
    };
    let why = if name.starts_with("ext_") {
        "no external storage (extstore) here; items live in memory (-m)"
    } else if name.starts_with("proxy_") {
        "memcached's proxy is not served here"
    } else if name == "meta_response_old" {
        "meta commands are answered as memcached 1.6.18 answers them by default (HD, NF, NS, EX)"
    } else {
        return Err(Refusal::new(1, format!("Illegal suboption \"{name}\"")));
    };
    Err(refused(&given, why))
}
