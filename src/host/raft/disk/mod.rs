//! The durable Raft state of one member of a replicated cluster (feature
//! `raft`, PROTOCOL.md 4.3), kept in its state directory: its hard state
//! (term, vote, commit), its log, and its latest snapshot, synced before
//! anything that depends on them is sent; and whose they are, the member's
//! Raft id and, once it is known, its cluster's identity.
//!
//! The Raft node keeps its log in memory; once per raft-rs `Ready` it hands
//! [`RaftDisk::persist`] what that `Ready` made (a [`Persist`]), and sends
//! nothing that depends on it (a vote, an acknowledgement) until that
//! returns. A start reads everything back with [`RaftDisk::open`]
//! ([`Restored`]).
//!
//! # On disk
//!
//! Beside the state directory's `lock` ([`StateDir`]: one process, `0700`,
//! files `0600`, nothing followed):
//!
//! - `raft-log.<n>`, the log segments, `n` counting up with no gap: a
//!   header, then records appended one after another. Segment 0 begins
//!   with the cluster's first configuration; every later one begins with
//!   the hard state at the time it was started, so that the ones before it
//!   can go. Every segment but the newest ends with a seal.
//! - `raft-snapshot`: the latest snapshot the node took of its own applied
//!   state ([`RaftDisk::compact`]), one record (no header: it is written
//!   whole or not at all).
//!
//! A segment's header fills its first three pages of 4096 bytes, one part
//! to a page, so that rewriting one part never rewrites another's page
//! (integers little-endian):
//!
//! | at | what |
//! |---|---|
//! | 0 | its identity, written once: [`SEGMENT_MAGIC`], the format's version (`u32`, 1), flags (`u32`; 1: it holds the whole log, see "Before headers"), the member's Raft id (`u64`), the segment's number (`u64`), a CRC-32 of these (`u32`) |
//! | 4096, 8192 | two witness slots, each: a sequence number (`u64`), how many bytes of the segment were synced (`u64`, counted from its start), the log's last index (`u64`) and the hard state's commit (`u64`) then, the cluster's identity (`u128`, 0 while unknown), whether the segment is sealed (one byte, then 11 of zeros), a CRC-32 of these (`u32`) |
//! | 12288 | the records |
//!
//! Of the two slots, the one with the greater sequence number whose CRC
//! matches is the segment's *witness*: what was synced, kept apart from
//! the bytes it vouches for.
//!
//! A record is a header of 9 bytes, then its payload: the payload's length
//! (`u32`, at most [`MAX_RECORD_LEN`]), a CRC-32 (IEEE) of the length, the
//! kind and the payload (`u32`), and its kind (one byte: a configuration,
//! a `Ready`, a snapshot, a seal). Payloads are prost messages of raft-rs's
//! own types (`raft::eraftpb`); a `Ready`'s is a message of three fields
//! (1: its hard state, 2: its entries, 3: a snapshot received from the
//! leader); a seal's is three `u64`s: the bytes of the segment before it,
//! the log's last index then, and the number of the segment that follows.
//!
//! # Syncs
//!
//! - [`RaftDisk::persist`]: its record written at the end of the newest
//!   segment, then the slot the latest sync did not write (the sequence
//!   number one more, the segment's length with the record, the last index
//!   and commit after it), then one `fdatasync`; only then is the `Ready`
//!   acknowledged. A crash before the sync returns may leave the record
//!   whole, cut or absent, and the slot new, old or torn; a torn slot
//!   fails its CRC, so the other one, the previous sync's, is the witness.
//! - [`RaftDisk::compact`]: the snapshot written whole or not at all (a
//!   temporary file created anew, synced, renamed, the directory synced),
//!   so that the log before it may go. Then the next segment, which begins
//!   with the hard state (the older ones may be the only ones to hold it),
//!   written to its temporary, synced, and the directory synced; then the
//!   newest segment sealed (a seal record, and a slot saying sealed: one
//!   `fdatasync`); then the next segment renamed into place and the
//!   directory synced, before anything is appended to it; then the oldest
//!   segments whose every entry is at or below the snapshot removed,
//!   oldest first, and the directory synced once more. A crash at any
//!   point leaves what a start reads whole: the older snapshot and every
//!   segment, or the newer one and segments some of whose entries it
//!   already holds (a start drops those); and a sealed newest segment only
//!   with the next one's temporary beside it, synced, which the start puts
//!   in place.
//! - [`RaftDisk::open`] of a new cluster: segment 0 written whole or not
//!   at all, as the snapshot is. Of an existing one: an unsynced tail cut
//!   off (see below) and the cut synced, and a directory from before
//!   headers upgraded, before anything is appended.
//!
//! # Reading back
//!
//! A start begins from the snapshot file and applies every record in
//! order: a hard state replaces the one before; entries starting at index
//! `i` replace `i` and everything after it, and are kept only above the
//! latest snapshot; a snapshot received from the leader empties the log
//! and, if it is later than the latest one, becomes it.
//!
//! Nothing synced is dropped. A segment's records must reach its witness's
//! length, ending a record there, and what they hold up to there must be
//! what the witness says (its last index, its commit; its seal). Past it,
//! in the newest segment only, records that read whole are kept (written,
//! and the process died before their slot), and a tail that cannot be read
//! is cut off and said ([`RaftDisk::dropped`]): a record cut short, a last
//! record failing its checksum, zeros, or a seal whose slot never said it.
//! Anything else stops the start ([`RaftDiskError::Corrupt`], naming the
//! file, the offset, and the indices missing): a segment that ends before
//! its witness's length, a damaged record before it, records that
//! disagree with their witness, no readable slot, a header that cannot be
//! read, a gap in the segments or in the log, an older segment not sealed
//! as its witness says, a newest one sealed (the next one is missing), a
//! log that ends before the hard state's commit. A member that forgot its
//! votes could elect two leaders in one term, and one that forgot entries
//! it acknowledged could help undo a commit. After a power loss the slot's
//! page may have reached the disk and the record's not: that start is
//! refused too, never silent.
//!
//! A state directory is one member's: the headers record its Raft id, and
//! a start as another member is refused ([`RaftDiskError::NotMine`]). The
//! cluster's identity, from the [`Persist`] that carries it on, is in
//! every slot written and every segment begun, and read back as
//! [`Restored::cluster`].
//!
//! # Before headers
//!
//! A directory written before segments had headers (no witness, no member
//! id) is read as it was then, a torn last record of the newest segment
//! dropped (and said); it becomes the member's it is started as, and is
//! upgraded before anything is appended: one new segment numbered after
//! the old ones holds everything they held (the first configuration, a
//! leader's snapshot later than the snapshot file, the hard state, every
//! entry), flagged as holding the whole log, written whole (temporary,
//! sync, rename, directory sync); then the old segments are removed,
//! oldest first, and the directory synced. A start that finds old
//! segments before such a one finishes their removal; one that finds only
//! old ones upgrades them again.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use prost::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use thiserror::Error;

use super::record::{
    read_one, segment_image, Bad, Identity, Read1, ReadyRecord, Seal, TooLarge, Witness,
    FLAG_WHOLE, IDENTITY_LEN, KIND_CONF, KIND_READY, KIND_SEAL, KIND_SNAPSHOT, RECORD_HEADER_LEN,
    SEAL_LEN, SLOT_AT, SLOT_LEN,
};
pub use super::record::{MAX_RECORD_LEN, SEGMENT_HEADER_LEN, SEGMENT_MAGIC};
use crate::host::state::{self, StateDir, StateError};
use crate::server::raft::ClusterId;

/// The latest snapshot's file name in the state directory.
pub const SNAPSHOT_FILE: &str = "raft-snapshot";

/// What the log segments' file names begin with (`raft-log.0`, ...).
pub const LOG_PREFIX: &str = "raft-log.";

/// How many bytes of entries an upgrade puts in one record, at most
/// (unless one entry alone is more).
const UPGRADE_CHUNK: usize = 4 << 20;

pub use crate::server::raft::{Persist, Restored};

/// How a member starts on its state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Start {
    /// The very first start of a new cluster: the directory must hold no
    /// Raft state, and segment 0 is written with the first configuration.
    NewCluster,
    /// A start of a member of an existing cluster: the directory must hold
    /// this member's Raft state, readable whole.
    Existing,
}

/// The Raft state in a state directory, held (locked) while this lives.
#[derive(Debug)]
pub struct RaftDisk {
    dir: StateDir,
    /// The member's Raft id, in every segment's header.
    member: u64,
    /// The cluster's identity, once recorded.
    cluster: Option<ClusterId>,
    /// Oldest first; the last is the one appended to.
    segments: Vec<Segment>,
    /// The newest segment, open for reading and writing (written at
    /// offsets, never through its cursor).
    log: File,
    /// The newest segment's witness as last synced, and which slot holds
    /// it: the next sync writes the other.
    witness: Witness,
    slot: usize,
    /// Bytes in the snapshot file (0 if there is none).
    snapshot_len: u64,
    /// Where the log stands, to refuse what would not read back.
    tail: Tail,
    /// The latest hard state, as persisted: a new segment begins with it.
    hard_state: HardState,
    /// The tails the start cut off.
    dropped: Vec<DroppedTail>,
    /// A write or a sync failed: what the newest segment holds is not
    /// known, so nothing more is written.
    failed: bool,
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    n: u64,
    len: u64,
    /// The greatest index of an entry or snapshot in it (0: none).
    top: u64,
}

/// What went wrong with the Raft state. Each names its file or directory.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RaftDiskError {
    /// The state directory or one of its files: held by another process,
    /// open to others, not a regular file, or a failed write (see
    /// [`StateError`]).
    #[error(transparent)]
    State(#[from] StateError),
    /// Reading, writing or syncing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// A new cluster was asked for on a directory that holds Raft state.
    #[error("{path}: holds Raft state already ({found}); a new cluster begins only on state directories with none, so refusing to start one here")]
    NotEmpty {
        /// The directory.
        path: PathBuf,
        /// A Raft file in it.
        found: PathBuf,
    },
    /// A member of an existing cluster was asked for on a directory that
    /// holds no Raft state.
    #[error("{path}: holds no Raft state, and the cluster is not new; refusing to start a member that forgot its votes (it could elect two leaders in one term)")]
    NoState {
        /// The directory.
        path: PathBuf,
    },
    /// The directory holds another member's Raft state.
    #[error("{path}: this state directory is member {recorded}'s; refusing to start it as member {member}")]
    NotMine {
        /// The directory.
        path: PathBuf,
        /// The member its segments were written for.
        recorded: u64,
        /// The member it was to be started as.
        member: u64,
    },
    /// What is on disk cannot be read whole.
    #[error("{path}: at byte {offset}: {why}; refusing to start from Raft state that cannot be read whole (a member that forgot its votes could elect two leaders in one term, one that forgot entries it acknowledged could help undo a commit)")]
    Corrupt {
        /// The file (or the directory, for what is missing from it).
        path: PathBuf,
        /// Where in it.
        offset: u64,
        /// What is wrong.
        why: String,
    },
    /// A record would be longer than [`MAX_RECORD_LEN`]: nothing written.
    #[error(
        "{path}: a record of {len} bytes, more than the {max} a record may hold; nothing written"
    )]
    TooLarge {
        /// The file it was for.
        path: PathBuf,
        /// Its payload's length.
        len: u64,
        /// [`MAX_RECORD_LEN`].
        max: u64,
    },
    /// What was to be written would not read back as a log (entries that
    /// leave a gap, a commit past the last entry, a snapshot without its
    /// configuration, another cluster's identity): nothing written.
    #[error("{path}: {why}; nothing written")]
    Refused {
        /// The file it was for.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An earlier write or sync failed: what the file holds is not known,
    /// so nothing more is written to it.
    #[error("{path}: an earlier write or sync failed, so what it holds is not known; nothing more is written until a start reads it again")]
    Failed {
        /// The newest segment.
        path: PathBuf,
    },
}

