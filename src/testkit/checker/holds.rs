//! The grants the embedder holds, as the client must have them (PROTOCOL.md
//! section 5, "Renewal", and invariant 7): each grant's `valid_until`,
//! its renewal (asked for by the embedder or by the schedule, queued, in
//! flight), jeopardy, expiry, loss, the notices each owes, and when the
//! client forgets it.
//!
//! For every grant the embedder holds the checker keeps its own
//! `valid_until` (the answered attempt's send time, plus the `waited_ms`
//! of the acquire's `G`, plus the lease given; a renewal's `G` moves it to
//! `max(valid_until, its send time + lease)`), whether it is renewed
//! automatically and until when, and the renewal that is asked for,
//! queued by the schedule or in flight. The rules it holds the client to:
//!
//! - an `X` only for a grant the embedder holds, that is not being
//!   released, whose `valid_until` has not passed, asked for (by the
//!   embedder, or by the schedule once less than two thirds of the lease
//!   is left) and with the lease asked; at most one in flight per grant
//!   ([`Holds::renewal_sent`]);
//! - a renewal waiting while a slot of the window is free is a violation
//!   ([`Holds::none_waiting`]);
//! - one in flight at a close is resent only while `valid_until` has not
//!   passed ([`Holds::requeue`]);
//! - Renewed with the new `valid_until`, LeaseJeopardy once per jeopardy,
//!   LeaseLost on `N .. X`, LeaseExpired when `valid_until` passes, each at
//!   the step it falls due and never otherwise ([`Holds::notice`],
//!   [`Holds::told`]);
//! - [`Client::valid_until`] is what the `G`s prove ([`Holds::told`]);
//! - the results of `renew`, `auto_renew` and `stop_renewing`
//!   ([`Holds::command`]).

use core::time::Duration;

use super::invariant::{breach, Verdict};
use super::rounds::LeaseCap;
use super::{ms, Invariant, Session};
use crate::client::{Client, ConnId, Error as ClientError, Event, Grant, OpId};
use crate::names::Key;
use crate::time::Time;
use crate::wire::AnswerKind;

/// Where a held grant's renewal is, as the client must have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    Idle,
    /// Asked for (by the embedder, or by the schedule: `auto`), not sent.
    Queued {
        lease_ms: u64,
        auto: bool,
    },
    /// In flight as request `id`.
    Sent {
        id: u64,
        sent_at: Time,
        lease_ms: u64,
        auto: bool,
    },
}

/// A grant the client holds for the embedder (matched, delivered or about
/// to be), until the client forgets it.
struct Held {
    key: String,
    token: u64,
    /// The `expires_by` of the [`Grant`] handed out.
    expires_by: Time,
    /// When the server has freed it at the latest, renewals included (no
    /// margin).
    lease_end: Time,
    delivered: bool,
    /// The grant handed out, once delivered.
    grant: Option<Grant>,
    /// What the `G`s read prove (invariant 7).
    valid_until: Time,
    /// The lease of the `G` that set `valid_until`.
    lease_ms: u64,
    /// What an automatic renewal asks for: the acquire's lease.
    renew_lease_ms: u64,
    /// The client keeps its record until this, once expired (its
    /// `expires_by`, moved by renewals).
    record_until: Time,
    /// Renewed automatically until this.
    auto_until: Option<Time>,
    renewal: Renewal,
    /// When its renewal went into the lane, while [`Renewal::Queued`]
    /// (`Time::ZERO`: put back at its front by a close): the lane sends
    /// renewals in that order.
    queued_at: Time,
    /// In jeopardy (told, or owed).
    jeopardy: bool,
    expired: bool,
    /// Its renewal was answered `N`.
    lost: bool,
    /// The client no longer has it: only owed notices keep the record.
    gone: bool,
    owed_renewed: Option<Time>,
    owed_jeopardy: bool,
    owed_expired: bool,
    owed_lost: bool,
}

impl Held {
    fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    /// Whether the embedder holds it (the client has not forgotten it, nor
    /// lost it).
    fn live(&self) -> bool {
        !self.gone && !self.lost
    }

    /// Whether a notice is owed.
    fn owes(&self) -> bool {
        self.owed_renewed.is_some() || self.owed_jeopardy || self.owed_expired || self.owed_lost
    }

