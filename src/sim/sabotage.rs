//! Bad clients (feature `sabotage`): the proof that the simulator's checks
//! can fail.
//!
//! Each [`Sabotage`] wraps an unmodified client core in a [`BadClient`]
//! that breaks one rule of PROTOCOL.md section 5 the way a buggy client
//! would: between the core and the simulated network, between the core and
//! the workload, or in the configuration it gives the core. The checks are
//! fed what the bad client does on the real wire and what it reports to the
//! workload, never what the wrapper shows the core, and `tests/sim.rs`
//! shows each sabotage caught within a few seeds.
//!
//! | sabotage | where it sits | what it does | the rule it breaks |
//! |---|---|---|---|
//! | `match-by-arrival` | bytes in | gives each answer the id of the oldest unanswered request of the same op and key | an answer is attributed only if id, op and key agree (invariant 2) |
//! | `resend-after-close` | outcomes out | submits an acquire that ended Indeterminate on a close again, and reports the new one's outcome as the first's | an acquire whose bytes were handed out is never sent again (invariant 3) |
//! | `use-reserved-slot` | bytes in | shows the core a window larger by the reserved slots | acquires never exceed `window - reserved` (invariant 4) |
//! | `drop-orphan-release` | actions out | drops the `R` of every release it announces for an orphaned grant | a grant nobody claims is released by its exact token (invariant 5) |
//! | `any-hint` | configuration | allowlists every address the simulation may hint, the impostor's included | leader hints are followed only to allowlisted addresses |
//! | `stale-hints` | configuration | gives the core a `stale_hint` of 1 ns, so that it follows an `M` to a leader that just died, at once | an address whose latest connection ended by a transport failure less than `stale_hint` (1 s) ago is not followed as a hint |
//! | `valid-until-from-arrival` | notices out | tells the workload, with every `Renewed`, a `valid_until` counted from the arrival of the renewal's `G` (plus the lease it gave) instead of from the renewal's send time | `valid_until` never runs past what a `G` proves (invariant 7) |
//! | `no-grace` | the cluster | a leader elected after the lock table was lost begins its term as if it had been handed it: no recovery grace ([`as_if_handed_the_table`]) | a term begun without the table grants nothing until every earlier grant has run out or been reclaimed (PROTOCOL.md 4.1, invariant 8) |
//! | `answer-before-commit` | the replicated cluster (`Scenario::Raft`, feature `raft`) | every member's answers skip the hold-back: a leader answers as soon as it decides (`Server::answer_before_commit`) | an answer waits until every entry it depends on is committed (PROTOCOL.md 4.3) |
//!
//! The checks keep the honest configuration: the world gives each checker,
//! and its allowlist check, the configuration the workload drew, not the
//! one `any-hint` or `stale-hints` gives the core.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;

use crate::client::{
    Action, Client, Config, ConfigError, ConnId, Error, Event, Grant, OpId, Outcome, TransportEnd,
};
use crate::names::{Endpoint, Key, Name};
use crate::server::Term;
use crate::time::Time;
use crate::wire::{ClientFrame, Op, ServerFrame, Window, MAX_FRAME};

/// A client rule broken on purpose, to show that the simulator's checks
/// catch it ([`SimConfig::sabotage`](super::SimConfig::sabotage)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Sabotage {
    /// Match answers by arrival order: each answer is given the id of the
    /// oldest unanswered request of its op and key before the core reads
    /// it.
    MatchByArrival,
    /// Resend an acquire after a close: one that ended Indeterminate
    /// because its connection closed (not because it was cancelled) is
    /// submitted again, and the new one's outcome is reported as the
    /// first's.
    ResendAfterClose,
    /// Put acquires in the reserved slots: the core is shown every `W`
    /// with its window raised by the reserved count.
    UseReservedSlot,
    /// Drop the orphan release: the `R` of every release the core announces
    /// with [`Event::OrphanRelease`] is cut from what it sends.
    DropOrphanRelease,
    /// Take hints from any address: the core's allowlist holds every address
    /// the simulation may hint, the impostor's included.
    AnyHint,
    /// Follow stale hints: the core's `stale_hint` is 1 ns, so that an `M`
    /// naming a leader whose connection just failed (one that just died)
    /// is followed at once.
    StaleHints,
    /// Count a renewed grant's validity from the arrival of the renewal's
    /// `G`, not from the renewal's send time: every [`Event::Renewed`] the
    /// workload is told carries the arrival time plus the lease the `G`
    /// gave, later than what the `G` proves by the round trip.
    ValidUntilFromArrival,
    /// Not a client rule but the server's (PROTOCOL.md 4.1): a leader
    /// elected after the lock table was lost begins its term as if it had
    /// been handed the table, with no recovery grace. The clients are
    /// honest.
    NoGrace,
    /// Not a client rule but the replicated cluster's (PROTOCOL.md 4.3,
    /// `Scenario::Raft`, feature `raft`): a leader sends its
    /// answers as soon as it decides, without waiting for the commit of
    /// the entries they depend on. The clients are honest.
    AnswerBeforeCommit,
}

