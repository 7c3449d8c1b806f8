//! Per-app launch: [`run`] gives each app its default address, turns its arguments into its
//! service's config and serves it.

use super::args::{App, Command, HttpArgs, KvArgs, TlsArgs, UdpPort};
use super::common::CommonArgs;
use super::daemon::{self, Detached};
use super::{fail, grace, pidfile, serve, serve_with};
use crate::check;
use corelocal::runtime::Service;
use corelocal::sys::signal;
use corelocal_apps::http::{AccessLog, HttpConfig, HttpService};
use corelocal_apps::kv::udp::{self, UdpLimits, UdpSockets};
use corelocal_apps::kv::{KvConfig, KvService, Protocol, Report, ShutdownHook};
use corelocal_apps::rpc::{RpcConfig, RpcService};
use corelocal_apps::sockperf::{SockperfConfig, SockperfService};
use corelocal_apps::tls::{CertFiles, TlsConfig, TlsHandle, TlsService};
use corelocal_proto::memcache;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// kv's default --input-limit: the longest multiget key list (a get line is the only request
/// kept whole in the input; storage data streams into the item) is one byte less, and above
/// memcached's own test's 128 KiB.
const KV_INPUT_LIMIT_DEFAULT: u64 = memcache::GET_LINE_BYTES_MAX_DEFAULT as u64 + 1;

/// Runs `corelocal serve`: with `--daemon`, in a process of its own once this one forked
/// (first thing: the process has one thread only until the app starts).
pub fn run(mut cmd: Command) -> ExitCode {
    match daemon::detach(&mut cmd.app) {
        Ok(Detached::Launcher(code)) => return code,
        Ok(Detached::Server) => {}
        Err(e) => return fail(&e),
    }
    let code = run_app(cmd);
    pidfile::remove_at_exit();
    code
}

