//! All operating-system code of the library lives here (mio's rule): every `unsafe` block, every
//! syscall. The rest of the crate is either pure (policy, protocols, encoders) or calls these
//! safe wrappers, and so do the workspace's tools (`corelocal-cli`, `-steer`, `-sweep`, `-top`,
//! `-bench`) for what `rustix` does not cover safely: apart from test code, the workspace has no
//! `unsafe` block outside this module (the load generator's client I/O is [`client`]).
//!
//! Where `rustix` covers a call these modules are thin typed layers over it: sockets and their
//! options, descriptor passing, sock_diag's netlink socket, pidfds, eventfd, epoll, poll,
//! thread affinity, the interface index (`SIOCGIFINDEX`), `kill`, `PR_SET_NO_NEW_PRIVS`,
//! rlimits. What it does not cover stays hand-written, with a `// SAFETY:` line per block:
//!
//! - the `bpf(2)` commands (maps, program load with the verifier log, links, iterators);
//! - the socket options `rustix` has no setter or getter for, through one generic
//!   `setsockopt` (reuseport BPF attach and detach, `TCP_DEFER_ACCEPT`,
//!   `IP_BIND_ADDRESS_NO_PORT`) and the first bytes of `TCP_INFO`; the borrow of the raw
//!   descriptor numbers the callers pass;
//! - the ethtool ioctl (`SIOCETHTOOL`);
//! - signals: the mask, `sigtimedwait` and `sigaction` (`rustix` has them only as unsafe
//!   functions of its unstable runtime module), and `tgkill`;
//! - `sched_getcpu` (libc reads it from rseq or the vDSO; `rustix` makes the `getcpu`
//!   syscall);
//! - `fork(2)`, through libc (its atfork handlers) and only while the process has one thread;
//! - `unshare(CLONE_NEWNS)` (`rustix`'s `unshare_unsafe`: safe for NEWNS alone) and the
//!   seccomp filter (`PR_SET_SECCOMP` with a pointer);
//! - io_uring details the `io-uring` crate leaves unsafe: submission pushes, the provided-buffer
//!   ring's memory, raw SQE fields, `io_uring_enter` with no argument, a direct descriptor
//!   handed back as an fd.
//!
//! Modules:
//!
//! - [`affinity`]: pin threads, read the current CPU.
//! - [`socket`]: socket creation and the options corelocal needs (SO_REUSEPORT,
//!   SO_INCOMING_CPU, reuseport BPF attach, TCP_INFO on listeners, accept4), and a client
//!   socket bound to a source address without a port (`IP_BIND_ADDRESS_NO_PORT`).
//! - [`bpf`]: the `bpf(2)` syscall (program load with verifier log, map operations, links,
//!   BPF iterators).
//! - [`ethtool`]: interface index by name; the ethtool ioctl (driver, RX queues, RSS table,
//!   the GRO and TSO switches).
//! - [`sockdiag`]: listening TCP sockets via `NETLINK_SOCK_DIAG` (cheap, unlike
//!   `/proc/net/tcp`).
//! - [`ktls`]: whether the kernel offers kTLS (the `tls` upper-layer protocol) and which
//!   TLS_TX settings (ciphers) it takes.
//! - [`signal`]: SIGINT/SIGTERM blocked everywhere and awaited in one place; a handler that
//!   only sets a flag, for the tools that clean up before they exit; a SIGTERM to one thread.
//! - [`process`]: uid, resource limits, a seccomp filter, a thread's own mount namespace; a
//!   daemon's fork (single-threaded only), new session, standard descriptors and child.
//! - [`pidfd`]: another process's descriptors (`pidfd_getfd`) and CPU affinity, for
//!   `corelocal steer`.
//! - [`scm`]: unix `SOCK_SEQPACKET` sockets and descriptor passing (`SCM_RIGHTS`) for handing
//!   listening sockets to a successor process.
//! - [`epoll`]: the epoll [`Backend`](crate::backend::Backend); [`uring`]: the io_uring one
//!   (both are woken from other threads through an eventfd).
//! - [`client`]: the load generator's side (`corelocal bench`): connection slots over io_uring
//!   or epoll behind [`client::ClientIo`], with buffers the caller cannot free or move while
//!   the kernel uses them. The server runtime does not use it.
//!
//! Every backend provides the same completion-style interface (see
//! [`backend::Backend`](crate::backend::Backend)): `push` queues operations (accept, recv,
//! send, sendfile, socket options between two sends, shutdown, close, detach) without a
//! syscall, `adopt` takes over a connection a predecessor process handed over, `submit` hands the batch to the kernel once per loop
//! turn, `wait` sleeps until a completion, a wake-up from another thread or a timeout (no lost
//! wake-ups), and `reap` collects completions in batches. Accept and receive are multishot.

pub mod affinity;
pub mod bpf;
pub mod client;
pub mod epoll;
pub mod ethtool;
mod eventfd;
pub mod ktls;
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
