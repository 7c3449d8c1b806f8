//! Binary upgrades. The running server's side by socket passing: [`UpgradeServer`] listens
//! on a unix socket (mode 0600) on its own thread — the workers' event loops never block on
//! it — and hands the listening sockets to the first successor that completes the exchange
//! (see [`crate::listen::transfer`]). Then the server stops accepting at once, serves what it
//! accepted and exits; the successor holds the same sockets, accept queues included.
//!
//! Then both forms (socket and `--takeover PID`) move what is established: [`send_moving`]
//! sends each connection between two requests and the service's state, [`receive_moving`]
//! gives them to the new server's workers, which start behind a gate until it is all there.

use super::handler::Service;
use super::handoff::{MovedConn, Outbox, StateError, StateImport};
use super::server::{ReleaseHandle, Server, ServerConfig, ServerError, ShutdownReport};
use crate::listen::handover::{
    ConnEntry, Message, CONN_ENTRY_HEADER_BYTES, CONN_STATE_BYTES_MAX, MESSAGE_BYTES_MAX,
    MESSAGE_HEADER_BYTES, SOCKETS_PER_MESSAGE,
};
use crate::listen::transfer::{self, Channel, HandoverError, UpgradeListener};
use crate::sys::scm;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the upgrade thread looks at its stop flag while waiting for a successor.
const ACCEPT_POLL: Duration = Duration::from_millis(100);
/// Pause after an unexpected accept error, so a persistent one cannot spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The upgrade socket of a running server (see the module docs).
#[derive(Debug)]
pub struct UpgradeServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    handed_over: Arc<AtomicBool>,
    outcome: Arc<Mutex<Option<Result<MoveReport, MoveFailure>>>>,
    thread: Option<JoinHandle<()>>,
}

/// How a server's upgrade socket ended ([`UpgradeServer::shutdown`]).
#[derive(Debug)]
pub enum Handover {
    /// No successor took the sockets: this server still owns them.
    Kept,
    /// A successor took the sockets, the connections and the state.
    Moved(MoveReport),
    /// A successor took the sockets, then the move broke (it died or stopped answering):
    /// this process must serve on ([`resume`]) or the connections left are lost.
    Failed(MoveFailure),
}

