//! A server that floods the client with frames that each make a notice (a
//! leader hint outside the allowlist, two addresses in turn, so that none
//! repeats the one before) must not grow the client: the adapters stop
//! reading while their notices are not taken, lose none of them, and the
//! binary's memory stays flat (issue 9).

mod cli;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ticketing::client::{Config, Event};
use ticketing::{Endpoint, Name};

/// A server that welcomes one client, then writes `lines` hints outside
/// the allowlist as fast as the client takes them.
struct Flood {
    addr: String,
    /// Bytes of the flood written so far.
    written: Arc<AtomicUsize>,
    /// The whole flood was written.
    done: Arc<AtomicBool>,
    total: usize,
}

/// What the flood server does once the flood is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Keeps the connection open until the client closes it.
    Wait,
    /// Closes it.
    Close,
}

const HINTS: [&str; 2] = ["L evil-a.example:1\n", "L evil-b.example:1\n"];

impl Flood {
    fn start(lines: usize) -> Flood {
        Flood::start_then(lines, Then::Wait)
    }

    fn start_then(lines: usize, then: Then) -> Flood {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let written = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let total = (0..lines).map(|i| HINTS[i % 2].len()).sum();
        let (w, d) = (Arc::clone(&written), Arc::clone(&done));
        thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let mut hello = String::new();
            BufReader::new(stream.try_clone().expect("clone"))
                .read_line(&mut hello)
                .expect("the client's hello");
            assert!(hello.starts_with("H "), "{hello:?}");
            write_flood(stream, lines, &w, &d, then);
        });
        Flood {
            addr,
            written,
            done,
            total,
        }
    }

    fn written(&self) -> usize {
        self.written.load(Ordering::SeqCst)
    }

    /// Waits until the flood stalls (nothing written for half a second:
    /// the client stopped reading) or ends; whether it stalled.
    fn stalls(&self) -> bool {
        let mut last = self.written();
        let mut since = Instant::now();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            thread::sleep(Duration::from_millis(50));
            if self.done.load(Ordering::SeqCst) {
                return false;
            }
            let now = self.written();
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() > Duration::from_millis(500) {
                return true;
            }
        }
        panic!("the flood neither stalled nor ended in 60 s");
    }
}

fn write_flood(
    mut stream: TcpStream,
    lines: usize,
    written: &AtomicUsize,
    done: &AtomicBool,
    then: Then,
) {
    let _ = stream.write_all(b"W node-1 16\n");
    // In batches of both hints, so that each write is one syscall.
    let batch: Vec<u8> = HINTS.concat().repeat(512).into_bytes();
    let mut left = lines;
    while left > 0 {
        let n = left.min(1024);
        let bytes = &batch[..(0..n).map(|i| HINTS[i % 2].len()).sum::<usize>()];
        if stream.write_all(bytes).is_err() {
            return;
        }
        written.fetch_add(bytes.len(), Ordering::SeqCst);
        left -= n;
    }
    done.store(true, Ordering::SeqCst);
    if then == Then::Close {
        return;
    }
    // Keep the connection open until the client closes it.
    let mut sink = [0u8; 64];
    let _ = std::io::Read::read(&mut stream, &mut sink);
}

fn config(addr: &str) -> Config {
    let mut c = Config::new(
        [Endpoint::new(addr).expect("an endpoint")],
        Name::new("flooded").expect("a name"),
    );
    c.seed = 1;
    c
}

fn is_ignored_hint(event: &Event) -> bool {
    matches!(event, Event::HintIgnored { .. })
}

const LINES: usize = 500_000;

#[test]
fn the_blocking_adapter_reads_no_further_ahead_than_its_bound_and_loses_no_notice() {
    let flood = Flood::start(LINES);
    let (handle, mut notices) = ticketing::blocking::connect_with_notices(
        config(&flood.addr),
        ticketing::blocking::TcpConnector,
    )
    .expect("a valid configuration");
    assert!(
        flood.stalls(),
        "the client kept reading with nobody taking its notices"
    );
    let ahead = handle.read_ahead();
    let written = flood.written();
    eprintln!(
        "stalled: {written} of {} bytes written, {ahead} read ahead, {} notices waiting",
        flood.total,
        notices.len()
    );
    assert!(
        ahead <= ticketing::blocking::READ_AHEAD + 16 * 1024,
        "{ahead} bytes read ahead"
    );
    assert_eq!(notices.len(), ticketing::blocking::NOTICES_CAPACITY);
    assert!(written < flood.total);
    let mut seen = 0;
    while seen < LINES {
        let event = notices
            .recv_timeout(Duration::from_secs(60))
            .expect("notices keep coming");
        seen += usize::from(is_ignored_hint(&event));
    }
    assert_eq!(seen, LINES, "every notice, once");
    assert!(handle.read_ahead() <= ticketing::blocking::READ_AHEAD + 16 * 1024);
}

