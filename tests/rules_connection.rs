//! Scenario tests for the CONNECTION rules of PROTOCOL.md section 5: the
//! handshake, leader hints (`L`, `M`), the `E` reasons, framing errors and
//! over-long lines, backing off, where the next connection goes, the
//! transport ending, and the answer grace of a sent release.
//!
//! Every test drives one client core with bytes and times and asserts both
//! the outcomes and the exact bytes the client sent. Closed reasons are
//! checked through their `Display` strings, as CLI.md lists them.

mod support;

use std::time::Duration;

use support::*;
use ticketing::client::{Action, BackoffCause, Config, ConnId, Event, Outcome, TransportEnd};
use ticketing::Time;

// ----- helpers ------------------------------------------------------------

/// The one backoff among `events`, with its cause.
fn the_backoff(events: &[Event], cause: BackoffCause) -> Time {
    match backoffs(events).as_slice() {
        [(c, until)] if *c == cause => *until,
        other => panic!("expected one {cause:?} backoff, got {other:?} in {events:?}"),
    }
}

/// Addresses of `LeaderHint` and `HintIgnored` events.
fn hints(events: &[Event]) -> (Vec<String>, Vec<String>) {
    let mut taken = Vec::new();
    let mut ignored = Vec::new();
    for e in events {
        match e {
            Event::LeaderHint { addr } => taken.push(addr.to_string()),
            Event::HintIgnored { addr } => ignored.push(addr.to_string()),
            _ => {}
        }
    }
    (taken, ignored)
}

fn one_closed(addr: &str, reason: &str) -> Vec<(String, String)> {
    vec![(addr.to_string(), reason.to_string())]
}

/// The step `d` of the `n`-th delay in a row: `min(cap, base * 2^n)`.
fn step(base_ms: u64, cap_ms: u64, n: u32) -> Duration {
    ms(base_ms.saturating_mul(1u64 << n.min(40)).min(cap_ms))
}

/// Asserts that a delay from `from` to `until` lies in `[d/2, d]`.
fn assert_jittered(from: Time, until: Time, d: Duration, what: &str) {
    let delay = until.saturating_duration_since(from);
    assert!(
        delay >= d / 2 && delay <= d,
        "{what}: delay {delay:?} outside [{:?}, {d:?}]",
        d / 2
    );
}

/// Waits out a backoff ending at `until`: nothing happens just before it,
/// and at `until` a `Connect` to `addr` is handed out. Returns its id.
fn reconnect_at(h: &mut Harness, until: Time, addr: &str) -> ConnId {
    let mark = h.actions.len();
    h.at(Time::from_nanos(until.as_nanos() - 1));
    assert!(
        connects(h, mark).is_empty(),
        "connected before the backoff ended"
    );
    h.at(until);
    match connects(h, mark).as_slice() {
        [(conn, to)] => {
            assert_eq!(to, &ep(addr));
            *conn
        }
        other => panic!("expected one connect to {addr}, got {other:?}"),
    }
}

/// The one `Connect` handed out since `actions[mark]`, with no time
/// passing, which must go to `addr`. Returns its connection.
#[track_caller]
fn connect_at_once(h: &Harness, mark: usize, addr: &str) -> ConnId {
    match connects(h, mark).as_slice() {
        [(conn, to)] => {
            assert_eq!(to, &ep(addr), "the connect at once");
            *conn
        }
        other => panic!("expected one connect to {addr} at once, got {other:?}"),
    }
}

/// Endpoints `a:1`, `b:2`, `c:3`; otherwise as [`config`].
fn config3() -> Config {
    let mut c = config();
    c.endpoints.push(ep("c:3"));
    c
}

/// A harness on [`config3`] whose first connection, to `a:1`, named `c:3`
/// the leader (`L c:3`) and then ended: the backoff is waited out and the
/// next connection, to the hint, is handed out but not yet connected.
/// Returns that connection.
#[track_caller]
fn connecting_to_the_hint() -> (Harness, ConnId) {
    let (mut h, _) = ready_with(config3(), 4);
    h.feed("L c:3\n");
    h.transport_closed(TransportEnd::Eof);
    let until = the_backoff(&h.take_events(), BackoffCause::Transport);
    let conn = reconnect_at(&mut h, until, "c:3");
    (h, conn)
}

// ----- the handshake ------------------------------------------------------

#[test]
fn nothing_is_sent_before_w_and_h_is_the_only_frame() {
    let mut h = Harness::new(config());
    let first = connects(&h, 0);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].1, ep("a:1"));
    // Submitted before any connection.
    let acquire = h.acquire("k", 1_000, 5_000);
    let release = h.release_token("k", 5);
    assert_eq!(h.take_sent(), "");

    h.at_ms(10);
    h.connect();
    assert_eq!(h.take_sent(), "H 2 c1 -\n");
    // A hint before W is allowed; it sends nothing either.
    h.at_ms(20);
    h.feed("L b:2\n");
    assert_eq!(h.take_sent(), "");
    h.at_ms(29);
    assert_eq!(h.take_sent(), "");
    assert_eq!(in_flight(&h.client), (0, 0));

    h.at_ms(30);
    h.feed("W node-1 4\n");
    // Releases first, then the acquire with what is left of its budget.
    assert_eq!(h.take_sent(), "R 1 k 5\nA 2 k o 970 5000\n");
    let events = h.take_events();
    assert!(events.contains(&Event::Connected {
        addr: ep("a:1"),
        node: name("node-1"),
        window: 4,
    }));
    assert_eq!(h.client.window(), Some(4));
    assert_eq!(h.client.node(), Some(&name("node-1")));
    h.feed("D 1 R k\nT 2 A k\n");
    assert_eq!(
        h.take_outcomes(),
        vec![
            (release, Outcome::Released),
            (
                acquire,
                Outcome::TimedOut {
                    sent: true,
                    cause: None
                }
            )
        ]
    );
}

#[test]
fn poll_timeout_is_now_while_the_hello_waits_to_go_out() {
    // A driver may sleep until `poll_timeout`: once the transport is up,
    // `H` is due at once, not at the handshake timeout.
    let mut h = Harness::new(config());
    h.at_ms(10);
    let (conn, _) = h.last_connect().expect("a connect");
    h.client.handle_connected(t(10), conn);
    assert_eq!(h.client.poll_timeout(), Some(t(10)), "H is due");
    h.pump();
    assert_eq!(h.take_sent(), "H 2 c1 -\n");
    // H is out: only the handshake timeout is left to wake for.
    assert_eq!(h.client.poll_timeout(), Some(t(10 + 5_000)));
}

#[test]
fn the_handshake_is_h_2_client_id_and_credential_or_a_dash() {
    let mut c = config();
    c.client_id = name("svc-7");
    let mut h = Harness::new(c.clone());
    h.connect();
    assert_eq!(h.take_sent(), "H 2 svc-7 -\n");

    c.credential = Some(name("s3cret"));
    let mut h = Harness::new(c);
    h.connect();
    assert_eq!(h.take_sent(), "H 2 svc-7 s3cret\n");
    // H goes out once per connection, never again.
    h.feed("L a:1\n");
    h.at_ms(100);
    assert_eq!(h.take_sent(), "");
}

// ----- L and M: leader hints ---------------------------------------------

