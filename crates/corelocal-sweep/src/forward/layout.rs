//! The layouts compared, as plans (pure), and their application to the router namespace.
//!
//! RPS and XPS values are a corelocal-tune [`Plan`] of `rps_cpus` / `xps_cpus` settings on
//! the router's interfaces, written by tune's `apply` (snapshot first, read back) and restored
//! by tune's `revert` (byte-exact, read back) from a thread that joined the router namespace
//! and mounted its own sysfs (the router's veths exist only there). Threaded NAPI — the veth's
//! stand-in for IRQ affinity — is not a tune knob: GRO on the ingress veth (which gives a veth
//! a NAPI context), `threaded` = 1, and the `napi/IF-ID` kernel threads pinned; saved and
//! restored here the same way.
//!
//! Pitfalls (seen on this kernel): without NAPI, veth delivers a packet on the sender's CPU,
//! as loopback does, so with no steering the whole router runs inside the generator's
//! `sendmmsg`; RPS on a non-NAPI veth looks up rx-(N-1) for a packet sent on tx queue N, so
//! RPS is written to every RX queue alike; with NAPI a full ring drops in the generator's
//! `tx_dropped` only.

use crate::forward::testbed::Ifaces;
use crate::place::in_netns;
use crate::sys;
use corelocal::cpu::{CpuSet, Topology};
use corelocal_tune::apply::{self, ApplyOptions, OnError, Snapshot};
use corelocal_tune::fs::{trimmed, Fs, RootFs};
use corelocal_tune::knob::{Knob, Value};
use corelocal_tune::plan::{self, Plan, Profile, Setting, PLAN_FORMAT};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A router layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// Nothing set: the router runs where the packet was sent (the generator's CPU).
    Default,
    /// RPS on every RX queue of the ingress veth to the CPUs other than the generator's.
    RpsOther,
    /// RPS on every RX queue of the ingress veth to every CPU (flows hashed across them).
    RpsSpread,
    /// `rps-spread` plus XPS on the egress veth: each CPU sends on its own TX queue.
    Xps,
    /// Threaded NAPI on the ingress veth (GRO on), its kernel threads pinned to the CPUs
    /// other than the generator's: the veth analogue of moving the NIC's IRQs away.
    NapiOther,
    /// Threaded NAPI, RX queue q's thread pinned to CPU q mod n: one queue per CPU, as in
    /// the seed's final IRQ table.
    NapiSpread,
}

impl Layout {
    /// Every layout, in the default order.
    pub const ALL: [Layout; 6] = [
        Layout::Default,
        Layout::RpsOther,
        Layout::RpsSpread,
        Layout::Xps,
        Layout::NapiOther,
        Layout::NapiSpread,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Default => "default",
            Layout::RpsOther => "rps-other",
            Layout::RpsSpread => "rps-spread",
            Layout::Xps => "xps",
            Layout::NapiOther => "napi-other",
            Layout::NapiSpread => "napi-spread",
        }
    }

    /// One line on what it sets.
    pub fn describe(self) -> &'static str {
        match self {
            Layout::Default => "nothing set (RPS/XPS 0, no NAPI)",
            Layout::RpsOther => "ingress rps_cpus = CPUs other than the generator's",
            Layout::RpsSpread => "ingress rps_cpus = all CPUs",
            Layout::Xps => "ingress rps_cpus = all CPUs; egress xps_cpus one TX queue per CPU",
            Layout::NapiOther => "ingress GRO + threaded NAPI, threads on the other CPUs",
            Layout::NapiSpread => "ingress GRO + threaded NAPI, RX queue q's thread on CPU q",
        }
    }

    fn napi(self) -> bool {
        matches!(self, Layout::NapiOther | Layout::NapiSpread)
    }
}

/// Parses a comma-separated layout list (`default,rps-other`, or `all`).
pub fn parse_layouts(text: &str) -> Result<Vec<Layout>, String> {
    if text.trim() == "all" {
        return Ok(Layout::ALL.to_vec());
    }
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let l = Layout::ALL
            .into_iter()
            .find(|l| l.name() == part)
            .ok_or_else(|| {
                let names: Vec<&str> = Layout::ALL.iter().map(|l| l.name()).collect();
                format!(
                    "unknown layout {part:?} (one of: {}, all)",
                    names.join(", ")
                )
            })?;
        if !out.contains(&l) {
            out.push(l);
        }
    }
    if out.is_empty() {
        return Err("no layout given".into());
    }
    Ok(out)
}

