//! What a server writes out so that its promises outlive it (PROTOCOL.md
//! 4.1): the epoch record, kept before a term's first grant, and the lock
//! table, written on a clean stop. Both are text with a checksum as their
//! last line, so that a torn or truncated write reads as an error, never
//! as a smaller table or an older epoch. The core encodes and decodes
//! them; the driver does the files (`ticketing serve --state-dir`).

use core::fmt::Write as _;
use core::hash::Hasher;
use core::time::Duration;

use siphasher::sip::SipHasher13;
use thiserror::Error;

use super::token::epoch_of;
use crate::names::Key;

/// The first line of an epoch record.
const EPOCH_MAGIC: &str = "ticketing-epoch 1";

/// The most digits a `u64` takes in decimal.
const U64_DIGITS: usize = 20;

/// The first line of a table image.
const TABLE_MAGIC: &str = "ticketing-table 1";

/// The durable part of a term: its epoch and the greatest lease that a
/// grant still live from it, or from an earlier term, may have. A term that
/// begins without the table takes a grace of that lease plus the margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochRecord {
    /// The epoch of the latest term begun.
    pub epoch: u64,
    /// The greatest lease, in milliseconds, that a grant of that term (or
    /// one still live from before it) may have.
    pub max_lease_ms: u64,
}

impl EpochRecord {
    /// The most bytes an encoded record takes (both numbers at `u64::MAX`):
    /// a driver reads no more than this of a file that should hold one.
    pub const MAX_ENCODED_LEN: usize = (EPOCH_MAGIC.len() + 1)
        + ("epoch ".len() + U64_DIGITS + 1)
        + ("max_lease_ms ".len() + U64_DIGITS + 1)
        + SUM_LINE_LEN;

    /// The record as bytes, checksum last.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = String::new();
        let _ = writeln!(body, "{EPOCH_MAGIC}");
        let _ = writeln!(body, "epoch {}", self.epoch);
        let _ = writeln!(body, "max_lease_ms {}", self.max_lease_ms);
        seal(body)
    }

    /// Reads a record back; anything but a whole, intact record is an
    /// error.
    pub fn decode(bytes: &[u8]) -> Result<EpochRecord, ImageError> {
        let mut lines = Fields::new(unseal(bytes)?);
        lines.magic(EPOCH_MAGIC)?;
        let record = EpochRecord {
            epoch: lines.number("epoch")?,
            max_lease_ms: lines.number("max_lease_ms")?,
        };
        lines.end()?;
        Ok(record)
    }
}

/// One grant of a [`TableImage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageGrant {
    /// The key.
    pub key: Key,
    /// Its fencing token.
    pub token: u64,
    /// What was left of its lease when the image was made, in
    /// milliseconds (at least 1).
    pub remaining_ms: u64,
}

/// A lock table written out: every grant with what was left of its lease,
/// the epoch and the counter, the greatest lease given, what was left of a
/// recovery grace, and the wall-clock time it was made at. Made by
/// [`Server::table_image`](super::Server::table_image), read back into a
/// new term by [`Term::Resumed`](super::Term::Resumed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableImage {
    /// The epoch of the term that wrote it.
    pub epoch: u64,
    /// How many grants that term had made (the `n` of its latest token).
    pub count: u64,
    /// The greatest lease, in milliseconds, any of its grants may have.
    pub max_lease_ms: u64,
    /// What was left of its recovery grace, in milliseconds (0: none).
    pub grace_ms: u64,
    /// When it was made, by the wall clock (since 1970), as the driver
    /// said: a driver counts the time stopped from it.
    pub written_at: Duration,
    /// Every grant, in key order.
    pub grants: Vec<ImageGrant>,
}

