//! The pending table and matching (PROTOCOL.md section 5, the rows from
//! "matching an answer" to "a second answer to one id").
//!
//! An answer is attributed to a request only if its id is pending **and**
//! its op and key equal the request's: never by arrival order, not even for
//! one key. Anything else means the session no longer agrees with the
//! server, and the connection is closed; a `G` that nobody claims is
//! released by its exact token unless the embedder holds it.

use core::num::NonZeroU64;

use super::outcome::{
    BackoffCause, CloseReason, Event, Grant, OpId, Outcome, ReleaseResult, Violation,
};
use super::{
    AcquirePhase, BusyPolicy, Client, Entry, Held, Release, ReleasePhase, LANE_HELD, LANE_OTHER,
};
use crate::names::Key;
use crate::time::{millis, Time};
use crate::wire::{AnswerKind, Op, RawAnswer};

/// Request id to slot, specialised for the client's own request ids, which
/// go up by one per request.
///
/// Most ids are in `near`, a ring indexed by the id's low bits: the ids in
/// flight are mostly a recent range, so each has a bucket of its own, where
/// it is found, put and taken out with no probing and without moving any
/// other id (taking an id out of an open-addressing table moves the rest of
/// its run back, a loop of unpredictable length for every answer). An id
/// still pending when the ids have gone round the ring and a later one
/// comes to its bucket (an acquire that waits long) moves on to `far`, a
/// hash table for the few that outlive a round. The ring has at least 4/3
/// as many buckets as there are ids pending, as the single table it
/// replaces had, so the memory of the usual case is the same.
///
/// A bucket is 12 bytes, the id and its slot side by side; id `0` marks an
/// empty bucket (the one id `0` there could ever be, after 2^64 requests,
/// is kept aside). Where an id goes depends on the ids alone, so the table
/// is as deterministic as the rest of the core. Nothing allocates once both
/// parts have grown to their working size.
#[derive(Default)]
pub(crate) struct PendingTable {
    /// Id `id` in bucket `id % near.len()` (a power of two), if anywhere.
    near: Vec<Bucket>,
    /// The ids pushed out of `near`.
    far: FarTable,
    len: usize,
    /// The slot of request id `0`, if pending.
    zero: Option<u32>,
}

/// Ids to slots: an open-addressing table with linear probing.
///
/// The home bucket of an id is the top bits of the id times 2^64 / φ
/// (Fibonacci hashing), so that ids that share their low bits (those
/// pushed out of one bucket of the ring) land far apart. Removal shifts the
/// rest of its run back instead of leaving tombstones, so nothing degrades.
#[derive(Default)]
struct FarTable {
    buckets: Vec<Bucket>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Bucket {
    id: u64,
    slot: u32,
}

const EMPTY: Bucket = Bucket { id: 0, slot: 0 };

/// Where a pending request's id is.
#[derive(Clone, Copy)]
pub(crate) enum Found {
    /// In this bucket of the ring.
    Near(usize),
    /// In this bucket of the far table.
    Far(usize),
    /// Id `0`.
    Zero,
}

impl PendingTable {
    /// How many requests are pending.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `id` is, if pending.
    #[inline]
    pub(crate) fn find(&self, id: u64) -> Option<Found> {
        if id == 0 {
            return self.zero.map(|_| Found::Zero);
        }
        // An empty ring has no bucket: `len - 1` wraps to a mask that
        // `get` refuses.
        let at = id as usize & self.near.len().wrapping_sub(1);
        match self.near.get(at) {
            Some(bucket) if bucket.id == id => Some(Found::Near(at)),
            _ => self.far.bucket_of(id).map(Found::Far),
        }
    }

    /// Whether `found` is where `id` is.
    #[inline]
    pub(crate) fn holds(&self, found: Found, id: u64) -> bool {
        match found {
            Found::Near(at) => self.near.get(at).is_some_and(|bucket| bucket.id == id),
            Found::Far(at) => self
                .far
                .buckets
                .get(at)
                .is_some_and(|bucket| bucket.id == id),
            Found::Zero => id == 0 && self.zero.is_some(),
        }
    }

    /// The slot of the request found at `found`.
    #[inline]
    pub(crate) fn slot(&self, found: Found) -> u32 {
        match found {
            Found::Near(at) => self.near[at].slot,
            Found::Far(at) => self.far.buckets[at].slot,
            Found::Zero => self.zero.expect("found"),
        }
    }

