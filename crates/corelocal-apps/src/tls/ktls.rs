//! kTLS for TLS 1.3 after rustls's handshake: the kernel seals what we send, this module
//! opens what we receive.
//!
//! Once rustls has completed a handshake (with `ServerConfig::enable_secret_extraction`),
//! `ServerConnection::dangerous_extract_secrets()` gives the traffic keys and sequence numbers
//! of both directions.
//!
//! - TX goes to the kernel: [`tls13_tx_info`] builds the `struct tls12_crypto_info_*` of
//!   `linux/tls.h` that `setsockopt(SOL_TLS, TLS_TX, ..)` takes ([`SOL_TLS`], [`TLS_TX`]).
//!   [`KernelCipher::probe_info`] builds one with zero keys, to learn at startup whether the
//!   kernel takes a cipher at all (on a throwaway loopback socket).
//! - RX stays here: the runtime's multishot receive may already hold bytes past the
//!   handshake, so the kernel cannot take RX at a record boundary. [`RecordOpener`] decrypts
//!   TLS 1.3 records (RFC 8446 §5.2) with `ring::aead`, and [`record_len`] frames them.
//!
//! TLS 1.3 only; a KeyUpdate from the peer is an error ([`RecordError::Handshake`]): the keys
//! cannot be changed here.

use std::fmt;

use ring::aead::{
    Aad, Algorithm, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305,
};
use rustls::ConnectionTrafficSecrets;

pub use corelocal::sys::ktls::{SOL_TLS, TLS_TX};

/// `TLS_1_3_VERSION` of `linux/tls.h`.
const TLS_1_3_VERSION: u16 = 0x0304;
/// Bytes of a record header: type, legacy version, length.
const HEADER_LEN: usize = 5;
/// Largest TLSCiphertext.length (RFC 8446 §5.2: 2^14 + 256).
const CIPHERTEXT_MAX: usize = (1 << 14) + 256;
/// Largest plaintext in one record (RFC 8446 §5.1); its inner plaintext, with content type
/// and padding, may have one byte more (§5.4).
const PLAINTEXT_MAX: usize = 1 << 14;
// Record content types (RFC 8446 §5.1).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// The alert description of close_notify.
const CLOSE_NOTIFY: u8 = 0;

/// The AEAD ciphers of TLS 1.3 the kernel knows, as `linux/tls.h` numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelCipher {
    /// `TLS_CIPHER_AES_GCM_128`.
    Aes128Gcm,
    /// `TLS_CIPHER_AES_GCM_256`.
    Aes256Gcm,
    /// `TLS_CIPHER_CHACHA20_POLY1305`.
    Chacha20Poly1305,
}

impl KernelCipher {
    /// A TLS 1.3 crypto_info for this cipher with zero key, IV and sequence number: enough
    /// for `setsockopt(SOL_TLS, TLS_TX)` to say whether the kernel supports the cipher.
    pub fn probe_info(self) -> Vec<u8> {
        self.crypto_info(&vec![0; self.key_len()], &[0; 12], 0)
    }

    /// The cipher's name, as TLS 1.3 suites spell it.
    pub fn name(self) -> &'static str {
        match self {
            KernelCipher::Aes128Gcm => "AES-128-GCM",
            KernelCipher::Aes256Gcm => "AES-256-GCM",
            KernelCipher::Chacha20Poly1305 => "CHACHA20-POLY1305",
        }
    }

    /// `cipher_type` of `struct tls_crypto_info`.
    fn cipher_type(self) -> u16 {
        match self {
            KernelCipher::Aes128Gcm => 51,
            KernelCipher::Aes256Gcm => 52,
            KernelCipher::Chacha20Poly1305 => 54,
        }
    }

    fn key_len(self) -> usize {
        match self {
            KernelCipher::Aes128Gcm => 16,
            KernelCipher::Aes256Gcm | KernelCipher::Chacha20Poly1305 => 32,
        }
    }

    fn aead(self) -> &'static Algorithm {
        match self {
            KernelCipher::Aes128Gcm => &AES_128_GCM,
            KernelCipher::Aes256Gcm => &AES_256_GCM,
            KernelCipher::Chacha20Poly1305 => &CHACHA20_POLY1305,
        }
    }

    /// `struct tls12_crypto_info_*`: info, iv, key, salt, rec_seq, all byte arrays (no
    /// padding). GCM's 12-byte nonce base is salt (first 4) and iv (last 8); ChaCha has no
    /// salt and a 12-byte iv. The kernel XORs the sequence number into it as TLS 1.3 does.
    fn crypto_info(self, key: &[u8], nonce_base: &[u8; 12], seq: u64) -> Vec<u8> {
        debug_assert_eq!(key.len(), self.key_len());
        let (salt, iv) = match self {
            KernelCipher::Chacha20Poly1305 => nonce_base.split_at(0),
            KernelCipher::Aes128Gcm | KernelCipher::Aes256Gcm => nonce_base.split_at(4),
        };
        let mut info = Vec::with_capacity(4 + iv.len() + key.len() + salt.len() + 8);
        info.extend_from_slice(&TLS_1_3_VERSION.to_ne_bytes());
        info.extend_from_slice(&self.cipher_type().to_ne_bytes());
        info.extend_from_slice(iv);
        info.extend_from_slice(key);
        info.extend_from_slice(salt);
        info.extend_from_slice(&seq.to_be_bytes());
        info
    }
}

