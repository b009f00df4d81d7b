//! The checker's model of where and when the client connects (PROTOCOL.md
//! section 5, "Connecting and backing off"): rounds over the addresses,
//! stale hints, the wait between rounds and its cap by a held lease, the
//! connect and handshake timeouts, and the misconfigured client.
//!
//! It is written from the protocol's text, apart from the client's code,
//! and fed only what the checker sees: `Connecting`, `Connected`, `Closed`,
//! `Backoff` and `Misconfigured` notices, the driver's inputs, and the
//! times of the steps. Timers can fire late (a driver may call in long
//! after a deadline), so every time the model derives is checked against
//! the window of the step it happened in: after the previous input, and
//! at the latest at this one.

use core::time::Duration;

use crate::client::{Backoff, BackoffCause, CloseReason, Config};
use crate::time::Time;

/// The least a held lease shortens a wait to.
const LEASE_CAP_FLOOR: Duration = Duration::from_millis(100);

/// The times at which something in a step may have happened: timers due
/// since the previous input fire at their own times, before the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    pub(super) lo: Time,
    pub(super) hi: Time,
}

impl Window {
    pub(super) fn at(t: Time) -> Window {
        Window { lo: t, hi: t }
    }

    /// When a wait of `wait` (capped by a held lease) that started in
    /// this window ends. In a window that is the instant the checker's
    /// grants are known at, the cap is exact; otherwise a grant may have
    /// expired in between, and only what holds for every cap is known: at
    /// least `min(wait, 100 ms)`, at most `wait`.
    fn after(self, wait: Duration, cap: &impl LeaseCap) -> Window {
        if self.lo == self.hi && self.lo == cap.as_of() {
            let wait = capped(wait, cap, self.lo);
            return Window::at(self.lo.saturating_add(wait));
        }
        Window {
            lo: self.lo.saturating_add(wait.min(LEASE_CAP_FLOOR)),
            hi: self.hi.saturating_add(wait),
        }
    }

    fn overlaps(self, other: Window) -> bool {
        self.lo <= other.hi && other.lo <= self.hi
    }

    /// The part of this window that lies in `other` too.
    fn within(self, other: Window) -> Window {
        Window {
            lo: self.lo.max(other.lo),
            hi: self.hi.min(other.hi),
        }
    }
}

/// The cap a held lease puts on every wait of the link, at a given time
/// (`None`: no such grant).
pub(super) trait LeaseCap {
    fn cap(&self, at: Time) -> Option<Duration>;
    /// The moment the grants behind the cap are known at.
    fn as_of(&self) -> Time;
}

/// Where a round's turn over the configured endpoints is: the endpoint it
/// takes next, and how many it has left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Turn {
    next: usize,
    left: usize,
}

/// What must follow a close in the same step.
#[derive(Debug, Clone, PartialEq)]
enum Next {
    /// Nothing yet: no close, or what followed it came.
    Settled,
    /// The round's next attempt, at once.
    AtOnce { required: bool },
    /// A backoff for `cause`, ending within `until`; then, if the round
    /// was refused by every address, the notice that says so.
    Wait {
        cause: BackoffCause,
        until: Window,
        misconfigures: Option<CloseReason>,
        required: bool,
    },
    /// The `Misconfigured` notice, after the backoff.
    Misconfigured(CloseReason),
    /// Whether the hint is stale cannot be told from the window: the round
    /// goes on at once with it, or it has failed and the wait is as for
    /// `Wait` (with the count of failed rounds one higher).
    Either {
        cause: BackoffCause,
        until: Window,
        misconfigures: Option<CloseReason>,
    },
}

