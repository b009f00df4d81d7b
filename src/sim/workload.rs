//! What a seed draws (the cluster's and the clients' settings, the fault
//! rates), and what the embedders do.
//!
//! Each client, at random intervals: acquires a random key (sometimes a
//! burst of acquires, often of one key) with a random wait budget and
//! lease, a third of the time renewed automatically (`acquire_renewing`,
//! with or without a limit); or cancels one of its open acquires; or idles.
//! A grant it is handed is written to the key's resource at once, maybe
//! again while it holds it, and after a random time released, abandoned
//! (handed back as undeliverable, as when the waiting task is gone), or
//! leaked (left to expire); now and then a late write follows, as from a
//! process that paused. A grant it means to keep longer than its lease it
//! renews: by hand, now and then before its lease runs out, or by asking
//! for automatic renewal (with or without a limit) once it holds it, which
//! it may stop again. At the end each client, maybe after releasing what it
//! holds, shuts down with a random budget.
//!
//! In [`Scenario::LeaderCrash`] each client instead holds one or two keys
//! of its own from the start until it shuts down, renewed automatically
//! with no limit, with leases of at least three election TTLs (PROTOCOL.md
//! 4.2's rule of thumb), writing with them now and then; beside them, now
//! and then, a plain acquire of a shared key with a short wait and lease,
//! released within half its lease. It then releases everything and shuts
//! down. No fault is drawn: the cluster plans its crashes itself.
//!
//! The [`Workload`] is every client's embedder. It owns what they hold and
//! draws what they do from a generator of its own. It calls no client: it
//! is told of each client's outcomes, and each of its [`Ev`]ents and each
//! grant it is handed gives back its [`Effect`]s in order (commands for the
//! client, writes to the resources, what to schedule), which the world
//! carries out.

use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};

use super::cluster::ELECTION_TTL_MS;
use super::{millis_between, FaultKind, Scenario, SimConfig};
use crate::client::{Backoff, BusyPolicy, CancelPolicy, Config, Grant, OpId, Outcome};
use crate::names::{Endpoint, Key, Name};
use crate::rng::Rng;
use crate::server;
use crate::time::Time;

/// Wait budgets, in milliseconds.
const WAITS_MS: [u64; 7] = [0, 0, 10, 100, 500, 2_000, 5_000];
/// Leases, in milliseconds.
const LEASES_MS: [u64; 7] = [20, 100, 300, 1_000, 3_000, 10_000, 30_000];
/// Shutdown budgets, in milliseconds.
const BUDGETS_MS: [u64; 4] = [0, 100, 1_000, 5_000];
/// Limits on automatic renewal (`renew_until`), in leases: `None` renews
/// until released.
const RENEW_LIMITS: [Option<u64>; 5] = [None, None, Some(0), Some(1), Some(3)];

