//! The [`Runner`]: applies the steps to a client and the model server,
//! with the checker watching, and settles the run.

use core::time::Duration;

use super::{
    foreign_grant, renew_limit, Setup, Step, BUDGETS_MS, FLOOD_ADDRS, KEYS, LEASES_MS,
    SETTLE_BUDGET, SETTLE_TIME, WAITS_MS,
};
use crate::client::{Action, Client, ConnId, Event, Grant, OpId, Outcome, TransportEnd};
use crate::names::{Key, Name};
use crate::testkit::checker::{Checker, Invariant, InvariantViolation, Stats};
use crate::testkit::model::{Fault, ModelServer};
use crate::time::Time;
use crate::wire::ClientFrame;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WireState {
    Connecting,
    Open,
    Gone,
}

/// The harness's side of the client's current connection.
#[derive(Debug)]
struct Wire {
    conn: ConnId,
    state: WireState,
    /// Sent by the client, not yet read by the server.
    to_server: Vec<u8>,
    /// Sent by the server (or forged), not yet delivered to the client.
    to_client: Vec<u8>,
}

/// What a run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The hash of everything observed (see [`Checker::trace_hash`]).
    pub trace_hash: u64,
    /// Counts of what happened.
    pub stats: Stats,
    /// The time the run ended.
    pub end: Time,
    /// Grants the server made.
    pub server_grants: u64,
}

/// Drives one client against the model server, with a checker; see the
/// module documentation.
pub struct Runner {
    client: Client,
    server: ModelServer,
    checker: Checker,
    now: Time,
    wire: Option<Wire>,
    /// Every operation submitted, for `Cancel`.
    ops: Vec<OpId>,
    /// Grants delivered and not given back.
    grants: Vec<Grant>,
    /// Grants given back (released or undeliverable).
    returned: Vec<Grant>,
    next_owner: u64,
    /// Recent requests sent: id, op letter, key, token (0 for an acquire).
    requests: Vec<(u64, u8, String, u64)>,
    complaints_seen: usize,
    shutdown_called: bool,
    log: Option<Vec<String>>,
}

impl Runner {
    /// A client made at time zero with `setup`'s configuration, and a fresh
    /// model server.
    pub fn new(setup: &Setup) -> Result<Runner, InvariantViolation> {
        let config = setup.client_config();
        let checker = Checker::new(&config, Time::ZERO);
        let client = Client::new(config, Time::ZERO).expect("the setups are valid");
        let mut runner = Runner {
            client,
            server: ModelServer::new(setup.server_config()),
            checker,
            now: Time::ZERO,
            wire: None,
            ops: Vec::new(),
            grants: Vec::new(),
            returned: Vec::new(),
            next_owner: 0,
            requests: Vec::new(),
            complaints_seen: 0,
            shutdown_called: false,
            log: None,
        };
        // The client's first outputs (its first connect).
        runner.drain()?;
        runner.checker.end_step(&runner.client)?;
        Ok(runner)
    }

    /// Runs `steps`, then [`settle`](Runner::settle)s.
    pub fn run(setup: &Setup, steps: &[Step]) -> Result<Report, InvariantViolation> {
        let mut runner = Runner::new(setup)?;
        for step in steps {
            runner.step(step)?;
        }
        runner.settle()?;
        Ok(runner.report())
    }

    /// Runs twice and compares the traces (invariant 6).
    pub fn run_twice(setup: &Setup, steps: &[Step]) -> Result<Report, InvariantViolation> {
        let first = Runner::run(setup, steps)?;
        let second = Runner::run(setup, steps)?;
        if first.trace_hash != second.trace_hash {
            return Err(InvariantViolation {
                invariant: Invariant::Determinism,
                at: first.end.min(second.end),
                step: steps.len() as u64,
                detail: format!(
                    "two runs of the same steps gave traces {:#018x} and {:#018x}",
                    first.trace_hash, second.trace_hash
                ),
            });
        }
        Ok(first)
    }

