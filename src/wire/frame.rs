//! Frame types (PROTOCOL.md section 3) and their canonical encoding.

use core::fmt;
use core::num::NonZeroU64;

use bytes::{BufMut, BytesMut};

use super::atom::{Addr, Atom};

/// The protocol version this crate speaks.
pub const VERSION: u64 = 1;

/// The op an answer answers: `A` (acquire) or `R` (release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `A`: acquire.
    Acquire,
    /// `R`: release.
    Release,
}

impl Op {
    /// The op's letter on the wire.
    pub const fn letter(self) -> u8 {
        match self {
            Op::Acquire => b'A',
            Op::Release => b'R',
        }
    }
}

/// A window announced by `W`: how many requests may be unanswered on the
/// connection. Always at least 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window(u64);

impl Window {
    /// `Some` if `n >= 2`.
    pub const fn new(n: u64) -> Option<Window> {
        if n >= 2 {
            Some(Window(n))
        } else {
            None
        }
    }

    /// The number of requests.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// A frame a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFrame<'a> {
    /// `H <version> <client-id> <credential>`: the first frame of every
    /// connection. The credential is the atom `-` when the client has none.
    Hello {
        /// Protocol version; this crate speaks [`VERSION`].
        version: u64,
        /// Who connects.
        client_id: Atom<'a>,
        /// The credential, or `-`.
        credential: Atom<'a>,
    },
    /// `A <id> <key> <owner> <wait_ms> <lease_ms>`.
    Acquire {
        /// Request id.
        id: u64,
        /// The lock.
        key: Atom<'a>,
        /// Who asks (diagnostics only).
        owner: Atom<'a>,
        /// How long the acquire may wait for its turn.
        wait_ms: u64,
        /// The lease asked for.
        lease_ms: NonZeroU64,
    },
    /// `R <id> <key> <token>`: release exactly the grant with this token.
    Release {
        /// Request id.
        id: u64,
        /// The lock.
        key: Atom<'a>,
        /// The fencing token of the grant.
        token: u64,
    },
}

/// What an answer says, besides its id, op and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    /// `G`: granted, with the fencing token and the lease actually given.
    Granted {
        /// The fencing token.
        token: u64,
        /// The lease in milliseconds, never more than asked.
        lease_ms: NonZeroU64,
    },
    /// `T`: not granted within `wait_ms`.
    TimedOut,
    /// `B`: refused before it was queued; nothing is held.
    Busy,
    /// `D`: released.
    Released,
    /// `N`: no grant of that key has that token.
    NotHeld,
}

impl AnswerKind {
    /// The op this kind answers: `G`, `T`, `B` answer `A`; `D`, `N` answer `R`.
    pub const fn op(self) -> Op {
        match self {
            AnswerKind::Granted { .. } | AnswerKind::TimedOut | AnswerKind::Busy => Op::Acquire,
            AnswerKind::Released | AnswerKind::NotHeld => Op::Release,
        }
    }

    /// The kind's letter on the wire.
    pub const fn letter(self) -> u8 {
        match self {
            AnswerKind::Granted { .. } => b'G',
            AnswerKind::TimedOut => b'T',
            AnswerKind::Busy => b'B',
            AnswerKind::Released => b'D',
            AnswerKind::NotHeld => b'N',
        }
    }
}

/// An answer to a request: `<kind> <id> <op> <key> [...]`. The op is implied
/// by the kind ([`AnswerKind::op`]); the parser refuses a frame whose op
/// field disagrees with its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer<'a> {
    /// The id of the request answered.
    pub id: u64,
    /// The key of the request answered.
    pub key: Atom<'a>,
    /// What the answer says.
    pub kind: AnswerKind,
}

impl Answer<'_> {
    /// The op answered.
    pub const fn op(&self) -> Op {
        self.kind.op()
    }
}