/// The holders' leases in [`Scenario::LeaderCrash`], in milliseconds.
const HOLDER_LEASES_MS: [u64; 4] = [7_500, 8_000, 10_000, 15_000];
const _: () = assert!(
    HOLDER_LEASES_MS[0] >= 3 * ELECTION_TTL_MS.1,
    "PROTOCOL.md 4.2: leases of at least three election TTLs"
);
/// How long a holder waits for its key (its own: nobody else takes it).
const HOLDER_WAIT: Duration = Duration::from_secs(2);
/// Wait budgets of the traffic beside the holders, in milliseconds.
const PASSING_WAITS_MS: [u64; 4] = [0, 100, 500, 2_000];
/// Leases of the traffic beside the holders, in milliseconds.
const PASSING_LEASES_MS: [u64; 3] = [300, 1_000, 3_000];

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
    /// What the run does (not drawn: the configuration's).
    pub(super) scenario: Scenario,
    /// The keys the clients share.
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
    pub(super) fn draw(rng: &mut Rng, config: &SimConfig) -> Params {
        match config.scenario {
            Scenario::Mixed => Params::mixed(rng),
            Scenario::LeaderCrash => Params::leader_crash(rng),
            #[cfg(feature = "raft")]
            Scenario::Raft | Scenario::Raft5 => Params::raft(rng, config.scenario),
        }
    }

    /// Every fault at a rate of its own (or off), and settings that make
    /// some of them likely: small windows, tight queue limits, leases cut
    /// short by the server.
    fn mixed(rng: &mut Rng) -> Params {
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
            scenario: Scenario::Mixed,
            keys,
            latency_us,
            spike_pm,
            split_pm,
            refuse_pm,
            fault_means,
            server,
        }
    }

    /// [`Scenario::LeaderCrash`]: the base latency alone and no fault of
    /// the world's; a window with room for acquires beside the reserved
    /// slots (three at most) and the default queue limits, so that the
    /// traffic does not crowd the holders out; a longest lease above every
    /// holder's.
    fn leader_crash(rng: &mut Rng) -> Params {
        let key_count = pick(rng, &[1, 2, 3]);
        let keys = (0..key_count)
            .map(|i| Key::new(format!("k{i}")).expect("an atom"))
            .collect();
        let low = rng.up_to(2_000);
        let latency_us = (low, low + rng.up_to(30_000));
        let mut server = server::Config::new(Name::new("template").expect("an atom"));
        server.window = pick(rng, &[4, 8, 64]);
        let longest = HOLDER_LEASES_MS[HOLDER_LEASES_MS.len() - 1];
        server.max_lease = Duration::from_millis(pick(rng, &[longest, 60_000]));
        server.credential = rng
            .chance(1, 2)
            .then(|| Name::new("secret").expect("an atom"));
        Params {
            scenario: Scenario::LeaderCrash,
            keys,
            latency_us,
            spike_pm: 0,
            split_pm: 0,
            refuse_pm: 0,
            fault_means: SCHEDULED.iter().map(|&kind| (kind, None)).collect(),
            server,
        }
    }
}

impl Params {
    /// `Scenario::Raft`: the leader-crash scenario's clients and settings,
    /// with latency spikes and split writes on the clients' side (the
    /// members' faults are drawn by the cluster, `raft.rs`).
    #[cfg(feature = "raft")]
    fn raft(rng: &mut Rng, scenario: Scenario) -> Params {
        let mut params = Params::leader_crash(rng);
        params.scenario = scenario;
        params.spike_pm = pick(rng, &[0, 5, 20]);
        params.split_pm = pick(rng, &[0, 100, 300]);
        params
    }
}

/// Client `c`'s configuration: some nodes as endpoints (in a random order),
/// the others allowlisted; the cluster's credential; random policies. In
/// [`Scenario::LeaderCrash`] at least two nodes are endpoints (a client
/// whose one endpoint is the leader that crashed could find nobody until
/// that node is back), and the timeouts and backoffs are the defaults.
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
    let least = if params.scenario.holds_keys() {
        order.len().min(2)
    } else {
        1
    };
    let count = least + rng.up_to((order.len() - least) as u64) as usize;
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
    config.release_attempts = pick(rng, &[2, 8]);
    config.max_acquires = pick(rng, &[4, 64]);
    // Short timeouts and backoffs, so that a run under every fault gets on
    // with its work. Where holders renew, the defaults, as a deployed
    // client has them: only the cap that a held lease puts on every wait
    // keeps a holder from backing off (up to 5 s) past what is left of its
    // lease.
    if !params.scenario.holds_keys() {
        let ms = Duration::from_millis;
        config.connect_timeout = Duration::from_secs(1);
        config.handshake_timeout = Duration::from_secs(1);
        config.backoff.transport = Backoff::new(ms(50), ms(2_000));
        config.backoff.no_leader = Backoff::new(ms(50), ms(1_000));
        config.backoff.not_active = Backoff::new(ms(100), ms(2_000));
        config.backoff.auth_failed = Backoff::new(ms(500), ms(2_000));
        config.backoff.redirect = Backoff::new(ms(50), ms(1_000));
        config.backoff.busy = Backoff::new(ms(10), ms(200));
    }
    config.seed = rng.next_u64();
    // A quarter of the clients give up while unreachable: taken from the
    // client's own seed, so that the seed's other draws stay as they were.
    config.give_up_while_unreachable = config.seed % 4 == 0;
    config
}

