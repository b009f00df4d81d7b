//! The invariant checker: watches one client core from the outside and
//! checks the six invariants of PROTOCOL.md section 5 after every step.
//!
//! The checker sees what an embedder and a driver see, nothing more: the
//! operations submitted (with their parameters and the results of the
//! calls), every [`Action`] (the bytes of every `Send` are parsed with
//! [`ClientFrame::parse`]), every byte handed to
//! [`Client::handle_bytes`], and every [`Event`]. From these it keeps its
//! own model of the session (which requests are in flight on which
//! connection, which answers match them by id, op and key, which grants the
//! embedder holds, which releases are under way) and compares the client's
//! outputs with it.
//!
//! # How to drive it
//!
//! For every step, in this order:
//!
//! 1. call the client (a command or an input), then tell the checker about
//!    it with the method of the same name ([`Checker::acquire`],
//!    [`Checker::bytes`], ...), passing the call's result where it has one;
//! 2. drain the client (`poll_action` until `None`, then `poll_event` until
//!    `None`, again until both are empty), handing every action to
//!    [`Checker::action`] and every event to [`Checker::event`];
//! 3. call [`Checker::end_step`].
//!
//! At the end of a run, once the client has shut down, call
//! [`Checker::finish`].
//!
//! One rule for the driver: before handing bytes to the client, fire its
//! due timers first (`handle_timeout` at the same time, then drain), so that
//! the bytes are read at a moment when no timer is due. The checker reads
//! the bytes the way the client must, and predicts at which frame the client
//! must close; a timer firing first would make that prediction ambiguous.
//!
//! The harness must give every acquire its own owner: that is how an `A`
//! frame is mapped to its operation. Releases are mapped by their exact
//! `(key, token)`.
//!
//! # Limits
//!
//! A server that grants the same `(key, token)` twice breaks the rule that
//! tokens strictly increase; if a release of the first is already under way
//! when the second is delivered, the release goes out while the embedder
//! holds the second. The checker does not count that against the client,
//! which cannot tell the two grants apart.

use core::fmt;
use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use super::TraceHash;
use crate::client::{
    Action, Client, Config, ConnId, Error as ClientError, Event, Grant, OpId, Outcome,
    ReleaseResult,
};
use crate::names::{Key, Name};
use crate::time::Time;
use crate::wire::{Answer, AnswerKind, ClientFrame, LineReader, Op, ServerFrame, VERSION};

/// Which rule a violation breaks: one of the six invariants of PROTOCOL.md
/// section 5, or another rule of the protocol that the checker's model of
/// the session relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Invariant {
    /// 1. Every operation ends in exactly one outcome: never none, never two.
    OneOutcome,
    /// 2. An answer is attributed to an operation only if id, op and key
    ///    all agree.
    Attribution,
    /// 3. An acquire whose bytes were handed out is never sent again.
    NoResend,
    /// 4. Unanswered requests on a connection never exceed the window, and
    ///    acquires never exceed `window - reserved`; nothing is sent before
    ///    `W`.
    Window,
    /// 5. A grant whose outcome could not be delivered, or that no pending
    ///    request claimed, is released by its exact token unless its lease
    ///    has run out; a grant the embedder holds is never released behind
    ///    its back.
    OrphanRelease,
    /// 6. The same inputs at the same times give the same actions, byte for
    ///    byte.
    Determinism,
    /// Another rule of PROTOCOL.md sections 2 to 5, or of the driver
    /// contract of [`Client`] (what an `H` carries, closing after an
    /// illegal frame, which outcome fits which history, API results).
    Protocol,
}

impl Invariant {
    /// The invariant's number in PROTOCOL.md section 5 (`None` for
    /// [`Invariant::Protocol`]).
    pub fn number(self) -> Option<u8> {
        match self {
            Invariant::OneOutcome => Some(1),
            Invariant::Attribution => Some(2),
            Invariant::NoResend => Some(3),
            Invariant::Window => Some(4),
            Invariant::OrphanRelease => Some(5),
            Invariant::Determinism => Some(6),
            Invariant::Protocol => None,
        }
    }

    /// The rule, in words.
    pub fn statement(self) -> &'static str {
        match self {
            Invariant::OneOutcome => "every operation ends in exactly one outcome",
            Invariant::Attribution => {
                "an answer is attributed to an operation only if id, op and key all agree"
            }
            Invariant::NoResend => "an acquire whose bytes were handed out is never sent again",
            Invariant::Window => {
                "unanswered requests never exceed the window, acquires never exceed window - reserved, nothing is sent before W"
            }
            Invariant::OrphanRelease => {
                "an unclaimed or undeliverable grant is released by its exact token unless its lease ran out, and a held grant never is"
            }
            Invariant::Determinism => "the same inputs give the same actions, byte for byte",
            Invariant::Protocol => "the protocol and the driver contract",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.number() {
            Some(n) => write!(f, "invariant {n} ({})", self.statement()),
            None => write!(f, "protocol rule ({})", self.statement()),
        }
    }
}

/// A broken invariant: which one, when, at which step, and what happened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{invariant} broken at {at}, step {step}: {detail}")]
pub struct InvariantViolation {
    /// The rule broken.
    pub invariant: Invariant,
    /// The time of the step.
    pub at: Time,
    /// The step's number (from 0), as counted by [`Checker::end_step`].
    pub step: u64,
    /// What happened, readably.
    pub detail: String,
}

/// What a run did, for checking that tests exercise what they claim to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Steps ended.
    pub steps: u64,
    /// Requests (`A` and `R`) handed out.
    pub requests: u64,
    /// Answers matched to a pending request.
    pub matched: u64,
    /// Answers no pending request could claim (unknown id, mismatch, before `W`).
    pub strays: u64,
    /// Connections closed by the client.
    pub closes: u64,
    /// `Granted` outcomes.
    pub granted: u64,
    /// `TimedOut` outcomes.
    pub timed_out: u64,
    /// `Busy` outcomes.
    pub busy: u64,
    /// `Cancelled` outcomes.
    pub cancelled: u64,
    /// `Indeterminate` outcomes.
    pub indeterminate: u64,
    /// `Released` outcomes.
    pub released: u64,
    /// `NotHeld` outcomes.
    pub not_held: u64,
    /// `Lapsed` outcomes.
    pub lapsed: u64,
    /// Releases the client issued by itself (`OrphanRelease`).
    pub orphan_releases: u64,
    /// Acquire attempts after a `B`.
    pub retries: u64,
}

