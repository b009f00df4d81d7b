//! Tokens (PROTOCOL.md 4.1): `token = epoch * 2^22 + n`, the `n`-th grant
//! of the term with that epoch, and the last epoch whose tokens fit 64
//! bits. The terms ([`super::term`]), the lock table and the table images
//! ([`super::image`]) all read tokens with it, so that none of them needs
//! another for that.

/// The bits of a token that count the term's grants: `token = epoch * 2^22 + n`.
pub const COUNTER_BITS: u32 = 22;

/// A term's grants are numbered `1..TERM_GRANTS`; the one that would reach
/// `TERM_GRANTS` (2^22) begins a new term instead.
pub const TERM_GRANTS: u64 = 1 << COUNTER_BITS;

/// The greatest epoch whose tokens fit a `u64`: 2^42 - 1 milliseconds after
/// 1970 is in May 2109.
pub const MAX_EPOCH: u64 = u64::MAX >> COUNTER_BITS;

/// The token of the `n`-th grant of the term with `epoch`, `None` if there
/// is none (`n` is 0 or at least 2^22, or the epoch is past [`MAX_EPOCH`]).
pub const fn token(epoch: u64, n: u64) -> Option<u64> {
    if n == 0 || n >= TERM_GRANTS || epoch > MAX_EPOCH {
        return None;
    }
    // Cannot overflow: epoch <= 2^42 - 1 and n < 2^22.
    Some((epoch << COUNTER_BITS) | n)
}

/// The epoch a token was granted in.
pub const fn epoch_of(token: u64) -> u64 {
    token >> COUNTER_BITS
}

/// Which grant of its term a token was (its `n`, 0 for no token).
pub const fn count_of(token: u64) -> u64 {
    token & (TERM_GRANTS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_epoch_times_2_pow_22_plus_n_and_fit_until_2109() {
        assert_eq!(token(0, 1), Some(1));
        assert_eq!(token(1, 1), Some((1 << 22) + 1));
        assert_eq!(token(5, TERM_GRANTS - 1), Some(6 * TERM_GRANTS - 1));
        assert_eq!(token(5, 0), None, "n counts from 1");
        assert_eq!(token(5, TERM_GRANTS), None, "n = 2^22 is a new term");
        // The last token of the last epoch is u64::MAX: nothing wraps.
        assert_eq!(token(MAX_EPOCH, TERM_GRANTS - 1), Some(u64::MAX));
        assert_eq!(token(MAX_EPOCH + 1, 1), None);
        assert_eq!(epoch_of(u64::MAX), MAX_EPOCH);
        assert_eq!(count_of(token(77, 12).unwrap()), 12);
        assert_eq!(epoch_of(token(77, 12).unwrap()), 77);
        // 2109-01-01T00:00:00Z in ms since 1970 still fits; May 2109 is the
        // end (2^42 ms after 1970 is 2109-05-15).
        const JAN_2109_MS: u64 = 4_386_441_600_000;
        const { assert!(JAN_2109_MS < MAX_EPOCH) };
        assert!(token(JAN_2109_MS, TERM_GRANTS - 1).is_some());
        const JUN_2109_MS: u64 = 4_399_488_000_000;
        const { assert!(JUN_2109_MS > MAX_EPOCH) };
    }
}
