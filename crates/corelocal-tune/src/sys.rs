//! The live ethtool probes: channel counts and the RSS indirection table and key, read through
//! [`corelocal::sys::ethtool`] (which holds the ioctl and its `unsafe`) and reported as
//! [`Probe`]s.
//!
//! Each command is read-only: `ETHTOOL_GCHANNELS`, then `ETHTOOL_GRSSH` (table and key) with
//! `ETHTOOL_GRXFHINDIR` (table only, older drivers) as the fallback. A driver without the
//! operation answers `EOPNOTSUPP`, reported as [`Probe::Unsupported`].

use crate::state::{Channels, Probe, Rss};
use corelocal::sys::ethtool;
use std::io;

fn unsupported<T>(e: io::Error) -> Probe<T> {
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            Probe::Unsupported("the driver has no such operation or an empty table".into())
        }
        Some(libc::ENODEV) => Probe::Unsupported("no such device in this network namespace".into()),
        Some(libc::EPERM) => Probe::NotQueried("permission denied".into()),
        _ => Probe::Unsupported(e.to_string()),
    }
}

/// `ETHTOOL_GCHANNELS`.
pub fn channels(nic: &str) -> Probe<Channels> {
    match ethtool::channels(nic) {
        Ok(c) => Probe::Ok(c),
        Err(e) => unsupported(e),
    }
}

/// The RSS table and key: `ETHTOOL_GRSSH`, falling back to `ETHTOOL_GRXFHINDIR`.
pub fn rss(nic: &str) -> Probe<Rss> {
    match ethtool::rxfh(nic) {
        Ok(r) => Probe::Ok(Rss {
            indirection: r.indirection,
            key: r.key.iter().map(|b| format!("{b:02x}")).collect(),
            hfunc: Some(r.hfunc),
        }),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => match ethtool::rxfh_indir(nic) {
            Ok(indirection) => Probe::Ok(Rss {
                indirection,
                key: String::new(),
                hfunc: None,
            }),
            Err(e) => unsupported(e),
        },
        Err(e) => unsupported(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_interface_is_reported_not_fatal() {
        assert!(matches!(
            channels("nosuchif0"),
            Probe::Unsupported(_) | Probe::NotQueried(_)
        ));
        assert!(matches!(
            rss("nosuchif0"),
            Probe::Unsupported(_) | Probe::NotQueried(_)
        ));
        assert!(matches!(channels(""), Probe::Unsupported(_)));
    }
}