    /// Starts keeping a readable log of the run: every step, and every
    /// action and event of the client (for reading a failing run).
    pub fn keep_log(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// The log kept since [`Runner::keep_log`].
    pub fn log(&self) -> &[String] {
        self.log.as_deref().unwrap_or(&[])
    }

    fn note(&mut self, what: impl FnOnce() -> String) {
        if let Some(log) = &mut self.log {
            log.push(format!("{} {}", self.now, what()));
        }
    }

    /// What the run did so far.
    pub fn report(&self) -> Report {
        Report {
            trace_hash: self.checker.trace_hash(),
            stats: self.checker.stats(),
            end: self.now,
            server_grants: self.server.grants(),
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The checker.
    pub fn checker(&self) -> &Checker {
        &self.checker
    }

    /// The server.
    pub fn server(&self) -> &ModelServer {
        &self.server
    }

    /// The current time.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Runs one step, drains the client, and checks.
    pub fn step(&mut self, step: &Step) -> Result<(), InvariantViolation> {
        self.note(|| format!("step {step:?}"));
        self.apply(step)?;
        self.drain()?;
        self.checker.end_step(&self.client)?;
        self.check_server()
    }

    fn check_server(&mut self) -> Result<(), InvariantViolation> {
        let complaints = self.server.complaints();
        if let Some(c) = complaints.get(self.complaints_seen) {
            self.complaints_seen = complaints.len();
            let invariant = if c.contains("window") || c.contains("before W") {
                Invariant::Window
            } else {
                Invariant::Protocol
            };
            return Err(InvariantViolation {
                invariant,
                at: self.now,
                step: self.checker.stats().steps,
                detail: format!("the server complains: {c}"),
            });
        }
        Ok(())
    }

    fn open_conn(&self) -> Option<ConnId> {
        self.wire
            .as_ref()
            .filter(|w| w.state == WireState::Open)
            .map(|w| w.conn)
    }

    fn apply(&mut self, step: &Step) -> Result<(), InvariantViolation> {
        let now = self.now;
        match step {
            Step::Acquire { key, wait, lease } => {
                let key = Key::new(KEYS[usize::from(key % 4)]).expect("atom");
                self.next_owner += 1;
                let owner = Name::new(format!("o{}", self.next_owner)).expect("atom");
                let wait = Duration::from_millis(WAITS_MS[usize::from(wait % 8)]);
                let lease = Duration::from_millis(LEASES_MS[usize::from(lease % 8)]);
                let result = self
                    .client
                    .acquire(now, key.clone(), owner.clone(), wait, lease);
                self.checker
                    .acquire(now, &key, &owner, wait, lease, &result)?;
                if let Ok(op) = result {
                    self.ops.push(op);
                }
            }
            Step::AcquireRenewing {
                key,
                wait,
                lease,
                limit,
            } => {
                let key = Key::new(KEYS[usize::from(key % 4)]).expect("atom");
                self.next_owner += 1;
                let owner = Name::new(format!("o{}", self.next_owner)).expect("atom");
                let wait = Duration::from_millis(WAITS_MS[usize::from(wait % 8)]);
                let lease = Duration::from_millis(LEASES_MS[usize::from(lease % 8)]);
                let limit = renew_limit(*limit);
                let result = self.client.acquire_renewing(
                    now,
                    key.clone(),
                    owner.clone(),
                    wait,
                    lease,
                    limit,
                );
                self.checker
                    .acquire_renewing(now, &key, &owner, wait, lease, limit, &result)?;
                if let Ok(op) = result {
                    self.ops.push(op);
                }
            }
            Step::Renew { pick, lease } => {
                let Some(grant) = self.pick_grant(*pick) else {
                    return Ok(());
                };
                let lease = LEASES_MS
                    .get(usize::from(lease % 9))
                    .map(|&ms| Duration::from_millis(ms));
                let result = self.client.renew(now, &grant, lease);
                self.checker.renew(now, &grant, lease, &result)?;
            }
            Step::AutoRenew { pick, limit } => {
                let Some(grant) = self.pick_grant(*pick) else {
                    return Ok(());
                };
                let limit = renew_limit(*limit);
                let result = self.client.auto_renew(now, &grant, limit);
                self.checker.auto_renew(now, &grant, limit, &result)?;
            }
            Step::StopRenewing { pick } => {
                let Some(grant) = self.pick_grant(*pick) else {
                    return Ok(());
                };
                let result = self.client.stop_renewing(now, &grant);
                self.checker.stop_renewing(now, &grant, &result)?;
            }
            Step::HintFlood { count, kind } => {
                if self.open_conn().is_none() {
                    return Ok(());
                }
                let lines = 1 + 16 * usize::from(*count);
                let w = self.wire.as_mut().expect("open");
                for i in 0..lines {
                    let addr = if *kind >= 128 {
                        FLOOD_ADDRS[i % FLOOD_ADDRS.len()]
                    } else {
                        FLOOD_ADDRS[usize::from(kind % 5)]
                    };
                    w.to_client
                        .extend_from_slice(format!("L {addr}\n").as_bytes());
                }
            }
            Step::Foreign { pick, what } => {
                let mimic = (!self.grants.is_empty())
                    .then(|| &self.grants[usize::from(*pick) % self.grants.len()]);
                let (key, token, lease_ms) = match mimic {
                    Some(g) => (
                        g.key().as_str().to_owned(),
                        g.token(),
                        u64::try_from(g.lease().as_millis()).unwrap_or(u64::MAX),
                    ),
                    None => (
                        KEYS[usize::from(pick % 6)].to_owned(),
                        u64::from(*pick),
                        1_000,
                    ),
                };
                let Some(grant) = foreign_grant(&key, token, lease_ms) else {
                    return Ok(());
                };
                // The timers due now fire first, so that whatever the call
                // hands out could only be its own doing.
                self.client.handle_timeout(now);
                self.checker.timeout(now);
                self.drain()?;
                let (call, result) = match what % 5 {
                    0 => ("release", self.client.release(now, &grant).map(|_| ())),
                    1 => ("undeliverable", self.client.undeliverable(now, &grant)),
                    2 => ("renew", self.client.renew(now, &grant, None)),
                    3 => ("auto_renew", self.client.auto_renew(now, &grant, None)),
                    _ => ("stop_renewing", self.client.stop_renewing(now, &grant)),
                };
                self.checker.foreign(now, call, &grant, &result)?;
            }
            Step::Release { pick } => {
                let stale = *pick >= 128;
                let list = if stale { &self.returned } else { &self.grants };
                if list.is_empty() {
                    return Ok(());
                }
                let i = usize::from(*pick) % list.len();
                let grant = list[i].clone();
                let result = self.client.release(now, &grant);
                self.checker.release(now, &grant, &result)?;
                if !stale && result.is_ok() {
                    self.returned.push(self.grants.remove(i));
                }
            }
            Step::ReleaseToken { key, token } => {
                let key = Key::new(KEYS[usize::from(key % 6)]).expect("atom");
                let token = u64::from(*token);
                let result = self.client.release_token(now, key.clone(), token);
                self.checker.release_token(now, &key, token, &result)?;
            }
            Step::Cancel { pick } => {
                if self.ops.is_empty() {
                    return Ok(());
                }
                let op = self.ops[usize::from(*pick) % self.ops.len()];
                let result = self.client.cancel(now, op);
                self.checker.cancel(now, op, &result)?;
            }
            Step::Undeliverable { pick } => {
                if self.grants.is_empty() {
                    return Ok(());
                }
                let i = usize::from(*pick) % self.grants.len();
                let grant = self.grants[i].clone();
                let result = self.client.undeliverable(now, &grant);
                self.checker.undeliverable(now, &grant, &result)?;
                if result.is_ok() {
                    self.returned.push(self.grants.remove(i));
                }
            }
            Step::Shutdown { budget } => {
                let budget = Duration::from_millis(BUDGETS_MS[usize::from(budget % 6)]);
                let result = self.client.shutdown(now, budget);
                self.checker.shutdown(now, budget, &result)?;
                self.shutdown_called = true;
            }
            Step::Connected => {
                let Some(w) = self.wire.as_mut() else {
                    return Ok(());
                };
                let conn = w.conn;
                if w.state == WireState::Connecting {
                    w.state = WireState::Open;
                    self.server.open(now, conn.get());
                }
                // On a connection that is already up or gone, the client
                // must ignore it.
                self.client.handle_connected(now, conn);
                self.checker.connected(now, conn);
            }
            Step::ConnectFailed => {
                let Some(w) = self.wire.as_mut() else {
                    return Ok(());
                };
                let conn = w.conn;
                if w.state != WireState::Gone {
                    w.state = WireState::Gone;
                    self.server.close(now, conn.get());
                }
                self.client.handle_connect_failed(now, conn);
                self.checker.connect_failed(now, conn);
            }
            Step::ServerReads { bytes } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                let w = self.wire.as_mut().expect("open");
                let n = take_len(*bytes, w.to_server.len());
                let data: Vec<u8> = w.to_server.drain(..n).collect();
                self.server.receive(now, conn.get(), &data);
            }
            Step::ServerEmits { frames } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                self.server.advance(now);
                let n = if *frames == 0 {
                    usize::MAX
                } else {
                    usize::from(*frames)
                };
                let w = self.wire.as_mut().expect("open");
                for _ in 0..n {
                    match self.server.emit(conn.get()) {
                        Some(frame) => w.to_client.extend_from_slice(&frame),
                        None => break,
                    }
                }
            }
            Step::Deliver { bytes } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                let w = self.wire.as_mut().expect("open");
                if w.to_client.is_empty() {
                    if self.server.wants_close(conn.get()) {
                        self.transport_closed(conn, TransportEnd::Eof);
                    }
                    return Ok(());
                }
                let n = take_len(*bytes, w.to_client.len());
                let data: Vec<u8> = w.to_client.drain(..n).collect();
                self.feed(conn, &data)?;
            }
            Step::Fault { kind } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                let fault = match kind % 17 {
                    0 => Fault::Leader {
                        addr: ["a:1", "b:2", "c:3"][usize::from(kind / 14 % 3)].to_owned(),
                    },
                    1 => Fault::Leader {
                        addr: "evil:666".to_owned(),
                    },
                    2 => Fault::Moved {
                        addr: ["a:1", "b:2", "c:3"][usize::from(kind / 14 % 3)].to_owned(),
                    },
                    3 => Fault::Moved {
                        addr: "evil:666".to_owned(),
                    },
                    4 => Fault::Error {
                        reason: "no_leader".to_owned(),
                    },
                    5 => Fault::Error {
                        reason: "not_active".to_owned(),
                    },
                    6 => Fault::Error {
                        reason: "auth_failed".to_owned(),
                    },
                    7 => Fault::Error {
                        reason: "overloaded".to_owned(),
                    },
                    8 => Fault::Duplicate,
                    9 => Fault::UnknownId {
                        key: KEYS[usize::from(kind / 14 % 6)].to_owned(),
                        grant: true,
                    },
                    10 => Fault::WrongKey {
                        key: KEYS[usize::from(kind / 14 % 6)].to_owned(),
                    },
                    11 => Fault::LongerLease,
                    12 => {
                        self.transport_closed(conn, TransportEnd::Error);
                        return Ok(());
                    }
                    14 => Fault::WaitedMissing,
                    15 => Fault::WaitedAbove,
                    16 => Fault::WrongToken,
                    _ => Fault::UnknownId {
                        key: KEYS[usize::from(kind / 14 % 6)].to_owned(),
                        grant: false,
                    },
                };
                self.server.inject(now, conn.get(), fault);
            }
            Step::Forge {
                kind,
                id,
                key,
                token,
                lease,
            } => {
                let Some(conn) = self.open_conn() else {
                    return Ok(());
                };
                let line = self.forge(*kind, *id, *key, *token, *lease);
                self.server.forgive(conn.get());
                let w = self.wire.as_mut().expect("open");
                w.to_client.extend_from_slice(line.as_bytes());
            }
            Step::Raw { data } => {
                let Some(w) = self.wire.as_ref().filter(|w| w.state != WireState::Gone) else {
                    return Ok(());
                };
                let conn = w.conn;
                self.server.forgive(conn.get());
                self.feed(conn, data)?;
            }
            Step::TransportClosed { error } => {
                let Some(w) = self.wire.as_ref().filter(|w| w.state != WireState::Gone) else {
                    return Ok(());
                };
                let conn = w.conn;
                let end = if *error {
                    TransportEnd::Error
                } else {
                    TransportEnd::Eof
                };
                self.transport_closed(conn, end);
            }
            Step::Advance { ms } => {
                self.now = self
                    .now
                    .saturating_add(Duration::from_millis(u64::from(*ms)));
                self.server.advance(self.now);
                if ms % 2 == 0 {
                    self.client.handle_timeout(self.now);
                    self.checker.timeout(self.now);
                }
            }
            Step::NextDeadline => {
                let client = self.client.poll_timeout().filter(|&t| t < Time::MAX);
                let next = [client, self.server.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                if let Some(t) = next {
                    self.now = self.now.max(t);
                }
                self.server.advance(self.now);
                self.client.handle_timeout(self.now);
                self.checker.timeout(self.now);
            }
        }
        Ok(())
    }

