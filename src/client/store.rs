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
//! few first-in first-out *lanes* of timers, each in deadline order: a new
//! timer joins the lane whose last deadline is the latest not after its
//! own, and only a timer that fits no lane goes into a binary heap. The
//! kinds sort themselves into lanes; nobody tells the slab which is which.
//!
//! Setting a timer again, or clearing it, does not look for its old entry:
//! the slot's stamp changes, and an entry whose stamp is not its slot's is
//! dead. Dead entries are dropped when they reach the front of their lane
//! or the top of the heap (the fronts are kept live, so the earliest
//! deadline is always exact), and all at once when they outnumber half the
//! live ones. Timers due at one moment fire in slot order, whatever lanes
//! they are in.

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

/// A timer: live while `stamp` is its slot's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Time,
    slot: u32,
    stamp: u32,
}

/// How many lanes a slab's timers have.
const LANES: usize = 4;
/// Where a timer is, in the low bits of its stamp: `NOWHERE` (none is
/// armed), lane `i` as `i + 1`, or the heap.
const PLACE_BITS: u32 = 3;
const PLACE_MASK: u32 = (1 << PLACE_BITS) - 1;
const NOWHERE: u32 = 0;
const HEAP: u32 = LANES as u32 + 1;
const PLACES: usize = LANES + 2;

/// The timers of a slab, one per slot at most.
#[derive(Default)]
struct Timers {
    /// Per slot: where its armed timer is (the low bits) and a number that
    /// goes up with every change (the high bits), so that no dead entry of
    /// the slot can look live again. An entry is live while its stamp is
    /// its slot's.
    stamps: Vec<u32>,
    /// Each in non-decreasing deadline order.
    lanes: [VecDeque<Timer>; LANES],
    heap: BinaryHeap<Reverse<Timer>>,
    /// Per place: live entries, and dead ones.
    live: [usize; PLACES],
    dead: [usize; PLACES],
    /// The earliest live deadline: the least of the lanes' fronts and the
    /// heap's top, found again when one of them changes.
    earliest: Option<Time>,
}

impl Timers {
    fn is_live(&self, timer: &Timer) -> bool {
        self.stamps[timer.slot as usize] == timer.stamp
    }

    /// Arms `slot`'s timer at `at`, replacing the one armed before.
    #[inline]
    fn arm(&mut self, slot: u32, at: Time) {
        if self.stamps[slot as usize] & PLACE_MASK != NOWHERE {
            self.disarm(slot);
        }
        let place = self.place_for(at);
        let stamp =
            (self.stamps[slot as usize] & !PLACE_MASK).wrapping_add(1 << PLACE_BITS) | place;
        self.stamps[slot as usize] = stamp;
        let timer = Timer { at, slot, stamp };
        if place == HEAP {
            self.heap.push(Reverse(timer));
        } else {
            self.lanes[place as usize - 1].push_back(timer);
        }
        self.live[place as usize] += 1;
        if self.earliest.map_or(true, |earliest| at < earliest) {
            self.earliest = Some(at);
        }
    }

    /// Where a timer due at `at` goes: the lane whose last deadline is the
    /// latest not after `at`, an empty lane if none, else the heap.
    fn place_for(&self, at: Time) -> u32 {
        let mut best = HEAP;
        let mut best_last = Time::ZERO;
        let mut empty = HEAP;
        for (index, lane) in self.lanes.iter().enumerate() {
            match lane.back() {
                Some(last) if last.at <= at && (best == HEAP || last.at > best_last) => {
                    best = index as u32 + 1;
                    best_last = last.at;
                }
                None if empty == HEAP => empty = index as u32 + 1,
                _ => {}
            }
        }
        if best == HEAP {
            empty
        } else {
            best
        }
    }

    /// Disarms `slot`'s timer, if armed.
    #[inline]
    fn disarm(&mut self, slot: u32) {
        let stamp = self.stamps[slot as usize];
        let place = stamp & PLACE_MASK;
        if place == NOWHERE {
            return;
        }
        self.stamps[slot as usize] = stamp & !PLACE_MASK;
        let at = place as usize;
        self.live[at] -= 1;
        self.dead[at] += 1;
        let is_it = |t: &Timer| t.stamp == stamp && t.slot == slot;
        if place == HEAP {
            if self.heap.peek().is_some_and(|Reverse(top)| is_it(top)) {
                self.settle_heap();
                self.earliest = self.find_earliest();
            }
        } else {
            let lane = place as usize - 1;
            if self.lanes[lane].back().is_some_and(is_it) {
                // Armed last (most often just now): gone at once.
                self.lanes[lane].pop_back();
                self.dead[at] -= 1;
                self.settle_back(lane);
                if self.lanes[lane].is_empty() {
                    // It was the front too.
                    self.earliest = self.find_earliest();
                }
            } else if self.lanes[lane].front().is_some_and(is_it) {
                self.lanes[lane].pop_front();
                self.dead[at] -= 1;
                self.settle_front(lane);
                self.earliest = self.find_earliest();
            }
        }
        if self.dead[at] > self.live[at] / 2 + 64 {
            self.sweep(place);
        }
    }

