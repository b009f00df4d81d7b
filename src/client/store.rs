//! Where the client core keeps what it knows: slabs of entries with one
//! timer each, the queues of entries waiting to be sent, and the requests
//! in flight by id.
//!
//! This is the only module of `client/` that knows how anything is stored;
//! the rules see four small interfaces:
//!
//! * [`Slab`]: `insert`, `get`, `remove`, and per entry one timer,
//!   `set_timer(entry, at)`, with `next_deadline`, `due_by` and `pop_due`;
//! * [`Handle`]: an entry's name in its slab for as long as it is stored;
//! * [`Fifo`]: a queue of handles, whose entries may leave it early;
//! * [`Pending`]: the requests in flight, by request id.
//!
//! Nothing here allocates once the containers have grown to their working
//! size, and containers that a burst made large give most of their memory
//! back once drained. Each is checked against a plain model in the tests
//! at the end of this file.
//!
//! # Timers
//!
//! Most deadlines are "now plus a duration that is the same for every
//! entry of its kind" (an answer's grace, a lease), so the timers of one
//! kind, armed one after another, come in deadline order. A slab keeps a
//! few *lanes* of timers, each a list in deadline order threaded through
//! the slots themselves: a new timer joins the lane whose last deadline is
//! the latest not after its own, and only a timer that fits no lane goes
//! into a binary heap, whose entries know their index. The kinds sort
//! themselves into lanes; nobody tells the slab which is which.
//!
//! A timer is placed in a lane or the heap only some time after it is
//! armed: until then it is listed as *deferred*, and one that is set again
//! or disarmed meanwhile (an acquire sent right after it was queued, a
//! grant released soon after it came) is only ever placed once, or never.
//! The deferred ones are placed once time moves on ([`Slab::due_by`] is
//! told the time), when one of them is due, or when they are many; the
//! earliest of them is found by looking at them, once, and kept until it
//! changes, so `next_deadline` stays exact.
//!
//! So arming a timer that fits a lane is an append, and disarming one
//! (answers come in any order) touches its slot and its two neighbours:
//! no timer is left behind dead, nothing is swept or compacted, and with
//! thousands of requests in flight the memory an answer touches is what
//! the answer is about. A lane's first timer is its earliest, so the
//! earliest deadline, the least of the lanes' first ones and the heap's
//! top, is exact. Timers due at one moment fire in slot order, whatever
//! lanes they are in.
//!
//! A slot keeps its entry, generation and timer side by side, in one place
//! in memory.

use core::hint::black_box;
use std::cell::Cell;
use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::outcome::{OpId, OpKind};
use crate::names::Key;
use crate::time::Time;
use crate::wire::{Digits, LineBuf};

/// What a queue keeps of its capacity once a burst has drained from it:
/// more than steady traffic needs between two polls.
const KEPT_WHEN_EMPTY: usize = 4096;

/// Once `queue` is empty: starts it again at the front of its memory (the
/// part used last, so most likely still in the cache) instead of going on
/// round all of it, and gives back most of what a burst made it grow to.
pub(crate) fn give_back<T>(queue: &mut VecDeque<T>) {
    if queue.is_empty() {
        // Clearing also puts the front back at the start.
        queue.clear();
        if queue.capacity() > KEPT_WHEN_EMPTY {
            queue.shrink_to(KEPT_WHEN_EMPTY);
        }
    }
}

/// An entry with a key: what storage reads ahead of handling it (see
/// [`Pending::read_ahead`]).
pub(crate) trait Keyed {
    fn key(&self) -> &Key;
}

/// How many answers storage reads ahead of those handled: enough that
/// their reads wait for memory together.
const AHEAD: usize = 16;

/// Names an entry of a [`Slab`] for as long as it is stored: its slot, and
/// the slot's generation, so that the handle of an entry that is gone
/// never reaches the entry that took its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Handle {
    slot: u32,
    gen: u32,
}

impl Handle {
    /// The handle with these parts (those of [`Handle::slot`] and
    /// [`Handle::gen`]).
    pub(crate) const fn from_parts(slot: u32, gen: u32) -> Handle {
        Handle { slot, gen }
    }

    /// The slot.
    pub(crate) const fn slot(self) -> u32 {
        self.slot
    }

    /// The slot's generation when the entry was stored.
    pub(crate) const fn gen(self) -> u32 {
        self.gen
    }
}

/// How many lanes a slab's timers have.
const LANES: usize = 4;

/// No slot: the end of a lane.
const NIL: u32 = u32::MAX;

/// How many timers may wait to be placed: past this many they are placed
/// at once, so that finding the earliest of them stays cheap.
const DEFERRED_MAX: usize = if cfg!(test) { 64 } else { 4096 };

/// Where a slot's timer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// No timer is armed.
    Nowhere,
    /// Armed, not yet in a lane or the heap: listed in `deferred`.
    Deferred,
    /// In this lane, between the slots `prev` and `next` of its slot.
    Lane(u8),
    /// In the heap, at index `prev` of its slot.
    Heap,
}

/// One slot: its entry, its generation, and its timer, side by side, so
/// that an entry and all that is known of it are in one place in memory.
struct Slot<T> {
    value: Option<T>,
    /// Bumped whenever the slot is emptied.
    gen: u32,
    place: Place,
    /// In a lane, the slot before this one ([`NIL`] for the first); in
    /// the heap, this timer's index there.
    prev: u32,
    /// In a lane, the slot after this one ([`NIL`] for the last).
    next: u32,
    /// The timer's deadline, while armed.
    at: Time,
}

/// A lane: timers in the order of their deadlines, a list through their
/// slots from `first` to `last`, whose deadlines it keeps at hand (an
/// empty lane's `last_at` is [`Time::ZERO`]).
#[derive(Debug, Clone, Copy)]
struct Lane {
    first: u32,
    last: u32,
    first_at: Time,
    last_at: Time,
}

impl Lane {
    const EMPTY: Lane = Lane {
        first: NIL,
        last: NIL,
        first_at: Time::ZERO,
        last_at: Time::ZERO,
    };
}

/// Entries of type `T`, each with one timer.
pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
    lanes: [Lane; LANES],
    /// The timers that fit no lane: a binary heap by `(deadline, slot)`.
    heap: Vec<(Time, u32)>,
    /// The earliest deadline in the lanes and the heap.
    earliest: Option<Time>,
    /// The slots whose timer was armed without being placed yet, and some
    /// whose timer was placed or disarmed since (their place tells).
    deferred: Vec<u32>,
    /// How many timers are deferred.
    deferred_live: usize,
    /// The earliest deferred deadline, once known (`None`: not known).
    deferred_min: Cell<Option<Time>>,
    /// No deferred deadline is earlier than this one (while any is).
    deferred_floor: Time,
    /// The latest time [`Slab::due_by`] was asked about.
    clock: Time,
}

