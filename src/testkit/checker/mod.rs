//! The invariant checker: watches one client core from the outside and
//! checks invariants 1 to 7 of PROTOCOL.md section 5 after every step,
//! for a client of protocol version 2.
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
//! frame is mapped to its operation. Releases and renewals are mapped by
//! their exact `(key, token)`.
//!
//! # Renewal (section 5, "Renewal", and invariant 7)
//!
//! For every grant the embedder holds the checker keeps its own
//! `valid_until` (the answered attempt's send time, plus the `waited_ms`
//! of the acquire's `G`, plus the lease given; a renewal's `G` moves it to
//! `max(valid_until, its send time + lease)`), whether it is renewed
//! automatically and until when, and the renewal that is asked for, queued
//! by the schedule or in flight. After every step it compares
//! [`Client::valid_until`] with it, and it holds the client to the rules
//! it can see from outside: an `X` only for a grant the embedder holds,
//! that is not being released, whose `valid_until` has not passed, asked
//! for (by the embedder, or by the schedule once less than two thirds of
//! the lease is left) and with the lease asked; at most one in flight per
//! grant; releases, then renewals, then acquires in what is sent, and a
//! renewal waiting while a slot of the window is free is a violation; one
//! in flight at a close resent only while `valid_until` has not passed;
//! Renewed with the new `valid_until`, LeaseJeopardy once per jeopardy,
//! LeaseLost on `N .. X`, LeaseExpired when `valid_until` passes, each at
//! the step it falls due and never otherwise.
//!
//! # Hints
//!
//! The checker keeps the leader hint and the address refused last, as the
//! client must, and expects exactly the notices that change something for
//! the embedder: a flood of `L` lines naming the same addresses gives a
//! bounded number of notices.
//!
//! # Limits
//!
//! A server that grants the same `(key, token)` twice breaks the rule that
//! tokens strictly increase; if a release of the first is already under way
//! when the second is delivered, the release goes out while the embedder
//! holds the second. The checker does not count that against the client,
//! which cannot tell the two grants apart.

mod invariant;
mod rounds;
mod stats;

use core::fmt;
use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};

pub use self::invariant::{Invariant, InvariantViolation};
pub use self::stats::Stats;

use self::rounds::{LeaseCap, Rounds, Window};
use super::TraceHash;
use crate::client::{
    Action, BackoffCause, Client, CloseReason, Config, ConnId, Error as ClientError, Event, Grant,
    OpId, Outcome, ReleaseResult,
};
use crate::names::{Key, Name};
use crate::time::Time;
use crate::wire::{Answer, AnswerKind, ClientFrame, LineReader, Op, ServerFrame, VERSION};

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
    Renew {
        key: String,
        token: u64,
        lease_ms: u64,
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
        waited_ms: u64,
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
    /// Asked with `acquire_renewing`: renewed automatically for at most this
    /// long from the grant (`Duration::MAX`: no limit).
    renew: Option<Duration>,
}

enum OpKind {
    Acquire(AcquireRecord),
    /// A release; `lost` when its grant's renewal was answered `N`: it
    /// ends NotHeld at once, with no request.
    Release {
        key: String,
        token: u64,
        lost: bool,
    },
}

struct OpRecord {
    kind: OpKind,
    outcome: Option<Outcome>,
}

/// Where a held grant's renewal is, as the client must have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    Idle,
    /// Asked for (by the embedder, or by the schedule: `auto`), not sent.
    Queued {
        lease_ms: u64,
        auto: bool,
    },
    /// In flight as request `id`.
    Sent {
        id: u64,
        sent_at: Time,
        lease_ms: u64,
        auto: bool,
    },
}

/// A grant the client holds for the embedder (matched, delivered or about
/// to be), until the client forgets it.
struct HeldGrant {
    key: String,
    token: u64,
    /// The `expires_by` of the [`Grant`] handed out.
    expires_by: Time,
    /// When the server has freed it at the latest, renewals included (no
    /// margin).
    lease_end: Time,
    delivered: bool,
    /// The grant handed out, once delivered.
    grant: Option<Grant>,
    /// What the `G`s read prove (invariant 7).
    valid_until: Time,
    /// The lease of the `G` that set `valid_until`.
    lease_ms: u64,
    /// What an automatic renewal asks for: the acquire's lease.
    renew_lease_ms: u64,
    /// The client keeps its record until this, once expired (its
    /// `expires_by`, moved by renewals).
    record_until: Time,
    /// Renewed automatically until this.
    auto_until: Option<Time>,
    renewal: Renewal,
    /// When its renewal went into the lane, while [`Renewal::Queued`]
    /// (`Time::ZERO`: put back at its front by a close): the lane sends
    /// renewals in that order.
    queued_at: Time,
    /// In jeopardy (told, or owed).
    jeopardy: bool,
    expired: bool,
    /// Its renewal was answered `N`.
    lost: bool,
    /// The client no longer has it: only owed notices keep the record.
    gone: bool,
    owed_renewed: Option<Time>,
    owed_jeopardy: bool,
    owed_expired: bool,
    owed_lost: bool,
}

impl HeldGrant {
    fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    /// Whether the embedder holds it (the client has not forgotten it, nor
    /// lost it).
    fn live(&self) -> bool {
        !self.gone && !self.lost
    }

    /// Whether a notice is owed.
    fn owes(&self) -> bool {
        self.owed_renewed.is_some() || self.owed_jeopardy || self.owed_expired || self.owed_lost
    }

    /// The next moment something is due for it (its renewal's answer
    /// grace aside: the client's close tells of that).
    fn next_moment(&self) -> Time {
        if self.gone {
            return Time::MAX;
        }
        if self.lost {
            return self.record_until;
        }
        if self.expired {
            return match self.renewal {
                Renewal::Sent { .. } => Time::MAX,
                _ => self.record_until,
            };
        }
        let mut at = self.valid_until;
        if let Some(until) = self.auto_until {
            at = at.min(until);
            if !self.jeopardy {
                at = at.min(self.jeopardy_at());
            }
            if self.renewal == Renewal::Idle {
                at = at.min(self.renew_at());
            }
        }
        at
    }

