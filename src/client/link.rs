//! The connection's life: where to connect and when, the handshake, leader
//! hints, closing (PROTOCOL.md section 5, "Connecting and backing off",
//! the rows for `L`, `M` and `E`, and "any close").
//!
//! [`Link`] owns every rule about the connection: where the next one goes
//! and when (the rounds over the addresses, the leader hint, the addresses
//! that failed a moment ago, the backoff between rounds, the timeouts),
//! the handshake and the window, the notices (`L`, `M`, `E`), and whether
//! every server refused the client. It never looks at operations: the
//! client hands it the one thing it needs from them, the cap that a held
//! lease puts on every wait.

use core::mem;
use core::time::Duration;

use super::config::{Backoff, Config};
use super::outcome::{Action, BackoffCause, CloseReason, ConnId, Event, Violation};
use super::Fx;
use crate::names::{Endpoint, Name};
use crate::rng::Rng;
use crate::time::Time;
use crate::wire::{Addr, Atom, ClientFrame, ServerFrame, VERSION};

/// The connection in use.
pub(crate) struct Conn {
    pub(crate) id: ConnId,
    pub(crate) addr: Endpoint,
    /// Whether the address came from a leader hint.
    pub(crate) to_hint: bool,
}

pub(crate) enum Phase {
    /// `Connect` was handed out; waiting for `handle_connected`.
    Connecting { deadline: Time },
    /// Connected; `H` goes out, then no request before `W`.
    Handshaking { deadline: Time, hello_sent: bool },
    /// `W` arrived.
    Ready { window: u64, node: Name },
}

pub(crate) enum LinkState {
    /// No connection; the next round starts at `until` (`Time::MAX`: none
    /// is planned).
    Down { until: Time },
    /// A connection in some phase.
    Up { conn: Conn, phase: Phase },
    /// Shut down for good.
    Finished,
}

/// The least a held lease shortens a wait to: a holder whose lease is
/// nearly out still waits this long between rounds and for a connect.
pub(crate) const LEASE_CAP_FLOOR: Duration = Duration::from_millis(100);

/// What the link does after a close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// The round goes on, or the next one is planned after its backoff.
    Connect,
    /// Nothing is left to send while shutting down: no new attempt.
    Idle,
}

pub(crate) struct Link {
    pub(crate) state: LinkState,
    next_conn: u64,
    /// The configured endpoint a round's turn takes next.
    next_endpoint: usize,
    pub(crate) hint: Option<Endpoint>,
    /// The last address a hint on the current connection named that the
    /// allowlist refused.
    ignored: Option<Endpoint>,
    round: Round,
    /// Rounds that failed in a row since the last `W`.
    failed_rounds: u32,
    /// Addresses whose latest connection ended by a transport failure, and
    /// when. Only allowlisted addresses are ever connected to, so this
    /// holds at most one entry for each.
    failed_at: Vec<(Endpoint, Time)>,
    /// Set when a whole round was refused with `auth_failed` or
    /// `unsupported_version`: the last such reason. Cleared by a `W`.
    misconfigured: Option<CloseReason>,
    /// Why the latest connection attempt ended; `None` after a `W`, and
    /// before any attempt ended.
    last_end: Option<CloseReason>,
    /// A whole round failed, at every address, since the last `W` (a
    /// connection that had its `W` and ended is no failed round): the
    /// client is unreachable, for acquires that give up then.
    round_failed: bool,
}

/// One round over the addresses: what it tried, and what its attempts
/// say about the backoff after it.
#[derive(Default)]
struct Round {
    /// The addresses it has tried, endpoints and hints alike.
    tried: Vec<Endpoint>,
    /// Configured endpoints its turn has not reached yet.
    endpoints_left: usize,
    /// Attempts that ended.
    attempts: u32,
    /// Of those, ended by `M`.
    moved: u32,
    /// Of those, refused with `auth_failed` or `unsupported_version`.
    refused: u32,
    /// The latest refusal.
    refusal: Option<CloseReason>,
    /// The cause of the latest attempt that ended otherwise.
    other: Option<BackoffCause>,
}

impl Round {
    /// A round over `endpoints` configured endpoints, keeping the memory
    /// of the last one.
    fn restart(&mut self, endpoints: usize) {
        self.tried.clear();
        let tried = mem::take(&mut self.tried);
        *self = Round {
            tried,
            endpoints_left: endpoints,
            ..Round::default()
        };
    }

    fn has_tried(&self, addr: &Endpoint) -> bool {
        self.tried.contains(addr)
    }

