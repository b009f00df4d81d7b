//! The operations the embedder asks for (PROTOCOL.md section 5: acquire,
//! release, cancel, an undeliverable grant, shutdown), and what their
//! deadlines mean when they pass.
//!
//! An operation ends in exactly one outcome, given in exactly one place:
//! [`Client::end_acquire`] for an acquire, [`Client::end_release`] for a
//! release.

use core::num::NonZeroU64;
use core::time::Duration;

use super::link::LinkState;
use super::outcome::{CloseReason, Error, Event, Grant, OpId, OpKind, Outcome, ReleaseResult};
use super::store::{Handle, Keyed};
use super::{CancelPolicy, Client};
use crate::names::{Key, Name};
use crate::time::{duration_millis, Time};

/// An acquire operation, or an abandoned waiter.
pub(crate) struct Acquire {
    pub(crate) key: Key,
    pub(crate) owner: Name,
    pub(crate) lease_ms: NonZeroU64,
    /// The end of the wait budget, across all attempts.
    pub(crate) budget_end: Time,
    /// When the current attempt was handed out.
    pub(crate) sent_at: Time,
    /// Attempts handed out so far: every one after the first followed a
    /// `B`.
    pub(crate) attempts: u32,
    pub(crate) phase: AcquirePhase,
}

impl Keyed for Acquire {
    fn key(&self) -> &Key {
        &self.key
    }
}

/// Where an acquire is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquirePhase {
    /// Waiting to be sent (its first attempt, or one after a `B`); its
    /// timer is the queue deadline.
    Queued,
    /// Answered `B`; its timer starts the next attempt.
    Backoff,
    /// An attempt is in flight; its timer is the answer deadline.
    Sent,
    /// In flight, but its operation already ended (cancelled under
    /// `KeepWaiter`, or shut down): its answer is still claimed.
    Abandoned,
}

impl Acquire {
    /// Whether it waits in the acquire queue.
    pub(crate) fn is_queued(&self) -> bool {
        self.phase == AcquirePhase::Queued
    }

    /// The `wait_ms` of an attempt sent at `sent_at`: what is left of the
    /// budget, at least 0.
    pub(crate) fn wire_wait_ms(&self) -> u64 {
        self.budget_end.millis_since(self.sent_at)
    }

    /// When a sent attempt must have been answered: its send time plus
    /// the `wait_ms` it was sent with plus the answer grace.
    pub(crate) fn answer_deadline(&self, answer_grace: Duration) -> Time {
        self.sent_at
            .saturating_add_millis(self.wire_wait_ms())
            .saturating_add(answer_grace)
    }
}

/// A release: the embedder's, or one the client issued for an orphaned
/// grant.
pub(crate) struct Release {
    pub(crate) key: Key,
    pub(crate) token: u64,
    /// No new attempt starts at or after this; its timer while queued.
    pub(crate) until: Time,
    pub(crate) attempts: u32,
    pub(crate) phase: ReleasePhase,
    /// Issued by the client for a grant nobody can take: it ends in a
    /// notice, not an outcome.
    pub(crate) orphan: bool,
    /// A renewal of the grant is in flight: its answer is claimed and
    /// changes nothing.
    pub(crate) renewal_sent: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleasePhase {
    Queued,
    Sent,
}

impl Release {
    /// A release waiting for its first attempt, trying until `until` at
    /// the latest.
    fn new(key: Key, token: u64, until: Time, orphan: bool) -> Release {
        Release {
            key,
            token,
            until,
            attempts: 0,
            phase: ReleasePhase::Queued,
            orphan,
            renewal_sent: false,
        }
    }
}

/// A grant handed to the embedder and not yet released or handed back.
pub(crate) struct Held {
    pub(crate) key: Key,
    pub(crate) token: u64,
    /// Until when the embedder may count on the grant: what the `G` that
    /// proves most proves (invariant 7).
    pub(crate) valid_until: Time,
    /// The lease that `G` gave: renewal's schedule counts in thirds of it.
    pub(crate) lease_ms: NonZeroU64,
    /// When the server has certainly freed it: the latest of every answer's
    /// arrival, and every renewal's send time, plus the lease plus the
    /// margin. Its release's deadline.
    pub(crate) expires_by: Time,
    /// What a renewal asks for: the acquire's lease, or the embedder's.
    pub(crate) renew_lease_ms: NonZeroU64,
    /// Renewed automatically until this moment (`Time::MAX`: with no
    /// limit); `None`: only when the embedder asks.
    pub(crate) auto_until: Option<Time>,
    pub(crate) renewal: Renewal,
    /// The embedder was told LeaseJeopardy since the last renewal.
    pub(crate) jeopardy: bool,
    /// `valid_until` has passed: the embedder was told LeaseExpired.
    pub(crate) expired: bool,
}

/// Where a held grant's renewal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// None is asked for.
    Idle,
    /// Waiting in the lane, asking for `lease_ms`; `auto`: the schedule
    /// asked for it, not the embedder.
    Queued { lease_ms: NonZeroU64, auto: bool },
    /// In flight since `sent_at`, asking for `lease_ms`.
    Sent {
        sent_at: Time,
        lease_ms: NonZeroU64,
        auto: bool,
    },
}

