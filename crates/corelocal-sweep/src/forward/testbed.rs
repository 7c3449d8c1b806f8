//! The forwarding testbed, built only inside network namespaces this process creates:
//!
//! ```text
//!  generator ns                 router ns (ip_forward=1)                 sink ns
//!  G 10.213.1.1/24 ==veth== RI 10.213.1.254/24   RO 10.213.2.254/24 ==veth== S 10.213.2.1/24
//!  route 198.18.0.0/15          route 198.18.0.0/15 via 10.213.2.1        forwarding off,
//!  via 10.213.1.254             [nft: conntrack + N non-matching rules]   no route: dropped
//! ```
//!
//! Both veth pairs have `queues` queues per direction; the generator's veth has TSO off (see
//! [`Testbed::create`]). Neighbours are static (`nud permanent`,
//! fixed MACs), so no ARP runs; IPv6 is off in every namespace, so nothing but the generator's
//! datagrams crosses the links. The sink drops at its route lookup with forwarding off, which
//! counts `Ip:InReceives` (what arrived) and sends no ICMP back.
//!
//! Everything lives in the three namespaces (`clfwd-PID-N-{g,r,s}`); deleting them (on drop,
//! also after an error, a panic or SIGINT/SIGTERM, which only set a flag) removes the links,
//! routes, sysctls and nft tables with them. The host's settings are never written:
//! [`HostNet`] reads them before and after so a run can say they did not change.

use crate::netns::{ip, Netns};
use crate::place::in_netns;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

/// Name prefix of the forwarding testbed's namespaces.
pub const PREFIX: &str = "clfwd-";
/// The generator's address.
pub const GEN_ADDR: [u8; 4] = [10, 213, 1, 1];
/// The router's ingress address (the generator's gateway).
pub const ROUTER_IN_ADDR: [u8; 4] = [10, 213, 1, 254];
/// The router's egress address.
pub const ROUTER_OUT_ADDR: [u8; 4] = [10, 213, 2, 254];
/// The sink's address (the router's next hop).
pub const SINK_ADDR: [u8; 4] = [10, 213, 2, 1];
/// The destinations the generator sends to (RFC 2544 benchmarking range), routed by prefix.
pub const DST_NET: &str = "198.18.0.0/15";
/// The most veth queues per direction.
pub const QUEUES_MAX: usize = 64;
/// The most firewall rules.
pub const FIREWALL_RULES_MAX: usize = 20_000;
/// The nft table the firewall load lives in (in the router namespace only).
pub const NFT_TABLE: &str = "clfwd";

const MAC_GEN: &str = "02:c1:0f:00:00:01";
const MAC_ROUTER_IN: &str = "02:c1:0f:00:00:02";
const MAC_ROUTER_OUT: &str = "02:c1:0f:00:00:03";
const MAC_SINK: &str = "02:c1:0f:00:00:04";

/// The four interface names of one testbed. They embed the pid and a per-process letter so
/// the router's `napi/IF-ID` kernel threads are told apart from any other run's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ifaces {
    /// The generator's veth end.
    pub gen: String,
    /// The router's ingress veth end (RPS, GRO, threaded NAPI go here).
    pub router_in: String,
    /// The router's egress veth end (XPS goes here; its tx_packets = forwarded).
    pub router_out: String,
    /// The sink's veth end.
    pub sink: String,
}

impl Ifaces {
    /// Names for testbed number `seq` of process `pid` (each at most 15 bytes).
    pub fn new(pid: u32, seq: usize) -> Ifaces {
        let tag = char::from(b'a' + (seq % 26) as u8);
        let base = format!("fw{}{tag}", pid % 10_000_000);
        Ifaces {
            gen: format!("{base}g0"),
            router_in: format!("{base}r0"),
            router_out: format!("{base}r1"),
            sink: format!("{base}s0"),
        }
    }
}

/// How to build a testbed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestbedSpec {
    /// Queues per direction on each veth.
    pub queues: usize,
    /// `net.ipv4.ip_forward` in the router namespace (off only to show nothing is forwarded).
    pub forwarding: bool,
    /// Firewall load: 0 = none; N = conntrack plus N rules that never match, in the router's
    /// forward hook.
    pub firewall_rules: usize,
}

/// A live testbed; dropping it deletes the three namespaces and everything in them.
#[derive(Debug)]
pub struct Testbed {
    /// The generator's namespace.
    pub gen: Netns,
    /// The router's namespace.
    pub router: Netns,
    /// The sink's namespace.
    pub sink: Netns,
    /// Interface names.
    pub ifs: Ifaces,
    /// What it was built from.
    pub spec: TestbedSpec,
}

