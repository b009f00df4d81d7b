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

use crate::names::Key;

/// The first line of an epoch record.
const EPOCH_MAGIC: &str = "ticketing-epoch 1";

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
}

/// The checksum of `body`: SipHash-1-3 under a fixed key. It guards
/// against torn and truncated writes, not against an adversary.
fn checksum(body: &[u8]) -> u64 {
    let mut h = SipHasher13::new_with_keys(0x7469_636b_6574_696e, 0x6773_7461_7465_0001);
    h.write(body);
    h.finish()
}

/// `body` followed by its checksum line.
fn seal(mut body: String) -> Vec<u8> {
    let sum = checksum(body.as_bytes());
    let _ = writeln!(body, "sum {sum:016x}");
    body.into_bytes()
}

/// The body of sealed bytes, if the checksum line is there and matches.
fn unseal(bytes: &[u8]) -> Result<&str, ImageError> {
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
fn number(s: &str) -> Option<u64> {
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
