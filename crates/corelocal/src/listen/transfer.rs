//! Binary upgrade by socket passing, the I/O side of [`super::handover`]: the running server's
//! upgrade socket ([`UpgradeListener`]) and its half of the exchange ([`hand_over`]), and the
//! successor's half ([`request`], [`Incoming::adopt`], [`Successor::ready`]).
//!
//! Every exchange runs over a unix `SOCK_SEQPACKET` connection whose sends and receives are
//! bounded by a timeout, so neither side waits forever on a dead or stopped peer.

use super::handover::{Layout, Message, MESSAGE_BYTES_MAX, SOCKETS_PER_MESSAGE};
use super::{GroupConfig, ListenError, ListenerGroup};
use crate::sys::scm::{self, PeerCred};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The default bound on each step of a handover (one message each way).
pub const HANDOVER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Permissions of the upgrade socket file: owner only.
pub const UPGRADE_SOCKET_MODE: u32 = 0o600;

/// Why a handover did not happen.
#[derive(Debug)]
pub enum HandoverError {
    /// A socket call failed (a timeout reads as `WouldBlock` / "timed out").
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: io::Error,
    },
    /// The peer sent something unexpected, malformed or in another protocol version.
    Protocol(String),
    /// The new process refused the sockets, with its reason.
    Refused(String),
    /// The listener group could not hand over, adopt or re-steer.
    Listen(ListenError),
}

