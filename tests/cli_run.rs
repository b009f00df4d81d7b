//! `ticketing run` (CLI.md): exit statuses, the child's environment, and
//! the release of the grant by its exact token on every path.

mod cli;

use std::time::{Duration, Instant};

use cli::{dead_endpoint, signal, ticketing, Client, Fake, Finished, Proc, Serve, WAIT};
use nix::sys::signal::Signal;

/// `ticketing run --endpoint ADDR --key KEY EXTRA... -- CMD...` to its end.
fn run(addr: &str, key: &str, extra: &[&str], cmd: &[&str]) -> Finished {
    ticketing(&run_args(addr, key, extra, cmd), WAIT)
}

fn run_args<'a>(addr: &'a str, key: &'a str, extra: &[&'a str], cmd: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["run", "--endpoint", addr, "--key", key];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(cmd);
    args
}

/// Prints `TICKETING_KEY TICKETING_TOKEN` and exits with `code`.
fn report_env_and_exit(code: u8) -> String {
    report_env_then(&format!("exit {code}"))
}

/// Prints `TICKETING_KEY TICKETING_TOKEN` and then runs `then`.
fn report_env_then(then: &str) -> String {
    format!("echo \"env $TICKETING_KEY $TICKETING_TOKEN\"; {then}")
}

/// The token a child printed with [`report_env_and_exit`], for `key`.
fn token_of(f: &Finished, key: &str) -> u64 {
    let line = f
        .stdout
        .lines()
        .find(|l| l.starts_with("env "))
        .unwrap_or_else(|| panic!("the child printed no environment: {f:?}"));
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields.len(), 3, "{line:?}");
    assert_eq!(fields[1], key, "TICKETING_KEY: {line:?}");
    fields[2]
        .parse()
        .unwrap_or_else(|_| panic!("TICKETING_TOKEN is not a number: {line:?}"))
}

/// Starts `ticketing run` on `k` with `extra`, its child printing
/// `TICKETING_KEY TICKETING_TOKEN` and then running the shell's `then`;
/// waits for that line and returns the run and the token.
fn start_reporting(addr: &str, extra: &[&str], then: &str) -> (Proc, u64) {
    let child = report_env_then(then);
    let mut p = Proc::start(&run_args(addr, "k", extra, &["sh", "-c", &child]));
    let line = p
        .stdout
        .until("the child's start", |l| l.starts_with("env "));
    let token: u64 = line.rsplit(' ').next().unwrap().parse().expect("token");
    (p, token)
}

/// Reads the rest of `p`'s standard error and asserts that a line of it
/// is one that `pred` is looking for.
#[track_caller]
fn stderr_has(p: &mut Proc, pred: impl Fn(&str) -> bool) {
    p.stderr.rest();
    assert!(p.stderr.seen.iter().any(|l| pred(l)), "{:?}", p.stderr.seen);
}

/// The grant of `key` is gone: a try-lock from another `run` gets it at
/// once (the leases the tests ask for are far longer than this takes), with
/// a newer token than `after`.
fn assert_free(addr: &str, key: &str, after: u64) {
    let f = run(
        addr,
        key,
        &["--wait-ms", "0"],
        &["sh", "-c", &report_env_and_exit(0)],
    );
    assert_eq!(
        f.code,
        Some(0),
        "{key} should be free again (released by token): {f:?}"
    );
    let token = token_of(&f, key);
    assert!(token > after, "token {token} after {after}");
}

#[test]
fn the_childs_exit_status_and_environment() {
    let serve = Serve::start(&[]);
    for code in [0u8, 3] {
        let key = format!("env-{code}");
        let f = run(
            &serve.addr,
            &key,
            &["--lease-ms", "60000"],
            &["sh", "-c", &report_env_and_exit(code)],
        );
        assert_eq!(f.code, Some(i32::from(code)), "{f:?}");
        let token = token_of(&f, &key);
        assert!(token >= 1);
        // Released by exact token as the child ended, long before the
        // 60 s lease: that token is no longer held...
        let mut c = Client::start(&[&serve.addr], &[]);
        c.send(&format!("release r {key} {token}"));
        c.outcome_is("r", "not_held");
        c.finish();
        // ... and the key is free.
        assert_free(&serve.addr, &key, token);
    }
}

#[test]
fn not_acquired_when_another_holds_the_key() {
    let serve = Serve::start(&[]);
    let mut holder = Client::start(&[&serve.addr], &[]);
    holder.send("acquire h k holder 0 60000");
    holder.granted("h", "k");

    for wait in ["0", "200"] {
        let f = run(
            &serve.addr,
            "k",
            &["--wait-ms", wait],
            &["sh", "-c", "echo ran"],
        );
        assert_eq!(f.code, Some(75), "contended, --wait-ms {wait}: {f:?}");
        assert!(!f.stdout.contains("ran"), "the command must not run: {f:?}");
        assert!(f.stderr.contains("not acquired"), "{f:?}");
    }
    // `run` released nothing of the holder's.
    holder.send("release-grant r h");
    holder.outcome_is("r", "released");
    holder.finish();
    assert_free(&serve.addr, "k", 0);
}

/// `run` on `addr` with `extra` exits 75 without running its command and
/// says `why` on its standard error.
fn not_acquired(addr: &str, extra: &[&str], why: &str) {
    let f = run(addr, "k", extra, &["sh", "-c", "echo ran"]);
    assert_eq!(f.code, Some(75), "{f:?}");
    assert!(!f.stdout.contains("ran"), "{f:?}");
    assert!(f.stderr.contains(why), "{f:?}");
}

#[test]
fn not_acquired_without_a_server() {
    let dead = dead_endpoint();
    not_acquired(
        &dead,
        &["--wait-ms", "0", "--queue-grace-ms", "200"],
        "not acquired",
    );
}