/// The model. See the module documentation.
pub(super) struct Rounds {
    endpoints: Vec<String>,
    stale_hint: Duration,
    connect_timeout: Duration,
    handshake_timeout: Duration,
    backoff: crate::client::Backoffs,
    /// The round in progress: the addresses it tried.
    tried: Vec<String>,
    /// Where the round's turn over the endpoints may be. More than one
    /// when the client went to an address that was both the hint and the
    /// next endpoint in turn, at a moment when the model cannot tell
    /// whether the hint was stale: as the hint, the turn stayed; in turn,
    /// it moved on.
    turns: Vec<Turn>,
    attempts: u32,
    moved: u32,
    refused: u32,
    refusal: Option<CloseReason>,
    other: Option<BackoffCause>,
    failed_rounds: u32,
    /// Addresses whose latest connection ended by a transport failure, and
    /// when.
    failed_at: Vec<(String, Window)>,
    misconfigured: Option<CloseReason>,
    last_end: Option<CloseReason>,
    /// A round failed at every address since the last `W`: the client is
    /// unreachable.
    round_failed: bool,
    next: Next,
    /// The next round starts then: a backoff was told.
    waiting: Option<Time>,
    /// When the latest close happened: what follows it at once happened
    /// then too.
    closed_at: Window,
    /// When the current attempt's connect must time out, and once
    /// `handle_connected` came for it (the client may have timed out the
    /// connect just before), its handshake.
    connect_deadline: Option<Window>,
    handshake_deadline: Option<Window>,
}

impl Rounds {
    pub(super) fn new(config: &Config) -> Rounds {
        Rounds {
            endpoints: config
                .endpoints
                .iter()
                .map(|e| e.as_str().to_owned())
                .collect(),
            stale_hint: config.stale_hint,
            connect_timeout: config.connect_timeout,
            handshake_timeout: config.handshake_timeout,
            backoff: config.backoff,
            tried: Vec::new(),
            turns: vec![Turn {
                next: 0,
                left: config.endpoints.len(),
            }],
            attempts: 0,
            moved: 0,
            refused: 0,
            refusal: None,
            other: None,
            failed_rounds: 0,
            failed_at: Vec::new(),
            misconfigured: None,
            last_end: None,
            round_failed: false,
            next: Next::Settled,
            waiting: None,
            closed_at: Window::at(Time::ZERO),
            connect_deadline: None,
            handshake_deadline: None,
        }
    }

    /// Why every server refused the client, while it is misconfigured.
    pub(super) fn misconfigured(&self) -> Option<&CloseReason> {
        self.misconfigured.as_ref()
    }

    /// Whether the client is unreachable: the last round of attempts
    /// failed at every address, and no `W` came since.
    pub(super) fn unreachable(&self) -> bool {
        self.round_failed
    }

    /// How the latest connection attempt ended, since the last `W`: the
    /// cause an acquire that could not be sent must carry.
    pub(super) fn last_end(&self) -> Option<&CloseReason> {
        self.last_end.as_ref()
    }

    fn new_round(&mut self) {
        self.tried.clear();
        let n = self.endpoints.len();
        for turn in &mut self.turns {
            turn.left = n;
        }
        self.turns.sort();
        self.turns.dedup();
        self.attempts = 0;
        self.moved = 0;
        self.refused = 0;
        self.refusal = None;
        self.other = None;
    }

    /// Whether `addr` may be stale at a time in `at`, and whether it
    /// certainly is.
    fn staleness(&self, addr: &str, at: Window) -> (bool, bool) {
        let Some((_, failed)) = self.failed_at.iter().find(|(a, _)| a == addr) else {
            return (false, false);
        };
        let maybe = at.lo < failed.hi.saturating_add(self.stale_hint);
        let surely = at.hi < failed.lo.saturating_add(self.stale_hint);
        (maybe, surely)
    }

    /// The endpoint `turn` gives next, skipping those tried, and how many
    /// it skips.
    fn next_in_turn(&self, turn: Turn) -> Option<(usize, &str)> {
        let n = self.endpoints.len();
        (0..turn.left)
            .map(|i| (i, self.endpoints[(turn.next + i) % n].as_str()))
            .find(|(_, addr)| !self.tried.iter().any(|t| t == addr))
    }