/// The cipher, key and 12-byte IV of `secrets`.
fn parts(secrets: &ConnectionTrafficSecrets) -> Option<(KernelCipher, &[u8], &[u8])> {
    let (cipher, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (KernelCipher::Aes128Gcm, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (KernelCipher::Aes256Gcm, key, iv),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            (KernelCipher::Chacha20Poly1305, key, iv)
        }
        _ => return None,
    };
    Some((cipher, key.as_ref(), iv.as_ref()))
}

/// The bytes `setsockopt(SOL_TLS, TLS_TX)` takes to send TLS 1.3 records with `secrets`,
/// starting at sequence number `seq`; `None` for a suite the kernel does not know.
pub fn tls13_tx_info(seq: u64, secrets: &ConnectionTrafficSecrets) -> Option<Vec<u8>> {
    let (cipher, key, iv) = parts(secrets)?;
    let nonce_base: [u8; 12] = iv.try_into().ok()?;
    (key.len() == cipher.key_len()).then(|| cipher.crypto_info(key, &nonce_base, seq))
}

/// The length (header and payload) of the first TLS record in `input` if all of it is
/// there, else `None`.
pub fn record_len(input: &[u8]) -> Option<usize> {
    let [_, _, _, hi, lo, ..] = *input else {
        return None;
    };
    let len = HEADER_LEN + usize::from(u16::from_be_bytes([hi, lo]));
    (input.len() >= len).then_some(len)
}

/// Why [`RecordOpener::open`] refused its input. The connection cannot go on after any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// A record that does not decrypt, or whose inner plaintext is malformed.
    Bad,
    /// A record longer than TLS 1.3 allows (record_overflow).
    Overflow,
    /// An outer content type other than application_data (change_cipher_spec included: it
    /// is allowed only during the handshake).
    Unexpected(u8),
    /// The peer sent this alert (its description), other than close_notify.
    Alert(u8),
    /// A handshake message after the handshake (a KeyUpdate: we cannot re-key).
    Handshake,
    /// The sequence number would wrap.
    SeqExhausted,
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Bad => write!(f, "TLS record does not decrypt or is malformed"),
            RecordError::Overflow => write!(f, "TLS record too long"),
            RecordError::Unexpected(t) => write!(f, "unexpected TLS record type {t}"),
            RecordError::Alert(d) => write!(f, "peer sent TLS alert {d}"),
            RecordError::Handshake => write!(f, "TLS handshake message after the handshake"),
            RecordError::SeqExhausted => write!(f, "TLS record sequence number exhausted"),
        }
    }
}

impl std::error::Error for RecordError {}

/// What one [`RecordOpener::open`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Bytes taken from the front of the input (whole records only).
    pub consumed: usize,
    /// The peer's close_notify has been read (now or before): nothing more will be opened.
    pub close_notify: bool,
}

/// Decrypts the TLS 1.3 records a peer sends, with the receive secrets rustls extracted.
pub struct RecordOpener {
    key: LessSafeKey,
    nonce_base: [u8; 12],
    seq: u64,
    /// Where each record is decrypted: reused, so no allocation per record once it has
    /// grown to the largest record seen.
    scratch: Vec<u8>,
    closed: bool,
}

