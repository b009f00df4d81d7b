//! Scenario tests for the MATCHING rules of PROTOCOL.md section 5: how an
//! answer is attributed to a request (id, op and key), what each matched
//! answer does to its operation, what a stray, second or mismatched answer
//! does to the connection, the `B` retries, and the answers that break the
//! handshake order (before `W`, a second `W`).
//!
//! Every test drives one client core with bytes and times and asserts both
//! the outcomes and the exact bytes the client sent. Closed reasons are
//! checked through their `Display` strings, as CLI.md lists them.

mod support;

use std::time::Duration;

use support::*;
use ticketing::client::{Action, BackoffCause, BusyPolicy, Event, OpId, Outcome, ReleaseResult};
use ticketing::Time;

// ----- helpers ------------------------------------------------------------

/// `(key, token)` of every `OrphanRelease` event.
fn orphan_releases(events: &[Event]) -> Vec<(String, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::OrphanRelease { key, token } => Some((key.to_string(), *token)),
            _ => None,
        })
        .collect()
}

/// `(key, token, result)` of every `OrphanSettled` event.
fn orphans_settled(events: &[Event]) -> Vec<(String, u64, ReleaseResult)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::OrphanSettled { key, token, result } => Some((key.to_string(), *token, *result)),
            _ => None,
        })
        .collect()
}

/// Goes through the backoff after a close to the next connection, which
/// must be a new `Connect` to `b:2`, readies it with window 4, and returns
/// what the client sends on it first.
#[track_caller]
fn sent_on_the_next_connection(h: &mut Harness) -> String {
    // A connection that had its `W` is followed by a wait; one that did
    // not, by the round's next attempt at once.
    if h.client.connection().is_none() {
        h.next_deadline();
    }
    let (conn, to) = h.last_connect().expect("a connect");
    assert_eq!(
        h.client.connection(),
        Some(conn),
        "a new connection attempt"
    );
    assert_eq!(to, ep("b:2"));
    h.ready(4);
    h.take_sent()
}

/// Feeds `frame`, a `B` to the acquire `op`, and checks that `op` ends
/// Busy at once: no retry is scheduled (no backoff), and the connection
/// stays (no close).
#[track_caller]
fn busy_at_once(h: &mut Harness, frame: &str, op: OpId) {
    h.feed(frame);
    let events = h.take_events();
    assert_eq!(
        outcomes(&events),
        vec![(op, Outcome::Busy)],
        "{frame:?}: {events:?}"
    );
    assert!(backoffs(&events).is_empty(), "{frame:?}: {events:?}");
    assert!(closed(&events).is_empty(), "{frame:?}: {events:?}");
}

// ----- matching by id, op and key -----------------------------------------

#[test]
fn answers_reordered_for_one_key_are_matched_by_id() {
    let (mut h, _) = ready(8);
    let waits = h.acquire("k", 1_000, 5_000);
    let tries = h.acquire("k", 0, 5_000);
    assert_eq!(h.take_sent(), "A 1 k o 1000 5000\nA 2 k o 0 5000\n");

    // The later request is answered first, in the same chunk as the earlier
    // one's answer. Arrival order would give the T to the first acquire.
    h.at_ms(30);
    h.feed("T 2 A k\nG 1 A k 11 5000 0\n");
    let events = h.take_events();
    assert_eq!(closed(&events), vec![]);
    let out = outcomes(&events);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(
        out[0],
        (
            tries,
            Outcome::TimedOut {
                sent: true,
                cause: None
            }
        )
    );
    assert_eq!(out[1].0, waits);
    let g = granted(&out[1].1);
    assert_eq!((g.key().as_str(), g.token()), ("k", 11));
    assert_eq!(in_flight(&h.client), (0, 0));
    assert_eq!(h.take_sent(), "");
}