fn run_app(cmd: Command) -> ExitCode {
    // Before the app is built (the built-in site takes a while): a SIGTERM during start-up then
    // waits and stops the server once it serves, instead of killing it half-started.
    if let Err(e) = corelocal::sys::signal::block_termination_signals() {
        return fail(&format!("blocking signals: {e}"));
    }
    match cmd.app {
        App::Http(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:8080");
            let access_log = match args.access_log.as_str() {
                "off" => AccessLog::Off,
                "stderr" => AccessLog::Stderr,
                path => AccessLog::File(PathBuf::from(path)),
            };
            if let Err(e) = check_http(&args, &access_log) {
                return fail(&e);
            }
            let config = HttpConfig {
                root: args.root.clone(),
                cache_bytes_max: args.cache_mb.saturating_mul(1 << 20),
                access_log,
                header_timeout_ms: u64::try_from(args.header_timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
                ..HttpConfig::default()
            };
            let service = match HttpService::new(config) {
                Ok(service) => Arc::new(service),
                Err(e) => return fail(&format!("http: {e}")),
            };
            if args.tls.tls_cert.is_empty() {
                return serve(&args.common, service);
            }
            let alpn = vec![b"http/1.1".to_vec()];
            match tls_service(&args.tls, &mut args.common, service, alpn, "http") {
                Ok(tls) => serve(&args.common, Arc::new(tls)),
                Err(e) => fail(&format!("http: {e}")),
            }
        }
        App::Kv(args) => run_kv(args),
        App::Rpc(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:7000");
            let config = RpcConfig {
                request_bytes: args.req_size as usize,
                response_bytes: args.resp_size as usize,
                one_shot: args.one_shot,
            };
            match RpcService::new(config) {
                Ok(service) => serve(&args.common, Arc::new(service)),
                Err(e) => fail(&e),
            }
        }
        App::Sockperf(mut args) => {
            default_listen(&mut args.common, "127.0.0.1:11111");
            let config = SockperfConfig {
                max_message_bytes: args.msg_size_max as usize,
            };
            match SockperfService::new(config) {
                Ok(service) => serve(&args.common, Arc::new(service)),
                Err(e) => fail(&format!("sockperf: {e}")),
            }
        }
    }
}

/// `serve kv`: TCP through the runtime ([`serve_with`]) unless `--no-tcp`, UDP alongside with
/// `--udp-port` (stopped once the TCP server has stopped).
fn run_kv(mut args: KvArgs) -> ExitCode {
    default_listen(&mut args.common, "127.0.0.1:11211");
    let input_limit = *args
        .common
        .input_limit
        .get_or_insert(KV_INPUT_LIMIT_DEFAULT);
    // One byte under the runtime's limit, so that kv sees an over-long multiget (and
    // answers it) before the runtime closes the connection silently.
    let get_line_bytes_max =
        usize::try_from(input_limit.saturating_sub(1).max(1)).unwrap_or(usize::MAX);
    // Before kv_config: --tls-listen addresses join the listening ones it reports.
    let tls = match kv_tls(&mut args, input_limit) {
        Ok(t) => t,
        Err(e) => return fail(&format!("kv: {e}")),
    };
    let mut config = match kv_config(&mut args, get_line_bytes_max) {
        Ok(c) => c,
        Err(e) => return fail(&format!("kv: {e}")),
    };
    config.tls = tls.as_ref().map(|(_, handle)| handle.clone());
    let udp = match bind_udp(&args) {
        Ok(u) => u,
        Err(e) => return fail(&format!("kv: {e}")),
    };
    if let Some(sockets) = &udp {
        config.report.udp_port = sockets.port();
        config.report.udp = sockets.addrs();
    }
    if args.no_tcp {
        config.report.listen.clear();
        config.report.tcp_port = 0;
    }
    if config.protocol == Protocol::Binary {
        corelocal::log_line!(
            "corelocal serve kv: --protocol binary: the binary protocol is not spoken here; \
             every connection is closed at its first byte"
        );
    }
    let service = match KvService::new(config) {
        Ok(s) => s,
        Err(e) => return fail(&format!("kv: {e}")),
    };
    if let Err(e) = restore(&args, &service).and_then(|()| grace::on_sigusr1()) {
        return fail(&format!("kv: {e}"));
    }
    let saver = service.clone();
    let udp_bound = udp.as_ref().map(UdpSockets::bound).unwrap_or_default();
    let limits = UdpLimits::for_items(args.item_max);
    let udp_server = match udp.map(|s| udp::serve(&service, s, limits)).transpose() {
        Ok(s) => s,
        Err(e) => return fail(&format!("kv: starting UDP: {e}")),
    };
    let port_file = args.port_file.clone();
    let code = if args.no_tcp {
        serve_without_tcp(&args.common, port_file.as_deref(), &udp_bound)
    } else {
        let shared = service.clone();
        let on_listen = move |addrs: &[SocketAddr]| {
            shared.set_listening(addrs);
            if let Some(path) = &port_file {
                write_port_file(path, addrs, &udp_bound);
            }
        };
        match tls {
            None => serve_with(&args.common, Arc::new(service.clone()), on_listen),
            Some((config, handle)) => {
                match wrap_tls(Arc::new(service.clone()), config, handle, "kv") {
                    Ok(tls) => serve_with(&args.common, Arc::new(tls), on_listen),
                    Err(e) => fail(&format!("kv: {e}")),
                }
            }
        }
    };
    if let Some(server) = udp_server {
        let t = server.stop();
        corelocal::log_line!(
            "corelocal serve kv: UDP stopped | requests {} | dropped {} | datagrams sent {} | \
             send errors {}",
            t.requests,
            t.dropped,
            t.sent,
            t.send_errors
        );
    }
    save(&saver, code)
}

/// `serve kv --tls-cert`: the TLS configuration (no ALPN: memcached offers none), its
/// decrypted input bounded as the runtime bounds plain input (`input_limit`), and memcached's
/// `ssl_*` lines for `stats settings`; SIGHUP reloads the certificates.
fn kv_tls(args: &mut KvArgs, input_limit: u64) -> Result<Option<(TlsConfig, TlsHandle)>, String> {
    let tls = &args.tls;
    if tls.tls_cert.is_empty() {
        return Ok(None);
    }
    if args.no_tcp {
        return Err("--tls-cert with --no-tcp: TLS is for TCP connections only".into());
    }
    let mut config = tls_config(tls, &mut args.common, Vec::new())?;
    config.plain_bytes_max = usize::try_from(input_limit).unwrap_or(usize::MAX);
    // Loaded now: a bad file stops the start before anything listens, and kv's
    // `refresh_certs` reloads these.
    let handle = TlsHandle::load(&config)?;
    Ok(Some((config, handle)))
}

/// Whether these flags let the kernel make records (`--tls-ktls auto` and no record size of
/// our own): memcached's `ssl_kernel_tls` setting.
fn ktls_asked(tls: &TlsArgs) -> bool {
    tls.tls_ktls == "auto" && tls.tls_record_bytes.is_none()
}

/// memcached's `ssl_*` rows of `stats settings` for these TLS flags (memcached 1.6.18's names
/// and forms).
fn tls_settings(tls: &TlsArgs) -> Vec<(String, String)> {
    if tls.tls_cert.is_empty() {
        return Vec::new();
    }
    let path = |p: Option<&PathBuf>| p.map_or("NULL".into(), |p| p.display().to_string());
    let resumes = tls.tls_session_cache > 0 || !tls.tls_no_tickets;
    // memcached's SSL_VERIFY_* levels: 0 none, 1 peer (optional), 2 peer and required.
    let verify_mode = match (&tls.tls_client_ca, tls.tls_client_cert_optional) {
        (None, _) => "0",
        (Some(_), true) => "1",
        (Some(_), false) => "2",
    };
    let rows = [
        ("ssl_enabled", "yes".to_string()),
        ("ssl_chain_cert", path(tls.tls_cert.first())),
        ("ssl_key", path(tls.tls_key.first())),
        ("ssl_verify_mode", verify_mode.into()),
        ("ssl_keyformat", "1".into()),
        (
            "ssl_ciphers",
            tls.tls_ciphers.clone().unwrap_or_else(|| "NULL".into()),
        ),
        ("ssl_ca_cert", path(tls.tls_client_ca.as_ref())),
        (
            "ssl_wbuf_size",
            tls.tls_record_bytes.unwrap_or(16 << 10).to_string(),
        ),
        (
            "ssl_session_cache",
            if resumes { "yes" } else { "no" }.into(),
        ),
        (
            "ssl_kernel_tls",
            if ktls_asked(tls) { "yes" } else { "no" }.into(),
        ),
        ("ssl_min_version", format!("tlsv{}", tls.tls_min_version)),
    ];
    rows.into_iter().map(|(n, v)| (n.to_string(), v)).collect()
}

/// `--memory-file` at start: loads the cache saved there (not at a takeover, which brings the
/// running server's newer one). `Err`: do not start.
fn restore(args: &KvArgs, service: &KvService) -> Result<(), String> {
    if args.common.takeover.is_some() && args.memory_file.is_some() {
        corelocal::log_line!(
            "corelocal serve kv: --memory-file not read: a takeover brings the running \
             server's cache"
        );
        return Ok(());
    }
    match service.restore_memory_file() {
        None => Ok(()),
        Some(Ok(told)) => {
            corelocal::log_line!("corelocal serve kv: --memory-file: {told}");
            Ok(())
        }
        Some(Err(e)) => Err(format!("--memory-file: {e}")),
    }
}

/// `--memory-file` at the stop (every worker and UDP thread has stopped): saves the cache if
/// the stop was graceful; a failed save makes the exit code a failure.
fn save(service: &KvService, code: ExitCode) -> ExitCode {
    if !grace::graceful() {
        if service.config().memory_file.is_some() {
            corelocal::log_line!(
                "corelocal serve kv: --memory-file: not saved (only a graceful stop saves, as \
                 memcached: SIGUSR1 or `shutdown graceful`)"
            );
        }
        return code;
    }
    match service.save_memory_file() {
        None => code,
        Some(Ok(told)) => {
            corelocal::log_line!("corelocal serve kv: --memory-file: {told}");
            code
        }
        Some(Err(e)) => {
            corelocal::log_line!("corelocal serve kv: --memory-file: not saved: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The UDP sockets `--udp-port` asks for: one per worker CPU on each `--listen` address's IP.
fn bind_udp(args: &KvArgs) -> Result<Option<UdpSockets>, String> {
    let common = &args.common;
    if args.no_tcp && (common.takeover.is_some() || common.upgrade_socket.is_some()) {
        return Err(
            "--no-tcp has no listening sockets to hand over: drop --takeover/--upgrade-socket"
                .into(),
        );
    }
    let port = match args.udp_port {
        UdpPort::Off => return Ok(None),
        UdpPort::Port(p) => p,
        UdpPort::Any => 0,
    };
    if args.auth_file.is_some() {
        // memcached's refusal: a datagram cannot carry the authentication exchange.
        return Err(
            "--udp-port with --auth-file: UDP cannot be used with ASCII authentication \
             (memcached refuses it too); drop --udp-port or give --udp-port 0"
                .into(),
        );
    }
    let mut ips: Vec<std::net::IpAddr> = Vec::new();
    for a in &common.listen {
        if !ips.contains(&a.ip()) {
            ips.push(a.ip());
        }
    }
    let cpus: Vec<usize> = match &common.cpus {
        Some(set) => set.iter().collect(),
        None => corelocal::cpu::current_affinity()
            .map(|set| set.iter().collect())
            .unwrap_or_else(|_| vec![0]),
    };
    // A successor shares the port with the server it takes over from.
    let shared = common.takeover.is_some();
    UdpSockets::bind(&ips, port, &cpus, shared)
        .map(Some)
        .map_err(|e| format!("--udp-port {port}: {e}; give another port or `any`"))
}

/// `--no-tcp`: UDP only (or nothing, as memcached with `-p 0 -U 0`) until SIGINT/SIGTERM.
fn serve_without_tcp(
    common: &CommonArgs,
    port_file: Option<&std::path::Path>,
    udp: &[SocketAddr],
) -> ExitCode {
    if let Some(path) = port_file {
        write_port_file(path, &[], udp);
    }
    if let Err(e) = pidfile::prepare(common).and_then(|()| pidfile::commit()) {
        return fail(&e);
    }
    let what = if udp.is_empty() {
        "nothing (--no-tcp without --udp-port)".to_string()
    } else {
        let addrs: Vec<String> = udp.iter().map(|a| format!("udp {a}")).collect();
        addrs.join(", ")
    };
    corelocal::log_line!("corelocal serve kv: listening on {what} | no TCP (--no-tcp)");
    daemon::ready();
    loop {
        if let Some(signal) = corelocal::sys::signal::wait_termination(Duration::from_secs(1)) {
            corelocal::log_line!("corelocal serve kv: signal {signal}, stopping");
            return ExitCode::SUCCESS;
        }
    }
}

/// memcached's port file (`MEMCACHED_PORT_FILENAME`): a `TCP INET: PORT` line per TCP
/// address, then a `UDP INET: PORT` line per UDP address (INET6 for IPv6), written to
/// `PATH.lck` and renamed into place, so that a reader never sees half of it. A failure is
/// reported and the server goes on.
fn write_port_file(path: &std::path::Path, tcp: &[SocketAddr], udp: &[SocketAddr]) {
    let text = port_file_text(tcp, udp);
    let mut aside = path.as_os_str().to_owned();
    aside.push(".lck");
    let written = std::fs::write(&aside, text).and_then(|()| std::fs::rename(&aside, path));
    if let Err(e) = written {
        corelocal::log_line!(
            "corelocal serve kv: --port-file {}: {e}; serving on",
            path.display()
        );
    }
}

fn port_file_text(tcp: &[SocketAddr], udp: &[SocketAddr]) -> String {
    let mut text = String::new();
    let mut seen: Vec<(&str, SocketAddr)> = Vec::new();
    for (proto, addrs) in [("TCP", tcp), ("UDP", udp)] {
        for a in addrs {
            // Per-CPU sockets share their address: one line each.
            if seen.contains(&(proto, *a)) {
                continue;
            }
            seen.push((proto, *a));
            let family = if a.is_ipv6() { "INET6" } else { "INET" };
            text.push_str(&format!("{proto} {family}: {}\n", a.port()));
        }
    }
    text
}

/// `--tls-cert`: `inner` wrapped in TLS on the --tls-listen addresses (appended after the
/// plain ones), or on every --listen address without them; `alpn`: the protocols offered,
/// `app` names the server in what SIGHUP logs.
fn tls_service<S: Service>(
    tls: &TlsArgs,
    common: &mut CommonArgs,
    inner: Arc<S>,
    alpn: Vec<Vec<u8>>,
    app: &'static str,
) -> Result<TlsService<S>, String> {
    let config = tls_config(tls, common, alpn)?;
    let handle = TlsHandle::load(&config)?;
    wrap_tls(inner, config, handle, app)
}

/// `inner` in TLS as `config` says, with the certificates `handle` loaded; SIGHUP reloads
/// them.
fn wrap_tls<S: Service>(
    inner: Arc<S>,
    config: TlsConfig,
    handle: TlsHandle,
    app: &'static str,
) -> Result<TlsService<S>, String> {
    let service = TlsService::with_handle(inner, config, handle)?;
    eprintln!("tls: rustls (ring); {}", service.record_path());
    reload_on_sighup(service.handle(), app)?;
    Ok(service)
}

/// The TLS flags as a [`TlsConfig`]; --tls-listen addresses join `common.listen`.
fn tls_config(
    tls: &TlsArgs,
    common: &mut CommonArgs,
    alpn: Vec<Vec<u8>>,
) -> Result<TlsConfig, String> {
    if tls.tls_cert.len() != tls.tls_key.len() {
        return Err(format!(
            "{} --tls-cert but {} --tls-key: give one key per certificate, in the same order",
            tls.tls_cert.len(),
            tls.tls_key.len()
        ));
    }
    let plain = common.listen.len();
    let listeners = if tls.tls_listen.is_empty() {
        (0..plain).collect()
    } else {
        common.listen.extend(tls.tls_listen.iter().copied());
        (plain..plain + tls.tls_listen.len()).collect()
    };
    let certs = tls
        .tls_cert
        .iter()
        .zip(&tls.tls_key)
        .map(|(chain, key)| CertFiles {
            chain: chain.clone(),
            key: key.clone(),
        })
        .collect();
    Ok(TlsConfig {
        certs,
        listeners,
        alpn,
        handshake_bytes_max: tls.tls_handshake_bytes_max as usize,
        handshake_timeout: tls.tls_handshake_timeout,
        session_cache_entries_max: tls.tls_session_cache,
        tickets: !tls.tls_no_tickets,
        ticket_period: tls.tls_ticket_period,
        tls12: tls.tls_min_version == "1.2",
        record_bytes_max: tls.tls_record_bytes.map(|n| n as usize),
        client_ca: tls.tls_client_ca.clone(),
        client_cert_required: !tls.tls_client_cert_optional,
        ktls: tls.tls_ktls == "auto",
        tls12_suites: match &tls.tls_ciphers {
            Some(list) => Some(
                corelocal_apps::tls::ciphers::tls12_suites(list)
                    .map_err(|e| format!("--tls-ciphers: {e}"))?,
            ),
            None => None,
        },
        ..TlsConfig::default()
    })
}

/// How often the SIGHUP flag is looked at (the signal handler may only set a flag).
const SIGHUP_POLL: Duration = Duration::from_millis(100);

/// SIGHUP reads the certificate and key files again (new handshakes use them; connections
/// keep theirs; a broken file keeps the old ones and says why), from a thread that sleeps
/// between looks at the flag.
fn reload_on_sighup(certs: TlsHandle, app: &'static str) -> Result<(), String> {
    signal::flag_on(&[libc::SIGHUP]).map_err(|e| format!("handling SIGHUP: {e}"))?;
    std::thread::Builder::new()
        .name("tls-sighup".into())
        .spawn(move || loop {
            std::thread::sleep(SIGHUP_POLL);
            if !signal::take_raised(libc::SIGHUP) {
                continue;
            }
            match certs.reload() {
                Ok(n) => corelocal::log_line!("corelocal serve {app}: SIGHUP: {n} certificates reloaded"),
                Err(e) => corelocal::log_line!(
                    "corelocal serve {app}: SIGHUP: reload failed, the certificates in force stay: {e}"
                ),
            }
        })
        .map(drop)
        .map_err(|e| format!("starting the SIGHUP thread: {e}"))
}

/// Checks `serve http`'s own flags before anything starts.
fn check_http(args: &HttpArgs, access_log: &AccessLog) -> Result<(), String> {
    if let Some(root) = &args.root {
        check::existing_dir(
            "--root",
            root,
            "give the directory holding the files to serve, or leave --root out to serve the \
             built-in site",
        )?;
    }
    if let AccessLog::File(path) = access_log {
        check::output_file("--access-log", path, "access.log")
            .map_err(|e| format!("{e} (or --access-log off or stderr)"))?;
    }
    check::positive("--header-timeout", args.header_timeout, "10s")
}

/// kv's idle timeout when none is given: memcached closes no idle connection unless told to
/// (`-o idle_timeout`), and cache clients keep pooled connections idle for long.
const KV_IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30 * 24 * 3600);

/// The kv service's configuration from its arguments (and what it reports of the common
/// ones, as memcached's `stats settings`).
fn kv_config(args: &mut KvArgs, get_line_bytes_max: usize) -> Result<KvConfig, String> {
    let common = &mut args.common;
    let idle_timeout_secs = match common.idle_timeout {
        Some(given) => given.as_secs().max(1),
        None => {
            common.idle_timeout = Some(KV_IDLE_TIMEOUT_DEFAULT);
            0
        }
    };
    let threads = common
        .cpus
        .as_ref()
        .map(|c| c.len())
        .or_else(|| corelocal::cpu::current_affinity().ok().map(|c| c.len()))
        .unwrap_or(1)
        * usize::from(common.workers_per_cpu);
    let auth = match &args.auth_file {
        None => Vec::new(),
        Some(path) => {
            let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            corelocal_apps::kv::parse_auth_file(&text)
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
    };
    let delimiter = match args.detail_delimiter {
        None => None,
        Some(c) if c.is_ascii() && c != ' ' => Some(c as u8),
        Some(c) => {
            return Err(format!(
                "--detail-delimiter {c:?}: one ASCII byte, not a space"
            ))
        }
    };
    let first = common.listen.first();
    let report = Report {
        threads: u32::try_from(threads).unwrap_or(u32::MAX),
        max_connections: common.conns_per_worker.saturating_mul(threads as u64),
        tcp_port: first.map_or(0, |a| a.port()),
        interface: first.map(|a| a.ip().to_string()),
        backlog: common.backlog,
        idle_timeout_secs,
        listen: common.listen.clone(),
        reqs_per_event: args.reqs_per_event,
        tls: tls_settings(&args.tls),
        ..Report::default()
    };
    let shutdown = ShutdownHook(Arc::new(|graceful| {
        // Our SIGTERM is already graceful: requests in progress finish (--drain-timeout);
        // `shutdown graceful` is memcached's graceful stop, which saves the cache (-e).
        if graceful {
            grace::stop_gracefully();
        } else if let Err(e) = corelocal::sys::signal::terminate(std::process::id() as i32) {
            corelocal::log_line!("corelocal serve kv: shutdown: {e}");
        }
    }));
    Ok(KvConfig {
        memory_bytes_max: args.memory_mb << 20,
        item_bytes_max: args.item_max,
        limits: memcache::Limits {
            get_line_bytes_max,
            ..memcache::Limits::default()
        },
        flush_enabled: !args.disable_flush_all,
        cas_enabled: !args.disable_cas,
        report,
        prefix_delimiter: delimiter.unwrap_or(b':'),
        detail: delimiter.is_some(),
        dump_enabled: !args.disable_dumping,
        lru_crawler: !args.no_lru_crawler,
        track_sizes: args.track_sizes,
        debug_time: args.debug_time,
        evictions: !args.disable_evictions,
        shutdown_enabled: args.enable_shutdown,
        shutdown: Some(shutdown),
        conn_limit: args.max_conns,
        auth,
        protocol: args.protocol,
        memory_file: args.memory_file.clone(),
        watch_enabled: !args.disable_watch,
        watcher_buf_bytes: args.watcher_buf_bytes as usize,
        ..KvConfig::default()
    })
}

fn default_listen(common: &mut CommonArgs, addr: &str) {
    if common.listen.is_empty() {
        common.listen.push(addr.parse().expect("static address"));
    }
}

#[cfg(test)]
mod port_file_tests {
    use super::port_file_text;

    #[test]
    fn lines_as_memcached_writes_them() {
        let tcp = [
            "127.0.0.1:11211".parse().unwrap(),
            "127.0.0.1:11211".parse().unwrap(),
        ];
        let udp = [
            "127.0.0.1:11222".parse().unwrap(),
            "[::1]:11222".parse().unwrap(),
        ];
        assert_eq!(
            port_file_text(&tcp, &udp),
            "TCP INET: 11211\nUDP INET: 11222\nUDP INET6: 11222\n"
        );
        assert_eq!(port_file_text(&[], &[]), "");
    }
}
