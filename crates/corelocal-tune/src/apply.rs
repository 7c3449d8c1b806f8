//! `apply`: snapshot, write, classify failures, roll back; `revert`: byte-exact restore.

use crate::check::{check_plan, Current};
use crate::error::{Result, TuneError};
use crate::fs::Fs;
use crate::knob::Knob;
use crate::plan::Plan;
use corelocal::cpu::CpuSet;
use serde::{Deserialize, Serialize};
use std::io::{self, Write};
use std::path::Path;

/// The snapshot file format tag.
pub const SNAPSHOT_FORMAT: &str = "corelocal-tune-snapshot/1";

/// What to do when a write fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnError {
    /// Restore every value written so far, then stop.
    Rollback,
    /// Record the failure and go on with the next knob.
    Continue,
}

/// The exact contents of every knob `apply` changed, taken before the first write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// [`SNAPSHOT_FORMAT`].
    pub format: String,
    /// The root the paths are relative to when taken.
    pub root: String,
    /// Entries, in the order they were written.
    pub entries: Vec<SnapshotEntry>,
}

/// One knob's contents, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotEntry {
    /// Path relative to the root.
    pub path: String,
    /// The file's contents, trailing newline included.
    pub content: String,
}

/// Why a write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteErrorClass {
    /// EIO (before Linux 6.12) / EPERM on `smp_affinity`: a kernel-managed IRQ, or IRQ
    /// affinity disabled; user space cannot move it.
    ManagedIrq,
    /// ENOSPC: no free interrupt vector on the target CPUs (x86 vector exhaustion).
    VectorsExhausted,
    /// EINVAL: the kernel rejected the value (offline CPU, mask too wide, not supported).
    Invalid,
    /// EPERM / EACCES elsewhere: not privileged.
    PermissionDenied,
    /// ENOENT / ENODEV: the knob or device went away.
    Missing,
    /// Anything else.
    Other,
}

/// A failed write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WriteFailure {
    /// The knob's path.
    pub path: String,
    /// The class.
    pub class: WriteErrorClass,
    /// errno, if any.
    pub errno: Option<i32>,
    /// A sentence for the operator.
    pub message: String,
}

/// Classifies a write error on `knob`.
pub fn classify(knob: &Knob, err: &io::Error) -> WriteFailure {
    use WriteErrorClass::*;
    let errno = err.raw_os_error();
    let irq = matches!(knob, Knob::IrqAffinity { .. });
    let (class, advice) = match errno {
        Some(libc::EIO) | Some(libc::EPERM) if irq => (
            ManagedIrq,
            "the kernel manages this IRQ's affinity (managed IRQ) or IRQ affinity is disabled",
        ),
        Some(libc::ENOSPC) => (
            VectorsExhausted,
            "no free interrupt vectors on the target CPU(s); spread IRQs over more CPUs",
        ),
        Some(libc::EINVAL) => (
            Invalid,
            "the kernel rejected the value (offline CPU, mask wider than nr_cpu_ids, unsupported)",
        ),
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::EROFS) => (
            PermissionDenied,
            "not permitted: run as root, on a writable /proc and /sys",
        ),
        Some(libc::ENOENT) | Some(libc::ENODEV) => (Missing, "the knob or its device is gone"),
        _ => (Other, "unexpected error"),
    };
    WriteFailure {
        path: knob.path(),
        class,
        errno,
        message: format!("{}: {err}: {advice}", knob.path()),
    }
}

/// Options for [`apply`].
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Write (otherwise a dry run).
    pub yes: bool,
    /// Go ahead although irqbalance runs.
    pub force: bool,
    /// What to do on a write failure.
    pub on_error: OnError,
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    /// Whether anything was written (false for a dry run).
    pub wrote: bool,
    /// Knobs changed (or that would change, in a dry run).
    pub changed: Vec<String>,
    /// Knobs already at the planned value.
    pub unchanged: usize,
    /// Write failures.
    pub failures: Vec<WriteFailure>,
    /// Whether a rollback restored the snapshot.
    pub rolled_back: bool,
}