/// Something an embedder has scheduled.
#[derive(Debug)]
pub(super) enum Ev {
    /// A client's next spontaneous command.
    Work { client: usize },
    /// A client decides what to do with a grant it holds.
    Fate { client: usize, no: u64 },
    /// A client writes to a key's resource with a grant it holds.
    Write { client: usize, no: u64 },
    /// A client renews a grant it holds, by hand, or asks for (or stops)
    /// its automatic renewal.
    Renew {
        client: usize,
        no: u64,
        how: RenewHow,
    },
    /// A late write, with a grant given up or past its validity.
    Zombie { client: usize, key: Key, token: u64 },
    /// A client acquires its own key `no`, to hold it until it shuts down
    /// ([`Scenario::LeaderCrash`]).
    Hold { client: usize, no: u64 },
    /// A client shuts down.
    Shutdown { client: usize },
}

impl Ev {
    /// The client whose embedder scheduled it.
    pub(super) fn client(&self) -> usize {
        match *self {
            Ev::Work { client }
            | Ev::Fate { client, .. }
            | Ev::Write { client, .. }
            | Ev::Renew { client, .. }
            | Ev::Zombie { client, .. }
            | Ev::Hold { client, .. }
            | Ev::Shutdown { client } => client,
        }
    }
}

/// What the world must do for one client's embedder, in order.
#[derive(Debug)]
pub(super) enum Effect {
    /// Schedule `Ev` at a time.
    At(Time, Ev),
    /// Call the client.
    Command(Command),
    /// Write to `key`'s resource with `token`.
    Write { key: Key, token: u64 },
}

/// How an embedder renews a grant it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RenewHow {
    /// `renew(grant, lease)` once, then again before that runs out.
    Manual { lease: Option<Duration> },
    /// `auto_renew(grant, limit)`.
    Auto { limit: Option<Duration> },
    /// `stop_renewing(grant)`.
    Stop,
}

/// A call an embedder makes to its client.
#[derive(Debug)]
pub(super) enum Command {
    /// `acquire(key, owner, wait, lease)`, or with `renew`,
    /// `acquire_renewing(key, owner, wait, lease, limit)`; the owner is the
    /// acquire's own.
    Acquire {
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        renew: Option<Option<Duration>>,
    },
    /// `renew(grant, lease)`, `auto_renew(grant, limit)` or
    /// `stop_renewing(grant)`.
    Renew(Grant, RenewHow),
    /// `cancel(op)`.
    Cancel(OpId),
    /// `release(grant)`.
    Release(Grant),
    /// `undeliverable(grant)`.
    Undeliverable(Grant),
    /// `shutdown(budget)`.
    Shutdown(Duration),
}

/// What the embedder does with a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Release,
    Abandon,
    Leak,
    /// Keeps it until the client shuts down, writing with it now and then
    /// ([`Scenario::LeaderCrash`]).
    Keep,
}

/// A grant the embedder holds.
#[derive(Debug, Clone)]
struct Held {
    grant: Grant,
    fate: Fate,
}

/// One client's embedder.
#[derive(Debug)]
struct Embedder {
    /// The range of the interval between commands, in milliseconds.
    interval_ms: (u64, u64),
    next_owner: u64,
    /// Acquires without an outcome yet (for cancelling one).
    open_acquires: BTreeSet<OpId>,
    /// Those that asked for automatic renewal.
    renewing: BTreeSet<OpId>,
    held: BTreeMap<u64, Held>,
    next_no: u64,
    release_at_shutdown: bool,
    budget: Duration,
    /// It has told its client to shut down.
    shut_down: bool,
    /// Its client has finished.
    finished: bool,
}

