//! Frame types (PROTOCOL.md section 3) and their canonical encoding.

use core::fmt;
use core::num::NonZeroU64;

use bytes::BytesMut;

use super::atom::{Addr, Atom};

/// The protocol version this crate's client speaks.
pub const VERSION: u64 = 2;

/// The op an answer answers: `A` (acquire), `R` (release) or `X` (renew).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// `A`: acquire.
    Acquire,
    /// `R`: release.
    Release,
    /// `X`: renew (version 2).
    Renew,
}

impl Op {
    /// The op's letter on the wire.
    pub const fn letter(self) -> u8 {
        match self {
            Op::Acquire => b'A',
            Op::Release => b'R',
            Op::Renew => b'X',
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
    /// `X <id> <key> <token> <lease_ms>` (version 2): renew exactly the
    /// grant with this token so that it lasts at least `lease_ms` more.
    Renew {
        /// Request id.
        id: u64,
        /// The lock.
        key: Atom<'a>,
        /// The fencing token of the grant.
        token: u64,
        /// The lease asked for, from when the server handles the request.
        lease_ms: NonZeroU64,
    },
}

/// What an answer says, besides its id, op and key. Each kind answers one
/// op ([`AnswerKind::op`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AnswerKind {
    /// `G <id> A ...`: granted, with the fencing token, the lease actually
    /// given and (version 2) how long the acquire waited in the queue.
    Granted {
        /// The fencing token.
        token: u64,
        /// The lease in milliseconds, never more than asked.
        lease_ms: NonZeroU64,
        /// Milliseconds the acquire waited in the key's queue, rounded
        /// down: present on version 2, absent on version 1.
        waited_ms: Option<u64>,
    },
    /// `T`: not granted within `wait_ms`.
    TimedOut,
    /// `B`: refused before it was queued; nothing is held.
    Busy,
    /// `D`: released.
    Released,
    /// `N <id> R ...`: no grant of that key has that token.
    NotHeld,
    /// `G <id> X ...` (version 2): renewed; the grant with that token lasts
    /// at least `lease_ms` from when the server handled the request.
    Renewed {
        /// The fencing token, the renewal's.
        token: u64,
        /// The lease in milliseconds, never more than asked.
        lease_ms: NonZeroU64,
    },
    /// `N <id> X ...` (version 2): no grant of that key has that token; it
    /// is gone and no renewal can bring it back.
    Gone,
}

impl AnswerKind {
    /// The op this kind answers: `G` with a waited time, `T`, `B` answer
    /// `A`; `D`, `N` answer `R`; a renewal's `G` and `N` answer `X`.
    pub const fn op(self) -> Op {
        match self {
            AnswerKind::Granted { .. } | AnswerKind::TimedOut | AnswerKind::Busy => Op::Acquire,
            AnswerKind::Released | AnswerKind::NotHeld => Op::Release,
            AnswerKind::Renewed { .. } | AnswerKind::Gone => Op::Renew,
        }
    }

