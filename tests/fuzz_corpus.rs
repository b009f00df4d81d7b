//! Replays the cargo-fuzz corpora on stable: every file of
//! `fuzz/corpus/decode` through `testkit::fuzz::decode`, and every file of
//! `fuzz/corpus/client` through `testkit::fuzz::client` (which checks the
//! invariants after every step and runs each input twice for determinism).
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

#[test]
fn the_decode_corpus_replays_cleanly() {
    let files = corpus("decode");
    let failures: Vec<String> = files
        .iter()
        .filter_map(|(path, data)| {
            fuzz::decode(data)
                .err()
                .map(|e| format!("{}: {e}", path.display()))
        })
        .collect();
    println!("decode: {} files replayed", files.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_client_corpus_keeps_every_invariant() {
    let files = corpus("client");
    let failures: Vec<String> = files
        .iter()
        .filter_map(|(path, data)| {
            fuzz::client(data)
                .err()
                .map(|e| format!("{}: {e}", path.display()))
        })
        .collect();
    println!("client: {} files replayed", files.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
