//! A scripted driver: one client core against the [`ModelServer`], step by
//! step, with the [`Checker`] watching every step.
//!
//! A run is a [`Setup`] (the client's and the server's settings) and a list
//! of [`Step`]s: what the embedder asks for, what the network does, what the
//! server does, and how time passes. Steps that cannot apply (delivering
//! bytes when there are none, cancelling when nothing was ever submitted)
//! do nothing, so every list of steps is a valid run. After the steps,
//! [`Runner::settle`] gives the client a healthy server until every
//! operation has ended, then shuts it down and checks the end of the run.
//!
//! Both [`Setup`] and [`Step`] have a compact byte encoding
//! ([`Setup::decode`], [`Step::decode`] and their inverses), which is what
//! the `client` fuzz target reads: one byte per field, so a mutation of one
//! byte changes one thing.

use core::time::Duration;

use arbitrary::Unstructured;

use super::checker::{Checker, Invariant, InvariantViolation, Stats};
use super::model::{Fault, ModelServer, ServerConfig};
use crate::client::{
    Action, BusyPolicy, CancelPolicy, Client, Config, ConnId, Event, Grant, OpId, Outcome,
    TransportEnd,
};
use crate::names::{Endpoint, Key, Name};
use crate::time::Time;
use crate::wire::ClientFrame;

/// The keys acquires use (`Step::Acquire` takes the first four; forged
/// answers may name all six).
pub const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];
/// Wait budgets, in milliseconds, indexed by `wait % 8`.
pub const WAITS_MS: [u64; 8] = [0, 1, 10, 50, 200, 1_000, 3_000, 10_000];
/// Leases, in milliseconds, indexed by `lease % 8`.
pub const LEASES_MS: [u64; 8] = [1, 5, 30, 100, 500, 2_000, 10_000, 60_000];
/// Shutdown budgets, in milliseconds, indexed by `budget % 6`.
pub const BUDGETS_MS: [u64; 6] = [0, 10, 100, 1_000, 5_000, 30_000];
/// Answer graces, in milliseconds, indexed by `answer_grace % 3`.
pub const GRACES_MS: [u64; 3] = [20, 200, 5_000];
/// The server's longest lease, in milliseconds, indexed by `max_lease % 4`.
pub const MAX_LEASES_MS: [u64; 4] = [1, 50, 1_000, 60_000];
/// Limits on automatic renewal (`renew_until`), in milliseconds, indexed
/// by `limit % 8`; `None` renews until released.
pub const RENEW_LIMITS_MS: [Option<u64>; 8] = [
    None,
    Some(0),
    Some(10),
    Some(100),
    Some(1_000),
    Some(5_000),
    Some(30_000),
    None,
];
/// The addresses a hint flood names, indexed by `kind % 5`: allowlisted
/// ones (endpoints and the extra allowlist), and two outside it.
pub const FLOOD_ADDRS: [&str; 5] = ["a:1", "b:2", "c:3", "evil:666", "evil:667"];

/// How long [`Runner::settle`] lets a live client work before shutting it
/// down: longer than any wait, lease or backoff the setups allow.
pub const SETTLE_TIME: Duration = Duration::from_secs(600);
/// The shutdown budget [`Runner::settle`] gives.
pub const SETTLE_BUDGET: Duration = Duration::from_secs(30);

/// The settings of one run: every field is a small number, read modulo the
/// size of its range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Setup {
    /// Seeds the client's generator and the server's.
    pub seed: u64,
    /// The server's window: `2 + window % 7`.
    pub window: u8,
    /// The client's reserved slots: `1 + reserved % 4` (clamped to
    /// `window - 1` by the client).
    pub reserved: u8,
    /// [`CancelPolicy::KeepWaiter`] instead of [`CancelPolicy::Close`].
    pub keep_waiter: bool,
    /// [`BusyPolicy::FailFast`] instead of [`BusyPolicy::Retry`].
    pub fail_fast: bool,
    /// The client's release attempts: `1 + release_attempts % 8`.
    pub release_attempts: u8,
    /// The server's queue limit per key: `queue_limit % 4` (0: every acquire
    /// that would wait is answered `B`).
    pub queue_limit: u8,
    /// The server's longest lease: [`MAX_LEASES_MS`]`[max_lease % 4]`.
    pub max_lease: u8,
    /// The client's capacity for open acquires: 1, 3, or 64 otherwise
    /// (`max_acquires % 8` = 0, 1, or more).
    pub max_acquires: u8,
    /// The client's answer grace: [`GRACES_MS`]`[answer_grace % 3]`.
    pub answer_grace: u8,
}

fn ep(s: &str) -> Endpoint {
    Endpoint::new(s).expect("a valid address")
}

impl Setup {
    /// Bytes taken by [`Setup::encode`].
    pub const ENCODED_LEN: usize = 16;

    /// The client's configuration: endpoints `a:1` and `b:2`, `c:3`
    /// allowlisted besides, client id `tk`.
    pub fn client_config(&self) -> Config {
        let mut c = Config::new([ep("a:1"), ep("b:2")], Name::new("tk").expect("atom"));
        c.allow = vec![ep("c:3")];
        c.seed = self.seed;
        c.reserved = 1 + u32::from(self.reserved % 4);
        c.cancel = if self.keep_waiter {
            CancelPolicy::KeepWaiter
        } else {
            CancelPolicy::Close
        };
        c.busy = if self.fail_fast {
            BusyPolicy::FailFast
        } else {
            BusyPolicy::Retry
        };
        c.release_attempts = 1 + u32::from(self.release_attempts % 8);
        c.answer_grace = Duration::from_millis(GRACES_MS[usize::from(self.answer_grace % 3)]);
        c.max_acquires = match self.max_acquires % 8 {
            0 => 1,
            1 => 3,
            _ => 64,
        };
        c
    }

