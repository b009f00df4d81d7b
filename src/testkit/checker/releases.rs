//! Releases (PROTOCOL.md section 5, "The reserved release lane", and the
//! rows on a Granted outcome the embedder cannot take and on answers
//! nobody claims): the embedder's, by grant or by raw `(key, token)`, and
//! the client's own for orphaned grants (invariant 5), each by its exact
//! token; the answers matched to them, and the outcomes those answers
//! allow.
//!
//! A grant the client must release by itself is an *obligation*: it must
//! be put into the release lane in the step it arises
//! ([`Releases::all_announced`]), and an `R` for it must go out unless its
//! lease runs out first ([`Releases::check_released`],
//! [`Releases::all_released`], [`Releases::settled`]). An `R` goes only
//! for a release under way, never for a grant the embedder holds
//! ([`Releases::sent`]; but see the limits in the checker's
//! documentation).

use std::collections::BTreeMap;

use super::invariant::{breach, Verdict};
use super::ledger::Ledger;
use super::{Invariant, Session};
use crate::client::{Error as ClientError, Grant, OpId, Outcome, ReleaseResult};
use crate::names::Key;
use crate::time::Time;

/// A grant by its key and token.
type Grip = (String, u64);

/// A release; `lost` when its grant's renewal was answered `N`: it ends
/// NotHeld at once, with no request.
struct Release {
    key: String,
    token: u64,
    lost: bool,
}

/// A grant the client must release by itself.
struct Obligation {
    key: String,
    token: u64,
    /// When the server has freed it at the latest (answer time plus lease).
    lease_end: Time,
    /// The client announced it with `OrphanRelease`.
    announced: bool,
    /// An `R` for it went out after it arose.
    r_sent: bool,
    settled: bool,
}

/// A grant the embedder gives back (`release`, `undeliverable`), as the
/// client must have it at the call.
#[derive(Clone, Copy)]
pub(super) struct Returned<'a> {
    pub(super) grant: &'a Grant,
    /// The call's time.
    pub(super) now: Time,
    /// The client still has the grant (held, or lost).
    pub(super) held: bool,
    /// Its renewal was answered `N`: its release ends NotHeld at once.
    pub(super) lost: bool,
}

pub(super) struct Releases {
    ops: Ledger<Release>,
    /// Releases under way (the embedder's and the client's own), by grant.
    under_way: BTreeMap<Grip, u32>,
    /// Matched `D` and `N` answers not yet claimed by an outcome.
    answers: BTreeMap<Grip, (u32, u32)>,
    obligations: Vec<Obligation>,
    /// The releases the client takes at most (`max_releases`).
    capacity: usize,
}

impl Releases {
    pub(super) fn new(capacity: usize) -> Releases {
        Releases {
            ops: Ledger::new(),
            under_way: BTreeMap::new(),
            answers: BTreeMap::new(),
            obligations: Vec::new(),
            capacity,
        }
    }

    pub(super) fn has(&self, op: OpId) -> bool {
        self.ops.has(op)
    }

    pub(super) fn is_open(&self, op: OpId) -> bool {
        self.ops.is_open(op)
    }

    /// Forgets release `op`, ended: its id names an acquire now.
    pub(super) fn forget(&mut self, op: OpId) {
        self.ops.forget(op);
    }

    /// Releases taken and not ended.
    pub(super) fn open(&self) -> usize {
        self.ops.open_count()
    }

    /// The first release not ended, by id.
    pub(super) fn first_open(&self) -> Option<OpId> {
        self.ops.first_open()
    }

    /// Releases taken, ended or not.
    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Grants the client had to release by itself.
    pub(super) fn obligations(&self) -> usize {
        self.obligations.len()
    }

    /// Whether every release has ended, the client's own included.
    pub(super) fn is_settled(&self) -> bool {
        self.ops.first_open().is_none() && self.obligations.iter().all(|o| o.settled)
    }

    /// Whether the client is at its capacity of releases.
    pub(super) fn full(&self) -> bool {
        self.open() >= self.capacity
    }

    /// Whether a release of `(key, token)` is under way.
    pub(super) fn releasing(&self, key: &str, token: u64) -> bool {
        self.under_way
            .get(&(key.to_owned(), token))
            .is_some_and(|&n| n > 0)
    }

    fn open_release(&mut self, key: &str, token: u64) {
        *self.under_way.entry((key.to_owned(), token)).or_default() += 1;
    }

