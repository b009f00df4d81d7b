//! Where the client core keeps what it knows: slabs of entries with one
//! timer each, the queues of entries waiting to be sent, and the requests
//! in flight by id.
//!
//! This is the only module of `client/` that knows how anything is stored;
//! the rules see four small interfaces:
//!
//! * [`Slab`]: `insert`, `get`, `remove`, and per entry one timer,
//!   `set_timer(entry, at)`, with `next_deadline` and `pop_due`;
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
//! few *lanes* of timers, each a queue in deadline order: a new timer joins
//! the lane whose last deadline is the latest not after its own, and only
//! a timer that fits no lane goes into a binary heap. The kinds sort
//! themselves into lanes; nobody tells the slab which is which.
//!
//! A timer that is disarmed, or set again, is not looked for: its entry
//! stays where it is, dead (each slot stamps its timer anew whenever it is
//! armed, and an entry is live while its stamp is its slot's), and is
//! dropped when it comes to the front, or with every dead entry of its
//! lane once they outnumber the live ones. So arming is a push and
//! disarming touches the slot alone, never a neighbour: with thousands of
//! requests in flight and answers in any order, the memory an answer
//! touches is what the answer is about. A lane's first entry is always
//! live, so the earliest deadline, the least of the lanes' first ones and
//! the heap's top, is always exact. Timers due at one moment fire in slot
//! order, whatever lanes they are in.
//!
//! A slot keeps its entry, generation and timer side by side, in one place
//! in memory.

use core::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use bytes::{Bytes, BytesMut};

use crate::hash::IdMap;
use crate::time::Time;

/// What a queue keeps of its capacity once a burst has drained from it:
/// more than steady traffic needs between two polls.
const KEPT_WHEN_EMPTY: usize = 4096;

/// Gives back most of what a burst made `queue` grow to, once it is empty.
pub(crate) fn give_back<T>(queue: &mut VecDeque<T>) {
    if queue.is_empty() && queue.capacity() > KEPT_WHEN_EMPTY {
        queue.shrink_to(KEPT_WHEN_EMPTY);
    }
}

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

/// Where a slot's timer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// No timer is armed.
    Nowhere,
    /// In this lane.
    Lane(u8),
    /// In the heap.
    Heap,
}

/// One slot: its entry, its generation, and its timer, side by side, so
/// that an entry and all that is known of it are in one place in memory.
struct Slot<T> {
    value: Option<T>,
    /// Bumped whenever the slot is emptied.
    gen: u32,
    /// Bumped whenever the timer is armed: the lane or heap entry made
    /// then carries it, and is live while the slot's timer is still that
    /// one. Before it comes round to a value again, every dead entry goes
    /// (see [`Slab::stamp`]), so no dead entry can ever pass for live.
    stamp: u16,
    place: Place,
    /// The timer's deadline, while armed.
    at: Time,
}

/// An entry of a lane: slot `slot`'s timer as armed with `stamp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Armed {
    slot: u32,
    stamp: u16,
}

/// A lane: timers in the order of their deadlines, oldest first, some of
/// them dead (disarmed or set again since); its first one is always live.
#[derive(Debug, Default)]
struct Lane {
    entries: VecDeque<Armed>,
    /// The live entries.
    live: usize,
    /// The first entry's deadline (meaningless while the lane is empty).
    first: Time,
    /// The last entry's deadline (meaningless while the lane is empty).
    last: Time,
}

/// The heap's entries: `(deadline, slot, stamp)`, so that timers due at
/// one moment come out in slot order.
type HeapEntry = Reverse<(Time, u32, u16)>;

/// Entries of type `T`, each with one timer.
pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
    lanes: [Lane; LANES],
    heap: BinaryHeap<HeapEntry>,
    /// Live entries of the heap.
    heap_live: usize,
    /// The earliest armed deadline.
    earliest: Option<Time>,
}

