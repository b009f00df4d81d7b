//! PROTOCOL.md section 5, "Renewal": one scenario per rule, on exact bytes
//! and times, through the client core alone.

mod support;

use support::*;
use ticketing::client::{BackoffCause, Error, Event, Outcome, TransportEnd};
use ticketing::Time;

/// The renewal notices among `events`, as `(what, token, valid_until)`.
fn renewal_notices(events: &[Event]) -> Vec<(&'static str, u64, Option<Time>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Renewed {
                token, valid_until, ..
            } => Some(("renewed", *token, Some(*valid_until))),
            Event::LeaseJeopardy {
                token, valid_until, ..
            } => Some(("jeopardy", *token, Some(*valid_until))),
            Event::LeaseLost { token, .. } => Some(("lost", *token, None)),
            Event::LeaseExpired { token, .. } => Some(("expired", *token, None)),
            _ => None,
        })
        .collect()
}

/// A grant held (valid until 3000, freed by 4000) renewed once at 10 ms
/// with a 30 ms lease (`X 2`), left unanswered while both pass: at 4500
/// it has expired, with its renewal still in flight.
fn expired_with_a_short_renewal_in_flight() -> (Harness, ticketing::client::Grant) {
    let (mut h, g) = renewal_in_flight(10, Some(30));
    h.at_ms(4_500);
    assert_eq!(renewal_notices(&h.take_events()), [("expired", 7, None)]);
    (h, g)
}

/// A ready harness (window 4) holding the grant of `k`, token 7, lease
/// 3000 ms, granted at once at t=0 from an acquire sent at t=0, renewed
/// automatically if `auto`.
fn holding(auto: bool) -> (Harness, ticketing::client::Grant) {
    let (mut h, _) = ready(4);
    let op = if auto {
        h.acquire_renewing("k", 0, 3_000, None)
    } else {
        h.acquire("k", 0, 3_000)
    };
    assert_eq!(h.take_sent(), "A 1 k o 0 3000\n");
    let g = h.granted_by(op, "G 1 A k 7 3000 0\n");
    assert_eq!(g.valid_until(), t(3_000));
    (h, g)
}

/// [`holding`] the grant, not renewed automatically, renewed by hand at
/// `at_ms` for `lease_ms` (`None`: the acquire's 3000 ms): the renewal
/// `X 2 k 7 <lease>` has gone out and is not answered.
#[track_caller]
fn renewal_in_flight(at_ms: u64, lease_ms: Option<u64>) -> (Harness, ticketing::client::Grant) {
    let (mut h, g) = holding(false);
    h.at_ms(at_ms);
    h.renew(&g, lease_ms);
    let lease = lease_ms.unwrap_or(3_000);
    assert_eq!(h.take_sent(), format!("X 2 k 7 {lease}\n"));
    (h, g)
}

/// [`holding`] the grant renewed automatically, at 1000 ms: a third of the
/// way through its lease, its first renewal `X 2 k 7 3000` has gone out and
/// is not answered.
#[track_caller]
fn first_automatic_renewal_in_flight() -> (Harness, ticketing::client::Grant) {
    let (mut h, g) = holding(true);
    h.at_ms(1_000);
    assert_eq!(h.take_sent(), "X 2 k 7 3000\n");
    (h, g)
}

#[test]
fn a_manual_renewal_goes_by_exact_token_and_valid_until_counts_from_its_send_time() {
    let (mut h, g) = holding(false);
    // Not renewed unless asked.
    h.at_ms(1_000);
    assert_eq!(h.take_sent(), "");
    h.renew(&g, None);
    assert_eq!(h.take_sent(), "X 2 k 7 3000\n", "the acquire's lease");
    // Answered later: valid_until counts from the send time, not the
    // arrival, with the lease the answer gives.
    h.at_ms(1_200);
    h.feed("G 2 X k 7 2500\n");
    let events = h.take_events();
    assert_eq!(
        renewal_notices(&events),
        [("renewed", 7, Some(t(3_500)))],
        "{events:?}"
    );
    assert!(matches!(&events[0], Event::Renewed { grant, .. } if *grant == g.id()));
    assert_eq!(h.client.valid_until(&g), Some(t(3_500)));
    assert_eq!(g.valid_until(), t(3_000), "the grant itself is a snapshot");
    // A lease the embedder asks for.
    h.renew(&g, Some(10_000));
    assert_eq!(h.take_sent(), "X 3 k 7 10000\n");
    h.feed("G 3 X k 7 10000\n");
    assert_eq!(h.client.valid_until(&g), Some(t(11_200)));
}