#[test]
fn the_same_op_and_key_three_times_in_flight_are_told_apart_by_id_alone() {
    let (mut h, _) = ready(16);
    // Three identical acquires: same op, key, owner, wait and lease.
    let ops: Vec<OpId> = (0..3).map(|_| h.acquire("k", 10_000, 5_000)).collect();
    assert_eq!(
        h.take_sent(),
        "A 1 k o 10000 5000\nA 2 k o 10000 5000\nA 3 k o 10000 5000\n"
    );
    assert_eq!(in_flight(&h.client), (3, 3));

    // Scrambled: 3 is granted, 1 times out, then (after 3's release) 2 is
    // granted with a shorter lease.
    h.at_ms(10);
    h.feed("G 3 A k 21 5000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, ops[2]);
    let third = granted(&out[0].1).clone();
    assert_eq!(third.token(), 21);

    h.at_ms(20);
    h.feed("T 1 A k\n");
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

    let release = h.client.release(h.now, &third).unwrap();
    h.pump();
    assert_eq!(h.take_sent(), "R 4 k 21\n");
    h.at_ms(25);
    h.feed("D 4 R k\n");
    assert_eq!(h.take_outcomes(), vec![(release, Outcome::Released)]);

    h.at_ms(30);
    h.feed("G 2 A k 22 4000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, ops[1]);
    let second = granted(&out[0].1);
    assert_eq!((second.token(), second.lease()), (22, ms(4_000)));
    // valid_until counts from when that request was sent (t=0).
    assert_eq!(second.valid_until(), t(4_000));

    // The same (R, key) twice in flight, answered in reverse.
    let r1 = h.client.release_token(h.now, key("k"), 30).unwrap();
    let r2 = h.client.release_token(h.now, key("k"), 31).unwrap();
    h.pump();
    assert_eq!(h.take_sent(), "R 5 k 30\nR 6 k 31\n");
    h.feed("N 6 R k\nD 5 R k\n");
    assert_eq!(
        h.take_outcomes(),
        vec![(r2, Outcome::NotHeld), (r1, Outcome::Released)]
    );
    assert!(closed(&h.take_events()).is_empty());
    assert_eq!(in_flight(&h.client), (0, 0));
}

#[test]
fn the_pending_entry_is_registered_before_the_bytes_are_handed_out() {
    let (mut h, conn) = ready(4);
    h.at_ms(7);
    let op = h
        .client
        .acquire(h.now, key("k"), name("o"), ms(1_000), ms(5_000))
        .unwrap();
    // Drive the core by hand: take the Send, and before anything else is
    // polled, feed its answer.
    let Some(Action::Send { conn: to, data }) = h.client.poll_action() else {
        panic!("expected the acquire to be sent");
    };
    assert_eq!(to, conn);
    assert_eq!(&data[..], b"A 1 k o 1000 5000\n");
    // From the moment the Send is returned the request counts as sent.
    assert_eq!(in_flight(&h.client), (1, 1));
    h.client.handle_bytes(h.now, conn, b"G 1 A k 3 5000 0\n");
    h.pump();
    let events = h.take_events();
    assert_eq!(closed(&events), vec![]);
    let out = outcomes(&events);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, op);
    let g = granted(&out[0].1);
    assert_eq!((g.token(), g.valid_until()), (3, t(5_007)));
    assert_eq!(h.client.connection(), Some(conn));
    assert_eq!(h.take_sent(), "");
}

#[test]
fn g_t_d_n_matched_end_the_operation_as_values() {
    let (mut h, conn) = ready(8);
    h.at_ms(10);
    let acquired = h.acquire("k1", 1_000, 5_000);
    let timed_out = h.acquire("k2", 0, 100);
    assert_eq!(h.take_sent(), "A 1 k1 o 1000 5000\nA 2 k2 o 0 100\n");

    // G: Granted with the token and the lease the server gave (less than
    // asked is fine); valid_until counts from when the request was sent,
    // expires_by from when the answer came, plus the settle margin.
    h.at_ms(40);
    h.feed("G 1 A k1 42 3000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, acquired);
    let g = granted(&out[0].1).clone();
    assert_eq!(g.key().as_str(), "k1");
    assert_eq!(g.token(), 42);
    assert_eq!(g.lease(), ms(3_000));
    assert_eq!(g.valid_until(), t(10 + 3_000));
    assert_eq!(g.expires_by(), t(40 + 3_000 + 1_000));
    assert!(out[0].1.is_definitive());

    // T: TimedOut, and the client knows it was sent.
    h.at_ms(50);
    h.feed("T 2 A k2\n");
    let out = h.take_outcomes();
    assert_eq!(
        out,
        vec![(
            timed_out,
            Outcome::TimedOut {
                sent: true,
                cause: None
            }
        )]
    );
    assert!(out[0].1.is_definitive());

    // D: Released.
    h.at_ms(60);
    let released = h.client.release(h.now, &g).unwrap();
    h.pump();
    assert_eq!(h.take_sent(), "R 3 k1 42\n");
    h.feed("D 3 R k1\n");
    let out = h.take_outcomes();
    assert_eq!(out, vec![(released, Outcome::Released)]);
    assert!(out[0].1.is_definitive());

    // N: NotHeld.
    let not_held = h.client.release_token(h.now, key("k1"), 41).unwrap();
    h.pump();
    assert_eq!(h.take_sent(), "R 4 k1 41\n");
    h.feed("N 4 R k1\n");
    let out = h.take_outcomes();
    assert_eq!(out, vec![(not_held, Outcome::NotHeld)]);
    assert!(out[0].1.is_definitive());

    // Values, not errors: the connection is untouched and nothing is open.
    assert!(closed(&h.take_events()).is_empty());
    assert_eq!(h.client.connection(), Some(conn));
    assert_eq!(in_flight(&h.client), (0, 0));
    assert_eq!(open_operations(&h.client), (0, 0));
    assert_eq!(close_actions(&h, 0), vec![]);
}

#[test]
fn an_answer_with_the_right_id_but_another_key_closes_and_its_grant_is_released() {
    let (mut h, _) = ready(4);
    let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);

    h.at_ms(100);
    let events = h.feed_closing("G 1 A other 9 5000 0\n", "a:1", "protocol:mismatch");
    // The acquire was sent and got no answer it can trust.
    assert_eq!(outcomes(&events), acquire.in_doubt_at(100));
    // The stray grant is nobody's: released by its exact (key, token).
    assert_eq!(orphan_releases(&events), vec![("other".to_string(), 9)]);
    assert_eq!(backoffs(&events)[0].0, BackoffCause::Transport);

    // The release goes out; the acquire is never sent again.
    assert_eq!(sent_on_the_next_connection(&mut h), "R 2 other 9\n");
    h.take_events();
    h.feed("D 2 R other\n");
    let events = h.take_events();
    assert_eq!(
        orphans_settled(&events),
        vec![("other".to_string(), 9, ReleaseResult::Released)]
    );
    assert!(outcomes(&events).is_empty());
    assert_eq!(open_operations(&h.client), (0, 0));
    assert_eq!(in_flight(&h.client), (0, 0));
}

#[test]
fn an_answer_with_the_right_id_but_another_op_closes_and_the_acquire_is_indeterminate() {
    let (mut h, _) = ready(4);
    let acquire = h.acquire_in_flight(1, "k", 2_000, 5_000);

    // `D` answers R: id 1 is an acquire.
    h.at_ms(300);
    let events = h.feed_closing("D 1 R k\n", "a:1", "protocol:mismatch");
    assert_eq!(outcomes(&events), acquire.in_doubt_at(300));
    // Not a G: nothing to release.
    assert!(orphan_releases(&events).is_empty());

    assert_eq!(sent_on_the_next_connection(&mut h), "");
    assert_eq!(open_operations(&h.client), (0, 0));
}

#[test]
fn an_acquire_answer_to_a_release_id_closes_and_the_release_goes_back_to_the_lane() {
    let (mut h, _) = ready(4);
    let release = h.release_token("k", 5);
    assert_eq!(h.take_sent(), "R 1 k 5\n");

    // A `G` for id 1 names op A: id 1 is a release. The connection closes,
    // the release is resent, and the stray grant is released as well.
    h.at_ms(20);
    let events = h.feed_closing("G 1 A k 9 5000 0\n", "a:1", "protocol:mismatch");
    assert!(outcomes(&events).is_empty(), "a release is always settled");
    assert_eq!(orphan_releases(&events), vec![("k".to_string(), 9)]);

    assert_eq!(sent_on_the_next_connection(&mut h), "R 2 k 5\nR 3 k 9\n");
    h.take_events();
    h.feed("N 3 R k\nD 2 R k\n");
    let events = h.take_events();
    assert_eq!(outcomes(&events), vec![(release, Outcome::Released)]);
    assert_eq!(
        orphans_settled(&events),
        vec![("k".to_string(), 9, ReleaseResult::NotHeld)]
    );
}

// ----- stray and second answers ------------------------------------------

#[test]
fn a_g_with_an_unknown_id_closes_and_is_released_by_exact_token() {
    let (mut h, _) = ready(4);
    let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);

    h.at_ms(50);
    let events = h.feed_closing("G 7 A k 3 5000 0\n", "a:1", "protocol:unknown_id");
    assert_eq!(orphan_releases(&events), vec![("k".to_string(), 3)]);
    // Any close: the acquire in flight is Indeterminate.
    assert_eq!(outcomes(&events), acquire.in_doubt_at(50));

    assert_eq!(sent_on_the_next_connection(&mut h), "R 2 k 3\n");
    h.take_events();
    h.feed("D 2 R k\n");
    assert_eq!(
        orphans_settled(&h.take_events()),
        vec![("k".to_string(), 3, ReleaseResult::Released)]
    );
    assert_eq!(in_flight(&h.client), (0, 0));
}