impl TableImage {
    /// The image as bytes, checksum last.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = String::new();
        let _ = writeln!(body, "{TABLE_MAGIC}");
        let _ = writeln!(body, "epoch {}", self.epoch);
        let _ = writeln!(body, "count {}", self.count);
        let _ = writeln!(body, "max_lease_ms {}", self.max_lease_ms);
        let _ = writeln!(body, "grace_ms {}", self.grace_ms);
        // Rounded up, so that the time stopped is never counted too long.
        let written_ms = self.written_at.as_nanos().div_ceil(1_000_000);
        let _ = writeln!(body, "written_ms {written_ms}");
        let _ = writeln!(body, "grants {}", self.grants.len());
        for g in &self.grants {
            let _ = writeln!(body, "g {} {} {}", g.key.as_str(), g.token, g.remaining_ms);
        }
        seal(body)
    }

    /// Reads an image back; anything but a whole, intact image is an error.
    pub fn decode(bytes: &[u8]) -> Result<TableImage, ImageError> {
        let mut lines = Fields::new(unseal(bytes)?);
        lines.magic(TABLE_MAGIC)?;
        let epoch = lines.number("epoch")?;
        let count = lines.number("count")?;
        let max_lease_ms = lines.number("max_lease_ms")?;
        let grace_ms = lines.number("grace_ms")?;
        let written_at = Duration::from_millis(lines.number("written_ms")?);
        let n = lines.number("grants")?;
        let mut grants = Vec::new();
        for _ in 0..n {
            let (line, at) = lines.next()?;
            let bad = || ImageError::Malformed { line: at };
            let mut fields = line.split(' ');
            if fields.next() != Some("g") {
                return Err(bad());
            }
            let key = fields
                .next()
                .and_then(|k| Key::new(k).ok())
                .ok_or_else(bad)?;
            let token = fields.next().and_then(number).ok_or_else(bad)?;
            let remaining_ms = fields.next().and_then(number).ok_or_else(bad)?;
            if fields.next().is_some() || token == 0 || remaining_ms == 0 {
                return Err(bad());
            }
            grants.push(ImageGrant {
                key,
                token,
                remaining_ms,
            });
        }
        lines.end()?;
        Ok(TableImage {
            epoch,
            count,
            max_lease_ms,
            grace_ms,
            written_at,
            grants,
        })
    }

    /// Whether the image's numbers are within what the term that wrote it
    /// could have given, by the epoch `record` kept beside it (PROTOCOL.md
    /// 4.1): of the record's epoch, no token of a later one, no lease
    /// (nor greatest lease) beyond the record's greatest, and no more grace
    /// left than a crash would cost now (that lease plus `grace_margin`).
    ///
    /// The bound is the record's, not the configuration of the start that
    /// reads it: a server restarted with a shorter longest lease still
    /// takes the table its longer leases were granted under. A table out
    /// of range is not used (the term begins with a recovery grace, which
    /// is always safe): its grants could outlive every grace to come, or
    /// its tokens outrank every token to come.
    pub fn check(&self, record: &EpochRecord, grace_margin: Duration) -> Result<(), ImageError> {
        let max_ms = record.max_lease_ms;
        let beyond = |range| Err(ImageError::OutOfRange(range));
        if self.epoch > record.epoch {
            return beyond(OutOfRange::EpochAhead {
                epoch: self.epoch,
                record: record.epoch,
            });
        }
        if self.epoch < record.epoch {
            return beyond(OutOfRange::Stale {
                epoch: self.epoch,
                record: record.epoch,
            });
        }
        if self.max_lease_ms > max_ms {
            return beyond(OutOfRange::MaxLease {
                lease_ms: self.max_lease_ms,
                max_ms,
            });
        }
        let grace_max_ms = max_ms.saturating_add(crate::time::duration_millis(grace_margin));
        if self.grace_ms > grace_max_ms {
            return beyond(OutOfRange::Grace {
                grace_ms: self.grace_ms,
                max_ms: grace_max_ms,
            });
        }
        for g in &self.grants {
            if epoch_of(g.token) > self.epoch {
                return beyond(OutOfRange::TokenAhead {
                    key: g.key.clone(),
                    epoch: epoch_of(g.token),
                    table: self.epoch,
                });
            }
            if g.remaining_ms > max_ms {
                return beyond(OutOfRange::Lease {
                    key: g.key.clone(),
                    lease_ms: g.remaining_ms,
                    max_ms,
                });
            }
        }
        Ok(())
    }
}