/// Takes the snapshot of every knob that will change.
pub fn snapshot_of(fs: &dyn Fs, changes: &[&Current]) -> Snapshot {
    Snapshot {
        format: SNAPSHOT_FORMAT.to_string(),
        root: canonical_root(fs.root()),
        entries: changes
            .iter()
            .map(|c| SnapshotEntry {
                path: c.setting.knob.path(),
                content: c.raw.clone(),
            })
            .collect(),
    }
}

/// The root as an absolute, symlink-free path when it can be resolved.
pub fn canonical_root(root: &Path) -> String {
    std::fs::canonicalize(root)
        .unwrap_or_else(|_| root.to_path_buf())
        .display()
        .to_string()
}

/// Writes `snapshot` to a new file (never overwriting one: it may hold the only record of
/// the original values).
pub fn save_snapshot(path: &Path, snapshot: &Snapshot) -> Result<()> {
    let text = serde_json::to_string_pretty(snapshot)
        .map_err(|e| TuneError::failed(format!("cannot encode snapshot: {e}")))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            TuneError::input(format!(
                "cannot create snapshot {}: {e} (an existing snapshot is never overwritten; \
                 revert it or pass --snapshot NEW)",
                path.display()
            ))
        })?;
    file.write_all(format!("{text}\n").as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(|e| TuneError::failed(format!("cannot write snapshot {}: {e}", path.display())))
}

fn irq_guard(fs: &dyn Fs, c: &Current) -> Option<WriteFailure> {
    let Knob::IrqAffinity { .. } = c.setting.knob else {
        return None;
    };
    let path = c.setting.knob.path();
    let now = fs
        .read(&path)
        .ok()
        .and_then(|t| CpuSet::parse_mask(crate::fs::trimmed(&t)).ok());
    match now {
        Some(set) if set.is_empty() => Some(WriteFailure {
            path: path.clone(),
            class: WriteErrorClass::Invalid,
            errno: None,
            message: format!("{path}: reads back empty after the write"),
        }),
        _ => None,
    }
}

fn write_one(fs: &dyn Fs, c: &Current) -> std::result::Result<(), WriteFailure> {
    let text = c.text_to_write();
    match fs.write(&c.setting.knob.path(), &text) {
        Ok(()) => irq_guard(fs, c).map_or(Ok(()), Err),
        Err(e) => Err(classify(&c.setting.knob, &e)),
    }
}

/// Restores `entries` (newest first); returns the failures.
pub fn restore(fs: &dyn Fs, entries: &[SnapshotEntry]) -> Vec<WriteFailure> {
    let mut failures = Vec::new();
    for e in entries.iter().rev() {
        if let Err(err) = fs.write(&e.path, &e.content) {
            let knob = Knob::parse(&e.path).unwrap_or(Knob::SockFlowEntries);
            failures.push(classify(&knob, &err));
        }
    }
    failures
}

/// Applies `plan`: validates it (nothing written on bad input), refuses while irqbalance runs
/// unless forced, saves the snapshot to `snapshot_path`, writes, and on failure rolls back or
/// continues as told.
pub fn apply(
    fs: &dyn Fs,
    online: &CpuSet,
    plan: &Plan,
    opts: &ApplyOptions,
    snapshot_path: &Path,
) -> Result<ApplyReport> {
    let current = check_plan(fs, online, plan)?;
    let changes: Vec<&Current> = current.iter().filter(|c| !c.matches()).collect();
    let mut report = ApplyReport {
        wrote: false,
        changed: changes.iter().map(|c| c.setting.knob.path()).collect(),
        unchanged: current.len() - changes.len(),
        failures: Vec::new(),
        rolled_back: false,
    };
    if !opts.yes || changes.is_empty() {
        return Ok(report);
    }
    refuse_irqbalance(fs, plan, opts.force)?;
    save_snapshot(snapshot_path, &snapshot_of(fs, &changes))?;
    report.wrote = true;
    write_all(fs, &changes, opts.on_error, &mut report);
    Ok(report)
}

