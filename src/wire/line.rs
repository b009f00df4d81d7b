//! Cutting a byte stream that arrives in arbitrary chunks into lines.

use super::atom::Atom;
use super::error::FrameError;
use super::frame::ServerFrame;
use super::parse::zero_bytes;

/// The longest frame, in bytes, `\n` included.
pub const MAX_FRAME: usize = 1024;

/// Cuts a byte stream into lines, holding at most [`MAX_FRAME`] bytes of an
/// unfinished line.
///
/// Lines that lie whole inside one chunk are handed out borrowed from that
/// chunk, without copying; only a line cut by a chunk boundary is assembled
/// in the reader's own buffer. The reader never buffers more than 1024
/// bytes: as soon as byte 1025 of a line arrives without a `\n` before it,
/// it fails with [`FrameError::LineTooLong`], and from then on keeps
/// returning that error (the connection is done).
///
/// ```
/// use ticketing::wire::{LineReader, ServerFrame};
///
/// let mut reader = LineReader::new();
/// let mut lines = Vec::new();
/// for chunk in [&b"W node-1 "[..], b"16\nG 7 A k 3 5", b"00\n"] {
///     let mut input = chunk;
///     while let Some(line) = reader.next_line(&mut input) {
///         let frame = ServerFrame::parse(line.unwrap()).unwrap();
///         lines.push(frame.to_string());
///     }
/// }
/// assert_eq!(lines, ["W node-1 16", "G 7 A k 3 500"]);
/// ```
#[derive(Debug, Default, Clone)]
pub struct LineReader {
    partial: Vec<u8>,
    /// `partial` holds a whole line that was handed out: clear it first.
    handed_out: bool,
    failed: bool,
}

impl LineReader {
    /// An empty reader.
    pub fn new() -> LineReader {
        LineReader::default()
    }

    /// The next whole line (without its `\n`) from what was buffered plus
    /// `input`, advancing `input` past what was consumed. `None` when
    /// `input` is used up without completing a line: its bytes are then
    /// buffered, to be continued by the next chunk.
    pub fn next_line<'r, 'i: 'r>(
        &'r mut self,
        input: &mut &'i [u8],
    ) -> Option<Result<&'r [u8], FrameError>> {
        if self.failed {
            return Some(Err(FrameError::LineTooLong));
        }
        if self.handed_out {
            self.partial.clear();
            self.handed_out = false;
        }
        if input.is_empty() {
            return None;
        }
        let chunk: &'i [u8] = input;
        match find_newline(chunk) {
            Some(newline) => {
                if self.partial.len() + newline + 1 > MAX_FRAME {
                    return Some(Err(self.fail()));
                }
                *input = &chunk[newline + 1..];
                if self.partial.is_empty() {
                    Some(Ok(&chunk[..newline]))
                } else {
                    self.partial.extend_from_slice(&chunk[..newline]);
                    self.handed_out = true;
                    Some(Ok(&self.partial))
                }
            }
            None => {
                *input = &[];
                if self.partial.len() + chunk.len() > MAX_FRAME {
                    return Some(Err(self.fail()));
                }
                if self.partial.capacity() == 0 {
                    self.partial.reserve_exact(MAX_FRAME);
                }
                self.partial.extend_from_slice(chunk);
                None
            }
        }
    }

    /// How many bytes of an unfinished line are buffered (at most
    /// [`MAX_FRAME`]).
    pub fn buffered(&self) -> usize {
        if self.handed_out {
            0
        } else {
            self.partial.len()
        }
    }

    /// Whether the next line starts at the next byte of input: nothing of
    /// an unfinished line is buffered, and no over-long line was met.
    fn at_line_start(&self) -> bool {
        !self.failed && self.buffered() == 0
    }

    /// The good lines that lie whole at the front of `input` (while the
    /// next line starts there), parsed where they are, up to [`BATCH`] of
    /// them; `input` is advanced past them. A line cut by the end of
    /// `input`, or one that breaks a rule, ends the batch: it is for
    /// [`next_line`](LineReader::next_line), which buffers the one and
    /// tells which rule the other breaks.
    pub(crate) fn leading_frames<'i>(&self, input: &mut &'i [u8]) -> Frames<'i> {
        // What fills the room past the frames read.
        let none = ServerFrame::Error {
            reason: Atom::from_checked(b"-"),
        };
        let mut frames = Frames {
            frames: [none; BATCH],
            len: 0,
        };
        if !self.at_line_start() {
            return frames;
        }
        while frames.len < BATCH {
            let Some((frame, len)) = ServerFrame::parse_leading(input) else {
                break;
            };
            *input = &input[len..];
            frames.frames[frames.len] = frame;
            frames.len += 1;
        }
        frames
    }

    /// Forgets everything, including a failure, keeping the buffer's memory
    /// for the next connection.
    pub fn reset(&mut self) {
        self.partial.clear();
        self.handed_out = false;
        self.failed = false;
    }

    #[cold]
    fn fail(&mut self) -> FrameError {
        self.failed = true;
        self.partial = Vec::new();
        FrameError::LineTooLong
    }
}

/// How many frames [`LineReader::leading_frames`] reads at once.
pub(crate) const BATCH: usize = 16;

/// Frames read where they lay at the front of some input, in order.
pub(crate) struct Frames<'a> {
    frames: [ServerFrame<'a>; BATCH],
    len: usize,
}

impl<'a> Frames<'a> {
    /// Whether no frame was read.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The frames, in order.
    pub(crate) fn as_slice(&self) -> &[ServerFrame<'a>] {
        &self.frames[..self.len]
    }
}

/// The offset of the first `\n` in `bytes`, eight bytes at a time.
fn find_newline(bytes: &[u8]) -> Option<usize> {
    const NEWLINES: u64 = 0x0a0a_0a0a_0a0a_0a0a;
    let word_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let hits = zero_bytes(word_at(at) ^ NEWLINES);
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    if at == bytes.len() {
        None
    } else if bytes.len() >= 8 {
        // The last eight bytes: those seen already hold no `\n`.
        let base = bytes.len() - 8;
        let hits = zero_bytes(word_at(base) ^ NEWLINES);
        (hits != 0).then(|| base + (hits.trailing_zeros() / 8) as usize)
    } else {
        bytes.iter().position(|&b| b == b'\n')
    }
}

#[cfg(test)]
mod tests {
    use super::find_newline;

    #[test]
    fn find_newline_agrees_with_a_byte_scan() {
        for len in 0..40 {
            for first in 0..=len {
                let mut bytes = vec![b'a'; len];
                for at in (first..len).step_by(3) {
                    bytes[at] = b'\n';
                }
                if first < len {
                    bytes[len - 1] ^= 0x80;
                }
                assert_eq!(
                    find_newline(&bytes),
                    bytes.iter().position(|&b| b == b'\n'),
                    "{bytes:?}"
                );
            }
        }
    }
}
