//! Helpers for tests that need privileges (used by this crate's and the other crates' tests).

/// Whether the process runs as root. When it does not, prints why the calling test skips and
/// returns `false` — except under `CI=true`, where privileged tests must not skip: it panics.
pub fn root_or_skip(test: &str) -> bool {
    if crate::sys::process::is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: needs root, and CI=true forbids skipping"
    );
    eprintln!("skipping {test}: needs root (CAP_BPF / CAP_NET_ADMIN)");
    false
}

/// Set in the environment of a test binary re-run inside a private network namespace.
pub const NETNS_INNER_ENV: &str = "CORELOCAL_NETNS_INNER";

/// For tests that need a private network namespace: returns `true` when this process already
/// runs inside one (the caller then does the work). Otherwise, as root, re-runs this same test
/// binary filtered to `test` under `unshare --net --mount` and asserts it passed, then returns
/// `false`; not root, it skips as [`root_or_skip`] does. Nothing outside the namespace changes.
pub fn inside_private_netns(test: &str) -> bool {
    if std::env::var(NETNS_INNER_ENV).is_ok() {
        return true;
    }
    if root_or_skip(test) {
        let exe = std::env::current_exe().expect("test binary path");
        let status = std::process::Command::new("unshare")
            .args(["--net", "--mount", "--"])
            .arg(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(NETNS_INNER_ENV, "1")
            .status()
            .expect("running unshare");
        assert!(status.success(), "{test} failed inside the namespace");
    }
    false
}

/// Runs a shell command, asserting it succeeds; returns its standard output.
pub fn sh(cmd: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .expect("running sh");
    assert!(out.status.success(), "{cmd}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Inside a private namespace: mounts its own sysfs, brings `lo` up and, when `rps_cpus` is
/// given, spreads loopback flows over those CPUs with RPS (like RSS on a NIC).
pub fn set_up_loopback(rps_cpus: Option<&crate::cpu::CpuSet>) {
    sh("mount -t sysfs sysfs /sys");
    sh("ip link set lo up");
    if let Some(cpus) = rps_cpus {
        let path = "/sys/class/net/lo/queues/rx-0/rps_cpus";
        std::fs::write(path, cpus.to_mask(0)).expect("writing rps_cpus");
        let back = std::fs::read_to_string(path).expect("reading rps_cpus");
        assert_eq!(
            crate::cpu::CpuSet::parse_mask(&back).expect("mask"),
            *cpus,
            "rps_cpus did not take"
        );
    }
}

/// A fresh directory under the system's temp dir for one test, removed with all it holds when
/// dropped (tests that left theirs behind filled /tmp run after run). Derefs to its [`Path`].
///
/// [`Path`]: std::path::Path
#[derive(Debug)]
pub struct ScratchDir {
    path: std::path::PathBuf,
}

impl ScratchDir {
    /// Creates `TMP/NAME-PID-N` afresh (N counts this process's scratch dirs, so tests running
    /// in parallel threads never share one). Panics if it cannot: a test cannot go on then.
    pub fn new(name: &str) -> ScratchDir {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        ScratchDir { path }
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Holds an io_uring's io-wq threads: at most one worker per list, each blocked (the bounded
/// one opening a FIFO nobody writes to, the unbounded one reading an empty pipe, both forced
/// to io-wq) until [`release`](IoWqHold::release). What the ring hands to io-wq meanwhile
/// waits behind them: how a test makes a request the kernel runs from io-wq (a shutdown, for
/// one) late on purpose.
pub struct IoWqHold {
    fifo: std::path::PathBuf,
    pipe_write: std::os::fd::OwnedFd,
    _pipe_read: std::os::fd::OwnedFd,
    _path: std::ffi::CString,
}

impl IoWqHold {
    /// Limits the ring's io-wq to one worker per list and returns the hold with the two
    /// requests that block those workers: the caller submits them (with `user_data`, which its
    /// completion handling must ignore) before the requests to hold back.
    pub fn new(
        submitter: &io_uring::Submitter<'_>,
        user_data: u64,
    ) -> std::io::Result<(IoWqHold, [io_uring::squeue::Entry; 2])> {
        use io_uring::{opcode, squeue::Flags, types};
        use std::os::fd::AsRawFd;
        submitter.register_iowq_max_workers(&mut [1, 1])?;
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("corelocal-iowq-{}-{n}", std::process::id());
        let fifo = std::env::temp_dir().join(name);
        let _ = std::fs::remove_file(&fifo);
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RWXU)?;
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes())
            .map_err(std::io::Error::other)?;
        let (pipe_read, pipe_write) = rustix::pipe::pipe()?;
        // Leaked: the read may complete after the hold is gone (8 bytes per hold, in tests).
        let buf: &'static mut [u8; 8] = Box::leak(Box::new([0u8; 8]));
        // Forced to io-wq (without it the open is tried non-blocking first, and succeeds).
        let open = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
            .flags(libc::O_RDONLY | libc::O_CLOEXEC)
            .build()
            .flags(Flags::ASYNC)
            .user_data(user_data);
        let read = opcode::Read::new(types::Fd(pipe_read.as_raw_fd()), buf.as_mut_ptr(), 1)
            .build()
            .flags(Flags::ASYNC)
            .user_data(user_data);
        let hold = IoWqHold {
            fifo,
            pipe_write,
            _pipe_read: pipe_read,
            _path: path,
        };
        Ok((hold, [open, read]))
    }

    /// Lets io-wq run again: the FIFO gets a writer, the pipe a byte.
    pub fn release(self) {
        let writer = std::fs::OpenOptions::new().write(true).open(&self.fifo);
        let _ = rustix::io::write(&self.pipe_write, b"x");
        drop(writer);
        let _ = std::fs::remove_file(&self.fifo);
    }
}

/// Reads until `want` bytes arrived, the end, or nothing came for the stream's read timeout;
/// what arrived (for tests that check a server's answers).
pub fn read_up_to(s: &mut impl std::io::Read, want: usize) -> Vec<u8> {
    let mut got = vec![0u8; want];
    let mut len = 0;
    while len < want {
        match s.read(&mut got[len..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
    }
    got.truncate(len);
    got
}

/// Runs each named test function `fn name(backend: BackendKind)` on each backend, as the
/// tests `epoll::name` and `uring::name` (for the integration tests of both backends).
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod epoll {
            $(#[test] fn $name() { super::$name($crate::runtime::BackendKind::Epoll) })*
        }
        mod uring {
            $(#[test] fn $name() { super::$name($crate::runtime::BackendKind::Uring) })*
        }
    };
}

#[cfg(test)]
mod tests {
    use super::ScratchDir;

    #[test]
    fn a_scratch_dir_is_fresh_and_gone_with_its_contents_when_dropped() {
        let a = ScratchDir::new("corelocal-scratch-test");
        let b = ScratchDir::new("corelocal-scratch-test");
        assert_ne!(
            a.to_path_buf(),
            b.to_path_buf(),
            "two scratch dirs share a path"
        );
        std::fs::create_dir_all(a.join("sub")).unwrap();
        std::fs::write(a.join("sub/file"), b"x").unwrap();
        let path = a.to_path_buf();
        drop(a);
        assert!(!path.exists(), "{} survived its drop", path.display());
        assert!(b.is_dir());
    }
}
