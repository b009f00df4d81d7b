//! Storage of the client's entries (operations, abandoned waiters, held
//! grants) with one timer each.
//!
//! A slab of slots, addressed by index and guarded by a generation so that a
//! stale [`OpId`](super::OpId) never reaches a reused slot, plus an indexed
//! min-heap of the slots whose timer is armed. Each slot knows its
//! place in the heap, so arming, re-arming and disarming a timer are
//! `O(log n)` and the earliest deadline is always exact: `poll_timeout`
//! never wakes the driver for nothing.
//!
//! Slots live in fixed-size chunks, so growing never moves an entry and
//! never reserves twice the memory in use. A slot's generation and heap
//! position live apart from its entry, in a dense array: sifting the heap
//! writes positions there (8 bytes a slot) instead of touching the cache
//! lines of every entry it moves. Free slots form a list threaded through
//! their unused heap position. Nothing here allocates once the table has
//! grown to its working size.
//!
//! The heap is 4-ary (half the depth of a binary heap) and keeps each
//! deadline beside its slot number in two parallel arrays, so sifting reads
//! only the heap, never the slots; it moves entries into a hole instead of
//! swapping, writing each moved slot's position once. Entries are ordered
//! by `(deadline, slot)`, a total order, so the firing order does not depend
//! on the heap's shape.

use crate::time::Time;

const CHUNK: usize = 256;
const NONE: u32 = u32::MAX;
/// Children per heap node.
const ARITY: usize = 4;

/// Whether `(a, ia)` comes before `(b, ib)`.
#[inline(always)]
fn before(a: Time, ia: u32, b: Time, ib: u32) -> bool {
    a < b || (a == b && ia < ib)
}

/// What the table keeps of a slot besides its entry.
#[derive(Clone, Copy)]
struct Meta {
    /// Bumped every time the slot is freed or its entry changes hands.
    gen: u32,
    /// Place in the heap while the timer is armed; next free slot while the
    /// slot is free; `NONE` otherwise.
    link: u32,
}

/// A slab of `E` with one timer per slot.
pub(crate) struct Table<E> {
    /// The entries, in chunks of `CHUNK`.
    chunks: Vec<Vec<Option<E>>>,
    /// Per slot, beside the entries.
    meta: Vec<Meta>,
    free: u32,
    live: usize,
    /// The heap of armed timers: deadlines, and the slot of each.
    deadlines: Vec<Time>,
    owners: Vec<u32>,
}

impl<E> Table<E> {
    pub(crate) fn new() -> Table<E> {
        Table {
            chunks: Vec::new(),
            meta: Vec::new(),
            free: NONE,
            live: 0,
            deadlines: Vec::new(),
            owners: Vec::new(),
        }
    }

    fn entry(&self, idx: u32) -> &Option<E> {
        &self.chunks[idx as usize / CHUNK][idx as usize % CHUNK]
    }

    fn entry_mut(&mut self, idx: u32) -> &mut Option<E> {
        &mut self.chunks[idx as usize / CHUNK][idx as usize % CHUNK]
    }

    /// Stores `entry`, returning its slot and generation.
    pub(crate) fn insert(&mut self, entry: E) -> (u32, u32) {
        self.live += 1;
        if self.free != NONE {
            let idx = self.free;
            self.free = core::mem::replace(&mut self.meta[idx as usize].link, NONE);
            *self.entry_mut(idx) = Some(entry);
            return (idx, self.meta[idx as usize].gen);
        }
        let count = self.chunks.last().map_or(CHUNK, Vec::len);
        if count == CHUNK {
            self.chunks.push(Vec::with_capacity(CHUNK));
            // Grow by an eighth at least: amortised O(1), at most an eighth
            // unused.
            let more = CHUNK.max(self.meta.len() / 8);
            if self.meta.capacity() - self.meta.len() < CHUNK {
                self.meta.reserve_exact(more);
            }
        }
        let chunk_index = self.chunks.len() - 1;
        let chunk = &mut self.chunks[chunk_index];
        chunk.push(Some(entry));
        self.meta.push(Meta { gen: 0, link: NONE });
        ((chunk_index * CHUNK + chunk.len() - 1) as u32, 0)
    }

