//! Storage: where the parts of the client core keep their records. The
//! parts see three small interfaces and nothing of how they work:
//!
//! * [`Table`]: records, each named by a [`Handle`] for as long as it is
//!   stored, each with at most one timer (`set_timer`, `clear_timer`,
//!   `next_deadline`, `pop_due`);
//! * [`Queue`]: handles waiting their turn, first in first out, whose
//!   records may leave early;
//! * [`SendBuffer`]: the bytes encoded and not yet handed out.
//!
//! A table is a slab (a vector of slots and a list of the free ones) and
//! its timers: those due soon in an indexed 4-ary heap, the rest in an
//! unsorted list (see [`Table`]). Each slot knows where its timer is, so
//! nothing dead is ever left behind. Timers due at one moment come in slot
//! order. Everything grows by an eighth at a time, and nothing allocates
//! once grown to its working size. Each container is checked step by step
//! against a plain model in the tests at the end of this file.

use core::time::Duration;
use std::cell::Cell;
use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use crate::time::Time;
use crate::wire::{Digits, LineBuf};

/// The most records one table holds: a handle's slot fits in the 30 bits
/// an operation's id keeps for it ([`OpId`](super::OpId)).
pub(crate) const MAX_RECORDS: usize = 1 << 30;

/// No timer: a slot's heap index when it has none.
const NONE: u32 = u32::MAX;

/// Names a record of a [`Table`] for as long as it is stored: its slot,
/// and the slot's generation, so that the handle of a record that is gone
/// never reaches the record that took its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Handle {
    slot: u32,
    gen: u32,
}

impl Handle {
    /// The handle with these parts: a slot, and its generation.
    pub(crate) const fn from_parts(slot: u32, gen: u32) -> Handle {
        Handle { slot, gen }
    }

    pub(crate) const fn slot(self) -> u32 {
        self.slot
    }

    pub(crate) const fn gen(self) -> u32 {
        self.gen
    }
}

struct Slot<T> {
    value: Option<T>,
    /// Bumped whenever the slot is emptied.
    gen: u32,
    /// Where the slot's timer is in the heap, or [`NONE`].
    timer: u32,
}

/// How many children a node of the heap has: four keeps it half as deep
/// as a binary heap, and each step down reads its children side by side.
const ARITY: usize = 4;

/// Makes room for one more in `v`, an eighth more at a time: a table is
/// never much larger than what it holds (doubling would leave up to half of
/// it unused, for as long as it lives).
fn grow<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.len() / 8 + 16);
    }
}

/// How far ahead of the time it was last told a table keeps its timers in
/// the heap; later ones wait, unsorted, in the far list.
const SPAN: Duration = Duration::from_secs(1);

/// A slot's `timer` with this bit set is an index into the far list.
const FAR: u32 = 1 << 31;

/// Records of type `T`, each with at most one timer.
///
/// Most timers never fire: an answer's deadline, a lease's end, a
/// release's deadline are all cancelled when the answer comes, long before.
/// So a timer due within [`SPAN`] of the latest time the table was told
/// goes into a heap, and a later one into the far list, unsorted, where
/// arming, moving and clearing it cost one write. When time reaches the
/// horizon the far list is looked through once, and what falls due within
/// the next span moves into the heap. No far timer is ever due before the
/// horizon, so finding what is due looks at the heap alone
/// ([`Table::due_by`]); the exact earliest deadline, for the driver
/// ([`Table::next_deadline`]), looks through the far list only when the
/// earliest one it had found has gone since.
pub(crate) struct Table<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    /// The timers due before `horizon`: a 4-ary min-heap of their keys
    /// (deadline, then slot): four children fill a cache line.
    heap: Vec<u128>,
    /// The timers due at `horizon` or later, in no order.
    far_at: Vec<Time>,
    far_slot: Vec<u32>,
    horizon: Time,
    /// The earliest far deadline, once looked for; `None` while not known.
    far_min: Cell<Option<Time>>,
}

impl<T> Default for Table<T> {
    fn default() -> Table<T> {
        Table {
            slots: Vec::new(),
            free: Vec::new(),
            heap: Vec::new(),
            far_at: Vec::new(),
            far_slot: Vec::new(),
            horizon: Time::ZERO,
            far_min: Cell::new(None),
        }
    }
}