    /// The hint, if this round may try it: `Some(true)` if it must,
    /// `Some(false)` if it may (staleness cannot be told in the window).
    fn hint_due(&self, hint: Option<&str>, at: Window) -> Option<(bool, String)> {
        let hint = hint?;
        if self.tried.iter().any(|t| t == hint) {
            return None;
        }
        match self.staleness(hint, at) {
            (_, true) => None,
            (maybe, false) => Some((!maybe, hint.to_owned())),
        }
    }

    /// Whether the round has an address left at a time in `at`: `None`
    /// when that cannot be told.
    fn has_next(&self, hint: Option<&str>, at: Window) -> Option<bool> {
        let hint = self.hint_due(hint, at);
        let mut answers = self
            .turns
            .iter()
            .map(|&turn| match (&hint, self.next_in_turn(turn)) {
                (_, Some(_)) | (Some((true, _)), None) => Some(true),
                (Some((false, _)), None) => None,
                (None, None) => Some(false),
            });
        let first = answers.next().flatten();
        match answers.all(|a| a == first) {
            true => first,
            false => None,
        }
    }

    /// A `Connecting` notice for `addr`, in the window `at`, with the leader
    /// hint as the checker holds it.
    pub(super) fn connecting(
        &mut self,
        addr: &str,
        hint: Option<&str>,
        at: Window,
        cap: &impl LeaseCap,
        shutting: bool,
    ) -> Result<(), String> {
        let mut at = at;
        match std::mem::replace(&mut self.next, Next::Settled) {
            Next::AtOnce { .. } | Next::Either { .. } => at = self.closed_at,
            Next::Settled => {
                if let Some(until) = self.waiting.take() {
                    if at.hi < until {
                        return Err(format!(
                            "connecting to {addr} before the wait that ends at {until}"
                        ));
                    }
                    // The timer fires at its own time, however late the
                    // driver.
                    at = Window::at(until);
                    self.new_round();
                } else if self.connect_deadline.is_none() && self.tried.is_empty() {
                    // The first round.
                } else if !shutting {
                    return Err(format!(
                        "connecting to {addr} with nothing that calls for it"
                    ));
                } else if self.has_next(hint, at) == Some(false) {
                    // Down for good while shutting down, until a release
                    // calls for a connection: a new round if this one is
                    // done.
                    self.new_round();
                }
            }
            Next::Wait { cause, .. } => {
                return Err(format!(
                    "connecting to {addr} at once, where the round called for a {cause:?} backoff"
                ))
            }
            Next::Misconfigured(cause) => {
                return Err(format!(
                    "connecting to {addr} before telling the round refused the client ({cause})"
                ))
            }
        }
        let hint_due = self.hint_due(hint, at);
        let n = self.endpoints.len();
        let mut turns = Vec::new();
        for &turn in &self.turns {
            match &hint_due {
                Some((_, h)) if h == addr => turns.push(turn),
                // The hint, neither stale nor tried: nothing else may go.
                Some((true, _)) => continue,
                _ => {}
            }
            if matches!(&hint_due, Some((true, _))) {
                continue;
            }
            if let Some((skipped, a)) = self.next_in_turn(turn) {
                if a == addr {
                    turns.push(Turn {
                        next: (turn.next + skipped + 1) % n,
                        left: turn.left - skipped - 1,
                    });
                }
            }
        }
        if turns.is_empty() {
            let in_turn: Vec<&str> = self
                .turns
                .iter()
                .filter_map(|&turn| self.next_in_turn(turn).map(|(_, a)| a))
                .collect();
            return Err(format!(
                "connecting to {addr}: the round calls for {in_turn:?} (hint {hint:?}, due {hint_due:?}, tried {:?})",
                self.tried
            ));
        }
        turns.sort();
        turns.dedup();
        self.turns = turns;
        self.tried.push(addr.to_owned());
        self.connect_deadline = Some(at.after(self.connect_timeout, cap));
        self.handshake_deadline = None;
        Ok(())
    }

