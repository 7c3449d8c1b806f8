//! Binary upgrades: `--takeover` (start on a running server's sockets, or join its reuseport
//! group and signal it) and `--upgrade-socket` (hand this server's sockets to a successor).

use super::common::{CommonArgs, Takeover};
use super::config::start_error;
use corelocal::listen::transfer::{self, Successor, UpgradeListener};
use corelocal::listen::{ActiveSteering, Steering};
use corelocal::procfs;
use corelocal::runtime::upgrade::{
    receive_moving, send_moving, MoveFailure, MoveReport, UpgradeServer,
};
use corelocal::runtime::{Server, ServerConfig, Service};
use corelocal::sys::pidfd;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// The running server a `--takeover PID` replaces, checked before this process binds anything:
/// it exists and listens on every address this one serves, so a stale PID file or a typo is
/// refused while the old server's group is still untouched. Held as a pidfd, so the SIGTERM
/// can never reach a later process that reused the number.
pub(super) struct OldServer {
    pid: i32,
    pidfd: OwnedFd,
}

impl OldServer {
    /// Checks `--takeover PID` (nothing to check for the socket form).
    pub(super) fn check(common: &CommonArgs) -> Result<Option<OldServer>, String> {
        let Some(Takeover::Pid(pid)) = common.takeover else {
            return Ok(None);
        };
        let pidfd = pidfd::pidfd_open(pid as u32).map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => format!(
                "--takeover {pid}: no process {pid} is running (a stale PID file?); give the \
                 PID of the running server, or its --upgrade-socket path"
            ),
            _ => format!("--takeover {pid}: pidfd_open: {e}"),
        })?;
        for addr in &common.listen {
            if !listens_on(pid, *addr)? {
                return Err(format!(
                    "--takeover {pid}: process {pid} ({}) does not listen on {addr}; give the \
                     PID of the server that does (`ss -ltnp sport = :{}`)",
                    comm(pid),
                    addr.port()
                ));
            }
        }
        Ok(Some(OldServer { pid, pidfd }))
    }
}

