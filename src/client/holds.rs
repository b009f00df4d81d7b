//! The grants the embedder holds, and what becomes of them (PROTOCOL.md
//! section 5: "The reserved release lane", "Renewal", and the rows on a
//! Granted outcome the embedder cannot take and on answers nobody claims):
//! renewal, jeopardy and expiry; releases by exact token, the embedder's
//! and the client's own for orphaned grants, each ended in one place,
//! [`Holds::end_release`].
//!
//! A grant keeps one record from the moment the embedder holds it to the
//! end of its release: held (its timer the next moment something is due:
//! a renewal, a jeopardy, its expiry, its renewal's answer grace, its
//! `expires_by`), then a release under way (its timer the release's
//! deadline, or the answer grace of an attempt in flight). A release of a
//! raw `(key, token)`, or of an orphaned grant, starts as a release.

use core::num::NonZeroU64;
use core::time::Duration;

use super::link::LEASE_CAP_FLOOR;
use super::outcome::{Error, Event, Grant, Issuer, OpId, OpKind, Outcome, ReleaseResult};
use super::pending::Expected;
use super::stats::Note;
use super::store::{Handle, Queue, Table};
use super::{Fx, Life, Unwell};
use crate::names::Key;
use crate::time::{duration_millis, millis, Time};
use crate::wire::{AnswerKind, ClientFrame, Op};

/// A grant handed to the embedder and not yet released or handed back.
struct Held {
    key: Key,
    token: u64,
    /// Until when the embedder may count on the grant: what the `G` that
    /// proves most proves (invariant 7).
    valid_until: Time,
    /// The lease that `G` gave: renewal's schedule counts in thirds of it.
    lease_ms: NonZeroU64,
    /// When the server has certainly freed it: the latest of every answer's
    /// arrival, and every renewal's send time, plus the lease plus the
    /// margin. Its release's deadline.
    expires_by: Time,
    /// What a renewal asks for: the acquire's lease, or the embedder's.
    renew_lease_ms: NonZeroU64,
    /// Renewed automatically until this moment (`Time::MAX`: with no
    /// limit); `None`: only when the embedder asks.
    auto_until: Option<Time>,
    renewal: Renewal,
    /// The embedder was told LeaseJeopardy since the last renewal.
    jeopardy: bool,
    /// `valid_until` has passed: the embedder was told LeaseExpired.
    expired: bool,
}

/// Where a held grant's renewal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    /// None is asked for.
    Idle,
    /// Waiting in the lane with its ticket, asking for `lease_ms`.
    Queued {
        lease_ms: NonZeroU64,
        asked: Asked,
        ticket: u32,
    },
    /// In flight since `sent_at`, asking for `lease_ms`.
    Sent {
        sent_at: Time,
        lease_ms: NonZeroU64,
        asked: Asked,
    },
}

/// Who asked for a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// The embedder, once ([`Holds::renew`]).
    ByEmbedder,
    /// The schedule of automatic renewal.
    BySchedule,
}

/// Where in the lane a renewal joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    /// After those waiting: a new one.
    Back,
    /// Before them: one sent again after a close, in its order.
    Front,
}

/// Automatic renewal of a held grant, asked for or stopped
/// ([`Holds::auto_renew`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AutoRenew {
    /// From now on, for at most `limit` (`None`: with no limit).
    On { limit: Option<Duration> },
    /// No longer (a queued automatic renewal is dropped).
    Off,
}

/// A release: the embedder's, or one the client issued for an orphaned
/// grant.
struct Release {
    key: Key,
    token: u64,
    /// No new attempt starts at or after this; its timer while queued.
    until: Time,
    attempts: u32,
    /// Its ticket while it waits in the lane; `None` while an attempt is in
    /// flight (its timer then the answer grace), or before it joins.
    queued: Option<u32>,
    /// Whose release it is: the embedder's ends in an outcome, the
    /// client's own for an orphaned grant in a notice.
    by: ReleasedBy,
}

/// Whose release it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReleasedBy {
    /// The embedder's: an operation, with an outcome.
    Embedder,
    /// The client's own, for a grant nobody can take: a notice.
    Client,
}

enum Hold {
    Held(Held),
    Release(Release),
    /// A grant whose renewal was answered `N`: gone on the server, and kept
    /// until its `expires_by` only so that a release of it ends NotHeld at
    /// once, without a request, where a release of a grant released before
    /// is misuse.
    Lost {
        key: Key,
        token: u64,
    },
}

/// What is due for a held grant at a moment, as [`Held::tend`] finds it.
#[derive(Default)]
struct Due {
    expired: bool,
    jeopardy: bool,
    /// Its renewal by the schedule went into the lane.
    queued: bool,
    /// A renewal waiting in the lane was dropped.
    dropped: bool,
    /// The server has certainly freed it: the record goes.
    gone: bool,
}

impl Held {
    /// `thirds` thirds of the grant's lease, in whole nanoseconds rounded
    /// down. Each is computed on its own: twice a rounded third can be a
    /// nanosecond short of two thirds rounded (200 ms is 66,666,666 ns
    /// twice, but 133,333,333 ns as two thirds).
    fn thirds(&self, thirds: u64) -> u64 {
        // In 64 bits, where a division by 3 is a multiplication, unless the
        // lease is too long for it (over 6,000 years).
        match self.lease_ms.get().checked_mul(1_000_000 * thirds) {
            Some(nanos) => nanos / 3,
            None => {
                let nanos = u128::from(self.lease_ms.get()) * 1_000_000 * u128::from(thirds) / 3;
                u64::try_from(nanos).unwrap_or(u64::MAX)
            }
        }
    }

    /// When an automatically renewed grant is renewed: once less than two
    /// thirds of its lease is left before `valid_until`.
    fn renew_at(&self) -> Time {
        self.valid_until.saturating_sub_nanos(self.thirds(2))
    }

    /// When it is in jeopardy: once less than a third of its lease is left.
    fn jeopardy_at(&self) -> Time {
        self.valid_until.saturating_sub_nanos(self.thirds(1))
    }

