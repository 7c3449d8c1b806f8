//! Pure parsers for the `/proc` files `top`, `sweep` and `bench` read: `/proc/stat`,
//! `/proc/net/dev`, `/proc/net/netstat` + `/proc/net/snmp`, `/proc/net/softnet_stat`,
//! `/proc/softirqs` (NET_RX), `/proc/net/tcp` (listeners),
//! `/proc/PID/stat`, `/proc/PID/task/TID/schedstat`, `/proc/loadavg`.
//!
//! Every parser takes the file's text and never fails: malformed lines are skipped, missing
//! fields read as 0. Inputs are bounded by [`READ_LIMIT`] where they are read ([`read_text`]).

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// The most bytes read from one `/proc` file.
pub const READ_LIMIT: u64 = 4 << 20;
/// The most rows (CPUs, interfaces, counters) kept from one file.
pub const ROWS_MAX: usize = 8192;

/// Reads at most [`READ_LIMIT`] bytes of `path` as text.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(READ_LIMIT)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// One CPU's `/proc/stat` counters (USER_HZ ticks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CpuTimes {
    /// user + nice.
    pub user: u64,
    /// system.
    pub sys: u64,
    /// hard interrupts.
    pub irq: u64,
    /// soft interrupts.
    pub softirq: u64,
    /// idle + iowait.
    pub idle: u64,
    /// steal (time taken by the hypervisor).
    pub steal: u64,
}

impl CpuTimes {
    /// All ticks.
    pub fn total(&self) -> u64 {
        self.user + self.sys + self.irq + self.softirq + self.idle + self.steal
    }

    /// `self - earlier`, saturating (counters never go back, but a CPU may go offline).
    pub fn since(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(earlier.user),
            sys: self.sys.saturating_sub(earlier.sys),
            irq: self.irq.saturating_sub(earlier.irq),
            softirq: self.softirq.saturating_sub(earlier.softirq),
            idle: self.idle.saturating_sub(earlier.idle),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }

    /// The split of a delta in percent of its total (all zero when the total is 0).
    pub fn percent(&self) -> CpuPercent {
        let t = self.total();
        let p = |v: u64| {
            if t == 0 {
                0.0
            } else {
                100.0 * v as f64 / t as f64
            }
        };
        CpuPercent {
            user: p(self.user),
            sys: p(self.sys),
            irq: p(self.irq),
            softirq: p(self.softirq),
            idle: p(self.idle + self.steal),
        }
    }
}

/// A CPU time split in percent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuPercent {
    /// user + nice.
    pub user: f64,
    /// system.
    pub sys: f64,
    /// hard interrupts.
    pub irq: f64,
    /// soft interrupts.
    pub softirq: f64,
    /// idle + iowait + steal.
    pub idle: f64,
}

/// The per-CPU lines (`cpuN ...`) of `/proc/stat`, in file order.
pub fn parse_stat(text: &str) -> Vec<(usize, CpuTimes)> {
    let mut out = Vec::new();
    for line in text.lines().take(ROWS_MAX) {
        let Some(rest) = line
            .strip_prefix("cpu")
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let Some(Ok(cpu)) = fields.next().map(str::parse::<usize>) else {
            continue;
        };
        let n: Vec<u64> = fields.map(|x| x.parse().unwrap_or(0)).collect();
        let g = |i: usize| n.get(i).copied().unwrap_or(0);
        out.push((
            cpu,
            CpuTimes {
                user: g(0) + g(1),
                sys: g(2),
                idle: g(3) + g(4),
                irq: g(5),
                softirq: g(6),
                steal: g(7),
            },
        ));
    }
    out
}

/// One interface's `/proc/net/dev` counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IfCounters {
    /// Interface name.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Receive drops.
    pub rx_drop: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Transmit drops.
    pub tx_drop: u64,
}

/// The interface rows of `/proc/net/dev` (two header lines, then `name: 16 numbers`).
pub fn parse_net_dev(text: &str) -> Vec<IfCounters> {
    let mut out = Vec::new();
    for line in text.lines().take(ROWS_MAX) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.is_empty() || name.contains(' ') || name.contains('|') {
            continue;
        }
        let n: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        if n.len() < 12 {
            continue;
        }
        out.push(IfCounters {
            name: name.to_string(),
            rx_bytes: n[0],
            rx_packets: n[1],
            rx_drop: n[3],
            tx_bytes: n[8],
            tx_packets: n[9],
            tx_drop: n[11],
        });
    }
    out
}

