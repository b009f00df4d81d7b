//! `Client::stats` (issue 14): every counter moves when its event happens,
//! through the core alone.

mod support;

use support::*;
use ticketing::client::{CancelPolicy, ClientStats, Outcome, TransportEnd};

fn stats(h: &Harness) -> ClientStats {
    h.client.stats()
}

#[test]
fn acquires_are_counted_by_outcome_and_indeterminate_ones_by_cause() {
    let (mut h, _) = ready(8);
    let granted = h.acquire("a", 1_000, 5_000);
    h.acquire("b", 0, 5_000);
    h.acquire("c", 0, 5_000);
    assert_eq!(
        h.take_sent(),
        "A 1 a o 1000 5000\nA 2 b o 0 5000\nA 3 c o 0 5000\n"
    );
    let s = stats(&h);
    assert_eq!(
        (s.acquires_started, s.in_flight, s.acquires_in_flight),
        (3, 3, 3)
    );
    assert_eq!((s.acquires_open, s.held), (3, 0));
    h.at_ms(300);
    let grant = h.granted_by(granted, "G 1 A a 7 5000 250\n");
    h.feed("T 2 A b\nB 3 A c\n");
    let s = stats(&h);
    assert_eq!(s.acquires.granted, 1);
    assert_eq!(s.acquires.timed_out, 1);
    assert_eq!(s.acquires.busy, 1, "a B with no budget left");
    assert_eq!((s.held, s.acquires_open, s.in_flight), (1, 0, 0));
    assert_eq!(s.grant_wait.count, 1);
    assert_eq!(s.grant_wait.buckets[8], 1, "250 ms is in [128, 256)");
    // Cancelled before it was sent: nothing was asked.
    let mut c = config();
    c.cancel = CancelPolicy::Close;
    let (mut h2, _) = ready_with(c, 2);
    h2.acquire("x", 60_000, 5_000);
    h2.acquire("y", 60_000, 5_000);
    let queued = h2.acquire("z", 60_000, 5_000);
    assert_eq!(
        stats(&h2).acquires_queued,
        2,
        "one acquire in a window of two"
    );
    h2.cancel(queued);
    assert_eq!(stats(&h2).acquires.cancelled, 1);

    // Indeterminate: by a close, by a cancel, by an answer timeout.
    h.acquire("d", 60_000, 5_000);
    h.take_sent();
    h.transport_closed(TransportEnd::Eof);
    assert_eq!(stats(&h).indeterminate.close, 1);
    h.reconnect(8);
    let sent = h.acquire("e", 60_000, 5_000);
    h.take_sent();
    h.cancel(sent);
    assert_eq!(stats(&h).indeterminate.cancel, 1);
    h.reconnect(8);
    h.acquire("f", 0, 5_000);
    h.take_sent();
    // Its deadline: wait 0 plus the answer grace (5 s).
    h.at(h.now.saturating_add(ms(5_000)));
    let s = stats(&h);
    assert_eq!(s.indeterminate.answer_timeout, 1);
    assert_eq!(s.acquires.indeterminate, 3);
    assert_eq!(s.closes.eof, 1);
    assert_eq!(s.closes.cancel, 1);
    assert_eq!(s.closes.answer_timeout, 1);
    h.release(&grant);
}

#[test]
fn releases_orphans_and_the_lease_left_are_counted() {
    let (mut h, _) = ready(8);
    let op = h.acquire("k", 0, 5_000);
    let grant = h.granted_by(op, "G 1 A k 7 5000 0\n");
    h.at_ms(1_000);
    h.release(&grant);
    h.release_token("k", 99);
    assert_eq!(h.take_sent(), "A 1 k o 0 5000\nR 2 k 7\nR 3 k 99\n");
    let s = stats(&h);
    assert_eq!((s.releases_started, s.releases_open), (2, 2));
    assert_eq!(s.lease_left_at_release.count, 1);
    assert_eq!(
        s.lease_left_at_release.max_ms, 4_000,
        "valid until 5 s, released at 1 s"
    );
    h.feed("D 2 R k\nN 3 R k\n");
    let s = stats(&h);
    assert_eq!((s.releases.released, s.releases.not_held), (1, 1));
    // A raw release that never gets through lapses at its horizon.
    h.release_token("gone", 1);
    h.take_sent();
    h.transport_closed(TransportEnd::Eof);
    h.refuse_connects_until(h.now.saturating_add(ms(61_000)));
    assert_eq!(stats(&h).releases.lapsed, 1);
    h.reconnect(8);
    // A G nobody asked for: released by its token, and settled.
    h.feed("G 77 A m 5 5000 0\n");
    assert_eq!(stats(&h).orphan_releases, 1);
    assert_eq!(stats(&h).closes.protocol, 1);
    h.reconnect(8);
    let sent = h.take_sent();
    let id: u64 = sent
        .lines()
        .find(|l| l.starts_with("R "))
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|id| id.parse().ok())
        .expect("the orphan's release");
    h.feed(&format!("D {id} R m\n"));
    assert_eq!(stats(&h).orphans.released, 1);
}

