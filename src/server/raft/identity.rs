//! Whose a member's state is (PROTOCOL.md 4.3, "A state directory knows
//! whose it is"): the cluster's identity, drawn by its first leader and
//! committed in the log, which every member records beside its Raft id.

use core::fmt;
use core::num::NonZeroU128;
use core::str::FromStr;

use thiserror::Error;

/// A replicated cluster's identity: 128 bits drawn once, by the cluster's
/// first leader, from the seed its driver gave it
/// ([`ReplicaConfig::draw`](super::ReplicaConfig::draw)). Written as 32
/// lowercase hexadecimal digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterId(NonZeroU128);

impl ClusterId {
    /// The identity whose bits are `bits`; none for 0, which stands for
    /// "not known yet" where identities are written.
    pub const fn new(bits: u128) -> Option<ClusterId> {
        match NonZeroU128::new(bits) {
            Some(bits) => Some(ClusterId(bits)),
            None => None,
        }
    }

    /// Its bits.
    pub const fn get(self) -> u128 {
        self.0.get()
    }

    /// The bits of `id`, 0 for none: as identities are written on disk
    /// and in peer hellos.
    pub fn bits_of(id: Option<ClusterId>) -> u128 {
        id.map_or(0, ClusterId::get)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0.get())
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterId({self})")
    }
}

/// Why text is not a [`ClusterId`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("a cluster identity is 32 hexadecimal digits, not all zero")]
pub struct ClusterIdError;

impl FromStr for ClusterId {
    type Err = ClusterIdError;

    fn from_str(s: &str) -> Result<ClusterId, ClusterIdError> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ClusterIdError);
        }
        let bits = u128::from_str_radix(s, 16).map_err(|_| ClusterIdError)?;
        ClusterId::new(bits).ok_or(ClusterIdError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_reads_back_from_its_text_and_nothing_else_does() {
        let id = ClusterId::new(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210).unwrap();
        assert_eq!(id.to_string(), "0123456789abcdeffedcba9876543210");
        assert_eq!(id.to_string().parse::<ClusterId>(), Ok(id));
        assert_eq!(ClusterId::new(1).unwrap().to_string(), format!("{:032}", 1));
        for bad in [
            "",
            "0",
            "00000000000000000000000000000000",
            "0123456789abcdeffedcba987654321",
            "0123456789abcdeffedcba98765432100",
            "+123456789abcdeffedcba9876543210",
            "0123456789abcdeffedcba987654321g",
        ] {
            assert_eq!(bad.parse::<ClusterId>(), Err(ClusterIdError), "{bad:?}");
        }
        assert_eq!(ClusterId::new(0), None);
        assert_eq!(ClusterId::bits_of(None), 0);
        assert_eq!(ClusterId::bits_of(Some(id)), id.get());
    }
}