impl Stats {
    /// Adds another run's counts.
    pub fn add(&mut self, other: &Stats) {
        self.steps += other.steps;
        self.requests += other.requests;
        self.matched += other.matched;
        self.strays += other.strays;
        self.closes += other.closes;
        self.granted += other.granted;
        self.timed_out += other.timed_out;
        self.busy += other.busy;
        self.cancelled += other.cancelled;
        self.indeterminate += other.indeterminate;
        self.released += other.released;
        self.not_held += other.not_held;
        self.lapsed += other.lapsed;
        self.orphan_releases += other.orphan_releases;
        self.retries += other.retries;
    }
}

type Grip = (String, u64);

/// A request in flight on a connection.
#[derive(Debug, Clone)]
enum Request {
    Acquire {
        op: OpId,
        key: String,
        lease_ms: u64,
    },
    Release {
        key: String,
        token: u64,
    },
}

/// The checker's model of one connection.
struct ConnModel {
    id: ConnId,
    /// Not yet closed by the client.
    alive: bool,
    /// `H` went out: the client reads what arrives.
    hello: bool,
    /// The window, once the client has read `W`.
    window: Option<u64>,
    reader: LineReader,
    pending: BTreeMap<u64, Request>,
    /// A frame that must close the connection was read: the rule it falls
    /// under and why.
    closing: Option<(Invariant, String)>,
    /// The driver reported that the connect failed.
    connect_failed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answered {
    Granted {
        token: u64,
        lease_ms: u64,
        at: Time,
        sent_at: Time,
    },
    TimedOut,
    Busy,
}

struct AcquireRecord {
    key: String,
    lease_ms: u64,
    wait: Duration,
    submitted: Time,
    attempts: u32,
    /// The attempt in flight on a live connection.
    in_flight: Option<(ConnId, u64)>,
    /// An attempt was handed out and no answer to it was read.
    unanswered: bool,
    sent_at: Time,
    /// The `wait_ms` of the latest attempt.
    wire_wait_ms: u64,
    last: Option<Answered>,
    cancel_requested: bool,
}

enum OpKind {
    Acquire(AcquireRecord),
    Release { key: String, token: u64 },
}

struct OpRecord {
    kind: OpKind,
    outcome: Option<Outcome>,
}

/// A grant the client holds for the embedder (matched, delivered or about
/// to be).
struct HeldGrant {
    key: String,
    token: u64,
    expires_by: Time,
    lease_end: Time,
    delivered: bool,
}

/// A grant the client must release by itself.
struct Obligation {
    key: String,
    token: u64,
    /// When the server has freed it at the latest (answer time plus lease).
    lease_end: Time,
    /// The client announced it with `OrphanRelease`.
    announced: bool,
    /// An `R` for it went out after it arose.
    r_sent: bool,
    settled: bool,
}

/// Watches one client core and checks the invariants; see the module
/// documentation for how to drive it.
pub struct Checker {
    client_id: String,
    credential: String,
    reserved: u64,
    settle_margin: Duration,
    queue_grace: Duration,
    max_acquires: usize,
    max_releases: usize,
    now: Time,
    step: u64,
    trace: TraceHash,
    stats: Stats,
    conn: Option<ConnModel>,
    ids: BTreeSet<u64>,
    ops: BTreeMap<OpId, OpRecord>,
    owners: BTreeMap<String, OpId>,
    held: Vec<HeldGrant>,
    releases_open: BTreeMap<Grip, u32>,
    /// Matched `D` and `N` answers not yet claimed by an outcome.
    answers: BTreeMap<Grip, (u32, u32)>,
    obligations: Vec<Obligation>,
    expect_indeterminate: Vec<OpId>,
    bytes_step: bool,
    shutdown: Option<Time>,
    complete: bool,
}

type Checked = Result<(), InvariantViolation>;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Checker {
    /// A checker for a client made with `config` at `now`.
    pub fn new(config: &Config, now: Time) -> Checker {
        Checker {
            client_id: config.client_id.as_str().to_owned(),
            credential: config
                .credential
                .as_ref()
                .map_or_else(|| "-".to_owned(), |c| c.as_str().to_owned()),
            reserved: u64::from(config.reserved),
            settle_margin: config.settle_margin,
            queue_grace: config.queue_grace,
            max_acquires: config.max_acquires,
            max_releases: config.max_releases,
            now,
            step: 0,
            trace: TraceHash::new(),
            stats: Stats::default(),
            conn: None,
            ids: BTreeSet::new(),
            ops: BTreeMap::new(),
            owners: BTreeMap::new(),
            held: Vec::new(),
            releases_open: BTreeMap::new(),
            answers: BTreeMap::new(),
            obligations: Vec::new(),
            expect_indeterminate: Vec::new(),
            bytes_step: false,
            shutdown: None,
            complete: false,
        }
    }

    /// The hash of everything observed so far: inputs with their times,
    /// actions with their bytes, events. Two runs of the same inputs must
    /// end with the same hash.
    pub fn trace_hash(&self) -> u64 {
        self.trace.get()
    }

    /// Counts of what the run did.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Whether nothing is left to settle: no operation open, no release of
    /// the client's own under way.
    pub fn is_settled(&self) -> bool {
        self.ops.values().all(|r| r.outcome.is_some()) && self.obligations.iter().all(|o| o.settled)
    }

    /// Operations submitted and not ended yet.
    pub fn open_operations(&self) -> usize {
        self.ops.values().filter(|r| r.outcome.is_none()).count()
    }

    fn violation(&self, invariant: Invariant, detail: impl Into<String>) -> InvariantViolation {
        InvariantViolation {
            invariant,
            at: self.now,
            step: self.step,
            detail: detail.into(),
        }
    }

    fn fail(&self, invariant: Invariant, detail: impl Into<String>) -> Checked {
        Err(self.violation(invariant, detail))
    }

    fn tick(&mut self, now: Time, what: &str) {
        self.now = self.now.max(now);
        self.trace.write(what.as_bytes());
        self.trace.write_u64(now.as_nanos());
    }

    // ----- the embedder's commands ----------------------------------------

    /// `acquire(now, key, owner, wait, lease)` returned `result`.
    pub fn acquire(
        &mut self,
        now: Time,
        key: &Key,
        owner: &Name,
        wait: Duration,
        lease: Duration,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.tick(now, "acquire");
        self.trace.write(key.as_bytes());
        self.trace.write(owner.as_bytes());
        self.trace.write_u64(ms(wait));
        self.trace.write_u64(ms(lease));
        self.trace.write(format!("{result:?}").as_bytes());
        match result {
            Ok(op) => {
                if self.owners.contains_key(owner.as_str()) {
                    return self.fail(
                        Invariant::Protocol,
                        format!("harness error: owner {owner} used twice"),
                    );
                }
                if let Some(old) = self.ops.get(op) {
                    if old.outcome.is_none() {
                        return self.fail(
                            Invariant::OneOutcome,
                            format!("{op} handed out for a new acquire while still open"),
                        );
                    }
                }
                if ms(lease) == 0 {
                    return self.fail(Invariant::Protocol, "an acquire with a zero lease accepted");
                }
                self.owners.insert(owner.as_str().to_owned(), *op);
                self.ops.insert(
                    *op,
                    OpRecord {
                        kind: OpKind::Acquire(AcquireRecord {
                            key: key.as_str().to_owned(),
                            lease_ms: ms(lease),
                            wait,
                            submitted: now,
                            attempts: 0,
                            in_flight: None,
                            unanswered: false,
                            sent_at: now,
                            wire_wait_ms: 0,
                            last: None,
                            cancel_requested: false,
                        }),
                        outcome: None,
                    },
                );
                Ok(())
            }
            Err(ClientError::Busy) => {
                let open = self.open_acquires();
                if open < self.max_acquires {
                    return self.fail(
                        Invariant::Protocol,
                        format!(
                            "acquire refused Busy with {open} acquires open, capacity {}",
                            self.max_acquires
                        ),
                    );
                }
                Ok(())
            }
            Err(ClientError::ZeroLease) if ms(lease) == 0 => Ok(()),
            Err(ClientError::ShuttingDown | ClientError::Finished) if self.shutdown.is_some() => {
                Ok(())
            }
            Err(e) => self.fail(Invariant::Protocol, format!("acquire refused: {e}")),
        }
    }

    fn open_acquires(&self) -> usize {
        self.ops
            .values()
            .filter(|r| r.outcome.is_none() && matches!(r.kind, OpKind::Acquire(_)))
            .count()
    }

    fn open_releases(&self) -> usize {
        self.ops
            .values()
            .filter(|r| r.outcome.is_none() && matches!(r.kind, OpKind::Release { .. }))
            .count()
    }

    fn held_index(&self, key: &str, token: u64, expires_by: Option<Time>) -> Option<usize> {
        self.held.iter().position(|h| {
            h.key == key
                && h.token == token
                && expires_by.map_or(true, |e| e == h.expires_by)
                && self.now < h.expires_by
        })
    }

    fn holds(&self, key: &str, token: u64) -> bool {
        self.held_index(key, token, None).is_some()
    }

    fn releasing(&self, key: &str, token: u64) -> bool {
        self.releases_open
            .get(&(key.to_owned(), token))
            .is_some_and(|&n| n > 0)
    }

    fn open_release(&mut self, key: &str, token: u64) {
        *self
            .releases_open
            .entry((key.to_owned(), token))
            .or_default() += 1;
    }

    fn close_release(&mut self, key: &str, token: u64) -> Checked {
        match self.releases_open.get_mut(&(key.to_owned(), token)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Ok(())
            }
            _ => self.fail(
                Invariant::Protocol,
                format!("a release of ({key}, {token}) ended that was not under way"),
            ),
        }
    }