    /// The model server's configuration.
    pub fn server_config(&self) -> ServerConfig {
        ServerConfig {
            node: "model-1".to_owned(),
            window: 2 + u64::from(self.window % 7),
            max_lease_ms: MAX_LEASES_MS[usize::from(self.max_lease % 4)],
            queue_limit: usize::from(self.queue_limit % 4),
            total_waiters: 16,
            seed: self.seed ^ 0x5eed_5eed_5eed_5eed,
        }
    }

    /// Reads a setup: 8 bytes of seed (little-endian), then one byte per
    /// field. Missing bytes read as zero.
    pub fn decode(u: &mut Unstructured<'_>) -> Setup {
        let mut seed = [0u8; 8];
        for b in &mut seed {
            *b = byte(u);
        }
        let window = byte(u);
        let reserved = byte(u);
        let flags = byte(u);
        let release_attempts = byte(u);
        let queue_limit = byte(u);
        let max_lease = byte(u);
        let max_acquires = byte(u);
        let answer_grace = byte(u);
        Setup {
            seed: u64::from_le_bytes(seed),
            window,
            reserved,
            keep_waiter: flags & 1 != 0,
            fail_fast: flags & 2 != 0,
            release_attempts,
            queue_limit,
            max_lease,
            max_acquires,
            answer_grace,
        }
    }

    /// The inverse of [`Setup::decode`].
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.seed.to_le_bytes());
        out.extend_from_slice(&[
            self.window,
            self.reserved,
            u8::from(self.keep_waiter) | u8::from(self.fail_fast) << 1,
            self.release_attempts,
            self.queue_limit,
            self.max_lease,
            self.max_acquires,
            self.answer_grace,
        ]);
    }
}

fn byte(u: &mut Unstructured<'_>) -> u8 {
    u.arbitrary::<u8>().unwrap_or(0)
}

/// One thing that happens in a run. Numbers are read modulo the size of
/// their range; a step that cannot apply does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The embedder acquires [`KEYS`]`[key % 4]`, waiting
    /// [`WAITS_MS`]`[wait % 8]`, for a lease of [`LEASES_MS`]`[lease % 8]`,
    /// with an owner of its own.
    Acquire {
        /// Which key.
        key: u8,
        /// Which wait budget.
        wait: u8,
        /// Which lease.
        lease: u8,
    },
    /// The embedder releases grant `pick % n` of those it holds; with
    /// `pick >= 128`, one it already gave back (the client must refuse it,
    /// or end it at once if it has expired).
    Release {
        /// Which grant.
        pick: u8,
    },
    /// The embedder releases a raw `(key, token)`.
    ReleaseToken {
        /// [`KEYS`]`[key % 6]`.
        key: u8,
        /// The token.
        token: u8,
    },
    /// The embedder cancels operation `pick % n` of all it ever submitted.
    Cancel {
        /// Which operation.
        pick: u8,
    },
    /// The embedder hands back grant `pick % n` as undeliverable.
    Undeliverable {
        /// Which grant.
        pick: u8,
    },
    /// The embedder shuts down with [`BUDGETS_MS`]`[budget % 6]`.
    Shutdown {
        /// Which budget.
        budget: u8,
    },
    /// The pending connect succeeds (the server accepts it).
    Connected,
    /// The pending connect fails (or, on a connected transport, it fails).
    ConnectFailed,
    /// The server reads `bytes` bytes of what the client sent (0: all).
    ServerReads {
        /// How many.
        bytes: u8,
    },
    /// The server sends `frames` frames, each picked at random among those
    /// it could send (0: all).
    ServerEmits {
        /// How many.
        frames: u8,
    },
    /// The network delivers `bytes` bytes of what the server sent (0: all);
    /// when nothing is left and the server has closed, the end of stream.
    Deliver {
        /// How many.
        bytes: u8,
    },
    /// The server injects a fault, `kind % 17`: `L` to an allowlisted or a
    /// foreign address (0, 1), `M` likewise (2, 3), `E no_leader`,
    /// `not_active`, `auth_failed`, another reason (4 to 7), a duplicate
    /// answer (8), a `G` to an unknown id (9), an answer naming another key
    /// (10), a `G` (to an acquire or a renewal) with a longer lease than
    /// asked (11), a dropped transport (12), a `T` to an unknown id (13), a
    /// `G` to an acquire without `waited_ms` (14) or with more than it
    /// asked (15), a `G` to a renewal with another token (16).
    Fault {
        /// Which fault.
        kind: u8,
    },
    /// A forged frame is put on the wire behind what the server sent:
    /// `kind % 13` is `G .. A` (with `waited_ms` 0), `T`, `B`, `D`,
    /// `N .. R` (0 to 4), an answer with the wrong op letter (5), `W` (6),
    /// `L` (7), `G .. X` (8: with the request's own token if `token < 128`
    /// and it was a renewal, else `token`), `N .. X` (9), `G .. A` without
    /// `waited_ms` (10), `G .. A` that waited `token * 50` ms (11), a
    /// `T`, `D` or `B` to a renewal (12). `id < 200` answers one of the
    /// recent requests, else an id never sent; `key < 128` names that
    /// request's key, else [`KEYS`]`[key % 6]`.
    Forge {
        /// Which frame.
        kind: u8,
        /// Which id.
        id: u8,
        /// Which key.
        key: u8,
        /// The token of a `G`.
        token: u8,
        /// The lease of a `G`: [`LEASES_MS`]`[lease % 8]`.
        lease: u8,
    },
    /// Raw bytes are handed to the client on its current connection, in
    /// whatever phase it is.
    Raw {
        /// The bytes (at most 255).
        data: Vec<u8>,
    },
    /// The transport ends: end of stream, or an error.
    TransportClosed {
        /// An error rather than an end of stream.
        error: bool,
    },
    /// Time passes by `ms` milliseconds. With an even `ms` the client is
    /// told at once; with an odd one it learns it from its next input (a
    /// late driver).
    Advance {
        /// How long.
        ms: u16,
    },
    /// Time jumps to the earliest deadline of the client or the server.
    NextDeadline,
    /// As [`Step::Acquire`], renewed automatically once granted, for at
    /// most [`RENEW_LIMITS_MS`]`[limit % 8]` (`acquire_renewing`).
    AcquireRenewing {
        /// Which key.
        key: u8,
        /// Which wait budget.
        wait: u8,
        /// Which lease.
        lease: u8,
        /// Which limit.
        limit: u8,
    },
    /// The embedder renews grant `pick % n` of those it holds once (with
    /// `pick >= 128`, one it gave back: refused), asking for the acquire's
    /// lease (`lease % 9 == 8`) or [`LEASES_MS`]`[lease % 9]`.
    Renew {
        /// Which grant.
        pick: u8,
        /// Which lease.
        lease: u8,
    },
    /// The embedder starts renewing grant `pick % n` automatically, for at
    /// most [`RENEW_LIMITS_MS`]`[limit % 8]` from now.
    AutoRenew {
        /// Which grant.
        pick: u8,
        /// Which limit.
        limit: u8,
    },
    /// The embedder stops renewing grant `pick % n` automatically.
    StopRenewing {
        /// Which grant.
        pick: u8,
    },
    /// A flood of `L` lines is put on the wire behind what the server sent:
    /// `1 + 16 * count` of them, naming [`FLOOD_ADDRS`]`[kind % 5]`, or
    /// (with `kind >= 128`) each in turn. The client must keep the
    /// connection and tell the embedder only of hints that change
    /// something.
    HintFlood {
        /// How many.
        count: u8,
        /// Which addresses.
        kind: u8,
    },
    /// A grant issued by another client, with the key, token and handle of
    /// the embedder's grant `pick % n` (or of [`KEYS`]`[pick % 6]` if it
    /// holds none), is handed to `release`, `undeliverable`, `renew`,
    /// `auto_renew` or `stop_renewing` (`what % 5`): it must be refused with
    /// `Error::ForeignGrant` and change nothing.
    Foreign {
        /// Which grant to mimic.
        pick: u8,
        /// Which call.
        what: u8,
    },
}

