//! Request identity and per-connection state: the `user_data` encoding (kind, and the
//! connection's key or another id) and each direct-descriptor slot's receive, send and close
//! progress.

use crate::backend::key::PACKED_SLOTS;
use crate::backend::FileRegion;
use crate::backend::{ConnKey, Origin};

pub(super) const KIND_ACCEPT: u64 = 1;
pub(super) const KIND_RECV: u64 = 2;
pub(super) const KIND_SEND: u64 = 3;
pub(super) const KIND_CLOSE: u64 = 4;
pub(super) const KIND_CANCEL: u64 = 5;
pub(super) const KIND_WAKE: u64 = 6;
pub(super) const KIND_SOCKOPT: u64 = 7;
pub(super) const KIND_STEAL: u64 = 8;
pub(super) const KIND_ACCEPT_ONE: u64 = 9;
pub(super) const KIND_SHUTDOWN: u64 = 10;
pub(super) const KIND_FILE_READ: u64 = 11;
pub(super) const KIND_INSTALL: u64 = 12;
pub(super) const KIND_ADOPT: u64 = 13;
/// The discarding receive just before a last send and its close (see `send::drain_entry`).
pub(super) const KIND_DRAIN: u64 = 14;
/// A socket option a handler asked for (see `options`).
pub(super) const KIND_OPTIONS: u64 = 15;

/// A connection's request: its kind in the top 8 bits, the connection's key below (see
/// [`ConnKey::pack`]), so a completion that comes after the slot got a new connection is
/// recognised as stale.
pub(super) fn user_data(kind: u64, key: ConnKey) -> u64 {
    (kind << 56) | key.pack()
}

/// A request of no connection (a listener's accept, a steal from a victim, a cancel, the
/// waker): its kind and an id that fits where a key's slot goes (generation 0).
pub(super) fn request(kind: u64, id: u32) -> u64 {
    debug_assert!(id < PACKED_SLOTS, "request id {id} too large");
    user_data(kind, ConnKey::new(id, 0))
}

/// The kind, and the key (of a connection's request) or the id (in the key's slot).
pub(super) fn split(ud: u64) -> (u64, ConnKey) {
    (ud >> 56, ConnKey::unpack(ud))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecvState {
    Off,
    /// A multishot receive is armed.
    Armed,
    /// Ran out of provided buffers: re-armed once buffers come back.
    Starved,
    /// A fresh connection's first receive: single-shot, linked behind its SO_INCOMING_CPU
    /// query (both in one submit, CQEs in that order).
    First,
    /// The first receive completed: a multishot receive is armed at the next submit unless the
    /// connection is closing or paused by then — a one-shot connection, answered and closed
    /// in the same turn, never has a multishot receive to cancel before its close.
    ArmAtSubmit,
    /// `Op::RecvStop`: the receive in flight was cancelled; its last CQE makes it `Held`.
    Stopping,
    /// Stopped and held (`Op::RecvStop`): nothing arms a receive until `Op::RecvRelease`.
    Held,
}

impl RecvState {
    /// A receive request is with the kernel (its last CQE is still to come).
    pub(super) fn in_flight(self) -> bool {
        matches!(
            self,
            RecvState::Armed | RecvState::First | RecvState::Stopping
        )
    }
}

#[derive(Debug)]
pub(super) struct SendState {
    pub(super) buf: Vec<u8>,
    pub(super) sent: usize,
    /// The connection's last output: its close goes out linked behind the send.
    pub(super) close_after: bool,
    /// For a file region: what is left to read after the bytes in `buf`, and the total.
    pub(super) file: Option<(FileRegion, u64)>,
    /// A read of the file's next chunk into `buf` is with the kernel (`KIND_FILE_READ`).
    pub(super) reading: bool,
    /// Bytes with a control message (`IORING_OP_SENDMSG`; `buf` is empty then).
    pub(super) control: Option<Box<crate::sys::socket::ControlSend>>,
}

impl SendState {
    /// The `user_data` kind of the request that holds `buf` now.
    pub(super) fn buf_owner(&self) -> u64 {
        if self.reading {
            KIND_FILE_READ
        } else {
            KIND_SEND
        }
    }
}

/// A connection being detached (see `handoff`): `Detached` waits for both.
#[derive(Debug)]
pub(super) struct Detaching {
    /// A receive may still complete (its cancellation's last CQE has not come).
    pub(super) recv_live: bool,
    /// The installed descriptor, once its CQE came.
    pub(super) fd: Option<std::io::Result<std::os::fd::OwnedFd>>,
}

/// A direct-descriptor slot's state (its generation is kept by the table, `Slots<Slot>`).
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) origin: Origin,
    pub(super) recv: RecvState,
    pub(super) send: Option<SendState>,
    pub(super) closing: bool,
    /// A close is linked behind the send in flight (see `send_next`): if the link breaks
    /// (the send failed or was cut short), its CQE is ECANCELED and the close is reissued.
    pub(super) close_linked: bool,
    /// Being detached (a binary upgrade moves the connection).
    pub(super) detaching: Option<Detaching>,
    /// The slot of a detached connection is closing: its completion is not reported.
    pub(super) detach_closing: bool,
    /// An `IORING_OP_SHUTDOWN` is with the kernel. The kernel always runs it from its io-wq
    /// threads and looks the direct descriptor up by index only when it runs, so the slot must
    /// not be closed (and handed to the next connection) before it completed: a late shutdown
    /// would end another connection (seen as a client's EOF before its answer under load).
    pub(super) shutdown_in_flight: bool,
    /// `close` came while the shutdown was in flight: the close is submitted when it completes.
    pub(super) close_after_shutdown: bool,
    /// Socket options with the kernel (`Op::SetOptions`).
    pub(super) options: Option<super::options::OptionsInFlight>,
    /// An upper-layer protocol is attached (kTLS): the last send goes without `MSG_MORE`,
    /// which would leave the ULP's last record open.
    pub(super) ulp: bool,
}
