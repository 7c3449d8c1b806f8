//! All operating-system code of the library lives here (mio's rule): every `unsafe` block, every
//! syscall. The rest of the crate is either pure (policy, protocols, encoders) or calls these
//! safe wrappers. Where `rustix` covers a call (sockets and their options, descriptor passing,
//! pidfds, eventfd, poll, rlimits) these modules are thin typed layers over it; what it does not
//! cover (the `bpf(2)` commands, the reuseport BPF attach, `TCP_INFO`, the ethtool ioctl,
//! sock_diag, signals, io_uring details) stays hand-written with a `// SAFETY:` line per block.
//!
//! - [`affinity`]: pin threads, read the current CPU.
//! - [`socket`]: socket creation and the options corelocal needs (SO_REUSEPORT,
//!   SO_INCOMING_CPU, reuseport BPF attach, TCP_INFO on listeners, accept4).
//! - [`bpf`]: the `bpf(2)` syscall (program load with verifier log, map operations, links).
//! - [`ethtool`]: interface index by name; the ethtool ioctl (driver, RX queues, RSS table).
//! - [`sockdiag`]: listening TCP sockets via `NETLINK_SOCK_DIAG` (cheap, unlike
//!   `/proc/net/tcp`).
//! - [`signal`]: SIGINT/SIGTERM blocked everywhere and awaited in one place.
//! - [`process`]: uid and resource limits.
//! - [`pidfd`]: another process's descriptors (`pidfd_getfd`) and CPU affinity, for
//!   `corelocal steer`.
//! - [`scm`]: unix `SOCK_SEQPACKET` sockets and descriptor passing (`SCM_RIGHTS`) for handing
//!   listening sockets to a successor process.
//! - [`epoll`]: the epoll [`Backend`](crate::backend::Backend); [`uring`]: the io_uring one.
//! - `eventfd`: the eventfd waker both backends share.
//!
//! Every backend provides the same completion-style interface (see
//! [`backend::Backend`](crate::backend::Backend)): `push` queues operations (accept, recv,
//! send, sendfile, shutdown, close, detach) without a syscall, `adopt` takes over a connection a
//! predecessor process handed over, `submit` hands the batch to the kernel once per loop
//! turn, `wait` sleeps until a completion, a wake-up from another thread or a timeout (no lost
//! wake-ups), and `reap` collects completions in batches. Accept and receive are multishot.

pub mod affinity;
pub mod bpf;
pub mod epoll;
pub mod ethtool;
mod eventfd;
pub mod pidfd;
pub mod process;
pub mod scm;
pub mod signal;
pub mod sockdiag;
pub mod socket;
pub mod uring;

/// A libc return code as a `Result`: negative means the call failed with `errno`.
pub(crate) fn cvt(rc: libc::c_int) -> std::io::Result<libc::c_int> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}
