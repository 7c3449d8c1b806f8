//! The running server's side of a binary upgrade by socket passing: [`UpgradeServer`] listens
//! on a unix socket (mode 0600) on its own thread — the workers' event loops never block on
//! it — and hands the listening sockets to the first successor that completes the exchange
//! (see [`crate::listen::transfer`]). Then the server stops accepting at once, serves what it
//! accepted and exits; the successor holds the same sockets, accept queues included.

use super::server::ReleaseHandle;
use crate::listen::handover::Message;
use crate::listen::transfer::{self, Channel, HandoverError, UpgradeListener};
use crate::sys::scm;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the upgrade thread looks at its stop flag while waiting for a successor.
const ACCEPT_POLL: Duration = Duration::from_millis(100);
/// Pause after an unexpected accept error, so a persistent one cannot spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The upgrade socket of a running server (see the module docs).
#[derive(Debug)]
pub struct UpgradeServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    handed_over: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UpgradeServer {
    /// Waits for successors on `listener` (bound with [`UpgradeListener::bind`], typically
    /// before the server starts, so that a bad path fails early) on a thread of its own. Each
    /// step of an exchange waits at most `timeout`.
    pub fn start(
        listener: UpgradeListener,
        server: ReleaseHandle,
        timeout: Duration,
    ) -> Result<UpgradeServer, HandoverError> {
        let path = listener.path().to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let handed_over = Arc::new(AtomicBool::new(false));
        let (s, h) = (stop.clone(), handed_over.clone());
        let thread = std::thread::Builder::new()
            .name("corelocal-upgrade".into())
            .spawn(move || serve_upgrades(listener, server, timeout, s, h))
            .map_err(|source| HandoverError::Io {
                context: "starting the upgrade thread".into(),
                source,
            })?;
        Ok(UpgradeServer {
            path,
            stop,
            handed_over,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the sockets were handed over (the server is stopping already).
    pub fn handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Acquire)
    }

    /// Stops waiting for successors (an exchange in progress finishes first, bounded by its
    /// timeout) and removes the socket file; returns whether the sockets were handed over.
    pub fn shutdown(mut self) -> bool {
        self.stop_and_join();
        self.handed_over()
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for UpgradeServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn serve_upgrades(
    listener: UpgradeListener,
    server: ReleaseHandle,
    timeout: Duration,
    stop: Arc<AtomicBool>,
    handed_over: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Acquire) && !server.is_released() {
        let channel = match listener.accept(ACCEPT_POLL, timeout) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                eprintln!(
                    "corelocal: upgrade socket {}: {e}",
                    listener.path().display()
                );
                std::thread::sleep(ERROR_BACKOFF);
                continue;
            }
        };
        let Some(pid) = trusted_peer(&channel) else {
            continue;
        };
        eprintln!("corelocal: upgrade: pid {pid} asks for the listening sockets");
        match transfer::hand_over(&channel, server.listeners()) {
            Ok(()) => {
                finish(listener, &channel, &server, pid);
                handed_over.store(true, Ordering::Release);
                return;
            }
            Err(e) => eprintln!("corelocal: upgrade by pid {pid} failed, still serving: {e}"),
        }
    }
}

/// Only a process of the same user (or root) may take the sockets; the 0600 socket file
/// already keeps others out, this also holds when the file's directory is shared.
fn trusted_peer(channel: &Channel) -> Option<i32> {
    let me = scm::effective_uid();
    match channel.peer() {
        Ok(p) if p.uid == me || p.uid == 0 => Some(p.pid),
        Ok(p) => {
            eprintln!(
                "corelocal: upgrade: refused pid {} (uid {}; this server runs as uid {me})",
                p.pid, p.uid
            );
            let _ = channel.send(&Message::Abort(format!(
                "uid {} may not take over a server of uid {me}",
                p.uid
            )));
            None
        }
        Err(e) => {
            eprintln!("corelocal: upgrade: SO_PEERCRED: {e}");
            None
        }
    }
}

/// The successor serves: stop accepting now, give up the path (so the successor can listen
/// there itself), then tell it so.
fn finish(listener: UpgradeListener, channel: &Channel, server: &ReleaseHandle, pid: i32) {
    server.release();
    drop(listener);
    if let Err(e) = channel.send(&Message::Done) {
        eprintln!("corelocal: upgrade: telling pid {pid} we are done: {e}");
    }
    eprintln!("corelocal: upgrade: listening sockets handed to pid {pid}; draining");
}
