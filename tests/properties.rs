//! Property tests: the codec, and the client core against the model server
//! with the invariant checker after every step.
//!
//! # Seeds
//!
//! Every property draws its cases from a `quickcheck::Gen` built with
//! `Gen::from_size_and_seed`, so a run is reproducible. The base seed is
//! [`DEFAULT_SEED`] unless the environment variable `TICKETING_QC_SEED`
//! gives another (decimal, or hex with `0x`); each property mixes its own
//! name into it. Every property prints the base seed it used (shown by
//! `cargo test -- --nocapture`, and in the output of a failing test), so
//!
//! ```text
//! TICKETING_QC_SEED=12345 cargo test --all-features --test properties
//! ```
//!
//! replays exactly the cases of a run that printed `TICKETING_QC_SEED=12345`.
//! A failing case is shrunk by quickcheck and printed with the broken
//! invariant.
//!
//! # Case counts
//!
//! Fixed per property (the `CASES_*` constants), chosen so that the whole
//! file runs in well under a minute in a debug build on two cores.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use quickcheck::{Arbitrary, Gen, QuickCheck, TestResult};
use ticketing::client::{Action, Client, Config, Event, Outcome};
use ticketing::testkit::fuzz;
use ticketing::testkit::{Checker, Invariant, Runner, Setup, Stats, Step};
use ticketing::wire::{
    Addr, Answer, AnswerKind, Atom, ClientFrame, FrameError, ServerFrame, Window, MAX_ATOM,
};
use ticketing::{Endpoint, Key, Name, Time};

/// The base seed when `TICKETING_QC_SEED` is not set.
const DEFAULT_SEED: u64 = 0x7469_636b_6574_0001;

const CASES_FRAMES: u64 = 10_000;
const CASES_LINES: u64 = 10_000;
const CASES_STEP_ENCODING: u64 = 1_000;
const CASES_RUNS: u64 = 10_000;
const CASES_DETERMINISM: u64 = 1_000;
const CASES_FUZZ_BYTES: u64 = 1_000;
const CASES_SERVER: u64 = 5_000;
const CASES_DECISIONS: u64 = 2_000;

