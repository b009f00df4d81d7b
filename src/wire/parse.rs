//! Parsing one line (without its `\n`) into a frame, enforcing every framing
//! rule of PROTOCOL.md section 2.

use core::num::NonZeroU64;

use super::atom::{Addr, Atom, MAX_ATOM};
use super::error::FrameError;
use super::frame::{Answer, AnswerKind, ClientFrame, Op, RawAnswer, ServerFrame, Window};

/// The most fields any frame has, plus one to tell "too many" apart.
const MAX_FIELDS: usize = 7;

/// `0x01` in every byte of a word.
const ONES: u64 = 0x0101_0101_0101_0101;
/// `0x80` in every byte of a word.
const HIGHS: u64 = 0x8080_8080_8080_8080;
/// `0x7f` in every byte of a word.
const LOWS: u64 = !HIGHS;

/// Bit 7 of each byte set where that byte of `word` is zero (exact: no
/// carry crosses bytes).
#[inline(always)]
pub(super) fn zero_bytes(word: u64) -> u64 {
    !((word & LOWS).wrapping_add(LOWS) | word) & HIGHS
}

/// Bit 7 of each byte set where that byte of `word` is outside
/// `first..=last` (`1 <= first <= last <= 0x7e`; exact: no carry crosses
/// bytes).
#[inline(always)]
fn outside(word: u64, first: u8, last: u8) -> u64 {
    debug_assert!(1 <= first && first <= last && last <= 0x7e);
    // Bit 7 cleared: every byte is at most 0x7f, and stays below 0x100
    // with either addition below.
    let low = word & LOWS;
    // Below `first`: adding `0x80 - first` leaves bit 7 clear.
    let below = !low.wrapping_add(u64::from(0x80 - first) * ONES);
    // Above `last`: adding `0x7f - last` sets bit 7.
    let above = low.wrapping_add(u64::from(0x7f - last) * ONES);
    (word | below | above) & HIGHS
}

/// Bit 7 of each byte set where that byte of `word` is not printable ASCII
/// (`0x20..=0x7e`).
#[inline(always)]
fn unprintable(word: u64) -> u64 {
    outside(word, 0x20, 0x7e)
}

/// Bit 7 of each byte set where that byte of `word` cannot be in an atom
/// (`0x21..=0x7e`): a space, or a byte that is not printable.
#[inline(always)]
fn not_atom(word: u64) -> u64 {
    outside(word, 0x21, 0x7e)
}

/// A line split into fields, every byte checked.
struct Fields<'a> {
    fields: [&'a [u8]; MAX_FIELDS],
    /// How many fields the line has, capped at `MAX_FIELDS + 1`.
    count: usize,
}

