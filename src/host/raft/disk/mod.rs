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

mod error;
mod files;
mod read;
mod upgrade;

#[cfg(test)]
mod tests;

use std::fs::File;
use std::path::{Path, PathBuf};

use prost::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

use self::error::{io_error, too_large};
pub use self::error::{DroppedTail, RaftDiskError, Torn};
use self::files::{open_file, segment_name, segment_path, write_at};
use self::read::{
    adopt_pending, check_numbering, indices, read_header, read_segment, read_snapshot_file, survey,
    Found, Replay, Tail,
};
use self::upgrade::{is_bare, upgrade};
use super::record::{
    segment_image, Identity, Seal, Witness, FLAG_WHOLE, KIND_CONF, KIND_SEAL, KIND_SNAPSHOT,
    SEAL_LEN, SLOT_AT,
};
pub use super::record::{MAX_RECORD_LEN, SEGMENT_HEADER_LEN, SEGMENT_MAGIC};
use crate::host::state::{self, StateDir};
use crate::server::raft::ClusterId;

/// The latest snapshot's file name in the state directory.
pub const SNAPSHOT_FILE: &str = "raft-snapshot";

/// What the log segments' file names begin with (`raft-log.0`, ...).
pub const LOG_PREFIX: &str = "raft-log.";

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
    /// The first start of a member to be added to a running cluster
    /// (`--raft-join`, PROTOCOL.md 4.4 "Adding"): the directory must hold
    /// no Raft state, and segment 0 is written with an empty
    /// configuration, which the leader's snapshot replaces.
    Join,
}

/// The file that says this directory's member was removed.
const REMOVED_FILE: &str = "raft-removed";

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
        let removed = dir.path().join(REMOVED_FILE);
        if removed.exists() {
            return Err(RaftDiskError::Removed { path: removed });
        }
        let found = survey(dir.path())?;
        match start {
            Start::NewCluster | Start::Join => {
                if let Some(found) = found.any(dir.path()) {
                    let path = dir.path().to_path_buf();
                    return Err(RaftDiskError::NotEmpty { path, found });
                }
                found.remove_pending(&dir)?;
                let voters = if start == Start::Join {
                    &[][..]
                } else {
                    voters
                };
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

    /// Records, durably, that this member was removed from its cluster
    /// ([`ReplicaEvent::Removed`](crate::server::raft::ReplicaEvent::Removed)):
    /// [`RaftDisk::open`] refuses the directory from now on.
    pub fn record_removed(&self) -> Result<(), RaftDiskError> {
        let text = format!("member {} was removed from its cluster\n", self.member);
        Ok(self.dir.write_durably(REMOVED_FILE, text.as_bytes())?)
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
