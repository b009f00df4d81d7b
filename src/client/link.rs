//! The connection's life: where to connect, the handshake, leader hints,
//! closing, and backing off (PROTOCOL.md section 5, "Connecting and backing
//! off", the rows for `L`, `M` and `E`, and "any close").

use core::mem;

use super::operations::AcquirePhase;
use super::outcome::{Action, BackoffCause, CloseReason, ConnId, Event, Outcome, Violation};
use super::{Client, Request};
use crate::names::{Endpoint, Name};
use crate::time::Time;
use crate::wire::{Addr, Atom, ClientFrame, FrameError, ServerFrame, VERSION};

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
    /// No connection; the next attempt starts at `until` (`Time::MAX`:
    /// none is planned).
    Down { until: Time },
    /// A connection in some phase.
    Up { conn: Conn, phase: Phase },
    /// Shut down for good.
    Finished,
}

pub(crate) struct Link {
    pub(crate) state: LinkState,
    next_conn: u64,
    next_endpoint: usize,
    pub(crate) hint: Option<Endpoint>,
    /// The last address a hint on the current connection named that the
    /// allowlist refused.
    ignored: Option<Endpoint>,
    /// Backoffs in a row since the last `W`.
    failures: u32,
    /// Redirects in a row since the last `W`.
    redirects: u32,
}

/// Redirects in a row that reconnect at once; the next ones back off.
const FREE_REDIRECTS: u32 = 3;

impl Link {
    pub(crate) fn new() -> Link {
        Link {
            state: LinkState::Down { until: Time::ZERO },
            next_conn: 1,
            next_endpoint: 0,
            hint: None,
            ignored: None,
            failures: 0,
            redirects: 0,
        }
    }

    /// The link's own deadline: the next connect, or the connect or
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
}

impl Client {
    /// Starts a connection to the leader hint if there is one, else to the
    /// next endpoint in turn.
    pub(crate) fn connect(&mut self) {
        let (addr, to_hint) = match &self.link.hint {
            Some(hint) => (hint.clone(), true),
            None => {
                let endpoints = &self.config.endpoints;
                let addr = endpoints[self.link.next_endpoint % endpoints.len()].clone();
                self.link.next_endpoint = (self.link.next_endpoint + 1) % endpoints.len();
                (addr, false)
            }
        };
        let id = ConnId(self.link.next_conn);
        self.link.next_conn += 1;
        self.actions.push_back(Action::Connect {
            conn: id,
            addr: addr.clone(),
        });
        self.events
            .push_back(Event::Connecting { addr: addr.clone() });
        self.link.state = LinkState::Up {
            conn: Conn { id, addr, to_hint },
            phase: Phase::Connecting {
                deadline: self.now.saturating_add(self.config.connect_timeout),
            },
        };
    }

    /// The link's deadline passed: the backoff ended (connect), or the
    /// connect or the handshake took too long.
    pub(crate) fn fire_link(&mut self) {
        match &self.link.state {
            LinkState::Down { .. } => self.connect(),
            LinkState::Up {
                phase: Phase::Connecting { .. },
                ..
            } => self.close(CloseReason::ConnectTimeout),
            LinkState::Up {
                phase: Phase::Handshaking { .. },
                ..
            } => self.close(CloseReason::HandshakeTimeout),
            LinkState::Up { .. } | LinkState::Finished => {}
        }
    }

    /// The transport is up: `H` goes out next.
    pub(crate) fn on_connected(&mut self) {
        if let LinkState::Up { phase, .. } = &mut self.link.state {
            *phase = Phase::Handshaking {
                deadline: self.now.saturating_add(self.config.handshake_timeout),
                hello_sent: false,
            };
        }
    }

    /// Encodes `H` if it has not gone out on this connection.
    pub(crate) fn fill_hello(&mut self) {
        if let LinkState::Up {
            phase: Phase::Handshaking { hello_sent, .. },
            ..
        } = &mut self.link.state
        {
            if !*hello_sent {
                *hello_sent = true;
                ClientFrame::Hello {
                    version: VERSION,
                    client_id: self.config.client_id.to_wire(),
                    credential: self
                        .config
                        .credential
                        .as_ref()
                        .map_or(Atom::trusted("-"), Name::to_wire),
                }
                .encode(self.out.writer());
            }
        }
    }

    /// Whether a request, or the hello, can go out now.
    pub(crate) fn can_send(&self) -> bool {
        match &self.link.state {
            LinkState::Up {
                phase: Phase::Handshaking { hello_sent, .. },
                ..
            } => !hello_sent,
            LinkState::Up {
                phase: Phase::Ready { window, .. },
                ..
            } => self.has_sendable(*window),
            _ => false,
        }
    }