impl Sabotage {
    /// Every sabotage.
    pub const ALL: [Sabotage; 9] = [
        Sabotage::MatchByArrival,
        Sabotage::ResendAfterClose,
        Sabotage::UseReservedSlot,
        Sabotage::DropOrphanRelease,
        Sabotage::AnyHint,
        Sabotage::StaleHints,
        Sabotage::ValidUntilFromArrival,
        Sabotage::NoGrace,
        Sabotage::AnswerBeforeCommit,
    ];

    /// Its name on the command line (`ticketing sim --sabotage NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Sabotage::MatchByArrival => "match-by-arrival",
            Sabotage::ResendAfterClose => "resend-after-close",
            Sabotage::UseReservedSlot => "use-reserved-slot",
            Sabotage::DropOrphanRelease => "drop-orphan-release",
            Sabotage::AnyHint => "any-hint",
            Sabotage::StaleHints => "stale-hints",
            Sabotage::ValidUntilFromArrival => "valid-until-from-arrival",
            Sabotage::NoGrace => "no-grace",
            Sabotage::AnswerBeforeCommit => "answer-before-commit",
        }
    }

    /// Whether it breaks a rule of the server's (the clients are honest)
    /// rather than a client's.
    pub fn breaks_the_server(self) -> bool {
        matches!(self, Sabotage::NoGrace | Sabotage::AnswerBeforeCommit)
    }
}

impl fmt::Display for Sabotage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Sabotage {
    type Err = UnknownSabotage;

    fn from_str(name: &str) -> Result<Sabotage, UnknownSabotage> {
        Sabotage::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| UnknownSabotage(name.to_owned()))
    }
}

/// A name that is no [`Sabotage`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownSabotage(String);

impl fmt::Display for UnknownSabotage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown sabotage {:?}; one of: ", self.0)?;
        for (i, s) in Sabotage::ALL.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownSabotage {}

/// The term that [`Sabotage::NoGrace`] begins after the lock table was
/// lost: one of a later epoch, as if the table had been handed over (empty,
/// since it was not), with no recovery grace.
pub(super) fn as_if_handed_the_table(epoch: u64) -> Term {
    Term::First { epoch }
}

/// A client core inside a wrapper that breaks one rule. It offers the part
/// of the core's interface that the simulator drives, and passes every call
/// on to the core, through its [`Rule`] where that misbehaves. It has no
/// timers of its own: the core's deadlines are its.
pub(super) struct BadClient {
    core: Client,
    rule: Box<dyn Rule>,
    /// Events taken from the core and passed by the rule, not polled yet.
    events: VecDeque<Event>,
}

