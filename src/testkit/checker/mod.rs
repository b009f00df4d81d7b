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
//! # Parts
//!
//! [`Checker`] is a router over parts that mirror the client core's. Each
//! part owns its state and the checks over it, is told the time and what
//! it needs to know of the others, and reports a rule it finds broken
//! without a date (a `Breach`), which the router dates with the step. No
//! part reads another's fields: the router hands each call, input, action
//! and event to the parts it concerns, and says in which order the checks
//! at the end of a step run.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Checker`]: its parts; the routing of the embedder's calls, of the driver's inputs (the bytes read among them), and of what the client hands out; the checks at the end of a step and of a run |
//! | `timeline.rs` | the time of each input, the window in which a step's timers fire, the step count, the trace, what a step owes by its end |
//! | `link.rs` | the connection: one at a time, `H`, `W`, the frames that must close it and the close; with `rounds.rs` (where and when the client connects, and backs off) and `hints.rs` (the leader hint and its notices) |
//! | `pending.rs` | the requests in flight, by id |
//! | `acquires.rs` | the acquires: submission, attempts within the wait budget, `B` retries, cancel, in doubt at a close, their outcomes |
//! | `holds.rs` | the grants held: `valid_until`, renewal, jeopardy, expiry, loss, their notices, the cap they put on the link's waits |
//! | `releases.rs` | releases: the embedder's, and the client's own for orphaned grants; their answers and outcomes |
//! | `ledger.rs` | the operations of one kind by id, with their outcomes |
//! | `invariant.rs`, `stats.rs` | what the checker reports: [`Invariant`], [`InvariantViolation`], [`Stats`] |
//!
//! # Where each rule lives
//!
//! | rule | where |
//! |---|---|
//! | 1. exactly one outcome | an id taken while open, a second outcome: `Ledger::fresh`, `Ledger::unended`; an outcome for nothing submitted: `Checker::outcome`; a cancel of an operation that has ended: `Acquires::cancel`; an acquire in flight at a close ends Indeterminate, one answered `G` or `T` has its outcome: `Acquires::in_doubt`, `Acquires::none_in_doubt`, `Acquires::answered_ended`; the client's count of open operations, quiescence: `Checker::end_step_checks`; the end of a run: [`Checker::finish`] |
//! | 2. attribution by id, op and key | `Pending::claim`; ids never reused: `Pending::admit`; outcomes that fit the answers matched: `Acquires::end`, `Releases::end`, `Releases::settled` |
//! | 3. an acquire sent is never sent again | `Acquires::attempt` |
//! | 4. the window | nothing before `W`: `Pending::admit`; what is unanswered: `Pending::register` |
//! | 5. orphaned grants released, held ones never | a grant nobody claims: `Checker::stray`, `Checker::matched`; one the embedder cannot take: `Releases::undeliverable`, [`Checker::undeliverable`]; then `Releases::orphan`, `Releases::all_announced`, `Releases::announced`, `Releases::sent`, `Releases::settled`, `Releases::check_released`, `Releases::all_released` |
//! | 6. determinism | the trace: `Timeline`, [`Checker::trace_hash`]; two runs are compared by their driver ([`Runner::run_twice`](super::Runner::run_twice), the simulator) |
//! | 7. `valid_until` and renewals | `Holds::renewal_sent`, `Holds::renewal_answer`, `Holds::notice`, `Holds::told`; a Granted outcome's `valid_until`: `Acquires::end` |
//! | the `H`, the frames that must close, the close | `Link::hello`, `Link::notice`, `Link::close`, `Link::closed_when_due`, [`Checker::bytes`] (framing errors, answers before `W`) |
//! | connecting and backing off; the leader hint | `Rounds`; `Hints` |
//! | renewals asked for, waiting; notices due | `Holds::renewal_sent`, `Holds::none_waiting`, `Holds::notice`, `Holds::told` |
//! | releases, then renewals, then acquires in a send | `Checker::send` |
//! | the results of the embedder's calls | `Acquires::submitted`, `Acquires::cancel`, `Releases::release`, `Releases::release_token`, `Releases::undeliverable`, `Holds::command`, `Timeline::foreign`, [`Checker::shutdown`] |
//! | nothing after a call with another client's grant; after `ShutdownComplete` | `Timeline::loud`; [`Checker::action`], [`Checker::event`] |
//!
//! # Limits
//!
//! A server that grants the same `(key, token)` twice breaks the rule that
//! tokens strictly increase; if a release of the first is already under way
//! when the second is delivered, the release goes out while the embedder
//! holds the second. The checker does not count that against the client,
//! which cannot tell the two grants apart (`Releases::sent`).

