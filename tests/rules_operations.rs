//! Scenario tests for cancelling, the timing rules of acquires, grant times,
//! shutting down, `poll_timeout` and determinism (PROTOCOL.md section 5:
//! the cancel rows, the answer-grace row, the "acquire not yet sent" row,
//! the shutdown item of "The reserved release lane", and invariant 6).
//!
//! Every test drives one client core with server bytes and times and checks
//! both the outcomes and the exact bytes the client sent.

mod support;

use support::*;
use ticketing::client::{
    Action, BackoffCause, CancelPolicy, CloseReason, Config, Error, Event, OpId, Outcome,
    ReleaseResult, TransportEnd,
};
use ticketing::Time;

/// The events since the last call, without the `Connecting` and `Connected`
/// notices (every test checks its connections through the actions and the
/// bytes sent).
fn events_of(h: &mut Harness) -> Vec<Event> {
    h.take_events()
        .into_iter()
        .filter(|e| !matches!(e, Event::Connecting { .. } | Event::Connected { .. }))
        .collect()
}

/// The outcomes among `events`, which must be all there is among them.
#[track_caller]
fn nothing_but_outcomes(events: Vec<Event>) -> Vec<(OpId, Outcome)> {
    let out = outcomes(&events);
    assert_eq!(out.len(), events.len(), "nothing but outcomes: {events:?}");
    out
}

/// Checks the events with which a shutdown completes: `ended` are the
/// outcomes among them, the connection closes for `shutdown`, and
/// `ShutdownComplete` comes last.
#[track_caller]
fn assert_shutdown_completes(events: &[Event], ended: &[(OpId, Outcome)]) {
    assert_eq!(outcomes(events), ended, "{events:?}");
    assert_eq!(
        close_reasons(events),
        vec![CloseReason::Shutdown],
        "{events:?}"
    );
    assert_eq!(events.last(), Some(&Event::ShutdownComplete), "{events:?}");
}

/// Feeds `answer`, a `G` to a waiter that was abandoned, and checks that
/// all it brings is the release of that grant by its exact `(key, token)`.
#[track_caller]
fn orphaned_by(h: &mut Harness, answer: &str, key_: &str, token: u64) {
    h.feed(answer);
    assert_eq!(
        events_of(h),
        vec![Event::OrphanRelease {
            key: key(key_),
            token
        }],
        "{answer:?}"
    );
}

fn keep_waiter() -> Config {
    let mut c = config();
    c.cancel = CancelPolicy::KeepWaiter;
    c
}

// ----- cancel ---------------------------------------------------------------

#[test]
fn an_abandoned_waiters_g_repeating_a_held_grant_never_releases_it() {
    // A misbehaving server answers an abandoned waiter with the (key,
    // token) of a grant the embedder holds: that grant is never released
    // behind the embedder's back, as for a stray `G`.
    let (mut h, _) = ready_with(keep_waiter(), 4);
    let first = h.acquire("k", 0, 60_000);
    h.feed("G 1 A k 7 60000 0\n");
    let held = grant_of(&h.take_outcomes()[0].1);
    assert_eq!(h.take_outcomes(), vec![]);
    let _ = first;
    let second = h.acquire("k", 5_000, 60_000);
    assert_eq!(h.take_sent(), "A 1 k o 0 60000\nA 2 k o 5000 60000\n");
    h.cancel(second);
    h.take_events();
    h.feed("G 2 A k 7 60000 0\n");
    assert_eq!(
        events_of(&mut h),
        vec![],
        "no orphan release of a held grant"
    );
    assert_eq!(h.take_sent(), "");
    // The embedder still holds it, and releases it itself.
    let release = h.release(&held);
    assert_eq!(h.take_sent(), "R 3 k 7\n");
    h.feed("D 3 R k\n");
    assert_eq!(h.take_outcomes(), vec![(release, Outcome::Released)]);
    // Another token from the abandoned waiter is an orphan, as before.
    let third = h.acquire("k", 5_000, 60_000);
    assert_eq!(h.take_sent(), "A 4 k o 5000 60000\n");
    h.cancel(third);
    h.take_events();
    orphaned_by(&mut h, "G 4 A k 8 60000 0\n", "k", 8);
    assert_eq!(h.take_sent(), "R 5 k 8\n");
}

