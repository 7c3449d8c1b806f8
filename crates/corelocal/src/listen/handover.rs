//! The binary-upgrade handover protocol, sans-IO: the messages a running server and its
//! successor exchange over a unix `SOCK_SEQPACKET` socket, and the [`Layout`] header that
//! describes the listening sockets the old process passes (`SCM_RIGHTS`, see
//! [`super::transfer`]).
//!
//! ```text
//! old → new   Offer(layout)            the sockets follow, in layout order
//! old → new   Sockets(n) + n fds       repeated until layout.socket_count() fds were sent
//! new → old   Ready | Abort(reason)    Ready: the new process serves from the sockets now
//! old → new   Done                     the old one stopped accepting and gave up the path
//! old → new   Moving                   established connections and state follow
//! old → new   Conns(entries) + fds     connections, each with its unhandled bytes and its
//!                                      handler's state; repeated (empty: still working)
//! old → new   ConnInput(bytes)         the rest of the last entry's bytes, when cut
//! old → new   State(bytes)             the service's state stream, in order
//! old → new   End(conns, summary)      nothing more follows
//! ```
//!
//! The `--takeover PID` form has no listening sockets to pass (the new process joined the
//! group itself): the old process connects to the new one after its SIGTERM and starts at
//! `Moving`.
//!
//! Every message starts with the magic `CLHO` and the protocol version (little-endian u16);
//! a peer speaking another version is refused with both versions named. Sizes are bounded:
//! [`MESSAGE_BYTES_MAX`] per message, [`ADDRS_MAX`] addresses, [`WORKERS_MAX`] workers,
//! [`REASON_BYTES_MAX`] of abort reason.

use super::{ActiveSteering, GroupConfig, LayoutMismatch, Mismatch, Mode, Steering};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The protocol version this build speaks.
pub const VERSION: u16 = 2;
/// The first bytes of every message.
pub const MAGIC: [u8; 4] = *b"CLHO";
/// The largest message either side sends or accepts.
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024;
/// The most listen addresses a layout may carry.
pub const ADDRS_MAX: usize = 64;
/// The most workers a layout may carry.
pub const WORKERS_MAX: usize = 4096;
/// The longest abort reason kept (longer ones are cut at a character boundary).
pub const REASON_BYTES_MAX: usize = 1024;
/// The longest handler state a moved connection may carry.
pub const CONN_STATE_BYTES_MAX: usize = 4096;
/// The longest summary an [`Message::End`] carries.
pub const SUMMARY_BYTES_MAX: usize = 1024;
/// Descriptors sent per [`Message::Sockets`] message (below the kernel's `SCM_MAX_FD`, 253).
pub const SOCKETS_PER_MESSAGE: usize = 64;

/// What the old process's listener group looks like: enough for the new process to check
/// that its own configuration matches and to rebuild the same group from the sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Spreading mode.
    pub mode: Mode,
    /// The steering in force (the new process keeps it).
    pub steering: ActiveSteering,
    /// The bound addresses, ports resolved, in group order.
    pub addrs: Vec<SocketAddr>,
    /// The CPU of each worker.
    pub worker_cpus: Vec<usize>,
    /// Per address: socket indexes in the kernel's `socks[]` order (cBPF steering needs it).
    pub kernel_order: Vec<Vec<usize>>,
}

impl Layout {
    /// Sockets per address: one shared socket in `stock` mode, else one per worker.
    pub fn sockets_per_addr(&self) -> usize {
        match self.mode {
            Mode::Stock => 1,
            _ => self.worker_cpus.len(),
        }
    }

    /// Sockets passed in all (address by address, socket by socket).
    pub fn socket_count(&self) -> usize {
        self.addrs.len() * self.sockets_per_addr()
    }