impl<T> Table<T> {
    /// Stores `value`, with no timer; `None` (and `value` dropped) if the
    /// table holds [`MAX_RECORDS`] already.
    pub(crate) fn insert(&mut self, value: T) -> Option<Handle> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None if self.slots.len() < MAX_RECORDS => {
                grow(&mut self.slots);
                self.slots.push(Slot {
                    value: None,
                    gen: 0,
                    timer: NONE,
                });
                (self.slots.len() - 1) as u32
            }
            None => return None,
        };
        let entry = &mut self.slots[slot as usize];
        entry.value = Some(value);
        Some(Handle {
            slot,
            gen: entry.gen,
        })
    }

    fn slot(&self, handle: Handle) -> Option<&Slot<T>> {
        self.slots
            .get(handle.slot as usize)
            .filter(|s| s.gen == handle.gen && s.value.is_some())
    }

    /// The record, if `handle` still names one.
    pub(crate) fn get(&self, handle: Handle) -> Option<&T> {
        self.slot(handle)?.value.as_ref()
    }

    /// The record, if `handle` still names one.
    pub(crate) fn get_mut(&mut self, handle: Handle) -> Option<&mut T> {
        self.slots
            .get_mut(handle.slot as usize)
            .filter(|s| s.gen == handle.gen)?
            .value
            .as_mut()
    }

    /// Takes the record out, and its timer with it.
    pub(crate) fn remove(&mut self, handle: Handle) -> Option<T> {
        self.slot(handle)?;
        self.clear_timer(handle);
        let entry = &mut self.slots[handle.slot as usize];
        let value = entry.value.take();
        entry.gen = entry.gen.wrapping_add(1);
        self.free.push(handle.slot);
        value
    }

    /// How many records are stored.
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Every record, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Handle, &T)> + '_ {
        (0..).zip(&self.slots).filter_map(|(slot, s)| {
            let value = s.value.as_ref()?;
            Some((Handle { slot, gen: s.gen }, value))
        })
    }

    /// The handles of every record, in slot order (a copy: the caller may
    /// change the table meanwhile).
    pub(crate) fn handles(&self) -> Vec<Handle> {
        self.iter().map(|(handle, _)| handle).collect()
    }

    /// Arms the record's timer at `at`, or moves it there.
    pub(crate) fn set_timer(&mut self, handle: Handle, at: Time) {
        let Some(slot) = self.slot(handle) else {
            return;
        };
        let timer = slot.timer;
        let far = at >= self.horizon;
        match timer {
            NONE => {}
            t if t & FAR != 0 && far => {
                // Far, and far still: one write.
                let index = (t & !FAR) as usize;
                self.far_moved(self.far_at[index], at);
                self.far_at[index] = at;
                return;
            }
            t if t & FAR == 0 && !far => {
                let index = t as usize;
                let new = key(at, handle.slot);
                match new < self.heap[index] {
                    true => self.sift_up(index, new),
                    false => self.sift_down(index, new),
                }
                return;
            }
            _ => self.clear_timer(handle),
        }
        match far {
            true => self.push_far(at, handle.slot),
            false => self.push_near(at, handle.slot),
        }
    }

    fn push_near(&mut self, at: Time, slot: u32) {
        grow(&mut self.heap);
        let new = key(at, slot);
        self.heap.push(new);
        self.sift_up(self.heap.len() - 1, new);
    }

    /// A far timer moved from `old` to `new` (`Time::MAX`: it left): the
    /// earliest known stays known unless it was the one that moved later.
    fn far_moved(&self, old: Time, new: Time) {
        if let Some(min) = self.far_min.get() {
            if new < min {
                self.far_min.set(Some(new));
            } else if old == min {
                self.far_min.set(None);
            }
        }
    }

    fn push_far(&mut self, at: Time, slot: u32) {
        if self.far_at.is_empty() {
            self.far_min.set(Some(at));
        } else {
            self.far_moved(Time::MAX, at);
        }
        grow(&mut self.far_at);
        grow(&mut self.far_slot);
        self.far_at.push(at);
        self.far_slot.push(slot);
        self.slots[slot as usize].timer = (self.far_at.len() - 1) as u32 | FAR;
    }

    /// Disarms the record's timer, if armed.
    pub(crate) fn clear_timer(&mut self, handle: Handle) {
        let Some(timer) = self.slot(handle).map(|s| s.timer).filter(|&t| t != NONE) else {
            return;
        };
        self.slots[handle.slot as usize].timer = NONE;
        if timer & FAR != 0 {
            let (at, _) = self.take_far((timer & !FAR) as usize);
            self.far_moved(at, Time::MAX);
            return;
        }
        let index = timer as usize;
        let removed = self.heap[index];
        // An armed timer is in the heap.
        let Some(last) = self.heap.pop() else {
            return;
        };
        if index < self.heap.len() {
            // The last timer fills the hole: up if it is earlier than the
            // one removed, else down.
            match last < removed {
                true => self.sift_up(index, last),
                false => self.sink(index, last),
            }
        }
    }

    /// When the record's timer is armed for, if it is.
    pub(crate) fn timer(&self, handle: Handle) -> Option<Time> {
        match self.slot(handle)?.timer {
            NONE => None,
            t if t & FAR != 0 => Some(self.far_at[(t & !FAR) as usize]),
            t => Some(at_of(self.heap[t as usize])),
        }
    }

    /// The earliest armed deadline.
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        let near = self.heap.first().map(|&k| at_of(k));
        match (near, self.far_earliest()) {
            (Some(near), Some(far)) => Some(near.min(far)),
            (near, far) => near.or(far),
        }
    }

    /// The earliest far deadline, looked for if not known.
    fn far_earliest(&self) -> Option<Time> {
        if self.far_at.is_empty() {
            return None;
        }
        if let Some(min) = self.far_min.get() {
            return Some(min);
        }
        let min = self.far_at.iter().copied().min();
        self.far_min.set(min);
        min
    }

    /// The earliest timer; with `by`, the earliest due by then (once
    /// caught up with it: [`Table::due_by`]).
    #[inline]
    pub(crate) fn earliest(&self, by: Option<Time>) -> Option<Time> {
        match by {
            Some(target) => self.due_by(target),
            None => self.next_deadline(),
        }
    }

    /// The earliest deadline if it is due by `target`: the table must have
    /// caught up with `target`, so that no far timer is.
    pub(crate) fn due_by(&self, target: Time) -> Option<Time> {
        debug_assert!(self.far_at.is_empty() || target < self.horizon);
        self.heap
            .first()
            .map(|&k| at_of(k))
            .filter(|&at| at <= target)
    }

    /// Time is `now`: once it reaches the horizon, the horizon moves a span
    /// past it, and the far timers due before it move into the heap.
    pub(crate) fn catch_up(&mut self, now: Time) {
        if now < self.horizon {
            return;
        }
        self.horizon = now.saturating_add(SPAN);
        self.far_min.set(None);
        let mut index = 0;
        while index < self.far_at.len() {
            if self.far_at[index] < self.horizon {
                let (at, slot) = self.take_far(index);
                self.push_near(at, slot);
            } else {
                index += 1;
            }
        }
    }

    /// Takes the far timer at `index` out; the last one takes its place.
    fn take_far(&mut self, index: usize) -> (Time, u32) {
        let at = self.far_at.swap_remove(index);
        let slot = self.far_slot.swap_remove(index);
        if let Some(&moved) = self.far_slot.get(index) {
            self.slots[moved as usize].timer = index as u32 | FAR;
        }
        (at, slot)
    }

    /// The record whose timer is the earliest, if it is due at `now`: its
    /// timer is disarmed. The table must have caught up with `now`.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<Handle> {
        debug_assert!(self.far_at.is_empty() || now < self.horizon);
        let &first = self.heap.first()?;
        if at_of(first) > now {
            return None;
        }
        let slot = slot_of(first);
        let handle = Handle {
            slot,
            gen: self.slots[slot as usize].gen,
        };
        self.clear_timer(handle);
        Some(handle)
    }

    /// Puts the timer `key` at `index`, and notes where it is.
    fn place(&mut self, index: usize, key: u128) {
        self.heap[index] = key;
        self.slots[slot_of(key) as usize].timer = index as u32;
    }

    /// The earliest child of the node at `index`, if it has any.
    fn first_child(&self, index: usize) -> Option<usize> {
        let first = ARITY * index + 1;
        let children = self.heap.get(first..(first + ARITY).min(self.heap.len()))?;
        let (mut best, mut best_key) = (0, *children.first()?);
        for (i, &key) in children.iter().enumerate().skip(1) {
            if key < best_key {
                (best, best_key) = (i, key);
            }
        }
        Some(first + best)
    }

    /// Moves the timer `key`, now at `index`, up to its place.
    fn sift_up(&mut self, mut index: usize, key: u128) {
        while index > 0 {
            let parent = (index - 1) / ARITY;
            if key >= self.heap[parent] {
                break;
            }
            self.place(index, self.heap[parent]);
            index = parent;
        }
        self.place(index, key);
    }

    /// Moves the timer `key`, now at `index`, down to its place.
    fn sift_down(&mut self, mut index: usize, key: u128) {
        while let Some(child) = self.first_child(index) {
            if self.heap[child] >= key {
                break;
            }
            self.place(index, self.heap[child]);
            index = child;
        }
        self.place(index, key);
    }

    /// Fills the hole at `index` with `key`, a timer from the end of the
    /// heap, so most often among the latest: the hole first sinks to a
    /// leaf, each step taking the earliest child up without comparing it
    /// with the timer, which then rises from there to its place.
    fn sink(&mut self, mut index: usize, key: u128) {
        while let Some(child) = self.first_child(index) {
            self.place(index, self.heap[child]);
            index = child;
        }
        self.sift_up(index, key);
    }
}