#[test]
fn automatic_renewal_asks_a_third_of_the_way_through_each_lease_for_the_acquires_lease() {
    let (mut h, g) = holding(true);
    assert_eq!(h.client.poll_timeout(), Some(t(1_000)));
    assert_eq!(h.next_deadline(), t(1_000));
    assert_eq!(h.take_sent(), "X 2 k 7 3000\n");
    h.at_ms(1_050);
    h.feed("G 2 X k 7 3000\n");
    assert_eq!(
        renewal_notices(&h.take_events()),
        [("renewed", 7, Some(t(4_000)))]
    );
    // The next one when less than two thirds of the new lease is left.
    assert_eq!(h.client.poll_timeout(), Some(t(2_000)));
    h.next_deadline();
    assert_eq!(h.take_sent(), "X 3 k 7 3000\n");
    // An answer that proves less than the grant has changes nothing; the
    // schedule goes by the lease of the G that set valid_until, of which
    // no more than two thirds is left: it asks again.
    h.feed("G 3 X k 7 1500\n");
    assert_eq!(h.client.valid_until(&g), Some(t(4_000)), "never shortened");
    assert_eq!(h.take_sent(), "X 4 k 7 3000\n");
}

#[test]
fn a_grant_that_waited_long_counts_its_wait_and_one_that_arrives_late_is_renewed_at_once() {
    let (mut h, _) = ready(4);
    let op = h.acquire_renewing("k", 5_000, 3_000, None);
    assert_eq!(h.take_sent(), "A 1 k o 5000 3000\n");
    // It waited 2.4 s in the key's queue; the answer took 1.1 s more.
    h.at_ms(3_500);
    let g = h.granted_by(op, "G 1 A k 7 3000 2400\n");
    assert_eq!(
        g.valid_until(),
        t(5_400),
        "sent at 0, plus 2400 waited, plus 3000"
    );
    // Less than two thirds of the lease is left: renewed at once.
    assert_eq!(h.take_sent(), "X 2 k 7 3000\n");
    assert_eq!(renewal_notices(&h.take_events()), []);
    // Less than a third left when it arrives: renewed, and in jeopardy, at
    // once.
    let (mut h, _) = ready(4);
    let op = h.acquire_renewing("j", 5_000, 3_000, None);
    assert_eq!(h.take_sent(), "A 1 j o 5000 3000\n");
    h.at_ms(2_500);
    let g = h.granted_by(op, "G 1 A j 8 3000 0\n");
    assert_eq!(g.valid_until(), t(3_000));
    assert_eq!(h.take_sent(), "X 2 j 8 3000\n");
    assert_eq!(
        renewal_notices(&h.take_events()),
        [("jeopardy", 8, Some(t(3_000)))]
    );
}

#[test]
fn at_most_one_renewal_of_a_grant_is_in_flight() {
    let (mut h, g) = first_automatic_renewal_in_flight();
    // Asked again by hand, and by the schedule: nothing more goes out.
    h.at_ms(1_500);
    h.renew(&g, None);
    h.at_ms(2_500);
    assert_eq!(h.take_sent(), "");
    // Once answered, the schedule goes on.
    h.feed("G 2 X k 7 3000\n");
    assert_eq!(h.client.valid_until(&g), Some(t(4_000)));
    assert_eq!(
        h.take_sent(),
        "X 3 k 7 3000\n",
        "less than 2/3 of it left at once"
    );
}

