//! Operations of one kind by id, each with its outcome once told: where
//! invariant 1 (exactly one outcome) is kept for each operation. The
//! acquires and the releases each keep one; an id names one operation at a
//! time, of either kind, which the router keeps ([`Ledger::fresh`] is told
//! whether the other kind has it open, and an ended one of the other kind
//! is forgotten when the id is taken again).

use std::collections::BTreeMap;

use super::invariant::{breach, Verdict};
use super::Invariant;
use crate::client::{OpId, Outcome};

/// An operation and its outcome, once told.
pub(super) struct Entry<T> {
    pub(super) op: T,
    pub(super) outcome: Option<Outcome>,
}

pub(super) struct Ledger<T> {
    ops: BTreeMap<OpId, Entry<T>>,
}

impl<T> Ledger<T> {
    pub(super) fn new() -> Ledger<T> {
        Ledger {
            ops: BTreeMap::new(),
        }
    }

    /// Whether `op` may name a new operation (a `what`): no open one has
    /// it, here or (`open_elsewhere`) in the other kind's ledger.
    pub(super) fn fresh(&self, op: OpId, what: &str, open_elsewhere: bool) -> Verdict {
        if self.is_open(op) || open_elsewhere {
            return breach(
                Invariant::OneOutcome,
                format!("{op} handed out for a new {what} while still open"),
            );
        }
        Ok(())
    }

    /// Takes `op` for `record`, replacing an ended one.
    pub(super) fn insert(&mut self, op: OpId, record: T) {
        self.ops.insert(
            op,
            Entry {
                op: record,
                outcome: None,
            },
        );
    }

    /// Forgets `op` (taken by an operation of the other kind).
    pub(super) fn forget(&mut self, op: OpId) {
        self.ops.remove(&op);
    }

    pub(super) fn get(&self, op: OpId) -> Option<&Entry<T>> {
        self.ops.get(&op)
    }

    pub(super) fn get_mut(&mut self, op: OpId) -> Option<&mut Entry<T>> {
        self.ops.get_mut(&op)
    }

    pub(super) fn has(&self, op: OpId) -> bool {
        self.ops.contains_key(&op)
    }

    /// Whether `op` is here, without its outcome yet.
    pub(super) fn is_open(&self, op: OpId) -> bool {
        self.ops.get(&op).is_some_and(|e| e.outcome.is_none())
    }

    /// A second outcome for `op` breaks invariant 1.
    pub(super) fn unended(&self, op: OpId, outcome: &Outcome) -> Verdict {
        match self.ops.get(&op).and_then(|e| e.outcome.as_ref()) {
            Some(first) => breach(
                Invariant::OneOutcome,
                format!("a second outcome for {op}: {outcome:?} after {first:?}"),
            ),
            None => Ok(()),
        }
    }

    /// Records `op`'s outcome.
    pub(super) fn end(&mut self, op: OpId, outcome: &Outcome) {
        if let Some(e) = self.ops.get_mut(&op) {
            e.outcome = Some(outcome.clone());
        }
    }

    /// The open operations, by id.
    pub(super) fn open(&self) -> impl Iterator<Item = (OpId, &T)> {
        self.ops
            .iter()
            .filter(|(_, e)| e.outcome.is_none())
            .map(|(&op, e)| (op, &e.op))
    }

    pub(super) fn open_count(&self) -> usize {
        self.open().count()
    }

    /// The first open operation, by id.
    pub(super) fn first_open(&self) -> Option<OpId> {
        self.open().map(|(op, _)| op).next()
    }

    /// Operations taken and not forgotten, ended or not.
    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }
}
