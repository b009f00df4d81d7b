//! `ticketing client` (CLI.md) as a coprocess against `ticketing serve`:
//! every command and every kind of output object.

mod cli;

use std::time::{Duration, Instant};

use cli::{dead_endpoint, Client, Fake, Raw, Serve};
use serde_json::Value;

/// The settle margin the client adds by default (PROTOCOL.md: 1 s).
const MARGIN_MS: u64 = 1000;

fn u64_of(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} is not a u64 in {v}"))
}

#[test]
fn acquire_try_lock_release_and_release_grant() {
    let serve = Serve::start(&["--node-id", "alpha", "--window", "9"]);
    let mut c = Client::start(&[&serve.addr], &[]);

    let connecting = c.event("connecting");
    assert_eq!(connecting["addr"], serve.addr.as_str(), "{connecting}");
    let connected = c.event("connected");
    assert_eq!(connected["addr"], serve.addr.as_str(), "{connected}");
    assert_eq!(connected["node"], "alpha", "{connected}");
    assert_eq!(connected["window"], 9, "{connected}");

    c.send("acquire a1 k me 0 5000");
    let (t1, lease) = c.granted("a1", "k");
    assert_eq!(lease, 5000, "the lease asked for");

    // A contended try-lock: sent, answered T.
    c.send("acquire a2 k me 0 5000");
    let v = c.outcome_is("a2", "timed_out");
    assert_eq!(v["op"], "acquire");
    assert_eq!(v["key"], "k");
    assert_eq!(v["sent"], true, "{v}");

    // Release by raw token, then again: the second is not held.
    c.send(&format!("release r1 k {t1}"));
    let v = c.outcome_is("r1", "released");
    assert_eq!(v["op"], "release");
    assert_eq!(v["key"], "k");
    c.send(&format!("release r2 k {t1}"));
    c.outcome_is("r2", "not_held");

    // Release of a grant by the acquire's tag.
    c.send("acquire a3 k me 0 5000");
    let (t3, _) = c.granted("a3", "k");
    assert!(t3 > t1, "tokens grow: {t3} after {t1}");
    c.send("release-grant r3 a3");
    let v = c.outcome_is("r3", "released");
    assert_eq!(v["op"], "release");
    assert_eq!(v["key"], "k");
    // That grant is gone, and cannot be released twice through its tag.
    c.send(&format!("release r4 k {t3}"));
    c.outcome_is("r4", "not_held");
    c.send("release-grant r5 a3");
    let message = c.error();
    assert!(message.contains("a3"), "{message}");

    c.send("acquire a4 k me 0 5000");
    c.granted("a4", "k");
    let rest = c.finish();
    assert!(
        !rest.iter().any(|v| v["type"] == "outcome"),
        "nothing was left open: {rest:?}"
    );
}

#[test]
fn an_unsent_acquire_times_out_and_one_is_cancelled_without_a_server() {
    let dead = dead_endpoint();
    let mut c = Client::start(&[&dead], &["--queue-grace-ms", "300"]);
    assert_eq!(c.event("connecting")["addr"], dead.as_str());
    assert_eq!(c.closed(), "connect_failed");

    let asked = Instant::now();
    c.send("acquire a1 k me 0 1000");
    c.send("acquire a2 k me 60000 1000");
    c.send("cancel a2");
    let v = c.outcome_is("a2", "cancelled");
    assert_eq!(v["key"], "k");
    let v = c.outcome_is("a1", "timed_out");
    assert_eq!(v["sent"], false, "never sent: {v}");
    // It waited `max(wait_ms, queue_grace)` for a connection, not less.
    assert!(
        asked.elapsed() >= Duration::from_millis(250),
        "timed out after {:?}",
        asked.elapsed()
    );
    // Cancelling an ended acquire changes nothing and says nothing.
    c.send("cancel a2");
    c.send("shutdown 300");
    let rest = c.finish_without_closing_stdin();
    assert!(
        !rest
            .iter()
            .any(|v| v["type"] == "error" || v["type"] == "outcome"),
        "{rest:?}"
    );
}