    /// Reads frames from the bytes of the current connection, `conn`, until
    /// they run out or one closes the connection. A framing error, an
    /// unknown kind, a bad pairing or an over-long line is a violation: the
    /// answer cannot be correlated, so the connection is done.
    pub(crate) fn read(&mut self, conn: ConnId, data: &[u8]) {
        let mut reader = mem::take(&mut self.reader);
        let mut input = data;
        loop {
            // A good line that lies whole in `input` is read where it is;
            // anything else goes through the reader, which buffers a line
            // cut by the end of `input` and tells which rule a bad one
            // breaks.
            let frame = match reader.at_line_start() {
                true => ServerFrame::parse_leading(input),
                false => None,
            };
            let verdict = match frame {
                Some((frame, len)) => {
                    input = &input[len..];
                    self.on_frame(frame)
                }
                None => match reader.next_line(&mut input) {
                    Some(line) => line
                        .and_then(ServerFrame::parse)
                        .map_err(|e: FrameError| CloseReason::Protocol(Violation::Framing(e)))
                        .and_then(|frame| self.on_frame(frame)),
                    None => break,
                },
            };
            if let Err(reason) = verdict {
                self.close(reason);
                break;
            }
        }
        if self.link.current(conn).is_none() {
            // The connection closed: keep the buffer's memory, not its bytes.
            reader.reset();
        }
        self.reader = reader;
    }

