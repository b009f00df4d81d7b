//! Scenario tests of the reference server, one or more per rule of
//! PROTOCOL.md section 4, plus the handshake, credentials, the window,
//! malformed frames, leases, queues, tokens, roles and leader hints. Every
//! test asserts the exact bytes the server sends.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ticketing::server::{
    Action, Config, ConfigError, ConnId, ImageError, Role, Server, TableImage, Term, TermError,
};
use ticketing::{Endpoint, Name, Time};

fn t(ms: u64) -> Time {
    Time::from_millis(ms)
}

fn ep(s: &str) -> Endpoint {
    Endpoint::new(s).unwrap()
}

/// Node `n1`, window 4, at most 2 waiters per key and 3 in all, leases of
/// at most 1 s.
fn config() -> Config {
    let mut c = Config::new(Name::new("n1").unwrap());
    c.window = 4;
    c.queue_limit = 2;
    c.max_waiters = 3;
    c.max_lease = Duration::from_millis(1000);
    c
}

/// One server and everything it said, per connection.
struct Harness {
    server: Server,
    now: Time,
    /// Bytes sent to each connection and not yet taken.
    unread: BTreeMap<ConnId, String>,
    /// Connections the server closed.
    closed: BTreeSet<ConnId>,
    clients: u64,
}

impl Harness {
    fn new(config: Config) -> Harness {
        Harness {
            server: Server::new(config, Time::ZERO).unwrap(),
            now: Time::ZERO,
            unread: BTreeMap::new(),
            closed: BTreeSet::new(),
            clients: 0,
        }
    }

    /// Drains the actions, checking that nothing is sent to a connection
    /// after its close and that the next timeout lies in the future.
    fn pump(&mut self) {
        while let Some(action) = self.server.poll_action() {
            match action {
                Action::Send { conn, data } => {
                    assert!(
                        !self.closed.contains(&conn),
                        "{conn} got bytes after its close"
                    );
                    assert!(!data.is_empty());
                    let text = String::from_utf8(data.to_vec()).unwrap();
                    assert!(text.ends_with('\n'), "whole frames only: {text:?}");
                    self.unread.entry(conn).or_default().push_str(&text);
                }
                Action::Close { conn } => {
                    assert!(self.closed.insert(conn), "{conn} closed twice");
                    assert!(!self.server.is_open(conn));
                }
                other => panic!("unexpected action {other:?}"),
            }
        }
        if let Some(at) = self.server.poll_timeout() {
            assert!(
                at > self.now,
                "poll_timeout {at} is not after now {}",
                self.now
            );
        }
    }

    fn accept(&mut self) -> ConnId {
        let conn = self.server.handle_accept(self.now);
        self.pump();
        conn
    }

    /// Accepts a connection and does the handshake in `version`, expecting
    /// `W`.
    fn hello(&mut self, version: u32) -> ConnId {
        let conn = self.accept();
        self.clients += 1;
        self.send(conn, &format!("H {version} c{} -\n", self.clients));
        assert_eq!(self.take(conn), "W n1 4\n");
        conn
    }

    /// Accepts a connection and does the handshake, expecting `W`.
    fn connect(&mut self) -> ConnId {
        self.hello(1)
    }

    /// The same with `H 2`.
    fn connect_v2(&mut self) -> ConnId {
        self.hello(2)
    }

    /// `N` connections by [`Harness::connect`], in order.
    fn connect_many<const N: usize>(&mut self) -> [ConnId; N] {
        std::array::from_fn(|_| self.connect())
    }

    /// `N` connections by [`Harness::connect_v2`], in order.
    fn connect_many_v2<const N: usize>(&mut self) -> [ConnId; N] {
        std::array::from_fn(|_| self.connect_v2())
    }

    /// Moves the clock to `ns` nanoseconds and fires the timers.
    fn at_ns(&mut self, ns: u64) {
        self.now = Time::from_nanos(ns);
        self.server.handle_timeout(self.now);
        self.pump();
    }

    fn send(&mut self, conn: ConnId, text: &str) {
        self.server.handle_bytes(self.now, conn, text.as_bytes());
        self.pump();
    }

    /// Sends `text` on `conn` and asserts that the server answered
    /// exactly `expected` to it.
    #[track_caller]
    fn ask(&mut self, conn: ConnId, text: &str, expected: impl AsRef<str>) {
        self.send(conn, text);
        assert_eq!(self.take(conn), expected.as_ref());
    }

    /// The connection ended on the client's side.
    fn end(&mut self, conn: ConnId) {
        self.server.handle_closed(self.now, conn);
        self.pump();
    }

    /// The embedder changes the server's role.
    fn set_role(&mut self, role: Role) {
        self.server.set_role(self.now, role);
        self.pump();
    }

    /// Moves the clock to `ms` and fires the timers.
    fn at(&mut self, ms: u64) {
        self.now = t(ms);
        self.server.handle_timeout(self.now);
        self.pump();
    }

    /// What the server sent `conn` since the last call.
    fn take(&mut self, conn: ConnId) -> String {
        self.unread.remove(&conn).unwrap_or_default()
    }

    fn closed(&self, conn: ConnId) -> bool {
        self.closed.contains(&conn)
    }

    fn token(&self, key: &str) -> Option<u64> {
        self.server.holder(key).map(|h| h.token)
    }
}

fn leader() -> Harness {
    Harness::new(config())
}

// ----- the handshake ------------------------------------------------------

#[test]
fn handshake_is_answered_w_with_node_and_window() {
    let mut h = leader();
    let a = h.accept();
    assert_eq!(h.take(a), "", "the server speaks only after H");
    h.ask(a, "H 1 client-a -\n", "W n1 4\n");
    assert_eq!(h.server.unanswered(a), Some(0));
    h.ask(a, "A 1 k o 0 10\n", "G 1 A k 1 10\n");
    assert!(!h.closed(a));
}

#[test]
fn handshake_sends_the_configured_leader_hint_after_w() {
    let mut c = config();
    c.leader_hint = Some(ep("n1.example:7878"));
    let mut h = Harness::new(c);
    let a = h.accept();
    h.ask(a, "H 1 c -\n", "W n1 4\nL n1.example:7878\n");
}

#[test]
fn request_before_hello_closes_that_connection_only() {
    let mut h = leader();
    let b = h.connect();
    h.ask(b, "A 1 k o 0 10\n", "G 1 A k 1 10\n");
    let a = h.accept();
    h.ask(a, "R 1 k 1\n", "E hello_required\n");
    assert!(h.closed(a));
    assert_eq!(h.token("k"), Some(1), "the release before H did nothing");
    h.ask(b, "R 2 k 1\n", "D 2 R k\n");
    assert!(!h.closed(b));
}

#[test]
fn second_hello_closes_the_connection() {
    let mut h = leader();
    let a = h.connect();
    h.ask(a, "H 1 again -\n", "E duplicate_hello\n");
    assert!(h.closed(a));
}

#[test]
fn versions_1_and_2_are_spoken_and_any_other_is_refused_and_closed() {
    let mut h = leader();
    for version in ["0", "3", "18446744073709551615"] {
        let a = h.accept();
        h.send(a, &format!("H {version} c -\nA 1 k o 0 10\n"));
        assert_eq!(h.take(a), "E unsupported_version\n", "H {version}");
        assert!(h.closed(a));
    }
    assert_eq!(h.token("k"), None, "nothing after a refused H is read");
    let one = h.connect();
    let two = h.connect_v2();
    h.send(one, "A 1 k o 0 10\n");
    h.send(two, "A 1 j o 0 10\n");
    assert_eq!(h.take(one), "G 1 A k 1 10\n", "version 1: no waited_ms");
    assert_eq!(
        h.take(two),
        "G 1 A j 2 10 0\n",
        "version 2: granted at once"
    );
}