    /// The slot of the pending request `id`.
    #[cfg(test)]
    pub(crate) fn get(&self, id: &u64) -> Option<u32> {
        self.find(*id).map(|found| self.slot(found))
    }

    /// Registers `id`, which is not pending, for `slot`.
    #[inline(always)]
    pub(crate) fn insert(&mut self, id: u64, slot: u32) {
        debug_assert!(self.find(id).is_none(), "id {id} is pending already");
        self.len += 1;
        if id == 0 {
            self.zero = Some(slot);
            return;
        }
        // At most three quarters full, so that the ring goes round slowly.
        if 4 * self.len > 3 * self.near.len() {
            self.grow();
        }
        let at = id as usize & (self.near.len() - 1);
        let old = core::mem::replace(&mut self.near[at], Bucket { id, slot });
        if old.id != 0 {
            self.far.insert(old.id, old.slot);
        }
    }

    /// Forgets the request found at `found`, returning its slot.
    #[inline]
    pub(crate) fn remove_found(&mut self, found: Found) -> u32 {
        self.len -= 1;
        match found {
            Found::Near(at) => core::mem::replace(&mut self.near[at], EMPTY).slot,
            Found::Far(at) => self.far.remove_at(at),
            Found::Zero => self.zero.take().expect("found"),
        }
    }

    /// Forgets `id`, returning its slot.
    #[cfg(test)]
    pub(crate) fn remove(&mut self, id: &u64) -> Option<u32> {
        let found = self.find(*id)?;
        Some(self.remove_found(found))
    }

    /// Every pending request, in no particular order (feature `sim` only,
    /// for a sabotage switch).
    #[cfg(feature = "sim")]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        let zero = self.zero.map(|slot| (0, slot));
        zero.into_iter().chain(
            self.near
                .iter()
                .chain(&self.far.buckets)
                .filter(|bucket| bucket.id != 0)
                .map(|bucket| (bucket.id, bucket.slot)),
        )
    }

    /// Takes every pending request out, in no particular order.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.len = 0;
        self.far.len = 0;
        let zero = self.zero.take().map(|slot| (0, slot));
        zero.into_iter().chain(
            self.near
                .iter_mut()
                .chain(&mut self.far.buckets)
                .filter(|bucket| bucket.id != 0)
                .map(|bucket| {
                    let Bucket { id, slot } = core::mem::replace(bucket, EMPTY);
                    (id, slot)
                }),
        )
    }

    /// Doubles the ring (16 buckets at first) and puts every id back: in
    /// the ring if its bucket there is free, else in the far table.
    #[cold]
    fn grow(&mut self) {
        let count = (2 * self.near.len()).max(16);
        let near = core::mem::replace(&mut self.near, vec![EMPTY; count]);
        let far = core::mem::take(&mut self.far);
        for bucket in near.into_iter().chain(far.buckets) {
            if bucket.id == 0 {
                continue;
            }
            let place = &mut self.near[bucket.id as usize & (count - 1)];
            if place.id == 0 {
                *place = bucket;
            } else {
                self.far.insert(bucket.id, bucket.slot);
            }
        }
    }
}