#[test]
fn renewals_wait_after_releases_and_before_acquires_and_may_use_the_reserved_slot() {
    // Window 3, one slot reserved: at most two acquires in flight.
    let (mut h, _) = ready(3);
    let mut grants = Vec::new();
    for (id, key) in [(1, "k1"), (2, "k2"), (3, "k3")] {
        let op = h.acquire(key, 0, 30_000);
        assert_eq!(h.take_sent(), format!("A {id} {key} o 0 30000\n"));
        grants.push(h.granted_by(op, &format!("G {id} A {key} {id}0 30000 0\n")));
    }
    h.acquire("k4", 60_000, 30_000);
    h.acquire("k5", 60_000, 30_000);
    assert_eq!(
        h.take_sent(),
        "A 4 k4 o 60000 30000\nA 5 k5 o 60000 30000\n"
    );
    // The acquires fill their part of the window; a renewal takes the
    // reserved slot.
    h.acquire("k6", 60_000, 30_000);
    h.renew(&grants[0], None);
    assert_eq!(h.take_sent(), "X 6 k1 10 30000\n");
    // The window is full: an acquire, a renewal and a release wait.
    h.acquire("k7", 60_000, 30_000);
    h.renew(&grants[1], None);
    h.release(&grants[2]);
    assert_eq!(h.take_sent(), "");
    // Each slot that frees goes to the release, then the renewal, then an
    // acquire.
    h.feed("T 4 A k4\n");
    assert_eq!(h.take_sent(), "R 7 k3 30\n");
    h.feed("G 6 X k1 10 30000\n");
    assert_eq!(h.take_sent(), "X 8 k2 20 30000\n");
    h.feed("D 7 R k3\n");
    assert_eq!(h.take_sent(), "A 9 k6 o 60000 30000\n");
}

#[test]
fn a_g_to_a_renewal_with_another_token_closes_and_that_token_is_released() {
    let (mut h, g) = renewal_in_flight(100, None);
    let events = h.feed_closing("G 2 X k 8 3000\n", "a:1", "protocol:token_mismatch");
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::OrphanRelease { key, token: 8 } if key.as_str() == "k")));
    assert_eq!(renewal_notices(&events), [], "nothing proved");
    // The renewal goes again on the next connection, the release of 8
    // before it.
    h.reconnect(4);
    assert_eq!(h.take_sent(), "R 3 k 8\nX 4 k 7 3000\n");
    assert_eq!(h.client.valid_until(&g), Some(t(3_000)));
}

#[test]
fn a_g_to_a_renewal_with_a_longer_lease_than_asked_closes_and_proves_nothing() {
    // The renewal asks 2000 ms; a `G` that gives more than asked is a bad
    // answer, even when it is no more than the grant's first lease.
    let (mut h, g) = renewal_in_flight(100, Some(2_000));
    let events = h.feed_closing("G 2 X k 7 2500\n", "a:1", "protocol:lease_above_asked");
    assert_eq!(renewal_notices(&events), [], "nothing proved");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::OrphanRelease { .. })),
        "the embedder holds token 7: never released behind its back"
    );
    assert_eq!(h.client.valid_until(&g), Some(t(3_000)));
    // The renewal goes again on the next connection.
    h.reconnect(4);
    assert_eq!(h.take_sent(), "X 3 k 7 2000\n");
}

#[test]
fn n_to_a_renewal_is_lease_lost_and_a_later_release_ends_not_held_without_a_request() {
    let (mut h, g) = first_automatic_renewal_in_flight();
    h.feed("N 2 X k\n");
    let events = h.take_events();
    assert_eq!(renewal_notices(&events), [("lost", 7, None)]);
    assert!(matches!(&events[0], Event::LeaseLost { grant, .. } if *grant == g.id()));
    assert_eq!(h.client.valid_until(&g), None);
    // No renewal any more, no jeopardy, no expiry: it is gone.
    h.at_ms(3_500);
    assert_eq!(h.take_sent(), "");
    assert_eq!(renewal_notices(&h.take_events()), []);
    assert_eq!(
        h.client.renew(h.now, &g, None),
        Err(Error::GrantNotHeld {
            key: key("k"),
            token: 7
        })
    );
    let op = h.release(&g);
    assert_eq!(h.take_outcomes(), [(op, Outcome::NotHeld)]);
    assert_eq!(h.take_sent(), "", "nothing asked");
}

#[test]
fn a_close_with_a_renewal_in_flight_resends_it_while_valid_and_not_after() {
    let (mut h, _) = renewal_in_flight(1_000, None);
    h.at_ms(1_100);
    h.transport_closed(TransportEnd::Eof);
    h.reconnect(4);
    assert!(h.now < t(3_000));
    assert_eq!(h.take_sent(), "X 3 k 7 3000\n", "sent again, with a new id");
    // Lost again, and no connection until its valid_until has passed.
    h.transport_closed(TransportEnd::Eof);
    h.refuse_connects_until(t(3_100));
    let events = h.take_events();
    assert_eq!(renewal_notices(&events), [("expired", 7, None)]);
    h.reconnect(4);
    assert_eq!(h.take_sent(), "", "not after its valid_until");
}

