//! A small harness for scenario tests: drives one client core with bytes and
//! times, and records every action and event it hands out.
#![allow(dead_code)]

use std::time::Duration;

use ticketing::client::{
    Action, BackoffCause, Client, CloseReason, Config, ConnId, Event, OpId, Outcome,
};
use ticketing::{Endpoint, Key, Name, Time};

/// The test configuration: endpoints `a:1` and `b:2`, client id `c1`, no
/// credential, seed 7, every other setting at its default.
pub fn config() -> Config {
    let mut c = Config::new([ep("a:1"), ep("b:2")], Name::new("c1").unwrap());
    c.seed = 7;
    c
}

pub fn ep(s: &str) -> Endpoint {
    Endpoint::new(s).unwrap()
}

pub fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

pub fn name(s: &str) -> Name {
    Name::new(s).unwrap()
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn t(ms: u64) -> Time {
    Time::from_millis(ms)
}

/// One client core and everything it said.
pub struct Harness {
    pub client: Client,
    pub now: Time,
    /// Every action handed out, in order.
    pub actions: Vec<Action>,
    /// Bytes sent since the last `take_sent`, across connections.
    sent: Vec<u8>,
    /// Events handed out since the last `take_events`.
    events: Vec<Event>,
}

impl Harness {
    /// A client made at t=0 with `config`, its first outputs drained.
    pub fn new(config: Config) -> Harness {
        let client = Client::new(config, Time::ZERO).expect("valid config");
        let mut h = Harness {
            client,
            now: Time::ZERO,
            actions: Vec::new(),
            sent: Vec::new(),
            events: Vec::new(),
        };
        h.pump();
        h
    }

    /// Drains actions and events until both are empty, and checks that
    /// `poll_timeout` then lies in the future (or is `None`).
    pub fn pump(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(action) = self.client.poll_action() {
                if let Action::Send { data, .. } = &action {
                    self.sent.extend_from_slice(data);
                }
                self.actions.push(action);
                progressed = true;
            }
            while let Some(event) = self.client.poll_event() {
                self.events.push(event);
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
        if let Some(deadline) = self.client.poll_timeout() {
            assert!(
                deadline > self.now,
                "poll_timeout {deadline} is not after now {} although everything was drained",
                self.now
            );
        }
    }

    /// Moves the clock to `ms` (milliseconds since the start), fires what is
    /// due and drains.
    pub fn at_ms(&mut self, ms: u64) {
        self.at(t(ms));
    }

    /// Moves the clock to `now`, fires what is due and drains.
    pub fn at(&mut self, now: Time) {
        assert!(now >= self.now, "time goes forward in tests");
        self.now = now;
        self.client.handle_timeout(now);
        self.pump();
    }

    /// Jumps to the client's next deadline, fires it and drains. Returns the
    /// time jumped to.
    pub fn next_deadline(&mut self) -> Time {
        let deadline = self.client.poll_timeout().expect("a deadline");
        self.at(deadline);
        deadline
    }

    /// The latest `Connect` action: its connection and address.
    pub fn last_connect(&self) -> Option<(ConnId, Endpoint)> {
        self.actions.iter().rev().find_map(|a| match a {
            Action::Connect { conn, addr } => Some((*conn, addr.clone())),
            _ => None,
        })
    }

    /// Completes the latest connect: the transport is up.
    pub fn connect(&mut self) -> ConnId {
        let (conn, _) = self.last_connect().expect("a connect action");
        self.client.handle_connected(self.now, conn);
        self.pump();
        conn
    }

    /// Completes the latest connect and checks that the test configuration's
    /// hello, `H 2 c1 -`, is all that went out: the handshake now waits for
    /// `W`. Returns the connection.
    #[track_caller]
    pub fn hello(&mut self) -> ConnId {
        let conn = self.connect();
        assert_eq!(self.take_sent(), "H 2 c1 -\n", "the hello on {conn:?}");
        conn
    }

    /// Connects, checks that `H` went out, and accepts it with `W node-1
    /// <window>`. Returns the connection.
    pub fn ready(&mut self, window: u64) -> ConnId {
        let conn = self.hello();
        self.feed(&format!("W node-1 {window}\n"));
        conn
    }

    /// Bytes from the server on the current connection.
    pub fn feed(&mut self, text: &str) {
        self.feed_bytes(text.as_bytes());
    }

    /// Bytes from the server on the current connection.
    pub fn feed_bytes(&mut self, bytes: &[u8]) {
        let conn = self.client.connection().expect("a connection");
        self.client.handle_bytes(self.now, conn, bytes);
        self.pump();
    }

    /// Bytes sent since the last call, as text.
    pub fn take_sent(&mut self) -> String {
        String::from_utf8(std::mem::take(&mut self.sent)).expect("ascii")
    }

    /// Events since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Outcomes since the last call, dropping the other events.
    pub fn take_outcomes(&mut self) -> Vec<(OpId, Outcome)> {
        self.take_events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Outcome { op, outcome } => Some((op, outcome)),
                _ => None,
            })
            .collect()
    }

    /// Acquires `key` with owner `o`.
    pub fn acquire(&mut self, key_: &str, wait_ms: u64, lease_ms: u64) -> OpId {
        let op = self
            .client
            .acquire(self.now, key(key_), name("o"), ms(wait_ms), ms(lease_ms))
            .expect("accepted");
        self.pump();
        op
    }
}