/// An answer as the client core reads it: the key as the bytes of an atom,
/// already checked, never turned into a `str` (the core only compares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawAnswer<'a> {
    /// The id of the request answered.
    pub(crate) id: u64,
    /// The key of the request answered: the bytes of an atom.
    pub(crate) key: &'a [u8],
    /// What the answer says.
    pub(crate) kind: AnswerKind,
}

impl RawAnswer<'_> {
    /// The op answered.
    pub(crate) const fn op(&self) -> Op {
        self.kind.op()
    }
}

impl<'a> From<Answer<'a>> for RawAnswer<'a> {
    fn from(answer: Answer<'a>) -> RawAnswer<'a> {
        RawAnswer {
            id: answer.id,
            key: answer.key.as_bytes(),
            kind: answer.kind,
        }
    }
}

/// A frame a server sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerFrame<'a> {
    /// `W <node-id> <window>`: the handshake is accepted.
    Welcome {
        /// The node that accepted.
        node: Atom<'a>,
        /// At most this many requests may be unanswered.
        window: Window,
    },
    /// `M <addr>`: this node does not lead; `addr` does. Closes after it.
    Moved {
        /// The leader.
        addr: Addr<'a>,
    },
    /// `E <reason>`: an error; closes after it.
    Error {
        /// `no_leader`, `not_active`, `auth_failed`, or anything else.
        reason: Atom<'a>,
    },
    /// `L <addr>`: the leader is, or is about to be, `addr`.
    Leader {
        /// The hinted leader.
        addr: Addr<'a>,
    },
    /// An answer to a request.
    Answer(Answer<'a>),
}

/// `10^i`, for `i` in `0..20`.
const POWERS_OF_TEN: [u64; 20] = {
    let mut powers = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        powers[i] = powers[i - 1] * 10;
        i += 1;
    }
    powers
};

/// How many decimal digits `n` has (1 for 0): the bit length gives
/// `floor(log10)` or one less, and one comparison settles which.
#[inline(always)]
fn decimal_len(n: u64) -> usize {
    // `n | 1` has as many digits as `n` (no power of ten is odd but 1).
    let n = n | 1;
    let bits = 64 - n.leading_zeros() as usize;
    let guess = (bits * 1233) >> 12;
    guess + usize::from(n >= POWERS_OF_TEN[guess])
}

/// The eight decimal digits of `n < 10^8`, zero-padded, as ASCII bytes in
/// memory order (little-endian), computed in one register: the number is
/// split into halves of four digits, then pairs, then digits, each split
/// done in every lane at once.
#[inline(always)]
fn eight_digits(n: u64) -> u64 {
    debug_assert!(n < 100_000_000);
    // Lanes of 32 bits: the high four digits first in memory.
    let x = (n / 10_000) | ((n % 10_000) << 32);
    // Lanes of 16 bits: `v / 100` is `v * 10486 >> 20` for `v < 10^4`.
    let hundreds = ((x * 10_486) >> 20) & 0x0000_007F_0000_007F;
    let x = hundreds | ((x - 100 * hundreds) << 16);
    // Lanes of 8 bits: `v / 10` is `v * 103 >> 10` for `v < 100`.
    let tens = ((x * 103) >> 10) & 0x000F_000F_000F_000F;
    let x = tens | ((x - 10 * tens) << 8);
    x | 0x3030_3030_3030_3030
}

/// Writes the digits of `n < 10^8`, without leading zeros, into `buf` from
/// `at`, returning where they end. Writes eight bytes whatever the length.
#[inline(always)]
fn write_small(buf: &mut [u8], at: usize, n: u64) -> usize {
    let len = decimal_len(n);
    let word = eight_digits(n) >> (8 * (8 - len));
    buf[at..at + 8].copy_from_slice(&word.to_le_bytes());
    at + len
}

