//! The no-lost-wakeup protocol of the balancer (register, re-check, sleep), stressed with real
//! threads on both backends: a waker publishes a flag and wakes; the sleeper checks the flag,
//! then sleeps with no timeout worth waiting for. A wake-up that lands between the check and
//! the sleep must still end the sleep at once (the eventfd stays readable until consumed).

use corelocal::runtime::Backend;
use corelocal::sys::epoll::{EpollBackend, PoolConfig};
use corelocal::sys::uring::{UringBackend, UringConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const ROUNDS: u64 = 2_000;
/// A sleep this long means a wake-up was lost (the protocol never needs timeouts).
const LOST: Duration = Duration::from_secs(2);

fn stress<B: Backend + 'static>(make: fn() -> B) {
    let published = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(AtomicU64::new(0));
    let (waker_tx, waker_rx) = mpsc::channel();
    let sleeper = {
        let (published, seen) = (published.clone(), seen.clone());
        std::thread::spawn(move || {
            let mut backend = make();
            waker_tx.send(backend.waker()).unwrap();
            let mut out = Vec::new();
            let mut slowest = Duration::ZERO;
            for round in 1..=ROUNDS {
                // Re-check after registering (the eventfd is always registered), then sleep.
                while published.load(Ordering::Acquire) < round {
                    let t = Instant::now();
                    backend.wait(Some(LOST)).unwrap();
                    backend.reap(&mut out, 64);
                    slowest = slowest.max(t.elapsed());
                }
                seen.store(round, Ordering::Release);
            }
            slowest
        })
    };
    let waker = waker_rx.recv().unwrap();
    for round in 1..=ROUNDS {
        published.store(round, Ordering::Release);
        waker.wake();
        let deadline = Instant::now() + LOST * 2;
        while seen.load(Ordering::Acquire) < round {
            assert!(
                Instant::now() < deadline,
                "round {round}: the sleeper never saw the wake"
            );
            std::hint::spin_loop();
        }
    }
    let slowest = sleeper.join().unwrap();
    assert!(
        slowest < LOST / 2,
        "a wake-up was lost: a sleep lasted {slowest:?}"
    );
}

#[test]
fn no_wakeup_is_lost_with_epoll() {
    stress(|| {
        EpollBackend::new(PoolConfig {
            bufs: 4,
            buf_bytes: 64,
        })
        .unwrap()
    });
}

#[test]
fn no_wakeup_is_lost_with_io_uring() {
    stress(|| {
        UringBackend::new(UringConfig {
            sq_entries: 64,
            files: 16,
            bufs: 4,
            buf_bytes: 64,
        })
        .unwrap()
    });
}