#[test]
fn malformed_frames_close_only_that_connection() {
    let bad = [
        "A 01 k o 0 5",                   // leading zero
        "A 1 k o 0 0",                    // zero lease
        "A 1 k o 0",                      // too few fields
        "A 1 k o 0 5 6",                  // too many fields
        "A 1  k o 0 5",                   // empty field
        "A 1 k o 0 5 ",                   // trailing space
        "A 1 k o 0 5\r",                  // carriage return
        "A 1 k o -1 5",                   // sign
        "A 18446744073709551616 k o 0 5", // overflow
        "R 1 k",                          // release without token
        "X 1 k",                          // unknown kind
        "G 1 A k 1 1",                    // a server's frame
        "",                               // empty line
        "A 1 k\u{1} o 0 5",               // control byte
    ];
    for line in bad {
        let mut h = leader();
        let other = h.connect();
        h.ask(other, "A 1 held o 0 500\n", "G 1 A held 1 500\n");
        let a = h.connect();
        h.ask(
            a,
            "A 1 mine o 0 500\nA 2 held o 300 500\n",
            "G 1 A mine 2 500\n",
        );
        assert_eq!(h.server.queue_len("held"), 1);
        h.send(a, &format!("{line}\nR 3 mine 2\n"));
        assert_eq!(h.take(a), "E bad_frame\n", "line {line:?}");
        assert!(h.closed(a), "line {line:?}");
        // The frame after the bad one was not read; the waiter is gone, the
        // grant stays; the other connection goes on.
        assert_eq!(h.token("mine"), Some(2), "line {line:?}");
        assert_eq!(h.server.queue_len("held"), 0, "line {line:?}");
        assert!(!h.closed(other));
        h.send(other, "R 2 held 1\n");
        assert_eq!(h.take(other), "D 2 R held\n", "line {line:?}");
    }
}

#[test]
fn a_line_is_buffered_up_to_1024_bytes_and_byte_1025_closes() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.send(a, &"x".repeat(1000));
    h.ask(a, &"x".repeat(24), "");
    assert!(!h.closed(a), "1024 bytes without a newline are still legal");
    h.ask(a, "\n", "E bad_frame\n");
    assert!(h.closed(a));
    // A frame may be cut anywhere.
    h.send(b, "A 1 k");
    h.ask(b, " o 0 ", "");
    h.ask(b, "10\nA 2 j o 0 10\nR 3 k", "G 1 A k 1 10\nG 2 A j 2 10\n");
    h.ask(b, " 1\n", "D 3 R k\n");
}

#[test]
fn the_same_conversation_in_single_bytes_gives_the_same_bytes() {
    let script = [
        "H 1 c -\nA 1 k o 0 100\nA 2 k o 50 100\nA 3 j o 0 20\n",
        "R 4 k 1\nR 5 k 1\nA 6 k o 0 5\n",
    ];
    let run = |split: bool| {
        let mut h = leader();
        let a = h.accept();
        for part in script {
            if split {
                for b in part.as_bytes() {
                    h.server.handle_bytes(h.now, a, &[*b]);
                }
                h.pump();
            } else {
                h.send(a, part);
            }
        }
        h.take(a)
    };
    let whole = run(false);
    assert_eq!(
        whole,
        "W n1 4\nG 1 A k 1 100\nG 3 A j 2 20\nD 4 R k\nG 2 A k 3 100\nN 5 R k\nT 6 A k\n"
    );
    assert_eq!(run(true), whole);
}

// ----- rule 1: exactly one answer per request -------------------------------

#[test]
fn rule1_every_request_gets_exactly_one_answer_in_any_order() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.ask(a, "A 1 k o 0 1000\n", "G 1 A k 1 1000\n");
    // b's first acquire waits; its later requests are answered first.
    h.ask(
        b,
        "A 10 k o 5000 100\nA 11 j o 0 100\nR 12 j 99\n",
        "G 11 A j 2 100\nN 12 R j\n",
    );
    assert_eq!(h.server.unanswered(b), Some(1));
    h.at(10);
    h.ask(a, "R 2 k 1\n", "D 2 R k\n");
    assert_eq!(h.take(b), "G 10 A k 3 100\n");
    assert_eq!(h.server.unanswered(b), Some(0));
    // Nothing else is ever said: not at the waits' or the leases' ends.
    h.at(10_000);
    assert_eq!(h.take(a), "");
    assert_eq!(h.take(b), "");
}

#[test]
fn rule1_a_waiting_acquire_gets_no_answer_once_its_connection_closed() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.send(a, "A 1 k o 0 100\n");
    h.send(b, "A 1 k o 500 100\n");
    h.end(b);
    h.at(1000);
    assert_eq!(h.take(b), "");
    assert_eq!(
        h.token("k"),
        None,
        "the lease ran out and nobody was granted"
    );
}

// ----- rule 2: acquire ----------------------------------------------------

#[test]
fn rule2_a_free_key_is_granted_at_once() {
    let mut h = leader();
    let a = h.connect();
    h.ask(a, "A 7 printer me 5000 300\n", "G 7 A printer 1 300\n");
    let holder = h.server.holder("printer").unwrap();
    assert_eq!((holder.token, holder.conn), (1, a));
    assert_eq!((holder.granted_at, holder.expires_at), (t(0), t(300)));
}

#[test]
fn rule2_wait_zero_on_a_held_key_is_answered_t() {
    let mut h = leader();
    let a = h.connect();
    h.ask(
        a,
        "A 1 k o 0 100\nA 2 k o 0 100\n",
        "G 1 A k 1 100\nT 2 A k\n",
    );
    assert_eq!(h.server.queue_len("k"), 0);
}

#[test]
fn rule2_wait_zero_is_answered_t_before_b_even_when_queues_are_full() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.send(a, "A 1 k o 0 100\n");
    h.ask(
        b,
        "A 1 k o 50 100\nA 2 k o 50 100\nA 3 k o 0 100\n",
        "T 3 A k\n",
    );
}

#[test]
fn rule2_busy_at_the_per_key_limit_holder_not_counted() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.send(a, "A 1 k o 0 100\n");
    // The holder plus two waiters: the queue (limit 2) is full only now.
    h.ask(b, "A 1 k o 50 100\nA 2 k o 50 100\n", "");
    assert_eq!(h.server.queue_len("k"), 2);
    h.ask(b, "A 3 k o 50 100\n", "B 3 A k\n");
    assert_eq!(h.server.queue_len("k"), 2, "a busy acquire is not queued");
    // Another key still takes waiters.
    h.send(a, "A 2 j o 0 100\n");
    h.send(b, "A 4 j o 50 100\n");
    assert_eq!(h.server.queue_len("j"), 1);
    assert_eq!(h.take(b), "");
}

#[test]
fn rule2_busy_at_the_total_limit_holders_not_counted() {
    let mut h = leader();
    let [a, b, c] = h.connect_many();
    h.ask(
        a,
        "A 1 k o 0 100\nA 2 j o 0 100\n",
        "G 1 A k 1 100\nG 2 A j 2 100\n",
    );
    // Two holders and three waiters: the server's limit (3) counts waiters.
    h.send(b, "A 1 k o 50 100\nA 2 k o 50 100\n");
    h.send(c, "A 1 j o 50 100\n");
    assert_eq!(h.server.lock_table().waiters(), 3);
    h.send(c, "A 2 j o 50 100\n");
    assert_eq!(
        h.take(c),
        "B 2 A j\n",
        "j's own queue has room, the server's has not"
    );
    // A free key is still granted: the limit is on waiting.
    h.ask(c, "A 3 free o 50 100\n", "G 3 A free 3 100\n");
    // Once a waiter leaves, there is room again.
    h.at(50);
    assert_eq!(h.take(b), "T 1 A k\nT 2 A k\n");
    assert_eq!(h.take(c), "T 1 A j\n");
    h.ask(c, "A 4 j o 50 100\n", "");
    assert_eq!(h.server.queue_len("j"), 1);
}

#[test]
fn rule2_waiters_are_granted_first_in_first_out() {
    let mut c = config();
    c.queue_limit = 10;
    c.max_waiters = 10;
    let mut h = Harness::new(c);
    let [a, b, x] = h.connect_many();
    h.ask(a, "A 1 k o 0 1000\n", "G 1 A k 1 1000\n");
    h.send(b, "A 1 k o 5000 1000\n");
    h.send(x, "A 1 k o 5000 1000\n");
    h.send(b, "A 2 k o 5000 1000\n");
    h.ask(a, "R 2 k 1\n", "D 2 R k\n");
    assert_eq!(h.take(b), "G 1 A k 2 1000\n");
    assert_eq!(h.take(x), "");
    h.send(a, "R 3 k 2\n");
    assert_eq!(h.take(x), "G 1 A k 3 1000\n");
    assert_eq!(h.take(b), "");
    h.send(a, "R 4 k 3\n");
    assert_eq!(h.take(b), "G 2 A k 4 1000\n");
    assert_eq!(h.take(a), "D 3 R k\nD 4 R k\n");
}