    /// The next moment something is due for it (its renewal's answer
    /// grace aside: the client's close tells of that).
    fn next_moment(&self) -> Time {
        if self.gone {
            return Time::MAX;
        }
        if self.lost {
            return self.record_until;
        }
        if self.expired {
            return match self.renewal {
                Renewal::Sent { .. } => Time::MAX,
                _ => self.record_until,
            };
        }
        let mut at = self.valid_until;
        if let Some(until) = self.auto_until {
            at = at.min(until);
            if !self.jeopardy {
                at = at.min(self.jeopardy_at());
            }
            if self.renewal == Renewal::Idle {
                at = at.min(self.renew_at());
            }
        }
        at
    }

    fn renew_at(&self) -> Time {
        self.valid_until.saturating_sub(self.lease() * 2 / 3)
    }

    fn jeopardy_at(&self) -> Time {
        self.valid_until.saturating_sub(self.lease() / 3)
    }

    /// What is due at `at`, in order: expiry (renewal stops), the end of
    /// automatic renewal, jeopardy, the schedule's renewal; and the client
    /// forgetting an expired grant once the server has certainly freed it
    /// (a lost one at its `expires_by`).
    fn tend(&mut self, at: Time) {
        if self.gone {
            return;
        }
        if self.lost {
            self.gone = at >= self.record_until;
            return;
        }
        if !self.expired && at >= self.valid_until {
            self.expired = true;
            self.owed_expired = true;
            self.auto_until = None;
            if matches!(self.renewal, Renewal::Queued { .. }) {
                self.renewal = Renewal::Idle;
            }
        }
        if self.auto_until.is_some_and(|until| at >= until) {
            self.auto_until = None;
            if matches!(self.renewal, Renewal::Queued { auto: true, .. }) {
                self.renewal = Renewal::Idle;
            }
        }
        if self.auto_until.is_some() {
            if !self.jeopardy && at >= self.jeopardy_at() {
                self.jeopardy = true;
                self.owed_jeopardy = true;
            }
            if self.renewal == Renewal::Idle && at >= self.renew_at() {
                self.renewal = Renewal::Queued {
                    lease_ms: self.renew_lease_ms,
                    auto: true,
                };
                self.queued_at = at;
            }
        }
        if self.expired && at >= self.record_until && !matches!(self.renewal, Renewal::Sent { .. })
        {
            self.gone = true;
        }
    }

    /// Whether `grant` names this one.
    fn is(&self, grant: &Grant) -> bool {
        self.key == grant.key().as_str()
            && self.token == grant.token()
            && match &self.grant {
                Some(g) => g.id() == grant.id(),
                None => self.expires_by == grant.expires_by(),
            }
    }
}

/// A notice about a held grant's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Notice {
    Renewed,
    LeaseJeopardy,
    LeaseLost,
    LeaseExpired,
}

impl Notice {
    fn name(self) -> &'static str {
        match self {
            Notice::Renewed => "Renewed",
            Notice::LeaseJeopardy => "LeaseJeopardy",
            Notice::LeaseLost => "LeaseLost",
            Notice::LeaseExpired => "LeaseExpired",
        }
    }

    /// The invariant the notice breaks when it is told wrongly or not at
    /// all: renewal for `Renewed`, the protocol for the others.
    fn invariant(self) -> Invariant {
        match self {
            Notice::Renewed => Invariant::Renewal,
            _ => Invariant::Protocol,
        }
    }
}

/// A renewal command of the embedder's.
#[derive(Debug, Clone, Copy)]
pub(super) enum Command {
    /// `renew(grant, lease)`.
    Renew(Option<Duration>),
    /// `auto_renew(grant, limit)`.
    AutoRenew(Option<Duration>),
    /// `stop_renewing(grant)`.
    StopRenewing,
}

impl Command {
    fn name(self) -> &'static str {
        match self {
            Command::Renew(_) => "renew",
            Command::AutoRenew(_) => "auto_renew",
            Command::StopRenewing => "stop_renewing",
        }
    }
}