/// Whether process `pid` holds a TCP listening socket on `addr`'s port (its `/proc/PID/fd`
/// links against the LISTEN rows of `/proc/net/tcp` and `tcp6`).
fn listens_on(pid: i32, addr: SocketAddr) -> Result<bool, String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = procfs::read_text(std::path::Path::new(table)) {
            inodes.extend(
                procfs::parse_tcp_listeners(&text)
                    .into_iter()
                    .filter(|&(port, _)| port == addr.port())
                    .map(|(_, inode)| format!("socket:[{inode}]")),
            );
        }
    }
    let dir = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        format!("--takeover {pid}: reading {dir}: {e} (run as the server's user or root)")
    })?;
    Ok(entries.flatten().any(|entry| {
        std::fs::read_link(entry.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    }))
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Binds and starts the server, or with `--takeover SOCKET` receives the running server's
/// sockets and starts on them; then the old server is waiting for this one's answer.
pub(super) fn start_server<S: Service>(
    common: &CommonArgs,
    config: &ServerConfig,
    service: Arc<S>,
) -> Result<(Server, Option<Successor>), String> {
    let Some(Takeover::Socket(path)) = &common.takeover else {
        return Server::start(config.clone(), service)
            .map(|s| (s, None))
            .map_err(|e| start_error(&e, common));
    };
    let context = |e: &dyn std::fmt::Display| format!("--takeover {}: {e}", path.display());
    let incoming = transfer::request(path, common.takeover_timeout).map_err(|e| context(&e))?;
    let (pid, sockets) = (incoming.peer().pid, incoming.layout().socket_count());
    let (group, successor) = incoming
        .adopt(config.listen.clone())
        .map_err(|e| context(&e))?;
    match Server::start_with_listeners(config.clone(), service, group) {
        Ok(server) => {
            corelocal::log_line!(
                "corelocal serve: received {sockets} listening sockets from pid {pid}"
            );
            Ok((server, Some(successor)))
        }
        Err(e) => {
            successor.abort(&e.to_string());
            Err(context(&e))
        }
    }
}

/// The server runs: finish the takeover. PID: this server's listeners joined the old group and
/// its eBPF program steers the group's SYNs now; SIGTERM the old server so it drains and
/// exits. SOCKET: tell the old server this one serves; it stops accepting and exits.
pub(super) fn take_over(
    server: &Server,
    successor: Option<Successor>,
    old: Option<OldServer>,
    timeout: std::time::Duration,
) -> Result<(), String> {
    if let Some(successor) = successor {
        // Serving already: a missing "done" is worth a warning, not a stop.
        match successor.ready() {
            Ok(channel) => {
                corelocal::log_line!(
                    "corelocal serve: took over the listening sockets; taking the connections"
                );
                take_moving(server, &channel);
            }
            Err(e) => {
                corelocal::log_line!(
                    "corelocal serve: --takeover: the old server did not confirm: {e}"
                );
                server.finish_taking();
            }
        }
        return Ok(());
    }
    let Some(old) = old else {
        server.finish_taking();
        return Ok(());
    };
    if server.steering() != ActiveSteering::Local(Steering::Ebpf) {
        return Err(format!(
            "--takeover PID needs --mode local with eBPF steering (this server has {}): only a \
             program attached by the new process moves the group's SYNs to it (--takeover \
             SOCKET works in every mode)",
            server.steering()
        ));
    }
    // This server's program steers the group's SYNs now: from here on it keeps serving
    // whatever happens, since exiting would leave the port to listeners that get no SYNs.
    // Its connections come over this socket: the old server connects to it when the SIGTERM
    // comes from this process.
    let moving = match UpgradeListener::bind(&moving_socket(std::process::id() as i32)) {
        Ok(l) => Some(l),
        Err(e) => {
            corelocal::log_line!(
                "corelocal serve: --takeover: no socket for the old server's connections: {e}"
            );
            None
        }
    };
    match pidfd::pidfd_send_signal(&old.pidfd, libc::SIGTERM) {
        Ok(()) => corelocal::log_line!(
            "corelocal serve: took over from pid {} (SIGTERM sent; it drains and exits)",
            old.pid
        ),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => corelocal::log_line!(
            "corelocal serve: took over from pid {} (it had exited already)",
            old.pid
        ),
        Err(e) => corelocal::log_line!(
            "corelocal serve: took over the port, but signalling pid {} failed: {e}; it gets \
             no new connections and keeps its open ones: stop it yourself",
            old.pid
        ),
    }
    let offered = moving.map(|l| wait_for_offer(&l, &old, timeout));
    match offered {
        Some(Ok(Some(channel))) if channel.peer().is_ok_and(|p| p.pid == old.pid) => {
            take_moving(server, &channel)
        }
        Some(Ok(Some(_))) => {
            corelocal::log_line!(
                "corelocal serve: --takeover: a process other than pid {} offered connections; \
                 ignored",
                old.pid
            );
            server.finish_taking();
        }
        Some(Ok(None)) => {
            corelocal::log_line!(
                "corelocal serve: --takeover: pid {} did not offer its connections (an older \
                 corelocal?); it closed them between requests itself",
                old.pid
            );
            server.finish_taking();
        }
        Some(Err(e)) => {
            corelocal::log_line!(
                "corelocal serve: --takeover: waiting for the old server's connections: {e}"
            );
            server.finish_taking();
        }
        None => server.finish_taking(),
    }
    Ok(())
}

/// How often the wait for the old server's offer looks whether it exited meanwhile.
const OFFER_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Waits for the old server to connect and offer its connections: until it does, or it exits
/// without (a build that does not move connections drains and exits), or `timeout` passes.
/// A connection made just before its exit is still taken (one last look after the exit).
fn wait_for_offer(
    listener: &UpgradeListener,
    old: &OldServer,
    timeout: std::time::Duration,
) -> std::io::Result<Option<corelocal::listen::transfer::Channel>> {
    let until = std::time::Instant::now() + timeout;
    loop {
        if let Some(channel) = listener.accept(OFFER_POLL, timeout)? {
            return Ok(Some(channel));
        }
        if pidfd::has_exited(&old.pidfd) {
            return listener.accept(std::time::Duration::ZERO, timeout);
        }
        if std::time::Instant::now() >= until {
            return Ok(None);
        }
    }
}

/// Where a `--takeover PID` successor waits for the old server's connections: an abstract
/// unix socket named after the successor's pid, which the old server learns from its SIGTERM.
pub(super) fn moving_socket(successor_pid: i32) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("@corelocal-takeover-{successor_pid}"))
}