impl BadClient {
    /// A core configured with `config` (or, for [`Sabotage::AnyHint`], with
    /// `config` and every address in `hintable` allowlisted; for
    /// [`Sabotage::StaleHints`], with no time for a hint to be stale),
    /// wrapped.
    pub(super) fn new(
        sabotage: Sabotage,
        config: &Config,
        hintable: &[Endpoint],
        now: Time,
    ) -> Result<BadClient, ConfigError> {
        let mut config = config.clone();
        let rule: Box<dyn Rule> = match sabotage {
            Sabotage::MatchByArrival => Box::<MatchByArrival>::default(),
            Sabotage::ResendAfterClose => Box::<ResendAfterClose>::default(),
            Sabotage::UseReservedSlot => Box::new(UseReservedSlot {
                reserved: u64::from(config.reserved),
                lines: Lines::default(),
            }),
            Sabotage::DropOrphanRelease => Box::<DropOrphanRelease>::default(),
            Sabotage::AnyHint => {
                for addr in hintable {
                    if !config.endpoints.contains(addr) && !config.allow.contains(addr) {
                        config.allow.push(addr.clone());
                    }
                }
                Box::new(ByConfiguration)
            }
            Sabotage::StaleHints => {
                config.stale_hint = Duration::from_nanos(1);
                Box::new(ByConfiguration)
            }
            Sabotage::ValidUntilFromArrival => Box::<ValidUntilFromArrival>::default(),
            // The server's sabotage: the client is honest.
            Sabotage::NoGrace | Sabotage::AnswerBeforeCommit => Box::new(ByConfiguration),
        };
        Ok(BadClient {
            core: Client::new(config, now)?,
            rule,
            events: VecDeque::new(),
        })
    }

    /// The core inside.
    pub(super) fn core(&self) -> &Client {
        &self.core
    }

    /// Tells the rule of an acquire of `key` for `owner`, with its budget's
    /// end and its lease, that the core took.
    fn submitted(
        &mut self,
        result: Result<OpId, Error>,
        (key, owner, budget_end, lease): (Key, Name, Time, Duration),
    ) -> Result<OpId, Error> {
        if let Ok(op) = result {
            self.rule.acquired(Submitted {
                op,
                key,
                owner,
                budget_end,
                lease,
                cancelled: false,
            });
        }
        result
    }

    pub(super) fn acquire(
        &mut self,
        now: Time,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> Result<OpId, Error> {
        let result = self
            .core
            .acquire(now, key.clone(), owner.clone(), wait, lease);
        self.submitted(result, (key, owner, now.saturating_add(wait), lease))
    }

    pub(super) fn acquire_renewing(
        &mut self,
        now: Time,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        limit: Option<Duration>,
    ) -> Result<OpId, Error> {
        let result =
            self.core
                .acquire_renewing(now, key.clone(), owner.clone(), wait, lease, limit);
        self.submitted(result, (key, owner, now.saturating_add(wait), lease))
    }

    pub(super) fn renew(
        &mut self,
        now: Time,
        grant: &Grant,
        lease: Option<Duration>,
    ) -> Result<(), Error> {
        self.core.renew(now, grant, lease)
    }

    pub(super) fn auto_renew(
        &mut self,
        now: Time,
        grant: &Grant,
        limit: Option<Duration>,
    ) -> Result<(), Error> {
        self.core.auto_renew(now, grant, limit)
    }

    pub(super) fn stop_renewing(&mut self, now: Time, grant: &Grant) -> Result<(), Error> {
        self.core.stop_renewing(now, grant)
    }

    pub(super) fn release(&mut self, now: Time, grant: &Grant) -> Result<OpId, Error> {
        self.core.release(now, grant)
    }

    pub(super) fn undeliverable(&mut self, now: Time, grant: &Grant) -> Result<(), Error> {
        self.core.undeliverable(now, grant)
    }

    pub(super) fn cancel(&mut self, now: Time, op: OpId) -> Result<(), Error> {
        let op = self.rule.cancel(op);
        self.core.cancel(now, op)
    }

    pub(super) fn shutdown(&mut self, now: Time, budget: Duration) -> Result<(), Error> {
        self.core.shutdown(now, budget)
    }

    pub(super) fn handle_connected(&mut self, now: Time, conn: ConnId) {
        self.core.handle_connected(now, conn);
    }

    pub(super) fn handle_connect_failed(&mut self, now: Time, conn: ConnId) {
        self.core.handle_connect_failed(now, conn);
    }

    pub(super) fn handle_transport_closed(&mut self, now: Time, conn: ConnId, end: TransportEnd) {
        self.core.handle_transport_closed(now, conn, end);
    }

    pub(super) fn handle_timeout(&mut self, now: Time) {
        self.core.handle_timeout(now);
    }

    pub(super) fn handle_bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) {
        let data = self.rule.bytes_in(conn, data);
        if !data.is_empty() {
            self.core.handle_bytes(now, conn, &data);
        }
    }

