//! `stats` and its sub-commands, with memcached 1.6.18's names, order and formats: general
//! (the 83 values of a memcached without an LRU maintainer and crawler, 85 with the crawler),
//! `settings`, `items`, `slabs`, `sizes`, `conns`, `detail on|off|dump`, `cachedump`, `reset`.
//!
//! Values that describe memcached's own machinery we do not have (its slab allocator's page
//! moves, its hash table, its read buffers, its log workers) are reported as memcached reports
//! them when the machinery is idle: 0. The README lists which ones.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use corelocal_proto::memcache::{self, write_line, Detail, Stats, DETAIL_USAGE};

use super::store::Now;
use super::{Inner, KvConfig};

/// Per-worker byte counters (each on its own cache line, written by its worker).
#[repr(align(128))]
#[derive(Default)]
struct WorkerIo {
    read: AtomicU64,
    written: AtomicU64,
}

/// Worker slots for byte counters; a worker index beyond wraps (still counted, shared).
const WORKER_SLOTS: usize = 256;

/// `stats detail` counters of one key prefix: get, hit, set, del.
type PrefixCounts = [u64; 4];

/// The statistics kept outside the store.
pub(super) struct ServerStats {
    cmd_meta: AtomicU64,
    pub(super) auth_cmds: AtomicU64,
    pub(super) auth_errors: AtomicU64,
    io: Box<[WorkerIo]>,
    pub(super) verbosity: AtomicU32,
    detail: AtomicBool,
    prefixes: Mutex<BTreeMap<Vec<u8>, PrefixCounts>>,
    sizes: AtomicBool,
    /// Unix seconds of the last immediate or delayed flush deadline (`oldest`), 0 = none.
    pub(super) oldest_unix: AtomicU64,
    pub(super) crawler_starts: AtomicU64,
    pub(super) crawler_running: AtomicBool,
    pub(super) crawler_reclaimed: AtomicU64,
    pub(super) crawler_checked: AtomicU64,
    pub(super) rejected_connections: AtomicU64,
    pub(super) crawler_enabled: AtomicBool,
    pub(super) idle_kicks: AtomicU64,
    /// Connections that stopped at `reqs_per_event` requests with more input (memcached's
    /// `conn_yields`).
    pub(super) conn_yields: AtomicU64,
    /// `slabs automove` level, reported (no slab pages to move).
    pub(super) slab_automove: AtomicU32,
    /// `debugtime`: seconds the clock was moved forward.
    pub(super) time_offset: AtomicU64,
    /// `hash_power_level`: see [`Inner::grow_hash_power`].
    pub(super) hash_power: AtomicU32,
}

/// memcached's starting `hash_power_level` (its default `-o hashpower`).
pub(super) const HASH_POWER_START: u32 = 16;
/// memcached's largest hash power.
const HASH_POWER_MAX: u32 = 32;

impl ServerStats {
    pub(super) fn new(config: &KvConfig) -> ServerStats {
        ServerStats {
            cmd_meta: AtomicU64::new(0),
            auth_cmds: AtomicU64::new(0),
            auth_errors: AtomicU64::new(0),
            io: (0..WORKER_SLOTS).map(|_| WorkerIo::default()).collect(),
            verbosity: AtomicU32::new(0),
            detail: AtomicBool::new(config.detail),
            prefixes: Mutex::new(BTreeMap::new()),
            sizes: AtomicBool::new(config.track_sizes),
            oldest_unix: AtomicU64::new(0),
            crawler_starts: AtomicU64::new(0),
            crawler_running: AtomicBool::new(false),
            crawler_reclaimed: AtomicU64::new(0),
            crawler_checked: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            crawler_enabled: AtomicBool::new(config.lru_crawler),
            idle_kicks: AtomicU64::new(0),
            conn_yields: AtomicU64::new(0),
            time_offset: AtomicU64::new(0),
            slab_automove: AtomicU32::new(0),
            hash_power: AtomicU32::new(HASH_POWER_START),
        }
    }

