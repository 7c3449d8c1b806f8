//! Certificates: PEM chains and keys loaded and checked at start, and the SNI choice among
//! them — a read-only map shared by every worker (no lock, nothing written after start).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A certificate chain (leaf first, then intermediates) and its private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// The chain: the server's certificate first, then the intermediates.
    pub chain: PathBuf,
    /// Its private key: PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
    pub key: PathBuf,
}

/// Loads one chain and key and checks they belong together (ECDSA P-256/P-384, Ed25519 or
/// RSA keys).
pub fn load(files: &CertFiles) -> Result<Arc<CertifiedKey>, String> {
    let chain = read_chain(&files.chain)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("{}: no private key ({e})", files.key.display()))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("{}: unusable private key: {e}", files.key.display()))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|e| {
        format!(
            "{} and {} do not match: {e}",
            files.chain.display(),
            files.key.display()
        )
    })?;
    Ok(Arc::new(certified))
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(chain)
}

/// Picks a certificate by the name the client asks for (SNI): exact names first, then a
/// wildcard one level up; no name or an unknown one gets the first certificates. Among the
/// certificates for a name (an ECDSA and an RSA one, say), the first whose key can sign with
/// a scheme the client offers wins.
#[derive(Debug)]
pub struct SniResolver {
    all: Vec<Arc<CertifiedKey>>,
    by_name: HashMap<String, Vec<Arc<CertifiedKey>>>,
}

impl SniResolver {
    /// Indexes the certificates by the DNS names each is valid for (checked with webpki, the
    /// way a client checks them), in the order given.
    pub fn new(certs: Vec<Arc<CertifiedKey>>) -> Result<SniResolver, String> {
        if certs.is_empty() {
            return Err("no certificate".into());
        }
        let mut by_name: HashMap<String, Vec<Arc<CertifiedKey>>> = HashMap::new();
        for certified in &certs {
            for name in names(certified)? {
                by_name.entry(name).or_default().push(certified.clone());
            }
        }
        Ok(SniResolver {
            all: certs,
            by_name,
        })
    }

    /// The certificates for `name` (`None`: no SNI), best first.
    fn candidates(&self, name: Option<&str>) -> &[Arc<CertifiedKey>] {
        let Some(name) = name.map(str::to_ascii_lowercase) else {
            return &self.all;
        };
        if let Some(c) = self.by_name.get(&name) {
            return c;
        }
        let wildcard = name.split_once('.').map(|(_, up)| format!("*.{up}"));
        match wildcard.and_then(|w| self.by_name.get(&w)) {
            Some(c) => c,
            None => &self.all,
        }
    }

    /// The certificate for `name` whose key signs with one of `schemes` (the first for
    /// `name` if none does: the handshake then fails with a clear alert).
    pub fn pick(&self, name: Option<&str>, schemes: &[SignatureScheme]) -> Arc<CertifiedKey> {
        let candidates = self.candidates(name);
        candidates
            .iter()
            .find(|c| c.key.choose_scheme(schemes).is_some())
            .unwrap_or(&candidates[0])
            .clone()
    }
}

/// The certificates in force, replaceable at run time ([`CertStore::reload`]) with no lock on
/// the handshake path: each worker keeps its own [`WorkerCerts`] copy and looks at one shared
/// generation number per handshake (a cache line written only at a reload); only a worker that
/// sees a new generation takes the store's lock, once, to fetch the new map.
#[derive(Debug)]
pub struct CertStore {
    files: Vec<CertFiles>,
    generation: AtomicU64,
    current: Mutex<Arc<SniResolver>>,
}

impl CertStore {
    /// Loads every certificate and key.
    pub fn load(files: Vec<CertFiles>) -> Result<CertStore, String> {
        let resolver = Arc::new(load_all(&files)?);
        Ok(CertStore {
            files,
            generation: AtomicU64::new(0),
            current: Mutex::new(resolver),
        })
    }

    /// Reads the same files again; new handshakes use what they hold now (connections
    /// already established keep theirs). On an error (a missing file, a key that does not
    /// match) the certificates in force stay. Returns how many were loaded.
    pub fn reload(&self) -> Result<usize, String> {
        let resolver = Arc::new(load_all(&self.files)?);
        let mut current = self
            .current
            .lock()
            .map_err(|_| "certificate store poisoned")?;
        *current = resolver;
        self.generation.fetch_add(1, Ordering::Release);
        Ok(self.files.len())
    }