/// Writes the eight digits of `n < 10^8`, zero-padded, into `buf` from `at`.
#[inline(always)]
fn write_eight(buf: &mut [u8], at: usize, n: u64) -> usize {
    buf[at..at + 8].copy_from_slice(&eight_digits(n).to_le_bytes());
    at + 8
}

/// Writes `n` in canonical decimal into `buf` from `at`, returning where it
/// ends. May write past the end of the digits: `buf` must have 20 bytes
/// of room from `at`.
#[inline(always)]
fn write_u64(buf: &mut [u8], at: usize, n: u64) -> usize {
    const E8: u64 = 100_000_000;
    if n < E8 {
        write_small(buf, at, n)
    } else if n < E8 * E8 {
        let at = write_small(buf, at, n / E8);
        write_eight(buf, at, n % E8)
    } else {
        let at = write_small(buf, at, n / (E8 * E8));
        let at = write_eight(buf, at, n / E8 % E8);
        write_eight(buf, at, n % E8)
    }
}

/// Writes `n` in canonical decimal.
pub(crate) fn put_u64(out: &mut impl BufMut, n: u64) {
    let mut digits = [0u8; 24];
    let len = write_u64(&mut digits, 0, n);
    out.put_slice(&digits[..len]);
}

/// The decimal digits of a number, at the start of `bytes`, which holds at
/// least 16 bytes (past the digits, anything): a short number is copied 16
/// bytes at once, a copy of a known size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Digits<'a> {
    bytes: &'a [u8],
    len: usize,
}

impl Digits<'_> {
    /// The digits themselves.
    #[cfg(test)]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Where the digits of an [`IdDigits`] end in its text; 16 bytes follow.
const ID_END: usize = 20;

/// The decimal digits of a request id that goes up by one at a time, kept
/// up to date by adding one to the text, so that writing an id into a
/// request is a copy. The digits end at `ID_END`, right-aligned.
#[derive(Clone, Debug)]
pub(crate) struct IdDigits {
    value: u64,
    text: [u8; ID_END + 16],
    start: usize,
}

impl IdDigits {
    /// The digits of `value`.
    pub(crate) fn new(value: u64) -> IdDigits {
        let mut digits = [0u8; 24];
        let len = write_u64(&mut digits, 0, value);
        let mut text = [b'0'; ID_END + 16];
        text[ID_END - len..ID_END].copy_from_slice(&digits[..len]);
        IdDigits {
            value,
            text,
            start: ID_END - len,
        }
    }

    /// The number.
    #[inline(always)]
    pub(crate) fn value(&self) -> u64 {
        self.value
    }

    /// Its digits, without leading zeros.
    #[inline(always)]
    pub(crate) fn digits(&self) -> Digits<'_> {
        Digits {
            bytes: &self.text[self.start..],
            len: ID_END - self.start,
        }
    }

    /// Moves on to the next number (wrapping), and its digits.
    #[inline(always)]
    pub(crate) fn advance(&mut self) {
        self.value = self.value.wrapping_add(1);
        let last = &mut self.text[ID_END - 1];
        if *last < b'9' && self.value != 0 {
            *last += 1;
        } else {
            self.carry();
        }
    }

    /// [`advance`](IdDigits::advance) past a last digit 9, or past
    /// `u64::MAX`.
    #[cold]
    fn carry(&mut self) {
        if self.value == 0 {
            // Round past `u64::MAX`.
            *self = IdDigits::new(0);
            return;
        }
        let mut at = ID_END - 1;
        loop {
            if self.text[at] < b'9' {
                self.text[at] += 1;
                return;
            }
            self.text[at] = b'0';
            if at == self.start {
                break;
            }
            at -= 1;
        }
        // All nines: one digit more (`u64::MAX` has 20 digits and does not
        // end in a 9, so there is room).
        self.start -= 1;
        self.text[self.start] = b'1';
    }
}

/// The decimal digits of the last number asked for, computed again only
/// when another number comes: leases and waits are mostly the same from one
/// request to the next.
#[derive(Clone, Debug)]
pub(crate) struct NumberDigits {
    value: u64,
    text: [u8; 24],
    len: usize,
}

