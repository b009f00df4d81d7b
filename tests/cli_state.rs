//! `ticketing serve` across restarts (PROTOCOL.md 4.1, invariant 8), run as
//! processes and spoken to by raw clients of protocol version 2: without
//! state, with `--state-dir` after a crash (SIGKILL) and after a clean stop
//! (SIGTERM), and with a state directory that is damaged.

mod cli;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cli::{ticketing, Raw, Serve, WAIT};
use nix::sys::signal::Signal;

/// A fresh directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("ticketing-cli-state-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn connect_v2(serve: &Serve) -> Raw {
    let mut raw = Raw::connect(&serve.addr);
    raw.hello_v2();
    raw
}

fn said(serve: &Serve, what: &str) -> bool {
    serve.stderr.seen.iter().any(|l| l.contains(what))
}

#[test]
fn a_restart_without_state_forgets_its_grants_but_tokens_still_grow() {
    let mut serve = Serve::start(&[]);
    assert!(
        said(&serve, "a restart forgets every grant"),
        "{:?}",
        serve.stderr.seen
    );
    let mut a = connect_v2(&serve);
    let before = a.grant_v2(1, "k", 0, 60_000);
    serve.kill();
    let serve = Serve::start(&[]);
    let mut b = connect_v2(&serve);
    // Forgotten: granted at once, with a greater token.
    let after = b.grant_v2(1, "k", 0, 60_000);
    assert!(after > before, "token {after} after {before}");
}

#[test]
fn a_crash_with_a_state_dir_means_a_grace_in_which_holders_reclaim() {
    let dir = Scratch::new("crash");
    let args = [
        "--state-dir",
        dir.path(),
        "--max-lease-ms",
        "3000",
        "--grace-margin-ms",
        "300",
    ];
    let mut serve = Serve::start(&args);
    assert!(
        !said(&serve, "recovery grace"),
        "a first start has no grace"
    );
    let mut a = connect_v2(&serve);
    let k = a.grant_v2(1, "k", 0, 3000);
    let j_sent = Instant::now();
    let j = a.grant_v2(2, "j", 0, 2000);
    serve.signal(Signal::SIGKILL);
    serve.kill();

    let mut serve = Serve::start(&args);
    assert!(said(&serve, "recovery grace"), "{:?}", serve.stderr.seen);
    // The holder of k reconnects and renews it: reclaimed, token kept.
    let mut a = connect_v2(&serve);
    a.send(&format!("X 1 k {k} 3000\n"));
    a.expect(&format!("G 1 X k {k} 3000"));
    // Someone else wants j, whose holder is gone, and k, which its holder
    // gives back in the grace: both are granted when it ends, not before
    // j's old lease could have run out.
    let mut b = connect_v2(&serve);
    b.send("A 1 j b 20000 1000\nA 2 k b 20000 1000\n");
    a.send(&format!("R 2 k {k}\n"));
    a.expect("D 2 R k");
    let (j2, _) = b.granted_v2(1, "j");
    assert!(
        j_sent.elapsed() >= Duration::from_millis(2000),
        "j was granted again {:?} after its 2 s grant was asked",
        j_sent.elapsed()
    );
    let (k2, _) = b.granted_v2(2, "k");
    serve.stderr.until("the end of the grace", |l| {
        l == "recovery grace over: granting"
    });
    for (new, old) in [(j2, j), (j2, k), (k2, k), (k2, j)] {
        assert!(new > old, "token {new} after {old}");
    }
}

#[test]
fn a_clean_stop_with_a_state_dir_keeps_the_grants_and_needs_no_grace() {
    let dir = Scratch::new("clean");
    let args = ["--state-dir", dir.path()];
    let mut serve = Serve::start(&args);
    let mut a = connect_v2(&serve);
    let k = a.grant_v2(1, "k", 0, 30_000);
    serve.signal(Signal::SIGTERM);
    assert_eq!(serve.wait_exit(WAIT).code(), Some(0));
    assert!(dir.file("table").exists(), "the table was written");

    let serve = Serve::start(&args);
    assert!(!said(&serve, "recovery grace"), "{:?}", serve.stderr.seen);
    assert!(!dir.file("table").exists(), "a table is used once");
    let mut b = connect_v2(&serve);
    let z = b.grant_v2(1, "z", 0, 100);
    assert!(z > k, "no grace, and a greater token: {z} after {k}");
    b.send("A 2 k b 0 1000\n");
    b.expect("T 2 A k");
    b.send("A 3 k b 20000 1000\n");
    let mut a = connect_v2(&serve);
    a.send(&format!("R 1 k {k}\n"));
    a.expect("D 1 R k");
    let (k2, _) = b.granted_v2(3, "k");
    assert!(k2 > z, "{k2} after {z}");
}

#[test]
fn an_epoch_file_that_is_not_valid_stops_the_server_naming_it() {
    let dir = Scratch::new("bad-epoch");
    fs::write(dir.file("epoch"), "ticketing-epoch 1\nepoch 12\n").expect("write");
    let done = ticketing(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            dir.path(),
        ],
        WAIT,
    );
    assert_eq!(done.code, Some(1), "{done:?}");
    let epoch = dir.file("epoch");
    assert!(done.stderr.contains(&*epoch.to_string_lossy()), "{done:?}");
    assert!(!done.stderr.contains("listening on"), "{done:?}");
    assert_eq!(
        fs::read_to_string(&epoch).expect("read"),
        "ticketing-epoch 1\nepoch 12\n",
        "left as it was"
    );
}

#[test]
fn a_torn_table_means_a_grace() {
    let dir = Scratch::new("torn-table");
    let args = ["--state-dir", dir.path()];
    let mut serve = Serve::start(&args);
    let mut a = connect_v2(&serve);
    a.grant_v2(1, "k", 0, 30_000);
    serve.signal(Signal::SIGTERM);
    assert_eq!(serve.wait_exit(WAIT).code(), Some(0));
    tear(&dir.file("table"));

    let serve = Serve::start(&args);
    assert!(said(&serve, "unreadable"), "{:?}", serve.stderr.seen);
    assert!(said(&serve, "recovery grace"), "{:?}", serve.stderr.seen);
    let mut b = connect_v2(&serve);
    b.send("A 1 other b 0 1000\n");
    b.expect("T 1 A other");
}

/// Cuts the last bytes off `file`, as a write torn by a crash would.
fn tear(file: &Path) {
    let bytes = fs::read(file).expect("the table");
    fs::write(file, &bytes[..bytes.len() - 5]).expect("tear it");
}
