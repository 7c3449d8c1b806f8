//! `--pid-file` (memcached `-P`): the process id and a newline, for init scripts and
//! systemd's `PIDFile=`.
//!
//! Before the server binds anything, [`prepare`] writes the text to `PATH.tmp-PID` beside
//! PATH: a directory that cannot take the file stops the start there, with the flag's name.
//! Once the server serves, [`commit`] renames it into place, so a reader never sees a partial
//! file. A `--takeover` successor commits before it signals the old server (PID) or tells it
//! that it serves (SOCKET): the old server, which only exits after that, finds the successor's
//! id in the file and leaves it; if the takeover fails after the commit, [`revert`] puts back
//! what was there. [`remove_at_exit`] removes the file only while it still holds this
//! process's id (and the aside file if it never moved).
//!
//! One per process, so it is kept here rather than passed through every app's start.

use super::common::CommonArgs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

struct PidFile {
    path: PathBuf,
    aside: PathBuf,
    text: String,
    /// Renamed into place; what PATH held before (for [`revert`]).
    committed: Option<Option<Vec<u8>>>,
}

static PID_FILE: Mutex<Option<PidFile>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Option<PidFile>) -> T) -> T {
    f(&mut PID_FILE.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Writes `PATH.tmp-PID` (`--pid-file PATH`); an error names the flag and says why.
pub(super) fn prepare(common: &CommonArgs) -> Result<(), String> {
    let Some(path) = &common.pid_file else {
        return Ok(());
    };
    crate::check::output_file("--pid-file", path, "corelocal.pid")?;
    let pid = std::process::id();
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".tmp-{pid}"));
    let aside = PathBuf::from(aside);
    let text = format!("{pid}\n");
    std::fs::write(&aside, &text).map_err(|e| {
        format!(
            "--pid-file {}: cannot write {}: {e}",
            path.display(),
            aside.display()
        )
    })?;
    with(|slot| {
        *slot = Some(PidFile {
            path: path.clone(),
            aside,
            text,
            committed: None,
        })
    });
    Ok(())
}

/// Renames the prepared file into place (nothing to do without `--pid-file`).
pub(super) fn commit() -> Result<(), String> {
    with(|slot| {
        let Some(file) = slot.as_mut().filter(|f| f.committed.is_none()) else {
            return Ok(());
        };
        let previous = std::fs::read(&file.path).ok();
        std::fs::rename(&file.aside, &file.path)
            .map_err(|e| format!("--pid-file {}: {e}", file.path.display()))?;
        file.committed = Some(previous);
        Ok(())
    })
}

/// The takeover failed after [`commit`]: the old server serves on, so the file gets back what
/// it held (or goes, if it held nothing).
pub(super) fn revert() {
    with(|slot| {
        let Some(file) = slot.take() else { return };
        let Some(previous) = file.committed else {
            let _ = std::fs::remove_file(&file.aside);
            return;
        };
        let put_back = match previous {
            Some(text) => std::fs::write(&file.aside, text)
                .and_then(|()| std::fs::rename(&file.aside, &file.path)),
            None => remove_if_ours(&file.path, &file.text),
        };
        if let Err(e) = put_back {
            corelocal::log_line!(
                "corelocal serve: --pid-file {}: putting back what it held: {e}",
                file.path.display()
            );
        }
    })
}

/// Writes this process's id again (it serves on after a successor failed: the file may hold
/// the successor's id).
pub(super) fn rewrite() {
    with(|slot| {
        let Some(file) = slot.as_ref().filter(|f| f.committed.is_some()) else {
            return;
        };
        let written = std::fs::write(&file.aside, &file.text)
            .and_then(|()| std::fs::rename(&file.aside, &file.path));
        if let Err(e) = written {
            corelocal::log_line!(
                "corelocal serve: --pid-file {}: writing it again: {e}",
                file.path.display()
            );
        }
    })
}

/// At exit: removes the file if it holds this process's id (a successor's stays).
pub(super) fn remove_at_exit() {
    with(|slot| {
        let Some(file) = slot.take() else { return };
        if file.committed.is_none() {
            let _ = std::fs::remove_file(&file.aside);
            return;
        }
        if let Err(e) = remove_if_ours(&file.path, &file.text) {
            corelocal::log_line!(
                "corelocal serve: --pid-file {}: not removed: {e}",
                file.path.display()
            );
        }
    })
}

fn remove_if_ours(path: &Path, ours: &str) -> std::io::Result<()> {
    match std::fs::read(path) {
        Ok(text) if text == ours.as_bytes() => std::fs::remove_file(path),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