/// A grant from the moment the embedder holds it to the end of its
/// release, in one record with one timer: held (its timer the next thing
/// due: a renewal, a jeopardy, its expiry, its renewal's answer grace, its
/// `expires_by`), then a release under way (its timer the release's
/// deadline, or the answer grace of an attempt in flight). A release of a
/// raw `(key, token)`, or of an orphaned grant, starts as a release.
pub(crate) enum Hold {
    Held(Held),
    Release(Release),
    /// A grant whose renewal was answered `N`: gone on the server, kept
    /// until its `expires_by` so that a release of it ends NotHeld at once.
    Lost {
        key: Key,
        token: u64,
        expires_by: Time,
    },
    /// A grant that ended (its release did, or its time ran out) while a
    /// renewal of it was in flight: kept only to claim that renewal's
    /// answer, which changes nothing.
    Claimed {
        key: Key,
        token: u64,
    },
}

impl Held {
    /// Whether the client keeps renewing it: it is renewed automatically,
    /// or a renewal of it is queued or in flight, and it has not expired.
    /// Such a grant caps every wait of the link.
    pub(crate) fn keeps_renewing(&self) -> bool {
        !self.expired && (self.auto_until.is_some() || self.renewal != Renewal::Idle)
    }
}

impl Hold {
    pub(crate) fn held(&self) -> Option<&Held> {
        match self {
            Hold::Held(held) => Some(held),
            _ => None,
        }
    }

    pub(crate) fn held_mut(&mut self) -> Option<&mut Held> {
        match self {
            Hold::Held(held) => Some(held),
            _ => None,
        }
    }

    pub(crate) fn release(&self) -> Option<&Release> {
        match self {
            Hold::Release(release) => Some(release),
            _ => None,
        }
    }

    pub(crate) fn release_mut(&mut self) -> Option<&mut Release> {
        match self {
            Hold::Release(release) => Some(release),
            _ => None,
        }
    }

    /// Whether it is a release waiting in the lane.
    pub(crate) fn is_queued_release(&self) -> bool {
        matches!(self, Hold::Release(r) if r.phase == ReleasePhase::Queued)
    }

    /// Whether it is a held grant with a renewal waiting in the lane.
    pub(crate) fn is_queued_renewal(&self) -> bool {
        matches!(self, Hold::Held(h) if matches!(h.renewal, Renewal::Queued { .. }))
    }

    /// The grant's key and token.
    pub(crate) fn grant(&self) -> (&Key, u64) {
        match self {
            Hold::Held(held) => (&held.key, held.token),
            Hold::Release(release) => (&release.key, release.token),
            Hold::Lost { key, token, .. } | Hold::Claimed { key, token } => (key, *token),
        }
    }
}

impl Keyed for Hold {
    fn key(&self) -> &Key {
        self.grant().0
    }
}

