//! ifstat2-style measurement: counters read once a second, deltas per second.
//!
//! Each namespace's `/proc/net/dev` and `/proc/net/snmp` (and the router's conntrack
//! statistics) are opened once from a thread inside that namespace; a proc net file stays
//! bound to the namespace it was opened in, so the sampling thread re-reads them without
//! joining anything. They must be closed before the namespaces are deleted (an open file
//! keeps its namespace alive): [`NsFiles`] is owned by the cell and dropped first.
//! Host-wide per-CPU numbers come from `/proc/stat` (tick-sampled softirq/sys/user),
//! `/proc/softirqs` (NET_RX runs) and `/proc/net/softnet_stat` (packets processed, backlog
//! drops, time squeezes, RPS IPIs received).

use crate::place::in_netns;
use corelocal::procfs::{self, parse_net_rx, CpuTimes, IfCounters, Softnet};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::time::Instant;

/// The most bytes read from one proc file per sample.
const READ_MAX: u64 = 1 << 20;

/// Proc files of one namespace, opened inside it.
#[derive(Debug)]
pub struct NsFiles {
    dev: File,
    snmp: File,
    conntrack: Option<File>,
}

impl NsFiles {
    /// Opens the calling thread's own namespace's files (the host's, from the main thread).
    pub fn open_here() -> Result<NsFiles, String> {
        let open = |p: &str| File::open(p).map_err(|e| format!("{p}: {e}"));
        Ok(NsFiles {
            dev: open("/proc/thread-self/net/dev")?,
            snmp: open("/proc/thread-self/net/snmp")?,
            conntrack: File::open("/proc/thread-self/net/stat/nf_conntrack").ok(),
        })
    }

    /// Opens `/proc/thread-self/net/{dev,snmp,stat/nf_conntrack}` from inside `ns`.
    pub fn open(ns: &str) -> Result<NsFiles, String> {
        in_netns(ns, false, NsFiles::open_here)
    }
}

fn reread(f: &mut File) -> String {
    let mut s = String::new();
    if f.seek(SeekFrom::Start(0)).is_ok() {
        let _ = f.take(READ_MAX).read_to_string(&mut s);
    }
    s
}

/// Sums the per-CPU rows of `/proc/net/stat/nf_conntrack` (a header of names, hex rows);
/// `entries`, the table's size, is printed on every row and taken once.
pub fn parse_conntrack_stat(text: &str) -> BTreeMap<String, u64> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return BTreeMap::new();
    };
    let names: Vec<&str> = header.split_whitespace().collect();
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (row, line) in lines.take(4096).enumerate() {
        for (name, v) in names.iter().zip(line.split_whitespace()) {
            let v = u64::from_str_radix(v, 16).unwrap_or(0);
            if *name == "entries" {
                if row == 0 {
                    out.insert("entries".into(), v);
                }
                continue;
            }
            *out.entry((*name).to_string()).or_default() += v;
        }
    }
    out
}

/// Counters read at one instant.
#[derive(Debug, Clone)]
pub struct Point {
    /// When.
    pub at: Instant,
    /// Per namespace (generator, router, sink): interface counters.
    pub dev: [Vec<IfCounters>; 3],
    /// Per namespace: `/proc/net/snmp`.
    pub snmp: [BTreeMap<String, u64>; 3],
    /// The router's conntrack statistics, summed over CPUs.
    pub conntrack: BTreeMap<String, u64>,
    /// `/proc/stat` per CPU.
    pub stat: Vec<(usize, CpuTimes)>,
    /// `/proc/softirqs` NET_RX per CPU.
    pub net_rx: Vec<(usize, u64)>,
    /// `/proc/net/softnet_stat`.
    pub softnet: Vec<Softnet>,
    /// Datagrams the generator sent, and its failed calls.
    pub gen_sent: u64,
    /// Failed `sendmmsg` calls.
    pub gen_errors: u64,
    /// Followed threads' schedstat.
    pub threads: Vec<ThreadTime>,
}

/// A thread's `/proc/.../schedstat`: time on a CPU and time waiting for one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadTime {
    /// Its pid or tid.
    pub id: u32,
    /// Run time, ns.
    pub run_ns: u64,
    /// Time runnable but waiting on a run queue, ns.
    pub wait_ns: u64,
}

/// The first two fields of a schedstat line: (run ns, wait ns).
pub fn parse_schedstat2(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_whitespace().map(|x| x.parse::<u64>());
    Some((f.next()?.ok()?, f.next()?.ok()?))
}

