//! Storage of the client's entries (operations, abandoned waiters, held
//! grants) with one timer each.
//!
//! A slab of slots, addressed by index and guarded by a generation so that a
//! stale [`OpId`](super::OpId) never reaches a reused slot. A slot keeps its
//! entry, its generation and its timer's stamp side by side, 64 bytes
//! aligned to a cache line: a slot is one line, and everything the core
//! does to an entry touches only that line. The slab grows by an eighth at
//! a time, so it never reserves much more memory than it uses. Free slots
//! form a list threaded through their cells. Nothing here allocates once
//! the table has grown to its working size.
//!
//! # Timers
//!
//! The earliest deadline is always exact (`poll_timeout` never wakes the
//! driver for nothing), and due timers fire in `(deadline, slot)` order, a
//! total order that does not depend on how the timers are stored.
//!
//! Most deadlines are "now plus a duration that is the same for every entry
//! of its kind" (an answer's grace, a lease), so the timers of one kind,
//! armed one after another, come in deadline order. Each kind of timer
//! has its own *lane*, which takes a timer whose deadline is not earlier
//! than the one armed before it; any other timer goes into a 4-ary heap
//! ordered by `(deadline, slot)`. There are two sorts of lanes:
//!
//! * A *queue* lane is a first-in first-out queue of timers, for kinds
//!   whose timers mostly end in the order they were armed (an acquire
//!   leaves the send queue in order). Arming appends.
//! * A *group* lane keeps, per deadline, only a count of the timers armed
//!   at it, for kinds whose timers end in any order (requests in flight,
//!   answered in any order). Arming joins the last group or starts one;
//!   disarming counts down, with nothing to search or move.
//!
//! A queued timer is never searched for: each slot holds a *stamp* that
//! changes whenever its timer is armed again or disarmed, and a queued
//! timer whose stamp is not its slot's any more is dead. Dead timers are
//! dropped when they reach the front of their lane (or the top of the
//! heap), which is kept so at every change, so the earliest deadline is
//! always a live timer's. A lane or the heap is compacted when its dead
//! timers pile up, and all are swept after so many changes that no stamp
//! can come round again while a dead timer holding it is still queued. A
//! slot in a group has the group's number in its stamp.
//!
//! A lane is ordered by deadline alone. When a deadline is due, every lane
//! timer with exactly that deadline moves into the heap first (for a
//! group, its members are found by a scan of the slots: a group's deadline
//! is the answer deadline of requests in flight, which closes the
//! connection), so the heap orders them by `(deadline, slot)` with the
//! rest.

use crate::time::Time;

const NONE: u32 = u32::MAX;
/// Children per heap node.
const ARITY: usize = 4;
/// How many queue lanes and group lanes a table has.
pub(crate) const QUEUE_LANES: usize = 2;
pub(crate) const GROUP_LANES: usize = 2;
/// The stamp's low bits: where the slot's live timer is.
const PLACE_BITS: u32 = 3;
const PLACE_MASK: u32 = (1 << PLACE_BITS) - 1;
/// No live timer.
const PLACE_NONE: u32 = 0;
/// Queue lane `i` is place `PLACE_QUEUE + i`.
const PLACE_QUEUE: u32 = 1;
/// In the heap.
const PLACE_HEAP: u32 = PLACE_QUEUE + QUEUE_LANES as u32;
/// Group lane `i` is place `PLACE_GROUP + i`.
const PLACE_GROUP: u32 = PLACE_HEAP + 1;
const _: () = assert!(PLACE_GROUP + GROUP_LANES as u32 <= 1 << PLACE_BITS);
/// Stamps between two sweeps of every dead timer: far fewer than it takes
/// the stamp counter to come round (2^29 stamps).
const SWEEP_EVERY: u32 = 1 << 22;

/// Where a timer is armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Queue lane `i`.
    Queue(usize),
    /// Group lane `i`.
    Group(usize),
    /// The heap.
    Heap,
}