/// Every client's embedder.
pub(super) struct Workload {
    rng: Rng,
    scenario: Scenario,
    keys: Vec<Key>,
    embedders: Vec<Embedder>,
    /// When the embedders stop their spontaneous commands and shut down.
    work_end: Time,
}

impl Workload {
    /// Embedders for `clients` clients, as `params` say, who start at
    /// `now` and work until `work_end`; with the events to schedule first.
    pub(super) fn new(
        mut rng: Rng,
        params: &Params,
        clients: usize,
        now: Time,
        work_end: Time,
    ) -> (Workload, Vec<(Time, Ev)>) {
        let mut first = Vec::new();
        let embedders = (0..clients)
            .map(|client| {
                let lo = 20 + rng.up_to(200);
                let hi = lo + rng.up_to(800);
                let start = now.saturating_add(Duration::from_millis(rng.up_to(hi)));
                first.push((start, Ev::Work { client }));
                let stagger = Duration::from_millis(rng.up_to(1_000));
                let shutdown = work_end.saturating_add(stagger);
                first.push((shutdown, Ev::Shutdown { client }));
                let mut embedder = Embedder {
                    interval_ms: (lo, hi),
                    next_owner: 0,
                    open_acquires: BTreeSet::new(),
                    renewing: BTreeSet::new(),
                    held: BTreeMap::new(),
                    next_no: 0,
                    release_at_shutdown: rng.chance(1, 2),
                    budget: Duration::from_millis(pick(&mut rng, &BUDGETS_MS)),
                    shut_down: false,
                    finished: false,
                };
                if params.scenario.holds_keys() {
                    // Holders let go of their keys when they are done.
                    embedder.release_at_shutdown = true;
                    for no in 0..1 + rng.up_to(1) {
                        let at = now.saturating_add(Duration::from_millis(rng.up_to(500)));
                        first.push((at, Ev::Hold { client, no }));
                    }
                }
                embedder
            })
            .collect();
        let workload = Workload {
            rng,
            scenario: params.scenario,
            keys: params.keys.clone(),
            embedders,
            work_end,
        };
        (workload, first)
    }

    /// One of the embedders' own events, at `now`.
    pub(super) fn handle(&mut self, ev: Ev, now: Time, out: &mut Vec<Effect>) {
        match ev {
            Ev::Work { client } => self.work(client, now, out),
            Ev::Fate { client, no } => self.fate(client, no, now, out),
            Ev::Write { client, no } => {
                if let Some(held) = self.embedders[client].held.get(&no) {
                    let (key, token) = (held.grant.key().clone(), held.grant.token());
                    let again = held.fate == Fate::Keep;
                    out.push(Effect::Write { key, token });
                    if again {
                        self.write_later(client, no, now, out);
                    }
                }
            }
            Ev::Renew { client, no, how } => self.renew(client, no, how, now, out),
            Ev::Zombie { key, token, .. } => out.push(Effect::Write { key, token }),
            Ev::Hold { client, no } => self.hold(client, no, now, out),
            Ev::Shutdown { client } => self.shutdown(client, out),
        }
    }

    /// The client accepted an acquire of `client`'s embedder as `op`
    /// (renewed automatically once granted, with `renewing`).
    pub(super) fn acquired(&mut self, client: usize, op: OpId, renewing: bool) {
        self.embedders[client].open_acquires.insert(op);
        if renewing {
            self.embedders[client].renewing.insert(op);
        }
    }

