//! From a [`Snapshot`] to a [`Plan`] (pure): the server's reuseport groups, which worker polls
//! each listener and on which CPU it is pinned, the CPU → listener map to install, what falls
//! back to the kernel's hash, and the reasons to refuse.

use crate::discover::{Proc, Snapshot};
use crate::procscan::Waits;
use corelocal::bpf::cpu_pick::WORKERS_PER_CPU_MAX;
use corelocal::cpu::CpuSet;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

/// What a duplicate of a listener told us (`SO_REUSEPORT`, `SO_COOKIE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockFacts {
    /// `SO_REUSEPORT` is set.
    pub reuseport: bool,
    /// The socket cookie.
    pub cookie: u64,
}

/// A process (or one of its threads) that accepts on a listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Worker {
    /// Process id.
    pub pid: u32,
    /// Thread id, when the listener belongs to one thread of a multi-threaded process.
    pub tid: Option<u32>,
    /// Command name.
    pub comm: String,
    /// CPUs it may run on (cpulist).
    pub affinity: String,
    /// The CPU it is pinned to (affinity of exactly one CPU).
    pub cpu: Option<usize>,
}

/// One listener of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listener {
    /// Socket inode.
    pub inode: u64,
    /// Socket cookie (what the sockarray reports back).
    pub cookie: u64,
    /// A process holding it, and the descriptor there (for `pidfd_getfd`).
    pub holder_pid: u32,
    /// The descriptor in `holder_pid`.
    pub holder_fd: i32,
    /// Who accepts on it.
    pub workers: Vec<Worker>,
    /// The CPU SYNs come from to reach it, when all its workers are pinned to that one CPU.
    pub cpu: Option<usize>,
}

/// One reuseport group (one address; v4 and v6 are separate groups).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupPlan {
    /// The bound address.
    pub addr: SocketAddr,
    /// Its listeners held by the server, by inode.
    pub listeners: Vec<Listener>,
    /// CPU → indexes into `listeners` whose worker is pinned there (with several, the SYN's
    /// 4-tuple hash picks among them).
    pub cpu_map: BTreeMap<usize, Vec<usize>>,
    /// Online CPUs without a worker (SYNs there use the kernel's hash).
    pub cpus_without_worker: String,
    /// What falls back to the kernel's hash, and other remarks.
    pub notes: Vec<String>,
    /// Why this group cannot be steered.
    pub refusal: Option<String>,
}

/// A BPF program descriptor held by one of the server's processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldProg {
    /// The process holding it.
    pub pid: u32,
    /// The descriptor there.
    pub fd: i32,
    /// `BPF_PROG_TYPE_*` (from its fdinfo).
    pub prog_type: u32,
    /// The program's id.
    pub prog_id: u32,
}

/// The plan for one server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The PID given.
    pub pid: u32,
    /// Its groups (listening TCP addresses held by the tree), by address.
    pub groups: Vec<GroupPlan>,
    /// BPF programs the server's processes hold (a server that steers its own reuseport
    /// groups holds its program, or at least its maps).
    pub held_progs: Vec<HeldProg>,
}

impl Plan {
    /// Refusals of all groups, one line each.
    pub fn refusals(&self) -> Vec<String> {
        self.groups
            .iter()
            .filter_map(|g| g.refusal.as_ref().map(|r| format!("{}: {r}", g.addr)))
            .collect()
    }
}

/// Whether `addr` matches a `--listen` filter: `ADDR:PORT`, or `PORT` alone for every address.
pub fn matches_filter(addr: &SocketAddr, filters: &[String]) -> bool {
    filters.is_empty()
        || filters.iter().any(|f| match f.parse::<u16>() {
            Ok(port) => addr.port() == port,
            Err(_) => f.parse::<SocketAddr>().ok() == Some(*addr),
        })
}

const SHARED_POLLER_HINT: &str = "which thread accepts on which listener cannot be known (a \
    shared poller, e.g. Go's netpoller); what would work: one process per core (nginx, \
    lighttpd-style prefork with SO_REUSEPORT), or a server that sets SO_INCOMING_CPU itself";

