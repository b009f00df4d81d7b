//! The bodies of the cargo-fuzz targets, as library functions so that the
//! corpus can be replayed on stable by an ordinary test.
//!
//! * [`decode`]: the codec on arbitrary bytes in arbitrary chunks.
//! * [`client`]: a client core against the model server, driven by an
//!   arbitrary list of steps, with the invariant checker after every step.
//!
//! Both return an error instead of panicking; the fuzz targets panic on it.

use std::fmt;

use arbitrary::Unstructured;
use thiserror::Error;

use super::checker::InvariantViolation;
use super::run::{Runner, Setup, Step};
use crate::admin::{AdminReply, AdminRequest};
use crate::rng::Rng;
use crate::wire::{ClientFrame, FrameError, LineReader, ServerFrame, MAX_FRAME};

/// The most steps [`client`] runs from one input.
pub const MAX_STEPS: usize = 400;

/// A broken rule of the codec, found by [`decode`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("codec: {0}")]
pub struct DecodeFailure(pub String);

fn failure(detail: String) -> Result<(), DecodeFailure> {
    Err(DecodeFailure(detail))
}

/// What the stream must give, line by line, whatever the chunking.
enum Expected {
    /// A whole line: its start and its end (the `\n`'s offset).
    Line(usize, usize),
    /// The line starting here grows past 1024 bytes: the error must come
    /// while the chunk holding byte `start + 1024` is read.
    TooLong(usize),
}

/// Cuts `stream` into lines the simple way, as the reference.
fn reference(stream: &[u8]) -> (Vec<Expected>, Option<usize>) {
    let mut expected = Vec::new();
    let mut start = 0;
    while start < stream.len() {
        match stream[start..].iter().position(|&b| b == b'\n') {
            Some(len) if len < MAX_FRAME => {
                expected.push(Expected::Line(start, start + len));
                start += len + 1;
            }
            Some(_) => {
                expected.push(Expected::TooLong(start));
                return (expected, None);
            }
            None => {
                let len = stream.len() - start;
                if len > MAX_FRAME {
                    expected.push(Expected::TooLong(start));
                    return (expected, None);
                }
                return (expected, Some(len));
            }
        }
    }
    (expected, Some(0))
}

/// Feeds `data` through a [`LineReader`] in chunks derived from it, and
/// checks every rule of the codec on the way:
///
/// * the lines handed out are exactly the stream's lines, whatever the
///   chunking, and an over-long line fails while the chunk holding its byte
///   1025 is read, and keeps failing after;
/// * the reader never buffers more than 1024 bytes;
/// * every line that parses (as [`ServerFrame`] or [`ClientFrame`], or as
///   an administrative frame, [`AdminRequest`] or [`AdminReply`]) encodes
///   back to the same bytes, parses again to the same frame, displays as
///   itself, and has the shape of section 2 (printable, single spaces, at
///   most 1023 bytes).
///
/// The first two bytes seed the chunking; the rest is the stream.
pub fn decode(data: &[u8]) -> Result<(), DecodeFailure> {
    let (seed, stream) = match data {
        [a, b, rest @ ..] => (u64::from(u16::from_le_bytes([*a, *b])), rest),
        _ => (0, data),
    };
    let (expected, trailing) = reference(stream);
    let mut rng = Rng::new(seed);
    let mut reader = LineReader::new();
    let mut next = 0;
    let mut failed = false;
    let mut at = 0;
    while at < stream.len() {
        let size = match rng.up_to(4) {
            0 => 0,
            1 => 1 + rng.up_to(7) as usize,
            2 => 1 + rng.up_to(63) as usize,
            3 => 1 + rng.up_to(2047) as usize,
            _ => stream.len() - at,
        };
        let end = (at + size).min(stream.len());
        let mut input = &stream[at..end];
        while let Some(line) = reader.next_line(&mut input) {
            match line {
                Ok(line) => {
                    if failed {
                        return failure("a line handed out after LineTooLong".into());
                    }
                    let Some(Expected::Line(start, stop)) = expected.get(next) else {
                        return failure(format!(
                            "line {:?} handed out, expected entry {next} is not a line",
                            String::from_utf8_lossy(line)
                        ));
                    };
                    if line != &stream[*start..*stop] {
                        return failure(format!(
                            "line {:?} handed out, expected {:?}",
                            String::from_utf8_lossy(line),
                            String::from_utf8_lossy(&stream[*start..*stop])
                        ));
                    }
                    next += 1;
                    check_line(line)?;
                }
                Err(FrameError::LineTooLong) => {
                    if !failed {
                        let Some(Expected::TooLong(start)) = expected.get(next) else {
                            return failure(format!(
                                "LineTooLong in chunk {at}..{end}, but entry {next} is not too long"
                            ));
                        };
                        let byte_1025 = start + MAX_FRAME;
                        if !(at..end).contains(&byte_1025) {
                            return failure(format!(
                                "LineTooLong in chunk {at}..{end}, but byte 1025 of the line starting at {start} is at {byte_1025}"
                            ));
                        }
                        failed = true;
                        next = usize::MAX;
                    }
                    // It keeps failing: stop reading this chunk.
                    break;
                }
                Err(e) => return failure(format!("the reader gave {e:?}")),
            }
            if reader.buffered() > MAX_FRAME {
                return failure(format!("{} bytes buffered", reader.buffered()));
            }
        }
        if reader.buffered() > MAX_FRAME {
            return failure(format!("{} bytes buffered", reader.buffered()));
        }
        at = end;
        if failed {
            break;
        }
    }
    if failed {
        let mut more: &[u8] = b"x\n";
        if !matches!(
            reader.next_line(&mut more),
            Some(Err(FrameError::LineTooLong))
        ) {
            return failure("the reader recovered after LineTooLong".into());
        }
    } else {
        if next != expected.len() {
            return failure(format!(
                "{} of {} expected entries handed out",
                next,
                expected.len()
            ));
        }
        let trailing = trailing.unwrap_or(0);
        if reader.buffered() != trailing {
            return failure(format!(
                "{} bytes buffered at the end, the unfinished line has {trailing}",
                reader.buffered()
            ));
        }
    }
    // Every line, however long, parses without panicking; and the rules hold.
    for line in stream.split(|&b| b == b'\n') {
        check_line(line)?;
    }
    Ok(())
}