#[test]
fn l_allowlisted_becomes_the_hint_and_keeps_the_connection() {
    let (mut h, conn) = ready_with(config3(), 4);
    let mark = h.actions.len();
    h.at_ms(10);
    h.feed("L c:3\n");
    let events = h.take_events();
    assert_eq!(hints(&events), (vec!["c:3".to_string()], vec![]));
    assert!(closed(&events).is_empty());
    assert_eq!(close_actions(&h, mark), vec![]);
    assert_eq!(h.client.connection(), Some(conn));
    assert_eq!(h.client.leader_hint(), Some(&ep("c:3")));
    // The connection still carries requests.
    let op = h.acquire("k", 0, 5_000);
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

    // The next connection goes to the hint, not to b:2 (next in turn).
    h.transport_closed(TransportEnd::Eof);
    let until = the_backoff(&h.take_events(), BackoffCause::Transport);
    reconnect_at(&mut h, until, "c:3");
}

#[test]
fn hints_that_change_nothing_are_not_told_again() {
    let (mut h, conn) = ready_with(config3(), 4);
    h.at_ms(10);
    // A flood: the same hint, and the same refused address, again and again.
    let mut flood = String::new();
    for _ in 0..1_000 {
        flood.push_str("L c:3\nL evil:9\n");
    }
    h.feed(&flood);
    let events = h.take_events();
    assert_eq!(
        hints(&events),
        (vec!["c:3".to_string()], vec!["evil:9".to_string()])
    );
    // Another address is news, each time it changes.
    h.feed("L b:2\nL c:3\nL other:1\nL evil:9\nL evil:9\n");
    let events = h.take_events();
    assert_eq!(
        hints(&events),
        (
            vec!["b:2".to_string(), "c:3".to_string()],
            vec!["other:1".to_string(), "evil:9".to_string()]
        )
    );
    assert_eq!(h.client.connection(), Some(conn));
    assert_eq!(h.client.leader_hint(), Some(&ep("c:3")));
    // On the next connection, a refused address is told again once.
    h.transport_closed(TransportEnd::Eof);
    let until = the_backoff(&h.take_events(), BackoffCause::Transport);
    reconnect_at(&mut h, until, "c:3");
    h.ready(4);
    h.take_events();
    h.feed("L evil:9\nL evil:9\nL c:3\n");
    assert_eq!(
        hints(&h.take_events()),
        (vec![], vec!["evil:9".to_string()])
    );
}

#[test]
fn l_not_allowlisted_is_ignored_and_changes_nothing() {
    let (mut h, conn) = ready_with(config3(), 4);
    h.feed("L evil:666\n");
    let events = h.take_events();
    assert_eq!(hints(&events), (vec![], vec!["evil:666".to_string()]));
    assert!(closed(&events).is_empty());
    assert_eq!(h.client.leader_hint(), None);
    assert_eq!(h.client.connection(), Some(conn));

    // An existing hint survives an ignored one (told once per connection).
    h.feed("L c:3\nL evil:666\n");
    let events = h.take_events();
    assert_eq!(hints(&events), (vec!["c:3".to_string()], vec![]));
    assert_eq!(h.client.leader_hint(), Some(&ep("c:3")));
    assert_eq!(h.client.connection(), Some(conn));
    assert_eq!(h.take_sent(), "");
}

#[test]
fn m_allowlisted_after_w_closes_as_moved_and_follows_the_hint_after_the_first_step() {
    // A leader that stops leading tells its clients `M`: the connection had
    // its `W`, so the next round begins after the first step's delay (all
    // of the old leader's clients must not come at once), and starts with
    // the hint.
    let (mut h, _) = ready_with(config3(), 4);
    let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);

    h.at_ms(40);
    let events = h.feed_closing("M c:3\n", "a:1", "moved");
    assert_eq!(hints(&events), (vec!["c:3".to_string()], vec![]));
    // As for any close: the sent acquire is Indeterminate.
    assert_eq!(outcomes(&events), acquire.in_doubt_at(40));
    let until = the_backoff(&events, BackoffCause::Redirect);
    assert_jittered(h.now, until, step(50, 2_000, 0), "after W");
    let new = reconnect_at(&mut h, until, "c:3");
    assert_eq!(h.client.connection(), Some(new));
    h.ready(4);
    assert_eq!(h.take_sent(), "", "a sent acquire is never resent");
}

#[test]
fn m_allowlisted_during_the_handshake_follows_the_hint_at_once() {
    let mut h = Harness::new(config3());
    h.hello();
    let mark = h.actions.len();
    let events = h.feed_closing("M c:3\n", "a:1", "moved");
    assert_eq!(hints(&events), (vec!["c:3".to_string()], vec![]));
    assert!(backoffs(&events).is_empty(), "inside a round: at once");
    connect_at_once(&h, mark, "c:3");
}

#[test]
fn m_not_allowlisted_closes_and_goes_to_the_next_endpoint() {
    // During the handshake: the round goes on at once.
    let mut h = Harness::new(config3());
    h.hello();
    let mark = h.actions.len();
    let events = h.feed_closing("M evil:666\n", "a:1", "moved");
    assert_eq!(hints(&events), (vec![], vec!["evil:666".to_string()]));
    assert_eq!(h.client.leader_hint(), None);
    connect_at_once(&h, mark, "b:2");

    // After `W`: the next round, after the first step, at the next endpoint.
    let (mut h, _) = ready_with(config3(), 4);
    h.at_ms(40);
    let events = h.feed_closing("M evil:666\n", "a:1", "moved");
    assert_eq!(hints(&events), (vec![], vec!["evil:666".to_string()]));
    let until = the_backoff(&events, BackoffCause::Redirect);
    reconnect_at(&mut h, until, "b:2");
}

#[test]
fn m_not_allowlisted_from_the_hinted_node_forgets_that_hint() {
    // The hinted node says it does not lead, and names an address the
    // client may not go to. Going back to the hint would ask the same node
    // again; a demanding user expects the client to move on to the next
    // endpoint, as it does when the hint refuses with `E not_active`.
    let (mut h, _) = connecting_to_the_hint();
    h.hello();
    let mark = h.actions.len();
    h.feed_closing("M evil:666\n", "c:3", "moved");
    assert_eq!(h.client.leader_hint(), None);
    connect_at_once(&h, mark, "b:2");
}

#[test]
fn config_allow_extends_the_allowlist() {
    let mut c = config();
    c.allow = vec![ep("x:9")];
    let (mut h, conn) = ready_with(c, 4);
    h.feed("L x:9\n");
    assert_eq!(hints(&h.take_events()), (vec!["x:9".to_string()], vec![]));
    assert_eq!(h.client.leader_hint(), Some(&ep("x:9")));
    assert_eq!(h.client.connection(), Some(conn));

    let events = h.feed_closing("M x:9\n", "a:1", "moved");
    let until = the_backoff(&events, BackoffCause::Redirect);
    reconnect_at(&mut h, until, "x:9");

    // Without the extra entry the same address is refused.
    let (mut h, _) = ready(4);
    h.feed("L x:9\n");
    assert_eq!(hints(&h.take_events()), (vec![], vec!["x:9".to_string()]));
}

// ----- E -----------------------------------------------------------------