/// A tail cut off the newest segment at start: bytes that were never
/// synced (a write a crash tore, never acknowledged). Said, never silent:
/// its `Display` is a line for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DroppedTail {
    /// The segment.
    pub path: PathBuf,
    /// Where the tail began.
    pub offset: u64,
    /// Its length.
    pub bytes: u64,
    /// The whole records it held (a record cut short is none).
    pub records: u64,
    /// What it was.
    pub what: Torn,
    /// Whether a witness said where what was synced ends (else the segment
    /// is from before headers, and only its last record could go).
    pub witnessed: bool,
}

/// What a [`DroppedTail`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Torn {
    /// A record cut short: a write cut by a crash.
    CutShort,
    /// A whole last record failing its checksum: a write torn by a crash.
    BadChecksum,
    /// Zeros, what a crash may leave past a file's last write.
    Zeros,
    /// A seal that its slot never said: a compaction cut short, which a
    /// later one does again.
    Seal,
}

impl fmt::Display for Torn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Torn::CutShort => "a record cut short",
            Torn::BadChecksum => "a whole record failing its checksum",
            Torn::Zeros => "zeros",
            Torn::Seal => "a seal whose compaction was cut short",
        })
    }
}

impl fmt::Display for DroppedTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let DroppedTail {
            path,
            offset,
            bytes,
            what,
            ..
        } = self;
        let path = path.display();
        if self.witnessed {
            write!(
                f,
                "{path}: dropped {bytes} bytes at offset {offset} beyond what was synced ({what})"
            )
        } else {
            write!(
                f,
                "{path}: dropped {bytes} bytes at offset {offset}, a torn last record of a segment from before segments recorded what was synced ({what})"
            )
        }
    }
}

impl RaftDisk {
    /// Opens `dir` (a [`StateDir`]: locked for the process's life,
    /// private) for `member`, the Raft id this node starts as.
    ///
    /// [`Start::NewCluster`]: the directory must hold no Raft state
    /// ([`RaftDiskError::NotEmpty`]); segment 0 is written with
    /// `ConfState { voters }`, and an empty [`Restored`] with that
    /// configuration is returned.
    ///
    /// [`Start::Existing`]: a directory without Raft state
    /// ([`RaftDiskError::NoState`]), another member's
    /// ([`RaftDiskError::NotMine`]), or one whose state cannot be read
    /// whole ([`RaftDiskError::Corrupt`], ...) is refused; what was cut off
    /// as never synced is in [`RaftDisk::dropped`], to be said. `voters`
    /// is not used: the configuration is the log's.
    pub fn open(
        dir: impl Into<PathBuf>,
        start: Start,
        member: u64,
        voters: &[u64],
    ) -> Result<(RaftDisk, Restored), RaftDiskError> {
        let dir = StateDir::open(dir)?;
        let found = survey(dir.path())?;
        match start {
            Start::NewCluster => {
                if let Some(found) = found.any(dir.path()) {
                    let path = dir.path().to_path_buf();
                    return Err(RaftDiskError::NotEmpty { path, found });
                }
                found.remove_pending(&dir)?;
                RaftDisk::begin(dir, member, voters)
            }
            Start::Existing => {
                if found.segments.is_empty() {
                    if found.snapshot {
                        return Err(RaftDiskError::Corrupt {
                            path: dir.path().join(format!("{LOG_PREFIX}*")),
                            offset: 0,
                            why: "a snapshot but no log segment, which held the hard state (the votes)"
                                .to_string(),
                        });
                    }
                    let path = dir.path().to_path_buf();
                    return Err(RaftDiskError::NoState { path });
                }
                RaftDisk::restore(dir, member, found)
            }
        }
    }

    /// A new cluster's first start: segment 0, written whole or not at
    /// all, with the first configuration.
    fn begin(
        dir: StateDir,
        member: u64,
        voters: &[u64],
    ) -> Result<(RaftDisk, Restored), RaftDiskError> {
        let conf_state = ConfState {
            voters: voters.to_vec(),
            ..ConfState::default()
        };
        let path = segment_path(&dir, 0);
        let record = frame(&path, KIND_CONF, conf_state.encoded_len(), |buf| {
            conf_state.encode_raw(buf)
        })?;
        let identity = Identity {
            flags: 0,
            member,
            n: 0,
        };
        let (image, witness) = segment_image(identity, &record, 0, 0, 0);
        dir.write_durably(&segment_name(0), &image)?;
        let log = open_file(&path, true)?;
        let disk = RaftDisk {
            dir,
            member,
            cluster: None,
            segments: vec![Segment {
                n: 0,
                len: witness.len,
                top: 0,
            }],
            log,
            witness,
            slot: 0,
            snapshot_len: 0,
            tail: Tail::default(),
            hard_state: HardState::default(),
            dropped: Vec::new(),
            failed: false,
        };
        let restored = Restored {
            conf_state,
            ..Restored::default()
        };
        Ok((disk, restored))
    }

    /// An existing member's start: a directory from before headers
    /// upgraded (or an upgrade's leftovers removed), then read.
    fn restore(
        dir: StateDir,
        member: u64,
        mut found: Found,
    ) -> Result<(RaftDisk, Restored), RaftDiskError> {
        let mut dropped = Vec::new();
        let mut headed = None;
        for (i, &n) in found.segments.iter().enumerate() {
            if !is_bare(&segment_path(&dir, n))? {
                headed = Some(i);
                break;
            }
        }
        match headed {
            Some(0) => {}
            None => {
                dropped = upgrade(&dir, member, &found)?;
                found = survey(dir.path())?;
            }
            Some(k) => {
                // Segments from before headers, below a segment with one:
                // what an upgrade left if it stopped before removing them,
                // which the segment must say it replaced.
                let n = found.segments[k];
                let path = segment_path(&dir, n);
                let file = open_file(&path, false)?;
                let header = read_header(&path, &file)?;
                if header.identity.flags & FLAG_WHOLE == 0 {
                    return Err(RaftDiskError::Corrupt {
                        path: segment_path(&dir, found.segments[k - 1]),
                        offset: 0,
                        why: format!(
                            "a segment without a header below {}, which does not replace it",
                            segment_name(n)
                        ),
                    });
                }
                for &old in &found.segments[..k] {
                    state::remove_if_there(&segment_path(&dir, old))?;
                }
                dir.sync_dir()?;
                found.segments.drain(..k);
            }
        }
        let (mut disk, restored) = RaftDisk::read(dir, member, &found)?;
        dropped.append(&mut disk.dropped);
        disk.dropped = dropped;
        Ok((disk, restored))
    }

    /// Reads the snapshot file, then every segment, each held to its
    /// witness; cuts off the newest one's unsynced tail.
    fn read(
        dir: StateDir,
        member: u64,
        found: &Found,
    ) -> Result<(RaftDisk, Restored), RaftDiskError> {
        let mut replay = Replay::default();
        let snapshot_len = read_snapshot_file(&dir, found, &mut replay)?;
        let mut numbers = found.segments.clone();
        check_numbering(&dir, &numbers)?;
        let newest = *numbers.last().expect("at least one segment");
        if adopt_pending(&dir, member, newest, found)? {
            numbers.push(newest + 1);
        }
        let mut segments = Vec::with_capacity(numbers.len());
        let mut cluster = None;
        let mut log = None;
        for (i, &n) in numbers.iter().enumerate() {
            let path = segment_path(&dir, n);
            let last = i + 1 == numbers.len();
            let file = open_file(&path, last)?;
            let header = read_header(&path, &file)?;
            let Identity {
                flags,
                member: recorded,
                n: named,
            } = header.identity;
            let corrupt = |why: String| RaftDiskError::Corrupt {
                path: path.clone(),
                offset: 0,
                why,
            };
            if named != n {
                return Err(corrupt(format!("a header naming {}", segment_name(named))));
            }
            if recorded != member {
                let path = dir.path().to_path_buf();
                return Err(RaftDiskError::NotMine {
                    path,
                    recorded,
                    member,
                });
            }
            if i > 0 && flags & FLAG_WHOLE != 0 {
                return Err(corrupt(
                    "a segment holding the whole log, after others".to_string(),
                ));
            }
            let w = header.witness;
            cluster = match (cluster, ClusterId::new(w.cluster)) {
                (Some(before), now) if now != Some(before) => {
                    let now = now.map_or_else(|| "none".to_string(), |c| c.to_string());
                    return Err(corrupt(format!(
                        "its witness records cluster {now}, where an older segment's records cluster {before}"
                    )));
                }
                (before, now) => now.or(before),
            };
            let read = read_segment(&path, &file, n, &w, last, &mut replay)?;
            if last {
                log = Some((file, w, header.slot, read.dropped));
            }
            segments.push(Segment {
                n,
                len: read.len,
                top: read.top,
            });
        }
        let (log, witness, slot, torn) = log.expect("at least one segment");
        let newest = segments.last().expect("at least one segment");
        if witness.sealed {
            return Err(RaftDiskError::Corrupt {
                path: segment_path(&dir, newest.n + 1),
                offset: 0,
                why: format!(
                    "missing: {} is sealed, naming it as the segment after it, so what it held after index {} is lost",
                    segment_name(newest.n),
                    witness.last
                ),
            });
        }
        let commit = replay.hard_state.commit;
        if commit > replay.tail.last {
            return Err(RaftDiskError::Corrupt {
                path: segment_path(&dir, newest.n),
                offset: newest.len,
                why: format!(
                    "the log ends at index {}, before the hard state's commit {commit}: {}",
                    replay.tail.last,
                    indices(replay.tail.last + 1, commit),
                ),
            });
        }
        let conf_state = match (&replay.snapshot, replay.conf) {
            (Some(snapshot), _) => snapshot.get_metadata().get_conf_state().clone(),
            (None, Some(conf)) => conf,
            (None, None) => {
                return Err(RaftDiskError::Corrupt {
                    path: segment_path(&dir, numbers[0]),
                    offset: 0,
                    why: "neither a snapshot nor the first configuration".to_string(),
                })
            }
        };
        // Read whole: the unsynced tail is cut off, and the cut kept,
        // before anything is appended.
        if let Some(tail) = &torn {
            log.set_len(newest.len).map_err(io_error(&tail.path))?;
            log.sync_data().map_err(io_error(&tail.path))?;
        }
        found.remove_pending(&dir)?;
        let mut hard_state = replay.hard_state.clone();
        hard_state.commit = hard_state.commit.max(replay.tail.base);
        let disk = RaftDisk {
            dir,
            member,
            cluster,
            segments,
            log,
            witness,
            slot,
            snapshot_len,
            tail: replay.tail,
            hard_state: replay.hard_state,
            dropped: torn.into_iter().collect(),
            failed: false,
        };
        let restored = Restored {
            hard_state,
            conf_state,
            snapshot: replay.snapshot,
            entries: replay.entries,
            cluster,
        };
        Ok((disk, restored))
    }