impl Default for NumberDigits {
    fn default() -> NumberDigits {
        let mut text = [0u8; 24];
        text[0] = b'0';
        NumberDigits {
            value: 0,
            text,
            len: 1,
        }
    }
}

impl NumberDigits {
    /// The digits of `n`.
    #[inline(always)]
    pub(crate) fn of(&mut self, n: u64) -> Digits<'_> {
        if n != self.value {
            self.value = n;
            self.len = write_u64(&mut self.text, 0, n);
        }
        Digits {
            bytes: &self.text,
            len: self.len,
        }
    }
}

/// The space and the digits of a `u64` field, at most.
const NUMBER_FIELD: usize = 1 + 20;
/// Room for a frame assembled on the stack. A client frame whose atoms are
/// short (the usual case) fits and is put out in one piece; a longer one is
/// written field by field.
const SHORT_LINE: usize = 128;

/// Room for a frame assembled in place: `SHORT_LINE`, and past it room for
/// the last copy of 16 digits at once.
const ROOM: usize = SHORT_LINE + 32;

/// A frame being written into `bytes` (a buffer on the stack, or room made
/// at the end of the send buffer), field after field.
struct Line<'a> {
    bytes: &'a mut [u8],
    len: usize,
}

impl Line<'_> {
    /// Whether a frame of `numbers` number fields and atoms of `atoms`
    /// bytes in `atom_fields` fields surely fits.
    #[inline(always)]
    fn fits(numbers: usize, atom_fields: usize, atoms: usize) -> bool {
        // The kind letter, the fields, the newline.
        let longest = 1 + numbers * NUMBER_FIELD + atom_fields + atoms + 1;
        longest <= SHORT_LINE
    }

    /// Writes a frame of at most `len` bytes (digit fields written 16 bytes
    /// at once included) at the end of `out`, in place: room is made with
    /// zeros, the frame is written over them, and what is left of the room
    /// is cut off. The frame's bytes are not copied once more from a buffer
    /// on the stack, where reading them back wide right after writing them
    /// narrow would stall.
    #[inline(always)]
    fn in_place(out: &mut BytesMut, len: usize, write: impl FnOnce(&mut Line<'_>)) {
        let start = out.len();
        if len <= 64 {
            out.extend_from_slice(&[0; 64]);
        } else {
            debug_assert!(len <= ROOM);
            out.extend_from_slice(&[0; ROOM]);
        }
        let mut line = Line {
            bytes: &mut out[start..],
            len: 0,
        };
        write(&mut line);
        let end = start + line.len;
        out.truncate(end);
    }

    #[inline(always)]
    fn start(&mut self, kind: u8) {
        self.bytes[0] = kind;
        self.len = 1;
    }

    #[inline(always)]
    fn field(&mut self, field: &[u8]) {
        let at = self.len;
        self.bytes[at] = b' ';
        copy_short(&mut self.bytes[at + 1..at + 1 + field.len()], field);
        self.len = at + 1 + field.len();
    }

    /// A field of digits: 16 bytes are copied when there are at most 16
    /// digits, the ones past them overwritten by the next field or cut off.
    #[inline(always)]
    fn digits(&mut self, digits: Digits<'_>) {
        let at = self.len;
        self.bytes[at] = b' ';
        if digits.len <= 16 {
            self.bytes[at + 1..at + 17].copy_from_slice(&digits.bytes[..16]);
        } else {
            self.bytes[at + 1..at + 1 + digits.len].copy_from_slice(&digits.bytes[..digits.len]);
        }
        self.len = at + 1 + digits.len;
    }

    #[inline(always)]
    fn number(&mut self, n: u64) {
        self.bytes[self.len] = b' ';
        self.len = write_u64(self.bytes, self.len + 1, n);
    }

    /// Ends the line with its `\n`.
    #[inline(always)]
    fn finish(&mut self) {
        self.bytes[self.len] = b'\n';
        self.len += 1;
    }
}