    /// `handle_connected` was called at `now` for the current attempt.
    pub(super) fn connected(&mut self, now: Time, cap: &impl LeaseCap) {
        if self.connect_deadline.is_some() && self.handshake_deadline.is_none() {
            self.handshake_deadline = Some(Window::at(now).after(self.handshake_timeout, cap));
        }
    }

    /// `W`: the round succeeded.
    pub(super) fn welcomed(&mut self) {
        self.failed_rounds = 0;
        self.round_failed = false;
        self.misconfigured = None;
        self.last_end = None;
        self.connect_deadline = None;
        self.handshake_deadline = None;
    }

    /// A `Closed` notice for `addr` in the window `at`: how the
    /// connection ended, and whether it had its `W`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn closed(
        &mut self,
        addr: &str,
        reason: &CloseReason,
        welcomed: bool,
        hint: Option<&str>,
        at: Window,
        cap: &impl LeaseCap,
        shutting: bool,
    ) -> Result<(), String> {
        if let Some(next) = self.owed() {
            return Err(format!(
                "{addr} closed while the last close still owes {next}"
            ));
        }
        let deadline = match reason {
            CloseReason::ConnectTimeout => Some(self.connect_deadline),
            CloseReason::HandshakeTimeout => Some(self.handshake_deadline),
            _ => None,
        };
        let mut at = at;
        if let Some(deadline) = deadline {
            match deadline {
                Some(d) if d.overlaps(at) => at = at.within(d),
                _ => {
                    return Err(format!(
                    "{reason} at {}..{}, but the attempt was due to time out within {deadline:?}",
                    at.lo, at.hi
                ))
                }
            }
        }
        self.closed_at = at;
        self.connect_deadline = None;
        self.handshake_deadline = None;
        self.failed_at.retain(|(a, _)| a != addr);
        if is_transport_failure(reason) {
            self.failed_at.push((addr.to_owned(), at));
        }
        if matches!(reason, CloseReason::Cancel | CloseReason::Shutdown) {
            self.new_round();
            self.next = Next::AtOnce { required: false };
            return Ok(());
        }
        self.last_end = Some(reason.clone());
        if welcomed {
            self.new_round();
            self.failed_rounds = 1;
            let cause = backoff_cause(reason);
            self.next = self.wait(cause, at, cap, None, !shutting);
            return Ok(());
        }
        self.attempts += 1;
        match reason {
            CloseReason::Moved => self.moved += 1,
            CloseReason::AuthFailed | CloseReason::UnsupportedVersion => {
                self.refused += 1;
                self.refusal = Some(reason.clone());
            }
            other => self.other = Some(backoff_cause(other)),
        }
        let all_refused = self.refused == self.attempts;
        let (cause, misconfigures) = match &self.refusal {
            Some(refusal) if all_refused => (backoff_cause(refusal), Some(refusal.clone())),
            _ if self.moved == self.attempts => (BackoffCause::Redirect, None),
            _ => (self.other.unwrap_or(BackoffCause::Redirect), None),
        };
        match self.has_next(hint, at) {
            Some(true) => {
                self.next = Next::AtOnce {
                    required: !shutting,
                };
            }
            Some(false) => {
                self.failed_rounds = self.failed_rounds.saturating_add(1);
                self.round_failed = true;
                self.new_round();
                self.next = self.wait(cause, at, cap, misconfigures, !shutting);
            }
            None => {
                // Whether the hint is stale cannot be told: the round may go
                // on with it, or have failed.
                self.failed_rounds = self.failed_rounds.saturating_add(1);
                let Next::Wait { until, .. } = self.wait(cause, at, cap, None, false) else {
                    unreachable!("a wait");
                };
                self.failed_rounds -= 1;
                self.next = Next::Either {
                    cause,
                    until,
                    misconfigures,
                };
            }
        }
        Ok(())
    }

    /// What a wait for `cause` after `failed_rounds` failed rounds may
    /// end at, started in `at`.
    fn wait(
        &self,
        cause: BackoffCause,
        at: Window,
        cap: &impl LeaseCap,
        misconfigures: Option<CloseReason>,
        required: bool,
    ) -> Next {
        let b = round_backoff(&self.backoff, cause);
        let d = b.step(self.failed_rounds.saturating_sub(1));
        // The jitter draws from [d/2, d], then the cap applies.
        let until = Window {
            lo: at.after(d / 2, cap).lo,
            hi: at.after(d, cap).hi,
        };
        Next::Wait {
            cause,
            until,
            misconfigures,
            required,
        }
    }

    /// A `Backoff` notice for a round (not for a `B`).
    pub(super) fn backoff(&mut self, cause: BackoffCause, until: Time) -> Result<(), String> {
        if let Next::Either {
            cause,
            until,
            misconfigures,
        } = &self.next
        {
            // The hint was stale after all: the round failed.
            self.next = Next::Wait {
                cause: *cause,
                until: *until,
                misconfigures: misconfigures.clone(),
                required: true,
            };
            self.failed_rounds = self.failed_rounds.saturating_add(1);
            self.round_failed = true;
            self.new_round();
        }
        match std::mem::replace(&mut self.next, Next::Settled) {
            Next::Wait {
                cause: want,
                until: range,
                misconfigures,
                ..
            } => {
                if want != cause {
                    return Err(format!(
                        "a {cause:?} backoff where the round calls for {want:?}"
                    ));
                }
                if until < range.lo || until > range.hi {
                    return Err(format!(
                        "a {cause:?} backoff until {until}, outside {}..={} (failed rounds in a row: {})",
                        range.lo, range.hi, self.failed_rounds
                    ));
                }
                self.waiting = Some(until);
                if let Some(refusal) = misconfigures {
                    self.misconfigured = Some(refusal.clone());
                    self.next = Next::Misconfigured(refusal);
                }
                Ok(())
            }
            Next::AtOnce { required: true } => Err(format!(
                "a {cause:?} backoff, where the round goes on at once"
            )),
            other => Err(format!(
                "a {cause:?} backoff with nothing that calls for it ({other:?})"
            )),
        }
    }

    /// A `Misconfigured` notice.
    pub(super) fn misconfigured_notice(&mut self, cause: &CloseReason) -> Result<(), String> {
        match std::mem::replace(&mut self.next, Next::Settled) {
            Next::Misconfigured(want) if want == *cause => Ok(()),
            other => Err(format!(
                "Misconfigured({cause}) where the model has {other:?}"
            )),
        }
    }

    /// What a close still owes at the end of a step, if anything.
    pub(super) fn owed(&self) -> Option<String> {
        match &self.next {
            Next::AtOnce { required: true } => Some("the round's next attempt at once".into()),
            Next::Wait {
                cause,
                required: true,
                ..
            } => Some(format!("a {cause:?} backoff")),
            Next::Misconfigured(cause) => Some(format!("the Misconfigured({cause}) notice")),
            _ => None,
        }
    }

    /// The step ended: what was not required is not owed any more.
    pub(super) fn end_step(&mut self) {
        if matches!(
            self.next,
            Next::AtOnce { required: false }
                | Next::Wait {
                    required: false,
                    ..
                }
                | Next::Either { .. }
        ) {
            self.next = Next::Settled;
        }
    }
}

/// `wait`, shortened by what a held lease allows at `at`.
fn capped(wait: Duration, cap: &impl LeaseCap, at: Time) -> Duration {
    cap.cap(at).map_or(wait, |cap| wait.min(cap))
}

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

fn round_backoff(b: &crate::client::Backoffs, cause: BackoffCause) -> Backoff {
    match cause {
        BackoffCause::Transport => b.transport,
        BackoffCause::NoLeader => b.no_leader,
        BackoffCause::NotActive => b.not_active,
        BackoffCause::AuthFailed => b.auth_failed,
        BackoffCause::UnsupportedVersion => b.unsupported_version,
        BackoffCause::Redirect => b.redirect,
        _ => b.busy,
    }
}