impl<'a> Fields<'a> {
    /// Splits on single spaces, refusing CR, non-printable bytes and empty
    /// fields (double, leading or trailing spaces).
    fn split(line: &'a [u8]) -> Result<Fields<'a>, FrameError> {
        if line.is_empty() {
            return Err(FrameError::EmptyLine);
        }
        let mut fields: [&[u8]; MAX_FIELDS] = [&[]; MAX_FIELDS];
        let mut count = 0;
        let mut start = 0;
        // Eight bytes at a time while they are all printable: only their
        // spaces need a look. The last word overlaps the one before it, its
        // bytes already seen masked off. A word with an unprintable byte
        // stops this, and the byte loop below reports the first fault.
        let mut done = 0;
        while done < line.len() && line.len() >= 8 {
            let base = done.min(line.len() - 8);
            let word = u64::from_le_bytes(line[base..base + 8].try_into().expect("8 bytes"));
            let fresh = !0u64 << (8 * (done - base));
            if unprintable(word) & fresh != 0 {
                break;
            }
            let mut spaces = zero_bytes(word ^ (0x20 * ONES)) & fresh;
            while spaces != 0 {
                let at = base + (spaces.trailing_zeros() / 8) as usize;
                spaces &= spaces - 1;
                if at == start {
                    return Err(FrameError::EmptyField { index: count });
                }
                if count < MAX_FIELDS {
                    fields[count] = &line[start..at];
                }
                count += 1;
                start = at + 1;
            }
            done = base + 8;
        }
        for (at, &byte) in line.iter().enumerate().skip(done) {
            if byte == b' ' {
                if at == start {
                    return Err(FrameError::EmptyField { index: count });
                }
                if count < MAX_FIELDS {
                    fields[count] = &line[start..at];
                }
                count += 1;
                start = at + 1;
            } else if byte == b'\r' {
                return Err(FrameError::CarriageReturn { at });
            } else if !(0x21..=0x7e).contains(&byte) {
                return Err(FrameError::InvalidByte { at, byte });
            }
        }
        if start == line.len() {
            return Err(FrameError::EmptyField { index: count });
        }
        if count < MAX_FIELDS {
            fields[count] = &line[start..];
        }
        count += 1;
        Ok(Fields {
            fields,
            count: count.min(MAX_FIELDS + 1),
        })
    }

    /// The kind letter, if the first field is a single byte.
    fn kind(&self) -> Option<u8> {
        match self.fields[0] {
            [kind] => Some(*kind),
            _ => None,
        }
    }

    fn unknown_kind(&self) -> FrameError {
        let kind = self.fields[0];
        FrameError::UnknownKind {
            kind: String::from_utf8_lossy(&kind[..kind.len().min(16)]).into_owned(),
        }
    }

    /// Checks that the frame of `kind` has exactly `expected` fields.
    fn expect(&self, kind: u8, expected: usize) -> Result<(), FrameError> {
        if self.count == expected {
            Ok(())
        } else {
            Err(FrameError::FieldCount {
                kind: char::from(kind),
                expected,
                found: self.count,
            })
        }
    }

    fn atom(&self, index: usize, field: &'static str) -> Result<Atom<'a>, FrameError> {
        let bytes = self.fields[index];
        if bytes.len() > MAX_ATOM {
            return Err(FrameError::AtomTooLong {
                field,
                len: bytes.len(),
            });
        }
        // Every byte is already known to be in 0x21..=0x7e.
        Atom::from_checked(bytes).ok_or(FrameError::InvalidByte { at: 0, byte: 0 })
    }

    fn addr(&self, index: usize, field: &'static str) -> Result<Addr<'a>, FrameError> {
        let atom = self.atom(index, field)?;
        Addr::new(atom.as_str()).map_err(|_| FrameError::BadAddress { field })
    }

    fn number(&self, index: usize, field: &'static str) -> Result<u64, FrameError> {
        parse_number(self.fields[index], field)
    }

    fn lease(&self, index: usize) -> Result<NonZeroU64, FrameError> {
        NonZeroU64::new(self.number(index, "lease_ms")?).ok_or(FrameError::ZeroLease)
    }

    fn op(&self, index: usize) -> Result<Op, FrameError> {
        match self.fields[index] {
            b"A" => Ok(Op::Acquire),
            b"R" => Ok(Op::Release),
            _ => Err(FrameError::BadOp),
        }
    }
}

/// Parses a canonical decimal `u64`: `0` or `[1-9][0-9]*`, no sign, no
/// overflow.
pub(crate) fn parse_number(bytes: &[u8], field: &'static str) -> Result<u64, FrameError> {
    if !bytes.is_empty() && bytes.len() <= 19 {
        // Nineteen digits cannot overflow a u64: no checks per digit.
        let mut value: u64 = 0;
        for &byte in bytes {
            let digit = byte.wrapping_sub(b'0');
            if digit > 9 {
                return Err(FrameError::NotANumber { field });
            }
            value = value * 10 + u64::from(digit);
        }
        if bytes.len() > 1 && bytes[0] == b'0' {
            return Err(FrameError::LeadingZero { field });
        }
        return Ok(value);
    }
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(FrameError::NotANumber { field });
    }
    if bytes.len() > 1 && bytes[0] == b'0' {
        return Err(FrameError::LeadingZero { field });
    }
    let mut value: u64 = 0;
    for &digit in bytes {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(digit - b'0')))
            .ok_or(FrameError::Overflow { field })?;
    }
    Ok(value)
}

