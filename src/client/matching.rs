//! Answers (PROTOCOL.md section 5, the rows from "matching an answer" to
//! "an answer whose id is pending but op or key differ").
//!
//! An answer is attributed to a request only if its id is in flight **and**
//! its op and key equal the request's: never by arrival order, not even for
//! one key. Anything else means the session no longer agrees with the
//! server, and the connection is closed; a `G` that nobody claims is
//! released by its exact token unless the embedder holds it.

use core::num::NonZeroU64;

use super::operations::{AcquirePhase, Renewal};
use super::outcome::{
    BackoffCause, CloseReason, Event, Grant, OpId, OpKind, Outcome, ReleaseResult, Violation,
};
use super::store::Handle;
use super::{BusyPolicy, Client, Held, Hold, Request};
use crate::names::Key;
use crate::time::{millis, Time};
use crate::wire::{Answer, AnswerKind, Op};

impl Client {
    /// Matches an answer to its request by id, op and key, and ends or
    /// advances the request's operation. `Err` closes the connection.
    pub(crate) fn on_answer(&mut self, answer: Answer<'_>) -> Result<(), CloseReason> {
        let id = answer.id;
        let Some(request) = self.pending.remove(id).map(Request::of) else {
            // Never sent, or already answered: a second answer to one id.
            self.stray_answer(&answer);
            return Err(CloseReason::Protocol(Violation::UnknownId { id }));
        };
        let expected = self.expected(request);
        let violation = if expected.op != answer.op() || !expected.key.is(answer.key.as_bytes()) {
            Some(Violation::Mismatch { id })
        } else {
            match answer.kind {
                AnswerKind::Granted { lease_ms, .. } | AnswerKind::Renewed { lease_ms, .. }
                    if lease_ms > expected.lease_ms =>
                {
                    Some(Violation::LeaseAboveAsked { id })
                }
                AnswerKind::Granted {
                    waited_ms: None, ..
                } => Some(Violation::WaitedMissing { id }),
                AnswerKind::Granted {
                    waited_ms: Some(waited),
                    ..
                } if waited > expected.wait_ms => Some(Violation::WaitedAboveAsked { id }),
                AnswerKind::Renewed { token, .. } if token != expected.token => {
                    Some(Violation::TokenMismatch { id })
                }
                _ => None,
            }
        };
        if let Some(violation) = violation {
            // The matched request stays in flight: the close treats it as
            // sent and unanswered.
            self.pending.insert(id, request.op());
            self.stray_answer(&answer);
            return Err(CloseReason::Protocol(violation));
        }
        match request {
            Request::Acquire(handle) => {
                self.acquires_in_flight -= 1;
                self.on_acquire_answer(handle, answer.kind);
            }
            Request::Release(handle) => self.on_release_answer(handle, answer.kind),
            Request::Renew(handle) => self.on_renewal_answer(handle, answer.kind),
        }
        Ok(())
    }

