//! Unix `SOCK_SEQPACKET` sockets and descriptor passing (`SCM_RIGHTS`), for handing listening
//! sockets to a successor process (binary upgrade, [`crate::listen::transfer`]).
//!
//! Sequenced packets keep message boundaries, so each message and the descriptors attached to it
//! arrive together: no framing, no gluing of two messages into one read. Every blocking call is
//! bounded by the socket's send/receive timeouts ([`set_timeouts`]).

use super::socket::borrow;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    self, sockopt, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
    ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags,
    SocketType,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// The kernel's limit on descriptors in one `SCM_RIGHTS` message (`SCM_MAX_FD`).
pub const FDS_PER_MESSAGE_MAX: usize = 253;

fn seqpacket_socket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// The address of `path`; `@name` is `name` in the abstract namespace (as `ss` shows it: no
/// file, gone with the socket).
fn unix_addr(path: &Path) -> io::Result<SocketAddrUnix> {
    let bytes = path.as_os_str().as_bytes();
    let invalid = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{why}: {}", path.display()),
        )
    };
    if bytes.contains(&0) || bytes.is_empty() {
        return Err(invalid("a unix socket path must be non-empty, without NUL"));
    }
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddrUnix::new_abstract_name(name),
        None => SocketAddrUnix::new(path),
    };
    addr.map_err(|_| invalid("unix socket path too long (at most 107 bytes)"))
}

/// A connected pair of `SOCK_SEQPACKET` sockets (tests, and in-process handovers).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// A non-blocking `SOCK_SEQPACKET` listener bound at `path` (`@name`: in the abstract
/// namespace) with permissions `mode` (e.g. 0o600). The mode is set on the socket before `bind`
/// (the kernel creates the file with it, minus the umask), so the file is never reachable with
/// wider permissions. `path` must not exist.
pub fn listen_seqpacket(path: &Path, mode: libc::mode_t, backlog: u32) -> io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode))?;
    net::bind(&fd, &unix_addr(path)?)?;
    net::listen(&fd, backlog.clamp(1, i32::MAX as u32) as i32)?;
    rustix::io::ioctl_fionbio(&fd, true)?;
    Ok(fd)
}

/// Connects a blocking `SOCK_SEQPACKET` socket to the listener at `path` (ECONNREFUSED: a
/// socket file nobody listens on; ENOENT: no such file).
pub fn connect_seqpacket(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    net::connect(&fd, &unix_addr(path)?)?;
    Ok(fd)
}

/// Waits up to `timeout` for a connection on `listener` and accepts it (blocking, close-on-
/// exec); `None` when none came.
pub fn accept_within(listener: RawFd, timeout: Duration) -> io::Result<Option<OwnedFd>> {
    let listener = borrow(listener);
    let mut fds = [PollFd::new(&listener, PollFlags::IN)];
    let wait = Timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    match rustix::event::poll(&mut fds, Some(&wait)) {
        Ok(0) | Err(Errno::INTR) => return Ok(None),
        Ok(_) => {}
        Err(e) => return Err(e.into()),
    }
    match net::accept_with(listener, SocketFlags::CLOEXEC) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::AGAIN) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Bounds every later send and receive on `fd` by `timeout` (they fail with `WouldBlock`).
pub fn set_timeouts(fd: RawFd, timeout: Duration) -> io::Result<()> {
    let timeout = Some(timeout.max(Duration::from_micros(1)));
    sockopt::set_socket_timeout(borrow(fd), sockopt::Timeout::Recv, timeout)?;
    sockopt::set_socket_timeout(borrow(fd), sockopt::Timeout::Send, timeout)?;
    Ok(())
}

/// The peer process of a connected unix socket (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Its process id.
    pub pid: i32,
    /// Its effective user id.
    pub uid: u32,
}

/// `SO_PEERCRED` of a connected unix socket.
pub fn peer_cred(fd: RawFd) -> io::Result<PeerCred> {
    let cred = sockopt::socket_peercred(borrow(fd))?;
    Ok(PeerCred {
        pid: cred.pid.as_raw_nonzero().get(),
        uid: cred.uid.as_raw(),
    })
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Sends one message `data` with `fds` attached (`SCM_RIGHTS`; the receiver gets its own
/// descriptors of the same open files). At most [`FDS_PER_MESSAGE_MAX`] descriptors.
pub fn send_with_fds(fd: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > FDS_PER_MESSAGE_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} descriptors in one message (max {FDS_PER_MESSAGE_MAX})",
                fds.len()
            ),
        ));
    }
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|&f| borrow(f)).collect();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !borrowed.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::other(
            "SCM_RIGHTS does not fit its control buffer",
        ));
    }
    let sent = net::sendmsg(
        borrow(fd),
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short sendmsg"));
    }
    Ok(())
}

