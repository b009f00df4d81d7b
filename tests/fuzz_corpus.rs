//! Replays the cargo-fuzz corpora on stable: every file of
//! `fuzz/corpus/decode` through `testkit::fuzz::decode`, and every file of
//! `fuzz/corpus/client` through `testkit::fuzz::client` (which checks the
//! invariants after every step and runs each input twice for determinism);
//! `decisions` likewise, and with the feature `raft`, `peer_frames`
//! through `testkit::peer_frames::peer_frames` and `backup` through
//! `testkit::fuzz::backup`.
//! A corpus directory that is missing or empty fails the test.

use std::fs;
use std::path::{Path, PathBuf};

use ticketing::testkit::fuzz;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("corpus")
        .join(target);
    let entries =
        fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    let mut files: Vec<(PathBuf, Vec<u8>)> = entries
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .map(|path| {
            let data =
                fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (path, data)
        })
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "the corpus {} is empty: seed it (see fuzz/README.md)",
        dir.display()
    );
    files
}

/// Replays every file of the corpus of `target` through `run`, and fails
/// naming each file that `run` fails on.
fn replay<E: std::fmt::Display>(target: &str, run: impl Fn(&[u8]) -> Result<(), E>) {
    let files = corpus(target);
    let failures: Vec<String> = files
        .iter()
        .filter_map(|(path, data)| run(data).err().map(|e| format!("{}: {e}", path.display())))
        .collect();
    println!("{target}: {} files replayed", files.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_decode_corpus_replays_cleanly() {
    replay("decode", fuzz::decode);
}

#[test]
fn the_client_corpus_keeps_every_invariant() {
    replay("client", fuzz::client);
}

#[test]
fn the_decisions_corpus_reads_back_canonically() {
    replay("decisions", fuzz::decisions);
}

#[cfg(feature = "raft")]
#[test]
fn the_peer_frames_corpus_fails_no_member() {
    replay("peer_frames", ticketing::testkit::peer_frames::peer_frames);
}

#[cfg(feature = "raft")]
#[test]
fn the_backup_corpus_reads_back_as_the_same_backup() {
    replay("backup", fuzz::backup);
}
