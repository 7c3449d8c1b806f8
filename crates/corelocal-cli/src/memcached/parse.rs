//! memcached 1.6.18's options, each applied as memcached applies it ([`parse`]), then the
//! checks memcached makes once all are read and the `serve kv` arguments they come to.

use super::getopt::{self, Given, Token};
use super::{extended, help, tls, Outcome, Plan, Refusal, EX_OSERR, EX_USAGE};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

/// memcached's defaults (memcached.c `settings_init`).
const PORT_DEFAULT: i64 = 11211;
const MEMORY_MB_DEFAULT: u64 = 64;
const ITEM_BYTES_DEFAULT: u64 = 1 << 20;
const CONNS_DEFAULT: u64 = 1024;
/// memcached's bounds on -I (`ITEM_SIZE_MAX_LOWER_LIMIT`, `..._UPPER_LIMIT`).
const ITEM_BYTES_MIN: u64 = 1024;
const ITEM_BYTES_MAX: u64 = 1 << 30;
/// serve kv's bounds on --memory-mb.
const MEMORY_MB_MAX: u64 = 1 << 20;

/// What the process itself brings besides its arguments.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// Invoked as `memcached-debug` (memcached's debug build, which its test suite runs):
    /// `debugtime` is accepted.
    pub debug_build: bool,
    /// `MEMCACHED_PORT_FILENAME`: memcached writes its bound ports there.
    pub port_file: Option<String>,
}

/// The command line read so far.
#[derive(Debug)]
pub(super) struct Settings {
    port: i64,
    tcp_specified: bool,
    udp_port: i64,
    udp_specified: bool,
    /// `-l` entries (memcached joins repeated `-l` with commas).
    listen: Vec<String>,
    memory_mb: u64,
    memory_given: bool,
    item_bytes: u64,
    item_given: bool,
    conns: u64,
    /// `serve kv` switches without a value (`--disable-cas`, ...), in the order given.
    switches: Vec<&'static str>,
    /// `serve kv` options with a value, in the order given (a later one replaces an earlier).
    valued: Vec<(&'static str, String)>,
    protocol: Option<String>,
    auth: bool,
    daemon: bool,
    verbose: u32,
    pub(super) crawler: bool,
    pub(super) track_sizes: bool,
    pub(super) idle_timeout_secs: u64,
    pub(super) watcher_buf_bytes: Option<u64>,
    /// `-Z` and `-o ssl_*`.
    pub(super) tls: tls::TlsOptions,
    notes: Vec<String>,
    noted: Vec<String>,
    passthrough: Vec<String>,
}

impl Settings {
    fn new() -> Settings {
        Settings {
            port: PORT_DEFAULT,
            tcp_specified: false,
            udp_port: 0,
            udp_specified: false,
            listen: Vec::new(),
            memory_mb: MEMORY_MB_DEFAULT,
            memory_given: false,
            item_bytes: ITEM_BYTES_DEFAULT,
            item_given: false,
            conns: CONNS_DEFAULT,
            switches: Vec::new(),
            valued: Vec::new(),
            protocol: None,
            auth: false,
            daemon: false,
            verbose: 0,
            crawler: true,
            track_sizes: false,
            idle_timeout_secs: 0,
            watcher_buf_bytes: None,
            tls: tls::TlsOptions::default(),
            notes: Vec::new(),
            noted: Vec::new(),
            passthrough: Vec::new(),
        }
    }

    /// Says once (per `key`) that an option has no effect here, and why.
    pub(super) fn note(&mut self, key: &str, text: String) {
        if !self.noted.iter().any(|k| k == key) {
            self.noted.push(key.to_string());
            self.notes.push(text);
        }
    }

    fn switch(&mut self, flag: &'static str) {
        if !self.switches.contains(&flag) {
            self.switches.push(flag);
        }
    }