    /// The client told `client`'s embedder that `op` ended with `outcome`,
    /// at `now`. The effects are writes and events to schedule, never a
    /// command: the client is still being drained.
    pub(super) fn outcome(
        &mut self,
        client: usize,
        op: OpId,
        outcome: &Outcome,
        now: Time,
        out: &mut Vec<Effect>,
    ) {
        self.embedders[client].open_acquires.remove(&op);
        let auto = self.embedders[client].renewing.remove(&op);
        if let Outcome::Granted(grant) = outcome {
            self.granted(client, grant.clone(), auto, now, out);
        }
    }

    /// `client`'s client has finished.
    pub(super) fn finished(&mut self, client: usize) {
        self.embedders[client].finished = true;
    }

    fn random_key(&mut self) -> Key {
        self.keys[self.rng.up_to(self.keys.len() as u64 - 1) as usize].clone()
    }

    /// A new owner name for an acquire of `c`'s.
    fn owner(&mut self, c: usize) -> Name {
        let embedder = &mut self.embedders[c];
        embedder.next_owner += 1;
        Name::new(format!("c{c}.{}", embedder.next_owner)).expect("an atom")
    }

    /// A client's next spontaneous command.
    fn work(&mut self, c: usize, now: Time, out: &mut Vec<Effect>) {
        if now >= self.work_end || self.embedders[c].shut_down {
            return;
        }
        if self.scenario.holds_keys() {
            self.pass_by(c, out);
        } else {
            self.mixed_work(c, out);
        }
        let (lo, hi) = self.embedders[c].interval_ms;
        let next = millis_between(&mut self.rng, lo, hi);
        out.push(Effect::At(now.saturating_add(next), Ev::Work { client: c }));
    }