    fn snapshot(&self) -> (u64, Arc<SniResolver>) {
        // The generation read under the lock matches the map: a reload bumps it under it.
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (self.generation.load(Ordering::Acquire), current.clone())
    }
}

fn load_all(files: &[CertFiles]) -> Result<SniResolver, String> {
    SniResolver::new(files.iter().map(load).collect::<Result<Vec<_>, _>>()?)
}

/// One worker's view of the [`CertStore`] (rustls's certificate resolver for its
/// configuration): its own copy of the map behind a mutex only its thread takes.
#[derive(Debug)]
pub struct WorkerCerts {
    store: Arc<CertStore>,
    held: Mutex<(u64, Arc<SniResolver>)>,
}

impl WorkerCerts {
    /// A worker's view, holding the store's map now.
    pub fn new(store: Arc<CertStore>) -> WorkerCerts {
        let held = Mutex::new(store.snapshot());
        WorkerCerts { store, held }
    }

    fn resolver(&self) -> Arc<SniResolver> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if self.store.generation.load(Ordering::Acquire) != held.0 {
            *held = self.store.snapshot();
        }
        held.1.clone()
    }
}

impl ResolvesServerCert for WorkerCerts {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.resolver()
                .pick(hello.server_name(), hello.signature_schemes()),
        )
    }
}

/// The DNS names (and wildcards) the leaf is valid for.
fn names(certified: &CertifiedKey) -> Result<Vec<String>, String> {
    let leaf = certified.end_entity_cert().map_err(|e| e.to_string())?;
    let parsed = webpki::EndEntityCert::try_from(leaf).map_err(|e| format!("{e:?}"))?;
    let mut names = Vec::new();
    for name in parsed.valid_dns_names() {
        // A listed name is taken only if webpki agrees the leaf is valid for it.
        let exact = name
            .strip_prefix("*.")
            .map_or(name.to_string(), |up| format!("x.{up}"));
        let Ok(server) = ServerName::try_from(exact.as_str()) else {
            continue;
        };
        if parsed.verify_is_valid_for_subject_name(&server).is_ok() {
            names.push(name.to_ascii_lowercase());
        }
    }
    Ok(names)
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name(), hello.signature_schemes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(name: &str) -> CertFiles {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls");
        CertFiles {
            chain: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        }
    }

    #[test]
    fn ecdsa_and_rsa_chains_load_with_their_intermediate() {
        for name in ["ecdsa", "rsa", "other"] {
            let c = load(&files(name)).unwrap();
            assert_eq!(c.cert.len(), 2, "{name}: leaf and intermediate");
        }
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let mut wrong = files("ecdsa");
        wrong.key = files("other").key;
        assert!(load(&wrong).unwrap_err().contains("do not match"));
        let mut missing = files("ecdsa");
        missing.chain = "/nonexistent.pem".into();
        assert!(load(&missing).is_err());
    }

    #[test]
    fn sni_picks_by_name_and_key_type_and_falls_back_to_the_first() {
        let (ec, rsa, other) = (
            load(&files("ecdsa")).unwrap(),
            load(&files("rsa")).unwrap(),
            load(&files("other")).unwrap(),
        );
        let r = SniResolver::new(vec![ec.clone(), rsa.clone(), other.clone()]).unwrap();
        let any = [
            SignatureScheme::ECDSA_NISTP256_SHA256,
            SignatureScheme::RSA_PSS_SHA256,
        ];
        let rsa_only = [SignatureScheme::RSA_PSS_SHA256];
        let pick = |name, schemes: &[SignatureScheme]| r.pick(name, schemes);
        assert!(Arc::ptr_eq(&pick(Some("other.test"), &any), &other));
        assert!(Arc::ptr_eq(&pick(Some("OTHER.test"), &any), &other));
        assert!(Arc::ptr_eq(&pick(Some("localhost"), &any), &ec));
        assert!(Arc::ptr_eq(&pick(Some("localhost"), &rsa_only), &rsa));
        assert!(Arc::ptr_eq(&pick(Some("unknown.example"), &any), &ec));
        assert!(Arc::ptr_eq(&pick(None, &rsa_only), &rsa));
        // No key signs with what the client offers: the first, and the handshake fails.
        assert!(Arc::ptr_eq(&pick(Some("other.test"), &rsa_only), &other));
    }
}