#[test]
fn a_renewal_without_an_answer_within_the_answer_grace_closes_with_answer_timeout() {
    let (mut h, _) = renewal_in_flight(10, Some(30_000));
    // valid_until (3000) passes first: told, but the renewal still waits.
    assert_eq!(h.next_deadline(), t(3_000));
    assert_eq!(renewal_notices(&h.take_events()), [("expired", 7, None)]);
    assert_eq!(h.next_deadline(), t(5_010));
    assert_eq!(
        closed(&h.take_events()),
        [("a:1".to_string(), "answer_timeout".to_string())]
    );
}

#[test]
fn jeopardy_is_told_once_when_a_third_of_the_lease_is_left_and_renewed_ends_it() {
    let (mut h, g) = first_automatic_renewal_in_flight();
    // Unanswered: at 2000 less than a third of the lease is left.
    assert_eq!(h.next_deadline(), t(2_000));
    assert_eq!(
        renewal_notices(&h.take_events()),
        [("jeopardy", 7, Some(t(3_000)))]
    );
    h.at_ms(2_400);
    assert_eq!(renewal_notices(&h.take_events()), [], "once");
    // Renewed ends it; renewed again at once (less than 2/3 left), and
    // that one unanswered brings a new jeopardy.
    h.feed("G 2 X k 7 3000\n");
    assert_eq!(
        renewal_notices(&h.take_events()),
        [("renewed", 7, Some(t(4_000)))]
    );
    assert_eq!(h.take_sent(), "X 3 k 7 3000\n");
    assert_eq!(h.next_deadline(), t(3_000));
    assert_eq!(
        renewal_notices(&h.take_events()),
        [("jeopardy", 7, Some(t(4_000)))]
    );
    assert_eq!(h.client.valid_until(&g), Some(t(4_000)));
}

#[test]
fn every_held_grant_expires_at_its_valid_until_renewed_or_not() {
    let (mut h, g) = holding(false);
    assert_eq!(h.next_deadline(), t(3_000));
    let events = h.take_events();
    assert_eq!(renewal_notices(&events), [("expired", 7, None)]);
    assert!(matches!(&events[0], Event::LeaseExpired { grant, .. } if *grant == g.id()));
    assert_eq!(
        h.client.renew(h.now, &g, None),
        Err(Error::LeaseExpired {
            key: key("k"),
            token: 7
        })
    );
    // Still the embedder's to release, by exact token.
    assert_eq!(h.client.valid_until(&g), Some(t(3_000)));
    h.release(&g);
    assert_eq!(h.take_sent(), "R 2 k 7\n");

    // An automatically renewed one whose renewals go unanswered.
    let (mut h, _) = first_automatic_renewal_in_flight();
    h.at_ms(3_000);
    assert_eq!(
        renewal_notices(&h.take_events()),
        [("jeopardy", 7, Some(t(3_000))), ("expired", 7, None)]
    );
    // The late answer is claimed and changes nothing.
    h.feed("G 2 X k 7 3000\n");
    assert_eq!(renewal_notices(&h.take_events()), []);
    h.at_ms(10_000);
    assert_eq!(h.take_sent(), "", "renewed no more");
}