impl UpgradeServer {
    /// Waits for successors on `listener` (bound with [`UpgradeListener::bind`], typically
    /// before the server starts, so that a bad path fails early) on a thread of its own. Each
    /// step of an exchange waits at most `timeout`.
    pub fn start(
        listener: UpgradeListener,
        server: ReleaseHandle,
        timeout: Duration,
    ) -> Result<UpgradeServer, HandoverError> {
        let path = listener.path().to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let handed_over = Arc::new(AtomicBool::new(false));
        let outcome = Arc::new(Mutex::new(None));
        let (s, h, o) = (stop.clone(), handed_over.clone(), outcome.clone());
        let thread = std::thread::Builder::new()
            .name("corelocal-upgrade".into())
            .spawn(move || serve_upgrades(listener, server, timeout, s, h, o))
            .map_err(|source| HandoverError::Io {
                context: "starting the upgrade thread".into(),
                source,
            })?;
        Ok(UpgradeServer {
            path,
            stop,
            handed_over,
            outcome,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the sockets were handed over (the server is stopping already).
    pub fn handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Acquire)
    }

    /// Stops waiting for successors (an exchange in progress, and a move of connections and
    /// state that followed it, finish first, each step bounded by its timeout) and removes the
    /// socket file; says whether the sockets were handed over and how the move went.
    pub fn shutdown(mut self) -> Handover {
        self.stop_and_join();
        let outcome = self.outcome.lock().expect("upgrade outcome lock").take();
        match outcome {
            Some(Ok(report)) => Handover::Moved(report),
            Some(Err(failure)) => Handover::Failed(failure),
            None if self.handed_over() => Handover::Moved(MoveReport::default()),
            None => Handover::Kept,
        }
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for UpgradeServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn serve_upgrades(
    listener: UpgradeListener,
    server: ReleaseHandle,
    timeout: Duration,
    stop: Arc<AtomicBool>,
    handed_over: Arc<AtomicBool>,
    outcome: Arc<Mutex<Option<Result<MoveReport, MoveFailure>>>>,
) {
    while !stop.load(Ordering::Acquire) && !server.is_released() {
        let channel = match listener.accept(ACCEPT_POLL, timeout) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                crate::log_line!(
                    "corelocal: upgrade socket {}: {e}",
                    listener.path().display()
                );
                std::thread::sleep(ERROR_BACKOFF);
                continue;
            }
        };
        let Some(pid) = trusted_peer(&channel) else {
            continue;
        };
        crate::log_line!("corelocal: upgrade: pid {pid} asks for the listening sockets");
        match transfer::hand_over(&channel, server.listeners()) {
            Ok(()) => {
                let moved = finish(listener, &channel, &server, pid);
                *outcome.lock().expect("upgrade outcome lock") = Some(moved);
                handed_over.store(true, Ordering::Release);
                return;
            }
            Err(e) => {
                crate::log_line!("corelocal: upgrade by pid {pid} failed, still serving: {e}")
            }
        }
    }
}

/// Only a process of the same user (or root) may take the sockets; the 0600 socket file
/// already keeps others out, this also holds when the file's directory is shared.
fn trusted_peer(channel: &Channel) -> Option<i32> {
    let me = scm::effective_uid();
    match channel.peer() {
        Ok(p) if p.uid == me || p.uid == 0 => Some(p.pid),
        Ok(p) => {
            crate::log_line!(
                "corelocal: upgrade: refused pid {} (uid {}; this server runs as uid {me})",
                p.pid,
                p.uid
            );
            let _ = channel.send(&Message::Abort(format!(
                "uid {} may not take over a server of uid {me}",
                p.uid
            )));
            None
        }
        Err(e) => {
            crate::log_line!("corelocal: upgrade: SO_PEERCRED: {e}");
            None
        }
    }
}

/// The successor serves: stop accepting now, give up the path (so the successor can listen
/// there itself), tell it so, then move the connections (between requests) and the state.
/// A failure leaves the outbox filling: the caller resumes serving ([`resume`]).
fn finish(
    listener: UpgradeListener,
    channel: &Channel,
    server: &ReleaseHandle,
    pid: i32,
) -> Result<MoveReport, MoveFailure> {
    server.release_moving();
    drop(listener);
    let successor = successor_pidfd(channel);
    if let Err(error) = channel.send(&Message::Done) {
        crate::log_line!("corelocal: upgrade: telling pid {pid} we are done: {error}");
        return Err(MoveFailure {
            error,
            held: Vec::new(),
            lost: 0,
            successor,
        });
    }
    crate::log_line!(
        "corelocal: upgrade: listening sockets handed to pid {pid}; moving connections"
    );
    let moved = send_moving(channel, server.outbox());
    match &moved {
        Ok(report) => crate::log_line!("corelocal: upgrade: moved to pid {pid}: {report}"),
        Err(f) => crate::log_line!("corelocal: upgrade: moving to pid {pid} failed: {f}"),
    }
    moved
}

/// While the old process waits for requests in progress to finish, it sends an empty
/// [`Message::Conns`] this often, so the successor's bounded receive does not time out.
const MOVING_KEEPALIVE: Duration = Duration::from_millis(500);
/// How often a long move prints its progress.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes of service state per [`Message::State`].
const STATE_CHUNK_BYTES: usize = MESSAGE_BYTES_MAX - 64;
/// How long the new process waits for a worker to take a connection before queuing it anyway.
const TAKE_WAIT: Duration = Duration::from_secs(1);

/// What a move of connections and state carried (see [`send_moving`], [`receive_moving`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MoveReport {
    /// Connections moved.
    pub conns: u64,
    /// Bytes of service state moved.
    pub state_bytes: u64,
    /// The service's word on its state (items exported, or imported, or why not).
    pub summary: String,
    /// From the first message to the last.
    pub elapsed: Duration,
}

