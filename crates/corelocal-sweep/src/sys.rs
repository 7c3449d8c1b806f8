//! The system calls `sweep` needs beyond std: joining a network namespace from one thread,
//! a private sysfs for that thread, the thread id, and a stop flag set by SIGINT/SIGTERM.
//! Also pinning another thread, the ethtool GRO switch and `sendmmsg` for the forwarding
//! generator. The calls go through `rustix`; what it does not cover safely is
//! `corelocal::sys`'s (the signal handler that only sets a flag, without `SA_RESTART`; the
//! ethtool ioctl; leaving this thread's mount namespace), so the crate has no `unsafe` block.

use rustix::net::SocketAddrAny;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by [`request_stop`] (a signal sets its own flag in `corelocal::sys::signal`).
static STOP: AtomicBool = AtomicBool::new(false);

/// Moves the calling thread (only) into the network namespace bound at `/run/netns/NAME`.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let file = File::open(Path::new("/run/netns").join(name))?;
    rustix::thread::move_into_link_name_space(
        file.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )?;
    Ok(())
}

/// Gives the calling thread its own mount namespace (a slave of the host's, so nothing
/// propagates back) and mounts a fresh sysfs on `/sys` in it, which then shows the devices of
/// the thread's network namespace. The mounts vanish when the thread exits.
pub fn private_sysfs() -> io::Result<()> {
    use rustix::mount::{MountFlags, MountPropagationFlags};
    corelocal::sys::process::unshare_mount_namespace()?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::DOWNSTREAM,
    )?;
    rustix::mount::mount("sysfs", "/sys", "sysfs", MountFlags::empty(), None)?;
    Ok(())
}

/// The calling thread's id (for `/proc/self/task/TID/schedstat`).
pub fn gettid() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

/// SIGINT and SIGTERM: a stop request.
const STOP_SIGNALS: [i32; 2] = [libc::SIGINT, libc::SIGTERM];

/// Makes SIGINT and SIGTERM set the stop flag instead of killing the process, so the guards
/// that delete network namespaces and restore IRQ affinity still run.
pub fn install_stop_handler() -> io::Result<()> {
    corelocal::sys::signal::flag_on(&STOP_SIGNALS)
}

/// Whether a stop was requested (signal, or [`request_stop`]).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst) || corelocal::sys::signal::raised(&STOP_SIGNALS)
}

/// Requests a stop, as a signal would.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Pins thread or process `pid` (a kernel thread such as `napi/IF-ID` too) to `cpus`.
pub fn set_affinity(pid: u32, cpus: &corelocal::cpu::CpuSet) -> io::Result<()> {
    use rustix::thread::CpuSet;
    let max = CpuSet::MAX_CPU;
    if cpus.is_empty() || cpus.max().unwrap_or(0) >= max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU set {:?} empty or beyond {max}", cpus.to_list()),
        ));
    }
    let mut set = CpuSet::new();
    for cpu in cpus.iter() {
        set.set(cpu);
    }
    // pid 0 (None) is the calling thread, as for sched_setaffinity(2).
    rustix::thread::sched_setaffinity(rustix::process::Pid::from_raw(pid as i32), &set)?;
    Ok(())
}

/// Whether GRO is on for `ifname` in the calling thread's network namespace.
pub fn gro(ifname: &str) -> io::Result<bool> {
    corelocal::sys::ethtool::gro(ifname)
}

/// Turns GRO on or off for `ifname` (on a veth it also switches the receive side to NAPI).
pub fn set_gro(ifname: &str, on: bool) -> io::Result<()> {
    corelocal::sys::ethtool::set_gro(ifname, on)
}

/// Turns every TSO feature of `ifname` on or off.
pub fn set_tso(ifname: &str, on: bool) -> io::Result<()> {
    corelocal::sys::ethtool::set_tso(ifname, on)
}

/// Sends `dsts.len()` (at most 1024) UDP datagrams of `payload` on `sock`, datagram i to
/// `dsts[i]`, in one `sendmmsg(2)`; returns how many the kernel took.
pub fn sendmmsg_to(sock: impl AsFd, payload: &[u8], dsts: &[SocketAddrAny]) -> io::Result<usize> {
    use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags};
    const BATCH_MAX: usize = 1024;
    let n = dsts.len().min(BATCH_MAX);
    let iov = [io::IoSlice::new(payload)];
    let mut control: Vec<SendAncillaryBuffer<'_, '_, '_>> =
        (0..n).map(|_| SendAncillaryBuffer::default()).collect();
    let mut msgs: Vec<MMsgHdr<'_>> = dsts[..n]
        .iter()
        .zip(control.iter_mut())
        .map(|(dst, c)| MMsgHdr::new_with_addr(dst, &iov, c))
        .collect();
    Ok(rustix::net::sendmmsg(sock, &mut msgs, SendFlags::empty())?)
}

/// Sets the nice value of thread `tid` (0: the calling thread); Linux applies it to that
/// thread only. Gone with the thread.
pub fn set_nice(tid: u32, nice: i32) -> io::Result<()> {
    // PRIO_PROCESS with a thread id (None: 0, the calling thread) affects only that thread.
    rustix::process::setpriority_process(rustix::process::Pid::from_raw(tid as i32), nice)?;
    Ok(())
}