    /// The slot's generation, if `idx` is an occupied slot.
    pub(crate) fn gen(&self, idx: u32) -> Option<u32> {
        self.get(idx).map(|_| self.meta[idx as usize].gen)
    }

    /// The entry in `idx`, if occupied.
    pub(crate) fn get(&self, idx: u32) -> Option<&E> {
        self.chunks
            .get(idx as usize / CHUNK)?
            .get(idx as usize % CHUNK)?
            .as_ref()
    }

    /// The entry in `idx`, if occupied.
    pub(crate) fn get_mut(&mut self, idx: u32) -> Option<&mut E> {
        self.chunks
            .get_mut(idx as usize / CHUNK)?
            .get_mut(idx as usize % CHUNK)?
            .as_mut()
    }

    /// The entry in `idx` if its generation is `gen`.
    pub(crate) fn get_checked(&self, idx: u32, gen: u32) -> Option<&E> {
        (self.gen(idx)? == gen).then(|| self.get(idx)).flatten()
    }

    /// Marks the entry as having changed hands: handles to the old
    /// generation stop reaching it. Returns the new generation.
    pub(crate) fn bump(&mut self, idx: u32) -> u32 {
        let gen = &mut self.meta[idx as usize].gen;
        *gen = gen.wrapping_add(1);
        *gen
    }

    /// Empties the slot, disarming its timer, and returns its entry.
    pub(crate) fn remove(&mut self, idx: u32) -> Option<E> {
        self.set_timer(idx, None);
        let entry = self.entry_mut(idx).take()?;
        let gen = &mut self.meta[idx as usize].gen;
        *gen = gen.wrapping_add(1);
        self.meta[idx as usize].link = self.free;
        self.free = idx;
        self.live -= 1;
        Some(entry)
    }