fn refuse_irqbalance(fs: &dyn Fs, plan: &Plan, force: bool) -> Result<()> {
    let touches_irqs = plan
        .settings
        .iter()
        .any(|s| matches!(s.knob, Knob::IrqAffinity { .. }));
    match crate::state::irqbalance_pid(fs) {
        Some(pid) if touches_irqs && !force => Err(TuneError::failed(format!(
            "irqbalance is running (pid {pid}) and would undo the IRQ layout; stop it \
             (systemctl stop irqbalance) or pass --force. Nothing was changed."
        ))),
        _ => Ok(()),
    }
}

fn write_all(fs: &dyn Fs, changes: &[&Current], on_error: OnError, report: &mut ApplyReport) {
    for (i, c) in changes.iter().enumerate() {
        let Err(failure) = write_one(fs, c) else {
            continue;
        };
        // A refused write changed nothing; a write that read back wrong did change the file.
        let written = if failure.errno.is_some() { i } else { i + 1 };
        report.failures.push(failure);
        if on_error == OnError::Rollback {
            let done: Vec<SnapshotEntry> = changes[..written]
                .iter()
                .map(|c| SnapshotEntry {
                    path: c.setting.knob.path(),
                    content: c.raw.clone(),
                })
                .collect();
            report.failures.extend(restore(fs, &done));
            report.rolled_back = true;
            return;
        }
    }
}

/// Loads and checks a snapshot's entries (only knobs the tuner writes).
pub fn check_snapshot(s: &Snapshot) -> Result<()> {
    if s.format != SNAPSHOT_FORMAT {
        return Err(TuneError::input(format!(
            "snapshot format {:?} is not {SNAPSHOT_FORMAT:?}",
            s.format
        )));
    }
    if s.entries.len() > crate::plan::SETTINGS_MAX {
        return Err(TuneError::input("snapshot has too many entries"));
    }
    for e in &s.entries {
        Knob::parse(&e.path).map_err(|m| TuneError::input(format!("snapshot: {m}")))?;
        if e.content.len() > 4096 {
            return Err(TuneError::input(format!(
                "snapshot: {} content too long",
                e.path
            )));
        }
    }
    Ok(())
}

/// What `revert` found after restoring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RevertReport {
    /// Entries restored.
    pub restored: usize,
    /// Write failures.
    pub failures: Vec<WriteFailure>,
    /// Paths whose contents differ from the snapshot after the restore: (path, now).
    pub mismatches: Vec<(String, String)>,
}

/// Restores a snapshot and checks every file reads back byte for byte.
pub fn revert(fs: &dyn Fs, snapshot: &Snapshot) -> Result<RevertReport> {
    check_snapshot(snapshot)?;
    let root = canonical_root(fs.root());
    if snapshot.root != root {
        return Err(TuneError::input(format!(
            "the snapshot was taken under root {:?}, not {root:?}; pass --root {:?}",
            snapshot.root, snapshot.root
        )));
    }
    for e in &snapshot.entries {
        if !fs.exists(&e.path) {
            return Err(TuneError::input(format!(
                "{} does not exist; nothing was changed",
                e.path
            )));
        }
    }
    let failures = restore(fs, &snapshot.entries);
    let mismatches = snapshot
        .entries
        .iter()
        .filter_map(|e| match fs.read(&e.path) {
            Ok(now) if now == e.content => None,
            Ok(now) => Some((e.path.clone(), now)),
            Err(err) => Some((e.path.clone(), format!("<unreadable: {err}>"))),
        })
        .collect();
    Ok(RevertReport {
        restored: snapshot.entries.len(),
        failures,
        mismatches,
    })
}
