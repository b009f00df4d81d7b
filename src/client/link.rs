//! The connection's life: where to connect, the handshake, leader hints,
//! closing, and backing off (PROTOCOL.md section 5, "Connecting and backing
//! off", and the rows for `L`, `M` and `E`).

use core::mem;

use super::outcome::{Action, BackoffCause, CloseReason, ConnId, Event, Violation};
use super::{AcquirePhase, Client, Entry};
use crate::names::{Endpoint, Name};
use crate::time::Time;
use crate::wire::{Addr, ServerFrame, VERSION};

/// The connection in use.
pub(crate) struct Conn {
    pub(crate) id: ConnId,
    pub(crate) addr: Endpoint,
    /// Whether the address came from a leader hint (a failure forgets it).
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
    /// No connection; the next attempt starts at `until`.
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

    /// The current connection, if its id is `conn`.
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

    /// The transport is up: `H` goes out next.
    pub(crate) fn on_connected(&mut self) {
        if let LinkState::Up { phase, .. } = &mut self.link.state {
            if matches!(phase, Phase::Connecting { .. }) {
                *phase = Phase::Handshaking {
                    deadline: self.now.saturating_add(self.config.handshake_timeout),
                    hello_sent: false,
                };
            }
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
                let dash = crate::wire::Atom::new("-").expect("valid atom");
                crate::wire::ClientFrame::Hello {
                    version: VERSION,
                    client_id: self.config.client_id.to_wire(),
                    credential: self.config.credential.as_ref().map_or(dash, Name::to_wire),
                }
                .encode(&mut self.out);
            }
        }
    }

    /// Handles a frame that is not an answer: `W`, `L`, `M`, `E`.
    /// Answers go to [`Client::on_answer`]. `Err` closes the connection.
    pub(crate) fn on_frame(&mut self, frame: ServerFrame<'_>) -> Result<(), CloseReason> {
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
                _ => CloseReason::ServerError(Name::from(reason)),
            }),
            ServerFrame::Answer(answer) => {
                if matches!(phase, Phase::Ready { .. }) {
                    self.on_answer(answer.into())
                } else {
                    // Nothing is sent before W, so no answer can be due.
                    self.stray_answer(answer.into());
                    Err(CloseReason::Protocol(Violation::AnswerBeforeWelcome))
                }
            }
        }
    }

    /// A leader hint (`L` or `M`): taken only if allowlisted.
    fn take_hint(&mut self, addr: Addr<'_>) {
        let endpoint = Endpoint::from(addr);
        if self.config.allows(addr) {
            self.link.hint = Some(endpoint.clone());
            self.events.push_back(Event::LeaderHint { addr: endpoint });
        } else {
            self.events.push_back(Event::HintIgnored { addr: endpoint });
        }
    }

    /// Closes the connection (or abandons the connect attempt) for `reason`
    /// and applies "any close" to the operations on it, then decides when
    /// and where to connect next.
    pub(crate) fn close(&mut self, reason: CloseReason) {
        let state = mem::replace(&mut self.link.state, LinkState::Down { until: Time::MAX });
        let LinkState::Up { conn, .. } = state else {
            self.link.state = state;
            return;
        };
        if reason != CloseReason::ConnectFailed {
            self.actions.push_back(Action::Close { conn: conn.id });
        }
        self.events.push_back(Event::Closed {
            addr: conn.addr.clone(),
            reason: reason.clone(),
        });
        self.reader.reset();
        self.settle_pending_on_close();

        if self.finishing {
            return;
        }
        let cause = match reason {
            CloseReason::Moved => {
                // The hinted node says it does not lead and named no other
                // allowlisted leader: going back to it would only ask it
                // again, so forget the hint and use the next endpoint (as
                // for `E not_active` at the hint).
                if conn.to_hint && self.link.hint.as_ref() == Some(&conn.addr) {
                    self.link.hint = None;
                }
                self.link.redirects += 1;
                if self.link.redirects <= FREE_REDIRECTS {
                    None
                } else {
                    Some(BackoffCause::Redirect)
                }
            }
            CloseReason::NoLeader => {
                self.link.hint = None;
                Some(BackoffCause::NoLeader)
            }
            CloseReason::NotActive => {
                if conn.to_hint {
                    self.link.hint = None;
                }
                Some(BackoffCause::NotActive)
            }
            CloseReason::AuthFailed => {
                self.events.push_back(Event::AuthFailed {
                    addr: conn.addr.clone(),
                });
                Some(BackoffCause::AuthFailed)
            }
            CloseReason::ConnectFailed
            | CloseReason::ConnectTimeout
            | CloseReason::HandshakeTimeout => {
                if conn.to_hint {
                    self.link.hint = None;
                }
                Some(BackoffCause::Transport)
            }
            // Our own decisions: the connection itself was fine.
            CloseReason::Cancel | CloseReason::Shutdown => None,
            CloseReason::Eof
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

    /// When the `n`-th backoff in a row for `cause` ends: `d/2 +
    /// random(0, d/2)` with `d = min(cap, base * 2^n)`.
    pub(crate) fn backoff_until(&mut self, cause: BackoffCause, n: u32) -> Time {
        let b = &self.config.backoff;
        let backoff = match cause {
            BackoffCause::Transport => b.transport,
            BackoffCause::NoLeader => b.no_leader,
            BackoffCause::NotActive => b.not_active,
            BackoffCause::AuthFailed => b.auth_failed,
            BackoffCause::Redirect => b.redirect,
            BackoffCause::Busy => b.busy,
        };
        let step = crate::time::duration_nanos(backoff.step(n));
        let half = step / 2;
        let delay = half.saturating_add(self.rng.up_to(half));
        self.now
            .saturating_add(core::time::Duration::from_nanos(delay))
    }

    /// Any close: sent acquires end Indeterminate and are never resent;
    /// abandoned waiters are dropped (lease expiry settles them); sent
    /// releases go back to the front of the lane, in their order; unsent
    /// requests stay queued.
    fn settle_pending_on_close(&mut self) {
        let mut sent = mem::take(&mut self.scratch);
        sent.clear();
        sent.extend(self.pending.drain());
        sent.sort_unstable();
        self.acquires_in_flight = 0;
        let mut releases = Vec::new();
        for &(_, idx) in &sent {
            match self.table.get(idx) {
                // SABOTAGE (feature `sim` only): a sent acquire goes back to
                // the queue, to be sent again on the next connection,
                // instead of ending Indeterminate.
                #[cfg(feature = "sim")]
                Some(Entry::Acquire(acquire))
                    if acquire.phase == AcquirePhase::Sent
                        && self.config.sabotage == super::Sabotage::ResendAfterClose =>
                {
                    let until = acquire.budget_end.max(self.now);
                    if let Some(Entry::Acquire(a)) = self.table.get_mut(idx) {
                        a.phase = AcquirePhase::Queued;
                    }
                    let gen = self.table.gen(idx).expect("occupied");
                    self.queue.push_back(idx, gen);
                    self.table.set_timer(idx, until, super::LANE_QUEUED);
                }
                Some(Entry::Acquire(acquire)) if acquire.phase == AcquirePhase::Sent => {
                    let settles_by = self
                        .now
                        .saturating_add_millis(acquire.wire_wait_ms())
                        .saturating_add_millis(acquire.lease_ms.get())
                        .saturating_add_nanos(self.settle_margin_ns);
                    self.emit_outcome(idx, super::Outcome::Indeterminate { settles_by });
                    self.retire(idx);
                }
                Some(Entry::Acquire(_)) => {
                    self.retire(idx);
                }
                Some(Entry::Release(_)) => releases.push(idx),
                Some(Entry::Held(_)) | None => unreachable!("pending entries are requests"),
            }
        }
        for &idx in releases.iter().rev() {
            self.requeue_release(idx);
        }
        self.scratch = sent;
    }

    /// Whether the connection is up and its handshake done.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(
            self.link.state,
            LinkState::Up {
                phase: Phase::Ready { .. },
                ..
            }
        )
    }

    /// Whether a shutting-down client still needs a connection.
    pub(crate) fn has_work_to_drain(&self) -> bool {
        self.lane.live() > 0 || !self.pending.is_empty()
    }
}