    /// Hands bytes to the client on `conn`, firing its due timers first
    /// (see the checker's rule for drivers).
    fn feed(&mut self, conn: ConnId, data: &[u8]) -> Result<(), InvariantViolation> {
        self.client.handle_timeout(self.now);
        self.checker.timeout(self.now);
        self.drain()?;
        self.note(|| format!("  bytes {conn} {:?}", String::from_utf8_lossy(data)));
        self.client.handle_bytes(self.now, conn, data);
        self.checker.bytes(self.now, conn, data)
    }

    fn transport_closed(&mut self, conn: ConnId, end: TransportEnd) {
        if let Some(w) = self.wire.as_mut().filter(|w| w.conn == conn) {
            w.state = WireState::Gone;
            w.to_client.clear();
            w.to_server.clear();
        }
        self.server.close(self.now, conn.get());
        self.client.handle_transport_closed(self.now, conn, end);
        self.checker.transport_closed(self.now, conn);
    }

    /// Builds a forged frame (see [`Step::Forge`]).
    fn forge(&self, kind: u8, id: u8, key: u8, token: u8, lease: u8) -> String {
        let recent = (id < 200 && !self.requests.is_empty()).then(|| {
            &self.requests[self.requests.len() - 1 - usize::from(id) % self.requests.len()]
        });
        let id_value = recent.map_or(900_000 + u64::from(id), |r| r.0);
        let key_name = match recent {
            Some(r) if key < 128 => r.2.clone(),
            _ => KEYS[usize::from(key % 6)].to_owned(),
        };
        let lease = LEASES_MS[usize::from(lease % 8)];
        let renewal_token = match recent {
            Some(r) if r.1 == b'X' && token < 128 => r.3,
            _ => u64::from(token),
        };
        match kind % 13 {
            0 => format!("G {id_value} A {key_name} {token} {lease} 0\n"),
            1 => format!("T {id_value} A {key_name}\n"),
            2 => format!("B {id_value} A {key_name}\n"),
            3 => format!("D {id_value} R {key_name}\n"),
            4 => format!("N {id_value} R {key_name}\n"),
            5 => {
                // The other op letter: a bad pairing, a framing error.
                let op = recent.map_or(b'A', |r| r.1);
                if op == b'A' {
                    format!("D {id_value} A {key_name}\n")
                } else {
                    format!("G {id_value} R {key_name} {token} {lease}\n")
                }
            }
            6 => format!("W forged {}\n", 2 + u64::from(token % 8)),
            7 => format!("L {}\n", ["a:1", "c:3", "evil:666"][usize::from(token % 3)]),
            8 => format!("G {id_value} X {key_name} {renewal_token} {lease}\n"),
            9 => format!("N {id_value} X {key_name}\n"),
            10 => format!("G {id_value} A {key_name} {token} {lease}\n"),
            11 => format!(
                "G {id_value} A {key_name} {token} {lease} {}\n",
                u64::from(token) * 50
            ),
            _ => format!(
                "{} {id_value} X {key_name}\n",
                ["T", "D", "B"][usize::from(token % 3)]
            ),
        }
    }

