//! The leader hint (PROTOCOL.md section 5, `L addr`, `M addr`, "stale
//! hints", "forgetting the hint"): the checker keeps the leader hint and
//! the address refused last, as the client must, and expects exactly the
//! notices that change something for the embedder: a flood of `L` lines
//! naming the same addresses gives a bounded number of notices.

use std::collections::VecDeque;

use super::invariant::{breach, Verdict};
use super::Invariant;
use crate::client::{CloseReason, Config, Event};

/// The connection as the notices tell of it: for the hint rules.
struct NoticeConn {
    addr: String,
    to_hint: bool,
    welcomed: bool,
}

pub(super) struct Hints {
    /// Endpoints and the extra allowlist.
    allowlist: Vec<String>,
    /// The leader hint, as the client must have it.
    hint: Option<String>,
    /// The address refused last on the current connection.
    ignored: Option<String>,
    /// Hint notices owed, in order: `(taken, addr)`.
    owed: VecDeque<(bool, String)>,
    notice_conn: Option<NoticeConn>,
}

impl Hints {
    pub(super) fn new(config: &Config) -> Hints {
        Hints {
            allowlist: config
                .endpoints
                .iter()
                .chain(&config.allow)
                .map(|e| e.as_str().to_owned())
                .collect(),
            hint: None,
            ignored: None,
            owed: VecDeque::new(),
            notice_conn: None,
        }
    }

    /// The leader hint, as the client must have it.
    pub(super) fn hint(&self) -> Option<&str> {
        self.hint.as_deref()
    }

    /// A hint (`L` or `M`) read: taken if allowlisted. Only what changes
    /// something is told: a hint that is not the hint already, an address
    /// refused that was not the one refused last on this connection.
    pub(super) fn take(&mut self, addr: &str) {
        if self.allowlist.iter().any(|a| a == addr) {
            if self.hint.as_deref() != Some(addr) {
                self.hint = Some(addr.to_owned());
                self.owed.push_back((true, addr.to_owned()));
            }
        } else if self.ignored.as_deref() != Some(addr) {
            self.ignored = Some(addr.to_owned());
            self.owed.push_back((false, addr.to_owned()));
        }
    }

    /// `LeaderHint` or `HintIgnored` (`event`, with `addr`): the next
    /// notice the hints read call for.
    pub(super) fn told(&mut self, event: &Event, addr: &str) -> Verdict {
        let taken = matches!(event, Event::LeaderHint { .. });
        match self.owed.pop_front() {
            Some((t, a)) if t == taken && a == addr => Ok(()),
            owed => breach(
                Invariant::Protocol,
                format!(
                    "{event:?}: the hints read call for {owed:?} (hint {:?}, refused last {:?})",
                    self.hint, self.ignored
                ),
            ),
        }
    }

    /// At the end of a step: every notice the hints read call for was told.
    pub(super) fn all_told(&self) -> Verdict {
        match self.owed.front() {
            Some(owed) => breach(
                Invariant::Protocol,
                format!("the hints read call for a notice {owed:?} that was not told"),
            ),
            None => Ok(()),
        }
    }

    /// `Connecting` to `addr`, accepted by the rounds.
    pub(super) fn connecting(&mut self, addr: &str) {
        self.notice_conn = Some(NoticeConn {
            addr: addr.to_owned(),
            to_hint: self.hint.as_deref() == Some(addr),
            welcomed: false,
        });
    }

    /// `Connected`: the connection had its `W`.
    pub(super) fn welcomed(&mut self) {
        if let Some(n) = &mut self.notice_conn {
            n.welcomed = true;
        }
    }

    /// `Closed` for `addr` with `reason`: whether the connection had its
    /// `W`. The hint is forgotten after `E no_leader`, and after a
    /// connection to it that ended without `W` for any reason but an `M`
    /// to another allowlisted address, or that ended in `M` or
    /// `E not_active` after it.
    pub(super) fn closed(&mut self, addr: &str, reason: &CloseReason) -> Verdict<bool> {
        let mut welcomed = false;
        if let Some(n) = self.notice_conn.take() {
            let still = n.to_hint && self.hint.as_deref() == Some(n.addr.as_str());
            let failed = still
                && (!n.welcomed || matches!(reason, CloseReason::Moved | CloseReason::NotActive));
            if failed || *reason == CloseReason::NoLeader {
                self.hint = None;
            }
            if n.addr != addr {
                return breach(
                    Invariant::Protocol,
                    format!("Closed for {addr}, but the connection was to {}", n.addr),
                );
            }
            welcomed = n.welcomed;
        } else if *reason == CloseReason::NoLeader {
            self.hint = None;
        }
        self.ignored = None;
        Ok(welcomed)
    }
}
