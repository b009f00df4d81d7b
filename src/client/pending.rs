//! The pending table and matching (PROTOCOL.md section 5, the rows from
//! "matching an answer" to "a second answer to one id").
//!
//! An answer is attributed to a request only if its id is pending **and**
//! its op and key equal the request's: never by arrival order, not even for
//! one key. Anything else means the session no longer agrees with the
//! server, and the connection is closed; a `G` that nobody claims is
//! released by its exact token unless the embedder holds it.

use core::hash::{BuildHasherDefault, Hasher};
use core::num::NonZeroU64;
use std::collections::HashMap;

use super::outcome::{
    BackoffCause, CloseReason, Event, Grant, OpId, Outcome, ReleaseResult, Violation,
};
use super::{AcquirePhase, BusyPolicy, Client, Entry, Held, Release, ReleasePhase};
use crate::names::Key;
use crate::time::{millis, Time};
use crate::wire::{Answer, AnswerKind, Atom, Op};

/// Request id to slot. Ids are the client's own sequence numbers, so a
/// multiplicative hash spreads them well and costs one instruction.
pub(crate) type PendingTable = HashMap<u64, u32, BuildHasherDefault<IdHasher>>;

/// A hasher for `u64` request ids (Fibonacci hashing).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Client {
    /// Matches an answer to its pending request by id, op and key, and ends
    /// or advances the request's operation. `Err` closes the connection.
    pub(crate) fn on_answer(&mut self, answer: Answer<'_>) -> Result<(), CloseReason> {
        let id = answer.id;
        let Some(&idx) = self.pending.get(&id) else {
            // Never sent, or already answered: a second answer to one id.
            self.stray_answer(answer);
            return Err(CloseReason::Protocol(Violation::UnknownId { id }));
        };
        let (op, key_matches, asked_lease) = match self.table.get(idx) {
            Some(Entry::Acquire(a)) => (Op::Acquire, a.key.is(answer.key.as_bytes()), a.lease_ms),
            Some(Entry::Release(r)) => (
                Op::Release,
                r.key.is(answer.key.as_bytes()),
                NonZeroU64::MAX,
            ),
            Some(Entry::Held(_)) | None => unreachable!("pending entries are requests"),
        };
        if op != answer.op() || !key_matches {
            // The matched operation stays pending: the close treats it as
            // sent and unanswered.
            self.stray_answer(answer);
            return Err(CloseReason::Protocol(Violation::Mismatch { id }));
        }
        if let AnswerKind::Granted { lease_ms, .. } = answer.kind {
            if lease_ms > asked_lease {
                self.stray_answer(answer);
                return Err(CloseReason::Protocol(Violation::LeaseAboveAsked { id }));
            }
        }
        self.pending.remove(&id);
        self.table.set_timer(idx, None);
        match answer.kind {
            AnswerKind::Released => self.end_release(idx, ReleaseResult::Released),
            AnswerKind::NotHeld => self.end_release(idx, ReleaseResult::NotHeld),
            kind => {
                self.acquires_in_flight -= 1;
                self.on_acquire_answer(idx, kind);
            }
        }
        Ok(())
    }

    fn on_acquire_answer(&mut self, idx: u32, kind: AnswerKind) {
        let Some(Entry::Acquire(acquire)) = self.table.get(idx) else {
            unreachable!("matched as an acquire");
        };
        let (phase, sent_at, budget_end, attempts) = (
            acquire.phase,
            acquire.sent_at,
            acquire.budget_end,
            acquire.attempts,
        );
        match (phase, kind) {
            (AcquirePhase::Abandoned, AnswerKind::Granted { token, lease_ms }) => {
                // An abandoned waiter's answer is claimed; its grant goes
                // back by exact token.
                let until = self.expires_by(lease_ms);
                if let Some(Entry::Acquire(a)) = self.table.remove(idx) {
                    self.queue_orphan_release(a.key, token, until);
                }
            }
            (AcquirePhase::Abandoned, _) => {
                self.table.remove(idx);
            }
            (_, AnswerKind::Granted { token, lease_ms }) => {
                let lease = millis(lease_ms.get());
                let expires_by = self.expires_by(lease_ms);
                let op = OpId::new(idx, self.table.gen(idx).expect("occupied"));
                // The acquire's id dies here; the grant's handle is the
                // slot's next generation.
                let handle = OpId::new(idx, self.table.bump(idx));
                self.open_acquires -= 1;
                let entry = self.table.get_mut(idx).expect("occupied");
                let Entry::Acquire(acquire) = entry else {
                    unreachable!("matched as an acquire");
                };
                let key = acquire.key.clone();
                *entry = Entry::Held(Held {
                    key: key.clone(),
                    token,
                });
                self.table.set_timer(idx, Some(expires_by));
                self.events.push_back(Event::Outcome {
                    op,
                    outcome: Outcome::Granted(Grant {
                        key,
                        token,
                        lease,
                        valid_until: sent_at.saturating_add(lease),
                        expires_by,
                        handle,
                    }),
                });
            }
            (_, AnswerKind::TimedOut) => {
                self.emit_outcome(idx, Outcome::TimedOut { sent: true });
                self.retire(idx);
            }
            (_, AnswerKind::Busy) => {
                // Refused before it was queued: trying again is safe, with a
                // new id, while the budget still fits an attempt.
                let retry_at = match self.config.busy {
                    BusyPolicy::Retry => {
                        Some(self.backoff_until(BackoffCause::Busy, attempts.saturating_sub(1)))
                    }
                    BusyPolicy::FailFast => None,
                };
                match retry_at {
                    Some(at) if fits_an_attempt(at, budget_end) => {
                        if let Some(Entry::Acquire(a)) = self.table.get_mut(idx) {
                            a.phase = AcquirePhase::Backoff;
                        }
                        self.table.set_timer(idx, Some(at));
                        self.events.push_back(Event::Backoff {
                            cause: BackoffCause::Busy,
                            until: at,
                        });
                    }
                    _ => {
                        self.emit_outcome(idx, Outcome::Busy);
                        self.retire(idx);
                    }
                }
            }
            (_, AnswerKind::Released | AnswerKind::NotHeld) => {
                unreachable!("matched as an acquire")
            }
        }
    }

    /// By when the server has certainly freed a grant of `lease_ms` that was
    /// answered now.
    pub(crate) fn expires_by(&self, lease_ms: NonZeroU64) -> Time {
        self.now
            .saturating_add(millis(lease_ms.get()))
            .saturating_add(self.config.settle_margin)
    }

    /// An answer no pending request claims. If it is a `G` for a grant the
    /// embedder was not given, release that grant by its exact token: a
    /// grant the embedder holds is never released behind its back.
    pub(crate) fn stray_answer(&mut self, answer: Answer<'_>) {
        if let AnswerKind::Granted { token, lease_ms } = answer.kind {
            if self.is_known_grant(answer.key, token) {
                return;
            }
            let until = self.expires_by(lease_ms);
            self.queue_orphan_release(Key::from(answer.key), token, until);
        }
    }

    /// Whether the embedder holds `(key, token)`, or a release of it is
    /// already under way. A scan: this only runs when the server has broken
    /// the protocol, at most once per connection.
    fn is_known_grant(&self, key: Atom<'_>, token: u64) -> bool {
        self.table.indices().any(|idx| match self.table.get(idx) {
            Some(Entry::Held(h)) => h.token == token && h.key.is(key.as_bytes()),
            Some(Entry::Release(r)) => r.token == token && r.key.is(key.as_bytes()),
            _ => false,
        })
    }

    /// Puts an exact-token release of a grant nobody can take into the lane.
    pub(crate) fn queue_orphan_release(&mut self, key: Key, token: u64, until: Time) {
        if self.now >= until {
            // The lease has run out: the server freed it already.
            return;
        }
        self.events.push_back(Event::OrphanRelease {
            key: key.clone(),
            token,
        });
        let (idx, gen) = self.table.insert(Entry::Release(Release {
            key,
            token,
            until,
            sent_at: Time::ZERO,
            attempts: 0,
            phase: ReleasePhase::Queued,
            orphan: true,
        }));
        self.lane.push_back(idx, gen);
        self.table.set_timer(idx, Some(until));
        self.wake_link();
    }
}

/// Whether an attempt starting at `at` still has at least a millisecond of
/// the budget to wait with.
fn fits_an_attempt(at: Time, budget_end: Time) -> bool {
    budget_end.saturating_duration_since(at) >= millis(1)
}