/// Why bytes are not an intact record or image.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ImageError {
    /// No checksum line at the end: a truncated or torn write.
    #[error("no checksum at the end (truncated?)")]
    Truncated,
    /// The checksum does not match the contents.
    #[error("the checksum does not match (a torn write?)")]
    Checksum,
    /// Intact, but not a record or image this version reads.
    #[error("malformed at line {line}")]
    Malformed {
        /// The line, counting from 1.
        line: usize,
    },
    /// Intact, but its numbers are out of range for the epoch record kept
    /// beside it ([`TableImage::check`]).
    #[error("out of range: {0}")]
    OutOfRange(OutOfRange),
}

/// A number of a [`TableImage`] that the term which wrote it could not
/// have given, by the epoch record kept beside it ([`TableImage::check`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum OutOfRange {
    /// The table is of an epoch the record never reached.
    #[error("the table's epoch {epoch} is ahead of the epoch record's {record}")]
    EpochAhead {
        /// The table's epoch.
        epoch: u64,
        /// The record's.
        record: u64,
    },
    /// The table is of an epoch before the record's: a later term began
    /// without it, so its grants are no longer the latest word.
    #[error("the table's epoch {epoch} is older than the epoch record's {record} (stale)")]
    Stale {
        /// The table's epoch.
        epoch: u64,
        /// The record's.
        record: u64,
    },
    /// A grant's token is of an epoch after the table's.
    #[error("the token of {key} is of epoch {epoch}, ahead of the table's {table}")]
    TokenAhead {
        /// The key.
        key: Key,
        /// The token's epoch.
        epoch: u64,
        /// The table's.
        table: u64,
    },
    /// A grant has more lease left than the greatest lease kept with the
    /// epoch.
    #[error("{key} has a lease of {lease_ms} ms left, beyond the {max_ms} ms kept with the epoch")]
    Lease {
        /// The key.
        key: Key,
        /// The lease left.
        lease_ms: u64,
        /// The greatest lease kept with the epoch.
        max_ms: u64,
    },
    /// The table's greatest lease is beyond the one kept with the epoch.
    #[error("a greatest lease of {lease_ms} ms, beyond the {max_ms} ms kept with the epoch")]
    MaxLease {
        /// The table's greatest lease.
        lease_ms: u64,
        /// The greatest lease kept with the epoch.
        max_ms: u64,
    },
    /// More of a recovery grace left than a crash would cost now.
    #[error("a grace of {grace_ms} ms left, beyond the {max_ms} ms a crash would cost")]
    Grace {
        /// The grace left.
        grace_ms: u64,
        /// The greatest lease kept with the epoch plus the margin.
        max_ms: u64,
    },
}

/// The checksum of `body`: SipHash-1-3 under a fixed key. It guards
/// against torn and truncated writes, not against an adversary.
fn checksum(body: &[u8]) -> u64 {
    let mut h = SipHasher13::new_with_keys(0x7469_636b_6574_696e, 0x6773_7461_7465_0001);
    h.write(body);
    h.finish()
}

/// The length of the checksum line: `sum `, 16 hex digits, `\n`.
const SUM_LINE_LEN: usize = "sum ".len() + 16 + 1;

/// `body` followed by its checksum line.
pub(crate) fn seal(mut body: String) -> Vec<u8> {
    let sum = checksum(body.as_bytes());
    let _ = writeln!(body, "sum {sum:016x}");
    body.into_bytes()
}