fn base_seed() -> u64 {
    match std::env::var("TICKETING_QC_SEED") {
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("TICKETING_QC_SEED={text:?} is not a u64: {e}"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

/// A property's verdict: passed, or the error of what failed.
fn verdict<E: std::fmt::Display>(result: Result<(), E>) -> TestResult {
    match result {
        Ok(()) => TestResult::passed(),
        Err(e) => TestResult::error(e.to_string()),
    }
}

/// A quickcheck runner for `property`, seeded from the base seed and the
/// property's name, running `cases` cases.
fn qc(property: &str, cases: u64) -> QuickCheck {
    let base = base_seed();
    let mut seed = base;
    for b in property.bytes() {
        seed = (seed ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    println!("{property}: TICKETING_QC_SEED={base} (generator seed {seed:#x}), {cases} cases");
    QuickCheck::new()
        .rng(Gen::from_size_and_seed(64, seed))
        .tests(cases)
        .max_tests(cases * 4)
}

fn below(g: &mut Gen, n: usize) -> usize {
    usize::arbitrary(g) % n
}

fn pick<T: Copy>(g: &mut Gen, items: &[T]) -> T {
    *g.choose(items).expect("non-empty")
}

// ----- codec ----------------------------------------------------------------

fn atom_text(g: &mut Gen, max: usize) -> String {
    let len = if bool::arbitrary(g) {
        1 + below(g, 8.min(max))
    } else {
        1 + below(g, max)
    };
    (0..len)
        .map(|_| char::from(0x21 + (u8::arbitrary(g) % 94)))
        .collect()
}

fn number(g: &mut Gen) -> u64 {
    match below(g, 4) {
        0 => pick(g, &[0, 1, 9, 10, 99, 100, u64::MAX, u64::MAX - 1]),
        1 => u64::from(u16::arbitrary(g)),
        _ => u64::arbitrary(g),
    }
}

fn addr_text(g: &mut Gen) -> String {
    let port = u16::arbitrary(g);
    let host = atom_text(g, MAX_ATOM - 6);
    format!("{host}:{port}")
}

/// A frame with owned fields, built into a wire frame in the property.
#[derive(Debug, Clone)]
enum FrameCase {
    Welcome(String, u64),
    Moved(String),
    Error(String),
    Leader(String),
    Answer(u64, String, u8, u64, u64, u64),
    Hello(u64, String, String),
    Acquire(u64, String, String, u64, u64),
    Release(u64, String, u64),
    Renew(u64, String, u64, u64),
}

impl Arbitrary for FrameCase {
    fn arbitrary(g: &mut Gen) -> FrameCase {
        match below(g, 9) {
            8 => FrameCase::Renew(
                number(g),
                atom_text(g, MAX_ATOM),
                number(g),
                number(g).max(1),
            ),
            0 => FrameCase::Welcome(atom_text(g, MAX_ATOM), number(g).max(2)),
            1 => FrameCase::Moved(addr_text(g)),
            2 => FrameCase::Error(atom_text(g, MAX_ATOM)),
            3 => FrameCase::Leader(addr_text(g)),
            4 => FrameCase::Answer(
                number(g),
                atom_text(g, MAX_ATOM),
                u8::arbitrary(g) % 8,
                number(g),
                number(g).max(1),
                number(g),
            ),
            5 => FrameCase::Hello(number(g), atom_text(g, MAX_ATOM), atom_text(g, MAX_ATOM)),
            6 => FrameCase::Acquire(
                number(g),
                atom_text(g, MAX_ATOM),
                atom_text(g, MAX_ATOM),
                number(g),
                number(g).max(1),
            ),
            _ => FrameCase::Release(number(g), atom_text(g, MAX_ATOM), number(g)),
        }
    }
}

fn answer_kind(kind: u8, token: u64, lease: u64, waited: u64) -> AnswerKind {
    let lease_ms = std::num::NonZeroU64::new(lease).unwrap();
    match kind {
        // Version 1 and version 2 grants.
        0 => AnswerKind::Granted {
            token,
            lease_ms,
            waited_ms: None,
        },
        5 => AnswerKind::Granted {
            token,
            lease_ms,
            waited_ms: Some(waited),
        },
        1 => AnswerKind::TimedOut,
        2 => AnswerKind::Busy,
        3 => AnswerKind::Released,
        6 => AnswerKind::Renewed { token, lease_ms },
        7 => AnswerKind::Gone,
        _ => AnswerKind::NotHeld,
    }
}

/// Encodes the frame, checks the line's shape, and parses it back.
fn frame_round_trip(case: &FrameCase) -> Result<(), String> {
    let mut out = Vec::new();
    let server = match case {
        FrameCase::Welcome(node, window) => Some(ServerFrame::Welcome {
            node: Atom::new(node).unwrap(),
            window: Window::new(*window).unwrap(),
        }),
        FrameCase::Moved(addr) => Some(ServerFrame::Moved {
            addr: Addr::new(addr).unwrap(),
        }),
        FrameCase::Error(reason) => Some(ServerFrame::Error {
            reason: Atom::new(reason).unwrap(),
        }),
        FrameCase::Leader(addr) => Some(ServerFrame::Leader {
            addr: Addr::new(addr).unwrap(),
        }),
        FrameCase::Answer(id, key, kind, token, lease, waited) => {
            Some(ServerFrame::Answer(Answer {
                id: *id,
                key: Atom::new(key).unwrap(),
                kind: answer_kind(*kind, *token, *lease, *waited),
            }))
        }
        _ => None,
    };
    if let Some(frame) = server {
        return round_trip(frame, &mut out, ServerFrame::encode, ServerFrame::parse);
    }
    let client = match case {
        FrameCase::Hello(version, id, cred) => ClientFrame::Hello {
            version: *version,
            client_id: Atom::new(id).unwrap(),
            credential: Atom::new(cred).unwrap(),
        },
        FrameCase::Acquire(id, key, owner, wait, lease) => ClientFrame::Acquire {
            id: *id,
            key: Atom::new(key).unwrap(),
            owner: Atom::new(owner).unwrap(),
            wait_ms: *wait,
            lease_ms: std::num::NonZeroU64::new(*lease).unwrap(),
        },
        FrameCase::Release(id, key, token) => ClientFrame::Release {
            id: *id,
            key: Atom::new(key).unwrap(),
            token: *token,
        },
        FrameCase::Renew(id, key, token, lease) => ClientFrame::Renew {
            id: *id,
            key: Atom::new(key).unwrap(),
            token: *token,
            lease_ms: std::num::NonZeroU64::new(*lease).unwrap(),
        },
        _ => unreachable!("server frames handled above"),
    };
    round_trip(client, &mut out, ClientFrame::encode, ClientFrame::parse)
}

/// Encodes `frame` into the empty `out`, checks the line's shape, and
/// `parse`s it back to the same frame.
fn round_trip<'o, F: PartialEq + std::fmt::Debug>(
    frame: F,
    out: &'o mut Vec<u8>,
    encode: impl Fn(&F, &mut Vec<u8>),
    parse: impl Fn(&'o [u8]) -> Result<F, FrameError>,
) -> Result<(), String> {
    encode(&frame, out);
    let out: &'o Vec<u8> = out;
    let line = out.strip_suffix(b"\n").ok_or("no LF at the end")?;
    if out.len() > 1024 || line.contains(&b'\n') {
        return Err(format!("bad line {:?}", String::from_utf8_lossy(out)));
    }
    let back = parse(line).map_err(|e| format!("{e} for {frame:?}"))?;
    if back != frame {
        return Err(format!("{frame:?} came back as {back:?}"));
    }
    Ok(())
}

#[test]
fn every_constructible_frame_encodes_to_a_line_that_parses_back_to_it() {
    fn prop(case: FrameCase) -> TestResult {
        verdict(frame_round_trip(&case))
    }
    qc("frames_round_trip", CASES_FRAMES).quickcheck(prop as fn(FrameCase) -> TestResult);
}

/// A line: a valid frame mutated a little, or tokens from a vocabulary.
#[derive(Debug, Clone)]
struct LineCase(Vec<u8>);

const VOCABULARY: &[&str] = &[
    "G",
    "T",
    "B",
    "D",
    "N",
    "W",
    "M",
    "E",
    "L",
    "H",
    "A",
    "R",
    "X",
    "GG",
    "0",
    "1",
    "00",
    "01",
    "7",
    "42",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "+1",
    "k",
    "printer",
    "-",
    "a:1",
    "host:65535",
    "host:65536",
    "host:01",
    ":1",
    "no_leader",
    "\r",
    "\t",
    "\u{7f}",
    "é",
];

impl Arbitrary for LineCase {
    fn arbitrary(g: &mut Gen) -> LineCase {
        let mut line = if bool::arbitrary(g) {
            let mut out = Vec::new();
            let case = FrameCase::arbitrary(g);
            // Only the encoding matters here; the round trip is another property.
            let _ = frame_round_trip(&case);
            encode_case(&case, &mut out);
            out.pop();
            out
        } else {
            let n = 1 + below(g, 7);
            let words: Vec<&str> = (0..n).map(|_| pick(g, VOCABULARY)).collect();
            words.join(" ").into_bytes()
        };
        for _ in 0..below(g, 3) {
            if line.is_empty() {
                break;
            }
            let at = below(g, line.len());
            match below(g, 5) {
                0 => line[at] = pick(g, &[b' ', b'0', b'A', b'\r', 0, 0x7f, b':']),
                1 => line.insert(at, pick(g, b" 09")),
                2 => {
                    line.remove(at);
                }
                3 => line.truncate(at),
                _ => line.extend_from_slice(b" 1"),
            }
        }
        LineCase(line)
    }
}

fn encode_case(case: &FrameCase, out: &mut Vec<u8>) {
    let lease = |l: u64| std::num::NonZeroU64::new(l).unwrap();
    match case {
        FrameCase::Welcome(node, window) => ServerFrame::Welcome {
            node: Atom::new(node).unwrap(),
            window: Window::new(*window).unwrap(),
        }
        .encode(out),
        FrameCase::Moved(addr) => ServerFrame::Moved {
            addr: Addr::new(addr).unwrap(),
        }
        .encode(out),
        FrameCase::Error(reason) => ServerFrame::Error {
            reason: Atom::new(reason).unwrap(),
        }
        .encode(out),
        FrameCase::Leader(addr) => ServerFrame::Leader {
            addr: Addr::new(addr).unwrap(),
        }
        .encode(out),
        FrameCase::Answer(id, key, kind, token, l, waited) => ServerFrame::Answer(Answer {
            id: *id,
            key: Atom::new(key).unwrap(),
            kind: answer_kind(*kind, *token, *l, *waited),
        })
        .encode(out),
        FrameCase::Hello(version, id, cred) => ClientFrame::Hello {
            version: *version,
            client_id: Atom::new(id).unwrap(),
            credential: Atom::new(cred).unwrap(),
        }
        .encode(out),
        FrameCase::Acquire(id, key, owner, wait, l) => ClientFrame::Acquire {
            id: *id,
            key: Atom::new(key).unwrap(),
            owner: Atom::new(owner).unwrap(),
            wait_ms: *wait,
            lease_ms: lease(*l),
        }
        .encode(out),
        FrameCase::Release(id, key, token) => ClientFrame::Release {
            id: *id,
            key: Atom::new(key).unwrap(),
            token: *token,
        }
        .encode(out),
        FrameCase::Renew(id, key, token, l) => ClientFrame::Renew {
            id: *id,
            key: Atom::new(key).unwrap(),
            token: *token,
            lease_ms: lease(*l),
        }
        .encode(out),
    }
}

static LINES_PARSED: AtomicU64 = AtomicU64::new(0);
static LINES_REFUSED: AtomicU64 = AtomicU64::new(0);

#[test]
fn every_line_that_parses_re_encodes_to_the_same_bytes() {
    fn prop(case: LineCase, seed: u16) -> TestResult {
        let line = &case.0;
        let server = ServerFrame::parse(line);
        let client = ClientFrame::parse(line);
        if server.is_ok() || client.is_ok() {
            LINES_PARSED.fetch_add(1, Ordering::Relaxed);
        } else {
            LINES_REFUSED.fetch_add(1, Ordering::Relaxed);
        }
        let mut expected = line.clone();
        expected.push(b'\n');
        if let Ok(frame) = server {
            let mut out = Vec::new();
            frame.encode(&mut out);
            if out != expected {
                return TestResult::error(format!("{frame:?} re-encodes as {out:?}"));
            }
        }
        if let Ok(frame) = client {
            let mut out = Vec::new();
            frame.encode(&mut out);
            if out != expected {
                return TestResult::error(format!("{frame:?} re-encodes as {out:?}"));
            }
        }
        // And the same line, twice, through the line reader in random chunks.
        let mut data = seed.to_le_bytes().to_vec();
        data.extend_from_slice(&expected);
        data.extend_from_slice(&expected);
        verdict(fuzz::decode(&data))
    }
    qc("lines_re_encode", CASES_LINES).quickcheck(prop as fn(LineCase, u16) -> TestResult);
    let (parsed, refused) = (
        LINES_PARSED.load(Ordering::Relaxed),
        LINES_REFUSED.load(Ordering::Relaxed),
    );
    println!("lines parsed: {parsed}, refused: {refused}");
    assert!(
        parsed >= CASES_LINES / 10 && refused >= CASES_LINES / 10,
        "the generator should give both valid and invalid lines: {parsed} parsed, {refused} refused"
    );
}

#[test]
fn over_long_lines_fail_at_byte_1025_in_any_chunking() {
    // 1023 bytes and a LF is the longest frame; 1024 and a LF is too long.
    for (len, ok) in [(1023usize, true), (1024, false), (5000, false)] {
        for seed in 0u16..50 {
            let mut data = seed.to_le_bytes().to_vec();
            data.extend_from_slice(b"W n 2\n");
            data.extend_from_slice(&vec![b'x'; len]);
            data.extend_from_slice(b"\nW n 3\n");
            fuzz::decode(&data).unwrap_or_else(|e| panic!("len {len}, seed {seed}: {e}"));
        }
        // Unfinished, the line may be buffered up to 1024 bytes, not one more.
        let mut reader = ticketing::wire::LineReader::new();
        let line = vec![b'x'; len];
        let mut input = &line[..];
        let first = reader.next_line(&mut input);
        if len <= 1024 {
            assert!(first.is_none());
            assert_eq!(reader.buffered(), len);
            let mut lf: &[u8] = b"\n";
            let line = reader.next_line(&mut lf).unwrap();
            assert_eq!(line.is_ok(), ok, "len {len}");
        } else {
            assert!(matches!(first, Some(Err(_))), "len {len}: {first:?}");
        }
    }
}

// ----- runs against the model server ------------------------------------------

/// A run: settings and steps.
#[derive(Debug, Clone)]
struct Scenario {
    setup: Setup,
    steps: Vec<Step>,
}

const ADVANCES: &[u16] = &[
    0, 1, 2, 4, 10, 20, 50, 100, 300, 1_000, 2_500, 6_000, 30_000,
];

fn raw_bytes(g: &mut Gen) -> Vec<u8> {
    let pieces: &[&[u8]] = &[
        // Version 1 grants (no waited_ms), which a version 2 client must
        // refuse, and version 2 answers to acquires and renewals.
        b"G 1 A k0 1 5\n",
        b"G 2 A k1 9 100\n",
        b"G 1 A k0 1 5 0\n",
        b"G 2 A k1 9 100 7\n",
        b"G 2 X k1 9 100\n",
        b"N 3 X k2\n",
        b"T 2 X k1\n",
        b"D 1 R k0\n",
        b"T 3 A k2\n",
        b"W x 4\n",
        b"L a:1\n",
        b"M b:2\n",
        b"E no_leader\n",
        b"E why\n",
        b"G 01 A k0 1 5\n",
        b"\r\n",
        b"\n",
        b"G 1 A k0",
        b" 7 50\n",
        b"Z\n",
    ];
    if below(g, 6) == 0 {
        return vec![b'x'; 255];
    }
    let mut out = Vec::new();
    for _ in 0..1 + below(g, 3) {
        out.extend_from_slice(pick(g, pieces));
    }
    out.truncate(255);
    out
}

fn step(g: &mut Gen, faulty: bool, shuts_down: bool) -> Step {
    let u = |g: &mut Gen| u8::arbitrary(g);
    // A grant to pick: now and then one already given back.
    let held = |g: &mut Gen| {
        if below(g, 10) == 0 {
            128 | u(g)
        } else {
            u(g) % 128
        }
    };
    loop {
        let roll = below(g, 118);
        let step = match roll {
            0..=13 => Step::Acquire {
                key: u(g),
                wait: u(g),
                lease: u(g),
            },
            14..=18 => Step::Release { pick: held(g) },
            19..=20 => Step::ReleaseToken {
                key: u(g),
                token: u(g) % 8,
            },
            21..=24 => Step::Cancel { pick: u(g) },
            25..=26 => Step::Undeliverable { pick: u(g) },
            27 if shuts_down && below(g, 3) == 0 => Step::Shutdown { budget: u(g) },
            28..=33 => Step::Connected,
            34 => Step::ConnectFailed,
            35..=44 => Step::ServerReads {
                bytes: if bool::arbitrary(g) { 0 } else { u(g) % 40 },
            },
            45..=54 => Step::ServerEmits { frames: u(g) % 4 },
            55..=66 => Step::Deliver {
                bytes: if bool::arbitrary(g) { 0 } else { 1 + u(g) % 30 },
            },
            67..=71 if faulty => Step::Fault { kind: u(g) },
            72..=76 if faulty => Step::Forge {
                kind: u(g),
                id: u(g),
                key: u(g),
                token: u(g) % 16,
                lease: u(g),
            },
            77 if faulty => Step::Raw { data: raw_bytes(g) },
            78 => Step::TransportClosed {
                error: bool::arbitrary(g),
            },
            79..=94 => Step::Advance {
                ms: pick(g, ADVANCES),
            },
            95..=98 => Step::NextDeadline,
            // Renewal (PROTOCOL.md section 5, "Renewal").
            100..=107 => Step::AcquireRenewing {
                key: u(g),
                wait: u(g),
                lease: u(g),
                limit: u(g),
            },
            108..=111 => Step::Renew {
                pick: held(g),
                lease: u(g),
            },
            112..=113 => Step::AutoRenew {
                pick: u(g),
                limit: u(g),
            },
            114 => Step::StopRenewing { pick: u(g) },
            115 if faulty => Step::HintFlood {
                count: u(g) % 8,
                kind: u(g),
            },
            116..=117 => Step::Foreign {
                pick: u(g),
                what: u(g),
            },
            _ => continue,
        };
        return step;
    }
}

impl Arbitrary for Scenario {
    fn arbitrary(g: &mut Gen) -> Scenario {
        let setup = Setup {
            seed: u64::arbitrary(g),
            window: u8::arbitrary(g),
            reserved: u8::arbitrary(g),
            keep_waiter: bool::arbitrary(g),
            fail_fast: below(g, 4) == 0,
            give_up: below(g, 4) == 0,
            release_attempts: u8::arbitrary(g),
            queue_limit: u8::arbitrary(g),
            // Mostly leases long enough to matter.
            max_lease: if below(g, 4) == 0 {
                u8::arbitrary(g)
            } else {
                3
            },
            max_acquires: u8::arbitrary(g),
            answer_grace: u8::arbitrary(g),
        };
        let faulty = bool::arbitrary(g);
        // A quarter of the runs may shut down before the end.
        let shuts_down = below(g, 4) == 0;
        let len = 10 + below(g, 190);
        let mut steps = Vec::with_capacity(len + 2);
        while steps.len() < len {
            if below(g, 5) == 0 {
                // A round trip on a healthy network: all the client sent is
                // read, answered and delivered. Without these, a connection
                // rarely lives long enough for a grant to be renewed.
                steps.extend([
                    Step::ServerReads { bytes: 0 },
                    Step::ServerEmits { frames: 0 },
                    Step::Deliver { bytes: 0 },
                ]);
            } else {
                steps.push(step(g, faulty, shuts_down));
            }
        }
        Scenario { setup, steps }
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Scenario>> {
        let setup = self.setup;
        let steps = self.steps.clone();
        let n = steps.len();
        let mut candidates = Vec::new();
        // Halves, quarters, then single steps (the last 40 only, to stay quick).
        let mut chunk = n / 2;
        while chunk >= 1 {
            let mut start = 0;
            while start < n {
                let mut fewer = steps.clone();
                fewer.drain(start..(start + chunk).min(n));
                candidates.push(Scenario {
                    setup,
                    steps: fewer,
                });
                start += chunk;
            }
            if chunk == 1 || candidates.len() > 200 {
                break;
            }
            chunk /= 2;
        }
        Box::new(candidates.into_iter())
    }
}

static RUN_STATS: Mutex<Option<(Stats, u64, u64)>> = Mutex::new(None);

#[test]
fn random_runs_keep_every_invariant() {
    fn prop(s: Scenario) -> TestResult {
        match Runner::run(&s.setup, &s.steps) {
            Ok(report) => {
                let mut tally = RUN_STATS.lock().unwrap();
                let (stats, keep, close) = tally.get_or_insert((Stats::default(), 0, 0));
                stats.add(&report.stats);
                if report.stats.cancelled + report.stats.indeterminate > 0 {
                    if s.setup.keep_waiter {
                        *keep += 1;
                    } else {
                        *close += 1;
                    }
                }
                TestResult::passed()
            }
            Err(v) => TestResult::error(format!("{v}")),
        }
    }
    qc("random_runs", CASES_RUNS).quickcheck(prop as fn(Scenario) -> TestResult);
    let (stats, keep, close) = RUN_STATS.lock().unwrap().expect("cases ran");
    println!("totals: {stats:?}; runs with cancels under KeepWaiter: {keep}, under Close: {close}");
    // The generator must reach what the properties claim to cover.
    let covered = [
        ("granted", stats.granted),
        ("timed out", stats.timed_out),
        ("busy", stats.busy),
        ("cancelled", stats.cancelled),
        ("indeterminate", stats.indeterminate),
        ("released", stats.released),
        ("not held", stats.not_held),
        ("lapsed", stats.lapsed),
        ("orphan releases", stats.orphan_releases),
        ("retries after B", stats.retries),
        ("stray answers", stats.strays),
        ("closes", stats.closes),
        ("renewals sent", stats.renewals),
        ("Renewed notices", stats.renewed),
        ("LeaseJeopardy notices", stats.jeopardies),
        ("LeaseLost notices", stats.lost),
        ("LeaseExpired notices", stats.expired),
        ("hint notices", stats.hint_notices),
        ("L lines read", stats.hints_read),
        ("foreign grants refused", stats.foreign_refused),
        ("cancels under KeepWaiter", keep),
        ("cancels under Close", close),
    ];
    for (what, count) in covered {
        assert!(count > 0, "no run had any {what}: {stats:?}");
    }
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    fn prop(s: Scenario) -> TestResult {
        let first = match Runner::run_twice(&s.setup, &s.steps) {
            Ok(report) => report,
            Err(v) => return TestResult::error(format!("{v}")),
        };
        // The same run read back from its fuzz encoding gives the same trace.
        let bytes = fuzz::encode_scenario(&s.setup, &s.steps);
        let (setup, steps) = fuzz::scenario(&bytes);
        if setup != s.setup || steps != s.steps {
            return TestResult::error("the fuzz encoding does not read back");
        }
        match Runner::run(&setup, &steps) {
            Ok(again) if again.trace_hash == first.trace_hash => TestResult::passed(),
            Ok(again) => TestResult::error(format!(
                "traces differ: {:#x} and {:#x}",
                first.trace_hash, again.trace_hash
            )),
            Err(v) => TestResult::error(format!("{v}")),
        }
    }
    qc("determinism", CASES_DETERMINISM).quickcheck(prop as fn(Scenario) -> TestResult);
}

#[test]
fn traces_tell_different_runs_apart() {
    // The trace hash is a real witness: changing one input changes it.
    let setup = Setup {
        seed: 3,
        max_lease: 3,
        ..Setup::default()
    };
    let mut steps = vec![
        Step::Acquire {
            key: 0,
            wait: 3,
            lease: 5,
        },
        Step::Connected,
        Step::ServerReads { bytes: 0 },
        Step::ServerEmits { frames: 0 },
        Step::Deliver { bytes: 0 },
        Step::ServerReads { bytes: 0 },
        Step::ServerEmits { frames: 0 },
        Step::Deliver { bytes: 0 },
    ];
    let a = Runner::run_twice(&setup, &steps).unwrap();
    steps.insert(0, Step::Advance { ms: 2 });
    let b = Runner::run_twice(&setup, &steps).unwrap();
    assert_ne!(a.trace_hash, b.trace_hash);
    assert_eq!(a.stats.granted, 1);
    let other_seed = Setup { seed: 4, ..setup };
    let c = Runner::run(&other_seed, &steps).unwrap();
    let d = Runner::run(&other_seed, &steps).unwrap();
    assert_eq!(c.trace_hash, d.trace_hash);
}

#[test]
fn step_encoding_reads_back() {
    fn prop(s: Scenario) -> bool {
        let bytes = fuzz::encode_scenario(&s.setup, &s.steps);
        let (setup, steps) = fuzz::scenario(&bytes);
        setup == s.setup && steps == s.steps
    }
    qc("step_encoding", CASES_STEP_ENCODING).quickcheck(prop as fn(Scenario) -> bool);
}

#[test]
fn arbitrary_bytes_never_break_the_fuzz_entry_points() {
    fn prop(data: Vec<u8>) -> TestResult {
        if let Err(e) = fuzz::decode(&data) {
            return TestResult::error(e.to_string());
        }
        verdict(fuzz::client(&data))
    }
    qc("fuzz_bytes", CASES_FUZZ_BYTES).quickcheck(prop as fn(Vec<u8>) -> TestResult);
}

// ----- a replicated cluster's entries of decisions -----------------------------------

/// Decisions of every kind, with keys and numbers from the edges.
#[derive(Debug, Clone)]
struct Decisions(Vec<ticketing::server::Decision>);

impl Arbitrary for Decisions {
    fn arbitrary(g: &mut Gen) -> Decisions {
        use std::num::NonZeroU64;
        use ticketing::server::Decision;
        let n = below(g, 12);
        let nonzero = |g: &mut Gen| NonZeroU64::new(number(g)).unwrap_or(NonZeroU64::MIN);
        let decisions = (0..n)
            .map(|_| {
                let key = Key::new(atom_text(g, MAX_ATOM)).expect("an atom");
                match below(g, 5) {
                    0 => Decision::Floor { epoch: number(g) },
                    1 => Decision::Grant {
                        key,
                        token: nonzero(g).get(),
                        lease_ms: nonzero(g),
                    },
                    2 => Decision::Release {
                        key,
                        token: nonzero(g).get(),
                    },
                    3 => Decision::Expire {
                        key,
                        token: nonzero(g).get(),
                    },
                    _ => Decision::Renew {
                        key,
                        token: nonzero(g).get(),
                        lease_ms: nonzero(g),
                    },
                }
            })
            .collect();
        Decisions(decisions)
    }
}

#[test]
fn entries_of_decisions_read_back_as_written_and_every_cut_is_refused_or_a_prefix() {
    fn prop(d: Decisions) -> TestResult {
        use ticketing::server::Decision;
        let bytes = Decision::encode_entry(&d.0);
        if Decision::decode_entry(&bytes).as_ref() != Ok(&d.0) {
            return TestResult::error(format!("{:?} does not read back", d.0));
        }
        if let Err(e) = fuzz::decisions(&bytes) {
            return TestResult::error(e.to_string());
        }
        for end in 0..bytes.len() {
            if let Ok(prefix) = Decision::decode_entry(&bytes[..end]) {
                if prefix[..] != d.0[..prefix.len()] {
                    return TestResult::error(format!("cut at {end} reads as {prefix:?}"));
                }
            }
        }
        TestResult::passed()
    }
    qc("decisions", CASES_DECISIONS).quickcheck(prop as fn(Decisions) -> TestResult);
}

// ----- the model server is legal --------------------------------------------------

/// What a model-server run does: (kind, conn, key, number) tuples.
#[derive(Debug, Clone)]
struct ServerScript {
    seed: u64,
    window: u64,
    queue_limit: usize,
    max_lease_ms: u64,
    moves: Vec<(u8, u8, u8, u16)>,
}

impl Arbitrary for ServerScript {
    fn arbitrary(g: &mut Gen) -> ServerScript {
        let len = below(g, 200);
        ServerScript {
            seed: u64::arbitrary(g),
            window: 2 + below(g, 6) as u64,
            queue_limit: below(g, 4),
            max_lease_ms: pick(g, &[1, 50, 1_000, 60_000]),
            moves: (0..len)
                .map(|_| {
                    (
                        u8::arbitrary(g) % 6,
                        u8::arbitrary(g) % 3,
                        u8::arbitrary(g) % 3,
                        u16::arbitrary(g),
                    )
                })
                .collect(),
        }
    }
}

/// Drives the model server directly from three connections and checks
/// section 4: one answer per request, with its id, op and key; a lease never
/// longer than asked nor than the maximum; `B` only with a full queue and
/// `T` at once only for a zero wait; tokens strictly increasing per key.
fn model_server_is_legal(script: &ServerScript) -> Result<(), String> {
    use std::collections::BTreeMap;
    use ticketing::testkit::{ModelServer, ServerConfig};
    let mut server = ModelServer::new(ServerConfig {
        window: script.window,
        queue_limit: script.queue_limit,
        max_lease_ms: script.max_lease_ms,
        seed: script.seed,
        ..ServerConfig::default()
    });
    let keys = ["a", "b", "c"];
    let mut now = Time::ZERO;
    // Per connection: open, welcomed, next id, unanswered requests.
    let mut open = [false; 3];
    let mut welcomed = [false; 3];
    let mut next_id = [1u64; 3];
    // id -> (op letter, key, lease asked, wait)
    type Unanswered<'k> = BTreeMap<u64, (u8, &'k str, u64, u64)>;
    let mut unanswered: [Unanswered; 3] = Default::default();
    let mut last_token: BTreeMap<&str, u64> = BTreeMap::new();
    let mut last_holder: BTreeMap<&str, u64> = BTreeMap::new();
    let mut tokens_seen: Vec<(&str, u64)> = Vec::new();
    for &(kind, conn, key, n) in &script.moves {
        let c = usize::from(conn);
        let id_conn = u64::from(conn);
        let key = keys[usize::from(key)];
        match kind {
            0 if !open[c] => {
                server.open(now, id_conn);
                server.receive(now, id_conn, b"H 1 x -\n");
                open[c] = true;
                welcomed[c] = false;
                unanswered[c].clear();
            }
            0 | 1 if open[c] && welcomed[c] && (unanswered[c].len() as u64) < script.window => {
                let id = next_id[c];
                next_id[c] += 1;
                let line = if kind == 0 {
                    let wait = [0u64, 5, 50, 500][usize::from(n % 4)];
                    let lease = [1u64, 20, 300, 100_000][usize::from(n / 4 % 4)];
                    unanswered[c].insert(id, (b'A', key, lease, wait));
                    format!("A {id} {key} o {wait} {lease}\n")
                } else {
                    let token = match tokens_seen.iter().rev().find(|(k, _)| *k == key) {
                        Some(&(_, t)) if n % 2 == 0 => t,
                        _ => u64::from(n % 5),
                    };
                    unanswered[c].insert(id, (b'R', key, 0, 0));
                    format!("R {id} {key} {token}\n")
                };
                server.receive(now, id_conn, line.as_bytes());
            }
            2 => now = now.saturating_add(Duration::from_millis(u64::from(n % 700))),
            3 | 4 if open[c] => {
                server.advance(now);
                while let Some(frame) = server.emit(id_conn) {
                    let line = &frame[..frame.len() - 1];
                    match ServerFrame::parse(line).map_err(|e| e.to_string())? {
                        ServerFrame::Welcome { window, .. } => {
                            if welcomed[c] || window.get() != script.window {
                                return Err(format!("bad W on {c}: {frame:?}"));
                            }
                            welcomed[c] = true;
                        }
                        ServerFrame::Answer(a) => {
                            let Some((op, k, asked, wait)) = unanswered[c].remove(&a.id) else {
                                return Err(format!(
                                    "answer to no request: {:?}",
                                    String::from_utf8_lossy(&frame)
                                ));
                            };
                            if a.op().letter() != op || a.key.as_str() != k {
                                return Err(format!("answer names another op or key: {a:?}"));
                            }
                            match a.kind {
                                AnswerKind::Granted {
                                    token, lease_ms, ..
                                } => {
                                    if lease_ms.get() > asked.min(script.max_lease_ms) {
                                        return Err(format!("lease {lease_ms} above {asked}"));
                                    }
                                    tokens_seen.push((k, token));
                                    SERVER_GRANTS.fetch_add(1, Ordering::Relaxed);
                                }
                                AnswerKind::Busy if wait == 0 => {
                                    return Err("B for a try-lock".into());
                                }
                                _ => {}
                            }
                        }
                        other => return Err(format!("unexpected {other:?}")),
                    }
                    if kind == 3 {
                        break;
                    }
                }
            }
            5 if open[c] => {
                server.close(now, id_conn);
                open[c] = false;
            }
            _ => {}
        }
        server.advance(now);
        for k in keys {
            if let Some(t) = server.holder(k) {
                let last = last_token.entry(k).or_insert(0);
                if last_holder.get(k) != Some(&t) {
                    if t <= *last {
                        return Err(format!("token {t} of {k} not above {last}"));
                    }
                    *last = t;
                    last_holder.insert(k, t);
                }
            } else {
                last_holder.remove(k);
            }
        }
    }
    if !server.complaints().is_empty() {
        return Err(format!("complaints: {:?}", server.complaints()));
    }
    Ok(())
}

static SERVER_GRANTS: AtomicU64 = AtomicU64::new(0);

#[test]
fn the_model_server_answers_legally() {
    fn prop(script: ServerScript) -> TestResult {
        verdict(model_server_is_legal(&script))
    }
    qc("model_server", CASES_SERVER).quickcheck(prop as fn(ServerScript) -> TestResult);
    let grants = SERVER_GRANTS.load(Ordering::Relaxed);
    println!("model server grants checked: {grants}");
    assert!(
        grants >= CASES_SERVER,
        "too few grants to mean anything: {grants}"
    );
}

// ----- the checker itself catches violations ------------------------------------

/// A client at t=0 with its first Connect handed to a checker.
fn watched() -> (Client, Checker) {
    let config = Config::new([Endpoint::new("a:1").unwrap()], Name::new("tk").unwrap());
    let mut checker = Checker::new(&config, Time::ZERO);
    let mut client = Client::new(config, Time::ZERO).unwrap();
    actions(&mut client, &mut checker);
    (client, checker)
}

fn conn_of(client: &Client) -> ticketing::client::ConnId {
    client.connection().unwrap()
}

/// A [`watched`] client through its [`handshake`].
fn welcomed() -> (Client, Checker) {
    let (mut client, mut checker) = watched();
    handshake(&mut client, &mut checker);
    (client, checker)
}

/// Drives `client` through the handshake (window 4), feeding the checker.
fn handshake(client: &mut Client, checker: &mut Checker) {
    let conn = conn_of(client);
    client.handle_connected(Time::ZERO, conn);
    checker.connected(Time::ZERO, conn);
    actions(client, checker);
    deliver(client, checker, Time::ZERO, b"W n 4\n");
    events(client, checker);
    checker.end_step(client).unwrap();
}

/// Hands every action of `client` to `checker`.
fn actions(client: &mut Client, checker: &mut Checker) {
    while let Some(action) = client.poll_action() {
        checker.action(&action).unwrap();
    }
}

/// Hands every event of `client` to `checker`.
fn events(client: &mut Client, checker: &mut Checker) {
    while let Some(event) = client.poll_event() {
        checker.event(&event).unwrap();
    }
}

/// Gives `client` and `checker` the same bytes from the server at `now`.
fn deliver(client: &mut Client, checker: &mut Checker, now: Time, data: &[u8]) {
    let conn = conn_of(client);
    client.handle_bytes(now, conn, data);
    checker.bytes(now, conn, data).unwrap();
}

/// A try-lock (no wait) of `key` for `owner` at t=0, asked of `client`
/// and told to `checker`.
fn acquire(
    client: &mut Client,
    checker: &mut Checker,
    key: &Key,
    owner: &Name,
    lease: Duration,
) -> Result<ticketing::client::OpId, ticketing::client::Error> {
    let r = client.acquire(
        Time::ZERO,
        key.clone(),
        owner.clone(),
        Duration::ZERO,
        lease,
    );
    checker
        .acquire(Time::ZERO, key, owner, Duration::ZERO, lease, &r)
        .unwrap();
    r
}

fn send(client: &Client, text: &str) -> Action {
    Action::Send {
        conn: conn_of(client),
        data: bytes::Bytes::copy_from_slice(text.as_bytes()),
    }
}

#[test]
fn the_checker_catches_a_request_before_w() {
    let (mut client, mut checker) = watched();
    let conn = conn_of(&client);
    client.handle_connected(Time::ZERO, conn);
    actions(&mut client, &mut checker);
    let key = Key::new("k").unwrap();
    let owner = Name::new("o1").unwrap();
    let _ = acquire(
        &mut client,
        &mut checker,
        &key,
        &owner,
        Duration::from_secs(1),
    );
    let err = checker
        .action(&send(&client, "A 1 k o1 0 1000\n"))
        .unwrap_err();
    assert_eq!(err.invariant, Invariant::Window, "{err}");
}

#[test]
fn the_checker_catches_a_resent_acquire_and_a_full_window() {
    let (mut client, mut checker) = welcomed();
    let key = Key::new("k").unwrap();
    let owner = Name::new("o1").unwrap();
    let lease = Duration::from_secs(1);
    let _ = acquire(&mut client, &mut checker, &key, &owner, lease);
    checker.action(&send(&client, "A 1 k o1 0 1000\n")).unwrap();
    let err = checker
        .action(&send(&client, "A 2 k o1 0 1000\n"))
        .unwrap_err();
    assert_eq!(err.invariant, Invariant::NoResend, "{err}");

    // Window 4, 1 reserved: a fourth acquire in flight is one too many.
    let (mut client, mut checker) = welcomed();
    for i in 1..=4 {
        let owner = Name::new(format!("o{i}")).unwrap();
        let _ = acquire(&mut client, &mut checker, &key, &owner, lease);
        let sent = checker.action(&send(&client, &format!("A {i} k o{i} 0 1000\n")));
        if i < 4 {
            sent.unwrap();
        } else {
            assert_eq!(sent.unwrap_err().invariant, Invariant::Window);
        }
    }
}

#[test]
fn the_checker_catches_misattributed_and_double_outcomes() {
    let (mut client, mut checker) = welcomed();
    let key = Key::new("k").unwrap();
    let lease = Duration::from_secs(1);
    let mut ops = Vec::new();
    for i in 1..=2 {
        let owner = Name::new(format!("o{i}")).unwrap();
        let r = acquire(&mut client, &mut checker, &key, &owner, lease);
        ops.push(r.unwrap());
    }
    // The real client sends both and gets G for the second only.
    actions(&mut client, &mut checker);
    deliver(&mut client, &mut checker, Time::ZERO, b"G 2 A k 5 1000 0\n");
    let granted = std::iter::from_fn(|| client.poll_event())
        .find_map(|e| match e {
            Event::Outcome {
                outcome: Outcome::Granted(g),
                ..
            } => Some(g),
            _ => None,
        })
        .unwrap();
    // Claiming that grant for the first operation is a misattribution.
    let wrong = Event::Outcome {
        op: ops[0],
        outcome: Outcome::Granted(granted.clone()),
    };
    assert_eq!(
        checker.event(&wrong).unwrap_err().invariant,
        Invariant::Attribution
    );
    let right = Event::Outcome {
        op: ops[1],
        outcome: Outcome::Granted(granted),
    };
    checker.event(&right).unwrap();
    let twice = Event::Outcome {
        op: ops[1],
        outcome: Outcome::Cancelled,
    };
    assert_eq!(
        checker.event(&twice).unwrap_err().invariant,
        Invariant::OneOutcome
    );
}

#[test]
fn the_checker_catches_a_release_behind_the_embedders_back_and_a_lost_orphan() {
    let (mut client, mut checker) = welcomed();
    let key = Key::new("k").unwrap();
    let owner = Name::new("o1").unwrap();
    let lease = Duration::from_secs(10);
    let _ = acquire(&mut client, &mut checker, &key, &owner, lease);
    actions(&mut client, &mut checker);
    deliver(
        &mut client,
        &mut checker,
        Time::ZERO,
        b"G 1 A k 5 10000 0\n",
    );
    events(&mut client, &mut checker);
    checker.end_step(&client).unwrap();
    // The embedder holds (k, 5): an R for it that nobody asked for.
    let err = checker.action(&send(&client, "R 2 k 5\n")).unwrap_err();
    assert_eq!(err.invariant, Invariant::OrphanRelease, "{err}");

    // A G to an unknown id that the client neither closes on nor releases.
    let (client, mut checker) = welcomed();
    let conn = conn_of(&client);
    checker
        .bytes(Time::ZERO, conn, b"G 77 A k 9 10000 0\n")
        .unwrap();
    // (the client is not given the bytes: it does nothing)
    let err = checker.end_step(&client).unwrap_err();
    assert_eq!(err.invariant, Invariant::OrphanRelease, "{err}");
}

#[test]
fn a_grant_of_another_client_is_refused_and_changes_nothing() {
    // The grant the Foreign step hands over is a real one, of another
    // client, with the key, token and lease asked for.
    let grant = ticketing::testkit::run::foreign_grant("k1", 41, 2_000).expect("a foreign grant");
    assert_eq!(
        (grant.key().as_str(), grant.token(), grant.lease()),
        ("k1", 41, Duration::from_secs(2))
    );
    // Handed to each call, on a client that holds a grant with that very
    // key, token and handle: refused every time, and the run goes on.
    let setup = Setup {
        seed: 5,
        max_lease: 3,
        ..Setup::default()
    };
    let mut steps = vec![
        Step::Connected,
        Step::ServerReads { bytes: 0 },
        Step::ServerEmits { frames: 0 },
        Step::Deliver { bytes: 0 },
        Step::Acquire {
            key: 1,
            wait: 0,
            lease: 5,
        },
        Step::ServerReads { bytes: 0 },
        Step::ServerEmits { frames: 0 },
        Step::Deliver { bytes: 0 },
    ];
    for what in 0..5 {
        steps.push(Step::Foreign { pick: 0, what });
    }
    steps.push(Step::Release { pick: 0 });
    let report = Runner::run_twice(&setup, &steps).unwrap();
    assert_eq!(report.stats.granted, 1, "{:?}", report.stats);
    assert_eq!(report.stats.foreign_refused, 5, "{:?}", report.stats);
    assert_eq!(report.stats.released, 1, "{:?}", report.stats);
}

/// A client holding `(k3, 1)` (lease 30 ms) whose renewal asking for 10 s
/// went out at t=0 and is never answered, and whose driver then sleeps
/// until t=22.359 s (an odd advance: the client learns the time from its
/// next input) before renewing again.
fn a_late_renewal_of_an_expired_grant() -> (Setup, Vec<Step>) {
    let setup = Setup {
        seed: 6,
        max_lease: 3,
        // An answer grace of 5 s.
        answer_grace: 2,
        ..Setup::default()
    };
    let round_trip = [
        Step::ServerReads { bytes: 0 },
        Step::ServerEmits { frames: 0 },
        Step::Deliver { bytes: 0 },
    ];
    let mut steps = vec![Step::Connected];
    steps.extend(round_trip.clone());
    steps.push(Step::Acquire {
        key: 3,
        wait: 0,
        lease: 2,
    });
    steps.extend(round_trip);
    steps.push(Step::Renew { pick: 0, lease: 6 });
    steps.push(Step::Advance { ms: 22_359 });
    steps.push(Step::Renew { pick: 0, lease: 6 });
    (setup, steps)
}

#[test]
fn a_renewal_command_after_a_close_the_clients_own_timers_made_within_the_call_is_not_held() {
    // Found by the client fuzz target. At the second renew the client
    // first fires what fell due meanwhile: the renewal's answer grace ran
    // out at t=5 s, so it closed then and put the renewal down (the grant
    // had expired), and at the record's end, t=11 s (the renewal's send
    // plus the 10 s it asked plus the margin), forgot the grant. So the
    // renew is refused GrantNotHeld, which the checker, knowing of no
    // close yet, took for a wrong LeaseExpired.
    let (setup, steps) = a_late_renewal_of_an_expired_grant();
    let report = Runner::run_twice(&setup, &steps).unwrap_or_else(|v| panic!("{v}"));
    assert_eq!(report.stats.granted, 1, "{:?}", report.stats);
    assert_eq!(report.stats.renewals, 1, "{:?}", report.stats);
    assert!(report.stats.closes >= 1, "{:?}", report.stats);
}

/// A watched client (window 4) holding `(k3, 1)`, granted at t=0 for
/// 30 ms, with a renewal asking for 10 s in flight since t=0.
fn holding_with_a_renewal_in_flight() -> (Client, Checker, ticketing::client::Grant) {
    let (mut client, mut checker) = welcomed();
    let (key, owner, lease) = (
        Key::new("k3").unwrap(),
        Name::new("o1").unwrap(),
        Duration::from_millis(30),
    );
    let _ = acquire(&mut client, &mut checker, &key, &owner, lease);
    actions(&mut client, &mut checker);
    checker.end_step(&client).unwrap();
    deliver(&mut client, &mut checker, Time::ZERO, b"G 1 A k3 1 30 0\n");
    let mut grant = None;
    while let Some(event) = client.poll_event() {
        checker.event(&event).unwrap();
        if let Event::Outcome {
            outcome: Outcome::Granted(g),
            ..
        } = event
        {
            grant = Some(g);
        }
    }
    checker.end_step(&client).unwrap();
    let grant = grant.expect("granted");
    let ten_s = Some(Duration::from_secs(10));
    let r = client.renew(Time::ZERO, &grant, ten_s);
    checker.renew(Time::ZERO, &grant, ten_s, &r).unwrap();
    let mut sent = Vec::new();
    while let Some(action) = client.poll_action() {
        checker.action(&action).unwrap();
        if let Action::Send { data, .. } = action {
            sent.extend_from_slice(&data);
        }
    }
    assert_eq!(sent, b"X 2 k3 1 10000\n");
    checker.end_step(&client).unwrap();
    (client, checker, grant)
}

#[test]
fn the_checker_catches_a_grant_forgotten_with_its_renewal_in_flight_and_no_close() {
    let late = Time::from_millis(22_359);
    let ten_s = Some(Duration::from_secs(10));
    // The real client, late: it closes first, within the call, then
    // refuses the renewal of a grant it has forgotten. The checker agrees.
    let (mut client, mut checker, grant) = holding_with_a_renewal_in_flight();
    let r = client.renew(late, &grant, ten_s);
    assert!(
        matches!(r, Err(ticketing::client::Error::GrantNotHeld { .. })),
        "{r:?}"
    );
    checker.renew(late, &grant, ten_s, &r).unwrap();
    let mut closed = false;
    while let Some(action) = client.poll_action() {
        closed |= matches!(action, Action::Close { .. });
        checker.action(&action).unwrap();
    }
    events(&mut client, &mut checker);
    assert!(closed);
    checker.end_step(&client).unwrap();
    // A client that says the same without having closed is caught: with
    // its renewal in flight, the grant is still known.
    let (client, mut checker, grant) = holding_with_a_renewal_in_flight();
    let forgotten = Err(ticketing::client::Error::GrantNotHeld {
        key: Key::new("k3").unwrap(),
        token: 1,
    });
    checker.renew(late, &grant, ten_s, &forgotten).unwrap();
    let err = checker.end_step(&client).unwrap_err();
    assert_eq!(err.invariant, Invariant::Protocol, "{err}");
    assert!(err.detail.contains("none came"), "{err}");
    // And one that says LeaseExpired, as if no close had come, is right
    // as far as the checker can tell from the call alone.
    let (_, mut checker, grant) = holding_with_a_renewal_in_flight();
    let expired = Err(ticketing::client::Error::LeaseExpired {
        key: Key::new("k3").unwrap(),
        token: 1,
    });
    checker.renew(late, &grant, ten_s, &expired).unwrap();
}

/// Feeds `client` and `checker` the same bytes at `now` and drains both,
/// ending the step; returns what the client sent and the grants it handed
/// out.
fn feed(
    client: &mut Client,
    checker: &mut Checker,
    now: Time,
    text: &str,
) -> (String, Vec<ticketing::client::Grant>) {
    deliver(client, checker, now, text.as_bytes());
    drain(client, checker)
}

/// Drains `client` into `checker` and ends the step.
fn drain(client: &mut Client, checker: &mut Checker) -> (String, Vec<ticketing::client::Grant>) {
    let mut sent = String::new();
    let mut grants = Vec::new();
    while let Some(action) = client.poll_action() {
        checker.action(&action).unwrap();
        if let Action::Send { data, .. } = &action {
            sent.push_str(std::str::from_utf8(data).unwrap());
        }
    }
    while let Some(event) = client.poll_event() {
        checker.event(&event).unwrap();
        if let Event::Outcome {
            outcome: Outcome::Granted(g),
            ..
        } = event
        {
            grants.push(g);
        }
    }
    checker.end_step(client).unwrap();
    (sent, grants)
}

#[test]
fn two_grants_with_one_key_and_token_are_renewed_each_as_its_own() {
    // Found by the client fuzz target: a forged G took a token that the
    // server gave later, so the embedder held two grants of (k, 5). The
    // client renewed the one it was asked to; the checker took the X for
    // the other one, whose renewal nobody had asked for.
    let (mut client, mut checker) = welcomed();
    let key = Key::new("k").unwrap();
    for (owner, lease) in [("o1", 3_000), ("o2", 60_000)] {
        let owner = Name::new(owner).unwrap();
        let lease = Duration::from_millis(lease);
        let _ = acquire(&mut client, &mut checker, &key, &owner, lease);
    }
    let (sent, _) = drain(&mut client, &mut checker);
    assert_eq!(sent, "A 1 k o1 0 3000\nA 2 k o2 0 60000\n");
    let (_, grants) = feed(
        &mut client,
        &mut checker,
        Time::ZERO,
        "G 1 A k 5 3000 0\nG 2 A k 5 60000 0\n",
    );
    let [short, long] = &grants[..] else {
        panic!("two grants: {grants:?}");
    };
    assert_eq!((short.token(), long.token()), (5, 5));
    // The second one, asking for 1 ms: it keeps what it has.
    let one_ms = Some(Duration::from_millis(1));
    let r = client.renew(Time::ZERO, long, one_ms);
    checker.renew(Time::ZERO, long, one_ms, &r).unwrap();
    let (sent, _) = drain(&mut client, &mut checker);
    assert_eq!(sent, "X 3 k 5 1\n");
    feed(&mut client, &mut checker, Time::ZERO, "G 3 X k 5 1\n");
    assert_eq!(client.valid_until(long), Some(Time::from_millis(60_000)));
    // Then the first one, at t=1 s: its own valid_until moves, and the
    // checker, which compares each grant's after every step, agrees.
    let at = Time::from_millis(1_000);
    let r = client.renew(at, short, None);
    checker.renew(at, short, None, &r).unwrap();
    let (sent, _) = drain(&mut client, &mut checker);
    assert_eq!(sent, "X 4 k 5 3000\n");
    feed(&mut client, &mut checker, at, "G 4 X k 5 3000\n");
    assert_eq!(client.valid_until(short), Some(Time::from_millis(4_000)));
    assert_eq!(client.valid_until(long), Some(Time::from_millis(60_000)));
    // An X for (k, 5) that neither asked for is still caught.
    let err = checker.action(&send(&client, "X 5 k 5 7\n")).unwrap_err();
    assert_eq!(err.invariant, Invariant::Protocol, "{err}");
    assert!(err.detail.contains("nobody asked"), "{err}");
}
