//! Helpers shared by the integration tests: fixture roots that clean up after themselves.

#![allow(dead_code)]

use corelocal::cpu::Topology;
use corelocal_tune::fixture::{self, Kind};
use corelocal_tune::fs::RootFs;
use corelocal_tune::plan::{self, Plan, PlanOptions, Profile};
use corelocal_tune::state::{self, HostState};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tune-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fixture tree in a temporary directory.
pub struct Fixture {
    pub dir: TempDir,
    pub root: PathBuf,
}

impl Fixture {
    pub fn new(kind: Kind) -> Fixture {
        let dir = TempDir::new(&format!("{kind:?}"));
        let root = dir.path("root");
        fixture::write(&root, kind).unwrap();
        Fixture { dir, root }
    }

    pub fn fs(&self) -> RootFs {
        RootFs::new(&self.root)
    }

    pub fn topo(&self) -> Topology {
        Topology::read(&self.root).unwrap()
    }

    pub fn host(&self, nics: &[&str]) -> HostState {
        let nics: Vec<String> = nics.iter().map(|s| s.to_string()).collect();
        state::read_host(&self.fs(), &self.topo(), &nics, &|_| {
            state::no_probe("fixture")
        })
        .unwrap()
    }

    pub fn plan(&self, profile: Profile, housekeeping: usize) -> Plan {
        let opts = PlanOptions {
            profile,
            housekeeping,
            flow_entries: plan::DEFAULT_FLOW_ENTRIES,
        };
        plan::plan(&self.topo(), &self.host(&[]), &opts).unwrap()
    }

    /// Every regular file under the root except `effective_affinity*` (the kernel picks
    /// those), path → contents.
    pub fn tree(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        walk(&self.root, &self.root, &mut out);
        out
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap()
    }
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        let path = entry.path();
        if kind.is_dir() {
            walk(root, &path, out);
        } else if kind.is_file()
            && !entry
                .file_name()
                .to_string_lossy()
                .starts_with("effective_affinity")
        {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(rel, std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// A plan's settings as (path, value) strings.
pub fn values(plan: &Plan) -> Vec<(String, String)> {
    plan.settings
        .iter()
        .map(|s| (s.knob.path(), s.value.to_string()))
        .collect()
}

/// Builds expected (path, value) pairs.
pub fn expect(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(p, v)| (p.to_string(), v.to_string()))
        .collect()
}