/// Whether `(a, ia)` comes before `(b, ib)`.
#[inline(always)]
fn before(a: Time, ia: u32, b: Time, ib: u32) -> bool {
    a < b || (a == b && ia < ib)
}

/// A queued timer: live while `stamp` is its slot's stamp.
#[derive(Clone, Copy, Debug)]
struct Timer {
    at: Time,
    slot: u32,
    stamp: u32,
}

/// What a slot holds.
enum Cell<E> {
    Full(E),
    /// A free slot, and the next free one (`NONE` for none).
    Free(u32),
}

/// One slot: its cell, its generation and its timer's stamp, on one cache
/// line.
#[repr(align(64))]
struct Slot<E> {
    cell: Cell<E>,
    /// Bumped every time the slot is freed or its entry changes hands.
    gen: u32,
    /// Where the slot's live timer is, below `PLACE_BITS`; above them, a
    /// number that changes whenever the timer is armed or disarmed (in a
    /// group: the group's number).
    stamp: u32,
}

/// The capacity, in items, a queue keeps once empty: steady traffic never
/// needs more, and a burst (thousands of acquires submitted before one
/// poll) gives the rest back once it has drained.
pub(crate) const KEPT_WHEN_EMPTY: usize = 4096;

/// A first-in first-out queue: a vector and the index of its front. The
/// space before the front is taken back when the vector is full and at
/// least half of it lies there, so every item is moved at most once more.
struct Fifo<T> {
    items: Vec<T>,
    head: usize,
}

impl<T> Default for Fifo<T> {
    fn default() -> Fifo<T> {
        Fifo {
            items: Vec::new(),
            head: 0,
        }
    }
}

impl<T> Fifo<T> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.items.len() - self.head
    }

    #[inline(always)]
    fn front(&self) -> Option<&T> {
        self.items.get(self.head)
    }

    #[inline(always)]
    fn back(&self) -> Option<&T> {
        if self.head < self.items.len() {
            self.items.last()
        } else {
            None
        }
    }

    #[inline(always)]
    fn push_back(&mut self, item: T) {
        if self.items.len() == self.items.capacity() {
            self.make_room();
        }
        self.items.push(item);
    }

    /// Room for one more: the space before the front if it is at least half
    /// the vector, else more memory.
    #[cold]
    fn make_room(&mut self) {
        if 2 * self.head >= self.items.len() {
            self.items.drain(..self.head);
            self.head = 0;
        } else {
            self.items.reserve(1);
        }
    }

    #[inline(always)]
    fn pop_front(&mut self) {
        self.head += 1;
        if self.head >= self.items.len() {
            self.items.clear();
            self.head = 0;
            if self.items.capacity() > KEPT_WHEN_EMPTY {
                self.give_back();
            }
        }
    }

    /// Gives back what a burst made the vector grow to.
    #[cold]
    #[inline(never)]
    fn give_back(&mut self) {
        self.items.shrink_to(KEPT_WHEN_EMPTY);
    }

    #[cfg(test)]
    fn iter(&self) -> core::slice::Iter<'_, T> {
        self.items[self.head..].iter()
    }

    fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.items.drain(..self.head);
        self.head = 0;
        self.items.retain(keep);
    }
}

/// A first-in first-out queue of timers whose deadlines never decrease.
#[derive(Default)]
struct QueueLane {
    timers: Fifo<Timer>,
    /// Live timers in `timers`.
    live: usize,
}

/// The timers of one group lane that share a deadline.
struct Group {
    at: Time,
    /// Live members; 0 for a group that waits to leave its lane.
    live: u32,
    /// The next free group, while this one is free.
    next_free: u32,
}

/// Groups in order of their deadlines, which strictly increase.
#[derive(Default)]
struct GroupLane {
    groups: Fifo<u32>,
    /// Groups in `groups` with live members.
    live: usize,
}

