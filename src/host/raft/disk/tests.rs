//! The unit tests of the Raft state on disk: what is persisted is what a
//! start restores, and what cannot be read whole is refused or said.

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};

use quickcheck::{Arbitrary, Gen, TestResult};

use crate::seeded::qc;
use raft::eraftpb::SnapshotMetadata;

use super::files::read_at;
use super::*;
use crate::host::raft::record::SLOT_LEN;
use crate::host::state::StateError;

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

fn bare_ready(hs: Option<HardState>, entries: &[Entry], snapshot: Option<&Snapshot>) -> Vec<u8> {
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
