//! Unix `SOCK_SEQPACKET` sockets and descriptor passing (`SCM_RIGHTS`), for handing listening
//! sockets to a successor process (binary upgrade, [`crate::listen::transfer`]).
//!
//! Sequenced packets keep message boundaries, so each message and the descriptors attached to it
//! arrive together: no framing, no gluing of two messages into one read. Every blocking call is
//! bounded by the socket's send/receive timeouts ([`set_timeouts`]).

use super::{cvt, cvt_size};
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// The kernel's limit on descriptors in one `SCM_RIGHTS` message (`SCM_MAX_FD`).
pub const FDS_PER_MESSAGE_MAX: usize = 253;

fn seqpacket_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked before use.
    let raw =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `raw` is a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn sockaddr_un(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        // The abstract namespace (as `ss` shows it): no file, gone with the socket.
        if name.is_empty() || name.len() >= addr.sun_path.len() || name.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "abstract unix socket name must be 1..{} bytes",
                    addr.sun_path.len() - 1
                ),
            ));
        }
        for (dst, &src) in addr.sun_path[1..].iter_mut().zip(name) {
            *dst = src as libc::c_char;
        }
        let len = size_of::<libc::sa_family_t>() + 1 + name.len();
        return Ok((addr, len as libc::socklen_t));
    }
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "unix socket path must be 1..{} bytes without NUL: {}",
                addr.sun_path.len() - 1,
                path.display()
            ),
        ));
    }
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// A connected pair of `SOCK_SEQPACKET` sockets (tests, and in-process handovers).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair(2) writes.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A non-blocking `SOCK_SEQPACKET` listener bound at `path` (`@name`: in the abstract
/// namespace) with permissions `mode` (e.g. 0o600). The mode is set on the socket before `bind` (the kernel creates the file with it,
/// minus the umask), so the file is never reachable with wider permissions. `path` must not
/// exist.
pub fn listen_seqpacket(path: &Path, mode: libc::mode_t, backlog: u32) -> io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    let raw = fd.as_raw_fd();
    // SAFETY: fchmod(2) on our own socket; no memory is involved.
    cvt(unsafe { libc::fchmod(raw, mode) })?;
    let (addr, len) = sockaddr_un(path)?;
    // SAFETY: `addr` is an initialised sockaddr_un of `len` bytes.
    cvt(unsafe { libc::bind(raw, &addr as *const _ as *const libc::sockaddr, len) })?;
    let backlog = backlog.clamp(1, i32::MAX as u32) as libc::c_int;
    // SAFETY: plain listen(2) on our socket.
    cvt(unsafe { libc::listen(raw, backlog) })?;
    super::socket::set_nonblocking(raw)?;
    Ok(fd)
}

/// Connects a blocking `SOCK_SEQPACKET` socket to the listener at `path` (ECONNREFUSED: a
/// socket file nobody listens on; ENOENT: no such file).
pub fn connect_seqpacket(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    let (addr, len) = sockaddr_un(path)?;
    // SAFETY: `addr` is an initialised sockaddr_un of `len` bytes.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &addr as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    Ok(fd)
}

/// Waits up to `timeout` for a connection on `listener` and accepts it (blocking, close-on-
/// exec); `None` when none came.
pub fn accept_within(listener: RawFd, timeout: Duration) -> io::Result<Option<OwnedFd>> {
    let mut pfd = libc::pollfd {
        fd: listener,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `pfd` is one live pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(None)
        } else {
            Err(e)
        };
    }
    if n == 0 {
        return Ok(None);
    }
    // SAFETY: accept4(2) without an address buffer.
    let raw = unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(raw) }))
}

/// Bounds every later send and receive on `fd` by `timeout` (they fail with `WouldBlock`).
pub fn set_timeouts(fd: RawFd, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    for name in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: `tv` is a live timeval and its exact size is passed.
        cvt(unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                &tv as *const libc::timeval as *const libc::c_void,
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        })?;
    }
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
    let mut cred = MaybeUninit::<libc::ucred>::zeroed();
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is writable for `len` bytes.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            cred.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    })?;
    // SAFETY: zero-initialised, then filled by the kernel.
    let cred = unsafe { cred.assume_init() };
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
    })
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Room for `n` descriptors of control data, in u64 words (cmsg buffers must be aligned).
fn cmsg_words(n: usize) -> usize {
    // SAFETY: CMSG_SPACE only computes a size.
    let bytes = unsafe { libc::CMSG_SPACE((n * size_of::<RawFd>()) as u32) } as usize;
    bytes.div_ceil(size_of::<u64>())
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
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut control = vec![0u64; cmsg_words(fds.len())];
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = control.len() * size_of::<u64>();
        let payload = std::mem::size_of_val(fds);
        // SAFETY: the control buffer holds CMSG_SPACE(payload) bytes (cmsg_words), so the first
        // header and its data fit; the kernel only reads data and control for sendmsg.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr() as *const u8,
                libc::CMSG_DATA(cmsg),
                payload,
            );
        }
    }
    // SAFETY: `msg` points at live buffers (`iov`, `control`) for the duration of the call.
    let sent = cvt_size(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) })?;
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
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = vec![0u64; cmsg_words(fds_max)];
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = control.len() * size_of::<u64>();
    // SAFETY: `msg` points at live, writable buffers (`buf`, `control`) of the sizes it states.
    let len = cvt_size(unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) })?;
    let fds = take_fds(&msg);
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("more than {fds_max} descriptors in one message"),
        ));
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message longer than {} bytes", buf.len()),
        ));
    }
    Ok((len, fds))
}

/// Takes ownership of every descriptor in the `SCM_RIGHTS` control messages of `msg`.
fn take_fds(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    // `msg` was filled by recvmsg: CMSG_FIRSTHDR/NXTHDR stay within msg_controllen, and each
    // header's data holds (cmsg_len - CMSG_LEN(0)) bytes of descriptors the kernel installed in
    // SAFETY: this process, owned by nobody else yet.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let bytes = (*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned((data as *const RawFd).add(i));
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    fds
}

/// Whether `path` names a unix socket file (it may be stale: nobody listening).
pub fn is_socket_file(path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    Ok(std::fs::symlink_metadata(path)?.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;
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
                let mut fds = [0; 2];
                // SAFETY: `fds` has room for two descriptors.
                assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
                // SAFETY: new descriptors owned by nobody else; the write end is closed at once.
                unsafe {
                    drop(OwnedFd::from_raw_fd(fds[1]));
                    OwnedFd::from_raw_fd(fds[0])
                }
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