fn check_shape(line: &[u8], what: &str) -> Result<(), DecodeFailure> {
    let text = String::from_utf8_lossy(line);
    if line.len() >= MAX_FRAME {
        return failure(format!(
            "{what} parsed a line of {} bytes: {text:?}",
            line.len()
        ));
    }
    if line.iter().any(|b| !(0x20..=0x7e).contains(b)) {
        return failure(format!(
            "{what} parsed a line with a non-printable byte: {text:?}"
        ));
    }
    if line.first() == Some(&b' ')
        || line.last() == Some(&b' ')
        || line.windows(2).any(|w| w == b"  ")
    {
        return failure(format!(
            "{what} parsed a line with an empty field: {text:?}"
        ));
    }
    Ok(())
}

/// Checks one line against both parsers.
fn check_line(line: &[u8]) -> Result<(), DecodeFailure> {
    if let Ok(frame) = ServerFrame::parse(line) {
        check_frame(line, "ServerFrame", frame, ServerFrame::encode, |bytes| {
            ServerFrame::parse(bytes) == Ok(frame)
        })?;
    }
    if let Ok(frame) = ClientFrame::parse(line) {
        check_frame(line, "ClientFrame", frame, ClientFrame::encode, |bytes| {
            ClientFrame::parse(bytes) == Ok(frame)
        })?;
    }
    if let Ok(frame) = AdminRequest::parse(line) {
        check_admin(
            line,
            "AdminRequest",
            &frame,
            AdminRequest::encode,
            |bytes| AdminRequest::parse(bytes).as_ref() == Ok(&frame),
        )?;
    }
    if let Ok(frame) = AdminReply::parse(line) {
        check_admin(line, "AdminReply", &frame, AdminReply::encode, |bytes| {
            AdminReply::parse(bytes).as_ref() == Ok(&frame)
        })?;
    }
    Ok(())
}

/// Checks a `line` that parsed as an administrative `frame`: its shape,
/// and that it encodes to the line and parses back to itself.
fn check_admin<F: fmt::Debug>(
    line: &[u8],
    what: &str,
    frame: &F,
    encode: impl Fn(&F, &mut Vec<u8>),
    parses_back: impl Fn(&[u8]) -> bool,
) -> Result<(), DecodeFailure> {
    check_shape(line, &format!("{what}::parse"))?;
    let mut out = Vec::new();
    encode(frame, &mut out);
    if out.strip_suffix(b"\n") != Some(line) {
        return failure(format!(
            "{what} {frame:?} from {:?} encodes as {:?}",
            String::from_utf8_lossy(line),
            String::from_utf8_lossy(&out)
        ));
    }
    if !parses_back(line) {
        return failure(format!("{what} {frame:?} does not parse back"));
    }
    Ok(())
}

/// Checks a `line` that parsed as `frame` (a `what`): its shape, and that
/// the frame `encode`s to the line and a newline, parses back to itself
/// (`parses_back` of the encoding without its newline) and displays as the
/// line.
fn check_frame<F: fmt::Debug + fmt::Display>(
    line: &[u8],
    what: &str,
    frame: F,
    encode: impl Fn(&F, &mut Vec<u8>),
    parses_back: impl Fn(&[u8]) -> bool,
) -> Result<(), DecodeFailure> {
    check_shape(line, &format!("{what}::parse"))?;
    let mut expected = line.to_vec();
    expected.push(b'\n');
    let mut out = Vec::new();
    encode(&frame, &mut out);
    if out != expected {
        return failure(format!(
            "{what} {frame:?} from {:?} encodes as {:?}",
            String::from_utf8_lossy(line),
            String::from_utf8_lossy(&out)
        ));
    }
    if !parses_back(&out[..out.len() - 1]) {
        return failure(format!("{what} {frame:?} does not parse back"));
    }
    if frame.to_string().as_bytes() != line {
        return failure(format!("{what} {frame:?} displays as {frame}"));
    }
    Ok(())
}

