//! Packet-level flow-group migration backends, so a moved group's receive (softirq) work moves
//! with it (Affinity-Accept §3.3.2; kernel-primitives.md §3.1, §3.7):
//!
//! - [`XdpSteering`] (re-exported from [`crate::bpf::xdp`]): software, any interface, an XDP
//!   program redirecting each flow group through a CPUMAP; groups by [`flow_group`].
//! - [`RssSteering`]: the NIC's RSS indirection table (hash bucket → RX queue) through the
//!   ethtool ioctl, on NICs that have one; [`RssSteering::detect`] says why not otherwise.

pub use crate::bpf::xdp::{flow_group, Iface, XdpConfig, XdpError, XdpMode, XdpSteering};

use crate::sys::ethtool;
use std::fmt;
use std::io;

/// Why a NIC's RSS table cannot be used for steering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The interface.
    pub iface: String,
    /// Why, in words.
    pub reason: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: RSS steering unsupported: {} (use the software paths: XDP or the eBPF table)",
            self.iface, self.reason
        )
    }
}

impl std::error::Error for Unsupported {}

/// A NIC's RSS indirection table as a flow-group → RX-queue map: flow group = hash bucket
/// (`rx_hash mod buckets()`, the NIC's Toeplitz hash, not [`flow_group`]). Which CPU serves a
/// queue is its IRQ affinity (`/proc/irq/N/effective_affinity`), set outside corelocal.
#[derive(Debug, Clone)]
pub struct RssSteering {
    iface: String,
    driver: Option<String>,
    table: Vec<u32>,
    queues: u32,
}

/// The reason text for an ethtool error while reading `iface`'s RSS table.
pub fn unsupported_reason(iface: &str, driver: Option<&str>, err: &io::Error) -> String {
    let who = match driver {
        Some(d) if !d.is_empty() => format!("driver {d}"),
        _ if iface == "lo" => "the loopback device".to_string(),
        _ => "the device".to_string(),
    };
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            let hint = match driver {
                Some("virtio_net") => " (virtio_net has one only with VIRTIO_NET_F_RSS)",
                Some("veth") => " (veth has no hardware RX queues)",
                _ => "",
            };
            format!("{who} has no RSS indirection table{hint}")
        }
        Some(libc::ENODEV) => "no such interface in this network namespace".to_string(),
        Some(libc::EPERM) | Some(libc::EACCES) => {
            format!("permission denied reading {who}'s RSS table (needs CAP_NET_ADMIN)")
        }
        _ => format!("reading {who}'s RSS table: {err}"),
    }
}

impl RssSteering {
    /// Reads `iface`'s RSS indirection table and RX queue count (read-only ioctls). Reports
    /// [`Unsupported`] with a reason when the interface is missing, its driver has no table
    /// (lo, veth, virtio_net without RSS), or it has fewer than two RX queues.
    pub fn detect(iface: &str) -> Result<RssSteering, Unsupported> {
        let unsupported = |reason: String| Unsupported {
            iface: iface.to_string(),
            reason,
        };
        if let Err(e) = ethtool::ifindex(iface) {
            return Err(unsupported(format!("no such interface ({e})")));
        }
        let driver = ethtool::driver(iface).ok();
        let table = ethtool::rss_table(iface)
            .map_err(|e| unsupported(unsupported_reason(iface, driver.as_deref(), &e)))?;
        let table_max = table.iter().max().map_or(0, |&q| q + 1);
        let queues = ethtool::rx_queues(iface)
            .unwrap_or(table_max)
            .max(table_max);
        if queues < 2 {
            return Err(unsupported(format!(
                "only {queues} RX queue: nothing to steer between"
            )));
        }
        Ok(RssSteering {
            iface: iface.to_string(),
            driver,
            table,
            queues,
        })
    }

    /// The interface.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The driver's name, when it reports one.
    pub fn driver(&self) -> Option<&str> {
        self.driver.as_deref()
    }

    /// Number of hash buckets (indirection table entries).
    pub fn buckets(&self) -> u32 {
        self.table.len() as u32
    }

    /// Number of RX queues.
    pub fn queues(&self) -> u32 {
        self.queues
    }

    /// The table as last read or written: bucket → RX queue.
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// The bucket of an RX hash (`skb->hash`, `SKF_AD_RXHASH`).
    pub fn bucket_of_hash(&self, rx_hash: u32) -> u32 {
        rx_hash % self.buckets()
    }

    /// The RX queue bucket `bucket` is steered to.
    pub fn bucket_queue(&self, bucket: u32) -> Option<u32> {
        self.table.get(bucket as usize).copied()
    }

    /// Steers bucket `bucket` to RX queue `queue`: rewrites the NIC's whole table
    /// (`ETHTOOL_SRXFHINDIR`, CAP_NET_ADMIN); the cached copy changes only on success.
    pub fn set_bucket_queue(&mut self, bucket: u32, queue: u32) -> io::Result<()> {
        let table = with_bucket(&self.table, self.queues, bucket, queue)?;
        ethtool::set_rss_table(&self.iface, &table)?;
        self.table = table;
        Ok(())
    }
}

/// `table` with `table[bucket] = queue`, both checked.
fn with_bucket(table: &[u32], queues: u32, bucket: u32, queue: u32) -> io::Result<Vec<u32>> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
    if bucket as usize >= table.len() {
        return Err(bad(format!("bucket {bucket} ≥ {} buckets", table.len())));
    }
    if queue >= queues {
        return Err(bad(format!("RX queue {queue} ≥ {queues} queues")));
    }
    let mut t = table.to_vec();
    t[bucket as usize] = queue;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_the_driver() {
        let nosup = io::Error::from_raw_os_error(libc::EOPNOTSUPP);
        let r = unsupported_reason("eth0", Some("virtio_net"), &nosup);
        assert!(
            r.contains("virtio_net") && r.contains("VIRTIO_NET_F_RSS"),
            "{r}"
        );
        let r = unsupported_reason("lo", None, &nosup);
        assert!(r.contains("loopback"), "{r}");
        let r = unsupported_reason("x", None, &io::Error::from_raw_os_error(libc::ENODEV));
        assert!(r.contains("no such interface"), "{r}");
    }

    #[test]
    fn setting_a_bucket_checks_ranges() {
        let t = vec![0, 1, 0, 1];
        assert_eq!(with_bucket(&t, 2, 2, 1).unwrap(), vec![0, 1, 1, 1]);
        assert!(with_bucket(&t, 2, 4, 0).is_err());
        assert!(with_bucket(&t, 2, 0, 2).is_err());
    }

    #[test]
    fn missing_interfaces_are_unsupported() {
        let e = RssSteering::detect("nosuchif0").unwrap_err();
        assert!(e.reason.contains("no such interface"), "{e}");
        assert!(e.to_string().contains("software paths"));
    }
}