    /// Checks that a process configured with `config` can adopt these sockets: same
    /// addresses, workers on the same CPUs, same mode, and the same steering when one is
    /// forced. Returns the steering to use (the old one), or every mismatch in one message.
    pub fn check_matches(&self, config: &GroupConfig) -> Result<ActiveSteering, LayoutMismatch> {
        let mut problems = Vec::new();
        if config.addrs != self.addrs {
            problems.push(Mismatch::Addrs(config.addrs.clone(), self.addrs.clone()));
        }
        if config.worker_cpus != self.worker_cpus {
            problems.push(Mismatch::WorkerCpus(
                config.worker_cpus.clone(),
                self.worker_cpus.clone(),
            ));
        }
        if config.mode != self.mode {
            problems.push(Mismatch::Mode(config.mode, self.mode));
        }
        if let (Some(forced), ActiveSteering::Local(running)) = (config.steering, self.steering) {
            if forced != running {
                problems.push(Mismatch::Steering(forced, running));
            }
        }
        if problems.is_empty() {
            Ok(self.steering)
        } else {
            Err(LayoutMismatch(problems))
        }
    }

    fn validate(&self) -> Result<(), DecodeError> {
        let bad = |m: String| Err(DecodeError::Invalid(m));
        if self.addrs.is_empty() || self.addrs.len() > ADDRS_MAX {
            return bad(format!("{} addresses (1..={ADDRS_MAX})", self.addrs.len()));
        }
        if self.worker_cpus.is_empty() || self.worker_cpus.len() > WORKERS_MAX {
            return bad(format!(
                "{} workers (1..={WORKERS_MAX})",
                self.worker_cpus.len()
            ));
        }
        let consistent = match self.mode {
            Mode::Stock => self.steering == ActiveSteering::Shared,
            Mode::Fine => self.steering == ActiveSteering::KernelHash,
            Mode::Local => matches!(self.steering, ActiveSteering::Local(_)),
        };
        if !consistent {
            return bad(format!(
                "mode {} with steering {}",
                self.mode, self.steering
            ));
        }
        if self.kernel_order.len() != self.addrs.len() {
            return bad("kernel order: one list per address expected".into());
        }
        let n = self.sockets_per_addr();
        for order in &self.kernel_order {
            let mut seen = vec![false; n];
            for &i in order {
                if i >= n || std::mem::replace(&mut seen[i], true) {
                    return bad(format!(
                        "kernel order {order:?} is not a permutation of 0..{n}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// One message of the handover protocol (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Old → new: the layout of the sockets about to follow.
    Offer(Layout),
    /// Old → new: this many sockets are attached to this message.
    Sockets(u16),
    /// New → old: serving from the sockets now; stop accepting.
    Ready,
    /// New → old: refused (the reason is for the old process's log); keep serving.
    Abort(String),
    /// Old → new: stopped accepting and released the upgrade socket path.
    Done,
    /// Old → new: established connections and the service's state follow.
    Moving,
    /// Old → new: connections, one descriptor each attached, in order (none: a keep-alive
    /// while the old process waits for requests in progress to finish).
    Conns(Vec<ConnEntry>),
    /// Old → new: more of the bytes of the last entry of the last [`Message::Conns`].
    ConnInput(Vec<u8>),
    /// Old → new: the next part of the service's state stream.
    State(Vec<u8>),
    /// Old → new: the end; how many connections were sent, and what the service's state
    /// export said.
    End {
        /// Connections sent.
        conns: u64,
        /// The export's summary (or why there was none).
        summary: String,
    },
}

/// One connection of a [`Message::Conns`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnEntry {
    /// The CPU of the worker that served it.
    pub cpu: u16,
    /// Its handler's state (at most [`CONN_STATE_BYTES_MAX`]).
    pub state: Vec<u8>,
    /// How many unhandled bytes it has in all.
    pub input_len: u32,
    /// The first of them (all but the last entry carry every byte; the rest of the last one
    /// follows in [`Message::ConnInput`] messages).
    pub input: Vec<u8>,
}

impl ConnEntry {
    /// Encoded size: the header and both byte strings.
    pub fn encoded_len(&self) -> usize {
        CONN_ENTRY_HEADER_BYTES + self.state.len() + self.input.len()
    }
}

/// Bytes of a [`ConnEntry`]'s header: cpu, state length, total and carried input lengths.
pub const CONN_ENTRY_HEADER_BYTES: usize = 2 + 2 + 4 + 4;
/// Bytes of a message's fixed part (magic, version, kind) and a [`Message::Conns`] count.
pub const MESSAGE_HEADER_BYTES: usize = 4 + 2 + 1 + 2;

/// Why bytes are not a valid message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Not a handover message at all (wrong magic).
    NotHandover,
    /// The peer speaks another protocol version.
    Version {
        /// The peer's version.
        theirs: u16,
    },
    /// The message ended early.
    Truncated,
    /// A field is out of range or inconsistent.
    Invalid(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::NotHandover => f.write_str("not a corelocal handover message"),
            DecodeError::Version { theirs } => write!(
                f,
                "the other process speaks handover protocol version {theirs}, this one {VERSION}"
            ),
            DecodeError::Truncated => f.write_str("truncated handover message"),
            DecodeError::Invalid(m) => write!(f, "invalid handover message: {m}"),
        }
    }
}

impl std::error::Error for DecodeError {}

const KIND_OFFER: u8 = 1;
const KIND_SOCKETS: u8 = 2;
const KIND_READY: u8 = 3;
const KIND_ABORT: u8 = 4;
const KIND_DONE: u8 = 5;
const KIND_MOVING: u8 = 6;
const KIND_CONNS: u8 = 7;
const KIND_CONN_INPUT: u8 = 8;
const KIND_STATE: u8 = 9;
const KIND_END: u8 = 10;

impl Message {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        match self {
            Message::Offer(layout) => {
                out.push(KIND_OFFER);
                encode_layout(layout, &mut out);
            }
            Message::Sockets(n) => {
                out.push(KIND_SOCKETS);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Message::Ready => out.push(KIND_READY),
            Message::Abort(reason) => {
                out.push(KIND_ABORT);
                let reason = truncate(reason, REASON_BYTES_MAX);
                out.extend_from_slice(&(reason.len() as u16).to_le_bytes());
                out.extend_from_slice(reason.as_bytes());
            }
            Message::Done => out.push(KIND_DONE),
            Message::Moving => out.push(KIND_MOVING),
            Message::Conns(entries) => {
                out.push(KIND_CONNS);
                out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
                for e in entries {
                    out.extend_from_slice(&e.cpu.to_le_bytes());
                    out.extend_from_slice(&(e.state.len() as u16).to_le_bytes());
                    out.extend_from_slice(&e.input_len.to_le_bytes());
                    out.extend_from_slice(&(e.input.len() as u32).to_le_bytes());
                    out.extend_from_slice(&e.state);
                    out.extend_from_slice(&e.input);
                }
            }
            Message::ConnInput(bytes) => {
                out.push(KIND_CONN_INPUT);
                out.extend_from_slice(bytes);
            }
            Message::State(bytes) => {
                out.push(KIND_STATE);
                out.extend_from_slice(bytes);
            }
            Message::End { conns, summary } => {
                out.push(KIND_END);
                out.extend_from_slice(&conns.to_le_bytes());
                let summary = truncate(summary, SUMMARY_BYTES_MAX);
                out.extend_from_slice(&(summary.len() as u16).to_le_bytes());
                out.extend_from_slice(summary.as_bytes());
            }
        }
        out
    }

    /// Parses one message; never panics, whatever the bytes.
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        if bytes.len() > MESSAGE_BYTES_MAX {
            return Err(DecodeError::Invalid(format!(
                "{} bytes (max {MESSAGE_BYTES_MAX})",
                bytes.len()
            )));
        }
        let mut r = Reader { bytes, at: 0 };
        if bytes.len() < MAGIC.len() || r.take(MAGIC.len())? != MAGIC {
            return Err(DecodeError::NotHandover);
        }
        let version = r.u16()?;
        if version != VERSION {
            return Err(DecodeError::Version { theirs: version });
        }
        let message = match r.u8()? {
            KIND_OFFER => Message::Offer(decode_layout(&mut r)?),
            KIND_SOCKETS => Message::Sockets(r.u16()?),
            KIND_READY => Message::Ready,
            KIND_ABORT => {
                let len = r.u16()? as usize;
                let text = String::from_utf8_lossy(r.take(len)?);
                Message::Abort(truncate(&text, REASON_BYTES_MAX).to_string())
            }
            KIND_DONE => Message::Done,
            KIND_MOVING => Message::Moving,
            KIND_CONNS => Message::Conns(decode_conns(&mut r)?),
            KIND_CONN_INPUT => Message::ConnInput(r.rest().to_vec()),
            KIND_STATE => Message::State(r.rest().to_vec()),
            KIND_END => {
                let conns = r.u64()?;
                let len = r.u16()? as usize;
                let text = String::from_utf8_lossy(r.take(len)?);
                Message::End {
                    conns,
                    summary: truncate(&text, SUMMARY_BYTES_MAX).to_string(),
                }
            }
            other => {
                return Err(DecodeError::Invalid(format!(
                    "unknown message kind {other}"
                )))
            }
        };
        if r.at != bytes.len() {
            return Err(DecodeError::Invalid(format!(
                "{} trailing bytes",
                bytes.len() - r.at
            )));
        }
        Ok(message)
    }
}

fn decode_conns(r: &mut Reader<'_>) -> Result<Vec<ConnEntry>, DecodeError> {
    let count = r.u16()? as usize;
    if count > SOCKETS_PER_MESSAGE {
        return Err(DecodeError::Invalid(format!(
            "{count} connections in one message (max {SOCKETS_PER_MESSAGE})"
        )));
    }
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let cpu = r.u16()?;
        let state_len = r.u16()? as usize;
        let input_len = r.u32()?;
        let carried = r.u32()? as usize;
        if state_len > CONN_STATE_BYTES_MAX || carried > input_len as usize {
            return Err(DecodeError::Invalid(format!(
                "connection {i}: state {state_len} bytes, input {carried} of {input_len}"
            )));
        }
        if i + 1 < count && carried != input_len as usize {
            return Err(DecodeError::Invalid(format!(
                "connection {i} of {count} is cut (only the last may be)"
            )));
        }
        let state = r.take(state_len)?.to_vec();
        let input = r.take(carried)?.to_vec();
        entries.push(ConnEntry {
            cpu,
            state,
            input_len,
            input,
        });
    }
    Ok(entries)
}

fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn mode_byte(mode: Mode) -> u8 {
    match mode {
        Mode::Stock => 0,
        Mode::Fine => 1,
        Mode::Local => 2,
    }
}

fn steering_byte(steering: ActiveSteering) -> u8 {
    match steering {
        ActiveSteering::Shared => 0,
        ActiveSteering::KernelHash => 1,
        ActiveSteering::Local(Steering::Ebpf) => 2,
        ActiveSteering::Local(Steering::IncomingCpu) => 3,
        ActiveSteering::Local(Steering::Cbpf) => 4,
    }
}

fn encode_layout(layout: &Layout, out: &mut Vec<u8>) {
    out.push(mode_byte(layout.mode));
    out.push(steering_byte(layout.steering));
    out.extend_from_slice(&(layout.addrs.len() as u16).to_le_bytes());
    for addr in &layout.addrs {
        match addr.ip() {
            IpAddr::V4(ip) => {
                out.push(4);
                out.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                out.push(6);
                out.extend_from_slice(&ip.octets());
            }
        }
        out.extend_from_slice(&addr.port().to_le_bytes());
    }
    out.extend_from_slice(&(layout.worker_cpus.len() as u16).to_le_bytes());
    for &cpu in &layout.worker_cpus {
        out.extend_from_slice(&(cpu as u32).to_le_bytes());
    }
    for order in &layout.kernel_order {
        out.extend_from_slice(&(order.len() as u16).to_le_bytes());
        for &i in order {
            out.extend_from_slice(&(i as u16).to_le_bytes());
        }
    }
}

fn decode_layout(r: &mut Reader<'_>) -> Result<Layout, DecodeError> {
    let mode = match r.u8()? {
        0 => Mode::Stock,
        1 => Mode::Fine,
        2 => Mode::Local,
        m => return Err(DecodeError::Invalid(format!("unknown mode {m}"))),
    };
    let steering = match r.u8()? {
        0 => ActiveSteering::Shared,
        1 => ActiveSteering::KernelHash,
        2 => ActiveSteering::Local(Steering::Ebpf),
        3 => ActiveSteering::Local(Steering::IncomingCpu),
        4 => ActiveSteering::Local(Steering::Cbpf),
        s => return Err(DecodeError::Invalid(format!("unknown steering {s}"))),
    };
    let addrs = r.count(ADDRS_MAX, "addresses")?;
    let addrs = (0..addrs)
        .map(|_| r.socket_addr())
        .collect::<Result<Vec<_>, _>>()?;
    let workers = r.count(WORKERS_MAX, "workers")?;
    let worker_cpus = (0..workers)
        .map(|_| r.u32().map(|c| c as usize))
        .collect::<Result<Vec<_>, _>>()?;
    let mut kernel_order = Vec::with_capacity(addrs.len());
    for _ in 0..addrs.len() {
        let n = r.count(WORKERS_MAX, "kernel order entries")?;
        let order = (0..n)
            .map(|_| r.u16().map(usize::from))
            .collect::<Result<Vec<_>, _>>()?;
        kernel_order.push(order);
    }
    let layout = Layout {
        mode,
        steering,
        addrs,
        worker_cpus,
        kernel_order,
    };
    layout.validate()?;
    Ok(layout)
}

/// A bounds-checked cursor over a message.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).ok_or(DecodeError::Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(DecodeError::Truncated)?;
        self.at = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// Everything left (the message's last field).
    fn rest(&mut self) -> &'a [u8] {
        let rest = &self.bytes[self.at..];
        self.at = self.bytes.len();
        rest
    }

    fn count(&mut self, max: usize, what: &str) -> Result<usize, DecodeError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(DecodeError::Invalid(format!("{n} {what} (max {max})")));
        }
        Ok(n)
    }

    fn socket_addr(&mut self) -> Result<SocketAddr, DecodeError> {
        let ip = match self.u8()? {
            4 => {
                let b: [u8; 4] = self.take(4)?.try_into().expect("4 bytes");
                IpAddr::V4(Ipv4Addr::from(b))
            }
            6 => {
                let b: [u8; 16] = self.take(16)?.try_into().expect("16 bytes");
                IpAddr::V6(Ipv6Addr::from(b))
            }
            f => return Err(DecodeError::Invalid(format!("unknown address family {f}"))),
        };
        Ok(SocketAddr::new(ip, self.u16()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout(mode: Mode, steering: ActiveSteering, cpus: Vec<usize>) -> Layout {
        let addrs: Vec<SocketAddr> = vec!["127.0.0.1:7000".parse().unwrap()];
        let n = if mode == Mode::Stock { 1 } else { cpus.len() };
        Layout {
            mode,
            steering,
            kernel_order: vec![(0..n).collect()],
            addrs,
            worker_cpus: cpus,
        }
    }

    fn config_for(l: &Layout) -> GroupConfig {
        GroupConfig::new(l.addrs.clone(), l.worker_cpus.clone(), l.mode)
    }

    #[test]
    fn every_message_round_trips() {
        let l = layout(
            Mode::Local,
            ActiveSteering::Local(Steering::Ebpf),
            vec![0, 1],
        );
        for m in [
            Message::Offer(l),
            Message::Sockets(64),
            Message::Ready,
            Message::Abort("mode differs".into()),
            Message::Done,
            Message::Moving,
            Message::Conns(vec![]),
            Message::Conns(vec![
                ConnEntry {
                    cpu: 3,
                    state: b"auth".to_vec(),
                    input_len: 4,
                    input: b"get ".to_vec(),
                },
                ConnEntry {
                    cpu: 0,
                    state: vec![],
                    input_len: 100_000,
                    input: b"set k 0 0 99995\r\n".to_vec(),
                },
            ]),
            Message::ConnInput(vec![7; 1000]),
            Message::State(vec![1, 2, 3]),
            Message::End {
                conns: 12,
                summary: "3 items".into(),
            },
        ] {
            assert_eq!(Message::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn another_version_or_magic_is_refused_by_name() {
        let mut bytes = Message::Ready.encode();
        bytes[4] = 9;
        let e = Message::decode(&bytes).unwrap_err();
        assert_eq!(e, DecodeError::Version { theirs: 9 });
        assert!(e.to_string().contains("version 9, this one 2"), "{e}");
        assert_eq!(
            Message::decode(b"HTTP/1.1 200"),
            Err(DecodeError::NotHandover)
        );
        assert_eq!(Message::decode(b"CL"), Err(DecodeError::NotHandover));
    }

    #[test]
    fn truncated_trailing_and_inconsistent_offers_are_refused() {
        let l = layout(Mode::Fine, ActiveSteering::KernelHash, vec![0, 1]);
        let bytes = Message::Offer(l.clone()).encode();
        for cut in 7..bytes.len() {
            assert!(Message::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            Message::decode(&long),
            Err(DecodeError::Invalid(_))
        ));
        let wrong = Layout {
            steering: ActiveSteering::Shared,
            ..l.clone()
        };
        let e = Message::decode(&Message::Offer(wrong).encode()).unwrap_err();
        assert!(
            e.to_string().contains("mode fine with steering shared"),
            "{e}"
        );
        let twice = Layout {
            kernel_order: vec![vec![1, 1]],
            ..l
        };
        assert!(Message::decode(&Message::Offer(twice).encode()).is_err());
    }

    #[test]
    fn only_the_last_connection_of_a_message_may_be_cut() {
        let cut = ConnEntry {
            cpu: 0,
            state: vec![],
            input_len: 10,
            input: b"get".to_vec(),
        };
        let whole = ConnEntry {
            input_len: 3,
            ..cut.clone()
        };
        let bytes = Message::Conns(vec![cut.clone(), whole.clone()]).encode();
        assert!(matches!(
            Message::decode(&bytes),
            Err(DecodeError::Invalid(_))
        ));
        let ok = Message::Conns(vec![whole, cut]);
        assert_eq!(Message::decode(&ok.encode()), Ok(ok));
        let over = ConnEntry {
            input_len: 2,
            ..ConnEntry {
                cpu: 0,
                state: vec![],
                input_len: 0,
                input: b"get".to_vec(),
            }
        };
        let bytes = Message::Conns(vec![over]).encode();
        assert!(
            Message::decode(&bytes).is_err(),
            "more bytes than announced"
        );
    }

    #[test]
    fn a_long_abort_reason_is_cut_at_a_character_boundary() {
        let reason = "é".repeat(REASON_BYTES_MAX);
        let Ok(Message::Abort(got)) = Message::decode(&Message::Abort(reason).encode()) else {
            panic!("abort expected");
        };
        assert!(got.len() <= REASON_BYTES_MAX && got.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_matching_config_adopts_the_running_steering() {
        let l = layout(
            Mode::Local,
            ActiveSteering::Local(Steering::Cbpf),
            vec![0, 1],
        );
        let mut config = config_for(&l);
        assert_eq!(l.check_matches(&config), Ok(l.steering));
        config.steering = Some(Steering::Cbpf);
        assert_eq!(l.check_matches(&config), Ok(l.steering));
    }

    #[test]
    fn every_mismatch_is_named() {
        let l = layout(
            Mode::Local,
            ActiveSteering::Local(Steering::Ebpf),
            vec![0, 1],
        );
        let mut config = config_for(&l);
        config.worker_cpus = vec![0];
        config.addrs = vec!["127.0.0.1:7001".parse().unwrap()];
        config.steering = Some(Steering::IncomingCpu);
        let e = l.check_matches(&config).unwrap_err().to_string();
        assert!(e.contains("worker CPUs"), "{e}");
        assert!(
            e.contains("this process [0], the running server [0,1]"),
            "{e}"
        );
        assert!(e.contains("listen addresses"), "{e}");
        assert!(
            e.contains("steering: this process incoming-cpu, the running server ebpf"),
            "{e}"
        );
        config = config_for(&l);
        config.mode = Mode::Fine;
        let e = l.check_matches(&config).unwrap_err().to_string();
        assert!(
            e.contains("mode: this process fine, the running server local"),
            "{e}"
        );
    }

    #[test]
    fn socket_counts_follow_the_mode() {
        let stock = layout(Mode::Stock, ActiveSteering::Shared, vec![0, 1, 2]);
        assert_eq!(stock.socket_count(), 1);
        let fine = layout(Mode::Fine, ActiveSteering::KernelHash, vec![0, 1, 2]);
        assert_eq!(fine.socket_count(), 3);
    }

    fn arb_addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
            (any::<[u8; 16]>(), any::<u16>())
                .prop_map(|(ip, p)| SocketAddr::from((Ipv6Addr::from(ip), p))),
        ]
    }

    fn arb_layout() -> impl Strategy<Value = Layout> {
        let steering = prop_oneof![
            Just((Mode::Stock, ActiveSteering::Shared)),
            Just((Mode::Fine, ActiveSteering::KernelHash)),
            Just((Mode::Local, ActiveSteering::Local(Steering::Ebpf))),
            Just((Mode::Local, ActiveSteering::Local(Steering::IncomingCpu))),
            Just((Mode::Local, ActiveSteering::Local(Steering::Cbpf))),
        ];
        (
            steering,
            prop::collection::vec(arb_addr(), 1..4),
            prop::collection::vec(0usize..4096, 1..40),
        )
            .prop_flat_map(|((mode, steering), addrs, cpus)| {
                let n = if mode == Mode::Stock { 1 } else { cpus.len() };
                let order = Just((0..n).collect::<Vec<usize>>()).prop_shuffle();
                let orders = prop::collection::vec(order, addrs.len());
                (Just((mode, steering, addrs, cpus)), orders)
            })
            .prop_map(
                |((mode, steering, addrs, worker_cpus), kernel_order)| Layout {
                    mode,
                    steering,
                    addrs,
                    worker_cpus,
                    kernel_order,
                },
            )
    }

    proptest! {
        #[test]
        fn offers_round_trip(l in arb_layout()) {
            let bytes = Message::Offer(l.clone()).encode();
            prop_assert!(bytes.len() <= MESSAGE_BYTES_MAX);
            prop_assert_eq!(Message::decode(&bytes), Ok(Message::Offer(l)));
        }

        #[test]
        fn any_bytes_decode_without_panicking(tail in prop::collection::vec(any::<u8>(), 0..300)) {
            let mut bytes = Message::Ready.encode();
            bytes.truncate(6);
            bytes.extend_from_slice(&tail);
            let _ = Message::decode(&bytes);
            let _ = Message::decode(&tail);
        }

        #[test]
        fn corrupted_offers_never_panic(l in arb_layout(), at in any::<usize>(), byte in any::<u8>()) {
            let mut bytes = Message::Offer(l).encode();
            let i = at % bytes.len();
            bytes[i] = byte;
            if let Ok(Message::Offer(got)) = Message::decode(&bytes) {
                prop_assert!(got.validate().is_ok());
            }
        }
    }
}