#[test]
fn rule2_a_wait_that_runs_out_is_answered_t_at_its_deadline() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.ask(a, "A 1 k o 0 1000\n", "G 1 A k 1 1000\n");
    h.at(5);
    h.send(b, "A 1 k o 100 50\nA 2 k o 200 50\n");
    assert_eq!(h.server.poll_timeout(), Some(t(105)));
    h.at(104);
    assert_eq!(h.take(b), "");
    h.at(105);
    assert_eq!(h.take(b), "T 1 A k\n");
    assert_eq!(h.server.queue_len("k"), 1);
    // A late timer still answers, and only once.
    h.at(900);
    assert_eq!(h.take(b), "T 2 A k\n");
    assert_eq!(h.take(a), "");
    assert_eq!(h.token("k"), Some(1), "the holder is untouched");
}

#[test]
fn rule2_a_wait_ending_exactly_when_the_key_frees_is_granted() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.send(a, "A 1 k o 0 100\n");
    h.send(b, "A 1 k o 100 30\n");
    h.at(100);
    assert_eq!(h.take(b), "G 1 A k 2 30\n");
}

// ----- rule 3: leases -----------------------------------------------------

#[test]
fn rule3_leases_are_capped_at_the_server_maximum() {
    let mut h = leader();
    let a = h.connect();
    h.ask(
        a,
        "A 1 k o 0 5000\nA 2 j o 0 1000\nA 3 i o 0 999\n",
        "G 1 A k 1 1000\nG 2 A j 2 1000\nG 3 A i 3 999\n",
    );
    assert_eq!(h.server.holder("k").unwrap().expires_at, t(1000));
    h.at(999);
    assert_eq!(h.token("k"), Some(1));
    assert_eq!(h.token("i"), None);
    h.at(1000);
    assert_eq!(h.token("k"), None);
    // A waiter's lease is capped too.
    let mut h = leader();
    let a = h.connect();
    h.send(a, "A 1 k o 0 10\nA 2 k o 100 18446744073709551615\n");
    h.at(10);
    assert_eq!(h.take(a), "G 1 A k 1 10\nG 2 A k 2 1000\n");
}

#[test]
fn rule3_expiry_frees_the_key_and_grants_the_next_waiter() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.ask(a, "A 1 k o 0 100\n", "G 1 A k 1 100\n");
    h.send(b, "A 1 k o 1000 50\n");
    assert_eq!(h.server.poll_timeout(), Some(t(100)));
    h.at(99);
    assert_eq!(h.take(b), "");
    h.at(100);
    assert_eq!(h.take(b), "G 1 A k 2 50\n");
    assert_eq!(h.take(a), "", "the expired holder is not told");
    // The lease started at the grant.
    let holder = h.server.holder("k").unwrap();
    assert_eq!((holder.granted_at, holder.expires_at), (t(100), t(150)));
    // The expired grant's token no longer releases anything.
    h.ask(a, "R 2 k 1\n", "N 2 R k\n");
    h.at(150);
    assert_eq!(h.token("k"), None);
    h.ask(a, "A 3 k o 0 10\n", "G 3 A k 3 10\n");
}

#[test]
fn rule3_a_late_timer_fires_each_expiry_at_its_own_time() {
    let mut h = leader();
    let [a, b, c] = h.connect_many();
    h.send(a, "A 1 k o 0 100\n");
    h.send(b, "A 1 k o 1000 100\n");
    h.send(c, "A 1 k o 250 100\n");
    // One late call: a's lease ends at 100 (b granted until 200), b's at
    // 200 (c granted until 300, within its wait of 250).
    h.at(260);
    assert_eq!(h.take(b), "G 1 A k 2 100\n");
    assert_eq!(h.take(c), "G 1 A k 3 100\n");
    let holder = h.server.holder("k").unwrap();
    assert_eq!((holder.granted_at, holder.expires_at), (t(200), t(300)));
}

// ----- rule 4: release ----------------------------------------------------

#[test]
fn rule4_release_by_exact_token_is_d_anything_else_n() {
    let mut h = leader();
    let a = h.connect();
    h.ask(
        a,
        "A 1 k o 0 100\nA 2 j o 0 100\n",
        "G 1 A k 1 100\nG 2 A j 2 100\n",
    );
    h.ask(
        a,
        "R 3 k 2\nR 4 nokey 1\nR 5 k 0\n",
        "N 3 R k\nN 4 R nokey\nN 5 R k\n",
    );
    assert_eq!(h.token("k"), Some(1));
    h.ask(a, "R 6 k 1\nR 7 k 1\n", "D 6 R k\nN 7 R k\n");
    assert_eq!(h.token("k"), None);
    assert_eq!(h.token("j"), Some(2));
}

#[test]
fn rule4_a_release_is_never_answered_b() {
    let mut h = leader();
    let [a, b, c] = h.connect_many();
    h.send(a, "A 1 k o 0 100\n");
    h.send(b, "A 1 k o 500 100\nA 2 k o 500 100\n");
    h.send(c, "A 1 j o 0 100\nA 2 k o 500 100\n");
    assert_eq!(h.take(c), "G 1 A j 2 100\nB 2 A k\n", "every queue is full");
    h.ask(
        c,
        "R 3 k 5\nR 4 j 2\nR 5 k 1\n",
        "N 3 R k\nD 4 R j\nD 5 R k\n",
    );
    assert_eq!(h.take(b), "G 1 A k 3 100\n");
}

#[test]
fn rule4_a_grant_is_released_from_another_connection() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.ask(a, "A 1 k o 0 100\nA 2 k o 500 100\n", "G 1 A k 1 100\n");
    h.ask(b, "R 1 k 1\n", "D 1 R k\n");
    assert_eq!(h.take(a), "G 2 A k 2 100\n");
    assert_eq!(h.server.unanswered(a), Some(0));
}

// ----- rule 5: closed connections -----------------------------------------

#[test]
fn rule5_a_closed_connection_loses_its_waiters_but_not_its_grants() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.ask(b, "A 1 j o 0 100\n", "G 1 A j 1 100\n");
    h.ask(a, "A 1 k o 0 500\nA 2 j o 400 100\n", "G 1 A k 2 500\n");
    assert_eq!(h.server.queue_len("j"), 1);
    h.end(a);
    assert_eq!(h.server.queue_len("j"), 0, "the waiter was dropped");
    assert_eq!(h.server.lock_table().waiters(), 0);
    let holder = h.server.holder("k").unwrap();
    assert_eq!((holder.token, holder.conn), (2, a), "the grant stays");
    // j frees with nobody to grant; k is released by its token from b.
    h.ask(b, "R 2 j 1\nR 3 k 2\n", "D 2 R j\nD 3 R k\n");
    assert_eq!(h.take(a), "");
    assert_eq!((h.token("j"), h.token("k")), (None, None));
}

#[test]
fn rule5_a_grant_of_a_closed_connection_lasts_until_its_lease_runs_out() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.send(a, "A 1 k o 0 300\n");
    h.end(a);
    h.ask(b, "A 1 k o 0 100\nA 2 k o 1000 100\n", "T 1 A k\n");
    h.at(299);
    assert_eq!(h.take(b), "");
    h.at(300);
    assert_eq!(h.take(b), "G 2 A k 2 100\n");
}

// ----- rule 6: the window -------------------------------------------------

#[test]
fn rule6_more_than_window_unanswered_is_answered_e_window_and_closed() {
    let mut c = config();
    c.queue_limit = 10;
    c.max_waiters = 10;
    let mut h = Harness::new(c);
    let [a, b] = h.connect_many();
    h.ask(a, "A 1 k o 0 1000\n", "G 1 A k 1 1000\n");
    // Requests answered at once leave the window: many in a row are fine.
    for id in 100..120 {
        h.ask(b, &format!("R {id} nokey 1\n"), format!("N {id} R nokey\n"));
    }
    // The window is 4: four waiting acquires fit.
    h.send(
        b,
        "A 1 k o 5000 10\nA 2 k o 5000 10\nA 3 k o 5000 10\nA 4 k o 5000 10\n",
    );
    assert_eq!(h.take(b), "");
    assert_eq!(h.server.unanswered(b), Some(4));
    // An answer frees a slot.
    h.ask(a, "R 2 k 1\n", "D 2 R k\n");
    assert_eq!(h.take(b), "G 1 A k 2 10\n");
    assert_eq!(h.server.unanswered(b), Some(3));
    h.send(b, "A 5 k o 5000 10\n");
    assert_eq!(h.server.unanswered(b), Some(4));
    // A fifth unanswered request is one too many, even one that would be
    // answered at once: it is not served, and the connection closes.
    h.ask(b, "A 6 s o 0 10\nA 7 t o 0 10\n", "E window\n");
    assert!(h.closed(b));
    assert_eq!(
        h.token("s"),
        None,
        "the request over the window was not served"
    );
    assert_eq!(h.token("t"), None);
    assert_eq!(h.server.queue_len("k"), 0, "b's waiters were dropped");
    assert_eq!(h.token("k"), Some(2), "b's grant stays");
    assert!(!h.closed(a));
    h.ask(a, "R 3 k 2\n", "D 3 R k\n");
}