    pub(super) fn poll_action(&mut self) -> Option<Action> {
        loop {
            // The rule sees the events first: an action may depend on one
            // (the release it announces) that the core queued before it.
            self.take_events();
            let action = self.core.poll_action()?;
            if let Some(action) = self.rule.action_out(action) {
                return Some(action);
            }
        }
    }

    pub(super) fn poll_event(&mut self) -> Option<Event> {
        self.take_events();
        self.events.pop_front()
    }

    fn take_events(&mut self) {
        while let Some(event) = self.core.poll_event() {
            if let Some(event) = self.rule.event_out(&mut self.core, event) {
                self.events.push_back(event);
            }
        }
    }
}

/// An acquire the workload submitted, as the core accepted it.
struct Submitted {
    /// The workload's operation (the core's too, until it is submitted
    /// again).
    op: OpId,
    key: Key,
    owner: Name,
    budget_end: Time,
    lease: Duration,
    /// The workload cancelled it.
    cancelled: bool,
}

/// Where a wrapper may misbehave. Every hook passes things on unchanged
/// unless the rule overrides it.
trait Rule {
    /// Bytes from the network on `conn`: what the core reads instead.
    fn bytes_in<'a>(&mut self, _conn: ConnId, data: &'a [u8]) -> Cow<'a, [u8]> {
        Cow::Borrowed(data)
    }

    /// An action of the core: what reaches the network instead, if
    /// anything.
    fn action_out(&mut self, action: Action) -> Option<Action> {
        Some(action)
    }

    /// An event of the core: what the workload is told instead, if
    /// anything. The rule may call the core.
    fn event_out(&mut self, _core: &mut Client, event: Event) -> Option<Event> {
        Some(event)
    }

    /// The core accepted an acquire of the workload's.
    fn acquired(&mut self, _acquire: Submitted) {}

    /// The workload cancels its `op`: the core's operation to cancel.
    fn cancel(&mut self, op: OpId) -> OpId {
        op
    }
}

/// The lines the core reads on its connection, put back together so that a
/// rule can rewrite whole frames.
#[derive(Default)]
struct Lines {
    /// The core's connection, while the lines are rewritten.
    conn: Option<ConnId>,
    /// The start of a line whose end has not arrived.
    partial: Vec<u8>,
}

impl Lines {
    /// Follows the core's connection: a connect starts afresh, a close
    /// stops the rewriting.
    fn follow(&mut self, action: &Action) {
        match action {
            Action::Connect { conn, .. } => {
                self.conn = Some(*conn);
                self.partial.clear();
            }
            Action::Close { conn } if self.conn == Some(*conn) => {
                self.conn = None;
                self.partial.clear();
            }
            _ => {}
        }
    }

    /// `data` as the core is to read it: every whole line of the current
    /// connection (without its `\n`) through `rewrite`, which appends what
    /// the core reads instead (with its `\n`); the start of an unfinished
    /// line waits for its end. Bytes of another connection pass unchanged;
    /// so does a line too long to be a frame, and all that follows it, for
    /// the core to refuse.
    fn rewrite<'a>(
        &mut self,
        conn: ConnId,
        data: &'a [u8],
        mut rewrite: impl FnMut(&[u8], &mut Vec<u8>),
    ) -> Cow<'a, [u8]> {
        if self.conn != Some(conn) {
            return Cow::Borrowed(data);
        }
        let mut out = Vec::with_capacity(data.len() + 8);
        let mut rest = data;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            let line = &rest[..end];
            if self.partial.is_empty() {
                rewrite(line, &mut out);
            } else {
                self.partial.extend_from_slice(line);
                rewrite(&self.partial, &mut out);
                self.partial.clear();
            }
            rest = &rest[end + 1..];
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() >= MAX_FRAME {
            out.append(&mut self.partial);
            self.conn = None;
        }
        Cow::Owned(out)
    }
}

