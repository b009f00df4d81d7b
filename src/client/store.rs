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
//! few *lanes* of timers, each a list in deadline order threaded through
//! the slots: a new timer joins the lane whose last deadline is the latest
//! not after its own, and only a timer that fits no lane goes into a binary
//! heap. The kinds sort themselves into lanes; nobody tells the slab which
//! is which. Arming and disarming a lane timer is linking and unlinking
//! one node; the earliest deadline is the least of the lanes' first ones
//! and the heap's top, kept up to date, so it is always exact. Timers due
//! at one moment fire in slot order, whatever lanes they are in.
//!
//! The heap does not look for a timer it holds when the timer is set again
//! or cleared: an entry is live while its slot's timer is in the heap with
//! the entry's deadline (one left over from a timer set again to the same
//! deadline is that timer's twin, harmless: whichever comes first fires it),
//! and the others are dropped when they reach the top, and all at once when
//! they outnumber half the live.

use core::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

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

/// A timer in the heap: live while its slot's timer is in the heap, due
/// at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Time,
    slot: u32,
}

/// How many lanes a slab's timers have.
const LANES: usize = 4;
/// No slot: the end of a lane.
const NIL: u32 = u32::MAX;

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

/// What a slab keeps of a slot besides its entry: its generation, and its
/// timer: the deadline, where it is, and its neighbours in its lane.
#[derive(Debug, Clone, Copy)]
struct Node {
    at: Time,
    place: Place,
    prev: u32,
    next: u32,
    /// Bumped whenever the slot is emptied.
    gen: u32,
}

const UNARMED: Node = Node {
    at: Time::ZERO,
    place: Place::Nowhere,
    prev: NIL,
    next: NIL,
    gen: 0,
};

/// A lane: the first and last slot of a list in deadline order.
#[derive(Debug, Clone, Copy)]
struct Lane {
    head: u32,
    tail: u32,
    /// The first deadline ([`Time::MAX`] while the lane is empty).
    first: Time,
    /// The last deadline, while the lane is not empty.
    last: Time,
}

const EMPTY_LANE: Lane = Lane {
    head: NIL,
    tail: NIL,
    first: Time::MAX,
    last: Time::ZERO,
};

/// The timers of a slab, one per slot at most.
struct Timers {
    nodes: Vec<Node>,
    lanes: [Lane; LANES],
    heap: BinaryHeap<Reverse<Timer>>,
    /// Live entries of the heap (the others are dead, or twins).
    heap_live: usize,
    /// The earliest armed deadline.
    earliest: Option<Time>,
}

impl Default for Timers {
    fn default() -> Timers {
        Timers {
            nodes: Vec::new(),
            lanes: [EMPTY_LANE; LANES],
            heap: BinaryHeap::new(),
            heap_live: 0,
            earliest: None,
        }
    }
}

impl Timers {
    fn is_live(&self, timer: &Timer) -> bool {
        let node = &self.nodes[timer.slot as usize];
        node.place == Place::Heap && node.at == timer.at
    }

    /// Arms `slot`'s timer at `at`, replacing the one armed before.
    #[inline]
    fn arm(&mut self, slot: u32, at: Time) {
        if self.nodes[slot as usize].place != Place::Nowhere {
            self.disarm(slot);
        }
        match self.lane_for(at) {
            Some(lane) => self.link(slot, at, lane),
            None => self.push_heap(slot, at),
        }
        if self.earliest.map_or(true, |earliest| at < earliest) {
            self.earliest = Some(at);
        }
    }

