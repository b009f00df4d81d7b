//! The acquires (PROTOCOL.md section 5): taken, queued until a connection
//! can send them, sent with what is left of their wait budget, retried
//! after `B` with backoff inside that budget, cancelled or abandoned,
//! timed out, and ended, each in exactly one outcome given in one place,
//! [`Acquires::end`].
//!
//! An acquire's record lives from its submission to its outcome; its one
//! timer means what its [`Phase`] says: the last moment it may wait for a
//! connection, the end of a `B` backoff, or the answer deadline of the
//! attempt in flight. An acquire abandoned in flight has its outcome at
//! once, and leaves behind a *waiter*: what its attempt's answer must
//! match, and its answer deadline (an answer that late means the
//! connection is unwell, whoever still waits for it).

use core::num::NonZeroU64;
use core::time::Duration;

use super::link::jittered;
use super::outcome::{CloseReason, Error, OpId, OpKind, Outcome};
use super::pending::Expected;
use super::stats::Note;
use super::store::{Handle, Queue, Table};
use super::{BusyPolicy, CancelPolicy, Fx, Unwell};
use crate::names::{Key, Name};
use crate::rng::Rng;
use crate::time::{duration_millis, millis, Time};
use crate::wire::{ClientFrame, Op};

struct Acquire {
    key: Key,
    owner: Name,
    lease_ms: NonZeroU64,
    /// The end of the wait budget, across all attempts.
    budget_end: Time,
    /// When the latest attempt was handed out.
    sent_at: Time,
    /// Attempts handed out so far: each after the first followed a `B`.
    sent: u32,
    phase: Phase,
    /// Ends at once, never sent, while the client is unreachable
    /// ([`Config::give_up_while_unreachable`](super::Config::give_up_while_unreachable)).
    give_up: bool,
    /// While [`Phase::Queued`], its ticket in the queue; while
    /// [`Phase::Sent`], its request's id. (Kept beside the phase, not in
    /// it, so that a record is 8 bytes smaller.)
    req: u64,
    /// Renew the grant automatically, for at most this many nanoseconds
    /// once granted ([`NO_RENEWAL`]: not automatically).
    renew: u64,
}

/// What the embedder asked for in one acquire.
pub(crate) struct Asked {
    pub(crate) key: Key,
    pub(crate) owner: Name,
    /// The wait budget, across all attempts.
    pub(crate) wait: Duration,
    pub(crate) lease: Duration,
    /// Renewed automatically once granted, for at most this long.
    pub(crate) renew: Option<Duration>,
    /// Gives up at once while the client is unreachable.
    pub(crate) give_up: bool,
}

/// Where the connection stands for an acquire submitted now.
pub(crate) struct Standing<'a> {
    /// Every server of the latest round refused the client: why.
    pub(crate) refused: Option<&'a CloseReason>,
    /// The latest round failed at every address, and no connection is
    /// up: how its latest attempt ended.
    pub(crate) unreachable: Option<&'a CloseReason>,
}

/// An [`Acquire`]'s `renew` when it asked for no automatic renewal.
const NO_RENEWAL: u64 = u64::MAX;

/// What is left of an acquire abandoned in flight: what its attempt's
/// answer must match.
struct Waiter {
    key: Key,
    lease_ms: NonZeroU64,
    wait_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting to be sent (its first attempt, or one after a `B`), with
    /// its ticket in the queue; its timer is the last moment it may wait.
    Queued,
    /// Answered `B`; its timer starts the next attempt.
    Backoff,
    /// An attempt is in flight, with its id; its timer is the answer
    /// deadline.
    Sent,
}

impl Acquire {
    /// The `wait_ms` of the attempt sent at `sent_at`: what is left of the
    /// budget, at least 0.
    fn wire_wait_ms(&self) -> u64 {
        self.budget_end.millis_since(self.sent_at)
    }

    /// When lease expiry settles it, given up at `now` while in flight:
    /// plus `wait_ms`, plus `lease_ms`, plus the margin for network delay
    /// and clock drift.
    fn settles_by(&self, now: Time, margin: Duration) -> Time {
        now.saturating_add_millis(self.wire_wait_ms())
            .saturating_add_millis(self.lease_ms.get())
            .saturating_add(margin)
    }
}

/// An acquire whose record was taken for its grant, and is still to be
/// given its outcome ([`Acquires::conclude`]).
#[must_use]
pub(crate) struct Concluding(Phase);

