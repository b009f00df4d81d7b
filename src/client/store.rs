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