// ----- rule 7: roles ------------------------------------------------------

fn in_role(role: Role) -> Harness {
    let mut c = config();
    c.role = role;
    Harness::new(c)
}

#[test]
fn rule7_a_follower_answers_hello_with_m_and_closes() {
    let mut h = in_role(Role::Follower {
        leader: ep("leader.example:7878"),
    });
    let a = h.accept();
    h.ask(a, "H 1 c -\nA 1 k o 0 10\n", "M leader.example:7878\n");
    assert!(h.closed(a));
    assert_eq!(h.token("k"), None);
}

#[test]
fn rule7_a_node_without_leader_answers_e_no_leader() {
    let mut h = in_role(Role::NoLeader);
    let a = h.accept();
    h.ask(a, "H 1 c -\n", "E no_leader\n");
    assert!(h.closed(a));
}

#[test]
fn rule7_a_node_starting_or_draining_answers_e_not_active() {
    let mut h = in_role(Role::NotActive);
    let a = h.accept();
    h.ask(a, "H 1 c -\n", "E not_active\n");
    assert!(h.closed(a));
}

#[test]
fn rule7_a_leader_that_steps_down_sends_m_to_every_connection_and_closes() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    let fresh = h.accept();
    h.send(a, "A 1 k o 0 1000\n");
    h.send(b, "A 1 k o 5000 100\n");
    assert_eq!(h.take(a), "G 1 A k 1 1000\n");
    h.set_role(Role::Follower {
        leader: ep("n2:7878"),
    });
    for conn in [a, b, fresh] {
        assert_eq!(h.take(conn), "M n2:7878\n");
        assert!(h.closed(conn));
    }
    assert_eq!(h.server.connections(), 0);
    assert_eq!(h.token("k"), Some(1), "grants stay");
    assert_eq!(
        h.server.queue_len("k"),
        0,
        "waiters of closed connections go"
    );
    // New handshakes are redirected.
    let c = h.accept();
    h.ask(c, "H 1 c -\n", "M n2:7878\n");
    // And leading again serves them.
    h.set_role(Role::Leader);
    let d = h.connect();
    h.ask(d, "R 1 k 1\n", "D 1 R k\n");
}

#[test]
fn rule7_a_leader_that_steps_down_without_a_successor_sends_e_no_leader() {
    let mut h = leader();
    let [a, b] = h.connect_many();
    h.set_role(Role::NoLeader);
    for conn in [a, b] {
        assert_eq!(h.take(conn), "E no_leader\n");
        assert!(h.closed(conn));
    }
    let mut h = leader();
    let a = h.connect();
    h.set_role(Role::NotActive);
    assert_eq!(h.take(a), "E not_active\n");
    assert!(h.closed(a));
}

#[test]
fn rule7_a_change_between_roles_that_do_not_lead_closes_nothing() {
    let mut h = in_role(Role::NoLeader);
    let a = h.accept();
    h.set_role(Role::Follower { leader: ep("n3:1") });
    assert!(!h.closed(a));
    assert_eq!(h.take(a), "");
    h.ask(a, "H 1 c -\n", "M n3:1\n");
}

#[test]
fn rule7_a_leader_grants_only_until_its_leadership_is_certain_then_steps_down() {
    let mut h = leader();
    let [a, b] = h.connect_many_v2();
    assert!(h.server.lead_until(h.now, t(100)));
    h.send(a, "A 1 k o 0 100\nA 2 j o 0 1000\n");
    h.send(b, "A 1 k o 5000 10\n");
    assert_eq!(h.take(a), "G 1 A k 1 100 0\nG 2 A j 2 1000 0\n");
    h.at(60);
    // Extended before it ran out: still leading.
    assert!(h.server.lead_until(h.now, t(100)));
    h.ask(a, "X 3 j 2 1000\n", "G 3 X j 2 1000\n");
    // k's lease ends exactly when the leadership does: b is not granted.
    h.at(100);
    assert_eq!(h.take(a), "E no_leader\n");
    assert_eq!(h.take(b), "E no_leader\n");
    assert!(h.closed(a) && h.closed(b));
    assert_eq!(h.server.role(), &Role::NoLeader);
    assert_eq!(h.server.leading_until(), None);
    // A late extension changes nothing, and says so.
    assert!(!h.server.lead_until(h.now, t(5000)));
    let c = h.accept();
    h.ask(c, "H 2 c -\n", "E no_leader\n");
}

#[test]
fn rule7_a_request_that_arrives_as_the_leadership_ends_is_not_served() {
    let mut h = leader();
    let a = h.connect_v2();
    assert!(h.server.lead_until(h.now, t(100)));
    h.send(a, "A 1 k o 0 1000\n");
    h.take(a);
    // The driver was late (a paused process): the bytes come at 150.
    h.now = t(150);
    h.send(a, "A 2 j o 0 1000\nX 3 k 1 1000\n");
    assert_eq!(
        h.take(a),
        "E no_leader\n",
        "stepped down at 100, before the bytes"
    );
    assert_eq!(h.token("j"), None);
    assert_eq!(
        h.server.holder("k").unwrap().expires_at,
        t(1000),
        "not renewed"
    );
    assert!(!h.server.lead_until(h.now, t(10_000)));
}

#[test]
fn rule7_l_is_sent_to_every_connection_at_any_time_and_they_stay() {
    let mut h = leader();
    let a = h.connect();
    let fresh = h.accept();
    h.ask(a, "A 1 k o 5000 100\n", "G 1 A k 1 100\n");
    h.server.announce_leader(h.now, ep("n2:7878"));
    h.pump();
    assert_eq!(h.take(a), "L n2:7878\n");
    assert_eq!(h.take(fresh), "L n2:7878\n");
    assert!(!h.closed(a) && !h.closed(fresh));
    // The connections go on, and later handshakes get the hint after W.
    h.ask(a, "R 2 k 1\n", "D 2 R k\n");
    h.ask(fresh, "H 1 c -\n", "W n1 4\nL n2:7878\n");
    assert_eq!(h.server.leader_hint(), Some(&ep("n2:7878")));
}

// ----- rule 8: credentials ------------------------------------------------

#[test]
fn rule8_a_required_credential_refuses_wrong_ones_and_dash() {
    let mut c = config();
    c.credential = Some(Name::new("s3cret").unwrap());
    let mut h = Harness::new(c);
    for (hello, answer) in [
        ("H 1 c wrong\n", "E auth_failed\n"),
        ("H 1 c -\n", "E auth_failed\n"),
        ("H 1 c s3cret!\n", "E auth_failed\n"),
        ("H 1 c s3cre\n", "E auth_failed\n"),
        ("H 1 c s3cret\n", "W n1 4\n"),
    ] {
        let a = h.accept();
        h.send(a, hello);
        assert_eq!(h.take(a), answer, "{hello:?}");
        assert_eq!(h.closed(a), answer != "W n1 4\n");
    }
}

#[test]
fn rule8_a_server_without_credential_accepts_any() {
    let mut h = leader();
    for hello in ["H 1 c -\n", "H 1 c anything\n"] {
        let a = h.accept();
        h.ask(a, hello, "W n1 4\n");
    }
}

#[test]
fn rule8_credentials_are_checked_before_the_role() {
    let mut c = config();
    c.credential = Some(Name::new("s3cret").unwrap());
    c.role = Role::Follower { leader: ep("n2:1") };
    let mut h = Harness::new(c);
    let a = h.accept();
    h.ask(a, "H 1 c -\n", "E auth_failed\n");
    let b = h.accept();
    h.ask(b, "H 1 c s3cret\n", "M n2:1\n");
}

// ----- rule 10: the handshake timeout -------------------------------------

/// The usual configuration with a handshake timeout of 500 ms.
fn impatient() -> Harness {
    let mut c = config();
    c.handshake_timeout = Duration::from_millis(500);
    Harness::new(c)
}

