//! [`CpuSet`]: a set of CPU ids with the two textual forms the kernel uses.
//!
//! - cpulist: `0-3,8,10-11` (`/sys/devices/system/cpu/online`, `taskset -c`);
//! - hex mask: comma-separated 32-bit groups, most significant first, any width
//!   (`ff,00000000`; `smp_affinity`, `rps_cpus`, `xps_cpus`).

use std::fmt;
use std::str::FromStr;

/// The largest CPU id accepted from text (the kernel's NR_CPUS upper bound is 8192).
pub const CPU_ID_MAX: usize = 8191;

/// A set of CPU ids, stored as a bitmap.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    words: Vec<u64>,
}

/// Why a cpulist or a hex mask could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseCpuSetError {
    input: String,
    reason: &'static str,
}

impl fmt::Display for ParseCpuSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid CPU set {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for ParseCpuSetError {}

fn parse_error(input: &str, reason: &'static str) -> ParseCpuSetError {
    ParseCpuSetError {
        input: input.to_string(),
        reason,
    }
}

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// CPUs `0..count`.
    pub fn first_n(count: usize) -> Self {
        (0..count).collect()
    }

    /// A set holding exactly `cpu`.
    pub fn single(cpu: usize) -> Self {
        std::iter::once(cpu).collect()
    }

    /// Adds `cpu`.
    pub fn insert(&mut self, cpu: usize) {
        let word = cpu / 64;
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        self.words[word] |= 1 << (cpu % 64);
    }

    /// Removes `cpu`.
    pub fn remove(&mut self, cpu: usize) {
        if let Some(w) = self.words.get_mut(cpu / 64) {
            *w &= !(1 << (cpu % 64));
        }
        self.trim();
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.words
            .get(cpu / 64)
            .is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    /// Number of CPUs in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The highest CPU id in the set.
    pub fn max(&self) -> Option<usize> {
        self.iter().last()
    }

    /// CPU ids in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            (0..64)
                .filter(move |b| w & (1u64 << b) != 0)
                .map(move |b| i * 64 + b)
        })
    }

    /// CPUs in both sets.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let mut out = CpuSet {
            words: self
                .words
                .iter()
                .zip(&other.words)
                .map(|(a, b)| a & b)
                .collect(),
        };
        out.trim();
        out
    }

    /// CPUs in either set.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let len = self.words.len().max(other.words.len());
        let word = |v: &Vec<u64>, i: usize| v.get(i).copied().unwrap_or(0);
        CpuSet {
            words: (0..len)
                .map(|i| word(&self.words, i) | word(&other.words, i))
                .collect(),
        }
    }

    /// CPUs in `self` but not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        let mut out = CpuSet {
            words: self
                .words
                .iter()
                .enumerate()
                .map(|(i, a)| a & !other.words.get(i).copied().unwrap_or(0))
                .collect(),
        };
        out.trim();
        out
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }

    /// Parses a cpulist: `0-3,8,10-11`; also `0-15:2` strides as the kernel accepts. Empty
    /// text (or only whitespace) is the empty set.
    pub fn parse_list(text: &str) -> Result<CpuSet, ParseCpuSetError> {
        let mut set = CpuSet::new();
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(set);
        }
        for part in trimmed.split(',') {
            let (range, stride) = match part.split_once(':') {
                Some((r, s)) => (r, parse_id(text, s)?),
                None => (part, 1),
            };
            if stride == 0 {
                return Err(parse_error(text, "stride must be at least 1"));
            }
            let (lo, hi) = match range.split_once('-') {
                Some((a, b)) => (parse_id(text, a)?, parse_id(text, b)?),
                None => {
                    let v = parse_id(text, range)?;
                    (v, v)
                }
            };
            if lo > hi {
                return Err(parse_error(text, "range start is above its end"));
            }
            for cpu in (lo..=hi).step_by(stride) {
                set.insert(cpu);
            }
        }
        Ok(set)
    }

    /// Parses a sysfs hex mask: comma-separated groups of up to 8 hex digits, most significant
    /// group first (`ff,00000000` = CPUs 32-39). An optional `0x` prefix is accepted.
    pub fn parse_mask(text: &str) -> Result<CpuSet, ParseCpuSetError> {
        let trimmed = text.trim();
        let body = trimmed
            .strip_prefix("0x")
            .or_else(|| trimmed.strip_prefix("0X"))
            .unwrap_or(trimmed);
        if body.is_empty() {
            return Err(parse_error(text, "empty mask"));
        }
        let groups: Vec<&str> = body.split(',').collect();
        let mut set = CpuSet::new();
        for (index_from_right, group) in groups.iter().rev().enumerate() {
            if group.is_empty() || group.len() > 8 {
                return Err(parse_error(text, "each group must have 1 to 8 hex digits"));
            }
            let value =
                u32::from_str_radix(group, 16).map_err(|_| parse_error(text, "not a hex digit"))?;
            let base = index_from_right * 32;
            if value != 0 && base + 31 - value.leading_zeros() as usize > CPU_ID_MAX {
                return Err(parse_error(text, "CPU id too large (at most 8191)"));
            }
            for bit in 0..32 {
                if value & (1 << bit) != 0 {
                    set.insert(base + bit);
                }
            }
        }
        Ok(set)
    }

    /// The cpulist form: `0-3,8`. The empty set prints as an empty string.
    pub fn to_list(&self) -> String {
        let mut out = String::new();
        let mut cpus = self.iter().peekable();
        while let Some(start) = cpus.next() {
            let mut end = start;
            while cpus.peek() == Some(&(end + 1)) {
                end = cpus.next().unwrap_or(end);
            }
            if !out.is_empty() {
                out.push(',');
            }
            if start == end {
                out.push_str(&start.to_string());
            } else {
                out.push_str(&format!("{start}-{end}"));
            }
        }
        out
    }

    /// The hex mask form with at least `min_groups` 32-bit groups, as sysfs prints it
    /// (`00000000,000000ff`). The empty set with `min_groups` 0 prints as `0`.
    pub fn to_mask(&self, min_groups: usize) -> String {
        let groups_needed = self.max().map_or(0, |m| m / 32 + 1);
        let groups = groups_needed.max(min_groups).max(1);
        (0..groups)
            .rev()
            .map(|g| {
                let word = self.words.get(g / 2).copied().unwrap_or(0);
                let half = (word >> ((g % 2) * 32)) as u32;
                if groups == 1 && min_groups == 0 {
                    format!("{half:x}")
                } else {
                    format!("{half:08x}")
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn parse_id(input: &str, text: &str) -> Result<usize, ParseCpuSetError> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(parse_error(input, "expected a CPU number"));
    }
    let id: usize = text
        .parse()
        .map_err(|_| parse_error(input, "CPU id too large (at most 8191)"))?;
    if id > CPU_ID_MAX {
        return Err(parse_error(input, "CPU id too large (at most 8191)"));
    }
    Ok(id)
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut set = CpuSet::new();
        for cpu in iter {
            set.insert(cpu);
        }
        set
    }
}

impl FromStr for CpuSet {
    type Err = ParseCpuSetError;

    /// Accepts a cpulist (`0-3,8`), or a hex mask when written with a `0x` prefix.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.starts_with("0x") || t.starts_with("0X") {
            CpuSet::parse_mask(t)
        } else {
            CpuSet::parse_list(t)
        }
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_list())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({})", self.to_list())
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_list())
    }
}

