//! `ticketing serve` (CLI.md), run as a process and spoken to over raw TCP.

mod cli;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::thread;
use std::time::{Duration, Instant};

use cli::{status_kb, Raw, Serve, WAIT};
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::Signal;
use nix::unistd::{sysconf, SysconfVar};

fn stops_with_status_0_on(sig: Signal) {
    let mut serve = Serve::start(&[]);
    let addr: SocketAddr = serve
        .addr
        .parse()
        .unwrap_or_else(|e| panic!("`listening on {}`: not an address: {e}", serve.addr));
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_ne!(addr.port(), 0, "the chosen port is shown, not 0");

    // It accepts connections at the printed address.
    let mut raw = Raw::connect(&serve.addr);
    assert_eq!(raw.hello(), ("node-1".to_string(), 64));
    raw.grant(1, "k", 0, 1000);

    serve.signal(sig);
    let status = serve.wait_exit(WAIT);
    assert_eq!(status.code(), Some(0), "serve after {sig}: {status}");
    // Stopping closed the connection.
    raw.expect_closed("the connection of a stopped server");
}

#[test]
fn prints_listening_on_and_sigterm_stops_it_with_status_0() {
    stops_with_status_0_on(Signal::SIGTERM);
}

#[test]
fn sigint_stops_it_with_status_0() {
    stops_with_status_0_on(Signal::SIGINT);
}

/// One connection breaks the protocol with `bad` (after its handshake,
/// while it has an acquire waiting); it alone is closed with `E <reason>`.
/// Another connection, older, keeps its grant and its session; a newer one
/// is served too.
fn closes_that_connection_only(bad: &[u8], reason: &str) {
    let serve = Serve::start(&[]);
    let mut good = Raw::connect(&serve.addr);
    good.hello();
    let (token, _) = good.grant(1, "k", 0, 30_000);

    let mut offender = Raw::connect(&serve.addr);
    offender.hello();
    // Waits behind `good`'s grant.
    offender.send("A 1 k other 30000 1000\n");
    offender.send_bytes(bad);
    offender.expect(&format!("E {reason}"));
    offender.expect_closed("the offending connection");

    // The old connection is untouched: it releases its grant by token...
    good.send(&format!("R 2 k {token}\n"));
    good.expect("D 2 R k");
    // ... and the offender's waiting acquire went with its connection, so
    // the key is free again.
    let (next, _) = good.grant(3, "k", 0, 1000);
    assert!(next > token, "tokens grow: {next} after {token}");

    let mut fresh = Raw::connect(&serve.addr);
    fresh.hello();
    fresh.grant(1, "other-key", 0, 1000);
}

#[test]
fn a_malformed_frame_closes_that_connection_only() {
    // A leading zero is a framing error.
    closes_that_connection_only(b"A 2 j o 01 1000\n", "bad_frame");
}

#[test]
fn a_frame_with_a_missing_field_closes_that_connection_only() {
    closes_that_connection_only(b"R 2 k\n", "bad_frame");
}

#[test]
fn an_unknown_kind_closes_that_connection_only() {
    closes_that_connection_only(b"Z 2 k\n", "bad_frame");
}

#[test]
fn a_window_overrun_closes_that_connection_only() {
    let serve = Serve::start(&["--window", "2"]);
    let mut good = Raw::connect(&serve.addr);
    assert_eq!(good.hello().1, 2, "--window 2 is announced in W");

    let mut offender = Raw::connect(&serve.addr);
    offender.hello();
    let (token, _) = offender.grant(1, "k", 0, 30_000);
    // Answered requests do not count; waiting ones do.
    offender.send("A 2 k o 30000 1000\n");
    offender.send("A 3 k o 30000 1000\n");
    offender.send("A 4 k o 30000 1000\n");
    offender.expect("E window");
    offender.expect_closed("the connection past its window");

    // The offender's grant outlives its connection (rule 5): another
    // connection releases it by exact token; its waiters are gone, so the
    // key is then free at once.
    good.send(&format!("R 1 k {token}\n"));
    good.expect("D 1 R k");
    good.grant(2, "k", 0, 1000);
    // The good connection may use its own window in full.
    good.send("A 3 k o 30000 1000\n");
    good.send("R 4 k 999999\n");
    good.expect("N 4 R k");
}