#[test]
fn queuing_a_release_stops_renewal_and_a_renewal_in_flight_is_claimed() {
    let (mut h, g) = first_automatic_renewal_in_flight();
    h.at_ms(1_100);
    let op = h.release(&g);
    assert_eq!(h.take_sent(), "R 3 k 7\n");
    h.feed("G 2 X k 7 3000\n");
    assert_eq!(renewal_notices(&h.take_events()), [], "claimed");
    h.feed("D 3 R k\n");
    assert_eq!(h.take_outcomes(), [(op, Outcome::Released)]);
    h.at_ms(10_000);
    assert_eq!(h.take_sent(), "");
    assert_eq!(renewal_notices(&h.take_events()), []);

    // Released while its renewal waits for a slot: the renewal is dropped.
    let (mut h, _) = ready(2);
    let op = h.acquire_renewing("k", 0, 3_000, None);
    assert_eq!(h.take_sent(), "A 1 k o 0 3000\n");
    let g = h.granted_by(op, "G 1 A k 7 3000 0\n");
    let other = h.acquire("m", 0, 30_000);
    assert_eq!(h.take_sent(), "A 2 m o 0 30000\n");
    let m = h.granted_by(other, "G 2 A m 5 30000 0\n");
    h.renew(&m, None);
    h.release_token("x", 1);
    assert_eq!(h.take_sent(), "X 3 m 5 30000\nR 4 x 1\n");
    h.at_ms(1_000);
    h.release(&g);
    h.feed("D 4 R x\n");
    assert_eq!(h.take_sent(), "R 5 k 7\n", "the release, and no renewal");
}

#[test]
fn shutdown_stops_every_renewal() {
    let (mut h, g) = holding(true);
    // A release of another grant keeps the shutdown going for a while.
    h.release_token("x", 1);
    assert_eq!(h.take_sent(), "R 2 x 1\n");
    h.at_ms(500);
    h.shutdown(10_000);
    assert_eq!(h.client.renew(h.now, &g, None), Err(Error::ShuttingDown));
    h.at_ms(2_500);
    assert_eq!(h.take_sent(), "", "no renewal");
    assert_eq!(renewal_notices(&h.take_events()), [], "no jeopardy");
}

#[test]
fn a_renewal_in_flight_when_shutdown_starts_is_not_sent_again_after_a_close() {
    let (mut h, g) = holding(false);
    // A release of another grant keeps the shutdown going, and connected.
    h.release_token("x", 1);
    assert_eq!(h.take_sent(), "R 2 x 1\n");
    h.at_ms(500);
    h.renew(&g, None);
    assert_eq!(h.take_sent(), "X 3 k 7 3000\n");
    h.shutdown(10_000);
    // The connection goes while the renewal is in flight: the release goes
    // out again on the next one, the renewal does not.
    h.at_ms(600);
    h.transport_closed(TransportEnd::Eof);
    h.reconnect(4);
    assert!(h.now < t(3_000), "the grant is still valid");
    assert_eq!(h.take_sent(), "R 4 x 1\n", "shutdown stops every renewal");
}

#[test]
fn e_unsupported_version_backs_off_long_and_is_told() {
    let mut h = Harness::new(config());
    h.hello();
    let events = h.feed_closing("E unsupported_version\n", "a:1", "unsupported_version");
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::UnsupportedVersion { addr } if addr.as_str() == "a:1")));
    // Another node may speak version 2: the round goes on, and only a
    // round that every node refused backs off.
    assert!(backoffs(&events).is_empty());
    h.hello();
    let events = h.feed_closing("E unsupported_version\n", "b:2", "unsupported_version");
    let until = backoffs(&events)
        .into_iter()
        .find(|(cause, _)| *cause == BackoffCause::UnsupportedVersion)
        .map(|(_, until)| until)
        .expect("a backoff");
    // The first step of 1 s, with equal jitter.
    assert!(until >= t(500) && until <= t(1_000), "{until}");
}

#[test]
fn renew_until_ends_automatic_renewal_with_no_jeopardy_after_it() {
    let (mut h, _) = ready(4);
    let op = h.acquire_renewing("k", 0, 3_000, Some(2_500));
    assert_eq!(h.take_sent(), "A 1 k o 0 3000\n");
    let g = h.granted_by(op, "G 1 A k 7 3000 0\n");
    h.at_ms(1_000);
    assert_eq!(h.take_sent(), "X 2 k 7 3000\n");
    h.feed("G 2 X k 7 3000\n");
    h.at_ms(2_000);
    assert_eq!(
        h.take_sent(),
        "X 3 k 7 3000\n",
        "before the limit: the whole lease"
    );
    h.at_ms(2_010);
    h.feed("G 3 X k 7 3000\n");
    assert_eq!(h.client.valid_until(&g), Some(t(5_000)));
    // The limit passes at 2500: no renewal at 3000, no jeopardy at 4000.
    h.at_ms(4_900);
    assert_eq!(h.take_sent(), "");
    assert_eq!(
        renewal_notices(&h.take_events()),
        [
            ("renewed", 7, Some(t(4_000))),
            ("renewed", 7, Some(t(5_000)))
        ]
    );
    assert_eq!(h.next_deadline(), t(5_000));
    assert_eq!(renewal_notices(&h.take_events()), [("expired", 7, None)]);
}