    fn renew_at(&self) -> Time {
        self.valid_until.saturating_sub(self.lease() * 2 / 3)
    }

    fn jeopardy_at(&self) -> Time {
        self.valid_until.saturating_sub(self.lease() / 3)
    }

    /// What is due at `at`, in order: expiry (renewal stops), the end of
    /// automatic renewal, jeopardy, the schedule's renewal; and the client
    /// forgetting an expired grant once the server has certainly freed it
    /// (a lost one at its `expires_by`).
    fn tend(&mut self, at: Time) {
        if self.gone {
            return;
        }
        if self.lost {
            self.gone = at >= self.record_until;
            return;
        }
        if !self.expired && at >= self.valid_until {
            self.expired = true;
            self.owed_expired = true;
            self.auto_until = None;
            if matches!(self.renewal, Renewal::Queued { .. }) {
                self.renewal = Renewal::Idle;
            }
        }
        if self.auto_until.is_some_and(|until| at >= until) {
            self.auto_until = None;
            if matches!(self.renewal, Renewal::Queued { auto: true, .. }) {
                self.renewal = Renewal::Idle;
            }
        }
        if self.auto_until.is_some() {
            if !self.jeopardy && at >= self.jeopardy_at() {
                self.jeopardy = true;
                self.owed_jeopardy = true;
            }
            if self.renewal == Renewal::Idle && at >= self.renew_at() {
                self.renewal = Renewal::Queued {
                    lease_ms: self.renew_lease_ms,
                    auto: true,
                };
                self.queued_at = at;
            }
        }
        if self.expired && at >= self.record_until && !matches!(self.renewal, Renewal::Sent { .. })
        {
            self.gone = true;
        }
    }

    /// Whether `grant` names this one.
    fn is(&self, grant: &Grant) -> bool {
        self.key == grant.key().as_str()
            && self.token == grant.token()
            && match &self.grant {
                Some(g) => g.id() == grant.id(),
                None => self.expires_by == grant.expires_by(),
            }
    }
}

/// The connection as the notices tell of it: for the hint rules.
struct NoticeConn {
    addr: String,
    to_hint: bool,
    welcomed: bool,
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
    /// Endpoints and the extra allowlist.
    allowlist: Vec<String>,
    /// The leader hint, as the client must have it.
    hint: Option<String>,
    /// The address refused last on the current connection.
    ignored: Option<String>,
    /// Hint notices owed, in order: `(taken, addr)`.
    owed_hints: std::collections::VecDeque<(bool, String)>,
    notice_conn: Option<NoticeConn>,
    /// A call that must change nothing was made this step.
    quiet_call: Option<&'static str>,
    /// A renewal command's result that is right only if the client closed
    /// its connection before the command, within the call: the close must
    /// come in this step. What was answered.
    close_owed: Option<String>,
    /// Where and when the client connects.
    rounds: Rounds,
    /// The time of the input before this step's: timers that fire in this
    /// step are due after it.
    step_from: Time,
}

/// The cap the grants the embedder holds put on the link's waits: a
/// quarter of what is left until the earliest `valid_until` of a grant
/// renewed automatically or with a renewal asked for, never below 100 ms.
struct HeldCap<'a>(&'a [HeldGrant], Time);

impl LeaseCap for HeldCap<'_> {
    fn as_of(&self) -> Time {
        self.1
    }

    fn cap(&self, at: Time) -> Option<Duration> {
        let earliest = self
            .0
            .iter()
            .filter(|g| g.live() && !g.expired)
            .filter(|g| g.auto_until.is_some() || g.renewal != Renewal::Idle)
            .map(|g| g.valid_until)
            .min()?;
        Some((earliest.saturating_duration_since(at) / 4).max(Duration::from_millis(100)))
    }
}