/// A slab of `E` with one timer per slot.
pub(crate) struct Table<E> {
    slots: Vec<Slot<E>>,
    free: u32,
    live: usize,
    queues: [QueueLane; QUEUE_LANES],
    group_lanes: [GroupLane; GROUP_LANES],
    /// Every group, by number.
    groups: Vec<Group>,
    free_group: u32,
    /// The heap of timers, by `(deadline, slot)`.
    heap: Vec<Timer>,
    /// Live timers in `heap`.
    heap_live: usize,
    /// The counter of the last queue or heap stamp.
    counter: u32,
    /// No live timer is due before this: the earliest deadline armed since
    /// it was last found exactly (timers that ended since may have been
    /// earlier). Deciding that nothing is due is then one comparison.
    wakeup: Time,
}

impl<E> Table<E> {
    pub(crate) fn new() -> Table<E> {
        Table {
            slots: Vec::new(),
            free: NONE,
            live: 0,
            queues: Default::default(),
            group_lanes: Default::default(),
            groups: Vec::new(),
            free_group: NONE,
            heap: Vec::new(),
            heap_live: 0,
            counter: 0,
            wakeup: Time::MAX,
        }
    }

    #[inline(always)]
    fn slot(&self, idx: u32) -> &Slot<E> {
        &self.slots[idx as usize]
    }

    #[inline(always)]
    fn slot_mut(&mut self, idx: u32) -> &mut Slot<E> {
        &mut self.slots[idx as usize]
    }

    #[inline(always)]
    fn find(&self, idx: u32) -> Option<&Slot<E>> {
        self.slots.get(idx as usize)
    }

    #[inline(always)]
    fn find_mut(&mut self, idx: u32) -> Option<&mut Slot<E>> {
        self.slots.get_mut(idx as usize)
    }

    /// Stores `entry`, returning its slot and generation.
    #[inline(always)]
    pub(crate) fn insert(&mut self, entry: E) -> (u32, u32) {
        if self.free == NONE {
            return self.push(entry);
        }
        self.live += 1;
        let idx = self.free;
        let slot = &mut self.slots[idx as usize];
        let Cell::Free(next) = slot.cell else {
            unreachable!("the free list holds free slots");
        };
        slot.cell = Cell::Full(entry);
        self.free = next;
        (idx, slot.gen)
    }

    /// Stores `entry` in a new slot.
    #[inline(never)]
    fn push(&mut self, entry: E) -> (u32, u32) {
        self.live += 1;
        if self.slots.len() == self.slots.capacity() {
            // Grow by an eighth at least: amortised O(1), at most an eighth
            // unused.
            self.slots.reserve_exact((self.slots.len() / 8).max(64));
        }
        self.slots.push(Slot {
            cell: Cell::Full(entry),
            gen: 0,
            stamp: PLACE_NONE,
        });
        ((self.slots.len() - 1) as u32, 0)
    }

    /// The slot's generation, if `idx` is an occupied slot.
    #[inline]
    pub(crate) fn gen(&self, idx: u32) -> Option<u32> {
        let slot = self.find(idx)?;
        match slot.cell {
            Cell::Full(_) => Some(slot.gen),
            Cell::Free(_) => None,
        }
    }

    /// Reads slot `idx`, so that it is in the cache when it is needed soon
    /// after.
    #[inline]
    pub(crate) fn touch(&self, idx: u32) -> u32 {
        self.find(idx).map_or(0, |slot| slot.gen)
    }

    /// The entry in `idx`, if occupied.
    #[inline]
    pub(crate) fn get(&self, idx: u32) -> Option<&E> {
        match &self.find(idx)?.cell {
            Cell::Full(entry) => Some(entry),
            Cell::Free(_) => None,
        }
    }

    /// The entry in `idx`, if occupied.
    #[inline]
    pub(crate) fn get_mut(&mut self, idx: u32) -> Option<&mut E> {
        match &mut self.find_mut(idx)?.cell {
            Cell::Full(entry) => Some(entry),
            Cell::Free(_) => None,
        }
    }

