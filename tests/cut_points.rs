//! Cut points: a whole session whose server bytes are fed split at every
//! possible byte boundary (and one byte at a time) gives exactly the same
//! outcomes, notices and bytes sent as feeding every chunk whole
//! (PROTOCOL.md section 2, framing; `Client::handle_bytes` takes bytes "in
//! any chunking").
//!
//! The session: a handshake preceded by an `L` hint, a raw release and
//! several keys, answers out of order (a later acquire answered first, two
//! acquires of one key), a `B` retried with a new id, a grant released with
//! an acquire waiting, a leader hint, an `M` that moves the client to
//! another node with bytes after it that must be ignored, a second
//! handshake, an `N`, and a shutdown.

mod support;

use support::*;
use ticketing::client::{Action, BackoffCause, CloseReason, ConnId, Event, OpId, Outcome};
use ticketing::rng::Rng;

/// How each server chunk is handed to the client.
#[derive(Clone, Debug)]
enum Cut {
    /// Every chunk whole.
    Whole,
    /// Chunk `chunk` split in two at byte `at`; the others whole.
    At { chunk: usize, at: usize },
    /// Every chunk one byte at a time.
    Bytewise,
    /// Every chunk split at random points (seeded).
    Random(u64),
}

/// What a run produced: every action but the sends, every byte sent, and
/// every event.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    actions: Vec<Action>,
    sent: String,
    events: Vec<Event>,
}

struct Feeder {
    cut: Cut,
    chunk: usize,
    rng: Rng,
    /// Every event so far.
    log: Vec<Event>,
}

impl Feeder {
    /// Moves the harness's events into the log.
    fn sync(&mut self, h: &mut Harness) {
        self.log.extend(h.take_events());
    }