#[test]
fn answers_read_together_before_a_stray_one_count_and_those_after_it_are_not_read() {
    let (mut h, _) = ready(4);
    let a = h.acquire_in_flight(1, "a", 1_000, 5_000);
    let b = h.acquire_in_flight(2, "b", 1_000, 5_000);
    let c = h.acquire_in_flight(3, "c", 1_000, 5_000);

    // One read: a's grant, a stray grant, then c's grant.
    h.at_ms(50);
    let events = h.feed_closing(
        "G 1 A a 5 5000 0\nG 9 A x 6 5000 0\nG 3 A c 7 5000 0\n",
        "a:1",
        "protocol:unknown_id",
    );
    let told = outcomes(&events);
    assert_eq!(told.len(), 3, "{told:?}");
    assert!(
        matches!(&told[0], (op, Outcome::Granted(g)) if *op == a.op && g.token() == 5),
        "a's grant, read before the stray answer, is given: {told:?}"
    );
    // What follows the stray answer on the closed connection is never
    // read: c is as unanswered as b.
    let mut in_doubt = b.in_doubt_at(50);
    in_doubt.extend(c.in_doubt_at(50));
    in_doubt.sort_by_key(|(op, _)| format!("{op:?}"));
    let mut rest = told[1..].to_vec();
    rest.sort_by_key(|(op, _)| format!("{op:?}"));
    assert_eq!(rest, in_doubt);
    assert_eq!(orphan_releases(&events), vec![("x".to_string(), 6)]);
}