/// What a granted acquire hands on to the grant it becomes.
pub(crate) struct Granted {
    pub(crate) key: Key,
    pub(crate) sent_at: Time,
    pub(crate) lease_ms: NonZeroU64,
    pub(crate) renew: Option<Duration>,
}

/// Every acquire that has not ended, the queue of those waiting for a
/// connection, and the answer deadlines of abandoned attempts.
#[derive(Default)]
pub(crate) struct Acquires {
    table: Table<Acquire>,
    queue: Queue,
    /// Abandoned attempts in flight, each with its answer deadline.
    waiters: Table<Waiter>,
}

impl Acquires {
    /// Takes an acquire as `asked`: of its key for its lease, waiting at
    /// most its `wait` in all, renewed once granted if it asked. It waits
    /// for a connection at most `max(wait, queue_grace)`; one that gives
    /// up while the client is unreachable (`link.unreachable`) is taken
    /// and ends at once, never sent. Refused when every server refuses the
    /// client (`link.refused`: why), when the lease is under a
    /// millisecond, or when the client's own capacity is full.
    pub(crate) fn submit(
        &mut self,
        fx: &mut Fx<'_>,
        asked: Asked,
        link: Standing<'_>,
    ) -> Result<OpId, Error> {
        let Asked {
            key,
            owner,
            wait,
            lease,
            renew,
            give_up,
        } = asked;
        if let Some(cause) = link.refused {
            return Err(Error::Misconfigured(cause.clone()));
        }
        let lease_ms = NonZeroU64::new(duration_millis(lease)).ok_or(Error::ZeroLease)?;
        if self.table.len() >= fx.config.max_acquires {
            return Err(Error::Busy);
        }
        let budget_end = fx.now.saturating_add(wait);
        // A try-lock submitted before the connection is up is still tried.
        let last_moment = budget_end.max(fx.now.saturating_add(fx.config.queue_grace));
        let handle = self
            .table
            .insert(Acquire {
                key,
                owner,
                lease_ms,
                budget_end,
                sent_at: Time::ZERO,
                sent: 0,
                phase: Phase::Backoff,
                give_up,
                req: 0,
                renew: renew.map_or(NO_RENEWAL, |limit| {
                    u64::try_from(limit.as_nanos()).unwrap_or(NO_RENEWAL - 1)
                }),
            })
            .ok_or(Error::Busy)?;
        fx.events.note(Note::AcquireStarted);
        match link.unreachable.filter(|_| give_up) {
            Some(cause) => self.unsent(fx, handle, Some(cause.clone())),
            None => self.enqueue(handle, last_moment),
        }
        Ok(OpId::of(OpKind::Acquire, handle))
    }

    /// How many have not ended.
    pub(crate) fn open(&self) -> usize {
        self.table.len()
    }

    /// How many abandoned attempts still wait for their answer.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// How many wait for a connection.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Puts an acquire in the queue, to wait for a connection until `last`.
    fn enqueue(&mut self, handle: Handle, last: Time) {
        let ticket = self.queue.push_back(handle);
        if let Some(acquire) = self.table.get_mut(handle) {
            acquire.phase = Phase::Queued;
            acquire.req = u64::from(ticket);
        }
        self.table.set_timer(handle, last);
    }

    fn is_queued(table: &Table<Acquire>, handle: Handle, ticket: u32) -> bool {
        table
            .get(handle)
            .is_some_and(|a| a.phase == Phase::Queued && a.req == u64::from(ticket))
    }

    /// Sends the first queued acquire as request `id`, its `wait_ms` what
    /// is left of its budget, its answer deadline armed: the acquire, to
    /// register as `id`. `None` when none is queued.
    pub(crate) fn send_next(&mut self, fx: &mut Fx<'_>, id: u64) -> Option<Handle> {
        let table = &self.table;
        let handle = self.queue.pop(|h, t| Acquires::is_queued(table, h, t))?;
        // Popped as queued: an acquire stored and waiting.
        let acquire = self.table.get_mut(handle)?;
        acquire.phase = Phase::Sent;
        acquire.req = id;
        acquire.sent_at = fx.now;
        acquire.sent += 1;
        let wait_ms = acquire.wire_wait_ms();
        ClientFrame::Acquire {
            id,
            key: acquire.key.to_wire(),
            owner: acquire.owner.to_wire(),
            wait_ms,
            lease_ms: acquire.lease_ms,
        }
        .encode(fx.send);
        let deadline = fx
            .now
            .saturating_add_millis(wait_ms)
            .saturating_add(fx.config.answer_grace);
        self.table.set_timer(handle, deadline);
        Some(handle)
    }