/// A heap timer's key: its deadline, then its slot, in one number, so that
/// the heap's order is that of the numbers.
fn key(at: Time, slot: u32) -> u128 {
    u128::from(at.as_nanos()) << 32 | u128::from(slot)
}

/// The deadline of a heap timer's key.
fn at_of(key: u128) -> Time {
    Time::from_nanos((key >> 32) as u64)
}

/// The slot of a heap timer's key.
fn slot_of(key: u128) -> u32 {
    key as u32
}

/// Handles waiting their turn, first in first out. Each push hands out a
/// ticket, which the record keeps while it waits: a record may leave the
/// queue early (cancelled, timed out), and its handle stays behind, but
/// `pop` knows it by its ticket and skips it, even if the record waits
/// again by then under a newer one. Once more than half of what is kept
/// is left behind that way, it is swept out, so a queue never holds more
/// than twice what waits in it, plus a few.
#[derive(Default)]
pub(crate) struct Queue {
    entries: VecDeque<(Handle, u32)>,
    /// Tickets handed out so far.
    tickets: u32,
    /// Records that left early, whose entries are still in `entries`.
    gone: usize,
}

/// A queue this short is never swept.
const SWEEP_ABOVE: usize = 64;
/// What a queue keeps of its capacity once a burst has gone through it:
/// more than steady traffic needs between two polls.
const KEPT: usize = 4096;

