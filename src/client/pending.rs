//! The requests in flight on the connection, by id, each with what its
//! answer must match (PROTOCOL.md section 5: "matching an answer", "when
//! to register", "an answer whose id no pending request holds", "an
//! answer whose id is pending but op or key differ", the `waited_ms` row).
//!
//! An entry is registered before its request's bytes exist, and carries
//! everything its answer is checked against: the op, the key, and what the
//! answer may not exceed or must repeat. So the operation it belongs to may
//! end, and its record go, while the request is still in flight: the
//! answer is still claimed here, and handed to an owner that may no longer
//! know it.

use core::num::NonZeroU64;

use super::outcome::Violation;
use super::store::Handle;
use crate::hash::IdMap;
use crate::names::Key;
use crate::wire::{Answer, AnswerKind, Op};

/// Whose request it is: the part and the record that sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// An attempt of the acquire `Handle`; once its operation ended while
    /// it was in flight (cancelled under `KeepWaiter`, shut down),
    /// `abandoned`, and the handle is its waiter's: its answer is claimed,
    /// and a grant it brings released.
    Acquire { acquire: Handle, abandoned: bool },
    /// An attempt of the release `Handle`.
    Release(Handle),
    /// A renewal of the held grant `Handle`.
    Renewal(Handle),
}

/// What the answer to a request in flight must say.
#[derive(Debug)]
pub(crate) struct Expect {
    pub(crate) owner: Owner,
    /// The key the request named (an acquire's and a release's travel with
    /// their request while it is in flight, and come back with its answer).
    pub(crate) key: Key,
    /// The token: of a release or a renewal (an acquire's is 0).
    pub(crate) token: u64,
    /// The lease asked: of an acquire or a renewal (a release's is 0).
    pub(crate) lease_ms: u64,
    /// The `wait_ms` sent: of an acquire.
    pub(crate) wait_ms: u64,
}

impl Expect {
    /// The op its answer must name.
    fn op(&self) -> Op {
        match self.owner {
            Owner::Acquire { .. } => Op::Acquire,
            Owner::Release(_) => Op::Release,
            Owner::Renewal(_) => Op::Renew,
        }
    }

    /// Why `answer` cannot be this request's, if it cannot: another op or
    /// key, a longer lease than asked (`leased`: when the lease matters),
    /// a `G` to an acquire that does not say how long it waited or says it
    /// waited longer than it was sent with, a renewal answered for another
    /// token.
    fn refuses(&self, id: u64, answer: &Answer<'_>, leased: bool) -> Option<Violation> {
        if self.op() != answer.op() || !self.key.is(answer.key.as_bytes()) {
            return Some(Violation::Mismatch { id });
        }
        match answer.kind {
            AnswerKind::Granted { lease_ms, .. } | AnswerKind::Renewed { lease_ms, .. }
                if leased && lease_ms.get() > self.lease_ms =>
            {
                Some(Violation::LeaseAboveAsked { id })
            }
            AnswerKind::Granted {
                waited_ms: None, ..
            } => Some(Violation::WaitedMissing { id }),
            AnswerKind::Granted {
                waited_ms: Some(waited),
                ..
            } if waited > self.wait_ms => Some(Violation::WaitedAboveAsked { id }),
            AnswerKind::Renewed { token, .. } if token != self.token => {
                Some(Violation::TokenMismatch { id })
            }
            _ => None,
        }
    }
}

/// The requests in flight.
pub(crate) struct Pending {
    entries: IdMap<u64, Expect>,
    /// The id of the next request: one more than the last, never reused.
    next_id: u64,
    /// How many of the entries are acquires.
    acquires: usize,
}

impl Default for Pending {
    fn default() -> Pending {
        Pending {
            entries: IdMap::default(),
            next_id: 1,
            acquires: 0,
        }
    }
}

