//! All operating-system code of the library lives here (mio's rule): every `unsafe` block, every
//! syscall. The rest of the crate is either pure (policy, protocols, encoders) or calls these
//! safe wrappers.
//!
//! - [`affinity`]: pin threads, read the current CPU.
//! - [`socket`]: socket creation and the options corelocal needs (SO_REUSEPORT,
//!   SO_INCOMING_CPU, reuseport BPF attach, TCP_INFO on listeners, accept4).
//! - [`bpf`]: the `bpf(2)` syscall (program load with verifier log, map operations).
//! - [`epoll`]: the epoll [`Backend`](crate::runtime::Backend).
//!
//! Every backend provides the same completion-style interface (see
//! [`runtime::Backend`](crate::runtime::Backend)): `submit` queues operations (accept, recv,
//! send, close) without a syscall where it can, `flush` hands the batch to the kernel, `reap`
//! collects completions in batches, and `wait` sleeps until a completion, a wake-up from another
//! thread or a timeout, with no lost wake-ups.

pub mod affinity;
pub mod bpf;
pub mod epoll;
pub mod process;
pub mod socket;
