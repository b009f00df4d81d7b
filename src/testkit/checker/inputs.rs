//! The driver's inputs: time passing, the connection's fate, and the bytes
//! read, which the checker reads the way the client must: each frame to
//! the link, each answer claimed by the request it answers or a stray.

use core::time::Duration;

use super::acquires::Matched;
use super::invariant::Breach;
use super::pending::{Asked, Request};
use super::{Checked, Checker, Invariant, InvariantViolation};
use crate::client::ConnId;
use crate::time::Time;
use crate::wire::{Answer, AnswerKind, ServerFrame};

impl Checker {
    /// `handle_connected(now, conn)` was called.
    pub fn connected(&mut self, now: Time, conn: ConnId) {
        self.timeline.tick(now, "connected");
        self.timeline.write_u64(conn.get());
        let at = self.timeline.now();
        self.link.connected(conn, at, &self.holds.cap(at));
    }

    /// `handle_connect_failed(now, conn)` was called.
    pub fn connect_failed(&mut self, now: Time, conn: ConnId) {
        self.timeline.tick(now, "connect_failed");
        self.timeline.write_u64(conn.get());
        self.link.connect_failed(conn);
    }

    /// `handle_transport_closed(now, conn, _)` was called.
    pub fn transport_closed(&mut self, now: Time, conn: ConnId) {
        self.timeline.tick(now, "transport_closed");
        self.timeline.write_u64(conn.get());
    }

    /// `handle_timeout(now)` was called.
    pub fn timeout(&mut self, now: Time) {
        self.timeline.tick(now, "timeout");
    }

    /// `handle_bytes(now, conn, data)` was called. Reads the frames the way
    /// the client must and predicts what it does with each: which answers
    /// it matches, which grants it must release by itself, and at which
    /// frame it must close.
    pub fn bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) -> Checked {
        self.timeline.tick(now, "bytes");
        self.timeline.write_u64(conn.get());
        self.timeline.write(data);
        self.timeline.bytes_read();
        self.holds.advance(now);
        let Some(mut reader) = self.link.reader(conn) else {
            return Ok(());
        };
        let mut input = data;
        let mut result = Ok(());
        while let Some(line) = reader.next_line(&mut input) {
            let closing = match line {
                Err(e) => Some(Breach::new(
                    Invariant::Protocol,
                    format!("framing error: {e}"),
                )),
                Ok(line) => match ServerFrame::parse(line) {
                    Err(e) => Some(Breach::new(
                        Invariant::Protocol,
                        format!("framing error in {:?}: {e}", String::from_utf8_lossy(line)),
                    )),
                    Ok(frame) => match self.frame(frame) {
                        Ok(closing) => closing,
                        Err(v) => {
                            result = Err(v);
                            None
                        }
                    },
                },
            };
            if result.is_err() {
                break;
            }
            if let Some(closing) = closing {
                self.link.must_close(closing);
                break;
            }
        }
        self.link.put_reader(reader);
        result
    }

    /// One frame read by the client: `Some` if it must close.
    fn frame(&mut self, frame: ServerFrame<'_>) -> Result<Option<Breach>, InvariantViolation> {
        match frame {
            ServerFrame::Answer(answer) => self.answer(answer),
            frame => {
                if let ServerFrame::Leader { .. } = frame {
                    self.stats.hints_read += 1;
                }
                Ok(self.link.notice(frame))
            }
        }
    }

    /// An answer read: claimed by the request it answers, or a stray.
    fn answer(&mut self, a: Answer<'_>) -> Result<Option<Breach>, InvariantViolation> {
        let text = ServerFrame::Answer(a).to_string();
        let conn = self.link.id().expect("reading a live connection");
        if self.link.window().is_none() {
            self.stray(a);
            return Ok(Some(Breach::new(
                Invariant::Protocol,
                format!("answer before W: {text}"),
            )));
        }
        let (acquires, holds) = (&self.acquires, &self.holds);
        let claimed = self
            .pending
            .claim(&a, &text, conn, |request| match request {
                Request::Acquire { op, lease_ms, .. } => Asked {
                    lease_ms: *lease_ms,
                    wait_ms: acquires.wire_wait_ms(*op),
                },
                Request::Release { .. } => Asked {
                    lease_ms: u64::MAX,
                    wait_ms: u64::MAX,
                },
                // The lease is held to what was asked only while the grant is
                // held: a renewal of a grant given up meanwhile is claimed, and
                // its answer changes nothing.
                Request::Renew { lease_ms, .. } => Asked {
                    lease_ms: if holds.renewing(a.id) {
                        *lease_ms
                    } else {
                        u64::MAX
                    },
                    wait_ms: u64::MAX,
                },
            });
        match claimed {
            Ok(request) => {
                self.stats.matched += 1;
                self.matched(request, a);
                Ok(None)
            }
            Err(why) => {
                self.stray(a);
                Ok(Some(why))
            }
        }
    }

    /// An answer matched by id, op and key, to the part that sent it.
    fn matched(&mut self, request: Request, a: Answer<'_>) {
        let now = self.timeline.now();
        match request {
            Request::Acquire { op, key, .. } => match self.acquires.matched(op, key, a.kind, now) {
                Matched::Nothing => {}
                Matched::Orphan {
                    key,
                    token,
                    lease_end,
                } => {
                    if !self.knows(&key, token) {
                        self.releases.orphan(key, token, lease_end);
                    }
                }
                Matched::Held(grant) => self.holds.hold(grant, now),
            },
            Request::Release { key, token } => {
                let released = matches!(a.kind, AnswerKind::Released);
                self.releases.answered(key, token, released);
            }
            Request::Renew { .. } => self.holds.renewal_answer(a.id, a.kind, now),
        }
    }

    /// An answer nobody claims: a `G` for a grant that is neither held nor
    /// being released must be released by its exact token.
    fn stray(&mut self, a: Answer<'_>) {
        self.stats.strays += 1;
        if let AnswerKind::Granted {
            token, lease_ms, ..
        }
        | AnswerKind::Renewed { token, lease_ms } = a.kind
        {
            let key = a.key.as_str();
            if self.knows(key, token) {
                return;
            }
            let lease_end = self
                .timeline
                .now()
                .saturating_add(Duration::from_millis(lease_ms.get()));
            self.releases.orphan(key.to_owned(), token, lease_end);
        }
    }
}