#[test]
fn busy_when_the_servers_queue_is_full() {
    let serve = Serve::start(&["--queue-limit", "0"]);
    let mut holder = Client::start(&[&serve.addr], &[]);
    holder.send("acquire h k me 0 30000");
    holder.granted("h", "k");

    // Fail-fast: the first B is the outcome, well before the budget.
    let mut fast = Client::start(&[&serve.addr], &["--busy", "fail-fast"]);
    fast.event("connected");
    let asked = Instant::now();
    fast.send("acquire b1 k me 20000 1000");
    let v = fast.outcome_is("b1", "busy");
    assert_eq!(v["key"], "k");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "fail-fast took {:?}",
        asked.elapsed()
    );

    // Retry (the default): B is retried within the budget, then Busy.
    let mut patient = Client::start(&[&serve.addr], &[]);
    patient.send("acquire b2 k me 300 1000");
    patient.outcome_is("b2", "busy");

    // The queue limit counts waiters, never the holder: a try-lock of
    // another key is granted.
    fast.send("acquire b3 j me 1000 1000");
    fast.granted("b3", "j");
    holder.send("release-grant r h");
    holder.outcome_is("r", "released");
    holder.finish();
    fast.finish();
    patient.finish();
}

/// Submits `acquire TAG k me WAIT LEASE` while `k` is held, and makes sure
/// it was handed to the transport: the acquires are sent in order, so once
/// a later try-lock of another key is answered, this one was sent.
fn send_waiting_acquire(c: &mut Client, tag: &str, wait_ms: u64, lease_ms: u64) {
    c.send(&format!("acquire {tag} k me {wait_ms} {lease_ms}"));
    let marker = format!("{tag}-marker");
    c.send(&format!("acquire {marker} {marker} me 0 1000"));
    c.granted(&marker, &marker);
}

#[test]
fn cancelling_a_sent_acquire_under_close_is_indeterminate() {
    let serve = Serve::start(&[]);
    let mut c = Client::start(&[&serve.addr], &["--on-cancel", "close"]);
    c.send("acquire a1 k me 0 30000");
    let (t1, _) = c.granted("a1", "k");
    send_waiting_acquire(&mut c, "a2", 5000, 2000);
    assert_eq!(c.count(|v| v["event"] == "closed"), 0);

    c.send("cancel a2");
    assert_eq!(c.closed(), "cancel");
    let v = c.outcome_is("a2", "indeterminate");
    assert_eq!(v["key"], "k");
    // Gave up now, plus wait, plus lease, plus the margin.
    let settled = u64_of(&v, "settled_within_ms");
    let most = 5000 + 2000 + MARGIN_MS;
    assert!(
        settled <= most && settled > most - 3000,
        "settled_within_ms {settled}, expected about {most}"
    );

    // The client reconnects; the grant made before survives the close and
    // is released by its token.
    c.event("connecting");
    c.event("connecting");
    c.event("connected");
    c.event("connected");
    c.send("release-grant r1 a1");
    c.outcome_is("r1", "released");
    // The cancelled waiter was dropped with its connection: `k` is free.
    c.send("acquire a3 k me 0 1000");
    let (t3, _) = c.granted("a3", "k");
    assert!(t3 > t1);
    c.finish();
}