impl Harness {
    /// Acquires `key` with owner `o`, renewed automatically once granted,
    /// for at most `limit_ms` of holding (`None`: no limit).
    pub fn acquire_renewing(
        &mut self,
        key_: &str,
        wait_ms: u64,
        lease_ms: u64,
        limit_ms: Option<u64>,
    ) -> OpId {
        let op = self
            .client
            .acquire_renewing(
                self.now,
                key(key_),
                name("o"),
                ms(wait_ms),
                ms(lease_ms),
                limit_ms.map(ms),
            )
            .expect("accepted");
        self.pump();
        op
    }

    /// The grant of `op`, answered now by `answer`: checks that it is the
    /// one outcome among the events, and keeps the other events.
    pub fn granted_by(&mut self, op: OpId, answer: &str) -> ticketing::client::Grant {
        self.feed(answer);
        let events = std::mem::take(&mut self.events);
        let mut grant = None;
        for event in events {
            match event {
                Event::Outcome {
                    op: done,
                    outcome: Outcome::Granted(g),
                } if done == op => grant = Some(g),
                Event::Outcome { .. } => panic!("another outcome: {event:?}"),
                other => self.events.push(other),
            }
        }
        grant.expect("granted")
    }

    /// Renews `grant` once now (the command must be accepted), and drains.
    pub fn renew(&mut self, grant: &ticketing::client::Grant, lease_ms: Option<u64>) {
        self.client
            .renew(self.now, grant, lease_ms.map(ms))
            .expect("accepted");
        self.pump();
    }
}

// ----- Appended for tests/rules_lane.rs, tests/rules_operations.rs and
// ----- tests/cut_points.rs.

/// The grant inside a `Granted` outcome; panics on any other outcome.
pub fn granted(outcome: &Outcome) -> &ticketing::client::Grant {
    match outcome {
        Outcome::Granted(grant) => grant,
        other => panic!("expected Granted, got {other:?}"),
    }
}

/// A copy of the grant inside a `Granted` outcome.
pub fn grant_of(outcome: &Outcome) -> ticketing::client::Grant {
    granted(outcome).clone()
}

/// `Indeterminate` as PROTOCOL.md defines its bound: the moment the client
/// gave up, plus `wait_ms`, plus `lease_ms`, plus the settle margin (1 s by
/// default).
pub fn indeterminate(gave_up: Time, wait_ms: u64, lease_ms: u64) -> Outcome {
    Outcome::Indeterminate {
        settles_by: gave_up.saturating_add(ms(wait_ms + lease_ms + 1_000)),
    }
}

/// A harness made with the test [`config`] whose first connection (to
/// `a:1`) is ready with `window`, at t=0, with its start-up events dropped.
pub fn ready(window: u64) -> (Harness, ConnId) {
    ready_with(config(), window)
}

/// A harness made with `config` whose first connection (to its first
/// endpoint) is ready with `window`, at t=0, with its start-up events
/// dropped.
pub fn ready_with(config: Config, window: u64) -> (Harness, ConnId) {
    let mut h = Harness::new(config);
    let conn = h.ready(window);
    h.take_events();
    (h, conn)
}

/// The connections opened by `Connect` actions from `actions[from..]`.
pub fn connects(h: &Harness, from: usize) -> Vec<(ConnId, Endpoint)> {
    h.actions[from..]
        .iter()
        .filter_map(|a| match a {
            Action::Connect { conn, addr } => Some((*conn, addr.clone())),
            _ => None,
        })
        .collect()
}

/// The connections closed by `Close` actions from `actions[from..]`.
pub fn close_actions(h: &Harness, from: usize) -> Vec<ConnId> {
    h.actions[from..]
        .iter()
        .filter_map(|a| match a {
            Action::Close { conn } => Some(*conn),
            _ => None,
        })
        .collect()
}