/// Threaded NAPI on one interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NapiPlan {
    /// The interface (the router's ingress veth).
    pub iface: String,
    /// CPUs for RX queue q's thread, indexed by q.
    pub pins: Vec<CpuSet>,
    /// Nice value for the threads (0: left as the kernel made them).
    pub nice: i32,
}

/// What one layout writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutPlan {
    /// The layout.
    pub layout: Layout,
    /// RPS / XPS settings, for corelocal-tune.
    pub plan: Plan,
    /// Threaded NAPI, if the layout uses it.
    pub napi: Option<NapiPlan>,
}

/// The CPUs that are not the generator's (all but the first when it is not pinned).
pub fn other_cpus(cpus: &CpuSet, gen_cpu: Option<usize>) -> CpuSet {
    let mut o = cpus.clone();
    match gen_cpu {
        Some(g) => o.remove(g),
        None => {
            if let Some(first) = cpus.iter().next() {
                o.remove(first);
            }
        }
    }
    o
}

fn empty_plan(ifs: &Ifaces, cpus: &CpuSet) -> Plan {
    Plan {
        format: PLAN_FORMAT.into(),
        profile: Profile::Rps,
        nics: vec![ifs.router_in.clone(), ifs.router_out.clone()],
        housekeeping_cpus: CpuSet::new(),
        network_cores: cpus.iter().collect(),
        app_cpus: None,
        settings: Vec::new(),
        notes: Vec::new(),
    }
}

fn rps(ifs: &Ifaces, queues: usize, set: &CpuSet) -> Vec<Setting> {
    (0..queues as u32)
        .map(|queue| Setting {
            knob: Knob::RpsCpus {
                nic: ifs.router_in.clone(),
                queue,
            },
            value: Value::Cpus(set.clone()),
        })
        .collect()
}

/// The plan of `layout` for a router on `cpus` (the host's online CPUs), the generator on
/// `gen_cpu`, veths of `queues` queues; NAPI threads get nice value `nice`.
pub fn plan_layout(
    layout: Layout,
    topo: &Topology,
    cpus: &CpuSet,
    gen_cpu: Option<usize>,
    ifs: &Ifaces,
    queues: usize,
    nice: i32,
) -> Result<LayoutPlan, String> {
    let other = other_cpus(cpus, gen_cpu);
    if other.is_empty() && matches!(layout, Layout::RpsOther | Layout::NapiOther) {
        return Err(format!(
            "layout {} needs a CPU besides the generator's",
            layout.name()
        ));
    }
    let mut p = empty_plan(ifs, cpus);
    match layout {
        Layout::Default | Layout::NapiOther | Layout::NapiSpread => {}
        Layout::RpsOther => p.settings = rps(ifs, queues, &other),
        Layout::RpsSpread => p.settings = rps(ifs, queues, cpus),
        Layout::Xps => {
            p.settings = rps(ifs, queues, cpus);
            let order: Vec<usize> = cpus.iter().collect();
            let placement = plan::place_queues(queues as u32, &order);
            for (queue, set) in plan::xps_map(topo, &placement, queues)
                .into_iter()
                .enumerate()
            {
                p.settings.push(Setting {
                    knob: Knob::XpsCpus {
                        nic: ifs.router_out.clone(),
                        queue: queue as u32,
                    },
                    value: Value::Cpus(set.intersection(cpus)),
                });
            }
        }
    }
    p.notes
        .push(format!("corelocal sweep forward layout {}", layout.name()));
    let napi = layout.napi().then(|| {
        let order: Vec<usize> = cpus.iter().collect();
        let pins = (0..queues)
            .map(|q| match layout {
                Layout::NapiOther => other.clone(),
                _ => CpuSet::single(order[q % order.len()]),
            })
            .collect();
        NapiPlan {
            iface: ifs.router_in.clone(),
            pins,
            nice,
        }
    });
    Ok(LayoutPlan {
        layout,
        plan: p,
        napi,
    })
}

/// A `napi/IF-ID` kernel thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NapiThread {
    /// Its pid.
    pub pid: u32,
    /// Its name.
    pub name: String,
    /// The RX queue it serves (threads sorted by NAPI id: veth adds rx-0's NAPI first).
    pub queue: usize,
    /// The CPUs it may run on, read back (`Cpus_allowed_list`).
    pub cpus: String,
    /// Its nice value, read back.
    pub nice: i64,
}