    fn register_release(&mut self, op: OpId, key: &str, token: u64) -> Checked {
        if let Some(old) = self.ops.get(&op) {
            if old.outcome.is_none() {
                return self.fail(
                    Invariant::OneOutcome,
                    format!("{op} handed out for a new release while still open"),
                );
            }
        }
        self.ops.insert(
            op,
            OpRecord {
                kind: OpKind::Release {
                    key: key.to_owned(),
                    token,
                },
                outcome: None,
            },
        );
        self.open_release(key, token);
        Ok(())
    }

    /// `release(now, grant)` returned `result`.
    pub fn release(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.tick(now, "release");
        self.trace_grant(grant);
        self.trace.write(format!("{result:?}").as_bytes());
        let (key, token) = (grant.key().as_str(), grant.token());
        let held = self.held_index(key, token, Some(grant.expires_by()));
        match result {
            Ok(op) => {
                match held {
                    Some(i) => {
                        self.held.remove(i);
                    }
                    None if now >= grant.expires_by() => {}
                    None => {
                        return self.fail(
                            Invariant::Protocol,
                            format!("release of ({key}, {token}) accepted though it is not held"),
                        )
                    }
                }
                self.register_release(*op, key, token)
            }
            Err(ClientError::GrantNotHeld { .. }) if held.is_none() => Ok(()),
            Err(ClientError::Busy) if self.open_releases() >= self.max_releases => Ok(()),
            Err(ClientError::Finished) if self.shutdown.is_some() => Ok(()),
            Err(e) => self.fail(
                Invariant::Protocol,
                format!("release of ({key}, {token}) refused: {e}"),
            ),
        }
    }

    /// `release_token(now, key, token)` returned `result`.
    pub fn release_token(
        &mut self,
        now: Time,
        key: &Key,
        token: u64,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.tick(now, "release_token");
        self.trace.write(key.as_bytes());
        self.trace.write_u64(token);
        self.trace.write(format!("{result:?}").as_bytes());
        match result {
            Ok(op) => self.register_release(*op, key.as_str(), token),
            Err(ClientError::Busy) if self.open_releases() >= self.max_releases => Ok(()),
            Err(ClientError::Finished) if self.shutdown.is_some() => Ok(()),
            Err(e) => self.fail(
                Invariant::Protocol,
                format!("release_token({key}, {token}) refused: {e}"),
            ),
        }
    }

    /// `cancel(now, op)` returned `result`.
    pub fn cancel(&mut self, now: Time, op: OpId, result: &Result<(), ClientError>) -> Checked {
        self.tick(now, "cancel");
        self.trace.write_u64(op.get());
        self.trace.write(format!("{result:?}").as_bytes());
        let open = self.ops.get(&op).is_some_and(|r| r.outcome.is_none());
        match result {
            Ok(()) if open => {
                if let Some(OpRecord {
                    kind: OpKind::Acquire(a),
                    ..
                }) = self.ops.get_mut(&op)
                {
                    a.cancel_requested = true;
                }
                Ok(())
            }
            Ok(()) => self.fail(
                Invariant::OneOutcome,
                format!("cancel of {op} accepted though it has ended"),
            ),
            Err(ClientError::UnknownOperation(_)) => Ok(()),
            Err(e) => self.fail(Invariant::Protocol, format!("cancel of {op} refused: {e}")),
        }
    }

