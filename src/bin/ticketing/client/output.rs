//! The JSON objects `ticketing client` prints, one a line (CLI.md), and
//! the folding of `hint_ignored` lines.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use ticketing::client::{self as core, CloseReason, Event, ReleaseResult};
use ticketing::{Endpoint, Time};

/// The fields of a `timed_out` outcome: `cause`, why its last connection
/// attempt failed, for one that was never sent (CLI.md).
pub(super) fn timed_out(sent: bool, cause: Option<&CloseReason>) -> Value {
    match cause {
        Some(cause) => json!({"outcome": "timed_out", "sent": sent, "cause": cause.to_string()}),
        None => json!({"outcome": "timed_out", "sent": sent}),
    }
}

/// Prints an `error` object, with the tag of the line it drops if any.
pub(super) fn error(tag: Option<&str>, message: impl std::fmt::Display) {
    let message = message.to_string();
    emit(match tag {
        Some(tag) => json!({"type": "error", "tag": tag, "message": message}),
        None => json!({"type": "error", "message": message}),
    });
}

/// The `stats` object (CLI.md; README.md lists its fields).
pub(super) fn stats_line(s: &core::ClientStats) -> Value {
    let histogram = |h: &core::Histogram| {
        json!({
            "count": h.count,
            "sum": h.sum_ms,
            "max": h.max_ms,
            "p50_at_most": h.quantile_bound_ms(0.5),
            "p99_at_most": h.quantile_bound_ms(0.99),
        })
    };
    let releases = |r: &core::ReleaseOutcomes| json!({"released": r.released, "not_held": r.not_held, "lapsed": r.lapsed});
    let (a, i, r, c, b) = (
        &s.acquires,
        &s.indeterminate,
        &s.renewals,
        &s.closes,
        &s.backoffs,
    );
    json!({
        "type": "stats",
        "acquires": {
            "started": s.acquires_started,
            "granted": a.granted,
            "timed_out": a.timed_out,
            "busy": a.busy,
            "cancelled": a.cancelled,
            "indeterminate": a.indeterminate,
        },
        "indeterminate": {"close": i.close, "cancel": i.cancel, "answer_timeout": i.answer_timeout},
        "releases": merge(json!({"started": s.releases_started}), releases(&s.releases)),
        "orphans": merge(json!({"queued": s.orphan_releases}), releases(&s.orphans)),
        "renewals": {
            "sent": r.sent,
            "renewed": r.renewed,
            "lost": r.lost,
            "jeopardy": r.jeopardy,
            "expired": r.expired,
        },
        "connects": s.connects,
        "connected": s.connected,
        "closes": {
            "eof": c.eof, "io": c.io, "connect_failed": c.connect_failed,
            "connect_timeout": c.connect_timeout, "tls": c.tls,
            "handshake_timeout": c.handshake_timeout, "moved": c.moved,
            "no_leader": c.no_leader, "not_active": c.not_active,
            "auth_failed": c.auth_failed, "unsupported_version": c.unsupported_version,
            "server_error": c.server_error, "protocol": c.protocol, "cancel": c.cancel,
            "answer_timeout": c.answer_timeout, "shutdown": c.shutdown,
        },
        "backoffs": {
            "transport": b.transport, "no_leader": b.no_leader, "not_active": b.not_active,
            "auth_failed": b.auth_failed, "unsupported_version": b.unsupported_version,
            "redirect": b.redirect, "busy": b.busy,
        },
        "hints": {"taken": s.hints_taken, "ignored": s.hints_ignored},
        "grant_wait_ms": histogram(&s.grant_wait),
        "lease_left_at_release_ms": histogram(&s.lease_left_at_release),
        "now": {
            "in_flight": s.in_flight,
            "acquires_in_flight": s.acquires_in_flight,
            "acquires_queued": s.acquires_queued,
            "releases_queued": s.releases_queued,
            "renewals_queued": s.renewals_queued,
            "acquires_open": s.acquires_open,
            "releases_open": s.releases_open,
            "held": s.held,
        },
    })
}

/// `hint_ignored` lines, at most one a second per connection (CLI.md): a
/// server that floods hints outside the allowlist makes a line a second,
/// not one a hint. The first of a connection is printed at once; those
/// that come within a second of a line are folded into the next, printed
/// once that second is over (or before the connection's `closed` line, or
/// `done`), with how many it stands for (`count`) and the latest address.
#[derive(Default)]
pub(super) struct IgnoredHints {
    /// When this connection's latest `hint_ignored` line was printed.
    printed: Option<Instant>,
    /// Hints ignored since then, and the latest one's address.
    folded: u64,
    addr: Option<Endpoint>,
}

impl IgnoredHints {
    const EVERY: Duration = Duration::from_secs(1);

    pub(super) fn ignored(&mut self, addr: Endpoint, now: Instant) {
        self.folded += 1;
        self.addr = Some(addr);
        if self.due().is_some_and(|due| due <= now) {
            self.flush(now);
        }
    }

    /// When what is folded is to be printed, if anything is.
    pub(super) fn due(&self) -> Option<Instant> {
        let after = |at: Instant| at + IgnoredHints::EVERY;
        (self.folded > 0).then(|| self.printed.map_or_else(Instant::now, after))
    }

    pub(super) fn flush(&mut self, now: Instant) {
        let Some(addr) = self.addr.take().filter(|_| self.folded > 0) else {
            return;
        };
        emit(json!({
            "type": "event",
            "event": "hint_ignored",
            "addr": addr.as_str(),
            "count": self.folded,
        }));
        self.folded = 0;
        self.printed = Some(now);
    }

    /// The connection ended: what it folded is printed, and the next one
    /// begins afresh.
    pub(super) fn end(&mut self, now: Instant) {
        self.flush(now);
        self.printed = None;
    }
}

pub(super) fn millis_until(at: Time, now: Time) -> u64 {
    u64::try_from(at.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
}

/// Prints a notice.
pub(super) fn notice(event: &Event) {
    let line = match event {
        Event::Connecting { addr } => json!({"event": "connecting", "addr": addr.as_str()}),
        Event::Connected { addr, node, window } => {
            json!({"event": "connected", "addr": addr.as_str(), "node": node.as_str(), "window": window})
        }
        Event::Closed { addr, reason } => {
            json!({"event": "closed", "addr": addr.as_str(), "reason": reason.to_string()})
        }
        Event::LeaderHint { addr } => json!({"event": "leader_hint", "addr": addr.as_str()}),
        Event::OrphanRelease { key, token } => {
            json!({"event": "orphan_release", "key": key.as_str(), "token": token})
        }
        Event::OrphanSettled { key, token, result } => json!({
            "event": "orphan_settled",
            "key": key.as_str(),
            "token": token,
            "result": match result {
                ReleaseResult::Released => "released",
                ReleaseResult::NotHeld => "not_held",
                _ => "lapsed",
            },
        }),
        Event::AuthFailed { addr } => json!({"event": "auth_failed", "addr": addr.as_str()}),
        // Backoff and the end of the shutdown are not part of the
        // interface: the next `connecting`, and `done`, say as much.
        _ => return,
    };
    emit(merge(json!({"type": "event"}), line));
}

pub(super) fn merge(mut base: Value, extra: Value) -> Value {
    if let (Value::Object(base), Value::Object(extra)) = (&mut base, extra) {
        base.extend(extra);
    }
    base
}

/// Writes one line of output and flushes it.
pub(super) fn emit(line: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
