//! What a replicated cluster replicates (PROTOCOL.md 4.3): the decisions
//! that change the lock table, never the requests behind them. A leader's
//! table notes each decision as it makes it; the decisions of one turn of
//! its loop travel as one Raft entry, encoded here; every member applies
//! them to its copy of the table ([`LockTable::apply`](super::LockTable)).
//!
//! An entry is `D`, a format byte (1), then each decision as a tag byte and
//! its fields, numbers as 8 bytes little-endian (a cluster identity as 16),
//! a key as its length (one byte: keys are atoms of at most [`MAX_ATOM`]
//! bytes) and its bytes. A
//! decoder takes nothing on trust: a key that is not an atom, a token or a
//! lease of 0, a truncated field or an unknown tag is an error, never a
//! guess.

use core::num::{NonZeroU128, NonZeroU64};

use thiserror::Error;

use crate::names::Key;
use crate::wire::check_atom;
use crate::wire::MAX_ATOM;

/// The first byte of an entry, and the format that follows it.
const MAGIC: u8 = b'D';
const FORMAT: u8 = 1;

const FLOOR: u8 = 0;
const GRANT: u8 = 1;
const RELEASE: u8 = 2;
const EXPIRE: u8 = 3;
const RENEW: u8 = 4;
const CLUSTER: u8 = 5;
const RESTORED: u8 = 6;

/// One change to the lock table, as a leader decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The epoch the cluster's tokens count from: a token is
    /// `(floor + index) * 2^22 + n` for the `n`-th grant of the entry at
    /// Raft index `index`, above every token of PROTOCOL.md 4.1 given
    /// before the cluster began. Decided once, by the first leader.
    Floor {
        /// The floor's epoch (a wall-clock time in milliseconds).
        epoch: u64,
    },
    /// The cluster's identity (PROTOCOL.md 4.3, "A state directory knows
    /// whose it is"): drawn once, by the first leader that finds none
    /// committed; every member records it. It changes nothing in the table.
    Cluster {
        /// Its 128 bits.
        id: NonZeroU128,
    },
    /// The cluster begins from a backup (PROTOCOL.md 4.4, "Backup and
    /// restore"): the one taken at `index`, whose `grants` grants follow in
    /// the same entry. Decided once, by the first leader, before its floor;
    /// every member given a backup checks it is its own. It changes nothing
    /// in the table.
    Restored {
        /// The applied index the backup was taken at.
        index: u64,
        /// How many grants it holds.
        grants: u64,
    },
    /// `key` granted with `token` for `lease_ms`, counted from when a
    /// member applies it.
    Grant {
        /// The key.
        key: Key,
        /// Its fencing token.
        token: u64,
        /// The lease, already capped.
        lease_ms: NonZeroU64,
    },
    /// The grant of `key` with `token` released.
    Release {
        /// The key.
        key: Key,
        /// The token released.
        token: u64,
    },
    /// The grant of `key` with `token` ran out.
    Expire {
        /// The key.
        key: Key,
        /// The token whose lease ended.
        token: u64,
    },
    /// The grant of `key` with `token` renewed: it lasts at least
    /// `lease_ms` from when a member applies this.
    Renew {
        /// The key.
        key: Key,
        /// The token renewed.
        token: u64,
        /// The lease, already capped.
        lease_ms: NonZeroU64,
    },
}

/// Why bytes are not an entry of decisions.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecisionError {
    /// It does not begin with `D` and format 1.
    #[error("not an entry of decisions (format {0:?})")]
    Format(Option<(u8, u8)>),
    /// A field runs past the end, at this offset.
    #[error("truncated at byte {0}")]
    Truncated(usize),
    /// An unknown tag, at this offset.
    #[error("unknown decision {tag} at byte {at}")]
    Tag {
        /// The tag.
        tag: u8,
        /// Its offset.
        at: usize,
    },
    /// A key that is not an atom, or a token, lease or cluster identity of
    /// 0, at this offset.
    #[error("invalid field at byte {0}")]
    Invalid(usize),
}