#[test]
fn auto_renew_can_start_and_stop_for_a_held_grant() {
    let (mut h, g) = holding(false);
    h.at_ms(500);
    h.client.auto_renew(h.now, &g, None).expect("accepted");
    h.pump();
    assert_eq!(h.client.poll_timeout(), Some(t(1_000)));
    h.at_ms(1_000);
    assert_eq!(h.take_sent(), "X 2 k 7 3000\n");
    h.feed("G 2 X k 7 3000\n");
    h.client.stop_renewing(h.now, &g).expect("accepted");
    h.pump();
    h.at_ms(3_900);
    assert_eq!(h.take_sent(), "");
    assert_eq!(
        renewal_notices(&h.take_events()),
        [("renewed", 7, Some(t(4_000)))],
        "no jeopardy once stopped"
    );
}

#[test]
fn a_g_that_waited_longer_than_asked_or_does_not_say_is_a_bad_answer() {
    for (answer, reason) in [
        ("G 1 A k 7 3000 1001\n", "protocol:waited_above_asked"),
        ("G 1 A k 7 3000\n", "protocol:waited_missing"),
    ] {
        let (mut h, _) = ready(4);
        let acquire = h.acquire_in_flight(1, "k", 1_000, 3_000);
        h.at_ms(20);
        let events = h.feed_closing(answer, "a:1", reason);
        // Treated as sent and unanswered; its token released.
        assert_eq!(outcomes(&events), acquire.in_doubt_at(20));
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::OrphanRelease { key, token: 7 } if key.as_str() == "k")));
    }
}

#[test]
fn an_expired_grants_release_deadline_counts_from_its_latest_renewal() {
    let (mut h, g) = renewal_in_flight(2_900, None);
    // expires_by from the grant: 0 + 3000 + the 1 s margin = 4000.
    assert_eq!(g.expires_by(), t(4_000));
    h.at_ms(2_950);
    h.transport_closed(TransportEnd::Eof);
    h.at_ms(3_100);
    h.release(&g);
    // No connection until 5000: past the grant's expires_by, but the
    // renewal may have extended it to 2900 + 3000 + 1000.
    h.refuse_connects_until(t(5_000));
    assert!(h.take_outcomes().is_empty(), "not lapsed");
    h.reconnect(4);
    assert_eq!(h.take_sent(), "R 3 k 7\n");
}

#[test]
fn a_release_after_the_deadline_its_latest_renewal_allows_ends_lapsed_at_once() {
    // A short renewal, never answered within its answer grace (5 s): the
    // grant's release deadline becomes 10 + 30 + the 1 s margin, but the
    // grant's own expires_by (4000) is later. Both pass with the renewal
    // still in flight: the server has certainly freed the grant.
    let (mut h, g) = expired_with_a_short_renewal_in_flight();
    let op = h.release(&g);
    assert_eq!(h.take_outcomes(), [(op, Outcome::Lapsed)], "at once");
    assert_eq!(h.take_sent(), "", "no attempt after its deadline");
    // The renewal's answer is still claimed, and changes nothing.
    h.feed("G 2 X k 7 30\n");
    assert_eq!(h.take_events(), []);
    assert_eq!(h.take_sent(), "");
}

#[test]
fn an_n_to_a_renewal_after_the_grants_expires_by_leaves_no_deadline_behind() {
    // Past valid_until (3000) and expires_by (4000), within the renewal's
    // answer grace (5 s): the record is kept only for that answer.
    let (mut h, g) = expired_with_a_short_renewal_in_flight();
    h.feed("N 2 X k\n");
    assert_eq!(renewal_notices(&h.take_events()), [("lost", 7, None)]);
    // Nothing is left due in the past: the client is idle until input.
    assert!(
        h.client.poll_timeout().map_or(true, |at| at > h.now),
        "a deadline at {:?}, now {}",
        h.client.poll_timeout(),
        h.now
    );
    // The server has freed it: a release ends at once, with no request.
    let op = h.release(&g);
    assert_eq!(h.take_outcomes(), [(op, Outcome::Lapsed)]);
    assert_eq!(h.take_sent(), "");
}

