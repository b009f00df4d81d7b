//! The connection, as the checker sees it (PROTOCOL.md sections 2, 3 and
//! 5): one at a time, each newer than the last; the `H` that opens it with
//! the configured id and credential; the `W` that makes it ready; the
//! frames that must close it (`M`, `E`, a second `W`, an answer before
//! `W`, a framing error) and the close that must follow; where and when
//! the client connects ([`Rounds`]) and the leader hint ([`Hints`]).

use super::hints::Hints;
use super::invariant::{breach, Breach, Verdict};
use super::rounds::{LeaseCap, Rounds, Window};
use super::Invariant;
use crate::client::{BackoffCause, CloseReason, Config, ConnId, Event};
use crate::time::Time;
use crate::wire::{LineReader, ServerFrame, VERSION};

/// The checker's model of one connection.
struct Conn {
    id: ConnId,
    /// Not yet closed by the client.
    alive: bool,
    /// `H` went out: the client reads what arrives.
    hello: bool,
    /// The window, once the client has read `W`.
    window: Option<u64>,
    reader: LineReader,
    /// A frame that must close the connection was read: the rule it falls
    /// under and why.
    closing: Option<Breach>,
    /// The driver reported that the connect failed.
    connect_failed: bool,
}

pub(super) struct Link {
    /// What every `H` must carry.
    client_id: String,
    credential: String,
    /// The connection opened last.
    conn: Option<Conn>,
    /// Where and when the client connects.
    rounds: Rounds,
    hints: Hints,
}

impl Link {
    pub(super) fn new(config: &Config) -> Link {
        Link {
            client_id: config.client_id.as_str().to_owned(),
            credential: config
                .credential
                .as_ref()
                .map_or_else(|| "-".to_owned(), |c| c.as_str().to_owned()),
            conn: None,
            rounds: Rounds::new(config),
            hints: Hints::new(config),
        }
    }

    /// Why every server refuses the client, if they do.
    pub(super) fn misconfigured(&self) -> Option<&CloseReason> {
        self.rounds.misconfigured()
    }

    /// How the latest attempt to connect ended.
    pub(super) fn last_end(&self) -> Option<&CloseReason> {
        self.rounds.last_end()
    }

    /// Whether the last round failed at every address, with no `W` since.
    pub(super) fn unreachable(&self) -> bool {
        self.rounds.unreachable()
    }