mod acquires;
mod hints;
mod holds;
mod invariant;
mod ledger;
mod link;
mod pending;
mod releases;
mod rounds;
mod stats;
mod timeline;

use core::fmt;
use core::time::Duration;

pub use self::invariant::{Invariant, InvariantViolation};
pub use self::stats::Stats;

use self::acquires::{Acquires, Attempt, Matched, Submission};
use self::holds::{Command, Holds};
use self::invariant::{breach, Breach};
use self::link::Link;
use self::pending::{Asked, Pending, Request};
use self::releases::{Releases, Returned};
use self::timeline::Timeline;
use crate::client::{
    Action, Client, Config, ConnId, Error as ClientError, Event, Grant, OpId, Outcome,
};
use crate::names::{Key, Name};
use crate::time::Time;
use crate::wire::{Answer, AnswerKind, ClientFrame, ServerFrame};

type Checked = Result<(), InvariantViolation>;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What the parts are told of the session.
#[derive(Debug, Clone, Copy)]
struct Session {
    /// The embedder asked the client to shut down.
    shutting: bool,
    /// The client told `ShutdownComplete`.
    complete: bool,
}

/// Watches one client core and checks the invariants; see the module
/// documentation for how to drive it.
pub struct Checker {
    timeline: Timeline,
    stats: Stats,
    link: Link,
    pending: Pending,
    acquires: Acquires,
    holds: Holds,
    releases: Releases,
    /// When the shutdown's budget ends, once asked for.
    shutdown: Option<Time>,
    /// `ShutdownComplete` was told.
    complete: bool,
}

impl Checker {
    /// A checker for a client made with `config` at `now`.
    pub fn new(config: &Config, now: Time) -> Checker {
        Checker {
            timeline: Timeline::new(now),
            stats: Stats::default(),
            link: Link::new(config),
            pending: Pending::new(config),
            acquires: Acquires::new(
                config.max_acquires,
                config.queue_grace,
                config.settle_margin,
            ),
            holds: Holds::new(config.settle_margin),
            releases: Releases::new(config.max_releases),
            shutdown: None,
            complete: false,
        }
    }

    /// The hash of everything observed so far: inputs with their times,
    /// actions with their bytes, events. Two runs of the same inputs must
    /// end with the same hash.
    pub fn trace_hash(&self) -> u64 {
        self.timeline.hash()
    }

    /// Counts of what the run did.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Whether nothing is left to settle: no operation open, no release of
    /// the client's own under way.
    pub fn is_settled(&self) -> bool {
        self.acquires.open() == 0 && self.releases.is_settled()
    }

    /// Operations submitted and not ended yet.
    pub fn open_operations(&self) -> usize {
        self.acquires.open() + self.releases.open()
    }

    /// The first operation not ended, by id.
    fn first_open(&self) -> Option<OpId> {
        [self.acquires.first_open(), self.releases.first_open()]
            .into_iter()
            .flatten()
            .min()
    }

    fn session(&self) -> Session {
        Session {
            shutting: self.shutdown.is_some(),
            complete: self.complete,
        }
    }

    /// Whether the client knows `(key, token)`, so that a `G` for it that
    /// nobody claims is not released: held, lost, being released, or with
    /// a renewal in flight.
    fn knows(&self, key: &str, token: u64) -> bool {
        self.pending.renews(key, token)
            || self.releases.releasing(key, token)
            || self.holds.knows(key, token)
    }

    // ----- the embedder's commands -----------------------------------------

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
        self.timeline.tick(now, "acquire");
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
        self.timeline.tick(now, "acquire_renewing");
        self.timeline.write_debug(&limit);
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
        self.timeline.write(key.as_bytes());
        self.timeline.write(owner.as_bytes());
        self.timeline.write_u64(ms(wait));
        self.timeline.write_u64(ms(lease));
        self.timeline.write_debug(result);
        let submission = Submission {
            now,
            key,
            owner,
            wait,
            lease,
            renew,
        };
        let open_elsewhere = result.as_ref().is_ok_and(|&op| self.releases.is_open(op));
        let session = self.session();
        let verdict = self.acquires.submitted(
            submission,
            result,
            self.link.misconfigured(),
            session,
            open_elsewhere,
        );
        self.timeline.judge(verdict)?;
        if let Ok(op) = result {
            self.releases.forget(*op);
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
        self.timeline.tick(now, call);
        self.timeline.write_grant(grant);
        self.timeline.write_debug(result);
        self.holds.advance(now);
        self.holds.index(grant)
    }