    /// The kind's letter on the wire.
    pub const fn letter(self) -> u8 {
        match self {
            AnswerKind::Granted { .. } | AnswerKind::Renewed { .. } => b'G',
            AnswerKind::TimedOut => b'T',
            AnswerKind::Busy => b'B',
            AnswerKind::Released => b'D',
            AnswerKind::NotHeld | AnswerKind::Gone => b'N',
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

/// What the digits of a number may be written past the line at most.
const DIGIT_SLACK: usize = 8;

/// The digits of a number field as the last frame that had it wrote them,
/// for a number below 10^8: a field that repeats (a lease, a wait) or goes
/// up by one (a request id) is written from them.
#[derive(Debug, Clone, Copy)]
struct Memo {
    value: u64,
    /// The digits, first in memory order, as [`eight_digits`] makes them.
    word: u64,
    len: usize,
}

impl Default for Memo {
    fn default() -> Memo {
        Memo {
            value: 0,
            word: u64::from(b'0'),
            len: 1,
        }
    }
}

impl Memo {
    /// The digits of `n < 10^8` and how many there are.
    #[inline(always)]
    fn digits(&mut self, n: u64) -> (u64, usize) {
        debug_assert!(n < 100_000_000);
        if n != self.value {
            let last = 8 * (self.len - 1);
            if n == self.value + 1 && (self.word >> last) as u8 != b'9' {
                // One more, without a carry: the last digit goes up.
                self.word += 1 << last;
            } else {
                self.len = decimal_len(n);
                self.word = eight_digits(n) >> (8 * (8 - self.len));
            }
            self.value = n;
        }
        (self.word, self.len)
    }
}

/// The digits of the number fields of the last frames encoded, by field:
/// kept by a buffer that frames are encoded into one after another (the
/// client's send buffer), so that a frame's numbers are mostly copies.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct Digits {
    id: Memo,
    wait: Memo,
    lease: Memo,
}

/// A number field that [`Digits`] keeps.
#[derive(Clone, Copy)]
enum Field {
    Id,
    Wait,
    Lease,
}

/// A growable byte buffer that frames are encoded into, in place:
/// `Vec<u8>` or [`BytesMut`].
pub trait LineBuf: sealed::Sealed {
    /// How many bytes it holds.
    #[doc(hidden)]
    fn filled(&self) -> usize;
    /// Appends `n` bytes, of any value, and returns them to be written
    /// over.
    #[doc(hidden)]
    fn grow(&mut self, n: usize) -> &mut [u8];
    /// Keeps the first `len` bytes.
    #[doc(hidden)]
    fn truncate(&mut self, len: usize);
    /// As [`grow`](LineBuf::grow), and the digits of the last frames'
    /// numbers, if the buffer keeps them.
    #[doc(hidden)]
    fn grow_with_digits(&mut self, n: usize) -> (&mut [u8], Option<&mut Digits>) {
        (self.grow(n), None)
    }
}

pub(crate) mod sealed {
    pub trait Sealed {}
    impl Sealed for Vec<u8> {}
    impl Sealed for bytes::BytesMut {}
}

impl LineBuf for Vec<u8> {
    fn filled(&self) -> usize {
        self.len()
    }

    fn grow(&mut self, n: usize) -> &mut [u8] {
        let start = Vec::len(self);
        self.resize(start + n, 0);
        &mut self[start..]
    }

    fn truncate(&mut self, len: usize) {
        Vec::truncate(self, len);
    }
}

impl LineBuf for BytesMut {
    fn filled(&self) -> usize {
        self.len()
    }

    fn grow(&mut self, n: usize) -> &mut [u8] {
        let start = BytesMut::len(self);
        bytes::BufMut::put_bytes(self, 0, n);
        &mut self[start..]
    }

    fn truncate(&mut self, len: usize) {
        BytesMut::truncate(self, len);
    }
}

/// A frame being written field after field over room made at the end of a
/// buffer: its kind letter, then fields, then its `\n`.
struct Line<'a> {
    bytes: &'a mut [u8],
    len: usize,
    digits: Option<&'a mut Digits>,
}

impl<'a> Line<'a> {
    /// Makes room for a line of at most `longest` bytes at the end of
    /// `out`, and writes `kind` there.
    fn start(out: &'a mut impl LineBuf, longest: usize, kind: u8) -> Line<'a> {
        let (bytes, digits) = out.grow_with_digits(longest + DIGIT_SLACK);
        bytes[0] = kind;
        Line {
            bytes,
            len: 1,
            digits,
        }
    }

    /// Room for a frame of kind letter, `atoms` bytes of atoms in
    /// `fields` fields, `numbers` number fields and the `\n`.
    fn longest(fields: usize, atoms: usize, numbers: usize) -> usize {
        1 + fields + atoms + numbers * 21 + 1
    }

    /// Appends a space and `field`, with copies of known sizes when it is
    /// short (two that overlap), so that no call is made.
    #[inline(always)]
    fn field(&mut self, field: &[u8]) {
        let at = self.len;
        self.bytes[at] = b' ';
        let n = field.len();
        let dst = &mut self.bytes[at + 1..at + 1 + n];
        match n {
            0 => {}
            1..=3 => {
                // The first, the middle and the last.
                dst[0] = field[0];
                dst[n / 2] = field[n / 2];
                dst[n - 1] = field[n - 1];
            }
            4..=7 => {
                dst[..4].copy_from_slice(&field[..4]);
                dst[n - 4..].copy_from_slice(&field[n - 4..]);
            }
            8..=16 => {
                dst[..8].copy_from_slice(&field[..8]);
                dst[n - 8..].copy_from_slice(&field[n - 8..]);
            }
            17..=32 => {
                dst[..16].copy_from_slice(&field[..16]);
                dst[n - 16..].copy_from_slice(&field[n - 16..]);
            }
            _ => dst.copy_from_slice(field),
        }
        self.len = at + 1 + n;
    }

    /// Appends a space and `n` in canonical decimal, eight digits at a
    /// time (see [`eight_digits`]).
    #[inline(always)]
    fn number(&mut self, n: u64) {
        const E8: u64 = 100_000_000;
        self.bytes[self.len] = b' ';
        self.len += 1;
        if n < E8 {
            self.leading_digits(n);
        } else if n < E8 * E8 {
            self.leading_digits(n / E8);
            self.eight_digits(n % E8);
        } else {
            self.leading_digits(n / (E8 * E8));
            self.eight_digits(n / E8 % E8);
            self.eight_digits(n % E8);
        }
    }

    /// Appends a space and `n`, the number `field`, from the digits of
    /// the last frames' `field` when the buffer keeps them.
    #[inline(always)]
    fn field_number(&mut self, field: Field, n: u64) {
        let memo = match self.digits.as_deref_mut() {
            Some(digits) if n < 100_000_000 => match field {
                Field::Id => &mut digits.id,
                Field::Wait => &mut digits.wait,
                Field::Lease => &mut digits.lease,
            },
            _ => return self.number(n),
        };
        let (word, len) = memo.digits(n);
        self.bytes[self.len] = b' ';
        self.bytes[self.len + 1..self.len + 9].copy_from_slice(&word.to_le_bytes());
        self.len += 1 + len;
    }

    /// Appends the digits of `n < 10^8`, without leading zeros. Eight
    /// bytes are written, whatever their number: the line has room for
    /// them past its longest frame.
    #[inline(always)]
    fn leading_digits(&mut self, n: u64) {
        let len = decimal_len(n);
        let word = eight_digits(n) >> (8 * (8 - len));
        self.bytes[self.len..self.len + 8].copy_from_slice(&word.to_le_bytes());
        self.len += len;
    }

    /// Appends the eight digits of `n < 10^8`, zero-padded.
    #[inline(always)]
    fn eight_digits(&mut self, n: u64) {
        self.bytes[self.len..self.len + 8].copy_from_slice(&eight_digits(n).to_le_bytes());
        self.len += 8;
    }

    /// Ends the line with its `\n`, returning its length.
    fn finish(self) -> usize {
        self.bytes[self.len] = b'\n';
        self.len + 1
    }
}

/// Encodes one frame at the end of `out`: room for its longest form is
/// made, `write` fills it, and what it did not use is cut off.
fn encode_with(
    out: &mut impl LineBuf,
    kind: u8,
    longest: usize,
    write: impl FnOnce(&mut Line<'_>),
) {
    let start = out.filled();
    let mut line = Line::start(out, longest, kind);
    write(&mut line);
    let len = line.finish();
    out.truncate(start + len);
}

impl ClientFrame<'_> {
    /// Appends the frame's canonical bytes, `\n` included.
    pub fn encode(&self, out: &mut impl LineBuf) {
        match *self {
            ClientFrame::Hello {
                version,
                client_id,
                credential,
            } => {
                let atoms = client_id.as_bytes().len() + credential.as_bytes().len();
                encode_with(out, b'H', Line::longest(3, atoms, 1), |line| {
                    line.number(version);
                    line.field(client_id.as_bytes());
                    line.field(credential.as_bytes());
                });
            }
            ClientFrame::Acquire {
                id,
                key,
                owner,
                wait_ms,
                lease_ms,
            } => {
                let atoms = key.as_bytes().len() + owner.as_bytes().len();
                encode_with(out, b'A', Line::longest(5, atoms, 3), |line| {
                    line.field_number(Field::Id, id);
                    line.field(key.as_bytes());
                    line.field(owner.as_bytes());
                    line.field_number(Field::Wait, wait_ms);
                    line.field_number(Field::Lease, lease_ms.get());
                });
            }
            ClientFrame::Release { id, key, token } => {
                encode_with(
                    out,
                    b'R',
                    Line::longest(3, key.as_bytes().len(), 2),
                    |line| {
                        line.field_number(Field::Id, id);
                        line.field(key.as_bytes());
                        line.number(token);
                    },
                );
            }
            ClientFrame::Renew {
                id,
                key,
                token,
                lease_ms,
            } => {
                encode_with(
                    out,
                    b'X',
                    Line::longest(4, key.as_bytes().len(), 3),
                    |line| {
                        line.field_number(Field::Id, id);
                        line.field(key.as_bytes());
                        line.number(token);
                        line.field_number(Field::Lease, lease_ms.get());
                    },
                );
            }
        }
    }
}

impl ServerFrame<'_> {
    /// Appends the frame's canonical bytes, `\n` included.
    pub fn encode(&self, out: &mut impl LineBuf) {
        match *self {
            ServerFrame::Welcome { node, window } => {
                encode_with(
                    out,
                    b'W',
                    Line::longest(2, node.as_bytes().len(), 1),
                    |line| {
                        line.field(node.as_bytes());
                        line.number(window.get());
                    },
                );
            }
            ServerFrame::Moved { addr } => {
                encode_with(
                    out,
                    b'M',
                    Line::longest(1, addr.as_bytes().len(), 0),
                    |line| {
                        line.field(addr.as_bytes());
                    },
                );
            }
            ServerFrame::Error { reason } => {
                encode_with(
                    out,
                    b'E',
                    Line::longest(1, reason.as_bytes().len(), 0),
                    |line| {
                        line.field(reason.as_bytes());
                    },
                );
            }
            ServerFrame::Leader { addr } => {
                encode_with(
                    out,
                    b'L',
                    Line::longest(1, addr.as_bytes().len(), 0),
                    |line| {
                        line.field(addr.as_bytes());
                    },
                );
            }
            ServerFrame::Answer(Answer { id, key, kind }) => {
                let longest = Line::longest(6, 1 + key.as_bytes().len(), 4);
                encode_with(out, kind.letter(), longest, |line| {
                    line.number(id);
                    line.field(&[kind.op().letter()]);
                    line.field(key.as_bytes());
                    match kind {
                        AnswerKind::Granted {
                            token,
                            lease_ms,
                            waited_ms,
                        } => {
                            line.number(token);
                            line.number(lease_ms.get());
                            if let Some(waited_ms) = waited_ms {
                                line.number(waited_ms);
                            }
                        }
                        AnswerKind::Renewed { token, lease_ms } => {
                            line.number(token);
                            line.number(lease_ms.get());
                        }
                        _ => {}
                    }
                });
            }
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

    /// A line of `fields` written by `write`.
    fn line_of(write: impl FnOnce(&mut Line<'_>)) -> Vec<u8> {
        let mut out = b"before\n".to_vec();
        encode_with(&mut out, b'X', 1 + 2 * LONGEST_ATOM_LINE, write);
        assert_eq!(&out[..7], b"before\n");
        out.split_off(7)
    }

    const LONGEST_ATOM_LINE: usize = 300;

    #[test]
    fn numbers_are_written_like_display() {
        let mut rng = Rng::new(5);
        let mut samples: Vec<u64> = (0..20).map(|i| POWERS_OF_TEN[i]).collect();
        samples.extend((0..20).map(|i| POWERS_OF_TEN[i] - 1));
        samples.extend([u64::MAX, u64::MAX - 1, 0, 1, 9, 10, 99, 100, 101]);
        samples.extend((0..10_000).map(|_| rng.up_to(u64::MAX) >> rng.up_to(63)));
        samples.extend(0..100_000);
        for n in samples {
            let line = line_of(|line| {
                line.number(n);
                line.number(n / 7);
            });
            assert_eq!(line, format!("X {n} {}\n", n / 7).as_bytes());
        }
    }

    #[test]
    fn fields_of_every_length_are_copied_whole() {
        let text = "abcdefghijklmnopqrstuvwxyz0123456789".repeat(8);
        for n in 1..=crate::wire::MAX_ATOM {
            let line = line_of(|line| {
                line.field(&text.as_bytes()[..n]);
                line.field(b"z");
            });
            assert_eq!(line, format!("X {} z\n", &text[..n]).as_bytes());
        }
    }

    #[test]
    fn the_room_made_fits_the_longest_frames_exactly_enough() {
        let atom = "k".repeat(crate::wire::MAX_ATOM);
        let atom = Atom::new(&atom).unwrap();
        let mut out = Vec::new();
        ClientFrame::Acquire {
            id: u64::MAX,
            key: atom,
            owner: atom,
            wait_ms: u64::MAX,
            lease_ms: NonZeroU64::MAX,
        }
        .encode(&mut out);
        assert_eq!(out.len(), 567);
        let mut out = BytesMut::new();
        ServerFrame::Answer(Answer {
            id: u64::MAX,
            key: atom,
            kind: AnswerKind::Granted {
                token: u64::MAX,
                lease_ms: NonZeroU64::MAX,
                waited_ms: Some(u64::MAX),
            },
        })
        .encode(&mut out);
        assert_eq!(out.len(), 1 + 1 + 20 + 2 + 1 + 250 + 3 * 21 + 1);
    }
}