#[test]
fn a_t_with_an_unknown_id_closes_and_releases_nothing() {
    let (mut h, _) = ready(4);
    h.at_ms(5);
    let events = h.feed_closing("T 5 A k\n", "a:1", "protocol:unknown_id");
    assert!(orphan_releases(&events).is_empty());
    assert!(outcomes(&events).is_empty());

    assert_eq!(sent_on_the_next_connection(&mut h), "");
    assert_eq!(open_operations(&h.client), (0, 0));
}

#[test]
fn a_second_answer_to_one_id_closes_and_a_held_grant_is_not_released_behind_its_back() {
    let (mut h, _) = ready(4);
    let op = h.acquire_in_flight(1, "k", 1_000, 5_000).op;
    h.at_ms(10);
    let g = h.granted_by(op, "G 1 A k 9 5000 0\n");

    // The same G again: the id is no longer pending.
    h.at_ms(20);
    let events = h.feed_closing("G 1 A k 9 5000 0\n", "a:1", "protocol:unknown_id");
    assert!(
        orphan_releases(&events).is_empty(),
        "the embedder holds k/9: never released behind its back"
    );
    assert!(outcomes(&events).is_empty(), "one outcome per operation");

    assert_eq!(
        sent_on_the_next_connection(&mut h),
        "",
        "no release of the held grant"
    );

    // The grant is still the embedder's to release.
    let r = h.release(&g);
    assert_eq!(h.take_sent(), "R 2 k 9\n");
    h.feed("D 2 R k\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
}

#[test]
fn a_second_answer_granting_another_token_is_released_but_the_held_one_is_not() {
    let (mut h, _) = ready(4);
    let op = h.acquire_in_flight(1, "k", 1_000, 5_000).op;
    h.at_ms(10);
    assert_eq!(h.granted_by(op, "G 1 A k 9 5000 0\n").token(), 9);

    // A second G for id 1 with token 10: that grant was never given to the
    // embedder, so it is released by its exact token.
    h.at_ms(20);
    let events = h.feed_closing("G 1 A k 10 5000 0\n", "a:1", "protocol:unknown_id");
    assert_eq!(orphan_releases(&events), vec![("k".to_string(), 10)]);
    assert!(outcomes(&events).is_empty());

    assert_eq!(sent_on_the_next_connection(&mut h), "R 2 k 10\n");
}

#[test]
fn a_grant_with_a_longer_lease_than_asked_is_a_protocol_violation() {
    let (mut h, _) = ready(4);
    let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);

    h.at_ms(10);
    let events = h.feed_closing("G 1 A k 9 5001 0\n", "a:1", "protocol:lease_above_asked");
    // The answer cannot be trusted: the acquire is Indeterminate, and the
    // grant, which nobody was given, is released by its exact token.
    assert_eq!(outcomes(&events), acquire.in_doubt_at(10));
    assert_eq!(orphan_releases(&events), vec![("k".to_string(), 9)]);

    assert_eq!(sent_on_the_next_connection(&mut h), "R 2 k 9\n");
}