impl Client {
    /// [`Client::acquire`], and [`Client::acquire_renewing`] with `renew`:
    /// the grant is renewed automatically, for at most that long from when
    /// it is granted.
    pub(crate) fn submit_acquire(
        &mut self,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        renew: Option<Duration>,
    ) -> Result<OpId, Error> {
        if self.is_finished() {
            return Err(Error::Finished);
        }
        if self.shutdown.is_some() {
            return Err(Error::ShuttingDown);
        }
        if let Some(cause) = self.link.misconfigured() {
            return Err(Error::Misconfigured(cause.clone()));
        }
        let lease_ms = NonZeroU64::new(duration_millis(lease)).ok_or(Error::ZeroLease)?;
        if self.open_acquires >= self.config.max_acquires {
            return Err(Error::Busy);
        }
        let budget_end = self.now.saturating_add(wait);
        // A try-lock submitted before the connection is up is still tried.
        let queue_deadline = budget_end.max(self.now.saturating_add(self.config.queue_grace));
        let acquire = self.acquires.insert(Acquire {
            key,
            owner,
            lease_ms,
            budget_end,
            sent_at: Time::ZERO,
            attempts: 0,
            phase: AcquirePhase::Queued,
        });
        self.open_acquires += 1;
        self.events.stats.acquires_started += 1;
        if let Some(limit) = renew {
            self.renew_on_grant.insert(acquire, limit);
        }
        self.queue.push_back(acquire);
        self.acquires.set_timer(acquire, queue_deadline);
        Ok(OpId::of(OpKind::Acquire, acquire))
    }

    /// The record of `grant`, if this client still has one that is the
    /// embedder's (held, or lost): `Err` for a grant another client issued.
    pub(crate) fn held(&self, grant: &Grant) -> Result<Option<Handle>, Error> {
        if !grant.issuer.is(self.issuer) {
            return Err(Error::ForeignGrant {
                key: grant.key.clone(),
                token: grant.token,
            });
        }
        Ok(match grant.handle.parts() {
            Some((OpKind::Grant, handle)) => self
                .holds
                .get(handle)
                .filter(|hold| matches!(hold, Hold::Held(_) | Hold::Lost { .. }))
                .filter(|hold| hold.grant() == (&grant.key, grant.token))
                .map(|_| handle),
            _ => None,
        })
    }

    /// The error for a grant the embedder no longer holds.
    pub(crate) fn not_held(grant: &Grant) -> Error {
        Error::GrantNotHeld {
            key: grant.key.clone(),
            token: grant.token,
        }
    }

    /// [`Client::release`].
    pub(crate) fn submit_release(&mut self, grant: &Grant) -> Result<OpId, Error> {
        if self.is_finished() {
            return Err(Error::Finished);
        }
        let Some(handle) = self.held(grant)? else {
            if self.now < grant.expires_by {
                return Err(Client::not_held(grant));
            }
            self.events.stats.releases_started += 1;
            // Freed by lease expiry already: nothing to ask.
            let release = self.ended_release(grant.key.clone(), grant.token, grant.expires_by);
            self.end_release(release, ReleaseResult::Lapsed);
            return Ok(OpId::of(OpKind::Release, release));
        };
        if let Some(Hold::Lost { .. }) = self.holds.get(handle) {
            self.events.stats.releases_started += 1;
            // Its renewal was answered `N`: gone, and nothing to ask.
            let Some(Hold::Lost {
                key,
                token,
                expires_by,
            }) = self.holds.remove(handle)
            else {
                unreachable!("just matched")
            };
            let release = self.ended_release(key, token, expires_by);
            self.end_release(release, ReleaseResult::NotHeld);
            return Ok(OpId::of(OpKind::Release, release));
        }
        if self.open_releases >= self.config.max_releases {
            return Err(Error::Busy);
        }
        self.open_releases += 1;
        self.events.stats.releases_started += 1;
        // The grant becomes its release, in place, and its renewal stops:
        // one not sent yet is dropped, one in flight is claimed.
        let held = self.holds.get(handle).and_then(Hold::held).expect("held");
        let left = held.valid_until.millis_since(self.now);
        self.events.stats.lease_left_at_release.record(left);
        let renewal_queued = matches!(held.renewal, Renewal::Queued { .. });
        self.holds.update(handle, |hold| match hold {
            Hold::Held(held) => Hold::Release(Release {
                renewal_sent: matches!(held.renewal, Renewal::Sent { .. }),
                ..Release::new(held.key, held.token, held.expires_by, false)
            }),
            other => other,
        });
        if renewal_queued {
            self.renewals.forget(&self.holds, Hold::is_queued_renewal);
        }
        let until = self
            .holds
            .get(handle)
            .and_then(Hold::release)
            .expect("a release")
            .until;
        if self.now >= until {
            // An expired grant kept only for its renewal in flight, past
            // the deadline that renewal allows: the server has freed it,
            // and no attempt may start. It never enters the lane (as
            // `ended_release`); the renewal's answer is claimed.
            if let Some(release) = self.holds.get_mut(handle).and_then(Hold::release_mut) {
                release.phase = ReleasePhase::Sent;
            }
            self.end_release(handle, ReleaseResult::Lapsed);
            return Ok(OpId::of(OpKind::Release, handle));
        }
        self.holds.set_timer(handle, until);
        self.enter_lane(handle);
        Ok(OpId::of(OpKind::Release, handle))
    }