impl<'a> ClientFrame<'a> {
    /// Parses one line, without its `\n`, as a frame a server receives.
    #[inline]
    pub fn parse(line: &'a [u8]) -> Result<ClientFrame<'a>, FrameError> {
        if let Some(request) = parse_request(line) {
            return Ok(request);
        }
        Self::parse_fields(line)
    }

    /// The general parser: splits the line, then checks each field.
    fn parse_fields(line: &'a [u8]) -> Result<ClientFrame<'a>, FrameError> {
        let f = Fields::split(line)?;
        let kind = f.kind().ok_or_else(|| f.unknown_kind())?;
        match kind {
            b'H' => {
                f.expect(kind, 4)?;
                Ok(ClientFrame::Hello {
                    version: f.number(1, "version")?,
                    client_id: f.atom(2, "client_id")?,
                    credential: f.atom(3, "credential")?,
                })
            }
            b'A' => {
                f.expect(kind, 6)?;
                Ok(ClientFrame::Acquire {
                    id: f.number(1, "id")?,
                    key: f.atom(2, "key")?,
                    owner: f.atom(3, "owner")?,
                    wait_ms: f.number(4, "wait_ms")?,
                    lease_ms: f.lease(5)?,
                })
            }
            b'R' => {
                f.expect(kind, 4)?;
                Ok(ClientFrame::Release {
                    id: f.number(1, "id")?,
                    key: f.atom(2, "key")?,
                    token: f.number(3, "token")?,
                })
            }
            _ => Err(f.unknown_kind()),
        }
    }
}

/// `10^i`, for `i` in `0..8`.
const SMALL_POWERS: [u64; 8] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// The eight bytes of `bytes` from `at`, as a little-endian word.
#[inline(always)]
fn word_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// How many of the bytes of `word`, in memory order, are digits before the
/// first one that is not (8 if all are).
#[inline(always)]
fn digit_run(word: u64) -> usize {
    outside(word, b'0', b'9').trailing_zeros() as usize / 8
}

/// The value of the first `len` (`1..=8`) bytes of `word`, all digits, the
/// first one most significant.
#[inline(always)]
fn digits_value(word: u64, len: usize) -> u64 {
    // The digits moved to the top of the word behind zeros, then combined
    // two, four and eight digits at a time.
    let digits = (word << (8 * (8 - len))) & (0x0F * ONES);
    let pairs = (digits.wrapping_mul(10 * 256 + 1) >> 8) & 0x00FF_00FF_00FF_00FF;
    let quads = (pairs.wrapping_mul(100 * 65_536 + 1) >> 16) & 0x0000_FFFF_0000_FFFF;
    quads.wrapping_mul(10_000 * (1 << 32) + 1) >> 32
}

/// A canonical number of at most 19 digits (so no overflow is possible)
/// at the start of `bytes`: its value and length. `None` for anything else,
/// which the general parser then judges.
#[inline(always)]
fn leading_number(bytes: &[u8]) -> Option<(u64, usize)> {
    if bytes.len() >= 8 {
        let word = word_at(bytes, 0);
        let len = digit_run(word);
        if len < 8 {
            if len == 0 || (len > 1 && bytes[0] == b'0') {
                return None;
            }
            return Some((digits_value(word, len), len));
        }
        if bytes.len() >= 16 {
            // Eight digits, then up to seven more.
            if bytes[0] == b'0' {
                return None;
            }
            let next = word_at(bytes, 8);
            let more = digit_run(next);
            if more < 8 {
                let high = digits_value(word, 8);
                if more == 0 {
                    return Some((high, 8));
                }
                let value = high * SMALL_POWERS[more] + digits_value(next, more);
                return Some((value, 8 + more));
            }
        }
    }
    let mut value: u64 = 0;
    let mut len = 0;
    while let Some(&byte) = bytes.get(len) {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        value = value.wrapping_mul(10).wrapping_add(u64::from(digit));
        len += 1;
    }
    let canonical = len == 1 || (len > 1 && len <= 19 && bytes[0] != b'0');
    canonical.then_some((value, len))
}

/// How many bytes at the start of `bytes` are in `0x21..=0x7e` (the bytes
/// of an atom), or some number above [`MAX_ATOM`] if that many are.
#[inline(always)]
fn atom_run(bytes: &[u8]) -> usize {
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let word = word_at(bytes, at);
        let stops = not_atom(word);
        if stops != 0 {
            return at + (stops.trailing_zeros() / 8) as usize;
        }
        at += 8;
        if at > MAX_ATOM {
            return at;
        }
    }
    let rest = &bytes[at..];
    at + rest
        .iter()
        .position(|b| !(0x21..=0x7e).contains(b))
        .unwrap_or(rest.len())
}

/// The common case of reading answers: a valid answer line at the start of
/// `bytes`, its `\n` included, parsed in one pass without looking for the
/// end of the line first. Returns the answer, with its key as the bytes of
/// an atom, and the length of the line with its `\n`. `None` for anything
/// else (other frames, a line not whole in `bytes`, and every fault): the
/// caller then takes the line through [`LineReader`](super::LineReader) and
/// [`ServerFrame::parse`], so results and errors are theirs in every case.
#[inline]
pub(crate) fn leading_answer(bytes: &[u8]) -> Option<(RawAnswer<'_>, usize)> {
    let letter = *bytes.first()?;
    let op = match letter {
        b'G' | b'T' | b'B' => b'A',
        b'D' | b'N' => b'R',
        _ => return None,
    };
    if bytes.get(1) != Some(&b' ') {
        return None;
    }
    let (id, len) = leading_number(&bytes[2..])?;
    let mut at = 2 + len;
    if bytes.get(at..at + 3)? != [b' ', op, b' '] {
        return None;
    }
    at += 3;
    let key_len = atom_run(&bytes[at..]);
    if key_len == 0 || key_len > MAX_ATOM {
        return None;
    }
    let key = &bytes[at..at + key_len];
    at += key_len;
    let kind = match letter {
        b'G' => {
            if bytes.get(at) != Some(&b' ') {
                return None;
            }
            let (token, len) = leading_number(&bytes[at + 1..])?;
            at += 1 + len;
            if bytes.get(at) != Some(&b' ') {
                return None;
            }
            let (lease_ms, len) = leading_number(&bytes[at + 1..])?;
            at += 1 + len;
            AnswerKind::Granted {
                token,
                lease_ms: NonZeroU64::new(lease_ms)?,
            }
        }
        b'T' => AnswerKind::TimedOut,
        b'B' => AnswerKind::Busy,
        b'D' => AnswerKind::Released,
        _ => AnswerKind::NotHeld,
    };
    if bytes.get(at) != Some(&b'\n') {
        return None;
    }
    Some((RawAnswer { id, key, kind }, at + 1))
}

/// The length of the atom at the start of `bytes`, which must end at a
/// space or at the end of `bytes`: `None` for an empty or over-long atom,
/// or a byte outside `0x21..=0x7e`, which the general parser then judges.
#[inline(always)]
fn leading_atom(bytes: &[u8]) -> Option<usize> {
    let mut done = 0;
    // Eight bytes at a time, the last word overlapping the one before it.
    while done < bytes.len() && bytes.len() >= 8 {
        let base = done.min(bytes.len() - 8);
        let word = u64::from_le_bytes(bytes[base..base + 8].try_into().expect("8 bytes"));
        let fresh = !0u64 << (8 * (done - base));
        let stops = not_atom(word) & fresh;
        if stops != 0 {
            done = base + (stops.trailing_zeros() / 8) as usize;
            break;
        }
        done = base + 8;
    }
    if bytes.len() < 8 {
        done = bytes
            .iter()
            .position(|&b| !(0x21..=0x7e).contains(&b))
            .unwrap_or(bytes.len());
    }
    let ends_well = done == bytes.len() || bytes[done] == b' ';
    (ends_well && done > 0 && done <= MAX_ATOM).then_some(done)
}

/// The common case of [`ServerFrame::parse`]: a valid answer, parsed in one
/// pass without splitting the line first. `None` for anything else (other
/// frames, and every fault), which the general parser then handles, so
/// results and errors are the general parser's in every case.
#[inline]
fn parse_answer(line: &[u8]) -> Option<Answer<'_>> {
    let (&kind, rest) = line.split_first()?;
    let op = match kind {
        b'G' | b'T' | b'B' => b'A',
        b'D' | b'N' => b'R',
        _ => return None,
    };
    let rest = rest.strip_prefix(b" ")?;
    let (id, len) = leading_number(rest)?;
    let rest = rest[len..].strip_prefix(b" ")?;
    let rest = rest.strip_prefix(&[op])?.strip_prefix(b" ")?;
    let key_len = leading_atom(rest)?;
    let key = Atom::from_checked(&rest[..key_len])?;
    let rest = &rest[key_len..];
    let kind = match kind {
        b'G' => {
            let rest = rest.strip_prefix(b" ")?;
            let (token, len) = leading_number(rest)?;
            let rest = rest[len..].strip_prefix(b" ")?;
            let (lease_ms, len) = leading_number(rest)?;
            if len != rest.len() {
                return None;
            }
            AnswerKind::Granted {
                token,
                lease_ms: NonZeroU64::new(lease_ms)?,
            }
        }
        _ if !rest.is_empty() => return None,
        b'T' => AnswerKind::TimedOut,
        b'B' => AnswerKind::Busy,
        b'D' => AnswerKind::Released,
        _ => AnswerKind::NotHeld,
    };
    Some(Answer { id, key, kind })
}

