//! What the client hands out: actions (a connect, the frames of a send, a
//! close) and events (outcomes, notices), each to the part it is for.

use super::acquires::{Attempt, Standing};
use super::invariant::breach;
use super::pending::Request;
use super::{Checked, Checker, Invariant, InvariantViolation};
use crate::client::{Action, ConnId, Event, OpId, Outcome};
use crate::wire::ClientFrame;

impl Checker {
    /// An action the client handed out.
    pub fn action(&mut self, action: &Action) -> Checked {
        self.timeline.write(b"action");
        self.timeline.judge(self.timeline.loud(action))?;
        match action {
            Action::Connect { conn, addr } => {
                self.timeline.write_u64(conn.get());
                self.timeline.write(addr.as_bytes());
                if self.complete {
                    return self.timeline.fail(
                        Invariant::Protocol,
                        "a connect after the shutdown completed",
                    );
                }
                self.timeline.judge(self.link.connect(*conn))?;
                self.pending.connect();
                Ok(())
            }
            Action::Send { conn, data } => {
                self.timeline.write_u64(conn.get());
                self.timeline.write(data);
                self.send(*conn, data)
            }
            Action::Close { conn } => {
                self.timeline.write_u64(conn.get());
                self.close(*conn)
            }
        }
    }

    fn close(&mut self, conn: ConnId) -> Checked {
        self.timeline.closed();
        let shutting = self.shutdown.is_some();
        let closed = self.link.close(conn, self.timeline.read_bytes(), shutting);
        self.timeline.judge(closed)?;
        self.stats.closes += 1;
        let pending = self.pending.close();
        let now = self.timeline.now();
        self.holds.advance(now);
        for (&id, request) in &pending {
            if let Request::Renew { .. } = request {
                self.holds.requeue(id, now, shutting);
            }
        }
        for request in pending.into_values() {
            if let Request::Acquire { op, .. } = request {
                self.acquires.in_doubt(op);
            }
        }
        Ok(())
    }

    fn send(&mut self, conn: ConnId, data: &[u8]) -> Checked {
        if !self.link.can_send(conn) {
            return self.timeline.fail(
                Invariant::Protocol,
                format!("Send on {conn}, which is not open"),
            );
        }
        let Some(body) = data.strip_suffix(b"\n") else {
            return self.timeline.fail(
                Invariant::Protocol,
                format!(
                    "Send of {:?}: not whole frames",
                    String::from_utf8_lossy(data)
                ),
            );
        };
        // Releases, then renewals, then acquires: the rank of the last
        // request in this send.
        let mut rank = 0;
        self.holds.advance(self.timeline.now());
        for line in body.split(|&b| b == b'\n') {
            let frame = match ClientFrame::parse(line) {
                Ok(frame) => frame,
                Err(e) => {
                    return self.timeline.fail(
                        Invariant::Protocol,
                        format!("sent {:?}, not a frame: {e}", String::from_utf8_lossy(line)),
                    )
                }
            };
            let this = match frame {
                ClientFrame::Hello { .. } => 0,
                ClientFrame::Release { .. } => 1,
                ClientFrame::Renew { .. } => 2,
                ClientFrame::Acquire { .. } => 3,
            };
            if this < rank {
                return self.timeline.fail(
                    Invariant::Protocol,
                    format!(
                        "{frame} sent after a {}: releases go first, then renewals, then acquires",
                        ["", "release", "renewal", "acquire"][rank]
                    ),
                );
            }
            rank = this;
            self.sent_frame(conn, frame)?;
        }
        Ok(())
    }

