//! Parsing one line (without its `\n`) into a frame, enforcing every framing
//! rule of PROTOCOL.md section 2.
//!
//! One pass from the left: the kind letter, then each field the kind has,
//! each checked as it is read (a number's digits, an atom's bytes, one
//! space between fields). A line that breaks a rule is reported by its
//! first fault from the left: the first byte that cannot be where it is,
//! named by what it breaks (a carriage return, a byte that is not
//! printable, an empty field, a number that is not one, too few or too
//! many fields), or, once every field was read, the value that is wrong
//! (a pairing, a zero lease, a window below 2, an address).

use core::num::NonZeroU64;

use super::atom::{Addr, Atom, MAX_ATOM};
use super::error::FrameError;
use super::frame::{Answer, AnswerKind, ClientFrame, Op, ServerFrame, Window};

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
#[cfg(test)]
fn unprintable(word: u64) -> u64 {
    outside(word, 0x20, 0x7e)
}

/// Bit 7 of each byte set where that byte of `word` cannot be in an atom
/// (`0x21..=0x7e`): a space, or a byte that is not printable.
#[inline(always)]
fn not_atom(word: u64) -> u64 {
    outside(word, 0x21, 0x7e)
}

/// A frame has at most this many fields; a count above it is reported as
/// one more (the most a [`FrameError::FieldCount`] says).
const MAX_FIELDS: usize = 7;

/// How many of the bytes of `word`, in memory order, are digits before the
/// first one that is not (8 if all are).
#[inline(always)]
fn digit_run(word: u64) -> usize {
    outside(word, b'0', b'9').trailing_zeros() as usize / 8
}

/// The value of the first `len` (`0..=8`) bytes of `word`, all digits, the
/// first one most significant.
#[inline(always)]
fn digits_value(word: u64, len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    // The digits moved to the top of the word behind zeros, then combined
    // two, four and eight digits at a time.
    let digits = (word << (8 * (8 - len))) & (0x0F * ONES);
    let pairs = (digits.wrapping_mul(10 * 256 + 1) >> 8) & 0x00FF_00FF_00FF_00FF;
    let quads = (pairs.wrapping_mul(100 * 65_536 + 1) >> 16) & 0x0000_FFFF_0000_FFFF;
    quads.wrapping_mul(10_000 * (1 << 32) + 1) >> 32
}

/// `10^i`, for `i` in `0..=8`.
const SCALES: [u64; 9] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
];

/// The digits at the start of `bytes`: their value (wrapped, if it
/// overflowed), how many there are, and whether the value overflowed.
/// Eight at a time while eight bytes are there to read.
#[inline(always)]
fn leading_digits(bytes: &[u8]) -> (u64, usize, bool) {
    // The usual number: fewer than eight digits, read in one word, or at
    // the end of the line one at a time.
    match bytes.get(..8) {
        Some(chunk) => {
            let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            let run = digit_run(word);
            if run < 8 {
                return (digits_value(word, run), run, false);
            }
        }
        None => {
            let mut value = 0;
            for (len, &byte) in bytes.iter().enumerate() {
                let digit = byte.wrapping_sub(b'0');
                if digit > 9 {
                    return (value, len, false);
                }
                value = value * 10 + u64::from(digit);
            }
            return (value, bytes.len(), false);
        }
    }
    long_digits(bytes)
}

/// [`leading_digits`] for any number of digits.
#[inline(never)]
fn long_digits(bytes: &[u8]) -> (u64, usize, bool) {
    let mut value: u64 = 0;
    let mut len = 0;
    let mut overflow = false;
    while let Some(chunk) = bytes.get(len..len + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let run = digit_run(word);
        if run == 0 {
            return (value, len, overflow);
        }
        let digits = digits_value(word, run);
        if len == 0 {
            value = digits;
        } else {
            match value
                .checked_mul(SCALES[run])
                .and_then(|v| v.checked_add(digits))
            {
                Some(v) => value = v,
                None => overflow = true,
            }
        }
        len += run;
        if run < 8 {
            return (value, len, overflow);
        }
    }
    while let Some(&byte) = bytes.get(len) {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(digit)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        len += 1;
    }
    (value, len, overflow)
}