    /// Counts bytes a connection of `worker` read and wrote.
    pub(super) fn count_io(&self, worker: usize, read: u64, written: u64) {
        let w = &self.io[worker % WORKER_SLOTS];
        if read != 0 {
            w.read.fetch_add(read, Ordering::Relaxed);
        }
        if written != 0 {
            w.written.fetch_add(written, Ordering::Relaxed);
        }
    }

    /// Counts an `me`.
    pub(super) fn count_meta(&self) {
        self.cmd_meta.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `stats detail` is counting (checked per command; one relaxed load).
    #[inline]
    pub(super) fn detail_on(&self) -> bool {
        self.detail.load(Ordering::Relaxed)
    }

    /// Counts a command on `key`'s prefix (memcached's `stats_prefix_record_*`): keys without
    /// the delimiter are not counted. `op`: 0 get (`hit` says whether it hit), 2 set, 3 del.
    pub(super) fn record_prefix(&self, delimiter: u8, key: &[u8], op: usize, hit: bool) {
        let Some(end) = key.iter().position(|&b| b == delimiter) else {
            return;
        };
        let mut map = self.prefixes.lock().unwrap_or_else(|e| e.into_inner());
        let c = map.entry(key[..end].to_vec()).or_default();
        c[op] += 1;
        if op == 0 && hit {
            c[1] += 1;
        }
    }

    fn reset(&self) {
        self.cmd_meta.store(0, Ordering::Relaxed);
        self.auth_cmds.store(0, Ordering::Relaxed);
        self.auth_errors.store(0, Ordering::Relaxed);
        self.rejected_connections.store(0, Ordering::Relaxed);
        self.idle_kicks.store(0, Ordering::Relaxed);
        self.conn_yields.store(0, Ordering::Relaxed);
        self.crawler_reclaimed.store(0, Ordering::Relaxed);
        self.crawler_checked.store(0, Ordering::Relaxed);
        for w in self.io.iter() {
            w.read.store(0, Ordering::Relaxed);
            w.written.store(0, Ordering::Relaxed);
        }
        self.prefixes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn io_totals(&self) -> (u64, u64) {
        self.io.iter().fold((0, 0), |(r, w), io| {
            (
                r + io.read.load(Ordering::Relaxed),
                w + io.written.load(Ordering::Relaxed),
            )
        })
    }
}

/// This process's user and system CPU time as memcached prints them (`%ld.%06ld`), from
/// /proc/self/stat (clock ticks of 10 ms).
fn rusage() -> (String, String) {
    let ticks = corelocal::procfs::read_text(Path::new("/proc/self/stat"))
        .ok()
        .and_then(|t| corelocal::procfs::parse_pid_stat(&t))
        .unwrap_or((0, 0));
    let fmt = |t: u64| format!("{}.{:06}", t / 100, (t % 100) * 10_000);
    (fmt(ticks.0), fmt(ticks.1))
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

impl Inner {
    /// Answers a `stats` command.
    pub(super) fn stats(&self, which: Stats, out: &mut Vec<u8>, now: Now) {
        let s = &self.stats;
        match which {
            Stats::Reset => {
                self.store.reset_counters();
                self.cmd_flush.store(0, Ordering::Relaxed);
                self.total_connections.store(0, Ordering::Relaxed);
                s.reset();
                return write_line(out, "RESET");
            }
            Stats::General => self.general_stats(out, now),
            Stats::Settings => self.settings_stats(out),
            Stats::Items => self.items_stats(out, now),
            Stats::Slabs => self.slabs_stats(out, now),
            Stats::Sizes => self.sizes_stats(out, now),
            Stats::SizesEnable => {
                s.sizes.store(true, Ordering::Relaxed);
                out.extend_from_slice(b"STAT sizes_status enabled\r\n");
            }
            Stats::SizesDisable => {
                s.sizes.store(false, Ordering::Relaxed);
                out.extend_from_slice(b"STAT sizes_status disabled\r\n");
            }
            Stats::Conns => self.conns.write(out, now.unix),
            Stats::Detail(None) => return write_line(out, DETAIL_USAGE),
            Stats::Detail(Some(Detail::On)) => {
                s.detail.store(true, Ordering::Relaxed);
                return write_line(out, "OK");
            }
            Stats::Detail(Some(Detail::Off)) => {
                s.detail.store(false, Ordering::Relaxed);
                return write_line(out, "OK");
            }
            Stats::Detail(Some(Detail::Dump)) => {
                let map = s.prefixes.lock().unwrap_or_else(|e| e.into_inner());
                for (prefix, c) in map.iter() {
                    out.extend_from_slice(b"PREFIX ");
                    out.extend_from_slice(prefix);
                    let _ = write!(
                        out,
                        " get {} hit {} set {} del {}\r\n",
                        c[0], c[1], c[2], c[3]
                    );
                }
            }
            Stats::Cachedump(_) if !self.config.dump_enabled => {
                return write_line(out, "CLIENT_ERROR stats cachedump not allowed");
            }
            Stats::Cachedump(Err(e)) => return write_line(out, e),
            Stats::Cachedump(Ok((class, limit))) => self.cachedump(out, now, class, limit),
        }
        write_line(out, "END");
    }

    /// Raises `hash_power_level` to the level memcached's hash table would have grown to for
    /// `items`: it doubles its table whenever the items pass 1.5 per bucket, and never
    /// shrinks it. Tools watch the level for a cache's growth; our store has no such table,
    /// so the level is this model's, sampled by the crawler thread every second and at each
    /// `stats` (memcached grows its table in a background thread too).
    pub(super) fn grow_hash_power(&self, items: u64) {
        let mut power = self.stats.hash_power.load(Ordering::Relaxed);
        while power < HASH_POWER_MAX && items > (3u64 << power) / 2 {
            power += 1;
        }
        self.stats.hash_power.fetch_max(power, Ordering::Relaxed);
    }

    fn general_stats(&self, out: &mut Vec<u8>, now: Now) {
        let t = self.store.totals();
        self.grow_hash_power(t.curr_items);
        let c = t.counters;
        let s = &self.stats;
        let r = &self.config.report;
        let (user, system) = rusage();
        let (read, written) = s.io_totals();
        let curr = self.curr_connections.load(Ordering::Relaxed);
        let crawler = s.crawler_enabled.load(Ordering::Relaxed);
        let _ = write!(
            out,
            "STAT pid {}\r\nSTAT uptime {}\r\nSTAT time {}\r\nSTAT version {}\r\n\
             STAT libevent none\r\nSTAT pointer_size 64\r\nSTAT rusage_user {user}\r\n\
             STAT rusage_system {system}\r\n",
            self.pid,
            now.unix.saturating_sub(self.started_unix),
            now.unix,
            memcache::VERSION,
        );
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let max_connections = match self.config.conn_limit {
            0 => r.max_connections,
            n => n,
        };
        let mut rows: Vec<(&str, u64)> = vec![
            ("max_connections", max_connections),
            ("curr_connections", curr),
            ("total_connections", load(&self.total_connections)),
            ("rejected_connections", load(&s.rejected_connections)),
            ("connection_structures", curr),
            ("response_obj_oom", 0),
            ("response_obj_count", 0),
            ("response_obj_bytes", 0),
            ("read_buf_count", 0),
            ("read_buf_bytes", 0),
            ("read_buf_bytes_free", 0),
            ("read_buf_oom", 0),
            ("reserved_fds", 0),
            ("cmd_get", c.cmd_get),
            ("cmd_set", c.cmd_set),
            ("cmd_flush", load(&self.cmd_flush)),
            ("cmd_touch", c.cmd_touch),
            ("cmd_meta", load(&s.cmd_meta)),
            ("get_hits", c.get_hits),
            ("get_misses", c.get_misses),
            ("get_expired", c.get_expired),
            ("get_flushed", c.get_flushed),
            ("delete_misses", c.delete_misses),
            ("delete_hits", c.delete_hits),
            ("incr_misses", c.incr_misses),
            ("incr_hits", c.incr_hits),
            ("decr_misses", c.decr_misses),
            ("decr_hits", c.decr_hits),
            ("cas_misses", c.cas_misses),
            ("cas_hits", c.cas_hits),
            ("cas_badval", c.cas_badval),
            ("touch_hits", c.touch_hits),
            ("touch_misses", c.touch_misses),
            ("store_too_large", c.store_too_large),
            ("store_no_memory", c.store_no_memory),
            ("auth_cmds", load(&s.auth_cmds)),
            ("auth_errors", load(&s.auth_errors)),
            ("bytes_read", read),
            ("bytes_written", written),
            ("limit_maxbytes", self.store.memory_bytes_max()),
            ("accepting_conns", 1),
            ("listen_disabled_num", 0),
            ("time_in_listen_disabled_us", 0),
            ("threads", u64::from(r.threads)),
            ("conn_yields", load(&s.conn_yields)),
            (
                "hash_power_level",
                u64::from(s.hash_power.load(Ordering::Relaxed)),
            ),
            ("hash_bytes", 0),
            ("hash_is_expanding", 0),
            ("slab_reassign_rescues", 0),
            ("slab_reassign_chunk_rescues", 0),
            ("slab_reassign_evictions_nomem", 0),
            ("slab_reassign_inline_reclaim", 0),
            ("slab_reassign_busy_items", 0),
            ("slab_reassign_busy_deletes", 0),
            ("slab_reassign_running", 0),
            ("slabs_moved", 0),
        ];
        if r.idle_timeout_secs > 0 {
            // memcached reports it after `auth_errors` when an idle timeout is set.
            let at = rows
                .iter()
                .position(|(k, _)| *k == "auth_errors")
                .unwrap_or(0)
                + 1;
            rows.insert(at, ("idle_kicks", load(&s.idle_kicks)));
        }
        if crawler {
            rows.push((
                "lru_crawler_running",
                u64::from(s.crawler_running.load(Ordering::Relaxed)),
            ));
            rows.push(("lru_crawler_starts", load(&s.crawler_starts)));
        }
        rows.extend_from_slice(&[
            ("malloc_fails", 0),
            ("log_worker_dropped", 0),
            ("log_worker_written", 0),
            ("log_watcher_skipped", load(&self.watch.skipped)),
            ("log_watcher_sent", load(&self.watch.sent)),
            ("log_watchers", self.watch.watchers()),
            ("unexpected_napi_ids", 0),
            ("round_robin_fallback", 0),
            ("bytes", t.bytes),
            ("curr_items", t.curr_items),
            ("total_items", c.total_items),
            ("slab_global_page_pool", 0),
            ("expired_unfetched", c.expired_unfetched),
            ("evicted_unfetched", c.evicted_unfetched),
            ("evictions", c.evictions),
            ("reclaimed", c.reclaimed),
            ("crawler_reclaimed", load(&s.crawler_reclaimed)),
            ("crawler_items_checked", load(&s.crawler_checked)),
            ("lrutail_reflocked", 0),
        ]);
        if let Some(tls) = &self.config.tls {
            // memcached's TLS build adds these when -Z is on, the first with ssl_session_cache.
            let resumes = r
                .tls
                .iter()
                .any(|(n, v)| n == "ssl_session_cache" && v == "yes");
            if resumes {
                rows.push(("ssl_new_sessions", tls.new_sessions()));
            }
            rows.push(("ssl_handshake_errors", tls.handshake_errors()));
            rows.push((
                "time_since_server_cert_refresh",
                tls.since_reload().as_secs(),
            ));
        }
        for (name, v) in rows {
            let _ = write!(out, "STAT {name} {v}\r\n");
        }
    }

    fn settings_stats(&self, out: &mut Vec<u8>) {
        let cfg = &self.config;
        let r = &cfg.report;
        let s = &self.stats;
        let max_connections = match cfg.conn_limit {
            0 => r.max_connections,
            n => n,
        };
        let oldest = match s.oldest_unix.load(Ordering::Relaxed) {
            0 => 0,
            t => self.rel_time(t),
        };
        let rows: Vec<(&str, String)> = vec![
            ("maxbytes", self.store.memory_bytes_max().to_string()),
            ("maxconns", max_connections.to_string()),
            ("tcpport", r.tcp_port.to_string()),
            ("udpport", r.udp_port.to_string()),
            (
                "inter",
                r.interface.clone().unwrap_or_else(|| "NULL".into()),
            ),
            ("verbosity", s.verbosity.load(Ordering::Relaxed).to_string()),
            ("oldest", oldest.to_string()),
            ("evictions", if cfg.evictions { "on" } else { "off" }.into()),
            ("domain_socket", "NULL".into()),
            ("umask", "700".into()),
            ("shutdown_command", yes_no(cfg.shutdown_enabled).into()),
            ("growth_factor", "1.25".into()),
            ("chunk_size", "48".into()),
            ("num_threads", r.threads.to_string()),
            ("num_threads_per_udp", r.threads.to_string()),
            (
                "stat_key_prefix",
                char::from(cfg.prefix_delimiter).to_string(),
            ),
            ("detail_enabled", yes_no(s.detail_on()).into()),
            ("reqs_per_event", r.reqs_per_event.to_string()),
            ("cas_enabled", yes_no(cfg.cas_enabled).into()),
            ("tcp_backlog", r.backlog.to_string()),
            ("binding_protocol", cfg.protocol.name().into()),
            ("auth_enabled_sasl", "no".into()),
            ("auth_enabled_ascii", yes_no(!cfg.auth.is_empty()).into()),
            ("item_size_max", self.store.item_bytes_max().to_string()),
            ("maxconns_fast", "yes".into()),
            ("hashpower_init", "0".into()),
            ("slab_reassign", "no".into()),
            (
                "slab_automove",
                s.slab_automove.load(Ordering::Relaxed).to_string(),
            ),
            ("slab_automove_ratio", "0.80".into()),
            ("slab_automove_window", "30".into()),
            ("slab_chunk_max", "524288".into()),
            (
                "lru_crawler",
                yes_no(s.crawler_enabled.load(Ordering::Relaxed)).into(),
            ),
            ("lru_crawler_sleep", "100".into()),
            ("lru_crawler_tocrawl", "0".into()),
            ("tail_repair_time", "0".into()),
            ("flush_enabled", yes_no(cfg.flush_enabled).into()),
            ("dump_enabled", yes_no(cfg.dump_enabled).into()),
            ("hash_algorithm", "siphash".into()),
            ("lru_maintainer_thread", "no".into()),
            ("lru_segmented", "no".into()),
            ("hot_lru_pct", "20".into()),
            ("warm_lru_pct", "40".into()),
            ("hot_max_factor", "0.20".into()),
            ("warm_max_factor", "2.00".into()),
            ("temp_lru", "no".into()),
            ("temporary_ttl", "61".into()),
            ("idle_timeout", r.idle_timeout_secs.to_string()),
            ("watcher_logbuf_size", "262144".into()),
            ("worker_logbuf_size", "65536".into()),
            ("read_buf_mem_limit", "0".into()),
            (
                "track_sizes",
                yes_no(s.sizes.load(Ordering::Relaxed)).into(),
            ),
            ("inline_ascii_response", "no".into()),
            ("num_napi_ids", "(null)".into()),
            (
                "memory_file",
                cfg.memory_file
                    .as_ref()
                    .map_or("(null)".into(), |p| p.display().to_string()),
            ),
        ];
        for (name, v) in rows {
            let _ = write!(out, "STAT {name} {v}\r\n");
        }
        for (name, v) in &r.tls {
            let _ = write!(out, "STAT {name} {v}\r\n");
        }
    }

    fn items_stats(&self, out: &mut Vec<u8>, now: Now) {
        for (id, c) in self.store.classes(now).iter().enumerate() {
            if c.number == 0 {
                continue;
            }
            let k = &c.counters;
            let rows: [(&str, u64); 14] = [
                ("number", c.number),
                ("age", c.age),
                ("mem_requested", c.mem_requested),
                ("evicted", k.evicted),
                ("evicted_nonzero", k.evicted_nonzero),
                ("evicted_time", k.evicted_time),
                ("outofmemory", k.outofmemory),
                ("tailrepairs", 0),
                ("reclaimed", k.reclaimed),
                ("expired_unfetched", k.expired_unfetched),
                ("evicted_unfetched", k.evicted_unfetched),
                ("crawler_reclaimed", k.crawler_reclaimed),
                ("crawler_items_checked", k.crawler_checked),
                ("lrutail_reflocked", 0),
            ];
            for (name, v) in rows {
                let _ = write!(out, "STAT items:{id}:{name} {v}\r\n");
            }
        }
    }

    /// `stats slabs`: the 1 MiB pages memcached would hold for these items (our store
    /// allocates per item): a class keeps at least one once it held an item, as memcached's
    /// do; `total_malloced` is those pages' bytes.
    fn slabs_stats(&self, out: &mut Vec<u8>, now: Now) {
        let slabs = self.store.slabs();
        let mut active = 0;
        let mut malloced = 0;
        for (id, c) in self.store.classes(now).iter().enumerate() {
            if id == 0 || !c.counters.used || id > slabs.sizes().len() {
                continue;
            }
            active += 1;
            let per = u64::from(slabs.per_page(id as u32));
            let pages = c.number.div_ceil(per).max(1);
            malloced += pages << 20;
            let rows: [(&str, u64); 7] = [
                ("chunk_size", u64::from(slabs.sizes()[id - 1])),
                ("chunks_per_page", per),
                ("total_pages", pages),
                ("total_chunks", pages * per),
                ("used_chunks", c.number),
                ("free_chunks", pages * per - c.number),
                ("free_chunks_end", 0),
            ];
            for (name, v) in rows {
                let _ = write!(out, "STAT {id}:{name} {v}\r\n");
            }
        }
        let _ = write!(
            out,
            "STAT active_slabs {active}\r\nSTAT total_malloced {malloced}\r\n"
        );
    }

    /// `stats sizes`: items per 32-byte size bucket (memcached's `-o track_sizes`), computed
    /// from the store when asked.
    fn sizes_stats(&self, out: &mut Vec<u8>, now: Now) {
        if !self.stats.sizes.load(Ordering::Relaxed) {
            out.extend_from_slice(b"STAT sizes_status disabled\r\n");
            return;
        }
        let mut hist: BTreeMap<u64, u64> = BTreeMap::new();
        self.store.dump(now, |it| {
            let size = self.item_total(it.key.len(), it.flags, it.value_len);
            *hist.entry(size.div_ceil(32) * 32).or_default() += 1;
            true
        });
        for (bucket, n) in hist {
            let _ = write!(out, "STAT {bucket} {n}\r\n");
        }
    }

    /// `stats cachedump <class> <limit>`: keys of one class (binary keys left out, as
    /// memcached), at most `limit` (0: no limit) and 2 MiB.
    fn cachedump(&self, out: &mut Vec<u8>, now: Now, class: u32, limit: u32) {
        let start = out.len();
        let mut shown = 0u32;
        self.store.dump(now, |it| {
            if u32::from(it.class) != class || it.key_binary {
                return true;
            }
            if (limit != 0 && shown >= limit) || out.len() - start > (2 << 20) - 512 {
                return false;
            }
            out.extend_from_slice(b"ITEM ");
            out.extend_from_slice(it.key);
            let _ = write!(out, " [{} b; {} s]\r\n", it.value_len, it.exp);
            shown += 1;
            true
        });
    }
}