impl<T> Default for Slab<T> {
    fn default() -> Slab<T> {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            lanes: Default::default(),
            heap: BinaryHeap::new(),
            heap_live: 0,
            earliest: None,
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
        let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 entries");
        self.slots.push(Slot {
            value: Some(value),
            gen: 0,
            stamp: 0,
            place: Place::Nowhere,
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

    /// Takes the entry out, with its timer.
    pub(crate) fn remove(&mut self, handle: Handle) -> Option<T> {
        self.slot(handle)?;
        self.disarm(handle.slot);
        let slot = &mut self.slots[handle.slot as usize];
        slot.gen = slot.gen.wrapping_add(1);
        let value = slot.value.take();
        self.free.push(handle.slot);
        self.len -= 1;
        value
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
        self.earliest
    }

    /// The entry whose timer is due first at `now` (its deadline at or
    /// before it), its timer disarmed; deadlines tie in slot order.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<Handle> {
        let at = self.next_deadline().filter(|&at| at <= now)?;
        // Every lane timer due at `at` joins the heap, which orders them by
        // slot; in a lane they are the first ones.
        for lane in 0..LANES {
            while self.lanes[lane].live > 0 && self.lanes[lane].first == at {
                let Armed { slot, .. } = self.lanes[lane].entries[0];
                self.disarm(slot);
                self.push_heap(slot, at);
            }
        }
        let Reverse((_, slot, _)) = *self.heap.peek().expect("a timer is due");
        self.disarm(slot);
        self.earliest = self.find_earliest();
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

    /// Arms `slot`'s timer at `at`, replacing the one armed before.
    #[inline]
    fn arm(&mut self, slot: u32, at: Time) {
        self.disarm(slot);
        match self.lane_for(at) {
            Some(lane) => self.push_lane(slot, at, lane),
            None => self.push_heap(slot, at),
        }
        if self.earliest.map_or(true, |earliest| at < earliest) {
            self.earliest = Some(at);
        }
    }

    /// A new stamp for `slot`'s timer, disarmed, armed at `at` in `place`.
    #[inline]
    fn stamp(&mut self, slot: u32, at: Time, place: Place) -> u16 {
        let stamp = self.slots[slot as usize].stamp.wrapping_add(1);
        if stamp == 0 {
            // The stamps of this slot come round: its dead entries go
            // first, while they can still be told from live ones.
            self.sweep();
        }
        let slot = &mut self.slots[slot as usize];
        slot.stamp = stamp;
        slot.place = place;
        slot.at = at;
        stamp
    }

    /// Drops every dead entry, of every lane and of the heap.
    #[cold]
    fn sweep(&mut self) {
        for index in 0..LANES {
            self.sweep_lane(index);
        }
        self.sweep_heap();
    }

    /// The lane a timer due at `at` joins: the one whose last deadline is
    /// the latest not after `at`, else an empty one, else none (the heap).
    #[inline(always)]
    fn lane_for(&self, at: Time) -> Option<usize> {
        // No lane: `LANES`.
        let (mut best, mut empty) = (LANES, LANES);
        let mut best_last = Time::ZERO;
        for (index, lane) in self.lanes.iter().enumerate() {
            if lane.live == 0 {
                if empty == LANES {
                    empty = index;
                }
            } else if lane.last <= at && (best == LANES || lane.last > best_last) {
                best = index;
                best_last = lane.last;
            }
        }
        let lane = if best < LANES { best } else { empty };
        (lane < LANES).then_some(lane)
    }

    /// Appends `slot`'s timer, due at `at`, to `lane`.
    #[inline]
    fn push_lane(&mut self, slot: u32, at: Time, index: usize) {
        let stamp = self.stamp(slot, at, Place::Lane(index as u8));
        let lane = &mut self.lanes[index];
        if lane.live == 0 {
            lane.first = at;
        }
        if lane.entries.len() == lane.entries.capacity() {
            // An eighth more at a time, as the slots grow.
            let more = lane.entries.len() / 8 + 16;
            lane.entries.reserve_exact(more);
        }
        lane.entries.push_back(Armed { slot, stamp });
        lane.live += 1;
        lane.last = at;
    }

    /// Puts `slot`'s timer, due at `at`, into the heap.
    fn push_heap(&mut self, slot: u32, at: Time) {
        let stamp = self.stamp(slot, at, Place::Heap);
        self.heap.push(Reverse((at, slot, stamp)));
        self.heap_live += 1;
    }

    /// Whether `entry` of lane `lane` is its slot's timer now.
    #[inline]
    fn is_live(slots: &[Slot<T>], entry: Armed, lane: usize) -> bool {
        let slot = &slots[entry.slot as usize];
        slot.stamp == entry.stamp && slot.place == Place::Lane(lane as u8)
    }

    /// Disarms `slot`'s timer, if armed. Its lane or heap entry stays
    /// behind, dead, unless it was first.
    #[inline(always)]
    fn disarm(&mut self, slot: u32) {
        let entry = &mut self.slots[slot as usize];
        let (place, stamp, at) = (entry.place, entry.stamp, entry.at);
        if place == Place::Nowhere {
            return;
        }
        entry.place = Place::Nowhere;
        match place {
            Place::Lane(index) => {
                let index = usize::from(index);
                let lane = &mut self.lanes[index];
                lane.live -= 1;
                let first = lane.entries.front() == Some(&Armed { slot, stamp });
                if first || lane.live == 0 || lane.entries.len() > 2 * lane.live + 64 {
                    self.tidy_lane(index);
                }
            }
            _ => self.disarm_in_heap(slot, stamp, at),
        }
        // Only the earliest timer's going moves the earliest deadline.
        if self.earliest == Some(at) {
            self.earliest = self.find_earliest();
        }
    }

    /// After a timer of lane `index` was disarmed: empties a lane with no
    /// live entry, drops the dead ones at its front, or all of them once
    /// they outnumber the live ones.
    #[inline(never)]
    fn tidy_lane(&mut self, index: usize) {
        let lane = &mut self.lanes[index];
        if lane.live == 0 {
            lane.entries.clear();
            give_back(&mut lane.entries);
        } else if lane.entries.len() > 2 * lane.live + 64 {
            self.sweep_lane(index);
            self.settle_lane(index);
        } else {
            self.settle_lane(index);
        }
    }

    /// Disarms `slot`'s timer, armed with `stamp` at `at` in the heap.
    #[cold]
    fn disarm_in_heap(&mut self, slot: u32, stamp: u16, at: Time) {
        self.heap_live -= 1;
        if self.heap.peek() == Some(&Reverse((at, slot, stamp))) {
            self.settle_heap();
        } else if self.heap.len() > self.heap_live + self.heap_live / 2 + 64 {
            self.sweep_heap();
        }
    }

    /// Drops the dead entries at the front of a lane that has live ones.
    fn settle_lane(&mut self, index: usize) {
        let lane = &mut self.lanes[index];
        while let Some(&front) = lane.entries.front() {
            if Self::is_live(&self.slots, front, index) {
                lane.first = self.slots[front.slot as usize].at;
                return;
            }
            lane.entries.pop_front();
        }
        unreachable!("a lane with live entries has a live first one");
    }

    /// Drops every dead entry of a lane.
    #[cold]
    fn sweep_lane(&mut self, index: usize) {
        let slots = &self.slots;
        let lane = &mut self.lanes[index];
        lane.entries
            .retain(|&entry| Self::is_live(slots, entry, index));
        // What a burst left behind goes back; the working size stays.
        if lane.entries.capacity() > 4 * lane.entries.len() + KEPT_WHEN_EMPTY {
            lane.entries
                .shrink_to(2 * lane.entries.len() + KEPT_WHEN_EMPTY);
        }
    }

    /// Whether `entry` of the heap is its slot's timer now.
    fn is_live_in_heap(slots: &[Slot<T>], entry: &HeapEntry) -> bool {
        let Reverse((at, slot, stamp)) = *entry;
        let slot = &slots[slot as usize];
        slot.stamp == stamp && slot.place == Place::Heap && slot.at == at
    }

    /// Drops the dead entries at the top of the heap.
    fn settle_heap(&mut self) {
        while let Some(top) = self.heap.peek() {
            if Self::is_live_in_heap(&self.slots, top) {
                break;
            }
            self.heap.pop();
        }
    }

    /// Drops every dead entry of the heap.
    #[cold]
    fn sweep_heap(&mut self) {
        let slots = &self.slots;
        let mut entries = core::mem::take(&mut self.heap).into_vec();
        entries.retain(|entry| Self::is_live_in_heap(slots, entry));
        if entries.capacity() > 4 * entries.len() + KEPT_WHEN_EMPTY {
            entries.shrink_to(2 * entries.len() + KEPT_WHEN_EMPTY);
        }
        self.heap = BinaryHeap::from(entries);
    }

    /// The least of the lanes' first deadlines and the heap's top.
    #[inline]
    fn find_earliest(&self) -> Option<Time> {
        let top = self.heap.peek().map(|Reverse((at, _, _))| *at);
        let firsts = self
            .lanes
            .iter()
            .filter(|lane| lane.live > 0)
            .map(|lane| lane.first);
        firsts.chain(top).min()
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

/// What a send buffer keeps of its capacity after a burst.
const SEND_BUFFER_KEPT: usize = 256 * 1024;
/// The room a send buffer makes at once when it starts filling again.
const SEND_BUFFER_ROOM: usize = 64 * 1024;

/// The bytes encoded and not yet handed out, taken as one send at a time.
#[derive(Default)]
pub(crate) struct SendBuffer {
    out: BytesMut,
}

impl SendBuffer {
    /// The buffer to encode the next frame into. An empty one first makes
    /// room for many frames: once the sends taken from it are dropped, that
    /// takes its memory back without copying any byte, where running out
    /// of room later would copy what it holds.
    pub(crate) fn writer(&mut self) -> &mut BytesMut {
        if self.out.is_empty() {
            self.out.reserve(SEND_BUFFER_ROOM);
        }
        &mut self.out
    }

    /// Everything encoded so far, if anything; a buffer that a burst made
    /// large is let go with it.
    pub(crate) fn take(&mut self) -> Option<Bytes> {
        if self.out.is_empty() {
            return None;
        }
        let burst = self.out.capacity() > SEND_BUFFER_KEPT;
        let data = self.out.split().freeze();
        if burst {
            self.out = BytesMut::new();
        }
        Some(data)
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
    far: IdMap<u64, R>,
    /// The request of id 0, if in flight.
    zero: Option<R>,
    len: usize,
}

impl<R> Default for Pending<R> {
    fn default() -> Pending<R> {
        Pending {
            ring: Vec::new(),
            far: IdMap::default(),
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
            _ => self.far.get(&id).copied(),
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
                _ => self.far.remove(&id),
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
        if self.far.capacity() > KEPT_WHEN_EMPTY {
            self.far.shrink_to(0);
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
        let far = core::mem::take(&mut self.far);
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
        let far = self.far.iter().map(|(&id, &request)| (id, request));
        self.zero.map(|r| (0, r)).into_iter().chain(ring).chain(far)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    use super::*;
    use crate::rng::Rng;

    /// Dead entries never outnumber the live ones by much, every lane's
    /// live entries are in deadline order behind a live first one, and the
    /// live entries are as many as the counts say.
    fn assert_sound<T>(slab: &Slab<T>) {
        let t = slab;
        assert!(t.heap.len() <= t.heap_live + t.heap_live / 2 + 64);
        for (index, lane) in t.lanes.iter().enumerate() {
            assert!(lane.entries.len() <= 2 * lane.live + 64);
            let live: Vec<Time> = lane
                .entries
                .iter()
                .filter(|&&entry| Slab::is_live(&t.slots, entry, index))
                .map(|entry| t.slots[entry.slot as usize].at)
                .collect();
            assert_eq!(live.len(), lane.live);
            assert!(live.windows(2).all(|w| w[0] <= w[1]), "in order");
            if let Some(&front) = lane.entries.front() {
                assert!(Slab::is_live(&t.slots, front, index), "a live first one");
                assert_eq!(live[0], lane.first);
            }
        }
        let in_heap = t
            .heap
            .iter()
            .filter(|e| Slab::is_live_in_heap(&t.slots, e))
            .count();
        assert_eq!(in_heap, t.heap_live);
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
                            assert_eq!(slab.remove(handle), None);
                        }
                    }
                    _ => {
                        if let Some(handle) = pick(&mut rng, &entries) {
                            *slab.get_mut(handle).unwrap() += 1;
                            *entries.get_mut(&handle).unwrap() += 1;
                        }
                    }
                }
                assert_eq!(slab.len(), entries.len());
                assert_eq!(
                    slab.next_deadline(),
                    deadlines.first().map(|&(at, _)| at),
                    "seed {seed} step {step}"
                );
                if step % 97 == 0 {
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
            assert_sound(&slab);
            let in_lanes: usize = slab.lanes.iter().map(|lane| lane.live).sum();
            assert_eq!(in_lanes + slab.heap_live, armed.len());
        }
    }

    /// Timers set again and again behind a first one that stays, in lanes
    /// and in the heap, leave dead entries that are swept before they pile
    /// up, and the timers still fire as armed.
    #[test]
    fn timers_set_again_behind_the_first_are_swept() {
        let mut rng = Rng::new(7);
        let mut slab: Slab<u32> = Slab::default();
        let mut armed: BTreeMap<u32, Time> = BTreeMap::new();
        let handles: Vec<Handle> = (0..200).map(|i| slab.insert(i)).collect();
        // Deadlines that go down, so that past four lanes they go to the
        // heap, and a first one that never moves.
        for (i, &handle) in handles.iter().enumerate() {
            let at = Time::from_nanos(if i == 0 { 1 } else { 1_000_000 - 10 * i as u64 });
            slab.set_timer(handle, at);
            armed.insert(handle.slot(), at);
        }
        let (mut swept_lane, mut swept_heap) = (false, false);
        for round in 0..20_000u64 {
            let handle = handles[1 + rng.up_to(198) as usize];
            let at = Time::from_nanos(2_000_000 + round);
            slab.set_timer(handle, at);
            armed.insert(handle.slot(), at);
            assert_sound(&slab);
            let lanes: usize = slab.lanes.iter().map(|l| l.entries.len()).sum();
            let live: usize = slab.lanes.iter().map(|l| l.live).sum();
            // Dead entries were there, and are gone.
            swept_lane |= round > 1_000 && lanes < live + 10;
            swept_heap |= slab.heap_live > 0 && slab.heap.len() < 140;
            assert_eq!(slab.next_deadline(), Some(Time::from_nanos(1)));
        }
        assert!(swept_lane && swept_heap);
        let mut expected: Vec<(Time, u32)> = armed.iter().map(|(&s, &at)| (at, s)).collect();
        expected.sort();
        let fired: Vec<(Time, u32)> = std::iter::from_fn(|| {
            let handle = slab.pop_due(Time::MAX)?;
            Some((armed[&handle.slot()], handle.slot()))
        })
        .collect();
        assert_eq!(fired, expected);
        assert_eq!(slab.next_deadline(), None);
    }

    /// A slot's stamps come round after 2^16 arms: a dead entry of its
    /// first arm, left in a lane behind a first timer that never moves,
    /// must not pass for live when the stamp it carries comes again.
    #[test]
    fn a_dead_entry_never_passes_for_live_when_stamps_come_round() {
        let mut slab: Slab<()> = Slab::default();
        let (first, other) = (slab.insert(()), slab.insert(()));
        let at = Time::from_nanos;
        slab.set_timer(first, at(1));
        // Behind `first` in its lane, then moved to another lane, leaving
        // a dead entry behind.
        slab.set_timer(other, at(10));
        for _ in 0..u32::from(u16::MAX) {
            slab.set_timer(other, at(5));
        }
        // Its stamps have come round: back into the first lane.
        slab.set_timer(other, at(20));
        assert_sound(&slab);
        assert_eq!(slab.pop_due(Time::MAX), Some(first));
        assert_eq!(slab.pop_due(Time::MAX), Some(other));
        assert_eq!(slab.pop_due(Time::MAX), None);
        assert_sound(&slab);
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

    #[test]
    fn a_drained_burst_gives_its_memory_back() {
        let mut slab: Slab<()> = Slab::default();
        let mut fifo = Fifo::default();
        for _ in 0..100_000 {
            fifo.push_back(slab.insert(()));
        }
        while let Some(handle) = fifo.pop(&slab, |_| true) {
            slab.remove(handle);
        }
        assert!(fifo.handles.capacity() <= KEPT_WHEN_EMPTY);
        let mut pending = Pending::default();
        for id in 0..100_000u64 {
            pending.insert(id, ());
        }
        assert_eq!(pending.drain().len(), 100_000);
        assert!(pending.ring.len() <= KEPT_WHEN_EMPTY && pending.far.capacity() <= KEPT_WHEN_EMPTY);
    }

    /// Random inserts and removals of ids, mostly in sequence, compared
    /// with a `BTreeMap`; `drain` gives them in id order.
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
                    pending.insert(id, step);
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
        }
        let mut listed: Vec<(u64, u32)> = pending.iter().collect();
        listed.sort_unstable();
        let expected: Vec<(u64, u32)> = model.into_iter().collect();
        assert_eq!(listed, expected);
        assert_eq!(pending.drain(), expected);
        assert_eq!(pending.len(), 0);
    }
}
