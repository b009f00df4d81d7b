//! Unit tests of the server's plumbing; the rules are tested scenario by
//! scenario in `tests/server_rules.rs` and against a model in
//! `tests/server_model.rs`.

use super::*;
use crate::names::Name;

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

fn in_term(epochs: EpochSource, epoch: u64, count: u64) -> Server {
    let mut config = Config::new(Name::new("n1").unwrap());
    config.window = 4;
    config.epochs = epochs;
    let mut s = Server::new(config, Time::ZERO).unwrap();
    s.begin_term(Time::ZERO, Term::First { epoch }).unwrap();
    s.table.set_count(count);
    s
}

#[test]
fn a_term_about_to_reach_n_2_pow_22_begins_the_next_epoch_keeping_its_table() {
    let mut s = in_term(EpochSource::Core, 40, TERM_GRANTS - 2);
    let a = s.handle_accept(Time::ZERO);
    s.handle_bytes(Time::ZERO, a, b"H 2 a -\nA 1 k o 0 50\nA 2 j o 0 50\n");
    let (last, first) = (token(40, TERM_GRANTS - 1).unwrap(), token(41, 1).unwrap());
    assert_eq!(
        last + 2,
        first,
        "n = 2^22 is skipped: it is the next epoch's 0"
    );
    assert_eq!(
        drain(&mut s),
        [send(
            a,
            &format!("W n1 4\nG 1 A k {last} 50 0\nG 2 A j {first} 50 0\n")
        )]
    );
    assert_eq!(s.epoch(), 41);
    assert_eq!(s.holder("k").unwrap().token, last, "the table is kept");
    assert_eq!(s.grace_until(), None);
}

#[test]
fn a_driver_that_gives_epochs_is_asked_and_nothing_is_granted_meanwhile() {
    let mut s = in_term(EpochSource::Driver, 40, TERM_GRANTS - 1);
    let a = s.handle_accept(Time::ZERO);
    s.handle_bytes(Time::ZERO, a, b"H 2 a -\nA 1 k o 100 50\nA 2 j o 0 50\n");
    assert_eq!(s.poll_timeout(), Some(Time::ZERO), "an action is waiting");
    assert_eq!(
        drain(&mut s),
        [
            Action::NeedEpoch { after: 40 },
            send(a, "W n1 4\nT 2 A j\n"),
        ]
    );
    assert_eq!(s.holder("k"), None);
    assert_eq!(s.queue_len("k"), 1, "it waits for the epoch");
    let later = Time::from_millis(7);
    assert_eq!(
        s.begin_epoch(later, 40),
        Err(TermError::EpochNotGreater {
            epoch: 40,
            current: 40
        })
    );
    assert_eq!(s.begin_epoch(later, 1_000), Ok(()));
    let first = token(1_000, 1).unwrap();
    assert_eq!(drain(&mut s), [send(a, &format!("G 1 A k {first} 50 7\n"))]);
    assert_eq!(s.begin_epoch(later, 2_000), Err(TermError::NotAsked));
    s.handle_bytes(later, a, b"A 3 z o 0 50\n");
    let second = token(1_000, 2).unwrap();
    assert_eq!(
        drain(&mut s),
        [send(a, &format!("G 3 A z {second} 50 0\n"))]
    );
}

#[test]
fn handshakes_refused_for_their_credential_are_counted() {
    let mut config = Config::new(Name::new("n1").unwrap());
    config.credential = Some(Name::new("open-sesame").unwrap());
    let mut s = Server::new(config, Time::ZERO).unwrap();
    for (offered, refused) in [("guess", true), ("-", true), ("open-sesame", false)] {
        let conn = s.handle_accept(Time::ZERO);
        s.handle_bytes(Time::ZERO, conn, format!("H 2 c {offered}\n").as_bytes());
        let said = drain(&mut s);
        assert_eq!(
            said.first() == Some(&send(conn, "E auth_failed\n")),
            refused,
            "{offered}: {said:?}"
        );
    }
    assert_eq!(s.stats().auth_failures, 2);
    // A server that asks for no credential refuses none.
    let mut open = server();
    let conn = open.handle_accept(Time::ZERO);
    open.handle_bytes(Time::ZERO, conn, b"H 2 c anything\n");
    assert_eq!(open.stats().auth_failures, 0);
}