// ----- B: busy -------------------------------------------------------------

/// The `n`-th busy backoff step (from 0): 10 ms doubling up to 500 ms.
fn busy_step(n: u32) -> Duration {
    ms(10u64 << n.min(20)).min(ms(500))
}

#[test]
fn b_is_retried_with_a_new_id_and_what_is_left_of_the_budget_until_it_cannot_fit_then_busy() {
    let (mut h, conn) = ready(4);
    let budget_end = t(2_000);
    let op = h.acquire("k", 2_000, 5_000);
    assert_eq!(h.take_sent(), "A 1 k o 2000 5000\n");

    let mut id = 1u64;
    let mut retries = 0u32;
    let mut saw_cap = false;
    loop {
        // The server refuses the attempt at once.
        h.feed(&format!("B {id} A k\n"));
        let events = h.take_events();
        assert!(closed(&events).is_empty(), "B is no violation: {events:?}");
        let step = busy_step(retries);
        match backoffs(&events).as_slice() {
            [(cause, until)] => {
                assert_eq!(*cause, BackoffCause::Busy);
                assert!(outcomes(&events).is_empty(), "{events:?}");
                let delay = until.saturating_duration_since(h.now);
                assert!(
                    delay >= step / 2 && delay <= step,
                    "retry {retries}: delay {delay:?} outside [{:?}, {step:?}]",
                    step / 2
                );
                saw_cap |= step == ms(500);
                // Nothing goes out during the backoff.
                let just_before = Time::from_nanos(until.as_nanos() - 1);
                h.at(just_before);
                assert_eq!(h.take_sent(), "");
                h.at(*until);
                id += 1;
                retries += 1;
                let left = budget_end.saturating_duration_since(*until).as_millis();
                assert!(left >= 1);
                assert_eq!(h.take_sent(), format!("A {id} k o {left} 5000\n"));
            }
            [] => {
                assert_eq!(outcomes(&events), vec![(op, Outcome::Busy)]);
                // Busy only once no retry could start with a millisecond of
                // budget left: the longest delay would have fit otherwise.
                let left = budget_end.saturating_duration_since(h.now);
                assert!(
                    left < step + ms(1),
                    "gave up with {left:?} left and a step of {step:?}"
                );
                break;
            }
            more => panic!("one backoff per B, got {more:?}"),
        }
    }
    assert!(saw_cap, "the backoff reached its 500 ms cap");
    assert!(retries >= 7, "only {retries} retries");
    // Done: nothing more is sent, the connection stays.
    h.at_ms(10_000);
    assert_eq!(h.take_sent(), "");
    assert_eq!(h.client.connection(), Some(conn));
    assert_eq!(open_operations(&h.client), (0, 0));
}

