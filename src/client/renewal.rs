//! Renewal (PROTOCOL.md section 5, "Renewal"): a held grant outlives its
//! lease by `X`, by its exact token; who renews and when; what a renewal's
//! answers, a close and the passing of time mean for the grant; and what
//! the embedder is told: Renewed, LeaseJeopardy, LeaseLost, LeaseExpired.
//!
//! A held grant keeps one timer, armed at the next moment something is due
//! for it ([`Client::tend`]): its renewal by the schedule, its jeopardy,
//! the end of its automatic renewal, its expiry, its renewal's answer
//! grace, and once expired its `expires_by`, when the record goes.

use core::num::NonZeroU64;
use core::time::Duration;

use super::lane::expiry;
use super::operations::{Held, Hold, Renewal};
use super::outcome::{CloseReason, Error, Event, Grant, OpId, OpKind};
use super::store::Handle;
use super::Client;
use crate::time::{duration_millis, Time};
use crate::wire::AnswerKind;

impl Held {
    /// `thirds` thirds of the grant's lease, in whole nanoseconds rounded
    /// down. Each is computed on its own: twice a rounded third can be a
    /// nanosecond short of two thirds rounded (200 ms is 66,666,666 ns
    /// twice, but 133,333,333 ns as two thirds).
    fn thirds(&self, thirds: u64) -> u64 {
        let nanos = u128::from(self.lease_ms.get()) * 1_000_000 * u128::from(thirds) / 3;
        u64::try_from(nanos).unwrap_or(u64::MAX)
    }

    /// When an automatically renewed grant is renewed: once less than two
    /// thirds of its lease is left before `valid_until`, from the first
    /// nanosecond that is so.
    fn renew_at(&self) -> Time {
        self.valid_until.saturating_sub_nanos(self.thirds(2))
    }

    /// When it is in jeopardy: once less than a third of its lease is left.
    fn jeopardy_at(&self) -> Time {
        self.valid_until.saturating_sub_nanos(self.thirds(1))
    }

