//! Pure placement logic: how a (flow CPU, application CPU) pair relates on the topology, the
//! order of the cells, where the sender goes, which IRQs to move, the axis order of the
//! heatmap, and the recommendation drawn from a finished matrix.

use corelocal::cpu::{CpuSet, Topology};
use serde::{Deserialize, Serialize};

/// How the application CPU relates to the flow (protocol processing) CPU: seed 003 §3.1's
/// four choices, with "same LLC" split from "same package" for hosts with several LLCs per
/// socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// The same logical CPU.
    SameCpu,
    /// SMT siblings of one physical core.
    SmtSibling,
    /// Different cores sharing the last-level cache.
    SameLlc,
    /// Same package (socket), different last-level caches.
    SamePackage,
    /// Different packages.
    OtherSocket,
}

impl Relation {
    /// Every relation, nearest first.
    pub const ALL: [Relation; 5] = [
        Relation::SameCpu,
        Relation::SmtSibling,
        Relation::SameLlc,
        Relation::SamePackage,
        Relation::OtherSocket,
    ];

    /// Where the application runs, relative to the flow CPU, as a sentence part
    /// ("… on {placement} the CPU that processes its flow").
    pub fn placement(self) -> &'static str {
        match self {
            Relation::SameCpu => "the same CPU as",
            Relation::SmtSibling => "an SMT sibling of",
            Relation::SameLlc => "another core sharing the LLC with",
            Relation::SamePackage => "another LLC on the same socket as",
            Relation::OtherSocket => "a core on another socket than",
        }
    }

    /// Words for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Relation::SameCpu => "same core",
            Relation::SmtSibling => "SMT sibling",
            Relation::SameLlc => "another core sharing the LLC",
            Relation::SamePackage => "another LLC on the same socket",
            Relation::OtherSocket => "another socket",
        }
    }
}

/// The relation of `app` to `flow`; `None` when either CPU is not in the topology.
pub fn relation(topo: &Topology, flow: usize, app: usize) -> Option<Relation> {
    let f = topo.cpu(flow)?;
    let a = topo.cpu(app)?;
    Some(if flow == app {
        Relation::SameCpu
    } else if f.siblings.contains(app) {
        Relation::SmtSibling
    } else if f.package != a.package {
        Relation::OtherSocket
    } else if f.llc_shared.contains(app) {
        Relation::SameLlc
    } else {
        Relation::SamePackage
    })
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cell {
    /// The CPU doing receive protocol processing (RPS target / IRQ affinity).
    pub flow: usize,
    /// The CPU the receiving application is pinned to.
    pub app: usize,
}

/// CPUs of the matrix in axis order: grouped by package (so the heatmap's quadrants are
/// contiguous), then by CPU number.
pub fn axis_order(topo: &Topology, cpus: &CpuSet) -> Vec<usize> {
    let mut v: Vec<usize> = cpus.iter().collect();
    v.sort_by_key(|&c| (topo.cpu(c).map_or(u32::MAX, |i| i.package), c));
    v
}

/// Package boundaries along an axis: (package, first index, count).
pub fn package_spans(topo: &Topology, axis: &[usize]) -> Vec<(u32, usize, usize)> {
    let mut spans: Vec<(u32, usize, usize)> = Vec::new();
    for (i, &c) in axis.iter().enumerate() {
        let p = topo.cpu(c).map_or(u32::MAX, |x| x.package);
        match spans.last_mut() {
            Some((lp, _, n)) if *lp == p => *n += 1,
            _ => spans.push((p, i, 1)),
        }
    }
    spans
}

/// The order cells run in: `rounds` passes over the matrix, each pass row by row but with the
/// rotation shifted per round, so drift (other load, thermal) spreads over all cells instead of
/// piling onto the last ones.
pub fn schedule(axis: &[usize], rounds: usize) -> Vec<(usize, Cell)> {
    let cells: Vec<Cell> = axis
        .iter()
        .flat_map(|&flow| axis.iter().map(move |&app| Cell { flow, app }))
        .collect();
    let n = cells.len().max(1);
    (0..rounds)
        .flat_map(|r| {
            let shift = (r * (axis.len() + 1)) % n;
            let cells = &cells;
            (0..cells.len()).map(move |i| (r, cells[(i + shift) % n]))
        })
        .collect()
}

/// Where the sender runs: a CPU of `allowed` outside the matrix, preferring one that shares
/// no physical core with a matrix CPU; `None` (left to the scheduler) when every allowed CPU
/// is in the matrix.
pub fn sender_cpu(topo: &Topology, matrix: &CpuSet, allowed: &CpuSet) -> Option<usize> {
    let outside: Vec<usize> = allowed.difference(matrix).iter().collect();
    let clean = outside.iter().copied().find(|&c| {
        topo.cpu(c)
            .is_some_and(|i| i.siblings.intersection(matrix).is_empty())
    });
    clean.or_else(|| outside.first().copied())
}

/// The interrupts to move for a NIC: its RX and combined queue IRQs, or, when no name says
/// which queue an IRQ serves, every IRQ that is not a control interrupt.
pub fn rx_irqs(nic: &corelocal_tune::state::NicState) -> Vec<u32> {
    use corelocal_tune::state::IrqRole;
    let rx: Vec<u32> = nic
        .irqs
        .iter()
        .filter(|i| matches!(i.role, IrqRole::Rx(_) | IrqRole::Combined(_)))
        .map(|i| i.irq)
        .collect();
    if !rx.is_empty() {
        return rx;
    }
    nic.irqs
        .iter()
        .filter(|i| i.role != IrqRole::Other)
        .map(|i| i.irq)
        .collect()
}

/// Mean throughput of one relation class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassSummary {
    /// The class.
    pub relation: Relation,
    /// Cells in it.
    pub cells: usize,
    /// Mean of the cells' median throughput, Gbit/s.
    pub mean_gbps: f64,
    /// Best cell's median throughput, Gbit/s.
    pub best_gbps: f64,
    /// mean_gbps ÷ the best class's mean_gbps.
    pub ratio_to_best: f64,
}