impl Pending {
    /// The id the next request registered gets.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Registers the next request, with what its answer must match; its
    /// id is [`Pending::next_id`]'s.
    pub(crate) fn register(&mut self, expect: Expect) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.insert(id, expect);
        id
    }

    fn insert(&mut self, id: u64, expect: Expect) {
        if matches!(expect.owner, Owner::Acquire { .. }) {
            self.acquires += 1;
        }
        self.entries.insert(id, expect);
    }

    /// Matches an answer by id, op and key, never by order: the entry it
    /// answers, taken out; else the violation, and the entry (if any) stays
    /// in flight, to be treated as sent and unanswered by the close. The
    /// lease a `G` gives is held to what was asked unless `claimed_only`
    /// says its owner no longer waits for it (a renewal of a grant given
    /// up: its answer changes nothing).
    pub(crate) fn claim(
        &mut self,
        answer: &Answer<'_>,
        claimed_only: impl Fn(Owner) -> bool,
    ) -> Result<Expect, Violation> {
        let id = answer.id;
        let Some(expect) = self.entries.get(&id) else {
            // Never sent, or already answered.
            return Err(Violation::UnknownId { id });
        };
        if let Some(violation) = expect.refuses(id, answer, !claimed_only(expect.owner)) {
            return Err(violation);
        }
        let expect = self.entries.remove(&id).expect("just found");
        if matches!(expect.owner, Owner::Acquire { .. }) {
            self.acquires -= 1;
        }
        Ok(expect)
    }

    /// The acquire in flight as `id` ended (its outcome was given), and
    /// `waiter`, if one could be kept, keeps its answer deadline: its
    /// answer is still claimed, and a grant it brings released.
    pub(crate) fn abandon(&mut self, id: u64, waiter: Option<Handle>) {
        if let Some(Expect {
            owner: Owner::Acquire { acquire, abandoned },
            ..
        }) = self.entries.get_mut(&id)
        {
            // Without a waiter (none could be kept) no record answers to
            // the handle: the answer is still claimed.
            *acquire = waiter.unwrap_or(Handle::from_parts(u32::MAX, u32::MAX));
            *abandoned = true;
        }
    }

    /// Every entry, taken out, in the order their requests were sent: the
    /// connection closed.
    pub(crate) fn drain(&mut self) -> Vec<Expect> {
        let mut all: Vec<(u64, Expect)> = self.entries.drain().collect();
        all.sort_unstable_by_key(|&(id, _)| id);
        self.acquires = 0;
        all.into_iter().map(|(_, expect)| expect).collect()
    }

    /// Whether a release of `(key, token)` is in flight.
    pub(crate) fn releases(&self, key: &Key, token: u64) -> bool {
        self.entries
            .values()
            .any(|e| matches!(e.owner, Owner::Release(_)) && e.token == token && e.key == *key)
    }

    /// Requests in flight.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Acquires among them.
    pub(crate) fn acquires(&self) -> usize {
        self.acquires
    }
}

/// An acquire's [`Expect`]: no token; the lease asked and the wait sent.
pub(crate) fn acquire(acquire: Handle, key: Key, wait_ms: u64, lease_ms: NonZeroU64) -> Expect {
    Expect {
        owner: Owner::Acquire {
            acquire,
            abandoned: false,
        },
        key,
        token: 0,
        lease_ms: lease_ms.get(),
        wait_ms,
    }
}

/// A release's [`Expect`]: its token, any lease (a `G` is a bad pairing).
pub(crate) fn release(release: Handle, key: Key, token: u64) -> Expect {
    Expect {
        owner: Owner::Release(release),
        key,
        token,
        lease_ms: u64::MAX,
        wait_ms: 0,
    }
}

/// A renewal's [`Expect`]: its token and the lease asked.
pub(crate) fn renewal(grant: Handle, key: Key, token: u64, lease_ms: NonZeroU64) -> Expect {
    Expect {
        owner: Owner::Renewal(grant),
        key,
        token,
        lease_ms: lease_ms.get(),
        wait_ms: 0,
    }
}
