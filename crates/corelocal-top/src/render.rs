//! The text frame: at most [`WIDTH`] columns, one `String` per line, no terminal codes (the
//! caller positions the cursor).

use crate::sample::{View, WorkerRow};
use std::fmt::Write;

/// Columns of every line.
pub const WIDTH: usize = 80;

/// `v` with a k/M/G suffix, at most 6 characters.
pub fn human(v: f64) -> String {
    let (d, s) = match v {
        v if v >= 1e9 => (v / 1e9, "G"),
        v if v >= 1e6 => (v / 1e6, "M"),
        v if v >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    if d >= 100.0 || s.is_empty() {
        format!("{d:.0}{s}")
    } else {
        format!("{d:.1}{s}")
    }
}

fn clip(mut s: String) -> String {
    if s.chars().count() > WIDTH {
        s = s.chars().take(WIDTH).collect();
    }
    s
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".into(), |x| x.to_string())
}

/// The frame's lines. `title` is the first line's left part (host, time).
pub fn frame(v: &View, title: &str, interactive: bool) -> Vec<String> {
    let mut out = Vec::new();
    let load = v.loadavg.map_or(String::new(), |l| {
        format!("load {:.2} {:.2} {:.2}", l[0], l[1], l[2])
    });
    let hint = if interactive { "q: quit" } else { "" };
    let left = format!("{title}  {load}");
    out.push(format!(
        "{left}{hint:>w$}",
        w = WIDTH.saturating_sub(left.chars().count())
    ));
    out.push(String::new());
    cpus(v, &mut out);
    out.push(String::new());
    interfaces(v, &mut out);
    out.push(String::new());
    let d = &v.drops;
    out.push(format!(
        "TCP listen overflows {}/s ({} total)  drops {}/s ({} total)",
        human(d.listen_overflows_ps),
        d.listen_overflows,
        human(d.listen_drops_ps),
        d.listen_drops
    ));
    out.push(format!(
        "softnet drops {} total  time_squeeze {} total",
        d.softnet_dropped, d.softnet_time_squeeze
    ));
    workers(v, &mut out);
    out.into_iter().map(clip).collect()
}

fn cpus(v: &View, out: &mut Vec<String>) {
    out.push(
        "CPU   user%  sys%  irq% sirq% idle% softnet/s drops/s sqz/s netrx/s  ipi/s".to_string(),
    );
    for c in &v.cpus {
        out.push(format!(
            "{:>3} {:>7.1} {:>5.1} {:>5.1} {:>5.1} {:>5.1} {:>9} {:>7} {:>5} {:>7} {:>6}",
            c.cpu,
            c.user,
            c.sys,
            c.irq,
            c.softirq,
            c.idle,
            human(c.softnet_pps),
            human(c.drops_ps),
            human(c.squeeze_ps),
            human(c.net_rx_ps),
            human(c.rps_ipis_ps)
        ));
    }
}

fn interfaces(v: &View, out: &mut Vec<String>) {
    match &v.netns {
        Some(Ok(name)) => out.push(format!("interfaces of network namespace {name}")),
        Some(Err(e)) => out.push(e.clone()),
        None => {}
    }
    out.push(
        "IFACE          rx pkt/s rx bit/s tx pkt/s tx bit/s  rxq rps       irq cpus".to_string(),
    );
    for i in &v.interfaces {
        let name: String = i.name.chars().take(14).collect();
        out.push(format!(
            "{name:<14} {:>8} {:>8} {:>8} {:>8} {:>4} {:<9} {}",
            human(i.rx_pps),
            human(i.rx_bps),
            human(i.tx_pps),
            human(i.tx_bps),
            i.steer.rx_queues,
            or_dash(&i.steer.rps).chars().take(9).collect::<String>(),
            or_dash(&i.steer.irq_cpus)
        ));
    }
}

fn worker_line(w: &WorkerRow) -> String {
    let n = &w.now;
    let queue = match (n.queue_len, n.queue_cap) {
        (Some(l), Some(c)) => format!("{l}/{c}"),
        (Some(l), None) => l.to_string(),
        _ => "-".into(),
    };
    let busy = n.busy.map_or("-", |b| if b { "yes" } else { "no" });
    format!(
        "{:>6} {:>4} {:>10} {:>10} {:>9} {:>7} {:>9} {:>4} {:>7}",
        n.worker,
        opt(n.cpu),
        w.accepted_ps.map_or("-".into(), human),
        n.accepted_local,
        n.stolen,
        w.local_pct.map_or("-".into(), |p| format!("{p:.1}%")),
        queue,
        busy,
        opt(n.open)
    )
}

fn workers(v: &View, out: &mut Vec<String>) {
    if let Some(e) = &v.server_error {
        out.push(String::new());
        out.push(format!("server stats: {e}"));
    }
    let Some(ws) = &v.workers else {
        return;
    };
    out.push(String::new());
    out.push(
        "WORKER  CPU  accepts/s      local    stolen  local%     queue busy    open".to_string(),
    );
    for w in ws {
        out.push(worker_line(w));
    }
}

/// The frame as plain text (for `--once` without `--json`).
pub fn plain(v: &View, title: &str) -> String {
    let mut s = String::new();
    for l in frame(v, title, false) {
        let _ = writeln!(s, "{}", l.trim_end());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_numbers_stay_short() {
        assert_eq!(human(0.0), "0");
        assert_eq!(human(999.4), "999");
        assert_eq!(human(1234.0), "1.2k");
        assert_eq!(human(123_456.0), "123k");
        assert_eq!(human(12.5e9), "12.5G");
        assert!(human(999.9e9).len() <= 6);
    }
}
