//! Scenario tests for the release lane and the window (PROTOCOL.md section 5,
//! "The reserved release lane", the "any close" row and invariant 4), for
//! the release outcomes (Released, NotHeld, Lapsed, and the accepted
//! boundary), and for the client's own capacity.
//!
//! Every test drives one client core with server bytes and times and checks
//! both the outcomes and the exact bytes the client sent.

mod support;

use std::collections::BTreeMap;

use support::*;
use ticketing::client::{
    Backoff, CloseReason, Error, Event, Grant, OpId, Outcome, ReleaseResult, TransportEnd,
};
use ticketing::rng::Rng;
use ticketing::Time;

/// Acquires `key_` on a ready connection, checks that `A <id> ...` went out,
/// answers `G <id> A <key> <token> <lease>` and returns the grant.
fn grant(h: &mut Harness, id: u64, key_: &str, token: u64, lease_ms: u64) -> Grant {
    let op = h.acquire(key_, 0, lease_ms);
    assert_eq!(h.take_sent(), format!("A {id} {key_} o 0 {lease_ms}\n"));
    h.feed(&format!("G {id} A {key_} {token} {lease_ms} 0\n"));
    let out = h.take_outcomes();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0, op);
    grant_of(&out[0].1)
}

#[test]
fn releases_are_sent_before_queued_acquires() {
    // Before the connection is up: an acquire, then a release, then another
    // acquire. The release goes first although it was submitted second.
    let mut h = Harness::new(config());
    let x = h.acquire("x", 1000, 5000);
    let r = h.release_token("k", 5);
    let y = h.acquire("y", 1000, 5000);
    assert_eq!(h.take_sent(), "");
    h.ready(3);
    // Window 3, one slot reserved: the release and two acquires.
    assert_eq!(
        h.take_sent(),
        "R 1 k 5\nA 2 x o 1000 5000\nA 3 y o 1000 5000\n"
    );

    // On a live connection: the window is full; an acquire is queued first,
    // then a release. When one acquire slot frees, the release takes it.
    let z = h.acquire("z", 1000, 5000);
    let r2 = h.release_token("k2", 6);
    assert_eq!(h.take_sent(), "");
    h.feed("T 2 A x\n");
    assert_eq!(
        h.take_outcomes(),
        vec![(
            x,
            Outcome::TimedOut {
                sent: true,
                cause: None
            }
        )]
    );
    assert_eq!(h.take_sent(), "R 4 k2 6\n");
    h.feed("D 1 R k\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
    // Only y is in flight among the acquires: z takes the free slot.
    assert_eq!(h.take_sent(), "A 5 z o 1000 5000\n");
    h.feed("D 4 R k2\nG 3 A y 1 5000 0\nG 5 A z 2 5000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out.len(), 3);
    assert_eq!(out[0], (r2, Outcome::Released));
    assert_eq!((out[1].0, grant_of(&out[1].1).token()), (y, 1));
    assert_eq!((out[2].0, grant_of(&out[2].1).token()), (z, 2));
}

#[test]
fn at_most_window_minus_reserved_acquires_in_flight() {
    for (reserved, limit) in [(1u32, 3u64), (2, 2), (3, 1)] {
        let mut c = config();
        c.reserved = reserved;
        let (mut h, _) = ready_with(c, 4);
        let ops: Vec<OpId> = (0..5)
            .map(|i| h.acquire(&format!("k{i}"), 1000, 5000))
            .collect();
        let expected: String = (0..limit)
            .map(|i| format!("A {} k{i} o 1000 5000\n", i + 1))
            .collect();
        assert_eq!(h.take_sent(), expected, "reserved {reserved}");
        assert_eq!(in_flight(&h.client), (limit as usize, limit as usize));
        // One answer frees one acquire slot: exactly one more goes out.
        h.feed("T 1 A k0\n");
        assert_eq!(
            h.take_outcomes(),
            vec![(
                ops[0],
                Outcome::TimedOut {
                    sent: true,
                    cause: None
                }
            )]
        );
        assert_eq!(
            h.take_sent(),
            format!("A {} k{limit} o 1000 5000\n", limit + 1)
        );
        assert_eq!(in_flight(&h.client), (limit as usize, limit as usize));
    }
}

#[test]
fn releases_may_use_any_free_slot() {
    // No acquire in flight: releases fill the whole window, acquire slots
    // included.
    let (mut h, _) = ready(4);
    let rs: Vec<OpId> = (0..5).map(|i| h.release_token("k", 10 + i)).collect();
    assert_eq!(h.take_sent(), "R 1 k 10\nR 2 k 11\nR 3 k 12\nR 4 k 13\n");
    assert_eq!(in_flight(&h.client), (4, 0));
    // An acquire waits behind the fifth release: the window is full.
    let a = h.acquire("a", 1000, 5000);
    assert_eq!(h.take_sent(), "");
    h.feed("D 2 R k\n");
    assert_eq!(h.take_outcomes(), vec![(rs[1], Outcome::Released)]);
    assert_eq!(
        h.take_sent(),
        "R 5 k 14\n",
        "the release goes before the acquire"
    );
    h.feed("N 1 R k\n");
    assert_eq!(h.take_outcomes(), vec![(rs[0], Outcome::NotHeld)]);
    assert_eq!(h.take_sent(), "A 6 a o 1000 5000\n");
    h.feed("T 6 A a\n");
    assert_eq!(
        h.take_outcomes(),
        vec![(
            a,
            Outcome::TimedOut {
                sent: true,
                cause: None
            }
        )]
    );

    // The acquire slots full: a release still takes the reserved one.
    let (mut h, _) = ready(4);
    for i in 0..3 {
        h.acquire(&format!("q{i}"), 1000, 5000);
    }
    assert_eq!(
        h.take_sent(),
        "A 1 q0 o 1000 5000\nA 2 q1 o 1000 5000\nA 3 q2 o 1000 5000\n"
    );
    let r = h.release_token("k", 1);
    assert_eq!(h.take_sent(), "R 4 k 1\n");
    assert_eq!(in_flight(&h.client), (4, 3));
    h.feed("D 4 R k\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
}

/// A tiny model server for the window test: it reads what the client sent,
/// keeps the requests it has not answered, and answers them at random.
struct ModelServer {
    /// Unanswered requests by id: (is an acquire, key).
    open: BTreeMap<u64, (bool, String)>,
    next_token: u64,
}

impl ModelServer {
    fn read(&mut self, sent: &str) {
        for line in sent.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let id: u64 = f[1].parse().unwrap();
            let entry = match f[0] {
                "A" => (true, f[2].to_owned()),
                "R" => (false, f[2].to_owned()),
                other => panic!("unexpected frame {other} in {line:?}"),
            };
            assert!(
                self.open.insert(id, entry).is_none(),
                "request id {id} sent twice"
            );
        }
    }
}

#[test]
fn unanswered_requests_never_exceed_the_window() {
    const WINDOW: u64 = 3;
    const RESERVED: u64 = 1; // the default
    let mut c = config();
    c.answer_grace = ms(3_600_000);
    c.queue_grace = ms(3_600_000);
    let (mut h, _) = ready_with(c, WINDOW);
    let mut server = ModelServer {
        open: BTreeMap::new(),
        next_token: 1,
    };
    let mut rng = Rng::new(2024);
    let mut held: Vec<Grant> = Vec::new();
    let mut ended: BTreeMap<OpId, Outcome> = BTreeMap::new();
    let mut submitted = 0usize;
    let mut max_seen = (0usize, 0usize);
    for step in 0..3000 {
        match rng.up_to(9) {
            0..=2 => {
                let k = format!("k{}", rng.up_to(3));
                h.acquire(&k, 60_000, 60_000);
                submitted += 1;
            }
            3 if !held.is_empty() => {
                let g = held.swap_remove(rng.up_to(held.len() as u64 - 1) as usize);
                h.release(&g);
                submitted += 1;
            }
            4 => {
                h.release_token("raw", rng.up_to(1000));
                submitted += 1;
            }
            5..=8 if !server.open.is_empty() => {
                let ids: Vec<u64> = server.open.keys().copied().collect();
                let id = ids[rng.up_to(ids.len() as u64 - 1) as usize];
                let (acquire, k) = server.open.remove(&id).unwrap();
                let frame = if acquire {
                    match rng.up_to(3) {
                        0 | 1 => {
                            server.next_token += 1;
                            format!("G {id} A {k} {} 60000 0\n", server.next_token)
                        }
                        2 => format!("T {id} A {k}\n"),
                        _ => format!("B {id} A {k}\n"),
                    }
                } else if rng.chance(1, 2) {
                    format!("D {id} R {k}\n")
                } else {
                    format!("N {id} R {k}\n")
                };
                h.feed(&frame);
            }
            _ => {
                let now = h.now;
                h.at(now.saturating_add(ms(rng.up_to(20))));
            }
        }
        server.read(&h.take_sent());
        for (op, outcome) in h.take_outcomes() {
            if let Outcome::Granted(g) = &outcome {
                held.push(g.clone());
            }
            assert!(
                ended.insert(op, outcome).is_none(),
                "{op} ended twice (step {step})"
            );
        }
        let acquires = server.open.values().filter(|(a, _)| *a).count();
        // What the server sees on the wire...
        assert!(
            server.open.len() as u64 <= WINDOW,
            "step {step}: {} unanswered",
            server.open.len()
        );
        assert!(
            acquires as u64 <= WINDOW - RESERVED,
            "step {step}: {acquires} acquires"
        );
        // ...is what the client counts.
        assert_eq!(in_flight(&h.client), (server.open.len(), acquires));
        max_seen.0 = max_seen.0.max(server.open.len());
        max_seen.1 = max_seen.1.max(acquires);
    }
    assert_eq!(h.closes(), vec![], "the connection stayed up");
    assert_eq!(
        max_seen,
        (WINDOW as usize, (WINDOW - RESERVED) as usize),
        "the window was filled"
    );
    assert!(ended.len() > submitted / 2, "most operations ended");
}

#[test]
fn window_two_with_one_reserved_slot_the_release_of_k_unblocks_the_acquire_waiting_for_k() {
    // THE case: window 2, one slot reserved, so one acquire at a time.
    let (mut h, _) = ready(2);
    let g1 = grant(&mut h, 1, "K", 1, 30_000);
    // The acquire slot fills with an acquire of K, which the server queues
    // behind the grant (no answer yet).
    let waiting = h.acquire("K", 10_000, 30_000);
    assert_eq!(h.take_sent(), "A 2 K o 10000 30000\n");
    // Another acquire cannot go: the only acquire slot is taken.
    let other = h.acquire("J", 10_000, 30_000);
    assert_eq!(h.take_sent(), "");
    assert_eq!(in_flight(&h.client), (1, 1));
    // The embedder releases its grant of K: the release takes the reserved
    // slot at once.
    let r = h.release(&g1);
    assert_eq!(h.take_sent(), "R 3 K 1\n");
    assert_eq!(in_flight(&h.client), (2, 1));
    // The server frees K and grants it to the waiting acquire.
    h.at_ms(50);
    h.feed("D 3 R K\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
    assert_eq!(h.take_sent(), "", "the acquire slot is still taken");
    h.feed("G 2 A K 2 30000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, waiting);
    let g2 = grant_of(&out[0].1);
    assert_eq!((g2.key().as_str(), g2.token()), ("K", 2));
    // And the next acquire takes the freed acquire slot.
    assert_eq!(h.take_sent(), "A 4 J o 9950 30000\n");
    h.feed("G 4 A J 3 30000 0\n");
    assert_eq!(h.take_outcomes()[0].0, other);
}

#[test]
fn reserved_as_large_as_the_window_sends_no_acquire_and_gives_every_slot_to_releases() {
    // PROTOCOL.md: at most `window - reserved` acquires in flight. With
    // five reserved slots and a window of 3 that is none (never "at least
    // one", which would break the rule); releases still use every slot.
    let mut c = config();
    c.reserved = 5;
    let (mut h, _) = ready_with(c, 3);
    let a = h.acquire("a", 1000, 5000);
    let b = h.acquire("b", 1000, 5000);
    assert_eq!(h.take_sent(), "", "no acquire slot");
    h.release_token("k", 1);
    h.release_token("k", 2);
    h.release_token("k", 3);
    h.release_token("k", 4);
    assert_eq!(h.take_sent(), "R 1 k 1\nR 2 k 2\nR 3 k 3\n");
    assert_eq!(in_flight(&h.client), (3, 0));
    h.feed("D 2 R k\n");
    // The freed slot goes to the queued release, never to an acquire.
    assert_eq!(h.take_sent(), "R 4 k 4\n");
    h.feed("D 1 R k\nD 3 R k\nD 4 R k\n");
    assert_eq!(h.take_sent(), "");
    assert_eq!(in_flight(&h.client), (0, 0));
    let released = h.take_outcomes();
    assert_eq!(released.len(), 4);
    assert!(released.iter().all(|(_, o)| *o == Outcome::Released));
    // The acquires wait for a connection that can take them, at most
    // max(wait, queue_grace) = 2 s, and end as never sent.
    h.ends_at(
        2_000,
        &[
            (
                a,
                Outcome::TimedOut {
                    sent: false,
                    cause: None,
                },
            ),
            (
                b,
                Outcome::TimedOut {
                    sent: false,
                    cause: None,
                },
            ),
        ],
    );
    assert_eq!(h.take_sent(), "");
}

#[test]
fn any_close_sent_acquires_indeterminate_sent_releases_resent_unsent_requests_go_next() {
    let (mut h, _) = ready(3); // two acquire slots
    let g = grant(&mut h, 1, "g", 7, 60_000);
    h.at_ms(100);
    let r = h.release(&g);
    let x = h.acquire("x", 3000, 10_000);
    let y = h.acquire("y", 4000, 10_000);
    assert_eq!(
        h.take_sent(),
        "R 2 g 7\nA 3 x o 3000 10000\nA 4 y o 4000 10000\n"
    );
    // Not sent: the window is full.
    let z = h.acquire("z", 5000, 10_000);
    assert_eq!(h.take_sent(), "");

    // The transport ends at t=1200.
    h.at_ms(1200);
    h.transport_closed(TransportEnd::Eof);
    let events = h.take_events();
    assert_eq!(close_reasons(&events), vec![CloseReason::Eof]);
    // Sent acquires: Indeterminate, settled by give-up time + wait_ms sent
    // + lease + settle margin (1 s).
    assert_eq!(
        outcomes(&events),
        vec![
            (
                x,
                Outcome::Indeterminate {
                    settles_by: t(1200 + 3000 + 10_000 + 1000)
                }
            ),
            (
                y,
                Outcome::Indeterminate {
                    settles_by: t(1200 + 4000 + 10_000 + 1000)
                }
            ),
        ]
    );

    // The next connection: the release again with a new id, then the unsent
    // acquire with what is left of its budget. x and y never again.
    h.reconnect(3);
    let left = t(100 + 5000).saturating_duration_since(h.now).as_millis();
    assert_eq!(h.take_sent(), format!("R 5 g 7\nA 6 z o {left} 10000\n"));
    h.feed("D 5 R g\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
    // This connection is lost too, 300 ms later: z's settles_by counts the
    // wait_ms it was sent with (what was left), not the wait asked for.
    let gave_up = h.now.saturating_add(ms(300));
    h.at(gave_up);
    h.transport_closed(TransportEnd::Error);
    let events = h.take_events();
    assert_eq!(close_reasons(&events), vec![CloseReason::Io]);
    assert_eq!(
        outcomes(&events),
        vec![(
            z,
            Outcome::Indeterminate {
                settles_by: gave_up.saturating_add(ms(left as u64 + 10_000 + 1000))
            }
        )]
    );
    h.reconnect(3);
    assert_eq!(h.take_sent(), "", "nothing left to send");
    let all = h.all_sent();
    for k in [" x o ", " y o ", " z o "] {
        assert_eq!(all.matches(k).count(), 1, "{k:?} is never resent: {all}");
    }
}

#[test]
fn a_release_whose_deadline_passes_ends_lapsed() {
    let (mut h, _) = ready(4);
    // Lease 3 s granted at t=0: expires_by = 0 + 3 s + 1 s margin.
    let g = grant(&mut h, 1, "k", 1, 3000);
    assert_eq!(g.expires_by(), t(4000));
    h.at_ms(10);
    h.transport_closed(TransportEnd::Eof);
    h.at_ms(20);
    let r = h.release(&g);
    h.take_events();
    // The server cannot be reached until after the deadline.
    h.refuse_connects_until(t(3999));
    assert_eq!(h.take_outcomes(), vec![]);
    h.refuse_connects_until(t(4000));
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Lapsed)]);
    // Nothing was ever sent for it, and nothing is sent later.
    if h.client.connection().is_none() {
        h.next_deadline();
    }
    h.ready(4);
    assert_eq!(h.take_sent(), "");
    assert_eq!(h.all_sent().matches("R ").count(), 0);
}

#[test]
fn accepted_boundary_lost_release_answers_end_lapsed_not_released() {
    // THE ACCEPTED BOUNDARY (PROTOCOL.md section 5): a server that keeps
    // losing the answers to releases leaves those grants reported Lapsed
    // rather than Released although they were released. Reporting Released
    // without an answer would be wrong in the far more dangerous case, a
    // release that never arrived. Here the server does release the grant at
    // the first R (it frees key k), but every answer is lost: the client
    // must end the release Lapsed, never Released.
    let mut c = config();
    c.release_attempts = 100; // the deadline, not the attempt count, ends it
    let (mut h, _) = ready_with(c, 4);
    let g = grant(&mut h, 1, "k", 5, 10_000);
    let deadline = g.expires_by();
    assert_eq!(deadline, t(11_000));
    let r = h.release(&g);
    let mut attempts: Vec<(u64, Time)> = Vec::new();
    let mut ended = None;
    while ended.is_none() {
        for line in h.take_sent().lines() {
            if line.starts_with('H') {
                continue;
            }
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!((f[0], f[2], f[3]), ("R", "k", "5"), "exact token: {line}");
            attempts.push((f[1].parse().unwrap(), h.now));
        }
        for event in h.take_events() {
            match event {
                Event::Outcome { op, outcome } => {
                    assert_eq!(op, r);
                    ended = Some((outcome, h.now));
                }
                Event::Closed { reason, .. } => assert_eq!(reason, CloseReason::AnswerTimeout),
                _ => {}
            }
        }
        if ended.is_some() {
            break;
        }
        // The answer to every R is lost; the client reconnects when it
        // wants to.
        h.next_deadline();
        if let Some((conn, _)) = h.last_connect() {
            if h.client.connection() == Some(conn) && h.client.window().is_none() {
                h.ready(4);
            }
        }
    }
    let (outcome, at) = ended.unwrap();
    assert_eq!(outcome, Outcome::Lapsed, "never Released without an answer");
    assert!(attempts.len() >= 2, "it was retried: {attempts:?}");
    let ids: Vec<u64> = attempts.iter().map(|a| a.0).collect();
    let mut distinct = ids.clone();
    distinct.dedup();
    assert_eq!(distinct, ids, "every attempt has a new id");
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert!(
        attempts.iter().all(|&(_, sent)| sent < deadline),
        "no attempt starts at or after the deadline: {attempts:?}"
    );
    // It ends when the last attempt is given up, past the deadline.
    let last = attempts.last().unwrap().1;
    assert!(at >= deadline, "{at}");
    assert_eq!(at, last.saturating_add(h.client.config().answer_grace));
}

#[test]
fn release_attempts_are_bounded_by_config_release_attempts() {
    let mut c = config();
    c.release_attempts = 3;
    let (mut h, _) = ready_with(c, 4);
    let g = grant(&mut h, 1, "k", 9, 600_000);
    let r = h.release(&g);
    let mut sent = vec![h.take_sent()];
    for _ in 0..2 {
        h.transport_closed(TransportEnd::Eof);
        assert_eq!(h.take_outcomes(), vec![]);
        h.reconnect(4);
        sent.push(h.take_sent());
    }
    assert_eq!(sent, vec!["R 2 k 9\n", "R 3 k 9\n", "R 4 k 9\n"]);
    // The third attempt is lost too: no fourth starts.
    h.transport_closed(TransportEnd::Eof);
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Lapsed)]);
    h.reconnect(4);
    assert_eq!(h.take_sent(), "");
}