    /// [`Scenario::Mixed`]: acquires (now and then a burst, often of one
    /// key), or a cancel, or nothing.
    fn mixed_work(&mut self, c: usize, out: &mut Vec<Effect>) {
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
                let renew = self.rng.chance(1, 3).then(|| self.renew_limit(lease));
                let owner = self.owner(c);
                out.push(Effect::Command(Command::Acquire {
                    key,
                    owner,
                    wait,
                    lease,
                    renew,
                }));
            }
        } else if roll < 82 {
            let open = &self.embedders[c].open_acquires;
            if !open.is_empty() {
                let i = self.rng.up_to(open.len() as u64 - 1) as usize;
                let op = *open.iter().nth(i).expect("in range");
                out.push(Effect::Command(Command::Cancel(op)));
            }
        }
    }

    /// [`Scenario::LeaderCrash`]: now and then a plain acquire of a shared
    /// key, with a short wait and lease.
    fn pass_by(&mut self, c: usize, out: &mut Vec<Effect>) {
        if !self.rng.chance(1, 4) {
            return;
        }
        let key = self.random_key();
        let wait = Duration::from_millis(pick(&mut self.rng, &PASSING_WAITS_MS));
        let lease = Duration::from_millis(pick(&mut self.rng, &PASSING_LEASES_MS));
        let owner = self.owner(c);
        out.push(Effect::Command(Command::Acquire {
            key,
            owner,
            wait,
            lease,
            renew: None,
        }));
    }

    /// [`Scenario::LeaderCrash`]: the embedder of `c` acquires its own key
    /// `no`, to hold it renewed automatically, with no limit, until it
    /// shuts down.
    fn hold(&mut self, c: usize, no: u64, now: Time, out: &mut Vec<Effect>) {
        if now >= self.work_end || self.embedders[c].shut_down {
            return;
        }
        let key = Key::new(format!("h{c}.{no}")).expect("an atom");
        let lease = Duration::from_millis(pick(&mut self.rng, &HOLDER_LEASES_MS));
        let owner = self.owner(c);
        out.push(Effect::Command(Command::Acquire {
            key,
            owner,
            wait: HOLDER_WAIT,
            lease,
            renew: Some(None),
        }));
    }

    /// A limit on automatic renewal: none, or a few leases.
    fn renew_limit(&mut self, lease: Duration) -> Option<Duration> {
        pick(&mut self.rng, &RENEW_LIMITS).map(|leases| {
            lease * u32::try_from(leases).unwrap_or(1) + millis_between(&mut self.rng, 0, 500)
        })
    }

    /// The embedder of `c` was handed `grant` (renewed automatically if
    /// `auto`): it writes with it at once, decides when to give it up, and
    /// whether to renew it meanwhile.
    fn granted(&mut self, c: usize, grant: Grant, auto: bool, now: Time, out: &mut Vec<Effect>) {
        out.push(Effect::Write {
            key: grant.key().clone(),
            token: grant.token(),
        });
        if self.scenario.holds_keys() {
            return self.keep_or_pass(c, grant, auto, now, out);
        }
        let lease_ms = grant.lease().as_millis() as u64;
        let fate = match self.rng.up_to(99) {
            0..=69 => Fate::Release,
            70..=84 => Fate::Abandon,
            _ => Fate::Leak,
        };
        // How it renews it, if at all: one grant in four it renews by hand
        // or starts renewing later, besides those acquired renewing.
        let renew = match self.rng.up_to(7) {
            0 => Some(RenewHow::Manual {
                lease: self
                    .rng
                    .chance(1, 2)
                    .then(|| Duration::from_millis(pick(&mut self.rng, &LEASES_MS))),
            }),
            1 => Some(RenewHow::Auto {
                limit: self.renew_limit(grant.lease()),
            }),
            _ => None,
        };
        // Held up to one and a half leases, or six seconds: long leases are
        // mostly given up early, so that their releases matter. A grant it
        // renews it may keep for several leases.
        let longest = if auto || renew.is_some() {
            (lease_ms * 4).clamp(1_000, 12_000)
        } else {
            (lease_ms + lease_ms / 2).min(6_000)
        };
        let hold = millis_between(&mut self.rng, 0, longest);
        let embedder = &mut self.embedders[c];
        embedder.next_no += 1;
        let no = embedder.next_no;
        embedder.held.insert(no, Held { grant, fate });
        out.push(Effect::At(
            now.saturating_add(hold),
            Ev::Fate { client: c, no },
        ));
        if self.rng.chance(1, 2) {
            let write = Duration::from_millis(self.rng.up_to(hold.as_millis() as u64));
            out.push(Effect::At(
                now.saturating_add(write),
                Ev::Write { client: c, no },
            ));
        }
        if let Some(how) = renew {
            // By hand a third of the way through its lease (or at once),
            // or automatic renewal asked for after a while.
            let after = match how {
                RenewHow::Manual { .. } => millis_between(&mut self.rng, 0, lease_ms / 2),
                _ => millis_between(&mut self.rng, 0, lease_ms),
            };
            out.push(Effect::At(
                now.saturating_add(after),
                Ev::Renew { client: c, no, how },
            ));
        } else if auto && self.rng.chance(1, 6) {
            self.stop_renewing_later(c, no, lease_ms, now, out);
        }
    }

    /// [`Scenario::LeaderCrash`]: a holder keeps its grant (renewed
    /// automatically) until it shuts down, and writes with it now and then;
    /// a passer-by releases its grant within half its lease.
    fn keep_or_pass(
        &mut self,
        c: usize,
        grant: Grant,
        auto: bool,
        now: Time,
        out: &mut Vec<Effect>,
    ) {
        let lease_ms = grant.lease().as_millis() as u64;
        let embedder = &mut self.embedders[c];
        embedder.next_no += 1;
        let no = embedder.next_no;
        if auto {
            embedder.held.insert(
                no,
                Held {
                    grant,
                    fate: Fate::Keep,
                },
            );
            self.write_later(c, no, now, out);
        } else {
            let fate = Fate::Release;
            embedder.held.insert(no, Held { grant, fate });
            let hold = millis_between(&mut self.rng, 0, lease_ms / 2);
            let at = now.saturating_add(hold);
            out.push(Effect::At(at, Ev::Fate { client: c, no }));
        }
    }

    /// A write with the grant `no` of `c`, kept until it shuts down, in a
    /// while (while the workload runs).
    fn write_later(&mut self, c: usize, no: u64, now: Time, out: &mut Vec<Effect>) {
        let at = now.saturating_add(millis_between(&mut self.rng, 500, 2_000));
        if at < self.work_end {
            out.push(Effect::At(at, Ev::Write { client: c, no }));
        }
    }

    /// The embedder of `c` stops the automatic renewal of its grant `no`
    /// within twice its lease of `lease_ms` from `now`.
    fn stop_renewing_later(
        &mut self,
        c: usize,
        no: u64,
        lease_ms: u64,
        now: Time,
        out: &mut Vec<Effect>,
    ) {
        let after = millis_between(&mut self.rng, 0, lease_ms * 2);
        out.push(Effect::At(
            now.saturating_add(after),
            Ev::Renew {
                client: c,
                no,
                how: RenewHow::Stop,
            },
        ));
    }

    /// The embedder renews a grant it still holds, or asks for or stops its
    /// automatic renewal; by hand, it renews again before that renewal's
    /// lease runs out, while it holds the grant.
    fn renew(&mut self, c: usize, no: u64, how: RenewHow, now: Time, out: &mut Vec<Effect>) {
        let embedder = &self.embedders[c];
        if embedder.finished || embedder.shut_down {
            return;
        }
        let Some(held) = embedder.held.get(&no) else {
            return;
        };
        out.push(Effect::Command(Command::Renew(held.grant.clone(), how)));
        match how {
            RenewHow::Manual { lease } => {
                let lease = lease.unwrap_or(held.grant.lease());
                let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
                let again = millis_between(&mut self.rng, lease_ms / 3, lease_ms * 2 / 3);
                out.push(Effect::At(
                    now.saturating_add(again),
                    Ev::Renew { client: c, no, how },
                ));
            }
            RenewHow::Auto { .. } if self.rng.chance(1, 4) => {
                let lease_ms = held.grant.lease().as_millis() as u64;
                self.stop_renewing_later(c, no, lease_ms, now, out);
            }
            _ => {}
        }
    }

    /// The embedder gives a grant up: releases it, hands it back, or lets
    /// it expire; maybe a late write follows.
    fn fate(&mut self, c: usize, no: u64, now: Time, out: &mut Vec<Effect>) {
        let Some(held) = self.embedders[c].held.remove(&no) else {
            return;
        };
        if self.embedders[c].finished {
            return;
        }
        let (key, token) = (held.grant.key().clone(), held.grant.token());
        match held.fate {
            Fate::Release => out.push(Effect::Command(Command::Release(held.grant))),
            Fate::Abandon => out.push(Effect::Command(Command::Undeliverable(held.grant))),
            Fate::Leak => {}
            Fate::Keep => unreachable!("a grant kept until shutdown has no fate scheduled"),
        }
        if self.rng.chance(1, 10) {
            let later = millis_between(&mut self.rng, 0, 2_000);
            let zombie = Ev::Zombie {
                client: c,
                key,
                token,
            };
            out.push(Effect::At(now.saturating_add(later), zombie));
        }
    }

    /// The client shuts down, maybe releasing what it holds first.
    fn shutdown(&mut self, c: usize, out: &mut Vec<Effect>) {
        let embedder = &mut self.embedders[c];
        if embedder.finished {
            return;
        }
        if embedder.release_at_shutdown {
            for held in core::mem::take(&mut embedder.held).into_values() {
                out.push(Effect::Command(Command::Release(held.grant)));
            }
        }
        embedder.shut_down = true;
        out.push(Effect::Command(Command::Shutdown(embedder.budget)));
    }
}
