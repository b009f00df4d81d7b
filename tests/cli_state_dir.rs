//! `ticketing serve --state-dir` against a directory that others share or
//! tamper with (issue 20, items 1 to 3 and 9): one server per directory,
//! no link followed and no file of any size read, private files whatever
//! the umask, tables whose numbers are out of range, temporaries left
//! behind by a full disk.

mod cli;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use cli::{Proc, Raw, Serve, WAIT};
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::Signal;
use nix::sys::stat::{umask, Mode};
use nix::unistd::{chown, geteuid, mkfifo, Uid};
use ticketing::server::TableImage;

/// A fresh path for one test (the directory is not made), removed when
/// dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("ticketing-state-dir-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        Scratch(dir)
    }

    /// The same, the directory made (0755, as `mkdir` makes it).
    fn made(name: &str) -> Scratch {
        let scratch = Scratch::new(name);
        fs::create_dir(&scratch.0).expect("a scratch directory");
        fs::set_permissions(&scratch.0, fs::Permissions::from_mode(0o755)).expect("chmod");
        scratch
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

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .mode()
        & 0o7777
}

fn said(serve: &Serve, what: &str) -> bool {
    serve.stderr.seen.iter().any(|l| l.contains(what))
}

/// `ticketing serve --state-dir DIR EXTRA...` that must not start: its
/// exit status and standard error, within [`WAIT`]. Its address space is
/// capped, so that a server that reads without bound fails fast instead of
/// taking the machine's memory.
fn refused_start(dir: &str, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--state-dir", dir];
    args.extend(extra);
    let done = Proc::start_with(&args, cap_memory).finish(WAIT);
    assert!(
        !done.stderr.contains("listening on"),
        "it started: {done:?}"
    );
    (done.code, done.stderr)
}

/// At most 1 GiB of address space for the process.
fn cap_memory(command: &mut Command) {
    const GIB: u64 = 1 << 30;
    // SAFETY: setrlimit is a plain system call, safe between fork and exec.
    unsafe {
        command.pre_exec(|| setrlimit(Resource::RLIMIT_AS, GIB, GIB).map_err(std::io::Error::from));
    }
}

/// Starts a server on `dir`, grants `k` for `lease_ms`, and stops it
/// cleanly so that it writes its table; returns the token.
fn table_with_a_grant(dir: &Scratch, extra: &[&str], lease_ms: u64) -> u64 {
    let mut args = vec!["--state-dir", dir.path()];
    args.extend(extra);
    let mut serve = Serve::start(&args);
    let mut raw = Raw::connect(&serve.addr);
    raw.hello_v2();
    let token = raw.grant_v2(1, "k", 0, lease_ms);
    serve.signal(Signal::SIGTERM);
    assert_eq!(serve.wait_exit(WAIT).code(), Some(0));
    assert!(dir.file("table").exists(), "the table was written");
    token
}

/// Rewrites the table in `dir` through `change`, sealed again.
fn rewrite_table(dir: &Scratch, change: impl FnOnce(&mut TableImage)) {
    let path = dir.file("table");
    let mut image = TableImage::decode(&fs::read(&path).expect("the table")).expect("intact");
    change(&mut image);
    fs::write(&path, image.encode()).expect("write the table");
}

// ----- item 1: one server per directory -----------------------------------

#[test]
fn a_second_server_on_a_state_dir_refuses_to_start_naming_it() {
    let dir = Scratch::new("shared");
    let mut first = Serve::start(&["--state-dir", dir.path()]);
    let (code, stderr) = refused_start(dir.path(), &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(dir.path()), "{stderr}");
    assert!(stderr.contains("another"), "{stderr}");

    // The first one is untouched, and serves.
    let mut raw = Raw::connect(&first.addr);
    raw.hello_v2();
    raw.grant_v2(1, "shared", 0, 1000);

    // Once it has stopped, the directory is free again.
    first.signal(Signal::SIGTERM);
    assert_eq!(first.wait_exit(WAIT).code(), Some(0));
    let next = Serve::start(&["--state-dir", dir.path()]);
    let mut raw = Raw::connect(&next.addr);
    raw.hello_v2();
    raw.send("A 1 shared me 0 1000\n");
    raw.expect("T 1 A shared");
}

// ----- item 2: no link followed, no file of any size read -----------------

