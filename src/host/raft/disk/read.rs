//! What a start reads back: the directory's Raft files listed
//! ([`survey`]), a segment's header and its witness ([`read_header`]), its
//! records replayed and held to that witness ([`read_segment`], [`scan`],
//! [`Replay`]), the tail it may cut off ([`torn_tail`]), the snapshot file,
//! and a compaction's next segment put in place ([`adopt_pending`]).

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use prost::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

use super::error::{io_error, DroppedTail, RaftDiskError, Torn};
use super::files::{open_file, read_at, segment_name, segment_number, segment_path};
use super::{index_of, SEGMENT_HEADER_LEN, SNAPSHOT_FILE};
use crate::host::raft::record::{
    read_one, Bad, Identity, Read1, ReadyRecord, Seal, Witness, IDENTITY_LEN, KIND_CONF,
    KIND_READY, KIND_SEAL, KIND_SNAPSHOT, RECORD_HEADER_LEN, SLOT_AT, SLOT_LEN,
};
use crate::host::state::{self, StateDir};

/// A segment's header as read.
pub(super) struct Header {
    pub(super) identity: Identity,
    /// The witness, and the slot it is in.
    pub(super) witness: Witness,
    pub(super) slot: usize,
}

/// Reads the header of the segment `file` (at `path`): its identity, and
/// the slot with the greater sequence number of those that read whole.
pub(super) fn read_header(path: &Path, file: &File) -> Result<Header, RaftDiskError> {
    let corrupt = |offset, why: String| RaftDiskError::Corrupt {
        path: path.to_path_buf(),
        offset,
        why,
    };
    let len = file.metadata().map_err(io_error(path))?.len();
    if len < SEGMENT_HEADER_LEN {
        return Err(corrupt(
            0,
            format!("{len} bytes, shorter than a segment's header ({SEGMENT_HEADER_LEN})"),
        ));
    }
    let mut identity = [0; IDENTITY_LEN];
    read_at(file, &mut identity, 0).map_err(io_error(path))?;
    let identity = Identity::decode(&identity)
        .map_err(|why| corrupt(0, format!("a segment header that cannot be read: {why}")))?;
    let mut best: Option<(Witness, usize)> = None;
    for (slot, at) in SLOT_AT.into_iter().enumerate() {
        let mut bytes = [0; SLOT_LEN];
        read_at(file, &mut bytes, at).map_err(io_error(path))?;
        if let Some(witness) = Witness::decode(&bytes) {
            if best.map_or(true, |(b, _)| witness.seq > b.seq) {
                best = Some((witness, slot));
            }
        }
    }
    let (witness, slot) = best.ok_or_else(|| {
        corrupt(
            SLOT_AT[0],
            "neither witness slot reads whole (both torn or damaged), so what was synced is not known"
                .to_string(),
        )
    })?;
    Ok(Header {
        identity,
        witness,
        slot,
    })
}

/// What [`read_segment`] read.
pub(super) struct SegmentRead {
    /// Where what is kept ends.
    pub(super) len: u64,
    /// The greatest index in it.
    pub(super) top: u64,
    /// The tail to cut off (the newest segment's only).
    pub(super) dropped: Option<DroppedTail>,
}