    /// What an answer to `request` must say: its op and key, and what it
    /// may not exceed.
    fn expected(&self, request: Request) -> Expected<'_> {
        let stored = "requests in flight are stored";
        match request {
            Request::Acquire(handle) => {
                let acquire = self.acquires.get(handle).expect(stored);
                Expected {
                    op: Op::Acquire,
                    key: &acquire.key,
                    lease_ms: acquire.lease_ms,
                    wait_ms: acquire.wire_wait_ms(),
                    token: 0,
                }
            }
            Request::Release(handle) => {
                let release = self
                    .holds
                    .get(handle)
                    .and_then(Hold::release)
                    .expect(stored);
                Expected {
                    op: Op::Release,
                    key: &release.key,
                    lease_ms: NonZeroU64::MAX,
                    wait_ms: 0,
                    token: release.token,
                }
            }
            Request::Renew(handle) => {
                let hold = self.holds.get(handle).expect(stored);
                let (key, token) = hold.grant();
                let lease_ms = match hold.held().map(|held| held.renewal) {
                    Some(Renewal::Sent { lease_ms, .. }) => lease_ms,
                    // Claimed: its answer changes nothing.
                    _ => NonZeroU64::MAX,
                };
                Expected {
                    op: Op::Renew,
                    key,
                    lease_ms,
                    wait_ms: 0,
                    token,
                }
            }
        }
    }

    /// `G`, `T` or `B` matched to an acquire.
    fn on_acquire_answer(&mut self, handle: Handle, kind: AnswerKind) {
        let acquire = self.acquires.get(handle).expect("matched");
        match (acquire.phase, kind) {
            (
                AcquirePhase::Abandoned,
                AnswerKind::Granted {
                    token, lease_ms, ..
                },
            ) => {
                // An abandoned waiter's answer is claimed; its grant goes
                // back by exact token, unless the embedder holds it.
                let acquire = self.acquires.remove(handle).expect("matched");
                self.take_renew_on_grant(handle);
                if !self.is_known_grant(&acquire.key, token) {
                    let until = self.expires_by(lease_ms);
                    self.queue_orphan_release(acquire.key, token, until);
                }
            }
            (AcquirePhase::Abandoned, _) => {
                self.acquires.remove(handle);
                self.take_renew_on_grant(handle);
            }
            (
                _,
                AnswerKind::Granted {
                    token,
                    lease_ms,
                    waited_ms,
                },
            ) => self.grant(handle, token, lease_ms, waited_ms.unwrap_or(0)),
            (_, AnswerKind::TimedOut) => {
                let outcome = Outcome::TimedOut {
                    sent: true,
                    cause: None,
                };
                self.end_acquire(handle, outcome);
            }
            (_, AnswerKind::Busy) => self.on_busy(handle),
            (_, _) => unreachable!("matched as an acquire"),
        }
    }

    /// `D` or `N` matched to a release.
    fn on_release_answer(&mut self, handle: Handle, kind: AnswerKind) {
        let result = match kind {
            AnswerKind::Released => ReleaseResult::Released,
            // After an earlier lost attempt too: the grant is gone.
            AnswerKind::NotHeld => ReleaseResult::NotHeld,
            _ => unreachable!("matched as a release"),
        };
        self.end_release(handle, result);
    }

    /// An acquire in flight is granted: the embedder holds the grant from
    /// now on, until `valid_until` (the attempt's send time, plus how long
    /// it waited in the key's queue, plus the lease) as far as it can tell;
    /// renewed automatically if its acquire asked for it.
    fn grant(&mut self, handle: Handle, token: u64, lease_ms: NonZeroU64, waited_ms: u64) {
        let acquire = self.acquires.remove(handle).expect("matched");
        let renew = self.take_renew_on_grant(handle);
        self.open_acquires -= 1;
        self.events.stats.grant_wait.record(waited_ms);
        let expires_by = self.expires_by(lease_ms);
        let valid_until = acquire
            .sent_at
            .saturating_add_millis(waited_ms)
            .saturating_add_millis(lease_ms.get());
        let held = self.holds.insert(Hold::Held(Held {
            key: acquire.key.clone(),
            token,
            valid_until,
            lease_ms,
            expires_by,
            renew_lease_ms: acquire.lease_ms,
            auto_until: None,
            renewal: Renewal::Idle,
            jeopardy: false,
            expired: false,
        }));
        let grant = Grant {
            key: acquire.key,
            token,
            lease: millis(lease_ms.get()),
            valid_until,
            expires_by,
            handle: OpId::of(OpKind::Grant, held),
            issuer: self.issuer,
        };
        self.emit(OpId::of(OpKind::Acquire, handle), Outcome::Granted(grant));
        if let Some(limit) = renew {
            self.renew_from_now(held, limit);
        }
        // Its first renewal, jeopardy or expiry may be due at once.
        self.tend(held);
    }

    /// `B`: the attempt was refused before it was queued, so trying again is
    /// safe, with a new id after a backoff, while the budget still fits an
    /// attempt.
    fn on_busy(&mut self, handle: Handle) {
        let acquire = self.acquires.get(handle).expect("matched");
        let (budget_end, refused_in_a_row) =
            (acquire.budget_end, acquire.attempts.saturating_sub(1));
        let retry_at = match self.config.busy {
            BusyPolicy::Retry => Some(self.busy_retry_at(refused_in_a_row)),
            BusyPolicy::FailFast => None,
        };
        match retry_at {
            Some(at) if fits_an_attempt(at, budget_end) => {
                self.acquires.get_mut(handle).expect("matched").phase = AcquirePhase::Backoff;
                self.acquires.set_timer(handle, at);
                self.events.push_back(Event::Backoff {
                    cause: BackoffCause::Busy,
                    until: at,
                });
            }
            _ => self.end_acquire(handle, Outcome::Busy),
        }
    }

    /// An answer no request in flight claims. If it is a `G` for a grant the
    /// embedder was not given, that grant is released by its exact token: a
    /// grant the embedder holds is never released behind its back.
    pub(crate) fn stray_answer(&mut self, answer: &Answer<'_>) {
        if let AnswerKind::Granted {
            token, lease_ms, ..
        }
        | AnswerKind::Renewed { token, lease_ms } = answer.kind
        {
            let key = Key::from(answer.key);
            if !self.is_known_grant(&key, token) {
                let until = self.expires_by(lease_ms);
                self.queue_orphan_release(key, token, until);
            }
        }
    }

    /// Whether the embedder holds `(key, token)`, or a release of it is
    /// already under way. A scan: this only runs when an answer came that
    /// nobody waits for.
    fn is_known_grant(&self, key: &Key, token: u64) -> bool {
        self.holds
            .iter()
            .any(|(_, hold)| hold.grant() == (key, token))
    }
}

/// Whether an attempt starting at `at` still has at least a millisecond of
/// the budget to wait with.
fn fits_an_attempt(at: Time, budget_end: Time) -> bool {
    budget_end.saturating_duration_since(at) >= millis(1)
}

/// What the answer to a request in flight must say (its op and key), and
/// what it may not exceed or must repeat.
struct Expected<'a> {
    op: Op,
    key: &'a Key,
    /// The lease asked for.
    lease_ms: NonZeroU64,
    /// The `wait_ms` sent (acquires).
    wait_ms: u64,
    /// The token (renewals).
    token: u64,
}
