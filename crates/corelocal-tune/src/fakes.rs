//! Test doubles for [`Fs`]: a fixture tree that behaves like the kernel on writes
//! ([`SimKernel`]), and a writer that fails on chosen paths ([`FaultyFs`]).

use crate::fs::{trimmed, Fs};
use crate::knob::mask_like;
use corelocal::cpu::CpuSet;
use std::cell::RefCell;
use std::io;
use std::path::Path;

fn os_err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// Wraps a fixture [`Fs`] and mimics the kernel on `proc/irq/N/smp_affinity` writes: managed
/// IRQs refuse (EPERM), IRQs out of vectors refuse (ENOSPC), masks without an online CPU are
/// EINVAL; on success `smp_affinity_list` is updated and `effective_affinity(_list)` becomes
/// the lowest CPU of the mask (x86 delivers to one CPU). `rps_flow_cnt` rounds up to a power of
/// two, as `store_rps_dev_flow_table_cnt` does.
pub struct SimKernel<F: Fs> {
    inner: F,
    online: CpuSet,
    /// IRQs whose affinity the kernel manages.
    pub managed: Vec<u32>,
    /// IRQs for which no vector is free.
    pub no_vectors: Vec<u32>,
}

impl<F: Fs> SimKernel<F> {
    /// A simulated kernel over `inner` with `online` CPUs.
    pub fn new(inner: F, online: CpuSet) -> Self {
        SimKernel {
            inner,
            online,
            managed: Vec::new(),
            no_vectors: Vec::new(),
        }
    }

    fn write_irq(&self, irq: u32, rel: &str, data: &str) -> io::Result<()> {
        if self.managed.contains(&irq) {
            return Err(os_err(libc::EPERM));
        }
        let set = CpuSet::parse_mask(trimmed(data)).map_err(|_| os_err(libc::EINVAL))?;
        let set = set.intersection(&self.online);
        if set.is_empty() {
            return Err(os_err(libc::EINVAL));
        }
        if self.no_vectors.contains(&irq) {
            return Err(os_err(libc::ENOSPC));
        }
        let width = self.inner.read(rel)?;
        let dir = format!("proc/irq/{irq}");
        let first = CpuSet::single(set.iter().next().unwrap_or(0));
        self.inner
            .write(rel, &format!("{}\n", mask_like(&set, trimmed(&width))))?;
        self.put(&format!("{dir}/smp_affinity_list"), &set.to_list())?;
        self.put(
            &format!("{dir}/effective_affinity"),
            &mask_like(&first, trimmed(&width)),
        )?;
        self.put(&format!("{dir}/effective_affinity_list"), &first.to_list())
    }

    fn put(&self, rel: &str, text: &str) -> io::Result<()> {
        if self.inner.exists(rel) {
            self.inner.write(rel, &format!("{text}\n"))
        } else {
            Ok(())
        }
    }
}

fn irq_of(rel: &str) -> Option<u32> {
    rel.strip_prefix("proc/irq/")?
        .strip_suffix("/smp_affinity")?
        .parse()
        .ok()
}

impl<F: Fs> Fs for SimKernel<F> {
    fn read(&self, rel: &str) -> io::Result<String> {
        self.inner.read(rel)
    }

    fn write(&self, rel: &str, data: &str) -> io::Result<()> {
        if let Some(irq) = irq_of(rel) {
            return self.write_irq(irq, rel, data);
        }
        if rel.ends_with("/rps_flow_cnt") {
            let n: u64 = trimmed(data)
                .trim()
                .parse()
                .map_err(|_| os_err(libc::EINVAL))?;
            let rounded = if n == 0 { 0 } else { n.next_power_of_two() };
            return self.inner.write(rel, &format!("{rounded}\n"));
        }
        self.inner.write(rel, data)
    }

    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        self.inner.list(rel)
    }

    fn read_link(&self, rel: &str) -> io::Result<String> {
        self.inner.read_link(rel)
    }

    fn exists(&self, rel: &str) -> bool {
        self.inner.exists(rel)
    }

    fn writable(&self, rel: &str) -> io::Result<bool> {
        self.inner.writable(rel)
    }

    fn root(&self) -> &Path {
        self.inner.root()
    }
}

/// Wraps an [`Fs`] and fails writes to chosen paths with a chosen errno; records every write
/// attempted.
pub struct FaultyFs<F: Fs> {
    inner: F,
    faults: Vec<(String, i32)>,
    /// Every write attempted: (path, data), successful or not.
    pub writes: RefCell<Vec<(String, String)>>,
}

impl<F: Fs> FaultyFs<F> {
    /// No faults yet.
    pub fn new(inner: F) -> Self {
        FaultyFs {
            inner,
            faults: Vec::new(),
            writes: RefCell::new(Vec::new()),
        }
    }

    /// Writes to `path` fail with `errno`.
    pub fn fail(mut self, path: &str, errno: i32) -> Self {
        self.faults.push((path.to_string(), errno));
        self
    }
}

impl<F: Fs> Fs for FaultyFs<F> {
    fn read(&self, rel: &str) -> io::Result<String> {
        self.inner.read(rel)
    }

    fn write(&self, rel: &str, data: &str) -> io::Result<()> {
        self.writes
            .borrow_mut()
            .push((rel.to_string(), data.to_string()));
        match self.faults.iter().find(|(p, _)| p == rel) {
            Some((_, errno)) => Err(os_err(*errno)),
            None => self.inner.write(rel, data),
        }
    }

    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        self.inner.list(rel)
    }

    fn read_link(&self, rel: &str) -> io::Result<String> {
        self.inner.read_link(rel)
    }

    fn exists(&self, rel: &str) -> bool {
        self.inner.exists(rel)
    }

    fn writable(&self, rel: &str) -> io::Result<bool> {
        self.inner.writable(rel)
    }

    fn root(&self) -> &Path {
        self.inner.root()
    }
}