    /// Notes an attempt that ended without `W`.
    fn ended(&mut self, reason: &CloseReason) {
        self.attempts += 1;
        match reason {
            CloseReason::Moved => self.moved += 1,
            CloseReason::AuthFailed | CloseReason::UnsupportedVersion => {
                self.refused += 1;
                self.refusal = Some(reason.clone());
            }
            other => self.other = Some(backoff_cause(other)),
        }
    }

    /// Why the round failed, for its backoff: every attempt refused, every
    /// attempt moved, else the latest attempt that ended otherwise. A round
    /// of refusals and moves alone backs off as for moves: a node that
    /// names a leader is not refusing the client.
    fn cause(&self) -> BackoffCause {
        match &self.refusal {
            Some(refusal) if self.refused == self.attempts => backoff_cause(refusal),
            _ if self.moved == self.attempts => BackoffCause::Redirect,
            _ => self.other.unwrap_or(BackoffCause::Redirect),
        }
    }

    /// The refusal that leaves the client misconfigured, if every attempt
    /// of the round was refused.
    fn misconfigures(&self) -> Option<&CloseReason> {
        self.refusal
            .as_ref()
            .filter(|_| self.refused == self.attempts)
    }
}

/// The backoff class of one attempt's end.
fn backoff_cause(reason: &CloseReason) -> BackoffCause {
    match reason {
        CloseReason::Moved => BackoffCause::Redirect,
        CloseReason::NoLeader => BackoffCause::NoLeader,
        CloseReason::NotActive => BackoffCause::NotActive,
        CloseReason::AuthFailed => BackoffCause::AuthFailed,
        CloseReason::UnsupportedVersion => BackoffCause::UnsupportedVersion,
        _ => BackoffCause::Transport,
    }
}

/// Whether a close is a transport failure: a failed or timed-out connect
/// or handshake, or the transport ending or failing. Such an address is
/// stale as a hint for a while.
fn is_transport_failure(reason: &CloseReason) -> bool {
    matches!(
        reason,
        CloseReason::ConnectFailed
            | CloseReason::ConnectTimeout
            | CloseReason::Tls(_)
            | CloseReason::HandshakeTimeout
            | CloseReason::Eof
            | CloseReason::Io
    )
}

/// `d/2 + random(0, d/2)`: a delay never below half its step.
pub(crate) fn jittered(step: Duration, rng: &mut Rng) -> Duration {
    let step = crate::time::duration_nanos(step);
    let half = step / 2;
    Duration::from_nanos(half.saturating_add(rng.up_to(half)))
}

/// What the link is told, besides its own state, when it decides where
/// and when to connect: the time, the configuration, the seeded generator,
/// and the cap a held lease puts on every wait.
pub(crate) struct Ctx<'a> {
    pub(crate) now: Time,
    pub(crate) config: &'a Config,
    pub(crate) rng: &'a mut Rng,
    pub(crate) cap: Option<Duration>,
}

/// A round that failed at every address, as [`Link::after_close`] tells
/// it: the acquires waiting for a connection that end now, and why.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RoundFailed {
    /// Every address refused the client (misconfigured): every acquire
    /// waiting for a connection ends, with the refusal.
    Refused(CloseReason),
    /// The client is unreachable: the acquires that give up then end,
    /// with how the round's latest attempt ended.
    Unreachable(CloseReason),
}

/// What comes after a connection or an attempt ended.
pub(crate) enum Next {
    /// The round goes on at once with another address.
    AtOnce,
    /// Wait `delay` (already capped) for `cause`; `misconfigured` when the
    /// round that failed was refused by every address, and why.
    Wait {
        cause: BackoffCause,
        delay: Duration,
        misconfigured: Option<CloseReason>,
    },
}

impl Link {
    pub(crate) fn new(endpoints: usize) -> Link {
        let mut round = Round::default();
        round.restart(endpoints);
        Link {
            state: LinkState::Down { until: Time::ZERO },
            next_conn: 1,
            next_endpoint: 0,
            hint: None,
            ignored: None,
            round,
            failed_rounds: 0,
            failed_at: Vec::new(),
            misconfigured: None,
            last_end: None,
            round_failed: false,
        }
    }

    /// The link's own deadline: the next round, or the connect or
    /// handshake timeout.
    pub(crate) fn deadline(&self) -> Option<Time> {
        match &self.state {
            LinkState::Down { until } => Some(*until),
            LinkState::Up {
                phase: Phase::Connecting { deadline } | Phase::Handshaking { deadline, .. },
                ..
            } => Some(*deadline),
            LinkState::Up { .. } | LinkState::Finished => None,
        }
    }