/// Receives one message into `buf` with up to `fds_max` attached descriptors (close-on-exec).
/// Returns the message length (0: the peer closed) and the descriptors. A message longer than
/// `buf` or carrying more than `fds_max` descriptors is an error (what did arrive is closed).
pub fn recv_with_fds(
    fd: RawFd,
    buf: &mut [u8],
    fds_max: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let fds_max = fds_max.min(FDS_PER_MESSAGE_MAX);
    let buf_len = buf.len();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds_max))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = net::recvmsg(
        borrow(fd),
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let fds: Vec<OwnedFd> = control
        .drain()
        .filter_map(|m| match m {
            RecvAncillaryMessage::ScmRights(fds) => Some(fds),
            _ => None,
        })
        .flatten()
        .collect();
    // The control buffer may hold a few more than asked (its size is rounded up): the bound
    // is `fds_max` either way.
    if msg.flags.contains(ReturnFlags::CTRUNC) || fds.len() > fds_max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("more than {fds_max} descriptors in one message"),
        ));
    }
    if msg.flags.contains(ReturnFlags::TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message longer than {buf_len} bytes"),
        ));
    }
    Ok((msg.bytes, fds))
}

/// Whether `path` names a unix socket file (it may be stale: nobody listening).
pub fn is_socket_file(path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    Ok(std::fs::symlink_metadata(path)?.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    fn same_file(a: RawFd, b: RawFd) -> bool {
        let stat = |fd: RawFd| {
            std::fs::metadata(format!("/proc/self/fd/{fd}"))
                .map(|m| (m.dev(), m.ino()))
                .unwrap()
        };
        stat(a) == stat(b)
    }

    fn pipes(n: usize) -> Vec<OwnedFd> {
        (0..n)
            .map(|_| {
                // The write end is closed at once.
                let (read, _write) =
                    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe2");
                read
            })
            .collect()
    }

    #[test]
    fn descriptors_and_data_cross_together() {
        let (a, b) = seqpacket_pair().unwrap();
        let sent = pipes(3);
        let raws: Vec<RawFd> = sent.iter().map(|f| f.as_raw_fd()).collect();
        send_with_fds(a.as_raw_fd(), b"hello", &raws).unwrap();
        send_with_fds(a.as_raw_fd(), b"second", &[]).unwrap();
        let mut buf = [0u8; 64];
        let (n, got) = recv_with_fds(b.as_raw_fd(), &mut buf, 8).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(got.len(), 3);
        for (s, g) in sent.iter().zip(&got) {
            assert_ne!(s.as_raw_fd(), g.as_raw_fd(), "a new descriptor");
            assert!(same_file(s.as_raw_fd(), g.as_raw_fd()), "of the same file");
        }
        // Message boundaries hold: the second message arrives alone, without descriptors.
        let (n, got) = recv_with_fds(b.as_raw_fd(), &mut buf, 8).unwrap();
        assert_eq!((&buf[..n], got.len()), (&b"second"[..], 0));
    }

    #[test]
    fn too_many_descriptors_are_refused_on_both_sides() {
        let (a, b) = seqpacket_pair().unwrap();
        let sent = pipes(4);
        let raws: Vec<RawFd> = sent.iter().map(|f| f.as_raw_fd()).collect();
        let many = vec![raws[0]; FDS_PER_MESSAGE_MAX + 1];
        assert!(send_with_fds(a.as_raw_fd(), b"x", &many).is_err());
        send_with_fds(a.as_raw_fd(), b"x", &raws).unwrap();
        let mut buf = [0u8; 8];
        let e = recv_with_fds(b.as_raw_fd(), &mut buf, 2).unwrap_err();
        assert!(e.to_string().contains("more than 2 descriptors"), "{e}");
    }

    #[test]
    fn an_oversized_message_is_an_error_and_a_closed_peer_reads_zero() {
        let (a, b) = seqpacket_pair().unwrap();
        send_with_fds(a.as_raw_fd(), &[7u8; 100], &[]).unwrap();
        let mut small = [0u8; 10];
        let e = recv_with_fds(b.as_raw_fd(), &mut small, 0).unwrap_err();
        assert!(e.to_string().contains("longer than 10 bytes"), "{e}");
        drop(a);
        assert_eq!(recv_with_fds(b.as_raw_fd(), &mut small, 0).unwrap().0, 0);
    }

    #[test]
    fn a_receive_times_out_instead_of_hanging() {
        let (_a, b) = seqpacket_pair().unwrap();
        set_timeouts(b.as_raw_fd(), Duration::from_millis(50)).unwrap();
        let started = std::time::Instant::now();
        let e = recv_with_fds(b.as_raw_fd(), &mut [0u8; 8], 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn a_listener_file_is_private_and_connections_carry_credentials() {
        let dir = std::env::temp_dir().join(format!("corelocal-scm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("up.sock");
        let listener = listen_seqpacket(&path, 0o600, 4).unwrap();
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode & !0o600, 0, "mode {mode:o}");
        assert!(is_socket_file(&path).unwrap());
        assert!(
            accept_within(listener.as_raw_fd(), Duration::from_millis(10))
                .unwrap()
                .is_none()
        );
        let client = connect_seqpacket(&path).unwrap();
        let server = accept_within(listener.as_raw_fd(), Duration::from_secs(2))
            .unwrap()
            .expect("a connection");
        let cred = peer_cred(server.as_raw_fd()).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(cred.uid, effective_uid());
        drop((client, server, listener));
        let refused = connect_seqpacket(&path).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::ECONNREFUSED));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