impl Queue {
    /// Puts `handle` last; its ticket.
    pub(crate) fn push_back(&mut self, handle: Handle) -> u32 {
        self.tickets = self.tickets.wrapping_add(1);
        self.entries.push_back((handle, self.tickets));
        self.tickets
    }

    /// Puts `handle` first (a request that was in flight when its
    /// connection closed goes again before those that never went); its
    /// ticket.
    pub(crate) fn push_front(&mut self, handle: Handle) -> u32 {
        self.tickets = self.tickets.wrapping_add(1);
        self.entries.push_front((handle, self.tickets));
        self.tickets
    }

    /// How many wait in it.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.gone
    }

    /// The first handle whose record still waits with its ticket (`waits`
    /// says which do).
    pub(crate) fn pop(&mut self, waits: impl Fn(Handle, u32) -> bool) -> Option<Handle> {
        while let Some((handle, ticket)) = self.entries.pop_front() {
            if waits(handle, ticket) {
                if self.entries.is_empty() && self.entries.capacity() > KEPT {
                    self.entries.shrink_to(KEPT);
                }
                return Some(handle);
            }
            self.gone -= 1;
        }
        None
    }

    /// A record stopped waiting other than by `pop`. `waits` says, of each
    /// entry, whether its record still waits with that ticket, for a sweep.
    pub(crate) fn left(&mut self, waits: impl Fn(Handle, u32) -> bool) {
        self.gone += 1;
        if self.gone > SWEEP_ABOVE && 2 * self.gone > self.entries.len() {
            self.entries.retain(|&(h, t)| waits(h, t));
            self.gone = 0;
            if self.entries.capacity() > 4 * self.entries.len().max(KEPT) {
                self.entries.shrink_to(2 * self.entries.len().max(KEPT));
            }
        }
    }
}