#[test]
fn the_blocking_adapter_forgets_every_failed_connect() {
    let dead = cli::dead_endpoint();
    let mut c = config(&dead);
    c.backoff.transport =
        ticketing::client::Backoff::new(Duration::from_micros(100), Duration::from_millis(1));
    let failures = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&failures);
    let (handle, mut notices) =
        ticketing::blocking::connect_with_notices(c, ticketing::blocking::TcpConnector)
            .expect("a valid configuration");
    thread::spawn(move || {
        while let Some(event) = notices.recv() {
            if matches!(event, Event::Closed { .. }) {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let start = Instant::now();
    while failures.load(Ordering::SeqCst) < 1_000 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} failed connects in 60 s",
            failures.load(Ordering::SeqCst)
        );
        thread::sleep(Duration::from_millis(5));
    }
    // The one being attempted now, at most.
    let tracked = handle.connections();
    eprintln!(
        "{} failed connects, {tracked} tracked",
        failures.load(Ordering::SeqCst)
    );
    assert!(tracked <= 1, "{tracked} connections tracked");
}

#[test]
fn the_tokio_adapter_stops_reading_while_its_notices_are_not_taken() {
    let flood = Flood::start(LINES);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let (_handle, mut notices) = rt.block_on(async {
        ticketing::tokio::spawn_with_notices(config(&flood.addr), ticketing::tokio::TcpConnector)
            .expect("a valid configuration")
    });
    assert!(
        flood.stalls(),
        "the client kept reading with nobody taking its notices"
    );
    let written = flood.written();
    eprintln!(
        "stalled: {written} of {} bytes written, {} notices waiting",
        flood.total,
        notices.len()
    );
    assert_eq!(notices.len(), ticketing::tokio::NOTICES_CAPACITY);
    assert!(written < flood.total);
    let seen = rt.block_on(async {
        let mut seen = 0;
        while seen < LINES {
            let event = tokio::time::timeout(Duration::from_secs(60), notices.recv())
                .await
                .expect("notices keep coming")
                .expect("the client runs");
            seen += usize::from(is_ignored_hint(&event));
        }
        seen
    });
    assert_eq!(seen, LINES, "every notice, once");
}

#[test]
fn the_binary_stays_flat_under_two_million_hints() {
    const MILLIONS: usize = 2_000_000;
    /// What the client may grow by (it grew by 191-213 MB before).
    const GROWTH_BOUND_KB: u64 = 16 * 1024;
    let flood = Flood::start(MILLIONS);
    let mut child = Command::new(cli::BIN)
        .args(["client", "--endpoint", &flood.addr, "--seed", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ticketing client");
    let pid = child.id();
    // Its size once connected, before the flood has gone far.
    while flood.written() == 0 {
        thread::sleep(Duration::from_millis(1));
    }
    let before = cli::status_kb(pid, "VmRSS");
    let mut peak = before;
    let start = Instant::now();
    while !flood.done.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "{} of {} bytes in 240 s",
            flood.written(),
            flood.total
        );
        peak = peak.max(cli::status_kb(pid, "VmRSS"));
        thread::sleep(Duration::from_millis(20));
    }
    peak = peak.max(cli::status_kb(pid, "VmRSS"));
    let growth = peak.saturating_sub(before);
    eprintln!(
        "{MILLIONS} hints ({} bytes) in {:.1} s: VmRSS {before} kB before, peak {peak} kB, \
         growth {growth} kB",
        flood.total,
        start.elapsed().as_secs_f64()
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        growth <= GROWTH_BOUND_KB,
        "the client grew by {growth} kB under {MILLIONS} hints"
    );
}

/// The audit's flood: a hostile server's 4 s of `L` lines made 399,236
/// `hint_ignored` lines (26 MB) on stdout. Now a connection prints at most
/// one a second, each with the `count` of hints it stands for: every hint
/// is counted once, and the lines are few.
#[test]
fn the_binary_prints_a_hint_ignored_line_a_second_with_the_count_it_folds() {
    use serde_json::Value;
    const HINTS_SENT: usize = 400_000;
    let flood = Flood::start_then(HINTS_SENT, Then::Close);
    let mut child = Command::new(cli::BIN)
        .args(["client", "--endpoint", &flood.addr, "--seed", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ticketing client");
    let stdout = BufReader::new(child.stdout.take().expect("its stdout"));
    let start = Instant::now();
    // Until the flood's connection ends: the hint lines, when each came.
    let mut hints: Vec<(Duration, u64)> = Vec::new();
    let mut lines = stdout.lines();
    let closed_at = loop {
        let line = lines
            .next()
            .expect("the client printed `closed` before it ended")
            .expect("a line");
        let v: Value = serde_json::from_str(&line).expect("JSON");
        match v["event"].as_str() {
            Some("hint_ignored") => {
                let count = v["count"].as_u64().expect("a count");
                assert!(count >= 1, "{line}");
                hints.push((start.elapsed(), count));
            }
            Some("closed") => break start.elapsed(),
            _ => {}
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{line}");
    };
    drop(child.stdin.take());
    let _ = child.wait();
    let counted: u64 = hints.iter().map(|&(_, n)| n).sum();
    eprintln!(
        "{HINTS_SENT} hints in {:.1} s: {} hint_ignored lines, counting {counted}",
        closed_at.as_secs_f64(),
        hints.len()
    );
    assert_eq!(counted, HINTS_SENT as u64, "every hint counted once");
    // One at once, then at most one a second, and what was folded at the
    // end (before `closed`).
    let seconds = closed_at.as_secs() + 1;
    assert!(
        hints.len() as u64 <= seconds + 2,
        "{} lines in {closed_at:?}",
        hints.len()
    );
    for pair in hints[..hints.len() - 1].windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= Duration::from_millis(900),
            "two lines within a second: {hints:?}"
        );
    }
}