    /// Whether the client keeps renewing it: it is renewed automatically,
    /// or a renewal of it is queued or in flight, and it has not expired.
    /// Such a grant caps every wait of the link.
    fn keeps_renewing(&self) -> bool {
        !self.expired && (self.auto_until.is_some() || self.renewal != Renewal::Idle)
    }

    /// The next moment something is due for it.
    fn next_moment(&self, answer_grace: Duration) -> Time {
        let mut at = Time::MAX;
        if let Renewal::Sent { sent_at, .. } = self.renewal {
            at = at.min(sent_at.saturating_add(answer_grace));
        }
        if self.expired {
            // The record goes once the server has certainly freed the
            // grant, unless a renewal in flight still waits for its answer.
            if !matches!(self.renewal, Renewal::Sent { .. }) {
                at = at.min(self.expires_by);
            }
            return at;
        }
        at = at.min(self.valid_until);
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

    /// Whether its renewal's answer is past the answer grace at `now`:
    /// the connection or the server is unwell (its timer finds it first,
    /// [`Holds::fire`]; the close puts the renewal back and tends it).
    fn overdue(&self, now: Time, answer_grace: Duration) -> bool {
        matches!(self.renewal, Renewal::Sent { sent_at, .. } if now >= sent_at.saturating_add(answer_grace))
    }

    /// Does what is due at `now`, in order: its expiry (renewal stops),
    /// the end of its automatic renewal, its jeopardy, its renewal by the
    /// schedule, and once expired and certainly freed, its record going.
    fn tend(&mut self, now: Time) -> Due {
        let mut due = Due::default();
        if !self.expired && now >= self.valid_until {
            self.expired = true;
            self.auto_until = None;
            due.expired = true;
            if matches!(self.renewal, Renewal::Queued { .. }) {
                self.renewal = Renewal::Idle;
                due.dropped = true;
            }
        }
        if self.auto_until.is_some_and(|until| now >= until) {
            // No renewal by the schedule after the limit.
            self.auto_until = None;
            if let Renewal::Queued {
                asked: Asked::BySchedule,
                ..
            } = self.renewal
            {
                self.renewal = Renewal::Idle;
                due.dropped = true;
            }
        }
        if self.auto_until.is_some() {
            if !self.jeopardy && now >= self.jeopardy_at() {
                self.jeopardy = true;
                due.jeopardy = true;
            }
            if self.renewal == Renewal::Idle && now >= self.renew_at() {
                // Queued by the caller, who hands out its ticket.
                due.queued = true;
            }
        }
        due.gone =
            self.expired && now >= self.expires_by && !matches!(self.renewal, Renewal::Sent { .. });
        due
    }
}

/// When the server has certainly freed a grant whose lease of `lease_ms`
/// started no earlier than `from`: that plus the lease plus the margin.
fn expiry(from: Time, lease_ms: NonZeroU64, margin: Duration) -> Time {
    from.saturating_add_millis(lease_ms.get())
        .saturating_add(margin)
}

/// The grants held and the releases under way, with the release lane and
/// the renewals waiting to be sent.
pub(crate) struct Holds {
    table: Table<Hold>,
    /// Releases waiting to be sent.
    lane: Queue,
    /// Renewals waiting to be sent, after releases and before acquires.
    renewals: Queue,
    /// The embedder's releases that have not ended.
    releases_open: usize,
    /// What the grants this client issues carry, so that it knows them.
    issuer: Issuer,
}

impl Default for Holds {
    fn default() -> Holds {
        Holds {
            table: Table::default(),
            lane: Queue::default(),
            renewals: Queue::default(),
            releases_open: 0,
            issuer: Issuer::new(),
        }
    }
}

impl Holds {
    fn held(&self, handle: Handle) -> Option<&Held> {
        match self.table.get(handle) {
            Some(Hold::Held(held)) => Some(held),
            _ => None,
        }
    }

    fn held_mut(&mut self, handle: Handle) -> Option<&mut Held> {
        match self.table.get_mut(handle) {
            Some(Hold::Held(held)) => Some(held),
            _ => None,
        }
    }

    fn is_queued_release(table: &Table<Hold>, handle: Handle, ticket: u32) -> bool {
        matches!(table.get(handle), Some(Hold::Release(r)) if r.queued == Some(ticket))
    }

    fn is_queued_renewal(table: &Table<Hold>, handle: Handle, ticket: u32) -> bool {
        matches!(table.get(handle), Some(Hold::Held(h))
            if matches!(h.renewal, Renewal::Queued { ticket: t, .. } if t == ticket))
    }

    /// Queues a renewal of the held grant `handle` asking for `lease_ms`.
    fn queue_renewal(&mut self, handle: Handle, lease_ms: NonZeroU64, asked: Asked, join: Join) {
        let ticket = match join {
            Join::Front => self.renewals.push_front(handle),
            Join::Back => self.renewals.push_back(handle),
        };
        if let Some(held) = self.held_mut(handle) {
            held.renewal = Renewal::Queued {
                lease_ms,
                asked,
                ticket,
            };
        }
    }

    /// A renewal waiting in the lane stopped waiting (not by being sent).
    fn renewal_left(&mut self) {
        let table = &self.table;
        self.renewals
            .left(|h, t| Holds::is_queued_renewal(table, h, t));
    }

    /// A release waiting in the lane stopped waiting (not by being sent).
    fn release_left(&mut self) {
        let table = &self.table;
        self.lane.left(|h, t| Holds::is_queued_release(table, h, t));
    }

    // ----- grants ---------------------------------------------------------