    /// A frame sent on `conn`, open: to the part it is for. A request is
    /// admitted by the window first, and registered as pending last.
    fn sent_frame(&mut self, conn: ConnId, frame: ClientFrame<'_>) -> Checked {
        let text = frame.to_string();
        let now = self.timeline.now();
        let (id, window, request) = match frame {
            ClientFrame::Hello {
                version,
                client_id,
                credential,
            } => {
                let hello =
                    self.link
                        .hello(version, client_id.as_str(), credential.as_str(), &text);
                return self.timeline.judge(hello);
            }
            ClientFrame::Acquire {
                id,
                key,
                owner,
                wait_ms,
                lease_ms,
            } => {
                let window = self.admit(id, &text)?;
                let attempt = Attempt {
                    key: key.as_str(),
                    owner: owner.as_str(),
                    wait_ms,
                    lease_ms: lease_ms.get(),
                };
                let attempt = self.acquires.attempt(&attempt, now, &text);
                let (op, retry) = self.timeline.judge(attempt)?;
                if retry {
                    self.stats.retries += 1;
                }
                let request = Request::Acquire {
                    op,
                    key: key.as_str().to_owned(),
                    lease_ms: lease_ms.get(),
                };
                (id, window, request)
            }
            ClientFrame::Renew {
                id,
                key,
                token,
                lease_ms,
            } => {
                let window = self.admit(id, &text)?;
                let key = key.as_str();
                let releasing = self.releases.releasing(key, token);
                let sent =
                    self.holds
                        .renewal_sent(id, key, token, lease_ms.get(), now, releasing, &text);
                self.timeline.judge(sent)?;
                self.stats.renewals += 1;
                let request = Request::Renew {
                    key: key.to_owned(),
                    token,
                    lease_ms: lease_ms.get(),
                };
                (id, window, request)
            }
            ClientFrame::Release { id, key, token } => {
                let window = self.admit(id, &text)?;
                let key = key.as_str();
                let held = self.holds.is_held(key, token);
                self.timeline
                    .judge(self.releases.sent(key, token, held, &text))?;
                let request = Request::Release {
                    key: key.to_owned(),
                    token,
                };
                (id, window, request)
            }
        };
        self.stats.requests += 1;
        let registered = self.pending.register(id, request, conn, window, &text);
        self.timeline.judge(registered)
    }

    /// Request `id` (`text`) went out: nothing before `W`, and never an id
    /// used before. The window.
    fn admit(&mut self, id: u64, text: &str) -> Result<u64, InvariantViolation> {
        let admitted = self.pending.admit(self.link.window(), id, text);
        self.timeline.judge(admitted)
    }

    /// An event the client handed out.
    pub fn event(&mut self, event: &Event) -> Checked {
        self.timeline.write(b"event");
        self.timeline.write_debug(event);
        if self.complete {
            return self.timeline.fail(
                Invariant::Protocol,
                format!("{event:?} after ShutdownComplete"),
            );
        }
        self.timeline.judge(self.timeline.loud(event))?;
        let now = self.timeline.now();
        self.holds.advance(now);
        match event {
            Event::Outcome { op, outcome } => self.outcome(*op, outcome),
            Event::OrphanRelease { key, token } => {
                let (key, token) = (key.as_str(), *token);
                let held = self.holds.is_held(key, token);
                self.timeline
                    .judge(self.releases.announced(key, token, held))?;
                self.stats.orphan_releases += 1;
                Ok(())
            }
            Event::OrphanSettled { key, token, result } => {
                let session = self.session();
                let settled = self
                    .releases
                    .settled(key.as_str(), *token, *result, now, session);
                self.timeline.judge(settled)
            }
            Event::ShutdownComplete => {
                if self.shutdown.is_none() {
                    return self
                        .timeline
                        .fail(Invariant::Protocol, "ShutdownComplete without a shutdown");
                }
                self.complete = true;
                // The client has stopped and forgets the grants it held for
                // the embedder: lease expiry ends them.
                self.holds.clear();
                Ok(())
            }
            _ => {
                if let Some(told) = self.holds.event(event, now) {
                    let notice = self.timeline.judge(told)?;
                    self.stats.notice(notice);
                    return Ok(());
                }
                if let Event::LeaderHint { .. } | Event::HintIgnored { .. } = event {
                    self.stats.hint_notices += 1;
                }
                let (window, shutting) = (self.timeline.window(), self.shutdown.is_some());
                let cap = self.holds.cap(now);
                match self.link.event(event, window, &cap, shutting) {
                    Some(verdict) => self.timeline.judge(verdict),
                    None => Ok(()),
                }
            }
        }
    }

    /// An outcome, to the part whose operation it ends.
    fn outcome(&mut self, op: OpId, outcome: &Outcome) -> Checked {
        let ended = if self.acquires.has(op) {
            let session = self.session();
            let link = Standing {
                now: self.timeline.now(),
                last_end: self.link.last_end(),
                misconfigured: self.link.misconfigured().is_some(),
                unreachable: self.link.unreachable(),
            };
            self.acquires.end(op, outcome, session, &link)
        } else if self.releases.has(op) {
            self.releases.end(op, outcome)
        } else {
            breach(
                Invariant::OneOutcome,
                format!("{outcome:?} for {op}, which was never submitted"),
            )
        };
        self.timeline.judge(ended)?;
        self.stats.outcome(outcome);
        if let Outcome::Granted(g) = outcome {
            self.holds.delivered(g);
        }
        Ok(())
    }
}