#[test]
fn rule10_the_handshake_timeout_is_10_s_by_default_and_never_zero() {
    let c = Config::new(Name::new("n1").unwrap());
    assert_eq!(c.handshake_timeout, Duration::from_secs(10));
    let mut h = Harness::new(c);
    let a = h.accept();
    assert_eq!(h.server.poll_timeout(), Some(t(10_000)));
    h.at(9_999);
    assert!(!h.closed(a));
    h.at(10_000);
    assert_eq!(h.take(a), "E handshake_timeout\n");
    assert!(h.closed(a));

    let mut zero = config();
    zero.handshake_timeout = Duration::ZERO;
    let refused = Server::new(zero, Time::ZERO).map(|_| ()).unwrap_err();
    assert_eq!(refused, ConfigError::HandshakeTimeoutZero);
    assert!(
        refused.to_string().contains("handshake_timeout"),
        "{refused}"
    );
}

#[test]
fn rule10_a_connection_without_h_is_closed_at_exactly_accept_plus_the_timeout() {
    let mut h = impatient();
    h.at(100);
    let a = h.accept();
    assert_eq!(h.server.poll_timeout(), Some(t(600)), "a's deadline");
    h.at(300);
    let b = h.accept();
    assert_eq!(h.server.poll_timeout(), Some(t(600)), "a's comes first");
    // One nanosecond before: nothing.
    h.now = t(600).saturating_sub(Duration::from_nanos(1));
    h.server.handle_timeout(h.now);
    h.pump();
    assert_eq!((h.take(a), h.closed(a)), (String::new(), false));
    h.at(600);
    assert_eq!(h.take(a), "E handshake_timeout\n");
    assert!(h.closed(a) && !h.server.is_open(a));
    assert!(!h.closed(b), "b's deadline is its own");
    assert_eq!(h.server.poll_timeout(), Some(t(800)));
    h.at(799);
    assert!(!h.closed(b));
    h.at(800);
    assert_eq!(h.take(b), "E handshake_timeout\n");
    assert!(h.closed(b));
    assert_eq!(h.server.poll_timeout(), None, "no timer is left");
    assert_eq!(h.server.connections(), 0);
    // Bytes after the close are ignored.
    h.ask(a, "H 1 late -\n", "");
}

#[test]
fn rule10_a_connection_that_sent_h_is_never_closed_by_the_timeout() {
    let mut h = impatient();
    let a = h.accept();
    h.at(499);
    assert_eq!(h.server.poll_timeout(), Some(t(500)), "a's deadline");
    h.ask(a, "H 1 a -\n", "W n1 4\n");
    assert_eq!(
        h.server.poll_timeout(),
        None,
        "the deadline went with the H"
    );
    for ms in [500, 501, 10_000, 1_000_000] {
        h.at(ms);
        assert!(!h.closed(a), "closed at {ms} ms");
    }
    h.ask(a, "A 1 k o 0 10\n", "G 1 A k 1 10\n");

    // A refused H ends the connection at once, and leaves no timer either.
    let mut c = config();
    c.handshake_timeout = Duration::from_millis(500);
    c.role = Role::NotActive;
    let mut h = Harness::new(c);
    let b = h.accept();
    assert_eq!(h.server.poll_timeout(), Some(t(500)), "b's deadline");
    h.ask(b, "H 1 b -\n", "E not_active\n");
    assert!(h.closed(b));
    assert_eq!(h.server.poll_timeout(), None);
}

#[test]
fn rule10_an_h_that_arrives_at_the_deadline_is_too_late() {
    let mut h = impatient();
    let a = h.accept();
    let b = h.accept();
    // Both arrive at 500 ms: the timer that is due fires first.
    h.now = t(500);
    h.ask(a, "H 1 a -\n", "E handshake_timeout\n");
    assert!(h.closed(a));
    assert_eq!(h.take(b), "E handshake_timeout\n");
    assert!(h.closed(b), "every input fires the timers due at its time");
}

#[test]
fn rule10_a_partial_h_does_not_count() {
    let mut h = impatient();
    let a = h.accept();
    let b = h.accept();
    h.at(100);
    // All of `H` but its newline, and a request after an unfinished one.
    h.send(a, "H 1 a -");
    h.send(b, "H 1 b -\nA 1 k o 0 10");
    assert_eq!(h.take(a), "");
    assert_eq!(h.take(b), "W n1 4\n", "b's H was whole");
    h.at(499);
    h.send(a, " ");
    assert!(!h.closed(a));
    h.at(500);
    assert_eq!(h.take(a), "E handshake_timeout\n");
    assert!(h.closed(a));
    // The newline that would have finished it changes nothing.
    h.ask(a, "\n", "");
    // b's unfinished request is not a handshake matter.
    assert!(!h.closed(b));
    h.ask(b, "\n", "G 1 A k 1 10\n");

    // An H that comes byte by byte is whole when its newline is.
    let c = h.accept();
    let hello = "H 1 c -\n";
    for (i, byte) in hello.bytes().enumerate() {
        h.at(500 + 50 * i as u64);
        h.server.handle_bytes(h.now, c, &[byte]);
        h.pump();
    }
    assert_eq!(h.take(c), "W n1 4\n", "the newline came at 850 ms");
    h.at(2_000);
    assert!(!h.closed(c));
}

#[test]
fn rule10_a_connection_that_ends_before_its_deadline_leaves_no_timer() {
    let mut h = impatient();
    let a = h.accept();
    h.at(100);
    assert_eq!(h.server.poll_timeout(), Some(t(500)), "a's deadline");
    h.end(a);
    assert_eq!(h.server.poll_timeout(), None);
    h.at(1_000);
    assert_eq!(h.take(a), "");
    assert!(!h.closed(a), "the server does not close what ended");
}

/// All the actions after one late input, in order.
fn drain(server: &mut Server) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    while let Some(action) = server.poll_action() {
        out.push(match action {
            Action::Send { conn, data } => (conn.get(), String::from_utf8(data.to_vec()).unwrap()),
            Action::Close { conn } => (conn.get(), "<close>".to_string()),
            other => panic!("unexpected action {other:?}"),
        });
    }
    out
}

#[test]
fn rule10_a_late_input_fires_handshake_timeouts_among_the_other_timers_in_time_order() {
    let mut c = config();
    c.handshake_timeout = Duration::from_millis(500);
    let run = || {
        let mut s = Server::new(c.clone(), Time::ZERO).unwrap();
        // `holder` holds k until 1000 ms; `waiter` waits for it.
        let holder = s.handle_accept(t(0));
        let waiter = s.handle_accept(t(0));
        s.handle_bytes(t(0), holder, b"H 1 h -\nA 1 k o 0 1000\n");
        s.handle_bytes(t(0), waiter, b"H 1 w -\nA 1 k o 5000 10\n");
        let early = s.handle_accept(t(400)); // closed at 900
        let exact = s.handle_accept(t(500)); // closed at 1000, with the expiry
        let late = s.handle_accept(t(700)); // closed at 1200
        let before = drain(&mut s);
        assert_eq!(
            before,
            [
                (holder.get(), "W n1 4\nG 1 A k 1 1000\n".to_string()),
                (waiter.get(), "W n1 4\n".to_string()),
            ]
        );
        assert_eq!(s.poll_timeout(), Some(t(900)));
        // The driver wakes late, once, at 2 s, with bytes from `holder`.
        s.handle_bytes(t(2000), holder, b"R 2 k 2\n");
        let after = drain(&mut s);
        ((early, exact, late, waiter, holder), after)
    };
    let ((early, exact, late, waiter, holder), after) = run();
    let timeout = "E handshake_timeout\n".to_string();
    assert_eq!(
        after,
        [
            (early.get(), timeout.clone()),
            (early.get(), "<close>".to_string()),
            // At 1000 ms the lease ends first, then the handshake timeout.
            (waiter.get(), "G 1 A k 2 10\n".to_string()),
            (exact.get(), timeout.clone()),
            (exact.get(), "<close>".to_string()),
            (late.get(), timeout),
            (late.get(), "<close>".to_string()),
            // The input itself last: `waiter`'s grant (token 2) had ended
            // at 1010 ms.
            (holder.get(), "N 2 R k\n".to_string()),
        ]
    );
    assert_eq!(run().1, after, "deterministic");
}

// ----- version 2: waited_ms and renewal (rules 3 and 9) ---------------------

#[test]
fn rule3_a_v2_grant_says_how_long_it_waited_in_whole_ms_rounded_down() {
    let mut h = leader();
    let a = h.connect();
    let b = h.connect_v2();
    let c = h.connect();
    h.ask(a, "A 1 k o 0 1000\n", "G 1 A k 1 1000\n");
    h.at_ns(400_000); // 0.4 ms
    h.send(b, "A 1 k o 5000 300\n");
    h.send(c, "A 1 k o 5000 300\n");
    assert_eq!(h.take(b), "", "queued");
    h.at(999);
    assert_eq!(h.take(b), "");
    h.at(1000);
    // Waited 999.6 ms: 999, rounded down.
    assert_eq!(h.take(b), "G 1 A k 2 300 999\n");
    h.at(1300);
    assert_eq!(
        h.take(c),
        "G 1 A k 3 300\n",
        "version 1 grants keep their form, waiting or not"
    );
}

