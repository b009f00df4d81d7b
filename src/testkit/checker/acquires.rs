//! The acquires (PROTOCOL.md section 5): what the embedder asked, each
//! attempt sent with what is left of its wait budget, never sent again
//! unless answered `B` (invariant 3), the answer matched to it, cancels,
//! the attempts in flight at a close (each owed an Indeterminate), and the
//! outcome each history allows (invariants 1 and 2).
//!
//! The harness must give every acquire its own owner: that is how an `A`
//! frame is mapped to its operation ([`Acquires::attempt`]).

use core::time::Duration;
use std::collections::BTreeMap;

use super::holds::NewGrant;
use super::invariant::{breach, Verdict};
use super::ledger::Ledger;
use super::{ms, Invariant, Session};
use crate::client::{CloseReason, Config, Error as ClientError, OpId, Outcome};
use crate::names::{Key, Name};
use crate::time::Time;
use crate::wire::AnswerKind;

/// The answer matched to an acquire's latest attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answered {
    Granted {
        token: u64,
        lease_ms: u64,
        waited_ms: u64,
        at: Time,
        sent_at: Time,
    },
    TimedOut,
    Busy,
}

struct Acquire {
    key: String,
    lease_ms: u64,
    wait: Duration,
    submitted: Time,
    attempts: u32,
    /// An attempt was handed out and no answer to it was read.
    unanswered: bool,
    sent_at: Time,
    /// The `wait_ms` of the latest attempt.
    wire_wait_ms: u64,
    last: Option<Answered>,
    cancel_requested: bool,
    /// Asked with `acquire_renewing`: renewed automatically for at most this
    /// long from the grant (`Duration::MAX`: no limit).
    renew: Option<Duration>,
    /// Gives up at once while the client is unreachable.
    give_up: bool,
}

/// An acquire the embedder asked for: `acquire(now, key, owner, wait,
/// lease)`, or `acquire_renewing` (`renew`: the limit, `Duration::MAX` for
/// none).
pub(super) struct Submission<'a> {
    pub(super) now: Time,
    pub(super) key: &'a Key,
    pub(super) owner: &'a Name,
    pub(super) wait: Duration,
    pub(super) lease: Duration,
    pub(super) renew: Option<Duration>,
    /// Whether it gives up while unreachable (`None`: as configured).
    pub(super) give_up: Option<bool>,
}

/// Where the connection stood as the checker saw it when an acquire ended.
pub(super) struct Standing<'a> {
    /// The time of the step.
    pub(super) now: Time,
    /// How the latest attempt to connect ended, since the last `W`.
    pub(super) last_end: Option<&'a CloseReason>,
    /// Every server of the last round refused the client.
    pub(super) misconfigured: bool,
    /// The last round failed at every address, with no `W` since.
    pub(super) unreachable: bool,
}

/// An `A` as sent.
pub(super) struct Attempt<'a> {
    pub(super) key: &'a str,
    pub(super) owner: &'a str,
    pub(super) wait_ms: u64,
    pub(super) lease_ms: u64,
}

/// What an answer to an acquire's attempt leaves the embedder with.
pub(super) enum Matched {
    /// Nothing held: `T`, `B`, or an answer that changes nothing.
    Nothing,
    /// A `G` to an acquire that has ended (an abandoned waiter): released
    /// by its exact token, unless the client knows it (a server that
    /// repeats a token of a grant the embedder holds, or one being
    /// released). The server frees it at `lease_end` at the latest.
    Orphan {
        key: String,
        token: u64,
        lease_end: Time,
    },
    /// A `G` that the embedder holds from now on.
    Held(NewGrant),
}

pub(super) struct Acquires {
    ops: Ledger<Acquire>,
    /// Every owner submitted, to the acquire it was given to.
    owners: BTreeMap<String, OpId>,
    /// Acquires in flight on a connection that closed, not ended yet: each
    /// must end Indeterminate in the step.
    in_doubt: Vec<OpId>,
    /// The acquires the client takes at most (`max_acquires`).
    capacity: usize,
    queue_grace: Duration,
    settle_margin: Duration,
    /// `Config::give_up_while_unreachable`.
    give_up: bool,
}

