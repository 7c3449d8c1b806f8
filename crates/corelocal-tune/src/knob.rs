//! The knobs the tuner may write, named by their path under the root, and their values.

use corelocal::cpu::CpuSet;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Path of the global RFS socket flow table size.
pub const SOCK_FLOW_PATH: &str = "proc/sys/net/core/rps_sock_flow_entries";
/// The largest queue index accepted in a knob path.
pub const QUEUE_MAX: u32 = 4095;
/// The largest IRQ number accepted in a knob path.
pub const IRQ_MAX: u32 = 1 << 20;
/// The largest numeric value accepted (rps_flow_cnt / rps_sock_flow_entries are capped by
/// the kernel well below this).
pub const NUMBER_MAX: u64 = 1 << 30;

/// One writable knob.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Knob {
    /// `proc/irq/N/smp_affinity`.
    IrqAffinity {
        /// IRQ number.
        irq: u32,
    },
    /// `sys/class/net/IF/queues/rx-N/rps_cpus`.
    RpsCpus {
        /// Interface.
        nic: String,
        /// RX queue index.
        queue: u32,
    },
    /// `sys/class/net/IF/queues/rx-N/rps_flow_cnt`.
    RpsFlowCnt {
        /// Interface.
        nic: String,
        /// RX queue index.
        queue: u32,
    },
    /// `sys/class/net/IF/queues/tx-N/xps_cpus`.
    XpsCpus {
        /// Interface.
        nic: String,
        /// TX queue index.
        queue: u32,
    },
    /// `proc/sys/net/core/rps_sock_flow_entries`.
    SockFlowEntries,
}

/// What a knob holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// A CPU set, written as a hex mask.
    Cpus,
    /// A decimal number.
    Number,
}

/// A knob's desired value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Value {
    /// A CPU set (cpulist in JSON, hex mask in the file).
    Cpus(CpuSet),
    /// A decimal number.
    Number(u64),
}

impl Value {
    /// The kind of value.
    pub fn kind(&self) -> ValueKind {
        match self {
            Value::Cpus(_) => ValueKind::Cpus,
            Value::Number(_) => ValueKind::Number,
        }
    }

    /// Parses a file's contents as a value of `kind`.
    pub fn parse(kind: ValueKind, text: &str) -> Result<Value, String> {
        let t = crate::fs::trimmed(text).trim();
        match kind {
            ValueKind::Cpus => CpuSet::parse_mask(t)
                .map(Value::Cpus)
                .map_err(|e| e.to_string()),
            ValueKind::Number => t
                .parse::<u64>()
                .map(Value::Number)
                .map_err(|_| format!("expected a number, found {t:?}")),
        }
    }

    /// The text to write, shaped like `current` (the file's present contents) so a mask keeps
    /// the kernel's width (`00000000,00000004` stays three groups wide on a 96-CPU host).
    pub fn render_like(&self, current: &str) -> String {
        match self {
            Value::Cpus(set) => format!("{}\n", mask_like(set, crate::fs::trimmed(current))),
            Value::Number(n) => format!("{n}\n"),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Cpus(s) if s.is_empty() => f.write_str("(none)"),
            Value::Cpus(s) => f.write_str(&s.to_list()),
            Value::Number(n) => write!(f, "{n}"),
        }
    }
}

/// `set` as a hex mask with as many groups as `template`, the first group as wide as the
/// template's first group when the set fits (the kernel prints `nr_cpu_ids` bits: `ff` on an
/// 8-CPU host, `f,ffffffff` on 36 CPUs).
pub fn mask_like(set: &CpuSet, template: &str) -> String {
    let groups: Vec<&str> = template.split(',').collect();
    let valid = !template.is_empty()
        && groups
            .iter()
            .all(|g| (1..=8).contains(&g.len()) && g.bytes().all(|b| b.is_ascii_hexdigit()));
    if !valid {
        return set.to_mask(0);
    }
    let full = set.to_mask(groups.len());
    let first_width = groups[0].len();
    match full.split_once(',') {
        None => trim_group(&full, first_width),
        Some((head, rest)) => format!("{},{rest}", trim_group(head, first_width)),
    }
}

fn trim_group(group: &str, width: usize) -> String {
    let significant = group.trim_start_matches('0');
    if significant.len() > width {
        significant.to_string()
    } else {
        format!("{significant:0>width$}")
    }
}

impl Knob {
    /// The path relative to the root.
    pub fn path(&self) -> String {
        match self {
            Knob::IrqAffinity { irq } => format!("proc/irq/{irq}/smp_affinity"),
            Knob::RpsCpus { nic, queue } => {
                format!("sys/class/net/{nic}/queues/rx-{queue}/rps_cpus")
            }
            Knob::RpsFlowCnt { nic, queue } => {
                format!("sys/class/net/{nic}/queues/rx-{queue}/rps_flow_cnt")
            }
            Knob::XpsCpus { nic, queue } => {
                format!("sys/class/net/{nic}/queues/tx-{queue}/xps_cpus")
            }
            Knob::SockFlowEntries => SOCK_FLOW_PATH.to_string(),
        }
    }