    /// `undeliverable(now, grant)` returned `result`.
    pub fn undeliverable(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.tick(now, "undeliverable");
        self.trace_grant(grant);
        self.trace.write(format!("{result:?}").as_bytes());
        let (key, token) = (grant.key().as_str(), grant.token());
        let held = self.held_index(key, token, Some(grant.expires_by()));
        match (result, held) {
            (Ok(()), Some(i)) => {
                let h = self.held.remove(i);
                self.add_obligation(h.key, h.token, h.lease_end);
                Ok(())
            }
            (Ok(()), None) if now >= grant.expires_by() => Ok(()),
            (Ok(()), None) => self.fail(
                Invariant::Protocol,
                format!("undeliverable ({key}, {token}) accepted though it is not held"),
            ),
            (Err(ClientError::GrantNotHeld { .. }), None) => Ok(()),
            // Shut down for good: no connection is left to release on, and
            // lease expiry frees the grant.
            (Err(ClientError::Finished), _) if self.shutdown.is_some() => Ok(()),
            (Err(e), _) => self.fail(
                Invariant::OrphanRelease,
                format!("undeliverable ({key}, {token}) refused ({e}): the grant would never be released"),
            ),
        }
    }

    /// `shutdown(now, budget)` returned `result`.
    pub fn shutdown(
        &mut self,
        now: Time,
        budget: Duration,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.tick(now, "shutdown");
        self.trace.write_u64(ms(budget));
        self.trace.write(format!("{result:?}").as_bytes());
        match result {
            Ok(()) if self.shutdown.is_none() => {
                self.shutdown = Some(now.saturating_add(budget));
                Ok(())
            }
            Ok(()) => self.fail(Invariant::Protocol, "a second shutdown accepted"),
            Err(ClientError::ShuttingDown) if self.shutdown.is_some() => Ok(()),
            Err(e) => self.fail(Invariant::Protocol, format!("shutdown refused: {e}")),
        }
    }

    fn trace_grant(&mut self, grant: &Grant) {
        self.trace.write(grant.key().as_bytes());
        self.trace.write_u64(grant.token());
        self.trace.write_u64(grant.expires_by().as_nanos());
    }

    // ----- the driver's inputs --------------------------------------------

    /// `handle_connected(now, conn)` was called.
    pub fn connected(&mut self, now: Time, conn: ConnId) {
        self.tick(now, "connected");
        self.trace.write_u64(conn.get());
    }

    /// `handle_connect_failed(now, conn)` was called.
    pub fn connect_failed(&mut self, now: Time, conn: ConnId) {
        self.tick(now, "connect_failed");
        self.trace.write_u64(conn.get());
        if let Some(c) = &mut self.conn {
            if c.id == conn && c.alive && !c.hello {
                // A failed connect closes without a Close action, unless a
                // timer closed it first (with one): settled at the end of
                // the step.
                c.connect_failed = true;
            }
        }
    }

    /// `handle_transport_closed(now, conn, _)` was called.
    pub fn transport_closed(&mut self, now: Time, conn: ConnId) {
        self.tick(now, "transport_closed");
        self.trace.write_u64(conn.get());
    }

    /// `handle_timeout(now)` was called.
    pub fn timeout(&mut self, now: Time) {
        self.tick(now, "timeout");
    }

