//! The embedder's calls, each told with its result: checked by the parts
//! it concerns, the grants brought up to the call's time first where the
//! client's timers would have.

use core::fmt;
use core::time::Duration;

use super::acquires::Submission;
use super::holds::Command;
use super::releases::Returned;
use super::{ms, Checked, Checker, Invariant};
use crate::client::{AcquireOptions, Error as ClientError, Grant, OpId};
use crate::names::{Key, Name};
use crate::time::Time;

impl Checker {
    /// `acquire(now, key, owner, wait, lease)` returned `result`.
    pub fn acquire(
        &mut self,
        now: Time,
        key: &Key,
        owner: &Name,
        wait: Duration,
        lease: Duration,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "acquire");
        self.submitted_acquire(now, key, owner, wait, lease, AcquireOptions::new(), result)
    }

    /// `acquire_renewing(now, key, owner, wait, lease, limit)` returned
    /// `result`.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_renewing(
        &mut self,
        now: Time,
        key: &Key,
        owner: &Name,
        wait: Duration,
        lease: Duration,
        limit: Option<Duration>,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "acquire_renewing");
        self.timeline.write_debug(&limit);
        let options = AcquireOptions::new().renewing(limit);
        self.submitted_acquire(now, key, owner, wait, lease, options, result)
    }

    /// `acquire_with(now, key, owner, wait, lease, options)` returned
    /// `result`.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_with(
        &mut self,
        now: Time,
        key: &Key,
        owner: &Name,
        wait: Duration,
        lease: Duration,
        options: AcquireOptions,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "acquire_with");
        self.timeline.write_debug(&options);
        self.submitted_acquire(now, key, owner, wait, lease, options, result)
    }

    #[allow(clippy::too_many_arguments)]
    fn submitted_acquire(
        &mut self,
        now: Time,
        key: &Key,
        owner: &Name,
        wait: Duration,
        lease: Duration,
        options: AcquireOptions,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.timeline.write(key.as_bytes());
        self.timeline.write(owner.as_bytes());
        self.timeline.write_u64(ms(wait));
        self.timeline.write_u64(ms(lease));
        self.timeline.write_debug(result);
        let submission = Submission {
            now,
            key,
            owner,
            wait,
            lease,
            renew: options.renew,
            give_up: options.give_up_while_unreachable,
        };
        let open_elsewhere = result.as_ref().is_ok_and(|&op| self.releases.is_open(op));
        let session = self.session();
        let verdict = self.acquires.submitted(
            submission,
            result,
            self.link.misconfigured(),
            session,
            open_elsewhere,
        );
        self.timeline.judge(verdict)?;
        if let Ok(op) = result {
            self.releases.forget(*op);
        }
        Ok(())
    }

    /// What every call that gives a grant back (`release`, `undeliverable`)
    /// does first: the trace of the call, its grant and its `result`, the
    /// grants brought up to `now`; the index of the grant among the held.
    fn grant_call(
        &mut self,
        now: Time,
        call: &str,
        grant: &Grant,
        result: &dyn fmt::Debug,
    ) -> Option<usize> {
        self.timeline.tick(now, call);
        self.timeline.write_grant(grant);
        self.timeline.write_debug(result);
        self.holds.advance(now);
        self.holds.index(grant)
    }

    /// `release(now, grant)` returned `result`.
    pub fn release(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        let held = self.grant_call(now, "release", grant, result);
        let returned = Returned {
            grant,
            now,
            held: held.is_some(),
            lost: held.is_some_and(|i| self.holds.is_lost(i)),
        };
        let open_elsewhere = result.as_ref().is_ok_and(|&op| self.acquires.is_open(op));
        let session = self.session();
        let verdict = self
            .releases
            .release(&returned, result, session, open_elsewhere);
        self.timeline.judge(verdict)?;
        if let Ok(op) = result {
            if let Some(i) = held {
                self.holds.give_up(i, self.timeline.now());
            }
            self.acquires.forget(*op);
        }
        Ok(())
    }

    /// `release_token(now, key, token)` returned `result`.
    pub fn release_token(
        &mut self,
        now: Time,
        key: &Key,
        token: u64,
        result: &Result<OpId, ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "release_token");
        self.timeline.write(key.as_bytes());
        self.timeline.write_u64(token);
        self.timeline.write_debug(result);
        let open_elsewhere = result.as_ref().is_ok_and(|&op| self.acquires.is_open(op));
        let session = self.session();
        let verdict = self
            .releases
            .release_token(key, token, result, session, open_elsewhere);
        self.timeline.judge(verdict)?;
        if let Ok(op) = result {
            self.acquires.forget(*op);
        }
        Ok(())
    }

    /// `cancel(now, op)` returned `result`.
    pub fn cancel(&mut self, now: Time, op: OpId, result: &Result<(), ClientError>) -> Checked {
        self.timeline.tick(now, "cancel");
        self.timeline.write_u64(op.get());
        self.timeline.write_debug(result);
        let open = self.acquires.is_open(op) || self.releases.is_open(op);
        let cancelled = self.acquires.cancel(op, open, result);
        self.timeline.judge(cancelled)
    }

    /// `undeliverable(now, grant)` returned `result`.
    pub fn undeliverable(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        let held = self.grant_call(now, "undeliverable", grant, result);
        let returned = Returned {
            grant,
            now,
            held: held.is_some(),
            lost: held.is_some_and(|i| self.holds.is_lost(i)),
        };
        let session = self.session();
        let verdict = self.releases.undeliverable(&returned, result, session);
        self.timeline.judge(verdict)?;
        if let (Ok(()), Some(i)) = (result, held) {
            let given = self.holds.give_up(i, self.timeline.now());
            // A lost grant, or one freed already, has nothing to release.
            if !given.freed {
                self.releases
                    .orphan(given.key, given.token, given.lease_end);
            }
        }
        Ok(())
    }

    /// `renew(now, grant, lease)` returned `result`.
    pub fn renew(
        &mut self,
        now: Time,
        grant: &Grant,
        lease: Option<Duration>,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "renew");
        self.timeline.write_debug(&lease);
        self.renewal_command(Command::Renew(lease), now, grant, result)
    }

    /// `auto_renew(now, grant, limit)` returned `result`.
    pub fn auto_renew(
        &mut self,
        now: Time,
        grant: &Grant,
        limit: Option<Duration>,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "auto_renew");
        self.timeline.write_debug(&limit);
        self.renewal_command(Command::AutoRenew(limit), now, grant, result)
    }

    /// `stop_renewing(now, grant)` returned `result`.
    pub fn stop_renewing(
        &mut self,
        now: Time,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "stop_renewing");
        self.renewal_command(Command::StopRenewing, now, grant, result)
    }

    fn renewal_command(
        &mut self,
        command: Command,
        now: Time,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.write_grant(grant);
        self.timeline.write_debug(result);
        let (at, session, alive) = (self.timeline.now(), self.session(), self.link.alive());
        let verdict = self
            .holds
            .command(command, now, at, grant, result, session, alive);
        if let Some(owed) = self.timeline.judge(verdict)? {
            self.timeline.owe_close(owed);
        }
        Ok(())
    }

    /// A call (`release`, `undeliverable`, `renew`, `auto_renew`,
    /// `stop_renewing`, by `call`) was made with a grant that another
    /// client issued, and returned `result`: it must be refused with
    /// `ForeignGrant` naming that grant (or, once shut down, as any call
    /// then is), and change nothing: no action and no event may follow
    /// until the step ends. The driver fires the timers due first.
    pub fn foreign(
        &mut self,
        now: Time,
        call: &'static str,
        grant: &Grant,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "foreign");
        self.timeline.write(call.as_bytes());
        self.timeline.write_grant(grant);
        self.timeline.write_debug(result);
        let session = self.session();
        let refused = self.timeline.foreign(call, grant, result, session);
        self.timeline.judge(refused)?;
        self.stats.foreign_refused += 1;
        Ok(())
    }

    /// `shutdown(now, budget)` returned `result`.
    pub fn shutdown(
        &mut self,
        now: Time,
        budget: Duration,
        result: &Result<(), ClientError>,
    ) -> Checked {
        self.timeline.tick(now, "shutdown");
        self.timeline.write_u64(ms(budget));
        self.timeline.write_debug(result);
        match result {
            Ok(()) if self.shutdown.is_none() => {
                self.shutdown = Some(now.saturating_add(budget));
                self.holds.stop_renewals(now);
                Ok(())
            }
            Ok(()) => self
                .timeline
                .fail(Invariant::Protocol, "a second shutdown accepted"),
            Err(ClientError::ShuttingDown) if self.shutdown.is_some() => Ok(()),
            Err(e) => self
                .timeline
                .fail(Invariant::Protocol, format!("shutdown refused: {e}")),
        }
    }
}