    /// An acquire in flight since `sent_at` is granted: the embedder holds
    /// the grant from now on, until `valid_until` (the attempt's send time,
    /// plus how long it waited in the key's queue, plus the lease) as far
    /// as it can tell; renewed automatically for `renew` if its acquire
    /// asked for it. `None` if no record can be kept (the table is full):
    /// lease expiry then settles the grant.
    pub(crate) fn hold(
        &mut self,
        fx: &mut Fx<'_>,
        token: u64,
        lease_ms: NonZeroU64,
        waited_ms: u64,
        granted: super::acquires::Granted,
    ) -> Option<Grant> {
        let key = granted.key;
        fx.events.note(Note::GrantWaited { ms: waited_ms });
        let expires_by = expiry(fx.now, lease_ms, fx.config.settle_margin);
        let valid_until = granted
            .sent_at
            .saturating_add_millis(waited_ms)
            .saturating_add_millis(lease_ms.get());
        let handle = self.table.insert(Hold::Held(Held {
            key: key.clone(),
            token,
            valid_until,
            lease_ms,
            expires_by,
            renew_lease_ms: granted.lease_ms,
            auto_until: granted.renew.map(|limit| fx.now.saturating_add(limit)),
            renewal: Renewal::Idle,
            jeopardy: false,
            expired: false,
        }))?;
        // Its first renewal, jeopardy or expiry may be due at once.
        self.tend(fx, handle);
        Some(Grant {
            key,
            token,
            lease: millis(lease_ms.get()),
            valid_until,
            expires_by,
            handle: OpId::of(OpKind::Grant, handle),
            issuer: self.issuer,
        })
    }

    /// The record of `grant`, if this client still has one that is the
    /// embedder's (held, or lost): `Err` for a grant another client issued.
    fn find(&self, grant: &Grant) -> Result<Option<Handle>, Error> {
        if !grant.issuer.is(self.issuer) {
            return Err(Error::ForeignGrant {
                key: grant.key.clone(),
                token: grant.token,
            });
        }
        let Some((OpKind::Grant, handle)) = grant.handle.parts() else {
            return Ok(None);
        };
        Ok(match self.table.get(handle) {
            Some(Hold::Held(h)) if h.key == grant.key && h.token == grant.token => Some(handle),
            Some(Hold::Lost { key, token }) if *key == grant.key && *token == grant.token => {
                Some(handle)
            }
            _ => None,
        })
    }

    /// [`Client::valid_until`](super::Client::valid_until).
    pub(crate) fn valid_until(&self, grant: &Grant) -> Option<Time> {
        let handle = self.find(grant).ok()??;
        self.held(handle).map(|held| held.valid_until)
    }

    /// Whether `(key, token)` is a grant the embedder holds, or one whose
    /// release is under way: one the client must not release behind the
    /// embedder's back, or twice. A scan: this only runs for an answer
    /// nobody claims.
    pub(crate) fn knows(&self, key: &Key, token: u64) -> bool {
        self.table.iter().any(|(_, hold)| match hold {
            Hold::Held(h) => h.token == token && h.key == *key,
            Hold::Release(r) => r.token == token && r.key == *key,
            Hold::Lost { key: k, token: t } => *t == token && k == key,
        })
    }

    /// How many grants the embedder holds.
    pub(crate) fn held_count(&self) -> usize {
        self.table
            .iter()
            .filter(|(_, hold)| matches!(hold, Hold::Held(_)))
            .count()
    }

    /// What a held lease allows any wait of the link to last (PROTOCOL.md
    /// section 5, "A held lease shortens the wait"): while a grant is
    /// renewed automatically, or has a renewal queued or in flight, a
    /// quarter of what is left until the earliest such `valid_until`, and
    /// never less than 100 ms. A scan: it runs once per connection attempt.
    pub(crate) fn lease_cap(&self, now: Time) -> Option<Duration> {
        let earliest = self
            .table
            .iter()
            .filter_map(|(_, hold)| match hold {
                Hold::Held(held) if held.keeps_renewing() => Some(held.valid_until),
                _ => None,
            })
            .min()?;
        Some((earliest.saturating_duration_since(now) / 4).max(LEASE_CAP_FLOOR))
    }

    // ----- renewal ----------------------------------------------------------

    /// The held grant `grant` names, for a renewal command: refused while
    /// shutting down, for a grant this client does not hold (released,
    /// handed back, lost), and for one that has expired.
    fn renewable(&mut self, grant: &Grant, life: Life) -> Result<(Handle, &mut Held), Error> {
        if life != Life::Running {
            return Err(Error::ShuttingDown);
        }
        let handle = self.find(grant)?.ok_or_else(|| not_held(grant))?;
        match self.held_mut(handle) {
            Some(held) if held.expired => Err(Error::LeaseExpired {
                key: grant.key.clone(),
                token: grant.token,
            }),
            Some(held) => Ok((handle, held)),
            None => Err(not_held(grant)),
        }
    }

    /// [`Client::renew`](super::Client::renew): one renewal, asking for
    /// `lease` (default: the acquire's lease). With one already queued or
    /// in flight, nothing more is asked: at most one renewal of a grant is
    /// in flight.
    pub(crate) fn renew(
        &mut self,
        fx: &mut Fx<'_>,
        grant: &Grant,
        lease: Option<Duration>,
        life: Life,
    ) -> Result<(), Error> {
        let (handle, held) = self.renewable(grant, life)?;
        let lease_ms = match lease {
            Some(lease) => NonZeroU64::new(duration_millis(lease)).ok_or(Error::ZeroLease)?,
            None => held.renew_lease_ms,
        };
        if held.renewal == Renewal::Idle {
            self.queue_renewal(handle, lease_ms, Asked::ByEmbedder, Join::Back);
            self.tend(fx, handle);
        }
        Ok(())
    }

    /// [`Client::auto_renew`](super::Client::auto_renew) and
    /// [`Client::stop_renewing`](super::Client::stop_renewing): renewed
    /// automatically from now on, or no longer.
    pub(crate) fn auto_renew(
        &mut self,
        fx: &mut Fx<'_>,
        grant: &Grant,
        auto: AutoRenew,
        life: Life,
    ) -> Result<(), Error> {
        let now = fx.now;
        let (handle, held) = self.renewable(grant, life)?;
        match auto {
            AutoRenew::On { limit } => {
                held.auto_until = Some(limit.map_or(Time::MAX, |limit| now.saturating_add(limit)));
            }
            AutoRenew::Off => {
                held.auto_until = None;
                if let Renewal::Queued {
                    asked: Asked::BySchedule,
                    ..
                } = held.renewal
                {
                    held.renewal = Renewal::Idle;
                    self.renewal_left();
                }
            }
        }
        self.tend(fx, handle);
        Ok(())
    }