/// Reads a run from bytes: a [`Setup`] ([`Setup::decode`]), then steps
/// ([`Step::decode`]) until the input is used up or [`MAX_STEPS`].
pub fn scenario(data: &[u8]) -> (Setup, Vec<Step>) {
    let mut u = Unstructured::new(data);
    let setup = Setup::decode(&mut u);
    let mut steps = Vec::new();
    while steps.len() < MAX_STEPS {
        match Step::decode(&mut u) {
            Some(step) => steps.push(step),
            None => break,
        }
    }
    (setup, steps)
}

/// The bytes [`scenario`] reads back as `setup` and `steps`: how corpus
/// files for the `client` target are written by hand.
pub fn encode_scenario(setup: &Setup, steps: &[Step]) -> Vec<u8> {
    let mut out = Vec::new();
    setup.encode(&mut out);
    for step in steps {
        step.encode(&mut out);
    }
    out
}

/// Runs the client against the model server as `data` says
/// ([`scenario`]), with the invariant checker after every step, then
/// settles and shuts down, twice, comparing the traces. Any broken
/// invariant is returned.
pub fn client(data: &[u8]) -> Result<(), InvariantViolation> {
    let (setup, steps) = scenario(data);
    Runner::run_twice(&setup, &steps).map(|_| ())
}

/// Why an entry of decisions broke a rule of its codec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("decisions: {0}")]
pub struct DecisionFailure(String);

/// Reads `data` as a replicated cluster's entry of decisions
/// ([`Decision::decode_entry`](crate::server::Decision::decode_entry)):
/// never a panic; the check a member makes of a peer's entries
/// ([`Decision::check_entry`](crate::server::Decision::check_entry)) gives
/// decoding's verdict; bytes that decode are the canonical encoding of what
/// they decode to (so a member that re-encodes an entry agrees with the
/// leader's bytes), and decoding that again gives the same decisions.
pub fn decisions(data: &[u8]) -> Result<(), DecisionFailure> {
    use crate::server::Decision;
    let decoded = Decision::decode_entry(data);
    if Decision::check_entry(data).is_ok() != decoded.is_ok() {
        return Err(DecisionFailure(format!(
            "{data:?}: checked {:?}, decoded {decoded:?}",
            Decision::check_entry(data)
        )));
    }
    let Ok(decisions) = decoded else {
        return Ok(());
    };
    let again = Decision::encode_entry(&decisions);
    if again != data {
        return Err(DecisionFailure(format!(
            "{data:?} decodes to {decisions:?}, which encodes to {again:?}"
        )));
    }
    match Decision::decode_entry(&again) {
        Ok(twice) if twice == decisions => Ok(()),
        other => Err(DecisionFailure(format!(
            "{decisions:?} encoded reads back as {other:?}"
        ))),
    }
}

/// Why a backup's file broke a rule of its codec.
#[cfg(feature = "raft")]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backup: {0}")]
pub struct BackupFailure(String);

/// Reads `data` as a backup's file
/// ([`Backup::decode`](crate::raft::Backup::decode)), which a restore
/// takes from wherever the operator kept it: never a panic; a backup that
/// reads encodes to bytes that read back as the same backup, every grant
/// of it possible at its index (so a restore's floor is above them all).
///
/// The bytes are read as they are, and again as the body of a file whose
/// checksum line is right, so that the fuzzer reaches the reading of
/// every field and not only the checksum.
#[cfg(feature = "raft")]
pub fn backup(data: &[u8]) -> Result<(), BackupFailure> {
    backup_reads_back(data)?;
    match core::str::from_utf8(data) {
        Ok(body) => backup_reads_back(&crate::server::seal(body.to_owned())),
        Err(_) => Ok(()),
    }
}

#[cfg(feature = "raft")]
fn backup_reads_back(data: &[u8]) -> Result<(), BackupFailure> {
    use crate::raft::Backup;
    let Ok(backup) = Backup::decode(data) else {
        return Ok(());
    };
    let limit = backup.floor.saturating_add(backup.index);
    if let Some(g) = backup
        .grants
        .iter()
        .find(|g| crate::server::epoch_of(g.token) > limit)
    {
        return Err(BackupFailure(format!("{g:?} is past the backup's index")));
    }
    match Backup::decode(&backup.encode()) {
        Ok(again) if again == backup => Ok(()),
        other => Err(BackupFailure(format!(
            "{backup:?} encoded reads back as {other:?}"
        ))),
    }
}