#[test]
fn cancelling_a_sent_acquire_under_keep_waiter_releases_its_late_grant() {
    let serve = Serve::start(&[]);
    let mut c = Client::start(&[&serve.addr], &["--on-cancel", "keep-waiter"]);
    c.send("acquire a1 k me 0 30000");
    let (t1, _) = c.granted("a1", "k");
    send_waiting_acquire(&mut c, "a2", 20_000, 30_000);

    c.send("cancel a2");
    let v = c.outcome_is("a2", "indeterminate");
    assert!(u64_of(&v, "settled_within_ms") > 30_000, "{v}");

    // Freeing `k` grants the abandoned waiter; the client releases that
    // grant by its exact token, on the same connection.
    c.send("release-grant r1 a1");
    c.outcome_is("r1", "released");
    let orphan = c.event("orphan_release");
    assert_eq!(orphan["key"], "k");
    let token = u64_of(&orphan, "token");
    assert!(token > t1, "the waiter's grant: {token} after {t1}");
    let settled = c.event("orphan_settled");
    assert_eq!(settled["token"], token);
    assert_eq!(settled["result"], "released");

    c.send("acquire a3 k me 0 1000");
    let (t3, _) = c.granted("a3", "k");
    assert!(t3 > token);
    assert_eq!(
        c.count(|v| v["event"] == "closed"),
        0,
        "the connection stayed up"
    );
    c.finish();
}

#[test]
fn abandon_releases_the_grant_by_its_token() {
    let serve = Serve::start(&[]);
    let mut c = Client::start(&[&serve.addr], &[]);
    c.send("acquire a1 k me 0 30000");
    let (t1, _) = c.granted("a1", "k");

    let started = Instant::now();
    c.send("abandon a1");
    let orphan = c.event("orphan_release");
    assert_eq!(orphan["key"], "k");
    assert_eq!(orphan["token"], t1);
    let settled = c.event("orphan_settled");
    assert_eq!(settled["token"], t1);
    assert_eq!(settled["result"], "released");

    // Free long before its 30 s lease, for anyone.
    let mut other = Client::start(&[&serve.addr], &[]);
    other.send("acquire o1 k other 0 1000");
    let (t2, _) = other.granted("o1", "k");
    assert!(t2 > t1);
    assert!(started.elapsed() < Duration::from_secs(20));

    // The grant is no longer the caller's.
    c.send("abandon a1");
    assert!(c.error().contains("a1"));
    c.send("release-grant r1 a1");
    assert!(c.error().contains("a1"));
    c.finish();
    other.finish();
}

#[test]
fn when_the_server_dies_a_waiting_acquire_is_indeterminate_and_a_release_lapses() {
    let mut serve = Serve::start(&[]);
    let mut c = Client::start(&[&serve.addr], &["--queue-grace-ms", "100"]);
    c.send("acquire a1 k me 0 300");
    let (_, lease) = c.granted("a1", "k");
    assert_eq!(lease, 300);
    c.send("acquire a2 j me 0 30000");
    c.granted("a2", "j");
    send_waiting_acquire(&mut c, "a3", 5000, 2000);

    serve.kill();
    let reason = c.closed();
    assert!(
        reason == "eof" || reason == "io",
        "closed because the server died: {reason}"
    );
    let v = c.outcome_is("a3", "indeterminate");
    assert!(u64_of(&v, "settled_within_ms") <= 5000 + 2000 + MARGIN_MS);
    assert_eq!(c.closed(), "connect_failed");

    // Nobody can answer this release before its deadline (the lease as the
    // client knows it, plus the margin).
    let asked = Instant::now();
    c.send("release-grant r1 a1");
    let v = c.outcome_is("r1", "lapsed");
    assert_eq!(v["op"], "release");
    assert_eq!(v["key"], "k");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "lapsed after {:?}",
        asked.elapsed()
    );
    c.send("shutdown 200");
    c.finish_without_closing_stdin();
}

#[test]
fn a_release_that_cannot_be_sent_lapses_within_the_shutdown_budget() {
    let dead = dead_endpoint();
    let mut c = Client::start(&[&dead], &[]);
    c.send("release r1 k 7");
    c.send("shutdown 300");
    let v = c.outcome_is("r1", "lapsed");
    assert_eq!(v["key"], "k");
    c.finish_without_closing_stdin();
}