/// Welcomes, then never answers.
fn silent(line: &str) -> Vec<String> {
    if line.starts_with("H ") {
        vec!["W fake 8".into()]
    } else {
        vec![]
    }
}

#[test]
fn an_indeterminate_acquire_is_75_and_the_command_does_not_run() {
    let fake = Fake::start(silent);
    not_acquired(
        &fake.addr,
        &["--wait-ms", "0", "--answer-grace-ms", "200"],
        "indeterminate",
    );
}

#[test]
fn a_lease_about_to_run_out_stops_the_child_with_124() {
    let serve = Serve::start(&[]);
    // Not renewed: the client stops the child a kill grace (1 s) before
    // the lease ends: about 2 s in, 1 s before the server would free the
    // key by itself.
    let lease_ms = 3000;
    let lease = lease_ms.to_string();
    let (mut p, token) = start_reporting(
        &serve.addr,
        &[
            "--lease-ms",
            &lease,
            "--no-renew",
            "--kill-grace-ms",
            "1000",
        ],
        "exec sleep 30",
    );
    let granted_at = Instant::now();
    let (status, _) = p.wait(WAIT);
    let ran = granted_at.elapsed();
    assert_eq!(status.code(), Some(124), "{status}");
    assert!(
        ran < Duration::from_millis(lease_ms),
        "stopped after {ran:?}, not before the lease ran out"
    );
    stderr_has(&mut p, |l| l.contains("about to run out"));
    // Released, not left to expire.
    assert_free(&serve.addr, "k", token);
    assert!(
        granted_at.elapsed() < Duration::from_millis(lease_ms),
        "the check came too late to tell a release from expiry ({:?}); \
         the machine is too slow for this test",
        granted_at.elapsed()
    );
}

#[test]
fn a_command_that_cannot_start_is_127() {
    let serve = Serve::start(&[]);
    let f = run(
        &serve.addr,
        "k",
        &["--lease-ms", "60000"],
        &["/nonexistent/ticketing-test-command"],
    );
    assert_eq!(f.code, Some(127), "{f:?}");
    assert!(f.stderr.contains("cannot run"), "{f:?}");
    assert_free(&serve.addr, "k", 0);
}

/// `ticketing run` gets `sig` while its child runs: the child is stopped,
/// the exit status is 128 + the signal, the grant is released.
fn stopped_by(sig: Signal, code: i32) {
    let serve = Serve::start(&[]);
    let (mut p, token) = start_reporting(&serve.addr, &["--lease-ms", "60000"], "exec sleep 30");
    signal(p.pid(), sig);
    let (status, _) = p.wait(WAIT);
    assert_eq!(status.code(), Some(code), "after {sig}: {status}");
    // The child is gone too: its end closed the output pipe.
    p.stdout.rest();
    assert_free(&serve.addr, "k", token);
}

#[test]
fn sigint_while_the_child_runs_is_130() {
    stopped_by(Signal::SIGINT, 130);
}

#[test]
fn sigterm_while_the_child_runs_is_143() {
    stopped_by(Signal::SIGTERM, 143);
}

#[test]
fn a_command_that_runs_ten_times_its_lease_keeps_the_lock_the_whole_time() {
    let serve = Serve::start(&[]);
    let started = Instant::now();
    let (mut first, token) = start_reporting(&serve.addr, &["--lease-ms", "300"], "sleep 3");
    // Well past its first lease, and again later: another run cannot get it.
    for at in [Duration::from_millis(900), Duration::from_millis(2_100)] {
        std::thread::sleep(at.saturating_sub(started.elapsed()));
        let other = run(
            &serve.addr,
            "k",
            &["--wait-ms", "0"],
            &["sh", "-c", &report_env_and_exit(0)],
        );
        assert_eq!(other.code, Some(75), "held at {at:?}: {other:?}");
    }
    let (status, _) = first.wait(WAIT);
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_free(&serve.addr, "k", token);
}

#[test]
fn when_renewal_stops_the_child_is_stopped_before_the_lease_runs_out_with_124() {
    let serve = Serve::start(&[]);
    // Renewed for at most 300 ms of a 600 ms lease: valid until about
    // 800 ms in. The child ignores SIGTERM and is killed a grace later.
    let mut p = Proc::start(&run_args(
        &serve.addr,
        "k",
        &[
            "--lease-ms",
            "600",
            "--max-hold-ms",
            "300",
            "--kill-grace-ms",
            "200",
        ],
        &["sh", "-c", "trap '' TERM; echo started; exec sleep 30"],
    ));
    p.stdout.until("the child's start", |l| l == "started");
    let started = Instant::now();
    let (status, _) = p.wait(WAIT);
    assert_eq!(status.code(), Some(124), "{status}");
    let ran = started.elapsed();
    assert!(
        ran < Duration::from_secs(5),
        "the child was killed: {ran:?}"
    );
    stderr_has(&mut p, |l| l.contains("about to run out"));
}

#[test]
fn a_lost_lease_stops_the_child_with_124() {
    let mut serve = Serve::start(&[]);
    let addr = serve.addr.clone();
    let mut p = Proc::start(&run_args(
        &addr,
        "k",
        &["--lease-ms", "1500", "--kill-grace-ms", "200"],
        &["sh", "-c", "echo started; exec sleep 30"],
    ));
    p.stdout.until("the child's start", |l| l == "started");
    // The server restarts without its table: the next renewal is answered
    // N, the lease is lost.
    serve.kill();
    let _restarted = Serve::start_on(&addr, &[], |_| {});
    let (status, _) = p.wait(WAIT);
    assert_eq!(status.code(), Some(124), "{status}");
    stderr_has(&mut p, |l| {
        l.contains("was lost") || l.contains("about to run out")
    });
}