    /// Handles a frame: `W`, `L`, `M`, `E`, or an answer. `Err` closes the
    /// connection.
    fn on_frame(&mut self, frame: ServerFrame<'_>) -> Result<(), CloseReason> {
        let LinkState::Up { conn, phase } = &mut self.link.state else {
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
                // A successful `W` resets the backoff.
                self.link.failures = 0;
                self.link.redirects = 0;
                self.events.push_back(Event::Connected {
                    addr,
                    node,
                    window: window.get(),
                });
                Ok(())
            }
            ServerFrame::Leader { addr } => {
                self.take_hint(addr);
                Ok(())
            }
            ServerFrame::Moved { addr } => {
                self.take_hint(addr);
                Err(CloseReason::Moved)
            }
            ServerFrame::Error { reason } => Err(match reason.as_str() {
                "no_leader" => CloseReason::NoLeader,
                "not_active" => CloseReason::NotActive,
                "auth_failed" => CloseReason::AuthFailed,
                "unsupported_version" => CloseReason::UnsupportedVersion,
                _ => CloseReason::ServerError(Name::from(reason)),
            }),
            ServerFrame::Answer(answer) => {
                if matches!(phase, Phase::Ready { .. }) {
                    self.on_answer(answer)
                } else {
                    // Nothing is sent before `W`, so no answer can be due.
                    self.stray_answer(&answer);
                    Err(CloseReason::Protocol(Violation::AnswerBeforeWelcome))
                }
            }
        }
    }

    /// A leader hint (`L` or `M`): taken only if allowlisted.
    ///
    /// A hint that changes nothing for the embedder is not told again: the
    /// hint it already is, or the address refused last on this connection.
    /// So a server that repeats itself cannot flood the embedder with
    /// notices.
    fn take_hint(&mut self, addr: Addr<'_>) {
        let same =
            |known: &Option<Endpoint>| known.as_ref().map(Endpoint::as_str) == Some(addr.as_str());
        if self.config.allows(addr) {
            if !same(&self.link.hint) {
                let endpoint = Endpoint::from(addr);
                self.link.hint = Some(endpoint.clone());
                self.events.push_back(Event::LeaderHint { addr: endpoint });
            }
        } else if !same(&self.link.ignored) {
            let endpoint = Endpoint::from(addr);
            self.link.ignored = Some(endpoint.clone());
            self.events.push_back(Event::HintIgnored { addr: endpoint });
        }
    }

    /// Closes the connection (or abandons the connect attempt) for `reason`
    /// and applies "any close" to the requests on it, then decides when and
    /// where to connect next.
    pub(crate) fn close(&mut self, reason: CloseReason) {
        let state = mem::replace(&mut self.link.state, LinkState::Down { until: Time::MAX });
        let LinkState::Up { conn, phase } = state else {
            self.link.state = state;
            return;
        };
        if !matches!(reason, CloseReason::ConnectFailed | CloseReason::Tls(_)) {
            self.actions.push_back(Action::Close { conn: conn.id });
        }
        self.events.push_back(Event::Closed {
            addr: conn.addr.clone(),
            reason: reason.clone(),
        });
        self.reader.reset();
        self.link.ignored = None;
        self.settle_on_close(&reason);
        if self.finishing {
            return;
        }
        self.forget_hint_after(&conn, &phase, &reason);
        let cause = match reason {
            CloseReason::Moved => {
                self.link.redirects += 1;
                (self.link.redirects > FREE_REDIRECTS).then_some(BackoffCause::Redirect)
            }
            CloseReason::NoLeader => Some(BackoffCause::NoLeader),
            CloseReason::NotActive => Some(BackoffCause::NotActive),
            CloseReason::AuthFailed => {
                self.events.push_back(Event::AuthFailed {
                    addr: conn.addr.clone(),
                });
                Some(BackoffCause::AuthFailed)
            }
            CloseReason::UnsupportedVersion => {
                self.events.push_back(Event::UnsupportedVersion {
                    addr: conn.addr.clone(),
                });
                Some(BackoffCause::UnsupportedVersion)
            }
            // Our own decisions: the connection itself was fine.
            CloseReason::Cancel | CloseReason::Shutdown => None,
            CloseReason::ConnectFailed
            | CloseReason::Tls(_)
            | CloseReason::ConnectTimeout
            | CloseReason::HandshakeTimeout
            | CloseReason::Eof
            | CloseReason::Io
            | CloseReason::ServerError(_)
            | CloseReason::Protocol(_)
            | CloseReason::AnswerTimeout => Some(BackoffCause::Transport),
        };
        match cause {
            _ if self.shutdown.is_some() && !self.has_work_to_drain() => {
                // Nothing left to send: the shutdown check finishes now.
            }
            None => self.connect(),
            Some(cause) => {
                let until = self.backoff_until(cause, self.link.failures);
                self.link.failures = self.link.failures.saturating_add(1);
                self.link.state = LinkState::Down { until };
                self.events.push_back(Event::Backoff { cause, until });
            }
        }
    }

    /// Forgets the leader hint when the connection that just closed shows
    /// it is no use: `E no_leader` anywhere; and a connection to the hint
    /// that ended without `W` for any reason but an `M` to another
    /// allowlisted address (which is the hint now), or that ended in `M`
    /// or `E not_active` after it. So a hinted node that is gone or broken
    /// never keeps the client from its configured endpoints.
    fn forget_hint_after(&mut self, conn: &super::link::Conn, phase: &Phase, reason: &CloseReason) {
        let welcomed = matches!(phase, Phase::Ready { .. });
        let still_the_hint = conn.to_hint && self.link.hint.as_ref() == Some(&conn.addr);
        let hint_failed = still_the_hint
            && (!welcomed || matches!(reason, CloseReason::Moved | CloseReason::NotActive));
        if hint_failed || *reason == CloseReason::NoLeader {
            self.link.hint = None;
        }
    }

    /// When the `n`-th backoff in a row for `cause` ends: `d/2 +
    /// random(0, d/2)` with `d = min(cap, base * 2^n)`.
    pub(crate) fn backoff_until(&mut self, cause: BackoffCause, n: u32) -> Time {
        let b = &self.config.backoff;
        let backoff = match cause {
            BackoffCause::Transport => b.transport,
            BackoffCause::NoLeader => b.no_leader,
            BackoffCause::NotActive => b.not_active,
            BackoffCause::AuthFailed => b.auth_failed,
            BackoffCause::UnsupportedVersion => b.unsupported_version,
            BackoffCause::Redirect => b.redirect,
            BackoffCause::Busy => b.busy,
        };
        let step = crate::time::duration_nanos(backoff.step(n));
        let half = step / 2;
        let delay = half.saturating_add(self.rng.up_to(half));
        self.now.saturating_add_nanos(delay)
    }

    /// Any close: sent acquires end Indeterminate and are never sent again;
    /// abandoned waiters are dropped (lease expiry settles them); sent
    /// releases and renewals go back to the front of the lane, in their
    /// order; unsent requests stay queued for the next connection.
    fn settle_on_close(&mut self, reason: &CloseReason) {
        self.acquires_in_flight = 0;
        let mut releases = Vec::new();
        let mut renewals = Vec::new();
        for (_, op) in self.pending.drain() {
            match Request::of(op) {
                Request::Acquire(handle) => {
                    let acquire = self.acquires.get(handle).expect("in flight");
                    if acquire.phase == AcquirePhase::Abandoned {
                        self.acquires.remove(handle);
                    } else {
                        let settles_by = self.settles_by(acquire);
                        self.events.stats.count_indeterminate(Some(reason));
                        self.end_acquire(handle, Outcome::Indeterminate { settles_by });
                    }
                }
                Request::Release(handle) => releases.push(handle),
                Request::Renew(handle) => renewals.push(handle),
            }
        }
        for &release in releases.iter().rev() {
            self.requeue_release(release);
        }
        for &renewal in renewals.iter().rev() {
            self.requeue_renewal(renewal);
        }
    }
}