#[test]
fn handshake_refusals_close_with_their_reason() {
    for (args, reason) in [
        (&["--role", "no-leader"][..], "no_leader"),
        (&["--role", "not-active"][..], "not_active"),
        (&["--credential", "sesame"][..], "auth_failed"),
    ] {
        let serve = Serve::start(args);
        let mut c = Client::start(&[&serve.addr], &["--credential", "wrong"]);
        assert_eq!(c.event("connecting")["addr"], serve.addr.as_str());
        let closed = c.event("closed");
        assert_eq!(closed["reason"], reason, "{args:?}");
        assert_eq!(closed["addr"], serve.addr.as_str());
        if reason == "auth_failed" {
            let v = c.event("auth_failed");
            assert_eq!(v["addr"], serve.addr.as_str());
        }
        assert_eq!(c.count(|v| v["event"] == "connected"), 0);
        c.send("shutdown 200");
        c.finish_without_closing_stdin();
    }

    // The right credential is let in.
    let serve = Serve::start(&["--credential", "sesame"]);
    let mut c = Client::start(&[&serve.addr], &["--credential", "sesame"]);
    c.event("connected");
    c.send("acquire a1 k me 0 1000");
    c.granted("a1", "k");
    c.finish();
}

#[test]
fn moved_follows_an_allowed_leader() {
    let leader = Serve::start(&["--node-id", "leader"]);
    let follower = Serve::start(&["--role", "follower", "--leader", &leader.addr]);
    let mut c = Client::start(&[&follower.addr], &["--allow", &leader.addr]);
    assert_eq!(c.event("connecting")["addr"], follower.addr.as_str());
    let closed = c.event("closed");
    assert_eq!(closed["reason"], "moved");
    assert_eq!(closed["addr"], follower.addr.as_str());
    assert_eq!(c.event("connecting")["addr"], leader.addr.as_str());
    let connected = c.event("connected");
    assert_eq!(connected["addr"], leader.addr.as_str());
    assert_eq!(connected["node"], "leader");
    c.send("acquire a1 k me 0 1000");
    c.granted("a1", "k");
    c.finish();
}

#[test]
fn leader_hints_are_taken_when_allowed_and_ignored_otherwise() {
    let serve = Serve::start(&["--leader-hint", "127.0.0.1:7003"]);
    let mut allowed = Client::start(&[&serve.addr], &["--allow", "127.0.0.1:7003"]);
    allowed.event("connected");
    assert_eq!(allowed.event("leader_hint")["addr"], "127.0.0.1:7003");
    let mut other = Client::start(&[&serve.addr], &[]);
    other.event("connected");
    assert_eq!(other.event("hint_ignored")["addr"], "127.0.0.1:7003");
    // Either way the connection stays and serves.
    allowed.send("acquire a1 k me 0 1000");
    allowed.granted("a1", "k");
    other.send("acquire a1 j me 0 1000");
    other.granted("a1", "j");
    assert_eq!(allowed.count(|v| v["event"] == "hint_ignored"), 0);
    assert_eq!(other.count(|v| v["event"] == "leader_hint"), 0);
    allowed.finish();
    other.finish();
}

/// A server that welcomes and then answers any request with a line that
/// is not a frame.
fn garbling(line: &str) -> Vec<String> {
    if line.starts_with("H ") {
        vec!["W fake 8".into()]
    } else {
        vec!["this is not a frame".into()]
    }
}

/// A server that welcomes and then answers an acquire for another id.
fn misnumbering(line: &str) -> Vec<String> {
    let f: Vec<&str> = line.split(' ').collect();
    match f[0] {
        "H" => vec!["W fake 8".into()],
        "A" => vec![format!("T 999999 A {}", f[2])],
        _ => vec![],
    }
}

/// A server that welcomes and then never answers.
fn silent(line: &str) -> Vec<String> {
    if line.starts_with("H ") {
        vec!["W fake 8".into()]
    } else {
        vec![]
    }
}

/// A server that refuses every handshake with an unknown reason.
fn overloaded(_: &str) -> Vec<String> {
    vec!["E overloaded".into()]
}

