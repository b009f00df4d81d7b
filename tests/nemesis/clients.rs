//! The nemesis's clients: the library's blocking adapter, one client (and
//! its driver thread) per worker, on shared keys and private ones. Every
//! operation goes into the history with its times; every grant writes its
//! token to the fenced store while, and only while, its lease is valid.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ticketing::blocking::{AcquireError, Handle, Lease, LeaseStatus, TcpConnector, TlsConnector};
use ticketing::client::{Config, Outcome};
use ticketing::tls::ClientTls;
use ticketing::{Endpoint, Key, Name};

use super::history::{Acquired, Entry, FencedStore, History, Ns};

/// A small generator (SplitMix64): each client's choices from the seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// How long before `valid_until` an honest client stops writing.
const WRITE_MARGIN: Duration = Duration::from_millis(100);

/// What every client of a run shares.
#[derive(Clone)]
pub struct Shared {
    pub history: History,
    pub store: FencedStore,
    pub stop: Arc<AtomicBool>,
    pub endpoints: Vec<String>,
    /// Addresses a leader hint may name besides the endpoints (members
    /// that may join).
    pub allow: Vec<String>,
    /// Keys every client contends for.
    pub keys: usize,
    /// TLS to the members, where they require it.
    pub tls: Option<ClientTls>,
}

impl Shared {
    fn config(&self, id: usize, endpoints: &[String]) -> Config {
        let endpoints = endpoints
            .iter()
            .map(|e| Endpoint::new(e).expect("an endpoint"));
        let mut config = Config::new(endpoints, Name::new(format!("c{id}")).expect("a name"));
        config.allow = self
            .allow
            .iter()
            .map(|e| Endpoint::new(e).expect("an endpoint"))
            .collect();
        config.seed = id as u64;
        // Short enough that a run gets on with its work after a fault.
        config.connect_timeout = Duration::from_millis(500);
        config.handshake_timeout = Duration::from_millis(500);
        config.answer_grace = Duration::from_millis(1_500);
        config
    }

    /// A client with `config`, over TLS if the members require it.
    fn connect(&self, config: Config) -> Handle {
        let handle = match &self.tls {
            Some(tls) => ticketing::blocking::connect(config, TlsConnector::new(tls.clone())),
            None => ticketing::blocking::connect(config, TcpConnector),
        };
        handle.expect("a client")
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

fn status_name(status: LeaseStatus) -> &'static str {
    match status {
        LeaseStatus::Valid { .. } => "valid",
        LeaseStatus::Jeopardy { .. } => "jeopardy",
        LeaseStatus::Lost => "lost",
        LeaseStatus::Expired { .. } => "expired",
        _ => "other",
    }
}

/// One client at work.
struct Worker {
    id: usize,
    shared: Shared,
    handle: Handle,
    rng: Rng,
}

impl Worker {
    fn ns(&self, at: Instant) -> Ns {
        self.shared.history.ns(at)
    }

    fn acquired(&self, result: &Result<Lease, AcquireError>) -> Acquired {
        match result {
            Ok(lease) => Acquired::Granted {
                token: lease.token(),
                valid_until: lease.valid_until().map_or(0, |at| self.ns(at)),
            },
            Err(e) => error_outcome(&self.shared.history, e),
        }
    }

    /// Takes `key` and records it; the lease if granted.
    fn lock(&mut self, key: &str, wait_ms: u64, lease_ms: u64, renew: bool) -> Option<Lease> {
        let mut builder = self
            .handle
            .lock(Key::new(key).expect("a key"))
            .wait(Duration::from_millis(wait_ms))
            .lease(Duration::from_millis(lease_ms));
        if renew {
            builder = builder.renew();
        }
        let invoked = self.shared.history.now();
        let result = builder.send();
        let completed = self.shared.history.now();
        self.shared.history.push(Entry::Acquire {
            client: self.id,
            key: key.to_owned(),
            invoked,
            completed,
            lease_ms,
            renew,
            outcome: self.acquired(&result),
        });
        result.ok()
    }

    /// Writes the lease's token if it is valid with room to spare; whether
    /// it did.
    fn write(&self, lease: &Lease) -> bool {
        let room = lease
            .valid_until()
            .is_some_and(|until| Instant::now() + WRITE_MARGIN < until);
        if !room || !matches!(lease.status(), LeaseStatus::Valid { .. }) {
            return false;
        }
        self.write_anyway(lease);
        true
    }

    fn write_anyway(&self, lease: &Lease) {
        let key = lease.key().as_str().to_owned();
        let at = self.shared.history.now();
        let accepted = self.shared.store.write(&key, lease.token());
        self.shared.history.push(Entry::Write {
            client: self.id,
            key,
            token: lease.token(),
            at,
            accepted,
        });
    }

