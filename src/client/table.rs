//! Storage of the client's entries (operations, abandoned waiters, held
//! grants) with one timer each.
//!
//! A slab of slots, addressed by index and guarded by a generation so that a
//! stale [`OpId`](super::OpId) never reaches a reused slot, plus an indexed
//! binary min-heap of the slots whose timer is armed. Each slot knows its
//! place in the heap, so arming, re-arming and disarming a timer are
//! `O(log n)` and the earliest deadline is always exact: `poll_timeout`
//! never wakes the driver for nothing.
//!
//! Slots live in fixed-size chunks, so growing never moves an entry and
//! never reserves twice the memory in use. Free slots form a list threaded
//! through their unused heap position. Nothing here allocates once the
//! table has grown to its working size.

use crate::time::Time;

const CHUNK: usize = 256;
const NONE: u32 = u32::MAX;

struct Slot<E> {
    /// Bumped every time the slot is freed or its entry changes hands.
    gen: u32,
    /// Place in the heap while the timer is armed; next free slot while the
    /// slot is free; `NONE` otherwise.
    link: u32,
    deadline: Time,
    entry: Option<E>,
}

/// A slab of `E` with one timer per slot.
pub(crate) struct Table<E> {
    chunks: Vec<Vec<Slot<E>>>,
    free: u32,
    live: usize,
    heap: Vec<u32>,
}

impl<E> Table<E> {
    pub(crate) fn new() -> Table<E> {
        Table {
            chunks: Vec::new(),
            free: NONE,
            live: 0,
            heap: Vec::new(),
        }
    }

    fn slot(&self, idx: u32) -> &Slot<E> {
        &self.chunks[idx as usize / CHUNK][idx as usize % CHUNK]
    }

    fn slot_mut(&mut self, idx: u32) -> &mut Slot<E> {
        &mut self.chunks[idx as usize / CHUNK][idx as usize % CHUNK]
    }