#[test]
fn rule3_waited_ms_is_never_more_than_the_wait_asked() {
    let mut h = leader();
    let a = h.connect();
    let b = h.connect_v2();
    h.send(a, "A 1 k o 0 1000\n");
    h.send(b, "A 7 k o 1000 10\n");
    // Its wait ends exactly when the key frees: granted, after all of it.
    h.at(1000);
    assert_eq!(h.take(b), "G 7 A k 2 10 1000\n");
    // Released by token, the next waiter is granted at the release.
    h.ask(b, "A 8 k o 50 10\nR 9 k 2\n", "D 9 R k\nG 8 A k 3 10 0\n");
}

#[test]
fn rule9_a_renewal_by_exact_token_extends_the_lease_from_now() {
    let mut h = leader();
    let a = h.connect_v2();
    h.ask(a, "A 1 k o 0 100\n", "G 1 A k 1 100 0\n");
    h.at(50);
    h.ask(a, "X 2 k 1 200\n", "G 2 X k 1 200\n");
    assert_eq!(h.server.holder("k").unwrap().expires_at, t(250));
    assert_eq!(h.token("k"), Some(1), "the token stays");
    h.at(249);
    assert_eq!(h.token("k"), Some(1), "past its first lease");
    h.at(250);
    assert_eq!(h.token("k"), None, "the renewed lease ran out");
}

#[test]
fn rule9_a_renewal_never_shortens_and_is_capped_at_the_maximum() {
    let mut h = leader();
    let a = h.connect_v2();
    h.send(a, "A 1 k o 0 800\n");
    h.take(a);
    h.at(100);
    h.send(a, "X 2 k 1 10\n");
    assert_eq!(
        h.take(a),
        "G 2 X k 1 10\n",
        "answered G, the lease it asked, even though it shortens nothing"
    );
    assert_eq!(h.server.holder("k").unwrap().expires_at, t(800));
    h.send(a, "X 3 k 1 5000\n");
    assert_eq!(h.take(a), "G 3 X k 1 1000\n", "capped at the 1 s maximum");
    assert_eq!(h.server.holder("k").unwrap().expires_at, t(1100));
}

#[test]
fn rule9_anything_but_the_current_grant_s_exact_token_is_answered_n() {
    let mut h = leader();
    let [a, b] = h.connect_many_v2();
    h.send(a, "A 1 k o 0 100\n");
    h.take(a);
    h.ask(
        a,
        "X 2 k 2 100\nX 3 nope 1 100\nX 4 k 0 100\n",
        "N 2 X k\nN 3 X nope\nN 4 X k\n",
    );
    // From any connection, by token.
    h.ask(b, "X 1 k 1 100\n", "G 1 X k 1 100\n");
    // Gone: a renewal never brings it back.
    h.ask(b, "R 2 k 1\nX 3 k 1 100\n", "D 2 R k\nN 3 X k\n");
    h.ask(a, "A 5 k o 0 100\n", "G 5 A k 2 100 0\n");
    h.at(100);
    h.send(a, "X 6 k 2 100\n");
    assert_eq!(h.take(a), "N 6 X k\n", "expired: gone");
}

#[test]
fn rule9_a_renewal_is_never_queued_nor_answered_b_or_t() {
    let mut h = leader();
    let [a, b] = h.connect_many_v2();
    h.send(a, "A 1 k o 0 100\nA 2 j o 0 100\n");
    h.take(a);
    // Both queues and the server's waiters full (2 per key, 3 in all).
    h.send(
        b,
        "A 1 k o 5000 10\nA 2 k o 5000 10\nA 3 j o 5000 10\nA 4 k o 5000 10\n",
    );
    assert_eq!(h.take(b), "B 4 A k\n");
    h.ask(a, "X 3 k 1 500\n", "G 3 X k 1 500\n");
    assert_eq!(h.server.queue_len("k"), 2);
    h.at(100);
    assert_eq!(h.take(b), "G 3 A j 3 10 100\n", "j ran out at 100");
    h.at(500);
    assert_eq!(h.take(b), "G 1 A k 4 10 500\n", "k only at its renewed end");
}

#[test]
fn rule9_on_a_version_1_connection_x_is_a_protocol_violation() {
    let mut h = leader();
    let a = h.connect();
    h.ask(
        a,
        "A 1 k o 0 100\nX 2 k 1 100\nR 3 k 1\n",
        "G 1 A k 1 100\nE bad_frame\n",
    );
    assert!(h.closed(a));
    assert_eq!(
        h.token("k"),
        Some(1),
        "the grant stays; nothing after X is read"
    );
}

// ----- tokens -------------------------------------------------------------

#[test]
fn tokens_strictly_increase_across_grants_keys_and_expiries() {
    let mut c = config();
    c.queue_limit = 10;
    c.max_waiters = 10;
    let mut h = Harness::new(c);
    let a = h.connect();
    let mut tokens = Vec::new();
    let mut id = 0;
    for round in 0..20u64 {
        for key in ["k", "j"] {
            id += 1;
            h.send(a, &format!("A {id} {key} o 0 {}\n", 5 + round % 3));
        }
        h.at(h.now.as_millis() + 10);
        for line in h.take(a).lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            assert_eq!(fields[0], "G", "{line}");
            tokens.push(fields[4].parse::<u64>().unwrap());
        }
    }
    assert_eq!(tokens.len(), 40);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

// ----- section 4.1: terms, epochs and recovery ------------------------------

const E: u64 = 1_700_000_000_000;

/// The first token of the term with `epoch`, plus `n - 1`.
fn tok(epoch: u64, n: u64) -> u64 {
    ticketing::server::token(epoch, n).unwrap()
}

/// A leader of `config()` (leases of at most 1 s) whose term began at 0 as
/// `term` says, with a grace margin of 100 ms.
fn in_term(term: Term) -> Harness {
    let mut c = config();
    c.grace_margin = Duration::from_millis(100);
    let mut h = Harness::new(c);
    h.server.begin_term(h.now, term).unwrap();
    h.pump();
    h
}

#[test]
fn epochs_tokens_are_epoch_times_2_pow_22_plus_n_from_1() {
    let mut h = in_term(Term::First { epoch: E });
    let a = h.connect_v2();
    h.send(a, "A 1 k o 0 10\nA 2 j o 0 10\n");
    let (k, j) = (tok(E, 1), tok(E, 2));
    assert_eq!(k, E * 4_194_304 + 1);
    assert_eq!(h.take(a), format!("G 1 A k {k} 10 0\nG 2 A j {j} 10 0\n"));
    assert_eq!(h.server.epoch(), E);
    assert_eq!(h.server.grace_until(), None, "a first term has no grace");
}

#[test]
fn epochs_a_term_that_is_not_later_is_refused_and_changes_nothing() {
    let mut h = in_term(Term::First { epoch: E });
    let a = h.connect();
    h.send(a, "A 1 k o 0 1000\n");
    h.take(a);
    for epoch in [E - 1, E] {
        assert_eq!(
            h.server.begin_term(h.now, Term::First { epoch }),
            Err(TermError::EpochNotGreater { epoch, current: E })
        );
    }
    let too_late = ticketing::server::MAX_EPOCH + 1;
    assert_eq!(
        h.server.begin_term(h.now, Term::First { epoch: too_late }),
        Err(TermError::EpochTooLarge { epoch: too_late })
    );
    assert_eq!(h.token("k"), Some(tok(E, 1)), "the table is untouched");
    assert_eq!(h.server.begin_epoch(h.now, E + 1), Err(TermError::NotAsked));
}

#[test]
fn tokens_of_a_later_term_are_greater_for_every_key() {
    let mut h = in_term(Term::First { epoch: 7 });
    let a = h.connect();
    for id in 1..=5 {
        h.send(a, &format!("A {id} k{id} o 0 10\n"));
    }
    h.take(a);
    h.at(10);
    h.server
        .begin_term(h.now, Term::First { epoch: 8 })
        .unwrap();
    let b = h.connect();
    h.ask(b, "A 1 k5 o 0 10\n", format!("G 1 A k5 {} 10\n", tok(8, 1)));
    assert!(tok(8, 1) > tok(7, 5));
}