    /// The grant the embedder holds (or, with `pick >= 128`, one it gave
    /// back) that `pick` names.
    fn pick_grant(&self, pick: u8) -> Option<Grant> {
        let list = if pick >= 128 {
            &self.returned
        } else {
            &self.grants
        };
        (!list.is_empty()).then(|| list[usize::from(pick) % list.len()].clone())
    }

    /// Drains the client's actions and events through the checker.
    fn drain(&mut self) -> Result<(), InvariantViolation> {
        loop {
            let mut any = false;
            while let Some(action) = self.client.poll_action() {
                any = true;
                self.note(|| format!("  action {action:?}"));
                self.checker.action(&action)?;
                self.on_action(action);
            }
            while let Some(event) = self.client.poll_event() {
                any = true;
                self.note(|| format!("  event {event:?}"));
                self.checker.event(&event)?;
                if let Event::Outcome {
                    outcome: Outcome::Granted(grant),
                    ..
                } = event
                {
                    self.grants.push(grant);
                }
            }
            if !any {
                return Ok(());
            }
        }
    }

    fn on_action(&mut self, action: Action) {
        match action {
            Action::Connect { conn, .. } => {
                if let Some(old) = self.wire.take() {
                    self.server.close(self.now, old.conn.get());
                }
                self.wire = Some(Wire {
                    conn,
                    state: WireState::Connecting,
                    to_server: Vec::new(),
                    to_client: Vec::new(),
                });
            }
            Action::Send { conn, data } => {
                for line in data.split(|&b| b == b'\n') {
                    match ClientFrame::parse(line) {
                        Ok(ClientFrame::Acquire { id, key, .. }) => {
                            self.requests.push((id, b'A', key.as_str().to_owned(), 0));
                        }
                        Ok(ClientFrame::Release { id, key, token }) => {
                            self.requests
                                .push((id, b'R', key.as_str().to_owned(), token));
                        }
                        Ok(ClientFrame::Renew { id, key, token, .. }) => {
                            self.requests
                                .push((id, b'X', key.as_str().to_owned(), token));
                        }
                        _ => {}
                    }
                }
                if self.requests.len() > 64 {
                    self.requests.drain(..self.requests.len() - 32);
                }
                if let Some(w) = self
                    .wire
                    .as_mut()
                    .filter(|w| w.conn == conn && w.state == WireState::Open)
                {
                    w.to_server.extend_from_slice(&data);
                }
            }
            Action::Close { conn } => {
                if let Some(w) = self.wire.as_mut().filter(|w| w.conn == conn) {
                    w.state = WireState::Gone;
                    w.to_client.clear();
                    w.to_server.clear();
                }
                self.server.close(self.now, conn.get());
            }
        }
    }

