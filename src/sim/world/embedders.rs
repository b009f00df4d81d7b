//! What the workload's embedders ask of their clients: each command is
//! one checked step of the client's, and the ground truth learns what it
//! started.

use core::time::Duration;

use super::{Ev, Step, World};
use crate::client::{Error as ClientError, Grant, OpId};
use crate::names::{Key, Name};
use crate::sim::check::OpInfo;
use crate::sim::net::MAX_DELAY;
use crate::sim::workload::{self, Command, RenewHow};
use crate::time::Time;

/// The longest a request and its answer take on the simulated network:
/// [`MAX_DELAY`] each way at most (a longer partition cuts the
/// connection).
const ROUND_TRIP: Duration = MAX_DELAY.saturating_mul(2);

impl World {
    /// Carries out what client `c`'s embedder does, in order: each command
    /// is one checked step.
    pub(super) fn embedder_effects(&mut self, c: usize, effects: Vec<workload::Effect>) -> Step {
        for effect in effects {
            match effect {
                workload::Effect::At(at, ev) => self.schedule(at, Ev::Workload(ev)),
                workload::Effect::Write { key, token } => {
                    if let Err(failure) = self.ledger.write(c, &key, token, self.now) {
                        return Err(self.failure(failure));
                    }
                }
                workload::Effect::Command(command) => self.command(c, command)?,
            }
        }
        Ok(())
    }

    /// Gives client `c` a command of its embedder's.
    fn command(&mut self, c: usize, command: Command) -> Step {
        match command {
            Command::Acquire {
                key,
                owner,
                wait,
                lease,
                renew,
            } => self.cmd_acquire(c, key, owner, wait, lease, renew),
            Command::Renew(grant, how) => self.cmd_renew(c, &grant, how),
            Command::Cancel(op) => self.cmd_cancel(c, op),
            Command::Release(grant) => self.cmd_release(c, &grant),
            Command::Undeliverable(grant) => self.cmd_undeliverable(c, &grant),
            Command::Shutdown(budget) => self.cmd_shutdown(c, budget),
        }
    }