    /// A release that never enters the lane, counted open, to be ended at
    /// once.
    fn ended_release(&mut self, key: Key, token: u64, until: Time) -> Handle {
        let release = self.holds.insert(Hold::Release(Release {
            phase: ReleasePhase::Sent,
            ..Release::new(key, token, until, false)
        }));
        self.open_releases += 1;
        release
    }

    /// [`Client::release_token`].
    pub(crate) fn submit_release_token(&mut self, key: Key, token: u64) -> Result<OpId, Error> {
        if self.is_finished() {
            return Err(Error::Finished);
        }
        if self.open_releases >= self.config.max_releases {
            return Err(Error::Busy);
        }
        let until = self.now.saturating_add(self.config.release_horizon);
        self.open_releases += 1;
        self.events.stats.releases_started += 1;
        let release = self.queue_release(Release::new(key, token, until, false));
        Ok(OpId::of(OpKind::Release, release))
    }

    /// Stores `release`, its deadline armed, at the back of the lane.
    fn queue_release(&mut self, release: Release) -> Handle {
        let until = release.until;
        let handle = self.holds.insert(Hold::Release(release));
        self.holds.set_timer(handle, until);
        self.enter_lane(handle);
        handle
    }

    /// Puts the release `handle` at the back of the lane, and makes sure a
    /// connection is coming.
    fn enter_lane(&mut self, handle: Handle) {
        self.lane.push_back(handle);
        if let LinkState::Down { until } = self.link.state {
            if until == Time::MAX {
                // Down for good while shutting down: a release still goes.
                self.connect();
            }
        }
    }

    /// Puts an exact-token release of a grant nobody can take into the
    /// lane, unless its lease has run out (the server freed it already).
    pub(crate) fn queue_orphan_release(&mut self, key: Key, token: u64, until: Time) {
        if self.now >= until {
            return;
        }
        self.events.push_back(Event::OrphanRelease {
            key: key.clone(),
            token,
        });
        self.queue_release(Release::new(key, token, until, true));
    }

    /// [`Client::cancel`].
    pub(crate) fn cancel_op(&mut self, op: OpId) -> Result<(), Error> {
        match op.parts() {
            Some((OpKind::Acquire, handle)) => {
                let phase = self.acquires.get(handle).map(|a| a.phase);
                match phase {
                    Some(AcquirePhase::Queued | AcquirePhase::Backoff) => {
                        self.end_acquire(handle, Outcome::Cancelled);
                        Ok(())
                    }
                    Some(AcquirePhase::Sent) => {
                        match self.config.cancel {
                            CancelPolicy::Close => self.close(CloseReason::Cancel),
                            CancelPolicy::KeepWaiter => self.abandon_waiter(handle),
                        }
                        Ok(())
                    }
                    Some(AcquirePhase::Abandoned) | None => Err(Error::UnknownOperation(op)),
                }
            }
            // A release ignores cancellation: it is always settled.
            Some((OpKind::Release, handle))
                if self
                    .holds
                    .get(handle)
                    .is_some_and(|h| h.release().is_some()) =>
            {
                Ok(())
            }
            _ => Err(Error::UnknownOperation(op)),
        }
    }

    /// Ends a sent acquire Indeterminate at once but keeps claiming its
    /// answer: it is an abandoned waiter from now on.
    pub(crate) fn abandon_waiter(&mut self, handle: Handle) {
        let acquire = self.acquires.get(handle).expect("a sent acquire");
        let settles_by = self.settles_by(acquire);
        self.events.stats.count_indeterminate(None);
        self.emit(
            OpId::of(OpKind::Acquire, handle),
            Outcome::Indeterminate { settles_by },
        );
        self.open_acquires -= 1;
        self.acquires.get_mut(handle).expect("stored").phase = AcquirePhase::Abandoned;
    }