    /// One step of a healthy world: connect, let the server read, answer,
    /// deliver; when nothing moves, jump to the next deadline. `false` when
    /// nothing at all is left to happen.
    fn pump(&mut self) -> Result<bool, InvariantViolation> {
        let step = match &self.wire {
            Some(w) if w.state == WireState::Connecting => Step::Connected,
            Some(w) if w.state == WireState::Open && !w.to_server.is_empty() => {
                Step::ServerReads { bytes: 0 }
            }
            Some(w) if w.state == WireState::Open && self.server.ready(w.conn.get()) > 0 => {
                Step::ServerEmits { frames: 0 }
            }
            Some(w)
                if w.state == WireState::Open
                    && (!w.to_client.is_empty() || self.server.wants_close(w.conn.get())) =>
            {
                Step::Deliver { bytes: 0 }
            }
            _ => {
                let client = self.client.poll_timeout().filter(|&t| t < Time::MAX);
                if client.is_none() && self.server.poll_timeout().is_none() {
                    return Ok(false);
                }
                Step::NextDeadline
            }
        };
        self.step(&step)?;
        Ok(true)
    }

    fn quiet(&self) -> bool {
        let wire_quiet = match &self.wire {
            None => true,
            Some(w) => match w.state {
                WireState::Gone => true,
                WireState::Connecting => false,
                WireState::Open => {
                    w.to_client.is_empty()
                        && w.to_server.is_empty()
                        && self.server.ready(w.conn.get()) == 0
                        && !self.server.wants_close(w.conn.get())
                }
            },
        };
        self.checker.is_settled() && self.client.in_flight().requests == 0 && wire_quiet
    }

