//! corelocal: process every TCP connection on one core.
//!
//! The library is laid out by layer; nothing reaches upward:
//!
//! - [`cpu`]: CPU sets (cpulists and hex masks), topology from sysfs, pinning.
//! - [`bpf`]: a classic and extended BPF instruction encoder, the `bpf(2)` wrappers and the
//!   steering programs (SK_REUSEPORT select by flow group / CPU; cBPF `return cpu`).
//! - [`listen`]: [`listen::ListenerGroup`], one SO_REUSEPORT listener per worker, steered by the
//!   kernel in mode `stock`, `fine` or `local` (Affinity-Accept §3.1–3.2, MegaPipe §3.4.1).
//! - [`balance`]: pure Affinity-Accept policy (busy tracking, stealing, flow-group migration)
//!   and the deterministic simulator that drives it; time is an input.
//! - [`steer`]: packet-level flow-group migration — XDP + CPUMAP (software, any interface)
//!   and the NIC's RSS indirection table (ethtool), with detection.
//! - [`backend`]: the operations and completions between the runtime's worker and the
//!   backends, and the accept policy both follow (a pure leaf both import).
//! - [`runtime`]: one pinned worker per CPU, the sans-IO [`runtime::Handler`] API, stats, and
//!   the backends behind one submit / reap / wait interface.
//! - [`procfs`]: pure parsers for `/proc` files (`stat`, `net/*`, `PID/stat`, `schedstat`),
//!   plus a bounded reader.
//! - [`sys`]: every syscall and `unsafe` block of the crate.

pub mod backend;
pub mod balance;
pub mod bpf;
pub mod cpu;
pub mod listen;
pub mod procfs;
pub mod runtime;
pub mod steer;
pub mod sys;
#[doc(hidden)]
pub mod testing;