    /// Whether the connection opened last is not closed yet.
    pub(super) fn alive(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| c.alive)
    }

    /// Whether the client may send on `conn`: open, and no frame read
    /// that must close it.
    pub(super) fn can_send(&self, conn: ConnId) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|c| c.id == conn && c.alive && c.closing.is_none())
    }

    /// The window of the connection opened last, once `H` went out and
    /// `W` was read: requests may be sent.
    pub(super) fn window(&self) -> Option<u64> {
        self.conn
            .as_ref()
            .filter(|c| c.hello)
            .and_then(|c| c.window)
    }

    /// The connection open to requests, its window, once the step is
    /// drained: alive, connected, ready, and no frame read that must close
    /// it.
    pub(super) fn open_window(&self) -> Option<(ConnId, u64)> {
        let c = self.conn.as_ref()?;
        let window = c.window?;
        (c.alive && !c.connect_failed && c.closing.is_none()).then_some((c.id, window))
    }

    /// `Connect` of `conn`: one connection at a time, each newer than the
    /// last.
    pub(super) fn connect(&mut self, conn: ConnId) -> Verdict {
        if let Some(c) = &self.conn {
            if c.alive && !c.connect_failed {
                return breach(
                    Invariant::Protocol,
                    format!("{conn} opened while {} was still open", c.id),
                );
            }
            if conn.get() <= c.id.get() {
                return breach(
                    Invariant::Protocol,
                    format!("{conn} is not newer than {}", c.id),
                );
            }
        }
        self.conn = Some(Conn {
            id: conn,
            alive: true,
            hello: false,
            window: None,
            reader: LineReader::new(),
            closing: None,
            connect_failed: false,
        });
        Ok(())
    }

    /// `handle_connected(conn)` at `now`.
    pub(super) fn connected(&mut self, conn: ConnId, now: Time, cap: &impl LeaseCap) {
        if self.conn.as_ref().is_some_and(|c| c.id == conn && c.alive) {
            self.rounds.connected(now, cap);
        }
    }

    /// `handle_connect_failed(conn)`.
    pub(super) fn connect_failed(&mut self, conn: ConnId) {
        if let Some(c) = &mut self.conn {
            if c.id == conn && c.alive && !c.hello {
                // A failed connect closes without a Close action, unless a
                // timer closed it first (with one): settled at the end of
                // the step.
                c.connect_failed = true;
            }
        }
    }

    /// The reader of `conn`, if the client reads what arrives on it: open,
    /// `H` sent, and no frame read that must close it. Given back with
    /// [`Link::put_reader`].
    pub(super) fn reader(&mut self, conn: ConnId) -> Option<LineReader> {
        let c = self.conn.as_mut()?;
        if c.id != conn || !c.alive || !c.hello || c.closing.is_some() {
            // Not a connection the client reads from: it ignores the bytes.
            return None;
        }
        Some(core::mem::take(&mut c.reader))
    }

    pub(super) fn put_reader(&mut self, reader: LineReader) {
        if let Some(c) = self.conn.as_mut() {
            c.reader = reader;
        }
    }

    /// A frame was read that must close the connection, for `why`.
    pub(super) fn must_close(&mut self, why: Breach) {
        if let Some(c) = self.conn.as_mut() {
            c.closing = Some(why);
        }
    }

    /// The id of the connection opened last.
    pub(super) fn id(&self) -> Option<ConnId> {
        self.conn.as_ref().map(|c| c.id)
    }

    /// A frame other than an answer, read on the connection: `Some` if it
    /// must close.
    pub(super) fn notice(&mut self, frame: ServerFrame<'_>) -> Option<Breach> {
        let c = self.conn.as_mut().expect("reading a live connection");
        match frame {
            ServerFrame::Welcome { window, .. } => {
                if c.window.is_some() {
                    return Some(Breach::new(Invariant::Protocol, "a second W"));
                }
                c.window = Some(window.get());
                None
            }
            ServerFrame::Leader { addr } => {
                self.hints.take(addr.as_str());
                None
            }
            ServerFrame::Moved { addr } => {
                self.hints.take(addr.as_str());
                Some(Breach::new(Invariant::Protocol, "M"))
            }
            ServerFrame::Error { reason } => {
                Some(Breach::new(Invariant::Protocol, format!("E {reason}")))
            }
            ServerFrame::Answer(_) => unreachable!("answers are the pending requests'"),
        }
    }

    /// An `H` went out (`text`): the first, with the protocol's version,
    /// the configured id and credential.
    pub(super) fn hello(
        &mut self,
        version: u64,
        client_id: &str,
        credential: &str,
        text: &str,
    ) -> Verdict {
        let c = self.conn.as_mut().expect("checked live");
        if c.hello {
            return breach(Invariant::Protocol, format!("a second H: {text}"));
        }
        c.hello = true;
        if version != VERSION
            || version != 2
            || client_id != self.client_id
            || credential != self.credential
        {
            return breach(
                Invariant::Protocol,
                format!("{text} does not carry the configured id and credential"),
            );
        }
        Ok(())
    }

    /// `Close` of `conn`, in a step that handed the client bytes or not
    /// (`read_bytes`), while shutting down or not: of the connection open,
    /// and only if what was read called for it (or shutting down).
    pub(super) fn close(&mut self, conn: ConnId, read_bytes: bool, shutting: bool) -> Verdict {
        let Some(c) = self.conn.as_mut().filter(|c| c.id == conn && c.alive) else {
            return breach(
                Invariant::Protocol,
                format!("Close of {conn}, which is not open"),
            );
        };
        if read_bytes && c.closing.is_none() && !shutting {
            return breach(
                Invariant::Protocol,
                format!("{conn} closed while reading frames that required no close"),
            );
        }
        c.alive = false;
        Ok(())
    }

    /// At the end of a step: a failed connect has closed the connection.
    pub(super) fn settle_connect_failed(&mut self) {
        if let Some(c) = &mut self.conn {
            if c.connect_failed {
                c.alive = false;
            }
        }
    }

    /// At the end of a step: a connection that ended was followed by what
    /// the rounds call for, in the step.
    pub(super) fn end_step(&mut self) -> Verdict {
        if let Some(owed) = self.rounds.owed() {
            return breach(
                Invariant::Protocol,
                format!("a connection ended, and the step did not end with {owed}"),
            );
        }
        self.rounds.end_step();
        Ok(())
    }

    /// At the end of a step: the connection is closed if a frame read on
    /// it called for that.
    pub(super) fn closed_when_due(&self) -> Verdict {
        if let Some(c) = &self.conn {
            if c.alive {
                if let Some(why) = &c.closing {
                    return breach(
                        why.invariant,
                        format!("{} stayed open after {}", c.id, why.detail),
                    );
                }
            }
        }
        Ok(())
    }

    /// At the end of a step: every hint notice owed was told.
    pub(super) fn hints_told(&self) -> Verdict {
        self.hints.all_told()
    }

    /// A notice about the connection or the hint, told with `window` the
    /// step's, the grants' `cap` on waits, while shutting down or not.
    /// `None` for the other events.
    pub(super) fn event(
        &mut self,
        event: &Event,
        window: Window,
        cap: &impl LeaseCap,
        shutting: bool,
    ) -> Option<Verdict> {
        let verdict = match event {
            Event::LeaderHint { addr } | Event::HintIgnored { addr } => {
                self.hints.told(event, addr.as_str())
            }
            Event::Connecting { addr } => self.connecting(addr.as_str(), window, cap, shutting),
            Event::Connected { .. } => {
                self.hints.welcomed();
                self.rounds.welcomed();
                Ok(())
            }
            Event::Backoff { cause, until } if *cause != BackoffCause::Busy => {
                self.rounds.backoff(*cause, *until).map_err(protocol)
            }
            Event::Misconfigured { cause } => {
                self.rounds.misconfigured_notice(cause).map_err(protocol)
            }
            Event::Closed { addr, reason } => {
                self.closed(addr.as_str(), reason, window, cap, shutting)
            }
            _ => return None,
        };
        Some(verdict)
    }

    fn connecting(
        &mut self,
        addr: &str,
        window: Window,
        cap: &impl LeaseCap,
        shutting: bool,
    ) -> Verdict {
        self.rounds
            .connecting(addr, self.hints.hint(), window, cap, shutting)
            .map_err(protocol)?;
        self.hints.connecting(addr);
        Ok(())
    }

    fn closed(
        &mut self,
        addr: &str,
        reason: &CloseReason,
        window: Window,
        cap: &impl LeaseCap,
        shutting: bool,
    ) -> Verdict {
        let welcomed = self.hints.closed(addr, reason)?;
        let hint = self.hints.hint();
        self.rounds
            .closed(addr, reason, welcomed, hint, window, cap, shutting)
            .map_err(protocol)
    }
}

/// What the rounds find wrong breaks a rule of the protocol.
fn protocol(why: String) -> Breach {
    Breach::new(Invariant::Protocol, why)
}