/// What [`apply_layout`] changed, for [`revert_layout`].
#[derive(Debug)]
pub struct Applied {
    /// Every value read back after applying, one line each (`path = value`).
    pub readback: Vec<String>,
    /// The NAPI threads and where they were pinned.
    pub threads: Vec<NapiThread>,
    snapshot_path: Option<PathBuf>,
    napi_saved: Option<(bool, String)>,
}

/// The `napi/IFACE-ID` threads now, by NAPI id.
pub fn napi_threads(iface: &str) -> Vec<NapiThread> {
    let prefix = format!("napi/{iface}-");
    let mut found: Vec<(u64, u32, String)> = Vec::new();
    for e in std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .take(1 << 20)
    {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        let comm = comm.trim();
        if let Some(id) = comm
            .strip_prefix(&prefix)
            .and_then(|i| i.parse::<u64>().ok())
        {
            found.push((id, pid, comm.to_string()));
        }
    }
    found.sort();
    found
        .into_iter()
        .enumerate()
        .map(|(queue, (_, pid, name))| NapiThread {
            pid,
            name,
            queue,
            cpus: allowed_cpus(pid).unwrap_or_default(),
            nice: nice_of(pid).unwrap_or(0),
        })
        .collect()
}

/// The nice value of a task (`/proc/PID/stat` field 19).
pub fn nice_of(pid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(16)?.parse().ok()
}

/// `Cpus_allowed_list` of a task.
pub fn allowed_cpus(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

/// Refuses unless /sys/class/net shows exactly `lo` and `want` (proof this sysfs is the
/// router namespace's).
fn check_router_sysfs(fs: &RootFs, want: &[&str]) -> Result<(), String> {
    let mut ifs = fs
        .list("sys/class/net")
        .map_err(|e| format!("listing /sys/class/net: {e}"))?;
    ifs.retain(|i| i != "lo");
    ifs.sort();
    let mut w: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    w.sort();
    if ifs == w {
        Ok(())
    } else {
        Err(format!(
            "refusing to write: /sys/class/net shows {ifs:?}, not just lo and {w:?}"
        ))
    }
}

fn scratch_snapshot() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("clfwd-{}-{n}.snapshot.json", std::process::id()))
}