/// Counters of `/proc/net/netstat` or `/proc/net/snmp`: pairs of lines `Prefix: names` and
/// `Prefix: values`, keyed `Prefix:Name` (e.g. `TcpExt:ListenOverflows`, `Tcp:RetransSegs`).
/// Negative values (`Tcp:MaxConn -1`) read as 0.
pub fn parse_counters(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut lines = text.lines().take(ROWS_MAX);
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (Some((p1, names)), Some((p2, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            break;
        };
        if p1 != p2 {
            break;
        }
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            out.insert(format!("{p1}:{name}"), value.parse().unwrap_or(0));
        }
    }
    out
}

/// One row of `/proc/net/softnet_stat` (hex columns).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Softnet {
    /// The CPU (column 13 on kernels that print it, else the row index).
    pub cpu: usize,
    /// Packets processed by this CPU's NET_RX softirq.
    pub processed: u64,
    /// Packets dropped because the backlog was full (`netdev_max_backlog`).
    pub dropped: u64,
    /// Times net_rx_action ran out of budget or time with work left.
    pub time_squeeze: u64,
    /// Packets steered here by RPS (IPIs received).
    pub received_rps: u64,
}

/// Rows of `/proc/net/softnet_stat` (one per online CPU).
pub fn parse_softnet(text: &str) -> Vec<Softnet> {
    let mut out = Vec::new();
    for (row, line) in text.lines().take(ROWS_MAX).enumerate() {
        let n: Vec<u64> = line
            .split_whitespace()
            .map(|x| u64::from_str_radix(x, 16).unwrap_or(0))
            .collect();
        if n.len() < 3 {
            continue;
        }
        let g = |i: usize| n.get(i).copied().unwrap_or(0);
        out.push(Softnet {
            cpu: if n.len() >= 13 { g(12) as usize } else { row },
            processed: g(0),
            dropped: g(1),
            time_squeeze: g(2),
            received_rps: g(9),
        });
    }
    out
}

/// utime and stime (fields 14 and 15, clock ticks) of a `/proc/PID/stat` file.
pub fn parse_pid_stat(text: &str) -> Option<(u64, u64)> {
    // Field 2 (comm) may contain spaces and ')': fields resume after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    Some((f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?))
}

/// Run time in ns (the first field) of a `schedstat` file.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The number of times a thread was scheduled in (the third field of
/// `/proc/<pid>/task/<tid>/schedstat`): for a server that sleeps between events, its wake-ups.
pub fn parse_schedstat_runs(text: &str) -> Option<u64> {
    text.split_whitespace().nth(2)?.parse().ok()
}

/// Listening sockets of a `/proc/net/tcp` or `/proc/net/tcp6` file: (local port, socket
/// inode) of every row in state LISTEN (`0A`).
pub fn parse_tcp_listeners(text: &str) -> Vec<(u16, u64)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(3) != Some(&"0A") {
                return None;
            }
            let port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            let inode = f.get(9)?.parse().ok()?;
            Some((port, inode))
        })
        .take(ROWS_MAX)
        .collect()
}