#[test]
fn e_no_leader_forgets_the_hint_and_backs_off_short() {
    let (mut h, _) = ready_with(config3(), 4);
    h.feed("L c:3\n");
    let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);
    h.take_events();

    h.at_ms(100);
    let events = h.feed_closing("E no_leader\n", "a:1", "no_leader");
    assert_eq!(outcomes(&events), acquire.in_doubt_at(100));
    assert_eq!(h.client.leader_hint(), None);
    // The connection had its `W`: the first step before the next round.
    let until = the_backoff(&events, BackoffCause::NoLeader);
    assert_jittered(h.now, until, step(50, 2_000, 0), "no_leader after W");
    // The hint is gone: the next endpoint in turn.
    reconnect_at(&mut h, until, "b:2");

    // Every node says no_leader, round after round: inside a round the
    // next node at once; between rounds 50 ms doubling up to 2 s.
    let mut turn = ["b:2", "c:3", "a:1"].iter().cycle();
    for k in 2..=8u32 {
        for at_once in [true, true, false] {
            let addr = turn.next().unwrap();
            assert_eq!(h.last_connect().unwrap().1, ep(addr));
            h.hello();
            let mark = h.actions.len();
            let events = h.feed_closing("E no_leader\n", addr, "no_leader");
            if at_once {
                assert!(backoffs(&events).is_empty(), "inside round {k}");
                assert_eq!(connects(&h, mark).len(), 1, "at once, round {k}");
            } else {
                let until = the_backoff(&events, BackoffCause::NoLeader);
                assert_jittered(h.now, until, step(50, 2_000, k - 1), "no_leader");
                reconnect_at(&mut h, until, "b:2");
            }
        }
    }
}

#[test]
fn e_not_active_moves_to_the_next_endpoint_with_its_backoff() {
    let mut h = Harness::new(config3());
    let turn = ["a:1", "b:2", "c:3"];
    for k in 1..=7u32 {
        for (i, addr) in turn.iter().enumerate() {
            assert_eq!(h.last_connect().unwrap().1, ep(addr), "round {k}");
            h.hello();
            let events = h.feed_closing("E not_active\n", addr, "not_active");
            if i < 2 {
                assert!(backoffs(&events).is_empty(), "the next address at once");
                continue;
            }
            let until = the_backoff(&events, BackoffCause::NotActive);
            // 200 ms doubling up to 5 s (reached at k=6).
            assert_jittered(h.now, until, step(200, 5_000, k - 1), "not_active");
            reconnect_at(&mut h, until, "a:1");
        }
    }
}

#[test]
fn e_auth_failed_tells_the_embedder_and_backs_off_long() {
    let mut c = config();
    c.credential = Some(name("wrong"));
    let mut h = Harness::new(c);
    for k in 1..=7u32 {
        for addr in ["a:1", "b:2"] {
            assert_eq!(h.last_connect().unwrap().1, ep(addr), "round {k}");
            h.connect();
            assert_eq!(h.take_sent(), "H 2 c1 wrong\n");
            let events = h.feed_closing("E auth_failed\n", addr, "auth_failed");
            assert!(events.contains(&Event::AuthFailed { addr: ep(addr) }));
            if addr == "a:1" {
                // Another node may accept: the round goes on.
                assert!(backoffs(&events).is_empty());
                continue;
            }
            // Every address refused: 1 s doubling up to 60 s (at k=7).
            let until = the_backoff(&events, BackoffCause::AuthFailed);
            assert_jittered(h.now, until, step(1_000, 60_000, k - 1), "auth_failed");
            reconnect_at(&mut h, until, "a:1");
        }
    }
}

#[test]
fn an_unknown_e_reason_closes_with_error_reason_and_the_transport_backoff() {
    let (mut h, _) = ready(4);
    let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);
    h.at_ms(10);
    let events = h.feed_closing("E window\n", "a:1", "error:window");
    assert_eq!(outcomes(&events), acquire.in_doubt_at(10));
    let until = the_backoff(&events, BackoffCause::Transport);
    assert_jittered(h.now, until, step(50, 5_000, 0), "transport");
    reconnect_at(&mut h, until, "b:2");

    // During the handshake too: the round goes on at once, and once every
    // address failed it is the second failed round in a row.
    h.connect();
    h.take_sent();
    let mark = h.actions.len();
    let events = h.feed_closing("E maintenance-window\n", "b:2", "error:maintenance-window");
    assert!(backoffs(&events).is_empty());
    connect_at_once(&h, mark, "a:1");
    h.connect();
    h.take_sent();
    let events = h.feed_closing("E maintenance-window\n", "a:1", "error:maintenance-window");
    let until = the_backoff(&events, BackoffCause::Transport);
    assert_jittered(h.now, until, step(50, 5_000, 1), "transport");
}

// ----- framing errors --------------------------------------------------------

/// One bad input per framing rule: `(code, bytes)`.
fn framing_cases() -> Vec<(&'static str, Vec<u8>)> {
    let case = |code, s: &str| (code, s.as_bytes().to_vec());
    vec![
        ("line_too_long", vec![b'x'; 1025]),
        case("carriage_return", "T 1 A k\r\n"),
        case("invalid_byte", "T 1 A k\x07\n"),
        case("invalid_byte", "T 1 A k\tj\n"),
        ("invalid_byte", b"T 1 A \xc3\xa9\n".to_vec()),
        case("empty_line", "\n"),
        case("empty_field", "T 1  A k\n"),
        case("empty_field", " T 1 A k\n"),
        case("empty_field", "T 1 A k \n"),
        case("unknown_kind", "X 1 A k\n"),
        case("unknown_kind", "TT 1 A k\n"),
        case("unknown_kind", "H 2 c1 -\n"),
        case("field_count", "T 1 A\n"),
        case("field_count", "G 1 A k 9\n"),
        case("field_count", "W node-1\n"),
        case("field_count", "L a:1 b:2\n"),
        (
            "atom_too_long",
            format!("T 1 A {}\n", "k".repeat(251)).into_bytes(),
        ),
        case("not_a_number", "T one A k\n"),
        case("not_a_number", "T -1 A k\n"),
        case("not_a_number", "G 1 A k 9 +5 0\n"),
        case("leading_zero", "T 01 A k\n"),
        case("leading_zero", "G 1 A k 09 5000 0\n"),
        case("overflow", "T 18446744073709551616 A k\n"),
        case("bad_op", "T 1 Y k\n"),
        case("bad_pairing", "T 1 X k\n"),
        case("bad_pairing", "G 1 R k 9 5000\n"),
        case("bad_pairing", "D 1 A k\n"),
        case("bad_pairing", "B 1 R k\n"),
        case("zero_lease", "G 1 A k 9 0 0\n"),
        case("window_too_small", "W node-1 1\n"),
        case("bad_address", "L nocolon\n"),
        case("bad_address", "M a:99999\n"),
    ]
}