/// Everything sent on `conn` in `actions`, as text, and whether it was
/// closed.
fn said(actions: &[Action], conn: ConnId) -> (String, bool) {
    let mut text = String::new();
    let mut closed = false;
    for a in actions {
        match a {
            Action::Send { conn: c, data } if *c == conn => {
                text.push_str(core::str::from_utf8(data).unwrap());
            }
            Action::Close { conn: c } if *c == conn => closed = true,
            _ => {}
        }
    }
    (text, closed)
}

#[test]
fn an_administrative_hello_is_refused_until_the_desk_opens_and_then_by_credential() {
    let mut s = server();
    let now = Time::ZERO;
    let early = s.handle_accept(now);
    s.handle_bytes(now, early, b"HA 1 -\n");
    assert_eq!(
        said(&drain(&mut s), early),
        ("E not_active\n".to_string(), true)
    );
    s.open_admin(
        3,
        &AdminAccess::Credential(Name::new("peer-secret").unwrap()),
    );
    for (hello, answer) in [
        ("HA 1 wrong\n", "E auth_failed\n"),
        ("HA 1 -\n", "E auth_failed\n"),
        ("HA 2 peer-secret\n", "E unsupported_version\n"),
        ("HA 1 peer-secret extra\n", "E bad_frame\n"),
    ] {
        let conn = s.handle_accept(now);
        s.handle_bytes(now, conn, hello.as_bytes());
        assert_eq!(
            said(&drain(&mut s), conn),
            (answer.to_string(), true),
            "{hello:?}"
        );
    }
    let conn = s.handle_accept(now);
    s.handle_bytes(now, conn, b"HA 1 peer-secret\nQ 1 status\nQ 2 transfer -\n");
    assert_eq!(said(&drain(&mut s), conn), ("WA 3\n".to_string(), false));
    assert_eq!(s.poll_admin(), Some((conn, AdminRequest::Status { id: 1 })));
    assert_eq!(
        s.poll_admin(),
        Some((conn, AdminRequest::Transfer { id: 2, to: None }))
    );
    assert_eq!(s.poll_admin(), None);
    s.answer_admin(conn, &AdminReply::Transferring { id: 2, to: 1 });
    assert_eq!(
        said(&drain(&mut s), conn),
        ("OK 2 transfer 1\n".to_string(), false)
    );
}

#[test]
fn the_two_kinds_of_connection_never_take_each_others_frames() {
    let mut s = server();
    let now = Time::ZERO;
    s.open_admin(3, &AdminAccess::Open);
    // An ordinary connection that sends an administrative request.
    let client = s.handle_accept(now);
    s.handle_bytes(now, client, b"H 2 c -\nQ 1 status\n");
    let (text, closed) = said(&drain(&mut s), client);
    assert!(text.ends_with("E bad_frame\n") && closed, "{text}");
    // An administrative one that sends a lock request, or a second hello.
    for line in ["A 1 k o 0 1000\n", "H 2 c -\n", "HA 1 -\n"] {
        let admin = s.handle_accept(now);
        s.handle_bytes(now, admin, b"HA 1 -\n");
        s.handle_bytes(now, admin, line.as_bytes());
        let (text, closed) = said(&drain(&mut s), admin);
        assert!(text.starts_with("WA 3\n") && closed, "{line:?}: {text}");
    }
    assert_eq!(s.poll_admin(), None, "nothing reached the desk");
    assert!(s.holder("k").is_none(), "nothing reached the table");
    // A request before the hello.
    let early = s.handle_accept(now);
    s.handle_bytes(now, early, b"Q 1 status\n");
    assert_eq!(
        said(&drain(&mut s), early),
        ("E bad_frame\n".to_string(), true)
    );
}

#[test]
fn an_administrative_connection_stays_when_the_role_changes_and_hears_no_hint() {
    let mut s = server();
    let now = Time::ZERO;
    s.open_admin(3, &AdminAccess::Open);
    let admin = s.handle_accept(now);
    s.handle_bytes(now, admin, b"HA 1 -\n");
    let client = s.handle_accept(now);
    s.handle_bytes(now, client, b"H 2 c -\n");
    drain(&mut s);
    s.announce_leader(now, Endpoint::new("10.0.0.9:7878").unwrap());
    s.set_role(now, Role::NoLeader);
    let actions = drain(&mut s);
    let (text, closed) = said(&actions, client);
    assert!(text.contains("L 10.0.0.9:7878") && closed, "{text}");
    assert_eq!(said(&actions, admin), (String::new(), false));
    assert!(s.is_open(admin));
    assert_eq!(s.unanswered(admin), None);
}