    /// When lease expiry settles an acquire in flight that is given up now:
    /// the moment the client gave up, plus `wait_ms`, plus `lease_ms`, plus
    /// the margin for network delay and clock drift.
    pub(crate) fn settles_by(&self, acquire: &Acquire) -> Time {
        self.now
            .saturating_add_millis(acquire.wire_wait_ms())
            .saturating_add_millis(acquire.lease_ms.get())
            .saturating_add(self.config.settle_margin)
    }

    /// By when the server has certainly freed a grant of `lease_ms` that was
    /// answered now.
    pub(crate) fn expires_by(&self, lease_ms: NonZeroU64) -> Time {
        self.now
            .saturating_add_millis(lease_ms.get())
            .saturating_add(self.config.settle_margin)
    }

    /// [`Client::undeliverable`].
    pub(crate) fn hand_back(&mut self, grant: &Grant) -> Result<(), Error> {
        if self.is_finished() {
            // The connection is gone for good: lease expiry frees the grant.
            return Err(Error::Finished);
        }
        match self.held(grant)? {
            Some(handle) => {
                let (key, token) = self.holds.get(handle).map(Hold::grant).expect("held");
                let (key, token) = (key.clone(), token);
                // A lost grant has nothing to release.
                if let Some(expires_by) = self.end_hold(handle) {
                    self.queue_orphan_release(key, token, expires_by);
                }
                Ok(())
            }
            None if self.now >= grant.expires_by => Ok(()),
            None => Err(Client::not_held(grant)),
        }
    }

    /// [`Client::shutdown`].
    pub(crate) fn start_shutdown(&mut self, budget: Duration) -> Result<(), Error> {
        if self.shutdown.is_some() || self.is_finished() {
            return Err(Error::ShuttingDown);
        }
        self.shutdown = Some(self.now.saturating_add(budget));
        self.stop_renewals();
        let mut sent_any = false;
        for handle in self.acquires.handles() {
            match self.acquires.get(handle).map(|a| a.phase) {
                Some(AcquirePhase::Queued | AcquirePhase::Backoff) => {
                    self.end_acquire(handle, Outcome::Cancelled);
                }
                Some(AcquirePhase::Sent) => match self.config.cancel {
                    CancelPolicy::Close => sent_any = true,
                    CancelPolicy::KeepWaiter => self.abandon_waiter(handle),
                },
                Some(AcquirePhase::Abandoned) | None => {}
            }
        }
        if sent_any {
            self.close(CloseReason::Cancel);
        }
        Ok(())
    }

    /// An acquire's timer fired: its queue deadline (it could not be sent
    /// in time), the end of a `B` backoff, or its answer deadline.
    pub(crate) fn fire_acquire(&mut self, handle: Handle) {
        let Some(acquire) = self.acquires.get_mut(handle) else {
            return;
        };
        match acquire.phase {
            AcquirePhase::Queued => {
                let outcome = self.unsent_outcome(handle, self.link.last_end().cloned());
                self.end_acquire(handle, outcome);
            }
            AcquirePhase::Backoff if self.link.misconfigured().is_some() => {
                // No connection will take it: it ends as it would queued.
                let cause = self.link.misconfigured().cloned();
                let outcome = self.unsent_outcome(handle, cause);
                self.end_acquire(handle, outcome);
            }
            AcquirePhase::Backoff => {
                acquire.phase = AcquirePhase::Queued;
                let budget_end = acquire.budget_end;
                self.queue.push_back(handle);
                self.acquires.set_timer(handle, budget_end);
            }
            // An answer that late: the connection or the server is unwell.
            AcquirePhase::Sent | AcquirePhase::Abandoned => self.close(CloseReason::AnswerTimeout),
        }
    }

    /// How an acquire that waits for a connection ends when it cannot be
    /// sent: `TimedOut`, never sent, with `cause`; or `Busy` if earlier
    /// attempts were all refused with `B`.
    fn unsent_outcome(&self, handle: Handle, cause: Option<CloseReason>) -> Outcome {
        match self.acquires.get(handle).map_or(0, |a| a.attempts) {
            0 => Outcome::TimedOut { sent: false, cause },
            _ => Outcome::Busy,
        }
    }