impl fmt::Display for HandoverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandoverError::Io { context, source } if is_timeout(source) => {
                write!(f, "{context}: no answer in time (timed out)")
            }
            HandoverError::Io { context, source } => write!(f, "{context}: {source}"),
            HandoverError::Protocol(m) => write!(f, "handover protocol: {m}"),
            HandoverError::Refused(m) => write!(f, "the new process refused: {m}"),
            HandoverError::Listen(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for HandoverError {}

impl From<ListenError> for HandoverError {
    fn from(e: ListenError) -> Self {
        HandoverError::Listen(e)
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> HandoverError {
    let context = context.into();
    move |source| HandoverError::Io { context, source }
}

/// One connected handover exchange (a `SOCK_SEQPACKET` socket with bounded sends/receives).
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    /// Wraps a connected `SOCK_SEQPACKET` socket; each send and receive waits at most `timeout`.
    pub fn new(fd: OwnedFd, timeout: Duration) -> io::Result<Channel> {
        scm::set_timeouts(fd.as_raw_fd(), timeout.max(Duration::from_millis(1)))?;
        Ok(Channel { fd })
    }

    /// The peer process.
    pub fn peer(&self) -> io::Result<PeerCred> {
        scm::peer_cred(self.fd.as_raw_fd())
    }

    /// Sends one message.
    pub fn send(&self, message: &Message) -> Result<(), HandoverError> {
        scm::send_with_fds(self.fd.as_raw_fd(), &message.encode(), &[])
            .map_err(io_error("sending a handover message"))
    }

    /// Receives one message (no descriptors expected).
    pub fn recv(&self) -> Result<Message, HandoverError> {
        let (message, fds) = self.recv_with(0)?;
        debug_assert!(fds.is_empty());
        Ok(message)
    }

    /// Sends one message with descriptors attached (at most [`SOCKETS_PER_MESSAGE`]).
    pub fn send_with(&self, message: &Message, fds: &[RawFd]) -> Result<(), HandoverError> {
        assert!(fds.len() <= SOCKETS_PER_MESSAGE, "too many descriptors");
        scm::send_with_fds(self.fd.as_raw_fd(), &message.encode(), fds)
            .map_err(io_error("sending a handover message with descriptors"))
    }

    /// Receives one message and the descriptors attached to it (at most `fds_max`).
    pub fn recv_with(&self, fds_max: usize) -> Result<(Message, Vec<OwnedFd>), HandoverError> {
        let mut buf = vec![0u8; MESSAGE_BYTES_MAX];
        let (n, fds) = scm::recv_with_fds(self.fd.as_raw_fd(), &mut buf, fds_max)
            .map_err(io_error("receiving a handover message"))?;
        if n == 0 {
            return Err(HandoverError::Protocol(
                "the other process closed the connection".into(),
            ));
        }
        let message =
            Message::decode(&buf[..n]).map_err(|e| HandoverError::Protocol(e.to_string()))?;
        Ok((message, fds))
    }

    fn send_sockets(&self, fds: &[RawFd]) -> Result<(), HandoverError> {
        for chunk in fds.chunks(SOCKETS_PER_MESSAGE) {
            let message = Message::Sockets(chunk.len() as u16).encode();
            scm::send_with_fds(self.fd.as_raw_fd(), &message, chunk)
                .map_err(io_error("sending listening sockets (SCM_RIGHTS)"))?;
        }
        Ok(())
    }

    fn recv_sockets(&self, count: usize) -> Result<Vec<OwnedFd>, HandoverError> {
        let mut all = Vec::with_capacity(count);
        while all.len() < count {
            let (message, fds) = self.recv_with(SOCKETS_PER_MESSAGE)?;
            match message {
                Message::Sockets(n) if n as usize == fds.len() && !fds.is_empty() => {
                    all.extend(fds)
                }
                Message::Sockets(n) => {
                    return Err(HandoverError::Protocol(format!(
                        "a message announced {n} sockets and carried {}",
                        fds.len()
                    )))
                }
                other => {
                    return Err(HandoverError::Protocol(format!(
                        "expected sockets, got {other:?}"
                    )))
                }
            }
        }
        if all.len() != count {
            return Err(HandoverError::Protocol(format!(
                "received {} sockets, the layout announced {count}",
                all.len()
            )));
        }
        Ok(all)
    }
}

/// The old process's half: passes every listening socket of `group` to the process at the
/// other end of `channel` and waits for its answer. On `Ready` the caller must stop accepting
/// at once (the successor accepts from the same queues now) and then send [`Message::Done`].
/// On anything else (a refusal, a malformed answer, a closed connection, a timeout) the
/// group's steering is restored and this process keeps serving as before.
pub fn hand_over(channel: &Channel, group: &ListenerGroup) -> Result<(), HandoverError> {
    let (layout, fds) = group.handover_sockets()?;
    group.release_steering()?;
    let outcome = offer_and_wait(channel, layout, &fds);
    if let Err(e) = outcome {
        return match group.restore_steering() {
            Ok(()) => Err(e),
            Err(restore) => Err(HandoverError::Protocol(format!(
                "{e}; then restoring the steering failed: {restore}"
            ))),
        };
    }
    Ok(())
}

fn offer_and_wait(channel: &Channel, layout: Layout, fds: &[RawFd]) -> Result<(), HandoverError> {
    channel.send(&Message::Offer(layout))?;
    channel.send_sockets(fds)?;
    match channel.recv()? {
        Message::Ready => Ok(()),
        Message::Abort(reason) => Err(HandoverError::Refused(reason)),
        other => Err(HandoverError::Protocol(format!(
            "expected ready or abort, got {other:?}"
        ))),
    }
}

/// The new process's half, first step: connects to the running server's upgrade socket at
/// `path` and receives its layout and listening sockets. Each step waits at most `timeout`.
pub fn request(path: &Path, timeout: Duration) -> Result<Incoming, HandoverError> {
    let fd = scm::connect_seqpacket(path).map_err(|source| HandoverError::Io {
        context: connect_context(path, &source),
        source,
    })?;
    let channel = Channel::new(fd, timeout).map_err(io_error("upgrade socket timeouts"))?;
    let peer = channel.peer().map_err(io_error("SO_PEERCRED"))?;
    let layout = match channel.recv()? {
        Message::Offer(layout) => layout,
        Message::Abort(reason) => return Err(HandoverError::Refused(reason)),
        other => {
            return Err(HandoverError::Protocol(format!(
                "expected an offer, got {other:?}"
            )))
        }
    };
    let fds = channel.recv_sockets(layout.socket_count())?;
    Ok(Incoming {
        channel,
        layout,
        fds,
        peer,
    })
}

fn connect_context(path: &Path, e: &io::Error) -> String {
    let shown = path.display();
    match e.raw_os_error() {
        Some(libc::ENOENT) => format!(
            "connecting to {shown}: no such socket (does the running server offer its \
             sockets there, as its upgrade socket?)"
        ),
        Some(libc::ECONNREFUSED) => format!(
            "connecting to {shown}: nothing listens there (a stale socket: the server that \
             made it is gone)"
        ),
        _ => format!("connecting to {shown}"),
    }
}

/// Sockets received from a running server, not adopted yet (see [`request`]).
#[derive(Debug)]
pub struct Incoming {
    channel: Channel,
    layout: Layout,
    fds: Vec<OwnedFd>,
    peer: PeerCred,
}

impl Incoming {
    /// The running server's layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The running server's process.
    pub fn peer(&self) -> PeerCred {
        self.peer
    }

    /// Builds this process's listener group from the sockets ([`ListenerGroup::adopt`]). On
    /// failure the running server is told why (it restores its steering and keeps serving).
    pub fn adopt(self, config: GroupConfig) -> Result<(ListenerGroup, Successor), HandoverError> {
        let successor = Successor {
            channel: self.channel,
        };
        match ListenerGroup::adopt(config, &self.layout, self.fds) {
            Ok(group) => Ok((group, successor)),
            Err(e) => {
                successor.abort(&e.to_string());
                Err(HandoverError::Listen(e))
            }
        }
    }
}

/// The new process after adopting: tells the old one how starting went.
#[derive(Debug)]
pub struct Successor {
    channel: Channel,
}

impl Successor {
    /// Tells the old process this one serves from the sockets now, then waits (bounded) for
    /// its `Done`: it stopped accepting and gave up its upgrade socket path. A missing `Done`
    /// is reported, but this process keeps the sockets and serves either way.
    /// On `Done` the channel comes back: the old process moves its connections and state
    /// over it next (see `runtime::upgrade::receive_moving`).
    pub fn ready(self) -> Result<Channel, HandoverError> {
        self.channel.send(&Message::Ready)?;
        match self.channel.recv()? {
            Message::Done => Ok(self.channel),
            other => Err(HandoverError::Protocol(format!(
                "expected done, got {other:?}"
            ))),
        }
    }

    /// Tells the old process this one could not start (it restores its steering and keeps
    /// serving). Best effort: the old process also gives up when the connection closes.
    pub fn abort(self, reason: &str) {
        let _ = self.channel.send(&Message::Abort(reason.to_string()));
    }
}

/// The running server's upgrade socket: a unix `SOCK_SEQPACKET` listener at a path, created
/// with mode 0600, removed on drop (only if the path still names this socket).
#[derive(Debug)]
pub struct UpgradeListener {
    fd: OwnedFd,
    path: PathBuf,
    /// (device, inode) of the socket file this listener created.
    file: (u64, u64),
}

impl UpgradeListener {
    /// Listens at `path`. A socket file nobody listens on (left by a crashed server) is
    /// replaced; a live one, or any other kind of file, is refused.
    pub fn bind(path: &Path) -> Result<UpgradeListener, HandoverError> {
        if path.as_os_str().as_encoded_bytes().starts_with(b"@") {
            return Self::bind_abstract(path);
        }
        remove_if_stale(path)?;
        let fd = scm::listen_seqpacket(path, UPGRADE_SOCKET_MODE, 4)
            .map_err(io_error(format!("listening on {}", path.display())))?;
        let meta = std::fs::symlink_metadata(path)
            .map_err(io_error(format!("stat {}", path.display())))?;
        Ok(UpgradeListener {
            fd,
            path: path.to_path_buf(),
            file: (meta.dev(), meta.ino()),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `wait` for a successor to connect; each step of its exchange will wait at
    /// most `timeout`.
    pub fn accept(&self, wait: Duration, timeout: Duration) -> io::Result<Option<Channel>> {
        match scm::accept_within(self.fd.as_raw_fd(), wait)? {
            Some(fd) => Channel::new(fd, timeout).map(Some),
            None => Ok(None),
        }
    }
}

impl UpgradeListener {
    /// Listens at `@name` in the abstract namespace: no file to make or remove, and a name in
    /// use fails (EADDRINUSE) instead of being replaced.
    fn bind_abstract(path: &Path) -> Result<UpgradeListener, HandoverError> {
        let fd = scm::listen_seqpacket(path, UPGRADE_SOCKET_MODE, 4)
            .map_err(io_error(format!("listening on {}", path.display())))?;
        Ok(UpgradeListener {
            fd,
            path: path.to_path_buf(),
            file: (0, 0),
        })
    }
}

impl Drop for UpgradeListener {
    fn drop(&mut self) {
        if self.file == (0, 0) {
            return; // Abstract: nothing on disk.
        }
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn remove_if_stale(path: &Path) -> Result<(), HandoverError> {
    let shown = path.display();
    match scm::is_socket_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(format!("stat {shown}"))(e)),
        Ok(false) => {
            return Err(HandoverError::Protocol(format!(
                "{shown} exists and is not a socket; refusing to replace it"
            )))
        }
        Ok(true) => {}
    }
    match scm::connect_seqpacket(path) {
        Ok(_) => Err(HandoverError::Protocol(format!(
            "another server listens on {shown} (take its sockets over from there, or pick \
             another path)"
        ))),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => std::fs::remove_file(path)
            .map_err(io_error(format!("removing the stale socket {shown}"))),
        Err(e) => Err(io_error(format!("probing {shown}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listen::Mode;
    use std::time::Instant;

    /// A socket path in a scratch dir of its own, removed when the returned guard drops.
    fn temp_path(tag: &str) -> (crate::testing::ScratchDir, PathBuf) {
        let dir = crate::testing::ScratchDir::new(&format!("corelocal-xfer-{tag}"));
        let path = dir.join("upgrade.sock");
        (dir, path)
    }

    fn fine_group() -> ListenerGroup {
        let cfg = GroupConfig::new(vec!["127.0.0.1:0".parse().unwrap()], vec![0, 0], Mode::Fine);
        ListenerGroup::bind(cfg).unwrap()
    }

    /// Runs the old side on a thread; returns its result and whether `Done` could be sent.
    fn old_side(
        listener: UpgradeListener,
        group: ListenerGroup,
    ) -> std::thread::JoinHandle<Result<(), String>> {
        std::thread::spawn(move || {
            let ch = listener
                .accept(Duration::from_secs(5), Duration::from_secs(5))
                .unwrap()
                .expect("a successor");
            hand_over(&ch, &group).map_err(|e| e.to_string())?;
            drop(listener);
            ch.send(&Message::Done).map_err(|e| e.to_string())
        })
    }

    #[test]
    fn a_successor_adopts_the_sockets_and_the_path_is_released() {
        let (_path_dir, path) = temp_path("ok");
        let group = fine_group();
        let addrs = group.local_addrs();
        let old = old_side(UpgradeListener::bind(&path).unwrap(), group);
        let incoming = request(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(incoming.peer().pid, std::process::id() as i32);
        let layout = incoming.layout().clone();
        let config = GroupConfig::new(
            layout.addrs.clone(),
            layout.worker_cpus.clone(),
            layout.mode,
        );
        let (new, successor) = incoming.adopt(config).unwrap();
        assert_eq!(new.local_addrs(), addrs);
        successor.ready().unwrap();
        assert_eq!(old.join().unwrap(), Ok(()));
        assert!(!path.exists(), "the old side removes its socket file");
    }

    #[test]
    fn a_refusing_successor_leaves_the_old_side_serving() {
        let (_path_dir, path) = temp_path("refused");
        let old = old_side(UpgradeListener::bind(&path).unwrap(), fine_group());
        let incoming = request(&path, Duration::from_secs(5)).unwrap();
        let mut config = GroupConfig::new(
            incoming.layout().addrs.clone(),
            vec![0, 0, 0],
            incoming.layout().mode,
        );
        config.backlog_total = 16;
        let e = incoming.adopt(config).unwrap_err();
        assert!(e.to_string().contains("worker CPUs"), "{e}");
        let old_result = old.join().unwrap().unwrap_err();
        assert!(
            old_result.contains("refused") && old_result.contains("worker CPUs"),
            "{old_result}"
        );
    }

    #[test]
    fn a_silent_peer_times_out_instead_of_hanging() {
        let (_path_dir, path) = temp_path("silent");
        let listener = UpgradeListener::bind(&path).unwrap();
        let started = Instant::now();
        let e = request(&path, Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("timed out"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(3));
        drop(listener);
    }

    #[test]
    fn a_live_socket_is_refused_a_stale_one_replaced_and_a_file_kept() {
        let (_path_dir, path) = temp_path("stale");
        let live = UpgradeListener::bind(&path).unwrap();
        let e = UpgradeListener::bind(&path).unwrap_err();
        assert!(e.to_string().contains("another server listens"), "{e}");
        drop(live);
        assert!(!path.exists(), "removed with its listener");
        // A stale socket file, what a killed server leaves behind: nobody listens on it.
        let (_path2_dir, path2) = temp_path("stale2");
        drop(scm::listen_seqpacket(&path2, 0o600, 1).unwrap());
        let e = request(&path2, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("stale"), "{e}");
        let replaced = UpgradeListener::bind(&path2).unwrap();
        assert!(scm::connect_seqpacket(replaced.path()).is_ok());
        let (_path3_dir, path3) = temp_path("file");
        std::fs::write(&path3, b"keep me").unwrap();
        let e = UpgradeListener::bind(&path3).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&path3).unwrap(), b"keep me");
        let (_none_dir, none) = temp_path("none");
        let e = request(&none, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("no such socket"), "{e}");
    }
}
