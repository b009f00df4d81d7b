//! Unit tests of the server's plumbing; the rules are tested scenario by
//! scenario in `tests/server_rules.rs` and against a model in
//! `tests/server_model.rs`.

use super::*;

fn server() -> Server {
    let mut config = Config::new(Name::new("n1").unwrap());
    config.window = 4;
    Server::new(config, Time::ZERO).unwrap()
}

fn drain(s: &mut Server) -> Vec<Action> {
    let mut out = Vec::new();
    while let Some(a) = s.poll_action() {
        out.push(a);
    }
    out
}

fn send(conn: ConnId, data: &str) -> Action {
    Action::Send {
        conn,
        data: bytes::Bytes::copy_from_slice(data.as_bytes()),
    }
}

#[test]
fn every_reason_is_an_atom() {
    for reason in Reason::ALL {
        assert!(Atom::new(reason.as_str()).is_ok(), "{reason:?}");
    }
}

#[test]
fn answers_to_one_connection_are_batched_and_sends_come_before_the_close() {
    let mut s = server();
    let a = s.handle_accept(Time::ZERO);
    let b = s.handle_accept(Time::ZERO);
    s.handle_bytes(Time::ZERO, a, b"H 1 a -\nA 1 k o 0 5\n");
    s.handle_bytes(Time::ZERO, b, b"H 1 b -\n");
    s.handle_bytes(Time::ZERO, a, b"R 2 k 9\n");
    s.handle_bytes(Time::ZERO, b, b"bogus\n");
    assert_eq!(s.poll_timeout(), Some(Time::ZERO), "actions are queued");
    assert_eq!(
        drain(&mut s),
        [
            send(a, "W n1 4\nG 1 A k 1 5\nN 2 R k\n"),
            send(b, "W n1 4\nE bad_frame\n"),
            Action::Close { conn: b },
        ]
    );
    assert_eq!(s.poll_timeout(), Some(Time::from_millis(5)));
    assert!(s.is_open(a) && !s.is_open(b));
    assert_eq!(s.connections(), 1);
}

#[test]
fn a_connection_reported_closed_gets_nothing_more() {
    let mut s = server();
    let a = s.handle_accept(Time::ZERO);
    s.handle_bytes(Time::ZERO, a, b"H 1 a -\n");
    s.handle_closed(Time::ZERO, a);
    assert_eq!(drain(&mut s), []);
    s.handle_bytes(Time::ZERO, a, b"A 1 k o 0 5\n");
    s.handle_closed(Time::ZERO, a);
    assert_eq!(drain(&mut s), []);
    assert_eq!(s.holder("k"), None);
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn the_same_inputs_give_the_same_bytes() {
    let run = || {
        let mut s = server();
        let mut all = Vec::new();
        let conns: Vec<ConnId> = (0..3).map(|_| s.handle_accept(Time::ZERO)).collect();
        for (i, &c) in conns.iter().enumerate() {
            s.handle_bytes(Time::ZERO, c, b"H 1 x -\n");
            let line = format!("A {i} k o 100 {}\nA 9 j o 50 7\n", 10 + i);
            s.handle_bytes(Time::from_millis(i as u64), c, line.as_bytes());
        }
        all.extend(drain(&mut s));
        while let Some(t) = s.poll_timeout() {
            s.handle_timeout(t);
            all.extend(drain(&mut s));
        }
        all
    };
    let first = run();
    assert!(first.len() > 6);
    assert_eq!(first, run());
}

#[test]
fn a_taken_table_leaves_a_counter_that_goes_on() {
    let mut s = server();
    let a = s.handle_accept(Time::ZERO);
    s.handle_bytes(Time::ZERO, a, b"H 1 a -\nA 1 k o 0 5\nA 2 k o 100 5\n");
    let table = s.take_lock_table(Time::ZERO);
    assert_eq!(
        drain(&mut s),
        [
            send(a, "W n1 4\nG 1 A k 1 5\nE not_active\n"),
            Action::Close { conn: a },
        ],
        "the connection with a waiter is closed"
    );
    assert_eq!((table.waiters(), table.holder("k").unwrap().token), (0, 1));
    assert_eq!(s.holder("k"), None);
    let b = s.handle_accept(Time::ZERO);
    s.handle_bytes(Time::ZERO, b, b"H 1 b -\nA 1 k o 0 5\n");
    assert_eq!(drain(&mut s), [send(b, "W n1 4\nG 1 A k 2 5\n")]);
}