/// A line passed on as it came.
fn verbatim(line: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(line);
    out.push(b'\n');
}

/// `match-by-arrival`: the core reads each answer with the id of the oldest
/// request of the same op and key that is still unanswered.
#[derive(Default)]
struct MatchByArrival {
    lines: Lines,
    /// The requests sent on the current connection and not yet answered (as
    /// the core was shown), oldest first.
    unanswered: Vec<(u64, Op, Key)>,
}

impl Rule for MatchByArrival {
    fn bytes_in<'a>(&mut self, conn: ConnId, data: &'a [u8]) -> Cow<'a, [u8]> {
        let unanswered = &mut self.unanswered;
        self.lines.rewrite(conn, data, |line, out| {
            let Ok(ServerFrame::Answer(mut answer)) = ServerFrame::parse(line) else {
                return verbatim(line, out);
            };
            let oldest = unanswered.iter().position(|(_, op, key)| {
                *op == answer.op() && key.as_bytes() == answer.key.as_bytes()
            });
            if let Some(i) = oldest {
                answer.id = unanswered.remove(i).0;
            }
            ServerFrame::Answer(answer).encode(out);
        })
    }

    fn action_out(&mut self, action: Action) -> Option<Action> {
        self.lines.follow(&action);
        match &action {
            Action::Connect { .. } | Action::Close { .. } => self.unanswered.clear(),
            Action::Send { data, .. } => {
                for line in data.split(|&b| b == b'\n') {
                    let (id, op, key) = match ClientFrame::parse(line) {
                        Ok(ClientFrame::Acquire { id, key, .. }) => (id, Op::Acquire, key),
                        Ok(ClientFrame::Release { id, key, .. }) => (id, Op::Release, key),
                        _ => continue,
                    };
                    self.unanswered.push((id, op, Key::from(key)));
                }
            }
        }
        Some(action)
    }
}

/// `resend-after-close`: an acquire that ended Indeterminate because its
/// connection closed is submitted again, with what is left of its budget,
/// and the new operation's outcome is reported as the first's.
#[derive(Default)]
struct ResendAfterClose {
    /// The workload's open acquires, by the core's operation.
    open: BTreeMap<OpId, Submitted>,
    /// The core's operation of each acquire submitted again, by the
    /// workload's.
    again: BTreeMap<OpId, OpId>,
}

impl Rule for ResendAfterClose {
    fn event_out(&mut self, core: &mut Client, event: Event) -> Option<Event> {
        let Event::Outcome { op, outcome } = event else {
            return Some(event);
        };
        let Some(acquire) = self.open.remove(&op) else {
            return Some(Event::Outcome { op, outcome });
        };
        self.again.remove(&acquire.op);
        if matches!(outcome, Outcome::Indeterminate { .. }) && !acquire.cancelled {
            let now = core.now();
            let wait = acquire.budget_end.saturating_duration_since(now);
            let resent = core.acquire(
                now,
                acquire.key.clone(),
                acquire.owner.clone(),
                wait,
                acquire.lease,
            );
            if let Ok(resent) = resent {
                self.again.insert(acquire.op, resent);
                self.open.insert(resent, acquire);
                return None;
            }
        }
        Some(Event::Outcome {
            op: acquire.op,
            outcome,
        })
    }

    fn acquired(&mut self, acquire: Submitted) {
        self.open.insert(acquire.op, acquire);
    }

    fn cancel(&mut self, op: OpId) -> OpId {
        let op = self.again.get(&op).copied().unwrap_or(op);
        if let Some(acquire) = self.open.get_mut(&op) {
            acquire.cancelled = true;
        }
        op
    }
}

/// `use-reserved-slot`: the core reads every `W` with the window raised by
/// its reserved slots, so that its acquires fill the real window's.
struct UseReservedSlot {
    reserved: u64,
    lines: Lines,
}