    /// Makes `p` durable: its record written at the end of the newest
    /// segment and the next witness slot rewritten, with one `fdatasync`,
    /// nothing else (nothing at all if `p` holds nothing new; only the slot
    /// if it holds only the cluster's identity). Refused, with nothing
    /// written, if it would not read back as a log, or names another
    /// cluster than the one recorded. After a failed write or sync nothing
    /// more is written ([`RaftDiskError::Failed`]): the node must stop.
    pub fn persist(&mut self, p: &Persist) -> Result<(), RaftDiskError> {
        self.usable()?;
        let path = self.log_path();
        let refused = |why| RaftDiskError::Refused {
            path: path.clone(),
            why,
        };
        let cluster = match (self.cluster, p.cluster) {
            (Some(known), Some(new)) if known != new => {
                return Err(refused(
                    "a cluster identity other than the one this member recorded",
                ))
            }
            (known, new) => new.or(known),
        };
        let snapshot = p.snapshot.as_ref().filter(|s| index_of(s) > 0);
        let has_record = p.hard_state.is_some() || !p.entries.is_empty() || snapshot.is_some();
        if !has_record && cluster == self.cluster {
            return Ok(());
        }
        let mut tail = self.tail;
        if let Some(snapshot) = snapshot {
            check_snapshot(&path, snapshot)?;
            tail.snapshot(index_of(snapshot));
        }
        tail.entries(&p.entries).map_err(refused)?;
        let commit = p.hard_state.as_ref().unwrap_or(&self.hard_state).commit;
        if commit > tail.last {
            return Err(refused("a commit index past the log's last entry"));
        }
        let record = if has_record {
            ready_record(&path, p.hard_state.as_ref(), &p.entries, snapshot)?
        } else {
            Vec::new()
        };
        let at = self.segments.last().expect("a segment").len;
        let witness = Witness {
            seq: self.witness.seq + 1,
            len: at + record.len() as u64,
            last: tail.last,
            commit,
            cluster: ClusterId::bits_of(cluster),
            sealed: false,
        };
        self.write_synced(&record, at, witness)?;
        let newest = self.segments.last_mut().expect("a segment");
        let top = p.entries.last().map_or(0, |e| e.index);
        newest.top = newest.top.max(top).max(snapshot.map_or(0, index_of));
        self.tail = tail;
        self.cluster = cluster;
        if let Some(hard_state) = &p.hard_state {
            self.hard_state = hard_state.clone();
        }
        Ok(())
    }

    /// Keeps `snapshot`, which the node took of its own applied state,
    /// written whole or not at all, then drops the log before it: the
    /// newest segment is sealed and a new one begun, and the oldest ones
    /// whose every entry is at or below the snapshot's index are removed,
    /// so that the directory holds at most about two snapshots' worth of
    /// log. A snapshot no later than the latest one is not written. It
    /// must carry its configuration.
    pub fn compact(&mut self, snapshot: &Snapshot) -> Result<(), RaftDiskError> {
        self.compact_until(snapshot, Stage::Done)
    }

    /// [`RaftDisk::compact`], stopped after `stop` (a crash, for tests).
    fn compact_until(&mut self, snapshot: &Snapshot, stop: Stage) -> Result<(), RaftDiskError> {
        self.usable()?;
        let index = index_of(snapshot);
        if index <= self.tail.base {
            return Ok(());
        }
        let path = self.dir.path().join(SNAPSHOT_FILE);
        check_snapshot(&path, snapshot)?;
        let record = frame(&path, KIND_SNAPSHOT, snapshot.encoded_len(), |buf| {
            snapshot.encode_raw(buf)
        })?;
        self.dir.write_durably(SNAPSHOT_FILE, &record)?;
        self.snapshot_len = record.len() as u64;
        self.tail.compact(index);
        if stop == Stage::Snapshot {
            return Ok(());
        }
        // The next segment, with the hard state that older ones may be the
        // only ones to hold, kept whole under its temporary name before
        // the newest is sealed: a start that finds the seal finds it too.
        let n = self.segments.last().expect("a segment").n + 1;
        let name = segment_name(n);
        let path = segment_path(&self.dir, n);
        let record = ready_record(&path, Some(&self.hard_state), &[], None)?;
        let identity = Identity {
            flags: 0,
            member: self.member,
            n,
        };
        let (image, witness) = segment_image(
            identity,
            &record,
            self.tail.last,
            self.hard_state.commit,
            ClusterId::bits_of(self.cluster),
        );
        self.dir.write_pending(&name, &image)?;
        if stop == Stage::Pending {
            return Ok(());
        }
        // From the seal on (from its write on: it may be on disk whatever
        // the sync says), nothing may be appended to the newest segment,
        // and a start puts the next one in place: until this process has
        // done so too, nothing more is written.
        self.failed = true;
        self.seal(n)?;
        if stop == Stage::Sealed {
            return Ok(());
        }
        self.dir.put_in_place(&name)?;
        self.log = open_file(&path, true)?;
        self.failed = false;
        self.segments.push(Segment {
            n,
            len: witness.len,
            top: 0,
        });
        self.witness = witness;
        self.slot = 0;
        if stop == Stage::Segment {
            return Ok(());
        }
        // Oldest first, so that what remains is always read whole.
        let mut removed = false;
        while self.segments.len() > 1 && self.segments[0].top <= index {
            state::remove_if_there(&segment_path(&self.dir, self.segments[0].n))?;
            self.segments.remove(0);
            removed = true;
            if stop == Stage::OneRemoved {
                return Ok(());
            }
        }
        if removed {
            self.dir.sync_dir()?;
        }
        Ok(())
    }

    /// Seals the newest segment, naming `next` as the one after it: a seal
    /// record and a slot saying sealed, one `fdatasync`.
    fn seal(&mut self, next: u64) -> Result<(), RaftDiskError> {
        let path = self.log_path();
        let at = self.segments.last().expect("a segment").len;
        let seal = Seal {
            closes: at,
            last: self.tail.last,
            next,
        };
        let record = frame(&path, KIND_SEAL, SEAL_LEN, |buf| {
            buf.extend_from_slice(&seal.encode())
        })?;
        // Where the log stands, which may be past the latest witness (a
        // start keeps the records written after it).
        let witness = Witness {
            seq: self.witness.seq + 1,
            len: at + record.len() as u64,
            last: self.tail.last,
            commit: self.hard_state.commit,
            cluster: ClusterId::bits_of(self.cluster),
            sealed: true,
        };
        self.write_synced(&record, at, witness)
    }

    /// Writes `record` at `at` in the newest segment and `witness` in the
    /// slot the latest sync did not write, then syncs: one `fdatasync`.
    fn write_synced(
        &mut self,
        record: &[u8],
        at: u64,
        witness: Witness,
    ) -> Result<(), RaftDiskError> {
        let slot = 1 - self.slot;
        let written = write_at(&self.log, record, at)
            .and_then(|()| write_at(&self.log, &witness.encode(), SLOT_AT[slot]))
            .and_then(|()| self.log.sync_data());
        if let Err(source) = written {
            self.failed = true;
            let path = self.log_path();
            return Err(RaftDiskError::Io { path, source });
        }
        self.segments.last_mut().expect("a segment").len = witness.len;
        self.witness = witness;
        self.slot = slot;
        Ok(())
    }

    /// Bytes in the Raft files.
    pub fn size(&self) -> u64 {
        self.snapshot_len + self.segments.iter().map(|s| s.len).sum::<u64>()
    }

    /// The state directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// What the start cut off as never synced, each to be said (a line
    /// each, their `Display`): empty on a clean start.
    pub fn dropped(&self) -> &[DroppedTail] {
        &self.dropped
    }

    fn log_path(&self) -> PathBuf {
        segment_path(&self.dir, self.segments.last().expect("a segment").n)
    }

    fn usable(&self) -> Result<(), RaftDiskError> {
        if self.failed {
            return Err(RaftDiskError::Failed {
                path: self.log_path(),
            });
        }
        Ok(())
    }
}

/// Where [`RaftDisk::compact_until`] stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The snapshot renamed into place.
    Snapshot,
    /// The next segment kept under its temporary name.
    Pending,
    /// The newest segment sealed.
    Sealed,
    /// The next segment in place.
    Segment,
    /// One old segment removed.
    OneRemoved,
    /// All of it.
    Done,
}

/// A segment's header as read.
struct Header {
    identity: Identity,
    /// The witness, and the slot it is in.
    witness: Witness,
    slot: usize,
}