impl Harness {
    /// Refuses the connect attempt in progress (the connector failed), and
    /// drains.
    pub fn fail_connect(&mut self) {
        let conn = self.client.connection().expect("a connect attempt");
        self.client.handle_connect_failed(self.now, conn);
        self.pump();
    }

    /// The transport of the current connection ends with `end`, and drains.
    pub fn transport_closed(&mut self, end: ticketing::client::TransportEnd) {
        let conn = self.client.connection().expect("a connection");
        self.client.handle_transport_closed(self.now, conn, end);
        self.pump();
    }

    /// Moves the clock to `end` through every deadline on the way, refusing
    /// every connect attempt the client starts before `end` (a connect
    /// started exactly at `end` is left for the caller). A round's
    /// attempts come at once, one after the other: each is refused.
    pub fn refuse_connects_until(&mut self, end: Time) {
        loop {
            while self.client.connection().is_some() && self.now < end {
                self.fail_connect();
            }
            match self.client.poll_timeout() {
                Some(deadline) if deadline < end => self.at(deadline.max(self.now)),
                _ => break,
            }
        }
        self.at(end);
    }

    /// Releases `grant` now (the command must be accepted), and drains.
    pub fn release(&mut self, grant: &ticketing::client::Grant) -> OpId {
        let op = self.client.release(self.now, grant).expect("accepted");
        self.pump();
        op
    }

    /// Releases the raw `(key, token)` now (the command must be accepted),
    /// and drains.
    pub fn release_token(&mut self, key_: &str, token: u64) -> OpId {
        let op = self
            .client
            .release_token(self.now, key(key_), token)
            .expect("accepted");
        self.pump();
        op
    }

    /// Cancels `op` now (the command must be accepted), and drains.
    pub fn cancel(&mut self, op: OpId) {
        self.client.cancel(self.now, op).expect("accepted");
        self.pump();
    }

    /// Starts a shutdown now with `budget_ms` to drain the release lane
    /// (the call must be accepted), and drains.
    pub fn shutdown(&mut self, budget_ms: u64) {
        self.client
            .shutdown(self.now, ms(budget_ms))
            .expect("accepted");
        self.pump();
    }

    /// Moves the clock to `at_ms`, where deadlines must end operations: a
    /// millisecond before, nothing has ended; at `at_ms`, the outcomes are
    /// exactly `ended`.
    #[track_caller]
    pub fn ends_at(&mut self, at_ms: u64, ended: &[(OpId, Outcome)]) {
        self.at_ms(at_ms - 1);
        assert_eq!(self.take_outcomes(), [], "nothing ends before {at_ms} ms");
        self.at_ms(at_ms);
        assert_eq!(self.take_outcomes(), ended, "what ends at {at_ms} ms");
    }

    /// Every `Close` action handed out so far.
    pub fn closes(&self) -> Vec<ConnId> {
        close_actions(self, 0)
    }

    /// Jumps through deadlines until the client hands out a new `Connect`,
    /// then accepts it with `W node-1 <window>`.
    pub fn reconnect(&mut self, window: u64) {
        let before = self.last_connect().map(|(c, _)| c);
        while self.last_connect().map(|(c, _)| c) == before {
            self.next_deadline();
        }
        self.ready(window);
    }

    /// Every byte sent so far, across connections, from the recorded actions
    /// (unaffected by `take_sent`).
    pub fn all_sent(&self) -> String {
        let mut out = Vec::new();
        for action in &self.actions {
            if let Action::Send { data, .. } = action {
                out.extend_from_slice(data);
            }
        }
        String::from_utf8(out).expect("ascii")
    }
}

// ----- an acquire in flight, and what closes a connection ---------------------

/// An acquire the client has sent and the server has not answered: its
/// operation, and the wait and lease it went out with.
#[derive(Clone, Copy, Debug)]
pub struct InFlight {
    pub op: OpId,
    pub wait_ms: u64,
    pub lease_ms: u64,
}

impl InFlight {
    /// The outcomes a close at `at_ms` must bring, as [`outcomes`] lists
    /// them: this acquire's alone, Indeterminate (the "any close" row),
    /// settled by `at_ms` plus its wait, its lease and the settle margin.
    pub fn in_doubt_at(&self, at_ms: u64) -> Vec<(OpId, Outcome)> {
        vec![(
            self.op,
            indeterminate(t(at_ms), self.wait_ms, self.lease_ms),
        )]
    }
}

