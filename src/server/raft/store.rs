//! The Raft log as raft-rs reads it: the latest snapshot, the entries after
//! it, the hard and configuration states, all in memory. What is durable
//! is the driver's (`ticketing::raft::RaftDisk`): this store changes only as the
//! node hands the same changes out to be made durable, so the two agree.

use prost::Message as _;
use raft::prelude::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

/// The in-memory Raft log of one member.
#[derive(Debug, Default)]
pub(crate) struct LogStore {
    hard_state: HardState,
    conf_state: ConfState,
    /// The latest snapshot; its index is the entry before the first kept.
    snapshot: Snapshot,
    /// Contiguous: `entries[i].index == snapshot index + 1 + i`.
    entries: Vec<Entry>,
}

impl LogStore {
    /// A store holding what a start read back.
    pub(crate) fn restored(
        hard_state: HardState,
        conf_state: ConfState,
        snapshot: Option<Snapshot>,
        entries: Vec<Entry>,
    ) -> LogStore {
        let mut store = LogStore {
            hard_state,
            conf_state,
            ..LogStore::default()
        };
        if let Some(snapshot) = snapshot {
            store.install(snapshot);
        }
        store.append(&entries);
        store
    }

    fn snapshot_index(&self) -> u64 {
        self.snapshot.metadata.as_ref().map_or(0, |m| m.index)
    }

    fn snapshot_term(&self) -> u64 {
        self.snapshot.metadata.as_ref().map_or(0, |m| m.term)
    }

    pub(crate) fn first(&self) -> u64 {
        self.snapshot_index() + 1
    }

    pub(crate) fn last(&self) -> u64 {
        self.snapshot_index() + self.entries.len() as u64
    }

    /// Everything it holds, as a start would read it back.
    pub(crate) fn to_restored(&self) -> super::Restored {
        super::Restored {
            hard_state: self.hard_state.clone(),
            conf_state: self.conf_state.clone(),
            snapshot: (self.snapshot_index() > 0).then(|| self.snapshot.clone()),
            entries: self.entries.clone(),
            cluster: None,
        }
    }

    pub(crate) fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// Appends `entries`; the first replaces the entry at its index and
    /// every one after it (a leader's log wins over what it contradicts).
    /// Entries at or below the snapshot are already in it.
    pub(crate) fn append(&mut self, entries: &[Entry]) {
        let first = self.first();
        let entries = match entries.iter().position(|e| e.index >= first) {
            Some(at) => &entries[at..],
            None => return,
        };
        let Some(head) = entries.first() else {
            return;
        };
        // raft-rs hands out contiguous entries that start at most one past
        // the last: keep what precedes the first.
        let keep = usize::try_from(head.index - first).unwrap_or(usize::MAX);
        self.entries.truncate(keep.min(self.entries.len()));
        self.entries.extend_from_slice(entries);
    }

    /// Replaces the log with `snapshot`: a leader's, for a member that
    /// fell behind, or this member's own ([`LogStore::compact`]).
    pub(crate) fn install(&mut self, snapshot: Snapshot) {
        let meta = snapshot.metadata.clone().unwrap_or_default();
        if meta.index <= self.snapshot_index() {
            return;
        }
        if meta.index <= self.last() && self.term_of(meta.index) == Some(meta.term) {
            // The log goes on past it: keep what follows.
            let drop = usize::try_from(meta.index - self.snapshot_index()).unwrap_or(usize::MAX);
            self.entries.drain(..drop.min(self.entries.len()));
        } else {
            self.entries.clear();
        }
        if let Some(cs) = &meta.conf_state {
            self.conf_state = cs.clone();
        }
        self.hard_state.term = self.hard_state.term.max(meta.term);
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.snapshot = snapshot;
    }

    /// The configuration as applied.
    pub(crate) fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    /// The configuration as applied: what the next snapshot holds.
    pub(crate) fn set_conf_state(&mut self, conf_state: ConfState) {
        self.conf_state = conf_state;
    }

    /// A snapshot of this member's own state applied through `index`, with
    /// `data`, which then replaces the log up to it.
    pub(crate) fn compact(&mut self, index: u64, data: Vec<u8>) -> Option<Snapshot> {
        let term = self.term_of(index)?;
        let snapshot = Snapshot {
            data,
            metadata: Some(SnapshotMetadata {
                conf_state: Some(self.conf_state.clone()),
                index,
                term,
            }),
        };
        self.install(snapshot.clone());
        Some(snapshot)
    }

    fn term_of(&self, index: u64) -> Option<u64> {
        if index == self.snapshot_index() {
            return Some(self.snapshot_term());
        }
        let at = index.checked_sub(self.first())?;
        self.entries.get(usize::try_from(at).ok()?).map(|e| e.term)
    }
}

impl Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = (low - self.first()) as usize;
        let to = (high - self.first()) as usize;
        let max = max_size.into().unwrap_or(u64::MAX);
        let mut size = 0u64;
        let mut out = Vec::with_capacity(to - from);
        for e in &self.entries[from..to] {
            size = size.saturating_add(e.encoded_len() as u64);
            // At least one entry, whatever its size.
            if !out.is_empty() && size > max {
                break;
            }
            out.push(e.clone());
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.snapshot_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_of(idx)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot_index() < request_index || self.snapshot_index() == 0 {
            // The next snapshot this member takes will do.
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Entry::default()
        }
    }

    fn ctx() -> GetEntriesContext {
        GetEntriesContext::empty(false)
    }

    #[test]
    fn appends_truncate_what_they_contradict_and_snapshots_replace_the_head() {
        let mut s = LogStore::default();
        s.append(&[entry(1, 1), entry(2, 1), entry(3, 1)]);
        assert_eq!((s.first(), s.last()), (1, 3));
        s.append(&[entry(2, 2)]);
        assert_eq!(s.last(), 2);
        assert_eq!(s.term(2).ok(), Some(2));
        s.append(&[entry(3, 2), entry(4, 2)]);
        let snap = s.compact(3, b"t".to_vec()).expect("index 3 is in the log");
        assert_eq!((s.first(), s.last()), (4, 4));
        assert_eq!(s.term(3).ok(), Some(2));
        assert!(s.term(2).is_err());
        assert!(s.entries(3, 5, None, ctx()).is_err());
        assert_eq!(s.entries(4, 5, None, ctx()).map(|e| e.len()).ok(), Some(1));
        assert_eq!(s.snapshot(3, 2).ok(), Some(snap));
        assert!(s.snapshot(4, 2).is_err());
        // A leader's snapshot past the log replaces all of it.
        let later = Snapshot {
            metadata: Some(SnapshotMetadata {
                index: 9,
                term: 3,
                conf_state: None,
            }),
            ..Snapshot::default()
        };
        s.install(later);
        assert_eq!((s.first(), s.last()), (10, 9));
        assert_eq!(s.term(9).ok(), Some(3));
        // Entries it covers are dropped; later ones kept.
        s.append(&[entry(9, 3), entry(10, 3)]);
        assert_eq!((s.first(), s.last()), (10, 10));
    }
}