#[test]
fn every_framing_error_closes_with_protocol_framing_code_and_applies_any_close() {
    for (code, bad) in framing_cases() {
        let want = format!("protocol:framing:{code}");
        // On a ready connection with an acquire in flight. A valid answer
        // behind the bad line must be ignored: the connection is done.
        let (mut h, _) = ready(4);
        let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);
        h.at_ms(20);
        let mut input = bad.clone();
        input.extend_from_slice(b"G 1 A k 9 5000 0\n");
        let events = h.feed_closing(&input, "a:1", &want);
        assert_eq!(
            outcomes(&events),
            acquire.in_doubt_at(20),
            "{want}: the sent acquire is Indeterminate"
        );
        let until = the_backoff(&events, BackoffCause::Transport);
        assert_jittered(h.now, until, step(50, 5_000, 0), &want);
        reconnect_at(&mut h, until, "b:2");
        h.ready(4);
        assert_eq!(h.take_sent(), "", "{want}: never resent");

        // During the handshake, with an acquire not yet sent: it stays
        // queued for the next connection, which the round makes at once.
        let mut h = Harness::new(config());
        let op = h.acquire("k", 10_000, 5_000);
        h.hello();
        h.at_ms(20);
        let mark = h.actions.len();
        let events = h.feed_closing(&bad, "a:1", &want);
        assert!(outcomes(&events).is_empty(), "{want}: {events:?}");
        assert!(backoffs(&events).is_empty(), "{want}: inside a round");
        connect_at_once(&h, mark, "b:2");
        let at = h.now;
        h.ready(4);
        let left = t(10_000).saturating_duration_since(at).as_millis();
        assert_eq!(h.take_sent(), format!("A 1 k o {left} 5000\n"), "{want}");
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
    }
}

#[test]
fn an_over_long_line_closes_as_soon_as_byte_1025_arrives() {
    let (mut h, conn) = ready(4);
    let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);
    // 1024 bytes without a newline, in two chunks: not yet an error (a
    // newline now would still make it 1025 bytes, but it has not come).
    h.at_ms(5);
    h.feed_bytes(&[b'x'; 1000]);
    h.feed_bytes(&[b'x'; 24]);
    assert!(h.take_events().is_empty());
    assert_eq!(h.client.connection(), Some(conn));
    // Byte 1025: closed at once, without waiting for a newline.
    h.at_ms(6);
    let events = h.feed_closing(b"x", "a:1", "protocol:framing:line_too_long");
    assert_eq!(outcomes(&events), acquire.in_doubt_at(6));

    // A long line that ends in time is judged as a frame, not as too long.
    let (mut h, _) = ready(4);
    let mut line = format!("T 1 A {}", "k".repeat(1_000)).into_bytes();
    line.push(b'\n');
    assert!(line.len() <= 1024);
    h.feed_closing(&line, "a:1", "protocol:framing:atom_too_long");
}

// ----- backing off and where to connect -----------------------------------

/// Fails `rounds` rounds of connects in a row from a fresh client (each
/// endpoint refuses, the next is tried at once); returns each backoff's
/// `(start, until)`, and every byte the client handed out.
fn failing_rounds(c: Config, rounds: u32) -> (Vec<(Time, Time)>, Vec<Action>) {
    let mut h = Harness::new(c);
    let mut delays = Vec::new();
    for _ in 0..rounds {
        for addr in ["a:1", "b:2"] {
            let (_, to) = h.last_connect().unwrap();
            assert_eq!(to, ep(addr));
            let mark = h.actions.len();
            h.fail_connect();
            let events = h.take_events();
            assert_eq!(closed(&events), one_closed(addr, "connect_failed"));
            if addr == "a:1" {
                assert!(backoffs(&events).is_empty(), "inside a round");
                connect_at_once(&h, mark, "b:2");
            } else {
                let until = the_backoff(&events, BackoffCause::Transport);
                delays.push((h.now, until));
                reconnect_at(&mut h, until, "a:1");
            }
        }
    }
    (delays, h.actions)
}

#[test]
fn the_wait_between_failed_rounds_is_exponential_with_equal_jitter() {
    let (delays, actions) = failing_rounds(config(), 10);
    let mut strictly_inside = 0;
    for (n, &(from, until)) in delays.iter().enumerate() {
        // After the k-th failed round (k = n + 1), the step is 50 ms * 2^(k-1),
        // up to 5 s (reached at k=8).
        let d = step(50, 5_000, n as u32);
        assert_jittered(from, until, d, &format!("transport, round {}", n + 1));
        let delay = until.saturating_duration_since(from);
        if delay > d / 2 && delay < d {
            strictly_inside += 1;
        }
    }
    assert!(strictly_inside >= 5, "the jitter is random: {delays:?}");
    // The jitter comes from the seed: the same seed, the same delays and
    // the same actions.
    assert_eq!(failing_rounds(config(), 10), (delays, actions));
}

#[test]
fn two_nodes_that_redirect_to_each_other_cost_one_attempt_each_per_round() {
    // a:1 names b:2 the leader, and b:2 names a:1: the hint is tried at
    // once, but a round tries each address once, so every round is two
    // attempts and then a redirect backoff that grows.
    let mut h = Harness::new(config());
    for k in 1..=6u32 {
        assert_eq!(h.last_connect().unwrap().1, ep("a:1"), "round {k}");
        h.hello();
        let mark = h.actions.len();
        let events = h.feed_closing("M b:2\n", "a:1", "moved");
        assert!(backoffs(&events).is_empty(), "the hint at once");
        connect_at_once(&h, mark, "b:2");
        h.hello();
        let mark = h.actions.len();
        let events = h.feed_closing("M a:1\n", "b:2", "moved");
        assert!(connects(&h, mark).is_empty(), "a:1 was tried this round");
        let until = the_backoff(&events, BackoffCause::Redirect);
        assert_jittered(h.now, until, step(50, 2_000, k - 1), "redirect");
        // The next round starts with the hint, a:1.
        reconnect_at(&mut h, until, "a:1");
    }
    // A `W` ends the run: the next failed round is the first again.
    h.ready(4);
    let events = h.feed_closing("M b:2\n", "a:1", "moved");
    let until = the_backoff(&events, BackoffCause::Redirect);
    assert_jittered(h.now, until, step(50, 2_000, 0), "after W");
}

#[test]
fn a_w_resets_the_count_of_failed_rounds_and_nothing_else_does() {
    let mut h = Harness::new(config());
    // Three failed rounds in a row: steps 50, 100, 200 ms. A connect that
    // succeeds without `W` is no success.
    for k in 1..=3u32 {
        h.fail_connect();
        h.connect();
        h.transport_closed(TransportEnd::Eof);
        let until = the_backoff(&h.take_events(), BackoffCause::Transport);
        assert_jittered(h.now, until, step(50, 5_000, k - 1), "before W");
        reconnect_at(&mut h, until, "a:1");
    }
    h.take_sent();
    h.ready(4);
    h.take_events();
    // The connection that had its `W` ends: the first step, not the fourth
    // (400 ms).
    h.transport_closed(TransportEnd::Eof);
    let events = h.take_events();
    assert_eq!(closed(&events), one_closed("a:1", "eof"));
    let until = the_backoff(&events, BackoffCause::Transport);
    assert_jittered(h.now, until, step(50, 5_000, 0), "after W");
    // As after a first failed round: the next failed round is the second.
    reconnect_at(&mut h, until, "b:2");
    h.fail_connect();
    h.fail_connect();
    let until = the_backoff(&h.take_events(), BackoffCause::Transport);
    assert_jittered(h.now, until, step(50, 5_000, 1), "the round after");
}

