//! The release lane, the acquire queue and window accounting
//! (PROTOCOL.md section 5, "The reserved release lane").
//!
//! Requests are turned into bytes only when the driver asks for them
//! ([`Client::poll_action`](super::Client::poll_action)): that is the moment
//! they count as sent, and their pending entries are registered just before
//! their bytes are handed out. Releases go first, into any free slot of the
//! window; acquires only while fewer than `window - reserved` of them are in
//! flight, so a window full of acquires waiting for key K still has room for
//! the release of K.

use std::collections::VecDeque;

use bytes::Bytes;

use super::table::Table;
use super::{AcquirePhase, Client, Entry, ReleasePhase};
use crate::client::outcome::{Action, Outcome, ReleaseResult};
use crate::client::Event;
use crate::time::millis;
use crate::wire::ClientFrame;

/// A first-in first-out queue of slots, tolerant of entries that left it
/// without being popped (cancelled, timed out): those are recognised by
/// their generation and skipped, and the queue is compacted when they pile
/// up. `live` counts only the entries still waiting.
#[derive(Default)]
pub(crate) struct Queue {
    items: VecDeque<(u32, u32)>,
    live: usize,
}

impl Queue {
    pub(crate) fn push_back(&mut self, idx: u32, gen: u32) {
        self.items.push_back((idx, gen));
        self.live += 1;
    }

    pub(crate) fn push_front(&mut self, idx: u32, gen: u32) {
        self.items.push_front((idx, gen));
        self.live += 1;
    }

    /// How many entries still wait.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// The next waiting slot.
    pub(crate) fn pop<E>(&mut self, table: &Table<E>) -> Option<u32> {
        while let Some((idx, gen)) = self.items.pop_front() {
            if table.gen(idx) == Some(gen) {
                self.live -= 1;
                return Some(idx);
            }
        }
        None
    }

    /// A waiting entry left without being popped.
    pub(crate) fn forget<E>(&mut self, table: &Table<E>) {
        self.live -= 1;
        if self.items.len() > 2 * self.live + 64 {
            self.items.retain(|&(idx, gen)| table.gen(idx) == Some(gen));
            debug_assert!(self.items.len() >= self.live);
        }
    }
}

impl Client {
    /// How many acquires may be in flight with this window: all but the
    /// reserved slots, keeping at least one for acquires.
    pub(crate) fn acquire_limit(&self, window: u64) -> u64 {
        // SABOTAGE (feature `sim` only): acquires may fill the reserved
        // slots too.
        #[cfg(feature = "sim")]
        if self.config.sabotage == super::Sabotage::UseReservedSlot {
            return window;
        }
        let reserved = u64::from(self.config.reserved).min(window.saturating_sub(1));
        window - reserved
    }

    /// Whether a request can be sent on a ready connection with `window`.
    pub(crate) fn has_sendable(&self, window: u64) -> bool {
        let in_flight = self.pending.len() as u64;
        in_flight < window
            && (self.lane.live() > 0
                || (self.queue.live() > 0
                    && (self.acquires_in_flight as u64) < self.acquire_limit(window)))
    }

    /// Encodes every request that may go out now on a ready connection,
    /// registering each as pending before its bytes exist.
    pub(crate) fn fill_window(&mut self, window: u64) {
        let now = self.now;
        // Releases first, in any free slot.
        while (self.pending.len() as u64) < window {
            let Some(idx) = self.lane.pop(&self.table) else {
                break;
            };
            let id = self.take_request_id();
            self.pending.insert(id, idx);
            let Some(Entry::Release(release)) = self.table.get_mut(idx) else {
                unreachable!("the lane holds releases only");
            };
            // No new attempt starts at or after the release's deadline, nor
            // beyond its attempts: its timer fired before any poll could get
            // here, and only releases with attempts left enter the lane.
            debug_assert!(now < release.until && release.attempts < self.config.release_attempts);
            release.phase = ReleasePhase::Sent;
            release.sent_at = now;
            release.attempts += 1;
            // The key is an atom, checked when it was made.
            ClientFrame::encode_release(&mut self.out, id, release.key.as_bytes(), release.token);
            let deadline = now.saturating_add(self.config.answer_grace);
            self.table.set_timer(idx, Some(deadline));
        }
        // Then acquires, never into the reserved slots.
        let limit = self.acquire_limit(window);
        while (self.pending.len() as u64) < window && (self.acquires_in_flight as u64) < limit {
            let Some(idx) = self.queue.pop(&self.table) else {
                break;
            };
            let id = self.take_request_id();
            self.pending.insert(id, idx);
            self.acquires_in_flight += 1;
            let Some(Entry::Acquire(acquire)) = self.table.get_mut(idx) else {
                unreachable!("the acquire queue holds acquires only");
            };
            debug_assert_eq!(acquire.phase, AcquirePhase::Queued);
            acquire.phase = AcquirePhase::Sent;
            acquire.sent_at = now;
            acquire.attempts += 1;
            let wait_ms = acquire.wire_wait_ms();
            // The key and owner are atoms, checked when they were made.
            ClientFrame::encode_acquire(
                &mut self.out,
                id,
                acquire.key.as_bytes(),
                acquire.owner.as_bytes(),
                wait_ms,
                acquire.lease_ms,
            );
            let deadline = now
                .saturating_add(millis(wait_ms))
                .saturating_add(self.config.answer_grace);
            self.table.set_timer(idx, Some(deadline));
        }
    }

    /// Takes what was encoded as one send action.
    pub(crate) fn take_send(&mut self, conn: super::ConnId) -> Option<Action> {
        if self.out.is_empty() {
            return None;
        }
        let data: Bytes = self.out.split().freeze();
        Some(Action::Send { conn, data })
    }

    fn take_request_id(&mut self) -> u64 {
        let id = self.next_request;
        self.next_request = self.next_request.wrapping_add(1);
        id
    }

    /// Puts a release whose attempt was lost back at the front of the lane,
    /// or ends it `Lapsed` if no further attempt may start (PROTOCOL.md: "A
    /// release that was in flight when its connection closed is sent again
    /// on the next one ... bounded").
    pub(crate) fn requeue_release(&mut self, idx: u32) {
        let Some(Entry::Release(release)) = self.table.get_mut(idx) else {
            unreachable!("only releases are requeued");
        };
        let until = release.until;
        if self.now >= until || release.attempts >= self.config.release_attempts || self.finishing {
            self.end_release(idx, ReleaseResult::Lapsed);
            return;
        }
        release.phase = ReleasePhase::Queued;
        let gen = self.table.gen(idx).expect("occupied");
        self.lane.push_front(idx, gen);
        self.table.set_timer(idx, Some(until));
    }

    /// Ends a release: an outcome for the embedder's, a notice for the
    /// client's own.
    pub(crate) fn end_release(&mut self, idx: u32, result: ReleaseResult) {
        let Some(Entry::Release(release)) = self.table.get(idx) else {
            unreachable!("only releases end as releases");
        };
        if release.orphan {
            self.events.push_back(Event::OrphanSettled {
                key: release.key.clone(),
                token: release.token,
                result,
            });
        } else {
            let outcome = match result {
                ReleaseResult::Released => Outcome::Released,
                ReleaseResult::NotHeld => Outcome::NotHeld,
                ReleaseResult::Lapsed => Outcome::Lapsed,
            };
            self.emit_outcome(idx, outcome);
        }
        self.retire(idx);
    }
}