impl std::fmt::Display for MoveReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} connections and {} bytes of state in {} ms ({})",
            self.conns,
            self.state_bytes,
            self.elapsed.as_millis(),
            self.summary
        )
    }
}

/// A move of connections and state that broke off (the successor died, or stopped answering
/// within the timeout). The connections still this process's are in `held`, and whatever the
/// stopping workers still put in the outbox.
#[derive(Debug)]
pub struct MoveFailure {
    /// What broke the move.
    pub error: HandoverError,
    /// Connections taken from the outbox and not sent, and — when the successor imports
    /// state ([`Outbox::keeps_sent`]) — those sent, which it cannot have read yet.
    pub held: Vec<MovedConn>,
    /// Connections that went with the successor (it may have read from them, or this process
    /// could not keep them: `Held::sent_max`).
    pub lost: u64,
    /// The successor's process (a pidfd taken while the move began, so the number cannot
    /// have been reused), which [`resume`] stops.
    pub successor: Option<OwnedFd>,
}

impl std::fmt::Display for MoveFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}; {} connections taken back, {} lost with it",
            self.error,
            self.held.len(),
            self.lost
        )
    }
}

/// Descriptors a move leaves to everything but kept connections: the outbox's
/// ([`super::handoff::OUTBOX_LEN_MAX`]) and the listeners', files' and rings' (the rest).
const KEPT_FDS_RESERVE: usize = super::handoff::OUTBOX_LEN_MAX + 1024;

/// The connections of a move this process still holds (see [`MoveFailure::held`]).
struct Held {
    /// Taken from the outbox, their message not sent.
    unsent: Vec<MovedConn>,
    /// Sent, kept open here until the end of the move (`None`: closed once sent).
    sent: Option<Vec<MovedConn>>,
    /// At most this many are kept (each is an ordinary descriptor, under RLIMIT_NOFILE: the
    /// io_uring backend holds many more connections than that as direct descriptors). Sent
    /// beyond it, a connection closes here as a service without state's does: it goes with a
    /// successor that fails (and is counted in [`MoveFailure::lost`]).
    sent_max: usize,
}

impl Held {
    fn new(keeps_sent: bool) -> Held {
        let soft = crate::sys::process::nofile_limit().map_or(1 << 16, |(soft, _)| soft);
        let soft = usize::try_from(soft).unwrap_or(usize::MAX);
        Held::with_max(keeps_sent, soft.saturating_sub(KEPT_FDS_RESERVE))
    }

    fn with_max(keeps_sent: bool, sent_max: usize) -> Held {
        Held {
            unsent: Vec::new(),
            sent: keeps_sent.then(Vec::new),
            sent_max,
        }
    }

    /// Where the connections of a message that was just sent go: kept while there is room
    /// (`None`: they close).
    fn keep_sent(&mut self, count: usize) -> Option<&mut Vec<MovedConn>> {
        let max = self.sent_max;
        self.sent.as_mut().filter(|kept| kept.len() + count <= max)
    }
}

/// The old process's side, once it stopped with its outbox enabled
/// ([`ReleaseHandle::release_moving`], or [`super::Server::stop_moving`]): sends every
/// connection its workers detach, as they come, then — once every worker exited and nothing
/// can write any more — the service's state, then the end. On an error the outbox stays on
/// and the connections this process still holds come back in the [`MoveFailure`]: the
/// caller serves on ([`resume`]), or gives them up ([`close_moving`]).
///
/// A successor that imports state keeps its gate closed until the end of the move (see
/// [`receive_moving`]): nothing reads the connections it received before then. For such a
/// service ([`Outbox::keeps_sent`]) this process keeps each sent connection open, with its
/// bytes and state, until the end, so a successor that dies on the way loses none of them
/// (up to RLIMIT_NOFILE less a reserve: `Held::sent_max`).
pub fn send_moving(channel: &Channel, outbox: &Outbox) -> Result<MoveReport, MoveFailure> {
    let mut report = MoveReport::default();
    let successor = successor_pidfd(channel);
    let mut held = Held::new(outbox.keeps_sent());
    let result = send_moving_inner(channel, outbox, &mut report, &mut held);
    match result {
        Ok(()) => Ok(report),
        Err(error) => {
            let mut back = held.sent.unwrap_or_default();
            let lost = report.conns - back.len() as u64;
            back.append(&mut held.unsent);
            Err(MoveFailure {
                error,
                held: back,
                lost,
                successor,
            })
        }
    }
}