/// Reads the records of segment `n` into `replay`, holding them to its
/// witness `w`: they must reach its length, ending a record there, and
/// agree with it there; past it only the newest segment may go on, with
/// records that read whole or a tail that cannot be read (to be cut off).
pub(super) fn read_segment(
    path: &Path,
    file: &File,
    n: u64,
    w: &Witness,
    newest: bool,
    replay: &mut Replay,
) -> Result<SegmentRead, RaftDiskError> {
    let corrupt = |offset, why: String| RaftDiskError::Corrupt {
        path: path.to_path_buf(),
        offset,
        why,
    };
    let end = file.metadata().map_err(io_error(path))?.len();
    let mut top = 0;
    let mut checked = false;
    let mut seal_end = None;
    let scanned = scan(
        path,
        file,
        SEGMENT_HEADER_LEN,
        end,
        |at, next, kind, payload| {
            if at == w.len {
                replay.agrees(w)?;
                checked = true;
            }
            if at < w.len && next > w.len {
                return Err(format!(
                    "a record reaching past byte {}, where its witness says what was synced ends",
                    w.len
                ));
            }
            if seal_end.is_some() {
                return Err("a record after the segment's seal".to_string());
            }
            if kind != KIND_SEAL {
                replay.apply(kind, payload, &mut top)?;
                return Ok(Flow::Go);
            }
            if newest && !w.sealed && at >= w.len {
                // Written, and the compaction stopped before its slot: the
                // segment is still the one appended to.
                return Ok(Flow::Stop);
            }
            let seal = Seal::decode(payload)?;
            let last = replay.tail.last;
            if seal.closes != at || seal.next != n + 1 || last != seal.last.max(replay.tail.base) {
                return Err(format!(
                "a seal that does not close what precedes it (it closes {} bytes up to index {}, then {}; read: {at} bytes up to index {last}, then {})",
                seal.closes,
                seal.last,
                segment_name(seal.next),
                segment_name(n + 1),
            ));
            }
            seal_end = Some(next);
            Ok(Flow::Go)
        },
    )?;
    let (len, dropped) = match scanned {
        Scanned::End => (end, None),
        Scanned::Stopped(at) => {
            let dropped = DroppedTail {
                path: path.to_path_buf(),
                offset: at,
                bytes: end - at,
                records: 1,
                what: Torn::Seal,
                witnessed: true,
            };
            (at, Some(dropped))
        }
        Scanned::Bad { at, bad } => {
            let torn = if newest && at >= w.len {
                torn_tail(path, file, at, end, bad)?
            } else {
                None
            };
            let Some(dropped) = torn else {
                let why = if at < w.len {
                    format!(
                        "{}, before byte {}, where its witness says what was synced ends: {}",
                        bad.why(),
                        w.len,
                        replay.missing(w)
                    )
                } else if newest {
                    format!("{}, and more than zeros after it", bad.why())
                } else {
                    bad.why().to_string()
                };
                return Err(corrupt(at, why));
            };
            (at, Some(dropped))
        }
    };
    if len < w.len {
        return Err(corrupt(
            len,
            format!(
                "the segment ends here, before byte {}, where its witness says what was synced ends: {}",
                w.len,
                replay.missing(w)
            ),
        ));
    }
    if !checked {
        replay.agrees(w).map_err(|why| corrupt(w.len, why))?;
    }
    if w.sealed && (seal_end != Some(w.len) || len != w.len) {
        return Err(corrupt(
            w.len,
            "its witness says it is sealed here, but no seal ends here, or more follows"
                .to_string(),
        ));
    }
    if !w.sealed && !newest {
        return Err(corrupt(
            w.len,
            "never sealed, by its witness, though a segment follows it".to_string(),
        ));
    }
    Ok(SegmentRead { len, top, dropped })
}

/// The tail from `at` to `end` of the newest segment of a directory, to be
/// cut off if it can only be a write a crash tore: a record cut short, a
/// last record failing its checksum, or zeros. `None` if it is anything
/// else.
pub(super) fn torn_tail(
    path: &Path,
    file: &File,
    at: u64,
    end: u64,
    bad: Bad,
) -> Result<Option<DroppedTail>, RaftDiskError> {
    let (what, records) = if zeros_from(file, at).map_err(io_error(path))? {
        (Torn::Zeros, 0)
    } else {
        match bad {
            Bad::CutShort => (Torn::CutShort, 0),
            Bad::Checksum { to_end: true } => (Torn::BadChecksum, 1),
            Bad::Checksum { to_end: false } | Bad::TooLong => return Ok(None),
        }
    };
    Ok(Some(DroppedTail {
        path: path.to_path_buf(),
        offset: at,
        bytes: end - at,
        records,
        what,
        witnessed: true,
    }))
}

