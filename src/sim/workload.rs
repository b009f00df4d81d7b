//! What a seed draws (the cluster's and the clients' settings, the fault
//! rates), and what the embedders do.
//!
//! Each client, at random intervals: acquires a random key (sometimes a
//! burst of acquires, often of one key) with a random wait budget and
//! lease; or cancels one of its open acquires; or idles. A grant it is
//! handed is written to the key's resource at once, maybe again while it
//! holds it, and after a random time released, abandoned (handed back as
//! undeliverable, as when the waiting task is gone), or leaked (left to
//! expire); now and then a late write follows, as from a process that
//! paused. At the end each client, maybe after releasing what it holds,
//! shuts down with a random budget.

use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};

use super::world::{Ev, Step, World};
use super::{FaultKind, SimConfig};
use crate::client::{Backoff, BusyPolicy, CancelPolicy, Config, Grant, OpId};
use crate::names::{Endpoint, Key, Name};
use crate::rng::Rng;
use crate::server;

/// Wait budgets, in milliseconds.
const WAITS_MS: [u64; 7] = [0, 0, 10, 100, 500, 2_000, 5_000];
/// Leases, in milliseconds.
const LEASES_MS: [u64; 7] = [20, 100, 300, 1_000, 3_000, 10_000, 30_000];
/// Shutdown budgets, in milliseconds.
const BUDGETS_MS: [u64; 4] = [0, 100, 1_000, 5_000];

/// The fault kinds injected on a schedule (the others happen per write, per
/// connect, or as consequences).
pub(super) const SCHEDULED: [FaultKind; 9] = [
    FaultKind::Reset,
    FaultKind::Crash,
    FaultKind::Partition,
    FaultKind::Moved,
    FaultKind::NoLeader,
    FaultKind::Vanished,
    FaultKind::Hint,
    FaultKind::NotActive,
    FaultKind::AuthRefused,
];

fn pick<T: Copy>(rng: &mut Rng, from: &[T]) -> T {
    from[rng.up_to(from.len() as u64 - 1) as usize]
}

/// What a seed draws for the whole run.
#[derive(Debug, Clone)]
pub(super) struct Params {
    pub(super) keys: Vec<Key>,
    /// The base one-way latency range, in microseconds.
    pub(super) latency_us: (u64, u64),
    /// Per mille of writes delayed by a latency spike.
    pub(super) spike_pm: u64,
    /// Per mille of writes split into chunks.
    pub(super) split_pm: u64,
    /// Per mille of connects refused.
    pub(super) refuse_pm: u64,
    /// The mean interval of each scheduled fault kind, in milliseconds
    /// (`None`: the kind is off for this seed).
    pub(super) fault_means: Vec<(FaultKind, Option<u64>)>,
    /// The cluster's settings (node id and role are set per node).
    pub(super) server: server::Config,
}

impl Params {
    pub(super) fn draw(rng: &mut Rng, _config: &SimConfig) -> Params {
        let key_count = pick(rng, &[1, 2, 3, 4, 6]);
        let keys = (0..key_count)
            .map(|i| Key::new(format!("k{i}")).expect("an atom"))
            .collect();
        let low = rng.up_to(2_000);
        let latency_us = (low, low + rng.up_to(30_000));
        let spike_pm = pick(rng, &[0, 10, 50]);
        let split_pm = pick(rng, &[0, 100, 500]);
        let refuse_pm = pick(rng, &[0, 100, 300]);
        let fault_means = SCHEDULED
            .iter()
            .map(|&kind| {
                let mean = rng.chance(3, 4).then(|| 1_000 + rng.up_to(5_000));
                (kind, mean)
            })
            .collect();
        let mut server = server::Config::new(Name::new("template").expect("an atom"));
        server.window = pick(rng, &[2, 3, 4, 8, 64]);
        server.queue_limit = pick(rng, &[0, 1, 2, 4, 1024, 1024]);
        server.max_waiters = pick(rng, &[2, 8, 65_536, 65_536]);
        server.max_lease = Duration::from_millis(pick(rng, &[200, 2_000, 60_000, 60_000]));
        server.credential = rng
            .chance(1, 2)
            .then(|| Name::new("secret").expect("an atom"));
        Params {
            keys,
            latency_us,
            spike_pm,
            split_pm,
            refuse_pm,
            fault_means,
            server,
        }
    }
}

