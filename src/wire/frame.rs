//! Frame types (PROTOCOL.md section 3) and their canonical encoding.

use core::fmt;
use core::num::NonZeroU64;

use bytes::BufMut;

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

/// Writes `n` in canonical decimal.
pub(crate) fn put_u64(out: &mut impl BufMut, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[at..]);
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
            }
            ClientFrame::Acquire {
                id,
                key,
                owner,
                wait_ms,
                lease_ms,
            } => {
                out.put_u8(b'A');
                put_number(out, id);
                put_field(out, key.as_bytes());
                put_field(out, owner.as_bytes());
                put_number(out, wait_ms);
                put_number(out, lease_ms.get());
            }
            ClientFrame::Release { id, key, token } => {
                out.put_u8(b'R');
                put_number(out, id);
                put_field(out, key.as_bytes());
                put_number(out, token);
            }
        }
        out.put_u8(b'\n');
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
