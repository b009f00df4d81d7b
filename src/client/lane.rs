//! The release lane, the acquire queue and the window (PROTOCOL.md section
//! 5, "The reserved release lane").
//!
//! Requests are turned into bytes only when the driver asks for them
//! ([`Client::poll_action`]): that is the moment they count as sent, and
//! each is registered in flight just before its bytes exist. Releases go
//! first, then renewals, into any free slot of the window; acquires only
//! while fewer than `window - reserved` of them are in flight, so a window
//! full of acquires waiting for key K still has room for the release of K,
//! and for renewals.

use core::num::NonZeroU64;

use super::operations::{Acquire, AcquirePhase, Hold, ReleasePhase, Renewal};
use super::outcome::{Action, ConnId, ReleaseResult};
use super::store::Handle;
use super::{Client, Request};
use crate::time::Time;
use crate::wire::ClientFrame;

impl Client {
    /// How many acquires may be in flight with this window: all but the
    /// reserved slots.
    pub(crate) fn acquire_limit(&self, window: u64) -> u64 {
        window.saturating_sub(u64::from(self.config.reserved))
    }

    /// Whether a request can be sent on a ready connection with `window`.
    pub(crate) fn has_sendable(&self, window: u64) -> bool {
        let free_slot = (self.pending.len() as u64) < window;
        let acquire_slot = (self.acquires_in_flight as u64) < self.acquire_limit(window);
        free_slot
            && (self.lane.len() > 0
                || self.renewals.len() > 0
                || (self.queue.len() > 0 && acquire_slot))
    }

    /// Encodes every request that may go out now on a ready connection:
    /// releases first, then renewals, in any free slot; then acquires,
    /// never into the reserved slots.
    pub(crate) fn fill_window(&mut self, window: u64) {
        while (self.pending.len() as u64) < window {
            let Some(release) = self.lane.pop(&self.holds, Hold::is_queued_release) else {
                break;
            };
            self.send_release(release);
        }
        while (self.pending.len() as u64) < window {
            let Some(grant) = self.renewals.pop(&self.holds, Hold::is_queued_renewal) else {
                break;
            };
            self.send_renewal(grant);
        }
        let limit = self.acquire_limit(window);
        while (self.pending.len() as u64) < window && (self.acquires_in_flight as u64) < limit {
            let Some(acquire) = self.queue.pop(&self.acquires, Acquire::is_queued) else {
                break;
            };
            self.send_acquire(acquire);
        }
    }

    /// Sends a queued renewal of a held grant, registered in flight first,
    /// with its answer grace armed; the grant's `expires_by` moves to what
    /// the renewal could give. A renewal whose grant's `valid_until` has
    /// passed is not sent: the grant is no longer renewed.
    fn send_renewal(&mut self, handle: Handle) {
        let held = self.holds.get_mut(handle).and_then(Hold::held_mut);
        let held = held.expect("queued renewals are of held grants");
        let Renewal::Queued { lease_ms, auto } = held.renewal else {
            unreachable!("popped as queued");
        };
        if self.now >= held.valid_until {
            held.renewal = Renewal::Idle;
            self.tend(handle);
            return;
        }
        let id = self.next_request_id();
        self.pending.insert(id, Request::Renew(handle).op());
        self.events.stats.renewals.sent += 1;
        let held = self
            .holds
            .get_mut(handle)
            .and_then(Hold::held_mut)
            .expect("held");
        held.renewal = Renewal::Sent {
            sent_at: self.now,
            lease_ms,
            auto,
        };
        held.expires_by =
            held.expires_by
                .max(expiry(self.now, lease_ms, self.config.settle_margin));
        ClientFrame::Renew {
            id,
            key: held.key.to_wire(),
            token: held.token,
            lease_ms,
        }
        .encode(self.out.writer());
        self.tend(handle);
    }

    /// The id of the next request: one more than the last, never reused.
    fn next_request_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// Sends the next attempt of a queued release, registered in flight
    /// first, with its answer grace armed.
    fn send_release(&mut self, handle: Handle) {
        let id = self.next_request_id();
        self.pending.insert(id, Request::Release(handle).op());
        let release = self.holds.get_mut(handle).and_then(Hold::release_mut);
        let release = release.expect("queued releases are stored");
        // Its deadline fired before any poll could get here, and only
        // releases with attempts left enter the lane.
        debug_assert!(self.now < release.until);
        release.phase = ReleasePhase::Sent;
        release.attempts += 1;
        ClientFrame::Release {
            id,
            key: release.key.to_wire(),
            token: release.token,
        }
        .encode(self.out.writer());
        let deadline = self.now.saturating_add(self.config.answer_grace);
        self.holds.set_timer(handle, deadline);
    }

    /// Sends the next attempt of a queued acquire, registered in flight
    /// first, its `wait_ms` what is left of its budget, with its answer
    /// deadline armed.
    fn send_acquire(&mut self, handle: Handle) {
        let id = self.next_request_id();
        self.pending.insert(id, Request::Acquire(handle).op());
        self.acquires_in_flight += 1;
        let acquire = self
            .acquires
            .get_mut(handle)
            .expect("queued acquires are stored");
        debug_assert_eq!(acquire.phase, AcquirePhase::Queued);
        acquire.phase = AcquirePhase::Sent;
        acquire.sent_at = self.now;
        acquire.attempts += 1;
        ClientFrame::Acquire {
            id,
            key: acquire.key.to_wire(),
            owner: acquire.owner.to_wire(),
            wait_ms: acquire.wire_wait_ms(),
            lease_ms: acquire.lease_ms,
        }
        .encode(self.out.writer());
        let deadline = acquire.answer_deadline(self.config.answer_grace);
        self.acquires.set_timer(handle, deadline);
    }

    /// Takes what was encoded as one send action.
    pub(crate) fn take_send(&mut self, conn: ConnId) -> Option<Action> {
        let data = self.out.take()?;
        Some(Action::Send { conn, data })
    }

    /// Puts a release whose attempt was lost at a close back at the front of
    /// the lane, or ends it `Lapsed` if no further attempt may start: after
    /// its deadline, past its attempts, or when the shutdown is ending.
    pub(crate) fn requeue_release(&mut self, handle: Handle) {
        let release = self.holds.get_mut(handle).and_then(Hold::release_mut);
        let release = release.expect("sent releases are stored");
        let until = release.until;
        if self.now >= until || release.attempts >= self.config.release_attempts || self.finishing {
            self.end_release(handle, ReleaseResult::Lapsed);
            return;
        }
        release.phase = ReleasePhase::Queued;
        self.lane.push_front(handle);
        self.holds.set_timer(handle, until);
    }
}

/// When the server has certainly freed a grant whose lease of `lease_ms`
/// started no earlier than `from`: that plus the lease plus the margin.
pub(crate) fn expiry(from: Time, lease_ms: NonZeroU64, margin: core::time::Duration) -> Time {
    from.saturating_add_millis(lease_ms.get())
        .saturating_add(margin)
}