    /// `handle_bytes(now, conn, data)` was called. Reads the frames the way
    /// the client must and predicts what it does with each: which answers
    /// it matches, which grants it must release by itself, and at which
    /// frame it must close.
    pub fn bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) -> Checked {
        self.tick(now, "bytes");
        self.trace.write_u64(conn.get());
        self.trace.write(data);
        self.bytes_step = true;
        let Some(c) = self.conn.as_mut() else {
            return Ok(());
        };
        if c.id != conn || !c.alive || !c.hello || c.closing.is_some() {
            // Not a connection the client reads from: it ignores the bytes.
            return Ok(());
        }
        let mut reader = core::mem::take(&mut c.reader);
        let mut input = data;
        let mut result = Ok(());
        while let Some(line) = reader.next_line(&mut input) {
            let closing = match line {
                Err(e) => Some((Invariant::Protocol, format!("framing error: {e}"))),
                Ok(line) => match ServerFrame::parse(line) {
                    Err(e) => Some((
                        Invariant::Protocol,
                        format!("framing error in {:?}: {e}", String::from_utf8_lossy(line)),
                    )),
                    Ok(frame) => match self.frame(frame) {
                        Ok(closing) => closing,
                        Err(v) => {
                            result = Err(v);
                            None
                        }
                    },
                },
            };
            if result.is_err() {
                break;
            }
            if let Some(closing) = closing {
                if let Some(c) = self.conn.as_mut() {
                    c.closing = Some(closing);
                }
                break;
            }
        }
        if let Some(c) = self.conn.as_mut() {
            c.reader = reader;
        }
        result
    }

    /// One frame read by the client: `Some` if it must close.
    fn frame(
        &mut self,
        frame: ServerFrame<'_>,
    ) -> Result<Option<(Invariant, String)>, InvariantViolation> {
        let c = self.conn.as_mut().expect("reading a live connection");
        match frame {
            ServerFrame::Welcome { window, .. } => {
                if c.window.is_some() {
                    return Ok(Some((Invariant::Protocol, "a second W".into())));
                }
                c.window = Some(window.get());
                Ok(None)
            }
            ServerFrame::Leader { .. } => Ok(None),
            ServerFrame::Moved { .. } => Ok(Some((Invariant::Protocol, "M".into()))),
            ServerFrame::Error { reason } => Ok(Some((Invariant::Protocol, format!("E {reason}")))),
            ServerFrame::Answer(answer) => self.answer(answer),
        }
    }

    fn answer(&mut self, a: Answer<'_>) -> Result<Option<(Invariant, String)>, InvariantViolation> {
        let c = self.conn.as_ref().expect("reading a live connection");
        let text = ServerFrame::Answer(a).to_string();
        let conn = c.id;
        if c.window.is_none() {
            self.stray(a);
            return Ok(Some((
                Invariant::Protocol,
                format!("answer before W: {text}"),
            )));
        }
        let Some(request) = c.pending.get(&a.id).cloned() else {
            self.stray(a);
            return Ok(Some((
                Invariant::Attribution,
                format!("{text}: no request with that id is unanswered on {conn}"),
            )));
        };
        let (op, key, asked) = match &request {
            Request::Acquire { key, lease_ms, .. } => (Op::Acquire, key.as_str(), *lease_ms),
            Request::Release { key, .. } => (Op::Release, key.as_str(), u64::MAX),
        };
        if a.op() != op || a.key.as_str() != key {
            let detail = format!("{text}: request {} was {op:?} of {key}", a.id);
            self.stray(a);
            return Ok(Some((Invariant::Attribution, detail)));
        }
        if let AnswerKind::Granted { lease_ms, .. } = a.kind {
            if lease_ms.get() > asked {
                self.stray(a);
                return Ok(Some((
                    Invariant::Attribution,
                    format!("{text}: a longer lease than the {asked} ms asked"),
                )));
            }
        }
        let c = self.conn.as_mut().expect("reading a live connection");
        c.pending.remove(&a.id);
        self.stats.matched += 1;
        self.matched(request, a);
        Ok(None)
    }

    /// An answer matched by id, op and key.
    fn matched(&mut self, request: Request, a: Answer<'_>) {
        match request {
            Request::Acquire { op, key, .. } => {
                let now = self.now;
                let margin = self.settle_margin;
                let Some(rec) = self.ops.get_mut(&op) else {
                    return;
                };
                let OpKind::Acquire(acq) = &mut rec.kind else {
                    return;
                };
                acq.in_flight = None;
                acq.unanswered = false;
                let abandoned = rec.outcome.is_some();
                match a.kind {
                    AnswerKind::Granted {
                        token, lease_ms, ..
                    } => {
                        let lease = Duration::from_millis(lease_ms.get());
                        let lease_end = now.saturating_add(lease);
                        if abandoned {
                            // An abandoned waiter's grant: released by its
                            // exact token, unless the embedder holds it (a
                            // server that repeats a token) or its release
                            // is under way already.
                            if !self.holds(&key, token) && !self.releasing(&key, token) {
                                self.add_obligation(key, token, lease_end);
                            }
                        } else {
                            acq.last = Some(Answered::Granted {
                                token,
                                lease_ms: lease_ms.get(),
                                at: now,
                                sent_at: acq.sent_at,
                            });
                            self.held.push(HeldGrant {
                                key,
                                token,
                                expires_by: lease_end.saturating_add(margin),
                                lease_end,
                                delivered: false,
                            });
                        }
                    }
                    AnswerKind::TimedOut if !abandoned => acq.last = Some(Answered::TimedOut),
                    AnswerKind::Busy if !abandoned => acq.last = Some(Answered::Busy),
                    _ => {}
                }
            }
            Request::Release { key, token } => {
                if let Some(n) = self.releases_open.get_mut(&(key.clone(), token)) {
                    *n = n.saturating_sub(1);
                }
                let entry = self.answers.entry((key, token)).or_default();
                match a.kind {
                    AnswerKind::Released => entry.0 += 1,
                    _ => entry.1 += 1,
                }
            }
        }
    }

    /// An answer nobody claims: a `G` for a grant that is neither held nor
    /// being released must be released by its exact token.
    fn stray(&mut self, a: Answer<'_>) {
        self.stats.strays += 1;
        if let AnswerKind::Granted {
            token, lease_ms, ..
        } = a.kind
        {
            let key = a.key.as_str();
            if self.holds(key, token) || self.releasing(key, token) {
                return;
            }
            let lease_end = self
                .now
                .saturating_add(Duration::from_millis(lease_ms.get()));
            self.add_obligation(key.to_owned(), token, lease_end);
        }
    }

    fn add_obligation(&mut self, key: String, token: u64, lease_end: Time) {
        self.open_release(&key, token);
        self.obligations.push(Obligation {
            key,
            token,
            lease_end,
            announced: false,
            r_sent: false,
            settled: false,
        });
    }

    // ----- the client's outputs -------------------------------------------

    /// An action the client handed out.
    pub fn action(&mut self, action: &Action) -> Checked {
        self.trace.write(b"action");
        match action {
            Action::Connect { conn, addr } => {
                self.trace.write_u64(conn.get());
                self.trace.write(addr.as_bytes());
                if self.complete {
                    return self.fail(
                        Invariant::Protocol,
                        "a connect after the shutdown completed",
                    );
                }
                if let Some(c) = &self.conn {
                    if c.alive && !c.connect_failed {
                        return self.fail(
                            Invariant::Protocol,
                            format!("{conn} opened while {} was still open", c.id),
                        );
                    }
                    if conn.get() <= c.id.get() {
                        return self.fail(
                            Invariant::Protocol,
                            format!("{conn} is not newer than {}", c.id),
                        );
                    }
                }
                self.conn = Some(ConnModel {
                    id: *conn,
                    alive: true,
                    hello: false,
                    window: None,
                    reader: LineReader::new(),
                    pending: BTreeMap::new(),
                    closing: None,
                    connect_failed: false,
                });
                Ok(())
            }
            Action::Send { conn, data } => {
                self.trace.write_u64(conn.get());
                self.trace.write(data);
                self.send(*conn, data)
            }
            Action::Close { conn } => {
                self.trace.write_u64(conn.get());
                self.close(*conn)
            }
        }
    }

    fn close(&mut self, conn: ConnId) -> Checked {
        let bytes_step = self.bytes_step;
        let shutting = self.shutdown.is_some();
        let Some(c) = self.conn.as_mut().filter(|c| c.id == conn && c.alive) else {
            return self.fail(
                Invariant::Protocol,
                format!("Close of {conn}, which is not open"),
            );
        };
        if bytes_step && c.closing.is_none() && !shutting {
            return self.fail(
                Invariant::Protocol,
                format!("{conn} closed while reading frames that required no close"),
            );
        }
        c.alive = false;
        self.stats.closes += 1;
        let pending = core::mem::take(&mut c.pending);
        for request in pending.into_values() {
            if let Request::Acquire { op, .. } = request {
                if let Some(rec) = self.ops.get_mut(&op) {
                    if let OpKind::Acquire(a) = &mut rec.kind {
                        a.in_flight = None;
                    }
                    if rec.outcome.is_none() {
                        self.expect_indeterminate.push(op);
                    }
                }
            }
        }
        Ok(())
    }

    fn send(&mut self, conn: ConnId, data: &[u8]) -> Checked {
        let live = self
            .conn
            .as_ref()
            .is_some_and(|c| c.id == conn && c.alive && c.closing.is_none());
        if !live {
            return self.fail(
                Invariant::Protocol,
                format!("Send on {conn}, which is not open"),
            );
        }
        let Some(body) = data.strip_suffix(b"\n") else {
            return self.fail(
                Invariant::Protocol,
                format!(
                    "Send of {:?}: not whole frames",
                    String::from_utf8_lossy(data)
                ),
            );
        };
        for line in body.split(|&b| b == b'\n') {
            let frame = match ClientFrame::parse(line) {
                Ok(frame) => frame,
                Err(e) => {
                    return self.fail(
                        Invariant::Protocol,
                        format!("sent {:?}, not a frame: {e}", String::from_utf8_lossy(line)),
                    )
                }
            };
            self.sent_frame(frame)?;
        }
        Ok(())
    }

    fn sent_frame(&mut self, frame: ClientFrame<'_>) -> Checked {
        let text = frame.to_string();
        let c = self.conn.as_mut().expect("checked live");
        match frame {
            ClientFrame::Hello {
                version,
                client_id,
                credential,
            } => {
                if c.hello {
                    return self.fail(Invariant::Protocol, format!("a second H: {text}"));
                }
                c.hello = true;
                if version != VERSION
                    || client_id.as_str() != self.client_id
                    || credential.as_str() != self.credential
                {
                    return self.fail(
                        Invariant::Protocol,
                        format!("{text} does not carry the configured id and credential"),
                    );
                }
                Ok(())
            }
            ClientFrame::Acquire {
                id,
                key,
                owner,
                wait_ms,
                lease_ms,
            } => {
                if !c.hello || c.window.is_none() {
                    return self.fail(Invariant::Window, format!("{text} sent before W"));
                }
                self.new_id(id, &text)?;
                let Some(&op) = self.owners.get(owner.as_str()) else {
                    return self.fail(
                        Invariant::Protocol,
                        format!("{text}: no acquire was submitted with owner {owner}"),
                    );
                };
                self.acquire_attempt(op, id, key.as_str(), wait_ms, lease_ms.get(), &text)?;
                self.stats.requests += 1;
                let c = self.conn.as_mut().expect("checked live");
                c.pending.insert(
                    id,
                    Request::Acquire {
                        op,
                        key: key.as_str().to_owned(),
                        lease_ms: lease_ms.get(),
                    },
                );
                self.check_window(&text)
            }
            ClientFrame::Renew { .. } => self.fail(
                Invariant::Protocol,
                format!("{text}: a renewal on version 1"),
            ),
            ClientFrame::Release { id, key, token } => {
                if !c.hello || c.window.is_none() {
                    return self.fail(Invariant::Window, format!("{text} sent before W"));
                }
                self.new_id(id, &text)?;
                let key = key.as_str();
                if !self.releasing(key, token) {
                    if self.holds(key, token) {
                        return self.fail(
                            Invariant::OrphanRelease,
                            format!("{text} releases a grant the embedder holds, behind its back"),
                        );
                    }
                    return self.fail(
                        Invariant::Protocol,
                        format!("{text}: no release of ({key}, {token}) is under way"),
                    );
                }
                for o in &mut self.obligations {
                    if o.key == key && o.token == token && !o.settled {
                        o.r_sent = true;
                    }
                }
                self.stats.requests += 1;
                let c = self.conn.as_mut().expect("checked live");
                c.pending.insert(
                    id,
                    Request::Release {
                        key: key.to_owned(),
                        token,
                    },
                );
                self.check_window(&text)
            }
        }
    }

    fn new_id(&mut self, id: u64, text: &str) -> Checked {
        if !self.ids.insert(id) {
            return self.fail(
                Invariant::Attribution,
                format!("{text} reuses request id {id}: answers to it could not be told apart"),
            );
        }
        Ok(())
    }

    fn acquire_attempt(
        &mut self,
        op: OpId,
        id: u64,
        key: &str,
        wait_ms: u64,
        lease_ms: u64,
        text: &str,
    ) -> Checked {
        let now = self.now;
        let conn = self.conn.as_ref().expect("checked live").id;
        let queue_grace = self.queue_grace;
        let rec = self.ops.get_mut(&op).expect("owners map to ops");
        let ended = rec.outcome.clone();
        let OpKind::Acquire(a) = &mut rec.kind else {
            unreachable!("owners map to acquires");
        };
        if let Some(outcome) = ended {
            return Err(self.violation(
                Invariant::NoResend,
                format!("{text}: {op} already ended {outcome:?}"),
            ));
        }
        if a.unanswered {
            return Err(self.violation(
                Invariant::NoResend,
                format!("{text}: an earlier attempt of {op} is still unanswered"),
            ));
        }
        if a.attempts > 0 && a.last != Some(Answered::Busy) {
            let last = a.last;
            return Err(self.violation(
                Invariant::NoResend,
                format!("{text}: {op} was sent before, and its answer was {last:?}, not B"),
            ));
        }
        let budget_end = a.submitted.saturating_add(a.wait);
        let expected_wait = ms(budget_end.saturating_duration_since(now));
        let send_by = if a.attempts == 0 {
            budget_end.max(a.submitted.saturating_add(queue_grace))
        } else {
            budget_end
        };
        let problem = if key != a.key || lease_ms != a.lease_ms {
            Some(format!("{op} asked for {} with {} ms", a.key, a.lease_ms))
        } else if wait_ms != expected_wait {
            Some(format!(
                "wait_ms should be what is left of the budget, {expected_wait}"
            ))
        } else if now >= send_by {
            Some(format!("sent at or after its last moment {send_by}"))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(self.violation(Invariant::Protocol, format!("{text}: {problem}")));
        }
        if a.attempts > 0 {
            self.stats.retries += 1;
        }
        a.attempts += 1;
        a.in_flight = Some((conn, id));
        a.unanswered = true;
        a.sent_at = now;
        a.wire_wait_ms = wait_ms;
        a.last = None;
        Ok(())
    }

    fn check_window(&self, text: &str) -> Checked {
        let c = self.conn.as_ref().expect("checked live");
        let window = c.window.expect("checked ready");
        let all = c.pending.len() as u64;
        let acquires = c
            .pending
            .values()
            .filter(|r| matches!(r, Request::Acquire { .. }))
            .count() as u64;
        let limit = window.saturating_sub(self.reserved);
        if all > window {
            return self.fail(
                Invariant::Window,
                format!(
                    "{text}: {all} requests unanswered on {}, window {window}",
                    c.id
                ),
            );
        }
        if acquires > limit {
            return self.fail(
                Invariant::Window,
                format!(
                    "{text}: {acquires} acquires unanswered on {}, window {window} less {} reserved",
                    c.id,
                    window - limit
                ),
            );
        }
        Ok(())
    }

    /// An event the client handed out.
    pub fn event(&mut self, event: &Event) -> Checked {
        self.trace.write(b"event");
        self.trace.write(format!("{event:?}").as_bytes());
        if self.complete {
            return self.fail(
                Invariant::Protocol,
                format!("{event:?} after ShutdownComplete"),
            );
        }
        match event {
            Event::Outcome { op, outcome } => self.outcome(*op, outcome),
            Event::OrphanRelease { key, token } => {
                let (key, token) = (key.as_str(), *token);
                match self
                    .obligations
                    .iter()
                    .position(|o| o.key == key && o.token == token && !o.announced)
                {
                    Some(i) => {
                        self.obligations[i].announced = true;
                        self.stats.orphan_releases += 1;
                        Ok(())
                    }
                    None if self.holds(key, token) => self.fail(
                        Invariant::OrphanRelease,
                        format!("release of ({key}, {token}) queued while the embedder holds it"),
                    ),
                    None => self.fail(
                        Invariant::Protocol,
                        format!("release of ({key}, {token}) queued, but no grant called for one"),
                    ),
                }
            }
            Event::OrphanSettled { key, token, result } => {
                self.orphan_settled(key.as_str(), *token, *result)
            }
            Event::ShutdownComplete => {
                if self.shutdown.is_none() {
                    return self.fail(Invariant::Protocol, "ShutdownComplete without a shutdown");
                }
                self.complete = true;
                // The client has stopped and forgets the grants it held for
                // the embedder: lease expiry ends them.
                self.held.clear();
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn consume_answer(&mut self, key: &str, token: u64, released: bool) -> bool {
        let Some(entry) = self.answers.get_mut(&(key.to_owned(), token)) else {
            return false;
        };
        let count = if released { &mut entry.0 } else { &mut entry.1 };
        if *count == 0 {
            return false;
        }
        *count -= 1;
        true
    }

    fn orphan_settled(&mut self, key: &str, token: u64, result: ReleaseResult) -> Checked {
        let now = self.now;
        let shutting = self.shutdown.is_some();
        let Some(i) = self
            .obligations
            .iter()
            .position(|o| o.key == key && o.token == token && o.announced && !o.settled)
        else {
            return self.fail(
                Invariant::Protocol,
                format!("({key}, {token}) settled {result:?}, but no release of it was under way"),
            );
        };
        self.obligations[i].settled = true;
        match result {
            ReleaseResult::Released | ReleaseResult::NotHeld => {
                let released = result == ReleaseResult::Released;
                if !self.consume_answer(key, token, released) {
                    return self.fail(
                        Invariant::Attribution,
                        format!("({key}, {token}) settled {result:?} without a matching answer"),
                    );
                }
                Ok(())
            }
            _ => {
                self.close_release(key, token)?;
                let o = &self.obligations[i];
                if !o.r_sent && now < o.lease_end && !shutting {
                    return self.fail(
                        Invariant::OrphanRelease,
                        format!(
                            "the release of ({key}, {token}) lapsed without ever being sent, its lease running until {}",
                            o.lease_end
                        ),
                    );
                }
                Ok(())
            }
        }
    }

    fn outcome(&mut self, op: OpId, outcome: &Outcome) -> Checked {
        let margin = self.settle_margin;
        let shutting = self.shutdown.is_some();
        let Some(rec) = self.ops.get(&op) else {
            return self.fail(
                Invariant::OneOutcome,
                format!("{outcome:?} for {op}, which was never submitted"),
            );
        };
        if let Some(first) = &rec.outcome {
            return self.fail(
                Invariant::OneOutcome,
                format!("a second outcome for {op}: {outcome:?} after {first:?}"),
            );
        }
        let problem: Option<(Invariant, String)> = match (&rec.kind, outcome) {
            (OpKind::Acquire(a), Outcome::Granted(g)) => match a.last {
                Some(Answered::Granted {
                    token,
                    lease_ms,
                    at,
                    sent_at,
                }) => {
                    let lease = Duration::from_millis(lease_ms);
                    if g.key().as_str() != a.key
                        || g.token() != token
                        || g.lease() != lease
                        || g.expires_by() != at.saturating_add(lease).saturating_add(margin)
                        || g.valid_until() != sent_at.saturating_add(lease)
                    {
                        Some((
                            Invariant::Attribution,
                            format!("{g:?} does not match the G read for it: token {token}, lease {lease_ms} ms at {at}"),
                        ))
                    } else {
                        None
                    }
                }
                last => Some((
                    Invariant::Attribution,
                    format!("Granted {g:?}, but the answer matched to it was {last:?}"),
                )),
            },
            (OpKind::Acquire(a), Outcome::TimedOut { sent: true }) => {
                (a.last != Some(Answered::TimedOut)).then(|| {
                    (
                        Invariant::Attribution,
                        format!("TimedOut, but the answer matched to it was {:?}", a.last),
                    )
                })
            }
            (OpKind::Acquire(a), Outcome::TimedOut { sent: false }) => {
                (a.attempts > 0).then(|| {
                    (
                        Invariant::Protocol,
                        format!("TimedOut as never sent, after {} attempts", a.attempts),
                    )
                })
            }
            (OpKind::Acquire(a), Outcome::Busy) => (a.last != Some(Answered::Busy) || a.unanswered)
                .then(|| {
                    (
                        Invariant::Attribution,
                        format!("Busy, but the answer matched to it was {:?}", a.last),
                    )
                }),
            (OpKind::Acquire(a), Outcome::Cancelled) => {
                if a.unanswered {
                    Some((
                        Invariant::Protocol,
                        "Cancelled (nothing asked) although a request of it is unanswered".into(),
                    ))
                } else if !a.cancel_requested && !shutting {
                    Some((Invariant::Protocol, "Cancelled without a cancel".into()))
                } else {
                    None
                }
            }
            (OpKind::Acquire(a), Outcome::Indeterminate { settles_by }) => {
                let lease = Duration::from_millis(a.lease_ms);
                if !a.unanswered {
                    Some((
                        Invariant::Protocol,
                        format!(
                            "Indeterminate, but no request of it is unanswered (last answer {:?})",
                            a.last
                        ),
                    ))
                } else if *settles_by
                    < a.sent_at
                        .saturating_add(Duration::from_millis(a.wire_wait_ms))
                        .saturating_add(lease)
                {
                    // A grant, if any, was made by sent_at + wait_ms at the
                    // latest, and lasts the lease.
                    Some((
                        Invariant::Protocol,
                        format!(
                            "Indeterminate settles by {settles_by}, before a grant made by {} + {} ms with a lease of {} ms could run out",
                            a.sent_at, a.wire_wait_ms, a.lease_ms
                        ),
                    ))
                } else {
                    None
                }
            }
            (OpKind::Release { key, token }, Outcome::Released | Outcome::NotHeld) => {
                let released = matches!(outcome, Outcome::Released);
                let (key, token) = (key.clone(), *token);
                if self.consume_answer(&key, token, released) {
                    None
                } else {
                    Some((
                        Invariant::Attribution,
                        format!("{outcome:?} for the release of ({key}, {token}) without a matching answer"),
                    ))
                }
            }
            (OpKind::Release { key, token }, Outcome::Lapsed) => {
                let (key, token) = (key.clone(), *token);
                self.close_release(&key, token)?;
                None
            }
            (OpKind::Acquire(_), other) => {
                Some((Invariant::Protocol, format!("{other:?} for an acquire")))
            }
            (OpKind::Release { .. }, other) => {
                Some((Invariant::Protocol, format!("{other:?} for a release")))
            }
        };
        if let Some((invariant, detail)) = problem {
            return self.fail(invariant, format!("{op}: {detail}"));
        }
        match outcome {
            Outcome::Granted(g) => {
                self.stats.granted += 1;
                if let Some(h) = self.held.iter_mut().find(|h| {
                    !h.delivered
                        && h.key == g.key().as_str()
                        && h.token == g.token()
                        && h.expires_by == g.expires_by()
                }) {
                    h.delivered = true;
                }
            }
            Outcome::TimedOut { .. } => self.stats.timed_out += 1,
            Outcome::Busy => self.stats.busy += 1,
            Outcome::Cancelled => self.stats.cancelled += 1,
            Outcome::Indeterminate { .. } => {
                self.stats.indeterminate += 1;
                self.expect_indeterminate.retain(|&o| o != op);
            }
            Outcome::Released => self.stats.released += 1,
            Outcome::NotHeld => self.stats.not_held += 1,
            Outcome::Lapsed => self.stats.lapsed += 1,
        }
        if let Some(rec) = self.ops.get_mut(&op) {
            rec.outcome = Some(outcome.clone());
        }
        Ok(())
    }

    /// Ends a step: checks what must hold once the client is drained.
    pub fn end_step(&mut self, client: &Client) -> Checked {
        let result = self.end_step_checks(client);
        self.bytes_step = false;
        self.step += 1;
        self.stats.steps += 1;
        result
    }

    fn end_step_checks(&mut self, client: &Client) -> Checked {
        if let Some(c) = &mut self.conn {
            if c.connect_failed {
                c.alive = false;
            }
        }
        if let Some(o) = self.obligations.iter().find(|o| !o.announced) {
            return self.fail(
                Invariant::OrphanRelease,
                format!(
                    "a grant of ({}, {}) that nobody can take was not put into the release lane",
                    o.key, o.token
                ),
            );
        }
        if let Some(op) = self.expect_indeterminate.first() {
            return self.fail(
                Invariant::OneOutcome,
                format!(
                    "{op} was in flight on a connection that closed, and did not end Indeterminate"
                ),
            );
        }
        if let Some(c) = &self.conn {
            if c.alive {
                if let Some((invariant, why)) = &c.closing {
                    return self.fail(*invariant, format!("{} stayed open after {why}", c.id));
                }
            }
        }
        for (op, rec) in &self.ops {
            if rec.outcome.is_some() {
                continue;
            }
            if let OpKind::Acquire(a) = &rec.kind {
                if matches!(a.last, Some(Answered::Granted { .. } | Answered::TimedOut)) {
                    return self.fail(
                        Invariant::OneOutcome,
                        format!("{op} was answered {:?} and has no outcome", a.last),
                    );
                }
            }
        }
        let open = client.open_operations();
        let (acquires, releases) = (open.acquires, open.releases);
        let expected = (self.open_acquires(), self.open_releases());
        if (acquires, releases) != expected {
            return self.fail(
                Invariant::OneOutcome,
                format!(
                    "the client counts {acquires} acquires and {releases} releases open; without an outcome are {} and {}",
                    expected.0, expected.1
                ),
            );
        }
        match client.poll_timeout() {
            Some(t) if t <= client.now() => self.fail(
                Invariant::Protocol,
                format!(
                    "poll_timeout is {t}, not after now {}, although everything was drained",
                    client.now()
                ),
            ),
            Some(_) => Ok(()),
            None => {
                // Quiescent: nothing will ever happen without new input, so
                // every operation must have its outcome.
                match self.ops.iter().find(|(_, r)| r.outcome.is_none()) {
                    Some((op, _)) => self.fail(
                        Invariant::OneOutcome,
                        format!("{op} has no outcome and the client is quiescent (no deadline)"),
                    ),
                    None if client.is_finished() && !self.complete => self.fail(
                        Invariant::Protocol,
                        "the client finished without ShutdownComplete",
                    ),
                    None => Ok(()),
                }
            }
        }
    }

    /// Ends a run: the client must have finished, every operation must
    /// have its outcome, and every grant the client had to release by
    /// itself must have been released by its exact token, unless its lease
    /// ran out or the shutdown's budget ended first.
    pub fn finish(&mut self, client: &Client) -> Checked {
        self.end_step(client)?;
        if !client.is_finished() || !self.complete {
            return self.fail(
                Invariant::Protocol,
                "the run ended before the client shut down",
            );
        }
        if let Some((op, _)) = self.ops.iter().find(|(_, r)| r.outcome.is_none()) {
            return self.fail(Invariant::OneOutcome, format!("{op} never got an outcome"));
        }
        let now = self.now;
        if let Some(o) = self
            .obligations
            .iter()
            .find(|o| !o.r_sent && !o.settled && now < o.lease_end)
        {
            return self.fail(
                Invariant::OrphanRelease,
                format!(
                    "({}, {}) was never released, and its lease runs until {}",
                    o.key, o.token, o.lease_end
                ),
            );
        }
        Ok(())
    }

    /// Checks that every grant the client had to release by itself was sent
    /// an `R` by now, or its lease has run out. Call it when the run has
    /// given the client every chance to send (connected, idle, before any
    /// shutdown).
    pub fn check_orphans_released(&self) -> Checked {
        let now = self.now;
        match self
            .obligations
            .iter()
            .find(|o| !o.r_sent && now < o.lease_end)
        {
            Some(o) => self.fail(
                Invariant::OrphanRelease,
                format!(
                    "({}, {}) has not been released although the client was connected and idle; its lease runs until {}",
                    o.key, o.token, o.lease_end
                ),
            ),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checker")
            .field("now", &self.now)
            .field("step", &self.step)
            .field("ops", &self.ops.len())
            .field("open", &self.open_operations())
            .field("obligations", &self.obligations.len())
            .finish_non_exhaustive()
    }
}