/// The common case of [`ClientFrame::parse`]: a valid acquire or release,
/// parsed in one pass without splitting the line first. `None` for anything
/// else (`H`, and every fault), which the general parser then handles, so
/// results and errors are the general parser's in every case.
#[inline]
fn parse_request(line: &[u8]) -> Option<ClientFrame<'_>> {
    let (&kind, rest) = line.split_first()?;
    if kind != b'A' && kind != b'R' {
        return None;
    }
    let rest = rest.strip_prefix(b" ")?;
    let (id, len) = leading_number(rest)?;
    let rest = rest[len..].strip_prefix(b" ")?;
    let key_len = leading_atom(rest)?;
    let key = Atom::from_checked(&rest[..key_len])?;
    let rest = rest[key_len..].strip_prefix(b" ")?;
    if kind == b'R' {
        let (token, len) = leading_number(rest)?;
        return (len == rest.len()).then_some(ClientFrame::Release { id, key, token });
    }
    let owner_len = leading_atom(rest)?;
    let owner = Atom::from_checked(&rest[..owner_len])?;
    let rest = rest[owner_len..].strip_prefix(b" ")?;
    let (wait_ms, len) = leading_number(rest)?;
    let rest = rest[len..].strip_prefix(b" ")?;
    let (lease_ms, len) = leading_number(rest)?;
    if len != rest.len() {
        return None;
    }
    Some(ClientFrame::Acquire {
        id,
        key,
        owner,
        wait_ms,
        lease_ms: NonZeroU64::new(lease_ms)?,
    })
}