#[test]
fn automatic_renewal_is_due_the_first_nanosecond_less_than_two_thirds_of_the_lease_is_left() {
    // A lease of 200 ms is 200,000,000 ns, whose two thirds are
    // 133,333,333.3 ns: from valid_until - 133,333,333 ns on, less than two
    // thirds is left (a third of the way through is 66,666,666.7 ns after
    // the send, so 66,666,667 ns). Not one nanosecond later.
    let (mut h, _) = ready(4);
    let op = h.acquire_renewing("k", 0, 200, None);
    assert_eq!(h.take_sent(), "A 1 k o 0 200\n");
    let g = h.granted_by(op, "G 1 A k 7 200 0\n");
    assert_eq!(g.valid_until(), t(200));
    let due = Time::from_nanos(66_666_667);
    assert_eq!(h.client.poll_timeout(), Some(due));
    h.at(Time::from_nanos(66_666_666));
    assert_eq!(
        h.take_sent(),
        "",
        "133,333,334 ns left: not less than two thirds"
    );
    h.at(due);
    assert_eq!(h.take_sent(), "X 2 k 7 200\n");
    // Jeopardy: from the first nanosecond less than a third is left
    // (66,666,666.7 ns before valid_until, so at 133,333,334 ns).
    h.at(Time::from_nanos(133_333_333));
    assert_eq!(renewal_notices(&h.take_events()), []);
    h.at(Time::from_nanos(133_333_334));
    assert_eq!(
        renewal_notices(&h.take_events()),
        [("jeopardy", 7, Some(t(200)))]
    );
}

#[test]
fn a_queued_release_that_lapses_with_its_renewal_in_flight_is_never_sent_and_the_answer_is_claimed()
{
    // Window 2 (one slot reserved): the renewal of k and an acquire fill it,
    // so the release of k waits in the lane until its deadline passes.
    let (mut h, _) = ready(2);
    let op = h.acquire("k", 0, 1_000);
    assert_eq!(h.take_sent(), "A 1 k o 0 1000\n");
    let g = h.granted_by(op, "G 1 A k 7 1000 0\n");
    h.at_ms(100);
    h.renew(&g, None);
    assert_eq!(h.take_sent(), "X 2 k 7 1000\n");
    let j = h.acquire("j", 10_000, 5_000);
    assert_eq!(h.take_sent(), "A 3 j o 10000 5000\n");
    h.at_ms(200);
    let r = h.release(&g);
    assert_eq!(h.take_sent(), "", "the window is full");
    // Its deadline: the renewal's send time plus its lease plus the margin.
    h.ends_at(2_100, &[(r, Outcome::Lapsed)]);
    // A slot frees: the lapsed release is not sent.
    h.at_ms(2_200);
    h.feed("T 3 A j\n");
    assert_eq!(
        h.take_outcomes(),
        [(
            j,
            Outcome::TimedOut {
                sent: true,
                cause: None
            }
        )]
    );
    assert_eq!(h.take_sent(), "");
    // The renewal's answer is claimed and changes nothing.
    h.feed("G 2 X k 7 1000\n");
    let events = h.take_events();
    assert_eq!(renewal_notices(&events), [], "{events:?}");
    assert!(closed(&events).is_empty(), "{events:?}");
    assert_eq!(h.take_sent(), "");
    assert_eq!(in_flight(&h.client), (0, 0));
}