/// Copies `src` into `dst`, of the same length, with copies of known sizes
/// (two overlapping ones) when it is short, so that no call is made.
#[inline(always)]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    debug_assert_eq!(dst.len(), n);
    if n >= 8 {
        if n <= 16 {
            dst[..8].copy_from_slice(&src[..8]);
            dst[n - 8..].copy_from_slice(&src[n - 8..]);
        } else if n <= 32 {
            dst[..16].copy_from_slice(&src[..16]);
            dst[n - 16..].copy_from_slice(&src[n - 16..]);
        } else {
            dst.copy_from_slice(src);
        }
    } else if n >= 4 {
        dst[..4].copy_from_slice(&src[..4]);
        dst[n - 4..].copy_from_slice(&src[n - 4..]);
    } else if n > 0 {
        // One to three bytes: the first, the middle and the last.
        dst[0] = src[0];
        dst[n / 2] = src[n / 2];
        dst[n - 1] = src[n - 1];
    }
}

fn put_field(out: &mut impl BufMut, field: &[u8]) {
    out.put_u8(b' ');
    out.put_slice(field);
}

fn put_number(out: &mut impl BufMut, n: u64) {
    out.put_u8(b' ');
    put_u64(out, n);
}

impl ClientFrame<'_> {
    /// Appends the frame's canonical bytes, `\n` included.
    pub fn encode(&self, out: &mut impl BufMut) {
        match *self {
            ClientFrame::Hello {
                version,
                client_id,
                credential,
            } => {
                out.put_u8(b'H');
                put_number(out, version);
                put_field(out, client_id.as_bytes());
                put_field(out, credential.as_bytes());
                out.put_u8(b'\n');
            }
            ClientFrame::Acquire {
                id,
                key,
                owner,
                wait_ms,
                lease_ms,
            } => Self::encode_acquire(out, id, key.as_bytes(), owner.as_bytes(), wait_ms, lease_ms),
            ClientFrame::Release { id, key, token } => {
                Self::encode_release(out, id, key.as_bytes(), token)
            }
        }
    }

    /// Writes `A <id> <key> <owner> <wait_ms> <lease_ms>\n` into `line`, if
    /// its atoms are short enough; `false` if they are not.
    #[inline(always)]
    fn acquire_line(
        line: &mut Line<'_>,
        id: u64,
        key: &[u8],
        owner: &[u8],
        wait_ms: u64,
        lease_ms: NonZeroU64,
    ) -> bool {
        if !Line::fits(3, 2, key.len() + owner.len()) {
            return false;
        }
        line.start(b'A');
        line.number(id);
        line.field(key);
        line.field(owner);
        line.number(wait_ms);
        line.number(lease_ms.get());
        line.finish();
        true
    }

    /// Writes `R <id> <key> <token>\n` into `line`, if its key is short
    /// enough; `false` if it is not.
    #[inline(always)]
    fn release_line(line: &mut Line<'_>, id: u64, key: &[u8], token: u64) -> bool {
        if !Line::fits(2, 1, key.len()) {
            return false;
        }
        line.start(b'R');
        line.number(id);
        line.field(key);
        line.number(token);
        line.finish();
        true
    }

    /// Appends `A <id> <key> <owner> <wait_ms> <lease_ms>\n`. `key` and
    /// `owner` must be atoms: the client passes its [`Key`](crate::Key) and
    /// [`Name`](crate::Name), checked when they were made, without checking
    /// them again for every request.
    pub(crate) fn encode_acquire(
        out: &mut impl BufMut,
        id: u64,
        key: &[u8],
        owner: &[u8],
        wait_ms: u64,
        lease_ms: NonZeroU64,
    ) {
        let mut bytes = [0; ROOM];
        let mut line = Line {
            bytes: &mut bytes,
            len: 0,
        };
        if Self::acquire_line(&mut line, id, key, owner, wait_ms, lease_ms) {
            out.put_slice(&line.bytes[..line.len]);
        } else {
            out.put_u8(b'A');
            put_number(out, id);
            put_field(out, key);
            put_field(out, owner);
            put_number(out, wait_ms);
            put_number(out, lease_ms.get());
            out.put_u8(b'\n');
        }
    }

    /// [`encode_acquire`](ClientFrame::encode_acquire) into a `BytesMut`,
    /// the client's send buffer, from the digits of its numbers (see
    /// [`IdDigits`] and [`NumberDigits`]), without a call to copy a short
    /// line.
    #[inline]
    pub(crate) fn encode_acquire_digits(
        out: &mut BytesMut,
        id: Digits<'_>,
        key: &[u8],
        owner: &[u8],
        wait_ms: Digits<'_>,
        lease_ms: Digits<'_>,
    ) {
        let len = 1 + id.len + key.len() + owner.len() + wait_ms.len + lease_ms.len + 5 + 1;
        if len <= SHORT_LINE {
            // Digits are written 16 bytes at once.
            Line::in_place(out, len + 16, |line| {
                line.start(b'A');
                line.digits(id);
                line.field(key);
                line.field(owner);
                line.digits(wait_ms);
                line.digits(lease_ms);
                line.finish();
            });
        } else {
            out.put_u8(b'A');
            for field in [&id.bytes[..id.len], key, owner] {
                put_field(out, field);
            }
            put_field(out, &wait_ms.bytes[..wait_ms.len]);
            put_field(out, &lease_ms.bytes[..lease_ms.len]);
            out.put_u8(b'\n');
        }
    }

    /// Appends `R <id> <key> <token>\n`. `key` must be an atom, as for
    /// [`encode_acquire`](ClientFrame::encode_acquire).
    pub(crate) fn encode_release(out: &mut impl BufMut, id: u64, key: &[u8], token: u64) {
        let mut bytes = [0; ROOM];
        let mut line = Line {
            bytes: &mut bytes,
            len: 0,
        };
        if Self::release_line(&mut line, id, key, token) {
            out.put_slice(&line.bytes[..line.len]);
        } else {
            out.put_u8(b'R');
            put_number(out, id);
            put_field(out, key);
            put_number(out, token);
            out.put_u8(b'\n');
        }
    }

    /// [`encode_release`](ClientFrame::encode_release) into a `BytesMut`,
    /// as [`encode_acquire_digits`](ClientFrame::encode_acquire_digits).
    #[inline]
    pub(crate) fn encode_release_digits(
        out: &mut BytesMut,
        id: Digits<'_>,
        key: &[u8],
        token: u64,
    ) {
        if Line::fits(1, 2, id.len + key.len()) {
            // The token is written eight bytes at once, up to 24.
            let len = 1 + 1 + id.len + 1 + key.len() + 1 + 20 + 1;
            Line::in_place(out, len + 16, |line| {
                line.start(b'R');
                line.digits(id);
                line.field(key);
                line.number(token);
                line.finish();
            });
        } else {
            out.put_u8(b'R');
            put_field(out, &id.bytes[..id.len]);
            put_field(out, key);
            put_number(out, token);
            out.put_u8(b'\n');
        }
    }
}