/// What a point reads.
#[derive(Debug)]
pub struct Reader {
    /// Generator, router, sink.
    pub ns: [NsFiles; 3],
    /// `/proc/.../schedstat` paths of the threads followed (generator, NAPI threads).
    pub threads: Vec<(u32, String)>,
}

fn host(path: &str) -> String {
    procfs::read_text(std::path::Path::new(path)).unwrap_or_default()
}

impl Reader {
    /// Reads every counter now.
    pub fn point(&mut self, gen_sent: u64, gen_errors: u64) -> Point {
        let at = Instant::now();
        let mut dev: [Vec<IfCounters>; 3] = Default::default();
        let mut snmp: [BTreeMap<String, u64>; 3] = Default::default();
        for (i, f) in self.ns.iter_mut().enumerate() {
            dev[i] = procfs::parse_net_dev(&reread(&mut f.dev));
            snmp[i] = procfs::parse_counters(&reread(&mut f.snmp));
        }
        let conntrack = self.ns[1]
            .conntrack
            .as_mut()
            .map(|f| parse_conntrack_stat(&reread(f)))
            .unwrap_or_default();
        Point {
            at,
            dev,
            snmp,
            conntrack,
            stat: procfs::parse_stat(&host("/proc/stat")),
            net_rx: parse_net_rx(&host("/proc/softirqs")),
            softnet: procfs::parse_softnet(&host("/proc/net/softnet_stat")),
            gen_sent,
            gen_errors,
            threads: self
                .threads
                .iter()
                .map(|(id, p)| {
                    let (run_ns, wait_ns) = parse_schedstat2(&host(p)).unwrap_or((0, 0));
                    ThreadTime {
                        id: *id,
                        run_ns,
                        wait_ns,
                    }
                })
                .collect(),
        }
    }
}

/// Packets lost, by where, over a window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Drops {
    /// `sendmmsg` calls that failed in the generator.
    pub gen_send_errors: u64,
    /// The generator's veth `tx_dropped`: the router's ingress refused (NAPI ring or
    /// backlog full).
    pub gen_tx_dropped: u64,
    /// The router's ingress `rx_dropped`.
    pub router_rx_dropped: u64,
    /// Backlog drops in `/proc/net/softnet_stat`, all CPUs (RPS / non-NAPI veth backlog full).
    pub softnet_dropped: u64,
    /// Router IP layer: `Ip:InDiscards + OutDiscards + InHdrErrors`.
    pub router_ip_discards: u64,
    /// Router packets not forwarded: `Ip:InAddrErrors + InNoRoutes` (forwarding off).
    pub router_not_forwarded: u64,
    /// Conntrack `drop + early_drop + insert_failed` in the router.
    pub conntrack: u64,
    /// The router's egress `tx_dropped`: the sink's side refused.
    pub router_tx_dropped: u64,
}

impl Drops {
    /// All drops.
    pub fn total(&self) -> u64 {
        self.gen_send_errors
            + self.gen_tx_dropped
            + self.router_rx_dropped
            + self.softnet_dropped
            + self.router_ip_discards
            + self.router_not_forwarded
            + self.conntrack
            + self.router_tx_dropped
    }
}

/// One CPU's work over a window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuWork {
    /// The CPU.
    pub cpu: usize,
    /// Percent user (tick-sampled).
    pub user: f64,
    /// Percent system (threaded NAPI polls count here, not as softirq).
    pub sys: f64,
    /// Percent softirq.
    pub softirq: f64,
    /// Percent idle.
    pub idle: f64,
    /// NET_RX softirq runs per second (`/proc/softirqs`).
    pub net_rx_per_s: f64,
    /// Packets processed per second (`softnet_stat` column 1: backlog and NAPI polls).
    pub softnet_pps: f64,
    /// Backlog drops.
    pub softnet_dropped: u64,
    /// Times `net_rx_action` ran out of budget with work left.
    pub time_squeeze: u64,
    /// RPS IPIs received per second.
    pub rps_ipis_per_s: f64,
}

/// A thread's run time over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadBusy {
    /// Its name (`generator`, `napi/IF-ID`).
    pub name: String,
    /// The CPUs it was allowed on.
    pub cpus: String,
    /// Run time ÷ window, percent.
    pub busy_pct: f64,
    /// Time it was runnable but waited for a CPU ÷ window, percent: how much other load
    /// on the machine held it back.
    pub wait_pct: f64,
}