    fn cmd_acquire(
        &mut self,
        c: usize,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        renew: Option<Option<Duration>>,
    ) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let (result, checked) = match renew {
            None => {
                let result = slot
                    .client
                    .acquire(now, key.clone(), owner.clone(), wait, lease);
                let checked = slot
                    .checker
                    .acquire(now, &key, &owner, wait, lease, &result);
                (result, checked)
            }
            Some(limit) => {
                let result = slot.client.acquire_renewing(
                    now,
                    key.clone(),
                    owner.clone(),
                    wait,
                    lease,
                    limit,
                );
                let checked = slot
                    .checker
                    .acquire_renewing(now, &key, &owner, wait, lease, limit, &result);
                (result, checked)
            }
        };
        if let Err(v) = checked {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| {
            format!("c{c} acquire {key} as {owner} wait {wait:?} lease {lease:?} renew {renew:?}: {result:?}")
        });
        match result {
            Ok(op) => {
                if let Some(limit) = renew {
                    self.failovers.acquired(c, op, limit);
                }
                let grace = self.clients[c].op_grace;
                self.ledger.owner(c, owner.as_str().to_owned(), op);
                self.ledger.op_started(
                    c,
                    op,
                    OpInfo {
                        what: format!(
                            "acquire {key} waiting {} ms for a lease of {} ms",
                            wait.as_millis(),
                            lease.as_millis()
                        ),
                        submitted: now,
                        deadline: now.saturating_add(wait + lease + grace),
                    },
                );
                self.workload.acquired(c, op, renew.is_some());
            }
            Err(ClientError::Busy) => self.ops.refused += 1,
            Err(_) => {}
        }
        self.end_client_step(c)
    }

    fn cmd_release(&mut self, c: usize, grant: &Grant) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let result = slot.client.release(now, grant);
        if let Err(v) = slot.checker.release(now, grant, &result) {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| format!("c{c} release {} {}: {result:?}", grant.key(), grant.token()));
        self.ledger.unhold(c, grant.key(), grant.token(), now);
        self.failovers.given_up(c, grant.key(), grant.token());
        // A renewed grant's release keeps trying until the latest end its
        // renewals could give it (plus the margin), and the renewal's
        // answer may come a round trip later than its send.
        let renewed_until = self.clients[c]
            .renewal_ends
            .remove(&(grant.key().clone(), grant.token()))
            .map(|end| end.saturating_add(ROUND_TRIP));
        if let Ok(op) = result {
            let grace = self.clients[c].op_grace;
            let deadline = now
                .saturating_add(grant.lease())
                .max(renewed_until.unwrap_or(Time::ZERO))
                .saturating_add(grace);
            self.ledger.op_started(
                c,
                op,
                OpInfo {
                    what: format!(
                        "release ({}, {}) of a lease of {} ms",
                        grant.key(),
                        grant.token(),
                        grant.lease().as_millis()
                    ),
                    submitted: now,
                    deadline,
                },
            );
            self.clients[c].release_ops.insert(op, grant.token());
            let grace = self.clients[c].release_grace;
            self.ledger
                .release_started(c, grant.token(), now, self.heal_at, grace);
        }
        self.end_client_step(c)
    }

    fn cmd_undeliverable(&mut self, c: usize, grant: &Grant) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let result = slot.client.undeliverable(now, grant);
        if let Err(v) = slot.checker.undeliverable(now, grant, &result) {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| {
            format!(
                "c{c} undeliverable {} {}: {result:?}",
                grant.key(),
                grant.token()
            )
        });
        self.ledger.unhold(c, grant.key(), grant.token(), now);
        self.failovers.given_up(c, grant.key(), grant.token());
        self.end_client_step(c)
    }

    fn cmd_renew(&mut self, c: usize, grant: &Grant, how: RenewHow) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let (result, checked) = match how {
            RenewHow::Manual { lease } => {
                let result = slot.client.renew(now, grant, lease);
                let checked = slot.checker.renew(now, grant, lease, &result);
                (result, checked)
            }
            RenewHow::Auto { limit } => {
                let result = slot.client.auto_renew(now, grant, limit);
                let checked = slot.checker.auto_renew(now, grant, limit, &result);
                (result, checked)
            }
            RenewHow::Stop => {
                let result = slot.client.stop_renewing(now, grant);
                let checked = slot.checker.stop_renewing(now, grant, &result);
                (result, checked)
            }
        };
        if let Err(v) = checked {
            return Err(self.checker_violation(c, v));
        }
        self.ops.renew_calls += 1;
        self.note(|| format!("c{c} {how:?} {} {}: {result:?}", grant.key(), grant.token()));
        if result.is_ok() {
            let (key, token) = (grant.key(), grant.token());
            match how {
                RenewHow::Auto { limit } => {
                    let core = self.clients[c].client.core();
                    if let Some(valid_until) = core.valid_until(grant) {
                        self.failovers
                            .auto_renew(c, key, token, valid_until, limit, now);
                    }
                }
                RenewHow::Stop => self.failovers.given_up(c, key, token),
                RenewHow::Manual { .. } => {}
            }
        }
        self.end_client_step(c)
    }

    fn cmd_cancel(&mut self, c: usize, op: OpId) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let result = slot.client.cancel(now, op);
        if let Err(v) = slot.checker.cancel(now, op, &result) {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| format!("c{c} cancel {op}: {result:?}"));
        self.end_client_step(c)
    }

    fn cmd_shutdown(&mut self, c: usize, budget: Duration) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let result = slot.client.shutdown(now, budget);
        if let Err(v) = slot.checker.shutdown(now, budget, &result) {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| format!("c{c} shutdown within {budget:?}: {result:?}"));
        if result.is_ok() {
            self.ledger
                .shutdown_started(c, now, now.saturating_add(budget));
            self.failovers.shutdown(c);
        }
        self.end_client_step(c)
    }

    /// The embedder of `c` was handed `grant`: it holds it, checked for
    /// mutual exclusion.
    pub(super) fn hold(&mut self, c: usize, grant: &Grant) -> Step {
        let (key, token) = (grant.key(), grant.token());
        match self
            .ledger
            .hold(c, key, token, grant.valid_until(), self.now)
        {
            Ok(()) => Ok(()),
            Err(failure) => Err(self.failure(failure)),
        }
    }
}
