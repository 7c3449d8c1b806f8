//! CPU topology read from sysfs under an injectable root, so tests run on fixture trees.
//!
//! Files read (relative to `root`): `sys/devices/system/cpu/{online,isolated,nohz_full}`,
//! `sys/devices/system/cpu/cpuN/topology/{physical_package_id,core_id,thread_siblings_list}`,
//! `sys/devices/system/cpu/cpuN/cache/indexK/{level,type,shared_cpu_list}` and
//! `sys/devices/system/node/nodeN/cpulist`.

use super::CpuSet;
use serde::Serialize;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Caches searched for the last level are limited to this many `indexK` directories.
const CACHE_INDEX_MAX: usize = 16;
/// NUMA node directories scanned are limited to this many.
const NUMA_NODE_MAX: usize = 1024;

/// What sysfs says about one online CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuInfo {
    /// The CPU id.
    pub cpu: usize,
    /// `physical_package_id` (socket).
    pub package: u32,
    /// `core_id`, unique within a package.
    pub core: u32,
    /// SMT siblings including this CPU (`thread_siblings_list`).
    pub siblings: CpuSet,
    /// NUMA node, if the host exposes nodes.
    pub numa_node: Option<u32>,
    /// CPUs sharing this CPU's last-level cache (the highest `level` among unified/data caches).
    pub llc_shared: CpuSet,
    /// The last-level cache's level (e.g. 3), if any cache is exposed.
    pub llc_level: Option<u32>,
}

/// The host's CPU topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// Online CPUs.
    pub online: CpuSet,
    /// CPUs isolated from the scheduler (`isolcpus=`).
    pub isolated: CpuSet,
    /// CPUs running tickless (`nohz_full=`).
    pub nohz_full: CpuSet,
    /// One entry per online CPU, in increasing CPU order.
    pub cpus: Vec<CpuInfo>,
    /// NUMA nodes and their CPUs (empty when the host exposes none).
    pub numa_nodes: Vec<(u32, CpuSet)>,
}

/// A topology file that could not be read or parsed.
#[derive(Debug)]
pub struct TopologyError {
    /// The file.
    pub path: PathBuf,
    /// What went wrong.
    pub reason: String,
}

impl std::fmt::Display for TopologyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

impl std::error::Error for TopologyError {}

fn read_trimmed(path: &Path) -> io::Result<String> {
    Ok(fs::read_to_string(path)?.trim().to_string())
}