/// The NET_RX row of `/proc/softirqs`: (CPU, count).
pub fn parse_net_rx(text: &str) -> Vec<(usize, u64)> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let cpus: Vec<usize> = header
        .split_whitespace()
        .filter_map(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect();
    lines
        .find_map(|l| l.trim_start().strip_prefix("NET_RX:"))
        .map(|row| {
            cpus.iter()
                .zip(row.split_whitespace())
                .map(|(c, v)| (*c, v.parse().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

/// The three load averages of `/proc/loadavg`.
pub fn parse_loadavg(text: &str) -> Option<[f64; 3]> {
    let mut f = text.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some([f.next()??, f.next()??, f.next()??])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_rx_row_per_cpu() {
        let t = "                    CPU0       CPU1\n          HI:          1          0\n      NET_TX:        5          6\n      NET_RX:     1234       5678\n";
        assert_eq!(parse_net_rx(t), vec![(0, 1234), (1, 5678)]);
        assert!(parse_net_rx("").is_empty());
    }

    #[test]
    fn tcp_listeners_are_the_rows_in_listen_state() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4209580 1 0 100 0 0 10 0\n\
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4209999 1 0 20 4 30 10 -1\n\
   2: 00000000000000000000000000000000:2CAB 00000000000000000000000000000000:0000 0A 0:0 00:0 0 0 0 77 1\n";
        assert_eq!(
            parse_tcp_listeners(text),
            vec![(8080, 4209580), (11435, 77)]
        );
    }

    #[test]
    fn stat_lines_and_split() {
        let text =
            "cpu  10 0 5 100 0 0 1 0 0 0\ncpu0 4 1 2 50 3 1 2 0 0 0\ncpu1 5 0 3 50\nintr 1 2\n";
        let v = parse_stat(text);
        assert_eq!(v.len(), 2);
        let (cpu, t) = v[0];
        assert_eq!(cpu, 0);
        assert_eq!(
            t,
            CpuTimes {
                user: 5,
                sys: 2,
                irq: 1,
                softirq: 2,
                idle: 53,
                steal: 0
            }
        );
        assert_eq!(v[1].1.irq, 0, "missing fields read as 0");
        let d = t.since(&CpuTimes::default());
        let p = d.percent();
        assert!((p.user + p.sys + p.irq + p.softirq + p.idle - 100.0).abs() < 1e-9);
        assert_eq!(CpuTimes::default().percent().idle, 0.0);
    }

    #[test]
    fn proc_stat_lines() {
        let t = "cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\ncpu1 10 0 20 70 0 0 0 0 0 0\nintr 5\n";
        let v = parse_stat(t);
        assert_eq!(v.len(), 2);
        let cpu0 = CpuTimes {
            user: 3,
            sys: 3,
            idle: 9,
            irq: 6,
            softirq: 7,
            steal: 8,
        };
        assert_eq!(v[0], (0, cpu0));
    }

    #[test]
    fn pid_stat_with_odd_comm() {
        let t = "1234 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 250 37 0 0 20 0 1 0 5 6 7";
        assert_eq!(parse_pid_stat(t), Some((250, 37)));
        assert_eq!(parse_pid_stat("garbage"), None);
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123456));
    }

    #[test]
    fn counters_pairs() {
        let text = "TcpExt: A B ListenOverflows\nTcpExt: 1 2 3\nIpExt: X\nIpExt: 9\n";
        let m = parse_counters(text);
        assert_eq!(m["TcpExt:ListenOverflows"], 3);
        assert_eq!(m["IpExt:X"], 9);
        let m = parse_counters("Tcp: MaxConn RetransSegs\nTcp: -1 7\n");
        assert_eq!((m["Tcp:MaxConn"], m["Tcp:RetransSegs"]), (0, 7));
        assert!(parse_counters("garbage\n").is_empty());
    }

    #[test]
    fn softnet_old_and_new_layouts() {
        let new = "00000010 00000001 00000002 0 0 0 0 0 0 00000005 0 0 00000003 0 0\n";
        assert_eq!(
            parse_softnet(new)[0],
            Softnet {
                cpu: 3,
                processed: 16,
                dropped: 1,
                time_squeeze: 2,
                received_rps: 5
            }
        );
        let old = "a 0 0 0 0 0 0 0 0 0 0\nb 1 0 0 0 0 0 0 0 0 0\n";
        let v = parse_softnet(old);
        assert_eq!((v[1].cpu, v[1].processed, v[1].dropped), (1, 11, 1));
    }

    #[test]
    fn net_dev_rows() {
        let text = "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n  lo: 1 2 0 3 0 0 0 0 4 5 0 6 0 0 0 0\nbad: 1 2\n";
        let v = parse_net_dev(text);
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].rx_bytes, v[0].rx_packets, v[0].rx_drop), (1, 2, 3));
        assert_eq!((v[0].tx_bytes, v[0].tx_packets, v[0].tx_drop), (4, 5, 6));
    }

    #[test]
    fn small_files() {
        assert_eq!(parse_schedstat("123 45 6\n"), Some(123));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(
            parse_loadavg("0.50 1.00 2.25 1/100 42\n"),
            Some([0.5, 1.0, 2.25])
        );
        assert_eq!(parse_loadavg("x"), None);
    }
}