#[test]
fn not_held_after_an_earlier_attempt_was_lost_is_reported_not_held() {
    let (mut h, _) = ready(4);
    let g = grant(&mut h, 1, "k", 3, 10_000);
    let r = h.release(&g);
    assert_eq!(h.take_sent(), "R 2 k 3\n");
    // The first attempt's answer is lost with its connection (the server
    // did free the grant).
    h.transport_closed(TransportEnd::Error);
    assert_eq!(h.take_outcomes(), vec![]);
    h.reconnect(4);
    assert_eq!(h.take_sent(), "R 3 k 3\n");
    h.feed("N 3 R k\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::NotHeld)]);
}

#[test]
fn release_token_keeps_trying_until_the_release_horizon() {
    // Default horizon: 60 s from submission. Backoff capped at 200 ms so
    // the connection can come back just before it.
    let mut c = config();
    c.backoff.transport = Backoff::new(ms(50), ms(200));
    assert_eq!(c.release_horizon, ms(60_000));

    // A raw release whose server is unreachable for 59.5 s still goes out.
    let mut h = Harness::new(c.clone());
    let r = h.release_token("old", 77);
    h.refuse_connects_until(t(59_500));
    assert_eq!(h.take_outcomes(), vec![]);
    h.next_deadline();
    while h.client.connection().is_none() {
        h.next_deadline();
    }
    assert!(h.now < t(60_000));
    h.ready(4);
    assert_eq!(h.take_sent(), "R 1 old 77\n");
    h.feed("D 1 R old\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);

    // One whose server stays unreachable ends Lapsed at the horizon, not
    // a moment before.
    let mut h = Harness::new(c);
    h.at_ms(1000);
    let r = h.release_token("old", 78);
    h.refuse_connects_until(t(60_999));
    assert_eq!(h.take_outcomes(), vec![]);
    h.refuse_connects_until(t(61_000));
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Lapsed)]);
    assert_eq!(h.all_sent(), "");
}