    /// The lane a timer due at `at` joins: the one whose last deadline is
    /// the latest not after `at`, else an empty one, else none (the heap).
    #[inline(always)]
    fn lane_for(&self, at: Time) -> Option<usize> {
        // No lane: `LANES`.
        let (mut best, mut empty) = (LANES, LANES);
        let mut best_last = Time::ZERO;
        for (index, lane) in self.lanes.iter().enumerate() {
            if lane.tail == NIL {
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

    /// Puts `slot`'s timer, due at `at`, into the heap.
    fn push_heap(&mut self, slot: u32, at: Time) {
        let node = &mut self.nodes[slot as usize];
        node.place = Place::Heap;
        node.at = at;
        self.heap.push(Reverse(Timer { at, slot }));
        self.heap_live += 1;
    }

    /// Appends `slot`, due at `at`, to `lane`.
    fn link(&mut self, slot: u32, at: Time, lane: usize) {
        let tail = self.lanes[lane].tail;
        self.nodes[slot as usize] = Node {
            at,
            place: Place::Lane(lane as u8),
            prev: tail,
            next: NIL,
            gen: self.nodes[slot as usize].gen,
        };
        if tail == NIL {
            self.lanes[lane].head = slot;
            self.lanes[lane].first = at;
        } else {
            self.nodes[tail as usize].next = slot;
        }
        self.lanes[lane].tail = slot;
        self.lanes[lane].last = at;
    }

    /// Disarms `slot`'s timer, if armed.
    #[inline]
    fn disarm(&mut self, slot: u32) {
        let node = self.nodes[slot as usize];
        let Place::Lane(lane) = node.place else {
            if node.place == Place::Heap {
                self.disarm_heap(slot);
            }
            return;
        };
        let lane = usize::from(lane);
        self.nodes[slot as usize].place = Place::Nowhere;
        if node.next == NIL {
            self.lanes[lane].tail = node.prev;
            if node.prev != NIL {
                self.lanes[lane].last = self.nodes[node.prev as usize].at;
            }
        } else {
            self.nodes[node.next as usize].prev = node.prev;
        }
        if node.prev == NIL {
            // It was first in its lane.
            self.lanes[lane].head = node.next;
            self.lanes[lane].first = match node.next {
                NIL => Time::MAX,
                next => self.nodes[next as usize].at,
            };
            // Only the earliest timer's going moves the earliest deadline.
            if self.earliest == Some(node.at) {
                self.earliest = self.find_earliest();
            }
        } else {
            self.nodes[node.prev as usize].next = node.next;
        }
    }

    /// Disarms `slot`'s timer, in the heap.
    #[cold]
    fn disarm_heap(&mut self, slot: u32) {
        self.nodes[slot as usize].place = Place::Nowhere;
        self.heap_live -= 1;
        let top = self.heap.peek().map(|Reverse(top)| top.slot);
        if top == Some(slot) {
            self.settle_heap();
            self.earliest = self.find_earliest();
        } else if self.heap.len() > self.heap_live + self.heap_live / 2 + 64 {
            self.sweep_heap();
        }
    }

    /// Drops the dead entries at the top of the heap.
    fn settle_heap(&mut self) {
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.is_live(top) {
                break;
            }
            self.heap.pop();
        }
    }

    /// Drops every dead entry of the heap.
    #[cold]
    fn sweep_heap(&mut self) {
        let nodes = &self.nodes;
        let mut entries = core::mem::take(&mut self.heap).into_vec();
        entries.retain(|Reverse(timer)| {
            let node = &nodes[timer.slot as usize];
            node.place == Place::Heap && node.at == timer.at
        });
        // One entry per timer: a twin goes.
        entries.sort_unstable();
        entries.dedup();
        if entries.capacity() > 2 * entries.len() + 64 {
            entries.shrink_to(entries.len() + entries.len() / 8 + 64);
        }
        self.heap = BinaryHeap::from(entries);
    }

    /// The least of the lanes' first deadlines and the heap's top.
    #[inline]
    fn find_earliest(&self) -> Option<Time> {
        let top = self.heap.peek().map_or(Time::MAX, |Reverse(top)| top.at);
        let first = self
            .lanes
            .iter()
            .fold(top, |first, lane| first.min(lane.first));
        // `Time::MAX` is a deadline too, or that none is armed.
        if first == Time::MAX && self.heap.is_empty() && self.lanes.iter().all(|l| l.head == NIL) {
            return None;
        }
        Some(first)
    }

    /// The earliest armed deadline.
    fn next(&self) -> Option<Time> {
        debug_assert_eq!(self.earliest, self.find_earliest());
        self.earliest
    }

    /// The slot whose timer is due first at `now`, its timer disarmed;
    /// deadlines tie in slot order.
    fn pop_due(&mut self, now: Time) -> Option<u32> {
        let at = self.next().filter(|&at| at <= now)?;
        // Every lane timer due at `at` joins the heap, which orders them by
        // slot; in a lane they are the first ones.
        for lane in 0..LANES {
            loop {
                let head = self.lanes[lane].head;
                if head == NIL || self.nodes[head as usize].at != at {
                    break;
                }
                self.disarm(head);
                self.push_heap(head, at);
            }
        }
        let Reverse(first) = *self.heap.peek().expect("a timer is due");
        self.disarm(first.slot);
        self.earliest = self.find_earliest();
        Some(first.slot)
    }

    /// The deadline armed for `slot`.
    #[cfg(test)]
    fn armed_at(&self, slot: u32) -> Option<Time> {
        let node = &self.nodes[slot as usize];
        (node.place != Place::Nowhere).then_some(node.at)
    }
}

/// Entries of type `T`, each with one timer.
pub(crate) struct Slab<T> {
    slots: Vec<Option<T>>,
    free: Vec<u32>,
    len: usize,
    timers: Timers,
}

impl<T> Default for Slab<T> {
    fn default() -> Slab<T> {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            timers: Timers::default(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value`, with no timer.
    pub(crate) fn insert(&mut self, value: T) -> Handle {
        self.len += 1;
        if let Some(slot) = self.free.pop() {
            self.slots[slot as usize] = Some(value);
            return Handle {
                slot,
                gen: self.timers.nodes[slot as usize].gen,
            };
        }
        if self.slots.len() == self.slots.capacity() {
            // An eighth more at a time: never much more memory than in use.
            let more = self.slots.len() / 8 + 16;
            self.slots.reserve_exact(more);
            self.timers.nodes.reserve_exact(more);
        }
        let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 entries");
        self.slots.push(Some(value));
        self.timers.nodes.push(UNARMED);
        Handle { slot, gen: 0 }
    }

    /// Whether `handle` names the entry in its slot now.
    fn is_current(&self, handle: Handle) -> bool {
        self.timers
            .nodes
            .get(handle.slot as usize)
            .is_some_and(|node| node.gen == handle.gen)
    }

    /// Whether `handle`'s entry is stored.
    pub(crate) fn contains(&self, handle: Handle) -> bool {
        self.get(handle).is_some()
    }

    /// The entry, if stored.
    pub(crate) fn get(&self, handle: Handle) -> Option<&T> {
        if !self.is_current(handle) {
            return None;
        }
        self.slots[handle.slot as usize].as_ref()
    }

    /// The entry, if stored.
    pub(crate) fn get_mut(&mut self, handle: Handle) -> Option<&mut T> {
        if !self.is_current(handle) {
            return None;
        }
        self.slots[handle.slot as usize].as_mut()
    }

    /// Takes the entry out, with its timer.
    pub(crate) fn remove(&mut self, handle: Handle) -> Option<T> {
        if !self.is_current(handle) {
            return None;
        }
        let value = self.slots[handle.slot as usize].take()?;
        self.timers.disarm(handle.slot);
        let node = &mut self.timers.nodes[handle.slot as usize];
        node.gen = node.gen.wrapping_add(1);
        self.free.push(handle.slot);
        self.len -= 1;
        Some(value)
    }

    /// How many entries are stored.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every entry, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Handle, &T)> + '_ {
        let nodes = &self.timers.nodes;
        self.slots
            .iter()
            .enumerate()
            .filter_map(move |(slot, entry)| {
                let value = entry.as_ref()?;
                let handle = Handle {
                    slot: slot as u32,
                    gen: nodes[slot].gen,
                };
                Some((handle, value))
            })
    }

    /// The handles of every entry, in slot order.
    pub(crate) fn handles(&self) -> Vec<Handle> {
        self.iter().map(|(handle, _)| handle).collect()
    }

    /// Arms the entry's timer at `at`, replacing the one armed before.
    pub(crate) fn set_timer(&mut self, handle: Handle, at: Time) {
        if self.contains(handle) {
            self.timers.arm(handle.slot, at);
        }
    }

    /// Disarms the entry's timer, if armed.
    #[cfg(test)]
    pub(crate) fn clear_timer(&mut self, handle: Handle) {
        if self.contains(handle) {
            self.timers.disarm(handle.slot);
        }
    }

    /// The earliest armed deadline.
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        self.timers.next()
    }

    /// The entry whose timer is due first at `now` (its deadline at or
    /// before it), its timer disarmed; deadlines tie in slot order.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<Handle> {
        let slot = self.timers.pop_due(now)?;
        Some(Handle {
            slot,
            gen: self.timers.nodes[slot as usize].gen,
        })
    }

    /// The entry's armed deadline (a scan: for tests).
    #[cfg(test)]
    pub(crate) fn timer(&self, handle: Handle) -> Option<Time> {
        self.get(handle)?;
        self.timers.armed_at(handle.slot)
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

    /// The first handle whose entry is still in `slab`.
    pub(crate) fn pop<T>(&mut self, slab: &Slab<T>) -> Option<Handle> {
        let found = loop {
            let Some(handle) = self.handles.pop_front() else {
                break None;
            };
            if slab.contains(handle) {
                self.waiting -= 1;
                break Some(handle);
            }
        };
        self.drop_stale(slab);
        give_back(&mut self.handles);
        found
    }

    /// An entry of `slab` that waited here left without being popped.
    pub(crate) fn forget<T>(&mut self, slab: &Slab<T>) {
        self.waiting -= 1;
        self.drop_stale(slab);
    }

    /// Drops every stale handle once they outnumber the waiting ones (and
    /// a few more).
    fn drop_stale<T>(&mut self, slab: &Slab<T>) {
        if self.handles.len() > 2 * self.waiting + 64 {
            self.handles.retain(|&handle| slab.contains(handle));
        }
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
            // Dead heap entries never outnumber the live ones by much, and
            // the lanes are in deadline order with every armed timer once.
            let t = &slab.timers;
            assert!(t.heap.len() <= t.heap_live + t.heap_live / 2 + 64);
            let mut in_lanes = 0;
            for lane in &t.lanes {
                let (mut at, mut last) = (lane.head, None);
                while at != NIL {
                    let node = &t.nodes[at as usize];
                    assert!(last.map_or(true, |last| last <= node.at), "in order");
                    last = Some(node.at);
                    in_lanes += 1;
                    at = node.next;
                }
                if lane.tail != NIL {
                    assert_eq!(Some(lane.last), last);
                }
            }
            assert_eq!(in_lanes + t.heap_live, armed.len());
        }
    }

    /// Random pushes at both ends, pops, and entries leaving early,
    /// compared with a `VecDeque` that removes them at once.
    #[test]
    fn a_fifo_behaves_like_a_queue_that_removes_at_once() {
        for seed in 0..40 {
            let mut rng = Rng::new(100 + seed);
            let mut slab: Slab<()> = Slab::default();
            let mut fifo = Fifo::default();
            let mut model: VecDeque<Handle> = VecDeque::new();
            for _ in 0..5_000 {
                match rng.up_to(5) {
                    0 | 1 => {
                        let handle = slab.insert(());
                        fifo.push_back(handle);
                        model.push_back(handle);
                    }
                    2 => {
                        let handle = slab.insert(());
                        fifo.push_front(handle);
                        model.push_front(handle);
                    }
                    3 => {
                        let popped = fifo.pop(&slab);
                        assert_eq!(popped, model.pop_front());
                        if let Some(handle) = popped {
                            slab.remove(handle);
                        }
                    }
                    _ => {
                        if !model.is_empty() {
                            let at = rng.up_to(model.len() as u64 - 1) as usize;
                            let handle = model.remove(at).unwrap();
                            slab.remove(handle);
                            fifo.forget(&slab);
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
        while let Some(handle) = fifo.pop(&slab) {
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
