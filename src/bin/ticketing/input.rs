//! Command lines from standard input, read without trusting them: a line
//! that is not UTF-8, or of any length, is a bad line to report, never the
//! end of the input, and no more than [`MAX_LINE`] bytes of one are kept.

use std::io;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The most of one line that is kept: far more than any command needs
/// (a few atoms of at most 250 bytes and some numbers). The rest of a
/// longer line is read and dropped, and the line is a bad one.
pub const MAX_LINE: usize = 4096;

/// The most of a bad line that an error message quotes, in bytes.
pub const QUOTE_MAX: usize = 100;

/// One line of input.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A line that is UTF-8 and fits, without its `\n` (or `\r\n`).
    Text(String),
    /// A line that is not UTF-8, or too long: what to say about it.
    Bad(String),
}

/// Reads lines, keeping at most [`MAX_LINE`] bytes of each.
///
/// [`next`](Lines::next) is cancel-safe, like tokio's own `Lines`: every
/// byte taken from the reader is in `self` before the next await, so a
/// `select!` that drops the future loses nothing.
pub struct Lines<R> {
    reader: R,
    /// The first `MAX_LINE` bytes of the line read so far.
    kept: Vec<u8>,
    /// How long the line read so far is, in bytes, kept or not.
    len: usize,
}

impl<R: AsyncBufRead + Unpin> Lines<R> {
    pub fn new(reader: R) -> Lines<R> {
        Lines {
            reader,
            kept: Vec::new(),
            len: 0,
        }
    }

    /// The next line; `None` at the end of the input. A last line without
    /// `\n` is a line.
    pub async fn next(&mut self) -> io::Result<Option<Line>> {
        loop {
            let buf = self.reader.fill_buf().await?;
            if buf.is_empty() {
                if self.len == 0 {
                    return Ok(None);
                }
                return Ok(Some(self.take()));
            }
            let (part, used, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], i + 1, true),
                None => (buf, buf.len(), false),
            };
            let room = MAX_LINE.saturating_sub(self.kept.len());
            self.kept.extend_from_slice(&part[..part.len().min(room)]);
            self.len = self.len.saturating_add(part.len());
            self.reader.consume(used);
            if done {
                return Ok(Some(self.take()));
            }
        }
    }

    /// The line read so far, and a fresh start for the next.
    fn take(&mut self) -> Line {
        let len = std::mem::take(&mut self.len);
        let mut bytes = std::mem::take(&mut self.kept);
        if bytes.ends_with(b"\r") && len == bytes.len() {
            bytes.pop();
        }
        if len > MAX_LINE {
            return Line::Bad(format!(
                "line too long: {len} bytes, at most {MAX_LINE}: {}",
                quote_bytes(&bytes)
            ));
        }
        match String::from_utf8(bytes) {
            Ok(text) => Line::Text(text),
            Err(e) => Line::Bad(format!("not UTF-8: {}", quote_bytes(e.as_bytes()))),
        }
    }
}

/// `s` quoted for a message, cut to its first [`QUOTE_MAX`] bytes (at a
/// character boundary) if longer, which `...` then says.
pub fn quote(s: &str) -> String {
    if s.len() <= QUOTE_MAX {
        return format!("{s:?}");
    }
    let mut end = QUOTE_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}...", &s[..end])
}

/// The first [`QUOTE_MAX`] bytes of `bytes` quoted, what is not UTF-8 in
/// them shown as U+FFFD.
fn quote_bytes(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(QUOTE_MAX)];
    let text = String::from_utf8_lossy(head);
    if bytes.len() > QUOTE_MAX {
        format!("{text:?}...")
    } else {
        format!("{text:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line of `input`, read through a buffer of `capacity` bytes.
    fn lines(input: &[u8], capacity: usize) -> Vec<Line> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let reader = tokio::io::BufReader::with_capacity(capacity, input);
            let mut lines = Lines::new(reader);
            let mut all = Vec::new();
            while let Some(line) = lines.next().await.expect("no I/O error") {
                assert!(lines.kept.capacity() <= 2 * MAX_LINE, "kept too much");
                all.push(line);
            }
            all
        })
    }

    fn text(s: &str) -> Line {
        Line::Text(s.to_string())
    }

    #[test]
    fn lines_are_split_at_newlines_in_any_chunking() {
        let input = b"acquire a k o 0 1\r\n\nlast";
        for capacity in [1, 2, 3, 7, 64] {
            assert_eq!(
                lines(input, capacity),
                [text("acquire a k o 0 1"), text(""), text("last")],
                "capacity {capacity}"
            );
        }
        assert_eq!(lines(b"", 8), []);
    }

    #[test]
    fn a_line_that_is_not_utf8_is_bad_and_the_next_one_is_read() {
        let got = lines(b"\xff\xfe\xfd\nstats\n", 8);
        assert_eq!(
            got,
            [
                Line::Bad("not UTF-8: \"\u{fffd}\u{fffd}\u{fffd}\"".to_string()),
                text("stats")
            ]
        );
    }

    #[test]
    fn a_line_of_any_length_is_bad_and_only_its_start_is_kept_and_quoted() {
        let mut input = vec![b'Z'; 1 << 20];
        input.extend_from_slice(b"\nnext\n");
        let got = lines(&input, 8192);
        let [Line::Bad(message), next] = &got[..] else {
            panic!("{got:?}");
        };
        assert_eq!(next, &text("next"));
        assert!(
            message.starts_with("line too long: 1048576 bytes"),
            "{message}"
        );
        assert_eq!(message.matches('Z').count(), QUOTE_MAX, "{message}");
        // Exactly MAX_LINE bytes fit.
        let fits = vec![b'a'; MAX_LINE];
        assert_eq!(lines(&fits, 64), [text(&String::from_utf8(fits).unwrap())]);
    }

    #[test]
    fn quotes_are_cut_at_100_bytes_on_a_character_boundary() {
        assert_eq!(quote("tag"), "\"tag\"");
        let long = "é".repeat(80); // 160 bytes
        let q = quote(&long);
        assert_eq!(q, format!("{:?}...", "é".repeat(50)));
        assert_eq!(
            quote_bytes(&[b'a'; 101]),
            format!("{:?}...", "a".repeat(100))
        );
    }
}