    /// The entry in `idx` and its generation, if occupied.
    #[inline]
    pub(crate) fn get_with_gen_mut(&mut self, idx: u32) -> Option<(&mut E, u32)> {
        let slot = self.find_mut(idx)?;
        match &mut slot.cell {
            Cell::Full(entry) => Some((entry, slot.gen)),
            Cell::Free(_) => None,
        }
    }

    /// The entry in `idx` if its generation is `gen`.
    #[inline]
    pub(crate) fn get_checked(&self, idx: u32, gen: u32) -> Option<&E> {
        let slot = self.find(idx)?;
        match &slot.cell {
            Cell::Full(entry) if slot.gen == gen => Some(entry),
            _ => None,
        }
    }

    /// Replaces the entry in occupied slot `idx` with what `change` makes of
    /// it, moving its parts instead of cloning them.
    #[inline(always)]
    pub(crate) fn replace_with(&mut self, idx: u32, change: impl FnOnce(E) -> E) {
        let slot = &mut self.slots[idx as usize];
        let Cell::Full(entry) = core::mem::replace(&mut slot.cell, Cell::Free(NONE)) else {
            unreachable!("an occupied slot");
        };
        slot.cell = Cell::Full(change(entry));
    }

    /// Marks the entry as having changed hands: handles to the old
    /// generation stop reaching it. Returns the new generation.
    #[inline]
    pub(crate) fn bump(&mut self, idx: u32) -> u32 {
        let gen = &mut self.slot_mut(idx).gen;
        *gen = gen.wrapping_add(1);
        *gen
    }