/// Reads the snapshot file into `replay`, if there is one; returns its
/// length.
pub(super) fn read_snapshot_file(
    dir: &StateDir,
    found: &Found,
    replay: &mut Replay,
) -> Result<u64, RaftDiskError> {
    if !found.snapshot {
        return Ok(0);
    }
    let path = dir.path().join(SNAPSHOT_FILE);
    let file = open_file(&path, false)?;
    let end = file.metadata().map_err(io_error(&path))?.len();
    let mut snapshot = None;
    let scanned = scan(&path, &file, 0, end, |_, _, kind, payload| {
        if kind != KIND_SNAPSHOT || snapshot.is_some() {
            return Err("not a single snapshot record".to_string());
        }
        snapshot = Some(Snapshot::decode(payload).map_err(|e| e.to_string())?);
        Ok(Flow::Go)
    })?;
    if let Scanned::Bad { at, bad } = scanned {
        return Err(RaftDiskError::Corrupt {
            path,
            offset: at,
            why: bad.why().to_string(),
        });
    }
    let snapshot = snapshot.ok_or_else(|| RaftDiskError::Corrupt {
        path: path.clone(),
        offset: 0,
        why: "no snapshot record".to_string(),
    })?;
    replay.tail.base = index_of(&snapshot);
    replay.tail.last = replay.tail.base;
    replay.snapshot = Some(snapshot);
    Ok(end)
}

/// Segments must be numbered with no gap.
pub(super) fn check_numbering(dir: &StateDir, numbers: &[u64]) -> Result<(), RaftDiskError> {
    for pair in numbers.windows(2) {
        if pair[0] + 1 != pair[1] {
            return Err(RaftDiskError::Corrupt {
                path: segment_path(dir, pair[0] + 1),
                offset: 0,
                why: format!(
                    "missing, between {} and {}",
                    segment_name(pair[0]),
                    segment_name(pair[1])
                ),
            });
        }
    }
    Ok(())
}

/// If the newest segment is sealed and the next one's temporary is there,
/// a compaction stopped between the seal and the rename: the temporary was
/// synced (and its name) before the seal, so it is checked and put in
/// place. Whether it was.
pub(super) fn adopt_pending(
    dir: &StateDir,
    member: u64,
    newest: u64,
    found: &Found,
) -> Result<bool, RaftDiskError> {
    let next = newest + 1;
    if !found.pending.contains(&next) {
        return Ok(false);
    }
    let path = segment_path(dir, newest);
    let witness = read_header(&path, &open_file(&path, false)?)?.witness;
    if !witness.sealed {
        return Ok(false);
    }
    let name = segment_name(next);
    let tmp = dir.tmp_path(&name);
    let file = open_file(&tmp, false)?;
    let header = read_header(&tmp, &file)?;
    let len = file.metadata().map_err(io_error(&tmp))?.len();
    let Identity { member: of, n, .. } = header.identity;
    if of != member || n != next || header.witness.len != len {
        return Err(RaftDiskError::Corrupt {
            path: tmp,
            offset: 0,
            why: format!(
                "the next segment as a compaction wrote it before sealing {}, but not whole, or not {name} of member {member}",
                segment_name(newest)
            ),
        });
    }
    dir.put_in_place(&name)?;
    Ok(true)
}

/// `from..=to`, as indices missing.
pub(super) fn indices(from: u64, to: u64) -> String {
    if from == to {
        format!("index {from} missing")
    } else {
        format!("indices {from}..={to} missing")
    }
}

/// Where the log stands: the latest snapshot's index, and the last
/// index (the snapshot's if no entry follows it).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Tail {
    pub(super) base: u64,
    pub(super) last: u64,
}

impl Tail {
    /// A snapshot received: the log emptied.
    pub(super) fn snapshot(&mut self, index: u64) {
        self.base = self.base.max(index);
        self.last = self.base;
    }