/// Takes the old server's connections and state, then lets the workers serve (whatever
/// happened: the connections taken so far are served, and the state is whole or absent). A
/// service with no state serves new connections at once, taking moved ones as they come.
fn take_moving(server: &Server, channel: &corelocal::listen::transfer::Channel) {
    if server.import_state().is_none() {
        server.open_gate();
    }
    match receive_moving(channel, server) {
        Ok(report) => corelocal::log_line!("corelocal serve: --takeover: took {report}"),
        Err(e) => corelocal::log_line!(
            "corelocal serve: --takeover: taking the connections stopped after {}: {e}",
            server.taken_conns()
        ),
    }
    server.finish_taking();
}

/// The old server, stopped by a SIGTERM from `sender`: when the sender is a `--takeover PID`
/// successor (it listens on [`moving_socket`]), the workers move their connections there
/// instead of closing them, then the state follows. `None` when there is no such successor
/// (stop as usual); a failed move comes back for the caller to serve on.
pub(super) fn move_to_successor(
    server: &Server,
    sender: i32,
    timeout: std::time::Duration,
) -> Option<Result<MoveReport, MoveFailure>> {
    if sender <= 1 {
        return None;
    }
    // A plain SIGTERM (kill, systemd): no successor waits.
    let fd = corelocal::sys::scm::connect_seqpacket(&moving_socket(sender)).ok()?;
    let channel = match corelocal::listen::transfer::Channel::new(fd, timeout) {
        Ok(c) => c,
        Err(e) => {
            corelocal::log_line!("corelocal serve: successor pid {sender}: {e}");
            return None;
        }
    };
    let me = corelocal::sys::scm::effective_uid();
    if !channel
        .peer()
        .is_ok_and(|p| p.pid == sender && (p.uid == me || p.uid == 0))
    {
        corelocal::log_line!("corelocal serve: pid {sender} is not a successor of this server's user; stopping as usual");
        return None;
    }
    server.stop_moving();
    let moved = send_moving(&channel, server.outbox());
    match &moved {
        Ok(report) => corelocal::log_line!("corelocal serve: moved to pid {sender}: {report}"),
        Err(failure) => {
            corelocal::log_line!("corelocal serve: moving to pid {sender} failed: {failure}")
        }
    }
    Some(moved)
}

/// `--upgrade-socket` is bound before the server starts (a live socket there fails early),
/// except when it is the path this process takes over from: the old server gives that path
/// up only at the end of the handover.
pub(super) fn bind_upgrade_early(common: &CommonArgs) -> Result<Option<UpgradeListener>, String> {
    let Some(path) = &common.upgrade_socket else {
        return Ok(None);
    };
    if common.takeover == Some(Takeover::Socket(path.clone())) {
        return Ok(None);
    }
    UpgradeListener::bind(path)
        .map(Some)
        .map_err(|e| format!("--upgrade-socket: {e}"))
}

/// Starts waiting for a successor. Binding late (after taking over from the same path) can
/// only fail if something else grabbed the path meanwhile: this server keeps serving, without
/// an upgrade socket, rather than drop what it took over.
pub(super) fn start_upgrade_socket(
    common: &CommonArgs,
    server: &Server,
    early: Option<UpgradeListener>,
) -> Option<UpgradeServer> {
    let path = common.upgrade_socket.as_ref()?;
    let listener = match early.map_or_else(|| UpgradeListener::bind(path), Ok) {
        Ok(l) => l,
        Err(e) => {
            corelocal::log_line!("corelocal serve: --upgrade-socket: {e}; serving without it");
            return None;
        }
    };
    match UpgradeServer::start(listener, server.release_handle(), common.takeover_timeout) {
        Ok(u) => {
            corelocal::log_line!("corelocal serve: upgrade socket {}", path.display());
            Some(u)
        }
        Err(e) => {
            corelocal::log_line!("corelocal serve: --upgrade-socket: {e}; serving without it");
            None
        }
    }
}