impl Acquires {
    pub(super) fn new(config: &Config) -> Acquires {
        Acquires {
            ops: Ledger::new(),
            owners: BTreeMap::new(),
            in_doubt: Vec::new(),
            capacity: config.max_acquires,
            queue_grace: config.queue_grace,
            settle_margin: config.settle_margin,
            give_up: config.give_up_while_unreachable,
        }
    }

    pub(super) fn has(&self, op: OpId) -> bool {
        self.ops.has(op)
    }

    pub(super) fn is_open(&self, op: OpId) -> bool {
        self.ops.is_open(op)
    }

    /// Forgets acquire `op`, ended: its id names a release now.
    pub(super) fn forget(&mut self, op: OpId) {
        self.ops.forget(op);
    }

    /// Acquires taken and not ended.
    pub(super) fn open(&self) -> usize {
        self.ops.open_count()
    }

    /// The first acquire not ended, by id.
    pub(super) fn first_open(&self) -> Option<OpId> {
        self.ops.first_open()
    }

    /// Acquires taken, ended or not.
    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }

    /// `acquire` or `acquire_renewing` returned `result`, while every
    /// server refuses the client or not (`misconfigured`); `open_elsewhere`
    /// if a release still open has the id it gave.
    pub(super) fn submitted(
        &mut self,
        s: Submission<'_>,
        result: &Result<OpId, ClientError>,
        misconfigured: Option<&CloseReason>,
        session: Session,
        open_elsewhere: bool,
    ) -> Verdict {
        match result {
            Ok(_) if misconfigured.is_some() => breach(
                Invariant::Protocol,
                "an acquire taken while every server refuses the client",
            ),
            Ok(op) => {
                if self.owners.contains_key(s.owner.as_str()) {
                    return breach(
                        Invariant::Protocol,
                        format!("harness error: owner {} used twice", s.owner),
                    );
                }
                self.ops.fresh(*op, "acquire", open_elsewhere)?;
                if ms(s.lease) == 0 {
                    return breach(Invariant::Protocol, "an acquire with a zero lease accepted");
                }
                self.owners.insert(s.owner.as_str().to_owned(), *op);
                self.ops.insert(
                    *op,
                    Acquire {
                        key: s.key.as_str().to_owned(),
                        lease_ms: ms(s.lease),
                        wait: s.wait,
                        submitted: s.now,
                        attempts: 0,
                        unanswered: false,
                        sent_at: s.now,
                        wire_wait_ms: 0,
                        last: None,
                        cancel_requested: false,
                        renew: s.renew,
                        give_up: s.give_up.unwrap_or(self.give_up),
                    },
                );
                Ok(())
            }
            Err(ClientError::Busy) => {
                let open = self.open();
                if open < self.capacity {
                    return breach(
                        Invariant::Protocol,
                        format!(
                            "acquire refused Busy with {open} acquires open, capacity {}",
                            self.capacity
                        ),
                    );
                }
                Ok(())
            }
            Err(ClientError::ZeroLease) if ms(s.lease) == 0 => Ok(()),
            Err(ClientError::ShuttingDown | ClientError::Finished) if session.shutting => Ok(()),
            Err(ClientError::Misconfigured(cause)) if misconfigured == Some(cause) => Ok(()),
            Err(e) => breach(Invariant::Protocol, format!("acquire refused: {e}")),
        }
    }

    /// `cancel(op)` returned `result`, while an operation with that id,
    /// of either kind, is open or not (`open`): accepted only then (a
    /// release ignores it).
    pub(super) fn cancel(
        &mut self,
        op: OpId,
        open: bool,
        result: &Result<(), ClientError>,
    ) -> Verdict {
        match result {
            Ok(()) if open => {
                if let Some(entry) = self.ops.get_mut(op) {
                    entry.op.cancel_requested = true;
                }
                Ok(())
            }
            Ok(()) => breach(
                Invariant::OneOutcome,
                format!("cancel of {op} accepted though it has ended"),
            ),
            Err(ClientError::UnknownOperation(_)) => Ok(()),
            Err(e) => breach(Invariant::Protocol, format!("cancel of {op} refused: {e}")),
        }
    }

    /// An `A` went out (`text`) at `now`: the acquire its owner
    /// names may send it (invariant 3: never again unless answered `B`),
    /// and it asks what is left of the wait budget, before the acquire's
    /// last moment. The acquire, and whether this attempt is a retry.
    pub(super) fn attempt(
        &mut self,
        sent: &Attempt<'_>,
        now: Time,
        text: &str,
    ) -> Verdict<(OpId, bool)> {
        let Some(&op) = self.owners.get(sent.owner) else {
            return breach(
                Invariant::Protocol,
                format!("{text}: no acquire was submitted with owner {}", sent.owner),
            );
        };
        let entry = self.ops.get_mut(op).expect("owners map to acquires");
        let a = &mut entry.op;
        if let Some(outcome) = &entry.outcome {
            return breach(
                Invariant::NoResend,
                format!("{text}: {op} already ended {outcome:?}"),
            );
        }
        if a.unanswered {
            return breach(
                Invariant::NoResend,
                format!("{text}: an earlier attempt of {op} is still unanswered"),
            );
        }
        if a.attempts > 0 && a.last != Some(Answered::Busy) {
            let last = a.last;
            return breach(
                Invariant::NoResend,
                format!("{text}: {op} was sent before, and its answer was {last:?}, not B"),
            );
        }
        let budget_end = a.submitted.saturating_add(a.wait);
        let expected_wait = ms(budget_end.saturating_duration_since(now));
        let send_by = if a.attempts == 0 {
            budget_end.max(a.submitted.saturating_add(self.queue_grace))
        } else {
            budget_end
        };
        let problem = if sent.key != a.key || sent.lease_ms != a.lease_ms {
            Some(format!("{op} asked for {} with {} ms", a.key, a.lease_ms))
        } else if sent.wait_ms != expected_wait {
            Some(format!(
                "wait_ms should be what is left of the budget, {expected_wait}"
            ))
        } else if now >= send_by {
            Some(format!("sent at or after its last moment {send_by}"))
        } else {
            None
        };
        if let Some(problem) = problem {
            return breach(Invariant::Protocol, format!("{text}: {problem}"));
        }
        let retry = a.attempts > 0;
        a.attempts += 1;
        a.unanswered = true;
        a.sent_at = now;
        a.wire_wait_ms = sent.wait_ms;
        a.last = None;
        Ok((op, retry))
    }

    /// The `wait_ms` the latest attempt of acquire `op` was sent with.
    pub(super) fn wire_wait_ms(&self, op: OpId) -> u64 {
        self.ops.get(op).map_or(u64::MAX, |e| e.op.wire_wait_ms)
    }

    /// The answer to an attempt of acquire `op` for `key`, matched at
    /// `now`.
    pub(super) fn matched(
        &mut self,
        op: OpId,
        key: String,
        kind: AnswerKind,
        now: Time,
    ) -> Matched {
        let Some(entry) = self.ops.get_mut(op) else {
            return Matched::Nothing;
        };
        let abandoned = entry.outcome.is_some();
        let acq = &mut entry.op;
        acq.unanswered = false;
        match kind {
            AnswerKind::Granted {
                token,
                lease_ms,
                waited_ms,
            } => {
                if abandoned {
                    let lease = Duration::from_millis(lease_ms.get());
                    let lease_end = now.saturating_add(lease);
                    return Matched::Orphan {
                        key,
                        token,
                        lease_end,
                    };
                }
                let waited_ms = waited_ms.unwrap_or(0);
                let sent_at = acq.sent_at;
                acq.last = Some(Answered::Granted {
                    token,
                    lease_ms: lease_ms.get(),
                    waited_ms,
                    at: now,
                    sent_at,
                });
                return Matched::Held(NewGrant {
                    key,
                    token,
                    lease_ms: lease_ms.get(),
                    waited_ms,
                    sent_at,
                    renew_lease_ms: acq.lease_ms,
                    renew: acq.renew,
                });
            }
            AnswerKind::TimedOut if !abandoned => acq.last = Some(Answered::TimedOut),
            AnswerKind::Busy if !abandoned => acq.last = Some(Answered::Busy),
            _ => {}
        }
        Matched::Nothing
    }

    /// An attempt of acquire `op` was in flight on a connection that
    /// closed: unless it has ended, it must end Indeterminate in the step.
    pub(super) fn in_doubt(&mut self, op: OpId) {
        if let Some(entry) = self.ops.get_mut(op) {
            if entry.outcome.is_none() {
                self.in_doubt.push(op);
            }
        }
    }

    /// Acquire `op` ended in `outcome`, while shutting down or not, the
    /// connection standing as `link` says: the outcome must fit the answer
    /// matched (invariant 2) and its history.
    pub(super) fn end(
        &mut self,
        op: OpId,
        outcome: &Outcome,
        session: Session,
        link: &Standing<'_>,
    ) -> Verdict {
        let last_end = link.last_end;
        self.ops.unended(op, outcome)?;
        let Some(entry) = self.ops.get(op) else {
            unreachable!("the router hands the acquires only their own operations");
        };
        let a = &entry.op;
        let problem: Option<(Invariant, String)> = match outcome {
            Outcome::Granted(g) => match a.last {
                Some(Answered::Granted {
                    token,
                    lease_ms,
                    waited_ms,
                    at,
                    sent_at,
                }) => {
                    let lease = Duration::from_millis(lease_ms);
                    let proven = sent_at
                        .saturating_add(Duration::from_millis(waited_ms))
                        .saturating_add(lease);
                    if g.valid_until() != proven {
                        Some((
                            Invariant::Renewal,
                            format!("{g:?}: valid until {}, but the G read proves {proven} (sent at {sent_at}, waited {waited_ms} ms, lease {lease_ms} ms)", g.valid_until()),
                        ))
                    } else if g.key().as_str() != a.key
                        || g.token() != token
                        || g.lease() != lease
                        || g.expires_by()
                            != at.saturating_add(lease).saturating_add(self.settle_margin)
                    {
                        Some((
                            Invariant::Attribution,
                            format!("{g:?} does not match the G read for it: token {token}, lease {lease_ms} ms at {at}"),
                        ))
                    } else {
                        None
                    }
                }
                last => Some((
                    Invariant::Attribution,
                    format!("Granted {g:?}, but the answer matched to it was {last:?}"),
                )),
            },
            Outcome::TimedOut { sent: true, cause } => {
                if a.last != Some(Answered::TimedOut) {
                    Some((
                        Invariant::Attribution,
                        format!("TimedOut, but the answer matched to it was {:?}", a.last),
                    ))
                } else {
                    cause.as_ref().map(|cause| {
                        (
                            Invariant::Protocol,
                            format!("TimedOut after a T, with a cause ({cause})"),
                        )
                    })
                }
            }
            Outcome::TimedOut { sent: false, cause } => {
                let last_moment = a.submitted.saturating_add(a.wait.max(self.queue_grace));
                let gave_up = a.give_up && link.unreachable;
                if a.attempts > 0 {
                    Some((
                        Invariant::Protocol,
                        format!("TimedOut as never sent, after {} attempts", a.attempts),
                    ))
                } else if cause.as_ref() != last_end {
                    Some((
                        Invariant::Protocol,
                        format!(
                            "TimedOut as never sent with cause {cause:?}, but the latest attempt ended {last_end:?}"
                        ),
                    ))
                } else if link.now < last_moment && !link.misconfigured && !gave_up {
                    // Timers fire by the step's time: ended before its last
                    // moment for sure, with nothing that ends it early.
                    Some((
                        Invariant::Protocol,
                        format!(
                            "TimedOut as never sent by {}, before its last moment {last_moment}, though the client was neither refused by every server nor unreachable with an acquire that gives up (gives up: {})",
                            link.now, a.give_up
                        ),
                    ))
                } else {
                    None
                }
            }
            Outcome::Busy => (a.last != Some(Answered::Busy) || a.unanswered).then(|| {
                (
                    Invariant::Attribution,
                    format!("Busy, but the answer matched to it was {:?}", a.last),
                )
            }),
            Outcome::Cancelled => {
                if a.unanswered {
                    Some((
                        Invariant::Protocol,
                        "Cancelled (nothing asked) although a request of it is unanswered".into(),
                    ))
                } else if !a.cancel_requested && !session.shutting {
                    Some((Invariant::Protocol, "Cancelled without a cancel".into()))
                } else {
                    None
                }
            }
            Outcome::Indeterminate { settles_by } => {
                let lease = Duration::from_millis(a.lease_ms);
                if !a.unanswered {
                    Some((
                        Invariant::Protocol,
                        format!(
                            "Indeterminate, but no request of it is unanswered (last answer {:?})",
                            a.last
                        ),
                    ))
                } else if *settles_by
                    < a.sent_at
                        .saturating_add(Duration::from_millis(a.wire_wait_ms))
                        .saturating_add(lease)
                {
                    // A grant, if any, was made by sent_at + wait_ms at the
                    // latest, and lasts the lease.
                    Some((
                        Invariant::Protocol,
                        format!(
                            "Indeterminate settles by {settles_by}, before a grant made by {} + {} ms with a lease of {} ms could run out",
                            a.sent_at, a.wire_wait_ms, a.lease_ms
                        ),
                    ))
                } else {
                    None
                }
            }
            other => Some((Invariant::Protocol, format!("{other:?} for an acquire"))),
        };
        if let Some((invariant, detail)) = problem {
            return breach(invariant, format!("{op}: {detail}"));
        }
        if let Outcome::Indeterminate { .. } = outcome {
            self.in_doubt.retain(|&o| o != op);
        }
        self.ops.end(op, outcome);
        Ok(())
    }

    /// At the end of a step, while every server refuses the client or not
    /// (`misconfigured`), and while it is unreachable or not: no acquire
    /// waits for a connection while every server refuses the client, and
    /// none that gives up while it is unreachable.
    pub(super) fn none_waiting(&self, misconfigured: bool, unreachable: bool) -> Verdict {
        let waiting =
            |a: &Acquire| a.attempts == 0 && (misconfigured || (unreachable && a.give_up));
        match self.ops.open().find(|(_, a)| waiting(a)) {
            Some((op, _)) if misconfigured => breach(
                Invariant::Protocol,
                format!("{op} waits for a connection while every server refuses the client"),
            ),
            Some((op, _)) => breach(
                Invariant::Protocol,
                format!("{op} gives up while unreachable, and waits for a connection though the last round failed at every address"),
            ),
            None => Ok(()),
        }
    }

    /// At the end of a step: every acquire in flight at a close has ended
    /// Indeterminate (invariant 1).
    pub(super) fn none_in_doubt(&self) -> Verdict {
        match self.in_doubt.first() {
            Some(op) => breach(
                Invariant::OneOutcome,
                format!(
                    "{op} was in flight on a connection that closed, and did not end Indeterminate"
                ),
            ),
            None => Ok(()),
        }
    }

    /// At the end of a step: every acquire answered `G` or `T` has its
    /// outcome (invariant 1).
    pub(super) fn answered_ended(&self) -> Verdict {
        for (op, a) in self.ops.open() {
            if matches!(a.last, Some(Answered::Granted { .. } | Answered::TimedOut)) {
                return breach(
                    Invariant::OneOutcome,
                    format!("{op} was answered {:?} and has no outcome", a.last),
                );
            }
        }
        Ok(())
    }
}