#[test]
fn protocol_violations_close_with_protocol_reasons() {
    for (respond, prefix) in [
        (garbling as fn(&str) -> Vec<String>, "protocol:framing:"),
        (misnumbering, "protocol:"),
    ] {
        let fake = Fake::start(respond);
        let mut c = Client::start(&[&fake.addr], &[]);
        let connected = c.event("connected");
        assert_eq!(connected["node"], "fake");
        assert_eq!(connected["window"], 8);
        c.send("acquire a1 k me 0 1000");
        let reason = c.closed();
        assert!(reason.starts_with(prefix), "{reason}, expected {prefix}...");
        c.outcome_is("a1", "indeterminate");
        c.send("shutdown 200");
        c.finish_without_closing_stdin();
    }
}

#[test]
fn an_answer_that_never_comes_closes_with_answer_timeout() {
    let fake = Fake::start(silent);
    let mut c = Client::start(&[&fake.addr], &["--answer-grace-ms", "200"]);
    c.event("connected");
    c.send("acquire a1 k me 100 1000");
    assert_eq!(c.closed(), "answer_timeout");
    let v = c.outcome_is("a1", "indeterminate");
    assert!(u64_of(&v, "settled_within_ms") <= 100 + 1000 + MARGIN_MS);
    c.send("shutdown 200");
    c.finish_without_closing_stdin();
}

#[test]
fn another_e_closes_with_error_reason() {
    let fake = Fake::start(overloaded);
    let mut c = Client::start(&[&fake.addr], &[]);
    assert_eq!(c.closed(), "error:overloaded");
    c.send("shutdown 200");
    c.finish_without_closing_stdin();
}