    /// Entries appended, if they are contiguous and leave no gap.
    pub(super) fn entries(&mut self, entries: &[Entry]) -> Result<(), &'static str> {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(());
        };
        if first.index == 0 {
            return Err("an entry at index 0");
        }
        if first.index > self.last + 1 {
            return Err("entries that leave a gap after the log");
        }
        if entries.windows(2).any(|w| w[1].index != w[0].index + 1) {
            return Err("entries whose indexes do not follow one another");
        }
        self.last = self.base.max(last.index);
        Ok(())
    }

    /// A snapshot of the node's own: the log before it dropped.
    pub(super) fn compact(&mut self, index: u64) {
        self.base = self.base.max(index);
        self.last = self.last.max(self.base);
    }
}

/// What a start has read so far.
#[derive(Default)]
pub(super) struct Replay {
    pub(super) tail: Tail,
    pub(super) hard_state: HardState,
    pub(super) conf: Option<ConfState>,
    pub(super) snapshot: Option<Snapshot>,
    /// Indexes `tail.base + 1 ..= tail.last`.
    pub(super) entries: Vec<Entry>,
}

impl Replay {
    /// Applies one record of a segment; `top` is raised to the greatest
    /// index in it.
    pub(super) fn apply(&mut self, kind: u8, payload: &[u8], top: &mut u64) -> Result<(), String> {
        match kind {
            KIND_CONF => {
                self.conf = Some(ConfState::decode(payload).map_err(|e| e.to_string())?);
            }
            KIND_READY => {
                let ready = ReadyRecord::decode(payload).map_err(|e| e.to_string())?;
                if let Some(snapshot) = ready.snapshot.filter(|s| index_of(s) > 0) {
                    let index = index_of(&snapshot);
                    *top = (*top).max(index);
                    if index > self.tail.base {
                        self.snapshot = Some(snapshot);
                    }
                    self.tail.snapshot(index);
                    self.entries.clear();
                }
                if let (Some(first), Some(last)) = (ready.entries.first(), ready.entries.last()) {
                    let (first, last) = (first.index, last.index);
                    self.tail.entries(&ready.entries)?;
                    *top = (*top).max(last);
                    let base = self.tail.base;
                    let keep = first.saturating_sub(base + 1) as usize;
                    self.entries.truncate(keep);
                    self.entries
                        .extend(ready.entries.into_iter().filter(|e| e.index > base));
                }
                if let Some(hard_state) = ready.hard_state {
                    self.hard_state = hard_state;
                }
            }
            other => return Err(format!("a record of unknown kind {other}")),
        }
        Ok(())
    }

    /// Whether what was read agrees with the witness `w`, read where it
    /// says what was synced ends: the same commit, and the same last index
    /// (or the snapshot's, if a snapshot taken since covers it: a start
    /// reads from the latest snapshot, where the writer had an older one).
    fn agrees(&self, w: &Witness) -> Result<(), String> {
        let (last, commit) = (self.tail.last, self.hard_state.commit);
        if last == w.last.max(self.tail.base) && commit == w.commit {
            return Ok(());
        }
        Err(format!(
            "what was read up to here (last index {last}, commit {commit}) is not what its witness says was synced (last index {}, commit {}): {}",
            w.last,
            w.commit,
            self.missing(w)
        ))
    }

    /// What is missing from what was read so far, by the witness `w`.
    fn missing(&self, w: &Witness) -> String {
        let have = self.tail.last;
        if w.last > have {
            indices(have + 1, w.last)
        } else {
            format!(
                "no index past {have} missing, but what was synced with them (a hard state with commit {}) is",
                w.commit
            )
        }
    }
}

/// Whether [`scan`] goes on after a record.
pub(super) enum Flow {
    Go,
    /// Stop before this record.
    Stop,
}