    /// Stores `entry`, returning its slot and generation.
    pub(crate) fn insert(&mut self, entry: E) -> (u32, u32) {
        self.live += 1;
        if self.free != NONE {
            let idx = self.free;
            let slot = self.slot_mut(idx);
            let next = slot.link;
            slot.link = NONE;
            slot.entry = Some(entry);
            let gen = slot.gen;
            self.free = next;
            return (idx, gen);
        }
        let count = self.chunks.last().map_or(CHUNK, Vec::len);
        if count == CHUNK {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let chunk_index = self.chunks.len() - 1;
        let chunk = &mut self.chunks[chunk_index];
        chunk.push(Slot {
            gen: 0,
            link: NONE,
            deadline: Time::MAX,
            entry: Some(entry),
        });
        ((chunk_index * CHUNK + chunk.len() - 1) as u32, 0)
    }

    /// The slot's generation, if `idx` is an occupied slot.
    pub(crate) fn gen(&self, idx: u32) -> Option<u32> {
        let slot = self
            .chunks
            .get(idx as usize / CHUNK)?
            .get(idx as usize % CHUNK)?;
        slot.entry.as_ref().map(|_| slot.gen)
    }

    /// The entry in `idx`, if occupied.
    pub(crate) fn get(&self, idx: u32) -> Option<&E> {
        self.chunks
            .get(idx as usize / CHUNK)?
            .get(idx as usize % CHUNK)?
            .entry
            .as_ref()
    }

    /// The entry in `idx`, if occupied.
    pub(crate) fn get_mut(&mut self, idx: u32) -> Option<&mut E> {
        self.chunks
            .get_mut(idx as usize / CHUNK)?
            .get_mut(idx as usize % CHUNK)?
            .entry
            .as_mut()
    }

    /// The entry in `idx` if its generation is `gen`.
    pub(crate) fn get_checked(&self, idx: u32, gen: u32) -> Option<&E> {
        (self.gen(idx)? == gen).then(|| self.get(idx)).flatten()
    }

    /// Marks the entry as having changed hands: handles to the old
    /// generation stop reaching it. Returns the new generation.
    pub(crate) fn bump(&mut self, idx: u32) -> u32 {
        let slot = self.slot_mut(idx);
        slot.gen = slot.gen.wrapping_add(1);
        slot.gen
    }

    /// Empties the slot, disarming its timer, and returns its entry.
    pub(crate) fn remove(&mut self, idx: u32) -> Option<E> {
        self.set_timer(idx, None);
        let free = self.free;
        let slot = self.slot_mut(idx);
        let entry = slot.entry.take()?;
        slot.gen = slot.gen.wrapping_add(1);
        slot.link = free;
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
                .filter(|(_, s)| s.entry.is_some())
                .map(move |(i, _)| (c * CHUNK + i) as u32)
        })
    }

    /// The slot's armed deadline.
    #[cfg(test)]
    pub(crate) fn timer(&self, idx: u32) -> Option<Time> {
        let slot = self.slot(idx);
        (slot.entry.is_some() && slot.link != NONE).then_some(slot.deadline)
    }

    /// Arms (or re-arms) the slot's timer at `deadline`, or disarms it.
    pub(crate) fn set_timer(&mut self, idx: u32, deadline: Option<Time>) {
        let slot = self.slot(idx);
        let armed = slot.entry.is_some() && slot.link != NONE;
        match (armed, deadline) {
            (false, None) => {}
            (false, Some(at)) => {
                let pos = self.heap.len() as u32;
                let slot = self.slot_mut(idx);
                slot.deadline = at;
                slot.link = pos;
                self.heap.push(idx);
                self.sift_up(pos as usize);
            }
            (true, Some(at)) => {
                let pos = slot.link as usize;
                self.slot_mut(idx).deadline = at;
                self.sift_up(pos);
                let pos = self.slot(idx).link as usize;
                self.sift_down(pos);
            }
            (true, None) => {
                let pos = slot.link as usize;
                let last = self.heap.len() - 1;
                self.heap.swap(pos, last);
                self.heap.pop();
                let slot = self.slot_mut(idx);
                slot.link = NONE;
                slot.deadline = Time::MAX;
                if pos < self.heap.len() {
                    let moved = self.heap[pos];
                    self.slot_mut(moved).link = pos as u32;
                    self.sift_up(pos);
                    let pos = self.slot(moved).link as usize;
                    self.sift_down(pos);
                }
            }
        }
    }

    /// The earliest armed deadline.
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        self.heap.first().map(|&idx| self.slot(idx).deadline)
    }

    /// The slot with the earliest deadline, if that deadline is at or before
    /// `now`; its timer is disarmed.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<u32> {
        let idx = *self.heap.first()?;
        if self.slot(idx).deadline > now {
            return None;
        }
        self.set_timer(idx, None);
        Some(idx)
    }

    fn key(&self, pos: usize) -> (Time, u32) {
        let idx = self.heap[pos];
        (self.slot(idx).deadline, idx)
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        let (ia, ib) = (self.heap[a], self.heap[b]);
        self.slot_mut(ia).link = a as u32;
        self.slot_mut(ib).link = b as u32;
    }

    fn sift_up(&mut self, mut pos: usize) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.key(pos) >= self.key(parent) {
                break;
            }
            self.swap(pos, parent);
            pos = parent;
        }
    }

    fn sift_down(&mut self, mut pos: usize) {
        loop {
            let left = 2 * pos + 1;
            if left >= self.heap.len() {
                break;
            }
            let right = left + 1;
            let child = if right < self.heap.len() && self.key(right) < self.key(left) {
                right
            } else {
                left
            };
            if self.key(child) >= self.key(pos) {
                break;
            }
            self.swap(pos, child);
            pos = child;
        }
    }

    #[cfg(test)]
    fn check_heap(&self) {
        for (pos, &idx) in self.heap.iter().enumerate() {
            assert_eq!(self.slot(idx).link as usize, pos);
            if pos > 0 {
                assert!(self.key((pos - 1) / 2) <= self.key(pos));
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