#[test]
fn a_connect_to_the_hint_that_fails_or_times_out_forgets_the_hint_and_the_round_goes_on() {
    for failure in ["connect_failed", "connect_timeout", "handshake_timeout"] {
        let (mut h, conn) = connecting_to_the_hint();
        let mark = h.actions.len();
        match failure {
            "connect_failed" => h.fail_connect(),
            "connect_timeout" => {
                h.at(h.now.saturating_add(ms(5_000)));
            }
            _ => {
                h.hello();
                h.at(h.now.saturating_add(ms(5_000)));
            }
        }
        let events = h.take_events();
        assert_eq!(closed(&events), one_closed("c:3", failure));
        if failure != "connect_failed" {
            assert_eq!(close_actions(&h, mark), vec![conn], "{failure}");
        }
        assert_eq!(h.client.leader_hint(), None, "{failure}");
        // The round goes on at once, at the next endpoint in turn (a:1
        // was the last endpoint tried).
        assert!(backoffs(&events).is_empty(), "{failure}");
        let (_, to) = connects(&h, mark).pop().expect("a connect at once");
        assert_eq!(to, ep("b:2"), "{failure}");
    }
}

#[test]
fn any_end_of_a_connection_to_the_hint_before_w_forgets_the_hint() {
    // A redirects with `M c:3`; c:3 accepts TCP and then ends the
    // connection before answering `H`, in every way a broken node can.
    // Each forgets the hint, so the client goes back to its endpoints
    // instead of trying c:3 for ever.
    let endings: [(&str, &str); 6] = [
        ("eof", ""),
        ("io", ""),
        ("auth_failed", "E auth_failed\n"),
        ("error:overloaded", "E overloaded\n"),
        ("protocol:framing:unknown_kind", "Q\n"),
        ("protocol:answer_before_welcome", "T 1 A k\n"),
    ];
    for (reason, bytes) in endings {
        let mut h = Harness::new(config3());
        h.hello();
        h.feed("M c:3\n");
        assert_eq!(h.client.leader_hint(), Some(&ep("c:3")));
        let (_, to) = h.last_connect().unwrap();
        assert_eq!(to, ep("c:3"), "redirected at once");
        h.hello();
        h.take_events();
        let mark = h.actions.len();
        match reason {
            "eof" => h.transport_closed(TransportEnd::Eof),
            "io" => h.transport_closed(TransportEnd::Error),
            _ => h.feed(bytes),
        }
        let events = h.take_events();
        assert_eq!(closed(&events), one_closed("c:3", reason), "{reason}");
        assert_eq!(h.client.leader_hint(), None, "{reason}");
        // The round goes on at once, at the next endpoint in turn: a:1
        // was used first.
        assert!(backoffs(&events).is_empty(), "{reason}");
        connect_at_once(&h, mark, "b:2");
    }
}

#[test]
fn an_m_from_the_hint_to_another_allowlisted_address_follows_it() {
    // The one exception: the hinted node names another allowlisted leader.
    let mut c = config3();
    c.allow.push(ep("d:4"));
    let mut h = Harness::new(c);
    h.connect();
    h.feed("M c:3\n");
    h.connect();
    assert_eq!(h.take_sent(), "H 2 c1 -\nH 2 c1 -\n");
    let mark = h.actions.len();
    h.feed("M d:4\n");
    assert_eq!(h.client.leader_hint(), Some(&ep("d:4")));
    connect_at_once(&h, mark, "d:4");
    // A hint that worked, then ended after `W`, is kept.
    h.ready(4);
    h.transport_closed(TransportEnd::Eof);
    assert_eq!(h.client.leader_hint(), Some(&ep("d:4")));
    // But its transport just failed: it is stale for a second, and the
    // next round goes to the endpoints (b:2 after a:1).
    let until = the_backoff(&h.take_events(), BackoffCause::Transport);
    reconnect_at(&mut h, until, "b:2");
}

#[test]
fn a_connect_that_does_not_complete_in_time_is_given_up() {
    let mut h = Harness::new(config());
    let (conn, addr) = h.last_connect().unwrap();
    assert_eq!(addr, ep("a:1"));
    assert_eq!(h.take_events(), vec![Event::Connecting { addr: ep("a:1") }]);
    let mark = h.actions.len();
    let events = h.closes_at(5_000, "a:1", "connect_timeout");
    assert!(backoffs(&events).is_empty(), "the round goes on");
    connect_at_once(&h, mark, "b:2");
    // A late report about the abandoned attempt is ignored.
    h.client.handle_connected(h.now, conn);
    h.pump();
    assert_eq!(h.take_sent(), "");
    assert!(h.take_events().is_empty());
    // The round's last address times out too: it failed.
    let events = h.closes_at(10_000, "b:2", "connect_timeout");
    let until = the_backoff(&events, BackoffCause::Transport);
    assert_jittered(h.now, until, step(50, 5_000, 0), "connect timeout");
    reconnect_at(&mut h, until, "a:1");
}

#[test]
fn a_handshake_without_an_answer_in_time_is_given_up() {
    let mut h = Harness::new(config());
    let op = h.acquire("k", 20_000, 5_000);
    h.at_ms(100);
    h.hello();
    assert_eq!(h.take_events(), vec![Event::Connecting { addr: ep("a:1") }]);
    let mark = h.actions.len();
    let events = h.closes_at(5_100, "a:1", "handshake_timeout");
    // Nothing was sent before W, so nothing is in doubt.
    assert!(outcomes(&events).is_empty());
    assert!(backoffs(&events).is_empty(), "the round goes on");
    connect_at_once(&h, mark, "b:2");
    let at = h.now;
    h.ready(4);
    let left = t(20_000).saturating_duration_since(at).as_millis();
    assert_eq!(h.take_sent(), format!("A 1 k o {left} 5000\n"));
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
}

#[test]
fn the_next_connection_goes_to_the_hint_if_any_else_the_next_endpoint_in_turn() {
    let mut h = Harness::new(config3());
    for addr in ["a:1", "b:2", "c:3", "a:1"] {
        assert_eq!(h.last_connect().unwrap().1, ep(addr));
        h.ready(4);
        h.take_events();
        h.transport_closed(TransportEnd::Eof);
        assert_eq!(closed(&h.take_events()), one_closed(addr, "eof"));
        h.next_deadline();
    }
    // Now at b:2, which names c:3 the leader.
    assert_eq!(h.last_connect().unwrap().1, ep("b:2"));
    h.ready(4);
    h.feed("L c:3\n");
    h.take_events();
    let mut at = "b:2";
    for _ in 0..3 {
        // An end after `W` is no failure of the hint: it is kept. Each
        // time c:3's own transport ended, the hint waits out its second
        // of staleness: the rounds of that second go to the endpoints.
        h.transport_closed(TransportEnd::Eof);
        assert_eq!(closed(&h.take_events()), one_closed(at, "eof"));
        assert_eq!(h.client.leader_hint(), Some(&ep("c:3")));
        h.next_deadline();
        if at == "c:3" {
            assert_ne!(h.last_connect().unwrap().1, ep("c:3"), "stale for 1 s");
            h.at(h.now.saturating_add(ms(1_000)));
            h.fail_connect();
            h.take_events();
        }
        assert_eq!(h.last_connect().unwrap().1, ep("c:3"));
        h.ready(4);
        let events = h.take_events();
        assert_eq!(closed(&events), vec![]);
        assert!(events.contains(&Event::Connected {
            addr: ep("c:3"),
            node: name("node-1"),
            window: 4
        }));
        at = "c:3";
    }
}

#[test]
fn a_partial_line_does_not_carry_over_to_the_next_connection() {
    let (mut h, _) = ready(4);
    h.feed("T 1 A");
    h.transport_closed(TransportEnd::Eof);
    assert_eq!(closed(&h.take_events()), one_closed("a:1", "eof"));
    h.next_deadline();
    h.hello();
    // Glued to the old fragment this would be "T 1 AW node-1 4".
    h.feed("W node-1 4\n");
    let events = h.take_events();
    assert_eq!(closed(&events), vec![]);
    assert_eq!(h.client.window(), Some(4));
}