/// Reads the header of the segment `file` (at `path`): its identity, and
/// the slot with the greater sequence number of those that read whole.
fn read_header(path: &Path, file: &File) -> Result<Header, RaftDiskError> {
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
struct SegmentRead {
    /// Where what is kept ends.
    len: u64,
    /// The greatest index in it.
    top: u64,
    /// The tail to cut off (the newest segment's only).
    dropped: Option<DroppedTail>,
}

/// Reads the records of segment `n` into `replay`, holding them to its
/// witness `w`: they must reach its length, ending a record there, and
/// agree with it there; past it only the newest segment may go on, with
/// records that read whole or a tail that cannot be read (to be cut off).
fn read_segment(
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
fn torn_tail(
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
fn read_snapshot_file(
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
fn check_numbering(dir: &StateDir, numbers: &[u64]) -> Result<(), RaftDiskError> {
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
fn adopt_pending(
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

/// Reads a directory from before headers as it was read then (a torn last
/// record of its newest segment dropped), and upgrades it: one segment
/// with a header holding all of it, written whole, then the old ones
/// removed. What was dropped is returned, to be said.
fn upgrade(dir: &StateDir, member: u64, found: &Found) -> Result<Vec<DroppedTail>, RaftDiskError> {
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
/// with a header begins with [`SEGMENT_MAGIC`], whose first four bytes
/// are more. A file too short to tell is not.
fn is_bare(path: &Path) -> Result<bool, RaftDiskError> {
    let file = open_file(path, false)?;
    let mut first = [0; 4];
    match read_at(&file, &mut first, 0) {
        Ok(()) => Ok(u64::from(u32::from_le_bytes(first)) <= MAX_RECORD_LEN),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(io_error(path)(e)),
    }
}

/// `from..=to`, as indices missing.
fn indices(from: u64, to: u64) -> String {
    if from == to {
        format!("index {from} missing")
    } else {
        format!("indices {from}..={to} missing")
    }
}

/// Where the log stands: the latest snapshot's index, and the last
/// index (the snapshot's if no entry follows it).
#[derive(Debug, Clone, Copy, Default)]
struct Tail {
    base: u64,
    last: u64,
}

impl Tail {
    /// A snapshot received: the log emptied.
    fn snapshot(&mut self, index: u64) {
        self.base = self.base.max(index);
        self.last = self.base;
    }

    /// Entries appended, if they are contiguous and leave no gap.
    fn entries(&mut self, entries: &[Entry]) -> Result<(), &'static str> {
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
    fn compact(&mut self, index: u64) {
        self.base = self.base.max(index);
        self.last = self.last.max(self.base);
    }
}

/// What a start has read so far.
#[derive(Default)]
struct Replay {
    tail: Tail,
    hard_state: HardState,
    conf: Option<ConfState>,
    snapshot: Option<Snapshot>,
    /// Indexes `tail.base + 1 ..= tail.last`.
    entries: Vec<Entry>,
}

impl Replay {
    /// Applies one record of a segment; `top` is raised to the greatest
    /// index in it.
    fn apply(&mut self, kind: u8, payload: &[u8], top: &mut u64) -> Result<(), String> {
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

/// A record for `path` ([`record::frame`](super::record::frame)).
fn frame(
    path: &Path,
    kind: u8,
    len: usize,
    payload: impl FnOnce(&mut Vec<u8>),
) -> Result<Vec<u8>, RaftDiskError> {
    super::record::frame(kind, len, payload).map_err(|e| too_large(path, e))
}

/// A `Ready` record for `path`
/// ([`record::ready_record`](super::record::ready_record)).
fn ready_record(
    path: &Path,
    hard_state: Option<&HardState>,
    entries: &[Entry],
    snapshot: Option<&Snapshot>,
) -> Result<Vec<u8>, RaftDiskError> {
    super::record::ready_record(hard_state, entries, snapshot).map_err(|e| too_large(path, e))
}

fn too_large(path: &Path, TooLarge(len): TooLarge) -> RaftDiskError {
    RaftDiskError::TooLarge {
        path: path.to_path_buf(),
        len,
        max: MAX_RECORD_LEN,
    }
}

/// Whether [`scan`] goes on after a record.
enum Flow {
    Go,
    /// Stop before this record.
    Stop,
}

/// Where [`scan`] stopped.
enum Scanned {
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
fn scan(
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
struct Found {
    snapshot: bool,
    /// Segment numbers, in order.
    segments: Vec<u64>,
    /// Segments written under their temporary name (`raft-log.<n>.tmp`),
    /// which a start may have to put in place.
    pending: Vec<u64>,
}

impl Found {
    fn any(&self, dir: &Path) -> Option<PathBuf> {
        match (self.snapshot, self.segments.first()) {
            (true, _) => Some(dir.join(SNAPSHOT_FILE)),
            (false, Some(&n)) => Some(dir.join(segment_name(n))),
            (false, None) => None,
        }
    }

    /// Removes the segments' temporaries that were not put in place.
    fn remove_pending(&self, dir: &StateDir) -> Result<(), RaftDiskError> {
        for &n in &self.pending {
            state::remove_if_there(&dir.tmp_path(&segment_name(n)))?;
        }
        Ok(())
    }
}

/// Lists the Raft files of `dir`, removing the temporaries a failed write
/// left but the segments' (which a start may have to put in place).
fn survey(dir: &Path) -> Result<Found, RaftDiskError> {
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

/// The number of the segment named `name`: only the names this module
/// gives.
fn segment_number(name: &str) -> Option<u64> {
    let n = name.strip_prefix(LOG_PREFIX)?;
    n.parse::<u64>().ok().filter(|p| p.to_string() == n)
}

fn segment_name(n: u64) -> String {
    format!("{LOG_PREFIX}{n}")
}

fn segment_path(dir: &StateDir, n: u64) -> PathBuf {
    dir.path().join(segment_name(n))
}

/// Opens a Raft file that must be there, a regular file (never through a
/// link), for reading, and for writing too if `write`.
fn open_file(path: &Path, write: bool) -> Result<File, RaftDiskError> {
    let opened = if write {
        state::open_regular_rw(path)
    } else {
        state::open_regular(path)
    };
    match opened {
        Ok(Some(file)) => Ok(file),
        Ok(None) => Err(StateError::NotRegular {
            path: path.to_path_buf(),
        }
        .into()),
        Err(source) => Err(RaftDiskError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes all of `bytes` at `at` in `file`, its cursor aside.
#[cfg(unix)]
fn write_at(file: &File, bytes: &[u8], at: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, at)
}

#[cfg(not(unix))]
fn write_at(mut file: &File, bytes: &[u8], at: u64) -> io::Result<()> {
    use std::io::Write as _;
    file.seek(SeekFrom::Start(at))?;
    file.write_all(bytes)
}

/// Fills `bytes` from `at` in `file`, its cursor aside.
#[cfg(unix)]
fn read_at(file: &File, bytes: &mut [u8], at: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, bytes, at)
}

#[cfg(not(unix))]
fn read_at(mut file: &File, bytes: &mut [u8], at: u64) -> io::Result<()> {
    file.seek(SeekFrom::Start(at))?;
    file.read_exact(bytes)
}

/// A snapshot's index (0 without metadata).
fn index_of(snapshot: &Snapshot) -> u64 {
    snapshot.get_metadata().get_index()
}

/// A snapshot must carry its configuration: it may be the only one left.
fn check_snapshot(path: &Path, snapshot: &Snapshot) -> Result<(), RaftDiskError> {
    match &snapshot.metadata {
        Some(metadata) if metadata.conf_state.is_some() => Ok(()),
        _ => Err(RaftDiskError::Refused {
            path: path.to_path_buf(),
            why: "a snapshot without its configuration (metadata.conf_state)",
        }),
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> RaftDiskError + '_ {
    move |source| RaftDiskError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::atomic::{AtomicU64, Ordering};

    use quickcheck::{Arbitrary, Gen, TestResult};

    use crate::seeded::qc;
    use raft::eraftpb::SnapshotMetadata;

    use super::*;

    /// The member the tests' directories are.
    const ME: u64 = 1;

    fn scratch(name: &str) -> PathBuf {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "ticketing-raft-disk-{name}-{}-{n}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// A new cluster's directory, member [`ME`].
    fn create(dir: &Path, voters: &[u64]) -> (RaftDisk, Restored) {
        RaftDisk::open(dir, Start::NewCluster, ME, voters).unwrap()
    }

    /// A start of member [`ME`] on `dir`.
    fn reopen(dir: &Path) -> Result<(RaftDisk, Restored), RaftDiskError> {
        RaftDisk::open(dir, Start::Existing, ME, &[])
    }

    fn entry(index: u64, term: u64, tag: u8) -> Entry {
        Entry {
            index,
            term,
            data: vec![tag; (index % 7) as usize],
            ..Entry::default()
        }
    }

    fn snapshot(index: u64, term: u64, voters: &[u64], data: Vec<u8>) -> Snapshot {
        Snapshot {
            data,
            metadata: Some(SnapshotMetadata {
                conf_state: Some(ConfState {
                    voters: voters.to_vec(),
                    ..ConfState::default()
                }),
                index,
                term,
            }),
        }
    }

    fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
        HardState { term, vote, commit }
    }

    fn entries(from: u64, to: u64, term: u64) -> Vec<Entry> {
        (from..=to).map(|i| entry(i, term, 1)).collect()
    }

    /// Entry `i` with the hard state committing the one before it.
    fn step(i: u64) -> Persist {
        Persist {
            hard_state: Some(hard_state(1, 1, i - 1)),
            entries: entries(i, i, 1),
            snapshot: None,
            cluster: None,
        }
    }

    fn cluster_id() -> ClusterId {
        ClusterId::new(0x5eed_0000_0000_0000_0000_0000_0000_c1d5).unwrap()
    }

    fn segments_in(dir: &Path) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                name.starts_with(LOG_PREFIX)
            })
            .collect();
        found.sort();
        found
    }

    /// The error's text, which must be [`RaftDiskError::Corrupt`] naming
    /// `file` and `offset`.
    fn corrupt_at(err: RaftDiskError, file: &Path, offset: u64) -> String {
        let text = err.to_string();
        match err {
            RaftDiskError::Corrupt {
                path, offset: at, ..
            } => {
                assert_eq!(path, file, "{text}");
                assert_eq!(at, offset, "{text}");
            }
            other => panic!("not Corrupt: {other}"),
        }
        assert!(text.contains(&*file.to_string_lossy()), "{text}");
        assert!(text.contains(&format!("at byte {offset}")), "{text}");
        text
    }

    fn write_to(path: &Path, at: u64, bytes: &[u8]) {
        let file = fs::OpenOptions::new().write(true).open(path).unwrap();
        write_at(&file, bytes, at).unwrap();
    }

    fn read_slot(path: &Path, slot: usize) -> [u8; SLOT_LEN] {
        let mut bytes = [0; SLOT_LEN];
        read_at(&fs::File::open(path).unwrap(), &mut bytes, SLOT_AT[slot]).unwrap();
        bytes
    }

    /// A new directory, member [`ME`], with entries 1 to 4 persisted one by
    /// one; the newest segment's length after each.
    fn four_steps(name: &str) -> (PathBuf, Vec<u64>) {
        let dir = scratch(name);
        let (mut disk, _) = create(&dir, &[1]);
        let ends = (1..=4)
            .map(|i| {
                disk.persist(&step(i)).unwrap();
                disk.size()
            })
            .collect();
        (dir, ends)
    }

    #[test]
    fn what_was_persisted_is_restored_with_truncations_applied() {
        let dir = scratch("restore");
        let (mut disk, restored) = create(&dir, &[1, 2, 3]);
        assert_eq!(restored.conf_state.voters, vec![1, 2, 3]);
        assert_eq!(restored.entries, Vec::new());
        disk.persist(&Persist {
            hard_state: Some(hard_state(1, 1, 0)),
            entries: entries(1, 5, 1),
            snapshot: None,
            cluster: None,
        })
        .unwrap();
        disk.persist(&Persist {
            hard_state: Some(hard_state(2, 3, 2)),
            entries: entries(3, 4, 2),
            snapshot: None,
            cluster: None,
        })
        .unwrap();
        let size = disk.size();
        let err = disk
            .persist(&Persist {
                entries: entries(9, 9, 2),
                ..Persist::default()
            })
            .unwrap_err();
        assert!(matches!(err, RaftDiskError::Refused { .. }), "{err}");
        // A commit past the last entry would not read back either.
        let err = disk
            .persist(&Persist {
                hard_state: Some(hard_state(2, 3, 5)),
                ..Persist::default()
            })
            .unwrap_err();
        assert!(matches!(err, RaftDiskError::Refused { .. }), "{err}");
        assert_eq!(disk.size(), size, "nothing written");
        drop(disk);
        let (disk, restored) = reopen(&dir).unwrap();
        assert!(disk.dropped().is_empty());
        assert_eq!(restored.hard_state, hard_state(2, 3, 2));
        let mut want = entries(1, 2, 1);
        want.extend(entries(3, 4, 2));
        assert_eq!(restored.entries, want);
        assert_eq!(restored.conf_state.voters, vec![1, 2, 3]);
        assert_eq!(restored.cluster, None);
        for path in segments_in(&dir) {
            let mode = fs::metadata(path).unwrap().permissions();
            #[cfg(unix)]
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
                0o600
            );
            let _ = mode;
        }
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_new_cluster_on_a_directory_with_state_is_refused() {
        let dir = scratch("not-empty");
        drop(create(&dir, &[1]));
        let err = RaftDisk::open(&dir, Start::NewCluster, ME, &[1]).unwrap_err();
        assert!(matches!(err, RaftDiskError::NotEmpty { .. }), "{err}");
        assert!(err.to_string().contains(&*dir.to_string_lossy()), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn no_state_without_a_new_cluster_is_refused_naming_the_directory() {
        let dir = scratch("no-state");
        let err = reopen(&dir).unwrap_err();
        assert!(matches!(err, RaftDiskError::NoState { .. }), "{err}");
        assert!(err.to_string().contains(&*dir.to_string_lossy()), "{err}");
        // Nor does a single server's state count.
        fs::write(dir.join(state::EPOCH_FILE), b"whatever").unwrap();
        let err = reopen(&dir).unwrap_err();
        assert!(matches!(err, RaftDiskError::NoState { .. }), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    // Nothing acknowledged is ever dropped (PROTOCOL.md 4.3): what a
    // witness says was synced must all be there.

    /// The audit's double grant: the newest segment cut back to a record's
    /// end, below what was synced, once started silently.
    #[test]
    fn an_acknowledged_tail_cut_at_a_record_boundary_is_refused_naming_what_is_missing() {
        let (dir, ends) = four_steps("cut-boundary");
        let log = dir.join("raft-log.0");
        let whole = fs::read(&log).unwrap();
        fs::write(&log, &whole[..ends[1] as usize]).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &log, ends[1]);
        assert!(text.contains("indices 3..=4 missing"), "{text}");
        assert!(text.contains(&format!("before byte {}", ends[3])), "{text}");
        assert_eq!(fs::metadata(&log).unwrap().len(), ends[1], "left as it was");
        // Cut to nothing but the header and the configuration: the same.
        fs::write(&log, &whole[..(SEGMENT_HEADER_LEN + 9 + 6) as usize]).unwrap();
        let err = reopen(&dir).unwrap_err();
        assert!(err.to_string().contains("indices 1..=4 missing"), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_acknowledged_record_cut_inside_is_refused() {
        let (dir, ends) = four_steps("cut-inside");
        let log = dir.join("raft-log.0");
        let whole = fs::read(&log).unwrap();
        fs::write(&log, &whole[..ends[2] as usize + 5]).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &log, ends[2]);
        assert!(text.contains("a record cut short"), "{text}");
        assert!(text.contains("index 4 missing"), "{text}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bad_checksum_on_an_acknowledged_record_is_refused_last_or_not() {
        let (dir, ends) = four_steps("checksum");
        let log = dir.join("raft-log.0");
        let whole = fs::read(&log).unwrap();
        for (damaged, missing) in [(2, "index 4 missing"), (0, "indices 2..=4 missing")] {
            let mut bad = whole.clone();
            bad[ends[damaged] as usize + 12] ^= 0x40;
            fs::write(&log, &bad).unwrap();
            let text = corrupt_at(reopen(&dir).unwrap_err(), &log, ends[damaged]);
            assert!(text.contains("checksum does not match"), "{text}");
            assert!(text.contains(missing), "{text}");
            assert_eq!(fs::read(&log).unwrap(), bad, "left as it was");
        }
        fs::remove_dir_all(dir).unwrap();
    }

    /// A directory with segments 0, 1 and 2 (a compaction low enough to
    /// keep segment 0, twice), entries 1 to 12.
    fn three_segments(name: &str) -> PathBuf {
        let dir = scratch(name);
        let (mut disk, _) = create(&dir, &[1, 2, 3]);
        for i in 1..=10 {
            disk.persist(&step(i)).unwrap();
        }
        disk.compact(&snapshot(2, 1, &[1, 2, 3], vec![2])).unwrap();
        disk.persist(&step(11)).unwrap();
        disk.compact(&snapshot(3, 1, &[1, 2, 3], vec![3])).unwrap();
        disk.persist(&step(12)).unwrap();
        assert_eq!(segments_in(&dir).len(), 3);
        dir
    }

    #[test]
    fn a_missing_segment_is_refused_newest_or_between() {
        let dir = three_segments("missing");
        let (s1, s2) = (dir.join("raft-log.1"), dir.join("raft-log.2"));
        let (one, two) = (fs::read(&s1).unwrap(), fs::read(&s2).unwrap());
        // The newest gone: the one before it is sealed, naming it.
        fs::remove_file(&s2).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &s2, 0);
        assert!(text.contains("raft-log.1 is sealed"), "{text}");
        assert!(text.contains("after index 11"), "{text}");
        // One between others gone.
        fs::write(&s2, &two).unwrap();
        fs::remove_file(&s1).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &s1, 0);
        assert!(text.contains("between raft-log.0 and raft-log.2"), "{text}");
        // Back whole, it opens.
        fs::write(&s1, &one).unwrap();
        let (_, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.entries.last().map(|e| e.index), Some(12));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_older_segment_that_is_not_sealed_is_refused() {
        let dir = scratch("unsealed");
        let (mut disk, _) = create(&dir, &[1]);
        for i in 1..=4 {
            disk.persist(&step(i)).unwrap();
        }
        let log = dir.join("raft-log.0");
        let before_seal = fs::read(&log).unwrap();
        disk.compact(&snapshot(1, 1, &[1], vec![1])).unwrap();
        disk.persist(&step(5)).unwrap();
        drop(disk);
        assert_eq!(segments_in(&dir).len(), 2);
        // Segment 0 as it was before its seal, with segment 1 after it.
        fs::write(&log, &before_seal).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &log, before_seal.len() as u64);
        assert!(text.contains("never sealed"), "{text}");
        fs::remove_dir_all(dir).unwrap();
    }

    /// Beyond what a witness says was synced, a tail that cannot be read
    /// is a write a crash tore, never acknowledged: cut off, said, and the
    /// start goes on. A record that reads whole there is kept.
    #[test]
    fn torn_tails_beyond_the_witness_are_dropped_said_and_the_directory_opens() {
        let (dir, ends) = four_steps("torn");
        let log = dir.join("raft-log.0");
        let whole = fs::read(&log).unwrap();
        let next = ready_record(&log, Some(&hard_state(1, 1, 4)), &entries(5, 6, 1), None).unwrap();
        let mut bad_checksum = next.clone();
        *bad_checksum.last_mut().unwrap() ^= 1;
        let cases: [(&[u8], Torn, u64); 4] = [
            (&next[..next.len() - 3], Torn::CutShort, 0),
            (&next[..5], Torn::CutShort, 0),
            (&bad_checksum, Torn::BadChecksum, 1),
            (&[0; 100], Torn::Zeros, 0),
        ];
        for (tail, what, records) in cases {
            let mut torn = whole.clone();
            torn.extend_from_slice(tail);
            fs::write(&log, &torn).unwrap();
            let (disk, restored) = reopen(&dir).unwrap();
            assert_eq!(restored.entries.len(), 4, "{what}");
            assert_eq!(restored.hard_state, hard_state(1, 1, 3));
            let dropped = DroppedTail {
                path: log.clone(),
                offset: ends[3],
                bytes: tail.len() as u64,
                records,
                what,
                witnessed: true,
            };
            assert_eq!(disk.dropped(), std::slice::from_ref(&dropped));
            assert_eq!(
                dropped.to_string(),
                format!(
                    "{}: dropped {} bytes at offset {} beyond what was synced ({what})",
                    log.display(),
                    tail.len(),
                    ends[3]
                )
            );
            assert_eq!(fs::read(&log).unwrap(), whole, "cut off, and the cut kept");
            drop(disk);
            let (disk, _) = reopen(&dir).unwrap();
            assert!(disk.dropped().is_empty(), "said once");
        }
        // A record written whole, whose slot never was: kept, and the next
        // persist goes after it.
        let mut written = whole.clone();
        written.extend_from_slice(&next);
        fs::write(&log, &written).unwrap();
        let (mut disk, restored) = reopen(&dir).unwrap();
        assert!(disk.dropped().is_empty());
        assert_eq!(restored.entries.last().map(|e| e.index), Some(6));
        assert_eq!(restored.hard_state, hard_state(1, 1, 4));
        disk.persist(&step(7)).unwrap();
        drop(disk);
        let (_, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.entries.last().map(|e| e.index), Some(7));
        // A bad record with a good one after it is no torn tail: refused.
        let mut torn = whole.clone();
        torn.extend_from_slice(&bad_checksum);
        torn.extend_from_slice(&next);
        fs::write(&log, &torn).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &log, ends[3]);
        assert!(text.contains("more than zeros after it"), "{text}");
        fs::remove_dir_all(dir).unwrap();
    }

    /// A slot's write torn by a crash fails its CRC: the other slot, the
    /// previous sync's, is the witness. Both unreadable: refused.
    #[test]
    fn a_torn_slot_falls_back_to_the_other_and_two_are_refused() {
        let (dir, ends) = four_steps("slots");
        let log = dir.join("raft-log.0");
        let whole = fs::read(&log).unwrap();
        let (disk, _) = reopen(&dir).unwrap();
        let newest = disk.slot;
        drop(disk);
        let mut torn = read_slot(&log, newest);
        torn[20] ^= 0x10;
        // The newest slot torn, its record whole: everything, read past
        // the older witness.
        write_to(&log, SLOT_AT[newest], &torn);
        let (disk, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.entries.len(), 4);
        assert!(disk.dropped().is_empty());
        assert_eq!(disk.slot, 1 - newest, "the other slot is the witness");
        drop(disk);
        // Its record cut too (the crash was mid-persist, never
        // acknowledged): the persist before it, and the cut said.
        fs::write(&log, &whole[..ends[3] as usize - 4]).unwrap();
        write_to(&log, SLOT_AT[newest], &torn);
        let (disk, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.entries.len(), 3);
        assert_eq!(disk.dropped().len(), 1);
        assert_eq!(disk.dropped()[0].offset, ends[2]);
        drop(disk);
        // Both slots unreadable: what was synced is not known.
        write_to(&log, SLOT_AT[0], &[0xff; 8]);
        write_to(&log, SLOT_AT[1], &[0xff; 8]);
        let text = corrupt_at(reopen(&dir).unwrap_err(), &log, SLOT_AT[0]);
        assert!(text.contains("neither witness slot"), "{text}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_header_that_cannot_be_read_is_refused() {
        let (dir, _) = four_steps("header");
        let log = dir.join("raft-log.0");
        let whole = fs::read(&log).unwrap();
        let mut bad = whole.clone();
        bad[17] ^= 1;
        fs::write(&log, &bad).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &log, 0);
        assert!(
            text.contains("segment header that cannot be read"),
            "{text}"
        );
        fs::write(&log, &whole[..100]).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &log, 0);
        assert!(text.contains("shorter than a segment's header"), "{text}");
        fs::remove_dir_all(dir).unwrap();
    }

    /// The audit's operator trap: member 1's directory started as member 2.
    #[test]
    fn another_members_directory_is_refused_naming_both() {
        let (dir, _) = four_steps("not-mine");
        let err = RaftDisk::open(&dir, Start::Existing, 2, &[]).unwrap_err();
        assert!(
            matches!(
                err,
                RaftDiskError::NotMine {
                    recorded: 1,
                    member: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "{}: this state directory is member 1's; refusing to start it as member 2",
                dir.display()
            )
        );
        reopen(&dir).expect("its own member's");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_cluster_identity_round_trips_across_restarts_and_compactions() {
        let dir = scratch("cluster");
        let (mut disk, restored) = create(&dir, &[1, 2, 3]);
        assert_eq!(restored.cluster, None);
        disk.persist(&step(1)).unwrap();
        // Learnt alone, with nothing else: still written and synced.
        let log = dir.join("raft-log.0");
        let before = fs::read(&log).unwrap();
        disk.persist(&Persist {
            cluster: Some(cluster_id()),
            ..Persist::default()
        })
        .unwrap();
        assert_ne!(fs::read(&log).unwrap(), before, "a slot written");
        assert_eq!(fs::metadata(&log).unwrap().len(), before.len() as u64);
        // Another cluster's: refused.
        let other = ClusterId::new(7).unwrap();
        let err = disk
            .persist(&Persist {
                cluster: Some(other),
                ..step(2)
            })
            .unwrap_err();
        assert!(matches!(err, RaftDiskError::Refused { .. }), "{err}");
        drop(disk);
        let (mut disk, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.cluster, Some(cluster_id()));
        // In every slot after, and in the segments compactions begin.
        for i in 2..=6 {
            disk.persist(&step(i)).unwrap();
            disk.compact(&snapshot(i - 1, 1, &[1, 2, 3], vec![1]))
                .unwrap();
        }
        drop(disk);
        assert!(!log.exists(), "compacted away");
        let (_, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.cluster, Some(cluster_id()));
        assert_eq!(restored.entries.last().map(|e| e.index), Some(6));
        fs::remove_dir_all(dir).unwrap();
    }

    // A compaction stopped between its steps.

    #[test]
    fn a_compaction_stopped_after_its_seal_is_finished_by_the_start() {
        let dir = scratch("sealed");
        let (mut disk, _) = create(&dir, &[1]);
        for i in 1..=4 {
            disk.persist(&step(i)).unwrap();
        }
        disk.compact_until(&snapshot(2, 1, &[1], vec![2]), Stage::Sealed)
            .unwrap();
        assert!(matches!(
            disk.persist(&step(5)),
            Err(RaftDiskError::Failed { .. })
        ));
        drop(disk);
        let pending = dir.join("raft-log.1.tmp");
        let next = dir.join("raft-log.1");
        assert!(pending.exists() && !next.exists());
        let keep = fs::read(&pending).unwrap();
        let (mut disk, restored) = reopen(&dir).unwrap();
        assert!(next.exists() && !pending.exists(), "put in place");
        assert_eq!(restored.entries.last().map(|e| e.index), Some(4));
        disk.persist(&step(5)).unwrap();
        drop(disk);
        let (_, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.entries.last().map(|e| e.index), Some(5));
        // Had its temporary been lost, the sealed segment would say so.
        fs::remove_file(&next).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &next, 0);
        assert!(text.contains("raft-log.0 is sealed"), "{text}");
        // And a temporary that is not the next segment whole is refused.
        fs::write(&pending, &keep[..keep.len() - 1]).unwrap();
        let text = corrupt_at(reopen(&dir).unwrap_err(), &pending, 0);
        assert!(text.contains("not whole"), "{text}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_seal_that_its_slot_never_said_is_dropped() {
        let dir = scratch("unsaid-seal");
        let (mut disk, _) = create(&dir, &[1]);
        for i in 1..=4 {
            disk.persist(&step(i)).unwrap();
        }
        let log = dir.join("raft-log.0");
        let open_slot = 1 - disk.slot;
        let slot_before = read_slot(&log, open_slot);
        let len = disk.size();
        disk.compact_until(&snapshot(2, 1, &[1], vec![2]), Stage::Sealed)
            .unwrap();
        drop(disk);
        // The seal written, its slot not: the process died in between.
        write_to(&log, SLOT_AT[open_slot], &slot_before);
        let (mut disk, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.entries.last().map(|e| e.index), Some(4));
        let dropped = &disk.dropped()[0];
        assert_eq!((dropped.what, dropped.offset), (Torn::Seal, len));
        assert!(
            !dir.join("raft-log.1.tmp").exists(),
            "the temporary removed"
        );
        disk.persist(&step(5)).unwrap();
        disk.compact(&snapshot(3, 1, &[1], vec![3])).unwrap();
        drop(disk);
        let (_, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.entries.last().map(|e| e.index), Some(5));
        fs::remove_dir_all(dir).unwrap();
    }

    // Directories from before headers.

    /// Writes `records` as segments `first`, `first + 1`, ... the way the
    /// version before headers did (records alone: their format has not
    /// changed), and `snapshot` as the snapshot file.
    fn write_bare(dir: &Path, first: u64, segments: &[Vec<Vec<u8>>], snapshot: Option<&Snapshot>) {
        fs::create_dir_all(dir).unwrap();
        for (n, records) in (first..).zip(segments) {
            fs::write(dir.join(segment_name(n)), records.concat()).unwrap();
        }
        if let Some(s) = snapshot {
            let record = frame(dir, KIND_SNAPSHOT, s.encoded_len(), |buf| s.encode_raw(buf));
            fs::write(dir.join(SNAPSHOT_FILE), record.unwrap()).unwrap();
        }
    }

    fn bare_conf(voters: &[u64]) -> Vec<u8> {
        let conf = ConfState {
            voters: voters.to_vec(),
            ..ConfState::default()
        };
        frame(Path::new("x"), KIND_CONF, conf.encoded_len(), |buf| {
            conf.encode_raw(buf)
        })
        .unwrap()
    }

    fn bare_ready(
        hs: Option<HardState>,
        entries: &[Entry],
        snapshot: Option<&Snapshot>,
    ) -> Vec<u8> {
        ready_record(Path::new("x"), hs.as_ref(), entries, snapshot).unwrap()
    }

    fn restored_from_bare() -> Restored {
        let mut want = entries(1, 2, 1);
        want.extend(entries(3, 7, 2));
        Restored {
            hard_state: hard_state(2, 3, 6),
            conf_state: ConfState {
                voters: vec![1, 2, 3],
                ..ConfState::default()
            },
            snapshot: None,
            entries: want,
            cluster: None,
        }
    }

    /// A directory from before headers: two segments, entries 1 to 7 (3
    /// to 5 rewritten), a torn last record.
    fn bare_directory(name: &str) -> (PathBuf, Vec<u8>) {
        let dir = scratch(name);
        let torn = bare_ready(Some(hard_state(2, 3, 7)), &entries(8, 8, 2), None);
        let segments = vec![
            vec![
                bare_conf(&[1, 2, 3]),
                bare_ready(Some(hard_state(1, 1, 1)), &entries(1, 5, 1), None),
            ],
            vec![
                bare_ready(Some(hard_state(2, 3, 2)), &entries(3, 5, 2), None),
                bare_ready(Some(hard_state(2, 3, 6)), &entries(6, 7, 2), None),
                torn[..torn.len() - 2].to_vec(),
            ],
        ];
        write_bare(&dir, 0, &segments, None);
        (dir, torn)
    }

    #[test]
    fn a_directory_from_before_headers_is_upgraded_and_says_what_it_dropped() {
        let (dir, torn) = bare_directory("bare");
        let old = dir.join("raft-log.1");
        let old_len = fs::metadata(&old).unwrap().len();
        let (mut disk, restored) = RaftDisk::open(&dir, Start::Existing, 2, &[]).unwrap();
        assert_eq!(restored, restored_from_bare());
        let dropped = DroppedTail {
            path: old.clone(),
            offset: old_len - (torn.len() as u64 - 2),
            bytes: torn.len() as u64 - 2,
            records: 0,
            what: Torn::CutShort,
            witnessed: false,
        };
        assert_eq!(disk.dropped(), std::slice::from_ref(&dropped));
        assert!(dropped
            .to_string()
            .contains("from before segments recorded"));
        assert_eq!(segments_in(&dir), [dir.join("raft-log.2")], "upgraded");
        disk.persist(&Persist {
            cluster: Some(cluster_id()),
            ..Persist::default()
        })
        .unwrap();
        drop(disk);
        // Now member 2's, with a header and its cluster.
        let err = RaftDisk::open(&dir, Start::Existing, 1, &[]).unwrap_err();
        assert!(
            matches!(err, RaftDiskError::NotMine { recorded: 2, .. }),
            "{err}"
        );
        let (disk, again) = RaftDisk::open(&dir, Start::Existing, 2, &[]).unwrap();
        assert!(disk.dropped().is_empty());
        assert_eq!(again.cluster, Some(cluster_id()));
        assert_eq!(
            Restored {
                cluster: None,
                ..again
            },
            restored
        );
        fs::remove_dir_all(dir).unwrap();
    }

    /// An upgrade stopped at any step starts: before its new segment is
    /// in place (upgraded again), after it with every old segment still
    /// there, or after some were removed (oldest first).
    #[test]
    fn an_upgrade_stopped_between_its_steps_starts() {
        let (dir, _) = bare_directory("bare-crash");
        let old: Vec<(PathBuf, Vec<u8>)> = segments_in(&dir)
            .into_iter()
            .map(|p| {
                let bytes = fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect();
        let put_back = |from: usize| {
            for (path, bytes) in &old[from..] {
                fs::write(path, bytes).unwrap();
            }
        };
        let (_, restored) = RaftDisk::open(&dir, Start::Existing, 2, &[]).unwrap();
        let upgraded = dir.join("raft-log.2");
        let image = fs::read(&upgraded).unwrap();
        for from in [0, 1] {
            put_back(from);
            let (disk, again) = RaftDisk::open(&dir, Start::Existing, 2, &[]).unwrap();
            assert_eq!(again, restored);
            assert!(disk.dropped().is_empty());
            assert_eq!(
                segments_in(&dir),
                std::slice::from_ref(&upgraded),
                "the rest removed"
            );
        }
        // Stopped before the rename: only old segments, and a temporary.
        fs::remove_file(&upgraded).unwrap();
        put_back(0);
        fs::write(dir.join("raft-log.2.tmp"), &image[..5000]).unwrap();
        let (disk, again) = RaftDisk::open(&dir, Start::Existing, 2, &[]).unwrap();
        assert_eq!(again, restored);
        assert_eq!(disk.dropped().len(), 1, "its torn record said again");
        assert_eq!(segments_in(&dir), std::slice::from_ref(&upgraded));
        assert_eq!(fs::read(&upgraded).unwrap(), image);
        // Old segments below a segment that does not replace them: refused.
        drop(disk);
        put_back(1);
        fs::write(&upgraded, image).unwrap();
        let (mut disk, _) = RaftDisk::open(&dir, Start::Existing, 2, &[]).unwrap();
        disk.compact(&snapshot(7, 2, &[1, 2, 3], vec![7])).unwrap();
        drop(disk);
        put_back(1);
        let err = RaftDisk::open(&dir, Start::Existing, 2, &[]).unwrap_err();
        assert!(err.to_string().contains("does not replace it"), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    /// A directory from before headers that had compacted: a snapshot
    /// file, a later snapshot from the leader in a segment, no first
    /// configuration left. The upgrade keeps each where a start finds it.
    #[test]
    fn an_upgrade_keeps_snapshots_and_a_compacted_log() {
        let dir = scratch("bare-snapshots");
        let leader = snapshot(9, 3, &[1, 2, 4], vec![9]);
        let segments = vec![
            vec![bare_ready(Some(hard_state(2, 1, 5)), &[], None)],
            vec![
                bare_ready(None, &entries(6, 8, 2), None),
                bare_ready(
                    Some(hard_state(3, 2, 9)),
                    &entries(10, 11, 3),
                    Some(&leader),
                ),
            ],
        ];
        write_bare(
            &dir,
            4,
            &segments,
            Some(&snapshot(5, 2, &[1, 2, 3], vec![5])),
        );
        let (disk, restored) = reopen(&dir).unwrap();
        assert!(disk.dropped().is_empty());
        assert_eq!(restored.snapshot, Some(leader));
        assert_eq!(restored.conf_state.voters, vec![1, 2, 4]);
        assert_eq!(restored.entries, entries(10, 11, 3));
        assert_eq!(restored.hard_state, hard_state(3, 2, 9));
        assert_eq!(segments_in(&dir), [dir.join("raft-log.6")]);
        drop(disk);
        let (_, again) = reopen(&dir).unwrap();
        assert_eq!(again, restored);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_link_planted_at_the_log_or_the_snapshot_is_not_followed() {
        let dir = scratch("link");
        let (mut disk, _) = create(&dir, &[1]);
        disk.persist(&Persist {
            entries: entries(1, 1, 1),
            ..Persist::default()
        })
        .unwrap();
        drop(disk);
        let log = dir.join("raft-log.0");
        let elsewhere = scratch("link-target");
        fs::create_dir_all(&elsewhere).unwrap();
        let target = elsewhere.join("log");
        fs::rename(&log, &target).unwrap();
        let before = fs::read(&target).unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&target, &log).unwrap();
            let err = reopen(&dir).unwrap_err();
            assert!(
                matches!(err, RaftDiskError::State(StateError::NotRegular { .. })),
                "{err}"
            );
            assert!(err.to_string().contains(&*log.to_string_lossy()), "{err}");
            assert_eq!(fs::read(&target).unwrap(), before);
            fs::remove_file(&log).unwrap();
            // At the snapshot's place, with the log back.
            fs::rename(&target, &log).unwrap();
            let snap = dir.join(SNAPSHOT_FILE);
            std::os::unix::fs::symlink(&target, &snap).unwrap();
            let err = reopen(&dir).unwrap_err();
            assert!(err.to_string().contains(&*snap.to_string_lossy()), "{err}");
        }
        fs::remove_dir_all(dir).unwrap();
        fs::remove_dir_all(elsewhere).unwrap();
    }

    #[test]
    fn the_size_stays_bounded_across_many_compactions() {
        let dir = scratch("bounded");
        let (mut disk, _) = create(&dir, &[1, 2, 3]);
        let table = vec![7; 4096];
        let mut last = 0;
        let mut most = 0;
        for round in 1..=150u64 {
            // Ten Readys of ten entries of about 1 KiB.
            for _ in 0..10 {
                let batch: Vec<Entry> = (last + 1..=last + 10)
                    .map(|i| Entry {
                        index: i,
                        term: round,
                        data: vec![1; 1000],
                        ..Entry::default()
                    })
                    .collect();
                last += 10;
                disk.persist(&Persist {
                    hard_state: Some(hard_state(round, 1, last - 5)),
                    entries: batch,
                    snapshot: None,
                    cluster: None,
                })
                .unwrap();
            }
            // The applied state lags the log a little.
            disk.compact(&snapshot(last - 15, round, &[1, 2, 3], table.clone()))
                .unwrap();
            most = most.max(disk.size());
            assert!(segments_in(&dir).len() <= 2, "{:?}", segments_in(&dir));
        }
        let on_disk: u64 = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with("raft-"))
            .map(|e| e.metadata().unwrap().len())
            .sum();
        assert_eq!(on_disk, disk.size());
        // A round's log is about 100 KiB: two of them, their headers, and
        // a snapshot.
        assert!(most < 2 * (110_000 + SEGMENT_HEADER_LEN) + 5_000, "{most}");
        drop(disk);
        let (_disk, restored) = reopen(&dir).unwrap();
        assert_eq!(restored.snapshot.as_ref().map(index_of), Some(last - 15));
        assert_eq!(restored.entries.first().map(|e| e.index), Some(last - 14));
        assert_eq!(restored.entries.last().map(|e| e.index), Some(last));
        assert_eq!(restored.hard_state, hard_state(150, 1, last - 5));
        fs::remove_dir_all(dir).unwrap();
    }

    /// How long a `persist` takes, one small `Ready` at a time (an entry
    /// of 128 bytes and a hard state): the cost of its write and its sync.
    /// Not run by default; run it on the disks to compare, in release:
    ///
    /// ```text
    /// TICKETING_BENCH_DIR=/tmp cargo test --release --features raft --lib \
    ///     host::raft::disk::tests::persist_timing -- --ignored --nocapture
    /// ```
    #[test]
    #[ignore = "a timing loop, run by hand"]
    fn persist_timing() {
        let base = std::env::var_os("TICKETING_BENCH_DIR")
            .map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from);
        let count: u64 = std::env::var("TICKETING_BENCH_COUNT")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(5_000);
        for round in 0..3 {
            let dir = base.join(format!(
                "ticketing-raft-disk-timing-{}-{round}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            let (mut disk, _) = create(&dir, &[1]);
            let mut took = Vec::with_capacity(count as usize);
            for i in 1..=count {
                let p = Persist {
                    hard_state: Some(hard_state(1, 1, i - 1)),
                    entries: vec![Entry {
                        index: i,
                        term: 1,
                        data: vec![7; 128],
                        ..Entry::default()
                    }],
                    snapshot: None,
                    cluster: None,
                };
                let start = std::time::Instant::now();
                disk.persist(&p).unwrap();
                took.push(start.elapsed());
            }
            drop(disk);
            fs::remove_dir_all(&dir).unwrap();
            let total: std::time::Duration = took.iter().sum();
            took.sort_unstable();
            let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
            println!(
                "{}: {count} persists, {:.1} us each on average (p50 {:.1} us, p99 {:.1} us), {:.0} a second",
                base.display(),
                total.as_secs_f64() * 1e6 / count as f64,
                at(0.5).as_secs_f64() * 1e6,
                at(0.99).as_secs_f64() * 1e6,
                count as f64 / total.as_secs_f64(),
            );
        }
    }

    // The model test: random runs of persist, compact (crashing at each
    // of its steps), reopen and torn writes, against an in-memory model.

    const CASES_MODEL: u64 = 300;

    /// A Ready, in numbers the model turns into one that makes sense
    /// where the log stands (as raft-rs's do: nothing committed is
    /// rewritten, the commit never passes the last entry).
    #[derive(Debug, Clone)]
    struct ReadyOp {
        hard_state: Option<(u8, u8)>,
        /// How far before the log's end the entries start.
        back: u8,
        count: u8,
        /// How far before the log's end plus 3 a leader's snapshot is.
        snapshot: Option<u8>,
        tag: u8,
        /// Whether it carries the cluster's identity.
        cluster: bool,
    }

    /// What a crash left of a persist's slot write.
    #[derive(Debug, Clone, Copy)]
    enum SlotFate {
        Landed,
        /// Nothing of it.
        Lost,
        /// Its first bytes only.
        Torn(u8),
    }

    #[derive(Debug, Clone)]
    enum Op {
        Persist(ReadyOp),
        /// Persisted, then as a crash before its sync returned may leave
        /// it: its record cut at a byte (or whole), its slot as `SlotFate`
        /// says; then reopened.
        Torn(ReadyOp, u32, SlotFate),
        /// A compaction `back` before the log's end, stopped at a step
        /// (then reopened), or whole.
        Compact {
            back: u8,
            stop: u8,
        },
        Reopen,
        /// Temporaries a crash left behind, then reopened.
        StaleTemporary,
    }

    impl Arbitrary for ReadyOp {
        fn arbitrary(g: &mut Gen) -> ReadyOp {
            ReadyOp {
                hard_state: Option::arbitrary(g),
                back: u8::arbitrary(g) % 5,
                count: u8::arbitrary(g) % 5,
                snapshot: (u8::arbitrary(g) % 8 == 0).then(|| u8::arbitrary(g) % 7),
                tag: u8::arbitrary(g),
                cluster: u8::arbitrary(g) % 10 == 0,
            }
        }
    }

    impl Arbitrary for SlotFate {
        fn arbitrary(g: &mut Gen) -> SlotFate {
            match u8::arbitrary(g) % 3 {
                0 => SlotFate::Landed,
                1 => SlotFate::Lost,
                _ => SlotFate::Torn(1 + u8::arbitrary(g) % (SLOT_LEN as u8 - 1)),
            }
        }
    }

    impl Arbitrary for Op {
        fn arbitrary(g: &mut Gen) -> Op {
            match u8::arbitrary(g) % 12 {
                0..=5 => Op::Persist(ReadyOp::arbitrary(g)),
                6 => Op::Torn(
                    ReadyOp::arbitrary(g),
                    u32::arbitrary(g),
                    SlotFate::arbitrary(g),
                ),
                7..=9 => Op::Compact {
                    back: u8::arbitrary(g) % 6,
                    stop: u8::arbitrary(g) % 6,
                },
                10 => Op::Reopen,
                _ => Op::StaleTemporary,
            }
        }
    }

    #[derive(Debug, Clone)]
    struct Model {
        restored: Restored,
        first_conf: ConfState,
    }

    impl Model {
        fn base(&self) -> u64 {
            self.restored.snapshot.as_ref().map_or(0, index_of)
        }

        fn last(&self) -> u64 {
            self.base() + self.restored.entries.len() as u64
        }

        fn commit(&self) -> u64 {
            self.restored.hard_state.commit
        }

        fn persist(&mut self, p: &Persist) {
            let r = &mut self.restored;
            if let Some(s) = p.snapshot.as_ref().filter(|s| index_of(s) > 0) {
                r.entries.clear();
                if index_of(s) > r.snapshot.as_ref().map_or(0, index_of) {
                    r.snapshot = Some(s.clone());
                }
            }
            if let Some(first) = p.entries.first() {
                let base = self.base();
                let r = &mut self.restored;
                r.entries.retain(|e| e.index < first.index);
                r.entries
                    .extend(p.entries.iter().filter(|e| e.index > base).cloned());
            }
            let r = &mut self.restored;
            if let Some(h) = &p.hard_state {
                r.hard_state = h.clone();
            }
            if p.cluster.is_some() {
                r.cluster = p.cluster;
            }
            self.settle();
        }

        fn compact(&mut self, s: &Snapshot) {
            let index = index_of(s);
            if index > self.base() {
                self.restored.snapshot = Some(s.clone());
                self.restored.entries.retain(|e| e.index > index);
            }
            self.settle();
        }

        fn settle(&mut self) {
            let base = self.base();
            let commit = &mut self.restored.hard_state.commit;
            *commit = (*commit).max(base);
            self.restored.conf_state = match &self.restored.snapshot {
                Some(s) => s.get_metadata().get_conf_state().clone(),
                None => self.first_conf.clone(),
            };
        }

        fn ready(&self, op: &ReadyOp) -> Persist {
            let mut after = self.clone();
            let snapshot = op.snapshot.map(|back| {
                let index = (self.last() + 3)
                    .saturating_sub(u64::from(back))
                    .max(self.commit())
                    .max(1);
                snapshot(index, 1, &[1, 2, index % 4], vec![op.tag; 3])
            });
            if let Some(s) = &snapshot {
                after.persist(&Persist {
                    snapshot: Some(s.clone()),
                    ..Persist::default()
                });
            }
            let first = (after.last() + 1)
                .saturating_sub(u64::from(op.back))
                .max(after.commit() + 1);
            let entries: Vec<Entry> = (first..first + u64::from(op.count))
                .map(|i| entry(i, u64::from(op.tag % 4), op.tag))
                .collect();
            after.persist(&Persist {
                entries: entries.clone(),
                ..Persist::default()
            });
            Persist {
                hard_state: op.hard_state.map(|(t, c)| {
                    let commit = u64::from(c).min(after.last());
                    hard_state(u64::from(t), u64::from(t % 3), commit)
                }),
                entries,
                snapshot,
                cluster: op.cluster.then(cluster_id),
            }
        }
    }

    /// A torn persist: `p` written, then the newest segment left as a
    /// crash before its sync returned may leave it; then a start, which
    /// must be refused if the slot claims bytes that did not land, and
    /// must otherwise start with everything acknowledged, and `p` if its
    /// record is there whole. After a refusal, the same crash with the
    /// slot's write lost instead, so that the run goes on.
    fn tear(
        dir: &Path,
        disk: &mut Option<RaftDisk>,
        model: &mut Model,
        p: &Persist,
        cut: u32,
        fate: SlotFate,
    ) -> Result<(), String> {
        let d = disk.as_mut().expect("open");
        let log = d.log_path();
        let before = d.segments.last().unwrap().len;
        let slot = 1 - d.slot;
        let old_slot = read_slot(&log, slot);
        let old_witness = d.witness;
        d.persist(p).map_err(|e| e.to_string())?;
        let after = d.segments.last().unwrap().len;
        let new_witness = d.witness;
        drop(disk.take());
        let at = before + u64::from(cut) % (after - before + 1);
        let file = fs::OpenOptions::new().write(true).open(&log).unwrap();
        file.set_len(at).unwrap();
        let new_slot = read_slot(&log, slot);
        let left = match fate {
            SlotFate::Landed => new_slot,
            SlotFate::Lost => old_slot,
            SlotFate::Torn(k) => {
                let mut left = old_slot;
                left[..usize::from(k)].copy_from_slice(&new_slot[..usize::from(k)]);
                left
            }
        };
        write_at(&file, &left, SLOT_AT[slot]).unwrap();
        // What the start finds as the witness: the new one only if that
        // slot reads whole as it (else the other, the older one).
        let mut landed = match Witness::decode(&left) {
            Some(w) if w == new_witness => true,
            Some(w) if new_witness == old_witness || w.seq < old_witness.seq => false,
            None => false,
            Some(w) => return Err(format!("a slot left as neither: {w:?}")),
        };
        if landed && at < after {
            // The slot claims bytes that did not land: refused, naming
            // the file and what is missing; never a silent start.
            match reopen(dir) {
                Err(e @ RaftDiskError::Corrupt { .. })
                    if e.to_string().contains(&*log.to_string_lossy()) => {}
                Err(e) => return Err(format!("refused, but not as it should be: {e}")),
                Ok((_, restored)) => {
                    return Err(format!(
                        "started without bytes its witness says were synced: {restored:?}"
                    ))
                }
            }
            write_at(&file, &old_slot, SLOT_AT[slot]).unwrap();
            landed = false;
        }
        drop(file);
        let (opened, restored) = reopen(dir).map_err(|e| format!("refused: {e}"))?;
        // The record is there whole, or not at all; the cluster's identity
        // only if its slot is.
        let mut record = p.clone();
        record.cluster = None;
        if at == after {
            model.persist(&record);
        }
        if landed && p.cluster.is_some() {
            model.persist(&Persist {
                cluster: p.cluster,
                ..Persist::default()
            });
        }
        let cut_off = (before < at && at < after) as usize;
        if opened.dropped().len() != cut_off {
            return Err(format!(
                "dropped {:?}, where {cut_off} tail was cut",
                opened.dropped()
            ));
        }
        if restored != model.restored {
            return Err(format!(
                "restored\n{restored:?}\nbut the model has\n{:?}",
                model.restored
            ));
        }
        *disk = Some(opened);
        Ok(())
    }

    fn run(ops: &[Op]) -> Result<(), String> {
        let dir = scratch("model");
        let (disk, restored) =
            RaftDisk::open(&dir, Start::NewCluster, ME, &[1, 2, 3]).map_err(|e| e.to_string())?;
        let mut disk = Some(disk);
        let mut model = Model {
            first_conf: restored.conf_state.clone(),
            restored,
        };
        let reopen = |disk: &mut Option<RaftDisk>, model: &Model, step: usize| {
            drop(disk.take());
            let (opened, restored) = reopen(&dir).map_err(|e| format!("step {step}: {e}"))?;
            if !opened.dropped().is_empty() {
                return Err(format!(
                    "step {step}: dropped {:?}, with nothing torn",
                    opened.dropped()
                ));
            }
            *disk = Some(opened);
            if restored != model.restored {
                return Err(format!(
                    "step {step}: restored\n{restored:?}\nbut the model has\n{:?}",
                    model.restored
                ));
            }
            Ok(())
        };
        for (step, op) in ops.iter().enumerate() {
            let d = disk.as_mut().expect("open");
            match op {
                Op::Persist(r) => {
                    let p = model.ready(r);
                    d.persist(&p).map_err(|e| format!("step {step}: {e}"))?;
                    model.persist(&p);
                }
                Op::Torn(r, cut, fate) => {
                    let p = model.ready(r);
                    tear(&dir, &mut disk, &mut model, &p, *cut, *fate)
                        .map_err(|e| format!("step {step}: {e}"))?;
                }
                Op::Compact { back, stop } => {
                    let index = model.last().saturating_sub(u64::from(*back));
                    let s = snapshot(index, 2, &[1, 2, 3, index % 5], vec![*back; 5]);
                    let stage = match stop {
                        0 => Stage::Snapshot,
                        1 => Stage::Pending,
                        2 => Stage::Sealed,
                        3 => Stage::Segment,
                        4 => Stage::OneRemoved,
                        _ => Stage::Done,
                    };
                    d.compact_until(&s, stage)
                        .map_err(|e| format!("step {step}: {e}"))?;
                    if index > 0 {
                        model.compact(&s);
                    }
                    if stage != Stage::Done {
                        reopen(&mut disk, &model, step)?;
                    }
                }
                Op::Reopen => reopen(&mut disk, &model, step)?,
                Op::StaleTemporary => {
                    fs::write(dir.join("raft-snapshot.tmp"), b"half a snapshot").unwrap();
                    fs::write(dir.join("raft-log.99.tmp"), b"half a segment").unwrap();
                    reopen(&mut disk, &model, step)?;
                    for name in ["raft-snapshot.tmp", "raft-log.99.tmp"] {
                        if dir.join(name).exists() {
                            return Err(format!("step {step}: {name} left"));
                        }
                    }
                }
            }
        }
        reopen(&mut disk, &model, ops.len())?;
        drop(disk);
        fs::remove_dir_all(&dir).unwrap();
        Ok(())
    }

    #[test]
    fn restored_state_matches_a_model_across_compactions_crashes_and_torn_writes() {
        fn prop(ops: Vec<Op>) -> TestResult {
            match run(&ops) {
                Ok(()) => TestResult::passed(),
                Err(why) => TestResult::error(why),
            }
        }
        qc("raft_disk_model", CASES_MODEL).quickcheck(prop as fn(Vec<Op>) -> TestResult);
    }
}