/// Gives up what a failed move left ([`MoveFailure`]): the stopping workers close their
/// connections again, as a stop without a successor does, and those already detached close.
pub fn close_moving(outbox: &Outbox, failure: MoveFailure) {
    outbox.disable();
    drop(failure.held);
    while !outbox.take(usize::MAX, Duration::ZERO).1 {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn send_moving_inner(
    channel: &Channel,
    outbox: &Outbox,
    report: &mut MoveReport,
    held: &mut Held,
) -> Result<(), HandoverError> {
    let started = Instant::now();
    channel.send(&Message::Moving)?;
    let mut last_sent = Instant::now();
    let mut progress = Progress::new(started);
    loop {
        progress.tick(report);
        let (batch, over) = outbox.take(SOCKETS_PER_MESSAGE, MOVING_KEEPALIVE / 5);
        if !batch.is_empty() {
            report.conns += send_conns(channel, batch, held)?;
            last_sent = Instant::now();
        } else if last_sent.elapsed() >= MOVING_KEEPALIVE {
            channel.send(&Message::Conns(Vec::new()))?;
            last_sent = Instant::now();
        }
        if over {
            break;
        }
    }
    report.summary = match outbox.export_state() {
        None => "no state to move".into(),
        Some(mut export) => {
            let mut chunk = Vec::with_capacity(STATE_CHUNK_BYTES);
            loop {
                chunk.clear();
                let more = export
                    .next_chunk(&mut chunk, STATE_CHUNK_BYTES)
                    .map_err(|e| HandoverError::Protocol(format!("exporting state: {e}")))?;
                for part in chunk.chunks(STATE_CHUNK_BYTES) {
                    channel.send(&Message::State(part.to_vec()))?;
                    report.state_bytes += part.len() as u64;
                }
                progress.tick(report);
                if !more {
                    break;
                }
            }
            export.summary()
        }
    };
    channel.send(&Message::End {
        conns: report.conns,
        summary: report.summary.clone(),
    })?;
    report.elapsed = started.elapsed();
    Ok(())
}

/// A successor failed mid-move ([`MoveFailure`]): this process serves on, and nothing is left
/// half-moved. Starts fresh workers for `service` on the same listening sockets (the
/// service's state never left this process), takes the group's steering back (SYNs reach
/// these sockets again), and gives the new workers the connections the move did not send:
/// the failure's, then each one the old workers still detach, until they exit. Connections
/// sent before the failure went with the successor. A successor that is still there (it
/// stopped answering rather than died) is killed first: it may have started serving, and
/// exactly one process may serve the connections and hold the state. Returns the new server
/// and how the old one stopped; on an error what is left closes, as a stop without a
/// successor does.
pub fn resume<S: Service>(
    old: Server,
    config: ServerConfig,
    service: Arc<S>,
    failure: MoveFailure,
) -> Result<(Server, ShutdownReport), ServerError> {
    if let Some(pidfd) = &failure.successor {
        stop_successor(pidfd);
    }
    let group = old.listeners().clone();
    let mut config = config;
    config.gated = true;
    let new = match Server::start_on_group(config, service, group.clone()) {
        Ok(s) => s,
        Err(e) => {
            close_moving(old.outbox(), failure);
            return Err(e);
        }
    };
    // No state to import: the new workers serve at once and take the moved ones as they come.
    new.open_gate();
    if let Err(e) = group.end_stop() {
        crate::log_line!("corelocal: upgrade: taking the steering back: {e}");
    }
    for conn in failure.held {
        new.take_conn(conn, TAKE_WAIT);
    }
    loop {
        let (batch, over) = old.outbox().take(SOCKETS_PER_MESSAGE, MOVING_KEEPALIVE / 5);
        for conn in batch {
            new.take_conn(conn, TAKE_WAIT);
        }
        if over {
            break;
        }
    }
    new.finish_taking();
    let (_, report) = old.join_report();
    Ok((new, report))
}

/// How long [`stop_successor`] waits for the killed successor to be gone (its descriptors
/// closed), so its copies of the connections taken back cannot be read any more.
const SUCCESSOR_EXIT_WAIT: Duration = Duration::from_secs(2);

/// The process at the other end of `channel`, as a pidfd (`None` if it is gone already).
fn successor_pidfd(channel: &Channel) -> Option<OwnedFd> {
    let pid = channel.peer().ok()?.pid;
    crate::sys::pidfd::pidfd_open(u32::try_from(pid).ok()?).ok()
}

/// Kills a successor whose move failed (SIGKILL) and waits, bounded, for it to be gone.
fn stop_successor(pidfd: &OwnedFd) {
    if crate::sys::pidfd::has_exited(pidfd) {
        return;
    }
    if let Err(e) = crate::sys::pidfd::pidfd_send_signal(pidfd, libc::SIGKILL) {
        crate::log_line!("corelocal: upgrade: stopping the failed successor: {e}");
        return;
    }
    let until = Instant::now() + SUCCESSOR_EXIT_WAIT;
    while !crate::sys::pidfd::has_exited(pidfd) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    crate::log_line!("corelocal: upgrade: the failed successor was still running: stopped it");
}

/// A progress line at most every [`PROGRESS_INTERVAL`] while a move runs long.
struct Progress {
    started: Instant,
    next: Instant,
}

impl Progress {
    fn new(started: Instant) -> Progress {
        Progress {
            started,
            next: started + PROGRESS_INTERVAL,
        }
    }

    fn tick(&mut self, report: &MoveReport) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + PROGRESS_INTERVAL;
        crate::log_line!(
            "corelocal: upgrade: moving, {:.1} s: {} connections, {:.1} MiB of state so far",
            now.duration_since(self.started).as_secs_f64(),
            report.conns,
            report.state_bytes as f64 / (1 << 20) as f64
        );
    }
}

/// Sends `conns` in as few messages as fit (at most [`SOCKETS_PER_MESSAGE`] descriptors and
/// [`MESSAGE_BYTES_MAX`] bytes each); a connection whose bytes do not fit goes last in its
/// message, the rest of its bytes in [`Message::ConnInput`] messages right after. Their
/// descriptors close here once sent (or wait in `held.sent`); on an error the connections
/// not sent go to `held.unsent`.
fn send_conns(
    channel: &Channel,
    conns: Vec<MovedConn>,
    held: &mut Held,
) -> Result<u64, HandoverError> {
    let mut conns = conns.into_iter();
    let sent = send_conns_from(channel, &mut conns, held);
    held.unsent.extend(conns);
    sent
}

fn send_conns_from(
    channel: &Channel,
    conns: &mut std::vec::IntoIter<MovedConn>,
    held: &mut Held,
) -> Result<u64, HandoverError> {
    let budget = MESSAGE_BYTES_MAX - MESSAGE_HEADER_BYTES;
    let mut batch = ConnBatch::default();
    let mut used = 0;
    let mut sent = 0;
    for mut conn in conns {
        if conn.state.len() > CONN_STATE_BYTES_MAX {
            crate::log_line!(
                "corelocal: upgrade: a connection's state is {} bytes (max {CONN_STATE_BYTES_MAX}); it moves without",
                conn.state.len()
            );
            conn.state.clear();
        }
        let whole = CONN_ENTRY_HEADER_BYTES + conn.state.len() + conn.input.len();
        if used + whole > budget && !batch.entries.is_empty() {
            sent += batch.flush(channel, Vec::new(), held)?;
            used = 0;
        }
        let room = budget - used - CONN_ENTRY_HEADER_BYTES - conn.state.len();
        let rest = if conn.input.len() > room {
            conn.input.split_off(room)
        } else {
            Vec::new()
        };
        used += batch.push(conn, rest.len());
        if !rest.is_empty() || batch.entries.len() == SOCKETS_PER_MESSAGE {
            sent += batch.flush(channel, rest, held)?;
            used = 0;
        }
    }
    if !batch.entries.is_empty() {
        sent += batch.flush(channel, Vec::new(), held)?;
    }
    Ok(sent)
}

/// One [`Message::Conns`] being filled: the entries and their connections, in order.
#[derive(Default)]
struct ConnBatch {
    entries: Vec<ConnEntry>,
    conns: Vec<MovedConn>,
}

impl ConnBatch {
    /// Adds `conn` (its bytes and state go into the entry; `rest_len` more bytes follow in
    /// [`Message::ConnInput`]); returns the entry's encoded length.
    fn push(&mut self, mut conn: MovedConn, rest_len: usize) -> usize {
        let input = std::mem::take(&mut conn.input);
        let entry = ConnEntry {
            cpu: conn.cpu,
            state: std::mem::take(&mut conn.state),
            input_len: (input.len() + rest_len) as u32,
            input,
        };
        let len = entry.encoded_len();
        self.entries.push(entry);
        self.conns.push(conn);
        len
    }

    /// Sends the message and `rest` (the last connection's bytes that did not fit). If the
    /// message itself could not be sent, its connections go back whole to `held.unsent`; once
    /// sent, whole to `held.sent` when kept, else they close.
    fn flush(
        &mut self,
        channel: &Channel,
        rest: Vec<u8>,
        held: &mut Held,
    ) -> Result<u64, HandoverError> {
        let raw: Vec<RawFd> = self.conns.iter().map(|c| c.fd.as_raw_fd()).collect();
        let message = Message::Conns(std::mem::take(&mut self.entries));
        let sent = channel.send_with(&message, &raw);
        let n = self.conns.len() as u64;
        let keep = match &sent {
            Err(_) => Some(&mut held.unsent),
            Ok(()) => held.keep_sent(self.conns.len()),
        };
        match keep {
            Some(into) => self.restore_into(message, &rest, into),
            None => self.conns.clear(), // Sent: this process's descriptors close.
        }
        sent?;
        for part in rest.chunks(MESSAGE_BYTES_MAX - MESSAGE_HEADER_BYTES) {
            channel.send(&Message::ConnInput(part.to_vec()))?;
        }
        Ok(n)
    }

    /// Puts the batch's connections, whole again (bytes, state), into `into`.
    fn restore_into(&mut self, message: Message, rest: &[u8], into: &mut Vec<MovedConn>) {
        let Message::Conns(entries) = message else {
            unreachable!("built as Conns")
        };
        for (entry, mut conn) in entries.into_iter().zip(self.conns.drain(..)) {
            conn.input = entry.input;
            conn.state = entry.state;
            into.push(conn);
        }
        if let Some(last) = into.last_mut() {
            last.input.extend_from_slice(rest);
        }
    }
}

/// The new process's side, on a server started behind its gate ([`super::ServerConfig::gated`]):
/// hands every connection received to a worker as it comes and feeds the state stream to the
/// service's importer, until the end. The caller opens the gate afterwards, whatever the
/// result (an error leaves what came so far: connections taken, state imported whole or not
/// at all as the service decides).
pub fn receive_moving(channel: &Channel, server: &Server) -> Result<MoveReport, HandoverError> {
    let started = Instant::now();
    match channel.recv()? {
        Message::Moving => {}
        other => {
            return Err(HandoverError::Protocol(format!(
                "expected the move to start, got {other:?}"
            )))
        }
    }
    let mut report = MoveReport::default();
    let mut import = StateIntake::new(server.import_state());
    let mut cut: Option<(MovedConn, usize)> = None;
    loop {
        let (message, fds) = channel.recv_with(SOCKETS_PER_MESSAGE)?;
        if let Some((mut conn, missing)) = cut.take() {
            let Message::ConnInput(bytes) = message else {
                return Err(HandoverError::Protocol(format!(
                    "{missing} bytes of a connection missing, got {message:?}"
                )));
            };
            if bytes.len() > missing {
                return Err(HandoverError::Protocol(
                    "more connection bytes than announced".into(),
                ));
            }
            conn.input.extend_from_slice(&bytes);
            match missing - bytes.len() {
                0 => server.take_conn(conn, TAKE_WAIT),
                left => cut = Some((conn, left)),
            }
            continue;
        }
        match message {
            Message::Conns(entries) => {
                if entries.len() != fds.len() {
                    return Err(HandoverError::Protocol(format!(
                        "{} connections announced, {} descriptors attached",
                        entries.len(),
                        fds.len()
                    )));
                }
                for (entry, fd) in entries.into_iter().zip(fds) {
                    report.conns += 1;
                    let missing = entry.input_len as usize - entry.input.len();
                    let conn = MovedConn {
                        fd,
                        input: entry.input,
                        state: entry.state,
                        cpu: entry.cpu,
                    };
                    if missing > 0 {
                        cut = Some((conn, missing));
                    } else {
                        server.take_conn(conn, TAKE_WAIT);
                    }
                }
            }
            Message::State(bytes) => {
                report.state_bytes += bytes.len() as u64;
                import.chunk(&bytes);
            }
            Message::End { conns, summary } => {
                if conns != report.conns {
                    crate::log_line!(
                        "corelocal: upgrade: {conns} connections announced, {} received",
                        report.conns
                    );
                }
                report.summary = format!("exported: {summary}; imported: {}", import.finish());
                report.elapsed = started.elapsed();
                return Ok(report);
            }
            other => {
                return Err(HandoverError::Protocol(format!(
                    "unexpected {other:?} while moving"
                )))
            }
        }
    }
}

/// The service's importer, stopped at its first error (the rest of the stream is skipped).
struct StateIntake {
    import: Option<Box<dyn StateImport>>,
    error: Option<StateError>,
}

impl StateIntake {
    fn new(import: Option<Box<dyn StateImport>>) -> StateIntake {
        StateIntake {
            import,
            error: None,
        }
    }

    fn chunk(&mut self, data: &[u8]) {
        let Some(import) = self.import.as_mut() else {
            return;
        };
        if let Err(e) = import.chunk(data) {
            self.error = Some(e);
            self.import = None;
        }
    }

    fn finish(self) -> String {
        match (self.import, self.error) {
            (_, Some(e)) => format!("failed: {e}"),
            (Some(import), None) => import.finish().unwrap_or_else(|e| e.to_string()),
            (None, None) => "nothing (this service keeps no state)".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conns(n: usize) -> Vec<MovedConn> {
        (0..n)
            .map(|_| MovedConn {
                fd: std::fs::File::open("/dev/null").unwrap().into(),
                input: Vec::new(),
                state: Vec::new(),
                cpu: 0,
            })
            .collect()
    }

    /// Sent connections are kept (a service that imports state) only while their descriptors
    /// fit: a move of more connections than RLIMIT_NOFILE allows must go on, the rest closing
    /// as they are sent (before this bound, every descriptor past the limit failed its move).
    #[test]
    fn kept_connections_stay_under_the_descriptor_bound() {
        let mut held = Held::with_max(true, 100);
        for _ in 0..3 {
            let batch = conns(40);
            match held.keep_sent(batch.len()) {
                Some(kept) => kept.extend(batch),
                None => drop(batch),
            }
        }
        assert_eq!(held.sent.as_ref().map(Vec::len), Some(80));
        let mut stateless = Held::with_max(false, 100);
        assert!(stateless.keep_sent(1).is_none());
        let limit = crate::sys::process::nofile_limit().unwrap().0 as usize;
        assert!(
            Held::new(true).sent_max < limit,
            "room left for everything else"
        );
    }
}