#[test]
fn inputs_about_a_closed_connection_are_ignored() {
    let (mut h, old) = ready(4);
    let acquire = h.acquire_in_flight(1, "k", 1_000, 5_000);
    let events = h.feed_closing("M b:2\n", "a:1", "moved");
    assert_eq!(outcomes(&events), acquire.in_doubt_at(0));
    h.next_deadline();
    let new = h.hello();
    h.take_events();
    assert_ne!(new, old);
    // The old connection's late answer, end and failure change nothing.
    h.client.handle_bytes(h.now, old, b"G 1 A k 9 5000 0\n");
    h.client
        .handle_transport_closed(h.now, old, TransportEnd::Error);
    h.client.handle_connect_failed(h.now, old);
    h.pump();
    assert_eq!(h.take_events(), vec![]);
    assert_eq!(h.client.connection(), Some(new));
    h.feed("W node-1 4\n");
    assert_eq!(closed(&h.take_events()), vec![]);
    assert_eq!(h.take_sent(), "");
}

// ----- the transport ending, and the answer grace ------------------------

#[test]
fn the_transport_ending_closes_and_applies_any_close() {
    for (end, reason) in [(TransportEnd::Eof, "eof"), (TransportEnd::Error, "io")] {
        let (mut h, conn) = ready(2);
        let release = h.client.release_token(h.now, key("k"), 5).unwrap();
        let sent = h.acquire("k1", 1_000, 5_000);
        let queued = h.acquire("k2", 1_000, 5_000);
        // Window 2: the release and one acquire; the other waits.
        assert_eq!(h.take_sent(), "R 1 k 5\nA 2 k1 o 1000 5000\n");
        let mark = h.actions.len();
        h.at_ms(50);
        h.transport_closed(end);
        let events = h.take_events();
        assert_eq!(closed(&events), one_closed("a:1", reason));
        assert_eq!(close_actions(&h, mark), vec![conn]);
        // Sent acquire: Indeterminate. Release and unsent acquire: kept.
        assert_eq!(
            outcomes(&events),
            vec![(sent, indeterminate(t(50), 1_000, 5_000))]
        );
        let until = the_backoff(&events, BackoffCause::Transport);
        assert_jittered(h.now, until, step(50, 5_000, 0), reason);
        reconnect_at(&mut h, until, "b:2");
        let at = h.now;
        h.ready(2);
        let left = t(1_000).saturating_duration_since(at).as_millis();
        assert_eq!(
            h.take_sent(),
            format!("R 3 k 5\nA 4 k2 o {left} 5000\n"),
            "{reason}"
        );
        h.feed("D 3 R k\nT 4 A k2\n");
        assert_eq!(
            h.take_outcomes(),
            vec![
                (release, Outcome::Released),
                (
                    queued,
                    Outcome::TimedOut {
                        sent: true,
                        cause: None
                    }
                )
            ]
        );
    }

    // A failure reported on an established connection is `io` as well.
    let (mut h, conn) = ready(2);
    h.client.handle_connect_failed(h.now, conn);
    h.pump();
    assert_eq!(closed(&h.take_events()), one_closed("a:1", "io"));
}

#[test]
fn a_sent_release_without_an_answer_within_the_grace_closes_and_is_resent() {
    let (mut h, _) = ready(4);
    h.at_ms(10);
    let release = h.release_token("k", 5);
    assert_eq!(h.take_sent(), "R 1 k 5\n");
    // The answer grace is 5 s.
    let events = h.closes_at(5_010, "a:1", "answer_timeout");
    assert!(outcomes(&events).is_empty(), "the release is not over");
    let until = the_backoff(&events, BackoffCause::Transport);
    assert_jittered(h.now, until, step(50, 5_000, 0), "answer timeout");
    reconnect_at(&mut h, until, "b:2");
    h.ready(4);
    // Back in the lane, sent again with a new id.
    assert_eq!(h.take_sent(), "R 2 k 5\n");
    h.feed("D 2 R k\n");
    assert_eq!(h.take_outcomes(), vec![(release, Outcome::Released)]);
}

#[test]
fn a_tls_handshake_that_fails_closes_with_its_reason_like_a_failed_connect() {
    let (mut h, conn) = connecting_to_the_hint();
    let mark = h.actions.len();
    let detail = ticketing::Name::new("unknown_ca").unwrap();
    h.client.handle_tls_failed(h.now, conn, detail);
    h.pump();
    let events = h.take_events();
    assert_eq!(closed(&events), one_closed("c:3", "tls:unknown_ca"));
    assert_eq!(close_actions(&h, mark), vec![], "nothing to close");
    assert_eq!(
        h.client.leader_hint(),
        None,
        "a hint that fails is forgotten"
    );
    // As for a failed connect: the round goes on at once.
    assert!(backoffs(&events).is_empty());
    connect_at_once(&h, mark, "b:2");
    // Once connected, the same input is a transport failure.
    let conn = h.connect();
    h.client
        .handle_tls_failed(h.now, conn, ticketing::Name::new("late").unwrap());
    h.pump();
    assert_eq!(closed(&h.take_events()), one_closed("b:2", "io"));
}

// ----- rounds, stale hints, the lease cap, refusals ---------------------------

/// Endpoints `a:1` and `b:2`, and `c:3` allowlisted but not an endpoint:
/// a leader that the endpoints only name.
fn config_with_leader_c3() -> Config {
    let mut c = config();
    c.allow.push(ep("c:3"));
    c
}

#[test]
fn a_stale_hint_is_skipped_and_a_live_nodes_m_is_followed() {
    let mut h = Harness::new(config_with_leader_c3());
    // a:1 names c:3, which leads, until its transport dies at t=100.
    h.hello();
    let mark = h.actions.len();
    h.feed_closing("M c:3\n", "a:1", "moved");
    connect_at_once(&h, mark, "c:3");
    h.ready(4);
    h.at_ms(100);
    h.transport_closed(TransportEnd::Eof);
    let until = the_backoff(&h.take_events(), BackoffCause::Transport);
    assert_eq!(h.client.leader_hint(), Some(&ep("c:3")), "kept after its W");

    // The next round, within the second: c:3 is stale, so the round goes
    // to the endpoints, whose `M c:3` (a follower still naming the dead
    // leader) costs no attempt.
    reconnect_at(&mut h, until, "b:2");
    h.hello();
    let mark = h.actions.len();
    let events = h.feed_closing("M c:3\n", "b:2", "moved");
    assert!(backoffs(&events).is_empty());
    connect_at_once(&h, mark, "a:1");
    h.hello();
    let mark = h.actions.len();
    let events = h.feed_closing("M c:3\n", "a:1", "moved");
    assert!(
        connects(&h, mark).is_empty(),
        "c:3 is not followed while stale"
    );
    // Every attempt of the round ended in `M`: the redirect backoff, the
    // round's second failure in a row (the first step came after W).
    let until = the_backoff(&events, BackoffCause::Redirect);
    assert_jittered(h.now, until, step(50, 2_000, 1), "redirect");

    // A second after c:3 failed, the hint is followed again, first.
    h.refuse_connects_until(t(1_100));
    h.take_events();
    let mark = h.actions.len();
    h.next_deadline();
    assert_eq!(
        connects(&h, mark).first().map(|(_, a)| a.clone()),
        Some(ep("c:3"))
    );

    // A live node's `M` is never stale: b:2 names c:3 again after c:3
    // refused the handshake with `E not_active` (no transport failure),
    // and the round follows it at once.
    h.hello();
    let mark = h.actions.len();
    h.feed_closing("E not_active\n", "c:3", "not_active");
    connect_at_once(&h, mark, "b:2");
    h.hello();
    let mark = h.actions.len();
    h.feed_closing("M a:1\n", "b:2", "moved");
    connect_at_once(&h, mark, "a:1");
    h.hello();
    let mark = h.actions.len();
    h.feed_closing("M c:3\n", "a:1", "moved");
    assert!(
        connects(&h, mark).is_empty(),
        "c:3 was tried this round already: each address once"
    );
}