#[test]
fn an_undeliverable_grant_is_released_by_its_exact_token() {
    let (mut h, _) = ready(4);
    let op = h.acquire("k", 0, 5000);
    assert_eq!(h.take_sent(), "A 1 k o 0 5000\n");
    h.feed("G 1 A k 4 5000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out[0].0, op);
    let g = grant_of(&out[0].1);
    // The waiter is gone: the driver hands the grant back.
    h.client.undeliverable(h.now, &g).unwrap();
    h.pump();
    assert_eq!(
        h.take_events(),
        vec![Event::OrphanRelease {
            key: key("k"),
            token: 4
        }]
    );
    assert_eq!(h.take_sent(), "R 2 k 4\n");
    h.feed("D 2 R k\n");
    assert_eq!(
        h.take_events(),
        vec![Event::OrphanSettled {
            key: key("k"),
            token: 4,
            result: ReleaseResult::Released
        }]
    );
    // It is no longer the embedder's to release.
    assert_eq!(
        h.client.release(h.now, &g),
        Err(Error::GrantNotHeld {
            key: key("k"),
            token: 4
        })
    );
    h.pump();
    assert_eq!(h.take_sent(), "");
}

#[test]
fn releasing_the_same_grant_twice_is_grant_not_held() {
    let (mut h, _) = ready(4);
    let g = grant(&mut h, 1, "k", 2, 5000);
    let r = h.release(&g);
    assert_eq!(h.take_sent(), "R 2 k 2\n");
    let twice = Err(Error::GrantNotHeld {
        key: key("k"),
        token: 2,
    });
    assert_eq!(h.client.release(h.now, &g), twice);
    h.pump();
    assert_eq!(h.take_sent(), "");
    h.feed("D 2 R k\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
    assert_eq!(h.client.release(h.now, &g), twice);
    h.pump();
    assert_eq!(h.take_sent(), "");
    assert_eq!(h.take_events(), vec![]);
}

#[test]
fn releasing_a_grant_past_its_expires_by_ends_lapsed_at_once() {
    let (mut h, _) = ready(4);
    let g1 = grant(&mut h, 1, "a", 1, 1000);
    let g2 = grant(&mut h, 2, "b", 2, 1000);
    assert_eq!(g2.expires_by(), t(2000));
    // Just before: a release goes out.
    h.at_ms(1999);
    h.release(&g1);
    assert_eq!(h.take_sent(), "R 3 a 1\n");
    // At expires_by: the server has freed it; nothing is asked.
    h.at_ms(2000);
    let r = h.release(&g2);
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Lapsed)]);
    assert_eq!(h.take_sent(), "");
    assert_eq!(open_operations(&h.client), (0, 1));
}

