//! Session tickets that every worker can decrypt, with no lock shared between workers.
//!
//! The process draws one random master secret at start ([`TicketKeys`]). The key of period
//! `p` (unix seconds / period length) is HKDF-SHA256(master, `p`): each worker holds its own
//! copy of the current and previous period's keys ([`WorkerTickets`]) and derives the next
//! one itself when its clock crosses a period boundary. No key travels between threads and
//! no lock is shared on the handshake path, yet a ticket made on one worker opens on any
//! other (a client's next connection may land on another core). A key lives two periods:
//! a ticket is accepted from one to two periods after it was made, then forward secrecy is
//! restored for those sessions as the key is forgotten.
//!
//! A ticket is `period (8 bytes, big-endian) || nonce (12) || AES-256-GCM(state) || tag
//! (16)`, the period bound in as associated data.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;

/// Bytes before the sealed state: period and nonce.
const HEADER_BYTES: usize = 8 + NONCE_LEN;
/// Longest ticket accepted for decryption: rustls's session state is a few hundred bytes
/// (more with a client certificate chain, which this server does not ask for).
const TICKET_BYTES_MAX: usize = 16 << 10;

/// The process's ticket secret and period: shared read-only by every worker.
pub struct TicketKeys {
    master: [u8; 32],
    period_secs: u64,
}

impl std::fmt::Debug for TicketKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("TicketKeys")
            .field("period_secs", &self.period_secs)
            .finish_non_exhaustive()
    }
}

impl TicketKeys {
    /// A fresh random master secret; keys rotate every `period_secs` (at least 1).
    pub fn generate(period_secs: u64) -> Result<TicketKeys, String> {
        let mut master = [0u8; 32];
        SystemRandom::new()
            .fill(&mut master)
            .map_err(|_| "no system randomness for the ticket secret".to_string())?;
        Ok(TicketKeys {
            master,
            period_secs: period_secs.max(1),
        })
    }

    fn key(&self, period: u64) -> LessSafeKey {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"corelocal session ticket key");
        let info = period.to_be_bytes();
        let info = [&info[..]];
        let prk = salt.extract(&self.master);
        let okm = prk
            .expand(&info, &aead::AES_256_GCM)
            .expect("32 bytes is within HKDF-SHA256's output limit");
        LessSafeKey::new(UnboundKey::from(okm))
    }
}

/// The keys one worker holds: its own copy, rotated by itself.
struct Held {
    period: u64,
    current: LessSafeKey,
    previous: LessSafeKey,
}

/// One worker's ticketer (rustls's [`ProducesTickets`]): its own keys behind a mutex that
/// only its own thread takes (rustls needs `Sync`), so it is never contended.
pub struct WorkerTickets {
    keys: Arc<TicketKeys>,
    held: Mutex<Held>,
    rng: SystemRandom,
}

impl std::fmt::Debug for WorkerTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerTickets")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl WorkerTickets {
    /// The current and previous keys for the wall clock now.
    pub fn new(keys: Arc<TicketKeys>) -> WorkerTickets {
        let period = period_now(keys.period_secs);
        let held = Held {
            period,
            current: keys.key(period),
            previous: keys.key(period.saturating_sub(1)),
        };
        WorkerTickets {
            keys,
            held: Mutex::new(held),
            rng: SystemRandom::new(),
        }
    }

    /// The held keys, rotated first if the clock crossed a period boundary.
    fn rotated(&self) -> Option<std::sync::MutexGuard<'_, Held>> {
        let mut held = self.held.lock().ok()?;
        let now = period_now(self.keys.period_secs);
        if now != held.period {
            let previous = if now == held.period + 1 {
                std::mem::replace(&mut held.current, self.keys.key(now))
            } else {
                held.current = self.keys.key(now);
                self.keys.key(now.saturating_sub(1))
            };
            held.previous = previous;
            held.period = now;
        }
        Some(held)
    }
}

fn period_now(period_secs: u64) -> u64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    unix / period_secs
}

impl ProducesTickets for WorkerTickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        // Guaranteed to open for at least one period (see the module docs).
        u32::try_from(self.keys.period_secs).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let held = self.rotated()?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let period = held.period.to_be_bytes();
        let mut ticket = Vec::with_capacity(HEADER_BYTES + plain.len() + 16);
        ticket.extend_from_slice(&period);
        ticket.extend_from_slice(&nonce);
        let mut sealed = plain.to_vec();
        held.current
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(period),
                &mut sealed,
            )
            .ok()?;
        ticket.extend_from_slice(&sealed);
        Some(ticket)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        if cipher.len() < HEADER_BYTES + 16 || cipher.len() > TICKET_BYTES_MAX {
            return None;
        }
        let (period, rest) = cipher.split_at(8);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let period: [u8; 8] = period.try_into().ok()?;
        let held = self.rotated()?;
        let key = match u64::from_be_bytes(period) {
            p if p == held.period => &held.current,
            p if p + 1 == held.period => &held.previous,
            _ => return None,
        };
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = key.open_in_place(nonce, Aad::from(period), &mut buf).ok()?;
        let n = plain.len();
        buf.truncate(n);
        Some(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_from_one_worker_opens_on_another() {
        let keys = Arc::new(TicketKeys::generate(3600).unwrap());
        let (a, b) = (WorkerTickets::new(keys.clone()), WorkerTickets::new(keys));
        let ticket = a.encrypt(b"session state").unwrap();
        assert_eq!(b.decrypt(&ticket).unwrap(), b"session state");
    }

    #[test]
    fn another_process_or_a_tampered_ticket_is_refused() {
        let a = WorkerTickets::new(Arc::new(TicketKeys::generate(3600).unwrap()));
        let other = WorkerTickets::new(Arc::new(TicketKeys::generate(3600).unwrap()));
        let mut ticket = a.encrypt(b"state").unwrap();
        assert!(other.decrypt(&ticket).is_none());
        let last = ticket.len() - 1;
        ticket[last] ^= 1;
        assert!(a.decrypt(&ticket).is_none());
        assert!(a.decrypt(&ticket[..10]).is_none());
        assert!(a.decrypt(&[]).is_none());
    }

    #[test]
    fn keys_of_the_previous_period_open_and_older_ones_do_not() {
        let keys = Arc::new(TicketKeys::generate(3600).unwrap());
        let a = WorkerTickets::new(keys.clone());
        let now = a.held.lock().unwrap().period;
        let seal = |period: u64| {
            let mut buf = b"old".to_vec();
            let nonce = [7u8; NONCE_LEN];
            keys.key(period)
                .seal_in_place_append_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(period.to_be_bytes()),
                    &mut buf,
                )
                .unwrap();
            [&period.to_be_bytes()[..], &nonce[..], &buf[..]].concat()
        };
        assert_eq!(a.decrypt(&seal(now - 1)).unwrap(), b"old");
        assert!(a.decrypt(&seal(now - 2)).is_none());
    }
}