fn dotted(a: [u8; 4]) -> String {
    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
}

/// Writes `(path under /proc/sys/net, value)` pairs from a thread inside namespace `ns`, so
/// only that namespace's sysctls change; reads each back.
pub fn set_sysctls(ns: &str, values: &[(&str, &str)]) -> Result<(), String> {
    let values: Vec<(String, String)> = values
        .iter()
        .map(|(k, v)| (format!("/proc/sys/net/{k}"), v.to_string()))
        .collect();
    in_netns(ns, false, move || {
        for (path, v) in &values {
            std::fs::write(path, format!("{v}\n")).map_err(|e| format!("writing {path}: {e}"))?;
            let back = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            if back.trim() != v {
                return Err(format!("{path} reads {:?} after writing {v}", back.trim()));
            }
        }
        Ok(())
    })
}

/// Reads a sysctl under /proc/sys/net from inside namespace `ns`.
pub fn read_sysctl(ns: &str, key: &str) -> Result<String, String> {
    let path = format!("/proc/sys/net/{key}");
    in_netns(ns, false, move || {
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|e| format!("{path}: {e}"))
    })
}

/// The nft script of the firewall load: `rules` rules that never match (source addresses in
/// TEST-NET-3, which the generator never uses), then a conntrack rule that accepts.
pub fn firewall_script(rules: usize) -> String {
    let mut s = format!(
        "table ip {NFT_TABLE} {{\n  chain forward {{\n    type filter hook forward priority filter; policy accept;\n"
    );
    for k in 0..rules {
        let _ = writeln!(
            s,
            "    ip saddr 203.0.113.{} udp dport {} drop",
            1 + k % 254,
            1 + k / 254
        );
    }
    s.push_str("    ct state new,established,related counter accept\n  }\n}\n");
    s
}

/// Runs `ip netns exec NS nft -f -` with `script` on stdin.
pub fn nft_in(ns: &str, script: &str) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run ip netns exec … nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("writing the nft script: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let hint = if err.contains("No such file") || err.contains("not found") {
            " (is nftables installed? apt-get install nftables)"
        } else {
            ""
        };
        Err(format!("nft -f in {ns}: {}{hint}", err.trim()))
    }
}

/// Whether the `nft` command can be run.
pub fn nft_available() -> bool {
    Command::new("nft")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The packet count of the firewall's final (accepting) rule in namespace `ns`.
pub fn firewall_accepted(ns: &str) -> Option<u64> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "list", "table", "ip", NFT_TABLE])
        .output()
        .ok()?;
    parse_counter(&String::from_utf8_lossy(&out.stdout))
}