    fn set(&mut self, flag: &'static str, value: String) {
        self.valued.retain(|(f, _)| *f != flag);
        self.valued.push((flag, value));
    }
}

/// memcached's command line `args` (without the program name): what to serve, what to print,
/// or memcached's refusal.
pub fn parse(args: &[String], env: &Env) -> Outcome {
    match read(args, env) {
        Ok(outcome) => outcome,
        Err(refusal) => Outcome::Refuse(refusal),
    }
}

fn read(args: &[String], env: &Env) -> Result<Outcome, Refusal> {
    let mut s = Settings::new();
    let mut next = 0;
    while next < args.len() {
        match getopt::token(args, &mut next) {
            Token::End => {
                s.passthrough = args[next..].to_vec();
                break;
            }
            Token::Operand(word) => s.note(
                &format!("operand {word}"),
                format!("{word:?} is not an option: ignored, as memcached ignores it"),
            ),
            Token::Options(options) => {
                for given in options {
                    if let Some(done) = apply(&mut s, given?)? {
                        return Ok(done);
                    }
                }
            }
        }
    }
    finish(s, env).map(Outcome::Serve)
}

/// Applies one option; `Some` for the ones memcached answers and exits on (-h, -V, -i).
fn apply(s: &mut Settings, g: Given) -> Result<Option<Outcome>, Refusal> {
    let value = g.value.clone().unwrap_or_default();
    match g.letter {
        'h' => return Ok(Some(Outcome::Print(help::usage()))),
        'V' => return Ok(Some(Outcome::Print(help::version()))),
        'i' => return Ok(Some(Outcome::Print(help::license()))),
        'p' => (s.port, s.tcp_specified) = (port(&g)?, true),
        'U' => (s.udp_port, s.udp_specified) = (port(&g)?, true),
        'l' => s.listen.extend(value.split([',', ';']).map(str::to_string)),
        'm' => (s.memory_mb, s.memory_given) = (whole(&g)?, true),
        'I' => (s.item_bytes, s.item_given) = (item_size(&g)?, true),
        'c' => s.conns = positive(&g, "Maximum connections must be greater than 0")?,
        'R' => {
            let n = positive(&g, "Number of requests per event must be greater than 0")?;
            s.set("--reqs-per-event", n.to_string());
        }
        'b' => s.set("--backlog", backlog(&g)?.to_string()),
        'B' => s.protocol = Some(protocol(&value)?),
        'D' => s.set("--detail-delimiter", delimiter(&value)?),
        'Y' => {
            s.auth = true;
            s.set("--auth-file", value);
        }
        'e' => s.set("--memory-file", value),
        'P' => s.set("--pid-file", value),
        'd' => s.daemon = true,
        'M' => s.switch("--disable-evictions"),
        'A' => s.switch("--enable-shutdown"),
        'F' => s.switch("--disable-flush-all"),
        'C' => s.switch("--disable-cas"),
        'X' => s.switch("--disable-dumping"),
        'W' => s.switch("--disable-watch"),
        'Z' => s.tls.enabled = true,
        'o' => extended::apply(s, &value)?,
        'v' => s.verbose = s.verbose.saturating_add(verbosity(&g)?),
        _ => no_effect(s, &g)?,
    }
    Ok(None)
}

/// The options accepted with no effect (validated as memcached does first), and the ones
/// refused.
fn no_effect(s: &mut Settings, g: &Given) -> Result<(), Refusal> {
    let key = g.letter.to_string();
    let value = g.value.as_deref().unwrap_or_default();
    let why = match g.letter {
        't' => {
            positive(g, "Number of threads must be greater than 0")?;
            "one worker runs on each CPU the process may use (`-- --cpus LIST` picks them)"
        }
        'u' => "the user is the service's (systemd User=/DynamicUser=); no switch is made here",
        'r' => "the core file limit is left as it is (systemd LimitCORE=, ulimit -c)",
        'L' => "items are not kept in large pages here",
        'k' => "memory is not locked here (memcached too goes on, with a warning, when it cannot)",
        'a' => "there is no unix socket to apply the mask to",
        'f' => {
            let factor: f64 = value.parse().unwrap_or(0.0);
            if factor <= 1.0 {
                return Err(Refusal::new(1, "Factor must be greater than 1".into()));
            }
            "items are allocated to their size, not in slab classes"
        }
        'n' => {
            positive(g, "Chunk size must be greater than 0")?;
            "items are allocated to their size, not in slab classes"
        }
        'N' => {
            positive(g, "Maximum number of NAPI IDs must be greater than 0")?;
            "each connection is served on the CPU that took its SYN already"
        }
        's' => {
            return Err(refused(
                g,
                "unix-domain sockets are not served (TCP and UDP only)",
            ))
        }
        'S' => {
            return Err(refused(
                g,
                "This server is not built with SASL support (ASCII authentication: -Y FILE)",
            ))
        }
        other => return Err(Refusal::new(1, format!("Illegal argument \"{other}\""))),
    };
    let shown = match &g.value {
        Some(v) => format!("{} {v}", g.spelled),
        None => g.spelled.clone(),
    };
    s.note(&key, format!("{shown}: no effect: {why}"));
    Ok(())
}

/// memcached's exit for an option this build lacks: EX_USAGE.
pub(super) fn refused(g: &Given, why: &str) -> Refusal {
    Refusal::new(
        EX_USAGE,
        format!("{}: not supported by corelocal memcached: {why}", g.spelled),
    )
}

fn verbosity(g: &Given) -> Result<u32, Refusal> {
    match &g.value {
        None => Ok(1),
        Some(v) => v
            .parse::<u32>()
            .map_err(|_| usage(format!("{}={v}: a verbosity level, e.g. 2", g.spelled))),
    }
}

fn usage(message: String) -> Refusal {
    Refusal::new(EX_USAGE, message)
}

/// A port: 1 to 65535, 0 (none) or -1 (one the kernel picks), as memcached takes them.
fn port(g: &Given) -> Result<i64, Refusal> {
    let v = g.value.as_deref().unwrap_or_default();
    match v.parse::<i64>() {
        Ok(p) if (-1..=65_535).contains(&p) => Ok(p),
        _ => Err(usage(format!(
            "{} {v}: not a port (1 to 65535, 0 for none, -1 for one the kernel picks)",
            g.spelled
        ))),
    }
}

fn whole(g: &Given) -> Result<u64, Refusal> {
    let v = g.value.as_deref().unwrap_or_default();
    v.parse::<u64>()
        .map_err(|_| usage(format!("{} {v}: not a whole number", g.spelled)))
}

/// A number above 0, else memcached's `message` and its exit 1.
fn positive(g: &Given, message: &str) -> Result<u64, Refusal> {
    match g.value.as_deref().unwrap_or_default().parse::<i64>() {
        Ok(n) if n > 0 => Ok(n as u64),
        _ => Err(Refusal::new(1, message.to_string())),
    }
}

fn backlog(g: &Given) -> Result<u32, Refusal> {
    let v = g.value.as_deref().unwrap_or_default();
    match v.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(usage(format!(
            "{} {v}: the listen backlog is 1 or more (memcached: 1024)",
            g.spelled
        ))),
    }
}