    /// The kind of value this knob holds.
    pub fn kind(&self) -> ValueKind {
        match self {
            Knob::IrqAffinity { .. } | Knob::RpsCpus { .. } | Knob::XpsCpus { .. } => {
                ValueKind::Cpus
            }
            Knob::RpsFlowCnt { .. } | Knob::SockFlowEntries => ValueKind::Number,
        }
    }

    /// The interface this knob belongs to, if any.
    pub fn nic(&self) -> Option<&str> {
        match self {
            Knob::RpsCpus { nic, .. }
            | Knob::RpsFlowCnt { nic, .. }
            | Knob::XpsCpus { nic, .. } => Some(nic),
            _ => None,
        }
    }

    /// Parses a knob path; only the knobs above are accepted.
    pub fn parse(path: &str) -> Result<Knob, String> {
        crate::fs::check_rel(path).map_err(|e| e.to_string())?;
        if path == SOCK_FLOW_PATH {
            return Ok(Knob::SockFlowEntries);
        }
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            ["proc", "irq", n, "smp_affinity"] => Ok(Knob::IrqAffinity {
                irq: parse_index(n, IRQ_MAX, path)?,
            }),
            ["sys", "class", "net", nic, "queues", q, file] => parse_queue_knob(nic, q, file, path),
            _ => Err(format!(
                "{path:?} is not a knob the tuner writes (smp_affinity, rps_cpus, rps_flow_cnt, \
                 xps_cpus, rps_sock_flow_entries)"
            )),
        }
    }
}

fn parse_queue_knob(nic: &str, q: &str, file: &str, path: &str) -> Result<Knob, String> {
    check_ifname(nic)?;
    let nic = nic.to_string();
    let rx = q
        .strip_prefix("rx-")
        .map(|n| parse_index(n, QUEUE_MAX, path));
    let tx = q
        .strip_prefix("tx-")
        .map(|n| parse_index(n, QUEUE_MAX, path));
    match (rx, tx, file) {
        (Some(queue), _, "rps_cpus") => Ok(Knob::RpsCpus { nic, queue: queue? }),
        (Some(queue), _, "rps_flow_cnt") => Ok(Knob::RpsFlowCnt { nic, queue: queue? }),
        (_, Some(queue), "xps_cpus") => Ok(Knob::XpsCpus { nic, queue: queue? }),
        _ => Err(format!("{path:?} is not a queue knob the tuner writes")),
    }
}

fn parse_index(text: &str, max: u32, path: &str) -> Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|n| *n <= max && (text == "0" || !text.starts_with('0')))
        .ok_or_else(|| format!("bad number {text:?} in {path:?}"))
}

/// Interface names: 1 to 15 bytes, no `/`, no whitespace (the kernel's `dev_valid_name`).
pub fn check_ifname(name: &str) -> Result<(), String> {
    let ok = (1..16).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace());
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a valid interface name"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(list: &str) -> CpuSet {
        CpuSet::parse_list(list).unwrap()
    }

    #[test]
    fn knob_paths_round_trip() {
        let knobs = [
            Knob::IrqAffinity { irq: 38 },
            Knob::RpsCpus {
                nic: "eth0".into(),
                queue: 3,
            },
            Knob::RpsFlowCnt {
                nic: "eth0".into(),
                queue: 0,
            },
            Knob::XpsCpus {
                nic: "veth-a".into(),
                queue: 15,
            },
            Knob::SockFlowEntries,
        ];
        for k in knobs {
            assert_eq!(Knob::parse(&k.path()).unwrap(), k);
        }
    }

    #[test]
    fn rejects_foreign_paths() {
        for p in [
            "etc/passwd",
            "proc/irq/38/../../etc/shadow",
            "proc/irq/038/smp_affinity",
            "proc/irq/x/smp_affinity",
            "sys/class/net/eth0/queues/tx-0/rps_cpus",
            "sys/class/net/eth0/queues/rx-0/xps_rxqs",
            "/proc/irq/1/smp_affinity",
        ] {
            assert!(Knob::parse(p).is_err(), "{p}");
        }
    }

    #[test]
    fn masks_keep_the_kernel_width() {
        assert_eq!(mask_like(&set("2"), "ff"), "04");
        assert_eq!(mask_like(&set("0"), "3"), "1");
        assert_eq!(
            mask_like(&set("24"), "00000000,00000000,00000000"),
            "00000000,00000000,01000000"
        );
        assert_eq!(mask_like(&set("35"), "f,ffffffff"), "8,00000000");
        assert_eq!(mask_like(&set(""), "ff"), "00");
        // A set wider than the template keeps every bit.
        assert_eq!(mask_like(&set("9"), "ff"), "200");
        assert_eq!(mask_like(&set("1"), "garbage"), "2");
    }

    #[test]
    fn values_parse_and_render() {
        let v = Value::parse(ValueKind::Cpus, "00000000,00000011\n").unwrap();
        assert_eq!(v, Value::Cpus(set("0,4")));
        assert_eq!(v.render_like("00000000,00000000\n"), "00000000,00000011\n");
        assert_eq!(
            Value::parse(ValueKind::Number, "2048\n").unwrap(),
            Value::Number(2048)
        );
        assert!(Value::parse(ValueKind::Cpus, "zz").is_err());
        assert!(Value::parse(ValueKind::Number, "-1").is_err());
    }
}