#[test]
fn bad_command_lines_get_an_error_and_the_client_goes_on() {
    let serve = Serve::start(&[]);
    let mut c = Client::start(&[&serve.addr], &[]);
    let bad = [
        "bogus",
        "acquire a1 k me 0",
        "acquire a1 k me zero 1000",
        "acquire a1 k me 0 -5",
        "release r1 k",
        "release r1 k token",
        "release-grant r1",
        "cancel",
        "cancel nobody",
        "abandon nobody",
        "release-grant r1 nobody",
        "shutdown soon",
        "acquire a\u{e9} k me 0 1000",
    ];
    for line in bad {
        c.send(line);
    }
    // Skipped without a word.
    c.send("");
    c.send("   ");
    c.send("# acquire c1 k me 0 1000");
    c.send("acquire a1 k me 0 1000");
    c.granted("a1", "k");
    // A tag is used once.
    c.send("acquire a1 j me 0 1000");
    c.send("acquire a2 j me 0 1000");
    c.granted("a2", "j");
    let errors = c.count(|v| v["type"] == "error");
    assert_eq!(
        errors,
        bad.len() + 1,
        "one error per bad line, none for blank lines and comments:\n{:?}",
        c.all
    );
    for v in c.all.iter().filter(|v| v["type"] == "error") {
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    assert_eq!(c.count(|v| v["tag"] == "c1"), 0);
    c.finish();
}

#[test]
fn end_of_input_drains_the_release_lane_then_done() {
    let serve = Serve::start(&[]);
    let mut c = Client::start(&[&serve.addr], &[]);
    c.send("acquire a1 k me 0 30000");
    c.granted("a1", "k");
    // The release is submitted and input ends at once: it is drained.
    c.send("release-grant r1 a1");
    let rest = c.finish();
    // Nothing read the output after the grant, so all of it is in `rest`.
    let released = rest
        .iter()
        .any(|v| v["tag"] == "r1" && v["outcome"] == "released");
    assert!(released, "r1 released before done: {rest:?}");
    assert!(
        rest.iter()
            .any(|v| v["event"] == "closed" && v["reason"] == "shutdown"),
        "{rest:?}"
    );

    // The key is free long before its lease would end.
    let mut raw = Raw::connect(&serve.addr);
    raw.hello();
    raw.grant(1, "k", 0, 1000);
}

#[test]
fn shutdown_ends_the_session_without_end_of_input() {
    let serve = Serve::start(&[]);
    let mut c = Client::start(&[&serve.addr], &[]);
    c.send("acquire a1 k me 0 30000");
    let (t1, _) = c.granted("a1", "k");
    send_waiting_acquire(&mut c, "a2", 30_000, 1000);
    c.send("acquire a3 k me 30000 1000");
    c.send("release-grant r1 a1");
    c.send("shutdown 3000");
    // The client stops reading: stdin stays open, yet it ends.
    let rest = c.finish_without_closing_stdin();
    let outcome = |tag: &str| {
        rest.iter()
            .find(|v| v["type"] == "outcome" && v["tag"] == tag)
            .unwrap_or_else(|| panic!("no outcome for {tag}: {rest:?}"))
            .clone()
    };
    // The release was drained. Cancelling the sent acquires closes the
    // connection (`--on-cancel close`), so a release in flight then may be
    // sent again and answered N: NotHeld, the grant is gone either way.
    let r1 = outcome("r1");
    assert!(
        r1["outcome"] == "released" || r1["outcome"] == "not_held",
        "{r1}"
    );
    let mut raw = Raw::connect(&serve.addr);
    raw.hello();
    raw.send(&format!("R 1 k {t1}\n"));
    raw.expect("N 1 R k");
    // Every acquire got exactly one outcome.
    for tag in ["a2", "a3"] {
        let v = outcome(tag);
        assert!(
            ["granted", "cancelled", "indeterminate", "timed_out"]
                .contains(&v["outcome"].as_str().unwrap_or("")),
            "{v}"
        );
        assert_eq!(
            rest.iter()
                .filter(|v| v["type"] == "outcome" && v["tag"] == tag)
                .count(),
            1
        );
    }
    // The connection ended, by the shutdown or already by the cancel of a
    // sent acquire (when the lane needed no new connection after it).
    assert!(
        rest.iter()
            .any(|v| v["event"] == "closed"
                && (v["reason"] == "shutdown" || v["reason"] == "cancel")),
        "{rest:?}"
    );
}

#[test]
fn a_line_that_is_not_utf8_gets_an_error_and_the_client_goes_on() {
    let serve = Serve::start(&[]);
    let mut c = Client::start(&[&serve.addr], &[]);
    c.event("connected");
    c.send_bytes(b"\xff\xfe\xfd\n");
    c.send_bytes(b"acquire a1 k me 0 1000 \xc3\n");
    c.send("acquire a2 k me 0 1000");
    let first = c.error();
    assert!(first.contains("UTF-8"), "{first}");
    let second = c.error();
    assert!(
        second.contains("UTF-8") && second.contains("acquire a1"),
        "{second}"
    );
    c.granted("a2", "k");
    // In that order, and stdin still open until now.
    let kinds: Vec<&str> = c
        .all
        .iter()
        .filter(|v| v["type"] != "event")
        .map(|v| v["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["error", "error", "outcome"], "{:?}", c.all);
    assert_eq!(c.count(|v| v["tag"] == "a1"), 0, "the bad line ran nothing");
    let rest = c.finish();
    assert!(
        !rest.iter().any(|v| v["type"] == "error"),
        "nothing more was wrong: {rest:?}"
    );
}

#[test]
fn a_line_of_any_length_gets_one_error_and_is_not_kept() {
    /// The line: 64 MiB without a newline.
    const LONG: usize = 64 << 20;
    /// The most the client's resident memory may grow by while it reads
    /// the line: 8 MiB. It keeps at most 4 KiB of a line and reads through
    /// an 8 KiB buffer; the rest is slack for the allocator. A client that
    /// kept the line would grow by at least its 64 MiB.
    const RSS_GROWTH_BOUND_KB: u64 = 8 << 10;

    let serve = Serve::start(&[]);
    let mut c = Client::start(&[&serve.addr], &[]);
    c.event("connected");
    let pid = c.pid();
    let before = cli::status_kb(pid, "VmRSS");
    let mut peak = before;
    let chunk = vec![b'Z'; 1 << 20];
    for _ in 0..LONG / chunk.len() {
        c.send_bytes(&chunk);
        peak = peak.max(cli::status_kb(pid, "VmRSS"));
    }
    c.send_bytes(b"\n");
    c.send("acquire a1 k me 0 1000");
    let message = c.error();
    c.granted("a1", "k");
    peak = peak.max(cli::status_kb(pid, "VmRSS"));
    let growth = peak.saturating_sub(before);
    eprintln!("a {LONG}-byte line: VmRSS {before} kB before, peak {peak} kB, growth {growth} kB");
    assert!(
        growth <= RSS_GROWTH_BOUND_KB,
        "the client grew by {growth} kB reading a {LONG}-byte line"
    );
    assert!(message.contains("too long"), "{message}");
    let quoted = message.matches('Z').count();
    assert!(
        quoted <= 100,
        "the message quotes {quoted} bytes of the line: {}",
        &message[..message.len().min(300)]
    );
    assert!(message.len() < 300, "{} bytes of message", message.len());
    assert_eq!(c.count(|v| v["type"] == "error"), 1, "{:?}", c.all);
    let rest = c.finish();
    assert!(
        !rest.iter().any(|v| v["type"] == "error"),
        "one error for the line, no more: {rest:?}"
    );
}

/// A server that accepts connections and never says a word.
fn mute(_: &str) -> Vec<String> {
    Vec::new()
}

#[test]
fn a_handshake_that_gets_no_answer_closes_with_handshake_timeout() {
    let fake = Fake::start(mute);
    let mut c = Client::start(&[&fake.addr], &[]);
    assert_eq!(c.event("connecting")["addr"], fake.addr.as_str());
    // The client core's handshake timeout is 5 s.
    let closed = c.event("closed");
    assert_eq!(closed["reason"], "handshake_timeout", "{closed}");
    assert_eq!(closed["addr"], fake.addr.as_str(), "{closed}");
    assert_eq!(c.count(|v| v["event"] == "connected"), 0);
    c.send("shutdown 200");
    c.finish_without_closing_stdin();
}

#[test]
fn a_connect_that_does_not_complete_closes_with_connect_timeout() {
    // A listener with a backlog of 1 that never accepts: once its queue is
    // full the kernel drops further SYNs, so a connect neither completes
    // nor fails.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime");
    let listener = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        socket.listen(1).expect("listen")
    });
    let addr = listener.local_addr().expect("addr");
    let fillers: Vec<std::net::TcpStream> = (0..8)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()
        })
        .collect();
    assert!(!fillers.is_empty(), "the backlog takes some connections");
    let addr = addr.to_string();
    let mut c = Client::start(&[&addr], &[]);
    assert_eq!(c.event("connecting")["addr"], addr.as_str());
    // The client core's connect timeout is 5 s.
    let closed = c.event("closed");
    assert_eq!(closed["reason"], "connect_timeout", "{closed}");
    assert_eq!(closed["addr"], addr.as_str(), "{closed}");
    c.send("shutdown 200");
    c.finish_without_closing_stdin();
    drop((fillers, listener));
}