#[test]
fn a_grant_issued_by_another_client_is_refused_and_changes_nothing() {
    // Client one's grant of `alpha`, token 7, handed to client two, whose
    // own grant of `beta` also has token 7 and the same place in its
    // table: client two refuses it, sends nothing, and keeps its own.
    let (mut one, _) = ready(4);
    one.acquire("alpha", 0, 60_000);
    one.feed("G 1 A alpha 7 60000 0\n");
    let foreign = grant_of(&one.take_outcomes()[0].1);
    let (mut two, _) = ready(4);
    two.acquire("beta", 0, 60_000);
    two.feed("G 1 A beta 7 60000 0\n");
    let own = grant_of(&two.take_outcomes()[0].1);
    two.take_sent();
    let refused = Error::ForeignGrant {
        key: key("alpha"),
        token: 7,
    };
    assert_eq!(two.client.release(two.now, &foreign), Err(refused.clone()));
    assert_eq!(two.client.undeliverable(two.now, &foreign), Err(refused));
    two.pump();
    assert_eq!(two.take_sent(), "", "nothing is sent for a foreign grant");
    assert_eq!(events_of(&mut two), vec![]);
    // Its own grant is still held, and released by its own token.
    let release = two.release(&own);
    assert_eq!(two.take_sent(), "R 2 beta 7\n");
    two.feed("D 2 R beta\n");
    assert_eq!(two.take_outcomes(), vec![(release, Outcome::Released)]);
    // And client one still takes its grant back.
    let back = one.release(&foreign);
    assert_eq!(one.take_sent(), "A 1 alpha o 0 60000\nR 2 alpha 7\n");
    one.feed("D 2 R alpha\n");
    assert_eq!(one.take_outcomes(), vec![(back, Outcome::Released)]);
}

#[test]
fn cancel_before_sending_is_cancelled_and_nothing_is_ever_sent() {
    // Before the connection is up.
    let mut h = Harness::new(config());
    let a = h.acquire("a", 1000, 5000);
    h.cancel(a);
    assert_eq!(h.take_outcomes(), vec![(a, Outcome::Cancelled)]);
    h.ready(2);
    assert_eq!(h.take_sent(), "", "nothing but H was ever sent");

    // On a live connection, queued behind the only acquire slot.
    let b = h.acquire("b", 1000, 5000);
    let c = h.acquire("c", 1000, 5000);
    assert_eq!(h.take_sent(), "A 1 b o 1000 5000\n");
    h.cancel(c);
    assert_eq!(h.take_outcomes(), vec![(c, Outcome::Cancelled)]);
    h.feed("T 1 A b\n");
    assert_eq!(
        h.take_outcomes(),
        vec![(
            b,
            Outcome::TimedOut {
                sent: true,
                cause: None
            }
        )]
    );
    assert_eq!(h.take_sent(), "", "the cancelled acquire never goes out");
    assert_eq!(h.closes(), vec![]);
}