#[test]
fn own_capacity_full_is_busy_at_once_with_nothing_sent() {
    let mut c = config();
    c.max_acquires = 2;
    c.max_releases = 1;
    let mut h = Harness::new(c);
    // Before the connection: the third acquire is refused at once.
    h.acquire("a", 1000, 60_000);
    h.acquire("b", 1000, 60_000);
    let refused = h
        .client
        .acquire(h.now, key("c"), name("o"), ms(1000), ms(60_000));
    assert_eq!(refused, Err(Error::Busy));
    h.pump();
    // Only the notice of the first connect: no outcome for the refusal.
    assert_eq!(h.take_events(), vec![Event::Connecting { addr: ep("a:1") }]);
    h.ready(4);
    assert_eq!(
        h.take_sent(),
        "A 1 a o 1000 60000\nA 2 b o 1000 60000\n",
        "the refused acquire is never sent"
    );
    h.feed("G 1 A a 1 60000 0\n");
    let g = grant_of(&h.take_outcomes()[0].1);
    // One open release at most.
    let r = h.release_token("raw", 5);
    assert_eq!(h.take_sent(), "R 3 raw 5\n");
    assert_eq!(
        h.client.release_token(h.now, key("raw"), 6),
        Err(Error::Busy)
    );
    assert_eq!(h.client.release(h.now, &g), Err(Error::Busy));
    h.pump();
    assert_eq!(h.take_sent(), "");
    assert_eq!(h.take_events(), vec![]);
    // Capacity comes back when an operation ends; the refused release left
    // the grant held.
    h.feed("D 3 R raw\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
    h.release(&g);
    assert_eq!(h.take_sent(), "R 4 a 1\n");
}

#[test]
fn releases_resent_after_a_close_keep_their_order_ahead_of_queued_ones() {
    let (mut h, _) = ready(2);
    let a = h.release_token("a", 1);
    let b = h.release_token("b", 2);
    let c = h.release_token("c", 3); // the window is full: queued
    assert_eq!(h.take_sent(), "R 1 a 1\nR 2 b 2\n");
    h.transport_closed(TransportEnd::Eof);
    assert_eq!(h.take_outcomes(), vec![]);
    h.reconnect(4);
    // The two that were in flight first, in their order, then the queued one.
    assert_eq!(h.take_sent(), "R 3 a 1\nR 4 b 2\nR 5 c 3\n");
    h.feed("D 5 R c\nN 4 R b\nD 3 R a\n");
    assert_eq!(
        h.take_outcomes(),
        vec![
            (c, Outcome::Released),
            (b, Outcome::NotHeld),
            (a, Outcome::Released)
        ]
    );
}

#[test]
fn poll_timeout_is_now_while_a_release_or_a_renewal_waits_for_a_free_slot() {
    // A driver may sleep until `poll_timeout`: a release or a renewal that
    // can go out now must make it "now", whether or not an acquire waits
    // too, or it would sit in the lane until some later deadline.
    let (mut h, _) = ready(4);
    let renewed = grant(&mut h, 1, "r", 7, 5000);
    let released = grant(&mut h, 2, "k", 8, 5000);
    h.at_ms(100);
    assert_ne!(h.client.poll_timeout(), Some(t(100)), "nothing is due");

    // A renewal alone in the lane (no release, no acquire queued).
    h.client.renew(t(100), &renewed, None).expect("accepted");
    assert_eq!(h.client.poll_timeout(), Some(t(100)), "a renewal is due");
    h.pump();
    assert_eq!(h.take_sent(), "X 3 r 7 5000\n");

    // A release alone in the lane (no renewal, no acquire queued).
    h.at_ms(200);
    let op = h.client.release(t(200), &released).expect("accepted");
    assert_eq!(h.client.poll_timeout(), Some(t(200)), "a release is due");
    h.pump();
    assert_eq!(h.take_sent(), "R 4 k 8\n");
    h.feed("D 4 R k\n");
    assert_eq!(h.take_outcomes(), vec![(op, Outcome::Released)]);
}

#[test]
fn handing_back_a_grant_twice_is_refused_and_one_past_its_expires_by_needs_nothing() {
    let (mut h, _) = ready(4);
    let g = grant(&mut h, 1, "k", 7, 1000);
    let other = grant(&mut h, 2, "j", 8, 1000);
    h.client.undeliverable(h.now, &g).expect("accepted");
    h.pump();
    assert_eq!(h.take_sent(), "R 3 k 7\n");
    // Handed back already (its release is under way): not the embedder's.
    assert_eq!(
        h.client.undeliverable(h.now, &g),
        Err(Error::GrantNotHeld {
            key: key("k"),
            token: 7
        })
    );
    h.feed("D 3 R k\n");
    assert_eq!(
        h.client.undeliverable(h.now, &g),
        Err(Error::GrantNotHeld {
            key: key("k"),
            token: 7
        })
    );
    // Past its expires_by (granted at 0, lease 1000, margin 1000) the
    // server has freed the other grant itself: accepted, nothing to send.
    assert_eq!(other.expires_by(), t(2_000));
    h.at_ms(2_000);
    h.take_events();
    assert_eq!(h.client.undeliverable(h.now, &other), Ok(()));
    h.pump();
    assert_eq!(h.take_sent(), "");
    assert_eq!(h.take_events(), vec![], "no orphan release");
}