#[test]
fn b_that_leaves_the_budget_no_room_for_another_attempt_is_busy_at_once() {
    let (mut h, _) = ready(4);
    let roomy = h.acquire("k1", 100, 5_000);
    let tight = h.acquire("k2", 100, 5_000);
    assert_eq!(h.take_sent(), "A 1 k1 o 100 5000\nA 2 k2 o 100 5000\n");
    // At t=50 a retry (10 ms at most) fits the budget.
    h.at_ms(50);
    h.feed("B 1 A k1\n");
    let events = h.take_events();
    assert!(outcomes(&events).is_empty());
    let [(BackoffCause::Busy, until)] = backoffs(&events)[..] else {
        panic!("{events:?}")
    };
    assert!(until <= t(60));
    h.at(until);
    let left = t(100).saturating_duration_since(until).as_millis();
    assert_eq!(h.take_sent(), format!("A 3 k1 o {left} 5000\n"));
    // At t=95 the shortest retry (5 ms) would start at the budget's end.
    h.at_ms(95);
    busy_at_once(&mut h, "B 2 A k2\n", tight);
    assert_eq!(h.take_sent(), "");
    h.feed("G 3 A k1 4 5000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out[0].0, roomy);
    // valid_until counts from the attempt that won.
    assert_eq!(
        granted(&out[0].1).valid_until(),
        until.saturating_add(ms(5_000))
    );
}

#[test]
fn b_with_a_zero_wait_budget_is_busy_at_once_without_retry() {
    let (mut h, conn) = ready(4);
    let op = h.acquire_in_flight(1, "k", 0, 5_000).op;
    h.at_ms(1);
    busy_at_once(&mut h, "B 1 A k\n", op);
    h.at_ms(5_000);
    assert_eq!(h.take_sent(), "");
    assert_eq!(h.client.connection(), Some(conn));
}

#[test]
fn b_under_the_fail_fast_policy_is_busy_at_the_first_b() {
    let mut c = config();
    c.busy = BusyPolicy::FailFast;
    let (mut h, conn) = ready_with(c, 4);
    let op = h.acquire_in_flight(1, "k", 10_000, 5_000).op;
    h.at_ms(3);
    busy_at_once(&mut h, "B 1 A k\n", op);
    h.at_ms(10_000);
    assert_eq!(h.take_sent(), "");
    assert_eq!(h.client.connection(), Some(conn));
}

// ----- the handshake order ----------------------------------------------

#[test]
fn an_answer_before_w_is_a_protocol_violation() {
    let mut h = Harness::new(config());
    // Submitted before the connection: it waits for W, so it is not sent.
    let op = h.acquire("k", 10_000, 5_000);
    h.hello();
    h.take_events();

    h.at_ms(10);
    let events = h.feed_closing(
        "G 1 A k 3 5000 0\n",
        "a:1",
        "protocol:answer_before_welcome",
    );
    // The acquire was never sent: it stays queued, no outcome yet.
    assert!(outcomes(&events).is_empty());
    // The G names nothing the client asked for on this connection: it is a
    // grant nobody claims, so it is released by its exact token.
    assert_eq!(orphan_releases(&events), vec![("k".to_string(), 3)]);

    let sent = sent_on_the_next_connection(&mut h);
    let left = t(10_000).saturating_duration_since(h.now).as_millis();
    assert_eq!(sent, format!("R 1 k 3\nA 2 k o {left} 5000\n"));
    h.feed("G 2 A k 4 5000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out[0].0, op);
    assert_eq!(granted(&out[0].1).token(), 4);
}

#[test]
fn a_second_w_is_a_protocol_violation() {
    let (mut h, _) = ready(4);
    let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);
    h.at_ms(15);
    let events = h.feed_closing("W node-2 8\n", "a:1", "protocol:second_welcome");
    assert_eq!(outcomes(&events), acquire.in_doubt_at(15));
    assert!(!events.iter().any(|e| matches!(e, Event::Connected { .. })));
    assert_eq!(backoffs(&events)[0].0, BackoffCause::Transport);
}

#[test]
fn operation_ids_grants_and_outcomes_tell_each_other_apart() {
    let (mut h, _) = ready(4);
    let a = h.acquire("k", 0, 5_000);
    let b = h.acquire("j", 0, 5_000);
    let r = h.release_token("z", 1);
    assert_eq!(h.take_sent(), "A 1 k o 0 5000\nA 2 j o 0 5000\nR 3 z 1\n");
    // Each open operation has its own number, and says what it is.
    assert_ne!(a.get(), b.get());
    assert_ne!(a.get(), r.get());
    assert!(a.to_string().starts_with("acquire#"), "{a}");
    assert!(r.to_string().starts_with("release#"), "{r}");
    assert_ne!(a.to_string(), b.to_string());
    let ga = h.granted_by(a, "G 1 A k 7 5000 0\n");
    let gb = h.granted_by(b, "G 2 A j 8 5000 0\n");
    assert!(ga.id().to_string().starts_with("grant#"), "{}", ga.id());
    // Two grants are two grants; a copy of one is that grant.
    assert_eq!(ga, ga.clone());
    assert_ne!(ga, gb);
    // Indeterminate and Lapsed do not state what happened on the server.
    assert!(!Outcome::Lapsed.is_definitive());
    assert!(!indeterminate(t(0), 0, 5_000).is_definitive());
    assert!(Outcome::Released.is_definitive());
    assert!(Outcome::NotHeld.is_definitive());
}