    fn close_release(&mut self, key: &str, token: u64) -> Verdict {
        match self.under_way.get_mut(&(key.to_owned(), token)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Ok(())
            }
            _ => breach(
                Invariant::Protocol,
                format!("a release of ({key}, {token}) ended that was not under way"),
            ),
        }
    }

    /// Release `op` of `(key, token)` was taken (`lost`: its grant's
    /// renewal was answered `N`, nothing to send); `open_elsewhere` if an
    /// acquire still open has its id.
    pub(super) fn register(
        &mut self,
        op: OpId,
        key: &str,
        token: u64,
        lost: bool,
        open_elsewhere: bool,
    ) -> Verdict {
        self.ops.fresh(op, "release", open_elsewhere)?;
        self.ops.insert(
            op,
            Release {
                key: key.to_owned(),
                token,
                lost,
            },
        );
        if !lost {
            self.open_release(key, token);
        }
        Ok(())
    }

    /// `release(grant)` returned `result`; `open_elsewhere` if an acquire
    /// still open has the id it gave. A grant the client no longer has is
    /// released only once it has expired.
    pub(super) fn release(
        &mut self,
        returned: &Returned<'_>,
        result: &Result<OpId, ClientError>,
        session: Session,
        open_elsewhere: bool,
    ) -> Verdict {
        let Returned {
            grant,
            now,
            held,
            lost,
        } = *returned;
        let (key, token) = (grant.key().as_str(), grant.token());
        match result {
            Ok(op) => {
                if !held && now < grant.expires_by() {
                    return breach(
                        Invariant::Protocol,
                        format!("release of ({key}, {token}) accepted though it is not held"),
                    );
                }
                self.register(*op, key, token, lost, open_elsewhere)
            }
            Err(ClientError::GrantNotHeld { .. }) if !held => Ok(()),
            Err(ClientError::Busy) if self.full() && !lost => Ok(()),
            Err(ClientError::Finished) if session.shutting => Ok(()),
            Err(e) => breach(
                Invariant::Protocol,
                format!("release of ({key}, {token}) refused: {e}"),
            ),
        }
    }

    /// `undeliverable(grant)` returned `result`: accepted for a grant the
    /// client has (which it must release by itself), or once the grant has
    /// expired; refused only as not held, or once shut down for good.
    pub(super) fn undeliverable(
        &self,
        returned: &Returned<'_>,
        result: &Result<(), ClientError>,
        session: Session,
    ) -> Verdict {
        let Returned {
            grant, now, held, ..
        } = *returned;
        let (key, token) = (grant.key().as_str(), grant.token());
        match result {
            Ok(()) if held || now >= grant.expires_by() => Ok(()),
            Ok(()) => breach(
                Invariant::Protocol,
                format!("undeliverable ({key}, {token}) accepted though it is not held"),
            ),
            Err(ClientError::GrantNotHeld { .. }) if !held => Ok(()),
            // Shut down for good: no connection is left to release on, and
            // lease expiry frees the grant.
            Err(ClientError::Finished) if session.shutting => Ok(()),
            Err(e) => breach(
                Invariant::OrphanRelease,
                format!("undeliverable ({key}, {token}) refused ({e}): the grant would never be released"),
            ),
        }
    }

    /// `release_token(key, token)` returned `result`; `open_elsewhere` if
    /// an acquire still open has the id it gave.
    pub(super) fn release_token(
        &mut self,
        key: &Key,
        token: u64,
        result: &Result<OpId, ClientError>,
        session: Session,
        open_elsewhere: bool,
    ) -> Verdict {
        match result {
            Ok(op) => self.register(*op, key.as_str(), token, false, open_elsewhere),
            Err(ClientError::Busy) if self.full() => Ok(()),
            Err(ClientError::Finished) if session.shutting => Ok(()),
            Err(e) => breach(
                Invariant::Protocol,
                format!("release_token({key}, {token}) refused: {e}"),
            ),
        }
    }

    /// A grant of `(key, token)` that the client must release by itself,
    /// freed by the server at `lease_end` at the latest.
    pub(super) fn orphan(&mut self, key: String, token: u64, lease_end: Time) {
        self.open_release(&key, token);
        self.obligations.push(Obligation {
            key,
            token,
            lease_end,
            announced: false,
            r_sent: false,
            settled: false,
        });
    }

    /// An `R` of `(key, token)` went out (`text`), while the embedder holds
    /// that grant or not (`held`): only for a release under way, never
    /// behind the embedder's back.
    pub(super) fn sent(&mut self, key: &str, token: u64, held: bool, text: &str) -> Verdict {
        if !self.releasing(key, token) {
            if held {
                return breach(
                    Invariant::OrphanRelease,
                    format!("{text} releases a grant the embedder holds, behind its back"),
                );
            }
            return breach(
                Invariant::Protocol,
                format!("{text}: no release of ({key}, {token}) is under way"),
            );
        }
        for o in &mut self.obligations {
            if o.key == key && o.token == token && !o.settled {
                o.r_sent = true;
            }
        }
        Ok(())
    }

    /// The answer to an `R` of `(key, token)` was matched: `D` if
    /// `released`, else `N`.
    pub(super) fn answered(&mut self, key: String, token: u64, released: bool) {
        if let Some(n) = self.under_way.get_mut(&(key.clone(), token)) {
            *n = n.saturating_sub(1);
        }
        let entry = self.answers.entry((key, token)).or_default();
        if released {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }

    /// Claims a matched `D` (`released`) or `N` of `(key, token)` for an
    /// outcome: `false` if there is none.
    fn consume_answer(&mut self, key: &str, token: u64, released: bool) -> bool {
        let Some(entry) = self.answers.get_mut(&(key.to_owned(), token)) else {
            return false;
        };
        let count = if released { &mut entry.0 } else { &mut entry.1 };
        if *count == 0 {
            return false;
        }
        *count -= 1;
        true
    }

    /// `OrphanRelease` for `(key, token)`, while the embedder holds that
    /// grant or not (`held`): a grant must have called for it.
    pub(super) fn announced(&mut self, key: &str, token: u64, held: bool) -> Verdict {
        match self
            .obligations
            .iter()
            .position(|o| o.key == key && o.token == token && !o.announced)
        {
            Some(i) => {
                self.obligations[i].announced = true;
                Ok(())
            }
            None if held => breach(
                Invariant::OrphanRelease,
                format!("release of ({key}, {token}) queued while the embedder holds it"),
            ),
            None => breach(
                Invariant::Protocol,
                format!("release of ({key}, {token}) queued, but no grant called for one"),
            ),
        }
    }

    /// `OrphanSettled` for `(key, token)` with `result`, at `now`.
    pub(super) fn settled(
        &mut self,
        key: &str,
        token: u64,
        result: ReleaseResult,
        now: Time,
        session: Session,
    ) -> Verdict {
        let Some(i) = self
            .obligations
            .iter()
            .position(|o| o.key == key && o.token == token && o.announced && !o.settled)
        else {
            return breach(
                Invariant::Protocol,
                format!("({key}, {token}) settled {result:?}, but no release of it was under way"),
            );
        };
        self.obligations[i].settled = true;
        match result {
            ReleaseResult::Released | ReleaseResult::NotHeld => {
                let released = result == ReleaseResult::Released;
                if !self.consume_answer(key, token, released) {
                    return breach(
                        Invariant::Attribution,
                        format!("({key}, {token}) settled {result:?} without a matching answer"),
                    );
                }
                Ok(())
            }
            _ => {
                self.close_release(key, token)?;
                let o = &self.obligations[i];
                if !o.r_sent && now < o.lease_end && !session.shutting {
                    return breach(
                        Invariant::OrphanRelease,
                        format!(
                            "the release of ({key}, {token}) lapsed without ever being sent, its lease running until {}",
                            o.lease_end
                        ),
                    );
                }
                Ok(())
            }
        }
    }

    /// Release `op` ended in `outcome`: the outcome must fit the answers
    /// matched (invariant 2) and its history.
    pub(super) fn end(&mut self, op: OpId, outcome: &Outcome) -> Verdict {
        self.ops.unended(op, outcome)?;
        let Some(entry) = self.ops.get(op) else {
            unreachable!("the router hands a release only its own operations");
        };
        let Release { key, token, lost } = &entry.op;
        let (key, token, lost) = (key.clone(), *token, *lost);
        let problem = match outcome {
            Outcome::NotHeld if lost => None,
            other if lost => Some((
                Invariant::Protocol,
                format!("{other:?} for the release of a grant whose renewal was answered N: NotHeld at once"),
            )),
            Outcome::Released | Outcome::NotHeld => {
                let released = matches!(outcome, Outcome::Released);
                if self.consume_answer(&key, token, released) {
                    None
                } else {
                    Some((
                        Invariant::Attribution,
                        format!("{outcome:?} for the release of ({key}, {token}) without a matching answer"),
                    ))
                }
            }
            Outcome::Lapsed => {
                self.close_release(&key, token)?;
                None
            }
            other => Some((Invariant::Protocol, format!("{other:?} for a release"))),
        };
        if let Some((invariant, detail)) = problem {
            return breach(invariant, format!("{op}: {detail}"));
        }
        self.ops.end(op, outcome);
        Ok(())
    }

    /// At the end of every step: every grant the client must release by
    /// itself was put into the release lane.
    pub(super) fn all_announced(&self) -> Verdict {
        match self.obligations.iter().find(|o| !o.announced) {
            Some(o) => breach(
                Invariant::OrphanRelease,
                format!(
                    "a grant of ({}, {}) that nobody can take was not put into the release lane",
                    o.key, o.token
                ),
            ),
            None => Ok(()),
        }
    }

    /// Every grant the client had to release by itself was sent an `R` by
    /// `now`, or its lease has run out.
    pub(super) fn check_released(&self, now: Time) -> Verdict {
        match self
            .obligations
            .iter()
            .find(|o| !o.r_sent && now < o.lease_end)
        {
            Some(o) => breach(
                Invariant::OrphanRelease,
                format!(
                    "({}, {}) has not been released although the client was connected and idle; its lease runs until {}",
                    o.key, o.token, o.lease_end
                ),
            ),
            None => Ok(()),
        }
    }

    /// At the end of a run, at `now`: every grant the client had to
    /// release by itself was released by its exact token, unless its lease
    /// ran out or the shutdown's budget ended first.
    pub(super) fn all_released(&self, now: Time) -> Verdict {
        match self
            .obligations
            .iter()
            .find(|o| !o.r_sent && !o.settled && now < o.lease_end)
        {
            Some(o) => breach(
                Invariant::OrphanRelease,
                format!(
                    "({}, {}) was never released, and its lease runs until {}",
                    o.key, o.token, o.lease_end
                ),
            ),
            None => Ok(()),
        }
    }
}