impl Rule for UseReservedSlot {
    fn bytes_in<'a>(&mut self, conn: ConnId, data: &'a [u8]) -> Cow<'a, [u8]> {
        let reserved = self.reserved;
        self.lines.rewrite(conn, data, |line, out| {
            let Ok(ServerFrame::Welcome { node, window }) = ServerFrame::parse(line) else {
                return verbatim(line, out);
            };
            let window = Window::new(window.get().saturating_add(reserved)).unwrap_or(window);
            ServerFrame::Welcome { node, window }.encode(out);
        })
    }

    fn action_out(&mut self, action: Action) -> Option<Action> {
        self.lines.follow(&action);
        Some(action)
    }
}

/// `drop-orphan-release`: the `R` lines of the releases the core announces
/// for orphaned grants never reach the network.
#[derive(Default)]
struct DropOrphanRelease {
    /// The grants announced with `OrphanRelease` and not settled yet.
    orphans: Vec<(Key, u64)>,
}

impl DropOrphanRelease {
    /// Whether `line` (with its `\n`) is the `R` of an orphan release.
    fn is_orphan(&self, line: &[u8]) -> bool {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let Ok(ClientFrame::Release { key, token, .. }) = ClientFrame::parse(line) else {
            return false;
        };
        self.orphans
            .iter()
            .any(|(k, t)| *t == token && k.as_bytes() == key.as_bytes())
    }
}

impl Rule for DropOrphanRelease {
    fn action_out(&mut self, action: Action) -> Option<Action> {
        let Action::Send { conn, data } = &action else {
            return Some(action);
        };
        let lines = data.split_inclusive(|&b| b == b'\n');
        if !lines.clone().any(|line| self.is_orphan(line)) {
            return Some(action);
        }
        let kept: Vec<u8> = lines
            .filter(|line| !self.is_orphan(line))
            .flatten()
            .copied()
            .collect();
        (!kept.is_empty()).then(|| Action::Send {
            conn: *conn,
            data: Bytes::from(kept),
        })
    }

    fn event_out(&mut self, _core: &mut Client, event: Event) -> Option<Event> {
        match &event {
            Event::OrphanRelease { key, token } => self.orphans.push((key.clone(), *token)),
            Event::OrphanSettled { key, token, .. } => {
                if let Some(i) = self
                    .orphans
                    .iter()
                    .position(|(k, t)| k == key && t == token)
                {
                    self.orphans.remove(i);
                }
            }
            _ => {}
        }
        Some(event)
    }
}

/// `valid-until-from-arrival`: every `Renewed` the workload is told says
/// the grant is valid until the moment the renewal's `G` arrived plus the
/// lease it gave, instead of the renewal's send time plus that lease.
#[derive(Default)]
struct ValidUntilFromArrival {
    lines: Lines,
    /// The lease of the latest `G .. X` read for each `(key, token)`.
    leases: BTreeMap<(Key, u64), u64>,
}

impl Rule for ValidUntilFromArrival {
    fn bytes_in<'a>(&mut self, conn: ConnId, data: &'a [u8]) -> Cow<'a, [u8]> {
        let leases = &mut self.leases;
        self.lines.rewrite(conn, data, |line, out| {
            if let Ok(ServerFrame::Answer(answer)) = ServerFrame::parse(line) {
                if let crate::wire::AnswerKind::Renewed { token, lease_ms } = answer.kind {
                    leases.insert((Key::from(answer.key), token), lease_ms.get());
                }
            }
            verbatim(line, out);
        })
    }

    fn action_out(&mut self, action: Action) -> Option<Action> {
        self.lines.follow(&action);
        Some(action)
    }

    fn event_out(&mut self, core: &mut Client, event: Event) -> Option<Event> {
        let Event::Renewed {
            grant,
            key,
            token,
            valid_until,
        } = event
        else {
            return Some(event);
        };
        let valid_until = match self.leases.get(&(key.clone(), token)) {
            // The core reads the answer at its arrival: its time is now.
            Some(&lease_ms) => valid_until.max(core.now().saturating_add_millis(lease_ms)),
            None => valid_until,
        };
        Some(Event::Renewed {
            grant,
            key,
            token,
            valid_until,
        })
    }
}

/// `any-hint` and `stale-hints`: they misbehave through the core's
/// configuration alone ([`BadClient::new`]); and `no-grace`'s honest
/// client.
struct ByConfiguration;

impl Rule for ByConfiguration {}