    /// Does what is due for the held grant `handle` now (see
    /// [`Held::tend`]): the notices, the lane, and its timer armed at its
    /// next moment, or its record gone.
    fn tend(&mut self, fx: &mut Fx<'_>, handle: Handle) {
        let Some(held) = self.held_mut(handle) else {
            return;
        };
        let next = held.next_moment(fx.config.answer_grace);
        if fx.now < next {
            // Nothing is due before its next moment (a fresh grant, most
            // often): only its timer is armed.
            self.table.set_timer(handle, next);
            return;
        }
        let due = held.tend(fx.now);
        let grant = OpId::of(OpKind::Grant, handle);
        let (token, valid_until) = (held.token, held.valid_until);
        let renew_lease_ms = held.renew_lease_ms;
        if due.expired {
            let key = held.key.clone();
            fx.events
                .push_back(Event::LeaseExpired { grant, key, token });
        }
        if due.jeopardy {
            fx.events.push_back(Event::LeaseJeopardy {
                grant,
                key: held.key.clone(),
                token,
                valid_until,
            });
        }
        if due.dropped {
            self.renewal_left();
        }
        if due.queued {
            self.queue_renewal(handle, renew_lease_ms, Asked::BySchedule, Join::Back);
        }
        if due.gone {
            self.table.remove(handle);
        } else if let Some(held) = self.held(handle) {
            let next = held.next_moment(fx.config.answer_grace);
            self.table.set_timer(handle, next);
        }
    }

    /// Sends the first renewal waiting in the lane as request `id`, with
    /// its answer grace armed: the grant, its key and token and the lease
    /// asked, to register as `id`. The grant's `expires_by` moves to what
    /// the renewal could give. A renewal whose grant's `valid_until` has
    /// passed is not sent: the grant is no longer renewed. `None` when none
    /// waits.
    pub(crate) fn send_renewal(
        &mut self,
        fx: &mut Fx<'_>,
        id: u64,
    ) -> Option<(Handle, Key, u64, NonZeroU64)> {
        loop {
            let table = &self.table;
            let handle = self
                .renewals
                .pop(|h, t| Holds::is_queued_renewal(table, h, t))?;
            // Popped as queued: a held grant with its renewal queued.
            let Some(held) = self.held_mut(handle) else {
                continue;
            };
            let Renewal::Queued {
                lease_ms, asked, ..
            } = held.renewal
            else {
                continue;
            };
            if fx.now >= held.valid_until {
                held.renewal = Renewal::Idle;
                self.tend(fx, handle);
                continue;
            }
            fx.events.note(Note::RenewalSent);
            held.renewal = Renewal::Sent {
                sent_at: fx.now,
                lease_ms,
                asked,
            };
            let margin = fx.config.settle_margin;
            held.expires_by = held.expires_by.max(expiry(fx.now, lease_ms, margin));
            ClientFrame::Renew {
                id,
                key: held.key.to_wire(),
                token: held.token,
                lease_ms,
            }
            .encode(fx.send);
            let sent = (handle, held.key.clone(), held.token, lease_ms);
            self.tend(fx, handle);
            return Some(sent);
        }
    }

    /// Whether the held grant `handle` waits for a renewal's answer (one
    /// given up, or expired and renewed no more since, does not).
    pub(crate) fn awaits_renewal(&self, handle: Handle) -> bool {
        self.held(handle)
            .is_some_and(|held| matches!(held.renewal, Renewal::Sent { .. }))
    }

    /// A renewal's answer, matched by id, op and key, for the record
    /// `handle`: for a held grant, `G` extends it (never past what the `G`
    /// proves: the renewal's send time plus the lease it gave) and `N`
    /// means it is lost. For a grant that is being released, has expired,
    /// or is gone, the answer is claimed and changes nothing but when the
    /// server has certainly freed it.
    pub(crate) fn renewal_answer(&mut self, fx: &mut Fx<'_>, handle: Handle, kind: AnswerKind) {
        let margin = fx.config.settle_margin;
        let now = fx.now;
        let Some(held) = self.held_mut(handle) else {
            return;
        };
        let Renewal::Sent { sent_at, .. } = held.renewal else {
            // Asked again since (the answer is of an attempt a close put
            // back, and that one is queued again): it changes nothing.
            return;
        };
        held.renewal = Renewal::Idle;
        match kind {
            AnswerKind::Renewed { lease_ms, .. } => {
                held.expires_by = held.expires_by.max(expiry(now, lease_ms, margin));
                if !held.expired {
                    let proven = sent_at.saturating_add_millis(lease_ms.get());
                    if proven > held.valid_until {
                        held.valid_until = proven;
                        held.lease_ms = lease_ms;
                    }
                    held.jeopardy = false;
                    fx.events.push_back(Event::Renewed {
                        grant: OpId::of(OpKind::Grant, handle),
                        key: held.key.clone(),
                        token: held.token,
                        valid_until: held.valid_until,
                    });
                }
                self.tend(fx, handle);
            }
            _ => self.lose(fx, handle),
        }
    }

    /// `N` to a renewal: the grant is gone. The embedder is told LeaseLost;
    /// a release of it ends NotHeld at once, until its `expires_by`.
    fn lose(&mut self, fx: &mut Fx<'_>, handle: Handle) {
        let Some(hold) = self.table.get_mut(handle) else {
            return;
        };
        let Hold::Held(held) = hold else {
            return;
        };
        let (key, token, expires_by) = (held.key.clone(), held.token, held.expires_by);
        fx.events.push_back(Event::LeaseLost {
            grant: OpId::of(OpKind::Grant, handle),
            key: key.clone(),
            token,
        });
        if fx.now >= expires_by {
            self.table.remove(handle);
        } else {
            *hold = Hold::Lost { key, token };
            self.table.set_timer(handle, expires_by);
        }
    }