/// A `G` to an acquire, which the embedder now holds: what the client was
/// asked and what the server answered.
pub(super) struct NewGrant {
    pub(super) key: String,
    pub(super) token: u64,
    /// The lease the `G` gave.
    pub(super) lease_ms: u64,
    /// The `waited_ms` of the `G`.
    pub(super) waited_ms: u64,
    /// When the attempt answered was sent.
    pub(super) sent_at: Time,
    /// The lease the acquire asked for, which automatic renewals ask for.
    pub(super) renew_lease_ms: u64,
    /// Renewed automatically for at most this long from the grant.
    pub(super) renew: Option<Duration>,
}

/// What the client must do with a grant the embedder gave up.
pub(super) struct GivenUp {
    pub(super) key: String,
    pub(super) token: u64,
    /// When the server has freed it at the latest.
    pub(super) lease_end: Time,
    /// Lost, or freed already: nothing to release.
    pub(super) freed: bool,
}

pub(super) struct Holds {
    held: Vec<Held>,
    settle_margin: Duration,
}

impl Holds {
    pub(super) fn new(settle_margin: Duration) -> Holds {
        Holds {
            held: Vec::new(),
            settle_margin,
        }
    }

    /// The held grant `grant` names, if the client still has it (held, or
    /// lost).
    pub(super) fn index(&self, grant: &Grant) -> Option<usize> {
        self.held.iter().position(|h| !h.gone && h.is(grant))
    }

    /// Whether held grant `i`'s renewal was answered `N`.
    pub(super) fn is_lost(&self, i: usize) -> bool {
        self.held[i].lost
    }

    /// Whether the embedder holds `(key, token)`.
    pub(super) fn is_held(&self, key: &str, token: u64) -> bool {
        self.held
            .iter()
            .any(|h| h.live() && h.key == key && h.token == token)
    }

    /// Whether the client still has a record of `(key, token)`: held, or
    /// lost.
    pub(super) fn knows(&self, key: &str, token: u64) -> bool {
        self.held
            .iter()
            .any(|h| !h.gone && h.key == key && h.token == token)
    }

    /// Whether a held grant's renewal is in flight as request `id`.
    pub(super) fn renewing(&self, id: u64) -> bool {
        self.held
            .iter()
            .any(|h| !h.gone && matches!(h.renewal, Renewal::Sent { id: sent, .. } if sent == id))
    }

