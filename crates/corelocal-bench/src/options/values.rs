//! Value types of flags: durations ([`Dur`]) and source address specs ([`SrcSpec`]).

use serde::Serialize;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::str::FromStr;

/// A duration: `100ms`, `10s`, `2m`, `1.5s`, `250us`; a bare number is seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Dur(pub u64);

impl Dur {
    /// Nanoseconds.
    pub fn ns(self) -> u64 {
        self.0
    }
    /// Seconds.
    pub fn secs(self) -> f64 {
        self.0 as f64 / 1e9
    }
}

impl FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let v: f64 = num
            .parse()
            .map_err(|_| format!("bad duration {s:?} (e.g. 100ms, 10s, 2m)"))?;
        let mul = match unit {
            "" | "s" => 1e9,
            "ms" => 1e6,
            "us" | "µs" => 1e3,
            "ns" => 1.0,
            "m" | "min" => 60e9,
            "h" => 3600e9,
            _ => {
                return Err(format!(
                    "bad duration unit {unit:?} in {s:?} (ns, us, ms, s, m, h)"
                ))
            }
        };
        if !v.is_finite() || v < 0.0 || v * mul > 1e18 {
            return Err(format!("duration out of range: {s:?}"));
        }
        Ok(Dur((v * mul) as u64))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n == 0 {
            f.write_str("0s")
        } else if n % 1_000_000_000 == 0 {
            write!(f, "{}s", n / 1_000_000_000)
        } else if n % 1_000_000 == 0 {
            write!(f, "{}ms", n / 1_000_000)
        } else if n % 1000 == 0 {
            write!(f, "{}us", n / 1000)
        } else {
            write!(f, "{n}ns")
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// Source addresses: `auto`, `none`, a CIDR (`127.0.0.0/8`) or a range (`127.0.0.2-127.0.0.201`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SrcSpec {
    /// On loopback: none until ephemeral ports run out, then 127.0.0.2–127.0.0.201; else none.
    Auto,
    /// Let the kernel choose.
    None,
    /// An inclusive range.
    Range(Ipv4Addr, Ipv4Addr),
}

/// Most source addresses used (each gives ~28k ports).
pub const MAX_SRC: u32 = 4096;

impl SrcSpec {
    /// The addresses for a target.
    pub fn addrs(&self, target: &SocketAddrV4) -> Vec<Ipv4Addr> {
        let (a, b) = match self {
            SrcSpec::None => return Vec::new(),
            SrcSpec::Auto if target.ip().is_loopback() => {
                (Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 201))
            }
            SrcSpec::Auto => return Vec::new(),
            SrcSpec::Range(a, b) => (*a, *b),
        };
        let (a, b) = (u32::from(a), u32::from(b));
        let last = b.min(a.saturating_add(MAX_SRC - 1));
        (a..=last)
            .filter(|x| x & 0xff != 0 && x & 0xff != 0xff)
            .map(Ipv4Addr::from)
            .collect()
    }
}

impl FromStr for SrcSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => return Ok(SrcSpec::Auto),
            "none" => return Ok(SrcSpec::None),
            _ => {}
        }
        let bad = || format!("bad --src {s:?}: auto, none, 127.0.0.0/8 or 127.0.0.2-127.0.0.201");
        if let Some((ip, bits)) = s.split_once('/') {
            let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
            let bits: u32 = bits.parse().map_err(|_| bad())?;
            if !(8..=32).contains(&bits) {
                return Err(bad());
            }
            let mask = if bits == 32 {
                u32::MAX
            } else {
                !(u32::MAX >> bits)
            };
            let net = u32::from(ip) & mask;
            let first = if bits >= 31 { net } else { net + 1 };
            let last = if bits >= 31 {
                net | !mask
            } else {
                (net | !mask) - 1
            };
            return Ok(SrcSpec::Range(first.into(), last.into()));
        }
        if let Some((a, b)) = s.split_once('-') {
            let a: Ipv4Addr = a.parse().map_err(|_| bad())?;
            let b: Ipv4Addr = b.parse().map_err(|_| bad())?;
            if u32::from(a) > u32::from(b) {
                return Err(bad());
            }
            return Ok(SrcSpec::Range(a, b));
        }
        let a: Ipv4Addr = s.parse().map_err(|_| bad())?;
        Ok(SrcSpec::Range(a, a))
    }
}

impl fmt::Display for SrcSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SrcSpec::Auto => f.write_str("auto"),
            SrcSpec::None => f.write_str("none"),
            SrcSpec::Range(a, b) if a == b => write!(f, "{a}"),
            SrcSpec::Range(a, b) => write!(f, "{a}-{b}"),
        }
    }
}

impl Serialize for SrcSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}