/// Where [`scan`] stopped.
pub(super) enum Scanned {
    /// At the end: every record read.
    End,
    /// Where it was told to.
    Stopped(u64),
    /// At a record that cannot be read.
    Bad { at: u64, bad: Bad },
}

/// Reads the records of `file` from `from` to `end`, handing each to
/// `each` with its offset and where it ends, until it says to stop, a
/// record cannot be read, or the end. What `each` refuses is
/// [`RaftDiskError::Corrupt`] at that record.
pub(super) fn scan(
    path: &Path,
    file: &File,
    from: u64,
    end: u64,
    mut each: impl FnMut(u64, u64, u8, &[u8]) -> Result<Flow, String>,
) -> Result<Scanned, RaftDiskError> {
    let mut reader = BufReader::new(file);
    reader.seek(SeekFrom::Start(from)).map_err(io_error(path))?;
    let mut at = from;
    while at < end {
        match read_one(&mut reader, end - at).map_err(io_error(path))? {
            Read1::Record { kind, payload } => {
                let next = at + RECORD_HEADER_LEN + payload.len() as u64;
                let flow =
                    each(at, next, kind, &payload).map_err(|why| RaftDiskError::Corrupt {
                        path: path.to_path_buf(),
                        offset: at,
                        why,
                    })?;
                match flow {
                    Flow::Go => at = next,
                    Flow::Stop => return Ok(Scanned::Stopped(at)),
                }
            }
            Read1::Bad(bad) => return Ok(Scanned::Bad { at, bad }),
        }
    }
    Ok(Scanned::End)
}

/// Whether only zeros follow `at` in `file` (what a crash may leave past
/// a file's last write).
fn zeros_from(file: &File, at: u64) -> io::Result<bool> {
    let mut reader = BufReader::new(file);
    reader.seek(SeekFrom::Start(at))?;
    let mut chunk = [0; 8192];
    loop {
        match reader.read(&mut chunk)? {
            0 => return Ok(true),
            n if chunk[..n].iter().any(|&b| b != 0) => return Ok(false),
            _ => {}
        }
    }
}

/// The Raft files of a directory.
pub(super) struct Found {
    pub(super) snapshot: bool,
    /// Segment numbers, in order.
    pub(super) segments: Vec<u64>,
    /// Segments written under their temporary name (`raft-log.<n>.tmp`),
    /// which a start may have to put in place.
    pub(super) pending: Vec<u64>,
}

impl Found {
    pub(super) fn any(&self, dir: &Path) -> Option<PathBuf> {
        match (self.snapshot, self.segments.first()) {
            (true, _) => Some(dir.join(SNAPSHOT_FILE)),
            (false, Some(&n)) => Some(dir.join(segment_name(n))),
            (false, None) => None,
        }
    }

    /// Removes the segments' temporaries that were not put in place.
    pub(super) fn remove_pending(&self, dir: &StateDir) -> Result<(), RaftDiskError> {
        for &n in &self.pending {
            state::remove_if_there(&dir.tmp_path(&segment_name(n)))?;
        }
        Ok(())
    }
}

/// Lists the Raft files of `dir`, removing the temporaries a failed write
/// left but the segments' (which a start may have to put in place).
pub(super) fn survey(dir: &Path) -> Result<Found, RaftDiskError> {
    let mut found = Found {
        snapshot: false,
        segments: Vec::new(),
        pending: Vec::new(),
    };
    let listing = std::fs::read_dir(dir).map_err(io_error(dir))?;
    for entry in listing {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(tmp) = name.strip_suffix(".tmp") {
            if let Some(n) = segment_number(tmp) {
                found.pending.push(n);
            } else if name.starts_with("raft-") {
                state::remove_if_there(&dir.join(name))?;
            }
        } else if name == SNAPSHOT_FILE {
            found.snapshot = true;
        } else if let Some(n) = segment_number(name) {
            found.segments.push(n);
        }
    }
    found.segments.sort_unstable();
    Ok(found)
}
