//! Human-readable output: `show`, plans and tables.

use crate::plan::Plan;
use crate::state::{HostState, IrqRole, NicState, Probe};
use corelocal::cpu::CpuSet;
use std::fmt::Write;

/// An aligned table, two spaces between columns, `indent` before each line.
pub fn table(indent: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, v) in widths.iter_mut().zip(r) {
            *w = (*w).max(v.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from(indent);
        for (v, w) in cells.iter().zip(&widths) {
            let _ = write!(s, "{v:<w$}  ");
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

fn cpus(set: &CpuSet) -> String {
    if set.is_empty() {
        "none".into()
    } else {
        set.to_list()
    }
}

/// A knob's CPU set: `n/a` when unreadable, `empty` when empty (for RPS/XPS that means off).
fn opt_cpus(set: &Option<CpuSet>) -> String {
    set.as_ref().map_or_else(
        || "n/a".into(),
        |s| {
            if s.is_empty() {
                "empty".into()
            } else {
                s.to_list()
            }
        },
    )
}

fn groups(list: &[(u32, CpuSet)]) -> String {
    if list.is_empty() {
        return "none exposed".into();
    }
    list.iter()
        .map(|(id, s)| format!("{id}:{}", cpus(s)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn host_lines(h: &HostState) -> String {
    let smt: Vec<String> = h.smt_siblings.iter().map(CpuSet::to_list).collect();
    let smt = if smt.is_empty() {
        "none".into()
    } else {
        smt.join(" ")
    };
    let irqb = h
        .irqbalance_pid
        .map_or_else(|| "not running".into(), |p| format!("RUNNING (pid {p})"));
    let flows = h
        .rps_sock_flow_entries
        .map_or_else(|| "n/a".into(), |n| n.to_string());
    format!(
        "host: {} CPUs online ({}); packages {}; NUMA nodes {}\n      SMT siblings: {smt}; \
         isolated: {}; nohz_full: {}\n      rps_sock_flow_entries: {flows}; irqbalance: {irqb}\n",
        h.online.len(),
        cpus(&h.online),
        groups(&h.packages),
        groups(&h.numa_nodes),
        cpus(&h.isolated),
        cpus(&h.nohz_full),
    )
}

fn probe_line<T>(what: &str, p: &Probe<T>, ok: impl Fn(&T) -> String) -> String {
    match p {
        Probe::Ok(v) => format!("  {what}: {}\n", ok(v)),
        Probe::Unsupported(r) => format!("  {what}: not supported ({r})\n"),
        Probe::NotQueried(r) => format!("  {what}: not queried ({r})\n"),
    }
}

fn role(r: IrqRole) -> String {
    match r {
        IrqRole::Rx(q) => format!("rx-{q}"),
        IrqRole::Tx(q) => format!("tx-{q}"),
        IrqRole::Combined(q) => format!("rx/tx-{q}"),
        IrqRole::Other => "other".into(),
    }
}

fn irq_table(n: &NicState) -> String {
    if n.irqs.is_empty() {
        return "  IRQs: none found\n".into();
    }
    let rows: Vec<Vec<String>> = n
        .irqs
        .iter()
        .map(|i| {
            vec![
                i.irq.to_string(),
                i.name.clone(),
                role(i.role),
                opt_cpus(&i.smp_affinity),
                opt_cpus(&i.effective_affinity),
                opt_cpus(&i.affinity_hint),
                i.count.to_string(),
            ]
        })
        .collect();
    table(
        "  ",
        &[
            "IRQ",
            "NAME",
            "QUEUE",
            "SMP_AFFINITY",
            "EFFECTIVE",
            "HINT",
            "COUNT",
        ],
        &rows,
    )
}

fn queue_table(n: &NicState) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for q in &n.rx {
        let cnt = q
            .rps_flow_cnt
            .map_or_else(|| "n/a".into(), |c| c.to_string());
        rows.push(vec![
            format!("rx-{}", q.index),
            opt_cpus(&q.rps_cpus),
            cnt,
            String::new(),
            String::new(),
        ]);
    }
    for q in &n.tx {
        rows.push(vec![
            format!("tx-{}", q.index),
            String::new(),
            String::new(),
            opt_cpus(&q.xps_cpus),
            opt_cpus(&q.xps_rxqs),
        ]);
    }
    table(
        "  ",
        &["QUEUE", "RPS_CPUS", "RPS_FLOW_CNT", "XPS_CPUS", "XPS_RXQS"],
        &rows,
    )
}

fn rss_summary(r: &crate::state::Rss) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for q in &r.indirection {
        *counts.entry(*q).or_insert(0u32) += 1;
    }
    let spread: Vec<String> = counts.iter().map(|(q, c)| format!("q{q}×{c}")).collect();
    let key = if r.key.is_empty() {
        "n/a".into()
    } else {
        r.key.clone()
    };
    format!(
        "{} buckets [{}]; key {key}",
        r.indirection.len(),
        spread.join(" ")
    )
}

fn nic_lines(n: &NicState) -> String {
    let node = n
        .numa_node
        .map_or_else(|| "unknown (-1)".into(), |x| x.to_string());
    let mut out = format!(
        "\n{}: driver {}, NUMA node {node}, {} RX / {} TX queue(s)\n",
        n.name,
        n.driver.as_deref().unwrap_or("none (virtual)"),
        n.rx.len(),
        n.tx.len()
    );
    out += &probe_line("channels", &n.channels, |c| {
        format!(
            "rx {}/{} tx {}/{} other {}/{} combined {}/{} (current/max)",
            c.rx, c.max_rx, c.tx, c.max_tx, c.other, c.max_other, c.combined, c.max_combined
        )
    });
    out += &probe_line("RSS", &n.rss, rss_summary);
    out += &irq_table(n);
    out += &queue_table(n);
    out
}

/// `tune show` as text.
pub fn show(h: &HostState) -> String {
    let mut out = host_lines(h);
    for n in &h.nics {
        out += &nic_lines(n);
    }
    out
}

/// A plan as text: settings table, CPU choices and notes.
pub fn plan(p: &Plan) -> String {
    let cores: Vec<String> = p.network_cores.iter().map(|c| c.to_string()).collect();
    let mut out = format!(
        "profile {} for {}: network cores [{}], housekeeping CPUs {}",
        p.profile.name(),
        p.nics.join(", "),
        cores.join(","),
        cpus(&p.housekeeping_cpus)
    );
    if let Some(app) = &p.app_cpus {
        let _ = write!(out, ", application CPUs {}", app.to_list());
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = p
        .settings
        .iter()
        .map(|s| vec![s.knob.path(), s.value.to_string()])
        .collect();
    out += &table("  ", &["PATH", "VALUE"], &rows);
    for n in &p.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}