/// How many bytes at the start of `bytes` can be in an atom
/// (`0x21..=0x7e`), eight at a time.
#[inline(always)]
fn atom_run(bytes: &[u8]) -> usize {
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let stops = not_atom(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        if stops != 0 {
            return at + (stops.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + bytes[at..]
        .iter()
        .position(|b| !(0x21..=0x7e).contains(b))
        .unwrap_or(bytes.len() - at)
}

/// The fault of a byte that no field may hold: a carriage return, or a
/// byte that is not printable. `None` for a printable byte.
fn bad_byte(at: usize, byte: u8) -> Option<FrameError> {
    if byte == b'\r' {
        Some(FrameError::CarriageReturn { at })
    } else if !(0x20..=0x7e).contains(&byte) {
        Some(FrameError::InvalidByte { at, byte })
    } else {
        None
    }
}

/// What a field of a frame is.
#[derive(Clone, Copy)]
enum FieldKind {
    Number(&'static str),
    Atom(&'static str),
}

/// A line being read from the left, field by field. Each field is read on
/// the way a valid line takes, with as few checks as that needs; the first
/// one that fails hands the field to [`Reader::fault`], which finds what
/// rule it breaks. (The reader is `Copy`, and what explains a fault takes a
/// copy of it, so that the way a valid line takes keeps it in registers.)
#[derive(Clone, Copy)]
struct Reader<'a> {
    line: &'a [u8],
    /// Where the field read last ends: at a space, or the line's end.
    at: usize,
    /// Fields read so far.
    fields: usize,
    /// The frame's kind letter, and how many fields its frames have.
    kind: u8,
    expected: usize,
}

impl<'a> Reader<'a> {
    /// Reads the kind letter: the first field, which must be one byte.
    #[inline(always)]
    fn new(line: &'a [u8]) -> Result<Reader<'a>, FrameError> {
        let Some(&kind) = line.first() else {
            return Err(FrameError::EmptyLine);
        };
        let mut reader = Reader {
            line,
            at: 1,
            fields: 1,
            kind,
            expected: 0,
        };
        if (0x21..=0x7e).contains(&kind) && reader.ends_field(1) {
            return Ok(reader);
        }
        Err(Reader::kind_fault(reader))
    }

    /// What is wrong with a first field that is not one atom byte.
    #[cold]
    #[inline(never)]
    fn kind_fault(self) -> FrameError {
        let len = atom_run(self.line);
        match self.line.get(len) {
            Some(b' ') if len == 0 => FrameError::EmptyField { index: 0 },
            Some(&byte) if byte != b' ' => bad_byte(len, byte).expect("not an atom byte"),
            _ => unknown_kind(&self.line[..len]),
        }
    }

    /// The frame is of `kind`, with `expected` fields.
    #[inline(always)]
    fn expect(&mut self, expected: usize) {
        self.expected = expected;
    }

    /// Whether a field that runs to `end` ends there: at a space, or at
    /// the end of the line, which is the end of `line` or its first `\n`
    /// (`line` is then cut there, so that nothing past it is read).
    #[inline(always)]
    fn ends_field(&mut self, end: usize) -> bool {
        match self.line.get(end) {
            None | Some(b' ') => true,
            Some(b'\n') => {
                self.line = &self.line[..end];
                true
            }
            Some(_) => false,
        }
    }

    /// Whether another field follows.
    #[inline(always)]
    fn has_more(&self) -> bool {
        self.at < self.line.len()
    }

    /// The next field, an atom.
    #[inline(always)]
    fn atom(&mut self, field: &'static str) -> Result<Atom<'a>, FrameError> {
        let start = self.at + 1;
        if let Some(rest) = self.line.get(start..) {
            let len = atom_run(rest);
            let end = start + len;
            if len > 0 && len <= MAX_ATOM && self.ends_field(end) {
                self.at = end;
                self.fields += 1;
                return Ok(Atom::from_checked(&self.line[start..end]));
            }
        }
        Err(Reader::fault(*self, FieldKind::Atom(field)))
    }

    /// The next field, a canonical decimal `u64`: `0` or `[1-9][0-9]*`, no
    /// sign, no overflow.
    #[inline(always)]
    fn number(&mut self, field: &'static str) -> Result<u64, FrameError> {
        let start = self.at + 1;
        if let Some(rest) = self.line.get(start..) {
            let (value, len, overflow) = leading_digits(rest);
            let end = start + len;
            let canonical = len == 1 || (len > 1 && rest[0] != b'0');
            if canonical && !overflow && self.ends_field(end) {
                self.at = end;
                self.fields += 1;
                return Ok(value);
            }
        }
        Err(Reader::fault(*self, FieldKind::Number(field)))
    }

    /// The next field, an op letter.
    #[inline(always)]
    fn op(&mut self) -> Result<Op, FrameError> {
        let start = self.at + 1;
        let op = match self.line.get(start) {
            Some(b'A') => Some(Op::Acquire),
            Some(b'R') => Some(Op::Release),
            Some(b'X') => Some(Op::Renew),
            _ => None,
        };
        if let Some(op) = op {
            if self.ends_field(start + 1) {
                self.at = start + 1;
                self.fields += 1;
                return Ok(op);
            }
        }
        // Its bytes are judged first, then its letter.
        let atom = self.atom("op")?;
        debug_assert!(!matches!(atom.as_bytes(), b"A" | b"R" | b"X"));
        Err(FrameError::BadOp)
    }

    /// What rule the next field, of kind `what`, breaks: there is none (too
    /// few fields), it is empty, a byte in it or right after it cannot be
    /// there, or its text is not what its kind must be.
    #[cold]
    #[inline(never)]
    fn fault(self, what: FieldKind) -> FrameError {
        if self.at >= self.line.len() {
            return self.count_fault(self.fields);
        }
        let start = self.at + 1;
        if matches!(self.line.get(start), None | Some(b' ')) {
            return FrameError::EmptyField { index: self.fields };
        }
        let rest = &self.line[start..];
        let (len, stops) = match what {
            FieldKind::Atom(_) => (atom_run(rest), None),
            // A number stops at its first byte that is not a digit.
            FieldKind::Number(field) => {
                let (_, digits, _) = leading_digits(rest);
                (digits, Some(FrameError::NotANumber { field }))
            }
        };
        let end = start + len;
        if let Some(&byte) = self.line.get(end) {
            if byte != b' ' {
                return bad_byte(end, byte)
                    .or(stops)
                    .expect("an atom stops at a space or a bad byte");
            }
        }
        match what {
            FieldKind::Atom(field) => FrameError::AtomTooLong { field, len },
            FieldKind::Number(field) if len > 1 && rest[0] == b'0' => {
                FrameError::LeadingZero { field }
            }
            FieldKind::Number(field) => FrameError::Overflow { field },
        }
    }

    /// A field count that is not the frame's.
    fn count_fault(&self, found: usize) -> FrameError {
        FrameError::FieldCount {
            kind: char::from(self.kind),
            expected: self.expected,
            found: found.min(MAX_FIELDS + 1),
        }
    }

    /// The end of the line, after the frame's last field: any more fields
    /// are too many (once the bytes after them are known to be good).
    #[inline(always)]
    fn end(&self) -> Result<(), FrameError> {
        if self.at == self.line.len() {
            return Ok(());
        }
        Err(Reader::past_the_end(*self))
    }

    /// What is wrong with the fields past the frame's last one.
    #[cold]
    #[inline(never)]
    fn past_the_end(self) -> FrameError {
        let rest = &self.line[self.at..];
        let mut fields = self.fields;
        let mut after_space = false;
        for (offset, &byte) in rest.iter().enumerate() {
            let at = self.at + offset;
            if byte == b' ' {
                if after_space {
                    // The field that began at the space before is empty.
                    return FrameError::EmptyField { index: fields - 1 };
                }
                if at + 1 == self.line.len() {
                    return FrameError::EmptyField { index: fields };
                }
                fields += 1;
            } else if let Some(fault) = bad_byte(at, byte) {
                return fault;
            }
            after_space = byte == b' ';
        }
        self.count_fault(fields)
    }
}

/// A first field that names no kind of frame.
fn unknown_kind(field: &[u8]) -> FrameError {
    FrameError::UnknownKind {
        kind: String::from_utf8_lossy(&field[..field.len().min(16)]).into_owned(),
    }
}

impl<'a> ClientFrame<'a> {
    /// Parses one line, without its `\n`, as a frame a server receives.
    pub fn parse(line: &'a [u8]) -> Result<ClientFrame<'a>, FrameError> {
        let mut r = Reader::new(line)?;
        let frame = match r.kind {
            b'H' => {
                r.expect(4);
                let version = r.number("version")?;
                let client_id = r.atom("client_id")?;
                let credential = r.atom("credential")?;
                ClientFrame::Hello {
                    version,
                    client_id,
                    credential,
                }
            }
            b'A' => {
                r.expect(6);
                let id = r.number("id")?;
                let key = r.atom("key")?;
                let owner = r.atom("owner")?;
                let wait_ms = r.number("wait_ms")?;
                let lease_ms = r.number("lease_ms")?;
                r.end()?;
                return Ok(ClientFrame::Acquire {
                    id,
                    key,
                    owner,
                    wait_ms,
                    lease_ms: NonZeroU64::new(lease_ms).ok_or(FrameError::ZeroLease)?,
                });
            }
            b'R' => {
                r.expect(4);
                let id = r.number("id")?;
                let key = r.atom("key")?;
                let token = r.number("token")?;
                ClientFrame::Release { id, key, token }
            }
            b'X' => {
                r.expect(5);
                let id = r.number("id")?;
                let key = r.atom("key")?;
                let token = r.number("token")?;
                let lease_ms = r.number("lease_ms")?;
                r.end()?;
                return Ok(ClientFrame::Renew {
                    id,
                    key,
                    token,
                    lease_ms: NonZeroU64::new(lease_ms).ok_or(FrameError::ZeroLease)?,
                });
            }
            kind => return Err(unknown_kind(&[kind])),
        };
        r.end()?;
        Ok(frame)
    }
}

impl<'a> ServerFrame<'a> {
    /// Parses one line, without its `\n`, as a frame a client receives.
    pub fn parse(line: &'a [u8]) -> Result<ServerFrame<'a>, FrameError> {
        Self::read(line).map(|(frame, _)| frame)
    }

    /// The frame at the start of `bytes`, which holds its whole line and
    /// its `\n`, and the length of that line with it; `None` for a line
    /// that is not whole in `bytes`, or breaks a rule (the caller then
    /// cuts the line off with a [`LineReader`](super::LineReader), which
    /// also judges its length, and [`ServerFrame::parse`]s it, to learn
    /// which). Valid lines that lie whole in what was read are read in
    /// place, without a pass to find their end first.
    pub(crate) fn parse_leading(bytes: &'a [u8]) -> Option<(ServerFrame<'a>, usize)> {
        let (frame, end) = Self::read(bytes).ok()?;
        (end < super::MAX_FRAME && bytes.get(end) == Some(&b'\n')).then_some((frame, end + 1))
    }

    /// Reads the frame at the start of `line`, which ends at the end of
    /// `line` or at a `\n`, and where it ends.
    #[inline(always)]
    fn read(line: &'a [u8]) -> Result<(ServerFrame<'a>, usize), FrameError> {
        let mut r = Reader::new(line)?;
        let kind = r.kind;
        match kind {
            b'W' => {
                r.expect(3);
                let node = r.atom("node")?;
                let window = r.number("window")?;
                r.end()?;
                let window = Window::new(window).ok_or(FrameError::WindowTooSmall { window })?;
                return Ok((ServerFrame::Welcome { node, window }, r.at));
            }
            b'M' | b'L' => {
                r.expect(2);
                let addr = r.atom("addr")?;
                r.end()?;
                let addr = Addr::new(addr.as_str())
                    .map_err(|_| FrameError::BadAddress { field: "addr" })?;
                let frame = if kind == b'M' {
                    ServerFrame::Moved { addr }
                } else {
                    ServerFrame::Leader { addr }
                };
                return Ok((frame, r.at));
            }
            b'E' => {
                r.expect(2);
                let reason = r.atom("reason")?;
                r.end()?;
                return Ok((ServerFrame::Error { reason }, r.at));
            }
            // Six fields, or seven for a grant of an acquire on version 2.
            b'G' => r.expect(6),
            b'T' | b'B' | b'D' | b'N' => r.expect(4),
            _ => return Err(unknown_kind(&[kind])),
        }
        let id = r.number("id")?;
        let op = r.op()?;
        let key = r.atom("key")?;
        let answer = match (kind, op) {
            (b'G', _) => {
                let token = r.number("token")?;
                let lease_ms = r.number("lease_ms")?;
                let waited_ms = if op == Op::Acquire && r.has_more() {
                    r.expect(7);
                    Some(r.number("waited_ms")?)
                } else {
                    None
                };
                r.end()?;
                let lease_ms = NonZeroU64::new(lease_ms).ok_or(FrameError::ZeroLease)?;
                match op {
                    Op::Renew => AnswerKind::Renewed { token, lease_ms },
                    _ => AnswerKind::Granted {
                        token,
                        lease_ms,
                        waited_ms,
                    },
                }
            }
            (b'T', _) => AnswerKind::TimedOut,
            (b'B', _) => AnswerKind::Busy,
            (b'D', _) => AnswerKind::Released,
            (_, Op::Renew) => AnswerKind::Gone,
            _ => AnswerKind::NotHeld,
        };
        r.end()?;
        if answer.op() != op {
            return Err(FrameError::BadPairing {
                kind: char::from(kind),
                op: char::from(op.letter()),
            });
        }
        let frame = ServerFrame::Answer(Answer {
            id,
            key,
            kind: answer,
        });
        Ok((frame, r.at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn leading_digits_are_read_like_one_at_a_time() {
        let mut rng = Rng::new(4);
        let tails: [&[u8]; 5] = [b"", b" ", b" A key 1 2", b"/", b":\xff"];
        let numbers =
            (0..20_000u64).chain((0..20_000).map(|_| rng.up_to(u64::MAX) >> rng.up_to(63)));
        for n in numbers {
            for tail in tails {
                for zeros in [0, 1, 7] {
                    let mut bytes = vec![b'0'; zeros];
                    bytes.extend_from_slice(n.to_string().as_bytes());
                    bytes.extend_from_slice(tail);
                    let len = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
                    let slowly = bytes[..len].iter().try_fold(0u64, |v, &d| {
                        v.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                    });
                    let (value, found, overflow) = leading_digits(&bytes);
                    assert_eq!(found, len, "{bytes:?}");
                    assert_eq!(overflow, slowly.is_none(), "{bytes:?}");
                    if let Some(v) = slowly {
                        assert_eq!(value, v, "{bytes:?}");
                    }
                }
            }
        }
        // Past u64::MAX, with more than twenty digits too.
        for text in [
            "18446744073709551616",
            "99999999999999999999999",
            "184467440737095516150",
        ] {
            assert!(leading_digits(text.as_bytes()).2, "{text}");
        }
        assert_eq!(
            leading_digits(b"18446744073709551615"),
            (u64::MAX, 20, false)
        );
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
                    let spaces = flags(|&b| b == b' ');
                    assert_eq!(zero_bytes(word ^ (0x20 * ONES)), spaces, "{bytes:?}");
                    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
                    assert_eq!(digit_run(word), digits, "{bytes:?}");
                }
            }
        }
    }

    #[test]
    fn a_line_read_in_place_is_read_as_the_line_reader_and_parse_read_it() {
        // Good lines of every kind, each byte then replaced by bytes that
        // end or break fields, followed by nothing, a `\n`, or more lines.
        let lines: [&[u8]; 9] = [
            b"W node-1 16",
            b"L 10.0.0.2:7000",
            b"M 10.0.0.2:7000",
            b"E no_leader",
            b"G 7 A key 3 500",
            b"G 18446744073709551615 A key 3 500 12",
            b"N 9 R key 3 reason",
            b"G 7 X key 3 500",
            b"B 2 A key 1",
        ];
        let swaps = [b'\n', b' ', b'0', b'A', b'X', 0x00, 0xff];
        let tails: [&[u8]; 4] = [b"", b"\n", b"\nW n 1\n", b"\n\n"];
        let mut cases = 0;
        for line in lines {
            let mut variants = vec![line.to_vec()];
            for at in 0..line.len() {
                for swap in swaps {
                    let mut v = line.to_vec();
                    v[at] = swap;
                    variants.push(v);
                }
            }
            for variant in variants {
                for tail in tails {
                    let mut bytes = variant.clone();
                    bytes.extend_from_slice(tail);
                    let mut reader = crate::wire::LineReader::new();
                    let mut input = &bytes[..];
                    let slowly = match reader.next_line(&mut input) {
                        Some(Ok(line)) => ServerFrame::parse(line)
                            .ok()
                            .map(|f| (f.to_string(), bytes.len() - input.len())),
                        _ => None,
                    };
                    let in_place =
                        ServerFrame::parse_leading(&bytes).map(|(f, n)| (f.to_string(), n));
                    assert_eq!(in_place, slowly, "{:?}", String::from_utf8_lossy(&bytes));
                    cases += 1;
                }
            }
        }
        assert!(cases > 1000);
    }
}