impl FarTable {
    /// The home bucket of `id` among `buckets` (a power of two, at least 2).
    #[inline(always)]
    fn home(id: u64, buckets: usize) -> usize {
        (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - buckets.trailing_zeros())) as usize
    }

    /// The bucket holding `id`, if any (`id != 0`).
    #[inline]
    fn bucket_of(&self, id: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let mut at = Self::home(id, self.buckets.len());
        loop {
            let found = self.buckets[at].id;
            if found == id {
                return Some(at);
            }
            if found == 0 {
                return None;
            }
            at = (at + 1) & mask;
        }
    }

    /// Registers `id` (not `0`, not here) for `slot`.
    #[inline(never)]
    fn insert(&mut self, id: u64, slot: u32) {
        // At most three quarters full, so that runs stay short.
        if 4 * (self.len + 1) > 3 * self.buckets.len() {
            self.grow();
        }
        let mask = self.buckets.len() - 1;
        let mut at = Self::home(id, self.buckets.len());
        loop {
            let found = self.buckets[at].id;
            if found == 0 {
                break;
            }
            debug_assert_ne!(found, id);
            at = (at + 1) & mask;
        }
        self.buckets[at] = Bucket { id, slot };
        self.len += 1;
    }

    /// Forgets the id in bucket `hole`, returning its slot.
    fn remove_at(&mut self, mut hole: usize) -> u32 {
        self.len -= 1;
        let slot = self.buckets[hole].slot;
        // Shift back every later id of the run that may sit in the hole:
        // one whose home is not cyclically within (hole, at].
        let mask = self.buckets.len() - 1;
        let mut at = (hole + 1) & mask;
        loop {
            let next = self.buckets[at];
            if next.id == 0 {
                break;
            }
            let home = Self::home(next.id, self.buckets.len());
            if (at.wrapping_sub(home) & mask) >= (at.wrapping_sub(hole) & mask) {
                self.buckets[hole] = next;
                hole = at;
            }
            at = (at + 1) & mask;
        }
        self.buckets[hole] = EMPTY;
        slot
    }

    /// Doubles the buckets (16 at first) and puts every id back.
    #[cold]
    fn grow(&mut self) {
        let count = (2 * self.buckets.len()).max(16);
        let old = core::mem::replace(&mut self.buckets, vec![EMPTY; count]);
        let mask = count - 1;
        for bucket in old.into_iter().filter(|bucket| bucket.id != 0) {
            let mut at = Self::home(bucket.id, count);
            while self.buckets[at].id != 0 {
                at = (at + 1) & mask;
            }
            self.buckets[at] = bucket;
        }
    }
}

impl Client {
    /// Matches an answer to its pending request by id, op and key, and ends
    /// or advances the request's operation. `Err` closes the connection.
    pub(crate) fn on_answer(&mut self, answer: RawAnswer<'_>) -> Result<(), CloseReason> {
        self.on_answer_found(&answer, None)
    }

