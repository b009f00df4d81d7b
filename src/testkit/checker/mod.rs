//! The invariant checker: watches one client core from the outside and
//! checks invariants 1 to 7 of PROTOCOL.md section 5 after every step,
//! for a client of protocol version 2.
//!
//! The checker sees what an embedder and a driver see, nothing more: the
//! operations submitted (with their parameters and the results of the
//! calls), every [`Action`](crate::client::Action) (the bytes of every
//! `Send` are parsed with
//! [`ClientFrame::parse`](crate::wire::ClientFrame::parse)), every byte
//! handed to [`Client::handle_bytes`], and every
//! [`Event`](crate::client::Event). From these it keeps its own model of
//! the session (which requests are in flight on which connection, which
//! answers match them by id, op and key, which grants the embedder holds,
//! which releases are under way) and compares the client's outputs with
//! it.
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
//! | `mod.rs` | [`Checker`]: its parts, the checks at the end of a step and of a run |
//! | `calls.rs`, `inputs.rs`, `outputs.rs` | the routing of the embedder's calls, of the driver's inputs (the bytes read among them), and of what the client hands out |
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
mod calls;
mod hints;
mod holds;
mod inputs;
mod invariant;
mod ledger;
mod link;
mod outputs;
mod pending;
mod releases;
mod rounds;
mod stats;
mod timeline;

use core::fmt;
use core::time::Duration;

pub use self::invariant::{Invariant, InvariantViolation};
pub use self::stats::Stats;

use self::acquires::Acquires;
use self::holds::Holds;
use self::link::Link;
use self::pending::Pending;
use self::releases::Releases;
use self::timeline::Timeline;
use crate::client::{Client, Config, OpId};
use crate::time::Time;

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
            acquires: Acquires::new(config),
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
        let unreachable = self.link.unreachable();
        self.timeline
            .judge(self.acquires.none_waiting(misconfigured, unreachable))?;
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