/// The room a send buffer reserves at once, and what it keeps of a burst.
const SEND_BUFFER_ROOM: usize = 64 * 1024;
const SEND_BUFFER_KEPT: usize = 4 * SEND_BUFFER_ROOM;
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
    /// Makes room for at least `n` more bytes, a few frames' worth at once;
    /// an empty buffer first reserves room for many frames, which the sends
    /// taken from it give back, once dropped, without a copy.
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, VecDeque};

    use super::*;
    use crate::rng::Rng;

    /// Every heap entry is below its children and names a slot that knows
    /// its index; every armed slot is in the heap; the count is right.
    fn assert_sound<T>(table: &Table<T>) {
        for index in 0..table.heap.len() {
            let slot = slot_of(table.heap[index]);
            assert_eq!(table.slots[slot as usize].timer, index as u32);
            assert!(table.slots[slot as usize].value.is_some());
            if index > 0 {
                assert!(
                    table.heap[(index - 1) / ARITY] <= table.heap[index],
                    "a heap"
                );
            }
        }
        for index in 0..table.far_at.len() {
            let slot = table.far_slot[index];
            assert_eq!(table.slots[slot as usize].timer, index as u32 | FAR);
            assert!(
                table.far_at[index] >= table.horizon,
                "far timers are past the horizon"
            );
        }
        let armed = table.slots.iter().filter(|s| s.timer != NONE).count();
        assert_eq!(armed, table.heap.len() + table.far_at.len());
        let stored = table.slots.iter().filter(|s| s.value.is_some()).count();
        assert_eq!(stored, table.len());
    }

    /// Random inserts, removals, lookups, timers set, moved, cleared and
    /// fired, compared step by step with a `BTreeMap` of records and their
    /// deadlines: the same records, the same earliest deadline, and timers
    /// due at one moment fired in slot order.
    #[test]
    fn a_table_and_its_timers_behave_like_a_map() {
        for seed in 0..30 {
            let mut rng = Rng::new(seed);
            let mut table: Table<u64> = Table::default();
            let mut model: BTreeMap<Handle, (u64, Option<Time>)> = BTreeMap::new();
            let mut gone: Vec<Handle> = Vec::new();
            let pick = |rng: &mut Rng, model: &BTreeMap<Handle, (u64, Option<Time>)>| {
                let n = model.len() as u64;
                (n > 0).then(|| *model.keys().nth(rng.up_to(n - 1) as usize).unwrap())
            };
            let mut now = Time::ZERO;
            for step in 0..3_000u64 {
                // Deadlines from a small range, so that they tie, or far
                // ahead, past the horizon.
                let at = match rng.chance(1, 3) {
                    true => Time::from_millis(now.as_millis() + 1_000 + rng.up_to(5_000)),
                    false => Time::from_millis(now.as_millis() + rng.up_to(50)),
                };
                match rng.up_to(9) {
                    0..=2 => {
                        let handle = table.insert(step).expect("room");
                        assert!(
                            !gone.contains(&handle),
                            "a handle is never handed out twice"
                        );
                        model.insert(handle, (step, None));
                    }
                    3 => {
                        if let Some(h) = pick(&mut rng, &model) {
                            assert_eq!(table.remove(h), Some(model.remove(&h).unwrap().0));
                            gone.push(h);
                        }
                    }
                    4 | 5 => {
                        if let Some(h) = pick(&mut rng, &model) {
                            table.set_timer(h, at);
                            model.get_mut(&h).unwrap().1 = Some(at);
                        }
                    }
                    6 => {
                        if let Some(h) = pick(&mut rng, &model) {
                            table.clear_timer(h);
                            model.get_mut(&h).unwrap().1 = None;
                        }
                    }
                    7 => {
                        now = now.saturating_add_millis(rng.up_to(2_000));
                        table.catch_up(now);
                        // Due ones fire in (deadline, slot) order.
                        let mut due: Vec<(Time, u32, Handle)> = model
                            .iter()
                            .filter_map(|(&h, &(_, at))| {
                                at.filter(|&at| at <= now).map(|at| (at, h.slot(), h))
                            })
                            .collect();
                        due.sort();
                        for (_, _, want) in due {
                            assert_eq!(table.pop_due(now), Some(want));
                            model.get_mut(&want).unwrap().1 = None;
                        }
                        assert_eq!(table.pop_due(now), None);
                    }
                    _ => {
                        // Handles of records that are gone reach nothing.
                        if let Some(&h) = gone.last() {
                            assert_eq!(table.get(h), None);
                            table.set_timer(h, at);
                            assert_eq!(table.timer(h), None);
                            assert_eq!(table.remove(h), None);
                        }
                    }
                }
                // The next deadline is the earliest, or (for timers past the
                // horizon) a moment before it, never after it.
                let earliest = model.values().filter_map(|&(_, at)| at).min();
                let next = table.next_deadline();
                assert_eq!(
                    next.is_some(),
                    earliest.is_some(),
                    "seed {seed} step {step}"
                );
                assert!(
                    next <= earliest,
                    "seed {seed} step {step}: {next:?} after {earliest:?}"
                );
                if let (Some(next), Some(earliest)) = (next, earliest) {
                    // Waking at `next` finds the earliest, or a later next.
                    if next < earliest && next >= now {
                        let mut probe: Table<u64> = Table::default();
                        std::mem::swap(&mut probe, &mut table);
                        probe.catch_up(next);
                        let again = probe.next_deadline().unwrap();
                        assert!(again > next || again == earliest, "seed {seed} step {step}");
                        std::mem::swap(&mut probe, &mut table);
                    }
                }
                for (&h, &(value, at)) in &model {
                    assert_eq!(table.get(h), Some(&value));
                    assert_eq!(table.timer(h), at);
                }
                assert_eq!(table.len(), model.len());
                assert_sound(&table);
            }
        }
    }

    /// Random pushes at both ends, pops, and records leaving or waiting
    /// again under a new ticket, compared with a `VecDeque` that removes
    /// at once; a queue holds at most about twice what waits in it.
    #[test]
    fn a_queue_behaves_like_one_that_removes_at_once() {
        let mut rng = Rng::new(5);
        let mut queue = Queue::default();
        // What waits, and the ticket each record waits with.
        let mut model: VecDeque<Handle> = VecDeque::new();
        let mut tickets: BTreeMap<Handle, u32> = BTreeMap::new();
        let mut next = 0u32;
        for step in 0..50_000u32 {
            let waits = |t: &BTreeMap<Handle, u32>| {
                let t = t.clone();
                move |h: Handle, ticket: u32| t.get(&h) == Some(&ticket)
            };
            match rng.up_to(9) {
                0..=2 => {
                    let h = Handle::from_parts(next % 500, next / 500);
                    next += 1;
                    tickets.insert(h, queue.push_back(h));
                    model.push_back(h);
                }
                3 => {
                    let h = Handle::from_parts(next % 500, next / 500);
                    next += 1;
                    tickets.insert(h, queue.push_front(h));
                    model.push_front(h);
                }
                4 | 5 => {
                    let got = queue.pop(waits(&tickets));
                    assert_eq!(got, model.pop_front(), "step {step}");
                    if let Some(h) = got {
                        tickets.remove(&h);
                    }
                }
                6 | 7 if !model.is_empty() => {
                    // A record leaves early.
                    let at = rng.up_to(model.len() as u64 - 1) as usize;
                    let h = model.remove(at).unwrap();
                    tickets.remove(&h);
                    queue.left(waits(&tickets));
                }
                _ if !model.is_empty() => {
                    // One leaves, then waits again at the back: its old
                    // entry must not send it early.
                    let at = rng.up_to(model.len() as u64 - 1) as usize;
                    let h = model.remove(at).unwrap();
                    tickets.remove(&h);
                    queue.left(waits(&tickets));
                    tickets.insert(h, queue.push_back(h));
                    model.push_back(h);
                }
                _ => {}
            }
            assert_eq!(queue.len(), model.len(), "step {step}");
            assert!(queue.entries.len() <= 2 * model.len() + 2 * SWEEP_ABOVE + 2);
        }
    }

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
            frame.encode(&mut out);
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
}