    /// A renewal in flight at a close: back to the front of the lane while
    /// its grant is held and its `valid_until` has not passed, unless the
    /// client is shutting down (which stops every renewal).
    pub(crate) fn requeue_renewal(&mut self, fx: &mut Fx<'_>, handle: Handle, life: Life) {
        let now = fx.now;
        let Some(held) = self.held_mut(handle) else {
            return;
        };
        let Renewal::Sent {
            lease_ms, asked, ..
        } = held.renewal
        else {
            return;
        };
        let allowed = match asked {
            Asked::ByEmbedder => true,
            Asked::BySchedule => held.auto_until.is_some_and(|until| now < until),
        };
        held.renewal = Renewal::Idle;
        if !held.expired && now < held.valid_until && life == Life::Running && allowed {
            self.queue_renewal(handle, lease_ms, asked, Join::Front);
        }
        self.tend(fx, handle);
    }

    /// Shutting down stops every renewal: automatic renewal ends, and
    /// renewals not yet sent are dropped.
    pub(crate) fn stop_renewals(&mut self, fx: &mut Fx<'_>) {
        for handle in self.table.handles() {
            let Some(held) = self.held_mut(handle) else {
                continue;
            };
            held.auto_until = None;
            if matches!(held.renewal, Renewal::Queued { .. }) {
                held.renewal = Renewal::Idle;
                self.renewal_left();
            }
            self.tend(fx, handle);
        }
    }

    // ----- releases ---------------------------------------------------------

    /// [`Client::release`](super::Client::release). A grant already freed
    /// by lease expiry ends Lapsed at once, and one lost NotHeld at once,
    /// without a request.
    pub(crate) fn release(&mut self, fx: &mut Fx<'_>, grant: &Grant) -> Result<OpId, Error> {
        let Some(handle) = self.find(grant)? else {
            if fx.now < grant.expires_by {
                return Err(not_held(grant));
            }
            // Freed by lease expiry already: nothing to ask.
            return Ok(self.release_at_once(fx, grant, ReleaseResult::Lapsed));
        };
        if let Some(Hold::Lost { .. }) = self.table.get(handle) {
            // Its renewal was answered `N`: gone, and nothing to ask.
            self.table.remove(handle);
            return Ok(self.release_at_once(fx, grant, ReleaseResult::NotHeld));
        }
        if self.releases_open >= fx.config.max_releases {
            return Err(Error::Busy);
        }
        // The grant becomes its release, in place, and its renewal stops:
        // one not sent yet is dropped; one in flight is still claimed, by
        // its request, and changes nothing.
        let Some(hold) = self.table.get_mut(handle) else {
            return Err(not_held(grant));
        };
        let Hold::Held(held) = hold else {
            return Err(not_held(grant));
        };
        let left = held.valid_until.millis_since(fx.now);
        fx.events.note(Note::LeaseLeftAtRelease { ms: left });
        let queued_renewal = matches!(held.renewal, Renewal::Queued { .. });
        let release = Release {
            key: held.key.clone(),
            token: held.token,
            until: held.expires_by,
            attempts: 0,
            queued: None,
            by: ReleasedBy::Embedder,
        };
        *hold = Hold::Release(release);
        self.releases_open += 1;
        fx.events.note(Note::ReleaseStarted);
        if queued_renewal {
            self.renewal_left();
        }
        self.enter_lane(fx, handle);
        Ok(OpId::of(OpKind::Release, handle))
    }

    /// A release of `grant` that ends at once with `result`, without a
    /// request: counted, and given its outcome.
    fn release_at_once(&mut self, fx: &mut Fx<'_>, grant: &Grant, result: ReleaseResult) -> OpId {
        fx.events.note(Note::ReleaseStarted);
        let outcome = match result {
            ReleaseResult::NotHeld => Outcome::NotHeld,
            _ => Outcome::Lapsed,
        };
        // It still gets an id of its own, for its outcome: a record that
        // never waits, ended at once.
        let release = Release {
            key: grant.key.clone(),
            token: grant.token,
            until: fx.now,
            attempts: 0,
            queued: None,
            by: ReleasedBy::Embedder,
        };
        match self.table.insert(Hold::Release(release)) {
            Some(handle) => {
                self.releases_open += 1;
                self.end_release(fx, handle, result);
                OpId::of(OpKind::Release, handle)
            }
            None => {
                // No room for even that: the outcome goes under an id no
                // record will ever have.
                let op = OpId::of(OpKind::Release, Handle::from_parts(0, u32::MAX));
                fx.events.push_back(Event::Outcome { op, outcome });
                op
            }
        }
    }

    /// [`Client::release_token`](super::Client::release_token): a raw
    /// `(key, token)` whose lease this client never saw, tried until the
    /// release horizon.
    pub(crate) fn release_token(
        &mut self,
        fx: &mut Fx<'_>,
        key: Key,
        token: u64,
    ) -> Result<OpId, Error> {
        if self.releases_open >= fx.config.max_releases {
            return Err(Error::Busy);
        }
        let until = fx.now.saturating_add(fx.config.release_horizon);
        let handle = self
            .queue_release(fx, key, token, until, ReleasedBy::Embedder)
            .ok_or(Error::Busy)?;
        self.releases_open += 1;
        fx.events.note(Note::ReleaseStarted);
        Ok(OpId::of(OpKind::Release, handle))
    }

    /// Stores a release, its deadline armed, at the back of the lane.
    fn queue_release(
        &mut self,
        fx: &mut Fx<'_>,
        key: Key,
        token: u64,
        until: Time,
        by: ReleasedBy,
    ) -> Option<Handle> {
        let handle = self.table.insert(Hold::Release(Release {
            key,
            token,
            until,
            attempts: 0,
            queued: None,
            by,
        }))?;
        self.enter_lane(fx, handle);
        Some(handle)
    }