/// One measured window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Window length, s.
    pub secs: f64,
    /// Packets the router sent on its egress, per second (forwarded).
    pub forwarded_pps: f64,
    /// Each second's forwarded pps (ifstat2).
    pub per_second: Vec<f64>,
    /// Packets the generator's veth sent, per second (offered to the router).
    pub offered_pps: f64,
    /// Packets the router's ingress received, per second.
    pub received_pps: f64,
    /// Datagrams the generator handed to the kernel, per second.
    pub generated_pps: f64,
    /// Packets that reached the sink's IP layer, per second.
    pub sink_pps: f64,
    /// Conntrack entries in the router at the window's end (0 with no firewall: nothing
    /// uses conntrack in the namespace then; this kernel no longer counts lookups).
    pub conntrack_entries: u64,
    /// Drops over the window.
    pub drops: Drops,
    /// Per CPU.
    pub cpus: Vec<CpuWork>,
    /// Generator and NAPI threads.
    pub threads: Vec<ThreadBusy>,
}

fn iface<'a>(p: &'a Point, ns: usize, name: &str) -> Option<&'a IfCounters> {
    p.dev[ns].iter().find(|c| c.name == name)
}

fn d(b: u64, a: u64) -> u64 {
    b.saturating_sub(a)
}

/// Interface names of a window (generator, router in, router out).
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    /// The generator's veth.
    pub gen: &'a str,
    /// The router's ingress.
    pub router_in: &'a str,
    /// The router's egress.
    pub router_out: &'a str,
}

fn tx(p: &Point, n: &Names) -> u64 {
    iface(p, 1, n.router_out).map_or(0, |c| c.tx_packets)
}

fn snmp_sum(p: &Point, ns: usize, keys: &[&str]) -> u64 {
    keys.iter()
        .map(|k| p.snmp[ns].get(*k).copied().unwrap_or(0))
        .sum()
}

fn cpu_work(cpu: usize, a: &Point, b: &Point, secs: f64) -> CpuWork {
    let t = |p: &Point| {
        p.stat
            .iter()
            .find(|(c, _)| *c == cpu)
            .map(|x| x.1)
            .unwrap_or_default()
    };
    let pct = t(b).since(&t(a)).percent();
    let sn = |p: &Point| {
        p.softnet
            .iter()
            .find(|s| s.cpu == cpu)
            .copied()
            .unwrap_or_default()
    };
    let rx = |p: &Point| p.net_rx.iter().find(|(c, _)| *c == cpu).map_or(0, |x| x.1);
    CpuWork {
        cpu,
        user: pct.user,
        sys: pct.sys,
        softirq: pct.softirq,
        idle: pct.idle,
        net_rx_per_s: d(rx(b), rx(a)) as f64 / secs,
        softnet_pps: sn(b).processed.wrapping_sub(sn(a).processed) as f64 / secs,
        softnet_dropped: d(sn(b).dropped, sn(a).dropped),
        time_squeeze: d(sn(b).time_squeeze, sn(a).time_squeeze),
        rps_ipis_per_s: d(sn(b).received_rps, sn(a).received_rps) as f64 / secs,
    }
}