    /// Holds `lease` for `hold`, writing every `every` while it may.
    fn hold(&self, lease: &Lease, hold: Duration, every: Duration) {
        let until = Instant::now() + hold;
        while Instant::now() < until && !self.shared.stopped() {
            if !self.write(lease) && lease.status().is_over() {
                break;
            }
            thread::sleep(every.min(until.saturating_duration_since(Instant::now())));
        }
    }

    /// Releases `lease` and records how its hold ended.
    fn end(&self, lease: Lease, release: bool) {
        let key = lease.key().as_str().to_owned();
        let token = lease.token();
        let status = lease.status();
        let valid_until = lease.valid_until().map_or(0, |at| self.ns(at));
        let at = self.shared.history.now();
        let released = if release {
            let invoked = self.shared.history.now();
            let result = lease.release();
            let completed = self.shared.history.now();
            let how = match result {
                Ok(Outcome::Released) => "released".to_owned(),
                Ok(Outcome::NotHeld) => "not_held".to_owned(),
                Ok(Outcome::Lapsed) => "lapsed".to_owned(),
                Ok(other) => format!("{other:?}"),
                Err(e) => format!("error: {e}"),
            };
            Some((invoked, completed, how))
        } else {
            drop(lease.let_expire());
            None
        };
        self.shared.history.push(Entry::HoldEnd {
            client: self.id,
            key,
            token,
            at,
            valid_until,
            status: status_name(status).to_owned(),
            released,
        });
    }

    fn shared_key(&mut self) -> String {
        format!("k{}", self.rng.range(0, self.shared.keys as u64 - 1))
    }

    /// One operation, drawn from the seed.
    fn step(&mut self) {
        let roll = self.rng.range(0, 99);
        if roll < 45 {
            // A short hold of a shared key.
            let key = self.shared_key();
            let (wait, lease) = (self.rng.range(0, 1_500), self.rng.range(600, 1_500));
            if let Some(lease_) = self.lock(&key, wait, lease, false) {
                let hold = Duration::from_millis(self.rng.range(10, 200));
                self.hold(&lease_, hold, Duration::from_millis(40));
                self.end(lease_, true);
            }
        } else if roll < 70 {
            // A renewing hold, through whatever faults come.
            let key = self.shared_key();
            if let Some(lease) = self.lock(&key, 1_000, 1_000, true) {
                let hold = Duration::from_millis(self.rng.range(1_000, 4_000));
                self.hold(&lease, hold, Duration::from_millis(100));
                let release = !self.rng.chance(10);
                self.end(lease, release);
            }
        } else if roll < 85 {
            // A try-lock of a key of its own.
            let key = format!("p{}", self.id);
            if let Some(lease) = self.lock(&key, 0, 800, false) {
                self.write(&lease);
                self.end(lease, true);
            }
        } else {
            self.cancelled();
        }
    }