/// -I: bytes, or with a k or m suffix (memcached.c reads exactly these).
fn item_size(g: &Given) -> Result<u64, Refusal> {
    let v = g.value.as_deref().unwrap_or_default();
    let (digits, unit) = match v.char_indices().last() {
        Some((at, 'k' | 'K')) => (&v[..at], 1 << 10),
        Some((at, 'm' | 'M')) => (&v[..at], 1 << 20),
        _ => (v, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| {
            usage(format!(
                "{} {v}: an item size in bytes, or with k or m (e.g. 1m; 1k to 1024m)",
                g.spelled
            ))
        })
}

/// -B: memcached's words and its refusal.
fn protocol(value: &str) -> Result<String, Refusal> {
    match value {
        "ascii" | "auto" | "binary" => Ok(value.to_string()),
        _ => Err(usage(format!(
            "Invalid value for binding protocol: {value}\n -- should be one of auto, binary, or ascii"
        ))),
    }
}

/// -D: memcached takes the first character.
fn delimiter(value: &str) -> Result<String, Refusal> {
    match value.chars().next() {
        Some(c) => Ok(c.to_string()),
        None => Err(Refusal::new(1, "No delimiter specified".into())),
    }
}

/// memcached's checks once every option is read (memcached.c, after the getopt loop), then
/// the `serve kv` arguments.
fn finish(mut s: Settings, env: &Env) -> Result<Plan, Refusal> {
    check_items(&s)?;
    if s.auth {
        match s.protocol.as_deref() {
            None | Some("ascii") => {}
            Some(_) => {
                return Err(usage(
                    "ERROR: You cannot allow the BINARY protocol while using ascii \
                     authentication tokens."
                        .into(),
                ))
            }
        }
        if s.udp_port != 0 {
            return Err(usage(
                "Cannot use UDP with ascii authentication enabled (-U 0 to disable)".into(),
            ));
        }
    }
    // memcached 1.6: -U alone (not 0) puts TCP on the same port.
    if s.udp_specified && s.udp_port != 0 && !s.tcp_specified {
        s.port = s.udp_port;
    }
    if s.verbose > 0 {
        let level = "v".repeat(s.verbose.min(3) as usize);
        s.note(
            "v",
            format!(
                "-{level}: no per-request log here: `watch` (memcached's live log) shows \
                 fetches, mutations and evictions; the server's own messages go to stderr"
            ),
        );
    }
    let tcp = s.port != 0;
    let tls_args = tls::finish(&mut s, tcp)?;
    let mut args = serve_args(&s, env)?;
    args.extend(tls_args);
    Ok(Plan {
        args,
        notes: s.notes,
    })
}

/// -I against memcached's bounds and -m (its words, EX_USAGE).
fn check_items(s: &Settings) -> Result<(), Refusal> {
    if s.item_bytes < ITEM_BYTES_MIN {
        return Err(usage(
            "Item max size cannot be less than 1024 bytes.".into(),
        ));
    }
    if s.item_bytes > s.memory_mb.saturating_mul(1 << 20) / 2 {
        return Err(usage(
            "Cannot set item size limit higher than 1/2 of memory max.".into(),
        ));
    }
    if s.item_bytes > ITEM_BYTES_MAX {
        return Err(usage(
            "Cannot set item size limit higher than a gigabyte.".into(),
        ));
    }
    if s.memory_mb > MEMORY_MB_MAX {
        return Err(usage(format!(
            "-m {}: more than serve kv takes ({MEMORY_MB_MAX} MB)",
            s.memory_mb
        )));
    }
    Ok(())
}

fn serve_args(s: &Settings, env: &Env) -> Result<Vec<String>, Refusal> {
    let mut args = Vec::new();
    let mut push = |flag: &str, value: String| {
        args.push(flag.to_string());
        args.push(value);
    };
    // -p 0: no TCP; the addresses still say where UDP goes. -1: a port the kernel picks.
    let tcp_port = u16::try_from(s.port.max(0)).unwrap_or(0);
    for (flag, addr) in listeners(s, tcp_port)? {
        push(flag, addr.to_string());
    }
    match s.udp_port {
        0 => {}
        -1 => push("--udp-port", "any".into()),
        p => push("--udp-port", p.to_string()),
    }
    if s.memory_given {
        push("--memory-mb", s.memory_mb.to_string());
    }
    if s.item_given {
        push("--item-max", s.item_bytes.to_string());
    }
    push("--max-conns", s.conns.to_string());
    if let Some(p) = &s.protocol {
        push("--protocol", p.clone());
    }
    if s.idle_timeout_secs > 0 {
        push("--idle-timeout", format!("{}s", s.idle_timeout_secs));
    }
    if let Some(bytes) = s.watcher_buf_bytes {
        push("--watcher-buf-bytes", bytes.to_string());
    }
    for (flag, value) in &s.valued {
        push(flag, value.clone());
    }
    if let Some(path) = &env.port_file {
        push("--port-file", path.clone());
    }
    // memcached accepts at once: a silent connection is counted, listed in `stats conns`
    // and, over -c, told `ERROR Too many open connections` right away.
    push("--defer-accept", "0".into());
    // memcached prints no periodic stats; a stop does not wait long for requests in flight.
    push("--stats-interval", "0".into());
    push("--drain-timeout", "1s".into());
    let mut switches: Vec<&str> = s.switches.clone();
    if s.port == 0 {
        switches.push("--no-tcp");
    }
    if !s.crawler {
        switches.push("--no-lru-crawler");
    }
    if s.track_sizes {
        switches.push("--track-sizes");
    }
    if env.debug_build {
        switches.push("--debug-time");
    }
    if s.daemon {
        switches.push("--daemon");
    }
    args.extend(switches.iter().map(|f| f.to_string()));
    args.extend(s.passthrough.iter().cloned());
    Ok(args)
}

/// `--listen` and `--tls-listen` addresses: with `-Z`, the `-l notls:` entries are the plain
/// ones and the others speak TLS (all of them when none is `notls:`).
fn listeners(s: &Settings, port: u16) -> Result<Vec<(&'static str, SocketAddr)>, Refusal> {
    let (plain, secure) = tls::split_listen(&s.listen, s.tls.enabled);
    let tagged = |flag: &'static str, addrs: Vec<SocketAddr>| {
        addrs
            .into_iter()
            .map(move |a| (flag, a))
            .collect::<Vec<_>>()
    };
    if !s.tls.enabled || plain.is_empty() {
        let all = if plain.is_empty() { secure } else { plain };
        return Ok(tagged("--listen", listen_addrs(&all, port)?));
    }
    if secure.is_empty() {
        return Err(usage(
            "-Z with every -l address notls: no listener would speak TLS; drop -Z or an              address's notls: prefix"
                .into(),
        ));
    }
    let mut all = tagged("--listen", listen_addrs(&plain, port)?);
    all.extend(tagged("--tls-listen", listen_addrs(&secure, port)?));
    Ok(all)
}