#[test]
fn grace_a_term_without_the_table_grants_nothing_for_max_lease_plus_margin() {
    // An earlier term could have given 400 ms leases; the margin is 100.
    let mut h = in_term(Term::Recovered {
        epoch: E,
        max_lease: Duration::from_millis(400),
    });
    assert_eq!(h.server.grace_until(), Some(t(500)));
    let a = h.connect_v2();
    let b = h.connect();
    h.send(a, "A 1 k o 0 10\n");
    assert_eq!(
        h.take(a),
        "T 1 A k\n",
        "a try-lock is not granted in the grace"
    );
    h.send(a, "A 2 k o 1000 10\nA 3 j o 200 10\n");
    h.send(b, "A 1 k o 1000 10\nA 2 k o 1000 10\n");
    assert_eq!(h.take(a), "", "queued");
    assert_eq!(h.take(b), "B 2 A k\n", "2 waiters per key at most");
    h.at(200);
    assert_eq!(h.take(a), "T 3 A j\n", "its wait ran out before the grace");
    h.at(499);
    assert_eq!((h.take(a), h.take(b)), (String::new(), String::new()));
    h.at(500);
    assert_eq!(h.take(a), format!("G 2 A k {} 10 500\n", tok(E, 1)));
    assert_eq!(h.server.grace_until(), None);
    h.at(510);
    assert_eq!(h.take(b), format!("G 1 A k {} 10\n", tok(E, 2)), "in order");
    h.ask(a, "A 4 z o 0 10\n", format!("G 4 A z {} 10 0\n", tok(E, 3)));
}

#[test]
fn grace_a_renewal_of_an_earlier_epoch_s_token_reclaims_the_key() {
    let mut h = in_term(Term::Recovered {
        epoch: E,
        max_lease: Duration::from_millis(400),
    });
    let old = tok(E - 5, 42);
    let [a, b] = h.connect_many_v2();
    h.send(b, "A 1 k o 5000 100\n");
    h.at(10);
    h.send(a, &format!("X 1 k {old} 5000\n"));
    assert_eq!(
        h.take(a),
        format!("G 1 X k {old} 1000\n"),
        "reclaimed: the token kept, the lease capped"
    );
    let holder = h.server.holder("k").unwrap();
    assert_eq!((holder.token, holder.expires_at), (old, t(1010)));
    // Renewed as any grant; released by its token.
    h.at(300);
    h.ask(
        a,
        &format!("X 2 k {old} 800\n"),
        format!("G 2 X k {old} 800\n"),
    );
    h.at(600);
    assert_eq!(h.take(b), "", "the grace is over, but the key is held");
    h.ask(a, &format!("R 3 k {old}\n"), "D 3 R k\n");
    assert_eq!(h.take(b), format!("G 1 A k {} 100 600\n", tok(E, 1)));
}

#[test]
fn grace_a_later_reclaim_with_a_greater_token_replaces_the_earlier() {
    let mut h = in_term(Term::Recovered {
        epoch: E,
        max_lease: Duration::from_millis(400),
    });
    let (older, newer) = (tok(E - 2, 9), tok(E - 1, 3));
    let [a, b] = h.connect_many_v2();
    h.ask(
        a,
        &format!("X 1 k {older} 300\n"),
        format!("G 1 X k {older} 300\n"),
    );
    h.ask(
        b,
        &format!("X 1 k {newer} 300\n"),
        format!("G 1 X k {newer} 300\n"),
    );
    assert_eq!(h.token("k"), Some(newer));
    h.send(a, &format!("X 2 k {older} 300\nR 3 k {older}\n"));
    assert_eq!(
        h.take(a),
        "N 2 X k\nN 3 R k\n",
        "the replaced token is gone"
    );
    assert_eq!(h.token("k"), Some(newer));
}

#[test]
fn grace_unknown_tokens_of_this_term_and_releases_are_answered_n() {
    let mut h = in_term(Term::Recovered {
        epoch: E,
        max_lease: Duration::from_millis(400),
    });
    let a = h.connect_v2();
    let this_term = tok(E, 1);
    let old = tok(E - 1, 1);
    h.send(
        a,
        &format!("X 1 k {this_term} 100\nR 2 k {old}\nX 3 k 0 100\nR 4 j {this_term}\n"),
    );
    assert_eq!(h.take(a), "N 1 X k\nN 2 R k\nN 3 X k\nN 4 R j\n");
    assert_eq!(h.token("k"), None);
}

#[test]
fn grace_when_it_ends_reclaiming_ends() {
    let mut h = in_term(Term::Recovered {
        epoch: E,
        max_lease: Duration::from_millis(400),
    });
    let a = h.connect_v2();
    h.at(500);
    h.ask(a, &format!("X 1 k {} 100\n", tok(E - 1, 1)), "N 1 X k\n");
    assert_eq!(h.token("k"), None);
}

#[test]
fn clean_stops_keep_the_table_with_the_time_stopped_counted_and_no_grace() {
    let mut one = in_term(Term::First { epoch: E });
    let a = one.connect_v2();
    one.send(a, "A 1 k o 0 1000\nA 2 j o 0 300\nA 3 k o 5000 10\n");
    one.at(100);
    let image = one
        .server
        .table_image(one.now, Duration::from_secs(1_700_000_000));
    let bytes = image.encode();
    let image = TableImage::decode(&bytes).unwrap();
    assert_eq!(image.count, 2);
    assert_eq!(
        image
            .grants
            .iter()
            .map(|g| (g.key.as_str(), g.remaining_ms))
            .collect::<Vec<_>>(),
        [("j", 200), ("k", 900)],
        "the waiter is not in it"
    );
    // 250 ms later by the wall clock, another server goes on from it.
    let mut two = in_term(Term::Resumed {
        epoch: E + 1,
        image,
        stopped: Duration::from_millis(250),
    });
    assert_eq!(two.server.grace_until(), None, "no grace");
    assert_eq!(two.token("j"), None, "its lease ran out while stopped");
    assert_eq!(two.server.holder("k").unwrap().expires_at, t(650));
    let b = two.connect_v2();
    two.ask(
        b,
        "A 1 k o 5000 10\nA 2 j o 0 10\n",
        format!("G 2 A j {} 10 0\n", tok(E + 1, 1)),
    );
    two.ask(
        b,
        &format!("X 3 k {} 1000\n", tok(E, 1)),
        format!("G 3 X k {} 1000\n", tok(E, 1)),
    );
    two.send(b, &format!("R 4 k {}\n", tok(E, 1)));
    assert_eq!(
        two.take(b),
        format!("D 4 R k\nG 1 A k {} 10 0\n", tok(E + 1, 2))
    );
}

#[test]
fn clean_stops_a_table_written_in_a_grace_keeps_the_rest_of_it() {
    let mut one = in_term(Term::Recovered {
        epoch: E,
        max_lease: Duration::from_millis(400),
    });
    one.at(200);
    let image = one.server.table_image(one.now, Duration::ZERO);
    assert_eq!(image.grace_ms, 300);
    let mut two = in_term(Term::Resumed {
        epoch: E + 1,
        image: image.clone(),
        stopped: Duration::from_millis(100),
    });
    assert_eq!(two.server.grace_until(), Some(t(200)));
    assert!(matches!(
        two.server.begin_term(
            two.now,
            Term::Resumed {
                epoch: E,
                image,
                stopped: Duration::ZERO
            }
        ),
        Err(TermError::EpochNotGreater { .. })
    ));
}

