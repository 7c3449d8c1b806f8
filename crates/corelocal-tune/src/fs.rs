//! The I/O edge: every file the tuner reads or writes goes through [`Fs`], with paths relative
//! to a root (`/` on a live host, a fixture directory in tests).
//!
//! Paths are plain relative strings such as `proc/irq/38/smp_affinity`; [`check_rel`] refuses
//! absolute paths and `..` so a plan file cannot reach outside the root.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// The most bytes read from one pseudo-file (sysfs/procfs values are a page at most; the
/// largest we read, `/proc/interrupts`, grows with IRQs × CPUs).
pub const READ_LIMIT: u64 = 8 << 20;
/// The most entries listed from one directory.
pub const DIR_LIMIT: usize = 65_536;

/// Reads and writes files under a root.
pub trait Fs {
    /// The raw contents of `rel` (at most [`READ_LIMIT`] bytes), as UTF-8.
    fn read(&self, rel: &str) -> io::Result<String>;
    /// Writes `data` to `rel` in one `write(2)`, without creating or truncating semantics beyond
    /// what the kernel's pseudo-files do (the file must exist).
    fn write(&self, rel: &str, data: &str) -> io::Result<()>;
    /// The entry names of directory `rel`, sorted, at most [`DIR_LIMIT`].
    fn list(&self, rel: &str) -> io::Result<Vec<String>>;
    /// The target of symlink `rel`.
    fn read_link(&self, rel: &str) -> io::Result<String>;
    /// Whether `rel` exists (following symlinks).
    fn exists(&self, rel: &str) -> bool;
    /// Whether `rel`'s mode has any write bit (pseudo-files of managed IRQs are 0444; root
    /// would bypass the bits on a fixture, so the tuner checks them itself).
    fn writable(&self, rel: &str) -> io::Result<bool>;
    /// The root directory these paths are relative to (for messages).
    fn root(&self) -> &Path;
}

/// Refuses absolute paths, empty components and `..`.
pub fn check_rel(rel: &str) -> io::Result<()> {
    let bad = rel.is_empty()
        || rel.starts_with('/')
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == ".." || c == ".");
    if bad {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {rel:?} must be relative to the root, without '..'"),
        ));
    }
    Ok(())
}

/// The real file system under a root directory.
#[derive(Debug, Clone)]
pub struct RootFs {
    root: PathBuf,
}

impl RootFs {
    /// Files under `root` (`/` for the live host).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RootFs { root: root.into() }
    }

    /// The absolute path of `rel`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Whether this is the live host's root (ioctls and process checks are then meaningful).
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }
}

impl Fs for RootFs {
    fn read(&self, rel: &str) -> io::Result<String> {
        check_rel(rel)?;
        let mut bytes = Vec::new();
        fs::File::open(self.path(rel))?
            .take(READ_LIMIT)
            .read_to_end(&mut bytes)?;
        String::from_utf8(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file is not UTF-8"))
    }

    fn write(&self, rel: &str, data: &str) -> io::Result<()> {
        check_rel(rel)?;
        // No O_CREAT / O_TRUNC: a missing knob is an error, never a new file. Sysfs and procfs
        // ignore the offset, and fixture files are rewritten from the start, so truncate by
        // hand only for regular files (fixtures).
        let mut file = fs::OpenOptions::new().write(true).open(self.path(rel))?;
        if file.metadata()?.len() > 0 && is_regular_fixture(&self.path(rel)) {
            file.set_len(0)?;
        }
        let written = file.write(data.as_bytes())?;
        if written != data.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
        }
        Ok(())
    }

    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        check_rel(rel)?;
        let mut names: Vec<String> = fs::read_dir(self.path(rel))?
            .take(DIR_LIMIT)
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        Ok(names)
    }

    fn read_link(&self, rel: &str) -> io::Result<String> {
        check_rel(rel)?;
        let target = fs::read_link(self.path(rel))?;
        target
            .into_os_string()
            .into_string()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "link is not UTF-8"))
    }

    fn exists(&self, rel: &str) -> bool {
        check_rel(rel).is_ok() && self.path(rel).exists()
    }

    fn writable(&self, rel: &str) -> io::Result<bool> {
        use std::os::unix::fs::PermissionsExt;
        check_rel(rel)?;
        Ok(fs::metadata(self.path(rel))?.permissions().mode() & 0o222 != 0)
    }

    fn root(&self) -> &Path {
        &self.root
    }
}

/// Regular files outside /proc and /sys are fixtures; kernel pseudo-files report size 4096
/// (sysfs) or 0 (procfs) and must not be truncated.
fn is_regular_fixture(path: &Path) -> bool {
    let live = path.starts_with("/proc") || path.starts_with("/sys");
    !live && path.metadata().map(|m| m.is_file()).unwrap_or(false)
}

/// The value of a pseudo-file without its trailing newline and spaces.
pub fn trimmed(text: &str) -> &str {
    text.trim_end_matches(['\n', ' ', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_escaping_paths() {
        for p in ["/etc/passwd", "a/../b", "", "a//b", "./a", "a/"] {
            assert!(check_rel(p).is_err(), "{p}");
        }
        assert!(check_rel("proc/irq/3/smp_affinity").is_ok());
    }

    #[test]
    fn write_replaces_fixture_contents() {
        let dir = std::env::temp_dir().join(format!("tune-fs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("f"), "00000000,0000ffff\n").unwrap();
        let fsys = RootFs::new(&dir);
        fsys.write("f", "3\n").unwrap();
        assert_eq!(fsys.read("f").unwrap(), "3\n");
        assert_eq!(
            fsys.write("missing", "1").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        fs::remove_dir_all(dir).unwrap();
    }
}
