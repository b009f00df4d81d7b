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

use core::hint::black_box;
use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::table::{Table, KEPT_WHEN_EMPTY};
use super::{AcquirePhase, Client, Entry, ReleasePhase, LANE_HELD, LANE_RELEASE_SENT, LANE_SENT};
use crate::client::outcome::{Action, Outcome, ReleaseResult};
use crate::client::Event;
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
    #[inline]
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

    /// The slot `ahead` places from the front (waiting or not).
    #[inline]
    fn peek(&self, ahead: usize) -> Option<u32> {
        self.items.get(ahead).map(|&(idx, _)| idx)
    }

    /// The next waiting slot.
    pub(crate) fn pop<E>(&mut self, table: &Table<E>) -> Option<u32> {
        while let Some((idx, gen)) = self.items.pop_front() {
            if table.gen(idx) == Some(gen) {
                self.live -= 1;
                return Some(idx);
            }
        }
        if self.items.capacity() > KEPT_WHEN_EMPTY {
            self.give_back();
        }
        None
    }

    /// Gives back what a burst made the queue grow to.
    #[cold]
    #[inline(never)]
    fn give_back(&mut self) {
        self.items.shrink_to(KEPT_WHEN_EMPTY);
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

    /// Reads the slots that sending the next [`BATCH`](super::BATCH)
    /// requests of `queue` will write, all at once. They are spread at
    /// random over memory larger than the caches: this way they are waited
    /// for together, once a batch, instead of at each request. (Their ids'
    /// buckets need no such read: consecutive ids have consecutive buckets.)
    #[inline(never)]
    fn read_ahead(&self, queue: &Queue) {
        for ahead in 0..super::BATCH {
            if let Some(idx) = queue.peek(ahead) {
                black_box(self.table.touch(idx));
            }
        }
    }

    /// Encodes every request that may go out now on a ready connection,
    /// registering each as pending before its bytes exist.
    #[inline(never)]
    pub(crate) fn fill_window(&mut self, window: u64) {
        let now = self.now;
        if self.out.is_empty() {
            // Once the driver has dropped every send taken from the buffer,
            // write at its start again, in memory that was used last,
            // instead of going on through all of it (no allocation: `false`
            // when a send is still held, and nothing changes).
            let whole = self.out.capacity() + 1;
            let _reclaimed = self.out.try_reclaim(whole);
        }
        // Releases first, in any free slot.
        let mut count = 0;
        while (self.pending.len() as u64) < window {
            if count % super::BATCH == 0 {
                self.read_ahead(&self.lane);
            }
            count += 1;
            let Some(idx) = self.lane.pop(&self.table) else {
                break;
            };
            let id = self.next_request.value();
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
            ClientFrame::encode_release_digits(
                &mut self.out,
                self.next_request.digits(),
                release.key.as_bytes(),
                release.token,
            );
            self.next_request.advance();
            let deadline = now.saturating_add_nanos(self.answer_grace_ns);
            self.table.set_timer(idx, deadline, LANE_RELEASE_SENT);
        }
        // Then acquires, never into the reserved slots.
        let limit = self.acquire_limit(window);
        let mut count = 0;
        while (self.pending.len() as u64) < window && (self.acquires_in_flight as u64) < limit {
            if count % super::BATCH == 0 {
                self.read_ahead(&self.queue);
            }
            count += 1;
            let Some(idx) = self.queue.pop(&self.table) else {
                break;
            };
            let id = self.next_request.value();
            self.pending.insert(id, idx);
            self.acquires_in_flight += 1;
            let Some(Entry::Acquire(acquire)) = self.table.get_mut(idx) else {
                unreachable!("the acquire queue holds acquires only");
            };
            debug_assert_eq!(acquire.phase, AcquirePhase::Queued);
            acquire.phase = AcquirePhase::Sent;
            acquire.sent_at = now;
            acquire.attempts = acquire.attempts.saturating_add(1);
            let wait_ms = acquire.wire_wait_ms();
            // The key and owner are atoms, checked when they were made.
            ClientFrame::encode_acquire_digits(
                &mut self.out,
                self.next_request.digits(),
                acquire.key.as_bytes(),
                self.owners.get(&acquire.owner).as_bytes(),
                self.wait_digits.of(wait_ms),
                self.lease_digits.of(acquire.lease_ms.get()),
            );
            self.next_request.advance();
            let deadline = now
                .saturating_add_millis(wait_ms)
                .saturating_add_nanos(self.answer_grace_ns);
            self.table.set_timer(idx, deadline, LANE_SENT);
        }
    }

    /// Takes what was encoded as one send action.
    pub(crate) fn take_send(&mut self, conn: super::ConnId) -> Option<Action> {
        if self.out.is_empty() {
            return None;
        }
        // A burst (thousands of acquires submitted before one poll) grows
        // the buffer far beyond what steady traffic needs: let it go with
        // this send rather than keep its memory for good.
        let burst = self.out.capacity() > super::SEND_BUFFER_KEPT;
        let data: Bytes = self.out.split().freeze();
        if burst {
            self.out = BytesMut::new();
        }
        Some(Action::Send { conn, data })
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
        self.table.set_timer(idx, until, LANE_HELD);
    }

    /// Ends a release: an outcome for the embedder's, a notice for the
    /// client's own.
    #[inline(never)]
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