/// The packets of the last `counter packets N` in an nft listing.
pub fn parse_counter(listing: &str) -> Option<u64> {
    listing
        .rsplit("counter packets ")
        .next()
        .filter(|_| listing.contains("counter packets "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Lists the nft tables of namespace `ns` (`ip netns exec NS nft list tables`).
pub fn nft_tables_in(ns: &str) -> Result<String, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "list", "tables"])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

impl Testbed {
    /// Builds generator → router → sink as described in the module docs. On any error the
    /// namespaces made so far are deleted before it returns.
    pub fn create(spec: &TestbedSpec) -> Result<Testbed, String> {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        if spec.queues == 0 || spec.queues > QUEUES_MAX {
            return Err(format!("queues must be 1 to {QUEUES_MAX}"));
        }
        if spec.firewall_rules > FIREWALL_RULES_MAX {
            return Err(format!("at most {FIREWALL_RULES_MAX} firewall rules"));
        }
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let base = format!("{PREFIX}{pid}-{seq}");
        let gen = Netns::create(&format!("{base}-g"))?;
        let router = Netns::create(&format!("{base}-r"))?;
        let sink = Netns::create(&format!("{base}-s"))?;
        let tb = Testbed {
            gen,
            router,
            sink,
            ifs: Ifaces::new(pid, seq),
            spec: spec.clone(),
        };
        tb.build()?;
        Ok(tb)
    }

    fn build(&self) -> Result<(), String> {
        let (g, r, s) = (self.gen.name(), self.router.name(), self.sink.name());
        let ifs = &self.ifs;
        let q = self.spec.queues.to_string();
        let no_v6 = [
            ("ipv6/conf/all/disable_ipv6", "1"),
            ("ipv6/conf/default/disable_ipv6", "1"),
        ];
        set_sysctls(g, &no_v6)?;
        set_sysctls(s, &[no_v6[0], no_v6[1], ("ipv4/ip_forward", "0")])?;
        let fwd = if self.spec.forwarding { "1" } else { "0" };
        set_sysctls(
            r,
            &[
                no_v6[0],
                no_v6[1],
                ("ipv4/conf/all/rp_filter", "0"),
                ("ipv4/conf/default/rp_filter", "0"),
                ("ipv4/ip_forward", fwd),
            ],
        )?;
        let pair = |ns: &str, a: &str, amac: &str, peer_ns: &str, b: &str, bmac: &str| {
            ip(&[
                "-n",
                ns,
                "link",
                "add",
                a,
                "address",
                amac,
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "type",
                "veth",
                "peer",
                "name",
                b,
                "address",
                bmac,
                "netns",
                peer_ns,
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
            ])
        };
        pair(g, &ifs.gen, MAC_GEN, r, &ifs.router_in, MAC_ROUTER_IN)?;
        pair(r, &ifs.router_out, MAC_ROUTER_OUT, s, &ifs.sink, MAC_SINK)?;
        let cidr = |a: [u8; 4]| format!("{}/24", dotted(a));
        ip(&["-n", g, "addr", "add", &cidr(GEN_ADDR), "dev", &ifs.gen])?;
        ip(&[
            "-n",
            r,
            "addr",
            "add",
            &cidr(ROUTER_IN_ADDR),
            "dev",
            &ifs.router_in,
        ])?;
        ip(&[
            "-n",
            r,
            "addr",
            "add",
            &cidr(ROUTER_OUT_ADDR),
            "dev",
            &ifs.router_out,
        ])?;
        ip(&["-n", s, "addr", "add", &cidr(SINK_ADDR), "dev", &ifs.sink])?;
        for (ns, dev) in [
            (g, &ifs.gen),
            (r, &ifs.router_in),
            (r, &ifs.router_out),
            (s, &ifs.sink),
        ] {
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        let neigh = |ns: &str, addr: [u8; 4], mac: &str, dev: &str| {
            ip(&[
                "-n",
                ns,
                "neigh",
                "replace",
                &dotted(addr),
                "lladdr",
                mac,
                "dev",
                dev,
                "nud",
                "permanent",
            ])
        };
        // A veth hands packets to its peer's NAPI only when they are fit for GRO: with TSO on
        // at the sender, a socket's UDP needs rx-udp-gro-forwarding at the receiver (which
        // would merge datagrams). The generator's veth, like a NIC's wire, sends no TSO.
        let gen_if = ifs.gen.clone();
        in_netns(g, false, move || {
            crate::sys::set_tso(&gen_if, false).map_err(|e| format!("TSO off on {gen_if}: {e}"))
        })?;
        neigh(g, ROUTER_IN_ADDR, MAC_ROUTER_IN, &ifs.gen)?;
        neigh(r, SINK_ADDR, MAC_SINK, &ifs.router_out)?;
        let via = |ns: &str, gw: [u8; 4], dev: &str| {
            ip(&[
                "-n",
                ns,
                "route",
                "add",
                DST_NET,
                "via",
                &dotted(gw),
                "dev",
                dev,
            ])
        };
        via(g, ROUTER_IN_ADDR, &ifs.gen)?;
        via(r, SINK_ADDR, &ifs.router_out)?;
        if self.spec.firewall_rules > 0 {
            nft_in(r, &firewall_script(self.spec.firewall_rules))?;
        }
        Ok(())
    }

    /// The namespace names (generator, router, sink).
    pub fn names(&self) -> [&str; 3] {
        [self.gen.name(), self.router.name(), self.sink.name()]
    }
}

/// The host's network settings that a run must leave alone: sysctls under
/// `/proc/sys/net/{core,ipv4,ipv6/conf/{all,default}}` and every interface's `rps_cpus`,
/// `xps_cpus` and `threaded`, read from the host namespace (the calling thread must not have
/// joined another one).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostNet {
    /// Path → contents.
    pub values: BTreeMap<String, String>,
}

const HOST_DIRS: [&str; 6] = [
    "/proc/sys/net/core",
    "/proc/sys/net/ipv4",
    "/proc/sys/net/ipv4/conf/all",
    "/proc/sys/net/ipv4/conf/default",
    "/proc/sys/net/ipv6/conf/all",
    "/proc/sys/net/ipv6/conf/default",
];

/// Files in the host snapshot that change on their own (not settings).
fn volatile(path: &str) -> bool {
    path.ends_with("/stable_secret")
}

impl HostNet {
    /// Reads the host's values now.
    pub fn read() -> HostNet {
        let mut values = BTreeMap::new();
        let mut add = |p: std::path::PathBuf| {
            let key = p.display().to_string();
            if volatile(&key) {
                return;
            }
            if let Ok(t) = std::fs::read_to_string(&p) {
                values.insert(key, t);
            }
        };
        for d in HOST_DIRS {
            for e in std::fs::read_dir(d)
                .into_iter()
                .flatten()
                .flatten()
                .take(4096)
            {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    add(e.path());
                }
            }
        }
        for i in std::fs::read_dir("/sys/class/net")
            .into_iter()
            .flatten()
            .flatten()
            .take(4096)
        {
            add(i.path().join("threaded"));
            let queues = i.path().join("queues");
            for q in std::fs::read_dir(&queues)
                .into_iter()
                .flatten()
                .flatten()
                .take(4096)
            {
                add(q.path().join("rps_cpus"));
                add(q.path().join("xps_cpus"));
            }
        }
        HostNet { values }
    }

    /// Values present before and after that differ: what a run must never cause. (Entries
    /// that appear or vanish come from interfaces other processes add or remove.)
    pub fn changed(&self, after: &HostNet) -> Vec<String> {
        self.values
            .iter()
            .filter_map(|(k, v)| {
                let w = after.values.get(k)?;
                (w != v).then(|| format!("{k}: {:?} -> {:?}", v.trim(), w.trim()))
            })
            .collect()
    }

    /// Lines describing what differs in `after` (changed, appeared, vanished).
    pub fn diff(&self, after: &HostNet) -> Vec<String> {
        let mut out = Vec::new();
        for (k, v) in &self.values {
            match after.values.get(k) {
                Some(w) if w == v => {}
                Some(w) => out.push(format!("{k}: {:?} -> {:?}", v.trim(), w.trim())),
                None => out.push(format!("{k}: vanished")),
            }
        }
        for k in after.values.keys() {
            if !self.values.contains_key(k) {
                out.push(format!("{k}: appeared"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_ifnamsiz_and_differ() {
        let a = Ifaces::new(4_194_304, 0);
        let b = Ifaces::new(4_194_304, 1);
        for n in [&a.gen, &a.router_in, &a.router_out, &a.sink] {
            assert!(n.len() <= 15, "{n}");
        }
        assert_ne!(a.router_in, b.router_in);
        assert_eq!(a.router_in, "fw4194304ar0");
    }

    #[test]
    fn firewall_script_has_n_rules_that_never_match() {
        let s = firewall_script(300);
        assert_eq!(s.matches(" drop\n").count(), 300);
        assert!(s.contains("ip saddr 203.0.113.1 udp dport 1 drop"));
        assert!(s.contains("ip saddr 203.0.113.46 udp dport 2 drop"));
        assert!(s.contains("ct state new,established,related counter accept"));
        assert!(!s.contains(&dotted(GEN_ADDR)));
        assert_eq!(firewall_script(0).matches(" drop\n").count(), 0);
    }

    #[test]
    fn nft_counter_is_read_from_the_listing() {
        let l = "table ip clfwd {\n\tchain forward {\n\t\tip saddr 203.0.113.1 udp dport 1 drop\n\t\tct state established,related,new counter packets 1234 bytes 56 accept\n\t}\n}\n";
        assert_eq!(parse_counter(l), Some(1234));
        assert_eq!(parse_counter("table ip clfwd {}"), None);
    }

    #[test]
    fn host_diff_names_changes() {
        let mut a = HostNet::default();
        a.values.insert("x".into(), "0\n".into());
        a.values.insert("y".into(), "1\n".into());
        let mut b = a.clone();
        assert!(a.diff(&b).is_empty());
        b.values.insert("x".into(), "1\n".into());
        b.values.remove("y");
        b.values.insert("z".into(), "2\n".into());
        assert_eq!(
            a.diff(&b),
            vec!["x: \"0\" -> \"1\"", "y: vanished", "z: appeared"]
        );
        assert_eq!(a.changed(&b), vec!["x: \"0\" -> \"1\""]);
    }
}