    /// An acquire cancelled after a moment, its outcome recorded.
    fn cancelled(&mut self) {
        let key = self.shared_key();
        let lease_ms = 800;
        let pending = self
            .handle
            .acquire(Key::new(&key).expect("a key"))
            .wait(Duration::from_millis(2_000))
            .lease(Duration::from_millis(lease_ms))
            .start();
        let invoked = self.shared.history.now();
        thread::sleep(Duration::from_millis(self.rng.range(0, 100)));
        pending.cancel();
        let result = pending.wait();
        let completed = self.shared.history.now();
        let outcome = match &result {
            Ok(grant) => Acquired::Granted {
                token: grant.token(),
                valid_until: self
                    .handle
                    .instant_of(grant.valid_until())
                    .map_or(0, |at| self.ns(at)),
            },
            Err(e) => error_outcome(&self.shared.history, e),
        };
        self.shared.history.push(Entry::Acquire {
            client: self.id,
            key: key.clone(),
            invoked,
            completed,
            lease_ms,
            renew: false,
            outcome: outcome.clone(),
        });
        if let (Ok(grant), Acquired::Granted { valid_until, .. }) = (result, outcome) {
            // Granted before the cancel took: released at once.
            let at = self.shared.history.now();
            let token = grant.token();
            let r_invoked = self.shared.history.now();
            let how = match self.handle.release(&grant) {
                Ok(Outcome::Released) => "released".to_owned(),
                Ok(other) => format!("{other:?}"),
                Err(e) => format!("error: {e}"),
            };
            let r_completed = self.shared.history.now();
            self.shared.history.push(Entry::HoldEnd {
                client: self.id,
                key,
                token,
                at,
                valid_until,
                status: "valid".to_owned(),
                released: Some((r_invoked, r_completed, how)),
            });
        }
    }
}

fn error_outcome(history: &History, e: &AcquireError) -> Acquired {
    match e {
        AcquireError::TimedOut { sent, cause } => Acquired::TimedOut {
            sent: *sent,
            cause: cause.as_ref().map(|c| c.reason().to_string()),
        },
        AcquireError::Busy => Acquired::Busy,
        AcquireError::Cancelled => Acquired::Cancelled,
        AcquireError::Indeterminate { settles_by } => Acquired::Indeterminate {
            settles_by: history.ns(*settles_by),
        },
        AcquireError::Misconfigured(cause) => Acquired::Misconfigured(cause.to_string()),
        other => Acquired::Other(other.to_string()),
    }
}

/// A client thread: worker `id` with `config` made from the shared one
/// (`tweak`), running `body`, then shutting down within `budget`.
fn spawn(
    shared: &Shared,
    id: usize,
    endpoints: Vec<String>,
    tweak: impl FnOnce(&mut Config) + Send + 'static,
    budget: Duration,
    body: impl FnOnce(&mut Worker) + Send + 'static,
) -> JoinHandle<()> {
    let shared = shared.clone();
    thread::spawn(move || {
        let mut config = shared.config(id, &endpoints);
        tweak(&mut config);
        let handle = shared.connect(config);
        let mut worker = Worker {
            id,
            shared,
            handle,
            rng: Rng::new(id as u64),
        };
        body(&mut worker);
        let _ = worker.handle.shutdown(budget);
    })
}

/// Starts `n` workers; each runs until `shared.stop`, then shuts down.
pub fn start_workers(shared: &Shared, n: usize, seed: u64) -> Vec<JoinHandle<()>> {
    (0..n)
        .map(|id| {
            let endpoints = shared.endpoints.clone();
            spawn(
                shared,
                id,
                endpoints,
                |_| {},
                Duration::from_secs(2),
                move |worker| {
                    worker.rng = Rng::new(seed ^ (id as u64).wrapping_mul(0x51_7cc1_b727_220a));
                    while !worker.shared.stopped() {
                        worker.step();
                    }
                },
            )
        })
        .collect()
}

/// The availability probe: a try-lock of a key nobody else asks for,
/// every 100 ms, released at once.
pub fn start_availability_probe(shared: &Shared, id: usize) -> JoinHandle<()> {
    let endpoints = shared.endpoints.clone();
    spawn(
        shared,
        id,
        endpoints,
        |_| {},
        Duration::from_secs(2),
        |worker| {
            while !worker.shared.stopped() {
                if let Some(lease) = worker.lock("free", 0, 500, false) {
                    worker.end(lease, true);
                }
                thread::sleep(Duration::from_millis(100));
            }
        },
    )
}

/// A probe that talks only to `endpoint` (a member about to be cut off
/// into a minority): try-locks of a key of its own until `until`.
pub fn start_minority_probe(
    shared: &Shared,
    id: usize,
    endpoint: &str,
    until: Instant,
) -> JoinHandle<()> {
    // Many tries while the member is cut off: a try-lock that finds no
    // connection waits this long, not the default 2 s. And no hint taken:
    // a follower cut off names the leader, which a member that joined
    // may be (the others' allowlist has it), and a grant from there is no
    // grant of the minority's.
    let tweak = |config: &mut Config| {
        config.queue_grace = Duration::from_millis(200);
        config.allow.clear();
    };
    let endpoints = vec![endpoint.to_owned()];
    spawn(
        shared,
        id,
        endpoints,
        tweak,
        Duration::from_millis(500),
        move |worker| {
            let key = format!("m{id}");
            while Instant::now() < until {
                if let Some(lease) = worker.lock(&key, 0, 500, false) {
                    worker.end(lease, true);
                }
                thread::sleep(Duration::from_millis(50));
            }
        },
    )
}

/// The sabotage: a client that goes on writing for 1.5 s after taking a
/// lease of 400 ms that it never renews. The checker must catch it.
pub fn start_saboteur(shared: &Shared, id: usize) -> JoinHandle<()> {
    let endpoints = shared.endpoints.clone();
    spawn(
        shared,
        id,
        endpoints,
        |_| {},
        Duration::from_secs(1),
        |worker| {
            while !worker.shared.stopped() {
                if let Some(lease) = worker.lock("k0", 2_000, 400, false) {
                    let until = Instant::now() + Duration::from_millis(1_500);
                    while Instant::now() < until {
                        worker.write_anyway(&lease);
                        thread::sleep(Duration::from_millis(50));
                    }
                    worker.end(lease, false);
                }
            }
        },
    )
}