/// The body of sealed bytes, if the checksum line is there and matches.
pub(crate) fn unseal(bytes: &[u8]) -> Result<&str, ImageError> {
    let text = core::str::from_utf8(bytes).map_err(|_| ImageError::Checksum)?;
    let without_lf = text.strip_suffix('\n').ok_or(ImageError::Truncated)?;
    let start = without_lf.rfind('\n').map_or(0, |i| i + 1);
    let (body, last) = text.split_at(start);
    let hex = last
        .strip_prefix("sum ")
        .and_then(|s| s.strip_suffix('\n'))
        .filter(|h| h.len() == 16 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .ok_or(ImageError::Truncated)?;
    let sum = u64::from_str_radix(hex, 16).map_err(|_| ImageError::Truncated)?;
    if sum != checksum(body.as_bytes()) {
        return Err(ImageError::Checksum);
    }
    Ok(body)
}

/// A canonical decimal number: digits only, no leading zero.
pub(crate) fn number(s: &str) -> Option<u64> {
    let canonical = s == "0" || (!s.starts_with('0') && !s.is_empty());
    if !canonical || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The lines of a body, read in order.
struct Fields<'a> {
    lines: core::str::Lines<'a>,
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(body: &'a str) -> Fields<'a> {
        Fields {
            lines: body.lines(),
            at: 0,
        }
    }

    fn next(&mut self) -> Result<(&'a str, usize), ImageError> {
        self.at += 1;
        let line = self
            .lines
            .next()
            .ok_or(ImageError::Malformed { line: self.at })?;
        Ok((line, self.at))
    }

    fn magic(&mut self, magic: &str) -> Result<(), ImageError> {
        let (line, at) = self.next()?;
        if line == magic {
            Ok(())
        } else {
            Err(ImageError::Malformed { line: at })
        }
    }

    /// A line `name <number>`.
    fn number(&mut self, name: &str) -> Result<u64, ImageError> {
        let (line, at) = self.next()?;
        line.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(number)
            .ok_or(ImageError::Malformed { line: at })
    }

    /// Nothing follows.
    fn end(mut self) -> Result<(), ImageError> {
        match self.lines.next() {
            None => Ok(()),
            Some(_) => Err(ImageError::Malformed { line: self.at + 1 }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> TableImage {
        TableImage {
            epoch: 1_700_000_000_000,
            count: 3,
            max_lease_ms: 60_000,
            grace_ms: 0,
            written_at: Duration::from_millis(1_700_000_000_500),
            grants: vec![
                ImageGrant {
                    key: Key::new("a").unwrap(),
                    token: 7,
                    remaining_ms: 10,
                },
                ImageGrant {
                    key: Key::new("b~!").unwrap(),
                    token: u64::MAX,
                    remaining_ms: 60_000,
                },
            ],
        }
    }

    #[test]
    fn an_image_and_a_record_read_back_as_they_were_written() {
        let i = image();
        assert_eq!(TableImage::decode(&i.encode()), Ok(i));
        let empty = TableImage {
            grants: Vec::new(),
            ..image()
        };
        assert_eq!(TableImage::decode(&empty.encode()), Ok(empty));
        let r = EpochRecord {
            epoch: 42,
            max_lease_ms: 1,
        };
        assert_eq!(EpochRecord::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_an_error() {
        let bytes = image().encode();
        for len in 0..bytes.len() {
            assert!(
                TableImage::decode(&bytes[..len]).is_err(),
                "a prefix of {len} bytes was read"
            );
        }
        for i in 0..bytes.len() {
            for bit in [0x01, 0x20, 0x80] {
                let mut torn = bytes.clone();
                torn[i] ^= bit;
                assert!(TableImage::decode(&torn).is_err(), "byte {i} ^ {bit:#x}");
            }
        }
        let record = EpochRecord {
            epoch: 9,
            max_lease_ms: 5,
        }
        .encode();
        for len in 0..record.len() {
            assert!(EpochRecord::decode(&record[..len]).is_err());
        }
        assert_eq!(EpochRecord::decode(b""), Err(ImageError::Truncated));
        assert_eq!(
            EpochRecord::decode(b"ticketing-epoch 1\nepoch 9\n"),
            Err(ImageError::Truncated)
        );
        assert_eq!(
            EpochRecord::decode(&bytes),
            Err(ImageError::Malformed { line: 1 }),
            "a table is not an epoch record"
        );
    }

    #[test]
    fn the_longest_epoch_record_is_its_bound() {
        let longest = EpochRecord {
            epoch: u64::MAX,
            max_lease_ms: u64::MAX,
        };
        assert_eq!(longest.encode().len(), EpochRecord::MAX_ENCODED_LEN);
        let short = EpochRecord {
            epoch: 0,
            max_lease_ms: 0,
        };
        assert!(short.encode().len() < EpochRecord::MAX_ENCODED_LEN);
    }

    #[test]
    fn a_table_is_checked_against_the_record_kept_beside_it() {
        let margin = Duration::from_millis(1_000);
        let epoch = 1_700_000_000_000;
        let i = TableImage {
            grants: vec![
                ImageGrant {
                    key: Key::new("a").unwrap(),
                    token: (epoch - 5) << 22 | 9,
                    remaining_ms: 10,
                },
                ImageGrant {
                    key: Key::new("b").unwrap(),
                    token: epoch << 22 | 3,
                    remaining_ms: 60_000,
                },
            ],
            ..image()
        };
        // The record's greatest lease bounds the table, not the table's own.
        let record = EpochRecord {
            epoch,
            max_lease_ms: 60_000,
        };
        assert_eq!(i.check(&record, margin), Ok(()));
        let out = |image: &TableImage, record: &EpochRecord| match image.check(record, margin) {
            Err(ImageError::OutOfRange(range)) => range,
            other => panic!("in range: {other:?}"),
        };
        let mut long = i.clone();
        long.grants[0].remaining_ms = 60_001;
        assert_eq!(
            out(&long, &record),
            OutOfRange::Lease {
                key: Key::new("a").unwrap(),
                lease_ms: 60_001,
                max_ms: 60_000
            }
        );
        assert!(ImageError::OutOfRange(out(&long, &record))
            .to_string()
            .contains("60001 ms"));
        let mut wide = i.clone();
        wide.max_lease_ms = 60_001;
        assert!(matches!(out(&wide, &record), OutOfRange::MaxLease { .. }));
        // A grace of at most what a crash would cost now.
        let mut grace = i.clone();
        grace.grace_ms = 61_000;
        assert_eq!(grace.check(&record, margin), Ok(()));
        grace.grace_ms = 61_001;
        assert!(matches!(
            out(&grace, &record),
            OutOfRange::Grace { max_ms: 61_000, .. }
        ));
        // Epochs: the record's, and no token of a later one.
        let behind = EpochRecord {
            epoch: epoch - 1,
            ..record
        };
        assert!(matches!(out(&i, &behind), OutOfRange::EpochAhead { .. }));
        let later = EpochRecord {
            epoch: epoch + 1,
            ..record
        };
        assert!(matches!(out(&i, &later), OutOfRange::Stale { .. }));
        let mut token = i.clone();
        token.grants[1].token = (epoch + 1) << 22 | 1;
        assert!(matches!(
            out(&token, &record),
            OutOfRange::TokenAhead { .. }
        ));
    }

    #[test]
    fn a_sealed_body_that_is_not_canonical_is_malformed() {
        for body in [
            "ticketing-epoch 1\nepoch 09\nmax_lease_ms 1\n",
            "ticketing-epoch 1\nepoch +9\nmax_lease_ms 1\n",
            "ticketing-epoch 1\nepoch 9\n",
            "ticketing-epoch 1\nepoch 9\nmax_lease_ms 1\nmore\n",
            "ticketing-epoch 2\nepoch 9\nmax_lease_ms 1\n",
        ] {
            let sealed = seal(body.to_string());
            assert!(
                matches!(
                    EpochRecord::decode(&sealed),
                    Err(ImageError::Malformed { .. })
                ),
                "{body:?}"
            );
        }
        for grant in [
            "g a 0 5",
            "g a 5 0",
            "g a 5",
            "g a 5 5 5",
            "x a 5 5",
            "g  5 5",
        ] {
            let body = format!(
                "ticketing-table 1\nepoch 1\ncount 1\nmax_lease_ms 1\ngrace_ms 0\nwritten_ms 0\ngrants 1\n{grant}\n"
            );
            assert!(
                matches!(
                    TableImage::decode(&seal(body)),
                    Err(ImageError::Malformed { line: 8 })
                ),
                "{grant:?}"
            );
        }
    }
}