    /// Releases every grant the embedder holds.
    fn release_all(&mut self) -> Result<(), InvariantViolation> {
        for grant in core::mem::take(&mut self.grants) {
            self.note(|| format!("settle: release {grant:?}"));
            let result = self.client.release(self.now, &grant);
            self.checker.release(self.now, &grant, &result)?;
            self.drain()?;
            self.checker.end_step(&self.client)?;
            self.returned.push(grant);
        }
        Ok(())
    }

    /// Ends the run: releases every grant the embedder holds, gives the
    /// client a healthy server until every operation has ended (at most
    /// [`SETTLE_TIME`]) and checks that every grant it had to release by
    /// itself was released; then shuts it down with [`SETTLE_BUDGET`], lets
    /// the shutdown finish, and checks the end of the run
    /// ([`Checker::finish`]).
    pub fn settle(&mut self) -> Result<(), InvariantViolation> {
        const MAX_PUMPS: usize = 100_000;
        if !self.client.is_finished() && !self.shutdown_called {
            let until = self.now.saturating_add(SETTLE_TIME);
            let mut pumps = 0;
            loop {
                self.release_all()?;
                if self.quiet() || self.now >= until || pumps >= MAX_PUMPS || !self.pump()? {
                    break;
                }
                pumps += 1;
            }
            if !self.quiet() {
                return Err(InvariantViolation {
                    invariant: Invariant::OneOutcome,
                    at: self.now,
                    step: self.checker.stats().steps,
                    detail: format!(
                        "after {pumps} steps of a healthy server, operations are still open: {:?}, in flight {:?}",
                        self.checker, self.client.in_flight()
                    ),
                });
            }
            self.checker.check_orphans_released()?;
        }
        if !self.shutdown_called {
            self.note(|| "settle: shutdown".to_owned());
            let result = self.client.shutdown(self.now, SETTLE_BUDGET);
            self.checker.shutdown(self.now, SETTLE_BUDGET, &result)?;
            self.shutdown_called = true;
            self.drain()?;
            self.checker.end_step(&self.client)?;
        }
        let mut pumps = 0;
        while !self.client.is_finished() && pumps < MAX_PUMPS {
            if !self.pump()? {
                break;
            }
            pumps += 1;
        }
        self.checker.finish(&self.client)
    }
}

fn take_len(n: u8, len: usize) -> usize {
    if n == 0 {
        len
    } else {
        usize::from(n).min(len)
    }
}