impl fmt::Debug for RecordOpener {
    // No key material, no plaintext.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordOpener")
            .field("seq", &self.seq)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl RecordOpener {
    /// An opener whose next record has sequence number `seq`; `None` for a suite it does not
    /// know.
    pub fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> Option<RecordOpener> {
        let (cipher, key, iv) = parts(&secrets)?;
        Some(RecordOpener {
            key: LessSafeKey::new(UnboundKey::new(cipher.aead(), key).ok()?),
            nonce_base: iv.try_into().ok()?,
            seq,
            scratch: Vec::new(),
            closed: false,
        })
    }

    /// The sequence number of the next record.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Opens whole records from the front of `input`, appending their application data to
    /// `plain`, while `plain` holds fewer than `plain_bytes_max` bytes (so it may pass that by
    /// up to one record, 16 KiB) and no close_notify has come. A partial record at the end is
    /// left unconsumed: call again with it and more bytes. A bad header is refused as soon as
    /// its 5 bytes are there. After an error nothing of the failing record was taken.
    pub fn open(
        &mut self,
        input: &[u8],
        plain: &mut Vec<u8>,
        plain_bytes_max: usize,
    ) -> Result<Opened, RecordError> {
        let mut consumed = 0;
        while !self.closed && plain.len() < plain_bytes_max {
            let rest = &input[consumed..];
            check_header(rest)?;
            let Some(len) = record_len(rest) else {
                break;
            };
            self.closed = self.open_record(&rest[..len], plain)?;
            consumed += len;
        }
        Ok(Opened {
            consumed,
            close_notify: self.closed,
        })
    }

    /// Decrypts one whole record; `Ok(true)` for close_notify.
    fn open_record(&mut self, record: &[u8], plain: &mut Vec<u8>) -> Result<bool, RecordError> {
        let (header, body) = record
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(RecordError::Bad)?;
        // Opening at u64::MAX would leave the next record's number wrapped (RFC 8446 §5.3).
        let next = self.seq.checked_add(1).ok_or(RecordError::SeqExhausted)?;
        let nonce = self.nonce();
        self.scratch.clear();
        self.scratch.extend_from_slice(body);
        let inner = self
            .key
            .open_in_place(nonce, Aad::from(*header), &mut self.scratch)
            .map_err(|_| RecordError::Bad)?;
        self.seq = next;
        // TLSInnerPlaintext: content, content type, zero padding; 2^14 + 1 bytes at most,
        // padding included (RFC 8446 §5.4).
        if inner.len() > PLAINTEXT_MAX + 1 {
            return Err(RecordError::Overflow);
        }
        let end = inner
            .iter()
            .rposition(|&b| b != 0)
            .ok_or(RecordError::Bad)?;
        let content = &inner[..end];
        match inner[end] {
            APPLICATION_DATA => plain.extend_from_slice(content),
            ALERT => return alert(content),
            HANDSHAKE => return Err(RecordError::Handshake),
            _ => return Err(RecordError::Bad),
        }
        Ok(false)
    }

    /// The per-record nonce: the IV XOR the sequence number, right-aligned (RFC 8446 §5.3).
    fn nonce(&self) -> Nonce {
        let mut nonce = self.nonce_base;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        Nonce::assume_unique_for_key(nonce)
    }
}

/// Refuses a record header as soon as it is there, rather than waiting for up to 64 KiB a
/// record could never be allowed to hold.
fn check_header(rest: &[u8]) -> Result<(), RecordError> {
    let [kind, _, _, hi, lo, ..] = *rest else {
        return Ok(());
    };
    if kind != APPLICATION_DATA {
        return Err(RecordError::Unexpected(kind));
    }
    if usize::from(u16::from_be_bytes([hi, lo])) > CIPHERTEXT_MAX {
        return Err(RecordError::Overflow);
    }
    Ok(())
}

/// An alert's body (level, description): `Ok(true)` for close_notify.
fn alert(content: &[u8]) -> Result<bool, RecordError> {
    match *content {
        [_, CLOSE_NOTIFY] => Ok(true),
        [_, description] => Err(RecordError::Alert(description)),
        _ => Err(RecordError::Bad),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::ops::DerefMut;
    use std::path::Path;
    use std::sync::Arc;

    use rustls::crypto::ring::{cipher_suite, default_provider};
    use rustls::crypto::CryptoProvider;
    use rustls::{
        ClientConfig, ClientConnection, ConnectionCommon, ExtractedSecrets, RootCertStore,
        ServerConfig, ServerConnection, SupportedCipherSuite,
    };
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    pub(crate) const SUITES: [(SupportedCipherSuite, KernelCipher); 3] = [
        (
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            KernelCipher::Aes128Gcm,
        ),
        (
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            KernelCipher::Aes256Gcm,
        ),
        (
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
            KernelCipher::Chacha20Poly1305,
        ),
    ];

    pub(crate) fn cert_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls")
    }

    fn server_config() -> Arc<ServerConfig> {
        let chain = CertificateDer::pem_file_iter(cert_dir().join("ecdsa.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(cert_dir().join("ecdsa.key")).unwrap();
        let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.enable_secret_extraction = true;
        Arc::new(config)
    }

    /// A client that offers only `suite`, trusting the test CA.
    fn client_config(suite: SupportedCipherSuite) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(cert_dir().join("ca.pem")).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let provider = CryptoProvider {
            cipher_suites: vec![suite],
            ..default_provider()
        };
        let config = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }

    /// All the records `c` has to send.
    fn take_tls<C: DerefMut<Target = ConnectionCommon<D>>, D>(c: &mut C) -> Vec<u8> {
        let mut out = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut out).unwrap();
        }
        out
    }