    /// The current connection's phase, if its id is `conn`.
    pub(crate) fn current(&self, conn: ConnId) -> Option<&Phase> {
        match &self.state {
            LinkState::Up { conn: c, phase } if c.id == conn => Some(phase),
            _ => None,
        }
    }

    /// Why every server refused the client, while it is misconfigured.
    pub(crate) fn misconfigured(&self) -> Option<&CloseReason> {
        self.misconfigured.as_ref()
    }

    /// Why the latest connection attempt ended, if one did since the last
    /// `W`: what an acquire that could not be sent was kept from by.
    pub(crate) fn last_end(&self) -> Option<&CloseReason> {
        self.last_end.as_ref()
    }

    /// Why the client is unreachable, while it is: the last round of
    /// attempts failed at every address and no `W` came since (the round
    /// under way, if any, has not succeeded yet). How the latest attempt
    /// ended is the cause an acquire that gives up then carries.
    pub(crate) fn unreachable(&self) -> Option<&CloseReason> {
        self.last_end.as_ref().filter(|_| self.round_failed)
    }

    /// Whether `addr` is stale as a hint at `now`: its latest connection
    /// ended by a transport failure less than `stale_hint` ago.
    fn is_stale(&self, addr: &Endpoint, now: Time, stale_hint: Duration) -> bool {
        self.failed_at
            .iter()
            .any(|(a, at)| a == addr && now < at.saturating_add(stale_hint))
    }

    /// The address the round tries next: the leader hint if there is one
    /// that this round has not tried and that is not stale, else the next
    /// configured endpoint in turn that it has not tried; `None` once the
    /// round has tried every address it may.
    fn next_address(&mut self, now: Time, config: &Config) -> Option<Endpoint> {
        if let Some(hint) = &self.hint {
            if !self.round.has_tried(hint) && !self.is_stale(hint, now, config.stale_hint) {
                return Some(hint.clone());
            }
        }
        let endpoints = &config.endpoints;
        while self.round.endpoints_left > 0 {
            self.round.endpoints_left -= 1;
            let addr = &endpoints[self.next_endpoint % endpoints.len()];
            self.next_endpoint = (self.next_endpoint + 1) % endpoints.len();
            if !self.round.has_tried(addr) {
                return Some(addr.clone());
            }
        }
        None
    }

    /// Opens a connection to `addr`, given up at `deadline` unless it
    /// connects first.
    fn open(&mut self, addr: Endpoint, to_hint: bool, deadline: Time) -> ConnId {
        let id = ConnId(self.next_conn);
        self.next_conn += 1;
        self.round.tried.push(addr.clone());
        self.state = LinkState::Up {
            conn: Conn { id, addr, to_hint },
            phase: Phase::Connecting { deadline },
        };
        id
    }

    /// A `W` on the current connection: the round succeeded, and every
    /// count of failures starts again.
    fn welcomed(&mut self) {
        self.failed_rounds = 0;
        self.misconfigured = None;
        self.last_end = None;
        self.round_failed = false;
    }

    /// Notes how the connection `conn`, in `phase`, ended, and says what
    /// comes next: the round goes on at once, or the client waits before
    /// the next round (`cap`: the cap a held lease puts on the wait).
    fn ended(
        &mut self,
        cx: &mut Ctx<'_>,
        conn: &Conn,
        phase: &Phase,
        reason: &CloseReason,
    ) -> Next {
        let (now, config) = (cx.now, cx.config);
        self.ignored = None;
        self.failed_at.retain(|(addr, _)| *addr != conn.addr);
        if is_transport_failure(reason) {
            self.failed_at.push((conn.addr.clone(), now));
        }
        self.forget_hint_after(conn, phase, reason);
        if matches!(reason, CloseReason::Cancel | CloseReason::Shutdown) {
            // Our own decisions: the connection itself was fine.
            self.round.restart(config.endpoints.len());
            return Next::AtOnce;
        }
        self.last_end = Some(reason.clone());
        if matches!(phase, Phase::Ready { .. }) {
            // A connection that had its `W` ends: the next round begins
            // after the first step's delay, as after a first failed round,
            // so that a node's clients do not all come back at once.
            self.round.restart(config.endpoints.len());
            self.failed_rounds = 1;
            let cause = backoff_cause(reason);
            let delay = self.delay(cause, cx);
            return Next::Wait {
                cause,
                delay,
                misconfigured: None,
            };
        }
        self.round.ended(reason);
        if self.next_address_exists(now, config) {
            return Next::AtOnce;
        }
        self.failed_rounds = self.failed_rounds.saturating_add(1);
        self.round_failed = true;
        let cause = self.round.cause();
        let misconfigured = self.round.misconfigures().cloned();
        if misconfigured.is_some() {
            self.misconfigured.clone_from(&misconfigured);
        }
        self.round.restart(config.endpoints.len());
        let delay = self.delay(cause, cx);
        Next::Wait {
            cause,
            delay,
            misconfigured,
        }
    }

