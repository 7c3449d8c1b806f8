//! memcached's TLS options: `-Z`/`--enable-ssl`, the `-o ssl_*` suboptions and the `notls:`
//! prefix of `-l`, mapped onto `serve kv --tls-*` (rustls on each worker).
//!
//! Accepted: what `serve kv` does (a certificate chain and its key, TLS 1.2/1.3 as the minimum
//! version, the TLS 1.2 suites from an OpenSSL cipher list in `ssl_ciphers` (rustls's six ECDHE
//! AEAD suites: a list that chooses none of them is refused, as OpenSSL refuses one), resumption with `ssl_session_cache`, the record size from `ssl_wbuf_size`, client
//! certificates checked against `ssl_ca_cert` with `ssl_verify_mode` 1 to 3, the kernel's
//! records with `ssl_kernel_tls` — as memcached, only when asked: `serve kv --tls-ktls auto`,
//! else `off`), and what changes nothing a client could see or rely on (`ssl_ca_cert` while
//! `ssl_verify_mode` is 0, as memcached asks no client for a certificate then). Refused with
//! the option named: what would change who may connect or how and is not done here
//! (a key format other than PEM, a verify mode without a CA) — never accepted
//! silently.

use super::parse::Settings;
use super::{Refusal, EX_USAGE};

/// The TLS options read so far.
#[derive(Debug, Default)]
pub(super) struct TlsOptions {
    /// `-Z`: the TCP listeners speak TLS (but `-l notls:...` ones).
    pub(super) enabled: bool,
    chain_cert: Option<String>,
    key: Option<String>,
    ca_cert: Option<String>,
    /// `ssl_min_version`: 0 to 3 (TLS 1.0 to 1.3); memcached's default is 2.
    min_version: Option<u8>,
    /// `ssl_verify_mode`: 0 (none, the default) to 3.
    verify_mode: u8,
    session_cache: bool,
    /// `ssl_kernel_tls`: the kernel makes the records it can (OpenSSL's `SSL_OP_ENABLE_KTLS`
    /// in memcached), off by default as there.
    kernel_tls: bool,
    wbuf_kib: Option<u64>,
    /// `ssl_ciphers`: an OpenSSL cipher list, for the TLS 1.2 suites (as memcached's
    /// `SSL_CTX_set_cipher_list`).
    ciphers: Option<String>,
    /// Suboptions given, for the note when `-Z` is not.
    given: Vec<String>,
}

/// Applies one `-o ssl_*` suboption.
pub(super) fn apply(s: &mut Settings, name: &str, value: Option<&str>) -> Result<(), Refusal> {
    let tls = &mut s.tls;
    tls.given.push(name.to_string());
    let text = || value.unwrap_or_default().to_string();
    match name {
        "ssl_chain_cert" => tls.chain_cert = Some(text()),
        "ssl_key" => tls.key = Some(text()),
        "ssl_ca_cert" => tls.ca_cert = Some(text()),
        "ssl_session_cache" => tls.session_cache = true,
        "ssl_kernel_tls" => tls.kernel_tls = true,
        "ssl_min_version" => tls.min_version = Some(min_version(value)?),
        "ssl_verify_mode" => tls.verify_mode = verify_mode(value)?,
        "ssl_keyformat" => keyformat(value)?,
        "ssl_wbuf_size" => tls.wbuf_kib = Some(wbuf_kib(value)?),
        "ssl_ciphers" => tls.ciphers = Some(text()),
        _ => return Err(Refusal::new(1, format!("Illegal suboption \"{name}\""))),
    }
    Ok(())
}

fn refused(name: &str, why: &str) -> Refusal {
    Refusal::new(
        EX_USAGE,
        format!("-o {name}: not supported by corelocal memcached: {why}"),
    )
}

/// memcached's `ssl_min_version`: 0 (TLS 1.0) to 3 (TLS 1.3), its message otherwise.
fn min_version(value: Option<&str>) -> Result<u8, Refusal> {
    match value.and_then(|v| v.parse::<u8>().ok()) {
        Some(v @ 0..=3) => Ok(v),
        _ => Err(Refusal::new(
            1,
            "Invalid ssl_min_version. Use help to see valid options.".into(),
        )),
    }
}

/// `ssl_verify_mode`: 0 none, 1 a certificate is asked for and checked if given, 2 it is
/// required, 3 required once (as 2 here: TLS is never renegotiated); memcached's message for
/// another value.
fn verify_mode(value: Option<&str>) -> Result<u8, Refusal> {
    match value.and_then(|v| v.parse::<u8>().ok()) {
        Some(mode @ 0..=3) => Ok(mode),
        _ => Err(Refusal::new(
            1,
            "Invalid ssl_verify_mode. Use help to see valid options.".into(),
        )),
    }
}

/// `ssl_keyformat`: OpenSSL's SSL_FILETYPE_PEM (1) only.
fn keyformat(value: Option<&str>) -> Result<(), Refusal> {
    match value {
        Some("1") => Ok(()),
        _ => Err(refused(
            "ssl_keyformat",
            "keys are read as PEM only (ssl_keyformat=1); convert a DER key with `openssl \
             pkey -inform DER -outform PEM`",
        )),
    }
}