fn read_required(path: &Path) -> Result<String, TopologyError> {
    read_trimmed(path).map_err(|e| TopologyError {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// A cpulist file that may be absent or empty. Debian's 6.12 kernel booted without
/// `nohz_full=` prints `(null)` in `/sys/devices/system/cpu/nohz_full` (the kernel formats a
/// cpumask it never allocated): that is an empty set too.
fn read_list_optional(path: &Path) -> Result<CpuSet, TopologyError> {
    match read_trimmed(path) {
        Ok(text) if text == "(null)" => Ok(CpuSet::new()),
        Ok(text) => CpuSet::parse_list(&text).map_err(|e| TopologyError {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(CpuSet::new()),
        Err(e) => Err(TopologyError {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

fn read_u32_or(path: &Path, default: u32) -> u32 {
    read_trimmed(path)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .map_or(default, |v| v.max(0) as u32)
}

impl Topology {
    /// Reads the topology of the running host (`root` = `/`).
    pub fn host() -> Result<Topology, TopologyError> {
        Topology::read(Path::new("/"))
    }

    /// Reads the topology from a sysfs tree under `root`.
    pub fn read(root: &Path) -> Result<Topology, TopologyError> {
        let cpu_dir = root.join("sys/devices/system/cpu");
        let online_path = cpu_dir.join("online");
        let online =
            CpuSet::parse_list(&read_required(&online_path)?).map_err(|e| TopologyError {
                path: online_path,
                reason: e.to_string(),
            })?;
        let numa_nodes = read_numa_nodes(&root.join("sys/devices/system/node"))?;
        let mut cpus = Vec::with_capacity(online.len());
        for cpu in online.iter() {
            cpus.push(read_cpu(
                &cpu_dir.join(format!("cpu{cpu}")),
                cpu,
                &numa_nodes,
            )?);
        }
        Ok(Topology {
            isolated: read_list_optional(&cpu_dir.join("isolated"))?,
            nohz_full: read_list_optional(&cpu_dir.join("nohz_full"))?,
            online,
            cpus,
            numa_nodes,
        })
    }

    /// Information on `cpu`, if it is online.
    pub fn cpu(&self, cpu: usize) -> Option<&CpuInfo> {
        self.cpus.iter().find(|c| c.cpu == cpu)
    }

    /// Distinct physical packages, in increasing order.
    pub fn packages(&self) -> Vec<u32> {
        let mut p: Vec<u32> = self.cpus.iter().map(|c| c.package).collect();
        p.sort_unstable();
        p.dedup();
        p
    }

    /// One CPU per physical core (the lowest-numbered SMT sibling), within `allowed`.
    pub fn primary_threads(&self, allowed: &CpuSet) -> CpuSet {
        self.cpus
            .iter()
            .filter(|c| allowed.contains(c.cpu))
            .filter(|c| {
                let first_sibling = c.siblings.intersection(allowed).iter().next();
                first_sibling == Some(c.cpu)
            })
            .map(|c| c.cpu)
            .collect()
    }

    /// The CPUs of NUMA node `node` (empty if unknown).
    pub fn node_cpus(&self, node: u32) -> CpuSet {
        self.numa_nodes
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }
}

fn read_cpu(dir: &Path, cpu: usize, nodes: &[(u32, CpuSet)]) -> Result<CpuInfo, TopologyError> {
    let topo = dir.join("topology");
    let mut siblings = read_list_optional(&topo.join("thread_siblings_list"))?;
    if siblings.is_empty() {
        siblings.insert(cpu);
    }
    let (llc_level, llc_shared) = read_llc(&dir.join("cache"))?;
    Ok(CpuInfo {
        cpu,
        package: read_u32_or(&topo.join("physical_package_id"), 0),
        core: read_u32_or(&topo.join("core_id"), cpu as u32),
        siblings,
        numa_node: nodes.iter().find(|(_, s)| s.contains(cpu)).map(|(n, _)| *n),
        llc_shared: if llc_shared.is_empty() {
            CpuSet::single(cpu)
        } else {
            llc_shared
        },
        llc_level,
    })
}

fn read_llc(cache_dir: &Path) -> Result<(Option<u32>, CpuSet), TopologyError> {
    let mut best: (Option<u32>, CpuSet) = (None, CpuSet::new());
    for index in 0..CACHE_INDEX_MAX {
        let dir = cache_dir.join(format!("index{index}"));
        let Ok(level_text) = read_trimmed(&dir.join("level")) else {
            continue;
        };
        let Ok(level) = level_text.parse::<u32>() else {
            continue;
        };
        let kind = read_trimmed(&dir.join("type")).unwrap_or_default();
        if kind == "Instruction" {
            continue;
        }
        if best.0.is_none_or(|b| level > b) {
            best = (
                Some(level),
                read_list_optional(&dir.join("shared_cpu_list"))?,
            );
        }
    }
    Ok(best)
}

fn read_numa_nodes(node_dir: &Path) -> Result<Vec<(u32, CpuSet)>, TopologyError> {
    let Ok(entries) = fs::read_dir(node_dir) else {
        return Ok(Vec::new());
    };
    let mut nodes = Vec::new();
    for entry in entries.flatten().take(NUMA_NODE_MAX) {
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        nodes.push((id, read_list_optional(&entry.path().join("cpulist"))?));
    }
    nodes.sort_by_key(|(id, _)| *id);
    Ok(nodes)
}

/// Writes a small sysfs fixture tree; used by tests here and in the tool crates.
pub mod fixture {
    use std::fs;
    use std::io;
    use std::path::Path;

    /// Description of a synthetic host: `packages` × `cores_per_package` × `threads_per_core`,
    /// CPU ids numbered like Linux on x86 (all first threads, then all second threads), one
    /// NUMA node and one LLC per package.
    #[derive(Debug, Clone, Copy)]
    pub struct HostShape {
        /// Sockets.
        pub packages: usize,
        /// Physical cores per socket.
        pub cores_per_package: usize,
        /// SMT threads per core.
        pub threads_per_core: usize,
    }

    impl HostShape {
        /// Total CPUs.
        pub fn cpus(&self) -> usize {
            self.packages * self.cores_per_package * self.threads_per_core
        }

        /// (package, core, thread) of `cpu`.
        pub fn place(&self, cpu: usize) -> (usize, usize, usize) {
            let cores = self.packages * self.cores_per_package;
            let thread = cpu / cores;
            let global_core = cpu % cores;
            (
                global_core / self.cores_per_package,
                global_core % self.cores_per_package,
                thread,
            )
        }
    }

    fn write(path: &Path, text: &str) -> io::Result<()> {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, format!("{text}\n"))
    }

    fn list(cpus: impl Iterator<Item = usize>) -> String {
        cpus.collect::<super::CpuSet>().to_list()
    }

    /// Writes the CPU and node part of sysfs for `shape` under `root`.
    pub fn write_host(root: &Path, shape: HostShape) -> io::Result<()> {
        let n = shape.cpus();
        let cpu_dir = root.join("sys/devices/system/cpu");
        write(&cpu_dir.join("online"), &format!("0-{}", n - 1))?;
        write(&cpu_dir.join("isolated"), "")?;
        for cpu in 0..n {
            let (pkg, core, _) = shape.place(cpu);
            let d = cpu_dir.join(format!("cpu{cpu}"));
            write(&d.join("topology/physical_package_id"), &pkg.to_string())?;
            write(&d.join("topology/core_id"), &core.to_string())?;
            let siblings = (0..n).filter(|&c| {
                let (p, k, _) = shape.place(c);
                p == pkg && k == core
            });
            write(&d.join("topology/thread_siblings_list"), &list(siblings))?;
            let same_pkg = (0..n).filter(|&c| shape.place(c).0 == pkg);
            write(&d.join("cache/index3/level"), "3")?;
            write(&d.join("cache/index3/type"), "Unified")?;
            write(&d.join("cache/index3/shared_cpu_list"), &list(same_pkg))?;
            write(&d.join("cache/index0/level"), "1")?;
            write(&d.join("cache/index0/type"), "Data")?;
        }
        for pkg in 0..shape.packages {
            let cpus = (0..n).filter(|&c| shape.place(c).0 == pkg);
            write(
                &root.join(format!("sys/devices/system/node/node{pkg}/cpulist")),
                &list(cpus),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::{write_host, HostShape};
    use super::*;

    fn temp_root(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("corelocal-topo-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn reads_two_socket_smt_fixture() {
        let root = temp_root("2s");
        let shape = HostShape {
            packages: 2,
            cores_per_package: 2,
            threads_per_core: 2,
        };
        write_host(&root, shape).unwrap();
        let t = Topology::read(&root).unwrap();
        assert_eq!(t.online.to_list(), "0-7");
        assert_eq!(t.packages(), vec![0, 1]);
        let c5 = t.cpu(5).unwrap();
        assert_eq!((c5.package, c5.core), (0, 1));
        assert_eq!(c5.siblings.to_list(), "1,5");
        assert_eq!(c5.numa_node, Some(0));
        assert_eq!(c5.llc_level, Some(3));
        assert_eq!(c5.llc_shared.to_list(), "0-1,4-5");
        assert_eq!(t.primary_threads(&t.online).to_list(), "0-3");
        assert_eq!(t.node_cpus(1).to_list(), "2-3,6-7");
        fs::remove_dir_all(root).unwrap();
    }

    /// Debian 6.12 at boot, no `nohz_full=`: the file reads `(null)` (issue 35's first boot
    /// broke `tune` on it).
    #[test]
    fn nohz_full_null_is_empty() {
        let root = temp_root("nohz-null");
        let shape = HostShape {
            packages: 1,
            cores_per_package: 2,
            threads_per_core: 1,
        };
        write_host(&root, shape).unwrap();
        let file = root.join("sys/devices/system/cpu/nohz_full");
        fs::write(&file, "(null)\n").unwrap();
        assert!(Topology::read(&root).unwrap().nohz_full.is_empty());
        fs::write(&file, "1\n").unwrap();
        assert_eq!(Topology::read(&root).unwrap().nohz_full.to_list(), "1");
        fs::write(&file, "garbage\n").unwrap();
        assert!(
            Topology::read(&root).is_err(),
            "anything else still refused"
        );
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn reads_this_host() {
        let t = Topology::host().unwrap();
        assert!(!t.online.is_empty());
        assert_eq!(t.cpus.len(), t.online.len());
        for c in &t.cpus {
            assert!(c.siblings.contains(c.cpu));
        }
    }

    #[test]
    fn missing_online_file_is_a_clear_error() {
        let root = temp_root("empty");
        fs::create_dir_all(&root).unwrap();
        let err = Topology::read(&root).unwrap_err();
        assert!(err.to_string().contains("online"), "{err}");
        fs::remove_dir_all(root).unwrap();
    }
}