fn wait_threads(iface: &str, want: usize) -> Vec<NapiThread> {
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        let t = napi_threads(iface);
        if t.len() == want || Instant::now() > end {
            return t;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn apply_napi(fs: &RootFs, n: &NapiPlan) -> Result<((bool, String), Vec<NapiThread>), String> {
    let threaded = format!("sys/class/net/{}/threaded", n.iface);
    let saved_threaded = fs.read(&threaded).map_err(|e| format!("{threaded}: {e}"))?;
    let saved_gro = sys::gro(&n.iface).map_err(|e| format!("GRO of {}: {e}", n.iface))?;
    sys::set_gro(&n.iface, true).map_err(|e| format!("GRO on {}: {e}", n.iface))?;
    fs.write(&threaded, "1\n")
        .map_err(|e| format!("writing {threaded}: {e}"))?;
    let saved = (saved_gro, saved_threaded);
    let threads = wait_threads(&n.iface, n.pins.len());
    if threads.len() != n.pins.len() {
        return Err(format!(
            "{} napi/{}-* threads, expected {} (one per RX queue)",
            threads.len(),
            n.iface,
            n.pins.len()
        ));
    }
    let mut out = Vec::new();
    for t in threads {
        let want = &n.pins[t.queue];
        sys::set_affinity(t.pid, want).map_err(|e| format!("pinning {}: {e}", t.name))?;
        if n.nice != 0 {
            sys::set_nice(t.pid, n.nice).map_err(|e| format!("nice of {}: {e}", t.name))?;
        }
        let cpus = allowed_cpus(t.pid).unwrap_or_default();
        let nice = nice_of(t.pid).unwrap_or(0);
        if nice != i64::from(n.nice) && n.nice != 0 {
            return Err(format!(
                "{} has nice {nice} after setting {}",
                t.name, n.nice
            ));
        }
        if CpuSet::parse_list(&cpus).ok().as_ref() != Some(want) {
            return Err(format!(
                "{} runs on {cpus:?} after pinning to {}",
                t.name,
                want.to_list()
            ));
        }
        out.push(NapiThread { cpus, nice, ..t });
    }
    Ok((saved, out))
}

/// Applies `lp` in router namespace `ns` (interfaces `ifs`) and reads every value back.
pub fn apply_layout(
    ns: &str,
    ifs: &Ifaces,
    lp: &LayoutPlan,
    online: &CpuSet,
) -> Result<Applied, String> {
    let (ifs, lp, online) = (ifs.clone(), lp.clone(), online.clone());
    let ns_name = ns.to_string();
    in_netns(ns, true, move || {
        let fs = RootFs::new("/");
        check_router_sysfs(&fs, &[&ifs.router_in, &ifs.router_out])?;
        let mut applied = Applied {
            readback: Vec::new(),
            threads: Vec::new(),
            snapshot_path: None,
            napi_saved: None,
        };
        if !lp.plan.settings.is_empty() {
            let snap = scratch_snapshot();
            let opts = ApplyOptions {
                yes: true,
                force: false,
                on_error: OnError::Rollback,
            };
            let report = apply::apply(&fs, &online, &lp.plan, &opts, &snap)
                .map_err(|e| format!("tune apply in {ns_name}: {e}"))?;
            if report.wrote {
                applied.snapshot_path = Some(snap.clone());
            }
            if !report.failures.is_empty() {
                // Rolled back (OnError::Rollback): the snapshot is no longer needed.
                let _ = std::fs::remove_file(&snap);
                let msgs: Vec<String> = report.failures.iter().map(|f| f.message.clone()).collect();
                return Err(format!("tune apply: {}", msgs.join("; ")));
            }
            let rows = corelocal_tune::verify::verify(&fs, &lp.plan)
                .map_err(|e| format!("tune verify: {e}"))?;
            for r in rows {
                if r.status != "ok" {
                    return Err(format!(
                        "{} reads {:?}, planned {} ({})",
                        r.path,
                        r.current,
                        r.planned,
                        r.detail.unwrap_or_default()
                    ));
                }
                applied
                    .readback
                    .push(format!("{} = {}", r.path, r.current.unwrap_or_default()));
            }
        }
        if let Some(n) = &lp.napi {
            match apply_napi(&fs, n) {
                Ok((saved, threads)) => {
                    applied.napi_saved = Some(saved);
                    let t = fs
                        .read(&format!("sys/class/net/{}/threaded", n.iface))
                        .unwrap_or_default();
                    applied.readback.push(format!(
                        "sys/class/net/{}/threaded = {} (GRO {})",
                        n.iface,
                        trimmed(&t),
                        if sys::gro(&n.iface).unwrap_or(false) {
                            "on"
                        } else {
                            "off"
                        }
                    ));
                    for th in &threads {
                        applied
                            .readback
                            .push(format!("{} (rx-{}) on CPU {}", th.name, th.queue, th.cpus));
                    }
                    applied.threads = threads;
                }
                Err(e) => {
                    // Put back whatever was switched before failing.
                    let _ = fs.write(&format!("sys/class/net/{}/threaded", n.iface), "0\n");
                    let _ = sys::set_gro(&n.iface, false);
                    return Err(e);
                }
            }
        }
        Ok(applied)
    })
}

/// Restores what [`apply_layout`] wrote (tune's byte-exact revert, NAPI back as it was) and
/// reads it back: returns one line per value, or what did not come back.
pub fn revert_layout(ns: &str, lp: &LayoutPlan, applied: Applied) -> Result<Vec<String>, String> {
    let lp = lp.clone();
    in_netns(ns, true, move || {
        let fs = RootFs::new("/");
        let mut out = Vec::new();
        let mut problems = Vec::new();
        if let (Some(n), Some((gro, threaded))) = (&lp.napi, &applied.napi_saved) {
            let path = format!("sys/class/net/{}/threaded", n.iface);
            if let Err(e) = fs.write(&path, threaded) {
                problems.push(format!("writing {path}: {e}"));
            }
            if let Err(e) = sys::set_gro(&n.iface, *gro) {
                problems.push(format!("GRO of {}: {e}", n.iface));
            }
            let now = fs.read(&path).unwrap_or_default();
            if now != *threaded {
                problems.push(format!("{path} reads {now:?}, was {threaded:?}"));
            }
            let end = Instant::now() + Duration::from_secs(2);
            while !napi_threads(&n.iface).is_empty() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            let left = napi_threads(&n.iface);
            if !left.is_empty() {
                problems.push(format!("{} napi thread(s) still running", left.len()));
            }
            out.push(format!(
                "{path} = {} (GRO {}), {} napi thread(s)",
                trimmed(&now),
                if sys::gro(&n.iface).unwrap_or(true) {
                    "on"
                } else {
                    "off"
                },
                left.len()
            ));
        }
        if let Some(path) = &applied.snapshot_path {
            let snap: Result<Snapshot, String> =
                corelocal_tune::load_json(path, "snapshot").map_err(|e| e.to_string());
            let _ = std::fs::remove_file(path);
            match snap.and_then(|s| apply::revert(&fs, &s).map_err(|e| e.to_string())) {
                Ok(r) => {
                    problems.extend(r.failures.iter().map(|f| f.message.clone()));
                    problems.extend(
                        r.mismatches
                            .iter()
                            .map(|(p, now)| format!("{p} reads {now:?} after revert")),
                    );
                }
                Err(e) => problems.push(format!("tune revert: {e}")),
            }
        }
        for s in &lp.plan.settings {
            let p = s.knob.path();
            out.push(format!(
                "{p} = {}",
                trimmed(&fs.read(&p).unwrap_or_default())
            ));
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems.join("; "))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo2() -> Topology {
        let dir = corelocal::testing::ScratchDir::new("clfwd-topo");
        corelocal::cpu::topology::fixture::write_host(
            &dir,
            corelocal::cpu::topology::fixture::HostShape {
                packages: 1,
                cores_per_package: 2,
                threads_per_core: 1,
            },
        )
        .unwrap();
        Topology::read(&dir).unwrap()
    }

    #[test]
    fn layouts_parse_by_name() {
        assert_eq!(parse_layouts("all").unwrap(), Layout::ALL.to_vec());
        assert_eq!(
            parse_layouts("xps, default,xps").unwrap(),
            vec![Layout::Xps, Layout::Default]
        );
        assert!(parse_layouts("irq").unwrap_err().contains("rps-other"));
        assert!(parse_layouts(",").is_err());
    }

    #[test]
    fn plans_write_what_each_layout_says() {
        let topo = topo2();
        let cpus = CpuSet::parse_list("0-1").unwrap();
        let ifs = Ifaces::new(7, 0);
        let p = |l| plan_layout(l, &topo, &cpus, Some(0), &ifs, 2, -5).unwrap();
        assert!(p(Layout::Default).plan.settings.is_empty());
        assert!(p(Layout::Default).napi.is_none());
        let other = p(Layout::RpsOther);
        assert_eq!(other.plan.settings.len(), 2, "every RX queue");
        assert!(other
            .plan
            .settings
            .iter()
            .all(|s| s.value == Value::Cpus(CpuSet::single(1))));
        let spread = p(Layout::RpsSpread);
        assert!(spread
            .plan
            .settings
            .iter()
            .all(|s| s.value == Value::Cpus(cpus.clone())));
        let xps = p(Layout::Xps);
        let x: Vec<&Setting> = xps
            .plan
            .settings
            .iter()
            .filter(|s| matches!(s.knob, Knob::XpsCpus { .. }))
            .collect();
        assert_eq!(x.len(), 2);
        assert_eq!(x[0].value, Value::Cpus(CpuSet::single(0)));
        assert_eq!(x[1].value, Value::Cpus(CpuSet::single(1)));
        assert_eq!(
            x[0].knob.path(),
            format!("sys/class/net/{}/queues/tx-0/xps_cpus", ifs.router_out)
        );
        let n = p(Layout::NapiOther).napi.unwrap();
        assert_eq!(n.pins, vec![CpuSet::single(1); 2]);
        assert_eq!(n.nice, -5);
        let n = p(Layout::NapiSpread).napi.unwrap();
        assert_eq!(n.pins, vec![CpuSet::single(0), CpuSet::single(1)]);
        let one = CpuSet::single(0);
        assert!(plan_layout(Layout::RpsOther, &topo, &one, Some(0), &ifs, 1, 0).is_err());
        assert_eq!(
            other_cpus(&cpus, None),
            CpuSet::single(1),
            "unpinned: all but the first"
        );
    }
}