/// A client on [`config`] holding `k` renewed automatically with a lease
/// of 8 s granted at t=0 (so `valid_until` is 8000 unless a renewal is
/// answered), whose connection then ends at `end_ms`.
fn holding_when_the_leader_dies(end_ms: u64) -> Harness {
    let (mut h, _) = ready(4);
    let op = h.acquire_renewing("k", 0, 8_000, None);
    h.granted_by(op, "G 1 A k 7 8000 0\n");
    h.at_ms(end_ms);
    h.transport_closed(TransportEnd::Eof);
    h.take_events();
    h
}

/// What a held lease allows a wait starting at `from` to last, for a grant
/// valid until 8000: a quarter of what is left, never below 100 ms.
fn lease_cap(from: Time) -> Duration {
    (t(8_000).saturating_duration_since(from) / 4).max(ms(100))
}

#[test]
fn a_held_lease_caps_the_wait_between_rounds_with_a_floor_of_100_ms() {
    let mut h = holding_when_the_leader_dies(3_000);
    let mut capped = 0;
    let mut floored = 0;
    let mut k = 1u32;
    // Every round fails (both endpoints refuse) until the lease is over.
    while h.now < t(7_950) {
        let (from, until) = match h.client.connection() {
            Some(_) => {
                h.fail_connect();
                h.fail_connect();
                k += 1;
                let until = the_backoff(&h.take_events(), BackoffCause::Transport);
                (h.now, until)
            }
            None => {
                // The first step after the connection that had its W.
                let events = h.take_events();
                assert!(backoffs(&events).is_empty(), "{events:?}");
                let mark = h.actions.len();
                h.next_deadline();
                assert_eq!(connects(&h, mark).len(), 1);
                continue;
            }
        };
        let d = step(50, 5_000, k - 1);
        let cap = lease_cap(from);
        let delay = until.saturating_duration_since(from);
        assert!(
            delay <= cap && delay >= (d / 2).min(cap),
            "round {k} at {from}: delay {delay:?}, step {d:?}, cap {cap:?}"
        );
        if delay == cap && cap < d {
            capped += 1;
        }
        if cap == ms(100) {
            floored += 1;
            assert_eq!(delay, ms(100), "the floor, never shorter");
        }
        h.next_deadline();
    }
    assert!(capped >= 2, "the cap bound the delay: {capped}");
    assert!(floored >= 1, "the floor was reached: {floored}");

    // Once the grant has expired it caps nothing: the steps grow again.
    h.at_ms(8_000);
    h.take_events();
    h.refuse_connects_until(t(30_000));
    let mut from = t(8_000);
    let mut longest = Duration::ZERO;
    for (_, until) in backoffs(&h.take_events()) {
        longest = longest.max(until.saturating_duration_since(from));
        from = until;
    }
    assert!(longest > ms(1_000), "uncapped: {longest:?}");
}

#[test]
fn a_held_lease_caps_the_connect_and_handshake_timeouts() {
    // Left at the connect: 8000 - 3000 - the first step, a quarter of it
    // well under the 5 s default.
    let mut h = holding_when_the_leader_dies(3_000);
    h.next_deadline();
    let start = h.now;
    let cap = lease_cap(start);
    assert!(cap < ms(5_000));
    let mark = h.actions.len();
    h.at(start.saturating_add(cap).saturating_sub(ms(1)));
    assert_eq!(closed(&h.take_events()), vec![], "not before the cap");
    h.at(start.saturating_add(cap));
    // (The round after a:1's connection starts at b:2.)
    assert_eq!(
        closed(&h.take_events()),
        one_closed("b:2", "connect_timeout")
    );
    assert_eq!(connects(&h, mark).len(), 1, "the round goes on at once");

    // The handshake too, from the moment the transport is up.
    h.connect();
    let up = h.now;
    let cap = lease_cap(up);
    h.at(up.saturating_add(cap).saturating_sub(ms(1)));
    assert_eq!(closed(&h.take_events()), vec![]);
    h.at(up.saturating_add(cap));
    assert_eq!(
        closed(&h.take_events()),
        one_closed("a:1", "handshake_timeout")
    );

    // Near the end of the lease, the 100 ms floor.
    let mut h = holding_when_the_leader_dies(7_700);
    h.next_deadline();
    let start = h.now;
    assert_eq!(lease_cap(start), ms(100));
    h.at(start.saturating_add(ms(99)));
    assert_eq!(closed(&h.take_events()), vec![]);
    h.at(start.saturating_add(ms(100)));
    assert_eq!(
        closed(&h.take_events()),
        one_closed("b:2", "connect_timeout")
    );

    // Without a renewed grant, the configured timeout.
    let mut h = Harness::new(config());
    h.at_ms(4_999);
    assert_eq!(closed(&h.take_events()), vec![]);
    h.at_ms(5_000);
    assert_eq!(
        closed(&h.take_events()),
        one_closed("a:1", "connect_timeout")
    );
}

#[test]
fn one_node_refusing_auth_among_healthy_ones_costs_one_attempt() {
    let mut h = Harness::new(config3());
    let op = h.acquire("k", 0, 5_000);
    h.hello();
    let mark = h.actions.len();
    let events = h.feed_closing("E auth_failed\n", "a:1", "auth_failed");
    assert!(events.contains(&Event::AuthFailed { addr: ep("a:1") }));
    assert!(backoffs(&events).is_empty());
    connect_at_once(&h, mark, "b:2");
    h.ready(4);
    let events = h.take_events();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::Misconfigured { .. })),
        "{events:?}"
    );
    // The acquire waited one attempt, then went out.
    assert_eq!(h.take_sent(), "A 1 k o 0 5000\n");
    h.feed("G 1 A k 3 5000 0\n");
    assert!(matches!(h.take_outcomes()[..], [(done, Outcome::Granted(_))] if done == op));
}