    /// [`on_answer`](Client::on_answer), with where the answer's id may be
    /// in the pending table (checked before it is used).
    #[inline]
    pub(crate) fn on_answer_found(
        &mut self,
        answer: &RawAnswer<'_>,
        hint: Option<Found>,
    ) -> Result<(), CloseReason> {
        let id = answer.id;
        // SABOTAGE (feature `sim` only): match by arrival order, taking the
        // oldest pending request of the answer's op and key instead of the
        // one its id names.
        #[cfg(feature = "sim")]
        let id = if self.config.sabotage == super::Sabotage::MatchByArrival {
            self.oldest_pending(answer.op(), answer.key).unwrap_or(id)
        } else {
            id
        };
        let found = match hint {
            Some(found) if self.pending.holds(found, id) => Some(found),
            _ => self.pending.find(id),
        };
        let Some(found) = found else {
            // Never sent, or already answered: a second answer to one id.
            self.stray_answer(*answer);
            return Err(CloseReason::Protocol(Violation::UnknownId { id }));
        };
        let idx = self.pending.slot(found);
        // The usual answers first: a grant of an acquire in flight, and a
        // release of the embedder's released, each matched in full. What
        // they do is what the general path below does with them.
        let (entry, gen) = self
            .table
            .get_with_gen_mut(idx)
            .expect("pending entries are requests");
        match (entry, answer.kind) {
            (Entry::Acquire(a), AnswerKind::Granted { token, lease_ms })
                if a.phase == AcquirePhase::Sent
                    && lease_ms <= a.lease_ms
                    && a.key.is(answer.key) =>
            {
                let sent_at = a.sent_at;
                self.pending.remove_found(found);
                self.acquires_in_flight -= 1;
                self.grant(idx, gen, token, lease_ms, sent_at);
                return Ok(());
            }
            (Entry::Release(r), AnswerKind::Released) if !r.orphan && r.key.is(answer.key) => {
                debug_assert_eq!(r.phase, ReleasePhase::Sent);
                self.pending.remove_found(found);
                self.events.push_back(Event::Outcome {
                    op: OpId::new(idx, gen),
                    outcome: Outcome::Released,
                });
                self.open_releases -= 1;
                self.free(idx);
                return Ok(());
            }
            _ => {}
        }
        let (op, key_matches, asked_lease) = match self.table.get(idx) {
            Some(Entry::Acquire(a)) => (Op::Acquire, a.key.is(answer.key), a.lease_ms),
            Some(Entry::Release(r)) => (Op::Release, r.key.is(answer.key), NonZeroU64::MAX),
            Some(Entry::Held(_)) | None => unreachable!("pending entries are requests"),
        };
        if op != answer.op() || !key_matches {
            // The matched operation stays pending: the close treats it as
            // sent and unanswered.
            self.stray_answer(*answer);
            return Err(CloseReason::Protocol(Violation::Mismatch { id }));
        }
        if let AnswerKind::Granted { lease_ms, .. } = answer.kind {
            if lease_ms > asked_lease {
                self.stray_answer(*answer);
                return Err(CloseReason::Protocol(Violation::LeaseAboveAsked { id }));
            }
        }
        self.pending.remove_found(found);
        // The answer timer is not disarmed here: every path below re-arms
        // it (a grant's lease, a `B` backoff) or frees the slot, which
        // disarms it; re-arming in place costs one sift instead of two.
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
                if let Some(key) = self.free(idx) {
                    self.queue_orphan_release(key, token, until);
                }
            }
            (AcquirePhase::Abandoned, _) => {
                self.free(idx);
            }
            (_, AnswerKind::Granted { token, lease_ms }) => {
                let gen = self.table.gen(idx).expect("occupied");
                self.grant(idx, gen, token, lease_ms, sent_at);
            }
            (_, AnswerKind::TimedOut) => {
                self.emit_outcome(idx, Outcome::TimedOut { sent: true });
                self.retire(idx);
            }
            (_, AnswerKind::Busy) => {
                // Refused before it was queued: trying again is safe, with a
                // new id, while the budget still fits an attempt.
                let retry_at =
                    match self.config.busy {
                        BusyPolicy::Retry => Some(self.backoff_until(
                            BackoffCause::Busy,
                            u32::from(attempts.saturating_sub(1)),
                        )),
                        BusyPolicy::FailFast => None,
                    };
                match retry_at {
                    Some(at) if fits_an_attempt(at, budget_end) => {
                        if let Some(Entry::Acquire(a)) = self.table.get_mut(idx) {
                            a.phase = AcquirePhase::Backoff;
                        }
                        self.table.set_timer(idx, at, LANE_OTHER);
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

    /// An acquire in flight in `idx`, of generation `gen`, sent at
    /// `sent_at`, is granted: the embedder holds the grant from now on.
    #[inline(never)]
    fn grant(&mut self, idx: u32, gen: u32, token: u64, lease_ms: NonZeroU64, sent_at: Time) {
        let expires_by = self.expires_by(lease_ms);
        let op = OpId::new(idx, gen);
        // The acquire's id dies here; the grant's handle is the slot's next
        // generation.
        let handle = OpId::new(idx, self.table.bump(idx));
        self.open_acquires -= 1;
        let mut taken = None;
        self.table.replace_with(idx, |entry| {
            let Entry::Acquire(acquire) = entry else {
                unreachable!("matched as an acquire");
            };
            let key = acquire.key.clone();
            taken = Some((key, acquire.owner));
            Entry::Held(Held {
                key: acquire.key,
                token,
            })
        });
        let (key, owner) = taken.expect("set above");
        self.owners.release(owner);
        self.table.set_timer(idx, expires_by, LANE_HELD);
        self.events.push_back(Event::Outcome {
            op,
            outcome: Outcome::Granted(Grant {
                key,
                token,
                lease: millis(lease_ms.get()),
                valid_until: sent_at.saturating_add_millis(lease_ms.get()),
                expires_by,
                handle,
            }),
        });
    }

    /// The oldest pending request of `op` on `key` (for a sabotage switch).
    #[cfg(feature = "sim")]
    fn oldest_pending(&self, op: Op, key: &[u8]) -> Option<u64> {
        self.pending
            .iter()
            .filter(|&(_, idx)| match self.table.get(idx) {
                Some(Entry::Acquire(a)) => op == Op::Acquire && a.key.is(key),
                Some(Entry::Release(r)) => op == Op::Release && r.key.is(key),
                _ => false,
            })
            .map(|(id, _)| id)
            .min()
    }

    /// By when the server has certainly freed a grant of `lease_ms` that was
    /// answered now.
    pub(crate) fn expires_by(&self, lease_ms: NonZeroU64) -> Time {
        self.now
            .saturating_add_millis(lease_ms.get())
            .saturating_add_nanos(self.settle_margin_ns)
    }

    /// An answer no pending request claims. If it is a `G` for a grant the
    /// embedder was not given, release that grant by its exact token: a
    /// grant the embedder holds is never released behind its back.
    pub(crate) fn stray_answer(&mut self, answer: RawAnswer<'_>) {
        if let AnswerKind::Granted { token, lease_ms } = answer.kind {
            if self.is_known_grant(answer.key, token) {
                return;
            }
            let until = self.expires_by(lease_ms);
            self.queue_orphan_release(Key::from_atom_bytes(answer.key), token, until);
        }
    }

    /// Whether the embedder holds `(key, token)`, or a release of it is
    /// already under way. A scan: this only runs when the server has broken
    /// the protocol, at most once per connection.
    fn is_known_grant(&self, key: &[u8], token: u64) -> bool {
        self.table.indices().any(|idx| match self.table.get(idx) {
            Some(Entry::Held(h)) => h.token == token && h.key.is(key),
            Some(Entry::Release(r)) => r.token == token && r.key.is(key),
            _ => false,
        })
    }

    /// Puts an exact-token release of a grant nobody can take into the lane.
    pub(crate) fn queue_orphan_release(&mut self, key: Key, token: u64, until: Time) {
        // SABOTAGE (feature `sim` only): drop the release of an orphaned
        // grant instead of queueing it.
        #[cfg(feature = "sim")]
        if self.config.sabotage == super::Sabotage::DropOrphanRelease {
            return;
        }
        if self.now >= until {
            // The lease has run out: the server freed it already.
            return;
        }
        self.events.push_back(Event::OrphanRelease {
            key: key.clone(),
            token,
        });
        let (idx, _) = self
            .table
            .insert(Entry::Release(Release::queued(key, token, until, true)));
        self.enqueue_release(idx, true);
    }
}

/// Whether an attempt starting at `at` still has at least a millisecond of
/// the budget to wait with.
fn fits_an_attempt(at: Time, budget_end: Time) -> bool {
    budget_end.saturating_duration_since(at) >= millis(1)
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::Entry;
    use std::collections::HashMap;

    use super::PendingTable;
    use crate::rng::Rng;

    #[test]
    fn the_pending_table_behaves_like_a_map() {
        let mut rng = Rng::new(11);
        let mut table = PendingTable::default();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut pending: Vec<u64> = Vec::new();
        let mut next = 1u64;
        for step in 0..200_000u32 {
            // Mostly new ids in sequence, some far apart (the same bucket of
            // a small ring, pushing each other out to the far table),
            // some id 0 or near u64::MAX, and removals of random ids.
            let id = match rng.up_to(10) {
                0..=3 => {
                    next += 1;
                    Some(next)
                }
                4 => Some(next + 1024 * rng.up_to(8)),
                5 if rng.chance(1, 2) => Some(0),
                5 => Some(u64::MAX - rng.up_to(3)),
                _ => None,
            };
            if let Some(id) = id {
                // Only ids not pending are registered.
                match model.entry(id) {
                    Entry::Occupied(entry) => assert_eq!(table.get(&id), Some(*entry.get())),
                    Entry::Vacant(entry) => {
                        entry.insert(step);
                        pending.push(id);
                        table.insert(id, step);
                    }
                }
            } else {
                let id = if !pending.is_empty() && rng.chance(7, 8) {
                    pending.swap_remove(rng.up_to(pending.len() as u64 - 1) as usize)
                } else {
                    next + rng.up_to(5000)
                };
                assert_eq!(table.get(&id), model.get(&id).copied());
                assert_eq!(table.remove(&id), model.remove(&id));
                assert_eq!(table.get(&id), None);
            }
            assert_eq!(table.len(), model.len());
            if step % 20_000 == 0 {
                for (id, slot) in &model {
                    assert_eq!(table.get(id), Some(*slot));
                }
            }
        }
        let mut drained: Vec<(u64, u32)> = table.drain().collect();
        let mut expected: Vec<(u64, u32)> = model.into_iter().collect();
        drained.sort_unstable();
        expected.sort_unstable();
        assert_eq!(drained, expected);
        assert!(table.is_empty());
        assert_eq!(table.get(&1), None);
        table.insert(5, 1);
        assert_eq!(table.get(&5), Some(1));
    }
}