impl<'de> serde::Deserialize<'de> for CpuSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        CpuSet::parse_list(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_lists() {
        let s = CpuSet::parse_list("0-3,8,10-11").unwrap();
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(s.to_list(), "0-3,8,10-11");
        assert_eq!(CpuSet::parse_list("0-7:2").unwrap().to_list(), "0,2,4,6");
        assert_eq!(CpuSet::parse_list("\n").unwrap(), CpuSet::new());
    }

    #[test]
    fn rejects_bad_lists() {
        for bad in ["a", "1-", "3-1", "1,,2", "0-3:0", "99999"] {
            assert!(CpuSet::parse_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_masks() {
        assert_eq!(CpuSet::parse_mask("3").unwrap().to_list(), "0-1");
        assert_eq!(
            CpuSet::parse_mask("ff,00000000").unwrap().to_list(),
            "32-39"
        );
        assert_eq!(
            CpuSet::parse_mask("00000001,00000000,00000000,00000001\n")
                .unwrap()
                .to_list(),
            "0,96"
        );
        assert!(CpuSet::parse_mask("").is_err());
        assert!(CpuSet::parse_mask("123456789").is_err());
        assert!(CpuSet::parse_mask("xyz").is_err());
    }

    #[test]
    fn prints_masks_like_sysfs() {
        let s = CpuSet::parse_list("0-1").unwrap();
        assert_eq!(s.to_mask(0), "3");
        assert_eq!(s.to_mask(1), "00000003");
        assert_eq!(s.to_mask(3), "00000000,00000000,00000003");
        assert_eq!(CpuSet::single(95).to_mask(0), "80000000,00000000,00000000");
        assert_eq!(CpuSet::new().to_mask(0), "0");
    }

    #[test]
    fn set_operations() {
        let a = CpuSet::parse_list("0-5").unwrap();
        let b = CpuSet::parse_list("4-9").unwrap();
        assert_eq!(a.intersection(&b).to_list(), "4-5");
        assert_eq!(a.union(&b).to_list(), "0-9");
        assert_eq!(a.difference(&b).to_list(), "0-3");
        assert_eq!(a.difference(&a), CpuSet::new());
    }

    proptest! {
        #[test]
        fn list_round_trips(cpus in proptest::collection::btree_set(0usize..600, 0..80)) {
            let set: CpuSet = cpus.iter().copied().collect();
            let back = CpuSet::parse_list(&set.to_list()).unwrap();
            prop_assert_eq!(&back, &set);
            prop_assert_eq!(back.iter().collect::<Vec<_>>(), cpus.into_iter().collect::<Vec<_>>());
        }

        #[test]
        fn mask_round_trips(cpus in proptest::collection::btree_set(0usize..600, 0..80), min in 0usize..20) {
            let set: CpuSet = cpus.into_iter().collect();
            prop_assert_eq!(CpuSet::parse_mask(&set.to_mask(min)).unwrap(), set);
        }
    }
}