#[test]
fn a_round_that_every_address_refused_leaves_the_client_misconfigured_until_a_w() {
    for (refusal, reason, cause) in [
        ("E auth_failed\n", "auth_failed", BackoffCause::AuthFailed),
        (
            "E unsupported_version\n",
            "unsupported_version",
            BackoffCause::UnsupportedVersion,
        ),
    ] {
        let (mut h, _) = ready(4);
        // A grant renewed automatically, and one by hand.
        let held = h.acquire_renewing("held", 0, 60_000, None);
        let held = h.granted_by(held, "G 1 A held 7 60000 0\n");
        h.take_sent();
        h.at_ms(10);
        // The server is replaced by one that refuses this client.
        h.transport_closed(TransportEnd::Eof);
        let waiting = h.acquire("w", 30_000, 5_000);
        let release = h.release_token("old", 3);
        h.renew(&held, None);
        h.next_deadline();
        h.take_events();
        h.hello();
        h.feed_closing(refusal, "b:2", reason);
        h.hello();
        let events = h.feed_closing(refusal, "a:1", reason);
        let want = match reason {
            "auth_failed" => ticketing::client::CloseReason::AuthFailed,
            _ => ticketing::client::CloseReason::UnsupportedVersion,
        };
        // Every address refused: the long backoff, the notice, and the
        // acquire waiting for a connection ends at once with the cause.
        assert_eq!(backoffs(&events).len(), 1, "{events:?}");
        assert_eq!(backoffs(&events)[0].0, cause);
        assert!(events.contains(&Event::Misconfigured {
            cause: want.clone()
        }));
        assert_eq!(
            outcomes(&events),
            vec![(
                waiting,
                Outcome::TimedOut {
                    sent: false,
                    cause: Some(want.clone())
                }
            )]
        );
        // New acquires are refused with the cause; releases and renewals
        // are still taken and wait.
        let refused = h
            .client
            .acquire(h.now, key("new"), name("o2"), ms(0), ms(5_000));
        assert_eq!(
            refused,
            Err(ticketing::client::Error::Misconfigured(want.clone()))
        );
        h.release_token("older", 4);
        assert_eq!(h.client.stats().misconfigured, 1);
        // It keeps trying; a `W` ends it, and the lane goes out first.
        h.next_deadline();
        h.ready(4);
        assert_eq!(h.take_sent(), "R 2 old 3\nR 3 older 4\nX 4 held 7 60000\n");
        h.feed("D 2 R old\n");
        assert_eq!(h.take_outcomes(), vec![(release, Outcome::Released)]);
        assert!(h
            .client
            .acquire(h.now, key("new"), name("o3"), ms(0), ms(5_000))
            .is_ok());
    }
}

#[test]
fn a_never_sent_timed_out_carries_why_the_latest_attempt_ended() {
    use ticketing::client::CloseReason;
    for (fail, want) in [
        ("connect", CloseReason::ConnectFailed),
        ("no_leader", CloseReason::NoLeader),
        ("tls", CloseReason::Tls(name("unknown_ca"))),
    ] {
        let mut h = Harness::new(config());
        let op = h.acquire("k", 0, 5_000);
        let conn = h.client.connection().unwrap();
        match fail {
            "connect" => h.fail_connect(),
            "no_leader" => {
                h.hello();
                h.feed("E no_leader\n");
            }
            _ => {
                h.client.handle_tls_failed(h.now, conn, name("unknown_ca"));
                h.pump();
            }
        }
        // b:2 is tried at once and hangs; the queue grace (2 s) runs out.
        h.ends_at(
            2_000,
            &[(
                op,
                Outcome::TimedOut {
                    sent: false,
                    cause: Some(want.clone()),
                },
            )],
        );
    }
    // After a `W`, what came before says nothing: no cause until an
    // attempt ends again.
    // (A window of 2 with 2 reserved: the acquire never goes out.)
    let mut c = config();
    c.reserved = 2;
    let (mut h, _) = ready_with(c, 2);
    let op = h.acquire("k", 0, 5_000);
    h.ends_at(
        2_000,
        &[(
            op,
            Outcome::TimedOut {
                sent: false,
                cause: None,
            },
        )],
    );
}

/// PROTOCOL.md section 5, "an acquire not yet sent": a client that gives
/// up while unreachable ends an unsent acquire at once, with the round's
/// cause, when a round fails at every address and at a submission until
/// a `W`; one that does not (the default, or an acquire that says so)
/// waits `max(wait, queue_grace)`. Releases are never given up.
#[test]
fn a_client_that_gives_up_while_unreachable_ends_unsent_acquires_at_once() {
    use ticketing::client::{AcquireOptions, CloseReason};
    let mut c = config();
    c.give_up_while_unreachable = true;
    let mut h = Harness::new(c);
    // Submitted before any round ended: it waits for the round.
    let first = h.acquire("k", 5_000, 5_000);
    let patient = h.client.acquire_with(
        h.now,
        key("p"),
        name("o-patient"),
        ms(5_000),
        ms(5_000),
        AcquireOptions::new().give_up_while_unreachable(false),
    );
    let patient = patient.expect("taken");
    let release = h.release_token("old", 3);
    h.take_events();
    h.fail_connect();
    assert_eq!(h.take_outcomes(), vec![], "a:1 failed, b:2 is left");
    h.at_ms(5);
    h.fail_connect();
    // Every address failed: the one that gives up ends now, with how the
    // latest attempt ended; the other and the release wait.
    let gave_up = Outcome::TimedOut {
        sent: false,
        cause: Some(CloseReason::ConnectFailed),
    };
    assert_eq!(h.take_outcomes(), vec![(first, gave_up.clone())]);
    // While unreachable, one submitted ends at once, also with a wait.
    let second = h.acquire("k", 5_000, 5_000);
    assert_eq!(h.take_outcomes(), vec![(second, gave_up.clone())]);
    // The next round under way changes nothing until a `W`.
    h.next_deadline();
    assert!(h.client.connection().is_some(), "a new round");
    let third = h.acquire("k", 5_000, 5_000);
    assert_eq!(h.take_outcomes(), vec![(third, gave_up)]);
    // A `W`: acquires wait and go out again; the lane goes first.
    h.ready(4);
    let fourth = h.acquire("k", 5_000, 5_000);
    assert_eq!(h.take_outcomes(), vec![]);
    let since_start = Duration::from_nanos(h.now.as_nanos());
    let left = ms(5_000).saturating_sub(since_start).as_millis();
    assert_eq!(
        h.take_sent(),
        format!("R 1 old 3\nA 2 p o-patient {left} 5000\nA 3 k o 5000 5000\n")
    );
    h.feed("D 1 R old\nG 2 A p 8 5000 0\nG 3 A k 9 5000 0\n");
    let ended: Vec<_> = h.take_outcomes().into_iter().map(|(op, _)| op).collect();
    assert_eq!(ended, vec![release, patient, fourth]);
}

/// Off by default: the same round leaves an acquire waiting out
/// `max(wait, queue_grace)`, and one acquire may ask to give up.
#[test]
fn by_default_an_unsent_acquire_waits_and_one_may_ask_to_give_up() {
    use ticketing::client::{AcquireOptions, CloseReason};
    let mut h = Harness::new(config());
    let waits = h.acquire("k", 3_000, 5_000);
    h.fail_connect();
    h.fail_connect();
    assert_eq!(h.take_outcomes(), vec![]);
    let asks = h.client.acquire_with(
        h.now,
        key("k"),
        name("o-asks"),
        ms(3_000),
        ms(5_000),
        AcquireOptions::new().give_up_while_unreachable(true),
    );
    let asks = asks.expect("taken");
    h.pump();
    let gave_up = Outcome::TimedOut {
        sent: false,
        cause: Some(CloseReason::ConnectFailed),
    };
    assert_eq!(h.take_outcomes(), vec![(asks, gave_up.clone())]);
    h.refuse_connects_until(t(3_000));
    assert_eq!(h.take_outcomes(), vec![(waits, gave_up)]);
}