impl<'a> ServerFrame<'a> {
    /// Parses one line, without its `\n`, as a frame a client receives.
    pub fn parse(line: &'a [u8]) -> Result<ServerFrame<'a>, FrameError> {
        if let Some(answer) = parse_answer(line) {
            return Ok(ServerFrame::Answer(answer));
        }
        Self::parse_fields(line)
    }

    /// The general parser: splits the line, then checks each field.
    fn parse_fields(line: &'a [u8]) -> Result<ServerFrame<'a>, FrameError> {
        let f = Fields::split(line)?;
        let kind = f.kind().ok_or_else(|| f.unknown_kind())?;
        let answer_kind = match kind {
            b'W' => {
                f.expect(kind, 3)?;
                let node = f.atom(1, "node")?;
                let window = f.number(2, "window")?;
                let window = Window::new(window).ok_or(FrameError::WindowTooSmall { window })?;
                return Ok(ServerFrame::Welcome { node, window });
            }
            b'M' => {
                f.expect(kind, 2)?;
                return Ok(ServerFrame::Moved {
                    addr: f.addr(1, "addr")?,
                });
            }
            b'L' => {
                f.expect(kind, 2)?;
                return Ok(ServerFrame::Leader {
                    addr: f.addr(1, "addr")?,
                });
            }
            b'E' => {
                f.expect(kind, 2)?;
                return Ok(ServerFrame::Error {
                    reason: f.atom(1, "reason")?,
                });
            }
            b'G' => {
                f.expect(kind, 6)?;
                None
            }
            b'T' => Some(AnswerKind::TimedOut),
            b'B' => Some(AnswerKind::Busy),
            b'D' => Some(AnswerKind::Released),
            b'N' => Some(AnswerKind::NotHeld),
            _ => return Err(f.unknown_kind()),
        };
        if answer_kind.is_some() {
            f.expect(kind, 4)?;
        }
        let id = f.number(1, "id")?;
        let op = f.op(2)?;
        let key = f.atom(3, "key")?;
        let kind_value = match answer_kind {
            Some(k) => k,
            None => AnswerKind::Granted {
                token: f.number(4, "token")?,
                lease_ms: f.lease(5)?,
            },
        };
        if kind_value.op() != op {
            return Err(FrameError::BadPairing {
                kind: char::from(kind),
                op: char::from(op.letter()),
            });
        }
        Ok(ServerFrame::Answer(Answer {
            id,
            key,
            kind: kind_value,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// A random answer line, valid or nearly so.
    fn answer_line(rng: &mut Rng) -> Vec<u8> {
        let kind = b"GTBDNWLEX"[rng.up_to(8) as usize];
        let op = if rng.chance(1, 10) {
            b"AR-"[rng.up_to(2) as usize]
        } else if b"GTB".contains(&kind) {
            b'A'
        } else {
            b'R'
        };
        let number = |rng: &mut Rng| -> String {
            match rng.up_to(9) {
                0 => "0".into(),
                1 => format!("0{}", rng.up_to(99)),
                2 => u64::MAX.to_string(),
                3 => "18446744073709551616".into(),
                4 => "9999999999999999999".into(),
                5 => "10000000000000000000".into(),
                _ => (rng.up_to(u64::MAX) >> rng.up_to(63)).to_string(),
            }
        };
        let key = "k".repeat(if rng.chance(1, 10) {
            240 + rng.up_to(20) as usize
        } else {
            1 + rng.up_to(30) as usize
        });
        let mut line = format!("{} {} {} {}", kind as char, number(rng), op as char, key);
        if kind == b'G' || rng.chance(1, 10) {
            line = format!("{line} {} {}", number(rng), number(rng));
        }
        line.into_bytes()
    }

    /// `leading_number` one byte at a time.
    fn leading_number_slowly(bytes: &[u8]) -> Option<(u64, usize)> {
        let len = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
        let canonical = len == 1 || (len > 1 && len <= 19 && bytes[0] != b'0');
        let value = bytes[..len].iter().fold(0u64, |n, &d| {
            n.wrapping_mul(10).wrapping_add(u64::from(d - b'0'))
        });
        canonical.then_some((value, len))
    }

    #[test]
    fn bytes_are_classified_eight_at_a_time_exactly() {
        // Every byte value at every place, beside bytes in and out of each
        // range (so that a carry between bytes would show).
        let fillers = [0x00, b' ', b'!', b'0', b'9', b'A', 0x7e, 0x7f, 0x80, 0xff];
        for filler in fillers {
            for place in 0..8 {
                for byte in 0..=u8::MAX {
                    let mut bytes = [filler; 8];
                    bytes[place] = byte;
                    let word = u64::from_le_bytes(bytes);
                    let flags = |outside: fn(&u8) -> bool| {
                        bytes
                            .iter()
                            .enumerate()
                            .filter(|(_, b)| outside(b))
                            .fold(0u64, |flags, (at, _)| flags | 0x80 << (8 * at))
                    };
                    assert_eq!(unprintable(word), flags(|b| !(0x20..=0x7e).contains(b)));
                    assert_eq!(not_atom(word), flags(|b| !(0x21..=0x7e).contains(b)));
                    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
                    assert_eq!(digit_run(word), digits, "{bytes:?}");
                }
            }
        }
    }

    #[test]
    fn leading_numbers_are_read_eight_bytes_at_a_time_exactly() {
        let mut rng = Rng::new(4);
        let tails: [&[u8]; 6] = [b"", b" ", b" A key 1 2", b"/", b":\xff", b"\x00 0"];
        for n in (0..100_000u64).chain((0..100_000).map(|_| rng.up_to(u64::MAX) >> rng.up_to(63))) {
            for tail in tails {
                for zeros in 0..2 {
                    let mut bytes = vec![b'0'; zeros];
                    bytes.extend_from_slice(n.to_string().as_bytes());
                    bytes.extend_from_slice(tail);
                    assert_eq!(
                        leading_number(&bytes),
                        leading_number_slowly(&bytes),
                        "{bytes:?}"
                    );
                }
            }
        }
        for _ in 0..200_000 {
            let bytes: Vec<u8> = (0..rng.up_to(12))
                .map(|_| b"0123456789 /:\xffA"[rng.up_to(14) as usize])
                .collect();
            assert_eq!(
                leading_number(&bytes),
                leading_number_slowly(&bytes),
                "{bytes:?}"
            );
        }
    }

    /// Changes, inserts or removes up to three bytes of `line`, drawn from
    /// `alphabet`.
    fn mutate(rng: &mut Rng, line: &mut Vec<u8>, alphabet: &[u8]) {
        for _ in 0..rng.up_to(3) {
            if line.is_empty() {
                break;
            }
            let at = rng.up_to(line.len() as u64 - 1) as usize;
            let byte = alphabet[rng.up_to(alphabet.len() as u64 - 1) as usize];
            match rng.up_to(2) {
                0 => line[at] = byte,
                1 => line.insert(at, byte),
                _ => {
                    line.remove(at);
                }
            }
        }
    }

    #[test]
    fn answers_read_from_the_input_agree_with_the_reader_and_the_general_parser() {
        let mut rng = Rng::new(8);
        let alphabet: &[u8] = b" 0123456789GTBDNAR-k\r\x7f\x80\x1f\n";
        let tails: [&[u8]; 5] = [b"", b"\n", b"G 1 A k 2 3\n", b"0123456789012345678", b" x"];
        let mut taken = 0;
        for _ in 0..300_000 {
            let mut bytes = answer_line(&mut rng);
            mutate(&mut rng, &mut bytes, alphabet);
            if rng.chance(9, 10) {
                bytes.push(b'\n');
            }
            bytes.extend_from_slice(tails[rng.up_to(4) as usize]);
            let mut reader = crate::wire::LineReader::new();
            let mut input = &bytes[..];
            let expected = match reader.next_line(&mut input) {
                Some(Ok(line)) => match ServerFrame::parse(line) {
                    Ok(ServerFrame::Answer(answer)) => Some((answer.into(), line.len() + 1)),
                    _ => None,
                },
                _ => None,
            };
            // Declining is always allowed (the reader then takes the line).
            if let Some(found) = leading_answer(&bytes) {
                taken += 1;
                assert_eq!(
                    Some(found),
                    expected,
                    "{:?}",
                    String::from_utf8_lossy(&bytes)
                );
            }
        }
        assert!(taken > 20_000, "{taken}");
        for line in [
            &b"G 12 A key 3 500\n"[..],
            b"G 123456789012345 A lock/000001 1234567890123456789 30000\n",
            b"T 1 A k\n",
            b"B 7 A k\n",
            b"D 9 R k\n",
            b"N 0 R k\n",
        ] {
            let (_, len) = leading_answer(line).expect("taken");
            assert_eq!(len, line.len());
        }
    }

    /// A random request line, valid or nearly so.
    fn request_line(rng: &mut Rng) -> Vec<u8> {
        let kind = b"ARHX"[rng.up_to(3) as usize];
        let number = |rng: &mut Rng| -> String {
            match rng.up_to(9) {
                0 => "0".into(),
                1 => format!("0{}", rng.up_to(99)),
                2 => u64::MAX.to_string(),
                3 => "18446744073709551616".into(),
                4 => "9999999999999999999".into(),
                5 => "10000000000000000000".into(),
                _ => (rng.up_to(u64::MAX) >> rng.up_to(63)).to_string(),
            }
        };
        let atom = |rng: &mut Rng| -> String {
            "k".repeat(if rng.chance(1, 10) {
                240 + rng.up_to(20) as usize
            } else {
                1 + rng.up_to(30) as usize
            })
        };
        let mut line = format!("{} {} {}", kind as char, number(rng), atom(rng));
        if kind != b'R' || rng.chance(1, 10) {
            line = format!("{line} {}", atom(rng));
        }
        line = format!("{line} {}", number(rng));
        if kind == b'A' || rng.chance(1, 10) {
            line = format!("{line} {}", number(rng));
        }
        line.into_bytes()
    }

    #[test]
    fn the_request_fast_path_agrees_with_the_general_parser() {
        let mut rng = Rng::new(5);
        let alphabet: &[u8] = b" 0123456789AHR-k\r\x7f\x80\x1f\n";
        for _ in 0..300_000 {
            let mut line = request_line(&mut rng);
            mutate(&mut rng, &mut line, alphabet);
            assert_eq!(
                ClientFrame::parse(&line),
                ClientFrame::parse_fields(&line),
                "{:?}",
                String::from_utf8_lossy(&line)
            );
        }
        // The fast path does take the usual requests.
        for line in [
            &b"A 12 lock/0001 worker-1 0 30000"[..],
            b"A 1 k o 5000 1",
            b"R 7 k 3",
            b"R 123456789012345 lock/000001 1234567890123456789",
        ] {
            assert!(parse_request(line).is_some());
        }
    }

    #[test]
    fn the_answer_fast_path_agrees_with_the_general_parser() {
        let mut rng = Rng::new(3);
        let alphabet: &[u8] = b" 0123456789GTBDNAR-k\r\x7f\x80\x1f\n";
        for _ in 0..300_000 {
            let mut line = answer_line(&mut rng);
            mutate(&mut rng, &mut line, alphabet);
            assert_eq!(
                ServerFrame::parse(&line),
                ServerFrame::parse_fields(&line),
                "{:?}",
                String::from_utf8_lossy(&line)
            );
        }
        // The fast path does take the usual answers.
        for line in [
            &b"G 12 A key 3 500"[..],
            b"T 1 A k",
            b"B 7 A k",
            b"D 9 R k",
            b"N 0 R k",
        ] {
            assert!(parse_answer(line).is_some());
        }
    }
}