    fn give_tls<C: DerefMut<Target = ConnectionCommon<D>>, D>(c: &mut C, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            c.read_tls(&mut bytes).unwrap();
            c.process_new_packets().unwrap();
        }
    }

    /// A completed handshake on `suite`, one application record each way already exchanged
    /// by rustls (so both sequence numbers are past 0), then the server's secrets.
    fn session(suite: SupportedCipherSuite) -> (ClientConnection, ExtractedSecrets) {
        let mut server = ServerConnection::new(server_config()).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut client = ClientConnection::new(client_config(suite), name).unwrap();
        client.set_buffer_limit(None);
        client.writer().write_all(b"early").unwrap();
        server.writer().write_all(b"hello").unwrap();
        loop {
            let (s2c, c2s) = (take_tls(&mut server), take_tls(&mut client));
            if s2c.is_empty() && c2s.is_empty() {
                break;
            }
            give_tls(&mut client, &s2c);
            give_tls(&mut server, &c2s);
        }
        assert!(!server.is_handshaking() && !client.is_handshaking());
        let mut early = [0; 5];
        server.reader().read_exact(&mut early).unwrap();
        assert_eq!(&early, b"early");
        client.reader().read_exact(&mut early).unwrap();
        assert_eq!(&early, b"hello");
        (client, server.dangerous_extract_secrets().unwrap())
    }

    /// What the client writes: one write over 16 KiB, so it spans records.
    fn writes() -> Vec<Vec<u8>> {
        let big = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
        vec![b"GET / HTTP/1.1\r\n\r\n".to_vec(), big, b"x".to_vec()]
    }

    /// The client's records of [`writes`] and its close_notify.
    fn client_records(client: &mut ClientConnection) -> Vec<u8> {
        for w in writes() {
            client.writer().write_all(&w).unwrap();
        }
        client.send_close_notify();
        take_tls(client)
    }

    /// Feeds `bytes` in chunks of the sizes `sizes` yields, keeping what is not consumed as a
    /// caller would; the plaintext, once close_notify has come with nothing left over.
    fn open_in_chunks(
        opener: &mut RecordOpener,
        bytes: &[u8],
        mut sizes: impl FnMut() -> usize,
    ) -> Vec<u8> {
        let (mut pending, mut plain, mut at) = (Vec::new(), Vec::new(), 0);
        let mut closed = false;
        while at < bytes.len() {
            let n = sizes().clamp(1, bytes.len() - at);
            pending.extend_from_slice(&bytes[at..at + n]);
            at += n;
            let opened = opener.open(&pending, &mut plain, usize::MAX).unwrap();
            if let Some(len) = record_len(&pending) {
                assert!(opened.consumed >= len || opened.close_notify);
            }
            pending.drain(..opened.consumed);
            assert!(record_len(&pending).is_none() || opened.close_notify);
            closed = opened.close_notify;
        }
        assert!(closed && pending.is_empty());
        plain
    }

    /// A deterministic sequence of chunk sizes in 1..=max.
    fn sizes(mut state: u32, max: u32) -> impl FnMut() -> usize {
        move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state % max + 1) as usize
        }
    }

    /// A fresh session's client records on `suite` and an opener for them (rustls's secrets
    /// are not `Clone`, so each opener needs its own handshake).
    fn opener_and_records(suite: SupportedCipherSuite) -> (RecordOpener, Vec<u8>) {
        let (mut client, secrets) = session(suite);
        assert_eq!(secrets.rx.0, 1, "one record already read by rustls");
        let bytes = client_records(&mut client);
        (
            RecordOpener::new(secrets.rx.0, secrets.rx.1).unwrap(),
            bytes,
        )
    }

    #[test]
    fn opens_what_a_rustls_client_sends_in_any_split() {
        let expected = writes().concat();
        for (suite, cipher) in SUITES {
            for split in 0..4 {
                let (mut opener, bytes) = opener_and_records(suite);
                let plain = match split {
                    0 => open_in_chunks(&mut opener, &bytes, || bytes.len()),
                    1 => open_in_chunks(&mut opener, &bytes, || 1),
                    n => open_in_chunks(&mut opener, &bytes, sizes(n, 3000)),
                };
                assert!(plain == expected, "{cipher:?} split {split}");
                // After close_notify nothing more is taken.
                let again = opener.open(&bytes, &mut Vec::new(), usize::MAX).unwrap();
                assert_eq!(
                    again,
                    Opened {
                        consumed: 0,
                        close_notify: true
                    }
                );
            }
        }
    }

    #[test]
    fn a_flipped_byte_is_refused_and_takes_nothing() {
        for (suite, _) in SUITES {
            let (mut opener, bytes) = opener_and_records(suite);
            let first = record_len(&bytes).unwrap();
            // The version (authenticated as AAD), the ciphertext, the tag.
            for at in [1, HEADER_LEN, first - 1] {
                let mut bad = bytes.clone();
                bad[at] ^= 0x40;
                let r = opener.open(&bad, &mut Vec::new(), usize::MAX);
                assert_eq!(r, Err(RecordError::Bad), "byte {at}");
            }
            // The failed attempts took nothing: the real records still open.
            let plain = open_in_chunks(&mut opener, &bytes, || bytes.len());
            assert!(plain == writes().concat());
        }
    }

    #[test]
    fn stops_at_plain_bytes_max_and_resumes() {
        let (mut opener, bytes) = opener_and_records(SUITES[0].0);
        let (mut plain, mut at, mut calls) = (Vec::new(), 0, 0);
        loop {
            let max = plain.len() + 1;
            let opened = opener.open(&bytes[at..], &mut plain, max).unwrap();
            // One record per call: the first leaves `plain` at or past its limit.
            assert_eq!(opened.consumed, record_len(&bytes[at..]).unwrap());
            at += opened.consumed;
            calls += 1;
            if opened.close_notify {
                break;
            }
            assert!(at < bytes.len());
        }
        assert_eq!(at, bytes.len());
        // The request, 40 000 bytes in three records, "x", close_notify.
        assert_eq!(calls, 6);
        assert!(plain == writes().concat());
    }

    #[test]
    fn headers_are_checked_before_the_record_is_whole() {
        let (mut opener, _) = opener_and_records(SUITES[2].0);
        let mut plain = Vec::new();
        let longest = [23, 3, 3, 0x41, 0x00]; // 2^14 + 256: allowed, waits for the rest
        assert_eq!(opener.open(&longest, &mut plain, 1).unwrap().consumed, 0);
        let r = opener.open(&[23, 3, 3, 0x41, 0x01], &mut plain, 1);
        assert_eq!(r, Err(RecordError::Overflow));
        // change_cipher_spec: allowed only during the handshake.
        let r = opener.open(&[20, 3, 3, 0, 1, 1], &mut plain, 1);
        assert_eq!(r, Err(RecordError::Unexpected(20)));
        let r = opener.open(&[22, 3, 3, 0, 1], &mut plain, 1);
        assert_eq!(r, Err(RecordError::Unexpected(22)));
    }

    #[test]
    fn record_len_needs_the_whole_record() {
        assert_eq!(record_len(&[]), None);
        assert_eq!(record_len(&[23, 3, 3, 0]), None);
        assert_eq!(record_len(&[23, 3, 3, 0, 0]), Some(5));
        assert_eq!(record_len(&[23, 3, 3, 0, 2, 9]), None);
        assert_eq!(record_len(&[23, 3, 3, 0, 2, 9, 9, 1, 2]), Some(7));
        assert_eq!(record_len(&[23, 3, 3, 1, 0, 0]), None);
    }

    /// The fields of a crypto_info, read back per `linux/tls.h` (independently of how
    /// [`tls13_tx_info`] writes them): cipher, key, salt||iv, rec_seq.
    pub(crate) fn parse_info(info: &[u8]) -> (KernelCipher, Vec<u8>, [u8; 12], u64) {
        assert_eq!(u16::from_ne_bytes([info[0], info[1]]), 0x0304);
        let (cipher, iv_len, key_len, salt_len) = match u16::from_ne_bytes([info[2], info[3]]) {
            51 => (KernelCipher::Aes128Gcm, 8, 16, 4),
            52 => (KernelCipher::Aes256Gcm, 8, 32, 4),
            54 => (KernelCipher::Chacha20Poly1305, 12, 32, 0),
            other => panic!("cipher type {other}"),
        };
        assert_eq!(info.len(), 4 + iv_len + key_len + salt_len + 8);
        let (iv, rest) = info[4..].split_at(iv_len);
        let (key, rest) = rest.split_at(key_len);
        let (salt, seq) = rest.split_at(salt_len);
        let nonce_base: [u8; 12] = [salt, iv].concat().try_into().unwrap();
        let seq = u64::from_be_bytes(seq.try_into().unwrap());
        (cipher, key.to_vec(), nonce_base, seq)
    }

    /// Seals records as the kernel does with a crypto_info.
    pub(crate) struct Sealer {
        key: LessSafeKey,
        nonce_base: [u8; 12],
        seq: u64,
    }

    impl Sealer {
        pub(crate) fn from_info(info: &[u8]) -> Sealer {
            let (cipher, key, nonce_base, seq) = parse_info(info);
            let key = LessSafeKey::new(UnboundKey::new(cipher.aead(), &key).unwrap());
            Sealer {
                key,
                nonce_base,
                seq,
            }
        }

        /// A record of `content` with inner type `kind` and `padding` zeros.
        pub(crate) fn seal(&mut self, kind: u8, content: &[u8], padding: usize) -> Vec<u8> {
            let mut inner = content.to_vec();
            inner.push(kind);
            inner.resize(inner.len() + padding, 0);
            self.seal_inner(inner)
        }

        /// A record around an inner plaintext as it is.
        fn seal_inner(&mut self, mut inner: Vec<u8>) -> Vec<u8> {
            let len = u16::try_from(inner.len() + 16).unwrap().to_be_bytes();
            let header = [APPLICATION_DATA, 3, 3, len[0], len[1]];
            let mut nonce = self.nonce_base;
            for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
                *n ^= s;
            }
            let nonce = Nonce::assume_unique_for_key(nonce);
            self.key
                .seal_in_place_append_tag(nonce, Aad::from(header), &mut inner)
                .unwrap();
            self.seq = self.seq.wrapping_add(1);
            [&header[..], &inner].concat()
        }
    }

    #[test]
    fn tx_info_seals_records_the_rustls_client_reads() {
        for (suite, cipher) in SUITES {
            let (mut client, secrets) = session(suite);
            let (seq, tx) = &secrets.tx;
            assert!(*seq >= 1, "tickets and one record already sent by rustls");
            let info = tls13_tx_info(*seq, tx).unwrap();
            assert_eq!(info.len(), cipher.probe_info().len());
            let (parsed, key, _, parsed_seq) = parse_info(&info);
            assert_eq!((parsed, parsed_seq), (cipher, *seq));
            assert_eq!(key, parts(tx).unwrap().1);
            let mut sealer = Sealer::from_info(&info);
            let big: Vec<u8> = (0..16_000u32).map(|i| (i % 253) as u8).collect();
            let full = vec![5; PLAINTEXT_MAX];
            let records = [
                sealer.seal(APPLICATION_DATA, b"from the kernel", 0),
                sealer.seal(APPLICATION_DATA, &big, 7),
                sealer.seal(APPLICATION_DATA, &full, 0),
            ];
            give_tls(&mut client, &records.concat());
            let sent = [&b"from the kernel"[..], &big, &full].concat();
            let mut got = vec![0; sent.len()];
            client.reader().read_exact(&mut got).unwrap();
            assert!(got == sent, "{cipher:?}");
        }
    }

    #[test]
    fn probe_info_is_tls13_with_zero_keys() {
        for (cipher, len) in [
            (KernelCipher::Aes128Gcm, 40),
            (KernelCipher::Aes256Gcm, 56),
            (KernelCipher::Chacha20Poly1305, 56),
        ] {
            let info = cipher.probe_info();
            assert_eq!(info.len(), len);
            let (parsed, key, nonce_base, seq) = parse_info(&info);
            assert_eq!(parsed, cipher);
            assert!(key.iter().chain(&nonce_base).all(|&b| b == 0) && seq == 0);
        }
    }

    /// Secrets made up here (ChaCha20's key is the one rustls's `AeadKey` can be built as),
    /// and a sealer with them, both starting at `seq`.
    pub(crate) fn made_up(seq: u64) -> (RecordOpener, Sealer) {
        let (opener, sealer, _) = made_up_with_info(seq);
        (opener, sealer)
    }

    /// As [`made_up`], with the secrets' crypto_info too.
    pub(crate) fn made_up_with_info(seq: u64) -> (RecordOpener, Sealer, Vec<u8>) {
        let secrets = || ConnectionTrafficSecrets::Chacha20Poly1305 {
            key: [7; 32].into(),
            iv: [9; 12].into(),
        };
        let info = tls13_tx_info(seq, &secrets()).unwrap();
        let sealer = Sealer::from_info(&info);
        (RecordOpener::new(seq, secrets()).unwrap(), sealer, info)
    }

    /// What one `open` of `records` makes of them.
    fn open_made_up(records: &[Vec<u8>]) -> (Result<Opened, RecordError>, Vec<u8>) {
        let (mut opener, _) = made_up(0);
        let mut plain = Vec::new();
        let r = opener.open(&records.concat(), &mut plain, usize::MAX);
        (r, plain)
    }

    #[test]
    fn inner_plaintext_padding_types_and_alerts() {
        let (_, mut s) = made_up(0);
        let data = s.seal(APPLICATION_DATA, b"abc", 10);
        let empty = s.seal(APPLICATION_DATA, b"", 0);
        let close = s.seal(ALERT, &[1, CLOSE_NOTIFY], 3);
        let after = s.seal(APPLICATION_DATA, b"late", 0);
        let records = [data.clone(), empty.clone(), close.clone(), after];
        let (r, plain) = open_made_up(&records);
        let consumed = data.len() + empty.len() + close.len();
        assert_eq!(
            r,
            Ok(Opened {
                consumed,
                close_notify: true
            })
        );
        assert_eq!(plain, b"abc");

        type Case = (fn(&mut Sealer) -> Vec<u8>, RecordError);
        let cases: [Case; 7] = [
            (|s| s.seal(ALERT, &[2, 40], 0), RecordError::Alert(40)),
            (|s| s.seal(ALERT, &[1], 0), RecordError::Bad),
            (
                |s| s.seal(HANDSHAKE, &[24, 0, 0, 1, 0], 0),
                RecordError::Handshake,
            ),
            (|s| s.seal(99, b"?", 0), RecordError::Bad),
            (|s| s.seal_inner(vec![0; 8]), RecordError::Bad),
            (
                |s| s.seal(APPLICATION_DATA, &[1; PLAINTEXT_MAX + 1], 0),
                RecordError::Overflow,
            ),
            // Padding counts: 2^14 bytes of data, the type and one zero is one too many.
            (
                |s| s.seal(APPLICATION_DATA, &[1; PLAINTEXT_MAX], 1),
                RecordError::Overflow,
            ),
        ];
        for (i, (seal, err)) in cases.into_iter().enumerate() {
            let (_, mut sealer) = made_up(0);
            assert_eq!(open_made_up(&[seal(&mut sealer)]).0, Err(err), "case {i}");
        }
    }

    #[test]
    fn the_sequence_number_does_not_wrap() {
        let (mut opener, mut sealer) = made_up(u64::MAX - 1);
        let records = [
            sealer.seal(APPLICATION_DATA, b"last", 0),
            sealer.seal(23, b"", 0),
        ];
        let mut plain = Vec::new();
        let r = opener.open(&records.concat(), &mut plain, usize::MAX);
        assert_eq!(r, Err(RecordError::SeqExhausted));
        assert_eq!((plain.as_slice(), opener.seq()), (&b"last"[..], u64::MAX));
    }

    #[test]
    fn errors_display() {
        assert_eq!(RecordError::Alert(40).to_string(), "peer sent TLS alert 40");
        assert_eq!(
            RecordError::Bad.to_string(),
            "TLS record does not decrypt or is malformed"
        );
    }
}