#[test]
fn clean_stops_a_torn_or_truncated_table_is_an_error_never_a_table() {
    let mut one = in_term(Term::First { epoch: E });
    let a = one.connect();
    one.send(a, "A 1 k o 0 1000\n");
    let bytes = one.server.table_image(one.now, Duration::ZERO).encode();
    for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
        assert!(TableImage::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    let mut torn = bytes.clone();
    torn[30] ^= 1;
    assert!(matches!(
        TableImage::decode(&torn),
        Err(ImageError::Checksum | ImageError::Malformed { .. })
    ));
    assert!(TableImage::decode(b"\xff\x00 garbage").is_err());
}

// ----- the lock table moves between servers --------------------------------

#[test]
fn the_lock_table_moves_with_leadership_between_servers() {
    let mut one = leader();
    let mut c = config();
    c.node_id = Name::new("n2").unwrap();
    c.role = Role::Follower { leader: ep("n1:1") };
    let mut two = Harness::new(c);

    let [a, b] = one.connect_many();
    one.send(a, "A 1 k o 0 1000\nA 2 j o 0 400\n");
    one.send(b, "A 1 k o 5000 100\n");
    assert_eq!(one.take(a), "G 1 A k 1 1000\nG 2 A j 2 400\n");

    one.at(100);
    two.at(100);
    one.set_role(Role::Follower { leader: ep("n2:1") });
    assert_eq!(one.take(a), "M n2:1\n");
    assert_eq!(one.take(b), "M n2:1\n");
    let table = one.server.take_lock_table(one.now);
    assert_eq!((table.last_token(), table.waiters()), (2, 0));
    assert_eq!(one.token("k"), None);
    two.server.install_lock_table(two.now, table);
    two.set_role(Role::Leader);

    // The grants, with their leases, carry on at the new leader.
    let x = two.accept();
    two.ask(x, "H 1 c -\n", "W n2 4\n");
    assert_eq!(two.server.holder("k").unwrap().expires_at, t(1000));
    two.ask(
        x,
        "A 1 k o 0 10\nR 2 j 1\nR 3 k 1\nA 4 k o 0 10\n",
        "T 1 A k\nN 2 R j\nD 3 R k\nG 4 A k 3 10\n",
    );
    two.at(399);
    assert_eq!(two.token("j"), Some(2));
    two.at(400);
    assert_eq!(
        two.token("j"),
        None,
        "the lease ran out at its original time"
    );
    // The old leader, should it lead again without a table, goes on after
    // the tokens it gave (1 and 2), never back.
    one.server.set_role(one.now, Role::Leader);
    let y = one.connect();
    one.ask(y, "A 1 z o 0 10\n", "G 1 A z 3 10\n");
}

#[test]
fn installing_a_copy_of_a_live_table_drops_its_waiters_and_keeps_tokens_rising() {
    let mut one = leader();
    let a = one.connect();
    one.send(a, "A 1 k o 0 1000\nA 2 k o 5000 10\n");
    let copy = one.server.lock_table().clone();
    assert_eq!(copy.waiters(), 1);

    let mut two = leader();
    let b = two.connect();
    for id in 1..=4 {
        two.send(b, &format!("A {id} x{id} o 0 1000\n"));
    }
    two.send(b, "A 5 x1 o 5000 10\n");
    assert_eq!(
        two.take(b),
        "G 1 A x1 1 1000\nG 2 A x2 2 1000\nG 3 A x3 3 1000\nG 4 A x4 4 1000\n"
    );
    let c = two.connect();
    two.server.install_lock_table(two.now, copy);
    two.pump();
    // b had a waiter in the replaced table: it cannot be answered any more.
    assert_eq!(two.take(b), "E not_active\n");
    assert!(two.closed(b));
    assert!(!two.closed(c));
    assert_eq!(two.server.lock_table().waiters(), 0);
    assert_eq!(two.token("x1"), None);
    assert_eq!(two.token("k"), Some(1));
    two.send(c, "A 1 new o 0 10\n");
    assert_eq!(
        two.take(c),
        "G 1 A new 5 10\n",
        "above every token either table gave"
    );
}

// ----- robustness ---------------------------------------------------------

#[test]
fn arbitrary_bytes_never_panic_and_end_only_their_connection() {
    use ticketing::rng::Rng;
    use ticketing::wire::ServerFrame;

    let mut rng = Rng::new(2024);
    let mut h = leader();
    let steady = h.connect();
    let alphabet = b"HARWGTBDNLME 0123456789k-o\n\r\x00\xff~";
    for round in 0..500u64 {
        let junk = h.accept();
        if rng.chance(1, 2) {
            h.send(junk, "H 1 junk -\n");
        }
        let len = rng.up_to(1500) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                if rng.chance(1, 3) {
                    rng.next_u64() as u8
                } else {
                    alphabet[rng.up_to(alphabet.len() as u64 - 1) as usize]
                }
            })
            .collect();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let n = (rng.up_to(64) as usize + 1).min(rest.len());
            h.server.handle_bytes(h.now, junk, &rest[..n]);
            rest = &rest[n..];
        }
        h.pump();
        // Whatever it said was valid frames; a close came after an `E`.
        let said = h.take(junk);
        for line in said.lines() {
            assert!(ServerFrame::parse(line.as_bytes()).is_ok(), "{line:?}");
        }
        if h.closed(junk) {
            assert!(
                said.lines().last().is_some_and(|l| l.starts_with("E ")),
                "{said:?}"
            );
        }
        h.end(junk);
        // The steady connection is untouched and served.
        assert!(!h.closed(steady));
        h.ask(
            steady,
            &format!("R {round} none 1\n"),
            format!("N {round} R none\n"),
        );
    }
    assert_eq!(h.server.connections(), 1);
    assert_eq!(h.server.lock_table().waiters(), 0);
}

#[test]
fn rule10_a_connection_whose_answers_are_not_written_is_not_read_from_until_they_drain() {
    // Answers to `R` are 11 bytes here ("N 1 R k\n" grows with the id);
    // a limit of 1024 bytes is reached after about a hundred of them.
    let mut c = config();
    c.window = 1_000_000;
    c.max_unwritten = 1024;
    let mut h = Harness::new(c);
    let a = h.accept();
    h.send(a, "H 1 c1 -\n");
    let b = h.accept();
    h.ask(b, "H 1 c2 -\n", "W n1 1000000\n");
    let welcome = h.take(a).len();
    assert!(h.server.is_reading(a) && h.server.is_reading(b));
    // The driver takes every Send but reports none of it written.
    let mut sent = welcome;
    let mut id = 0;
    while h.server.is_reading(a) {
        id += 1;
        h.send(a, &format!("R {id} k 5\n"));
        sent += h.take(a).len();
    }
    assert!(
        sent >= 1024,
        "not read from only once 1024 bytes wait: {sent}"
    );
    assert!(sent < 1024 + 32, "held back at once: {sent}");
    // The other connection is read from, and answered, as before.
    assert!(h.server.is_reading(b));
    h.ask(b, "R 1 k 5\n", "N 1 R k\n");
    // Half written is not enough to read again; more than half is.
    h.server.handle_written(h.now, a, sent / 2 - 1);
    assert!(
        !h.server.is_reading(a),
        "at {} of 1024 bytes",
        sent - (sent / 2 - 1)
    );
    h.server
        .handle_written(h.now, a, sent - 512 - (sent / 2 - 1));
    assert!(h.server.is_reading(a), "down to half");
    // A connection the server does not have is not read from.
    h.send(a, "X\n");
    assert!(h.closed(a));
    assert!(!h.server.is_reading(a));
}

// ----- Server::stats (issue 14) --------------------------------------------

#[test]
fn stats_count_every_answer_by_kind_expiries_waiters_and_connections() {
    let mut h = leader();
    let [a, b] = h.connect_many_v2();
    h.send(a, "A 1 k o 0 100\n");
    h.send(
        b,
        "A 1 k o 0 100\nA 2 k o 5000 100\nA 3 k o 5000 100\nA 4 k o 5000 100\n",
    );
    let s = h.server.stats();
    assert_eq!((s.grants, s.timed_out, s.busy), (1, 1, 1));
    assert_eq!((s.waiters, s.max_waiters), (2, 2));
    assert_eq!((s.accepted, s.connections), (2, 2));
    let token = h.token("k").unwrap();
    h.send(a, &format!("X 2 k {token} 100\nX 3 k 999 100\nR 4 k 999\n"));
    let s = h.server.stats();
    assert_eq!((s.renewals, s.renewals_gone, s.not_held), (1, 1, 1));
    h.send(a, &format!("R 5 k {token}\n"));
    let s = h.server.stats();
    assert_eq!(s.releases, 1);
    assert_eq!(
        (s.grants, s.waiters, s.max_waiters),
        (2, 1, 2),
        "the next waiter got it"
    );
    // The new holder's lease runs out, the last waiter gets it; then that
    // one runs out too.
    h.at(1_000);
    h.at(2_000);
    let s = h.server.stats();
    assert_eq!((s.expiries, s.grants, s.waiters), (2, 3, 0));
    h.server.handle_closed(h.now, b);
    assert_eq!(h.server.stats().connections, 1);
}

#[test]
fn stats_tell_the_epoch_the_grace_and_reclaims() {
    let mut h = in_term(Term::Recovered {
        epoch: E,
        max_lease: Duration::from_millis(400),
    });
    let s = h.server.stats();
    assert_eq!((s.epoch, s.in_grace), (E, true));
    let a = h.connect_v2();
    h.at(10);
    h.send(a, &format!("X 1 k {} 5000\n", tok(E - 5, 42)));
    let s = h.server.stats();
    assert_eq!((s.reclaims, s.renewals), (1, 1));
    h.at(500);
    assert!(!h.server.stats().in_grace);
}