/// Client `c`'s configuration: some nodes as endpoints (in a random order),
/// the others allowlisted; the cluster's credential; random policies.
pub(super) fn client_config(
    c: usize,
    rng: &mut Rng,
    nodes: &[Endpoint],
    params: &Params,
) -> Config {
    let mut order: Vec<Endpoint> = nodes.to_vec();
    for i in (1..order.len()).rev() {
        let j = rng.up_to(i as u64) as usize;
        order.swap(i, j);
    }
    let count = 1 + rng.up_to(order.len() as u64 - 1) as usize;
    let allow = order.split_off(count);
    let mut config = Config::new(order, Name::new(format!("c{c}")).expect("an atom"));
    config.allow = allow;
    config.credential = params.server.credential.clone();
    config.reserved = 1 + rng.up_to(2) as u32;
    config.busy = if rng.chance(1, 5) {
        BusyPolicy::FailFast
    } else {
        BusyPolicy::Retry
    };
    config.cancel = if rng.chance(1, 2) {
        CancelPolicy::KeepWaiter
    } else {
        CancelPolicy::Close
    };
    config.answer_grace = Duration::from_millis(pick(rng, &[300, 1_000, 3_000]));
    config.connect_timeout = Duration::from_secs(1);
    config.handshake_timeout = Duration::from_secs(1);
    config.release_attempts = pick(rng, &[2, 8]);
    config.max_acquires = pick(rng, &[4, 64]);
    let ms = Duration::from_millis;
    config.backoff.transport = Backoff::new(ms(50), ms(2_000));
    config.backoff.no_leader = Backoff::new(ms(50), ms(1_000));
    config.backoff.not_active = Backoff::new(ms(100), ms(2_000));
    config.backoff.auth_failed = Backoff::new(ms(500), ms(2_000));
    config.backoff.redirect = Backoff::new(ms(50), ms(1_000));
    config.backoff.busy = Backoff::new(ms(10), ms(200));
    config.seed = rng.next_u64();
    config
}

/// What the embedder does with a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    Release,
    Abandon,
    Leak,
}

/// A grant the embedder holds.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) grant: Grant,
    fate: Fate,
}

/// One client's embedder.
#[derive(Debug)]
pub(super) struct Work {
    /// The range of the interval between commands, in milliseconds.
    pub(super) interval_ms: (u64, u64),
    pub(super) next_owner: u64,
    /// Acquires without an outcome yet (for cancelling one).
    pub(super) open_acquires: BTreeSet<OpId>,
    /// The embedder's releases without an outcome yet, with their token.
    pub(super) release_ops: BTreeMap<OpId, u64>,
    held: BTreeMap<u64, Held>,
    next_no: u64,
    release_at_shutdown: bool,
    budget: Duration,
}

impl Work {
    pub(super) fn draw(rng: &mut Rng) -> Work {
        let lo = 20 + rng.up_to(200);
        let hi = lo + rng.up_to(800);
        Work {
            interval_ms: (lo, hi),
            next_owner: 0,
            open_acquires: BTreeSet::new(),
            release_ops: BTreeMap::new(),
            held: BTreeMap::new(),
            next_no: 0,
            release_at_shutdown: rng.chance(1, 2),
            budget: Duration::from_millis(pick(rng, &BUDGETS_MS)),
        }
    }
}

impl World {
    fn random_key(&mut self) -> Key {
        let keys = &self.params.keys;
        keys[self.rng.up_to(keys.len() as u64 - 1) as usize].clone()
    }

    /// A client's next spontaneous command.
    pub(super) fn on_work(&mut self, c: usize) -> Step {
        if self.now >= self.work_end || self.clients[c].shutdown_at.is_some() {
            return Ok(());
        }
        let roll = self.rng.up_to(99);
        if roll < 70 {
            let burst = if self.rng.chance(1, 4) {
                2 + self.rng.up_to(3)
            } else {
                1
            };
            let key = self.random_key();
            for _ in 0..burst {
                let key = if self.rng.chance(3, 4) {
                    key.clone()
                } else {
                    self.random_key()
                };
                let wait = Duration::from_millis(pick(&mut self.rng, &WAITS_MS));
                let lease = Duration::from_millis(pick(&mut self.rng, &LEASES_MS));
                self.cmd_acquire(c, key, wait, lease)?;
            }
        } else if roll < 82 {
            let open = &self.clients[c].work.open_acquires;
            if !open.is_empty() {
                let i = self.rng.up_to(open.len() as u64 - 1) as usize;
                let op = *open.iter().nth(i).expect("in range");
                self.cmd_cancel(c, op)?;
            }
        }
        let (lo, hi) = self.clients[c].work.interval_ms;
        let next = self.millis_between(lo, hi);
        self.schedule_in(next, Ev::Work { client: c });
        Ok(())
    }