    /// Empties the slot, disarming its timer, and returns its entry.
    #[inline]
    pub(crate) fn remove(&mut self, idx: u32) -> Option<E> {
        self.get(idx)?;
        self.clear_timer(idx);
        let free = self.free;
        let slot = self.slot_mut(idx);
        let Cell::Full(entry) = core::mem::replace(&mut slot.cell, Cell::Free(free)) else {
            unreachable!("checked above");
        };
        slot.gen = slot.gen.wrapping_add(1);
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
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| matches!(slot.cell, Cell::Full(_)))
            .map(|(i, _)| i as u32)
    }

    // ----- timers ---------------------------------------------------------

    /// Whether `timer` is its slot's live timer.
    #[inline(always)]
    fn is_live(&self, timer: &Timer) -> bool {
        self.slot(timer.slot).stamp == timer.stamp
    }

    /// The slot's armed deadline (a scan: tests only).
    #[cfg(test)]
    pub(crate) fn timer(&self, idx: u32) -> Option<Time> {
        self.gen(idx)?;
        let stamp = self.slot(idx).stamp;
        match stamp & PLACE_MASK {
            PLACE_NONE => None,
            place if place >= PLACE_GROUP => Some(self.groups[(stamp >> PLACE_BITS) as usize].at),
            _ => self
                .queues
                .iter()
                .flat_map(|lane| lane.timers.iter())
                .chain(self.heap.iter())
                .find(|timer| timer.slot == idx && self.is_live(timer))
                .map(|timer| timer.at),
        }
    }

    /// A stamp for a timer about to be queued at `place`.
    #[inline(always)]
    fn next_stamp(&mut self, place: u32) -> u32 {
        self.counter = self.counter.wrapping_add(1 << PLACE_BITS);
        if self.counter & ((SWEEP_EVERY - 1) << PLACE_BITS) == 0 {
            self.sweep();
        }
        self.counter | place
    }

    /// Disarms the slot's timer.
    #[inline(always)]
    pub(crate) fn clear_timer(&mut self, idx: u32) {
        let slot = &mut self.slots[idx as usize];
        let stamp = slot.stamp;
        if stamp & PLACE_MASK != PLACE_NONE {
            slot.stamp = PLACE_NONE;
            self.forget(stamp);
        }
    }

    /// Counts out the timer that had `stamp`, no longer its slot's.
    #[inline(always)]
    fn forget(&mut self, stamp: u32) {
        let place = stamp & PLACE_MASK;
        if place >= PLACE_GROUP {
            let group = &mut self.groups[(stamp >> PLACE_BITS) as usize];
            group.live -= 1;
            if group.live == 0 {
                self.group_emptied((place - PLACE_GROUP) as usize);
            }
        } else if place == PLACE_HEAP {
            self.forget_heap(stamp);
        } else {
            let lane = (place - PLACE_QUEUE) as usize;
            let queue = &mut self.queues[lane];
            queue.live -= 1;
            if queue.timers.front().map(|front| front.stamp) == Some(stamp) {
                queue.timers.pop_front();
                // Dead timers behind it only if the lane has any.
                if queue.timers.len() != queue.live {
                    self.settle_queue(lane);
                }
            }
        }
    }

    /// A group of lane `lane` lost its last member.
    #[inline(never)]
    fn group_emptied(&mut self, lane: usize) {
        self.group_lanes[lane].live -= 1;
        self.settle_group_lane(lane);
    }

    /// Counts out the heap timer that had `stamp`.
    #[inline(never)]
    fn forget_heap(&mut self, stamp: u32) {
        self.heap_live -= 1;
        if self.heap[0].stamp == stamp {
            self.settle_heap();
        }
    }

    /// Arms (or re-arms) the slot's timer at `at`, in `lane` if that keeps
    /// the lane in deadline order, else in the heap.
    #[inline(always)]
    pub(crate) fn set_timer(&mut self, idx: u32, at: Time, lane: Lane) {
        self.clear_timer(idx);
        if at < self.wakeup {
            self.wakeup = at;
        }
        match lane {
            Lane::Queue(lane) => {
                let fits = self.queues[lane]
                    .timers
                    .back()
                    .map_or(true, |last| last.at <= at);
                if fits {
                    let stamp = self.next_stamp(PLACE_QUEUE + lane as u32);
                    self.slots[idx as usize].stamp = stamp;
                    let queue = &mut self.queues[lane];
                    queue.timers.push_back(Timer {
                        at,
                        slot: idx,
                        stamp,
                    });
                    queue.live += 1;
                    // Dead timers stay at most half as many as the live ones.
                    if queue.timers.len() > queue.live + queue.live / 2 + 64 {
                        self.compact_queue(lane);
                    }
                    return;
                }
            }
            Lane::Group(lane) => {
                let place = PLACE_GROUP + lane as u32;
                match self.group_lanes[lane].groups.back() {
                    Some(&number) if self.groups[number as usize].at == at => {
                        let group = &mut self.groups[number as usize];
                        group.live += 1;
                        if group.live == 1 {
                            self.group_lanes[lane].live += 1;
                        }
                        self.slots[idx as usize].stamp = number << PLACE_BITS | place;
                        return;
                    }
                    Some(&number) if self.groups[number as usize].at > at => {}
                    _ => {
                        self.join_new_group(idx, at, lane);
                        return;
                    }
                }
            }
            Lane::Heap => {}
        }
        self.heap_insert(idx, at);
    }

    /// Arms the slot's (disarmed) timer at `at` as the first member of a new
    /// group at the back of group lane `lane`.
    #[inline(never)]
    fn join_new_group(&mut self, idx: u32, at: Time, lane: usize) {
        let number = self.new_group(at);
        debug_assert!(number < 1 << (32 - PLACE_BITS));
        self.slots[idx as usize].stamp = number << PLACE_BITS | (PLACE_GROUP + lane as u32);
        let groups = &mut self.group_lanes[lane];
        groups.groups.push_back(number);
        groups.live += 1;
        if groups.groups.len() > groups.live + groups.live / 2 + 64 {
            self.compact_group_lane(lane);
        }
    }

    /// Arms the slot's (disarmed) timer at `at` in the heap.
    #[inline(never)]
    fn heap_insert(&mut self, idx: u32, at: Time) {
        let stamp = self.next_stamp(PLACE_HEAP);
        self.slot_mut(idx).stamp = stamp;
        self.heap_push(Timer {
            at,
            slot: idx,
            stamp,
        });
        self.heap_live += 1;
        if self.heap.len() > self.heap_live + self.heap_live / 2 + 64 {
            self.compact_heap();
        }
    }

    /// A new group with one live member, at `at`.
    fn new_group(&mut self, at: Time) -> u32 {
        let group = Group {
            at,
            live: 1,
            next_free: NONE,
        };
        if self.free_group != NONE {
            let number = self.free_group;
            self.free_group = self.groups[number as usize].next_free;
            self.groups[number as usize] = group;
            number
        } else {
            self.groups.push(group);
            (self.groups.len() - 1) as u32
        }
    }

    /// Frees a group that left its lane.
    fn free_group(&mut self, number: u32) {
        self.groups[number as usize].next_free = self.free_group;
        self.free_group = number;
    }

    /// Whether no timer is due at `now`: mostly decided from a bound, else
    /// from the exact earliest deadline, which becomes the bound.
    #[inline]
    pub(crate) fn none_due(&mut self, now: Time) -> bool {
        if self.wakeup > now {
            return true;
        }
        self.wakeup = self.next_deadline().unwrap_or(Time::MAX);
        self.wakeup > now
    }

    /// The earliest armed deadline.
    #[inline]
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        let mut next = self.heap.first().map(|timer| timer.at);
        let mut consider = |at: Time| {
            if next.map_or(true, |next| at < next) {
                next = Some(at);
            }
        };
        for lane in &self.queues {
            if let Some(front) = lane.timers.front() {
                consider(front.at);
            }
        }
        for lane in &self.group_lanes {
            if let Some(&front) = lane.groups.front() {
                consider(self.groups[front as usize].at);
            }
        }
        next
    }

    /// The slot with the earliest deadline, if that deadline is at or before
    /// `now`; its timer is disarmed. Of several with that deadline, the
    /// lowest slot.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<u32> {
        let at = self.next_deadline()?;
        if at > now {
            return None;
        }
        // Every lane timer due at `at` joins the heap, to be ordered by slot.
        for lane in 0..QUEUE_LANES {
            while let Some(&front) = self.queues[lane].timers.front() {
                if front.at != at {
                    break;
                }
                self.queues[lane].timers.pop_front();
                if self.is_live(&front) {
                    self.queues[lane].live -= 1;
                    self.slot_mut(front.slot).stamp = PLACE_NONE;
                    self.heap_insert(front.slot, at);
                }
            }
            self.settle_queue(lane);
        }
        for lane in 0..GROUP_LANES {
            let Some(&number) = self.group_lanes[lane].groups.front() else {
                continue;
            };
            if self.groups[number as usize].at != at {
                continue;
            }
            let stamp = number << PLACE_BITS | (PLACE_GROUP + lane as u32);
            let members: Vec<u32> = self
                .indices()
                .filter(|&idx| self.slot(idx).stamp == stamp)
                .collect();
            debug_assert_eq!(members.len(), self.groups[number as usize].live as usize);
            for idx in members {
                self.clear_timer(idx);
                self.heap_insert(idx, at);
            }
        }
        let top = *self.heap.first().expect("a timer is due");
        debug_assert!(top.at == at && self.is_live(&top));
        self.clear_timer(top.slot);
        Some(top.slot)
    }

    /// Drops dead timers from the front of queue lane `lane`.
    #[inline(never)]
    fn settle_queue(&mut self, lane: usize) {
        while let Some(front) = self.queues[lane].timers.front() {
            if self.is_live(front) {
                break;
            }
            self.queues[lane].timers.pop_front();
        }
    }

    /// Drops groups without members from the front of group lane `lane`.
    #[inline]
    fn settle_group_lane(&mut self, lane: usize) {
        while let Some(&front) = self.group_lanes[lane].groups.front() {
            if self.groups[front as usize].live > 0 {
                break;
            }
            self.group_lanes[lane].groups.pop_front();
            self.free_group(front);
        }
    }

    /// Drops dead timers from the top of the heap.
    #[inline]
    fn settle_heap(&mut self) {
        while let Some(top) = self.heap.first() {
            if self.is_live(top) {
                break;
            }
            let last = self.heap.pop().expect("not empty");
            if !self.heap.is_empty() {
                self.sift_down(0, last);
            }
        }
    }

    /// Keeps only the live timers of queue lane `lane`.
    #[cold]
    fn compact_queue(&mut self, lane: usize) {
        let mut timers = core::mem::take(&mut self.queues[lane].timers);
        timers.retain(|timer| self.is_live(timer));
        self.queues[lane].timers = timers;
        debug_assert_eq!(self.queues[lane].timers.len(), self.queues[lane].live);
    }

    /// Keeps only the groups of group lane `lane` that have members.
    #[cold]
    fn compact_group_lane(&mut self, lane: usize) {
        let mut groups = core::mem::take(&mut self.group_lanes[lane].groups);
        groups.retain(|&number| {
            let live = self.groups[number as usize].live > 0;
            if !live {
                self.free_group(number);
            }
            live
        });
        self.group_lanes[lane].groups = groups;
        debug_assert_eq!(
            self.group_lanes[lane].groups.len(),
            self.group_lanes[lane].live
        );
    }

    /// Keeps only the live timers of the heap.
    #[cold]
    fn compact_heap(&mut self) {
        let mut heap = core::mem::take(&mut self.heap);
        heap.retain(|timer| self.is_live(timer));
        self.heap = heap;
        debug_assert_eq!(self.heap.len(), self.heap_live);
        // Rebuild the order bottom-up.
        if self.heap.len() > 1 {
            for pos in (0..=(self.heap.len() - 2) / ARITY).rev() {
                let timer = self.heap[pos];
                self.sift_down(pos, timer);
            }
        }
    }

    /// Drops every dead timer everywhere.
    #[cold]
    fn sweep(&mut self) {
        for lane in 0..QUEUE_LANES {
            self.compact_queue(lane);
        }
        self.compact_heap();
    }

    /// Puts `timer` into the heap.
    #[inline]
    fn heap_push(&mut self, timer: Timer) {
        let mut pos = self.heap.len();
        self.heap.push(timer);
        while pos > 0 {
            let parent = (pos - 1) / ARITY;
            let above = self.heap[parent];
            if !before(timer.at, timer.slot, above.at, above.slot) {
                break;
            }
            self.heap[pos] = above;
            pos = parent;
        }
        self.heap[pos] = timer;
    }

    /// Moves `timer`, whose place is the hole at `pos`, down to where it
    /// belongs.
    fn sift_down(&mut self, mut pos: usize, timer: Timer) {
        let len = self.heap.len();
        loop {
            let first = ARITY * pos + 1;
            if first >= len {
                break;
            }
            let end = (first + ARITY).min(len);
            let mut best = first;
            for child in first + 1..end {
                let (c, b) = (&self.heap[child], &self.heap[best]);
                if before(c.at, c.slot, b.at, b.slot) {
                    best = child;
                }
            }
            let below = self.heap[best];
            if !before(below.at, below.slot, timer.at, timer.slot) {
                break;
            }
            self.heap[pos] = below;
            pos = best;
        }
        self.heap[pos] = timer;
    }

    #[cfg(test)]
    fn check_timers(&self) {
        for (pos, timer) in self.heap.iter().enumerate() {
            if pos > 0 {
                let parent = &self.heap[(pos - 1) / ARITY];
                assert!(before(parent.at, parent.slot, timer.at, timer.slot));
            }
        }
        assert_eq!(
            self.heap.iter().filter(|t| self.is_live(t)).count(),
            self.heap_live
        );
        if let Some(top) = self.heap.first() {
            assert!(self.is_live(top));
        }
        for lane in &self.queues {
            let timers: Vec<&Timer> = lane.timers.iter().collect();
            assert!(timers.windows(2).all(|w| w[0].at <= w[1].at));
            assert_eq!(timers.iter().filter(|t| self.is_live(t)).count(), lane.live);
            if let Some(front) = lane.timers.front() {
                assert!(self.is_live(front));
            }
        }
        for (i, lane) in self.group_lanes.iter().enumerate() {
            let groups: Vec<&Group> = lane
                .groups
                .iter()
                .map(|&n| &self.groups[n as usize])
                .collect();
            assert!(groups.windows(2).all(|w| w[0].at < w[1].at));
            assert_eq!(groups.iter().filter(|g| g.live > 0).count(), lane.live);
            if let Some(front) = groups.first() {
                assert!(front.live > 0);
            }
            for &number in lane.groups.iter() {
                let stamp = number << PLACE_BITS | (PLACE_GROUP + i as u32);
                let members = self
                    .indices()
                    .filter(|&idx| self.slot(idx).stamp == stamp)
                    .count();
                assert_eq!(members, self.groups[number as usize].live as usize);
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
        assert_eq!(t.remove(a + 7), None);
        // An entry, its generation and its stamp fill one cache line.
        assert_eq!(core::mem::size_of::<Slot<super::super::Entry>>(), 64);
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
        let mut clock = 0;
        for round in 0..40 {
            for _ in 0..2_000 {
                let idx = rng.up_to(999) as u32;
                if rng.chance(1, 4) {
                    t.clear_timer(idx);
                    model[idx as usize] = None;
                } else {
                    // Mostly in order within a lane, some ties, some not.
                    let lane = match rng.up_to(4) {
                        0 | 1 => Lane::Queue(rng.up_to(QUEUE_LANES as u64 - 1) as usize),
                        2 => Lane::Group(rng.up_to(GROUP_LANES as u64 - 1) as usize),
                        _ => Lane::Heap,
                    };
                    let at = Time::from_nanos(
                        clock + rng.up_to(if round % 2 == 0 { 50 } else { 10_000 }),
                    );
                    clock += rng.up_to(3);
                    t.set_timer(idx, at, lane);
                    model[idx as usize] = Some(at);
                }
                if rng.chance(1, 500) {
                    assert_eq!(t.timer(idx), model[idx as usize]);
                }
            }
            t.check_timers();
            assert_eq!(t.next_deadline(), model.iter().flatten().min().copied());
            let now = Time::from_nanos(clock.saturating_sub(rng.up_to(2_000)));
            let mut last = (Time::ZERO, 0);
            let mut fired = 0;
            while let Some(idx) = t.pop_due(now) {
                let at = model[idx as usize].take().unwrap();
                assert!(at <= now);
                assert!(
                    before(last.0, last.1, at, idx) || fired == 0,
                    "{last:?} then {at:?} {idx}"
                );
                // Nothing due is left behind an earlier one.
                assert!(model.iter().flatten().all(|&m| m >= at));
                last = (at, idx);
                fired += 1;
            }
            assert!(model.iter().flatten().all(|&at| at > now));
            t.check_timers();
        }
        for idx in 0..1000 {
            t.remove(idx);
        }
        t.check_timers();
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn ties_fire_by_slot_across_lanes_and_the_heap() {
        let mut t = Table::new();
        for _ in 0..10 {
            t.insert(());
        }
        let at = Time::from_nanos(5);
        for (idx, lane) in [
            (7, Lane::Queue(0)),
            (3, Lane::Queue(0)),
            (9, Lane::Group(1)),
            (1, Lane::Heap),
            (5, Lane::Group(1)),
            (2, Lane::Queue(1)),
            (8, Lane::Group(0)),
        ] {
            t.set_timer(idx, at, lane);
        }
        t.set_timer(0, Time::from_nanos(6), Lane::Queue(0));
        let fired: Vec<u32> = core::iter::from_fn(|| t.pop_due(at)).collect();
        assert_eq!(fired, [1, 2, 3, 5, 7, 8, 9]);
        assert_eq!(t.next_deadline(), Some(Time::from_nanos(6)));
    }
}