impl<T> Default for Slab<T> {
    fn default() -> Slab<T> {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            lanes: [Lane::EMPTY; LANES],
            heap: Vec::new(),
            earliest: None,
            deferred: Vec::new(),
            deferred_live: 0,
            deferred_min: Cell::new(None),
            deferred_floor: Time::MAX,
            clock: Time::ZERO,
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value`, with no timer.
    pub(crate) fn insert(&mut self, value: T) -> Handle {
        self.len += 1;
        if let Some(slot) = self.free.pop() {
            let entry = &mut self.slots[slot as usize];
            entry.value = Some(value);
            return Handle {
                slot,
                gen: entry.gen,
            };
        }
        if self.slots.len() == self.slots.capacity() {
            // An eighth more at a time: never much more memory than in use.
            self.slots.reserve_exact(self.slots.len() / 8 + 16);
        }
        let slot = u32::try_from(self.slots.len())
            .ok()
            .filter(|&slot| slot != NIL)
            .expect("fewer than 2^32 - 1 entries");
        self.slots.push(Slot {
            value: Some(value),
            gen: 0,
            place: Place::Nowhere,
            prev: NIL,
            next: NIL,
            at: Time::ZERO,
        });
        Handle { slot, gen: 0 }
    }

    /// The slot `handle` names, while its entry is stored.
    #[inline]
    fn slot(&self, handle: Handle) -> Option<&Slot<T>> {
        let slot = self.slots.get(handle.slot as usize)?;
        (slot.gen == handle.gen && slot.value.is_some()).then_some(slot)
    }

    /// Whether `handle`'s entry is stored.
    pub(crate) fn contains(&self, handle: Handle) -> bool {
        self.slot(handle).is_some()
    }

    /// The entry, if stored.
    pub(crate) fn get(&self, handle: Handle) -> Option<&T> {
        self.slot(handle)?.value.as_ref()
    }

    /// The entry, if stored.
    pub(crate) fn get_mut(&mut self, handle: Handle) -> Option<&mut T> {
        let slot = self.slots.get_mut(handle.slot as usize)?;
        if slot.gen != handle.gen {
            return None;
        }
        slot.value.as_mut()
    }

    /// Makes the entry what `change` makes of it, in place: its handle and
    /// its timer stay. Nothing happens if it is not stored.
    pub(crate) fn update(&mut self, handle: Handle, change: impl FnOnce(T) -> T) {
        let Some(slot) = self.slots.get_mut(handle.slot as usize) else {
            return;
        };
        if slot.gen == handle.gen {
            if let Some(value) = slot.value.take() {
                slot.value = Some(change(value));
            }
        }
    }

    /// Takes the entry out, with its timer.
    pub(crate) fn remove(&mut self, handle: Handle) -> Option<T> {
        self.slot(handle)?;
        self.disarm(handle.slot);
        self.free.push(handle.slot);
        self.len -= 1;
        // Last, so that the entry moves once: straight to the caller.
        let slot = &mut self.slots[handle.slot as usize];
        slot.gen = slot.gen.wrapping_add(1);
        slot.value.take()
    }

    /// How many entries are stored.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every entry, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Handle, &T)> + '_ {
        self.slots.iter().enumerate().filter_map(|(at, slot)| {
            let handle = Handle {
                slot: at as u32,
                gen: slot.gen,
            };
            Some((handle, slot.value.as_ref()?))
        })
    }

    /// The handles of every entry, in slot order.
    pub(crate) fn handles(&self) -> Vec<Handle> {
        self.iter().map(|(handle, _)| handle).collect()
    }

    /// Arms the entry's timer at `at`, replacing the one armed before.
    pub(crate) fn set_timer(&mut self, handle: Handle, at: Time) {
        if self.contains(handle) {
            self.arm(handle.slot, at);
        }
    }

    /// Disarms the entry's timer, if armed.
    pub(crate) fn clear_timer(&mut self, handle: Handle) {
        if self.contains(handle) {
            self.disarm(handle.slot);
        }
    }

    /// The earliest armed deadline.
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        debug_assert_eq!(self.earliest, self.find_earliest());
        if self.deferred_live == 0 {
            return self.earliest;
        }
        let deferred = self.deferred_min.get().unwrap_or_else(|| {
            let slots = &self.slots;
            let min = self
                .deferred
                .iter()
                .map(|&slot| &slots[slot as usize])
                .filter(|entry| entry.place == Place::Deferred)
                .map(|entry| entry.at)
                .min()
                .expect("a deferred timer");
            self.deferred_min.set(Some(min));
            min
        });
        Some(
            self.earliest
                .map_or(deferred, |earliest| earliest.min(deferred)),
        )
    }

    /// Whether a timer is due at `target` (its deadline at or before it):
    /// `next_deadline() <= target`, found without looking for the earliest
    /// deferred timer when none can be due. `target` is the time now, and
    /// never goes back: once time has moved on, the timers armed before
    /// are placed (those set again or disarmed in the same instant never
    /// were).
    pub(crate) fn due_by(&mut self, target: Time) -> bool {
        if target > self.clock {
            self.clock = target;
            if self.deferred_live > 0 {
                self.place_deferred();
            }
        }
        self.earliest.is_some_and(|at| at <= target)
            || (self.deferred_live > 0
                && self.deferred_floor <= target
                && self.next_deadline().is_some_and(|at| at <= target))
    }

    /// The entry whose timer is due first at `now` (its deadline at or
    /// before it), its timer disarmed; deadlines tie in slot order.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<Handle> {
        let at = self.next_deadline().filter(|&at| at <= now)?;
        self.place_deferred();
        // Every lane timer due at `at` joins the heap, which orders them by
        // slot; in a lane they are the first ones.
        for lane in 0..LANES {
            loop {
                let Lane {
                    first, first_at, ..
                } = self.lanes[lane];
                if first == NIL || first_at != at {
                    break;
                }
                self.unlink(lane, first);
                self.push_heap(first, at);
            }
        }
        let (_, slot) = self.heap[0];
        self.disarm(slot);
        Some(Handle {
            slot,
            gen: self.slots[slot as usize].gen,
        })
    }

    /// The entry's armed deadline (for tests).
    #[cfg(test)]
    pub(crate) fn timer(&self, handle: Handle) -> Option<Time> {
        let slot = self.slot(handle)?;
        (slot.place != Place::Nowhere).then_some(slot.at)
    }

    // ----- the timers -----------------------------------------------------

    /// Arms `slot`'s timer at `at`, replacing the one armed before. The
    /// timer is placed later, if it is still armed then: a timer set
    /// again, or disarmed, before it is placed (a request answered, or
    /// sent, soon after it was made) costs no lane or heap work at all.
    fn arm(&mut self, slot: u32, at: Time) {
        let entry = &self.slots[slot as usize];
        let old = match entry.place {
            Place::Deferred => Some(entry.at),
            Place::Nowhere => None,
            Place::Lane(_) | Place::Heap => {
                self.disarm_placed(slot);
                None
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.at = at;
        if old.is_none() {
            entry.place = Place::Deferred;
            self.deferred.push(slot);
            self.deferred_live += 1;
        }
        self.deferred_floor = self.deferred_floor.min(at);
        let min = self.deferred_min.get();
        self.deferred_min.set(match (min, old) {
            // The earliest one went later: not known any more.
            (Some(min), Some(old)) if old == min && at > min => None,
            (Some(min), _) => Some(min.min(at)),
            (None, _) if self.deferred_live == 1 => Some(at),
            (None, _) => None,
        });
        if self.deferred.len() >= DEFERRED_MAX {
            self.place_deferred();
        }
    }

    /// Puts every deferred timer in its lane, or the heap.
    #[cold]
    fn place_deferred(&mut self) {
        let mut deferred = core::mem::take(&mut self.deferred);
        for &slot in &deferred {
            let entry = &self.slots[slot as usize];
            if entry.place == Place::Deferred {
                let at = entry.at;
                self.place(slot, at);
            }
        }
        deferred.clear();
        self.deferred = deferred;
        self.deferred_live = 0;
        self.deferred_min.set(None);
        self.deferred_floor = Time::MAX;
    }

    /// Puts `slot`'s timer, due at `at`, in its lane or the heap.
    fn place(&mut self, slot: u32, at: Time) {
        match self.lane_for(at) {
            Some(lane) => self.push_lane(lane, slot, at),
            None => self.push_heap(slot, at),
        }
        if self.earliest.map_or(true, |earliest| at < earliest) {
            self.earliest = Some(at);
        }
    }

    /// The lane a timer due at `at` joins: the one whose last deadline is
    /// the latest not after `at`, else an empty one (whose last deadline
    /// counts as [`Time::ZERO`]), else none (the heap).
    #[inline]
    fn lane_for(&self, at: Time) -> Option<usize> {
        let (mut best, mut best_at) = (LANES, Time::ZERO);
        for (index, lane) in self.lanes.iter().enumerate() {
            if lane.last_at <= at && (best == LANES || lane.last_at > best_at) {
                (best, best_at) = (index, lane.last_at);
            }
        }
        (best < LANES).then_some(best)
    }

    /// Appends `slot`'s timer, due at `at`, to lane `index`, whose last
    /// deadline is not after `at`.
    #[inline]
    fn push_lane(&mut self, index: usize, slot: u32, at: Time) {
        let lane = &mut self.lanes[index];
        let last = core::mem::replace(&mut lane.last, slot);
        lane.last_at = at;
        if last == NIL {
            lane.first = slot;
            lane.first_at = at;
        } else {
            self.slots[last as usize].next = slot;
        }
        let entry = &mut self.slots[slot as usize];
        entry.place = Place::Lane(index as u8);
        entry.prev = last;
        entry.next = NIL;
        entry.at = at;
    }

    /// Takes `slot` out of lane `index`'s list.
    #[inline]
    fn unlink(&mut self, index: usize, slot: u32) {
        let entry = &mut self.slots[slot as usize];
        let (prev, next) = (entry.prev, entry.next);
        entry.place = Place::Nowhere;
        let lane = &mut self.lanes[index];
        if prev == NIL {
            lane.first = next;
            if next != NIL {
                lane.first_at = self.slots[next as usize].at;
            }
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            lane.last = prev;
            lane.last_at = match prev {
                NIL => Time::ZERO,
                prev => self.slots[prev as usize].at,
            };
        } else {
            self.slots[next as usize].prev = prev;
        }
    }

    /// Disarms `slot`'s timer, if armed.
    #[inline]
    fn disarm(&mut self, slot: u32) {
        let entry = &mut self.slots[slot as usize];
        let at = entry.at;
        match entry.place {
            Place::Nowhere => {}
            Place::Deferred => {
                entry.place = Place::Nowhere;
                self.deferred_live -= 1;
                if self.deferred_live == 0 {
                    self.deferred.clear();
                    self.deferred_min.set(None);
                    self.deferred_floor = Time::MAX;
                } else if self.deferred_min.get() == Some(at) {
                    self.deferred_min.set(None);
                }
            }
            Place::Lane(_) | Place::Heap => self.disarm_placed(slot),
        }
    }

    /// Disarms `slot`'s timer, in a lane or the heap.
    #[inline(never)]
    fn disarm_placed(&mut self, slot: u32) {
        let entry = &self.slots[slot as usize];
        let at = entry.at;
        match entry.place {
            Place::Lane(index) => self.unlink(usize::from(index), slot),
            Place::Heap => self.remove_heap(slot),
            Place::Nowhere | Place::Deferred => unreachable!("placed"),
        }
        // Only the earliest timer's going moves the earliest deadline.
        if self.earliest == Some(at) {
            self.earliest = self.find_earliest();
        }
    }

    /// Puts `slot`'s timer, due at `at`, into the heap.
    fn push_heap(&mut self, slot: u32, at: Time) {
        let entry = &mut self.slots[slot as usize];
        entry.place = Place::Heap;
        entry.at = at;
        self.heap.push((at, slot));
        self.sift_up(self.heap.len() - 1);
    }

    /// Takes `slot`'s timer out of the heap.
    #[inline(never)]
    fn remove_heap(&mut self, slot: u32) {
        let entry = &mut self.slots[slot as usize];
        entry.place = Place::Nowhere;
        let index = entry.prev as usize;
        let last = self.heap.pop().expect("a timer in the heap");
        if index < self.heap.len() {
            // The hole goes down to a leaf, the smaller child moving up at
            // each level, and the last entry goes up from there: about one
            // comparison a level (the last entry seldom rises far).
            let leaf = self.sink_hole(index);
            self.heap[leaf] = last;
            self.sift_up(leaf);
        }
        if self.heap.is_empty() && self.heap.capacity() > KEPT_WHEN_EMPTY {
            self.heap.shrink_to(KEPT_WHEN_EMPTY);
        }
    }

    /// Moves the heap's entry at `index` up to its place.
    fn sift_up(&mut self, mut index: usize) {
        let entry = self.heap[index];
        while index > 0 {
            let parent = (index - 1) / 2;
            if self.heap[parent] <= entry {
                break;
            }
            self.heap[index] = self.heap[parent];
            self.slots[self.heap[index].1 as usize].prev = index as u32;
            index = parent;
        }
        self.heap[index] = entry;
        self.slots[entry.1 as usize].prev = index as u32;
    }

    /// Moves the hole at `index` down to a leaf, moving the smaller child
    /// of each level up into it; returns the leaf.
    fn sink_hole(&mut self, mut index: usize) -> usize {
        loop {
            let left = 2 * index + 1;
            let Some(&smaller) = self.heap.get(left) else {
                return index;
            };
            let (child, smaller) = match self.heap.get(left + 1) {
                Some(&right) if right < smaller => (left + 1, right),
                _ => (left, smaller),
            };
            self.heap[index] = smaller;
            self.slots[smaller.1 as usize].prev = index as u32;
            index = child;
        }
    }

    /// The least of the lanes' first deadlines and the heap's top.
    #[inline(never)]
    fn find_earliest(&self) -> Option<Time> {
        let mut earliest = self.heap.first().map(|&(at, _)| at);
        for lane in &self.lanes {
            if lane.first != NIL && earliest.map_or(true, |at| lane.first_at < at) {
                earliest = Some(lane.first_at);
            }
        }
        earliest
    }
}
/// A first-in first-out queue of entries waiting their turn. An entry may
/// leave its slab while it waits (it was cancelled, or timed out): its
/// handle then stays in the queue, is skipped when it comes to the front,
/// and all such handles are dropped at once when they pile up.
#[derive(Default)]
pub(crate) struct Fifo {
    handles: VecDeque<Handle>,
    /// Handles in `handles` whose entries still wait.
    waiting: usize,
}

impl Fifo {
    /// Appends `handle`.
    pub(crate) fn push_back(&mut self, handle: Handle) {
        self.handles.push_back(handle);
        self.waiting += 1;
    }

    /// Puts `handle` first.
    pub(crate) fn push_front(&mut self, handle: Handle) {
        self.handles.push_front(handle);
        self.waiting += 1;
    }

    /// How many entries wait.
    pub(crate) fn len(&self) -> usize {
        self.waiting
    }

    /// The first handle whose entry in `slab` still `waits`.
    pub(crate) fn pop<T>(&mut self, slab: &Slab<T>, waits: impl Fn(&T) -> bool) -> Option<Handle> {
        let waiting = |handle: Handle| slab.get(handle).is_some_and(&waits);
        let found = loop {
            let Some(handle) = self.handles.pop_front() else {
                break None;
            };
            if waiting(handle) {
                self.waiting -= 1;
                break Some(handle);
            }
        };
        self.drop_stale(waiting);
        give_back(&mut self.handles);
        found
    }

    /// An entry of `slab` that waited here stopped waiting (it left the
    /// slab, or `waits` is no longer true of it) without being popped.
    pub(crate) fn forget<T>(&mut self, slab: &Slab<T>, waits: impl Fn(&T) -> bool) {
        self.waiting -= 1;
        self.drop_stale(|handle| slab.get(handle).is_some_and(&waits));
    }

    /// Drops every stale handle once they outnumber the waiting ones (and
    /// a few more).
    fn drop_stale(&mut self, waiting: impl Fn(Handle) -> bool) {
        if self.handles.len() > 2 * self.waiting + 64 {
            self.handles.retain(|&handle| waiting(handle));
        }
    }
}

impl Pending<OpId> {
    /// Reads into the cache what matching answers to `ids` (the first
    /// [`AHEAD`] of them) will read, one step of the way for all of them at
    /// a time: where each id can be (its bucket in the ring, and where
    /// looking it up among those that outlived a round of the ring
    /// starts), then the entries of `acquires` or `holds` that the
    /// requests found are attempts of, then those entries' keys. Answers
    /// name requests all over memory larger than the caches, and this way
    /// the reads of a batch wait for memory together, a few times a batch,
    /// instead of a few times an answer. Nothing changes.
    pub(crate) fn read_ahead<A: Keyed, H: Keyed>(
        &self,
        ids: impl Iterator<Item = u64>,
        acquires: &Slab<A>,
        holds: &Slab<H>,
    ) {
        let mask = self.ring.len().wrapping_sub(1);
        let mut batch = [0; AHEAD];
        let mut len = 0;
        for (id, slot) in ids.zip(&mut batch) {
            *slot = id;
            len += 1;
            // Both places, whichever holds it, without waiting to know.
            if let Some(bucket) = self.ring.get(id as usize & mask) {
                black_box(bucket.0);
            }
            if let Some(bucket) = self.far.home_bucket(id) {
                black_box(bucket.0);
            }
        }
        let mut keys = [None; AHEAD];
        for (&id, key) in batch[..len].iter().zip(&mut keys) {
            *key = match self.find(id).and_then(OpId::parts) {
                Some((OpKind::Acquire, handle)) => acquires.get(handle).map(Keyed::key),
                Some((OpKind::Release, handle)) => holds.get(handle).map(Keyed::key),
                _ => None,
            };
        }
        for key in keys.iter().flatten() {
            black_box(key.as_bytes()[0]);
        }
    }
}

/// What a send buffer keeps of its capacity after a burst.
const SEND_BUFFER_KEPT: usize = 256 * 1024;
/// The memory a send buffer reserves at once when it runs out.
const SEND_BUFFER_ROOM: usize = 64 * 1024;
/// The room a send buffer makes for frames at once.
const ROOM_STEP: usize = 2048;

/// The bytes encoded and not yet handed out, taken as one send at a time.
///
/// Past them it keeps room already written (zeros at first, then what
/// frames cut short left there), so that a frame is encoded over room
/// that is there, without making room for each frame.
#[derive(Default)]
pub(crate) struct SendBuffer {
    /// The bytes encoded, then the room.
    out: BytesMut,
    /// How many bytes of `out` are encoded.
    filled: usize,
    /// The digits of the last frames' numbers.
    digits: Digits,
}

impl SendBuffer {
    /// The buffer to encode the next frame into.
    pub(crate) fn writer(&mut self) -> &mut SendBuffer {
        self
    }

    /// Makes room for at least `n` more bytes, a few frames' worth at once.
    /// An empty buffer first reserves memory for many frames: once the
    /// sends taken from it are dropped, that takes their memory back
    /// without copying any byte, where running out of it later would copy
    /// what it holds.
    #[cold]
    fn make_room(&mut self, n: usize) {
        let n = n.max(ROOM_STEP);
        self.out.truncate(self.filled);
        if self.filled == 0 {
            self.out.reserve(SEND_BUFFER_ROOM);
        }
        self.out.resize(self.filled + n, 0);
    }

    /// Everything encoded so far, if anything; a buffer that a burst made
    /// large is let go with it.
    pub(crate) fn take(&mut self) -> Option<Bytes> {
        if self.filled == 0 {
            return None;
        }
        let burst = self.out.capacity() > SEND_BUFFER_KEPT;
        let data = self.out.split_to(self.filled).freeze();
        self.filled = 0;
        if burst {
            self.out = BytesMut::new();
        }
        Some(data)
    }
}

impl crate::wire::sealed::Sealed for SendBuffer {}

impl LineBuf for SendBuffer {
    fn filled(&self) -> usize {
        self.filled
    }

    fn grow(&mut self, n: usize) -> &mut [u8] {
        self.grow_with_digits(n).0
    }

    fn truncate(&mut self, len: usize) {
        self.filled = self.filled.min(len);
    }

    fn grow_with_digits(&mut self, n: usize) -> (&mut [u8], Option<&mut Digits>) {
        let start = self.filled;
        if self.out.len() < start + n {
            self.make_room(n);
        }
        self.filled = start + n;
        (&mut self.out[start..start + n], Some(&mut self.digits))
    }
}

/// The ids that outlived a round of the ring (see [`Pending`]): open
/// addressing by a multiplicative hash of the id, with linear probing, at
/// most half full. A removal moves back the entries after it that probed
/// past its bucket, so no bucket is ever left marked as removed. Id 0
/// marks an empty bucket (the pending table keeps id 0 aside).
struct Far<R> {
    /// Id `id` in bucket `home(id)` or the first free one after it.
    buckets: Vec<(u64, R)>,
    len: usize,
}

impl<R> Default for Far<R> {
    fn default() -> Far<R> {
        Far {
            buckets: Vec::new(),
            len: 0,
        }
    }
}

impl<R: Copy> Far<R> {
    /// The bucket where probing for `id` starts: the top bits of its
    /// [`spread`](crate::hash::spread) (the table has buckets).
    #[inline]
    fn home(&self, id: u64) -> usize {
        let bits = self.buckets.len().trailing_zeros();
        (crate::hash::spread(id) >> (64 - bits)) as usize
    }

    /// The bucket of `id`, if it is here.
    #[inline]
    fn find(&self, id: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let mut at = self.home(id);
        loop {
            match self.buckets[at].0 {
                found if found == id => return Some(at),
                0 => return None,
                _ => at = (at + 1) & mask,
            }
        }
    }

    fn get(&self, id: u64) -> Option<R> {
        self.find(id).map(|at| self.buckets[at].1)
    }

    /// Adds `id` (not 0, not here) as `request`.
    fn insert(&mut self, id: u64, request: R) {
        debug_assert!(id != 0 && self.find(id).is_none());
        if 2 * (self.len + 1) > self.buckets.len() {
            self.grow(request);
        }
        let mask = self.buckets.len() - 1;
        let mut at = self.home(id);
        while self.buckets[at].0 != 0 {
            at = (at + 1) & mask;
        }
        self.buckets[at] = (id, request);
        self.len += 1;
    }

    /// Takes `id` out, if here, and moves back the entries after it that
    /// would no longer be found past the bucket it leaves.
    fn remove(&mut self, id: u64) -> Option<R> {
        let mut hole = self.find(id)?;
        let found = self.buckets[hole].1;
        let mask = self.buckets.len() - 1;
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let next = self.buckets[at].0;
            if next == 0 {
                break;
            }
            // It may fill the hole if its probe passed the hole's bucket.
            let home = self.home(next);
            if (at.wrapping_sub(home) & mask) >= (at.wrapping_sub(hole) & mask) {
                self.buckets[hole] = self.buckets[at];
                hole = at;
            }
        }
        self.buckets[hole].0 = 0;
        self.len -= 1;
        Some(found)
    }

    /// Twice the buckets (16 at first), every entry put back; empty
    /// buckets hold `filler`.
    #[cold]
    fn grow(&mut self, filler: R) {
        let count = (2 * self.buckets.len()).max(16);
        let old = core::mem::replace(&mut self.buckets, vec![(0, filler); count]);
        self.len = 0;
        for (id, request) in old {
            if id != 0 {
                self.insert(id, request);
            }
        }
    }

    /// The bucket where looking `id` up starts, if the table has any.
    #[inline]
    fn home_bucket(&self, id: u64) -> Option<&(u64, R)> {
        (self.len > 0).then(|| &self.buckets[self.home(id)])
    }

    /// Every entry, in no particular order.
    fn iter(&self) -> impl Iterator<Item = (u64, R)> + '_ {
        self.buckets.iter().filter(|&&(id, _)| id != 0).copied()
    }

    /// Takes every entry out; a table that a burst made large is let go.
    fn drain(&mut self) -> Vec<(u64, R)> {
        let all: Vec<(u64, R)> = self.iter().collect();
        if self.buckets.len() > KEPT_WHEN_EMPTY {
            self.buckets = Vec::new();
        } else {
            self.buckets.iter_mut().for_each(|bucket| bucket.0 = 0);
        }
        self.len = 0;
        all
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The requests in flight on the connection, by request id.
///
/// Request ids go up by one per request, so the ids in flight are mostly
/// a recent range: most are kept in a ring indexed by the id's low bits,
/// where each has a bucket of its own, found, put and taken out with no
/// probing. An id still in flight when the ids have gone round the ring and
/// a later one needs its bucket (an acquire that waits long) moves to a
/// hash map for the few that outlive a round. The ring has at least 8/7 as
/// many buckets as there are ids in flight. Id 0 marks an empty bucket; the
/// one id 0 there could ever be, after 2^64 requests, is kept aside.
pub(crate) struct Pending<R> {
    /// Id `id` in bucket `id % ring.len()` (a power of two), if anywhere.
    ring: Vec<(u64, R)>,
    /// The ids moved out of the ring.
    far: Far<R>,
    /// The request of id 0, if in flight.
    zero: Option<R>,
    len: usize,
}

impl<R> Default for Pending<R> {
    fn default() -> Pending<R> {
        Pending {
            ring: Vec::new(),
            far: Far::default(),
            zero: None,
            len: 0,
        }
    }
}

impl<R: Copy> Pending<R> {
    /// Registers request `id` (not in flight) as `request`.
    pub(crate) fn insert(&mut self, id: u64, request: R) {
        debug_assert!(
            self.find(id).is_none(),
            "request id {id} is in flight already"
        );
        self.len += 1;
        if id == 0 {
            self.zero = Some(request);
            return;
        }
        if 8 * self.len > 7 * self.ring.len() {
            self.grow(request);
        }
        let at = id as usize & (self.ring.len() - 1);
        let (old, moved) = core::mem::replace(&mut self.ring[at], (id, request));
        if old != 0 {
            self.far.insert(old, moved);
        }
    }

    /// The request `id`, if in flight.
    fn find(&self, id: u64) -> Option<R> {
        if id == 0 {
            return self.zero;
        }
        let at = id as usize & self.ring.len().wrapping_sub(1);
        match self.ring.get(at) {
            Some(&(found, request)) if found == id => Some(request),
            _ => self.far.get(id),
        }
    }

    /// The request `id`, if in flight.
    #[cfg(test)]
    pub(crate) fn get(&self, id: u64) -> Option<R> {
        self.find(id)
    }

    /// Takes request `id` out, if in flight.
    pub(crate) fn remove(&mut self, id: u64) -> Option<R> {
        let found = if id == 0 {
            self.zero.take()
        } else {
            // An empty ring has no bucket: `len - 1` wraps to a mask that
            // `get_mut` refuses.
            let at = id as usize & self.ring.len().wrapping_sub(1);
            match self.ring.get_mut(at) {
                Some(bucket) if bucket.0 == id => {
                    // The request stays, as the empty bucket's filler.
                    bucket.0 = 0;
                    Some(bucket.1)
                }
                _ if self.far.is_empty() => None,
                _ => self.far.remove(id),
            }
        };
        if found.is_some() {
            self.len -= 1;
        }
        found
    }

    /// How many requests are in flight.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Takes every request out, in the order of their ids.
    pub(crate) fn drain(&mut self) -> Vec<(u64, R)> {
        let mut all: Vec<(u64, R)> = self.zero.take().map(|r| (0, r)).into_iter().collect();
        for bucket in &mut self.ring {
            if bucket.0 != 0 {
                all.push(*bucket);
                bucket.0 = 0;
            }
        }
        all.extend(self.far.drain());
        all.sort_unstable_by_key(|&(id, _)| id);
        if self.ring.len() > KEPT_WHEN_EMPTY {
            self.ring = Vec::new();
        }
        self.len = 0;
        all
    }

    /// Doubles the ring (16 buckets at first) and puts every id back: in
    /// the ring if its bucket there is free, else in the far map. Empty
    /// buckets hold `filler` (their id 0 says they are empty).
    #[cold]
    fn grow(&mut self, filler: R) {
        let buckets = (2 * self.ring.len()).max(16);
        let old = core::mem::replace(&mut self.ring, vec![(0, filler); buckets]);
        let far = core::mem::take(&mut self.far).drain();
        for (id, request) in old.into_iter().filter(|&(id, _)| id != 0).chain(far) {
            let bucket = &mut self.ring[id as usize & (buckets - 1)];
            if bucket.0 == 0 {
                *bucket = (id, request);
            } else {
                self.far.insert(id, request);
            }
        }
    }

    /// Every request in flight, in no particular order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, R)> + '_ {
        let ring = self.ring.iter().filter(|&&(id, _)| id != 0).copied();
        let far = self.far.iter();
        self.zero.map(|r| (0, r)).into_iter().chain(ring).chain(far)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    use super::*;
    use crate::rng::Rng;

    impl Keyed for Key {
        fn key(&self) -> &Key {
            self
        }
    }

    /// Every lane is a list in deadline order whose slots say they are in
    /// it, with the right neighbours; the heap is a heap whose slots know
    /// their index; no slot is armed anywhere else; and the earliest
    /// deadline is the least of them. Returns how many timers are armed.
    fn assert_sound<T>(slab: &Slab<T>) -> usize {
        let t = slab;
        let mut armed = 0;
        for (index, lane) in t.lanes.iter().enumerate() {
            assert_eq!(lane.first == NIL, lane.last == NIL);
            let (mut prev, mut at, mut slot) = (NIL, Time::ZERO, lane.first);
            while slot != NIL {
                let entry = &t.slots[slot as usize];
                assert_eq!(entry.place, Place::Lane(index as u8));
                assert_eq!(entry.prev, prev);
                assert!(entry.at >= at, "in deadline order");
                armed += 1;
                (prev, at, slot) = (slot, entry.at, entry.next);
            }
            assert_eq!(lane.last, prev);
            if prev != NIL {
                assert_eq!(lane.first_at, t.slots[lane.first as usize].at);
            }
            assert_eq!(lane.last_at, at, "Time::ZERO when empty");
        }
        for (index, &(at, slot)) in t.heap.iter().enumerate() {
            let entry = &t.slots[slot as usize];
            assert_eq!(
                (entry.place, entry.prev, entry.at),
                (Place::Heap, index as u32, at)
            );
            if index > 0 {
                assert!(t.heap[(index - 1) / 2] < (at, slot), "a heap");
            }
        }
        armed += t.heap.len();
        // Every deferred timer is listed (a timer disarmed and armed again
        // before it was placed may be listed twice: placed once, skipped
        // the second time); the earliest of them, when known, is right.
        let deferred: Vec<u32> = (0..t.slots.len() as u32)
            .filter(|&s| t.slots[s as usize].place == Place::Deferred)
            .collect();
        assert_eq!(deferred.len(), t.deferred_live);
        for &slot in &deferred {
            assert!(t.deferred.contains(&slot));
        }
        assert!(t.deferred.len() < DEFERRED_MAX);
        if let Some(min) = deferred.iter().map(|&s| t.slots[s as usize].at).min() {
            assert!(t.deferred_floor <= min, "the floor is below them all");
        }
        if let Some(min) = t.deferred_min.get() {
            let exact = deferred.iter().map(|&s| t.slots[s as usize].at).min();
            assert_eq!(Some(min), exact, "the earliest deferred deadline");
        }
        armed += deferred.len();
        let marked = t.slots.iter().filter(|s| s.place != Place::Nowhere).count();
        assert_eq!(
            marked, armed,
            "every armed slot is in a lane, the heap or deferred"
        );
        assert_eq!(t.earliest, t.find_earliest());
        armed
    }

    /// Random inserts, removals, timers set, cleared and fired, and
    /// lookups, compared step by step with a `BTreeMap` of entries and a
    /// `BTreeSet` of `(deadline, slot)`.
    #[test]
    fn a_slab_and_its_timers_behave_like_a_map_and_an_ordered_set() {
        for seed in 0..40 {
            let mut rng = Rng::new(seed);
            let mut slab: Slab<u64> = Slab::default();
            let mut entries: BTreeMap<Handle, u64> = BTreeMap::new();
            let mut deadlines: BTreeSet<(Time, u32)> = BTreeSet::new();
            let mut armed: HashMap<Handle, Time> = HashMap::new();
            let mut gone: Vec<Handle> = Vec::new();
            let mut now = 0u64;
            let pick = |rng: &mut Rng, entries: &BTreeMap<Handle, u64>| {
                let n = entries.len() as u64;
                (n > 0).then(|| *entries.keys().nth(rng.up_to(n - 1) as usize).unwrap())
            };
            for step in 0..4_000u64 {
                match rng.up_to(9) {
                    0 | 1 => {
                        let handle = slab.insert(step);
                        assert!(!entries.contains_key(&handle));
                        entries.insert(handle, step);
                    }
                    2 => {
                        if let Some(handle) = pick(&mut rng, &entries) {
                            assert_eq!(slab.remove(handle), entries.remove(&handle));
                            if let Some(at) = armed.remove(&handle) {
                                deadlines.remove(&(at, handle.slot()));
                            }
                            gone.push(handle);
                        }
                    }
                    3 | 4 => {
                        if let Some(handle) = pick(&mut rng, &entries) {
                            // Mostly later deadlines, sometimes earlier ones.
                            let at = Time::from_nanos(now + rng.up_to(50) * rng.up_to(3));
                            slab.set_timer(handle, at);
                            if let Some(old) = armed.insert(handle, at) {
                                deadlines.remove(&(old, handle.slot()));
                            }
                            deadlines.insert((at, handle.slot()));
                        }
                    }
                    5 => {
                        if let Some(handle) = pick(&mut rng, &entries) {
                            slab.clear_timer(handle);
                            if let Some(old) = armed.remove(&handle) {
                                deadlines.remove(&(old, handle.slot()));
                            }
                        }
                    }
                    6 => {
                        now += rng.up_to(30);
                        let due = Time::from_nanos(now);
                        loop {
                            let expected = deadlines.first().copied().filter(|&(at, _)| at <= due);
                            let popped = slab.pop_due(due);
                            assert_eq!(popped.map(Handle::slot), expected.map(|(_, s)| s));
                            let Some(handle) = popped else { break };
                            deadlines.pop_first();
                            assert_eq!(armed.remove(&handle), expected.map(|(at, _)| at));
                            assert!(entries.contains_key(&handle));
                        }
                    }
                    7 => {
                        // A stale handle reaches nothing, and changes nothing.
                        if let Some(&handle) = gone.last() {
                            assert_eq!(slab.get(handle), None);
                            assert!(!slab.contains(handle));
                            slab.set_timer(handle, Time::ZERO);
                            slab.clear_timer(handle);
                            slab.update(handle, |_| unreachable!("a stale handle"));
                            assert_eq!(slab.remove(handle), None);
                        }
                    }
                    _ => {
                        if let Some(handle) = pick(&mut rng, &entries) {
                            if rng.chance(1, 2) {
                                *slab.get_mut(handle).unwrap() += 1;
                            } else {
                                slab.update(handle, |value| value + 1);
                            }
                            *entries.get_mut(&handle).unwrap() += 1;
                        }
                    }
                }
                assert_eq!(slab.len(), entries.len());
                // Every step leaves the slab sound (the earliest deferred
                // deadline, where kept, right), while the earliest is asked
                // for only now and then, so that several changes come
                // between two looks, as between two polls.
                assert_eq!(assert_sound(&slab), armed.len(), "seed {seed} step {step}");
                if rng.chance(1, 3) {
                    assert_eq!(
                        slab.next_deadline(),
                        deadlines.first().map(|&(at, _)| at),
                        "seed {seed} step {step}"
                    );
                }
                if rng.chance(1, 3) {
                    let target = Time::from_nanos(now + rng.up_to(60));
                    let due = deadlines.first().is_some_and(|&(at, _)| at <= target);
                    assert_eq!(slab.due_by(target), due, "seed {seed} step {step}");
                }
                if step % 97 == 0 {
                    let mut handles = slab.handles();
                    handles.sort_unstable();
                    assert!(handles.iter().copied().eq(entries.keys().copied()));
                    let listed: Vec<(Handle, u64)> = slab.iter().map(|(h, &v)| (h, v)).collect();
                    let expected: Vec<(Handle, u64)> =
                        entries.iter().map(|(&h, &v)| (h, v)).collect();
                    let mut sorted = listed.clone();
                    sorted.sort_by_key(|(h, _)| h.slot());
                    assert_eq!(listed, sorted, "in slot order");
                    let mut by_handle = listed;
                    by_handle.sort();
                    assert_eq!(by_handle, expected);
                    for (&handle, &at) in &armed {
                        assert_eq!(slab.timer(handle), Some(at));
                    }
                }
            }
            assert_eq!(assert_sound(&slab), armed.len());
        }
    }

    /// Fires every armed timer and checks that they come out in
    /// `(deadline, slot)` order, as `armed` has them.
    fn assert_fire_in_order<T>(slab: &mut Slab<T>, armed: &BTreeMap<u32, Time>) {
        let mut expected: Vec<(Time, u32)> = armed.iter().map(|(&s, &at)| (at, s)).collect();
        expected.sort();
        let fired: Vec<(Time, u32)> = std::iter::from_fn(|| {
            let handle = slab.pop_due(Time::MAX)?;
            assert_sound(slab);
            Some((armed[&handle.slot()], handle.slot()))
        })
        .collect();
        assert_eq!(fired, expected);
        assert_eq!(slab.next_deadline(), None);
        assert!(slab.heap.is_empty());
    }

    /// Timers of a few kinds, each "now plus its own duration", armed in
    /// any mix as time goes on, sort themselves into lanes: none goes to
    /// the heap, and they fire in order.
    #[test]
    fn timers_of_a_few_kinds_each_find_their_lane() {
        let mut rng = Rng::new(5);
        let mut slab: Slab<u32> = Slab::default();
        let mut armed: BTreeMap<u32, Time> = BTreeMap::new();
        let durations = [30_000, 5_000, 60_000, 100];
        let handles: Vec<Handle> = (0..3_000).map(|i| slab.insert(i)).collect();
        for (step, &handle) in handles.iter().enumerate() {
            let now = step as u64 / 7;
            let kind = rng.up_to(LANES as u64 - 1) as usize;
            let at = Time::from_nanos(now + durations[kind]);
            slab.set_timer(handle, at);
            armed.insert(handle.slot(), at);
            if rng.chance(1, 3) {
                // Answered in any order: its timer goes.
                let gone = handles[rng.up_to(step as u64) as usize];
                slab.clear_timer(gone);
                armed.remove(&gone.slot());
            }
            slab.place_deferred();
            assert!(slab.heap.is_empty(), "step {step}: a timer fit no lane");
        }
        assert_eq!(assert_sound(&slab), armed.len());
        // One kind more than there are lanes: only its timers that fit no
        // lane go to the heap, and they still fire in order.
        let fifth = Time::from_nanos(10);
        slab.set_timer(handles[0], fifth);
        armed.insert(handles[0].slot(), fifth);
        slab.place_deferred();
        assert_eq!(slab.heap.len(), 1);
        assert_eq!(assert_sound(&slab), armed.len());
        assert_fire_in_order(&mut slab, &armed);
    }

    /// Deadlines that go down fit no lane once the lanes are taken: they
    /// go to the heap, and come out of it exactly, whether disarmed, set
    /// again, removed with their entry, or fired.
    #[test]
    fn timers_that_fit_no_lane_go_to_the_heap_and_out_of_it_exactly() {
        let mut rng = Rng::new(7);
        let mut slab: Slab<u32> = Slab::default();
        let mut armed: BTreeMap<u32, Time> = BTreeMap::new();
        let mut handles: Vec<Handle> = (0..300).map(|i| slab.insert(i)).collect();
        for (i, &handle) in handles.iter().enumerate() {
            let at = Time::from_nanos(1_000_000 - 10 * i as u64);
            slab.set_timer(handle, at);
            armed.insert(handle.slot(), at);
        }
        slab.place_deferred();
        assert_eq!(slab.heap.len(), 300 - LANES);
        for round in 0..20_000u64 {
            let pick = rng.up_to(handles.len() as u64 - 1) as usize;
            let handle = handles[pick];
            match rng.up_to(3) {
                0 => {
                    slab.clear_timer(handle);
                    armed.remove(&handle.slot());
                }
                1 => {
                    assert!(slab.remove(handle).is_some());
                    armed.remove(&handle.slot());
                    handles[pick] = slab.insert(0);
                }
                _ => {
                    // Earlier and later than the lanes' last deadlines.
                    let at = Time::from_nanos(rng.up_to(2_000_000) + round);
                    slab.set_timer(handle, at);
                    armed.insert(handle.slot(), at);
                }
            }
            assert_eq!(slab.next_deadline(), armed.values().min().copied());
            if round % 7 == 0 {
                // Placed now and then, as a burst of timers would be.
                slab.place_deferred();
            }
            if round % 50 == 0 {
                assert_eq!(assert_sound(&slab), armed.len());
            }
        }
        assert!(!slab.heap.is_empty());
        assert_eq!(assert_sound(&slab), armed.len());
        assert_fire_in_order(&mut slab, &armed);
    }

    /// A timer armed and set again within one instant is placed once, when
    /// time moves on, and not before: the deferred ones last one instant.
    #[test]
    fn deferred_timers_last_one_instant() {
        let mut slab: Slab<u32> = Slab::default();
        let at = Time::from_nanos;
        let handles: Vec<Handle> = (0..10).map(|i| slab.insert(i)).collect();
        assert!(!slab.due_by(at(5)));
        for &handle in &handles {
            slab.set_timer(handle, at(100));
            slab.set_timer(handle, at(200));
        }
        // Asked again at the same time: still deferred, and exact.
        assert!(!slab.due_by(at(5)));
        assert_eq!((slab.deferred_live, slab.deferred.len()), (10, 10));
        assert_eq!(slab.next_deadline(), Some(at(200)));
        // Time moves on: every one is placed, in one lane.
        assert!(!slab.due_by(at(6)));
        assert_eq!((slab.deferred_live, slab.deferred.len()), (0, 0));
        assert_eq!(
            slab.lanes.iter().filter(|lane| lane.first != NIL).count(),
            1
        );
        assert_eq!(assert_sound(&slab), 10);
        assert!(slab.due_by(at(200)));
    }

    /// Timers due at one moment fire in slot order, whether in one lane,
    /// in several, or in the heap.
    #[test]
    fn timers_due_at_one_moment_fire_in_slot_order() {
        let mut slab: Slab<u32> = Slab::default();
        let mut armed: BTreeMap<u32, Time> = BTreeMap::new();
        let handles: Vec<Handle> = (0..40).map(|i| slab.insert(i)).collect();
        // Armed from the last slot down, at two moments: two lanes.
        for (i, &handle) in handles.iter().enumerate().rev() {
            let at = Time::from_nanos(if i % 2 == 0 { 10 } else { 20 });
            slab.set_timer(handle, at);
            armed.insert(handle.slot(), at);
        }
        // Then lower deadlines, in two more lanes and then the heap, and
        // some at the first two moments again.
        slab.place_deferred();
        for (&handle, at) in handles.iter().zip([9, 8, 7, 7, 10, 20]) {
            slab.set_timer(handle, Time::from_nanos(at));
            armed.insert(handle.slot(), Time::from_nanos(at));
        }
        slab.place_deferred();
        assert_eq!(slab.heap.len(), 2);
        assert!(!slab.heap.is_empty());
        assert_eq!(assert_sound(&slab), armed.len());
        assert_eq!(slab.pop_due(Time::from_nanos(4)), None);
        assert_fire_in_order(&mut slab, &armed);
    }

    /// Random pushes at both ends, pops, and entries leaving early,
    /// compared with a `VecDeque` that removes them at once.
    #[test]
    fn a_fifo_behaves_like_a_queue_that_removes_at_once() {
        // An entry is `true` while it waits; one that stops waiting either
        // leaves the slab or stays in it as `false`.
        let waits = |waiting: &bool| *waiting;
        for seed in 0..40 {
            let mut rng = Rng::new(100 + seed);
            let mut slab: Slab<bool> = Slab::default();
            let mut fifo = Fifo::default();
            let mut model: VecDeque<Handle> = VecDeque::new();
            for _ in 0..5_000 {
                match rng.up_to(6) {
                    0 | 1 => {
                        let handle = slab.insert(true);
                        fifo.push_back(handle);
                        model.push_back(handle);
                    }
                    2 => {
                        let handle = slab.insert(true);
                        fifo.push_front(handle);
                        model.push_front(handle);
                    }
                    3 => {
                        let popped = fifo.pop(&slab, waits);
                        assert_eq!(popped, model.pop_front());
                        if let Some(handle) = popped {
                            slab.remove(handle);
                        }
                    }
                    4 => {
                        if !model.is_empty() {
                            let at = rng.up_to(model.len() as u64 - 1) as usize;
                            let handle = model.remove(at).unwrap();
                            slab.remove(handle);
                            fifo.forget(&slab, waits);
                        }
                    }
                    _ => {
                        if !model.is_empty() {
                            let at = rng.up_to(model.len() as u64 - 1) as usize;
                            let handle = model.remove(at).unwrap();
                            *slab.get_mut(handle).unwrap() = false;
                            fifo.forget(&slab, waits);
                        }
                    }
                }
                assert_eq!(fifo.len(), model.len());
                assert!(
                    fifo.handles.len() <= 2 * fifo.len() + 65,
                    "{} {}",
                    fifo.handles.len(),
                    fifo.len()
                );
            }
        }
    }

    /// A burst through a slab, a queue, the timer heap and the pending
    /// requests (ring and far table) leaves each of them small once drained.
    #[test]
    fn a_drained_burst_gives_its_memory_back() {
        let mut slab: Slab<Key> = Slab::default();
        let key = Key::new("k").unwrap();
        let mut fifo = Fifo::default();
        for _ in 0..100_000 {
            fifo.push_back(slab.insert(key.clone()));
        }
        // Slots grow an eighth at a time: never much more than in use.
        assert!(slab.slots.capacity() <= 100_000 + 100_000 / 8 + 16);
        while let Some(handle) = fifo.pop(&slab, |_| true) {
            slab.remove(handle);
        }
        assert!(fifo.handles.capacity() <= KEPT_WHEN_EMPTY);
        // Timers that went to the heap (deadlines that go down fit no lane
        // once the lanes are taken), placed, then disarmed.
        let handles: Vec<Handle> = (0..100_000).map(|_| slab.insert(key.clone())).collect();
        for (i, &handle) in handles.iter().enumerate() {
            slab.set_timer(handle, Time::from_nanos(1_000_000 - i as u64));
        }
        slab.place_deferred();
        assert!(slab.heap.len() > 90_000);
        for handle in handles {
            slab.clear_timer(handle);
        }
        assert!(slab.heap.is_empty() && slab.heap.capacity() <= KEPT_WHEN_EMPTY);
        assert!(slab.deferred.capacity() <= DEFERRED_MAX);
        // Ids in sequence, and ids that all want one bucket of the ring:
        // each pushes the one before it far.
        let mut pending = Pending::default();
        for id in (0..100_000u64).chain((1..=10_000).map(|k| k << 32)) {
            pending.insert(id, ());
        }
        assert!(pending.far.buckets.len() > KEPT_WHEN_EMPTY);
        assert_eq!(pending.drain().len(), 110_000);
        assert!(
            pending.ring.len() <= KEPT_WHEN_EMPTY && pending.far.buckets.len() <= KEPT_WHEN_EMPTY
        );
    }

    /// Random inserts and removals of ids that crowd a few buckets (so
    /// that probes wrap round the table and removals move entries back),
    /// compared with a `BTreeMap` step by step.
    #[test]
    fn the_far_table_behaves_like_a_map() {
        for seed in 0..20 {
            let mut rng = Rng::new(300 + seed);
            let mut far: Far<u64> = Far::default();
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let mut grown = 0;
            for step in 0..6_000u64 {
                // Few distinct ids, many of them large: long probe runs.
                let id =
                    1 + rng.up_to(if step % 2 == 0 { 60 } else { 3_000 }) + (rng.up_to(1) << 63);
                if rng.chance(1, 2) && !model.contains_key(&id) {
                    far.insert(id, step);
                    model.insert(id, step);
                } else {
                    assert_eq!(far.remove(id), model.remove(&id), "seed {seed} step {step}");
                }
                assert_eq!(far.get(id), model.get(&id).copied());
                assert_eq!(far.len, model.len());
                assert!(far.buckets.is_empty() || 2 * far.len <= far.buckets.len());
                grown = grown.max(far.buckets.len());
                if step % 101 == 0 {
                    // Every entry is found from its home bucket, with no
                    // empty bucket on the way.
                    for (&id, &value) in &model {
                        assert_eq!(far.get(id), Some(value));
                    }
                    let mut listed: Vec<(u64, u64)> = far.iter().collect();
                    listed.sort_unstable();
                    let expected: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
                    assert_eq!(listed, expected);
                }
            }
            assert!(grown >= 64);
            let mut drained = far.drain();
            drained.sort_unstable();
            assert_eq!(drained, model.into_iter().collect::<Vec<_>>());
            assert!(far.is_empty() && far.iter().next().is_none());
        }
    }

    /// The ids that go far share their low bits (those of the ring bucket
    /// they were pushed out of): the far table spreads them all the same,
    /// each found on average less than one bucket past its home.
    #[test]
    fn the_far_table_spreads_ids_that_share_their_low_bits() {
        let mut far: Far<()> = Far::default();
        for k in 1..=1_000u64 {
            far.insert(k << 12 | 5, ());
        }
        let mask = far.buckets.len() - 1;
        let past_home: usize = far
            .iter()
            .map(|(id, _)| far.find(id).unwrap().wrapping_sub(far.home(id)) & mask)
            .sum();
        assert!(
            past_home < far.len,
            "{past_home} buckets past home for {} ids",
            far.len
        );
    }

    /// Reading ahead changes nothing, whatever the ids: in the ring, far,
    /// unknown, of either slab, or of entries gone.
    #[test]
    fn reading_ahead_changes_nothing() {
        let key = Key::new("k").unwrap();
        let mut acquires: Slab<Key> = Slab::default();
        let mut holds: Slab<Key> = Slab::default();
        let mut pending: Pending<OpId> = Pending::default();
        // Nothing in flight: no bucket to read.
        pending.read_ahead([1, 2, 0].into_iter(), &acquires, &holds);
        // Ids whose buckets the later ones take: those go far.
        for id in (1..100u64).chain(1_000..1_100) {
            let op = match id % 3 {
                0 => OpId::of(OpKind::Acquire, acquires.insert(key.clone())),
                1 => OpId::of(OpKind::Release, holds.insert(key.clone())),
                // A handle whose entry is gone.
                _ => {
                    let handle = holds.insert(key.clone());
                    holds.remove(handle);
                    OpId::of(OpKind::Release, handle)
                }
            };
            pending.insert(id, op);
        }
        // Ids from the ring, from the far table, unknown, and id 0.
        let before: Vec<(u64, OpId)> = {
            let mut all: Vec<(u64, OpId)> = pending.iter().collect();
            all.sort_unstable_by_key(|&(id, _)| id);
            all
        };
        assert!(!pending.far.is_empty());
        for ids in [[0, 1, 2, 50, 1_050, 99, 100, 999, 1_099, u64::MAX]; 2] {
            pending.read_ahead(ids.into_iter(), &acquires, &holds);
        }
        pending.read_ahead((0..40).map(|i| i * 30), &acquires, &holds);
        let mut after: Vec<(u64, OpId)> = pending.iter().collect();
        after.sort_unstable_by_key(|&(id, _)| id);
        assert_eq!(before, after);
        assert_eq!(pending.len(), 199);
    }

    /// Frames encoded one after another into a send buffer, whose numbers
    /// repeat, go up by one (with and without a carry, past eight digits)
    /// or jump, are the bytes that plain formatting gives.
    #[test]
    fn frames_encoded_into_the_send_buffer_are_canonical() {
        use crate::wire::{Atom, ClientFrame};
        use core::num::NonZeroU64;
        let mut rng = Rng::new(21);
        let mut out = SendBuffer::default();
        let mut expected = Vec::new();
        let mut sent = Vec::new();
        let mut id = 0u64;
        let (key, owner) = (Atom::new("lock/7").unwrap(), Atom::new("me").unwrap());
        let starts = [0, 8, 9, 98, 99_999_990, 999_999_995, u64::MAX - 30];
        for step in 0..20_000u64 {
            id = match rng.up_to(40) {
                0 => starts[rng.up_to(starts.len() as u64 - 1) as usize],
                1 => rng.up_to(u64::MAX),
                _ => id.wrapping_add(1),
            };
            let number = match rng.up_to(3) {
                0 => 60_000,
                1 => step % 20,
                _ => rng.up_to(u64::MAX) >> rng.up_to(63),
            };
            let lease = NonZeroU64::new(number.max(1)).unwrap();
            let frame = match rng.up_to(2) {
                0 => ClientFrame::Acquire {
                    id,
                    key,
                    owner,
                    wait_ms: number,
                    lease_ms: lease,
                },
                1 => ClientFrame::Release {
                    id,
                    key,
                    token: number,
                },
                _ => ClientFrame::Renew {
                    id,
                    key,
                    token: step,
                    lease_ms: lease,
                },
            };
            frame.encode(out.writer());
            let text = match frame {
                ClientFrame::Acquire { .. } => format!("A {id} lock/7 me {number} {lease}\n"),
                ClientFrame::Release { .. } => format!("R {id} lock/7 {number}\n"),
                _ => format!("X {id} lock/7 {step} {lease}\n"),
            };
            expected.extend_from_slice(text.as_bytes());
            if rng.chance(1, 50) {
                sent.extend_from_slice(&out.take().unwrap());
            }
        }
        sent.extend_from_slice(&out.take().unwrap_or_default());
        assert_eq!(out.take(), None);
        assert!(sent == expected, "the bytes differ");
    }

    /// Makes room for `n` bytes at the end of `out` and writes `byte` over it.
    fn write(out: &mut impl LineBuf, n: usize, byte: u8) {
        out.grow(n).fill(byte);
    }

    /// Room made with `grow` or `grow_with_digits` and written over, some
    /// of it truncated, and sends taken now and then: the send buffer
    /// holds, and hands out, what a `Vec<u8>` does.
    #[test]
    fn a_send_buffer_holds_what_a_vec_does() {
        let mut rng = Rng::new(23);
        let mut out = SendBuffer::default();
        let mut model: Vec<u8> = Vec::new();
        for step in 0..20_000u64 {
            let byte = step as u8;
            match rng.up_to(9) {
                0..=6 => {
                    // Mostly a frame's worth, now and then more than the
                    // room made at once.
                    let most = if rng.chance(1, 50) { 3 * ROOM_STEP } else { 60 };
                    let n = rng.up_to(most as u64) as usize;
                    if rng.chance(1, 2) {
                        write(&mut out, n, byte);
                    } else {
                        out.grow_with_digits(n).0.fill(byte);
                    }
                    write(&mut model, n, byte);
                }
                7 | 8 => {
                    let len = rng.up_to(model.len() as u64 + 5) as usize;
                    out.truncate(len);
                    LineBuf::truncate(&mut model, len);
                }
                _ => {
                    let sent = out.take();
                    assert_eq!(sent.as_deref(), (!model.is_empty()).then_some(&model[..]));
                    model.clear();
                }
            }
            assert_eq!(out.filled(), model.len(), "step {step}");
        }
    }

    /// An empty send buffer makes room for many frames at once, and goes
    /// on sharing that memory with the sends taken from it; one that a
    /// burst made large is let go with its send, which then holds that
    /// memory alone, and the buffer starts small again.
    #[test]
    fn a_send_buffer_lets_a_burst_go_with_its_send() {
        let mut out = SendBuffer::default();
        write(&mut out, 100, b'a');
        assert!(out.out.capacity() >= SEND_BUFFER_ROOM);
        let small = out.take().unwrap();
        assert!(
            !small.is_unique(),
            "the buffer keeps the rest of its memory"
        );
        for _ in 0..1_000 {
            write(&mut out, 1_000, b'b');
        }
        assert!(out.out.capacity() > SEND_BUFFER_KEPT);
        let burst = out.take().unwrap();
        assert!(burst.is_unique(), "the burst's memory goes with it");
        write(&mut out, 100, b'c');
        assert!(out.out.capacity() <= SEND_BUFFER_KEPT);
    }

    /// Random inserts and removals of ids, mostly in sequence, compared
    /// with a `BTreeMap`; the ring stays large enough, and when it grows
    /// it takes back the ids that outlived a round; `drain` gives them in
    /// id order.
    #[test]
    fn pending_requests_behave_like_a_map() {
        let mut rng = Rng::new(11);
        let mut pending: Pending<u32> = Pending::default();
        let mut model: BTreeMap<u64, u32> = BTreeMap::new();
        let mut next = 1u64;
        for step in 0..50_000u32 {
            if rng.chance(1, 2) {
                let id = match rng.up_to(20) {
                    0 => u64::MAX - rng.up_to(1_000),
                    // The bucket of one in flight, so that it moves on.
                    1 => next + 16 * (1 + rng.up_to(64)),
                    2 => 0,
                    _ => {
                        next += 1;
                        next
                    }
                };
                if let std::collections::btree_map::Entry::Vacant(e) = model.entry(id) {
                    e.insert(step);
                    let buckets = pending.ring.len();
                    pending.insert(id, step);
                    if pending.ring.len() != buckets {
                        // A grown ring took back every id whose new bucket
                        // was free: those still far lost theirs to another.
                        let mask = pending.ring.len() - 1;
                        let taken = |(id, _): (u64, u32)| pending.ring[id as usize & mask].0 != 0;
                        assert!(pending.far.iter().all(taken));
                    }
                }
            } else {
                let id = match rng.up_to(10) {
                    0 => 0,
                    1 => next + 16 * rng.up_to(64),
                    _ => next.saturating_sub(rng.up_to(200)),
                };
                assert_eq!(pending.get(id), model.get(&id).copied());
                assert_eq!(pending.remove(id), model.remove(&id));
            }
            assert_eq!(pending.len(), model.len());
            // At least 8/7 as many buckets as ids in the ring or far.
            let in_ring_or_far = pending.len() - usize::from(pending.zero.is_some());
            assert!(8 * in_ring_or_far <= 7 * pending.ring.len(), "step {step}");
        }
        let mut listed: Vec<(u64, u32)> = pending.iter().collect();
        listed.sort_unstable();
        let expected: Vec<(u64, u32)> = model.into_iter().collect();
        assert_eq!(listed, expected);
        assert_eq!(pending.drain(), expected);
        assert_eq!(pending.len(), 0);
    }
}