    /// Whether the round has an address left to try, without taking it.
    fn next_address_exists(&self, now: Time, config: &Config) -> bool {
        let hint_left = self.hint.as_ref().is_some_and(|hint| {
            !self.round.has_tried(hint) && !self.is_stale(hint, now, config.stale_hint)
        });
        let endpoints = &config.endpoints;
        let endpoint_left = (0..self.round.endpoints_left)
            .map(|i| &endpoints[(self.next_endpoint + i) % endpoints.len()])
            .any(|addr| !self.round.has_tried(addr));
        hint_left || endpoint_left
    }

    /// The wait before the next round, after `failed_rounds` failed rounds
    /// in a row whose last failed for `cause`: `d/2 + random(0, d/2)` with
    /// `d = min(cap, base * 2^(k-1))`, then at most what a held lease
    /// allows.
    fn delay(&self, cause: BackoffCause, cx: &mut Ctx<'_>) -> Duration {
        let backoff = round_backoff(cause, cx.config);
        let step = backoff.step(self.failed_rounds.saturating_sub(1));
        let delay = jittered(step, cx.rng);
        cx.cap.map_or(delay, |cap| delay.min(cap))
    }

    /// Forgets the leader hint when the connection that just ended shows
    /// it is no use: `E no_leader` anywhere; and a connection to the hint
    /// that ended without `W` for any reason but an `M` to another
    /// allowlisted address (which is the hint now), or that ended in `M`
    /// or `E not_active` after it. So a hinted node that is gone or broken
    /// never keeps the client from its configured endpoints.
    fn forget_hint_after(&mut self, conn: &Conn, phase: &Phase, reason: &CloseReason) {
        let welcomed = matches!(phase, Phase::Ready { .. });
        let still_the_hint = conn.to_hint && self.hint.as_ref() == Some(&conn.addr);
        let hint_failed = still_the_hint
            && (!welcomed || matches!(reason, CloseReason::Moved | CloseReason::NotActive));
        if hint_failed || *reason == CloseReason::NoLeader {
            self.hint = None;
        }
    }
}

/// The backoff for rounds that failed for `cause`.
fn round_backoff(cause: BackoffCause, config: &Config) -> Backoff {
    let b = &config.backoff;
    match cause {
        BackoffCause::Transport => b.transport,
        BackoffCause::NoLeader => b.no_leader,
        BackoffCause::NotActive => b.not_active,
        BackoffCause::AuthFailed => b.auth_failed,
        BackoffCause::UnsupportedVersion => b.unsupported_version,
        BackoffCause::Redirect => b.redirect,
        BackoffCause::Busy => b.busy,
    }
}

/// A connection the link just closed, as it was.
pub(crate) struct Closed {
    conn: Conn,
    phase: Phase,
}

impl Link {
    /// The connection the core is using or opening, if any.
    pub(crate) fn connection(&self) -> Option<ConnId> {
        match &self.state {
            LinkState::Up { conn, .. } => Some(conn.id),
            _ => None,
        }
    }

    /// The window of the current connection, once `W` arrived.
    pub(crate) fn window(&self) -> Option<u64> {
        match &self.state {
            LinkState::Up {
                phase: Phase::Ready { window, .. },
                ..
            } => Some(*window),
            _ => None,
        }
    }

    /// The node id of the current connection, once `W` arrived.
    pub(crate) fn node(&self) -> Option<&Name> {
        match &self.state {
            LinkState::Up {
                phase: Phase::Ready { node, .. },
                ..
            } => Some(node),
            _ => None,
        }
    }

    /// Whether it is down for good (shut down).
    pub(crate) fn is_finished(&self) -> bool {
        matches!(self.state, LinkState::Finished)
    }

    /// Down for good: shut down.
    pub(crate) fn finish(&mut self) {
        self.state = LinkState::Finished;
    }

    /// Starts the next attempt of the round: to the leader hint if it may
    /// be tried, else to the next endpoint in turn. A round that has
    /// nothing left starts again (the caller asks only when it may).
    pub(crate) fn connect(&mut self, fx: &mut Fx<'_>, cap: Option<Duration>) {
        let (now, config) = (fx.now, fx.config);
        let next = self.next_address(now, config).or_else(|| {
            self.round.restart(config.endpoints.len());
            self.next_address(now, config)
        });
        // A new round always has an endpoint to try: a configuration has
        // at least one ([`Config::validate`]).
        let Some(addr) = next else {
            return;
        };
        // Whether it came as the hint or in turn, a connection to the
        // hint's address is one to the hint.
        let to_hint = self.hint.as_ref() == Some(&addr);
        let timeout = capped(config.connect_timeout, cap);
        let id = self.open(addr.clone(), to_hint, now.saturating_add(timeout));
        fx.actions.push_back(Action::Connect {
            conn: id,
            addr: addr.clone(),
        });
        fx.events.push_back(Event::Connecting { addr });
    }