#[test]
fn links_planted_at_the_temporaries_are_not_followed() {
    let dir = Scratch::made("links");
    let victims = Scratch::made("links-victims");
    let epoch_victim = victims.file("epoch-victim");
    let table_victim = victims.file("table-victim");
    for victim in [&epoch_victim, &table_victim] {
        fs::write(victim, "precious\n").expect("write a victim");
    }
    symlink(&epoch_victim, dir.file("epoch.tmp")).expect("plant a link");

    // The start writes the epoch through `epoch.tmp`.
    let mut serve = Serve::start(&["--state-dir", dir.path()]);
    // The clean stop writes the table through `table.tmp`.
    symlink(&table_victim, dir.file("table.tmp")).expect("plant a link");
    let mut raw = Raw::connect(&serve.addr);
    raw.hello_v2();
    raw.grant_v2(1, "k", 0, 60_000);
    serve.signal(Signal::SIGTERM);
    assert_eq!(serve.wait_exit(WAIT).code(), Some(0));

    for victim in [&epoch_victim, &table_victim] {
        assert_eq!(
            fs::read_to_string(victim).expect("read a victim"),
            "precious\n",
            "{} was written through a link",
            victim.display()
        );
    }
    for kept in ["epoch", "table"] {
        let meta = fs::symlink_metadata(dir.file(kept)).expect("kept");
        assert!(meta.file_type().is_file(), "{kept}: {meta:?}");
    }
}

#[test]
fn a_fifo_at_the_table_is_refused_and_costs_a_grace_not_a_hang() {
    let dir = Scratch::new("fifo");
    table_with_a_grant(&dir, &["--max-lease-ms", "2000"], 2000);
    let table = dir.file("table");
    fs::remove_file(&table).expect("remove the table");
    mkfifo(&table, Mode::S_IRUSR | Mode::S_IWUSR).expect("mkfifo");

    let serve = Serve::start(&["--state-dir", dir.path(), "--max-lease-ms", "2000"]);
    let named = serve
        .stderr
        .seen
        .iter()
        .find(|l| l.contains(&*table.to_string_lossy()));
    assert!(
        named.is_some_and(|l| l.contains("not a regular file")),
        "{:?}",
        serve.stderr.seen
    );
    assert!(said(&serve, "recovery grace"), "{:?}", serve.stderr.seen);
}

#[test]
fn an_epoch_that_is_a_device_is_refused_naming_it() {
    let dir = Scratch::made("device");
    let epoch = dir.file("epoch");
    symlink("/dev/zero", &epoch).expect("plant a link");
    let (code, stderr) = refused_start(dir.path(), &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&*epoch.to_string_lossy()), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
}

#[test]
fn an_epoch_file_larger_than_a_record_is_refused_unread() {
    let dir = Scratch::made("huge-epoch");
    let epoch = dir.file("epoch");
    // Sparse: 4 GiB that take no disk.
    let file = fs::File::create(&epoch).expect("create");
    file.set_len(4 << 30).expect("grow");
    drop(file);
    let (code, stderr) = refused_start(dir.path(), &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(&*epoch.to_string_lossy()), "{stderr}");
    assert!(stderr.contains("larger than"), "{stderr}");
}

#[test]
fn a_table_larger_than_the_limit_costs_a_grace_naming_it() {
    let dir = Scratch::new("huge-table");
    table_with_a_grant(&dir, &["--max-lease-ms", "2000"], 2000);
    let table = dir.file("table");
    // Sparse: 4 GiB that take no disk, well past the documented limit.
    fs::OpenOptions::new()
        .write(true)
        .open(&table)
        .and_then(|f| f.set_len(4 << 30))
        .expect("grow the table");

    let serve = Serve::start_with(
        &["--state-dir", dir.path(), "--max-lease-ms", "2000"],
        cap_memory,
    );
    let named = serve
        .stderr
        .seen
        .iter()
        .find(|l| l.contains(&*table.to_string_lossy()));
    assert!(
        named.is_some_and(|l| l.contains("larger than")),
        "{:?}",
        serve.stderr.seen
    );
    assert!(said(&serve, "recovery grace"), "{:?}", serve.stderr.seen);
    assert!(!table.exists(), "a table is used once, even a refused one");
}

// ----- item 3: private files whatever the umask -----------------------------

/// Runs the server with umask 000.
fn open_umask(command: &mut Command) {
    // SAFETY: umask is a plain system call, safe between fork and exec.
    unsafe {
        command.pre_exec(|| {
            umask(Mode::empty());
            Ok(())
        });
    }
}

#[test]
fn a_new_state_dir_and_its_files_are_private_under_umask_000() {
    let dir = Scratch::new("umask");
    let mut serve = Serve::start_with(&["--state-dir", dir.path()], open_umask);
    assert_eq!(mode(&dir.0), 0o700, "the directory");
    assert_eq!(mode(&dir.file("epoch")), 0o600, "the epoch");
    let mut raw = Raw::connect(&serve.addr);
    raw.hello_v2();
    raw.grant_v2(1, "k", 0, 60_000);
    serve.signal(Signal::SIGTERM);
    assert_eq!(serve.wait_exit(WAIT).code(), Some(0));
    assert_eq!(mode(&dir.file("table")), 0o600, "the table");
    for entry in fs::read_dir(&dir.0).expect("list") {
        let path = entry.expect("an entry").path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
}

#[test]
fn an_open_state_dir_of_this_user_is_tightened() {
    let dir = Scratch::made("tighten");
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o777)).expect("chmod");
    let _serve = Serve::start(&["--state-dir", dir.path()]);
    assert_eq!(mode(&dir.0), 0o700);
}