/// A small deterministic generator for garbage.
fn garbage(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn garbage_does_not_kill_the_server() {
    let mut serve = Serve::start(&[]);
    let mut holder = Raw::connect(&serve.addr);
    holder.hello();
    let (token, _) = holder.grant(1, "k", 0, 30_000);

    // Random bytes, before and after a handshake.
    for seed in 1..=8u64 {
        let mut raw = Raw::connect(&serve.addr);
        if seed % 2 == 0 {
            raw.hello();
        }
        raw.send_lossy(&garbage(seed, 4096));
        // The server says why (or nothing, if the bytes broke the line
        // first) and closes; it must not keep the connection.
        loop {
            match raw.next("the server's answer to garbage") {
                cli::End::Closed => break,
                cli::End::Line(line) => assert!(
                    line.starts_with("E ") || line.starts_with("G ") || line.starts_with("T "),
                    "unexpected answer to garbage: {line:?}"
                ),
            }
        }
    }

    // A line that grows past 1024 bytes: closed as soon as byte 1025
    // arrives, without waiting for a newline.
    let mut long = Raw::connect(&serve.addr);
    long.hello();
    long.send(&"A".repeat(1025));
    long.expect("E bad_frame");
    long.expect_closed("the connection with an over-long line");

    // The same before the handshake, and much longer.
    let mut longer = Raw::connect(&serve.addr);
    longer.send_lossy(&[b'x'; 64 * 1024]);
    longer.expect("E bad_frame");
    longer.expect_closed("the connection with a 64 KiB line");

    // Connections that end abruptly, mid-line or right away.
    for text in ["", "H 1 te", "H 1 test -\nA 9 k o 30000 1000"] {
        let mut raw = Raw::connect(&serve.addr);
        raw.send(text);
        raw.shutdown_write();
        drop(raw);
    }

    // A request before the handshake.
    let mut early = Raw::connect(&serve.addr);
    early.send("A 1 k o 0 1000\n");
    early.expect("E hello_required");
    early.expect_closed("a request before H");

    assert!(serve.is_running(), "the server died of garbage");
    // The old session still works, and new ones do.
    holder.send(&format!("R 2 k {token}\n"));
    holder.expect("D 2 R k");
    let mut fresh = Raw::connect(&serve.addr);
    fresh.hello();
    fresh.grant(1, "k", 0, 1000);
}

/// A server started with `args` answers a handshake with `answer` and
/// then closes the connection (`after`, for the failure message).
fn answers_hello_and_closes(args: &[&str], answer: &str, after: &str) {
    let serve = Serve::start(args);
    let mut raw = Raw::connect(&serve.addr);
    raw.send("H 1 test -\n");
    raw.expect(answer);
    raw.expect_closed(after);
}

#[test]
fn a_follower_answers_moved() {
    answers_hello_and_closes(
        &["--role", "follower", "--leader", "127.0.0.1:7001"],
        "M 127.0.0.1:7001",
        "a follower's connection after M",
    );
}

#[test]
fn no_leader_answers_e_no_leader() {
    answers_hello_and_closes(&["--role", "no-leader"], "E no_leader", "after E no_leader");
}

#[test]
fn not_active_answers_e_not_active() {
    answers_hello_and_closes(
        &["--role", "not-active"],
        "E not_active",
        "after E not_active",
    );
}

#[test]
fn a_wrong_credential_gets_e_auth_failed() {
    let serve = Serve::start(&["--credential", "sesame"]);
    for hello in ["H 1 test -\n", "H 1 test sesamo\n", "H 1 test sesame2\n"] {
        let mut raw = Raw::connect(&serve.addr);
        raw.send(hello);
        raw.expect("E auth_failed");
        raw.expect_closed("after E auth_failed");
    }
    let mut raw = Raw::connect(&serve.addr);
    raw.send("H 1 test sesame\n");
    raw.expect("W node-1 64");
    raw.grant(1, "k", 0, 1000);
}

#[test]
fn window_and_node_id_are_announced_in_w() {
    let serve = Serve::start(&["--window", "7", "--node-id", "alpha"]);
    let mut raw = Raw::connect(&serve.addr);
    assert_eq!(raw.hello(), ("alpha".to_string(), 7));
}

#[test]
fn the_leader_hint_is_sent_after_w() {
    let serve = Serve::start(&["--leader-hint", "127.0.0.1:7002"]);
    let mut raw = Raw::connect(&serve.addr);
    raw.send("H 1 test -\n");
    raw.expect("W node-1 64");
    raw.expect("L 127.0.0.1:7002");
    // The connection stays and is served.
    raw.grant(1, "k", 0, 1000);
}

#[test]
fn max_lease_ms_caps_the_lease_in_g() {
    let serve = Serve::start(&["--max-lease-ms", "300"]);
    let mut raw = Raw::connect(&serve.addr);
    raw.hello();
    let (_, lease) = raw.grant(1, "k", 0, 60_000);
    assert_eq!(lease, 300, "the lease is capped");
    let (_, lease) = raw.grant(2, "j", 0, 100);
    assert_eq!(lease, 100, "a shorter lease is granted as asked");

    // The capped lease really ends: a waiter gets `k` once it runs out,
    // long before the 60 s asked for.
    let started = Instant::now();
    let mut waiter = Raw::connect(&serve.addr);
    waiter.hello();
    let (token, _) = waiter.grant(1, "k", 20_000, 1000);
    assert!(token > 1, "a new grant, token {token}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "granted after {:?}",
        started.elapsed()
    );
}

#[test]
fn handshake_timeout_ms_closes_a_connection_that_sends_no_h() {
    let serve = Serve::start(&["--handshake-timeout-ms", "300"]);
    let accepted = Instant::now();
    let mut silent = Raw::connect(&serve.addr);
    // Half an H is no H.
    let mut partial = Raw::connect(&serve.addr);
    partial.send("H 1 test");
    // A connection that says H in time is served past the timeout.
    let mut prompt = Raw::connect(&serve.addr);
    prompt.hello();

    silent.expect("E handshake_timeout");
    silent.expect_closed("a connection without H");
    let waited = accepted.elapsed();
    partial.expect("E handshake_timeout");
    partial.expect_closed("a connection with half an H");
    assert!(
        waited >= Duration::from_millis(300),
        "closed {waited:?} after the accept, before the 300 ms timeout"
    );
    // Not a speed limit: the default of 10 s must not be what applied.
    assert!(
        waited < Duration::from_secs(5),
        "closed {waited:?} after the accept: the option was not applied"
    );
    prompt.grant(1, "k", 0, 1000);

    // The default is 10 s: a connection that stays silent for a second is
    // still open, and is served once it speaks.
    let serve = Serve::start(&[]);
    let mut slow = Raw::connect(&serve.addr);
    std::thread::sleep(Duration::from_secs(1));
    slow.hello();
    slow.grant(1, "k", 0, 1000);
}

#[test]
fn a_handshake_timeout_of_0_is_refused_at_start() {
    let out = cli::ticketing(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--handshake-timeout-ms",
            "0",
        ],
        WAIT,
    );
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("handshake_timeout"), "{out:?}");
    assert!(!out.stderr.contains("listening on"), "{out:?}");
}