/// What the matrix recommends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// The best class, if any cell finished.
    pub relation: Option<Relation>,
    /// Whether the best class beats the runner-up by more than the noise margin.
    pub clear: bool,
    /// The best cell of the best class (an example placement).
    pub example: Option<Cell>,
    /// Classes this host cannot show (e.g. no SMT, one socket).
    pub untestable: Vec<Relation>,
    /// One-paragraph advice.
    pub text: String,
}

/// Relative difference below which two classes count as equal.
pub const NOISE_MARGIN: f64 = 0.05;

/// Mean throughput per relation class, nearest class first.
pub fn summarize(topo: &Topology, cells: &[(Cell, f64)]) -> Vec<ClassSummary> {
    let mut out: Vec<ClassSummary> = Relation::ALL
        .iter()
        .filter_map(|&rel| {
            let v: Vec<f64> = cells
                .iter()
                .filter(|(c, _)| relation(topo, c.flow, c.app) == Some(rel))
                .map(|(_, g)| *g)
                .collect();
            (!v.is_empty()).then(|| ClassSummary {
                relation: rel,
                cells: v.len(),
                mean_gbps: v.iter().sum::<f64>() / v.len() as f64,
                best_gbps: v.iter().copied().fold(f64::MIN, f64::max),
                ratio_to_best: 0.0,
            })
        })
        .collect();
    let best = out.iter().map(|c| c.mean_gbps).fold(0.0, f64::max);
    for c in &mut out {
        c.ratio_to_best = if best > 0.0 { c.mean_gbps / best } else { 0.0 };
    }
    out
}

/// Relations the topology could show for some pair of `cpus` but that the matrix lacks, plus
/// those the host cannot show at all.
fn untestable(topo: &Topology, classes: &[ClassSummary]) -> Vec<Relation> {
    Relation::ALL
        .iter()
        .copied()
        .filter(|r| !classes.iter().any(|c| c.relation == *r))
        .filter(|r| *r != Relation::SamePackage || llcs_per_package(topo) > 1)
        .collect()
}

fn llcs_per_package(topo: &Topology) -> usize {
    let mut llcs: Vec<(u32, String)> = topo
        .cpus
        .iter()
        .map(|c| (c.package, c.llc_shared.to_list()))
        .collect();
    llcs.sort();
    llcs.dedup();
    let packages = topo.packages().len().max(1);
    llcs.len().div_ceil(packages)
}

