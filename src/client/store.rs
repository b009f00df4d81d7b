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
//! A table is a slab (a vector of slots and a list of the free ones) with
//! an indexed binary heap of timers: each slot knows where its timer is in
//! the heap, so setting, moving and clearing a timer are `O(log n)` and
//! nothing dead is ever left in the heap. Timers due at one moment come in
//! slot order. Nothing here allocates once the containers have grown to
//! their working size. Each container is checked step by step against a
//! plain model in the tests at the end of this file.

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
    /// The handle with these parts.
    pub(crate) const fn from_parts(slot: u32, gen: u32) -> Handle {
        Handle { slot, gen }
    }

    /// The slot.
    pub(crate) const fn slot(self) -> u32 {
        self.slot
    }

    /// The slot's generation when the record was stored.
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

/// Makes room for one more in `v`, an eighth more at a time: a table is
/// never much larger than what it holds (doubling would leave up to half of
/// it unused, for as long as it lives).
fn grow<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.len() / 8 + 16);
    }
}

/// Records of type `T`, each with at most one timer.
pub(crate) struct Table<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
    /// The armed timers, a binary min-heap by `(deadline, slot)`.
    heap: Vec<(Time, u32)>,
}

impl<T> Default for Table<T> {
    fn default() -> Table<T> {
        Table {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            heap: Vec::new(),
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
        self.len += 1;
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
        self.len -= 1;
        value
    }

    /// How many records are stored.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every record, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Handle, &T)> + '_ {
        self.slots.iter().enumerate().filter_map(|(slot, s)| {
            let handle = Handle {
                slot: slot as u32,
                gen: s.gen,
            };
            s.value.as_ref().map(|value| (handle, value))
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
        let index = match slot.timer {
            NONE => {
                grow(&mut self.heap);
                self.heap.push((at, handle.slot));
                self.heap.len() - 1
            }
            index => {
                self.heap[index as usize].0 = at;
                index as usize
            }
        };
        let index = self.sift_up(index);
        self.sift_down(index);
    }

    /// Disarms the record's timer, if armed.
    pub(crate) fn clear_timer(&mut self, handle: Handle) {
        let Some(index) = self.slot(handle).map(|s| s.timer).filter(|&i| i != NONE) else {
            return;
        };
        self.slots[handle.slot as usize].timer = NONE;
        let last = self.heap.pop().expect("an armed timer is in the heap");
        let index = index as usize;
        if index < self.heap.len() {
            self.heap[index] = last;
            self.slots[last.1 as usize].timer = index as u32;
            let index = self.sift_up(index);
            self.sift_down(index);
        }
    }

    /// When the record's timer is armed for, if it is.
    pub(crate) fn timer(&self, handle: Handle) -> Option<Time> {
        let index = self.slot(handle)?.timer;
        (index != NONE).then(|| self.heap[index as usize].0)
    }

    /// The earliest armed deadline.
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        self.heap.first().map(|&(at, _)| at)
    }

    /// The record whose timer is the earliest, if it is due at `now`: its
    /// timer is disarmed.
    pub(crate) fn pop_due(&mut self, now: Time) -> Option<Handle> {
        let &(at, slot) = self.heap.first()?;
        if at > now {
            return None;
        }
        let handle = Handle {
            slot,
            gen: self.slots[slot as usize].gen,
        };
        self.clear_timer(handle);
        Some(handle)
    }

    /// Moves the heap entry at `index` up to its place; where it ends.
    fn sift_up(&mut self, mut index: usize) -> usize {
        let entry = self.heap[index];
        while index > 0 {
            let parent = (index - 1) / 2;
            if self.heap[parent] <= entry {
                break;
            }
            self.heap[index] = self.heap[parent];
            self.slots[self.heap[index].1 as usize].timer = index as u32;
            index = parent;
        }
        self.heap[index] = entry;
        self.slots[entry.1 as usize].timer = index as u32;
        index
    }

    /// Moves the heap entry at `index` down to its place.
    fn sift_down(&mut self, mut index: usize) {
        let entry = self.heap[index];
        let len = self.heap.len();
        loop {
            let left = 2 * index + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let child = if right < len && self.heap[right] < self.heap[left] {
                right
            } else {
                left
            };
            if entry <= self.heap[child] {
                break;
            }
            self.heap[index] = self.heap[child];
            self.slots[self.heap[index].1 as usize].timer = index as u32;
            index = child;
        }
        self.heap[index] = entry;
        self.slots[entry.1 as usize].timer = index as u32;
    }
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
    fn ticket(&mut self) -> u32 {
        self.tickets = self.tickets.wrapping_add(1);
        self.tickets
    }

    /// Puts `handle` last; its ticket.
    pub(crate) fn push_back(&mut self, handle: Handle) -> u32 {
        let ticket = self.ticket();
        self.entries.push_back((handle, ticket));
        ticket
    }

    /// Puts `handle` first (a request that was in flight when its
    /// connection closed goes again before those that never went); its
    /// ticket.
    pub(crate) fn push_front(&mut self, handle: Handle) -> u32 {
        let ticket = self.ticket();
        self.entries.push_front((handle, ticket));
        ticket
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, VecDeque};

    use super::*;
    use crate::rng::Rng;

    /// Every heap entry is below its children and names a slot that knows
    /// its index; every armed slot is in the heap; the count is right.
    fn assert_sound<T>(table: &Table<T>) {
        for (index, &(at, slot)) in table.heap.iter().enumerate() {
            assert_eq!(table.slots[slot as usize].timer, index as u32);
            assert!(table.slots[slot as usize].value.is_some());
            if index > 0 {
                assert!(table.heap[(index - 1) / 2] <= (at, slot), "a heap");
            }
        }
        let armed = table.slots.iter().filter(|s| s.timer != NONE).count();
        assert_eq!(armed, table.heap.len());
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
                // Deadlines from a small range, so that they tie.
                let at = Time::from_millis(now.as_millis() + rng.up_to(50));
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
                        now = now.saturating_add_millis(rng.up_to(20));
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
                let earliest = model.values().filter_map(|&(_, at)| at).min();
                assert_eq!(table.next_deadline(), earliest, "seed {seed} step {step}");
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