    /// Whether no connection is planned: down for good while shutting
    /// down, until something is to be sent.
    pub(crate) fn is_idle(&self) -> bool {
        matches!(self.state, LinkState::Down { until: Time::MAX })
    }

    /// The link's deadline passed: the wait before a round ended (a new
    /// round starts), or the connect or the handshake took too long (the
    /// reason to close for).
    pub(crate) fn fire(&mut self, fx: &mut Fx<'_>, cap: Option<Duration>) -> Option<CloseReason> {
        match &self.state {
            LinkState::Down { .. } => {
                self.round.restart(fx.config.endpoints.len());
                self.connect(fx, cap);
                None
            }
            LinkState::Up {
                phase: Phase::Connecting { .. },
                ..
            } => Some(CloseReason::ConnectTimeout),
            LinkState::Up {
                phase: Phase::Handshaking { .. },
                ..
            } => Some(CloseReason::HandshakeTimeout),
            LinkState::Up { .. } | LinkState::Finished => None,
        }
    }

    /// The transport of `conn` is up: `H` goes out next.
    pub(crate) fn connected(&mut self, fx: &mut Fx<'_>, conn: ConnId, cap: Option<Duration>) {
        let timeout = capped(fx.config.handshake_timeout, cap);
        if let LinkState::Up { conn: c, phase } = &mut self.state {
            if c.id == conn && matches!(phase, Phase::Connecting { .. }) {
                *phase = Phase::Handshaking {
                    deadline: fx.now.saturating_add(timeout),
                    hello_sent: false,
                };
            }
        }
    }

    /// Encodes `H` if it is due on this connection.
    pub(crate) fn send_hello(&mut self, fx: &mut Fx<'_>) {
        if let LinkState::Up {
            phase: Phase::Handshaking { hello_sent, .. },
            ..
        } = &mut self.state
        {
            if !*hello_sent {
                *hello_sent = true;
                let config = fx.config;
                ClientFrame::Hello {
                    version: VERSION,
                    client_id: config.client_id.to_wire(),
                    credential: config
                        .credential
                        .as_ref()
                        .map_or(Atom::trusted("-"), Name::to_wire),
                }
                .encode(fx.send);
            }
        }
    }

    /// Whether `H` waits to go out.
    pub(crate) fn hello_due(&self) -> bool {
        matches!(
            self.state,
            LinkState::Up {
                phase: Phase::Handshaking {
                    hello_sent: false,
                    ..
                },
                ..
            }
        )
    }

    /// Handles a frame that is not an answer to a request: `W`, `L`, `M`,
    /// `E`. `Err` closes the connection, for that reason.
    pub(crate) fn notice(
        &mut self,
        fx: &mut Fx<'_>,
        frame: ServerFrame<'_>,
    ) -> Result<(), CloseReason> {
        let LinkState::Up { conn, phase } = &mut self.state else {
            return Ok(());
        };
        match frame {
            ServerFrame::Welcome { node, window } => {
                if !matches!(phase, Phase::Handshaking { .. }) {
                    return Err(CloseReason::Protocol(Violation::SecondWelcome));
                }
                let node = Name::from(node);
                *phase = Phase::Ready {
                    window: window.get(),
                    node: node.clone(),
                };
                let addr = conn.addr.clone();
                self.welcomed();
                fx.events.push_back(Event::Connected {
                    addr,
                    node,
                    window: window.get(),
                });
                Ok(())
            }
            ServerFrame::Leader { addr } => {
                self.take_hint(fx, addr);
                Ok(())
            }
            ServerFrame::Moved { addr } => {
                self.take_hint(fx, addr);
                Err(CloseReason::Moved)
            }
            ServerFrame::Error { reason } => Err(match reason.as_str() {
                "no_leader" => CloseReason::NoLeader,
                "not_active" => CloseReason::NotActive,
                "auth_failed" => CloseReason::AuthFailed,
                "unsupported_version" => CloseReason::UnsupportedVersion,
                _ => CloseReason::ServerError(Name::from(reason)),
            }),
            // Answers are the client's to route; one before `W` is a
            // violation.
            ServerFrame::Answer(_) if matches!(phase, Phase::Ready { .. }) => Ok(()),
            ServerFrame::Answer(_) => Err(CloseReason::Protocol(Violation::AnswerBeforeWelcome)),
        }
    }