    /// `release(now, grant)` returned `result`.
    pub fn release(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        let held = self.grant_call(now, "release", grant, result);
        let returned = Returned {
            grant,
            now,
            held: held.is_some(),
            lost: held.is_some_and(|i| self.holds.is_lost(i)),
        };
        let open_elsewhere = result.as_ref().is_ok_and(|&op| self.acquires.is_open(op));
        let session = self.session();
        let verdict = self
            .releases
            .release(&returned, result, session, open_elsewhere);
        self.timeline.judge(verdict)?;
        if let Ok(op) = result {
            if let Some(i) = held {
                self.holds.give_up(i, self.timeline.now());
            }
            self.acquires.forget(*op);
        }
        Ok(())
    }

    /// `release_token(now, key, token)` returned `result`.
    pub fn release_token(
        &mut self,
        now: Time,
        key: &Key,
        token: u64,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "release_token");
        self.timeline.write(key.as_bytes());
        self.timeline.write_u64(token);
        self.timeline.write_debug(result);
        let open_elsewhere = result.as_ref().is_ok_and(|&op| self.acquires.is_open(op));
        let session = self.session();
        let verdict = self
            .releases
            .release_token(key, token, result, session, open_elsewhere);
        self.timeline.judge(verdict)?;
        if let Ok(op) = result {
            self.acquires.forget(*op);
        }
        Ok(())
    }

    /// `cancel(now, op)` returned `result`.
    pub fn cancel(&mut self, now: Time, op: OpId, result: &Result<(), ClientError>) -> Checked {
        self.timeline.tick(now, "cancel");
        self.timeline.write_u64(op.get());
        self.timeline.write_debug(result);
        let open = self.acquires.is_open(op) || self.releases.is_open(op);
        let cancelled = self.acquires.cancel(op, open, result);
        self.timeline.judge(cancelled)
    }

    /// `undeliverable(now, grant)` returned `result`.
    pub fn undeliverable(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        let held = self.grant_call(now, "undeliverable", grant, result);
        let returned = Returned {
            grant,
            now,
            held: held.is_some(),
            lost: held.is_some_and(|i| self.holds.is_lost(i)),
        };
        let session = self.session();
        let verdict = self.releases.undeliverable(&returned, result, session);
        self.timeline.judge(verdict)?;
        if let (Ok(()), Some(i)) = (result, held) {
            let given = self.holds.give_up(i, self.timeline.now());
            // A lost grant, or one freed already, has nothing to release.
            if !given.freed {
                self.releases
                    .orphan(given.key, given.token, given.lease_end);
            }
        }
        Ok(())
    }

    /// `renew(now, grant, lease)` returned `result`.
    pub fn renew(
        &mut self,
        now: Time,
        grant: &Grant,
        lease: Option<Duration>,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "renew");
        self.timeline.write_debug(&lease);
        self.renewal_command(Command::Renew(lease), now, grant, result)
    }

    /// `auto_renew(now, grant, limit)` returned `result`.
    pub fn auto_renew(
        &mut self,
        now: Time,
        grant: &Grant,
        limit: Option<Duration>,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "auto_renew");
        self.timeline.write_debug(&limit);
        self.renewal_command(Command::AutoRenew(limit), now, grant, result)
    }

    /// `stop_renewing(now, grant)` returned `result`.
    pub fn stop_renewing(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "stop_renewing");
        self.renewal_command(Command::StopRenewing, now, grant, result)
    }

    fn renewal_command(
        &mut self,
        command: Command,
        now: Time,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.write_grant(grant);
        self.timeline.write_debug(result);
        let (at, session, alive) = (self.timeline.now(), self.session(), self.link.alive());
        let verdict = self
            .holds
            .command(command, now, at, grant, result, session, alive);
        if let Some(owed) = self.timeline.judge(verdict)? {
            self.timeline.close_owed = Some(owed);
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
        self.timeline.tick(now, "foreign");
        self.timeline.write(call.as_bytes());
        self.timeline.write_grant(grant);
        self.timeline.write_debug(result);
        let session = self.session();
        let refused = self.timeline.foreign(call, grant, result, session);
        self.timeline.judge(refused)?;
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
        self.timeline.tick(now, "shutdown");
        self.timeline.write_u64(ms(budget));
        self.timeline.write_debug(result);
        match result {
            Ok(()) if self.shutdown.is_none() => {
                self.shutdown = Some(now.saturating_add(budget));
                self.holds.stop_renewals(now);
                Ok(())
            }
            Ok(()) => self
                .timeline
                .fail(Invariant::Protocol, "a second shutdown accepted"),
            Err(ClientError::ShuttingDown) if self.shutdown.is_some() => Ok(()),
            Err(e) => self
                .timeline
                .fail(Invariant::Protocol, format!("shutdown refused: {e}")),
        }
    }

    // ----- the driver's inputs ---------------------------------------------

    /// `handle_connected(now, conn)` was called.
    pub fn connected(&mut self, now: Time, conn: ConnId) {
        self.timeline.tick(now, "connected");
        self.timeline.write_u64(conn.get());
        let at = self.timeline.now();
        self.link.connected(conn, at, &self.holds.cap(at));
    }

    /// `handle_connect_failed(now, conn)` was called.
    pub fn connect_failed(&mut self, now: Time, conn: ConnId) {
        self.timeline.tick(now, "connect_failed");
        self.timeline.write_u64(conn.get());
        self.link.connect_failed(conn);
    }

    /// `handle_transport_closed(now, conn, _)` was called.
    pub fn transport_closed(&mut self, now: Time, conn: ConnId) {
        self.timeline.tick(now, "transport_closed");
        self.timeline.write_u64(conn.get());
    }

    /// `handle_timeout(now)` was called.
    pub fn timeout(&mut self, now: Time) {
        self.timeline.tick(now, "timeout");
    }

    /// `handle_bytes(now, conn, data)` was called. Reads the frames the way
    /// the client must and predicts what it does with each: which answers
    /// it matches, which grants it must release by itself, and at which
    /// frame it must close.
    pub fn bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) -> Checked {
        self.timeline.tick(now, "bytes");
        self.timeline.write_u64(conn.get());
        self.timeline.write(data);
        self.timeline.read_bytes = true;
        self.holds.advance(now);
        let Some(mut reader) = self.link.reader(conn) else {
            return Ok(());
        };
        let mut input = data;
        let mut result = Ok(());
        while let Some(line) = reader.next_line(&mut input) {
            let closing = match line {
                Err(e) => Some(Breach::new(
                    Invariant::Protocol,
                    format!("framing error: {e}"),
                )),
                Ok(line) => match ServerFrame::parse(line) {
                    Err(e) => Some(Breach::new(
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
                self.link.must_close(closing);
                break;
            }
        }
        self.link.put_reader(reader);
        result
    }

    /// One frame read by the client: `Some` if it must close.
    fn frame(&mut self, frame: ServerFrame<'_>) -> Result<Option<Breach>, InvariantViolation> {
        match frame {
            ServerFrame::Answer(answer) => self.answer(answer),
            frame => {
                if let ServerFrame::Leader { .. } = frame {
                    self.stats.hints_read += 1;
                }
                Ok(self.link.notice(frame))
            }
        }
    }

    /// An answer read: claimed by the request it answers, or a stray.
    fn answer(&mut self, a: Answer<'_>) -> Result<Option<Breach>, InvariantViolation> {
        let text = ServerFrame::Answer(a).to_string();
        let conn = self.link.id().expect("reading a live connection");
        if self.link.window().is_none() {
            self.stray(a);
            return Ok(Some(Breach::new(
                Invariant::Protocol,
                format!("answer before W: {text}"),
            )));
        }
        let (acquires, holds) = (&self.acquires, &self.holds);
        let claimed = self
            .pending
            .claim(&a, &text, conn, |request| match request {
                Request::Acquire { op, lease_ms, .. } => Asked {
                    lease_ms: *lease_ms,
                    wait_ms: acquires.wire_wait_ms(*op),
                },
                Request::Release { .. } => Asked {
                    lease_ms: u64::MAX,
                    wait_ms: u64::MAX,
                },
                // The lease is held to what was asked only while the grant is
                // held: a renewal of a grant given up meanwhile is claimed, and
                // its answer changes nothing.
                Request::Renew { lease_ms, .. } => Asked {
                    lease_ms: if holds.renewing(a.id) {
                        *lease_ms
                    } else {
                        u64::MAX
                    },
                    wait_ms: u64::MAX,
                },
            });
        match claimed {
            Ok(request) => {
                self.stats.matched += 1;
                self.matched(request, a);
                Ok(None)
            }
            Err(why) => {
                self.stray(a);
                Ok(Some(why))
            }
        }
    }

    /// An answer matched by id, op and key, to the part that sent it.
    fn matched(&mut self, request: Request, a: Answer<'_>) {
        let now = self.timeline.now();
        match request {
            Request::Acquire { op, key, .. } => match self.acquires.matched(op, key, a.kind, now) {
                Matched::Nothing => {}
                Matched::Orphan {
                    key,
                    token,
                    lease_end,
                } => {
                    if !self.knows(&key, token) {
                        self.releases.orphan(key, token, lease_end);
                    }
                }
                Matched::Held(grant) => self.holds.hold(grant, now),
            },
            Request::Release { key, token } => {
                let released = matches!(a.kind, AnswerKind::Released);
                self.releases.answered(key, token, released);
            }
            Request::Renew { .. } => self.holds.renewal_answer(a.id, a.kind, now),
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
            if self.knows(key, token) {
                return;
            }
            let lease_end = self
                .timeline
                .now()
                .saturating_add(Duration::from_millis(lease_ms.get()));
            self.releases.orphan(key.to_owned(), token, lease_end);
        }
    }

    // ----- the client's outputs --------------------------------------------

    /// An action the client handed out.
    pub fn action(&mut self, action: &Action) -> Checked {
        self.timeline.write(b"action");
        self.timeline.judge(self.timeline.loud(action))?;
        match action {
            Action::Connect { conn, addr } => {
                self.timeline.write_u64(conn.get());
                self.timeline.write(addr.as_bytes());
                if self.complete {
                    return self.timeline.fail(
                        Invariant::Protocol,
                        "a connect after the shutdown completed",
                    );
                }
                self.timeline.judge(self.link.connect(*conn))?;
                self.pending.connect();
                Ok(())
            }
            Action::Send { conn, data } => {
                self.timeline.write_u64(conn.get());
                self.timeline.write(data);
                self.send(*conn, data)
            }
            Action::Close { conn } => {
                self.timeline.write_u64(conn.get());
                self.close(*conn)
            }
        }
    }

    fn close(&mut self, conn: ConnId) -> Checked {
        self.timeline.closed();
        let shutting = self.shutdown.is_some();
        let closed = self.link.close(conn, self.timeline.read_bytes, shutting);
        self.timeline.judge(closed)?;
        self.stats.closes += 1;
        let pending = self.pending.close();
        let now = self.timeline.now();
        self.holds.advance(now);
        for (&id, request) in &pending {
            if let Request::Renew { .. } = request {
                self.holds.requeue(id, now, shutting);
            }
        }
        for request in pending.into_values() {
            if let Request::Acquire { op, .. } = request {
                self.acquires.in_doubt(op);
            }
        }
        Ok(())
    }

    fn send(&mut self, conn: ConnId, data: &[u8]) -> Checked {
        if !self.link.can_send(conn) {
            return self.timeline.fail(
                Invariant::Protocol,
                format!("Send on {conn}, which is not open"),
            );
        }
        let Some(body) = data.strip_suffix(b"\n") else {
            return self.timeline.fail(
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
        self.holds.advance(self.timeline.now());
        for line in body.split(|&b| b == b'\n') {
            let frame = match ClientFrame::parse(line) {
                Ok(frame) => frame,
                Err(e) => {
                    return self.timeline.fail(
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
                return self.timeline.fail(
                    Invariant::Protocol,
                    format!(
                        "{frame} sent after a {}: releases go first, then renewals, then acquires",
                        ["", "release", "renewal", "acquire"][rank]
                    ),
                );
            }
            rank = this;
            self.sent_frame(conn, frame)?;
        }
        Ok(())
    }

    /// A frame sent on `conn`, open: to the part it is for. A request is
    /// admitted by the window first, and registered as pending last.
    fn sent_frame(&mut self, conn: ConnId, frame: ClientFrame<'_>) -> Checked {
        let text = frame.to_string();
        let now = self.timeline.now();
        let (id, window, request) = match frame {
            ClientFrame::Hello {
                version,
                client_id,
                credential,
            } => {
                let hello =
                    self.link
                        .hello(version, client_id.as_str(), credential.as_str(), &text);
                return self.timeline.judge(hello);
            }
            ClientFrame::Acquire {
                id,
                key,
                owner,
                wait_ms,
                lease_ms,
            } => {
                let window = self.admit(id, &text)?;
                let attempt = Attempt {
                    id,
                    key: key.as_str(),
                    owner: owner.as_str(),
                    wait_ms,
                    lease_ms: lease_ms.get(),
                };
                let attempt = self.acquires.attempt(&attempt, conn, now, &text);
                let (op, retry) = self.timeline.judge(attempt)?;
                if retry {
                    self.stats.retries += 1;
                }
                let request = Request::Acquire {
                    op,
                    key: key.as_str().to_owned(),
                    lease_ms: lease_ms.get(),
                };
                (id, window, request)
            }
            ClientFrame::Renew {
                id,
                key,
                token,
                lease_ms,
            } => {
                let window = self.admit(id, &text)?;
                let key = key.as_str();
                let releasing = self.releases.releasing(key, token);
                let sent =
                    self.holds
                        .renewal_sent(id, key, token, lease_ms.get(), now, releasing, &text);
                self.timeline.judge(sent)?;
                self.stats.renewals += 1;
                let request = Request::Renew {
                    key: key.to_owned(),
                    token,
                    lease_ms: lease_ms.get(),
                };
                (id, window, request)
            }
            ClientFrame::Release { id, key, token } => {
                let window = self.admit(id, &text)?;
                let key = key.as_str();
                let held = self.holds.is_held(key, token);
                self.timeline
                    .judge(self.releases.sent(key, token, held, &text))?;
                let request = Request::Release {
                    key: key.to_owned(),
                    token,
                };
                (id, window, request)
            }
        };
        self.stats.requests += 1;
        let registered = self.pending.register(id, request, conn, window, &text);
        self.timeline.judge(registered)
    }

    /// Request `id` (`text`) went out: nothing before `W`, and never an id
    /// used before. The window.
    fn admit(&mut self, id: u64, text: &str) -> Result<u64, InvariantViolation> {
        let admitted = self.pending.admit(self.link.window(), id, text);
        self.timeline.judge(admitted)
    }

    /// An event the client handed out.
    pub fn event(&mut self, event: &Event) -> Checked {
        self.timeline.write(b"event");
        self.timeline.write_debug(event);
        if self.complete {
            return self.timeline.fail(
                Invariant::Protocol,
                format!("{event:?} after ShutdownComplete"),
            );
        }
        self.timeline.judge(self.timeline.loud(event))?;
        let now = self.timeline.now();
        self.holds.advance(now);
        match event {
            Event::Outcome { op, outcome } => self.outcome(*op, outcome),
            Event::OrphanRelease { key, token } => {
                let (key, token) = (key.as_str(), *token);
                let held = self.holds.is_held(key, token);
                self.timeline
                    .judge(self.releases.announced(key, token, held))?;
                self.stats.orphan_releases += 1;
                Ok(())
            }
            Event::OrphanSettled { key, token, result } => {
                let session = self.session();
                let settled = self
                    .releases
                    .settled(key.as_str(), *token, *result, now, session);
                self.timeline.judge(settled)
            }
            Event::ShutdownComplete => {
                if self.shutdown.is_none() {
                    return self
                        .timeline
                        .fail(Invariant::Protocol, "ShutdownComplete without a shutdown");
                }
                self.complete = true;
                // The client has stopped and forgets the grants it held for
                // the embedder: lease expiry ends them.
                self.holds.clear();
                Ok(())
            }
            _ => {
                if let Some(told) = self.holds.event(event, now) {
                    let notice = self.timeline.judge(told)?;
                    self.stats.notice(notice);
                    return Ok(());
                }
                if let Event::LeaderHint { .. } | Event::HintIgnored { .. } = event {
                    self.stats.hint_notices += 1;
                }
                let (window, shutting) = (self.timeline.window(), self.shutdown.is_some());
                let cap = self.holds.cap(now);
                match self.link.event(event, window, &cap, shutting) {
                    Some(verdict) => self.timeline.judge(verdict),
                    None => Ok(()),
                }
            }
        }
    }

    /// An outcome, to the part whose operation it ends.
    fn outcome(&mut self, op: OpId, outcome: &Outcome) -> Checked {
        let ended = if self.acquires.has(op) {
            let session = self.session();
            self.acquires
                .end(op, outcome, session, self.link.last_end())
        } else if self.releases.has(op) {
            self.releases.end(op, outcome)
        } else {
            breach(
                Invariant::OneOutcome,
                format!("{outcome:?} for {op}, which was never submitted"),
            )
        };
        self.timeline.judge(ended)?;
        self.stats.outcome(outcome);
        if let Outcome::Granted(g) = outcome {
            self.holds.delivered(g);
        }
        Ok(())
    }

    /// Ends a step: checks what must hold once the client is drained.
    pub fn end_step(&mut self, client: &Client) -> Checked {
        let result = self
            .end_step_checks(client)
            .and_then(|()| self.renewal_checks(client));
        self.holds.forget_gone();
        self.timeline.end_step();
        self.stats.steps += 1;
        result
    }

    /// What must hold once the client is drained, in this order.
    fn end_step_checks(&mut self, client: &Client) -> Checked {
        self.link.settle_connect_failed();
        let owed = self.timeline.owes_no_close();
        self.timeline.judge(owed)?;
        self.timeline.judge(self.releases.all_announced())?;
        self.timeline.judge(self.link.end_step())?;
        let misconfigured = self.link.misconfigured().is_some();
        self.timeline
            .judge(self.acquires.none_waiting(misconfigured))?;
        self.timeline.judge(self.acquires.none_in_doubt())?;
        self.timeline.judge(self.link.closed_when_due())?;
        self.timeline.judge(self.acquires.answered_ended())?;
        let open = client.open_operations();
        let (acquires, releases) = (open.acquires, open.releases);
        let expected = (self.acquires.open(), self.releases.open());
        if (acquires, releases) != expected {
            return self.timeline.fail(
                Invariant::OneOutcome,
                format!(
                    "the client counts {acquires} acquires and {releases} releases open; without an outcome are {} and {}",
                    expected.0, expected.1
                ),
            );
        }
        match client.poll_timeout() {
            Some(t) if t <= client.now() => self.timeline.fail(
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
                match self.first_open() {
                    Some(op) => self.timeline.fail(
                        Invariant::OneOutcome,
                        format!("{op} has no outcome and the client is quiescent (no deadline)"),
                    ),
                    None if client.is_finished() && !self.complete => self.timeline.fail(
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
        self.holds.advance(self.timeline.now());
        self.timeline.judge(self.link.hints_told())?;
        self.timeline
            .judge(self.holds.told(client, self.complete))?;
        if let Some((conn, window)) = self.link.open_window() {
            let in_use = self.pending.len();
            if (in_use as u64) < window {
                self.timeline
                    .judge(self.holds.none_waiting(conn, window, in_use))?;
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
            return self.timeline.fail(
                Invariant::Protocol,
                "the run ended before the client shut down",
            );
        }
        if let Some(op) = self.first_open() {
            return self
                .timeline
                .fail(Invariant::OneOutcome, format!("{op} never got an outcome"));
        }
        let now = self.timeline.now();
        self.timeline.judge(self.releases.all_released(now))
    }

    /// Checks that every grant the client had to release by itself was sent
    /// an `R` by now, or its lease has run out. Call it when the run has
    /// given the client every chance to send (connected, idle, before any
    /// shutdown).
    pub fn check_orphans_released(&self) -> Checked {
        let now = self.timeline.now();
        self.timeline.judge(self.releases.check_released(now))
    }
}

impl fmt::Debug for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checker")
            .field("now", &self.timeline.now())
            .field("step", &self.timeline.step())
            .field("ops", &(self.acquires.len() + self.releases.len()))
            .field("open", &self.open_operations())
            .field("obligations", &self.releases.obligations())
            .finish_non_exhaustive()
    }
}