impl Harness {
    /// Acquires `key_` with owner `o` on a ready connection and checks that
    /// it goes out at once, alone, as request `id`: `A <id> <key> o <wait>
    /// <lease>`.
    #[track_caller]
    pub fn acquire_in_flight(
        &mut self,
        id: u64,
        key_: &str,
        wait_ms: u64,
        lease_ms: u64,
    ) -> InFlight {
        let op = self.acquire(key_, wait_ms, lease_ms);
        assert_eq!(
            self.take_sent(),
            format!("A {id} {key_} o {wait_ms} {lease_ms}\n"),
            "the acquire of {key_} goes out at once"
        );
        InFlight {
            op,
            wait_ms,
            lease_ms,
        }
    }

    /// Feeds `input` on the current connection and checks that it closes
    /// that connection: the one `Closed` event is `(addr, reason)`, the
    /// reason as its `Display` (CLI.md's `closed` reasons), and the one
    /// `Close` action is for that connection. Returns every event the input
    /// brought.
    #[track_caller]
    pub fn feed_closing(
        &mut self,
        input: impl AsRef<[u8]>,
        addr: &str,
        reason: &str,
    ) -> Vec<Event> {
        let input = input.as_ref();
        let conn = self.client.connection().expect("a connection");
        let mark = self.actions.len();
        self.feed_bytes(input);
        let events = self.take_events();
        let shown: String = String::from_utf8_lossy(input).chars().take(60).collect();
        self.assert_closed(mark, conn, &events, addr, reason, &format!("{shown:?}"));
        events
    }

    /// Moves the clock to `at_ms`, where a deadline must close the current
    /// connection: a millisecond before, nothing happens (no event, no
    /// `Close`); at `at_ms` the one `Closed` event is `(addr, reason)` and
    /// the one `Close` action is for that connection. Returns the events of
    /// `at_ms`.
    #[track_caller]
    pub fn closes_at(&mut self, at_ms: u64, addr: &str, reason: &str) -> Vec<Event> {
        let conn = self.client.connection().expect("a connection");
        let mark = self.actions.len();
        self.at_ms(at_ms - 1);
        let before = self.take_events();
        assert_eq!(
            before,
            vec![],
            "{reason}: nothing happens before {at_ms} ms"
        );
        assert_eq!(
            close_actions(self, mark),
            vec![],
            "{reason}: nothing closes before {at_ms} ms"
        );
        self.at_ms(at_ms);
        let events = self.take_events();
        self.assert_closed(mark, conn, &events, addr, reason, "the deadline");
        events
    }

    /// Checks that `events` and the actions from `actions[mark]` close
    /// `conn`, once, with the `Closed` event `(addr, reason)`; `what` names
    /// the input in the messages.
    #[track_caller]
    fn assert_closed(
        &self,
        mark: usize,
        conn: ConnId,
        events: &[Event],
        addr: &str,
        reason: &str,
        what: &str,
    ) {
        assert_eq!(
            closed(events),
            vec![(addr.to_string(), reason.to_string())],
            "{what} at {}: {events:?}",
            self.now
        );
        assert_eq!(
            close_actions(self, mark),
            vec![conn],
            "{what} at {} closes {conn:?}",
            self.now
        );
    }
}

// ----- reading events --------------------------------------------------------

/// `(addr, reason)` of every `Closed` event, the reason as its `Display`
/// (the CLI's `closed` reasons).
pub fn closed(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Closed { addr, reason } => Some((addr.to_string(), reason.to_string())),
            _ => None,
        })
        .collect()
}

/// The `Closed` reasons among `events`.
pub fn close_reasons(events: &[Event]) -> Vec<CloseReason> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Closed { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

/// The outcomes among `events`.
pub fn outcomes(events: &[Event]) -> Vec<(OpId, Outcome)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Outcome { op, outcome } => Some((*op, outcome.clone())),
            _ => None,
        })
        .collect()
}

/// `(cause, until)` of every `Backoff` event.
pub fn backoffs(events: &[Event]) -> Vec<(BackoffCause, Time)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Backoff { cause, until } => Some((*cause, *until)),
            _ => None,
        })
        .collect()
}

// ----- counts as pairs ---------------------------------------------------------

/// `(requests, acquires)` in flight.
pub fn in_flight(client: &Client) -> (usize, usize) {
    let counts = client.in_flight();
    (counts.requests, counts.acquires)
}

/// `(acquires, releases)` open.
pub fn open_operations(client: &Client) -> (usize, usize) {
    let counts = client.open_operations();
    (counts.acquires, counts.releases)
}