    /// A round was refused by every address: the client is misconfigured,
    /// and every acquire waiting for a connection ends at once with
    /// `cause`. Releases and renewals stay queued: a grant is never given
    /// up for a configuration error.
    pub(crate) fn end_unsendable_acquires(&mut self, cause: &CloseReason) {
        for handle in self.acquires.handles() {
            if self.acquires.get(handle).is_some_and(Acquire::is_queued) {
                let outcome = self.unsent_outcome(handle, Some(cause.clone()));
                self.end_acquire(handle, outcome);
            }
        }
    }

    /// A grant's timer fired: what is due for a held grant (see
    /// [`Client::tend`]), a lost grant's `expires_by`, a queued release's
    /// deadline, or a sent release's answer grace.
    pub(crate) fn fire_hold(&mut self, handle: Handle) {
        match self.holds.get(handle) {
            Some(Hold::Held(_)) => self.tend(handle),
            Some(Hold::Lost { .. }) => {
                self.holds.remove(handle);
            }
            Some(Hold::Release(release)) => match release.phase {
                ReleasePhase::Queued => self.end_release(handle, ReleaseResult::Lapsed),
                ReleasePhase::Sent => self.close(CloseReason::AnswerTimeout),
            },
            Some(Hold::Claimed { .. }) | None => {}
        }
    }

    /// Forgets a held or lost grant the embedder gave up, stopping its
    /// renewal (a renewal in flight keeps it as claimed until answered);
    /// the held grant's `expires_by`, `None` if it was lost.
    pub(crate) fn end_hold(&mut self, handle: Handle) -> Option<Time> {
        let hold = self.holds.get(handle)?;
        let Hold::Held(held) = hold else {
            self.holds.remove(handle);
            return None;
        };
        let expires_by = held.expires_by;
        match held.renewal {
            Renewal::Sent { .. } => {
                let (key, token) = (held.key.clone(), held.token);
                *self.holds.get_mut(handle).expect("held") = Hold::Claimed { key, token };
                // No timer: the renewal's answer, or the close, ends it.
                self.holds.clear_timer(handle);
            }
            Renewal::Queued { .. } => {
                self.holds.remove(handle);
                self.renewals.forget(&self.holds, Hold::is_queued_renewal);
            }
            Renewal::Idle => {
                self.holds.remove(handle);
            }
        }
        Some(expires_by)
    }

    /// Ends an acquire operation with `outcome` and forgets it.
    pub(crate) fn end_acquire(&mut self, handle: Handle, outcome: Outcome) {
        let Some(acquire) = self.acquires.remove(handle) else {
            return;
        };
        debug_assert_ne!(
            acquire.phase,
            AcquirePhase::Abandoned,
            "its outcome was given"
        );
        if acquire.phase == AcquirePhase::Queued {
            self.queue.forget(&self.acquires, Acquire::is_queued);
        }
        self.take_renew_on_grant(handle);
        self.open_acquires -= 1;
        self.emit(OpId::of(OpKind::Acquire, handle), outcome);
    }

    /// Ends a release: an outcome for the embedder's, a notice for the
    /// client's own.
    pub(crate) fn end_release(&mut self, handle: Handle, result: ReleaseResult) {
        let Some(Hold::Release(release)) = self.holds.get(handle) else {
            return;
        };
        let release = if release.renewal_sent {
            // Kept only to claim that renewal's answer.
            let claimed = Hold::Claimed {
                key: release.key.clone(),
                token: release.token,
            };
            self.holds.clear_timer(handle);
            let hold = self.holds.get_mut(handle).expect("stored");
            let Hold::Release(release) = core::mem::replace(hold, claimed) else {
                unreachable!("just matched")
            };
            release
        } else {
            let Some(Hold::Release(release)) = self.holds.remove(handle) else {
                unreachable!("just matched")
            };
            release
        };
        if release.phase == ReleasePhase::Queued {
            self.lane.forget(&self.holds, Hold::is_queued_release);
        }
        if release.orphan {
            self.events.push_back(Event::OrphanSettled {
                key: release.key,
                token: release.token,
                result,
            });
        } else {
            self.open_releases -= 1;
            let outcome = match result {
                ReleaseResult::Released => Outcome::Released,
                ReleaseResult::NotHeld => Outcome::NotHeld,
                ReleaseResult::Lapsed => Outcome::Lapsed,
            };
            self.emit(OpId::of(OpKind::Release, handle), outcome);
        }
    }
}