    /// Puts the release `handle` at the back of the lane with its deadline
    /// armed; one past its deadline (an expired grant whose renewal allowed
    /// no more) ends Lapsed at once.
    fn enter_lane(&mut self, fx: &mut Fx<'_>, handle: Handle) {
        let Some(Hold::Release(release)) = self.table.get(handle) else {
            return;
        };
        let until = release.until;
        if fx.now >= until {
            self.end_release(fx, handle, ReleaseResult::Lapsed);
            return;
        }
        self.table.set_timer(handle, until);
        let ticket = self.lane.push_back(handle);
        if let Some(Hold::Release(release)) = self.table.get_mut(handle) {
            release.queued = Some(ticket);
        }
    }

    /// Puts an exact-token release of a grant nobody can take into the
    /// lane, unless its lease has run out (the server freed it already):
    /// an undeliverable outcome, an abandoned waiter's `G`, or a `G` no
    /// pending request claimed (the caller checked that nobody holds it).
    pub(crate) fn orphan(&mut self, fx: &mut Fx<'_>, key: Key, token: u64, lease_ms: NonZeroU64) {
        let until = expiry(fx.now, lease_ms, fx.config.settle_margin);
        self.orphan_until(fx, key, token, until);
    }

    fn orphan_until(&mut self, fx: &mut Fx<'_>, key: Key, token: u64, until: Time) {
        if fx.now >= until {
            return;
        }
        fx.events.push_back(Event::OrphanRelease {
            key: key.clone(),
            token,
        });
        // A table too full for it leaves the grant to lease expiry.
        let _ = self.queue_release(fx, key, token, until, ReleasedBy::Client);
    }

    /// [`Client::undeliverable`](super::Client::undeliverable): the
    /// embedder hands a grant back; it is released by exact token (a lost
    /// one has nothing to release).
    pub(crate) fn undeliverable(&mut self, fx: &mut Fx<'_>, grant: &Grant) -> Result<(), Error> {
        match self.find(grant)? {
            Some(handle) => {
                if let Some(Hold::Held(held)) = self.table.remove(handle) {
                    if matches!(held.renewal, Renewal::Queued { .. }) {
                        self.renewal_left();
                    }
                    self.orphan_until(fx, held.key, held.token, held.expires_by);
                }
                Ok(())
            }
            None if fx.now >= grant.expires_by => Ok(()),
            None => Err(not_held(grant)),
        }
    }

    /// Sends the next attempt of the first release waiting in the lane as
    /// request `id`, with its answer grace armed: the release, to register
    /// as `id`. `None` when none waits.
    pub(crate) fn send_release(&mut self, fx: &mut Fx<'_>, id: u64) -> Option<Handle> {
        let table = &self.table;
        let handle = self
            .lane
            .pop(|h, t| Holds::is_queued_release(table, h, t))?;
        // Popped as queued: a release waiting in the lane.
        let Some(Hold::Release(release)) = self.table.get_mut(handle) else {
            return None;
        };
        // Its deadline fired before any send could get here, and only
        // releases with attempts left enter the lane.
        debug_assert!(fx.now < release.until);
        release.queued = None;
        release.attempts += 1;
        ClientFrame::Release {
            id,
            key: release.key.to_wire(),
            token: release.token,
        }
        .encode(fx.send);
        self.table
            .set_timer(handle, fx.now.saturating_add(fx.config.answer_grace));
        Some(handle)
    }

    /// What the answer to the release `handle` in flight must match.
    pub(crate) fn release_expected(&self, handle: Handle) -> Option<Expected<'_>> {
        let Some(Hold::Release(release)) = self.table.get(handle) else {
            return None;
        };
        Some(Expected {
            op: Op::Release,
            key: &release.key,
            lease_ms: u64::MAX,
            wait_ms: 0,
            token: release.token,
        })
    }

    /// `D` (Released) or `N` (NotHeld) matched to a release in flight.
    /// After an earlier lost attempt too, `N` says the grant is gone.
    pub(crate) fn release_answer(
        &mut self,
        fx: &mut Fx<'_>,
        handle: Handle,
        result: ReleaseResult,
    ) {
        self.end_release(fx, handle, result);
    }

    /// A release in flight at a close: back to the front of the lane, or
    /// ended Lapsed if no further attempt may start: after its deadline,
    /// past its attempts, or when the shutdown is ending.
    pub(crate) fn requeue_release(&mut self, fx: &mut Fx<'_>, handle: Handle, life: Life) {
        let Some(Hold::Release(release)) = self.table.get_mut(handle) else {
            return;
        };
        let until = release.until;
        let spent = fx.now >= until || release.attempts >= fx.config.release_attempts;
        if spent || life == Life::Ending {
            self.end_release(fx, handle, ReleaseResult::Lapsed);
            return;
        }
        let ticket = self.lane.push_front(handle);
        if let Some(Hold::Release(release)) = self.table.get_mut(handle) {
            release.queued = Some(ticket);
        }
        self.table.set_timer(handle, until);
    }

    /// Ends a release: an outcome for the embedder's, a notice for the
    /// client's own. The one place a release ends.
    pub(crate) fn end_release(&mut self, fx: &mut Fx<'_>, handle: Handle, result: ReleaseResult) {
        let Some(Hold::Release(release)) = self.table.remove(handle) else {
            return;
        };
        if release.queued.is_some() {
            self.release_left();
        }
        if release.by == ReleasedBy::Client {
            fx.events.push_back(Event::OrphanSettled {
                key: release.key,
                token: release.token,
                result,
            });
        } else {
            self.releases_open -= 1;
            let outcome = match result {
                ReleaseResult::Released => Outcome::Released,
                ReleaseResult::NotHeld => Outcome::NotHeld,
                ReleaseResult::Lapsed => Outcome::Lapsed,
            };
            fx.events.push_back(Event::Outcome {
                op: OpId::of(OpKind::Release, handle),
                outcome,
            });
        }
    }