/// The `-l` entries (memcached's forms: `ADDR`, `ADDR:PORT`, `[V6]:PORT`, a bare IPv6
/// address, `*`, a host name), each resolved; none: all IPv4 interfaces (memcached's
/// INADDR_ANY).
fn listen_addrs(entries: &[String], port: u16) -> Result<Vec<SocketAddr>, Refusal> {
    let mut addrs: Vec<SocketAddr> = Vec::new();
    if entries.is_empty() {
        addrs.push(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    for entry in entries.iter().filter(|e| !e.is_empty()) {
        let (host, port) = split_entry(entry, port)?;
        for addr in resolve(entry, host, port)? {
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
    }
    Ok(addrs)
}

/// memcached.c `server_sockets`: a `[...]` host, then `:PORT` when only one colon is left.
fn split_entry(entry: &str, port: u16) -> Result<(&str, u16), Refusal> {
    let (host, rest) = match entry.strip_prefix('[') {
        Some(inside) => match inside.split_once(']') {
            Some((h, rest)) => (Some(h), rest),
            None => {
                return Err(Refusal::new(
                    1,
                    format!("Invalid IPV6 address: \"{entry}\""),
                ))
            }
        },
        None => (None, entry),
    };
    let (addr, port_text) = match rest.split_once(':') {
        Some((a, p)) if host.is_some() || !p.contains(':') => (a, Some(p)),
        _ => (rest, None),
    };
    let port = match port_text {
        None => port,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| Refusal::new(1, format!("Invalid port number: \"{p}\"")))?,
    };
    Ok((host.unwrap_or(addr), port))
}

fn resolve(entry: &str, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
    if host == "*" || host.is_empty() {
        return Ok(vec![SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port)]);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    // memcached's own words when getaddrinfo fails, and its exit (EX_OSERR).
    let failed = |why: String| {
        Refusal::new(
            EX_OSERR,
            format!("-l {entry}: getaddrinfo(): {why}\nfailed to listen on TCP port {port}"),
        )
    };
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| failed(e.to_string()))?
        .collect();
    if found.is_empty() {
        return Err(failed("no address".into()));
    }
    Ok(found)
}
