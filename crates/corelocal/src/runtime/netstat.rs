//! The kernel's listen-path counters of the server's network namespace (`TcpExt` in
//! `/proc/net/netstat`): what a SYN flood or a connection flood does before any worker sees a
//! connection. Sampled by the server's owner at the stats interval (one small file read, never
//! per connection) and reported as deltas since the server started.
//!
//! The counters are namespace-wide: other listeners in the same namespace add to them.

use crate::procfs;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

/// Where the counters are read.
const NETSTAT: &str = "/proc/net/netstat";

/// Listen-path counters (`TcpExt:*` of `/proc/net/netstat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NetCounters {
    /// `ListenOverflows`: completed handshakes dropped because an accept queue was full.
    pub listen_overflows: u64,
    /// `ListenDrops`: SYNs and handshakes dropped at a listener for any reason (overflows
    /// included).
    pub listen_drops: u64,
    /// `SyncookiesSent`: SYN-ACKs answered with a SYN cookie instead of a queued request.
    pub syncookies_sent: u64,
    /// `SyncookiesRecv`: ACKs that carried a valid cookie (handshakes completed by cookie).
    pub syncookies_recv: u64,
    /// `SyncookiesFailed`: ACKs with an invalid cookie.
    pub syncookies_failed: u64,
    /// `TCPReqQFullDrop`: SYNs dropped because a SYN queue was full and cookies were off.
    pub req_q_full_drop: u64,
    /// `TCPReqQFullDoCookies`: SYNs answered with a cookie because a SYN queue was full.
    pub req_q_full_do_cookies: u64,
}

impl NetCounters {
    /// The counters from a parsed `/proc/net/netstat` ([`procfs::parse_counters`]); missing
    /// ones read as 0.
    pub fn from_counters(map: &BTreeMap<String, u64>) -> NetCounters {
        let get = |name: &str| map.get(&format!("TcpExt:{name}")).copied().unwrap_or(0);
        NetCounters {
            listen_overflows: get("ListenOverflows"),
            listen_drops: get("ListenDrops"),
            syncookies_sent: get("SyncookiesSent"),
            syncookies_recv: get("SyncookiesRecv"),
            syncookies_failed: get("SyncookiesFailed"),
            req_q_full_drop: get("TCPReqQFullDrop"),
            req_q_full_do_cookies: get("TCPReqQFullDoCookies"),
        }
    }

    /// Reads `path` (a `/proc/net/netstat`); `None` when it cannot be read.
    pub fn read_from(path: &Path) -> Option<NetCounters> {
        let text = procfs::read_text(path).ok()?;
        Some(NetCounters::from_counters(&procfs::parse_counters(&text)))
    }

    /// `self - earlier`, field by field, saturating.
    pub fn since(&self, earlier: &NetCounters) -> NetCounters {
        NetCounters {
            listen_overflows: self
                .listen_overflows
                .saturating_sub(earlier.listen_overflows),
            listen_drops: self.listen_drops.saturating_sub(earlier.listen_drops),
            syncookies_sent: self.syncookies_sent.saturating_sub(earlier.syncookies_sent),
            syncookies_recv: self.syncookies_recv.saturating_sub(earlier.syncookies_recv),
            syncookies_failed: self
                .syncookies_failed
                .saturating_sub(earlier.syncookies_failed),
            req_q_full_drop: self.req_q_full_drop.saturating_sub(earlier.req_q_full_drop),
            req_q_full_do_cookies: self
                .req_q_full_do_cookies
                .saturating_sub(earlier.req_q_full_do_cookies),
        }
    }

    /// Whether every counter is zero.
    pub fn is_zero(&self) -> bool {
        *self == NetCounters::default()
    }
}

/// The baseline taken when the server started and the last delta sampled since.
#[derive(Debug)]
pub struct NetSampler {
    base: Option<NetCounters>,
    latest: Mutex<NetCounters>,
}

impl NetSampler {
    /// Takes the baseline from this process's namespace (none, and zeros forever, when
    /// `/proc/net/netstat` cannot be read).
    pub fn new() -> NetSampler {
        NetSampler {
            base: NetCounters::read_from(Path::new(NETSTAT)),
            latest: Mutex::new(NetCounters::default()),
        }
    }

    /// Reads the counters now and keeps their delta since the baseline.
    pub fn sample(&self) {
        let Some(base) = self.base else {
            return;
        };
        if let Some(now) = NetCounters::read_from(Path::new(NETSTAT)) {
            *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = now.since(&base);
        }
    }

    /// The delta at the last [`sample`](NetSampler::sample).
    pub fn latest(&self) -> NetCounters {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for NetSampler {
    fn default() -> Self {
        NetSampler::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NETSTAT_TEXT: &str = "TcpExt: SyncookiesSent SyncookiesRecv SyncookiesFailed \
        ListenOverflows ListenDrops TCPReqQFullDoCookies TCPReqQFullDrop\n\
        TcpExt: 10 7 1 3 5 9 2\n\
        IpExt: InNoRoutes\nIpExt: 4\n";

    #[test]
    fn parses_the_listen_counters_and_subtracts() {
        let c = NetCounters::from_counters(&procfs::parse_counters(NETSTAT_TEXT));
        assert_eq!(
            c,
            NetCounters {
                listen_overflows: 3,
                listen_drops: 5,
                syncookies_sent: 10,
                syncookies_recv: 7,
                syncookies_failed: 1,
                req_q_full_drop: 2,
                req_q_full_do_cookies: 9,
            }
        );
        let base = NetCounters {
            syncookies_sent: 4,
            listen_drops: 9,
            ..NetCounters::default()
        };
        let d = c.since(&base);
        assert_eq!(
            (d.syncookies_sent, d.listen_drops, d.syncookies_recv),
            (6, 0, 7)
        );
        assert!(NetCounters::default().is_zero() && !d.is_zero());
        assert!(NetCounters::from_counters(&BTreeMap::new()).is_zero());
    }

    #[test]
    fn sampler_starts_at_zero() {
        let s = NetSampler::new();
        assert!(s.latest().is_zero());
        assert_eq!(s.base.is_some(), Path::new(NETSTAT).exists());
        s.sample();
    }
}