type Checked = Result<(), InvariantViolation>;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The invariant that a renewal notice `what` (`Renewed`, `LeaseJeopardy`,
/// `LeaseExpired`, `LeaseLost`) breaks when it is told wrongly or not at
/// all: renewal for `Renewed`, the protocol for the others.
fn notice_invariant(what: &str) -> Invariant {
    if what == "Renewed" {
        Invariant::Renewal
    } else {
        Invariant::Protocol
    }
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
            allowlist: config
                .endpoints
                .iter()
                .chain(&config.allow)
                .map(|e| e.as_str().to_owned())
                .collect(),
            hint: None,
            ignored: None,
            owed_hints: std::collections::VecDeque::new(),
            notice_conn: None,
            quiet_call: None,
            close_owed: None,
            rounds: Rounds::new(config),
            step_from: now,
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

    /// When what this step shows may have happened.
    fn window(&self) -> Window {
        Window {
            lo: self.step_from,
            hi: self.now,
        }
    }

    fn tick(&mut self, now: Time, what: &str) {
        self.step_from = self.now;
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
        self.submitted_acquire(now, key, owner, wait, lease, None, result)
    }

    /// `acquire_renewing(now, key, owner, wait, lease, limit)` returned
    /// `result`.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_renewing(
        &mut self,
        now: Time,
        key: &Key,
        owner: &Name,
        wait: Duration,
        lease: Duration,
        limit: Option<Duration>,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.tick(now, "acquire_renewing");
        self.trace.write(format!("{limit:?}").as_bytes());
        let renew = Some(limit.unwrap_or(Duration::MAX));
        self.submitted_acquire(now, key, owner, wait, lease, renew, result)
    }

    #[allow(clippy::too_many_arguments)]
    fn submitted_acquire(
        &mut self,
        now: Time,
        key: &Key,
        owner: &Name,
        wait: Duration,
        lease: Duration,
        renew: Option<Duration>,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.trace.write(key.as_bytes());
        self.trace.write(owner.as_bytes());
        self.trace.write_u64(ms(wait));
        self.trace.write_u64(ms(lease));
        self.trace.write(format!("{result:?}").as_bytes());
        match result {
            Ok(_) if self.rounds.misconfigured().is_some() => self.fail(
                Invariant::Protocol,
                "an acquire taken while every server refuses the client",
            ),
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
                            renew,
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
            Err(ClientError::Misconfigured(cause))
                if self.rounds.misconfigured() == Some(cause) =>
            {
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

    /// The held grant `grant` names, if the client still has it (held, or
    /// lost).
    fn held_index(&self, grant: &Grant) -> Option<usize> {
        self.held.iter().position(|h| !h.gone && h.is(grant))
    }

    /// Whether the embedder holds `(key, token)`.
    fn holds(&self, key: &str, token: u64) -> bool {
        self.held
            .iter()
            .any(|h| h.live() && h.key == key && h.token == token)
    }

    /// Whether the client knows `(key, token)`, so that a `G` for it that
    /// nobody claims is not released: held, lost, being released, or with
    /// a renewal in flight.
    fn known(&self, key: &str, token: u64) -> bool {
        let renewing = self.conn.as_ref().is_some_and(|c| {
            c.pending.values().any(
                |r| matches!(r, Request::Renew { key: k, token: t, .. } if k == key && *t == token),
            )
        });
        renewing
            || self.releasing(key, token)
            || self
                .held
                .iter()
                .any(|h| !h.gone && h.key == key && h.token == token)
    }

    /// Brings every held grant to `now`, as the client's timers must have,
    /// each at its own moment: its renewal by the schedule (less than two
    /// thirds of its lease left before `valid_until`), its jeopardy (less
    /// than a third), the end of its automatic renewal, its expiry, and the
    /// client forgetting it.
    fn advance_grants(&mut self, now: Time) {
        for h in &mut self.held {
            loop {
                let at = h.next_moment();
                if at > now {
                    break;
                }
                h.tend(at);
            }
        }
    }

    /// What the client does for held grant `i` at once, at `now`, after a
    /// change to it: everything due, in the order the client does it.
    fn tend_now(&mut self, i: usize, now: Time) {
        self.held[i].tend(now);
        self.advance_grants(now);
    }

    /// Forgets the grants the client has forgotten, once told all it owes.
    fn forget_gone(&mut self) {
        self.held.retain(|h| !h.gone || h.owes());
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

    fn register_release(&mut self, op: OpId, key: &str, token: u64, lost: bool) -> Checked {
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
                    lost,
                },
                outcome: None,
            },
        );
        if !lost {
            self.open_release(key, token);
        }
        Ok(())
    }

    /// What every call that gives a grant back (`release`, `undeliverable`)
    /// does first: the trace of the call, its grant and its `result`, the
    /// grants brought up to `now`; the index of the grant among the held.
    fn grant_call(
        &mut self,
        now: Time,
        call: &str,
        grant: &Grant,
        result: &dyn fmt::Debug,
    ) -> Option<usize> {
        self.tick(now, call);
        self.trace_grant(grant);
        self.trace.write(format!("{result:?}").as_bytes());
        self.advance_grants(now);
        self.held_index(grant)
    }

    /// `release(now, grant)` returned `result`.
    pub fn release(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        let held = self.grant_call(now, "release", grant, result);
        let (key, token) = (grant.key().as_str(), grant.token());
        let lost = held.is_some_and(|i| self.held[i].lost);
        match result {
            Ok(op) => {
                match held {
                    Some(i) => {
                        self.forget_held(i);
                    }
                    None if now >= grant.expires_by() => {}
                    None => {
                        return self.fail(
                            Invariant::Protocol,
                            format!("release of ({key}, {token}) accepted though it is not held"),
                        )
                    }
                }
                self.register_release(*op, key, token, lost)
            }
            Err(ClientError::GrantNotHeld { .. }) if held.is_none() => Ok(()),
            Err(ClientError::Busy) if self.open_releases() >= self.max_releases && !lost => Ok(()),
            Err(ClientError::Finished) if self.shutdown.is_some() => Ok(()),
            Err(e) => self.fail(
                Invariant::Protocol,
                format!("release of ({key}, {token}) refused: {e}"),
            ),
        }
    }

    /// The embedder gave up held grant `i` (released it, or handed it
    /// back): the client forgets it and its renewal stops (one in flight
    /// is claimed). Notices that fell due before the call are still owed.
    /// Its key, token, the bound on its lease, and whether it was lost (or
    /// is freed already: nothing to release).
    fn forget_held(&mut self, i: usize) -> (String, u64, Time, bool) {
        let now = self.now;
        let h = &mut self.held[i];
        h.gone = true;
        h.renewal = Renewal::Idle;
        // An expired grant kept only for a renewal in flight, past what
        // that renewal could give it: the server has freed it, there is
        // nothing left to release.
        let freed = h.expired && now >= h.record_until;
        (h.key.clone(), h.token, h.lease_end, h.lost || freed)
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
            Ok(op) => self.register_release(*op, key.as_str(), token, false),
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
        let held = self.grant_call(now, "undeliverable", grant, result);
        let (key, token) = (grant.key().as_str(), grant.token());
        match (result, held) {
            (Ok(()), Some(i)) => {
                let (key, token, lease_end, lost) = self.forget_held(i);
                // A lost grant has nothing to release.
                if !lost {
                    self.add_obligation(key, token, lease_end);
                }
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

    /// Whether a close of the connection now would make the client forget
    /// `grant`: it has expired, its renewal is in flight on the live
    /// connection (so its record is kept for that answer), and its record's
    /// end has passed.
    fn forgotten_at_a_close(&self, grant: &Grant) -> bool {
        let live = self.conn.as_ref().is_some_and(|c| c.alive);
        self.held_index(grant).is_some_and(|i| {
            let h = &self.held[i];
            live && h.live()
                && h.expired
                && matches!(h.renewal, Renewal::Sent { .. })
                && self.now >= h.record_until
        })
    }

    /// What a renewal command on `grant` must give at `now`, before its own
    /// effect: `Ok(i)` for held grant `i`, else the error.
    fn renewable(&self, grant: &Grant) -> Result<usize, ClientError> {
        let (key, token) = (grant.key().clone(), grant.token());
        if self.complete {
            return Err(ClientError::Finished);
        }
        if self.shutdown.is_some() {
            return Err(ClientError::ShuttingDown);
        }
        match self.held_index(grant) {
            Some(i) if self.held[i].lost => Err(ClientError::GrantNotHeld { key, token }),
            Some(i) if self.held[i].expired => Err(ClientError::LeaseExpired { key, token }),
            Some(i) => Ok(i),
            None => Err(ClientError::GrantNotHeld { key, token }),
        }
    }

    /// Checks a renewal command's result against [`Checker::renewable`]:
    /// the held grant it applies to, if it was accepted.
    fn renewal_command(
        &mut self,
        call: &str,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Result<Option<usize>, InvariantViolation> {
        self.trace_grant(grant);
        self.trace.write(format!("{result:?}").as_bytes());
        let now = self.now;
        self.advance_grants(now);
        let expected = self.renewable(grant);
        match (&expected, result) {
            (Ok(i), Ok(())) => Ok(Some(*i)),
            (Err(e), Err(got)) if e == got => Ok(None),
            // The shutdown may finish at the call's own moment, its timers
            // fired first: told by the event that follows.
            (Err(ClientError::ShuttingDown), Err(ClientError::Finished)) => Ok(None),
            // An expired grant kept only for its renewal in flight, past
            // its record's end. If the client's own timers close the
            // connection first, within the call (an answer grace that ran
            // out while the driver was late: closes tell of answer graces,
            // which this model does not keep), the renewal is put down and
            // the client forgets the grant: not held. Right only with that
            // close, which must come in this step.
            (Err(ClientError::LeaseExpired { .. }), Err(ClientError::GrantNotHeld { .. }))
                if self.forgotten_at_a_close(grant) =>
            {
                self.close_owed = Some(format!(
                    "{call} of ({}, {}) gave {result:?}",
                    grant.key(),
                    grant.token()
                ));
                Ok(None)
            }
            _ => Err(self.violation(
                Invariant::Protocol,
                format!(
                    "{call} of ({}, {}) gave {result:?}, expected {:?}",
                    grant.key(),
                    grant.token(),
                    expected.map(|_| ())
                ),
            )),
        }
    }

    /// `renew(now, grant, lease)` returned `result`.
    pub fn renew(
        &mut self,
        now: Time,
        grant: &Grant,
        lease: Option<Duration>,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.tick(now, "renew");
        self.trace.write(format!("{lease:?}").as_bytes());
        if let Some(i) = self.renewal_command("renew", grant, result)? {
            let h = &mut self.held[i];
            if h.renewal == Renewal::Idle {
                h.renewal = Renewal::Queued {
                    lease_ms: lease.map_or(h.renew_lease_ms, ms),
                    auto: false,
                };
                h.queued_at = now;
            }
        }
        Ok(())
    }

    /// `auto_renew(now, grant, limit)` returned `result`.
    pub fn auto_renew(
        &mut self,
        now: Time,
        grant: &Grant,
        limit: Option<Duration>,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.tick(now, "auto_renew");
        self.trace.write(format!("{limit:?}").as_bytes());
        if let Some(i) = self.renewal_command("auto_renew", grant, result)? {
            self.held[i].auto_until = Some(limit.map_or(Time::MAX, |l| now.saturating_add(l)));
            self.tend_now(i, now);
        }
        Ok(())
    }

    /// `stop_renewing(now, grant)` returned `result`.
    pub fn stop_renewing(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.tick(now, "stop_renewing");
        if let Some(i) = self.renewal_command("stop_renewing", grant, result)? {
            let h = &mut self.held[i];
            h.auto_until = None;
            if matches!(h.renewal, Renewal::Queued { auto: true, .. }) {
                h.renewal = Renewal::Idle;
            }
            self.tend_now(i, now);
        }
        Ok(())
    }

    /// A call (`release`, `undeliverable`, `renew`, `auto_renew`,
    /// `stop_renewing`, by `call`) was made with a grant that another
    /// client issued, and returned `result`: it must be refused with
    /// `ForeignGrant` naming that grant (or, once shut down, as any call
    /// then is), and change nothing: no action and no event may follow
    /// until the step ends. The driver fires the timers due first.
    pub fn foreign(
        &mut self,
        now: Time,
        call: &'static str,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.tick(now, "foreign");
        self.trace.write(call.as_bytes());
        self.trace_grant(grant);
        self.trace.write(format!("{result:?}").as_bytes());
        self.quiet_call = Some(call);
        let renewal = !matches!(call, "release" | "undeliverable");
        let foreign = ClientError::ForeignGrant {
            key: grant.key().clone(),
            token: grant.token(),
        };
        let fits = match result {
            Err(ClientError::Finished) => self.shutdown.is_some(),
            Err(ClientError::ShuttingDown) => renewal && self.shutdown.is_some() && !self.complete,
            Err(e) => *e == foreign && !(renewal && self.shutdown.is_some()) && !self.complete,
            Ok(()) => false,
        };
        if !fits {
            return self.fail(
                Invariant::Protocol,
                format!(
                    "{call} with a grant of ({}, {}) from another client gave {result:?}, not {foreign:?}",
                    grant.key(),
                    grant.token()
                ),
            );
        }
        self.stats.foreign_refused += 1;
        Ok(())
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
                // Shutting down stops every renewal: automatic renewal
                // ends, and renewals not sent are dropped.
                self.advance_grants(now);
                for i in 0..self.held.len() {
                    let h = &mut self.held[i];
                    h.auto_until = None;
                    if matches!(h.renewal, Renewal::Queued { .. }) {
                        h.renewal = Renewal::Idle;
                    }
                    self.tend_now(i, now);
                }
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
        if self.conn.as_ref().is_some_and(|c| c.id == conn && c.alive) {
            self.rounds
                .connected(self.now, &HeldCap(&self.held, self.now));
        }
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
        self.advance_grants(now);
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
            ServerFrame::Leader { addr } => {
                self.stats.hints_read += 1;
                self.take_hint(addr.as_str());
                Ok(None)
            }
            ServerFrame::Moved { addr } => {
                self.take_hint(addr.as_str());
                Ok(Some((Invariant::Protocol, "M".into())))
            }
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
            Request::Renew { key, lease_ms, .. } => {
                // The lease is held to what was asked only while the grant
                // is held: a renewal of a grant given up meanwhile is
                // claimed, and its answer changes nothing.
                let held = self.held.iter().any(|h| {
                    !h.gone && matches!(h.renewal, Renewal::Sent { id, .. } if id == a.id)
                });
                (
                    Op::Renew,
                    key.as_str(),
                    if held { *lease_ms } else { u64::MAX },
                )
            }
        };
        if a.op() != op || a.key.as_str() != key {
            let detail = format!("{text}: request {} was {op:?} of {key}", a.id);
            self.stray(a);
            return Ok(Some((Invariant::Attribution, detail)));
        }
        let bad = match (a.kind, &request) {
            (AnswerKind::Granted { lease_ms, .. } | AnswerKind::Renewed { lease_ms, .. }, _)
                if lease_ms.get() > asked =>
            {
                Some(format!("{text}: a longer lease than the {asked} ms asked"))
            }
            (
                AnswerKind::Granted {
                    waited_ms: None, ..
                },
                _,
            ) => Some(format!(
                "{text}: a G to an acquire on version 2 without waited_ms"
            )),
            (
                AnswerKind::Granted {
                    waited_ms: Some(waited),
                    ..
                },
                Request::Acquire { op, .. },
            ) if waited > self.wire_wait_ms(*op) => Some(format!(
                "{text}: waited longer than the {} ms asked",
                self.wire_wait_ms(*op)
            )),
            (AnswerKind::Renewed { token, .. }, Request::Renew { token: asked, .. })
                if token != *asked =>
            {
                Some(format!(
                    "{text}: a renewal of token {asked} answered for another"
                ))
            }
            _ => None,
        };
        if let Some(detail) = bad {
            // The request stays unanswered: the close treats it as sent
            // and unanswered.
            self.stray(a);
            return Ok(Some((Invariant::Attribution, detail)));
        }
        let c = self.conn.as_mut().expect("reading a live connection");
        c.pending.remove(&a.id);
        self.stats.matched += 1;
        self.matched(request, a);
        Ok(None)
    }

    /// The `wait_ms` the latest attempt of acquire `op` was sent with.
    fn wire_wait_ms(&self, op: OpId) -> u64 {
        match self.ops.get(&op).map(|r| &r.kind) {
            Some(OpKind::Acquire(a)) => a.wire_wait_ms,
            _ => u64::MAX,
        }
    }

    /// A hint (`L` or `M`) read: taken if allowlisted. Only what changes
    /// something is told: a hint that is not the hint already, an address
    /// refused that was not the one refused last on this connection.
    fn take_hint(&mut self, addr: &str) {
        if self.allowlist.iter().any(|a| a == addr) {
            if self.hint.as_deref() != Some(addr) {
                self.hint = Some(addr.to_owned());
                self.owed_hints.push_back((true, addr.to_owned()));
            }
        } else if self.ignored.as_deref() != Some(addr) {
            self.ignored = Some(addr.to_owned());
            self.owed_hints.push_back((false, addr.to_owned()));
        }
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
                        token,
                        lease_ms,
                        waited_ms,
                    } => {
                        let lease = Duration::from_millis(lease_ms.get());
                        let lease_end = now.saturating_add(lease);
                        if abandoned {
                            // An abandoned waiter's grant: released by its
                            // exact token, unless the client knows it (a
                            // server that repeats a token of a grant the
                            // embedder holds, or one being released).
                            if !self.known(&key, token) {
                                self.add_obligation(key, token, lease_end);
                            }
                        } else {
                            let waited_ms = waited_ms.unwrap_or(0);
                            let sent_at = acq.sent_at;
                            let renew = acq.renew;
                            acq.last = Some(Answered::Granted {
                                token,
                                lease_ms: lease_ms.get(),
                                waited_ms,
                                at: now,
                                sent_at,
                            });
                            let renew_lease_ms = acq.lease_ms;
                            let expires_by = lease_end.saturating_add(margin);
                            self.held.push(HeldGrant {
                                key,
                                token,
                                expires_by,
                                lease_end,
                                delivered: false,
                                grant: None,
                                valid_until: sent_at
                                    .saturating_add(Duration::from_millis(waited_ms))
                                    .saturating_add(lease),
                                lease_ms: lease_ms.get(),
                                renew_lease_ms,
                                record_until: expires_by,
                                auto_until: renew.map(|limit| now.saturating_add(limit)),
                                renewal: Renewal::Idle,
                                queued_at: Time::ZERO,
                                jeopardy: false,
                                expired: false,
                                lost: false,
                                gone: false,
                                owed_renewed: None,
                                owed_jeopardy: false,
                                owed_expired: false,
                                owed_lost: false,
                            });
                            self.tend_now(self.held.len() - 1, now);
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
            Request::Renew { .. } => {
                let now = self.now;
                let margin = self.settle_margin;
                let Some(i) = self.held.iter().position(|h| {
                    !h.gone && matches!(h.renewal, Renewal::Sent { id, .. } if id == a.id)
                }) else {
                    // Its grant was given up meanwhile: claimed, changes
                    // nothing.
                    return;
                };
                let h = &mut self.held[i];
                let Renewal::Sent { sent_at, .. } = h.renewal else {
                    unreachable!("just matched");
                };
                h.renewal = Renewal::Idle;
                match a.kind {
                    AnswerKind::Renewed { lease_ms, .. } => {
                        let lease = Duration::from_millis(lease_ms.get());
                        h.record_until = h
                            .record_until
                            .max(now.saturating_add(lease).saturating_add(margin));
                        h.lease_end = h.lease_end.max(now.saturating_add(lease));
                        if !h.expired {
                            // From the renewal's send time, never its
                            // arrival; never shortened.
                            let proven = sent_at.saturating_add(lease);
                            if proven > h.valid_until {
                                h.valid_until = proven;
                                h.lease_ms = lease_ms.get();
                            }
                            h.jeopardy = false;
                            h.owed_renewed = Some(h.valid_until);
                        }
                    }
                    _ => {
                        h.lost = true;
                        h.owed_lost = true;
                        h.auto_until = None;
                        return;
                    }
                }
                self.tend_now(i, now);
            }
        }
    }

    /// An answer nobody claims: a `G` for a grant that is neither held nor
    /// being released must be released by its exact token.
    fn stray(&mut self, a: Answer<'_>) {
        self.stats.strays += 1;
        if let AnswerKind::Granted {
            token, lease_ms, ..
        }
        | AnswerKind::Renewed { token, lease_ms } = a.kind
        {
            let key = a.key.as_str();
            if self.known(key, token) {
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
        if let Some(call) = self.quiet_call {
            return self.fail(
                Invariant::Protocol,
                format!("{action:?} after {call} with another client's grant, which must change nothing"),
            );
        }
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
        self.close_owed = None;
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
        let now = self.now;
        self.advance_grants(now);
        for (id, request) in &pending {
            if !matches!(request, Request::Renew { .. }) {
                continue;
            }
            // Back into the lane while the grant's valid_until has not
            // passed (and an automatic one while its renewal goes on); not
            // once shutting down, which stops every renewal.
            if let Some(i) = self.held.iter().position(|h| {
                !h.gone && matches!(h.renewal, Renewal::Sent { id: sent, .. } if sent == *id)
            }) {
                let h = &mut self.held[i];
                let Renewal::Sent { lease_ms, auto, .. } = h.renewal else {
                    unreachable!("just matched");
                };
                let allowed = !auto || h.auto_until.is_some_and(|until| now < until);
                h.renewal = if !h.expired && now < h.valid_until && !shutting && allowed {
                    h.queued_at = Time::ZERO;
                    Renewal::Queued { lease_ms, auto }
                } else {
                    Renewal::Idle
                };
                self.tend_now(i, now);
            }
        }
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
        // Releases, then renewals, then acquires: the rank of the last
        // request in this send.
        let mut rank = 0;
        let now = self.now;
        self.advance_grants(now);
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
            let this = match frame {
                ClientFrame::Hello { .. } => 0,
                ClientFrame::Release { .. } => 1,
                ClientFrame::Renew { .. } => 2,
                ClientFrame::Acquire { .. } => 3,
            };
            if this < rank {
                return self.fail(
                    Invariant::Protocol,
                    format!(
                        "{frame} sent after a {}: releases go first, then renewals, then acquires",
                        ["", "release", "renewal", "acquire"][rank]
                    ),
                );
            }
            rank = this;
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
                    || version != 2
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
            ClientFrame::Renew {
                id,
                key,
                token,
                lease_ms,
            } => {
                if !c.hello || c.window.is_none() {
                    return self.fail(Invariant::Window, format!("{text} sent before W"));
                }
                self.new_id(id, &text)?;
                self.renewal_sent(id, key.as_str(), token, lease_ms.get(), &text)?;
                self.stats.requests += 1;
                self.stats.renewals += 1;
                let c = self.conn.as_mut().expect("checked live");
                c.pending.insert(
                    id,
                    Request::Renew {
                        key: key.as_str().to_owned(),
                        token,
                        lease_ms: lease_ms.get(),
                    },
                );
                self.check_window(&text)
            }
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

    /// An `X` went out: invariant 7 and the renewal rules it must keep.
    fn renewal_sent(
        &mut self,
        id: u64,
        key: &str,
        token: u64,
        lease_ms: u64,
        text: &str,
    ) -> Checked {
        let now = self.now;
        let margin = self.settle_margin;
        // The grant it renews. Two the embedder holds may have one key and
        // token (a forged `G` took a token the server gave later): then the
        // one whose renewal asked for this lease, first in the lane.
        let asked = |h: &HeldGrant| matches!(h.renewal, Renewal::Queued { lease_ms: asked, .. } if asked == lease_ms);
        let same = |h: &&HeldGrant| h.live() && h.key == key && h.token == token;
        let first_asked = self
            .held
            .iter()
            .enumerate()
            .filter(|(_, h)| same(h) && asked(h))
            .min_by_key(|(_, h)| h.queued_at)
            .map(|(i, _)| i);
        let Some(i) = first_asked.or_else(|| self.held.iter().position(|h| same(&h))) else {
            let why = if self.releasing(key, token) {
                "a grant that is being released"
            } else {
                "a grant the embedder does not hold"
            };
            return self.fail(Invariant::Renewal, format!("{text}: a renewal of {why}"));
        };
        let h = &mut self.held[i];
        if h.expired || now >= h.valid_until {
            let until = h.valid_until;
            return self.fail(
                Invariant::Renewal,
                format!("{text}: a renewal of a grant whose valid_until {until} has passed"),
            );
        }
        let (until, auto_until, lease) = (h.valid_until, h.auto_until, h.lease_ms);
        let auto = match h.renewal {
            Renewal::Sent { id: other, .. } => {
                return self.fail(
                    Invariant::Protocol,
                    format!(
                        "{text}: renewal {other} of the grant is still in flight: at most one is"
                    ),
                )
            }
            Renewal::Idle => {
                return self.fail(
                    Invariant::Protocol,
                    format!(
                        "{text}: nobody asked for a renewal (valid until {until}, lease {lease} ms, automatic until {auto_until:?})"
                    ),
                );
            }
            Renewal::Queued {
                lease_ms: asked, ..
            } if asked != lease_ms => {
                return self.fail(
                    Invariant::Protocol,
                    format!("{text}: the renewal asked for {asked} ms"),
                );
            }
            Renewal::Queued { auto, .. } => auto,
        };
        let h = &mut self.held[i];
        h.renewal = Renewal::Sent {
            id,
            sent_at: now,
            lease_ms,
            auto,
        };
        let lease = Duration::from_millis(lease_ms);
        h.record_until = h
            .record_until
            .max(now.saturating_add(lease).saturating_add(margin));
        h.lease_end = h.lease_end.max(now.saturating_add(lease));
        self.tend_now(i, now);
        Ok(())
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
        if let Some(call) = self.quiet_call {
            return self.fail(
                Invariant::Protocol,
                format!(
                    "{event:?} after {call} with another client's grant, which must change nothing"
                ),
            );
        }
        let now = self.now;
        self.advance_grants(now);
        match event {
            Event::Outcome { op, outcome } => self.outcome(*op, outcome),
            Event::Renewed {
                grant,
                key,
                token,
                valid_until,
            } => self.renewal_notice("Renewed", *grant, key, *token, Some(*valid_until)),
            Event::LeaseJeopardy {
                grant,
                key,
                token,
                valid_until,
            } => self.renewal_notice("LeaseJeopardy", *grant, key, *token, Some(*valid_until)),
            Event::LeaseLost { grant, key, token } => {
                self.renewal_notice("LeaseLost", *grant, key, *token, None)
            }
            Event::LeaseExpired { grant, key, token } => {
                self.renewal_notice("LeaseExpired", *grant, key, *token, None)
            }
            Event::LeaderHint { addr } | Event::HintIgnored { addr } => {
                let taken = matches!(event, Event::LeaderHint { .. });
                self.stats.hint_notices += 1;
                match self.owed_hints.pop_front() {
                    Some((t, a)) if t == taken && a == addr.as_str() => Ok(()),
                    owed => self.fail(
                        Invariant::Protocol,
                        format!(
                            "{event:?}: the hints read call for {owed:?} (hint {:?}, refused last {:?})",
                            self.hint, self.ignored
                        ),
                    ),
                }
            }
            Event::Connecting { addr } => {
                let to_hint = self.hint.as_deref() == Some(addr.as_str());
                let window = self.window();
                let shutting = self.shutdown.is_some();
                let connecting = self.rounds.connecting(
                    addr.as_str(),
                    self.hint.as_deref(),
                    window,
                    &HeldCap(&self.held, self.now),
                    shutting,
                );
                if let Err(why) = connecting {
                    return self.fail(Invariant::Protocol, why);
                }
                self.notice_conn = Some(NoticeConn {
                    addr: addr.as_str().to_owned(),
                    to_hint,
                    welcomed: false,
                });
                Ok(())
            }
            Event::Connected { .. } => {
                if let Some(n) = &mut self.notice_conn {
                    n.welcomed = true;
                }
                self.rounds.welcomed();
                Ok(())
            }
            Event::Backoff { cause, until } if *cause != BackoffCause::Busy => self
                .rounds
                .backoff(*cause, *until)
                .or_else(|why| self.fail(Invariant::Protocol, why)),
            Event::Misconfigured { cause } => self
                .rounds
                .misconfigured_notice(cause)
                .or_else(|why| self.fail(Invariant::Protocol, why)),
            Event::Closed { addr, reason } => {
                // The hint is forgotten after `E no_leader`, and after a
                // connection to it that ended without `W` for any reason
                // but an `M` to another allowlisted address, or that ended
                // in `M` or `E not_active` after it.
                let mut welcomed = false;
                if let Some(n) = self.notice_conn.take() {
                    let still = n.to_hint && self.hint.as_deref() == Some(n.addr.as_str());
                    let failed = still
                        && (!n.welcomed
                            || matches!(reason, CloseReason::Moved | CloseReason::NotActive));
                    if failed || *reason == CloseReason::NoLeader {
                        self.hint = None;
                    }
                    if n.addr != addr.as_str() {
                        return self.fail(
                            Invariant::Protocol,
                            format!("Closed for {addr}, but the connection was to {}", n.addr),
                        );
                    }
                    welcomed = n.welcomed;
                } else if *reason == CloseReason::NoLeader {
                    self.hint = None;
                }
                self.ignored = None;
                let window = self.window();
                let shutting = self.shutdown.is_some();
                self.rounds
                    .closed(
                        addr.as_str(),
                        reason,
                        welcomed,
                        self.hint.as_deref(),
                        window,
                        &HeldCap(&self.held, self.now),
                        shutting,
                    )
                    .or_else(|why| self.fail(Invariant::Protocol, why))
            }
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

    /// A renewal notice about `grant`: it must be owed, name the grant the
    /// embedder was handed, and carry the `valid_until` the `G`s prove.
    fn renewal_notice(
        &mut self,
        what: &str,
        grant: OpId,
        key: &Key,
        token: u64,
        valid_until: Option<Time>,
    ) -> Checked {
        let Some(i) = self.held.iter().position(|h| {
            h.key == key.as_str()
                && h.token == token
                && h.grant.as_ref().map_or(true, |g| g.id() == grant)
                && match what {
                    "Renewed" => h.owed_renewed.is_some(),
                    "LeaseJeopardy" => h.owed_jeopardy,
                    "LeaseLost" => h.owed_lost,
                    _ => h.owed_expired,
                }
        }) else {
            let known: Vec<String> = self
                .held
                .iter()
                .filter(|h| h.key == key.as_str() && h.token == token)
                .map(|h| {
                    format!(
                        "valid until {}, lease {} ms, automatic until {:?}, {:?}, jeopardy {}, expired {}, lost {}, gone {}",
                        h.valid_until, h.lease_ms, h.auto_until, h.renewal, h.jeopardy, h.expired, h.lost, h.gone
                    )
                })
                .collect();
            return self.fail(
                notice_invariant(what),
                format!(
                    "{what} for ({key}, {token}) at {} was not due: {known:?}",
                    self.now
                ),
            );
        };
        let h = &mut self.held[i];
        let expected = match what {
            "Renewed" => h.owed_renewed.take(),
            "LeaseJeopardy" => {
                h.owed_jeopardy = false;
                Some(h.valid_until)
            }
            "LeaseLost" => {
                h.owed_lost = false;
                None
            }
            _ => {
                h.owed_expired = false;
                None
            }
        };
        match what {
            "Renewed" => self.stats.renewed += 1,
            "LeaseJeopardy" => self.stats.jeopardies += 1,
            "LeaseLost" => self.stats.lost += 1,
            _ => self.stats.expired += 1,
        }
        if valid_until != expected {
            return self.fail(
                Invariant::Renewal,
                format!(
                    "{what} for ({key}, {token}) says valid until {valid_until:?}; what the G read proves is {expected:?}"
                ),
            );
        }
        Ok(())
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
                    waited_ms,
                    at,
                    sent_at,
                }) => {
                    let lease = Duration::from_millis(lease_ms);
                    let proven = sent_at
                        .saturating_add(Duration::from_millis(waited_ms))
                        .saturating_add(lease);
                    if g.valid_until() != proven {
                        Some((
                            Invariant::Renewal,
                            format!("{g:?}: valid until {}, but the G read proves {proven} (sent at {sent_at}, waited {waited_ms} ms, lease {lease_ms} ms)", g.valid_until()),
                        ))
                    } else if g.key().as_str() != a.key
                        || g.token() != token
                        || g.lease() != lease
                        || g.expires_by() != at.saturating_add(lease).saturating_add(margin)
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
            (OpKind::Acquire(a), Outcome::TimedOut { sent: true, cause }) => {
                if a.last != Some(Answered::TimedOut) {
                    Some((
                        Invariant::Attribution,
                        format!("TimedOut, but the answer matched to it was {:?}", a.last),
                    ))
                } else {
                    cause.as_ref().map(|cause| {
                        (
                            Invariant::Protocol,
                            format!("TimedOut after a T, with a cause ({cause})"),
                        )
                    })
                }
            }
            (OpKind::Acquire(a), Outcome::TimedOut { sent: false, cause }) => {
                if a.attempts > 0 {
                    Some((
                        Invariant::Protocol,
                        format!("TimedOut as never sent, after {} attempts", a.attempts),
                    ))
                } else if cause.as_ref() != self.rounds.last_end() {
                    Some((
                        Invariant::Protocol,
                        format!(
                            "TimedOut as never sent with cause {cause:?}, but the latest attempt ended {:?}",
                            self.rounds.last_end()
                        ),
                    ))
                } else {
                    None
                }
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
            (OpKind::Release { lost: true, .. }, Outcome::NotHeld) => None,
            (OpKind::Release { lost: true, .. }, other) => Some((
                Invariant::Protocol,
                format!("{other:?} for the release of a grant whose renewal was answered N: NotHeld at once"),
            )),
            (OpKind::Release { key, token, .. }, Outcome::Released | Outcome::NotHeld) => {
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
            (OpKind::Release { key, token, .. }, Outcome::Lapsed) => {
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
                    h.grant = Some(g.clone());
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
        let result = self
            .end_step_checks(client)
            .and_then(|()| self.renewal_checks(client));
        self.forget_gone();
        self.quiet_call = None;
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
        if let Some(what) = self.close_owed.take() {
            return self.fail(
                Invariant::Protocol,
                format!(
                    "{what}: the grant expired and its renewal is in flight, so it is still known unless a close came first, and none came"
                ),
            );
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
        if let Some(owed) = self.rounds.owed() {
            return self.fail(
                Invariant::Protocol,
                format!("a connection ended, and the step did not end with {owed}"),
            );
        }
        self.rounds.end_step();
        if self.rounds.misconfigured().is_some() {
            let waiting = self.ops.iter().find(|(_, r)| {
                r.outcome.is_none() && matches!(&r.kind, OpKind::Acquire(a) if a.attempts == 0)
            });
            if let Some((op, _)) = waiting {
                return self.fail(
                    Invariant::Protocol,
                    format!("{op} waits for a connection while every server refuses the client"),
                );
            }
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

    /// What must hold of renewals once the client is drained: every notice
    /// due was told; the client's `valid_until` of every grant the embedder
    /// holds is what the `G`s prove (invariant 7); a renewal waiting while
    /// the window has a free slot is a violation (renewals go before
    /// acquires, and may use the reserved slots); and the hints read were
    /// told as they must be.
    fn renewal_checks(&mut self, client: &Client) -> Checked {
        let now = self.now;
        self.advance_grants(now);
        if let Some(owed) = self.owed_hints.front() {
            return self.fail(
                Invariant::Protocol,
                format!("the hints read call for a notice {owed:?} that was not told"),
            );
        }
        for h in &self.held {
            let owed = [
                (h.owed_renewed.is_some(), "Renewed"),
                (h.owed_jeopardy, "LeaseJeopardy"),
                (h.owed_expired, "LeaseExpired"),
                (h.owed_lost, "LeaseLost"),
            ];
            if let Some((_, what)) = owed.iter().find(|(due, _)| *due) {
                return self.fail(
                    notice_invariant(what),
                    format!(
                        "{what} was due for ({}, {}) (valid until {}, lease {} ms, automatic until {:?}) and was not told",
                        h.key, h.token, h.valid_until, h.lease_ms, h.auto_until
                    ),
                );
            }
            if let Some(grant) = h.grant.as_ref().filter(|_| !h.gone && !self.complete) {
                let expected = (!h.lost).then_some(h.valid_until);
                let told = client.valid_until(grant);
                if told != expected {
                    return self.fail(
                        Invariant::Renewal,
                        format!(
                            "the client says ({}, {}) is valid until {told:?}; the G read prove {expected:?}",
                            h.key, h.token
                        ),
                    );
                }
            }
        }
        let Some(c) = self.conn.as_ref() else {
            return Ok(());
        };
        let Some(window) = c.window else {
            return Ok(());
        };
        if c.alive && !c.connect_failed && c.closing.is_none() && (c.pending.len() as u64) < window
        {
            if let Some(h) = self
                .held
                .iter()
                .find(|h| h.live() && matches!(h.renewal, Renewal::Queued { .. }))
            {
                return self.fail(
                    Invariant::Protocol,
                    format!(
                        "the renewal of ({}, {}) waits with {} of {window} slots in use on {}",
                        h.key,
                        h.token,
                        c.pending.len(),
                        c.id
                    ),
                );
            }
        }
        Ok(())
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