    /// Drops the dead entries at the front of `lane`.
    #[inline]
    fn settle_front(&mut self, lane: usize) {
        let stamps = &self.stamps;
        let queue = &mut self.lanes[lane];
        while let Some(front) = queue.front() {
            if stamps[front.slot as usize] == front.stamp {
                return;
            }
            queue.pop_front();
            self.dead[lane + 1] -= 1;
        }
        give_back(queue);
    }

    /// Drops the dead entries at the back of `lane`.
    #[inline]
    fn settle_back(&mut self, lane: usize) {
        let stamps = &self.stamps;
        let queue = &mut self.lanes[lane];
        while let Some(back) = queue.back() {
            if stamps[back.slot as usize] == back.stamp {
                return;
            }
            queue.pop_back();
            self.dead[lane + 1] -= 1;
        }
        give_back(queue);
    }

    /// Drops the dead entries at the top of the heap.
    fn settle_heap(&mut self) {
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.is_live(top) {
                break;
            }
            self.heap.pop();
            self.dead[HEAP as usize] -= 1;
        }
    }

    /// Drops every dead entry of `place`.
    fn sweep(&mut self, place: u32) {
        let stamps = &self.stamps;
        let live = |timer: &Timer| stamps[timer.slot as usize] == timer.stamp;
        if place == HEAP {
            self.heap.retain(|Reverse(timer)| live(timer));
            if self.heap.capacity() > 2 * self.heap.len() + 64 {
                self.heap
                    .shrink_to(self.heap.len() + self.heap.len() / 8 + 64);
            }
        } else {
            // The live ones moved down over the dead, in place.
            let lane = &mut self.lanes[place as usize - 1];
            let timers = lane.make_contiguous();
            let mut kept = 0;
            for at in 0..timers.len() {
                if live(&timers[at]) {
                    timers[kept] = timers[at];
                    kept += 1;
                }
            }
            lane.truncate(kept);
            if lane.capacity() > 2 * lane.len() + 64 {
                lane.shrink_to(lane.len() + lane.len() / 8 + 64);
            }
        }
        self.dead[place as usize] = 0;
    }

    /// The least of the lanes' fronts and the heap's top.
    fn find_earliest(&self) -> Option<Time> {
        let fronts = self.lanes.iter().filter_map(|lane| lane.front());
        let top = self.heap.peek().map(|Reverse(top)| top);
        fronts.chain(top).map(|timer| timer.at).min()
    }

    /// The earliest live deadline.
    fn next(&self) -> Option<Time> {
        debug_assert_eq!(self.earliest, self.find_earliest());
        self.earliest
    }

    /// The slot whose timer is due first at `now`, its timer disarmed;
    /// deadlines tie in slot order.
    fn pop_due(&mut self, now: Time) -> Option<u32> {
        let at = self.next().filter(|&at| at <= now)?;
        // Every lane timer due at `at` joins the heap, which orders them by
        // slot; the live ones at the fronts are all there are at `at`.
        for lane in 0..LANES {
            while let Some(&front) = self.lanes[lane].front() {
                if front.at != at {
                    break;
                }
                self.lanes[lane].pop_front();
                self.live[lane + 1] -= 1;
                let stamp = (front.stamp & !PLACE_MASK) | HEAP;
                self.stamps[front.slot as usize] = stamp;
                self.heap.push(Reverse(Timer { stamp, ..front }));
                self.live[HEAP as usize] += 1;
                self.settle_front(lane);
            }
        }
        let Reverse(timer) = *self.heap.peek().expect("a timer is due");
        self.disarm(timer.slot);
        self.earliest = self.find_earliest();
        Some(timer.slot)
    }

    /// The deadline armed for `slot` (a scan: for tests).
    #[cfg(test)]
    fn armed_at(&self, slot: u32) -> Option<Time> {
        let stamp = self.stamps[slot as usize];
        let mut all = self
            .lanes
            .iter()
            .flatten()
            .chain(self.heap.iter().map(|Reverse(t)| t));
        all.find(|t| t.slot == slot && t.stamp == stamp && stamp & PLACE_MASK != NOWHERE)
            .map(|t| t.at)
    }
}

