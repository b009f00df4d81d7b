//! The wire codec: frame types, an incremental line reader, a parser that
//! enforces every framing rule, and a canonical encoder.
//!
//! A frame is one line of printable ASCII ending in `\n`, at most 1024 bytes,
//! fields separated by exactly one space (PROTOCOL.md sections 2 and 3).
//! Decoding is two steps, so that neither allocates:
//!
//! 1. [`LineReader::next_line`] cuts the incoming byte stream, which may
//!    arrive in chunks of any size, into lines;
//! 2. [`ServerFrame::parse`] (what a client receives) or
//!    [`ClientFrame::parse`] (what a server receives) turns one line into a
//!    frame that borrows its atoms from the line.
//!
//! Encoding is canonical: for every line that parses,
//! `encode(parse(line)) == line`, and every frame that can be constructed
//! (atoms are validated by [`Atom::new`] and [`Addr::new`], leases are
//! non-zero, windows are at least 2) encodes to a line that parses back to
//! it.
//!
//! ```
//! use ticketing::wire::{Answer, AnswerKind, Atom, ServerFrame};
//! use std::num::NonZeroU64;
//!
//! // A grant on version 2: token 7, a lease of 30 s, after 120 ms in the queue.
//! let line = b"G 42 A printer 7 30000 120";
//! let frame = ServerFrame::parse(line).unwrap();
//! assert_eq!(
//!     frame,
//!     ServerFrame::Answer(Answer {
//!         id: 42,
//!         key: Atom::new("printer").unwrap(),
//!         kind: AnswerKind::Granted {
//!             token: 7,
//!             lease_ms: NonZeroU64::new(30000).unwrap(),
//!             waited_ms: Some(120),
//!         },
//!     })
//! );
//! let mut out = Vec::new();
//! frame.encode(&mut out);
//! assert_eq!(out, b"G 42 A printer 7 30000 120\n");
//!
//! // Every framing rule is a typed error.
//! assert!(ServerFrame::parse(b"G 042 A printer 7 30000").is_err()); // leading zero
//! assert!(ServerFrame::parse(b"G 42 R printer 7 30000").is_err()); // G cannot answer R
//! ```

mod atom;
mod error;
mod frame;
mod line;
mod parse;

pub use atom::{Addr, Atom, MAX_ATOM};
pub use error::{AtomError, FrameError};
pub(crate) use frame::{sealed, Digits};
pub use frame::{Answer, AnswerKind, ClientFrame, LineBuf, Op, ServerFrame, Window, VERSION};
pub(crate) use line::BATCH;
pub use line::{LineReader, MAX_FRAME};

pub(crate) use atom::{check_atom, is_host_port};

#[cfg(test)]
mod tests;
