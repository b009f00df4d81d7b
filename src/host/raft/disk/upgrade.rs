//! Directories written before segments had headers: read as they were
//! then, and upgraded to one segment with a header holding all of it
//! before anything is appended (see "Before headers" in [the module's
//! docs](super)).

use std::io;
use std::path::Path;

use prost::Message as _;
use raft::eraftpb::Entry;

use super::error::{io_error, DroppedTail, RaftDiskError};
use super::files::{open_file, read_at, segment_name, segment_path};
use super::read::{
    check_numbering, indices, read_snapshot_file, scan, torn_tail, Flow, Found, Replay, Scanned,
};
use super::{frame, index_of, ready_record, MAX_RECORD_LEN};
use crate::host::raft::record::{segment_image, Identity, FLAG_WHOLE, KIND_CONF};
use crate::host::state::{self, StateDir};

/// How many bytes of entries an upgrade puts in one record, at most
/// (unless one entry alone is more).
const UPGRADE_CHUNK: usize = 4 << 20;

/// Reads a directory from before headers as it was read then (a torn last
/// record of its newest segment dropped), and upgrades it: one segment
/// with a header holding all of it, written whole, then the old ones
/// removed. What was dropped is returned, to be said.
pub(super) fn upgrade(
    dir: &StateDir,
    member: u64,
    found: &Found,
) -> Result<Vec<DroppedTail>, RaftDiskError> {
    let mut replay = Replay::default();
    read_snapshot_file(dir, found, &mut replay)?;
    let in_file = replay.tail.base;
    check_numbering(dir, &found.segments)?;
    let mut dropped = Vec::new();
    for (i, &n) in found.segments.iter().enumerate() {
        let path = segment_path(dir, n);
        let file = open_file(&path, false)?;
        let end = file.metadata().map_err(io_error(&path))?.len();
        let mut top = 0;
        let scanned = scan(&path, &file, 0, end, |_, _, kind, payload| {
            replay.apply(kind, payload, &mut top).map(|()| Flow::Go)
        })?;
        if let Scanned::Bad { at, bad } = scanned {
            let newest = i + 1 == found.segments.len();
            let torn = if newest {
                torn_tail(&path, &file, at, end, bad)?
            } else {
                None
            };
            let Some(mut tail) = torn else {
                return Err(RaftDiskError::Corrupt {
                    path,
                    offset: at,
                    why: bad.why().to_string(),
                });
            };
            tail.witnessed = false;
            dropped.push(tail);
        }
    }
    let newest = *found.segments.last().expect("at least one segment");
    let corrupt = |why: String| RaftDiskError::Corrupt {
        path: segment_path(dir, found.segments[0]),
        offset: 0,
        why,
    };
    if replay.snapshot.is_none() && replay.conf.is_none() {
        return Err(corrupt(
            "neither a snapshot nor the first configuration".to_string(),
        ));
    }
    let commit = replay.hard_state.commit;
    if commit > replay.tail.last {
        return Err(corrupt(format!(
            "the log ends at index {}, before the hard state's commit {commit}: {}",
            replay.tail.last,
            indices(replay.tail.last + 1, commit)
        )));
    }
    let n = newest + 1;
    let path = segment_path(dir, n);
    let mut records = Vec::new();
    if let Some(conf) = &replay.conf {
        records.extend(frame(&path, KIND_CONF, conf.encoded_len(), |buf| {
            conf.encode_raw(buf)
        })?);
    }
    let leader_snapshot = replay.snapshot.as_ref().filter(|s| index_of(s) > in_file);
    for (i, chunk) in chunks(&replay.entries).into_iter().enumerate() {
        let first = i == 0;
        records.extend(ready_record(
            &path,
            first.then_some(&replay.hard_state),
            chunk,
            leader_snapshot.filter(|_| first),
        )?);
    }
    let identity = Identity {
        flags: FLAG_WHOLE,
        member,
        n,
    };
    let (image, _) = segment_image(identity, &records, replay.tail.last, commit, 0);
    dir.write_durably(&segment_name(n), &image)?;
    for &old in &found.segments {
        state::remove_if_there(&segment_path(dir, old))?;
    }
    dir.sync_dir()?;
    Ok(dropped)
}

/// `entries` in runs of about [`UPGRADE_CHUNK`] bytes (at least one run,
/// maybe empty).
fn chunks(entries: &[Entry]) -> Vec<&[Entry]> {
    let mut runs = Vec::new();
    let (mut from, mut bytes) = (0, 0);
    for (i, entry) in entries.iter().enumerate() {
        let len = prost::encoding::message::encoded_len(2, entry);
        if i > from && bytes + len > UPGRADE_CHUNK {
            runs.push(&entries[from..i]);
            (from, bytes) = (i, 0);
        }
        bytes += len;
    }
    runs.push(&entries[from..]);
    runs
}

/// Whether the file at `path` is a segment from before headers: it begins
/// with a record's length (at most [`MAX_RECORD_LEN`]), where a segment
/// with a header begins with [`SEGMENT_MAGIC`](super::SEGMENT_MAGIC),
/// whose first four bytes are more. A file too short to tell is not.
pub(super) fn is_bare(path: &Path) -> Result<bool, RaftDiskError> {
    let file = open_file(path, false)?;
    let mut first = [0; 4];
    match read_at(&file, &mut first, 0) {
        Ok(()) => Ok(u64::from(u32::from_le_bytes(first)) <= MAX_RECORD_LEN),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(io_error(path)(e)),
    }
}
