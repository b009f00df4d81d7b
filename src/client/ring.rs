//! A first-in first-out ring for the core's outputs.
//!
//! Like a `VecDeque`, but an item is written straight into its place in the
//! ring, and a ring that has been emptied starts again at the front of its
//! memory (the part used last, so most likely in the cache) instead of
//! going round all of it.

/// A ring of `T`, its capacity a power of two.
pub(crate) struct Ring<T> {
    slots: Vec<Option<T>>,
    head: usize,
    len: usize,
}

impl<T> Default for Ring<T> {
    fn default() -> Ring<T> {
        Ring {
            slots: Vec::new(),
            head: 0,
            len: 0,
        }
    }
}

impl<T> Ring<T> {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `item`.
    #[inline(always)]
    pub(crate) fn push_back(&mut self, item: T) {
        if self.len == self.slots.len() {
            self.grow();
        }
        let at = (self.head + self.len) & (self.slots.len() - 1);
        self.slots[at] = Some(item);
        self.len += 1;
    }

    /// Takes the first item out.
    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let item = self.slots[self.head].take();
        self.len -= 1;
        self.head = if self.len == 0 {
            0
        } else {
            (self.head + 1) & (self.slots.len() - 1)
        };
        item
    }

    /// Doubles the ring (16 at first), keeping the order.
    #[cold]
    fn grow(&mut self) {
        let count = (2 * self.slots.len()).max(16);
        let mut slots: Vec<Option<T>> = Vec::with_capacity(count);
        let mask = self.slots.len().wrapping_sub(1);
        for i in 0..self.len {
            slots.push(self.slots[(self.head + i) & mask].take());
        }
        slots.resize_with(count, || None);
        self.slots = slots;
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;
    use std::collections::VecDeque;

    #[test]
    fn the_ring_behaves_like_a_deque() {
        let mut rng = crate::rng::Rng::new(12);
        let mut ring = Ring::default();
        let mut model = VecDeque::new();
        for step in 0..100_000u32 {
            if rng.chance(11, 20) {
                ring.push_back(step);
                model.push_back(step);
            } else {
                assert_eq!(ring.pop_front(), model.pop_front());
            }
            assert_eq!(ring.len(), model.len());
            assert_eq!(ring.is_empty(), model.is_empty());
        }
    }
}