    /// The embedder of `c` was handed `grant`: it holds it (checked for
    /// mutual exclusion), writes with it at once, and decides when to give
    /// it up.
    pub(super) fn on_granted(&mut self, c: usize, grant: Grant) -> Step {
        let now = self.now;
        if let Err(failure) =
            self.ledger
                .hold(c, grant.key(), grant.token(), grant.valid_until(), now)
        {
            return Err(self.failure(failure));
        }
        if let Err(failure) = self.ledger.write(c, grant.key(), grant.token(), now) {
            return Err(self.failure(failure));
        }
        let lease_ms = grant.lease().as_millis() as u64;
        let fate = match self.rng.up_to(99) {
            0..=69 => Fate::Release,
            70..=84 => Fate::Abandon,
            _ => Fate::Leak,
        };
        // Held up to one and a half leases, or six seconds: long leases are
        // mostly given up early, so that their releases matter.
        let hold = self.millis_between(0, (lease_ms + lease_ms / 2).min(6_000));
        let work = &mut self.clients[c].work;
        work.next_no += 1;
        let no = work.next_no;
        work.held.insert(no, Held { grant, fate });
        self.schedule_in(hold, Ev::Fate { client: c, no });
        if self.rng.chance(1, 2) {
            let at = self.rng.up_to(hold.as_millis() as u64);
            self.schedule_in(Duration::from_millis(at), Ev::Write { client: c, no });
        }
        Ok(())
    }

    /// The embedder gives a grant up: releases it, hands it back, or lets
    /// it expire; maybe a late write follows.
    pub(super) fn on_fate(&mut self, c: usize, no: u64) -> Step {
        let Some(held) = self.clients[c].work.held.remove(&no) else {
            return Ok(());
        };
        if self.clients[c].finished {
            return Ok(());
        }
        match held.fate {
            Fate::Release => self.cmd_release(c, &held.grant)?,
            Fate::Abandon => self.cmd_undeliverable(c, &held.grant)?,
            Fate::Leak => {}
        }
        if self.rng.chance(1, 10) {
            let later = self.millis_between(0, 2_000);
            self.schedule_in(
                later,
                Ev::Zombie {
                    client: c,
                    key: held.grant.key().clone(),
                    token: held.grant.token(),
                },
            );
        }
        Ok(())
    }

    /// A write with a grant the embedder still holds.
    pub(super) fn on_write(&mut self, c: usize, no: u64) -> Step {
        let Some(held) = self.clients[c].work.held.get(&no) else {
            return Ok(());
        };
        let (key, token) = (held.grant.key().clone(), held.grant.token());
        match self.ledger.write(c, &key, token, self.now) {
            Ok(()) => Ok(()),
            Err(failure) => Err(self.failure(failure)),
        }
    }

    /// A late write.
    pub(super) fn on_zombie(&mut self, c: usize, key: Key, token: u64) -> Step {
        match self.ledger.write(c, &key, token, self.now) {
            Ok(()) => Ok(()),
            Err(failure) => Err(self.failure(failure)),
        }
    }

    /// The client shuts down, maybe releasing what it holds first.
    pub(super) fn on_shutdown(&mut self, c: usize) -> Step {
        if self.clients[c].finished {
            return Ok(());
        }
        if self.clients[c].work.release_at_shutdown {
            let held: Vec<Held> = core::mem::take(&mut self.clients[c].work.held)
                .into_values()
                .collect();
            for h in held {
                self.cmd_release(c, &h.grant)?;
            }
        }
        let budget = self.clients[c].work.budget;
        self.cmd_shutdown(c, budget)
    }
}