/// The recommendation for this host from the cells' median throughput.
pub fn recommend(topo: &Topology, cells: &[(Cell, f64)]) -> Recommendation {
    let classes = summarize(topo, cells);
    let untestable = untestable(topo, &classes);
    let mut ranked = classes.clone();
    ranked.sort_by(|a, b| b.mean_gbps.total_cmp(&a.mean_gbps));
    let Some(best) = ranked.first().filter(|b| b.mean_gbps > 0.0) else {
        return Recommendation {
            relation: None,
            clear: false,
            example: None,
            untestable,
            text: "no cell moved data: nothing to recommend".into(),
        };
    };
    let runner = ranked.get(1);
    let clear = runner.is_none_or(|r| r.mean_gbps < best.mean_gbps * (1.0 - NOISE_MARGIN));
    let example = cells
        .iter()
        .filter(|(c, _)| relation(topo, c.flow, c.app) == Some(best.relation))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| *c);
    let text = advice(best, runner, clear, example, &untestable);
    Recommendation {
        relation: Some(best.relation),
        clear,
        example,
        untestable,
        text,
    }
}

fn advice(
    best: &ClassSummary,
    runner: Option<&ClassSummary>,
    clear: bool,
    example: Option<Cell>,
    untestable: &[Relation],
) -> String {
    let mut s = format!(
        "Run the receiving application on {} the CPU that processes its flow ({:.2} Gbit/s mean",
        best.relation.placement(),
        best.mean_gbps
    );
    if let Some(r) = runner {
        s += &format!(
            " vs {:.2} for {}, {:+.0}%",
            r.mean_gbps,
            r.relation.describe(),
            100.0 * (best.mean_gbps / r.mean_gbps.max(1e-9) - 1.0)
        );
    }
    s += ")";
    if let Some(c) = example {
        s += &format!(
            ", e.g. flow on CPU {} and application on CPU {}",
            c.flow, c.app
        );
    }
    s += ".";
    if !clear {
        s += &format!(
            " The difference is within {:.0}%: no clear preference on this host.",
            NOISE_MARGIN * 100.0
        );
    }
    if !untestable.is_empty() {
        let names: Vec<&str> = untestable.iter().map(|r| r.describe()).collect();
        s += &format!(" Not measurable here: {}.", names.join(", "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelocal::cpu::topology::fixture::{write_host, HostShape};

    fn topo(packages: usize, cores: usize, threads: usize) -> Topology {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "corelocal-sweep-place-{packages}-{cores}-{threads}-{}-{seq}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        write_host(
            &dir,
            HostShape {
                packages,
                cores_per_package: cores,
                threads_per_core: threads,
            },
        )
        .unwrap();
        let t = Topology::read(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        t
    }

    #[test]
    fn relations_on_two_sockets_with_smt() {
        // 2 × 2 × 2: CPUs 0-3 first threads (0,1 socket 0; 2,3 socket 1), 4-7 their siblings.
        let t = topo(2, 2, 2);
        assert_eq!(relation(&t, 0, 0), Some(Relation::SameCpu));
        assert_eq!(relation(&t, 0, 4), Some(Relation::SmtSibling));
        assert_eq!(relation(&t, 0, 1), Some(Relation::SameLlc));
        assert_eq!(relation(&t, 0, 5), Some(Relation::SameLlc));
        assert_eq!(relation(&t, 0, 2), Some(Relation::OtherSocket));
        assert_eq!(relation(&t, 6, 1), Some(Relation::OtherSocket));
        assert_eq!(relation(&t, 0, 99), None);
    }

    #[test]
    fn axis_groups_by_package_for_quadrants() {
        let t = topo(2, 2, 2);
        let all = CpuSet::parse_list("0-7").unwrap();
        let axis = axis_order(&t, &all);
        assert_eq!(axis, vec![0, 1, 4, 5, 2, 3, 6, 7]);
        assert_eq!(package_spans(&t, &axis), vec![(0, 0, 4), (1, 4, 4)]);
        let one = topo(1, 2, 1);
        let axis = axis_order(&one, &CpuSet::parse_list("0-1").unwrap());
        assert_eq!(package_spans(&one, &axis), vec![(0, 0, 2)]);
    }

    #[test]
    fn schedule_covers_every_cell_once_per_round_and_rotates() {
        let axis = [0, 1];
        let s = schedule(&axis, 2);
        assert_eq!(s.len(), 8);
        for r in 0..2 {
            let mut cells: Vec<Cell> = s.iter().filter(|x| x.0 == r).map(|x| x.1).collect();
            cells.sort();
            cells.dedup();
            assert_eq!(cells.len(), 4, "round {r}");
        }
        assert_ne!(s[0].1, s[4].1, "round 2 starts elsewhere");
        assert!(schedule(&axis, 0).is_empty());
    }

    #[test]
    fn sender_goes_outside_the_matrix_off_its_cores() {
        let t = topo(2, 2, 2);
        let online = t.online.clone();
        // Matrix 0,1: CPU 4 and 5 are siblings of matrix CPUs, 2 is clean.
        let m = CpuSet::parse_list("0-1").unwrap();
        assert_eq!(sender_cpu(&t, &m, &online), Some(2));
        // Only siblings left outside: take one anyway.
        let m = CpuSet::parse_list("0-3").unwrap();
        assert_eq!(sender_cpu(&t, &m, &online), Some(4));
        // Nothing outside: the scheduler decides.
        let vm = topo(1, 2, 1);
        assert_eq!(sender_cpu(&vm, &vm.online, &vm.online), None);
    }

    #[test]
    fn recommends_same_socket_other_core_like_seed_003() {
        // Figure 4's pattern on 2 sockets × 2 cores: diagonal slow, other socket slow,
        // same socket different core fast.
        let t = topo(2, 2, 1);
        let mut cells = Vec::new();
        for flow in 0..4 {
            for app in 0..4 {
                let g = match relation(&t, flow, app).unwrap() {
                    Relation::SameCpu => 22.0,
                    Relation::SameLlc => 35.0 + flow as f64 * 0.1,
                    _ => 26.0,
                };
                cells.push((Cell { flow, app }, g));
            }
        }
        let r = recommend(&t, &cells);
        assert_eq!(r.relation, Some(Relation::SameLlc));
        assert!(r.clear);
        assert_eq!(r.example, Some(Cell { flow: 3, app: 2 }));
        assert_eq!(r.untestable, vec![Relation::SmtSibling]);
        assert!(r.text.contains("sharing the LLC"), "{}", r.text);
        let classes = summarize(&t, &cells);
        let other = classes
            .iter()
            .find(|c| c.relation == Relation::OtherSocket)
            .unwrap();
        assert_eq!(other.cells, 8);
        assert!((other.ratio_to_best - 26.0 / 35.15).abs() < 1e-9);
    }

    #[test]
    fn small_differences_are_not_clear_and_empty_is_handled() {
        let t = topo(1, 2, 1);
        let cells = [
            (Cell { flow: 0, app: 0 }, 10.0),
            (Cell { flow: 1, app: 1 }, 10.2),
            (Cell { flow: 0, app: 1 }, 10.3),
            (Cell { flow: 1, app: 0 }, 10.1),
        ];
        let r = recommend(&t, &cells);
        assert_eq!(r.relation, Some(Relation::SameLlc));
        assert!(!r.clear, "{}", r.text);
        assert!(r.text.contains("no clear preference"));
        assert_eq!(
            r.untestable,
            vec![Relation::SmtSibling, Relation::OtherSocket]
        );
        let none = recommend(&t, &[]);
        assert_eq!(none.relation, None);
    }

    #[test]
    fn rx_irqs_prefer_queue_interrupts() {
        use corelocal_tune::fs::RootFs;
        use corelocal_tune::state;
        let dir = std::env::temp_dir().join(format!("corelocal-sweep-irq-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        corelocal_tune::fixture::write(&dir, corelocal_tune::fixture::Kind::TwoSocket).unwrap();
        let fs = RootFs::new(&dir);
        let t = Topology::read(&dir).unwrap();
        let host = state::read_host(&fs, &t, &["ens1f0".to_string()], &|_| {
            state::no_probe("fixture")
        })
        .unwrap();
        assert_eq!(rx_irqs(&host.nics[0]), vec![51, 52, 53, 54]);
        let vm = std::env::temp_dir().join(format!("corelocal-sweep-irqvm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&vm);
        corelocal_tune::fixture::write(&vm, corelocal_tune::fixture::Kind::Vm).unwrap();
        let fs = RootFs::new(&vm);
        let t = Topology::read(&vm).unwrap();
        let host = state::read_host(&fs, &t, &["eth0".to_string()], &|_| {
            state::no_probe("fixture")
        })
        .unwrap();
        assert_eq!(rx_irqs(&host.nics[0]), vec![38], "virtio input.0 only");
        std::fs::remove_dir_all(dir).unwrap();
        std::fs::remove_dir_all(vm).unwrap();
    }
}