#[test]
fn cancel_after_sending_with_the_close_policy_closes_and_every_sent_acquire_is_indeterminate() {
    let (mut h, conn1) = ready(4);
    let a = h.acquire("k1", 2000, 5000);
    let b = h.acquire("k2", 2000, 5000);
    let c = h.acquire("k3", 2000, 5000);
    let d = h.acquire("k4", 2000, 5000); // no acquire slot left
    let r = h.release_token("k9", 1);
    assert_eq!(
        h.take_sent(),
        "A 1 k1 o 2000 5000\nA 2 k2 o 2000 5000\nA 3 k3 o 2000 5000\nR 4 k9 1\n"
    );
    h.at_ms(100);
    let n = h.actions.len();
    h.cancel(b);
    // The connection is closed (reason `cancel`) and, the connection having
    // been fine, a new one starts at once.
    assert!(matches!(
        &h.actions[n..],
        [Action::Close { conn }, Action::Connect { .. }] if *conn == conn1
    ));
    let events = events_of(&mut h);
    assert_eq!(close_reasons(&events), vec![CloseReason::Cancel]);
    assert_eq!(CloseReason::Cancel.to_string(), "cancel");
    assert!(!events.iter().any(|e| matches!(e, Event::Backoff { .. })));
    // Every acquire sent on it: Indeterminate (100 + 2000 + 5000 + 1000).
    let settles_by = t(8100);
    assert_eq!(
        outcomes(&events),
        vec![
            (a, Outcome::Indeterminate { settles_by }),
            (b, Outcome::Indeterminate { settles_by }),
            (c, Outcome::Indeterminate { settles_by }),
        ]
    );
    // The next connection: the release again, the unsent acquire with what
    // is left of its budget; none of the cancelled connection's acquires.
    h.ready(4);
    assert_eq!(h.take_sent(), "R 5 k9 1\nA 6 k4 o 1900 5000\n");
    h.feed("D 5 R k9\nG 6 A k4 3 5000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out[0], (r, Outcome::Released));
    assert_eq!(out[1].0, d);
    assert_eq!(grant_of(&out[1].1).token(), 3);
}

#[test]
fn cancel_after_sending_with_keep_waiter_is_indeterminate_at_once_and_the_answer_is_still_claimed()
{
    let (mut h, conn) = ready_with(keep_waiter(), 4);
    let a = h.acquire("k1", 2000, 5000);
    let b = h.acquire("k2", 2000, 5000);
    let c = h.acquire("k3", 2000, 5000);
    assert_eq!(
        h.take_sent(),
        "A 1 k1 o 2000 5000\nA 2 k2 o 2000 5000\nA 3 k3 o 2000 5000\n"
    );
    h.at_ms(100);
    h.cancel(a);
    h.cancel(b);
    let settles_by = t(100 + 2000 + 5000 + 1000);
    assert_eq!(
        nothing_but_outcomes(events_of(&mut h)),
        vec![
            (a, Outcome::Indeterminate { settles_by }),
            (b, Outcome::Indeterminate { settles_by }),
        ]
    );
    // The connection is untouched; the abandoned waiters still hold their
    // window slots (the server has not answered them).
    assert_eq!(h.closes(), vec![]);
    assert_eq!(h.client.connection(), Some(conn));
    assert_eq!(in_flight(&h.client), (3, 3));
    assert_eq!(h.client.cancel(h.now, a), Err(Error::UnknownOperation(a)));
    let d = h.acquire("k4", 2000, 5000);
    assert_eq!(h.take_sent(), "");

    // A G for the abandoned waiter: released by its exact token, before the
    // queued acquire.
    h.at_ms(200);
    orphaned_by(&mut h, "G 1 A k1 5 5000 0\n", "k1", 5);
    // d was submitted at 100 with 2000 ms to wait; sent at 200.
    assert_eq!(h.take_sent(), "R 4 k1 5\nA 5 k4 o 1900 5000\n");
    // A T for the other one is simply dropped.
    h.feed("T 2 A k2\n");
    assert_eq!(events_of(&mut h), vec![]);
    assert_eq!(h.take_sent(), "");
    // The other operations are untouched.
    h.feed("G 3 A k3 6 5000 0\nD 4 R k1\nT 5 A k4\n");
    let events = events_of(&mut h);
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(
        matches!(&events[0], Event::Outcome { op, outcome: Outcome::Granted(g) }
        if *op == c && g.token() == 6)
    );
    assert_eq!(
        events[1],
        Event::OrphanSettled {
            key: key("k1"),
            token: 5,
            result: ReleaseResult::Released
        }
    );
    assert_eq!(
        events[2],
        Event::Outcome {
            op: d,
            outcome: Outcome::TimedOut {
                sent: true,
                cause: None
            }
        }
    );
    assert_eq!(h.closes(), vec![]);
    assert_eq!(in_flight(&h.client), (0, 0));
}

#[test]
fn cancel_of_a_release_changes_nothing_and_it_still_settles() {
    let mut h = Harness::new(config());
    // Queued.
    let r = h.release_token("k", 4);
    h.client.cancel(h.now, r).unwrap();
    h.pump();
    assert_eq!(events_of(&mut h), vec![]);
    h.ready(4);
    assert_eq!(h.take_sent(), "R 1 k 4\n");
    // In flight.
    h.client.cancel(h.now, r).unwrap();
    h.pump();
    assert_eq!(events_of(&mut h), vec![]);
    assert_eq!(h.closes(), vec![]);
    h.feed("D 1 R k\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
}

#[test]
fn cancel_of_an_ended_operation_is_unknown_operation() {
    let (mut h, _) = ready(4);
    let timed_out = h.acquire("a", 0, 5000);
    let granted = h.acquire("b", 0, 5000);
    let indeterminate = h.acquire("c", 0, 5000);
    assert_eq!(
        h.take_sent(),
        "A 1 a o 0 5000\nA 2 b o 0 5000\nA 3 c o 0 5000\n"
    );
    h.feed("T 1 A a\nG 2 A b 1 5000 0\n");
    h.cancel(indeterminate); // in flight: closes under the default policy
    let out = h.take_outcomes();
    assert_eq!(out.len(), 3, "{out:?}");
    let g = grant_of(&out[1].1);
    // Queued while the next connection comes up.
    let cancelled = h.acquire("d", 0, 5000);
    h.cancel(cancelled);
    assert_eq!(h.take_outcomes(), vec![(cancelled, Outcome::Cancelled)]);
    h.ready(4);
    let released = h.release(&g);
    assert_eq!(h.take_sent(), "R 4 b 1\n");
    h.feed("D 4 R b\n");
    assert_eq!(h.take_outcomes(), vec![(released, Outcome::Released)]);
    for op in [timed_out, granted, indeterminate, cancelled, released] {
        assert_eq!(h.client.cancel(h.now, op), Err(Error::UnknownOperation(op)));
    }
    h.pump();
    assert_eq!(events_of(&mut h), vec![]);
    assert_eq!(h.take_sent(), "");
}

// ----- timing ---------------------------------------------------------------

#[test]
fn answer_grace_deadline_closes_with_answer_timeout_whatever_the_cancel_policy() {
    for policy in [CancelPolicy::Close, CancelPolicy::KeepWaiter] {
        let mut c = config();
        c.cancel = policy;
        let (mut h, _) = ready_with(c, 4);
        let a = h.acquire("k", 1000, 5000);
        assert_eq!(h.take_sent(), "A 1 k o 1000 5000\n");
        // sent_at 0 + wait 1000 + answer_grace 5000.
        let events = h.closes_at(6000, "a:1", "answer_timeout");
        assert_eq!(close_reasons(&events), vec![CloseReason::AnswerTimeout]);
        assert_eq!(CloseReason::AnswerTimeout.to_string(), "answer_timeout");
        assert_eq!(
            outcomes(&events),
            vec![(
                a,
                Outcome::Indeterminate {
                    settles_by: t(6000 + 1000 + 5000 + 1000)
                }
            )],
            "{policy:?}"
        );
        assert_eq!(h.closes().len(), 1);
        h.reconnect(4);
        assert_eq!(h.take_sent(), "", "never resent ({policy:?})");
    }

    // An abandoned waiter whose answer never comes closes the connection
    // just the same (its outcome was given at the cancel).
    let (mut h, _) = ready_with(keep_waiter(), 4);
    let a = h.acquire("k", 1000, 5000);
    h.at_ms(100);
    h.cancel(a);
    assert_eq!(
        h.take_outcomes(),
        vec![(
            a,
            Outcome::Indeterminate {
                settles_by: t(100 + 1000 + 5000 + 1000)
            }
        )]
    );
    let events = h.closes_at(6000, "a:1", "answer_timeout");
    assert_eq!(close_reasons(&events), vec![CloseReason::AnswerTimeout]);
    assert_eq!(outcomes(&events), vec![]);
}

#[test]
fn a_sent_release_without_an_answer_within_the_grace_closes_and_goes_back_to_the_lane() {
    let (mut h, _) = ready(4);
    let r = h.release_token("k", 1);
    assert_eq!(h.take_sent(), "R 1 k 1\n");
    let events = h.closes_at(5000, "a:1", "answer_timeout");
    assert_eq!(close_reasons(&events), vec![CloseReason::AnswerTimeout]);
    assert_eq!(outcomes(&events), vec![]);
    h.reconnect(4);
    assert_eq!(h.take_sent(), "R 2 k 1\n");
    h.feed("D 2 R k\n");
    assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
}

#[test]
fn an_unsent_acquire_whose_budget_runs_out_times_out_never_sent() {
    // The connection never comes up (the connect hangs).
    let mut h = Harness::new(config());
    h.at_ms(100);
    // Wait 500 ms: it waits max(500 ms, queue_grace 2 s) from submission.
    let short = h.acquire("a", 500, 5000);
    // Wait 3 s: longer than the queue grace.
    let long = h.acquire("b", 3000, 5000);
    h.ends_at(
        2100,
        &[(
            short,
            Outcome::TimedOut {
                sent: false,
                cause: None,
            },
        )],
    );
    h.ends_at(
        3100,
        &[(
            long,
            Outcome::TimedOut {
                sent: false,
                cause: None,
            },
        )],
    );
    assert!(Outcome::TimedOut {
        sent: false,
        cause: None
    }
    .is_definitive());
    h.ready(4);
    assert_eq!(h.take_sent(), "", "a timed-out acquire is never sent");
}

#[test]
fn a_try_lock_submitted_before_the_connection_is_tried_once_within_the_queue_grace() {
    let mut h = Harness::new(config());
    let op = h.acquire("k", 0, 5000);
    h.at_ms(1500);
    h.ready(4);
    assert_eq!(h.take_sent(), "A 1 k o 0 5000\n");
    h.feed("T 1 A k\n");
    assert_eq!(
        h.take_outcomes(),
        vec![(
            op,
            Outcome::TimedOut {
                sent: true,
                cause: None
            }
        )]
    );

    // The connection comes after the queue grace: too late.
    let mut h = Harness::new(config());
    let op = h.acquire("k", 0, 5000);
    h.ends_at(
        2000,
        &[(
            op,
            Outcome::TimedOut {
                sent: false,
                cause: None,
            },
        )],
    );
    h.ready(4);
    assert_eq!(h.take_sent(), "");
}

#[test]
fn when_sent_the_wait_on_the_wire_is_what_is_left_of_the_budget() {
    let mut h = Harness::new(config());
    h.acquire("a", 3000, 5000);
    // Its budget is gone, but it is within the queue grace: 0, not less.
    h.acquire("b", 1000, 5000);
    h.at_ms(1234);
    h.ready(4);
    assert_eq!(h.take_sent(), "A 1 a o 1766 5000\nA 2 b o 0 5000\n");
}

#[test]
fn granted_valid_until_is_sent_time_plus_lease_and_expires_by_is_receipt_plus_lease_plus_margin() {
    let mut h = Harness::new(config());
    let op = h.acquire("k", 1000, 5000);
    h.at_ms(200);
    h.ready(4);
    assert_eq!(h.take_sent(), "A 1 k o 800 5000\n");
    h.at_ms(700);
    // The server gave less than asked.
    h.feed("G 1 A k 42 4000 0\n");
    let out = h.take_outcomes();
    assert_eq!(out[0].0, op);
    let g = grant_of(&out[0].1);
    assert_eq!(g.key(), &key("k"));
    assert_eq!(g.token(), 42);
    assert_eq!(g.lease(), ms(4000));
    assert_eq!(g.valid_until(), t(200 + 4000));
    assert_eq!(g.expires_by(), t(700 + 4000 + 1000));
}

// ----- shutdown -------------------------------------------------------------

#[test]
fn shutdown_drains_the_release_lane_within_its_budget_then_closes() {
    let (mut h, _) = ready(4);
    for (i, k) in ["k1", "k2", "k3"].into_iter().enumerate() {
        h.acquire(k, 0, 60_000);
        let id = i + 1;
        assert_eq!(h.take_sent(), format!("A {id} {k} o 0 60000\n"));
        h.feed(&format!("G {id} A {k} {} 60000 0\n", 10 + id));
    }
    let grants: Vec<_> = h.take_outcomes().iter().map(|o| grant_of(&o.1)).collect();
    h.at_ms(100);
    let r1 = h.release(&grants[0]);
    assert_eq!(h.take_sent(), "R 4 k1 11\n");
    h.at_ms(200);
    h.transport_closed(TransportEnd::Eof);
    events_of(&mut h);
    // Shutting down while the release waits for a connection.
    h.at_ms(220);
    h.shutdown(10_000);
    assert_eq!(events_of(&mut h), vec![]);
    // A release is still taken while shutting down.
    h.at_ms(230);
    let r2 = h.release(&grants[1]);
    h.reconnect(4);
    assert_eq!(h.take_sent(), "R 5 k1 11\nR 6 k2 12\n");
    h.feed("D 6 R k2\n");
    assert_eq!(
        nothing_but_outcomes(events_of(&mut h)),
        vec![(r2, Outcome::Released)]
    );
    assert!(!h.client.is_finished());
    let conn = h.client.connection().unwrap();
    let n = h.actions.len();
    h.feed("D 5 R k1\n");
    let events = events_of(&mut h);
    assert_eq!(
        events,
        vec![
            Event::Outcome {
                op: r1,
                outcome: Outcome::Released
            },
            Event::Closed {
                addr: h.last_connect().unwrap().1,
                reason: CloseReason::Shutdown
            },
            Event::ShutdownComplete,
        ]
    );
    assert_eq!(CloseReason::Shutdown.to_string(), "shutdown");
    assert_eq!(h.actions[n..], [Action::Close { conn }]);
    assert!(h.client.is_finished());
    assert_eq!(h.client.poll_timeout(), None);
    // The grant the embedder still holds was not released behind its back.
    assert!(!h.all_sent().contains(" k3 13"), "{}", h.all_sent());
}

#[test]
fn shutdown_whose_budget_runs_out_ends_open_releases_lapsed() {
    let (mut h, _) = ready(4);
    h.acquire("k", 0, 60_000);
    h.feed("G 1 A k 1 60000 0\n");
    let g = grant_of(&h.take_outcomes()[0].1);
    h.at_ms(100);
    let r = h.release(&g);
    assert_eq!(h.take_sent(), "A 1 k o 0 60000\nR 2 k 1\n");
    h.at_ms(200);
    h.shutdown(1000);
    h.at_ms(1199);
    assert_eq!(events_of(&mut h), vec![]);
    h.at_ms(1200);
    assert_shutdown_completes(&events_of(&mut h), &[(r, Outcome::Lapsed)]);
    assert!(h.client.is_finished());
    assert_eq!(h.client.poll_timeout(), None);
}

#[test]
fn shutdown_whose_budget_runs_out_ends_releases_never_sent_lapsed_too() {
    // The first round fails (both endpoints refuse): the release waits in
    // the lane, unsent, and still gets its outcome when the budget ends at
    // 1000. A driver that is late (its next call at 5000, past both the
    // end of the backoff and the budget) sees what a punctual one sees:
    // the connect attempt at the end of the backoff, closed by the
    // shutdown.
    fn run(late: bool) -> (Vec<Event>, Vec<Action>, OpId) {
        let mut h = Harness::new(config());
        let r = h.release_token("z", 9);
        h.shutdown(1_000);
        h.fail_connect();
        h.fail_connect();
        h.take_events();
        let mark = h.actions.len();
        if !late {
            while !h.client.is_finished() {
                h.next_deadline();
            }
        }
        h.at_ms(5_000);
        assert!(h.client.is_finished());
        assert_eq!(h.all_sent(), "");
        assert_eq!(open_operations(&h.client), (0, 0));
        (h.take_events(), h.actions.split_off(mark), r)
    }
    let punctual = run(false);
    assert_eq!(run(true), punctual);
    let (events, actions, r) = punctual;
    assert_shutdown_completes(&events, &[(r, Outcome::Lapsed)]);
    assert_eq!(actions.len(), 2, "a connect, then its close: {actions:?}");
    assert!(matches!(actions[0], Action::Connect { .. }), "{actions:?}");
    assert!(matches!(actions[1], Action::Close { .. }), "{actions:?}");
}

#[test]
fn shutdown_refuses_new_acquires() {
    let (mut h, _) = ready(4);
    let r = h.release_token("k", 1);
    h.shutdown(5000);
    assert_eq!(
        h.client
            .acquire(h.now, key("a"), name("o"), ms(1000), ms(5000)),
        Err(Error::ShuttingDown)
    );
    assert_eq!(h.client.shutdown(h.now, ms(5000)), Err(Error::ShuttingDown));
    h.pump();
    assert_eq!(h.take_sent(), "R 1 k 1\n");
    assert_eq!(events_of(&mut h), vec![]);
    h.feed("D 1 R k\n");
    let events = events_of(&mut h);
    assert_eq!(outcomes(&events), vec![(r, Outcome::Released)]);
    assert_eq!(events.last(), Some(&Event::ShutdownComplete));
    // Once shut down, nothing is taken any more.
    assert_eq!(
        h.client
            .acquire(h.now, key("a"), name("o"), ms(1000), ms(5000)),
        Err(Error::Finished)
    );
    assert_eq!(
        h.client.release_token(h.now, key("k"), 2),
        Err(Error::Finished)
    );
}

#[test]
fn shutdown_with_the_close_policy_cancels_queued_acquires_and_closes_on_sent_ones() {
    let (mut h, conn1) = ready(3);
    let a = h.acquire("a", 5000, 10_000);
    let b = h.acquire("b", 5000, 10_000);
    let c = h.acquire("c", 5000, 10_000);
    let r = h.release_token("k9", 99);
    assert_eq!(
        h.take_sent(),
        "A 1 a o 5000 10000\nA 2 b o 5000 10000\nR 3 k9 99\n"
    );
    h.at_ms(100);
    h.shutdown(10_000);
    let events = events_of(&mut h);
    let settles_by = t(100 + 5000 + 10_000 + 1000);
    assert_eq!(
        outcomes(&events),
        vec![
            (c, Outcome::Cancelled),
            (a, Outcome::Indeterminate { settles_by }),
            (b, Outcome::Indeterminate { settles_by }),
        ]
    );
    assert_eq!(close_reasons(&events), vec![CloseReason::Cancel]);
    assert_eq!(h.closes(), vec![conn1]);
    // The release in flight drains on a new connection.
    h.ready(3);
    assert_eq!(h.take_sent(), "R 4 k9 99\n");
    h.feed("D 4 R k9\n");
    assert_shutdown_completes(&events_of(&mut h), &[(r, Outcome::Released)]);
    assert!(!h.all_sent().contains(" c o "));
}

#[test]
fn shutdown_whose_cancel_close_leaves_nothing_to_drain_finishes_without_connecting_again() {
    // Only an acquire in flight: the shutdown's close (cancel policy Close)
    // ends it Indeterminate and leaves nothing to send, so the shutdown
    // completes at once: no new connection, no backoff.
    let (mut h, conn) = ready(3);
    let a = h.acquire("a", 5000, 10_000);
    assert_eq!(h.take_sent(), "A 1 a o 5000 10000\n");
    h.at_ms(100);
    events_of(&mut h);
    let n = h.actions.len();
    h.shutdown(10_000);
    assert_eq!(
        h.take_events(),
        vec![
            Event::Closed {
                addr: ep("a:1"),
                reason: CloseReason::Cancel
            },
            Event::Outcome {
                op: a,
                outcome: Outcome::Indeterminate {
                    settles_by: t(100 + 5000 + 10_000 + 1000)
                }
            },
            Event::ShutdownComplete,
        ]
    );
    assert_eq!(h.actions[n..], [Action::Close { conn }]);
    assert!(h.client.is_finished());
    assert_eq!(h.client.poll_timeout(), None);
}

#[test]
fn shutdown_with_keep_waiter_releases_a_grant_arriving_during_shutdown_by_exact_token_before_closing(
) {
    let (mut h, _) = ready_with(keep_waiter(), 3);
    let a = h.acquire("ka", 5000, 10_000);
    let b = h.acquire("kb", 5000, 10_000);
    let c = h.acquire("kc", 5000, 10_000);
    assert_eq!(h.take_sent(), "A 1 ka o 5000 10000\nA 2 kb o 5000 10000\n");
    h.at_ms(100);
    h.shutdown(10_000);
    let settles_by = t(100 + 5000 + 10_000 + 1000);
    assert_eq!(
        nothing_but_outcomes(events_of(&mut h)),
        vec![
            (a, Outcome::Indeterminate { settles_by }),
            (b, Outcome::Indeterminate { settles_by }),
            (c, Outcome::Cancelled),
        ]
    );
    assert_eq!(h.closes(), vec![], "the waiters' answers are still claimed");
    h.at_ms(300);
    h.feed("T 2 A kb\n");
    assert_eq!(events_of(&mut h), vec![]);
    assert!(!h.client.is_finished());
    orphaned_by(&mut h, "G 1 A ka 7 10000 0\n", "ka", 7);
    assert_eq!(h.take_sent(), "R 3 ka 7\n");
    assert!(h.closes().is_empty());
    h.feed("D 3 R ka\n");
    let events = events_of(&mut h);
    assert_eq!(
        events[0],
        Event::OrphanSettled {
            key: key("ka"),
            token: 7,
            result: ReleaseResult::Released
        }
    );
    assert_eq!(close_reasons(&events), vec![CloseReason::Shutdown]);
    assert_eq!(events.last(), Some(&Event::ShutdownComplete));
    assert_eq!(h.closes().len(), 1);
    assert!(!h.all_sent().contains(" kc o "));
}

// ----- the driver contract --------------------------------------------------

#[test]
fn poll_timeout_is_now_while_output_is_queued_and_an_exact_deadline_otherwise() {
    let mut h = Harness::new(config());
    // Connecting: the connect timeout.
    assert_eq!(h.client.poll_timeout(), Some(t(5000)));
    h.at_ms(10);
    h.hello();
    // Handshaking: the handshake timeout.
    assert_eq!(h.client.poll_timeout(), Some(t(10 + 5000)));
    h.feed("W node-1 4\n");
    assert_eq!(h.client.poll_timeout(), None, "idle: nothing to wake for");

    let conn = h.client.connection().unwrap();
    let client = &mut h.client;
    let op = client
        .acquire(t(20), key("k"), name("o"), ms(1000), ms(5000))
        .unwrap();
    assert_eq!(client.poll_timeout(), Some(t(20)), "a send is due");
    assert_eq!(
        client.poll_action(),
        Some(Action::Send {
            conn,
            data: "A 1 k o 1000 5000\n".into()
        })
    );
    assert_eq!(client.poll_action(), None);
    assert_eq!(client.poll_event(), None);
    // sent at 20 + wait 1000 + answer grace 5000.
    assert_eq!(client.poll_timeout(), Some(t(6020)));
    client.handle_bytes(t(30), conn, b"T 1 A k\n");
    assert_eq!(client.poll_timeout(), Some(t(30)), "an event is due");
    assert_eq!(client.poll_action(), None);
    assert_eq!(
        client.poll_event(),
        Some(Event::Outcome {
            op,
            outcome: Outcome::TimedOut {
                sent: true,
                cause: None
            }
        })
    );
    assert_eq!(client.poll_timeout(), None);

    // A closed connection: the backoff's end, exactly.
    client.handle_transport_closed(t(40), conn, TransportEnd::Eof);
    assert_eq!(client.poll_timeout(), Some(t(40)));
    assert!(matches!(client.poll_action(), Some(Action::Close { .. })));
    let mut until = None;
    while let Some(e) = client.poll_event() {
        if let Event::Backoff { cause, until: u } = e {
            assert_eq!(cause, BackoffCause::Transport);
            until = Some(u);
        }
    }
    let until = until.expect("a backoff");
    assert_eq!(client.poll_timeout(), Some(until));
    assert!(until >= t(40 + 25) && until <= t(40 + 50), "{until}");
}

/// A scenario with jitter (connect failures, a `B` retry), reordered
/// answers, a cancel, a close and a shutdown, driven only by the client's
/// own deadlines. Returns every action and every event.
fn scripted_run(seed: u64) -> (Vec<Action>, Vec<Event>) {
    let mut c = config();
    c.seed = seed;
    let mut h = Harness::new(c);
    let mut events = Vec::new();
    h.acquire("a", 3000, 10_000);
    h.acquire("b", 3000, 10_000);
    h.acquire("c", 3000, 10_000);
    // Three failed rounds, each of both endpoints.
    for _ in 0..3 {
        h.fail_connect();
        h.fail_connect();
        h.next_deadline();
    }
    h.ready(3);
    h.feed("G 2 A b 1 10000 0\nB 1 A a\n");
    events.extend(events_of(&mut h));
    h.next_deadline(); // the B retry
    h.feed("G 3 A c 2 10000 0\n");
    events.extend(events_of(&mut h));
    let grant_b = grant_of(&outcomes(&events)[0].1);
    h.release(&grant_b);
    h.transport_closed(TransportEnd::Eof);
    h.take_sent();
    h.reconnect(3);
    h.feed("N 6 R b\n");
    let d = h.acquire("d", 3000, 10_000);
    h.cancel(d);
    h.shutdown(2000);
    while !h.client.is_finished() {
        h.next_deadline();
    }
    events.extend(events_of(&mut h));
    (h.actions.clone(), events)
}

#[test]
fn determinism_the_same_inputs_at_the_same_times_give_the_same_bytes() {
    let first = scripted_run(7);
    let second = scripted_run(7);
    assert_eq!(first.0, second.0, "actions, byte for byte");
    assert_eq!(first.1, second.1, "events");
    // The scenario exercised what it claims: jittered backoffs, a retry
    // with a new id, a resent release.
    let backoffs = first
        .1
        .iter()
        .filter(|e| matches!(e, Event::Backoff { .. }))
        .count();
    assert!(backoffs >= 4, "{:?}", first.1);
    let sent: Vec<u8> = first
        .0
        .iter()
        .filter_map(|a| match a {
            Action::Send { data, .. } => Some(data.to_vec()),
            _ => None,
        })
        .flatten()
        .collect();
    let sent = String::from_utf8(sent).unwrap();
    assert!(sent.contains("\nA 4 a o "), "{sent}");
    assert!(
        sent.contains("R 5 b 1\n") && sent.contains("R 6 b 1\n"),
        "{sent}"
    );
    assert_eq!(first.1.last(), Some(&Event::ShutdownComplete));
    // The randomness comes from the seed: another seed, other jitter.
    let other = scripted_run(8);
    assert_ne!(first.1, other.1);
}

#[test]
fn shutdown_with_a_zero_budget_ends_at_once() {
    // The budget is already spent when the shutdown starts: a demanding
    // driver expects the shutdown to complete in the call itself, not at
    // some later input.
    let (mut h, _) = ready(4);
    let r = h.release_token("k", 1);
    assert_eq!(h.take_sent(), "R 1 k 1\n");
    h.at_ms(100);
    h.shutdown(0);
    assert_shutdown_completes(&events_of(&mut h), &[(r, Outcome::Lapsed)]);
    assert!(h.client.is_finished());
}

#[test]
fn an_abandoned_waiter_no_longer_counts_against_the_clients_own_capacity() {
    // Cancelled under KeepWaiter, the acquire's operation has ended (it was
    // told Indeterminate): only its window slot stays taken, until the
    // server answers it.
    let mut c = keep_waiter();
    c.max_acquires = 1;
    let (mut h, _) = ready_with(c, 4);
    let a = h.acquire("k1", 2000, 5000);
    assert_eq!(h.take_sent(), "A 1 k1 o 2000 5000\n");
    assert_eq!(
        h.client
            .acquire(h.now, key("k2"), name("o"), ms(2000), ms(5000)),
        Err(Error::Busy),
        "one open acquire at most"
    );
    h.at_ms(100);
    h.cancel(a);
    assert_eq!(
        h.take_outcomes(),
        vec![(a, indeterminate(t(100), 2000, 5000))]
    );
    assert_eq!(open_operations(&h.client), (0, 0));
    let b = h.acquire("k2", 2000, 5000);
    assert_eq!(h.take_sent(), "A 2 k2 o 2000 5000\n");
    assert_eq!(open_operations(&h.client), (1, 0));
    assert_eq!(in_flight(&h.client), (2, 2));
    // The waiter's answer is claimed and changes no count.
    h.feed("T 1 A k1\n");
    assert_eq!(h.take_outcomes(), vec![]);
    assert_eq!(open_operations(&h.client), (1, 0));
    h.feed("T 2 A k2\n");
    assert_eq!(
        h.take_outcomes(),
        vec![(
            b,
            Outcome::TimedOut {
                sent: true,
                cause: None
            }
        )]
    );
    assert_eq!(open_operations(&h.client), (0, 0));
}

#[test]
fn now_is_the_latest_time_seen_and_an_earlier_one_does_not_move_it_back() {
    let mut h = Harness::new(config());
    assert_eq!(h.client.now(), Time::ZERO);
    h.at_ms(1_234);
    assert_eq!(h.client.now(), t(1_234));
    // An earlier time is taken as the latest one seen.
    h.client.handle_timeout(t(1_000));
    assert_eq!(h.client.now(), t(1_234));
}

/// A client's `Debug` says where it is (its time, connection, window and
/// counts), and a grant's names who issued it without a number: two
/// clients fed the same inputs print the same text.
#[test]
fn debug_output_tells_the_state_and_is_the_same_for_the_same_inputs() {
    let run = || {
        let (mut h, _) = ready(8);
        let op = h.acquire("k", 0, 5_000);
        h.acquire("q", 60_000, 5_000);
        let grant = h.granted_by(op, "G 1 A k 7 5000 0\n");
        (format!("{:?}", h.client), format!("{grant:?}"))
    };
    let (client, grant) = run();
    for part in [
        "Client {",
        "now: ",
        "connection: Some(",
        "window: Some(8)",
        "in_flight: InFlight { requests: 1, acquires: 1 }",
        "open: OpenOperations { acquires: 1, releases: 0 }",
    ] {
        assert!(client.contains(part), "{part:?} in {client}");
    }
    for part in ["Grant {", "token: 7", "issuer: Issuer"] {
        assert!(grant.contains(part), "{part:?} in {grant}");
    }
    assert_eq!(run(), (client, grant), "the same inputs print the same");
}
