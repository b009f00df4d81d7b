//! Parsing one line (without its `\n`) into a frame, enforcing every framing
//! rule of PROTOCOL.md section 2.

use core::num::NonZeroU64;

use super::atom::{Addr, Atom, MAX_ATOM};
use super::error::FrameError;
use super::frame::{Answer, AnswerKind, ClientFrame, Op, ServerFrame, Window};

/// The most fields any frame has, plus one to tell "too many" apart.
const MAX_FIELDS: usize = 7;

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
        for (at, &byte) in line.iter().enumerate() {
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
    pub fn parse(line: &'a [u8]) -> Result<ClientFrame<'a>, FrameError> {
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

impl<'a> ServerFrame<'a> {
    /// Parses one line, without its `\n`, as a frame a client receives.
    pub fn parse(line: &'a [u8]) -> Result<ServerFrame<'a>, FrameError> {
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