    /// The next moment something is due for the grant: the earliest at
    /// which [`Client::tend`] has anything to do.
    fn next_moment(&self, answer_grace: Duration) -> Time {
        debug_assert!(
            !(self.expired && self.auto_until.is_some()),
            "an expired grant is not renewed"
        );
        let mut at = Time::MAX;
        if let Renewal::Sent { sent_at, .. } = self.renewal {
            at = at.min(sent_at.saturating_add(answer_grace));
        }
        if self.expired {
            // The record goes once the server has certainly freed the
            // grant, unless a renewal in flight still needs it.
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
}

impl Client {
    /// How long the grant of `acquire` is to be renewed automatically, if
    /// its acquire asked for that: taken out, the acquire having ended.
    pub(crate) fn take_renew_on_grant(&mut self, acquire: Handle) -> Option<Duration> {
        // Most acquires ask for none: no lookup then.
        if self.renew_on_grant.is_empty() {
            return None;
        }
        self.renew_on_grant.remove(&acquire)
    }

    /// The held grant `grant` names, for a renewal command: refused if this
    /// client is shutting down, does not hold it (released, handed back,
    /// lost), or it has expired.
    fn renewable(&self, grant: &Grant) -> Result<Handle, Error> {
        if self.is_finished() {
            return Err(Error::Finished);
        }
        if self.shutdown.is_some() {
            return Err(Error::ShuttingDown);
        }
        let handle = self.held(grant)?.ok_or_else(|| Client::not_held(grant))?;
        match self.holds.get(handle) {
            Some(Hold::Held(held)) if held.expired => Err(Error::LeaseExpired {
                key: grant.key.clone(),
                token: grant.token,
            }),
            Some(Hold::Held(_)) => Ok(handle),
            _ => Err(Client::not_held(grant)),
        }
    }

    /// [`Client::renew`]: one renewal, asking for `lease` (default: the
    /// acquire's lease). With one already queued or in flight, nothing
    /// more is asked: at most one renewal of a grant is in flight.
    pub(crate) fn submit_renew(
        &mut self,
        grant: &Grant,
        lease: Option<Duration>,
    ) -> Result<(), Error> {
        let handle = self.renewable(grant)?;
        let lease_ms = match lease {
            Some(lease) => NonZeroU64::new(duration_millis(lease)).ok_or(Error::ZeroLease)?,
            None => {
                self.holds
                    .get(handle)
                    .and_then(Hold::held)
                    .expect("held")
                    .renew_lease_ms
            }
        };
        let held = self
            .holds
            .get_mut(handle)
            .and_then(Hold::held_mut)
            .expect("held");
        if held.renewal == Renewal::Idle {
            held.renewal = Renewal::Queued {
                lease_ms,
                auto: false,
            };
            self.renewals.push_back(handle);
            self.tend(handle);
        }
        Ok(())
    }

    /// [`Client::auto_renew`]: renewed automatically from now on, for at
    /// most `limit` from now (`None`: with no limit), or, with `on` false,
    /// no longer (a queued automatic renewal is dropped).
    pub(crate) fn set_auto_renew(
        &mut self,
        grant: &Grant,
        on: bool,
        limit: Option<Duration>,
    ) -> Result<(), Error> {
        let handle = self.renewable(grant)?;
        let until = limit.map_or(Time::MAX, |limit| self.now.saturating_add(limit));
        let held = self
            .holds
            .get_mut(handle)
            .and_then(Hold::held_mut)
            .expect("held");
        if on {
            held.auto_until = Some(until);
        } else {
            held.auto_until = None;
            self.drop_automatic_renewal(handle);
        }
        self.tend(handle);
        Ok(())
    }

    /// [`Client::valid_until`].
    pub(crate) fn current_valid_until(&self, grant: &Grant) -> Option<Time> {
        let handle = self.held(grant).ok()??;
        self.holds
            .get(handle)
            .and_then(Hold::held)
            .map(|held| held.valid_until)
    }

    /// Starts automatic renewal of a grant just taken, as its acquire
    /// asked: for at most `limit` from now.
    pub(crate) fn renew_from_now(&mut self, handle: Handle, limit: Duration) {
        let until = self.now.saturating_add(limit);
        if let Some(held) = self.holds.get_mut(handle).and_then(Hold::held_mut) {
            held.auto_until = Some(until);
        }
    }

    /// Drops a held grant's queued renewal if the schedule asked for it.
    fn drop_automatic_renewal(&mut self, handle: Handle) {
        let held = self
            .holds
            .get_mut(handle)
            .and_then(Hold::held_mut)
            .expect("held");
        if let Renewal::Queued { auto: true, .. } = held.renewal {
            held.renewal = Renewal::Idle;
            self.renewals.forget(&self.holds, Hold::is_queued_renewal);
        }
    }

    /// Does what is due for the held grant `handle` now, in order: its
    /// expiry (told LeaseExpired; renewal stops), the end of its automatic
    /// renewal, its jeopardy (told LeaseJeopardy once), its renewal by the
    /// schedule (into the lane), and once expired and certainly freed, its
    /// record going; then arms its timer at the next moment.
    pub(crate) fn tend(&mut self, handle: Handle) {
        let now = self.now;
        let grant = OpId::of(OpKind::Grant, handle);
        let Some(held) = self.holds.get_mut(handle).and_then(Hold::held_mut) else {
            return;
        };
        let next = held.next_moment(self.config.answer_grace);
        if now < next {
            // Nothing below is due before the next moment (a fresh grant,
            // most often): only its timer is armed.
            self.holds.set_timer(handle, next);
            return;
        }
        if let Renewal::Sent { sent_at, .. } = held.renewal {
            if now >= sent_at.saturating_add(self.config.answer_grace) {
                // As for a release: the connection or the server is unwell.
                // The close puts the renewal back, and tends the grant.
                self.close(CloseReason::AnswerTimeout);
                return;
            }
        }
        let held = self
            .holds
            .get_mut(handle)
            .and_then(Hold::held_mut)
            .expect("held");
        if !held.expired && now >= held.valid_until {
            held.expired = true;
            held.auto_until = None;
            let event = Event::LeaseExpired {
                grant,
                key: held.key.clone(),
                token: held.token,
            };
            self.events.push_back(event);
            if matches!(held.renewal, Renewal::Queued { .. }) {
                held.renewal = Renewal::Idle;
                self.renewals.forget(&self.holds, Hold::is_queued_renewal);
            }
        }
        let held = self
            .holds
            .get_mut(handle)
            .and_then(Hold::held_mut)
            .expect("held");
        if held.auto_until.is_some_and(|until| now >= until) {
            // No renewal by the schedule after the limit.
            held.auto_until = None;
            self.drop_automatic_renewal(handle);
        }
        let held = self
            .holds
            .get_mut(handle)
            .and_then(Hold::held_mut)
            .expect("held");
        if held.auto_until.is_some() {
            if !held.jeopardy && now >= held.jeopardy_at() {
                held.jeopardy = true;
                let event = Event::LeaseJeopardy {
                    grant,
                    key: held.key.clone(),
                    token: held.token,
                    valid_until: held.valid_until,
                };
                self.events.push_back(event);
            }
            let held = self
                .holds
                .get_mut(handle)
                .and_then(Hold::held_mut)
                .expect("held");
            if held.renewal == Renewal::Idle && now >= held.renew_at() {
                held.renewal = Renewal::Queued {
                    lease_ms: held.renew_lease_ms,
                    auto: true,
                };
                self.renewals.push_back(handle);
            }
        }
        let held = self.holds.get(handle).and_then(Hold::held).expect("held");
        let freed = held.expired && now >= held.expires_by;
        if freed && !matches!(held.renewal, Renewal::Sent { .. }) {
            self.holds.remove(handle);
            return;
        }
        let at = held.next_moment(self.config.answer_grace);
        self.holds.set_timer(handle, at);
    }

    /// A renewal's answer, matched by id, op and key, for the grant record
    /// `handle`: for a held grant, `G` extends it (never past what the `G`
    /// proves: the renewal's send time plus the lease it gave) and `N` means
    /// it is lost; a renewal of a grant that is being released, has
    /// expired, or was given up is claimed and changes nothing.
    pub(crate) fn on_renewal_answer(&mut self, handle: Handle, kind: AnswerKind) {
        let margin = self.config.settle_margin;
        let now = self.now;
        match self.holds.get_mut(handle) {
            Some(Hold::Held(held)) => {
                let Renewal::Sent { sent_at, .. } = held.renewal else {
                    unreachable!("a renewal in flight");
                };
                held.renewal = Renewal::Idle;
                match kind {
                    AnswerKind::Renewed { lease_ms, .. } if !held.expired => {
                        let proven = sent_at.saturating_add_millis(lease_ms.get());
                        if proven > held.valid_until {
                            held.valid_until = proven;
                            held.lease_ms = lease_ms;
                        }
                        held.expires_by = held.expires_by.max(expiry(now, lease_ms, margin));
                        held.jeopardy = false;
                        let event = Event::Renewed {
                            grant: OpId::of(OpKind::Grant, handle),
                            key: held.key.clone(),
                            token: held.token,
                            valid_until: held.valid_until,
                        };
                        self.events.push_back(event);
                        self.tend(handle);
                    }
                    AnswerKind::Renewed { lease_ms, .. } => {
                        held.expires_by = held.expires_by.max(expiry(now, lease_ms, margin));
                        self.tend(handle);
                    }
                    AnswerKind::Gone => self.lose(handle),
                    _ => unreachable!("matched as a renewal"),
                }
            }
            Some(Hold::Release(release)) => release.renewal_sent = false,
            Some(Hold::Claimed { .. }) => {
                self.holds.remove(handle);
            }
            Some(Hold::Lost { .. }) | None => unreachable!("a renewal in flight keeps its grant"),
        }
    }

    /// `N` to a renewal: the grant is gone. The embedder is told LeaseLost;
    /// a release of it ends NotHeld at once, until its `expires_by`. An
    /// answer that comes after that (the record was kept for it) leaves no
    /// record: the server has freed the grant by then anyway.
    fn lose(&mut self, handle: Handle) {
        let now = self.now;
        let hold = self.holds.get_mut(handle).expect("held");
        let Hold::Held(held) = hold else {
            unreachable!("a held grant's renewal");
        };
        let (key, token, expires_by) = (held.key.clone(), held.token, held.expires_by);
        *hold = Hold::Lost {
            key: key.clone(),
            token,
            expires_by,
        };
        self.events.push_back(Event::LeaseLost {
            grant: OpId::of(OpKind::Grant, handle),
            key,
            token,
        });
        if now >= expires_by {
            self.holds.remove(handle);
        } else {
            self.holds.set_timer(handle, expires_by);
        }
    }

    /// A renewal in flight at a close: back to the front of the lane while
    /// its grant is held and its `valid_until` has not passed, unless the
    /// client is shutting down (which stops every renewal); a renewal of a
    /// grant given up meanwhile is forgotten with it.
    pub(crate) fn requeue_renewal(&mut self, handle: Handle) {
        let now = self.now;
        let shutting_down = self.shutdown.is_some();
        match self.holds.get_mut(handle) {
            Some(Hold::Held(held)) => {
                let Renewal::Sent { lease_ms, auto, .. } = held.renewal else {
                    unreachable!("a renewal in flight");
                };
                let allowed = !auto || held.auto_until.is_some_and(|until| now < until);
                if !held.expired && now < held.valid_until && !shutting_down && allowed {
                    held.renewal = Renewal::Queued { lease_ms, auto };
                    self.renewals.push_front(handle);
                } else {
                    held.renewal = Renewal::Idle;
                }
                self.tend(handle);
            }
            Some(Hold::Release(release)) => release.renewal_sent = false,
            Some(Hold::Claimed { .. }) => {
                self.holds.remove(handle);
            }
            Some(Hold::Lost { .. }) | None => {}
        }
    }

    /// Shutting down stops every renewal: automatic renewal ends, and
    /// renewals not yet sent are dropped.
    pub(crate) fn stop_renewals(&mut self) {
        for handle in self.holds.handles() {
            let Some(held) = self.holds.get_mut(handle).and_then(Hold::held_mut) else {
                continue;
            };
            held.auto_until = None;
            if matches!(held.renewal, Renewal::Queued { .. }) {
                held.renewal = Renewal::Idle;
                self.renewals.forget(&self.holds, Hold::is_queued_renewal);
            }
            self.tend(handle);
        }
    }
}