/// The renewal commands and the four renewal events (CLI.md).
#[test]
fn renewal_commands_and_events() {
    let serve = Serve::start(&["--node-id", "alpha"]);
    let mut c = Client::start(&[&serve.addr], &[]);
    c.event("connected");
    let event = |c: &mut Client, name: &str, tag: &str| {
        let name = name.to_string();
        let tag = tag.to_string();
        c.wait_for(&format!("{name} of {tag}"), move |v| {
            v["type"] == "event" && v["event"] == name.as_str() && v["tag"] == tag.as_str()
        })
    };

    // Renewed automatically, a third of the way through each lease.
    c.send("acquire a1 k me 0 600 renew");
    let (token, _) = c.granted("a1", "k");
    for _ in 0..3 {
        let v = event(&mut c, "renewed", "a1");
        assert_eq!(
            (v["key"].as_str(), v["token"].as_u64()),
            (Some("k"), Some(token)),
            "{v}"
        );
        let valid_for = u64_of(&v, "valid_for_ms");
        assert!(valid_for > 0 && valid_for <= 600, "{v}");
    }
    // Held past several leases: another try-lock of the key times out.
    c.send("acquire a2 k me 0 600");
    c.outcome_is("a2", "timed_out");
    // Stopped: it runs out, told once.
    c.send("auto-renew a1 off");
    let v = event(&mut c, "lease_expired", "a1");
    assert_eq!(v["token"].as_u64(), Some(token), "{v}");
    // Renewing an expired grant is refused; releasing it still goes.
    c.send("renew a1");
    let message = c.error();
    assert!(message.contains("expired"), "{message}");
    c.send("release-grant r1 a1");
    c.outcome("r1");

    // Renewed by hand, with a lease of its own, and with a limit.
    c.send("acquire a3 m me 0 600");
    c.granted("a3", "m");
    c.send("renew a3 5000");
    let v = event(&mut c, "renewed", "a3");
    assert!(u64_of(&v, "valid_for_ms") > 600, "the lease asked: {v}");
    c.send("acquire a4 n me 0 600 renew=100");
    c.granted("a4", "n");
    event(&mut c, "lease_expired", "a4");

    // Bad lines.
    for line in [
        "acquire a5 k me 0 600 renew=soon",
        "acquire a5 k me 0 600 forever",
        "auto-renew a3 maybe",
        "renew nobody",
    ] {
        c.send(line);
        let message = c.error();
        assert!(!message.is_empty(), "{line}");
    }
    c.finish();
}