/// How much the flood sends at most: far more than the server may keep.
const FLOOD: usize = 128 << 20;
/// The most the server's resident memory may grow by while one connection
/// floods it and reads nothing: 4 MiB. The server keeps at most
/// `server::Config::max_unwritten` (256 KiB) of unwritten answers for a
/// connection plus the answers to one 64 KiB read (an answer to `R` is
/// no longer than its request), about 0.5 MiB in all; the rest of the
/// bound is slack for the allocator (0.6 MiB of growth was measured). A
/// server that buffers without bound grows by more than it is sent (183
/// MiB for the 128 MiB of this flood, measured before the fix).
const RSS_GROWTH_BOUND_KB: u64 = 4 << 10;
/// The least the flood must get out for the bound to mean something: 16
/// times what the server may keep, the rest held by the kernel's socket
/// buffers (about 9 MB on loopback here) until TCP pushes back.
const FLOOD_AT_LEAST: usize = 4 << 20;

/// Writes `R` requests to `stream` and reads nothing, until `FLOOD` bytes
/// are out or the socket has taken nothing for 2 s in a row (the server
/// stopped reading and TCP pushes back). Returns the bytes sent.
fn flood(mut stream: TcpStream) -> usize {
    stream
        .set_write_timeout(Some(Duration::from_millis(500)))
        .expect("write timeout");
    let mut chunk = Vec::with_capacity(64 * 1024 + 32);
    let mut id = 1u64;
    let mut sent = 0;
    let started = Instant::now();
    while sent < FLOOD && started.elapsed() < Duration::from_secs(120) {
        chunk.clear();
        while chunk.len() < 64 * 1024 {
            writeln!(chunk, "R {id} k 1").expect("format");
            id += 1;
        }
        let mut at = 0;
        let mut stuck_since = None::<Instant>;
        while at < chunk.len() {
            match stream.write(&chunk[at..]) {
                Ok(n) => {
                    at += n;
                    sent += n;
                    stuck_since = None;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    let since = *stuck_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= Duration::from_secs(2) {
                        return sent;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => panic!("flood: write after {sent} bytes: {e}"),
            }
        }
    }
    sent
}

#[test]
fn a_client_that_never_reads_does_not_grow_the_server_and_others_are_served() {
    let mut serve = Serve::start(&[]);
    let pid = serve.pid();
    let mut good = Raw::connect(&serve.addr);
    good.hello();
    good.grant(1, "warm-up", 0, 1000);

    let mut flooder = TcpStream::connect(&serve.addr).expect("connect");
    flooder.write_all(b"H 1 flooder -\n").expect("write H");
    let mut w = [0u8; 12];
    flooder.read_exact(&mut w).expect("read W");
    assert_eq!(&w, b"W node-1 64\n");
    let before = status_kb(pid, "VmRSS");
    let flooding = thread::spawn(move || {
        let sent = flood(flooder.try_clone().expect("clone"));
        (sent, flooder)
    });

    // The other connection is answered all along, and the server's
    // memory is watched.
    let mut peak = before;
    let mut id = 2u64;
    while !flooding.is_finished() {
        good.send(&format!("R {id} k 1\n"));
        good.expect(&format!("N {id} R k"));
        id += 1;
        peak = peak.max(status_kb(pid, "VmRSS"));
        thread::sleep(Duration::from_millis(20));
    }
    let (sent, flooder) = flooding.join().expect("the flood thread");
    peak = peak.max(status_kb(pid, "VmRSS"));
    good.send(&format!("R {id} k 1\n"));
    good.expect(&format!("N {id} R k"));
    let growth = peak.saturating_sub(before);
    eprintln!(
        "flooded {sent} bytes ({} MiB); VmRSS {before} kB before, peak {peak} kB, growth {growth} kB; \
         {} round trips of the other connection meanwhile",
        sent >> 20,
        id - 2
    );
    assert!(
        growth <= RSS_GROWTH_BOUND_KB,
        "the server grew by {growth} kB while a connection that reads nothing sent {sent} bytes"
    );
    // The bound means something only if the flood was much larger.
    assert!(
        sent >= FLOOD_AT_LEAST,
        "the flood got only {sent} bytes out"
    );

    // A connection that reads nothing does not keep the server from
    // stopping cleanly.
    serve.signal(Signal::SIGTERM);
    let status = serve.wait_exit(WAIT);
    assert_eq!(status.code(), Some(0), "serve after SIGTERM: {status}");
    drop(flooder);
}

/// The CPU time `pid` has used, user and system (`/proc/<pid>/stat`).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    // Field 2, the command, is in parentheses and may hold spaces: count
    // from after it. Field 3 is then the first; utime is 14, stime 15.
    let after_name = &stat[stat.rfind(')').expect("(comm)") + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let ticks = |field: usize| -> u64 {
        fields[field - 3]
            .parse()
            .unwrap_or_else(|e| panic!("field {field} of {stat:?}: {e}"))
    };
    let per_second = sysconf(SysconfVar::CLK_TCK)
        .expect("sysconf")
        .expect("CLK_TCK") as u64;
    Duration::from_millis((ticks(14) + ticks(15)) * 1000 / per_second)
}

/// How many descriptors `pid` has open.
fn open_descriptors(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
        .count() as u64
}

#[test]
fn out_of_descriptors_the_server_neither_spins_nor_stops_serving() {
    const NOFILE: u64 = 64;
    // No handshake timeout closes the connections it accepts meanwhile.
    let serve = Serve::start_with(&["--handshake-timeout-ms", "600000"], |command| {
        // SAFETY: setrlimit is a plain system call, safe between fork and
        // exec.
        unsafe {
            command.pre_exec(|| {
                setrlimit(Resource::RLIMIT_NOFILE, NOFILE, NOFILE).map_err(std::io::Error::from)
            });
        }
    });
    let pid = serve.pid();
    let mut served = Raw::connect(&serve.addr);
    served.hello();
    let (token, _) = served.grant(1, "k", 0, 60_000);

    // Twice as many connections as it may have descriptors: the kernel
    // completes them all into the listen backlog, and the server accepts
    // until accepting fails.
    let waiting: Vec<TcpStream> = (0..2 * NOFILE)
        .map(|_| TcpStream::connect(&serve.addr).expect("connect"))
        .collect();
    let deadline = Instant::now() + WAIT;
    while open_descriptors(pid) < NOFILE {
        assert!(
            Instant::now() < deadline,
            "the server has {} descriptors open, not the {NOFILE} it may",
            open_descriptors(pid)
        );
        thread::sleep(Duration::from_millis(20));
    }

    // Connections wait, nothing is sent: the server must idle.
    thread::sleep(Duration::from_millis(500));
    let before = cpu_time(pid);
    let measured = Instant::now();
    thread::sleep(Duration::from_secs(2));
    let used = cpu_time(pid).saturating_sub(before);
    let over = measured.elapsed();
    eprintln!("out of descriptors: {used:?} of CPU in {over:?} with no traffic");
    assert!(
        used < Duration::from_millis(300),
        "the server used {used:?} of CPU in {over:?} with no traffic, out of descriptors"
    );

    // The connection it has is served all along.
    served.send(&format!("R 2 k {token}\n"));
    served.expect("D 2 R k");
    // Once descriptors are free again, new connections are accepted.
    drop(waiting);
    let mut fresh = Raw::connect(&serve.addr);
    fresh.hello();
    fresh.grant(1, "k", 0, 1000);
}