impl Decision {
    /// Encodes `decisions` as one entry.
    pub fn encode_entry(decisions: &[Decision]) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + decisions.len() * 32);
        out.extend_from_slice(&[MAGIC, FORMAT]);
        for d in decisions {
            d.encode(&mut out);
        }
        out
    }

    /// Decodes an entry made by [`Decision::encode_entry`].
    pub fn decode_entry(bytes: &[u8]) -> Result<Vec<Decision>, DecisionError> {
        let mut r = Reader::of_entry(bytes)?;
        let mut out = Vec::new();
        while r.at < bytes.len() {
            let at = r.at;
            let tag = r.byte()?;
            out.push(match tag {
                FLOOR => Decision::Floor { epoch: r.u64()? },
                CLUSTER => Decision::Cluster { id: r.id()? },
                RESTORED => Decision::Restored {
                    index: r.u64()?,
                    grants: r.u64()?,
                },
                GRANT => Decision::Grant {
                    token: r.token()?,
                    lease_ms: r.lease()?,
                    key: r.key()?,
                },
                RELEASE => Decision::Release {
                    token: r.token()?,
                    key: r.key()?,
                },
                EXPIRE => Decision::Expire {
                    token: r.token()?,
                    key: r.key()?,
                },
                RENEW => Decision::Renew {
                    token: r.token()?,
                    lease_ms: r.lease()?,
                    key: r.key()?,
                },
                tag => return Err(DecisionError::Tag { tag, at }),
            });
        }
        Ok(out)
    }

    /// Whether `bytes` decode as an entry ([`Decision::decode_entry`] gives
    /// the same verdict), without building its decisions: what a member
    /// checks of every entry a peer sends it, before Raft takes it. The
    /// cluster identity it holds, if any.
    pub fn check_entry(bytes: &[u8]) -> Result<Option<NonZeroU128>, DecisionError> {
        let mut r = Reader::of_entry(bytes)?;
        let mut cluster = None;
        while r.at < bytes.len() {
            let at = r.at;
            match r.byte()? {
                FLOOR => {
                    r.u64()?;
                }
                CLUSTER => cluster = Some(r.id()?),
                RESTORED => {
                    r.u64()?;
                    r.u64()?;
                }
                GRANT | RENEW => {
                    r.token()?;
                    r.lease()?;
                    r.key_bytes()?;
                }
                RELEASE | EXPIRE => {
                    r.token()?;
                    r.key_bytes()?;
                }
                tag => return Err(DecisionError::Tag { tag, at }),
            }
        }
        Ok(cluster)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let key = |out: &mut Vec<u8>, key: &Key| {
            let bytes = key.as_bytes();
            // Keys are atoms: at most MAX_ATOM (250) bytes.
            out.push(bytes.len().min(MAX_ATOM) as u8);
            out.extend_from_slice(&bytes[..bytes.len().min(MAX_ATOM)]);
        };
        match self {
            Decision::Floor { epoch } => {
                out.push(FLOOR);
                out.extend_from_slice(&epoch.to_le_bytes());
            }
            Decision::Cluster { id } => {
                out.push(CLUSTER);
                out.extend_from_slice(&id.get().to_le_bytes());
            }
            Decision::Restored { index, grants } => {
                out.push(RESTORED);
                out.extend_from_slice(&index.to_le_bytes());
                out.extend_from_slice(&grants.to_le_bytes());
            }
            Decision::Grant {
                key: k,
                token,
                lease_ms,
            } => {
                out.push(GRANT);
                out.extend_from_slice(&token.to_le_bytes());
                out.extend_from_slice(&lease_ms.get().to_le_bytes());
                key(out, k);
            }
            Decision::Release { key: k, token } => {
                out.push(RELEASE);
                out.extend_from_slice(&token.to_le_bytes());
                key(out, k);
            }
            Decision::Expire { key: k, token } => {
                out.push(EXPIRE);
                out.extend_from_slice(&token.to_le_bytes());
                key(out, k);
            }
            Decision::Renew {
                key: k,
                token,
                lease_ms,
            } => {
                out.push(RENEW);
                out.extend_from_slice(&token.to_le_bytes());
                out.extend_from_slice(&lease_ms.get().to_le_bytes());
                key(out, k);
            }
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader of an entry's decisions, past its magic and format.
    fn of_entry(bytes: &'a [u8]) -> Result<Reader<'a>, DecisionError> {
        match bytes {
            [MAGIC, FORMAT, ..] => Ok(Reader { bytes, at: 2 }),
            [a, b, ..] => Err(DecisionError::Format(Some((*a, *b)))),
            _ => Err(DecisionError::Format(None)),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecisionError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(DecisionError::Truncated(self.at))?;
        let field = &self.bytes[self.at..end];
        self.at = end;
        Ok(field)
    }

    fn byte(&mut self) -> Result<u8, DecisionError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, DecisionError> {
        let field = self.take(8)?;
        let mut word = [0; 8];
        word.copy_from_slice(field);
        Ok(u64::from_le_bytes(word))
    }

    fn id(&mut self) -> Result<NonZeroU128, DecisionError> {
        let at = self.at;
        let mut word = [0; 16];
        word.copy_from_slice(self.take(16)?);
        NonZeroU128::new(u128::from_le_bytes(word)).ok_or(DecisionError::Invalid(at))
    }

    fn token(&mut self) -> Result<u64, DecisionError> {
        let at = self.at;
        match self.u64()? {
            0 => Err(DecisionError::Invalid(at)),
            token => Ok(token),
        }
    }

    fn lease(&mut self) -> Result<NonZeroU64, DecisionError> {
        let at = self.at;
        NonZeroU64::new(self.u64()?).ok_or(DecisionError::Invalid(at))
    }

    /// A key's bytes, checked to be an atom.
    fn key_bytes(&mut self) -> Result<&'a [u8], DecisionError> {
        let at = self.at;
        let len = usize::from(self.byte()?);
        let bytes = self.take(len)?;
        check_atom(bytes).map_err(|_| DecisionError::Invalid(at))?;
        Ok(bytes)
    }

    fn key(&mut self) -> Result<Key, DecisionError> {
        let at = self.at;
        let bytes = self.key_bytes()?;
        core::str::from_utf8(bytes)
            .ok()
            .and_then(|s| Key::new(s).ok())
            .ok_or(DecisionError::Invalid(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Key {
        Key::new(s).expect("atom")
    }

    fn lease(ms: u64) -> NonZeroU64 {
        NonZeroU64::new(ms).expect("nonzero")
    }

    fn every_kind() -> Vec<Decision> {
        vec![
            Decision::Floor { epoch: u64::MAX },
            Decision::Cluster {
                id: NonZeroU128::new(u128::MAX - 1).expect("nonzero"),
            },
            Decision::Restored {
                index: 41,
                grants: u64::MAX,
            },
            Decision::Grant {
                key: key("a"),
                token: 7,
                lease_ms: lease(1000),
            },
            Decision::Release {
                key: key(&"k".repeat(MAX_ATOM)),
                token: u64::MAX,
            },
            Decision::Expire {
                key: key("b/c"),
                token: 1,
            },
            Decision::Renew {
                key: key("d"),
                token: 9,
                lease_ms: lease(u64::MAX),
            },
        ]
    }

    #[test]
    fn every_kind_of_decision_reads_back_as_written() {
        let decisions = every_kind();
        let bytes = Decision::encode_entry(&decisions);
        assert_eq!(Decision::decode_entry(&bytes), Ok(decisions));
        assert_eq!(
            Decision::decode_entry(&Decision::encode_entry(&[])),
            Ok(vec![])
        );
    }

    #[test]
    fn every_cut_of_an_entry_is_an_error_or_a_prefix_of_its_decisions() {
        let decisions = every_kind();
        let bytes = Decision::encode_entry(&decisions);
        for end in 0..bytes.len() {
            match Decision::decode_entry(&bytes[..end]) {
                Err(_) => {}
                // A cut between two decisions reads as the ones before it.
                Ok(prefix) => assert_eq!(prefix[..], decisions[..prefix.len()], "cut at {end}"),
            }
        }
    }

    /// The check a member makes of a peer's entries agrees with decoding,
    /// on every cut and every byte changed of an entry of every kind.
    #[test]
    fn checking_an_entry_gives_decodings_verdict_and_its_cluster() {
        let decisions = every_kind();
        let bytes = Decision::encode_entry(&decisions);
        let cluster = NonZeroU128::new(u128::MAX - 1);
        assert_eq!(Decision::check_entry(&bytes), Ok(cluster));
        let agree = |b: &[u8]| {
            let decoded = Decision::decode_entry(b).map(|ds| {
                ds.iter().rev().find_map(|d| match d {
                    Decision::Cluster { id } => Some(*id),
                    _ => None,
                })
            });
            assert_eq!(Decision::check_entry(b), decoded, "{b:?}");
        };
        for end in 0..=bytes.len() {
            agree(&bytes[..end]);
        }
        for at in 0..bytes.len() {
            for value in [0, 1, b' ', b'~' + 1, 0x7f, 0xff] {
                let mut changed = bytes.clone();
                changed[at] = value;
                agree(&changed);
            }
        }
    }

    #[test]
    fn zero_tokens_zero_leases_bad_keys_and_unknown_tags_are_refused() {
        let grant = Decision::encode_entry(&[Decision::Grant {
            key: key("a"),
            token: 7,
            lease_ms: lease(5),
        }]);
        let mut zero_token = grant.clone();
        zero_token[3..11].fill(0);
        assert_eq!(
            Decision::decode_entry(&zero_token),
            Err(DecisionError::Invalid(3))
        );
        let mut zero_lease = grant.clone();
        zero_lease[11..19].fill(0);
        assert_eq!(
            Decision::decode_entry(&zero_lease),
            Err(DecisionError::Invalid(11))
        );
        let mut bad_key = grant.clone();
        bad_key[20] = b' ';
        assert_eq!(
            Decision::decode_entry(&bad_key),
            Err(DecisionError::Invalid(19))
        );
        let mut tag = grant.clone();
        tag[2] = 9;
        assert_eq!(
            Decision::decode_entry(&tag),
            Err(DecisionError::Tag { tag: 9, at: 2 })
        );
        assert_eq!(
            Decision::decode_entry(b"X\x01"),
            Err(DecisionError::Format(Some((b'X', 1))))
        );
    }
}
