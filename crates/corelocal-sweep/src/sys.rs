//! The system calls `sweep` needs beyond std: joining a network namespace from one thread,
//! a private sysfs for that thread, the thread id, and a stop flag set by SIGINT/SIGTERM.
//! Also pinning another thread, the ethtool GRO switch and `sendmmsg` for the forwarding
//! generator. Every `unsafe` block of the crate is here.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT / SIGTERM once [`install_stop_handler`] ran.
static STOP: AtomicBool = AtomicBool::new(false);

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Moves the calling thread (only) into the network namespace bound at `/run/netns/NAME`.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let file = File::open(Path::new("/run/netns").join(name))?;
    // SAFETY: the fd is open for the whole call; setns changes only this thread's namespace.
    check(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) })
}

/// Gives the calling thread its own mount namespace (a slave of the host's, so nothing
/// propagates back) and mounts a fresh sysfs on `/sys` in it, which then shows the devices of
/// the thread's network namespace. The mounts vanish when the thread exits.
pub fn private_sysfs() -> io::Result<()> {
    // SAFETY: CLONE_NEWNS implies CLONE_FS; both unshare only this thread's fs/mount state.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
    let root = c"/";
    let sys = c"/sys";
    let sysfs = c"sysfs";
    // SAFETY: NUL-terminated literals; a NULL source/type/data is allowed for a propagation
    // change, which affects only this thread's new mount namespace.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    })?;
    // SAFETY: as above; the new sysfs is mounted only in this thread's mount namespace.
    check(unsafe {
        libc::mount(
            sysfs.as_ptr(),
            sys.as_ptr(),
            sysfs.as_ptr(),
            0,
            std::ptr::null(),
        )
    })
}

/// The calling thread's id (for `/proc/self/task/TID/schedstat`).
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

extern "C" fn on_stop_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set the stop flag instead of killing the process, so the guards
/// that delete network namespaces and restore IRQ affinity still run.
pub fn install_stop_handler() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction is plain old data; zeroed is a valid empty mask and no flags.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_stop_signal as *const () as libc::sighandler_t;
        // SAFETY: `act` is initialised and the handler only stores to an atomic
        // (async-signal-safe); the old action is not needed.
        check(unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) })?;
    }
    Ok(())
}

/// Whether a stop was requested (signal, or [`request_stop`]).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Requests a stop, as a signal would.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Pins thread or process `pid` (a kernel thread such as `napi/IF-ID` too) to `cpus`.
pub fn set_affinity(pid: u32, cpus: &corelocal::cpu::CpuSet) -> io::Result<()> {
    let max = libc::CPU_SETSIZE as usize;
    if cpus.is_empty() || cpus.max().unwrap_or(0) >= max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU set {:?} empty or beyond {max}", cpus.to_list()),
        ));
    }
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.iter() {
        // SAFETY: cpu < CPU_SETSIZE was checked above.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; the kernel only reads it.
    check(unsafe {
        libc::sched_setaffinity(
            pid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    })
}

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_STSO: u32 = 0x1f;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with the `ifr_data` member.
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ethtool_value(ifname: &str, cmd: u32, data: u32) -> io::Result<u32> {
    if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ || ifname.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {ifname:?}"),
        ));
    }
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| {
        // A namespace with only `lo` down still has AF_INET sockets; binding may fail only
        // when no address family works, which the ioctl below would report anyway.
        std::net::UdpSocket::bind("127.0.0.1:0")
    })?;
    let mut value = EthtoolValue { cmd, data };
    let mut req = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: (&mut value as *mut EthtoolValue).cast(),
        _pad: [0; 16],
    };
    for (d, s) in req.name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq whose data pointer refers to `value`, which outlives the
    // call; SIOCETHTOOL with GGRO/SGRO reads or writes only that struct ethtool_value.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req) })?;
    Ok(value.data)
}

/// Whether GRO is on for `ifname` in the calling thread's network namespace.
pub fn gro(ifname: &str) -> io::Result<bool> {
    ethtool_value(ifname, ETHTOOL_GGRO, 0).map(|v| v != 0)
}

/// Turns GRO on or off for `ifname` (on a veth it also switches the receive side to NAPI).
pub fn set_gro(ifname: &str, on: bool) -> io::Result<()> {
    ethtool_value(ifname, ETHTOOL_SGRO, u32::from(on)).map(|_| ())
}

/// Turns every TSO feature of `ifname` on or off.
pub fn set_tso(ifname: &str, on: bool) -> io::Result<()> {
    ethtool_value(ifname, ETHTOOL_STSO, u32::from(on)).map(|_| ())
}

/// Sends `msgs` UDP datagrams of `payload` on `fd`, datagram i to `dsts[i]`, in one
/// `sendmmsg(2)`; returns how many the kernel took.
pub fn sendmmsg_to(
    fd: std::os::fd::RawFd,
    payload: &[u8],
    dsts: &[libc::sockaddr_in],
) -> io::Result<usize> {
    const BATCH_MAX: usize = 1024;
    let n = dsts.len().min(BATCH_MAX);
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: mmsghdr is plain old data; zeroed = no control data, no flags.
    let mut msgs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (m, dst) in msgs.iter_mut().zip(dsts) {
        m.msg_hdr.msg_name = dst as *const libc::sockaddr_in as *mut libc::c_void;
        m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        m.msg_hdr.msg_iov = &mut iov;
        m.msg_hdr.msg_iovlen = 1;
    }
    // The kernel only reads the payload and writes each header's msg_len.
    // SAFETY: `msgs` holds `n` headers pointing into `dsts`, `iov`, `payload`, alive for the call.
    let rc = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), n as libc::c_uint, 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// Sets the nice value of thread `tid` (0: the calling thread); Linux applies it to that
/// thread only. Gone with the thread.
pub fn set_nice(tid: u32, nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers; PRIO_PROCESS with a thread id affects only
    // that thread on Linux.
    check(unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) })
}