    /// Whether `op` is a release under way (cancelling it changes
    /// nothing: a release is always settled).
    pub(crate) fn is_release(&self, op: OpId) -> bool {
        matches!(op.parts(), Some((OpKind::Release, h)) if matches!(self.table.get(h), Some(Hold::Release(_))))
    }

    // ----- time, and the end ------------------------------------------------

    /// Time is `now` (see [`Table::catch_up`]).
    pub(crate) fn catch_up(&mut self, now: Time) {
        self.table.catch_up(now);
    }

    /// The earliest timer; with `by`, the earliest due by then (once
    /// caught up with it).
    pub(crate) fn earliest(&self, by: Option<Time>) -> Option<Time> {
        self.table.earliest(by)
    }

    /// Fires the earliest timer if it is due at `at`: what is due for a
    /// held grant, a lost grant's `expires_by`, a queued release's deadline
    /// (Lapsed), or the answer grace of a renewal or a release in flight
    /// (the connection is unwell).
    pub(crate) fn fire(&mut self, fx: &mut Fx<'_>, at: Time) -> Result<(), Unwell> {
        let Some(handle) = self.table.pop_due(at) else {
            return Ok(());
        };
        match self.table.get(handle) {
            Some(Hold::Held(held)) if held.overdue(at, fx.config.answer_grace) => {
                return Err(Unwell)
            }
            Some(Hold::Held(_)) => self.tend(fx, handle),
            Some(Hold::Lost { .. }) => drop(self.table.remove(handle)),
            Some(Hold::Release(release)) if release.queued.is_none() => return Err(Unwell),
            Some(Hold::Release(_)) => self.end_release(fx, handle, ReleaseResult::Lapsed),
            None => {}
        }
        Ok(())
    }

    /// The shutdown ends: every release still open lapses, and the held
    /// grants are forgotten (never released behind the embedder's back).
    pub(crate) fn finish(&mut self, fx: &mut Fx<'_>) {
        for handle in self.table.handles() {
            match self.table.get(handle) {
                Some(Hold::Release(_)) => self.end_release(fx, handle, ReleaseResult::Lapsed),
                _ => drop(self.table.remove(handle)),
            }
        }
    }

    /// The embedder's releases that have not ended.
    pub(crate) fn releases_open(&self) -> usize {
        self.releases_open
    }

    /// Releases waiting in the lane.
    pub(crate) fn lane_len(&self) -> usize {
        self.lane.len()
    }

    /// Renewals waiting to be sent.
    pub(crate) fn renewals_len(&self) -> usize {
        self.renewals.len()
    }
}

/// The error for a grant the embedder no longer holds.
fn not_held(grant: &Grant) -> Error {
    Error::GrantNotHeld {
        key: grant.key.clone(),
        token: grant.token,
    }
}

#[cfg(test)]
mod tests {
    use super::super::acquires::Granted;
    use super::super::harness::{at_ms, Harness};
    use super::*;

    fn nz(ms: u64) -> NonZeroU64 {
        NonZeroU64::new(ms).expect("not zero")
    }

    /// A grant of `k` with token 9 and a lease of 900 ms, its acquire sent
    /// at 0 and answered at once; renewed automatically with no limit.
    fn held(h: &mut Harness, holds: &mut Holds, renew: bool) -> Grant {
        let granted = Granted {
            key: Key::new("k").expect("a key"),
            sent_at: h.now,
            lease_ms: nz(900),
            renew: renew.then_some(Duration::MAX),
        };
        let grant = holds.hold(&mut h.fx(), 9, nz(900), 0, granted);
        grant.expect("room for it")
    }

    /// As the client does: time catches up to `at`, then every timer due
    /// by then fires.
    fn advance(h: &mut Harness, holds: &mut Holds, at: Time) -> Result<(), Unwell> {
        h.now = at;
        holds.catch_up(at);
        while holds.earliest(Some(at)).is_some() {
            holds.fire(&mut h.fx(), at)?;
        }
        Ok(())
    }