#[test]
fn a_queued_automatic_renewal_is_dropped_when_renew_until_passes_or_renewing_stops() {
    for stop in [false, true] {
        // Window 2 (one slot reserved): an acquire and a release fill it, so
        // the renewal due at 1000 waits in the lane.
        let (mut h, _) = ready(2);
        let limit = if stop { None } else { Some(1_500) };
        let op = h.acquire_renewing("k", 0, 3_000, limit);
        let g = h.granted_by(op, "G 1 A k 7 3000 0\n");
        let j = h.acquire("j", 10_000, 5_000);
        let r = h.release_token("z", 9);
        assert_eq!(
            h.take_sent(),
            "A 1 k o 0 3000\nA 2 j o 10000 5000\nR 3 z 9\n"
        );
        h.at_ms(1_000);
        assert_eq!(h.take_sent(), "", "the window is full");
        if stop {
            h.at_ms(1_100);
            h.client.stop_renewing(h.now, &g).expect("accepted");
            h.pump();
        }
        // renew_until (1500) has passed, or renewing stopped: when a slot
        // frees, the queued renewal is not sent.
        h.at_ms(1_600);
        h.feed("D 3 R z\n");
        assert_eq!(h.take_outcomes(), vec![(r, Outcome::Released)]);
        assert_eq!(h.take_sent(), "", "stop: {stop}");
        h.at_ms(2_999);
        assert_eq!(h.take_sent(), "", "stop: {stop}");
        assert_eq!(h.client.valid_until(&g), Some(t(3_000)));
        h.feed("T 2 A j\n");
        assert_eq!(
            h.take_outcomes(),
            vec![(
                j,
                Outcome::TimedOut {
                    sent: true,
                    cause: None
                }
            )]
        );
        assert_eq!(h.take_sent(), "", "stop: {stop}");
    }
}

#[test]
fn a_renewal_that_proves_no_later_valid_until_keeps_the_schedule_of_the_lease_that_set_it() {
    // Renewed automatically: lease 3000 ms, valid until 3000, due at 1000.
    let (mut h, g) = holding(true);
    h.at_ms(500);
    h.renew(&g, Some(2_500));
    assert_eq!(h.take_sent(), "X 2 k 7 2500\n");
    h.at_ms(600);
    h.feed("G 2 X k 7 2500\n");
    // 500 + 2500 is the valid_until the grant already had: the G that set
    // it gave 3000 ms, so a third of the way through is still at 1000.
    assert_eq!(
        renewal_notices(&h.take_events()),
        [("renewed", 7, Some(t(3_000)))]
    );
    h.at_ms(999);
    assert_eq!(h.take_sent(), "");
    h.at_ms(1_000);
    assert_eq!(h.take_sent(), "X 3 k 7 3000\n");
}

#[test]
fn automatic_renewals_in_flight_at_a_close_go_again_first_in_their_order() {
    let (mut h, _) = ready(8);
    let a = h.acquire_renewing("ka", 0, 3_000, None);
    h.granted_by(a, "G 1 A ka 7 3000 0\n");
    h.at_ms(100);
    let b = h.acquire_renewing("kb", 0, 3_000, None);
    h.granted_by(b, "G 2 A kb 8 3000 0\n");
    h.at_ms(1_000);
    h.at_ms(1_100);
    assert_eq!(
        h.take_sent(),
        "A 1 ka o 0 3000\nA 2 kb o 0 3000\nX 3 ka 7 3000\nX 4 kb 8 3000\n"
    );
    h.at_ms(1_200);
    h.transport_closed(TransportEnd::Eof);
    h.reconnect(8);
    assert!(h.now < t(3_000));
    assert_eq!(h.take_sent(), "X 5 ka 7 3000\nX 6 kb 8 3000\n");
}

/// Timers due at one instant fire in one fixed order, whatever they are
/// of: an acquire's answer deadline before a held grant's expiry, so the
/// same inputs give the same events in the same order. Both fall at 5000
/// here: the try-lock's 5 s answer grace, and the grant's 5 s lease.
#[test]
fn an_acquire_deadline_fires_before_an_expiry_at_the_same_instant() {
    let (mut h, _) = ready(8);
    let held = h.acquire("g", 0, 5_000);
    let unanswered = h.acquire("a", 0, 60_000);
    assert_eq!(h.take_sent(), "A 1 g o 0 5000\nA 2 a o 0 60000\n");
    let g = h.granted_by(held, "G 1 A g 7 5000 0\n");
    assert_eq!(g.valid_until(), t(5_000));
    h.take_events();
    h.at_ms(5_000);
    let events = h.take_events();
    let timed_out = events.iter().position(|e| {
        matches!(e, Event::Outcome { op, outcome: Outcome::Indeterminate { .. } } if *op == unanswered)
    });
    let expired = events
        .iter()
        .position(|e| matches!(e, Event::LeaseExpired { token: 7, .. }));
    match (timed_out, expired) {
        (Some(timed_out), Some(expired)) => assert!(timed_out < expired, "{events:?}"),
        _ => panic!("both are due at 5000: {events:?}"),
    }
}