/// The window from `points[0]` to the last point; `thread_names` names
/// [`Point::threads`] in order, with the CPUs each may run on.
pub fn window(points: &[Point], n: &Names, thread_names: &[(String, String)]) -> Option<Window> {
    let (a, b) = (points.first()?, points.last()?);
    let secs = (b.at - a.at).as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    let per_second = points
        .windows(2)
        .map(|w| {
            let s = (w[1].at - w[0].at).as_secs_f64().max(1e-6);
            d(tx(&w[1], n), tx(&w[0], n)) as f64 / s
        })
        .collect();
    let g = |p: &Point| iface(p, 0, n.gen).cloned().unwrap_or_default();
    let ri = |p: &Point| iface(p, 1, n.router_in).cloned().unwrap_or_default();
    let ro = |p: &Point| iface(p, 1, n.router_out).cloned().unwrap_or_default();
    let ct = |p: &Point| {
        ["drop", "early_drop", "insert_failed"]
            .iter()
            .map(|k| p.conntrack.get(*k).copied().unwrap_or(0))
            .sum::<u64>()
    };
    let softnet_drop = |p: &Point| p.softnet.iter().map(|s| s.dropped).sum::<u64>();
    let drops = Drops {
        gen_send_errors: d(b.gen_errors, a.gen_errors),
        gen_tx_dropped: d(g(b).tx_drop, g(a).tx_drop),
        router_rx_dropped: d(ri(b).rx_drop, ri(a).rx_drop),
        softnet_dropped: d(softnet_drop(b), softnet_drop(a)),
        router_ip_discards: d(
            snmp_sum(b, 1, &["Ip:InDiscards", "Ip:OutDiscards", "Ip:InHdrErrors"]),
            snmp_sum(a, 1, &["Ip:InDiscards", "Ip:OutDiscards", "Ip:InHdrErrors"]),
        ),
        router_not_forwarded: d(
            snmp_sum(b, 1, &["Ip:InAddrErrors", "Ip:InNoRoutes"]),
            snmp_sum(a, 1, &["Ip:InAddrErrors", "Ip:InNoRoutes"]),
        ),
        conntrack: d(ct(b), ct(a)),
        router_tx_dropped: d(ro(b).tx_drop, ro(a).tx_drop),
    };
    let cpus = b
        .stat
        .iter()
        .map(|(c, _)| cpu_work(*c, a, b, secs))
        .collect();
    let threads = b
        .threads
        .iter()
        .zip(thread_names)
        .map(|(t, (name, cpus))| {
            let before = a
                .threads
                .iter()
                .find(|x| x.id == t.id)
                .copied()
                .unwrap_or_default();
            ThreadBusy {
                name: name.clone(),
                cpus: cpus.clone(),
                busy_pct: d(t.run_ns, before.run_ns) as f64 / 1e7 / secs,
                wait_pct: d(t.wait_ns, before.wait_ns) as f64 / 1e7 / secs,
            }
        })
        .collect();
    Some(Window {
        secs,
        forwarded_pps: d(tx(b, n), tx(a, n)) as f64 / secs,
        per_second,
        offered_pps: d(g(b).tx_packets, g(a).tx_packets) as f64 / secs,
        received_pps: d(ri(b).rx_packets, ri(a).rx_packets) as f64 / secs,
        generated_pps: d(b.gen_sent, a.gen_sent) as f64 / secs,
        sink_pps: d(
            snmp_sum(b, 2, &["Ip:InReceives"]),
            snmp_sum(a, 2, &["Ip:InReceives"]),
        ) as f64
            / secs,
        conntrack_entries: b.conntrack.get("entries").copied().unwrap_or(0),
        drops,
        cpus,
        threads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_stat_sums_hex_rows() {
        let t = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n\
                 00000010  00000000 00000000 00000000 00000002 00000000 00000000 00000000 00000000 00000000 0000000a 00000000 00000000  00000000 00000000 00000000 00000000\n\
                 00000010  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000005 00000000 00000000  00000000 00000000 00000000 00000000\n";
        let m = parse_conntrack_stat(t);
        assert_eq!(m["drop"], 15);
        assert_eq!(m["insert_failed"], 1);
        assert_eq!(m["invalid"], 2);
        assert_eq!(m["entries"], 16, "the table size, once");
    }

    #[test]
    fn schedstat_run_and_wait() {
        assert_eq!(parse_schedstat2("123 456 7\n"), Some((123, 456)));
        assert_eq!(parse_schedstat2("123"), None);
    }

    fn point(at: Instant, tx: u64, gen_tx: u64) -> Point {
        let c = |name: &str, txp: u64| IfCounters {
            name: name.into(),
            tx_packets: txp,
            ..Default::default()
        };
        Point {
            at,
            dev: [vec![c("g", gen_tx)], vec![c("ri", 0), c("ro", tx)], vec![]],
            snmp: Default::default(),
            conntrack: BTreeMap::new(),
            stat: vec![(0, CpuTimes::default())],
            net_rx: vec![],
            softnet: vec![],
            gen_sent: gen_tx,
            gen_errors: 0,
            threads: vec![],
        }
    }

    #[test]
    fn window_rates_and_per_second_series() {
        let t0 = Instant::now();
        let s = std::time::Duration::from_secs(1);
        let pts = vec![
            point(t0, 0, 0),
            point(t0 + s, 1000, 1500),
            point(t0 + 2 * s, 3000, 3000),
        ];
        let n = Names {
            gen: "g",
            router_in: "ri",
            router_out: "ro",
        };
        let w = window(&pts, &n, &[]).unwrap();
        assert_eq!(w.per_second, vec![1000.0, 2000.0]);
        assert!((w.forwarded_pps - 1500.0).abs() < 1e-9);
        assert!((w.offered_pps - 1500.0).abs() < 1e-9);
        assert_eq!(w.drops.total(), 0);
        assert!(window(&pts[..1], &n, &[]).is_none());
    }
}