    /// The cap the grants held at `now` put on the link's waits.
    pub(super) fn cap(&self, now: Time) -> HeldCap<'_> {
        HeldCap(&self.held, now)
    }

    /// Brings every held grant to `now`, as the client's timers must have,
    /// each at its own moment: its renewal by the schedule (less than two
    /// thirds of its lease left before `valid_until`), its jeopardy (less
    /// than a third), the end of its automatic renewal, its expiry, and the
    /// client forgetting it.
    pub(super) fn advance(&mut self, now: Time) {
        for h in &mut self.held {
            loop {
                let at = h.next_moment();
                if at > now {
                    break;
                }
                h.tend(at);
            }
        }
    }

    /// What the client does for held grant `i` at once, at `now`, after a
    /// change to it: everything due, in the order the client does it.
    fn tend_now(&mut self, i: usize, now: Time) {
        self.held[i].tend(now);
        self.advance(now);
    }

    /// Forgets the grants the client has forgotten, once told all it owes.
    pub(super) fn forget_gone(&mut self) {
        self.held.retain(|h| !h.gone || h.owes());
    }

    /// The client has stopped, and forgets every grant it held for the
    /// embedder: lease expiry ends them.
    pub(super) fn clear(&mut self) {
        self.held.clear();
    }

    /// The embedder holds a grant read from a `G` at `now`.
    pub(super) fn hold(&mut self, g: NewGrant, now: Time) {
        let lease = Duration::from_millis(g.lease_ms);
        let lease_end = now.saturating_add(lease);
        let expires_by = lease_end.saturating_add(self.settle_margin);
        self.held.push(Held {
            key: g.key,
            token: g.token,
            expires_by,
            lease_end,
            delivered: false,
            grant: None,
            valid_until: g
                .sent_at
                .saturating_add(Duration::from_millis(g.waited_ms))
                .saturating_add(lease),
            lease_ms: g.lease_ms,
            renew_lease_ms: g.renew_lease_ms,
            record_until: expires_by,
            auto_until: g.renew.map(|limit| now.saturating_add(limit)),
            renewal: Renewal::Idle,
            queued_at: Time::ZERO,
            jeopardy: false,
            expired: false,
            lost: false,
            gone: false,
            owed_renewed: None,
            owed_jeopardy: false,
            owed_expired: false,
            owed_lost: false,
        });
        self.tend_now(self.held.len() - 1, now);
    }

    /// The Granted outcome `g` was told: the grant it hands out.
    pub(super) fn delivered(&mut self, g: &Grant) {
        if let Some(h) = self.held.iter_mut().find(|h| {
            !h.delivered
                && h.key == g.key().as_str()
                && h.token == g.token()
                && h.expires_by == g.expires_by()
        }) {
            h.delivered = true;
            h.grant = Some(g.clone());
        }
    }

    /// The embedder gave up held grant `i` at `now` (released it, or handed
    /// it back): the client forgets it and its renewal stops (one in
    /// flight is claimed). Notices that fell due before the call are still
    /// owed.
    pub(super) fn give_up(&mut self, i: usize, now: Time) -> GivenUp {
        let h = &mut self.held[i];
        h.gone = true;
        h.renewal = Renewal::Idle;
        // An expired grant kept only for a renewal in flight, past what
        // that renewal could give it: the server has freed it, there is
        // nothing left to release.
        let freed = h.expired && now >= h.record_until;
        GivenUp {
            key: h.key.clone(),
            token: h.token,
            lease_end: h.lease_end,
            freed: h.lost || freed,
        }
    }

    /// Whether a close of the connection now would make the client forget
    /// `grant`: it has expired, its renewal is in flight on the live
    /// connection (so its record is kept for that answer), and its record's
    /// end has passed.
    fn forgotten_at_a_close(&self, grant: &Grant, conn_alive: bool, now: Time) -> bool {
        self.index(grant).is_some_and(|i| {
            let h = &self.held[i];
            conn_alive
                && h.live()
                && h.expired
                && matches!(h.renewal, Renewal::Sent { .. })
                && now >= h.record_until
        })
    }

    /// What a renewal command on `grant` must give, before its own effect:
    /// `Ok(i)` for held grant `i`, else the error.
    fn renewable(&self, grant: &Grant, session: Session) -> Result<usize, ClientError> {
        let (key, token) = (grant.key().clone(), grant.token());
        if session.complete {
            return Err(ClientError::Finished);
        }
        if session.shutting {
            return Err(ClientError::ShuttingDown);
        }
        match self.index(grant) {
            Some(i) if self.held[i].lost => Err(ClientError::GrantNotHeld { key, token }),
            Some(i) if self.held[i].expired => Err(ClientError::LeaseExpired { key, token }),
            Some(i) => Ok(i),
            None => Err(ClientError::GrantNotHeld { key, token }),
        }
    }

    /// The renewal command `command`, called at `now` with `grant`, gave
    /// `result`, the grants known as of `at`. Checks the result against
    /// what the grant's state calls for, and applies the command if it was
    /// accepted. `Some` if the result is right only if the client closed
    /// its connection within the call (which the step must show): what was
    /// answered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn command(
        &mut self,
        command: Command,
        now: Time,
        at: Time,
        grant: &Grant,
        result: &Result<(), ClientError>,
        session: Session,
        conn_alive: bool,
    ) -> Verdict<Option<String>> {
        let call = command.name();
        self.advance(at);
        let expected = self.renewable(grant, session);
        let i = match (&expected, result) {
            (Ok(i), Ok(())) => *i,
            (Err(e), Err(got)) if e == got => return Ok(None),
            // The shutdown may finish at the call's own moment, its timers
            // fired first: told by the event that follows.
            (Err(ClientError::ShuttingDown), Err(ClientError::Finished)) => return Ok(None),
            // An expired grant kept only for its renewal in flight, past
            // its record's end. If the client's own timers close the
            // connection first, within the call (an answer grace that ran
            // out while the driver was late: closes tell of answer graces,
            // which this model does not keep), the renewal is put down and
            // the client forgets the grant: not held. Right only with that
            // close, which must come in this step.
            (Err(ClientError::LeaseExpired { .. }), Err(ClientError::GrantNotHeld { .. }))
                if self.forgotten_at_a_close(grant, conn_alive, at) =>
            {
                return Ok(Some(format!(
                    "{call} of ({}, {}) gave {result:?}",
                    grant.key(),
                    grant.token()
                )));
            }
            _ => {
                return breach(
                    Invariant::Protocol,
                    format!(
                        "{call} of ({}, {}) gave {result:?}, expected {:?}",
                        grant.key(),
                        grant.token(),
                        expected.map(|_| ())
                    ),
                )
            }
        };
        let h = &mut self.held[i];
        match command {
            Command::Renew(lease) => {
                if h.renewal == Renewal::Idle {
                    h.renewal = Renewal::Queued {
                        lease_ms: lease.map_or(h.renew_lease_ms, ms),
                        auto: false,
                    };
                    h.queued_at = now;
                }
            }
            Command::AutoRenew(limit) => {
                h.auto_until = Some(limit.map_or(Time::MAX, |l| now.saturating_add(l)));
                self.tend_now(i, now);
            }
            Command::StopRenewing => {
                h.auto_until = None;
                if matches!(h.renewal, Renewal::Queued { auto: true, .. }) {
                    h.renewal = Renewal::Idle;
                }
                self.tend_now(i, now);
            }
        }
        Ok(None)
    }

    /// Shutting down at `now` stops every renewal: automatic renewal ends,
    /// and renewals not sent are dropped.
    pub(super) fn stop_renewals(&mut self, now: Time) {
        self.advance(now);
        for i in 0..self.held.len() {
            let h = &mut self.held[i];
            h.auto_until = None;
            if matches!(h.renewal, Renewal::Queued { .. }) {
                h.renewal = Renewal::Idle;
            }
            self.tend_now(i, now);
        }
    }

    /// An `X` went out at `now` as request `id` (`text`), while a release
    /// of `(key, token)` is under way or not (`releasing`): invariant 7 and
    /// the renewal rules it must keep.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn renewal_sent(
        &mut self,
        id: u64,
        key: &str,
        token: u64,
        lease_ms: u64,
        now: Time,
        releasing: bool,
        text: &str,
    ) -> Verdict {
        let margin = self.settle_margin;
        // The grant it renews. Two the embedder holds may have one key and
        // token (a forged `G` took a token the server gave later): then the
        // one whose renewal asked for this lease, first in the lane.
        let asked = |h: &Held| matches!(h.renewal, Renewal::Queued { lease_ms: asked, .. } if asked == lease_ms);
        let same = |h: &&Held| h.live() && h.key == key && h.token == token;
        let first_asked = self
            .held
            .iter()
            .enumerate()
            .filter(|(_, h)| same(h) && asked(h))
            .min_by_key(|(_, h)| h.queued_at)
            .map(|(i, _)| i);
        let Some(i) = first_asked.or_else(|| self.held.iter().position(|h| same(&h))) else {
            let why = if releasing {
                "a grant that is being released"
            } else {
                "a grant the embedder does not hold"
            };
            return breach(Invariant::Renewal, format!("{text}: a renewal of {why}"));
        };
        let h = &mut self.held[i];
        if h.expired || now >= h.valid_until {
            let until = h.valid_until;
            return breach(
                Invariant::Renewal,
                format!("{text}: a renewal of a grant whose valid_until {until} has passed"),
            );
        }
        let (until, auto_until, lease) = (h.valid_until, h.auto_until, h.lease_ms);
        let auto = match h.renewal {
            Renewal::Sent { id: other, .. } => {
                return breach(
                    Invariant::Protocol,
                    format!(
                        "{text}: renewal {other} of the grant is still in flight: at most one is"
                    ),
                )
            }
            Renewal::Idle => {
                return breach(
                    Invariant::Protocol,
                    format!(
                        "{text}: nobody asked for a renewal (valid until {until}, lease {lease} ms, automatic until {auto_until:?})"
                    ),
                );
            }
            Renewal::Queued {
                lease_ms: asked, ..
            } if asked != lease_ms => {
                return breach(
                    Invariant::Protocol,
                    format!("{text}: the renewal asked for {asked} ms"),
                );
            }
            Renewal::Queued { auto, .. } => auto,
        };
        h.renewal = Renewal::Sent {
            id,
            sent_at: now,
            lease_ms,
            auto,
        };
        let lease = Duration::from_millis(lease_ms);
        h.record_until = h
            .record_until
            .max(now.saturating_add(lease).saturating_add(margin));
        h.lease_end = h.lease_end.max(now.saturating_add(lease));
        self.tend_now(i, now);
        Ok(())
    }

    /// The answer to renewal `id`, matched at `now`.
    pub(super) fn renewal_answer(&mut self, id: u64, kind: AnswerKind, now: Time) {
        let margin = self.settle_margin;
        let Some(i) = self.held.iter().position(|h| {
            !h.gone && matches!(h.renewal, Renewal::Sent { id: sent, .. } if sent == id)
        }) else {
            // Its grant was given up meanwhile: claimed, changes nothing.
            return;
        };
        let h = &mut self.held[i];
        let Renewal::Sent { sent_at, .. } = h.renewal else {
            unreachable!("just matched");
        };
        h.renewal = Renewal::Idle;
        match kind {
            AnswerKind::Renewed { lease_ms, .. } => {
                let lease = Duration::from_millis(lease_ms.get());
                h.record_until = h
                    .record_until
                    .max(now.saturating_add(lease).saturating_add(margin));
                h.lease_end = h.lease_end.max(now.saturating_add(lease));
                if !h.expired {
                    // From the renewal's send time, never its arrival;
                    // never shortened.
                    let proven = sent_at.saturating_add(lease);
                    if proven > h.valid_until {
                        h.valid_until = proven;
                        h.lease_ms = lease_ms.get();
                    }
                    h.jeopardy = false;
                    h.owed_renewed = Some(h.valid_until);
                }
            }
            _ => {
                h.lost = true;
                h.owed_lost = true;
                h.auto_until = None;
                return;
            }
        }
        self.tend_now(i, now);
    }

    /// Renewal `id` was in flight on a connection that closed at `now`:
    /// back into the lane while the grant's `valid_until` has not passed
    /// (and an automatic one while its renewal goes on); not once shutting
    /// down, which stops every renewal.
    pub(super) fn requeue(&mut self, id: u64, now: Time, shutting: bool) {
        let Some(i) = self.held.iter().position(|h| {
            !h.gone && matches!(h.renewal, Renewal::Sent { id: sent, .. } if sent == id)
        }) else {
            return;
        };
        let h = &mut self.held[i];
        let Renewal::Sent { lease_ms, auto, .. } = h.renewal else {
            unreachable!("just matched");
        };
        let allowed = !auto || h.auto_until.is_some_and(|until| now < until);
        h.renewal = if !h.expired && now < h.valid_until && !shutting && allowed {
            h.queued_at = Time::ZERO;
            Renewal::Queued { lease_ms, auto }
        } else {
            Renewal::Idle
        };
        self.tend_now(i, now);
    }

    /// A notice about a held grant's lease, told at `now`: which one, if
    /// it checks out ([`Holds::notice`]). `None` for the other events.
    pub(super) fn event(&mut self, event: &Event, now: Time) -> Option<Verdict<Notice>> {
        let (notice, grant, key, token, valid_until) = match event {
            Event::Renewed {
                grant,
                key,
                token,
                valid_until,
            } => (Notice::Renewed, grant, key, token, Some(*valid_until)),
            Event::LeaseJeopardy {
                grant,
                key,
                token,
                valid_until,
            } => (Notice::LeaseJeopardy, grant, key, token, Some(*valid_until)),
            Event::LeaseLost { grant, key, token } => (Notice::LeaseLost, grant, key, token, None),
            Event::LeaseExpired { grant, key, token } => {
                (Notice::LeaseExpired, grant, key, token, None)
            }
            _ => return None,
        };
        let told = self.notice(notice, *grant, key, *token, valid_until, now);
        Some(told.map(|()| notice))
    }

    /// A renewal notice about `grant`, told at `now`: it must be owed, name
    /// the grant the embedder was handed, and carry the `valid_until` the
    /// `G`s prove.
    fn notice(
        &mut self,
        notice: Notice,
        grant: OpId,
        key: &Key,
        token: u64,
        valid_until: Option<Time>,
        now: Time,
    ) -> Verdict {
        let what = notice.name();
        let Some(i) = self.held.iter().position(|h| {
            h.key == key.as_str()
                && h.token == token
                && h.grant.as_ref().map_or(true, |g| g.id() == grant)
                && match notice {
                    Notice::Renewed => h.owed_renewed.is_some(),
                    Notice::LeaseJeopardy => h.owed_jeopardy,
                    Notice::LeaseLost => h.owed_lost,
                    Notice::LeaseExpired => h.owed_expired,
                }
        }) else {
            let known: Vec<String> = self
                .held
                .iter()
                .filter(|h| h.key == key.as_str() && h.token == token)
                .map(|h| {
                    format!(
                        "valid until {}, lease {} ms, automatic until {:?}, {:?}, jeopardy {}, expired {}, lost {}, gone {}",
                        h.valid_until, h.lease_ms, h.auto_until, h.renewal, h.jeopardy, h.expired, h.lost, h.gone
                    )
                })
                .collect();
            return breach(
                notice.invariant(),
                format!("{what} for ({key}, {token}) at {now} was not due: {known:?}"),
            );
        };
        let h = &mut self.held[i];
        let expected = match notice {
            Notice::Renewed => h.owed_renewed.take(),
            Notice::LeaseJeopardy => {
                h.owed_jeopardy = false;
                Some(h.valid_until)
            }
            Notice::LeaseLost => {
                h.owed_lost = false;
                None
            }
            Notice::LeaseExpired => {
                h.owed_expired = false;
                None
            }
        };
        if valid_until != expected {
            return breach(
                Invariant::Renewal,
                format!(
                    "{what} for ({key}, {token}) says valid until {valid_until:?}; what the G read proves is {expected:?}"
                ),
            );
        }
        Ok(())
    }

    /// Once the client is drained: every notice due was told, and the
    /// client's `valid_until` of every grant the embedder holds is what the
    /// `G`s prove (invariant 7), unless it has stopped (`complete`).
    pub(super) fn told(&self, client: &Client, complete: bool) -> Verdict {
        for h in &self.held {
            let owed = [
                (h.owed_renewed.is_some(), Notice::Renewed),
                (h.owed_jeopardy, Notice::LeaseJeopardy),
                (h.owed_expired, Notice::LeaseExpired),
                (h.owed_lost, Notice::LeaseLost),
            ];
            if let Some((_, notice)) = owed.iter().find(|(due, _)| *due) {
                return breach(
                    notice.invariant(),
                    format!(
                        "{} was due for ({}, {}) (valid until {}, lease {} ms, automatic until {:?}) and was not told",
                        notice.name(), h.key, h.token, h.valid_until, h.lease_ms, h.auto_until
                    ),
                );
            }
            if let Some(grant) = h.grant.as_ref().filter(|_| !h.gone && !complete) {
                let expected = (!h.lost).then_some(h.valid_until);
                let told = client.valid_until(grant);
                if told != expected {
                    return breach(
                        Invariant::Renewal,
                        format!(
                            "the client says ({}, {}) is valid until {told:?}; the G read prove {expected:?}",
                            h.key, h.token
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// Once the client is drained, with `in_use` of the `window` slots of
    /// connection `conn` taken: no renewal waits (renewals go before
    /// acquires, and may use the reserved slots).
    pub(super) fn none_waiting(&self, conn: ConnId, window: u64, in_use: usize) -> Verdict {
        match self
            .held
            .iter()
            .find(|h| h.live() && matches!(h.renewal, Renewal::Queued { .. }))
        {
            Some(h) => breach(
                Invariant::Protocol,
                format!(
                    "the renewal of ({}, {}) waits with {in_use} of {window} slots in use on {conn}",
                    h.key, h.token,
                ),
            ),
            None => Ok(()),
        }
    }
}

/// The cap the grants the embedder holds put on the link's waits: a
/// quarter of what is left until the earliest `valid_until` of a grant
/// renewed automatically or with a renewal asked for, never below 100 ms.
pub(super) struct HeldCap<'a>(&'a [Held], Time);

impl LeaseCap for HeldCap<'_> {
    fn as_of(&self) -> Time {
        self.1
    }

    fn cap(&self, at: Time) -> Option<Duration> {
        let earliest = self
            .0
            .iter()
            .filter(|g| g.live() && !g.expired)
            .filter(|g| g.auto_until.is_some() || g.renewal != Renewal::Idle)
            .map(|g| g.valid_until)
            .min()?;
        Some((earliest.saturating_duration_since(at) / 4).max(Duration::from_millis(100)))
    }
}