    /// How many slots are occupied.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Every occupied slot, in index order.
    pub(crate) fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.chunks.iter().enumerate().flat_map(|(c, chunk)| {
            chunk
                .iter()
                .enumerate()
                .filter(|(_, entry)| entry.is_some())
                .map(move |(i, _)| (c * CHUNK + i) as u32)
        })
    }

    /// The slot's armed deadline.
    #[cfg(test)]
    pub(crate) fn timer(&self, idx: u32) -> Option<Time> {
        let link = self.meta[idx as usize].link;
        (self.entry(idx).is_some() && link != NONE).then(|| self.deadlines[link as usize])
    }

    /// Arms (or re-arms) the slot's timer at `deadline`, or disarms it.
    pub(crate) fn set_timer(&mut self, idx: u32, deadline: Option<Time>) {
        let link = self.meta[idx as usize].link;
        let armed = link != NONE && self.entry(idx).is_some();
        let pos = link as usize;
        match (armed, deadline) {
            (false, None) => {}
            (false, Some(at)) => {
                let pos = self.deadlines.len();
                self.deadlines.push(at);
                self.owners.push(idx);
                self.sift_up(pos, at, idx);
            }
            (true, Some(at)) => {
                let old = self.deadlines[pos];
                if at < old {
                    self.sift_up(pos, at, idx);
                } else if at > old {
                    self.sift_down(pos, at, idx);
                }
            }
            (true, None) => {
                self.meta[idx as usize].link = NONE;
                let last_at = self.deadlines.pop().expect("armed");
                let last_idx = self.owners.pop().expect("armed");
                if pos < self.deadlines.len() {
                    // The last entry fills the hole, up or down from it.
                    if pos > 0 {
                        let parent = (pos - 1) / ARITY;
                        if before(
                            last_at,
                            last_idx,
                            self.deadlines[parent],
                            self.owners[parent],
                        ) {
                            self.sift_up(pos, last_at, last_idx);
                            return;
                        }
                    }
                    self.sift_down(pos, last_at, last_idx);
                }
            }
        }
    }

    /// The earliest armed deadline.
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        self.deadlines.first().copied()
    }

    /// The slot with the earliest deadline, if that deadline is at or before
    /// `now`; its timer is disarmed.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<u32> {
        if *self.deadlines.first()? > now {
            return None;
        }
        let idx = self.owners[0];
        self.set_timer(idx, None);
        Some(idx)
    }

    /// Puts `(at, idx)` at heap position `pos`.
    #[inline(always)]
    fn place(&mut self, pos: usize, at: Time, idx: u32) {
        self.deadlines[pos] = at;
        self.owners[pos] = idx;
        self.meta[idx as usize].link = pos as u32;
    }

    /// Moves `(at, idx)`, whose place is the hole at `pos`, up to where it
    /// belongs.
    fn sift_up(&mut self, mut pos: usize, at: Time, idx: u32) {
        while pos > 0 {
            let parent = (pos - 1) / ARITY;
            let (parent_at, parent_idx) = (self.deadlines[parent], self.owners[parent]);
            if !before(at, idx, parent_at, parent_idx) {
                break;
            }
            self.place(pos, parent_at, parent_idx);
            pos = parent;
        }
        self.place(pos, at, idx);
    }

    /// Moves `(at, idx)`, whose place is the hole at `pos`, down to where it
    /// belongs.
    fn sift_down(&mut self, mut pos: usize, at: Time, idx: u32) {
        let len = self.deadlines.len();
        loop {
            let first = ARITY * pos + 1;
            if first >= len {
                break;
            }
            let end = (first + ARITY).min(len);
            let mut best = first;
            let mut best_at = self.deadlines[first];
            for child in first + 1..end {
                let child_at = self.deadlines[child];
                if child_at < best_at
                    || (child_at == best_at && self.owners[child] < self.owners[best])
                {
                    best = child;
                    best_at = child_at;
                }
            }
            let best_idx = self.owners[best];
            if !before(best_at, best_idx, at, idx) {
                break;
            }
            self.place(pos, best_at, best_idx);
            pos = best;
        }
        self.place(pos, at, idx);
    }

    #[cfg(test)]
    fn check_heap(&self) {
        assert_eq!(self.deadlines.len(), self.owners.len());
        for (pos, &idx) in self.owners.iter().enumerate() {
            assert_eq!(self.meta[idx as usize].link as usize, pos);
            if pos > 0 {
                let parent = (pos - 1) / ARITY;
                assert!(before(
                    self.deadlines[parent],
                    self.owners[parent],
                    self.deadlines[pos],
                    idx
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn generations_guard_reused_slots() {
        let mut t = Table::new();
        let (a, ga) = t.insert("a");
        assert_eq!(t.get_checked(a, ga), Some(&"a"));
        assert_eq!(t.remove(a), Some("a"));
        let (b, gb) = t.insert("b");
        assert_eq!(a, b, "the freed slot is reused");
        assert_ne!(ga, gb);
        assert_eq!(t.get_checked(a, ga), None);
        assert_eq!(t.get_checked(b, gb), Some(&"b"));
        let gc = t.bump(b);
        assert_eq!(t.get_checked(b, gb), None);
        assert_eq!(t.get_checked(b, gc), Some(&"b"));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn timers_fire_in_deadline_order_through_random_rearming() {
        let mut rng = Rng::new(99);
        let mut t = Table::new();
        let mut model: Vec<Option<Time>> = Vec::new();
        for _ in 0..1000 {
            let (idx, _) = t.insert(());
            model.push(None);
            assert_eq!(idx as usize, model.len() - 1);
        }
        for _ in 0..20_000 {
            let idx = rng.up_to(999) as u32;
            let deadline = if rng.chance(1, 4) {
                None
            } else {
                Some(Time::from_nanos(rng.up_to(10_000)))
            };
            t.set_timer(idx, deadline);
            model[idx as usize] = deadline;
            assert_eq!(t.timer(idx), deadline);
        }
        t.check_heap();
        assert_eq!(t.next_deadline(), model.iter().flatten().min().copied());
        let mut last = Time::ZERO;
        let mut fired = 0;
        while let Some(idx) = t.pop_due(Time::from_nanos(5_000)) {
            let at = model[idx as usize].take().unwrap();
            assert!(at >= last && at <= Time::from_nanos(5_000));
            last = at;
            fired += 1;
        }
        assert!(fired > 0);
        assert!(model
            .iter()
            .flatten()
            .all(|&at| at > Time::from_nanos(5_000)));
        t.check_heap();
        for idx in 0..1000 {
            t.remove(idx);
        }
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.len(), 0);
    }
}