/// `ssl_wbuf_size`: KiB, 1 or more.
fn wbuf_kib(value: Option<&str>) -> Result<u64, Refusal> {
    match value.and_then(|v| v.parse::<u64>().ok()) {
        Some(n) if (1..=64 << 10).contains(&n) => Ok(n),
        _ => Err(Refusal::new(
            1,
            format!(
                "Invalid numeric argument for ssl_wbuf_size: {}",
                value.unwrap_or_default()
            ),
        )),
    }
}

/// memcached's checks at start, then the `serve kv` TLS flags (listeners aside: see
/// [`split_listen`]). Without `-Z`, the `ssl_*` options do nothing, as in memcached.
pub(super) fn finish(s: &mut Settings, tcp: bool) -> Result<Vec<String>, Refusal> {
    if !s.tls.enabled {
        if !s.tls.given.is_empty() {
            let given = s.tls.given.join(", ");
            s.note(
                "o:ssl",
                format!("-o {given}: no effect without -Z, as in memcached"),
            );
        }
        return Ok(Vec::new());
    }
    if !tcp {
        return Err(Refusal::new(
            EX_USAGE,
            "ERROR: You cannot enable SSL without a TCP port.".into(),
        ));
    }
    let tls = &s.tls;
    // memcached's words when a file is missing or unreadable (it loads them at start).
    let chain = readable(
        tls.chain_cert.as_deref(),
        "Error loading the certificate chain",
    )?;
    let key = readable(tls.key.as_deref(), "Error loading the key")?;
    let mut args = vec!["--tls-cert".into(), chain, "--tls-key".into(), key];
    let min = match tls.min_version.unwrap_or(2) {
        3 => "1.3",
        _ => "1.2",
    };
    args.extend(["--tls-min-version".into(), min.into()]);
    if let Some(list) = &tls.ciphers {
        // memcached's words (it exits when OpenSSL takes none of the list), then why.
        corelocal_apps::tls::ciphers::tls12_suites(list).map_err(|why| {
            Refusal::new(
                EX_USAGE,
                format!("Error setting the provided cipher(s): {list}\n{why}"),
            )
        })?;
        args.extend(["--tls-ciphers".into(), list.clone()]);
    }
    if !tls.session_cache {
        // memcached resumes no session unless ssl_session_cache is given.
        args.extend([
            "--tls-session-cache".into(),
            "0".into(),
            "--tls-no-tickets".into(),
        ]);
    }
    if let Some(kib) = tls.wbuf_kib {
        args.extend(["--tls-record-bytes".into(), (kib << 10).to_string()]);
    }
    let ktls = if tls.kernel_tls { "auto" } else { "off" };
    args.extend(["--tls-ktls".into(), ktls.into()]);
    args.extend(client_certs(tls)?);
    notes(s);
    Ok(args)
}

/// `ssl_verify_mode` 1 to 3: client certificates checked against `ssl_ca_cert`, which they
/// need (without it OpenSSL would refuse every certificate; refused here, clearly, instead).
fn client_certs(tls: &TlsOptions) -> Result<Vec<String>, Refusal> {
    if tls.verify_mode == 0 {
        return Ok(Vec::new());
    }
    let Some(ca) = &tls.ca_cert else {
        return Err(refused(
            "ssl_verify_mode",
            "client certificates are checked against -o ssl_ca_cert=FILE: give it",
        ));
    };
    let ca = readable(Some(ca), "Error loading the CA certificate")?;
    let mut args = vec!["--tls-client-ca".into(), ca];
    if tls.verify_mode == 1 {
        args.push("--tls-client-cert-optional".into());
    }
    Ok(args)
}

/// What is accepted with no effect, said once.
fn notes(s: &mut Settings) {
    if s.tls.kernel_tls && s.tls.wbuf_kib.is_some() {
        s.note(
            "o:ssl_kernel_tls",
            "-o ssl_kernel_tls: records stay in user space, as ssl_wbuf_size sets their size \
             (the kernel makes records of its own size)"
                .into(),
        );
    }
    if matches!(s.tls.min_version, Some(0 | 1)) {
        s.note(
            "o:ssl_min_version",
            "-o ssl_min_version: TLS 1.0 and 1.1 are never offered here: the minimum is TLS 1.2"
                .into(),
        );
    }
    if let Some(ca) = s.tls.ca_cert.clone().filter(|_| s.tls.verify_mode == 0) {
        s.note(
            "o:ssl_ca_cert",
            format!(
                "-o ssl_ca_cert={ca}: no effect: with ssl_verify_mode 0 no client is asked \
                 for a certificate (as in memcached)"
            ),
        );
    }
}

fn readable(path: Option<&str>, what: &str) -> Result<String, Refusal> {
    let path = path.ok_or_else(|| Refusal::new(EX_USAGE, format!("{what}: (null)")))?;
    std::fs::File::open(path)
        .map(|_| path.to_string())
        .map_err(|e| Refusal::new(EX_USAGE, format!("{what}: {path} : {e}")))
}

/// memcached's `-l notls:ADDR`: plain listener entries (prefix removed) and TLS ones. Without
/// `-Z` every entry is plain.
pub(super) fn split_listen(entries: &[String], enabled: bool) -> (Vec<String>, Vec<String>) {
    let mut plain = Vec::new();
    let mut tls = Vec::new();
    for entry in entries {
        match entry.strip_prefix("notls:") {
            Some(rest) => plain.push(rest.to_string()),
            None if enabled => tls.push(entry.clone()),
            None => plain.push(entry.clone()),
        }
    }
    (plain, tls)
}
