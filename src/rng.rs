//! The seeded generator the cores draw their randomness from.
//!
//! The cores never ask the operating system for entropy: the embedder puts a
//! seed in the configuration and every random choice (backoff jitter in the
//! client, anything random in a simulation) comes from this generator. Same
//! seed, same inputs, same outputs.
//!
//! The generator is SplitMix64 (Steele, Lea and Flood, 2014): one `u64` of
//! state, full period, good enough statistics for jitter and simulation, and
//! trivially reproducible on every platform.

/// A small, fast, seeded pseudo-random generator (SplitMix64).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose whole future is fixed by `seed`.
    pub const fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number uniformly drawn from `0..=max`, without modulo bias.
    pub fn up_to(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next_u64();
        }
        let span = max + 1;
        // Reject the few values of the top partial bucket so that every
        // residue is equally likely (Lemire's threshold).
        let threshold = span.wrapping_neg() % span;
        loop {
            let x = self.next_u64();
            let wide = u128::from(x) * u128::from(span);
            if (wide as u64) >= threshold {
                return (wide >> 64) as u64;
            }
        }
    }

    /// `true` with probability `numerator / denominator` (false when the
    /// denominator is 0).
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        denominator != 0 && self.up_to(denominator - 1) < numerator
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_known_first_value() {
        let mut a = Rng::new(1234567);
        let mut b = Rng::new(1234567);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        // Reference value of SplitMix64 for seed 1234567.
        assert_eq!(Rng::new(1234567).next_u64(), 6457827717110365317);
    }

    #[test]
    fn up_to_stays_in_range_and_reaches_both_ends() {
        let mut r = Rng::new(7);
        let (mut saw0, mut saw5) = (false, false);
        for _ in 0..1000 {
            let x = r.up_to(5);
            assert!(x <= 5);
            saw0 |= x == 0;
            saw5 |= x == 5;
        }
        assert!(saw0 && saw5);
        assert_eq!(r.up_to(0), 0);
        let _ = r.up_to(u64::MAX);
    }
}