impl Step {
    /// How many kinds of step there are.
    pub const KINDS: u8 = 23;

    /// Reads one step: a kind byte (modulo [`Step::KINDS`]), then one byte
    /// per field (`Advance`: two, little-endian; `Raw`: a length, then
    /// that many bytes or what is left). `None` when the input is used up.
    pub fn decode(u: &mut Unstructured<'_>) -> Option<Step> {
        if u.is_empty() {
            return None;
        }
        let kind = byte(u) % Step::KINDS;
        Some(match kind {
            0 => Step::Acquire {
                key: byte(u),
                wait: byte(u),
                lease: byte(u),
            },
            1 => Step::Release { pick: byte(u) },
            2 => Step::ReleaseToken {
                key: byte(u),
                token: byte(u),
            },
            3 => Step::Cancel { pick: byte(u) },
            4 => Step::Undeliverable { pick: byte(u) },
            5 => Step::Shutdown { budget: byte(u) },
            6 => Step::Connected,
            7 => Step::ConnectFailed,
            8 => Step::ServerReads { bytes: byte(u) },
            9 => Step::ServerEmits { frames: byte(u) },
            10 => Step::Deliver { bytes: byte(u) },
            11 => Step::Fault { kind: byte(u) },
            12 => Step::Forge {
                kind: byte(u),
                id: byte(u),
                key: byte(u),
                token: byte(u),
                lease: byte(u),
            },
            13 => {
                let len = usize::from(byte(u)).min(u.len());
                Step::Raw {
                    data: u.bytes(len).unwrap_or_default().to_vec(),
                }
            }
            14 => Step::TransportClosed {
                error: byte(u) & 1 != 0,
            },
            15 => Step::Advance {
                ms: u16::from_le_bytes([byte(u), byte(u)]),
            },
            16 => Step::NextDeadline,
            17 => Step::AcquireRenewing {
                key: byte(u),
                wait: byte(u),
                lease: byte(u),
                limit: byte(u),
            },
            18 => Step::Renew {
                pick: byte(u),
                lease: byte(u),
            },
            19 => Step::AutoRenew {
                pick: byte(u),
                limit: byte(u),
            },
            20 => Step::StopRenewing { pick: byte(u) },
            21 => Step::HintFlood {
                count: byte(u),
                kind: byte(u),
            },
            _ => Step::Foreign {
                pick: byte(u),
                what: byte(u),
            },
        })
    }

    /// The inverse of [`Step::decode`] (a `Raw` step keeps at most 255
    /// bytes).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Step::Acquire { key, wait, lease } => out.extend_from_slice(&[0, *key, *wait, *lease]),
            Step::Release { pick } => out.extend_from_slice(&[1, *pick]),
            Step::ReleaseToken { key, token } => out.extend_from_slice(&[2, *key, *token]),
            Step::Cancel { pick } => out.extend_from_slice(&[3, *pick]),
            Step::Undeliverable { pick } => out.extend_from_slice(&[4, *pick]),
            Step::Shutdown { budget } => out.extend_from_slice(&[5, *budget]),
            Step::Connected => out.push(6),
            Step::ConnectFailed => out.push(7),
            Step::ServerReads { bytes } => out.extend_from_slice(&[8, *bytes]),
            Step::ServerEmits { frames } => out.extend_from_slice(&[9, *frames]),
            Step::Deliver { bytes } => out.extend_from_slice(&[10, *bytes]),
            Step::Fault { kind } => out.extend_from_slice(&[11, *kind]),
            Step::Forge {
                kind,
                id,
                key,
                token,
                lease,
            } => out.extend_from_slice(&[12, *kind, *id, *key, *token, *lease]),
            Step::Raw { data } => {
                let data = &data[..data.len().min(255)];
                out.push(13);
                out.push(data.len() as u8);
                out.extend_from_slice(data);
            }
            Step::TransportClosed { error } => out.extend_from_slice(&[14, u8::from(*error)]),
            Step::Advance { ms } => {
                out.push(15);
                out.extend_from_slice(&ms.to_le_bytes());
            }
            Step::NextDeadline => out.push(16),
            Step::AcquireRenewing {
                key,
                wait,
                lease,
                limit,
            } => out.extend_from_slice(&[17, *key, *wait, *lease, *limit]),
            Step::Renew { pick, lease } => out.extend_from_slice(&[18, *pick, *lease]),
            Step::AutoRenew { pick, limit } => out.extend_from_slice(&[19, *pick, *limit]),
            Step::StopRenewing { pick } => out.extend_from_slice(&[20, *pick]),
            Step::HintFlood { count, kind } => out.extend_from_slice(&[21, *count, *kind]),
            Step::Foreign { pick, what } => out.extend_from_slice(&[22, *pick, *what]),
        }
    }
}