/// Builds the plan. `facts`: per listener inode, from a duplicate (inodes missing there were
/// not readable); `online`: online CPUs; `filters`: `--listen` values.
pub fn plan(
    snap: &Snapshot,
    facts: &BTreeMap<u64, SockFacts>,
    online: &CpuSet,
    filters: &[String],
) -> Plan {
    let addr_of: BTreeMap<u64, SocketAddr> =
        snap.listeners.iter().map(|l| (l.inode, l.addr)).collect();
    // Listener inode → first holder (pid, fd).
    let mut holder: BTreeMap<u64, (u32, i32)> = BTreeMap::new();
    for p in &snap.procs {
        for &(fd, inode) in &p.sockets {
            if addr_of.contains_key(&inode) {
                holder.entry(inode).or_insert((p.pid, fd));
            }
        }
    }
    let mut by_addr: BTreeMap<SocketAddr, Vec<u64>> = BTreeMap::new();
    for &inode in holder.keys() {
        let addr = addr_of[&inode];
        if matches_filter(&addr, filters) {
            by_addr.entry(addr).or_default().push(inode);
        }
    }
    let groups = by_addr
        .into_iter()
        .map(|(addr, inodes)| plan_group(snap, facts, online, addr, &inodes, &holder))
        .collect();
    let held_progs = snap
        .procs
        .iter()
        .flat_map(|p| {
            p.bpf_progs
                .iter()
                .map(move |&(fd, prog_type, prog_id)| HeldProg {
                    pid: p.pid,
                    fd,
                    prog_type,
                    prog_id,
                })
        })
        .collect();
    Plan {
        pid: snap.root,
        groups,
        held_progs,
    }
}

/// How to pin the server's workers, one per CPU, said in the server's own configuration
/// language: nginx (`worker_cpu_affinity auto;`), HAProxy (`cpu-map auto:1/1-N …`), else
/// `taskset` for each worker (process, or thread of a threaded server).
/// `cpus`: the CPUs to put them on.
pub fn pin_advice(workers: &[Worker], cpus: &CpuSet) -> String {
    let comm = workers.first().map_or("", |w| w.comm.as_str());
    let cpus: Vec<usize> = cpus.iter().collect();
    let n = workers.len().max(1);
    if comm.starts_with("nginx") {
        return "pin one worker per CPU: add `worker_cpu_affinity auto;` to nginx.conf (main \
                context, next to `worker_processes`) and reload (`nginx -s reload`)"
            .to_string();
    }
    if comm.starts_with("haproxy") {
        let take: Vec<usize> = cpus.iter().copied().take(n).collect();
        let contiguous = take.windows(2).all(|w| w[1] == w[0] + 1);
        let set = match (take.first(), take.last()) {
            (Some(a), Some(b)) if contiguous && a != b => format!("{a}-{b}"),
            _ => take
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(" "),
        };
        return format!(
            "pin one thread per CPU: add `cpu-map auto:1/1-{n} {set}` to haproxy.cfg's global \
             section ({n} threads; with `bind … shards by-thread` each thread has its own \
             listener) and reload"
        );
    }
    let cmds: Vec<String> = workers
        .iter()
        .zip(cpus.iter().cycle())
        .map(|(w, cpu)| match w.tid {
            Some(t) => format!("taskset -pc {cpu} {t}"),
            None => format!("taskset -apc {cpu} {}", w.pid),
        })
        .collect();
    format!(
        "pin one worker per CPU, e.g. `{}` (or start each worker under `taskset -c CPU`)",
        cmds.join("; ")
    )
}

fn worker(p: &Proc, tid: Option<u32>, affinity: CpuSet) -> Worker {
    Worker {
        pid: p.pid,
        tid,
        comm: p.comm.clone(),
        cpu: (affinity.len() == 1).then(|| affinity.max()).flatten(),
        affinity: affinity.to_list(),
    }
}

