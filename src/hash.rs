//! The one hash for numbers the crate makes itself (request ids,
//! operation ids, tickets), and the maps keyed by them.
//!
//! Such keys come from counters, never from the network, so SipHash's
//! defence against chosen keys buys nothing there, and one multiplication
//! by 2^64/φ spreads them well: it maps consecutive numbers to distinct
//! low bits (the multiplier is odd), which is what a hash table indexes by,
//! and mixes every bit of the key into the top ones. Maps keyed by what a
//! peer chooses (the server's lock table) use a keyed hash instead.

use core::hash::{BuildHasherDefault, Hasher};
use std::collections::HashMap;

/// `n` times 2^64/φ (Fibonacci hashing): consecutive numbers get distinct
/// low bits (the multiplier is odd) and every bit of `n` reaches the top
/// ones, which a table indexes by.
#[inline]
pub(crate) const fn spread(n: u64) -> u64 {
    n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Multiplies each number written into it by 2^64/φ (see [`spread`]).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = spread(self.0.rotate_left(5) ^ n);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by numbers the crate makes itself (the adapters' replies,
/// the client's renewals asked before their grant came).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use core::hash::Hash;

    fn hash(n: u64) -> u64 {
        let mut h = IdHasher::default();
        n.hash(&mut h);
        h.finish()
    }

    #[test]
    fn consecutive_ids_get_distinct_low_bits_and_mixed_top_bits() {
        // The low 12 bits of 4,096 consecutive ids are a permutation.
        let mut low: Vec<u64> = (1_000..1_000 + 4_096).map(|n| hash(n) & 0xfff).collect();
        low.sort_unstable();
        low.dedup();
        assert_eq!(low.len(), 4_096);
        // The top 7 bits (what hashbrown compares first) take many values.
        let mut top: Vec<u64> = (0..1_024).map(|n| hash(n) >> 57).collect();
        top.sort_unstable();
        top.dedup();
        assert!(top.len() > 100, "{}", top.len());
        assert_ne!(hash(1), hash(2));
    }
}