/// A renewal limit of [`RENEW_LIMITS_MS`].
fn renew_limit(limit: u8) -> Option<Duration> {
    RENEW_LIMITS_MS[usize::from(limit % 8)].map(Duration::from_millis)
}

/// A grant of `key` with `token` and `lease_ms`, issued by a client of its
/// own (so with the same handle as the first grant of any client), for
/// handing to a client that did not issue it.
///
/// The issuing client is driven in the order the driver contract asks:
/// its `H` is handed out before the `W` comes, and its `A` before the `G`
/// (an answer to a request not yet handed out would be a stray).
pub fn foreign_grant(key: &str, token: u64, lease_ms: u64) -> Option<Grant> {
    let config = Config::new([ep("f:9")], Name::new("foreign").ok()?);
    let key = Key::new(key).ok()?;
    let now = Time::ZERO;
    let mut client = Client::new(config, now).ok()?;
    let conn = std::iter::from_fn(|| client.poll_action()).find_map(|action| match action {
        Action::Connect { conn, .. } => Some(conn),
        _ => None,
    })?;
    client.handle_connected(now, conn);
    while client.poll_action().is_some() {}
    client.handle_bytes(now, conn, b"W f 4\n");
    let op = client
        .acquire(
            now,
            key.clone(),
            Name::new("f").ok()?,
            Duration::ZERO,
            Duration::from_millis(lease_ms.max(1)),
        )
        .ok()?;
    while client.poll_action().is_some() {}
    let answer = format!("G 1 A {key} {token} {} 0\n", lease_ms.max(1));
    client.handle_bytes(now, conn, answer.as_bytes());
    std::iter::from_fn(|| client.poll_event()).find_map(|event| match event {
        Event::Outcome {
            op: done,
            outcome: Outcome::Granted(grant),
        } if done == op => Some(grant),
        _ => None,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WireState {
    Connecting,
    Open,
    Gone,
}

/// The harness's side of the client's current connection.
#[derive(Debug)]
struct Wire {
    conn: ConnId,
    state: WireState,
    /// Sent by the client, not yet read by the server.
    to_server: Vec<u8>,
    /// Sent by the server (or forged), not yet delivered to the client.
    to_client: Vec<u8>,
}

/// What a run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The hash of everything observed (see [`Checker::trace_hash`]).
    pub trace_hash: u64,
    /// Counts of what happened.
    pub stats: Stats,
    /// The time the run ended.
    pub end: Time,
    /// Grants the server made.
    pub server_grants: u64,
}

/// Drives one client against the model server, with a checker; see the
/// module documentation.
pub struct Runner {
    client: Client,
    server: ModelServer,
    checker: Checker,
    now: Time,
    wire: Option<Wire>,
    /// Every operation submitted, for `Cancel`.
    ops: Vec<OpId>,
    /// Grants delivered and not given back.
    grants: Vec<Grant>,
    /// Grants given back (released or undeliverable).
    returned: Vec<Grant>,
    next_owner: u64,
    /// Recent requests sent: id, op letter, key, token (0 for an acquire).
    requests: Vec<(u64, u8, String, u64)>,
    complaints_seen: usize,
    shutdown_called: bool,
    log: Option<Vec<String>>,
}

impl Runner {
    /// A client made at time zero with `setup`'s configuration, and a fresh
    /// model server.
    pub fn new(setup: &Setup) -> Result<Runner, InvariantViolation> {
        let config = setup.client_config();
        let checker = Checker::new(&config, Time::ZERO);
        let client = Client::new(config, Time::ZERO).expect("the setups are valid");
        let mut runner = Runner {
            client,
            server: ModelServer::new(setup.server_config()),
            checker,
            now: Time::ZERO,
            wire: None,
            ops: Vec::new(),
            grants: Vec::new(),
            returned: Vec::new(),
            next_owner: 0,
            requests: Vec::new(),
            complaints_seen: 0,
            shutdown_called: false,
            log: None,
        };
        // The client's first outputs (its first connect).
        runner.drain()?;
        runner.checker.end_step(&runner.client)?;
        Ok(runner)
    }

    /// Runs `steps`, then [`settle`](Runner::settle)s.
    pub fn run(setup: &Setup, steps: &[Step]) -> Result<Report, InvariantViolation> {
        let mut runner = Runner::new(setup)?;
        for step in steps {
            runner.step(step)?;
        }
        runner.settle()?;
        Ok(runner.report())
    }

    /// Runs twice and compares the traces (invariant 6).
    pub fn run_twice(setup: &Setup, steps: &[Step]) -> Result<Report, InvariantViolation> {
        let first = Runner::run(setup, steps)?;
        let second = Runner::run(setup, steps)?;
        if first.trace_hash != second.trace_hash {
            return Err(InvariantViolation {
                invariant: Invariant::Determinism,
                at: first.end.min(second.end),
                step: steps.len() as u64,
                detail: format!(
                    "two runs of the same steps gave traces {:#018x} and {:#018x}",
                    first.trace_hash, second.trace_hash
                ),
            });
        }
        Ok(first)
    }

    /// Starts keeping a readable log of the run: every step, and every
    /// action and event of the client (for reading a failing run).
    pub fn keep_log(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// The log kept since [`Runner::keep_log`].
    pub fn log(&self) -> &[String] {
        self.log.as_deref().unwrap_or(&[])
    }

    fn note(&mut self, what: impl FnOnce() -> String) {
        if let Some(log) = &mut self.log {
            log.push(format!("{} {}", self.now, what()));
        }
    }

    /// What the run did so far.
    pub fn report(&self) -> Report {
        Report {
            trace_hash: self.checker.trace_hash(),
            stats: self.checker.stats(),
            end: self.now,
            server_grants: self.server.grants(),
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The checker.
    pub fn checker(&self) -> &Checker {
        &self.checker
    }

    /// The server.
    pub fn server(&self) -> &ModelServer {
        &self.server
    }

    /// The current time.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Runs one step, drains the client, and checks.
    pub fn step(&mut self, step: &Step) -> Result<(), InvariantViolation> {
        self.note(|| format!("step {step:?}"));
        self.apply(step)?;
        self.drain()?;
        self.checker.end_step(&self.client)?;
        self.check_server()
    }

    fn check_server(&mut self) -> Result<(), InvariantViolation> {
        let complaints = self.server.complaints();
        if let Some(c) = complaints.get(self.complaints_seen) {
            self.complaints_seen = complaints.len();
            let invariant = if c.contains("window") || c.contains("before W") {
                Invariant::Window
            } else {
                Invariant::Protocol
            };
            return Err(InvariantViolation {
                invariant,
                at: self.now,
                step: self.checker.stats().steps,
                detail: format!("the server complains: {c}"),
            });
        }
        Ok(())
    }

    fn open_conn(&self) -> Option<ConnId> {
        self.wire
            .as_ref()
            .filter(|w| w.state == WireState::Open)
            .map(|w| w.conn)
    }

    fn apply(&mut self, step: &Step) -> Result<(), InvariantViolation> {
        let now = self.now;
        match step {
            Step::Acquire { key, wait, lease } => {
                let key = Key::new(KEYS[usize::from(key % 4)]).expect("atom");
                self.next_owner += 1;
                let owner = Name::new(format!("o{}", self.next_owner)).expect("atom");
                let wait = Duration::from_millis(WAITS_MS[usize::from(wait % 8)]);
                let lease = Duration::from_millis(LEASES_MS[usize::from(lease % 8)]);
                let result = self
                    .client
                    .acquire(now, key.clone(), owner.clone(), wait, lease);
                self.checker
                    .acquire(now, &key, &owner, wait, lease, &result)?;
                if let Ok(op) = result {
                    self.ops.push(op);
                }
            }
            Step::AcquireRenewing {
                key,
                wait,
                lease,
                limit,
            } => {
                let key = Key::new(KEYS[usize::from(key % 4)]).expect("atom");
                self.next_owner += 1;
                let owner = Name::new(format!("o{}", self.next_owner)).expect("atom");
                let wait = Duration::from_millis(WAITS_MS[usize::from(wait % 8)]);
                let lease = Duration::from_millis(LEASES_MS[usize::from(lease % 8)]);
                let limit = renew_limit(*limit);
                let result = self.client.acquire_renewing(
                    now,
                    key.clone(),
                    owner.clone(),
                    wait,
                    lease,
                    limit,
                );
                self.checker
                    .acquire_renewing(now, &key, &owner, wait, lease, limit, &result)?;
                if let Ok(op) = result {
                    self.ops.push(op);
                }
            }
            Step::Renew { pick, lease } => {
                let Some(grant) = self.pick_grant(*pick) else {
                    return Ok(());
                };
                let lease = LEASES_MS
                    .get(usize::from(lease % 9))
                    .map(|&ms| Duration::from_millis(ms));
                let result = self.client.renew(now, &grant, lease);
                self.checker.renew(now, &grant, lease, &result)?;
            }
            Step::AutoRenew { pick, limit } => {
                let Some(grant) = self.pick_grant(*pick) else {
                    return Ok(());
                };
                let limit = renew_limit(*limit);
                let result = self.client.auto_renew(now, &grant, limit);
                self.checker.auto_renew(now, &grant, limit, &result)?;
            }
            Step::StopRenewing { pick } => {
                let Some(grant) = self.pick_grant(*pick) else {
                    return Ok(());
                };
                let result = self.client.stop_renewing(now, &grant);
                self.checker.stop_renewing(now, &grant, &result)?;
            }
            Step::HintFlood { count, kind } => {
                if self.open_conn().is_none() {
                    return Ok(());
                }
                let lines = 1 + 16 * usize::from(*count);
                let w = self.wire.as_mut().expect("open");
                for i in 0..lines {
                    let addr = if *kind >= 128 {
                        FLOOD_ADDRS[i % FLOOD_ADDRS.len()]
                    } else {
                        FLOOD_ADDRS[usize::from(kind % 5)]
                    };
                    w.to_client
                        .extend_from_slice(format!("L {addr}\n").as_bytes());
                }
            }
            Step::Foreign { pick, what } => {
                let mimic = (!self.grants.is_empty())
                    .then(|| &self.grants[usize::from(*pick) % self.grants.len()]);
                let (key, token, lease_ms) = match mimic {
                    Some(g) => (
                        g.key().as_str().to_owned(),
                        g.token(),
                        u64::try_from(g.lease().as_millis()).unwrap_or(u64::MAX),
                    ),
                    None => (
                        KEYS[usize::from(pick % 6)].to_owned(),
                        u64::from(*pick),
                        1_000,
                    ),
                };
                let Some(grant) = foreign_grant(&key, token, lease_ms) else {
                    return Ok(());
                };
                // The timers due now fire first, so that whatever the call
                // hands out could only be its own doing.
                self.client.handle_timeout(now);
                self.checker.timeout(now);
                self.drain()?;
                let (call, result) = match what % 5 {
                    0 => ("release", self.client.release(now, &grant).map(|_| ())),
                    1 => ("undeliverable", self.client.undeliverable(now, &grant)),
                    2 => ("renew", self.client.renew(now, &grant, None)),
                    3 => ("auto_renew", self.client.auto_renew(now, &grant, None)),
                    _ => ("stop_renewing", self.client.stop_renewing(now, &grant)),
                };
                self.checker.foreign(now, call, &grant, &result)?;
            }
            Step::Release { pick } => {
                let stale = *pick >= 128;
                let list = if stale { &self.returned } else { &self.grants };
                if list.is_empty() {
                    return Ok(());
                }
                let i = usize::from(*pick) % list.len();
                let grant = list[i].clone();
                let result = self.client.release(now, &grant);
                self.checker.release(now, &grant, &result)?;
                if !stale && result.is_ok() {
                    self.returned.push(self.grants.remove(i));
                }
            }
            Step::ReleaseToken { key, token } => {
                let key = Key::new(KEYS[usize::from(key % 6)]).expect("atom");
                let token = u64::from(*token);
                let result = self.client.release_token(now, key.clone(), token);
                self.checker.release_token(now, &key, token, &result)?;
            }
            Step::Cancel { pick } => {
                if self.ops.is_empty() {
                    return Ok(());
                }
                let op = self.ops[usize::from(*pick) % self.ops.len()];
                let result = self.client.cancel(now, op);
                self.checker.cancel(now, op, &result)?;
            }
            Step::Undeliverable { pick } => {
                if self.grants.is_empty() {
                    return Ok(());
                }
                let i = usize::from(*pick) % self.grants.len();
                let grant = self.grants[i].clone();
                let result = self.client.undeliverable(now, &grant);
                self.checker.undeliverable(now, &grant, &result)?;
                if result.is_ok() {
                    self.returned.push(self.grants.remove(i));
                }
            }
            Step::Shutdown { budget } => {
                let budget = Duration::from_millis(BUDGETS_MS[usize::from(budget % 6)]);
                let result = self.client.shutdown(now, budget);
                self.checker.shutdown(now, budget, &result)?;
                self.shutdown_called = true;
            }
            Step::Connected => {
                let Some(w) = self.wire.as_mut() else {
                    return Ok(());
                };
                let conn = w.conn;
                if w.state == WireState::Connecting {
                    w.state = WireState::Open;
                    self.server.open(now, conn.get());
                }
                // On a connection that is already up or gone, the client
                // must ignore it.
                self.client.handle_connected(now, conn);
                self.checker.connected(now, conn);
            }
            Step::ConnectFailed => {
                let Some(w) = self.wire.as_mut() else {
                    return Ok(());
                };
                let conn = w.conn;
                if w.state != WireState::Gone {
                    w.state = WireState::Gone;
                    self.server.close(now, conn.get());
                }
                self.client.handle_connect_failed(now, conn);
                self.checker.connect_failed(now, conn);
            }
            Step::ServerReads { bytes } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                let w = self.wire.as_mut().expect("open");
                let n = take_len(*bytes, w.to_server.len());
                let data: Vec<u8> = w.to_server.drain(..n).collect();
                self.server.receive(now, conn.get(), &data);
            }
            Step::ServerEmits { frames } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                self.server.advance(now);
                let n = if *frames == 0 {
                    usize::MAX
                } else {
                    usize::from(*frames)
                };
                let w = self.wire.as_mut().expect("open");
                for _ in 0..n {
                    match self.server.emit(conn.get()) {
                        Some(frame) => w.to_client.extend_from_slice(&frame),
                        None => break,
                    }
                }
            }
            Step::Deliver { bytes } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                let w = self.wire.as_mut().expect("open");
                if w.to_client.is_empty() {
                    if self.server.wants_close(conn.get()) {
                        self.transport_closed(conn, TransportEnd::Eof);
                    }
                    return Ok(());
                }
                let n = take_len(*bytes, w.to_client.len());
                let data: Vec<u8> = w.to_client.drain(..n).collect();
                self.feed(conn, &data)?;
            }
            Step::Fault { kind } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                let fault = match kind % 17 {
                    0 => Fault::Leader {
                        addr: ["a:1", "b:2", "c:3"][usize::from(kind / 14 % 3)].to_owned(),
                    },
                    1 => Fault::Leader {
                        addr: "evil:666".to_owned(),
                    },
                    2 => Fault::Moved {
                        addr: ["a:1", "b:2", "c:3"][usize::from(kind / 14 % 3)].to_owned(),
                    },
                    3 => Fault::Moved {
                        addr: "evil:666".to_owned(),
                    },
                    4 => Fault::Error {
                        reason: "no_leader".to_owned(),
                    },
                    5 => Fault::Error {
                        reason: "not_active".to_owned(),
                    },
                    6 => Fault::Error {
                        reason: "auth_failed".to_owned(),
                    },
                    7 => Fault::Error {
                        reason: "overloaded".to_owned(),
                    },
                    8 => Fault::Duplicate,
                    9 => Fault::UnknownId {
                        key: KEYS[usize::from(kind / 14 % 6)].to_owned(),
                        grant: true,
                    },
                    10 => Fault::WrongKey {
                        key: KEYS[usize::from(kind / 14 % 6)].to_owned(),
                    },
                    11 => Fault::LongerLease,
                    12 => {
                        self.transport_closed(conn, TransportEnd::Error);
                        return Ok(());
                    }
                    14 => Fault::WaitedMissing,
                    15 => Fault::WaitedAbove,
                    16 => Fault::WrongToken,
                    _ => Fault::UnknownId {
                        key: KEYS[usize::from(kind / 14 % 6)].to_owned(),
                        grant: false,
                    },
                };
                self.server.inject(now, conn.get(), fault);
            }
            Step::Forge {
                kind,
                id,
                key,
                token,
                lease,
            } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                let line = self.forge(*kind, *id, *key, *token, *lease);
                self.server.forgive(conn.get());
                let w = self.wire.as_mut().expect("open");
                w.to_client.extend_from_slice(line.as_bytes());
            }
            Step::Raw { data } => {
                let Some(w) = self.wire.as_ref().filter(|w| w.state != WireState::Gone) else {
                    return Ok(());
                };
                let conn = w.conn;
                self.server.forgive(conn.get());
                self.feed(conn, data)?;
            }
            Step::TransportClosed { error } => {
                let Some(w) = self.wire.as_ref().filter(|w| w.state != WireState::Gone) else {
                    return Ok(());
                };
                let conn = w.conn;
                let end = if *error {
                    TransportEnd::Error
                } else {
                    TransportEnd::Eof
                };
                self.transport_closed(conn, end);
            }
            Step::Advance { ms } => {
                self.now = self
                    .now
                    .saturating_add(Duration::from_millis(u64::from(*ms)));
                self.server.advance(self.now);
                if ms % 2 == 0 {
                    self.client.handle_timeout(self.now);
                    self.checker.timeout(self.now);
                }
            }
            Step::NextDeadline => {
                let client = self.client.poll_timeout().filter(|&t| t < Time::MAX);
                let next = [client, self.server.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                if let Some(t) = next {
                    self.now = self.now.max(t);
                }
                self.server.advance(self.now);
                self.client.handle_timeout(self.now);
                self.checker.timeout(self.now);
            }
        }
        Ok(())
    }

    /// Hands bytes to the client on `conn`, firing its due timers first
    /// (see the checker's rule for drivers).
    fn feed(&mut self, conn: ConnId, data: &[u8]) -> Result<(), InvariantViolation> {
        self.client.handle_timeout(self.now);
        self.checker.timeout(self.now);
        self.drain()?;
        self.note(|| format!("  bytes {conn} {:?}", String::from_utf8_lossy(data)));
        self.client.handle_bytes(self.now, conn, data);
        self.checker.bytes(self.now, conn, data)
    }

    fn transport_closed(&mut self, conn: ConnId, end: TransportEnd) {
        if let Some(w) = self.wire.as_mut().filter(|w| w.conn == conn) {
            w.state = WireState::Gone;
            w.to_client.clear();
            w.to_server.clear();
        }
        self.server.close(self.now, conn.get());
        self.client.handle_transport_closed(self.now, conn, end);
        self.checker.transport_closed(self.now, conn);
    }

    /// Builds a forged frame (see [`Step::Forge`]).
    fn forge(&self, kind: u8, id: u8, key: u8, token: u8, lease: u8) -> String {
        let recent = (id < 200 && !self.requests.is_empty()).then(|| {
            &self.requests[self.requests.len() - 1 - usize::from(id) % self.requests.len()]
        });
        let id_value = recent.map_or(900_000 + u64::from(id), |r| r.0);
        let key_name = match recent {
            Some(r) if key < 128 => r.2.clone(),
            _ => KEYS[usize::from(key % 6)].to_owned(),
        };
        let lease = LEASES_MS[usize::from(lease % 8)];
        let renewal_token = match recent {
            Some(r) if r.1 == b'X' && token < 128 => r.3,
            _ => u64::from(token),
        };
        match kind % 13 {
            0 => format!("G {id_value} A {key_name} {token} {lease} 0\n"),
            1 => format!("T {id_value} A {key_name}\n"),
            2 => format!("B {id_value} A {key_name}\n"),
            3 => format!("D {id_value} R {key_name}\n"),
            4 => format!("N {id_value} R {key_name}\n"),
            5 => {
                // The other op letter: a bad pairing, a framing error.
                let op = recent.map_or(b'A', |r| r.1);
                if op == b'A' {
                    format!("D {id_value} A {key_name}\n")
                } else {
                    format!("G {id_value} R {key_name} {token} {lease}\n")
                }
            }
            6 => format!("W forged {}\n", 2 + u64::from(token % 8)),
            7 => format!("L {}\n", ["a:1", "c:3", "evil:666"][usize::from(token % 3)]),
            8 => format!("G {id_value} X {key_name} {renewal_token} {lease}\n"),
            9 => format!("N {id_value} X {key_name}\n"),
            10 => format!("G {id_value} A {key_name} {token} {lease}\n"),
            11 => format!(
                "G {id_value} A {key_name} {token} {lease} {}\n",
                u64::from(token) * 50
            ),
            _ => format!(
                "{} {id_value} X {key_name}\n",
                ["T", "D", "B"][usize::from(token % 3)]
            ),
        }
    }

    /// The grant the embedder holds (or, with `pick >= 128`, one it gave
    /// back) that `pick` names.
    fn pick_grant(&self, pick: u8) -> Option<Grant> {
        let list = if pick >= 128 {
            &self.returned
        } else {
            &self.grants
        };
        (!list.is_empty()).then(|| list[usize::from(pick) % list.len()].clone())
    }

    /// Drains the client's actions and events through the checker.
    fn drain(&mut self) -> Result<(), InvariantViolation> {
        loop {
            let mut any = false;
            while let Some(action) = self.client.poll_action() {
                any = true;
                self.note(|| format!("  action {action:?}"));
                self.checker.action(&action)?;
                self.on_action(action);
            }
            while let Some(event) = self.client.poll_event() {
                any = true;
                self.note(|| format!("  event {event:?}"));
                self.checker.event(&event)?;
                if let Event::Outcome {
                    outcome: Outcome::Granted(grant),
                    ..
                } = event
                {
                    self.grants.push(grant);
                }
            }
            if !any {
                return Ok(());
            }
        }
    }

    fn on_action(&mut self, action: Action) {
        match action {
            Action::Connect { conn, .. } => {
                if let Some(old) = self.wire.take() {
                    self.server.close(self.now, old.conn.get());
                }
                self.wire = Some(Wire {
                    conn,
                    state: WireState::Connecting,
                    to_server: Vec::new(),
                    to_client: Vec::new(),
                });
            }
            Action::Send { conn, data } => {
                for line in data.split(|&b| b == b'\n') {
                    match ClientFrame::parse(line) {
                        Ok(ClientFrame::Acquire { id, key, .. }) => {
                            self.requests.push((id, b'A', key.as_str().to_owned(), 0));
                        }
                        Ok(ClientFrame::Release { id, key, token }) => {
                            self.requests
                                .push((id, b'R', key.as_str().to_owned(), token));
                        }
                        Ok(ClientFrame::Renew { id, key, token, .. }) => {
                            self.requests
                                .push((id, b'X', key.as_str().to_owned(), token));
                        }
                        _ => {}
                    }
                }
                if self.requests.len() > 64 {
                    self.requests.drain(..self.requests.len() - 32);
                }
                if let Some(w) = self
                    .wire
                    .as_mut()
                    .filter(|w| w.conn == conn && w.state == WireState::Open)
                {
                    w.to_server.extend_from_slice(&data);
                }
            }
            Action::Close { conn } => {
                if let Some(w) = self.wire.as_mut().filter(|w| w.conn == conn) {
                    w.state = WireState::Gone;
                    w.to_client.clear();
                    w.to_server.clear();
                }
                self.server.close(self.now, conn.get());
            }
        }
    }

    /// One step of a healthy world: connect, let the server read, answer,
    /// deliver; when nothing moves, jump to the next deadline. `false` when
    /// nothing at all is left to happen.
    fn pump(&mut self) -> Result<bool, InvariantViolation> {
        let step = match &self.wire {
            Some(w) if w.state == WireState::Connecting => Step::Connected,
            Some(w) if w.state == WireState::Open && !w.to_server.is_empty() => {
                Step::ServerReads { bytes: 0 }
            }
            Some(w) if w.state == WireState::Open && self.server.ready(w.conn.get()) > 0 => {
                Step::ServerEmits { frames: 0 }
            }
            Some(w)
                if w.state == WireState::Open
                    && (!w.to_client.is_empty() || self.server.wants_close(w.conn.get())) =>
            {
                Step::Deliver { bytes: 0 }
            }
            _ => {
                let client = self.client.poll_timeout().filter(|&t| t < Time::MAX);
                if client.is_none() && self.server.poll_timeout().is_none() {
                    return Ok(false);
                }
                Step::NextDeadline
            }
        };
        self.step(&step)?;
        Ok(true)
    }

    fn quiet(&self) -> bool {
        let wire_quiet = match &self.wire {
            None => true,
            Some(w) => match w.state {
                WireState::Gone => true,
                WireState::Connecting => false,
                WireState::Open => {
                    w.to_client.is_empty()
                        && w.to_server.is_empty()
                        && self.server.ready(w.conn.get()) == 0
                        && !self.server.wants_close(w.conn.get())
                }
            },
        };
        self.checker.is_settled() && self.client.in_flight().requests == 0 && wire_quiet
    }

    /// Releases every grant the embedder holds.
    fn release_all(&mut self) -> Result<(), InvariantViolation> {
        for grant in core::mem::take(&mut self.grants) {
            self.note(|| format!("settle: release {grant:?}"));
            let result = self.client.release(self.now, &grant);
            self.checker.release(self.now, &grant, &result)?;
            self.drain()?;
            self.checker.end_step(&self.client)?;
            self.returned.push(grant);
        }
        Ok(())
    }

    /// Ends the run: releases every grant the embedder holds, gives the
    /// client a healthy server until every operation has ended (at most
    /// [`SETTLE_TIME`]) and checks that every grant it had to release by
    /// itself was released; then shuts it down with [`SETTLE_BUDGET`], lets
    /// the shutdown finish, and checks the end of the run
    /// ([`Checker::finish`]).
    pub fn settle(&mut self) -> Result<(), InvariantViolation> {
        const MAX_PUMPS: usize = 100_000;
        if !self.client.is_finished() && !self.shutdown_called {
            let until = self.now.saturating_add(SETTLE_TIME);
            let mut pumps = 0;
            loop {
                self.release_all()?;
                if self.quiet() || self.now >= until || pumps >= MAX_PUMPS || !self.pump()? {
                    break;
                }
                pumps += 1;
            }
            if !self.quiet() {
                return Err(InvariantViolation {
                    invariant: Invariant::OneOutcome,
                    at: self.now,
                    step: self.checker.stats().steps,
                    detail: format!(
                        "after {pumps} steps of a healthy server, operations are still open: {:?}, in flight {:?}",
                        self.checker, self.client.in_flight()
                    ),
                });
            }
            self.checker.check_orphans_released()?;
        }
        if !self.shutdown_called {
            self.note(|| "settle: shutdown".to_owned());
            let result = self.client.shutdown(self.now, SETTLE_BUDGET);
            self.checker.shutdown(self.now, SETTLE_BUDGET, &result)?;
            self.shutdown_called = true;
            self.drain()?;
            self.checker.end_step(&self.client)?;
        }
        let mut pumps = 0;
        while !self.client.is_finished() && pumps < MAX_PUMPS {
            if !self.pump()? {
                break;
            }
            pumps += 1;
        }
        self.checker.finish(&self.client)
    }
}

fn take_len(n: u8, len: usize) -> usize {
    if n == 0 {
        len
    } else {
        usize::from(n).min(len)
    }
}