impl ServerFrame<'_> {
    /// Appends the frame's canonical bytes, `\n` included.
    pub fn encode(&self, out: &mut impl BufMut) {
        match *self {
            ServerFrame::Welcome { node, window } => {
                out.put_u8(b'W');
                put_field(out, node.as_bytes());
                put_number(out, window.get());
            }
            ServerFrame::Moved { addr } => {
                out.put_u8(b'M');
                put_field(out, addr.as_bytes());
            }
            ServerFrame::Error { reason } => {
                out.put_u8(b'E');
                put_field(out, reason.as_bytes());
            }
            ServerFrame::Leader { addr } => {
                out.put_u8(b'L');
                put_field(out, addr.as_bytes());
            }
            ServerFrame::Answer(answer) => answer.encode_fields(out),
        }
        out.put_u8(b'\n');
    }
}

impl Answer<'_> {
    /// Appends the answer's line, the bytes [`ServerFrame::encode`] gives.
    /// A short one (the usual case) is written in place at the end of
    /// `out`, as the client writes its requests: this is how the server
    /// answers.
    #[inline]
    pub(crate) fn encode_into(&self, out: &mut BytesMut) {
        let key = self.key.as_bytes();
        let granted = matches!(self.kind, AnswerKind::Granted { .. });
        let numbers = if granted { 3 } else { 1 };
        // The op is a field of one byte.
        if !Line::fits(numbers, 2, 1 + key.len()) {
            ServerFrame::Answer(*self).encode(out);
            return;
        }
        let longest = 1 + numbers * NUMBER_FIELD + 2 + 1 + key.len() + 1;
        // A number may be written up to 19 bytes past its last digit.
        Line::in_place(out, longest + 19, |line| {
            line.start(self.kind.letter());
            line.number(self.id);
            line.field(&[self.op().letter()]);
            line.field(key);
            if let AnswerKind::Granted { token, lease_ms } = self.kind {
                line.number(token);
                line.number(lease_ms.get());
            }
            line.finish();
        });
    }

    fn encode_fields(&self, out: &mut impl BufMut) {
        out.put_u8(self.kind.letter());
        put_number(out, self.id);
        out.put_u8(b' ');
        out.put_u8(self.op().letter());
        put_field(out, self.key.as_bytes());
        if let AnswerKind::Granted { token, lease_ms } = self.kind {
            put_number(out, token);
            put_number(out, lease_ms.get());
        }
    }
}