    /// The outcome of `op`, which must have ended.
    fn outcome_of(&mut self, h: &mut Harness, op: OpId) -> Outcome {
        self.sync(h);
        self.log
            .iter()
            .find_map(|e| match e {
                Event::Outcome { op: o, outcome } if *o == op => Some(outcome.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no outcome for {op}"))
    }

    /// Hands the server's `bytes` for connection `conn` to the client, cut
    /// as `self.cut` says, draining the client's outputs after each piece
    /// as a driver does.
    fn feed(&mut self, h: &mut Harness, conn: ConnId, bytes: &str) {
        let bytes = bytes.as_bytes();
        let mut cuts: Vec<usize> = match self.cut {
            Cut::Whole => vec![],
            Cut::At { chunk, at } if chunk == self.chunk => vec![at],
            Cut::At { .. } => vec![],
            Cut::Bytewise => (1..bytes.len()).collect(),
            Cut::Random(_) => (1..bytes.len()).filter(|_| self.rng.chance(1, 5)).collect(),
        };
        cuts.push(bytes.len());
        let mut from = 0;
        for to in cuts {
            // Feed to the chunk's connection, even if an earlier piece closed
            // it: the client must ignore bytes of a connection it closed.
            h.client.handle_bytes(h.now, conn, &bytes[from..to]);
            h.pump();
            from = to;
        }
        self.chunk += 1;
        self.sync(h);
    }
}

/// The server's chunks, in order, each fed at one moment.
const CHUNKS: [&str; 6] = [
    // 0: a hint (allowlisted endpoint) before the handshake answer.
    "L b:2\nW node-1 3\n",
    // 1: the later acquire answered first; a B for the earlier one.
    "G 3 A k2 7 10000 0\nD 1 R k9\nB 2 A k1\n",
    // 2: a try-lock's T, a release's D, and the first waiter of k1.
    "T 5 A k3\nD 6 R k2\nG 4 A k1 12 8000 0\n",
    // 3: another hint, the last answers, then M: the rest is ignored.
    "L a:1\nD 8 R k1\nG 7 A k1 13 10000 0\nM b:2\nG 99 A zz 1 10 0\nE nonsense\n",
    // 4: the handshake on the second node.
    "W node-2 4\n",
    // 5: an N for a release, a grant.
    "N 10 R k1\nG 9 A k4 14 2000 0\n",
];

fn session(cut: Cut) -> Record {
    let mut f = Feeder {
        rng: Rng::new(match cut {
            Cut::Random(seed) => seed,
            _ => 0,
        }),
        cut,
        chunk: 0,
        log: Vec::new(),
    };
    let mut h = Harness::new(config());
    // Window 3 below, one slot reserved: two acquires in flight at most.
    let op1 = h.acquire("k1", 5000, 10_000);
    let op2 = h.acquire("k2", 5000, 10_000);
    let op3 = h.acquire("k1", 5000, 10_000);
    let op4 = h.acquire("k3", 0, 10_000);
    let raw = h.release_token("k9", 41);
    let conn1 = h.connect();
    f.feed(&mut h, conn1, CHUNKS[0]);

    h.at_ms(100);
    f.feed(&mut h, conn1, CHUNKS[1]);

    // The B retry's backoff (10 ms step) has passed; no acquire slot yet.
    h.at_ms(200);
    let grant2 = f.outcome_of(&mut h, op2);
    let rel2 = h.release(&grant_of(&grant2));

    h.at_ms(300);
    f.feed(&mut h, conn1, CHUNKS[2]);

    h.at_ms(400);
    let grant3 = f.outcome_of(&mut h, op3);
    let rel3 = h.release(&grant_of(&grant3));

    h.at_ms(500);
    f.feed(&mut h, conn1, CHUNKS[3]);

    // Moved: reconnected at once to the hint.
    h.at_ms(600);
    let conn2 = h.connect();
    assert_ne!(conn1, conn2);
    f.feed(&mut h, conn2, CHUNKS[4]);

    h.at_ms(700);
    let op7 = h.acquire("k4", 1000, 2000);
    let grant1 = f.outcome_of(&mut h, op1);
    let rel1 = h.release(&grant_of(&grant1));

    h.at_ms(800);
    f.feed(&mut h, conn2, CHUNKS[5]);

    h.client.shutdown(h.now, ms(1000)).unwrap();
    h.pump();
    assert!(h.client.is_finished());

    f.sync(&mut h);
    // Each operation ended once, as the script says.
    let expected = [
        (op4, "TimedOut { sent: true, cause: None }"),
        (raw, "Released"),
        (rel2, "Released"),
        (rel3, "Released"),
        (rel1, "NotHeld"),
    ];
    for (op, outcome) in expected {
        let ended: Vec<String> = f
            .log
            .iter()
            .filter_map(|e| match e {
                Event::Outcome { op: o, outcome } if *o == op => Some(format!("{outcome:?}")),
                _ => None,
            })
            .collect();
        assert_eq!(ended, vec![outcome.to_owned()], "{op}");
    }
    assert_eq!(grant_of(&f.outcome_of(&mut h, op7)).token(), 14);
    Record {
        actions: h
            .actions
            .iter()
            .filter(|a| !matches!(a, Action::Send { .. }))
            .cloned()
            .collect(),
        sent: h.all_sent(),
        events: f.log,
    }
}

#[test]
fn the_whole_session_fed_whole_does_what_the_script_says() {
    let r = session(Cut::Whole);
    assert_eq!(
        r.sent,
        "H 2 c1 -\n\
         R 1 k9 41\nA 2 k1 o 5000 10000\nA 3 k2 o 5000 10000\n\
         A 4 k1 o 4900 10000\nA 5 k3 o 0 10000\n\
         R 6 k2 7\n\
         A 7 k1 o 4700 10000\n\
         R 8 k1 12\n\
         H 2 c1 -\n\
         A 9 k4 o 1000 2000\nR 10 k1 13\n"
    );
    let outcomes: Vec<String> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Outcome { outcome, .. } => Some(match outcome {
                Outcome::Granted(g) => format!("granted {} {}", g.key(), g.token()),
                other => format!("{other:?}"),
            }),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            "granted k2 7",
            "Released",
            "TimedOut { sent: true, cause: None }",
            "Released",
            "granted k1 12",
            "Released",
            "granted k1 13",
            "NotHeld",
            "granted k4 14",
        ]
    );
    let closes: Vec<&CloseReason> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Closed { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(closes, vec![&CloseReason::Moved, &CloseReason::Shutdown]);
    let connects: Vec<String> = r
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Connect { addr, .. } => Some(addr.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(connects, vec!["a:1", "b:2"], "the M's hint was followed");
    assert!(r.events.iter().any(|e| matches!(
        e,
        Event::Backoff {
            cause: BackoffCause::Busy,
            ..
        }
    )));
    // The G and E after M were ignored: no release of a stray grant, no
    // other close.
    assert!(!r
        .events
        .iter()
        .any(|e| matches!(e, Event::OrphanRelease { .. } | Event::HintIgnored { .. })));
    assert_eq!(r.events.last(), Some(&Event::ShutdownComplete));
}

#[test]
fn every_cut_point_gives_the_same_outcomes_and_bytes_as_feeding_whole() {
    let whole = session(Cut::Whole);
    let mut runs = 0;
    for (chunk, text) in CHUNKS.iter().enumerate() {
        for at in 0..=text.len() {
            let split = session(Cut::At { chunk, at });
            assert_eq!(
                split,
                whole,
                "chunk {chunk} split at byte {at}: {:?} | {:?}",
                &text[..at],
                &text[at..]
            );
            runs += 1;
        }
    }
    assert_eq!(
        runs,
        CHUNKS.iter().map(|c| c.len() + 1).sum::<usize>(),
        "every boundary of every chunk"
    );
}

#[test]
fn one_byte_at_a_time_gives_the_same_outcomes_and_bytes_as_feeding_whole() {
    assert_eq!(session(Cut::Bytewise), session(Cut::Whole));
}

#[test]
fn random_cuts_in_every_chunk_give_the_same_outcomes_and_bytes_as_feeding_whole() {
    let whole = session(Cut::Whole);
    for seed in 0..50 {
        assert_eq!(session(Cut::Random(seed)), whole, "seed {seed}");
    }
}