    /// What the answer to the attempt in flight of `handle` must match.
    pub(crate) fn expected(&self, handle: Handle) -> Option<Expected<'_>> {
        let acquire = self.table.get(handle)?;
        Some(Expected {
            op: Op::Acquire,
            key: &acquire.key,
            lease_ms: acquire.lease_ms.get(),
            wait_ms: acquire.wire_wait_ms(),
            token: 0,
        })
    }

    /// What the answer to the abandoned attempt `waiter` must match.
    pub(crate) fn waiter_expected(&self, waiter: Handle) -> Option<Expected<'_>> {
        let w = self.waiters.get(waiter)?;
        Some(Expected {
            op: Op::Acquire,
            key: &w.key,
            lease_ms: w.lease_ms.get(),
            wait_ms: w.wait_ms,
            token: 0,
        })
    }

    /// `G` to the attempt in flight: the acquire's record ends, and what
    /// the grant needs of it moves out (its key is not copied). Its outcome
    /// is given with [`Acquires::conclude`] once the grant is held.
    pub(crate) fn granted(&mut self, handle: Handle) -> Option<(Granted, Concluding)> {
        let acquire = self.table.remove(handle)?;
        let granted = Granted {
            key: acquire.key,
            sent_at: acquire.sent_at,
            lease_ms: acquire.lease_ms,
            renew: (acquire.renew != NO_RENEWAL).then(|| Duration::from_nanos(acquire.renew)),
        };
        Some((granted, Concluding(acquire.phase)))
    }

    /// Gives the acquire `handle`, whose record [`Acquires::granted`] took,
    /// its outcome.
    pub(crate) fn conclude(
        &mut self,
        fx: &mut Fx<'_>,
        handle: Handle,
        Concluding(phase): Concluding,
        outcome: Outcome,
    ) {
        self.ended(fx, handle, phase, outcome);
    }

    /// `B`: the attempt was refused before it was queued, so trying again
    /// is safe, with a new id after a jittered backoff, while the budget
    /// still fits an attempt; else Busy.
    pub(crate) fn busy(&mut self, fx: &mut Fx<'_>, rng: &mut Rng, handle: Handle) {
        let Some(acquire) = self.table.get_mut(handle) else {
            return;
        };
        let retry_at = match fx.config.busy {
            BusyPolicy::Retry => {
                // The n-th `B` in a row, from 0.
                let step = fx.config.backoff.busy.step(acquire.sent - 1);
                Some(fx.now.saturating_add(jittered(step, rng)))
            }
            BusyPolicy::FailFast => None,
        };
        match retry_at {
            Some(at) if acquire.budget_end.saturating_duration_since(at) >= millis(1) => {
                acquire.phase = Phase::Backoff;
                self.table.set_timer(handle, at);
                fx.events.push_back(super::Event::Backoff {
                    cause: super::BackoffCause::Busy,
                    until: at,
                });
            }
            _ => self.end(fx, handle, Outcome::Busy),
        }
    }

    /// Cancel: one none of whose bytes went out ends Cancelled (nothing
    /// was asked); one in flight is left to the caller's cancel policy, and
    /// `Ok(Some(id))` names its request. An acquire that has ended (or
    /// never was) is unknown.
    pub(crate) fn cancel(&mut self, fx: &mut Fx<'_>, op: OpId) -> Result<Option<u64>, Error> {
        let unknown = Error::UnknownOperation(op);
        let Some((OpKind::Acquire, handle)) = op.parts() else {
            return Err(unknown);
        };
        match self.table.get(handle).map(|a| (a.phase, a.req)) {
            Some((Phase::Queued | Phase::Backoff, _)) => {
                self.end(fx, handle, Outcome::Cancelled);
                Ok(None)
            }
            Some((Phase::Sent, id)) => Ok(Some(id)),
            None => Err(unknown),
        }
    }

    /// Ends an acquire in flight Indeterminate at once, its request left
    /// in flight (`KeepWaiter`, or a shutdown): a waiter keeps what its
    /// answer must match and its answer deadline, and the caller hands it
    /// to the pending table, which still claims the answer. `None`, and
    /// the acquire untouched, if no waiter can be kept (the table is full):
    /// the caller then closes instead.
    pub(crate) fn abandon(&mut self, fx: &mut Fx<'_>, handle: Handle) -> Option<Handle> {
        let acquire = self.table.get(handle)?;
        let settles_by = acquire.settles_by(fx.now, fx.config.settle_margin);
        let waiter = Waiter {
            key: acquire.key.clone(),
            lease_ms: acquire.lease_ms,
            wait_ms: acquire.wire_wait_ms(),
        };
        let deadline = self.table.timer(handle);
        let waiter = self.waiters.insert(waiter)?;
        if let Some(deadline) = deadline {
            self.waiters.set_timer(waiter, deadline);
        }
        fx.events.note(Note::InDoubt(None));
        self.end(fx, handle, Outcome::Indeterminate { settles_by });
        Some(waiter)
    }

    /// The key of the abandoned attempt `waiter`'s acquire.
    pub(crate) fn waiter_key(&self, waiter: Handle) -> Option<&Key> {
        self.waiters.get(waiter).map(|w| &w.key)
    }

    /// The abandoned attempt `waiter` was answered, or its connection
    /// closed.
    pub(crate) fn waiter_done(&mut self, waiter: Handle) {
        self.waiters.remove(waiter);
    }

    /// The connection closed with an attempt in flight: Indeterminate,
    /// never sent again (invariant 3).
    pub(crate) fn in_doubt(&mut self, fx: &mut Fx<'_>, handle: Handle, reason: &CloseReason) {
        let Some(acquire) = self.table.get(handle) else {
            return;
        };
        let settles_by = acquire.settles_by(fx.now, fx.config.settle_margin);
        fx.events.note(Note::InDoubt(Some(reason)));
        self.end(fx, handle, Outcome::Indeterminate { settles_by });
    }

    /// A shutdown starts: the queued and backing-off acquires end
    /// Cancelled; those in flight are cancelled under the cancel `policy`:
    /// abandoned (each waiter with its request id, for the pending table),
    /// or left for the caller to close on. In slot order, one outcome each.
    /// Whether any was in flight.
    pub(crate) fn shut(
        &mut self,
        fx: &mut Fx<'_>,
        policy: CancelPolicy,
        abandoned: &mut Vec<(u64, Option<Handle>)>,
    ) -> bool {
        let mut in_flight = false;
        for handle in self.table.handles() {
            match self.table.get(handle).map(|a| (a.phase, a.req)) {
                Some((Phase::Sent, id)) if policy == CancelPolicy::KeepWaiter => {
                    let waiter = self.abandon(fx, handle);
                    abandoned.push((id, waiter));
                }
                Some((Phase::Sent, _)) => in_flight = true,
                Some(_) => self.end(fx, handle, Outcome::Cancelled),
                None => {}
            }
        }
        in_flight
    }

    /// The shutdown ends: an acquire still open was never handed out (those
    /// in flight ended at the close); it ends Cancelled.
    pub(crate) fn cancel_all(&mut self, fx: &mut Fx<'_>) {
        for handle in self.table.handles() {
            self.end(fx, handle, Outcome::Cancelled);
        }
    }

    /// Every acquire waiting for a connection (queued, or backing off
    /// after `B`) ends now, none of its bytes sent since: every server
    /// refused the client (misconfigured), with `cause`.
    pub(crate) fn refused(&mut self, fx: &mut Fx<'_>, cause: &CloseReason) {
        self.end_waiting(fx, cause, |_| true);
    }

    /// Every acquire not yet sent that gives up while unreachable ends
    /// now: a round just failed at every address, the latest attempt for
    /// `cause`.
    pub(crate) fn unreachable(&mut self, fx: &mut Fx<'_>, cause: &CloseReason) {
        self.end_waiting(fx, cause, |a| a.give_up && a.sent == 0);
    }

    /// Ends every acquire waiting for a connection (queued, or backing
    /// off after `B`) that `which` picks, with `cause`.
    fn end_waiting(&mut self, fx: &mut Fx<'_>, cause: &CloseReason, which: fn(&Acquire) -> bool) {
        for handle in self.table.handles() {
            if self
                .table
                .get(handle)
                .is_some_and(|a| matches!(a.phase, Phase::Queued | Phase::Backoff) && which(a))
            {
                self.unsent(fx, handle, Some(cause.clone()));
            }
        }
    }

    /// Ends an acquire that waits for a connection and cannot be sent:
    /// TimedOut, never sent, with `cause`; or Busy if its earlier attempts
    /// were all refused with `B`.
    fn unsent(&mut self, fx: &mut Fx<'_>, handle: Handle, cause: Option<CloseReason>) {
        let outcome = match self.table.get(handle).map_or(0, |a| a.sent) {
            0 => Outcome::TimedOut { sent: false, cause },
            _ => Outcome::Busy,
        };
        self.end(fx, handle, outcome);
    }

    /// Time is `now` (see [`Table::catch_up`]).
    pub(crate) fn catch_up(&mut self, now: Time) {
        self.table.catch_up(now);
        self.waiters.catch_up(now);
    }

    /// The earliest timer; with `by`, the earliest due by then (once
    /// caught up with it).
    pub(crate) fn earliest(&self, by: Option<Time>) -> Option<Time> {
        match (self.table.earliest(by), self.waiters.earliest(by)) {
            (Some(a), Some(w)) => Some(a.min(w)),
            (a, w) => a.or(w),
        }
    }

    /// Fires the earliest timer if it is due at `at`: the last moment to
    /// wait for a connection (ends it, with `cause`: why the latest
    /// connection attempt ended), the end of a `B` backoff (queued again),
    /// or an answer deadline (the connection is unwell).
    pub(crate) fn fire(
        &mut self,
        fx: &mut Fx<'_>,
        at: Time,
        cause: Option<&CloseReason>,
    ) -> Result<(), Unwell> {
        if let Some(waiter) = self.waiters.pop_due(at) {
            // An abandoned attempt's answer that late: as for any.
            self.waiters.remove(waiter);
            return Err(Unwell);
        }
        let Some(handle) = self.table.pop_due(at) else {
            return Ok(());
        };
        let Some(acquire) = self.table.get_mut(handle) else {
            return Ok(());
        };
        match acquire.phase {
            Phase::Queued => self.unsent(fx, handle, cause.cloned()),
            Phase::Backoff => {
                let budget_end = acquire.budget_end;
                self.enqueue(handle, budget_end);
            }
            // An answer that late: the connection or the server is unwell.
            Phase::Sent => return Err(Unwell),
        }
        Ok(())
    }

    /// Ends an acquire with `outcome` and forgets it: the one place an
    /// acquire's outcome is given.
    pub(crate) fn end(&mut self, fx: &mut Fx<'_>, handle: Handle, outcome: Outcome) {
        if let Some(acquire) = self.table.remove(handle) {
            self.ended(fx, handle, acquire.phase, outcome);
        }
    }

    /// The one place an acquire is given its outcome, its record (which
    /// was in `phase`) gone.
    fn ended(&mut self, fx: &mut Fx<'_>, handle: Handle, phase: Phase, outcome: Outcome) {
        if phase == Phase::Queued {
            let table = &self.table;
            self.queue.left(|h, t| Acquires::is_queued(table, h, t));
        }
        fx.events.push_back(super::Event::Outcome {
            op: OpId::of(OpKind::Acquire, handle),
            outcome,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::harness::Harness;
    use super::*;
    use crate::client::Event;

    fn submit(h: &mut Harness, a: &mut Acquires, wait_ms: u64) -> OpId {
        let (key, owner) = (Key::new("k").unwrap(), Name::new("o").unwrap());
        let (wait, lease) = (millis(wait_ms), millis(1000));
        let asked = Asked {
            key,
            owner,
            wait,
            lease,
            renew: None,
            give_up: false,
        };
        let link = Standing {
            refused: None,
            unreachable: None,
        };
        a.submit(&mut h.fx(), asked, link).expect("taken")
    }

    /// As the client does: time catches up to `at`, then the timer due fires.
    fn fire(
        h: &mut Harness,
        a: &mut Acquires,
        at: Time,
        cause: Option<&CloseReason>,
    ) -> Result<(), Unwell> {
        h.now = at;
        a.catch_up(at);
        a.fire(&mut h.fx(), at, cause)
    }

    fn outcomes(h: &mut Harness) -> Vec<Outcome> {
        h.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Outcome { outcome, .. } => Some(outcome),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_acquire_waits_for_a_connection_then_goes_out_with_what_is_left_of_its_budget() {
        let (mut h, mut a) = (Harness::new(), Acquires::default());
        let op = submit(&mut h, &mut a, 500);
        assert_eq!((a.open(), a.queued()), (1, 1));
        // Its last moment to wait: max(wait, queue_grace) from now.
        assert_eq!(
            a.earliest(None),
            Some(h.now.saturating_add(h.config.queue_grace))
        );
        h.at(200);
        let handle = a.send_next(&mut h.fx(), 7).expect("queued");
        assert_eq!(Some((OpKind::Acquire, handle)), op.parts());
        assert_eq!(h.sent(), "A 7 k o 300 1000\n");
        let e = a.expected(handle).expect("in flight");
        assert_eq!(
            (e.op, e.key.as_str(), e.lease_ms, e.wait_ms),
            (Op::Acquire, "k", 1000, 300)
        );
        // Its answer deadline: what it waits on the wire, plus the grace.
        let deadline = h
            .now
            .saturating_add(millis(300))
            .saturating_add(h.config.answer_grace);
        assert_eq!(a.earliest(None), Some(deadline));
        assert_eq!(
            fire(&mut h, &mut a, deadline, None),
            Err(Unwell),
            "that late: unwell"
        );
        assert!(a.send_next(&mut h.fx(), 8).is_none(), "nothing more queued");
    }

    #[test]
    fn one_never_sent_times_out_with_why_and_a_cancel_before_sending_asks_nothing() {
        let (mut h, mut a) = (Harness::new(), Acquires::default());
        submit(&mut h, &mut a, 0);
        let last = a.earliest(None).expect("its last moment");
        let cause = CloseReason::ConnectFailed;
        assert_eq!(fire(&mut h, &mut a, last, Some(&cause)), Ok(()));
        assert_eq!(
            outcomes(&mut h),
            [Outcome::TimedOut {
                sent: false,
                cause: Some(cause)
            }]
        );
        let op = submit(&mut h, &mut a, 0);
        assert_eq!(a.cancel(&mut h.fx(), op), Ok(None));
        assert_eq!(outcomes(&mut h), [Outcome::Cancelled]);
        assert_eq!(a.cancel(&mut h.fx(), op), Err(Error::UnknownOperation(op)));
        assert_eq!(a.open(), 0);
    }

    #[test]
    fn a_busy_answer_is_retried_while_the_budget_fits_and_ends_busy_after() {
        let (mut h, mut a) = (Harness::new(), Acquires::default());
        let mut rng = Rng::new(1);
        submit(&mut h, &mut a, 1_000);
        let handle = a.send_next(&mut h.fx(), 1).expect("queued");
        a.busy(&mut h.fx(), &mut rng, handle);
        let retry = a.earliest(None).expect("a backoff");
        assert!(retry > h.now && retry < h.now.saturating_add(millis(1_000)));
        assert!(h
            .events()
            .iter()
            .any(|e| matches!(e, Event::Backoff { .. })));
        // Queued again at the end of the backoff, sent with what is left.
        assert_eq!(fire(&mut h, &mut a, retry, None), Ok(()));
        let again = a.send_next(&mut h.fx(), 2).expect("queued again");
        assert_eq!(again, handle);
        // A `B` once the budget cannot fit another attempt: Busy.
        h.at(999);
        a.busy(&mut h.fx(), &mut rng, handle);
        assert_eq!(outcomes(&mut h), [Outcome::Busy]);
        assert_eq!(a.open(), 0);
    }

    #[test]
    fn a_grant_moves_out_of_the_acquire_which_then_gets_its_outcome() {
        let (mut h, mut a) = (Harness::new(), Acquires::default());
        submit(&mut h, &mut a, 0);
        let handle = a.send_next(&mut h.fx(), 1).expect("queued");
        let (granted, concluding) = a.granted(handle).expect("in flight");
        assert_eq!((granted.key.as_str(), granted.lease_ms.get()), ("k", 1000));
        assert_eq!(a.open(), 0, "its record went with the grant");
        assert!(a.granted(handle).is_none());
        a.conclude(&mut h.fx(), handle, concluding, Outcome::Busy);
        assert_eq!(outcomes(&mut h), [Outcome::Busy]);
    }

    #[test]
    fn one_in_flight_abandoned_leaves_a_waiter_that_keeps_what_its_answer_must_match() {
        let (mut h, mut a) = (Harness::new(), Acquires::default());
        let op = submit(&mut h, &mut a, 100);
        let handle = a.send_next(&mut h.fx(), 4).expect("queued");
        assert_eq!(a.cancel(&mut h.fx(), op), Ok(Some(4)), "left to the policy");
        let waiter = a.abandon(&mut h.fx(), handle).expect("a waiter");
        assert!(matches!(
            outcomes(&mut h)[..],
            [Outcome::Indeterminate { .. }]
        ));
        let e = a.waiter_expected(waiter).expect("kept");
        assert_eq!((e.key.as_str(), e.wait_ms), ("k", 100));
        assert_eq!((a.open(), a.waiting()), (0, 1));
        a.waiter_done(waiter);
        assert_eq!(a.waiting(), 0);
    }
}