    fn outcomes(h: &mut Harness) -> Vec<Outcome> {
        h.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Outcome { outcome, .. } => Some(outcome),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_automatic_renewal_goes_at_a_third_and_its_grant_proves_from_its_send_time() {
        let (mut h, mut holds) = (Harness::new(), Holds::default());
        let grant = held(&mut h, &mut holds, true);
        assert_eq!(grant.valid_until, at_ms(900));
        assert_eq!(
            holds.lease_cap(h.now),
            Some(millis(225)),
            "a quarter of 900 ms"
        );
        // Nothing due before a third of the lease has passed.
        assert_eq!(holds.earliest(None), Some(at_ms(300)));
        advance(&mut h, &mut holds, at_ms(299)).expect("well");
        assert_eq!(holds.renewals_len(), 0);
        advance(&mut h, &mut holds, at_ms(300)).expect("well");
        assert_eq!(holds.renewals_len(), 1);
        let (handle, key, token, lease_ms) = holds.send_renewal(&mut h.fx(), 5).expect("queued");
        assert_eq!((key.as_str(), token, lease_ms.get()), ("k", 9, 900));
        assert_eq!(h.sent(), "X 5 k 9 900\n");
        assert!(holds.awaits_renewal(handle));
        // Answered at 400: good until 300 + 900, not 400 + 900.
        h.at(400);
        let renewed = AnswerKind::Renewed {
            token: 9,
            lease_ms: nz(900),
        };
        holds.renewal_answer(&mut h.fx(), handle, renewed);
        assert_eq!(holds.valid_until(&grant), Some(at_ms(1_200)));
        assert!(matches!(h.events()[..], [Event::Renewed { token: 9, .. }]));
    }

    #[test]
    fn an_unanswered_renewal_puts_the_grant_in_jeopardy_then_expires_it() {
        let (mut h, mut holds) = (Harness::new(), Holds::default());
        h.config.answer_grace = millis(100);
        let grant = held(&mut h, &mut holds, true);
        advance(&mut h, &mut holds, at_ms(300)).expect("well");
        let (handle, ..) = holds.send_renewal(&mut h.fx(), 1).expect("queued");
        // The answer grace passes first: the connection is unwell, and the
        // close puts the renewal back at the front.
        let grace = h.now.saturating_add(h.config.answer_grace);
        assert_eq!(advance(&mut h, &mut holds, grace), Err(Unwell));
        holds.requeue_renewal(&mut h.fx(), handle, Life::Running);
        assert_eq!(holds.renewals_len(), 1);
        advance(&mut h, &mut holds, at_ms(600)).expect("well");
        let events = h.events();
        assert!(
            matches!(events[..], [Event::LeaseJeopardy { token: 9, .. }]),
            "{events:?}"
        );
        advance(&mut h, &mut holds, at_ms(900)).expect("well");
        assert!(matches!(
            h.events()[..],
            [Event::LeaseExpired { token: 9, .. }]
        ));
        assert_eq!(
            holds.renewals_len(),
            0,
            "an expired grant is renewed no more"
        );
        let renew = holds.renew(&mut h.fx(), &grant, None, Life::Running);
        assert!(matches!(renew, Err(Error::LeaseExpired { token: 9, .. })));
    }

    #[test]
    fn a_release_goes_by_exact_token_before_any_renewal_and_ends_once() {
        let (mut h, mut holds) = (Harness::new(), Holds::default());
        let grant = held(&mut h, &mut holds, true);
        advance(&mut h, &mut holds, at_ms(300)).expect("well");
        let op = holds.release(&mut h.fx(), &grant).expect("held");
        assert!(holds.is_release(op));
        // Its queued renewal left with the grant.
        assert_eq!((holds.lane_len(), holds.renewals_len()), (1, 0));
        assert!(holds.send_renewal(&mut h.fx(), 1).is_none());
        let handle = holds.send_release(&mut h.fx(), 2).expect("in the lane");
        assert_eq!(h.sent(), "R 2 k 9\n");
        let expected = holds.release_expected(handle).expect("in flight");
        assert_eq!((expected.op, expected.token), (Op::Release, 9));
        holds.release_answer(&mut h.fx(), handle, ReleaseResult::Released);
        assert_eq!(outcomes(&mut h), [Outcome::Released]);
        assert_eq!(holds.releases_open(), 0);
        // Released twice is misuse, and no request.
        assert!(matches!(
            holds.release(&mut h.fx(), &grant),
            Err(Error::GrantNotHeld { token: 9, .. })
        ));
        assert_eq!(holds.lane_len(), 0);
    }

    #[test]
    fn a_lost_grant_ends_its_release_at_once_and_another_clients_grant_is_refused() {
        let (mut h, mut holds) = (Harness::new(), Holds::default());
        let grant = held(&mut h, &mut holds, false);
        holds
            .renew(&mut h.fx(), &grant, None, Life::Running)
            .expect("held");
        let (handle, ..) = holds.send_renewal(&mut h.fx(), 1).expect("queued");
        holds.renewal_answer(&mut h.fx(), handle, AnswerKind::Gone);
        assert!(matches!(
            h.events()[..],
            [Event::LeaseLost { token: 9, .. }]
        ));
        holds
            .release(&mut h.fx(), &grant)
            .expect("lost, still known");
        assert_eq!(outcomes(&mut h), [Outcome::NotHeld]);
        assert_eq!(holds.lane_len(), 0, "nothing asked");

        let mut other = Holds::default();
        let (mut h2, theirs) = (Harness::new(), held(&mut Harness::new(), &mut other, false));
        assert!(matches!(
            holds.release(&mut h2.fx(), &theirs),
            Err(Error::ForeignGrant { token: 9, .. })
        ));
    }

    #[test]
    fn an_orphan_is_released_by_the_client_with_a_notice_unless_its_lease_ran_out() {
        let (mut h, mut holds) = (Harness::new(), Holds::default());
        holds.orphan(&mut h.fx(), Key::new("o").expect("a key"), 4, nz(500));
        assert!(matches!(
            h.events()[..],
            [Event::OrphanRelease { token: 4, .. }]
        ));
        let handle = holds.send_release(&mut h.fx(), 3).expect("in the lane");
        assert_eq!(h.sent(), "R 3 o 4\n");
        // Its attempt in flight at a close goes back to the front; once the
        // lease plus the margin has passed, it lapses.
        holds.requeue_release(&mut h.fx(), handle, Life::Running);
        assert_eq!(holds.lane_len(), 1);
        let until = h
            .now
            .saturating_add(millis(500))
            .saturating_add(h.config.settle_margin);
        advance(&mut h, &mut holds, until).expect("well");
        let events = h.events();
        let settled = Event::OrphanSettled {
            key: Key::new("o").expect("a key"),
            token: 4,
            result: ReleaseResult::Lapsed,
        };
        assert_eq!(events, [settled]);
        assert_eq!(holds.releases_open(), 0, "not the embedder's");
        // A grant handed back once the server has certainly freed it:
        // nothing to release.
        let grant = held(&mut h, &mut holds, false);
        let freed = grant.expires_by;
        advance(&mut h, &mut holds, freed).expect("well");
        assert!(matches!(
            h.events()[..],
            [Event::LeaseExpired { token: 9, .. }]
        ));
        assert_eq!(holds.undeliverable(&mut h.fx(), &grant), Ok(()));
        assert_eq!((h.events(), holds.lane_len()), (vec![], 0));
    }

    #[test]
    fn a_release_in_flight_at_a_close_lapses_once_its_attempts_are_spent() {
        let (mut h, mut holds) = (Harness::new(), Holds::default());
        let op = holds
            .release_token(&mut h.fx(), Key::new("r").expect("a key"), 7)
            .expect("room");
        for id in 0..u64::from(h.config.release_attempts) {
            let handle = holds.send_release(&mut h.fx(), id).expect("in the lane");
            holds.requeue_release(&mut h.fx(), handle, Life::Running);
        }
        assert!(!holds.is_release(op));
        assert_eq!(outcomes(&mut h), [Outcome::Lapsed]);
        assert_eq!(holds.releases_open(), 0);
    }
}