struct Slot<T> {
    value: Option<T>,
    /// Bumped whenever the slot is emptied.
    gen: u32,
}

/// Entries of type `T`, each with one timer.
pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
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
            let entry = &mut self.slots[slot as usize];
            entry.value = Some(value);
            return Handle {
                slot,
                gen: entry.gen,
            };
        }
        if self.slots.len() == self.slots.capacity() {
            // An eighth more at a time: never much more memory than in use.
            let more = self.slots.len() / 8 + 16;
            self.slots.reserve_exact(more);
            self.timers.stamps.reserve_exact(more);
        }
        let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 entries");
        self.slots.push(Slot {
            value: Some(value),
            gen: 0,
        });
        self.timers.stamps.push(0);
        Handle { slot, gen: 0 }
    }

    fn slot(&self, handle: Handle) -> Option<&Slot<T>> {
        self.slots
            .get(handle.slot as usize)
            .filter(|slot| slot.gen == handle.gen && slot.value.is_some())
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
        self.clear_timer(handle);
        let slot = &mut self.slots[handle.slot as usize];
        let value = slot.value.take();
        slot.gen = slot.gen.wrapping_add(1);
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
        self.slots.iter().enumerate().filter_map(|(slot, entry)| {
            let value = entry.value.as_ref()?;
            let handle = Handle {
                slot: slot as u32,
                gen: entry.gen,
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
            gen: self.slots[slot as usize].gen,
        })
    }

    /// The entry's armed deadline (a scan: for tests).
    #[cfg(test)]
    pub(crate) fn timer(&self, handle: Handle) -> Option<Time> {
        self.slot(handle)?;
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
pub(crate) struct Pending<R> {
    ids: IdMap<u64, R>,
}

impl<R> Default for Pending<R> {
    fn default() -> Pending<R> {
        Pending {
            ids: IdMap::default(),
        }
    }
}

impl<R: Copy> Pending<R> {
    /// Registers request `id` (not in flight) as `request`.
    pub(crate) fn insert(&mut self, id: u64, request: R) {
        let before = self.ids.insert(id, request);
        debug_assert!(before.is_none(), "request id {id} is in flight already");
    }

    /// The request `id`, if in flight.
    #[cfg(test)]
    pub(crate) fn get(&self, id: u64) -> Option<R> {
        self.ids.get(&id).copied()
    }

    /// Takes request `id` out, if in flight.
    pub(crate) fn remove(&mut self, id: u64) -> Option<R> {
        self.ids.remove(&id)
    }

    /// How many requests are in flight.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Takes every request out, in the order of their ids.
    pub(crate) fn drain(&mut self) -> Vec<(u64, R)> {
        let mut all: Vec<(u64, R)> = self.ids.drain().collect();
        all.sort_unstable_by_key(|&(id, _)| id);
        if self.ids.capacity() > KEPT_WHEN_EMPTY {
            self.ids.shrink_to(KEPT_WHEN_EMPTY);
        }
        all
    }

    /// Every request in flight, in no particular order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, R)> + '_ {
        self.ids.iter().map(|(&id, &request)| (id, request))
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
            // Dead timers never outnumber the live ones by much, and the
            // counts are true.
            let t = &slab.timers;
            for place in 1..PLACES {
                assert!(t.dead[place] <= t.live[place] / 2 + 64, "place {place}");
                let len = if place == HEAP as usize {
                    t.heap.len()
                } else {
                    t.lanes[place - 1].len()
                };
                assert_eq!(len, t.live[place] + t.dead[place], "place {place}");
            }
            assert_eq!(t.live.iter().sum::<usize>(), armed.len());
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
        assert!(pending.ids.capacity() <= 2 * KEPT_WHEN_EMPTY);
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
                let id = if rng.chance(9, 10) {
                    next += 1;
                    next
                } else {
                    u64::MAX - rng.up_to(1_000)
                };
                if let std::collections::btree_map::Entry::Vacant(e) = model.entry(id) {
                    e.insert(step);
                    pending.insert(id, step);
                }
            } else {
                let id = next.saturating_sub(rng.up_to(200));
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