/// Shows a frame as its line, without the `\n`.
fn display_encoded(f: &mut fmt::Formatter<'_>, encode: impl FnOnce(&mut Vec<u8>)) -> fmt::Result {
    let mut line = Vec::with_capacity(64);
    encode(&mut line);
    line.pop();
    f.write_str(&String::from_utf8_lossy(&line))
}

impl fmt::Display for ClientFrame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        display_encoded(f, |out| self.encode(out))
    }
}

impl fmt::Display for ServerFrame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        display_encoded(f, |out| self.encode(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use crate::wire::MAX_ATOM;

    #[test]
    fn answers_written_in_place_are_the_bytes_of_the_frame_encoder() {
        let mut rng = Rng::new(11);
        let long_key = "k".repeat(MAX_ATOM);
        let number = |rng: &mut Rng| match rng.up_to(4) {
            0 => rng.up_to(200),
            1 => u64::MAX - rng.up_to(3),
            _ => rng.up_to(u64::MAX) >> rng.up_to(63),
        };
        for _ in 0..100_000 {
            // Short keys, and long ones that take the general path.
            let len = if rng.chance(1, 2) {
                1 + rng.up_to(63)
            } else {
                1 + rng.up_to(MAX_ATOM as u64 - 1)
            };
            let key = Atom::new(&long_key[..len as usize]).expect("an atom");
            let kind = match rng.up_to(4) {
                0 => AnswerKind::TimedOut,
                1 => AnswerKind::Busy,
                2 => AnswerKind::Released,
                3 => AnswerKind::NotHeld,
                _ => AnswerKind::Granted {
                    token: number(&mut rng),
                    lease_ms: NonZeroU64::new(number(&mut rng)).unwrap_or(NonZeroU64::MAX),
                },
            };
            let answer = Answer {
                id: number(&mut rng),
                key,
                kind,
            };
            let mut expected = BytesMut::new();
            ServerFrame::Answer(answer).encode(&mut expected);
            let mut found = BytesMut::from(&b"before\n"[..]);
            answer.encode_into(&mut found);
            assert_eq!(&found[..7], b"before\n");
            assert_eq!(found[7..], expected[..], "{answer:?}");
        }
    }

    #[test]
    fn numbers_are_written_like_display() {
        let mut rng = Rng::new(5);
        let mut samples: Vec<u64> = (0..20).map(|i| POWERS_OF_TEN[i]).collect();
        samples.extend((0..20).map(|i| POWERS_OF_TEN[i] - 1));
        samples.extend([u64::MAX, u64::MAX - 1, 0, 1, 9, 10, 99, 100, 101]);
        samples.extend((0..10_000).map(|_| rng.up_to(u64::MAX) >> rng.up_to(63)));
        samples.extend(0..300_000);
        samples.extend((1..20).flat_map(|i| {
            let p = POWERS_OF_TEN[i];
            [p - 2, p + 1, p.saturating_mul(3) - 1, p / 2]
        }));
        for n in samples {
            let mut out = Vec::new();
            put_u64(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }

    #[test]
    fn digits_follow_their_numbers() {
        let mut rng = Rng::new(9);
        let starts = [0, 1, 8, 9, 99, 999, 1_099, u64::MAX - 3, 10u64.pow(19) - 2];
        for start in starts
            .into_iter()
            .chain((0..200).map(|_| rng.up_to(u64::MAX) >> rng.up_to(63)))
        {
            let mut id = IdDigits::new(start);
            for _ in 0..1_200 {
                assert_eq!(id.digits().as_bytes(), id.value().to_string().as_bytes());
                id.advance();
            }
        }
        let mut memo = NumberDigits::default();
        for n in [0, 0, 5, 5, 30_000, 7, 0, u64::MAX, u64::MAX, 10] {
            assert_eq!(memo.of(n).as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn short_and_long_frames_encode_alike() {
        let mut rng = Rng::new(6);
        for _ in 0..2_000 {
            let atom = |rng: &mut Rng| {
                let longest = if rng.chance(1, 2) { 40 } else { 249 };
                "k".repeat(1 + rng.up_to(longest) as usize)
            };
            let (key, owner) = (atom(&mut rng), atom(&mut rng));
            let id = rng.up_to(u64::MAX) >> rng.up_to(63);
            let wait = rng.up_to(u64::MAX) >> rng.up_to(63);
            let lease = (rng.up_to(u64::MAX) >> rng.up_to(63)).max(1);
            let mut out = Vec::new();
            ClientFrame::Acquire {
                id,
                key: Atom::new(&key).unwrap(),
                owner: Atom::new(&owner).unwrap(),
                wait_ms: wait,
                lease_ms: NonZeroU64::new(lease).unwrap(),
            }
            .encode(&mut out);
            assert_eq!(
                out,
                format!("A {id} {key} {owner} {wait} {lease}\n").as_bytes()
            );
            let mut bytes = BytesMut::from(&b"before "[..]);
            let (mut waits, mut leases) = (NumberDigits::default(), NumberDigits::default());
            let id_digits = IdDigits::new(id);
            ClientFrame::encode_acquire_digits(
                &mut bytes,
                id_digits.digits(),
                key.as_bytes(),
                owner.as_bytes(),
                waits.of(wait),
                leases.of(lease),
            );
            ClientFrame::encode_release_digits(
                &mut bytes,
                id_digits.digits(),
                key.as_bytes(),
                wait,
            );
            assert_eq!(
                bytes,
                format!("before A {id} {key} {owner} {wait} {lease}\nR {id} {key} {wait}\n")
                    .as_bytes()
            );
            out.clear();
            ClientFrame::Release {
                id,
                key: Atom::new(&key).unwrap(),
                token: wait,
            }
            .encode(&mut out);
            assert_eq!(out, format!("R {id} {key} {wait}\n").as_bytes());
        }
    }
}