#[test]
fn an_open_state_dir_of_another_user_is_refused() {
    // As root, a directory of our own given away; otherwise /tmp, which
    // another user (root) owns and everyone may write to.
    let scratch = Scratch::made("foreign");
    let dir = if geteuid().is_root() {
        fs::set_permissions(&scratch.0, fs::Permissions::from_mode(0o777)).expect("chmod");
        chown(&scratch.0, Some(Uid::from_raw(65534)), None).expect("chown");
        scratch.0.clone()
    } else {
        PathBuf::from("/tmp")
    };
    let before = mode(&dir);
    let path = dir.to_str().expect("UTF-8");
    let (code, stderr) = refused_start(path, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(path), "{stderr}");
    assert!(stderr.contains("owns it"), "{stderr}");
    assert_eq!(mode(&dir), before, "left as it was");
    assert!(!dir.join("epoch").exists(), "nothing written there");
}

// ----- item 9: tables out of range, temporaries left behind ----------------

/// Starts on a table that `change` made out of range: the start takes a
/// grace, names the file and says why; the key is not held.
fn out_of_range(name: &str, change: impl FnOnce(&mut TableImage), why: &str) {
    let dir = Scratch::new(name);
    let args = ["--max-lease-ms", "5000"];
    table_with_a_grant(&dir, &args, 5000);
    rewrite_table(&dir, change);
    let table = dir.file("table");
    let serve = Serve::start(&["--state-dir", dir.path(), "--max-lease-ms", "5000"]);
    let named = serve
        .stderr
        .seen
        .iter()
        .find(|l| l.contains(&*table.to_string_lossy()));
    assert!(
        named.is_some_and(|l| l.contains(why) && l.contains("recovery grace")),
        "{:?}",
        serve.stderr.seen
    );
    assert!(
        said(&serve, "recovery grace: no grant"),
        "{:?}",
        serve.stderr.seen
    );
}

#[test]
fn a_table_with_a_lease_beyond_the_kept_maximum_costs_a_grace() {
    out_of_range(
        "long-lease",
        |image| image.grants[0].remaining_ms = 999_999_999,
        "999999999 ms",
    );
}

#[test]
fn a_table_claiming_a_greatest_lease_beyond_the_kept_one_costs_a_grace() {
    out_of_range(
        "long-max",
        |image| image.max_lease_ms = 999_999_999,
        "999999999 ms",
    );
}

#[test]
fn a_table_of_an_epoch_ahead_of_the_record_costs_a_grace() {
    out_of_range("epoch-ahead", |image| image.epoch += 1_000_000, "ahead of");
}

#[test]
fn a_table_with_a_token_of_a_later_epoch_costs_a_grace() {
    // Year 2100: an epoch no start could reach for a long time.
    const EPOCH_2100: u64 = 4_102_444_800_000;
    out_of_range(
        "token-ahead",
        |image| image.grants[0].token = (EPOCH_2100 << 22) | 1,
        "ahead of",
    );
}

#[test]
fn lowering_the_maximum_lease_keeps_the_table_of_longer_leases() {
    let dir = Scratch::new("lowered");
    let token = table_with_a_grant(&dir, &["--max-lease-ms", "60000"], 60_000);
    let serve = Serve::start(&["--state-dir", dir.path(), "--max-lease-ms", "1000"]);
    assert!(!said(&serve, "recovery grace"), "{:?}", serve.stderr.seen);
    let mut raw = Raw::connect(&serve.addr);
    raw.hello_v2();
    raw.send("A 1 k me 0 1000\n");
    raw.expect("T 1 A k");
    raw.send(&format!("R 2 k {token}\n"));
    raw.expect("D 2 R k");
}

#[test]
fn temporaries_left_by_a_full_disk_are_removed_at_the_next_start() {
    let dir = Scratch::new("leftovers");
    table_with_a_grant(&dir, &[], 1000);
    for name in ["table.tmp", "epoch.tmp"] {
        fs::write(dir.file(name), b"ticketing-table 1\nepoch 1\ncou").expect("a torn write");
    }
    let _serve = Serve::start(&["--state-dir", dir.path()]);
    for name in ["table.tmp", "epoch.tmp"] {
        assert!(!dir.file(name).exists(), "{name} is still there");
    }
}