#[test]
fn renewals_are_counted_sent_renewed_lost_in_jeopardy_and_expired() {
    let (mut h, _) = ready(8);
    let op = h.acquire_renewing("k", 0, 3_000, None);
    h.granted_by(op, "G 1 A k 7 3000 0\n");
    h.at_ms(1_000);
    h.feed("G 2 X k 7 3000\n");
    let s = stats(&h);
    assert_eq!((s.renewals.sent, s.renewals.renewed), (1, 1));
    // Unanswered: jeopardy, then expiry.
    h.at_ms(2_000);
    h.at_ms(3_000);
    h.at_ms(4_000);
    let s = stats(&h);
    assert_eq!(s.renewals.sent, 2);
    assert_eq!((s.renewals.jeopardy, s.renewals.expired), (1, 1));
    // The late answer to the last one is claimed; another grant's
    // renewal is answered N.
    h.feed("G 3 X k 7 3000\n");
    let op = h.acquire_renewing("m", 0, 3_000, None);
    assert_eq!(
        h.take_sent(),
        "A 1 k o 0 3000\nX 2 k 7 3000\nX 3 k 7 3000\nA 4 m o 0 3000\n"
    );
    h.granted_by(op, "G 4 A m 8 3000 0\n");
    h.at_ms(5_000);
    assert_eq!(h.take_sent(), "X 5 m 8 3000\n");
    h.feed("N 5 X m\n");
    let s = stats(&h);
    assert_eq!(
        (s.renewals.sent, s.renewals.renewed, s.renewals.lost),
        (3, 1, 1)
    );
    assert_eq!(s.renewals_queued, 0);
}

#[test]
fn connections_closes_backoffs_and_hints_are_counted() {
    let mut h = Harness::new(config());
    assert_eq!(stats(&h).connects, 1);
    // A round: both endpoints refuse, then one backoff.
    h.fail_connect();
    h.fail_connect();
    let s = stats(&h);
    assert_eq!((s.closes.connect_failed, s.backoffs.transport), (2, 1));
    h.reconnect(4);
    assert_eq!((stats(&h).connects, stats(&h).connected), (3, 1));
    h.feed("L b:2\nL evil:1\n");
    let s = stats(&h);
    assert_eq!((s.hints_taken, s.hints_ignored), (1, 1));
    h.feed("E no_leader\n");
    let s = stats(&h);
    assert_eq!((s.closes.no_leader, s.backoffs.no_leader), (1, 1));
    h.reconnect(4);
    h.feed("E unsupported_version\n");
    let s = stats(&h);
    assert_eq!(
        (s.closes.unsupported_version, s.backoffs.unsupported_version),
        (1, 1)
    );
}

#[test]
fn releases_that_end_at_once_are_counted_as_started_too() {
    // A release of a lost grant (its renewal answered N) ends NotHeld at
    // once, one of a grant past its expires_by ends Lapsed at once: both
    // are releases the embedder started, though nothing is sent.
    let (mut h, _) = ready(8);
    let a = h.acquire("a", 0, 1_000);
    let b = h.acquire("b", 0, 1_000);
    let ga = h.granted_by(a, "G 1 A a 7 1000 0\n");
    let gb = h.granted_by(b, "G 2 A b 8 1000 0\n");
    h.renew(&gb, None);
    assert_eq!(
        h.take_sent(),
        "A 1 a o 0 1000\nA 2 b o 0 1000\nX 3 b 8 1000\n"
    );
    h.feed("N 3 X b\n");
    let rb = h.release(&gb);
    assert_eq!(h.take_outcomes(), vec![(rb, Outcome::NotHeld)]);
    let s = stats(&h);
    assert_eq!(
        (s.releases_started, s.releases.not_held, s.releases_open),
        (1, 1, 0)
    );
    // a's expires_by: granted at 0, lease 1000, margin 1000.
    assert_eq!(ga.expires_by(), t(2_000));
    h.at_ms(2_000);
    h.take_events();
    let ra = h.release(&ga);
    assert_eq!(h.take_outcomes(), vec![(ra, Outcome::Lapsed)]);
    let s = stats(&h);
    assert_eq!(
        (s.releases_started, s.releases.lapsed, s.releases_open),
        (2, 1, 0)
    );
    assert_eq!(h.take_sent(), "", "nothing to ask");
}