/// `stats` (CLI.md): one object whose counts match the outcomes printed.
#[test]
fn stats_match_the_outcomes_printed() {
    let serve = Serve::start(&["--node-id", "alpha"]);
    let mut c = Client::start(&[&serve.addr], &[]);
    c.event("connected");
    c.send("acquire a1 k me 0 5000");
    let (token, _) = c.granted("a1", "k");
    c.send("acquire a2 k me 0 5000");
    c.outcome_is("a2", "timed_out");
    c.send("acquire a3 j me 0 5000");
    c.granted("a3", "j");
    c.send("release-grant r1 a1");
    c.outcome_is("r1", "released");
    c.send(&format!("release r2 k {token}"));
    c.outcome_is("r2", "not_held");
    c.send("stats");
    let v = c.wait_for("the stats", |v| v["type"] == "stats");
    let outcomes: Vec<&Value> = c.all.iter().filter(|v| v["type"] == "outcome").collect();
    let count = |op: &str, outcome: &str| {
        outcomes
            .iter()
            .filter(|v| v["op"] == op && v["outcome"] == outcome)
            .count() as u64
    };
    assert_eq!(u64_of(&v["acquires"], "started"), 3, "{v}");
    assert_eq!(u64_of(&v["releases"], "started"), 2);
    for (counts, op, outcome) in [
        ("acquires", "acquire", "granted"),
        ("acquires", "acquire", "timed_out"),
        ("releases", "release", "released"),
        ("releases", "release", "not_held"),
    ] {
        assert_eq!(
            u64_of(&v[counts], outcome),
            count(op, outcome),
            "{counts}.{outcome}"
        );
    }
    assert_eq!(u64_of(&v, "connected"), 1);
    assert_eq!(u64_of(&v["now"], "held"), 1, "j is still held");
    assert_eq!(u64_of(&v["grant_wait_ms"], "count"), 2);
    assert_eq!(
        u64_of(&v["lease_left_at_release_ms"], "count"),
        1,
        "the grant of a1"
    );
    c.finish();
}