    /// A leader hint (`L` or `M`): taken only if allowlisted.
    ///
    /// A hint that changes nothing for the embedder is not told again: the
    /// hint it already is, or the address refused last on this connection.
    /// So a server that repeats itself cannot flood the embedder with
    /// notices.
    fn take_hint(&mut self, fx: &mut Fx<'_>, addr: Addr<'_>) {
        let same =
            |known: &Option<Endpoint>| known.as_ref().map(Endpoint::as_str) == Some(addr.as_str());
        if fx.config.allows(addr) {
            if !same(&self.hint) {
                let endpoint = Endpoint::from(addr);
                self.hint = Some(endpoint.clone());
                fx.events.push_back(Event::LeaderHint { addr: endpoint });
            }
        } else if !same(&self.ignored) {
            let endpoint = Endpoint::from(addr);
            self.ignored = Some(endpoint.clone());
            fx.events.push_back(Event::HintIgnored { addr: endpoint });
        }
    }

    /// Closes the connection (or abandons the connect attempt) for
    /// `reason`: the close action and the notice. What it was, for
    /// [`Link::after_close`]; `None` if there was none.
    pub(crate) fn close(&mut self, fx: &mut Fx<'_>, reason: &CloseReason) -> Option<Closed> {
        let state = mem::replace(&mut self.state, LinkState::Down { until: Time::MAX });
        let LinkState::Up { conn, phase } = state else {
            self.state = state;
            return None;
        };
        if !matches!(reason, CloseReason::ConnectFailed | CloseReason::Tls(_)) {
            fx.actions.push_back(Action::Close { conn: conn.id });
        }
        fx.events.push_back(Event::Closed {
            addr: conn.addr.clone(),
            reason: reason.clone(),
        });
        Some(Closed { conn, phase })
    }

    /// After a close, once the requests on the connection are settled:
    /// the round goes on at once, or the client waits before the next one
    /// (with [`Plan::Idle`], no new attempt is planned). How the round
    /// failed, if it just did: refused by every address (misconfigured),
    /// or unreachable.
    pub(crate) fn after_close(
        &mut self,
        fx: &mut Fx<'_>,
        rng: &mut Rng,
        cap: Option<Duration>,
        closed: Closed,
        reason: &CloseReason,
        plan: Plan,
    ) -> Option<RoundFailed> {
        match reason {
            CloseReason::AuthFailed => fx.events.push_back(Event::AuthFailed {
                addr: closed.conn.addr.clone(),
            }),
            CloseReason::UnsupportedVersion => fx.events.push_back(Event::UnsupportedVersion {
                addr: closed.conn.addr.clone(),
            }),
            _ => {}
        }
        let mut cx = Ctx {
            now: fx.now,
            config: fx.config,
            rng,
            cap,
        };
        let next = self.ended(&mut cx, &closed.conn, &closed.phase, reason);
        if plan == Plan::Idle {
            return None;
        }
        match next {
            Next::AtOnce => {
                self.connect(fx, cap);
                None
            }
            Next::Wait {
                cause,
                delay,
                misconfigured,
            } => {
                let until = fx.now.saturating_add(delay);
                self.state = LinkState::Down { until };
                fx.events.push_back(Event::Backoff { cause, until });
                if let Some(cause) = &misconfigured {
                    fx.events.push_back(Event::Misconfigured {
                        cause: cause.clone(),
                    });
                }
                match misconfigured {
                    Some(refusal) => Some(RoundFailed::Refused(refusal)),
                    None => self.unreachable().cloned().map(RoundFailed::Unreachable),
                }
            }
        }
    }
}

/// `wait`, shortened by what a held lease allows.
fn capped(wait: Duration, cap: Option<Duration>) -> Duration {
    cap.map_or(wait, |cap| wait.min(cap))
}

#[cfg(test)]
mod tests {
    use super::super::harness::Harness;
    use super::*;

    fn endpoint(s: &str) -> Endpoint {
        Endpoint::new(s).expect("an endpoint")
    }