fn plan_group(
    snap: &Snapshot,
    facts: &BTreeMap<u64, SockFacts>,
    online: &CpuSet,
    addr: SocketAddr,
    inodes: &[u64],
    holder: &BTreeMap<u64, (u32, i32)>,
) -> GroupPlan {
    let members: BTreeSet<u64> = inodes.iter().copied().collect();
    let mut refusal: Option<String> = None;
    let mut notes = Vec::new();
    let mut workers: BTreeMap<u64, Vec<Worker>> = BTreeMap::new();
    for p in &snap.procs {
        let fd_inode: BTreeMap<i32, u64> = p.sockets.iter().copied().collect();
        // Listeners of this group each of the process's epoll instances watches.
        let mut per_epoll: BTreeMap<i32, BTreeSet<u64>> = BTreeMap::new();
        for (epfd, targets) in &p.epolls {
            let set: BTreeSet<u64> = targets
                .iter()
                .map(|t| t.inode)
                .filter(|i| members.contains(i))
                .collect();
            if set.len() >= 2 && refusal.is_none() {
                refusal = Some(format!(
                    "threaded server: one epoll instance (fd {epfd} of pid {} {}) watches {} \
                     listeners of the group; {SHARED_POLLER_HINT}",
                    p.pid,
                    p.comm,
                    set.len()
                ));
            }
            if !set.is_empty() {
                per_epoll.insert(*epfd, set);
            }
        }
        // Threads blocked in accept() on a listener of the group.
        let mut accepting: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (ti, t) in p.tasks.iter().enumerate() {
            if let Some(Waits::Accept(fd)) = t.waits {
                if let Some(&inode) = fd_inode.get(&fd).filter(|i| members.contains(i)) {
                    accepting.entry(inode).or_default().push(ti);
                }
            }
        }
        let mut polled: BTreeSet<u64> = per_epoll.values().flatten().copied().collect();
        polled.extend(accepting.keys().copied());
        if polled.is_empty() {
            // Threads waiting where the descriptor is not visible (io_uring, poll) while the
            // process holds listeners of the group: its workers cannot be known.
            let held = p
                .sockets
                .iter()
                .filter(|(_, i)| members.contains(i))
                .count();
            let opaque = p
                .tasks
                .iter()
                .filter(|t| t.waits == Some(Waits::Opaque))
                .count();
            if held > 0 && opaque > 0 && p.tasks.len() > 1 && refusal.is_none() {
                refusal = Some(format!(
                    "threaded server: pid {} ({}) holds {held} listeners of the group and \
                     {opaque} of its threads wait in io_uring, poll or select, where the \
                     descriptor they accept on is not visible, so the thread of each listener \
                     cannot be known; {SHARED_POLLER_HINT} (corelocal serve: `--backend epoll`)",
                    p.pid, p.comm
                ));
            }
            continue;
        }
        if polled.len() == 1 || p.tasks.len() <= 1 {
            if polled.len() > 1 {
                notes.push(format!(
                    "pid {} ({}) polls {} listeners of the group in one thread: each keeps \
                     the CPU of the process",
                    p.pid,
                    p.comm,
                    polled.len()
                ));
            }
            for inode in polled {
                workers
                    .entry(inode)
                    .or_default()
                    .push(worker(p, None, p.affinity()));
            }
            continue;
        }
        // A multi-threaded process polling several listeners: map each thread by what it is
        // blocked in.
        let mut threads_of: BTreeMap<u64, CpuSet> = BTreeMap::new();
        let mut tids_of: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for t in &p.tasks {
            let set = match t.waits {
                Some(Waits::Epoll(fd)) => per_epoll.get(&fd).cloned().unwrap_or_default(),
                Some(Waits::Accept(fd)) => fd_inode
                    .get(&fd)
                    .filter(|i| members.contains(i))
                    .map(|&i| BTreeSet::from([i]))
                    .unwrap_or_default(),
                _ => BTreeSet::new(),
            };
            if set.len() == 1 {
                let inode = *set.iter().next().expect("one element");
                let a = threads_of.entry(inode).or_default();
                *a = a.union(&t.affinity);
                tids_of.entry(inode).or_default().push(t.tid);
            }
        }
        let unresolved: Vec<u64> = polled
            .iter()
            .copied()
            .filter(|i| !threads_of.contains_key(i))
            .collect();
        if !unresolved.is_empty() && refusal.is_none() {
            refusal = Some(format!(
                "threaded server: pid {} ({}) polls {} listeners of the group from its threads \
                 and the thread of {} of them cannot be known (threads running, or waiting in \
                 poll/select/io_uring where the descriptor is not visible); {SHARED_POLLER_HINT}",
                p.pid,
                p.comm,
                polled.len(),
                unresolved.len()
            ));
        }
        for (inode, affinity) in threads_of {
            let tids = &tids_of[&inode];
            workers
                .entry(inode)
                .or_default()
                .push(worker(p, Some(tids[0]), affinity));
        }
    }

    let mut listeners = Vec::new();
    let mut unpinned: Vec<(u64, Vec<Worker>)> = Vec::new();
    let mut any_not_reuseport = false;
    for &inode in inodes {
        let (holder_pid, holder_fd) = holder[&inode];
        let f = facts.get(&inode);
        if f.map(|f| !f.reuseport).unwrap_or(false) {
            any_not_reuseport = true;
        }
        let ws = workers.remove(&inode).unwrap_or_default();
        let cpus: BTreeSet<Option<usize>> = ws.iter().map(|w| w.cpu).collect();
        let cpu = match (ws.is_empty(), cpus.len()) {
            (false, 1) => *cpus.iter().next().expect("one element"),
            _ => None,
        };
        if ws.is_empty() {
            notes.push(format!(
                "listener inode {inode} (fd {holder_fd} of pid {holder_pid}): no worker polls \
                 it; it gets SYNs only by the kernel's hash"
            ));
        } else if cpu.is_none() {
            unpinned.push((inode, ws.clone()));
        }
        listeners.push(Listener {
            inode,
            cookie: f.map_or(0, |f| f.cookie),
            holder_pid,
            holder_fd,
            workers: ws,
            cpu,
        });
    }
    let mut cpu_map: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, l) in listeners.iter().enumerate() {
        if let Some(cpu) = l.cpu {
            cpu_map.entry(cpu).or_default().push(i);
        }
    }
    for (cpu, ls) in &cpu_map {
        if ls.len() > 1 {
            notes.push(format!(
                "cpu {cpu}: {} listeners have their worker pinned there; its SYNs are \
                 spread over them by the 4-tuple hash{}",
                ls.len(),
                if ls.len() > WORKERS_PER_CPU_MAX as usize {
                    format!(" (the first {WORKERS_PER_CPU_MAX} only)")
                } else {
                    String::new()
                }
            ));
        }
    }
    let mapped: CpuSet = cpu_map.keys().copied().collect();
    let without = online.difference(&mapped);
    if !cpu_map.is_empty() {
        for (inode, ws) in &unpinned {
            let who: Vec<String> = ws
                .iter()
                .map(|w| format!("pid {} ({}) on cpus {}", w.pid, w.comm, w.affinity))
                .collect();
            let free = if without.is_empty() { online } else { &without };
            notes.push(format!(
                "listener inode {inode}: worker not pinned to one CPU ({}): it gets SYNs only \
                 by the kernel's hash; {}",
                who.join(", "),
                pin_advice(ws, free)
            ));
        }
    }
    if !without.is_empty() && !cpu_map.is_empty() {
        notes.push(format!(
            "cpus {} have no pinned worker: SYNs processed there use the kernel's hash",
            without.to_list()
        ));
    }
    if refusal.is_none() {
        refusal = if any_not_reuseport {
            Some(format!(
                "not reuseport: the listening socket has no SO_REUSEPORT, so all workers share \
                 one accept queue and there is nothing to steer; what would work: one \
                 SO_REUSEPORT listener per worker (nginx: `listen {} reuseport;`)",
                addr
            ))
        } else if listeners.len() < 2 {
            Some(
                "only one listener in the group: nothing to choose between; what would work: \
                 one SO_REUSEPORT listener per worker (nginx: `listen … reuseport` with 2+ \
                 workers)"
                    .to_string(),
            )
        } else if listeners.iter().all(|l| l.workers.is_empty()) {
            Some(
                "no process or thread of the server polls the group's listeners (in epoll or \
                 accept), so none can be given its CPU's SYNs"
                    .to_string(),
            )
        } else if cpu_map.is_empty() {
            let all: Vec<Worker> = listeners.iter().flat_map(|l| l.workers.clone()).collect();
            Some(format!(
                "no worker is pinned to a CPU, so no CPU has a listener of its own; what would \
                 work: {}",
                pin_advice(&all, online)
            ))
        } else {
            None
        };
    }
    GroupPlan {
        addr,
        listeners,
        cpu_map,
        cpus_without_worker: without.to_list(),
        notes,
        refusal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::Task;
    use crate::procscan::{EpollTarget, ListenEntry};

    fn task(tid: u32, cpus: &str, waits: Option<Waits>) -> Task {
        Task {
            tid,
            affinity: CpuSet::parse_list(cpus).unwrap(),
            waits,
        }
    }

    fn proc_(pid: u32, ppid: u32, tasks: Vec<Task>, sockets: &[(i32, u64)]) -> Proc {
        Proc {
            pid,
            ppid,
            comm: "nginx".into(),
            start_ticks: 1,
            tasks,
            sockets: sockets.to_vec(),
            epolls: vec![],
            bpf_progs: vec![],
        }
    }

    fn epoll(fd: i32, targets: &[(i32, u64)]) -> (i32, Vec<EpollTarget>) {
        (
            fd,
            targets
                .iter()
                .map(|&(tfd, inode)| EpollTarget { tfd, inode })
                .collect(),
        )
    }

    /// nginx: master holds both listeners, each worker polls its own.
    fn nginx(reuseport: bool, cpus: [&str; 2]) -> (Snapshot, BTreeMap<u64, SockFacts>) {
        let mut w0 = proc_(11, 10, vec![task(11, cpus[0], None)], &[(6, 100)]);
        w0.epolls.push(epoll(9, &[(6, 100)]));
        let mut w1 = proc_(12, 10, vec![task(12, cpus[1], None)], &[(7, 101)]);
        w1.epolls.push(epoll(9, &[(7, 101)]));
        let master = proc_(10, 1, vec![task(10, "0-1", None)], &[(6, 100), (7, 101)]);
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let snap = Snapshot {
            root: 10,
            procs: vec![master, w0, w1],
            listeners: vec![
                ListenEntry { inode: 100, addr },
                ListenEntry { inode: 101, addr },
                ListenEntry {
                    inode: 999,
                    addr: "0.0.0.0:22".parse().unwrap(),
                },
            ],
            unreadable: vec![],
        };
        let facts = [100, 101]
            .into_iter()
            .map(|i| {
                (
                    i,
                    SockFacts {
                        reuseport,
                        cookie: i + 5000,
                    },
                )
            })
            .collect();
        (snap, facts)
    }

    #[test]
    fn nginx_workers_map_their_cpus_to_their_listeners() {
        let (snap, facts) = nginx(true, ["0", "1"]);
        let plan = plan(&snap, &facts, &CpuSet::first_n(2), &[]);
        assert_eq!(plan.groups.len(), 1, "sshd's listener is not ours");
        let g = &plan.groups[0];
        assert_eq!(g.refusal, None);
        assert_eq!(g.listeners.len(), 2);
        assert_eq!(g.listeners[0].workers[0].pid, 11);
        assert_eq!(g.listeners[0].holder_pid, 10, "the master holds it first");
        assert_eq!(g.listeners[1].cookie, 5101);
        assert_eq!(g.cpu_map, BTreeMap::from([(0, vec![0]), (1, vec![1])]));
        assert!(g.notes.is_empty(), "{:?}", g.notes);
    }

    #[test]
    fn swapped_affinity_swaps_the_map() {
        let (snap, facts) = nginx(true, ["1", "0"]);
        let g = &plan(&snap, &facts, &CpuSet::first_n(2), &[]).groups[0];
        assert_eq!(g.cpu_map, BTreeMap::from([(1, vec![0]), (0, vec![1])]));
    }

    #[test]
    fn unpinned_workers_and_idle_cpus_fall_back_and_say_so() {
        let (snap, facts) = nginx(true, ["0", "0-3"]);
        let g = &plan(&snap, &facts, &CpuSet::first_n(4), &[]).groups[0];
        assert_eq!(g.refusal, None);
        assert_eq!(g.cpu_map, BTreeMap::from([(0, vec![0])]));
        assert_eq!(g.cpus_without_worker, "1-3");
        assert!(g.notes.iter().any(|n| n.contains("not pinned")));
        assert!(g
            .notes
            .iter()
            .any(|n| n.contains("cpus 1-3 have no pinned worker")));
        let (snap, facts) = nginx(true, ["0-1", "0-1"]);
        let g = &plan(&snap, &facts, &CpuSet::first_n(2), &[]).groups[0];
        assert!(g.refusal.as_ref().unwrap().contains("no worker is pinned"));
    }

    fn w(pid: u32, tid: Option<u32>, comm: &str) -> Worker {
        Worker {
            pid,
            tid,
            comm: comm.into(),
            affinity: "0-3".into(),
            cpu: None,
        }
    }

    #[test]
    fn unpinned_workers_get_the_line_for_their_server() {
        let four = CpuSet::first_n(4);
        let a = pin_advice(&[w(11, None, "nginx"), w(12, None, "nginx")], &four);
        assert!(a.contains("`worker_cpu_affinity auto;`"), "{a}");
        let threads = [w(20, Some(21), "haproxy"), w(20, Some(22), "haproxy")];
        let a = pin_advice(&threads, &four);
        assert!(a.contains("`cpu-map auto:1/1-2 0-1`"), "{a}");
        let odd = CpuSet::parse_list("1,3").unwrap();
        let a = pin_advice(&threads, &odd);
        assert!(a.contains("`cpu-map auto:1/1-2 1 3`"), "{a}");
        let a = pin_advice(&[w(31, None, "python3"), w(32, None, "python3")], &odd);
        assert!(a.contains("`taskset -apc 1 31; taskset -apc 3 32`"), "{a}");
        let a = pin_advice(&[w(40, Some(41), "java"), w(40, Some(42), "java")], &four);
        assert!(a.contains("`taskset -pc 0 41; taskset -pc 1 42`"), "{a}");
        // The refusal carries it.
        let (snap, facts) = nginx(true, ["0-1", "0-1"]);
        let g = &plan(&snap, &facts, &CpuSet::first_n(2), &[]).groups[0];
        assert!(g
            .refusal
            .as_ref()
            .unwrap()
            .contains("worker_cpu_affinity auto;"));
        // One worker of two unpinned: the note names the CPU without a worker.
        let (mut snap, facts) = nginx(true, ["0", "0-1"]);
        for p in &mut snap.procs {
            p.comm = "python3".into();
        }
        let g = &plan(&snap, &facts, &CpuSet::first_n(2), &[]).groups[0];
        assert!(
            g.notes.iter().any(|n| n.contains("`taskset -apc 1 12`")),
            "{:?}",
            g.notes
        );
    }

    #[test]
    fn two_workers_on_one_cpu_share_its_syns() {
        let (snap, facts) = nginx(true, ["1", "1"]);
        let g = &plan(&snap, &facts, &CpuSet::first_n(2), &[]).groups[0];
        assert_eq!(g.refusal, None);
        assert_eq!(g.cpu_map, BTreeMap::from([(1, vec![0, 1])]));
        assert!(
            g.notes.iter().any(|n| n.contains("spread")),
            "{:?}",
            g.notes
        );
        assert_eq!(g.cpus_without_worker, "0");
    }

    #[test]
    fn not_reuseport_is_refused() {
        let (snap, facts) = nginx(false, ["0", "1"]);
        let p = plan(&snap, &facts, &CpuSet::first_n(2), &[]);
        assert!(
            p.refusals()[0].contains("not reuseport"),
            "{:?}",
            p.refusals()
        );
    }

    #[test]
    fn listen_filter() {
        let (snap, facts) = nginx(true, ["0", "1"]);
        assert_eq!(
            plan(&snap, &facts, &CpuSet::first_n(2), &["9090".into()])
                .groups
                .len(),
            0
        );
        assert_eq!(
            plan(
                &snap,
                &facts,
                &CpuSet::first_n(2),
                &["127.0.0.1:8080".into()]
            )
            .groups
            .len(),
            1
        );
    }

    #[test]
    fn a_shared_netpoller_is_refused() {
        // One process, one epoll watching both listeners, many threads (Go).
        let mut p = proc_(
            20,
            1,
            vec![
                task(20, "0", Some(Waits::Epoll(4))),
                task(21, "1", Some(Waits::Other)),
            ],
            &[(3, 100), (5, 101)],
        );
        p.epolls.push(epoll(4, &[(3, 100), (5, 101)]));
        let (mut snap, facts) = nginx(true, ["0", "1"]);
        snap.procs = vec![p];
        snap.root = 20;
        let r = plan(&snap, &facts, &CpuSet::first_n(2), &[]).refusals();
        assert!(r[0].contains("shared poller"), "{r:?}");
    }

    #[test]
    fn threads_with_their_own_epoll_are_mapped_by_what_they_wait_in() {
        // corelocal serve --mode fine --backend epoll: one epoll per pinned worker thread.
        let mut p = proc_(
            30,
            1,
            vec![
                task(30, "0-1", Some(Waits::Other)),
                task(31, "0", Some(Waits::Epoll(8))),
                task(32, "1", Some(Waits::Epoll(9))),
            ],
            &[(3, 100), (5, 101)],
        );
        p.epolls.push(epoll(8, &[(3, 100)]));
        p.epolls.push(epoll(9, &[(5, 101)]));
        let (mut snap, facts) = nginx(true, ["0", "1"]);
        snap.procs = vec![p.clone()];
        let g = &plan(&snap, &facts, &CpuSet::first_n(2), &[]).groups[0];
        assert_eq!(g.refusal, None);
        assert_eq!(g.cpu_map, BTreeMap::from([(0, vec![0]), (1, vec![1])]));
        assert_eq!(g.listeners[1].workers[0].tid, Some(32));
        // A thread that is running cannot be placed: refuse rather than guess.
        p.tasks[2].waits = None;
        snap.procs = vec![p];
        let r = plan(&snap, &facts, &CpuSet::first_n(2), &[]).refusals();
        assert!(r[0].contains("cannot be known"), "{r:?}");
    }

    #[test]
    fn threads_waiting_in_io_uring_are_refused() {
        // corelocal serve --backend uring: listeners in rings, threads in io_uring_enter.
        let p = proc_(
            40,
            1,
            vec![
                task(40, "0-1", Some(Waits::Other)),
                task(41, "0", Some(Waits::Opaque)),
                task(42, "1", Some(Waits::Opaque)),
            ],
            &[(3, 100), (5, 101)],
        );
        let (mut snap, facts) = nginx(true, ["0", "1"]);
        snap.procs = vec![p];
        let r = plan(&snap, &facts, &CpuSet::first_n(2), &[]).refusals();
        assert!(r[0].contains("io_uring"), "{r:?}");
    }
}