    fn frame(line: &str) -> ServerFrame<'_> {
        ServerFrame::parse(line.as_bytes()).expect("a frame")
    }

    /// Where the link connects now (the last `Connect` handed out).
    fn connecting(h: &mut Harness) -> (ConnId, String) {
        let mut last = None;
        while let Some(action) = h.actions.pop_front() {
            if let Action::Connect { conn, addr } = action {
                last = Some((conn, addr.as_str().to_owned()));
            }
        }
        last.expect("a Connect")
    }

    /// The current attempt ends for `reason`; where the link goes next.
    fn fail(
        h: &mut Harness,
        link: &mut Link,
        rng: &mut Rng,
        reason: CloseReason,
    ) -> Option<RoundFailed> {
        let closed = link.close(&mut h.fx(), &reason).expect("a connection");
        link.after_close(&mut h.fx(), rng, None, closed, &reason, Plan::Connect)
    }

    /// The connection `conn` is welcomed by node `n1`.
    fn welcome(h: &mut Harness, link: &mut Link, conn: ConnId) {
        link.connected(&mut h.fx(), conn, None);
        link.send_hello(&mut h.fx());
        assert!(h.sent().starts_with("H 2 me -"));
        link.notice(&mut h.fx(), frame("W n1 64"))
            .expect("a welcome");
        assert_eq!(link.window(), Some(64));
    }

    #[test]
    fn a_round_tries_every_endpoint_in_turn_then_backs_off_longer_each_time() {
        let (mut h, mut link, mut rng) = (Harness::new(), Link::new(3), Rng::new(7));
        let mut waits = Vec::new();
        link.connect(&mut h.fx(), None);
        for round in 0..4 {
            let mut tried = Vec::new();
            for _ in 0..3 {
                tried.push(connecting(&mut h).1);
                fail(&mut h, &mut link, &mut rng, CloseReason::ConnectFailed);
            }
            assert_eq!(tried.len(), 3, "round {round}");
            tried.sort();
            assert_eq!(tried, ["a:1", "b:1", "c:1"], "round {round}: each once");
            let until = link.deadline().expect("a wait");
            waits.push(until.saturating_duration_since(h.now));
            h.now = until;
            assert_eq!(link.fire(&mut h.fx(), None), None, "a new round");
        }
        // d/2 + random(0, d/2), d doubling from 50 ms.
        for (k, wait) in waits.iter().enumerate() {
            let d = Duration::from_millis(50 << k);
            assert!(
                *wait >= d / 2 && *wait <= d,
                "round {k}: {wait:?} for {d:?}"
            );
        }
    }

    /// PROTOCOL.md section 5, "an acquire not yet sent": the client is
    /// unreachable from the end of a round that failed at every address
    /// until a `W`, whatever the next round is doing; a welcomed
    /// connection that ends is no failed round.
    #[test]
    fn a_round_failed_at_every_address_leaves_the_client_unreachable_until_a_welcome() {
        let (mut h, mut link, mut rng) = (Harness::new(), Link::new(3), Rng::new(7));
        link.connect(&mut h.fx(), None);
        for attempt in 0..3 {
            assert_eq!(link.unreachable(), None, "attempt {attempt}");
            connecting(&mut h);
            let told = fail(&mut h, &mut link, &mut rng, CloseReason::ConnectFailed);
            let want =
                (attempt == 2).then_some(RoundFailed::Unreachable(CloseReason::ConnectFailed));
            assert_eq!(told, want, "attempt {attempt}");
        }
        assert_eq!(link.unreachable(), Some(&CloseReason::ConnectFailed));
        // The next round starts: still unreachable, with its latest cause.
        h.now = link.deadline().expect("a wait");
        assert_eq!(link.fire(&mut h.fx(), None), None);
        connecting(&mut h);
        assert_eq!(
            fail(&mut h, &mut link, &mut rng, CloseReason::ConnectTimeout),
            None
        );
        assert_eq!(link.unreachable(), Some(&CloseReason::ConnectTimeout));
        let (conn, _) = connecting(&mut h);
        welcome(&mut h, &mut link, conn);
        assert_eq!(link.unreachable(), None);
        // A connection that had its `W` ends: a wait, but no failed round.
        assert_eq!(fail(&mut h, &mut link, &mut rng, CloseReason::Eof), None);
        assert_eq!(link.unreachable(), None);
    }

    #[test]
    fn a_hint_is_tried_first_only_if_allowlisted_and_told_once() {
        let (mut h, mut link, mut rng) = (Harness::new(), Link::new(3), Rng::new(7));
        h.config.allow.push(endpoint("d:1"));
        link.connect(&mut h.fx(), None);
        let (conn, _) = connecting(&mut h);
        welcome(&mut h, &mut link, conn);
        h.events();
        for _ in 0..3 {
            link.notice(&mut h.fx(), frame("L x:9")).expect("kept");
        }
        assert_eq!(
            h.events(),
            [Event::HintIgnored {
                addr: endpoint("x:9")
            }]
        );
        assert_eq!(
            link.notice(&mut h.fx(), frame("M d:1")),
            Err(CloseReason::Moved)
        );
        assert_eq!(
            h.events(),
            [Event::LeaderHint {
                addr: endpoint("d:1")
            }]
        );
        // A close of a welcomed connection waits a first step, then the
        // next round goes to the hint first.
        assert_eq!(fail(&mut h, &mut link, &mut rng, CloseReason::Moved), None);
        h.now = link.deadline().expect("a wait");
        assert_eq!(link.fire(&mut h.fx(), None), None);
        assert_eq!(connecting(&mut h).1, "d:1");
        // A hint that fails to connect is forgotten: the round goes on
        // with the configured endpoints.
        fail(&mut h, &mut link, &mut rng, CloseReason::ConnectFailed);
        assert_ne!(connecting(&mut h).1, "d:1");
        assert!(link.hint.is_none());
    }

    #[test]
    fn a_held_lease_shortens_every_wait_of_the_link() {
        let (mut h, mut link, mut rng) = (Harness::new(), Link::new(3), Rng::new(7));
        let cap = Duration::from_millis(20);
        link.connect(&mut h.fx(), Some(cap));
        assert_eq!(link.deadline(), Some(h.now.saturating_add(cap)), "connect");
        let (conn, _) = connecting(&mut h);
        link.connected(&mut h.fx(), conn, Some(cap));
        assert_eq!(
            link.deadline(),
            Some(h.now.saturating_add(cap)),
            "handshake"
        );
        link.notice(&mut h.fx(), frame("W n1 8"))
            .expect("a welcome");
        // After a welcomed connection, a first step of 25 to 50 ms: 20.
        let reason = CloseReason::Eof;
        let closed = link.close(&mut h.fx(), &reason).expect("a connection");
        link.after_close(
            &mut h.fx(),
            &mut rng,
            Some(cap),
            closed,
            &reason,
            Plan::Connect,
        );
        assert_eq!(link.deadline(), Some(h.now.saturating_add(cap)), "backoff");
        h.now = h.now.saturating_add(cap);
        link.fire(&mut h.fx(), Some(cap));
        assert_eq!(
            link.fire(&mut h.fx(), Some(cap)),
            Some(CloseReason::ConnectTimeout)
        );
    }

    #[test]
    fn a_round_every_server_refuses_leaves_the_client_misconfigured_until_a_welcome() {
        let (mut h, mut link, mut rng) = (Harness::new(), Link::new(3), Rng::new(7));
        link.connect(&mut h.fx(), None);
        let mut told = None;
        for _ in 0..3 {
            let (conn, _) = connecting(&mut h);
            link.connected(&mut h.fx(), conn, None);
            let refused = link.notice(&mut h.fx(), frame("E auth_failed"));
            assert_eq!(refused, Err(CloseReason::AuthFailed));
            told = fail(&mut h, &mut link, &mut rng, CloseReason::AuthFailed);
        }
        assert_eq!(told, Some(RoundFailed::Refused(CloseReason::AuthFailed)));
        assert_eq!(link.misconfigured(), Some(&CloseReason::AuthFailed));
        let events = h.events();
        assert!(events.contains(&Event::Misconfigured {
            cause: CloseReason::AuthFailed
        }));
        // Its backoff is the refusal's: at least half of a second.
        let wait = link
            .deadline()
            .expect("a wait")
            .saturating_duration_since(h.now);
        assert!(wait >= Duration::from_millis(500), "{wait:?}");
        h.now = link.deadline().expect("a wait");
        assert_eq!(link.fire(&mut h.fx(), None), None);
        let (conn, _) = connecting(&mut h);
        welcome(&mut h, &mut link, conn);
        assert_eq!(link.misconfigured(), None);
    }

    #[test]
    fn answers_before_the_welcome_and_a_second_welcome_are_violations() {
        let (mut h, mut link) = (Harness::new(), Link::new(3));
        link.connect(&mut h.fx(), None);
        let (conn, _) = connecting(&mut h);
        link.connected(&mut h.fx(), conn, None);
        assert_eq!(
            link.notice(&mut h.fx(), frame("D 1 R k")),
            Err(CloseReason::Protocol(Violation::AnswerBeforeWelcome))
        );
        link.notice(&mut h.fx(), frame("W n1 8"))
            .expect("a welcome");
        assert_eq!(link.notice(&mut h.fx(), frame("D 1 R k")), Ok(()));
        assert_eq!(
            link.notice(&mut h.fx(), frame("W n1 8")),
            Err(CloseReason::Protocol(Violation::SecondWelcome))
        );
    }
}
