//! The requests in flight on the connection, by id (PROTOCOL.md section
//! 5: "matching an answer", "when to register", "an answer whose id no
//! pending request holds", "an answer whose id is pending but op or key
//! differ", the `waited_ms` row).
//!
//! An entry is registered before its request's bytes exist, and names
//! whose request it is. An answer is claimed with one lookup of its id
//! ([`Pending::take`]), then checked against what its request must match
//! ([`Expected::refuses`]); one that does not match is put back, to be
//! treated as sent and unanswered by the close. An acquire's and a
//! release's records live as long as their request is in flight (an
//! acquire abandoned in flight leaves a waiter that does), so what their
//! answer must match is read from them, by the client. A renewal's grant
//! may be released, handed back or expire while its renewal is in flight:
//! what its answer must match (the key, the token, the lease asked) is
//! kept here, so the grant's record can go the moment the embedder gives
//! it up, and the answer is still claimed.

use core::num::NonZeroU64;

use super::outcome::Violation;
use super::store::Handle;
use crate::hash::IdMap;
use crate::names::Key;
use crate::wire::{Answer, AnswerKind, Op};

/// Whose request is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// An attempt of the acquire `Handle`.
    Acquire(Handle),
    /// An attempt of an acquire whose operation ended while it was in
    /// flight (cancelled under `KeepWaiter`, shut down): its waiter keeps
    /// what its answer must match and its answer deadline; its answer is
    /// claimed, and a grant it brings released.
    Waiter(Handle),
    /// An attempt of the release `Handle`.
    Release(Handle),
    /// A renewal, kept here as the `n`-th renewal in flight.
    Renewal(u32),
}

/// What the answer to a request must say: its op and key, and what it may
/// not exceed or must repeat.
pub(crate) struct Expected<'a> {
    pub(crate) op: Op,
    pub(crate) key: &'a Key,
    /// The lease asked: a `G` may give no more (`u64::MAX`: any).
    pub(crate) lease_ms: u64,
    /// The `wait_ms` sent: a `G` to an acquire may say it waited no more.
    pub(crate) wait_ms: u64,
    /// The token a renewal's `G` must repeat.
    pub(crate) token: u64,
}

impl Expected<'_> {
    /// Why `answer` cannot be this request's, if it cannot: another op or
    /// key, a longer lease than asked, a `G` to an acquire that does not
    /// say how long it waited or says it waited longer than it was sent
    /// with, a renewal answered for another token.
    pub(crate) fn refuses(&self, answer: &Answer<'_>) -> Option<Violation> {
        let id = answer.id;
        if self.op != answer.op() || !self.key.is(answer.key.as_bytes()) {
            return Some(Violation::Mismatch { id });
        }
        match answer.kind {
            AnswerKind::Granted { lease_ms, .. } | AnswerKind::Renewed { lease_ms, .. }
                if lease_ms.get() > self.lease_ms =>
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

/// A renewal in flight: what its answer must match.
struct Renewal {
    grant: Handle,
    key: Key,
    token: u64,
    lease_ms: NonZeroU64,
}

/// The requests in flight.
pub(crate) struct Pending {
    entries: IdMap<u64, Owner>,
    /// The renewals in flight, by the number their entry holds.
    renewals: Vec<Option<Renewal>>,
    /// Numbers of `renewals` that are free.
    free: Vec<u32>,
    /// The id of the next request: one more than the last, never reused.
    next_id: u64,
    /// How many of the entries are acquires (waiters included).
    acquires: usize,
}

impl Default for Pending {
    fn default() -> Pending {
        Pending {
            entries: IdMap::default(),
            renewals: Vec::new(),
            free: Vec::new(),
            next_id: 1,
            acquires: 0,
        }
    }
}

/// An answer matched to its request: whose it was (a renewal's, by the
/// grant it renews).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claimed {
    Acquire(Handle),
    Waiter(Handle),
    Release(Handle),
    Renewal(Handle),
}

impl Pending {
    /// The id the next request registered gets.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Registers the next request, `owner`'s, under the id
    /// [`Pending::next_id`] said.
    pub(crate) fn register(&mut self, owner: Owner) {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        if matches!(owner, Owner::Acquire(_) | Owner::Waiter(_)) {
            self.acquires += 1;
        }
        self.entries.insert(id, owner);
    }

    /// Registers the next request, a renewal of the held grant `grant` by
    /// its `(key, token)`, asking for `lease_ms`.
    pub(crate) fn register_renewal(
        &mut self,
        grant: Handle,
        key: Key,
        token: u64,
        lease_ms: NonZeroU64,
    ) {
        let renewal = Some(Renewal {
            grant,
            key,
            token,
            lease_ms,
        });
        let n = match self.free.pop() {
            Some(n) => {
                self.renewals[n as usize] = renewal;
                n
            }
            None => {
                self.renewals.push(renewal);
                (self.renewals.len() - 1) as u32
            }
        };
        self.register(Owner::Renewal(n))
    }

    /// Takes the renewal `n` out.
    fn take_renewal(&mut self, n: u32) -> Option<Renewal> {
        let renewal = self.renewals.get_mut(n as usize)?.take()?;
        self.free.push(n);
        Some(renewal)
    }

    /// The request `id` names, taken out: the one lookup of an answer
    /// (matched by id, never by order). `None`: never sent, or answered
    /// already.
    pub(crate) fn take(&mut self, id: u64) -> Option<Owner> {
        let owner = self.entries.remove(&id)?;
        if matches!(owner, Owner::Acquire(_) | Owner::Waiter(_)) {
            self.acquires -= 1;
        }
        Some(owner)
    }

    /// Puts back the request `id` whose answer did not match what it must:
    /// it stays in flight, to be treated as sent and unanswered by the
    /// close.
    pub(crate) fn put_back(&mut self, id: u64, owner: Owner) {
        if matches!(owner, Owner::Acquire(_) | Owner::Waiter(_)) {
            self.acquires += 1;
        }
        self.entries.insert(id, owner);
    }

    /// The grant the renewal `n` renews.
    pub(crate) fn renewal_grant(&self, n: u32) -> Option<Handle> {
        self.renewal(n).map(|r| r.grant)
    }

    /// What the answer to the renewal `n` must match: its key and token,
    /// and while its grant still waits for it (`awaited`), no more lease
    /// than it asked (a renewal of a grant given up, or expired since, is
    /// claimed and changes nothing, whatever lease it gives).
    pub(crate) fn renewal_expected(&self, n: u32, awaited: bool) -> Option<Expected<'_>> {
        let r = self.renewal(n)?;
        Some(Expected {
            op: Op::Renew,
            key: &r.key,
            lease_ms: if awaited { r.lease_ms.get() } else { u64::MAX },
            wait_ms: 0,
            token: r.token,
        })
    }

    fn renewal(&self, n: u32) -> Option<&Renewal> {
        self.renewals.get(n as usize)?.as_ref()
    }

    /// Whose the request taken out was, the renewal's grant for a renewal
    /// (its record given up). `None` only for a renewal number that holds
    /// none, which registering never makes.
    pub(crate) fn claimed(&mut self, owner: Owner) -> Option<Claimed> {
        Some(match owner {
            Owner::Acquire(h) => Claimed::Acquire(h),
            Owner::Waiter(h) => Claimed::Waiter(h),
            Owner::Release(h) => Claimed::Release(h),
            Owner::Renewal(n) => Claimed::Renewal(self.take_renewal(n)?.grant),
        })
    }

    /// The acquire in flight as `id` ended (its outcome was given), and
    /// `waiter` keeps what its answer must match and its deadline.
    pub(crate) fn abandon(&mut self, id: u64, waiter: Handle) {
        if let Some(owner @ Owner::Acquire(_)) = self.entries.get_mut(&id) {
            *owner = Owner::Waiter(waiter);
        }
    }

    /// Every entry, taken out, in the order their requests were sent: the
    /// connection closed.
    pub(crate) fn drain(&mut self) -> Vec<Claimed> {
        let mut all: Vec<(u64, Owner)> = self.entries.drain().collect();
        all.sort_unstable_by_key(|&(id, _)| id);
        self.acquires = 0;
        all.into_iter()
            .filter_map(|(_, owner)| self.claimed(owner))
            .collect()
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

#[cfg(test)]
mod tests {
    use core::num::NonZeroU64;

    use super::*;
    use crate::wire::{Answer, AnswerKind};

    fn key(k: &str) -> Key {
        Key::new(k).expect("a key")
    }

    fn handle(slot: u32) -> Handle {
        Handle::from_parts(slot, 0)
    }

    fn lease(ms: u64) -> NonZeroU64 {
        NonZeroU64::new(ms).expect("positive")
    }

    fn granted<'a>(id: u64, k: &'a Key, lease_ms: u64, waited_ms: Option<u64>) -> Answer<'a> {
        Answer {
            id,
            key: k.to_wire(),
            kind: AnswerKind::Granted {
                token: 9,
                lease_ms: lease(lease_ms),
                waited_ms,
            },
        }
    }

    #[test]
    fn ids_go_up_and_an_answer_takes_its_entry_out_with_one_lookup() {
        let mut p = Pending::default();
        assert_eq!(p.next_id(), 1);
        p.register(Owner::Acquire(handle(0)));
        p.register(Owner::Release(handle(1)));
        p.register(Owner::Waiter(handle(2)));
        assert_eq!((p.next_id(), p.len(), p.acquires()), (4, 3, 2));
        assert_eq!(p.take(1), Some(Owner::Acquire(handle(0))));
        assert_eq!((p.len(), p.acquires()), (2, 1));
        assert_eq!(p.take(1), None, "answered already");
        assert_eq!(p.take(7), None, "never sent");
        // An answer that did not match is put back: still in flight.
        p.put_back(1, Owner::Acquire(handle(0)));
        assert_eq!((p.len(), p.acquires()), (3, 2));
        // A close drains them in the order they were sent.
        let drained = p.drain();
        assert_eq!(
            drained,
            [
                Claimed::Acquire(handle(0)),
                Claimed::Release(handle(1)),
                Claimed::Waiter(handle(2))
            ]
        );
        assert_eq!(
            (p.len(), p.acquires(), p.next_id()),
            (0, 0, 4),
            "ids never reused"
        );
    }

    #[test]
    fn a_renewal_keeps_what_its_answer_must_match_after_its_grant_is_given_up() {
        let mut p = Pending::default();
        let k = key("k");
        p.register_renewal(handle(3), k.clone(), 42, lease(1000));
        let Some(Owner::Renewal(n)) = p.take(1) else {
            panic!("a renewal's entry");
        };
        assert_eq!(p.renewal_grant(n), Some(handle(3)));
        let renewed = |lease_ms, token| Answer {
            id: 1,
            key: k.to_wire(),
            kind: AnswerKind::Renewed {
                token,
                lease_ms: lease(lease_ms),
            },
        };
        let awaited = p.renewal_expected(n, true).expect("kept");
        assert_eq!(awaited.refuses(&renewed(1000, 42)), None);
        assert_eq!(
            awaited.refuses(&renewed(1001, 42)),
            Some(Violation::LeaseAboveAsked { id: 1 })
        );
        assert_eq!(
            awaited.refuses(&renewed(1000, 43)),
            Some(Violation::TokenMismatch { id: 1 })
        );
        // Its grant was given up: claimed whatever lease it gives.
        let given_up = p.renewal_expected(n, false).expect("kept");
        assert_eq!(given_up.refuses(&renewed(5000, 42)), None);
        assert_eq!(
            p.claimed(Owner::Renewal(n)),
            Some(Claimed::Renewal(handle(3)))
        );
        assert_eq!(p.renewal_grant(n), None, "its place is free again");
        p.register_renewal(handle(4), k, 7, lease(10));
        assert_eq!(p.renewals.len(), 1, "and taken by the next");
    }

    #[test]
    fn an_answer_must_repeat_the_op_and_key_and_stay_within_what_was_asked() {
        let (k, other) = (key("k"), key("other"));
        let expected = Expected {
            op: Op::Acquire,
            key: &k,
            lease_ms: 1000,
            wait_ms: 50,
            token: 0,
        };
        assert_eq!(expected.refuses(&granted(5, &k, 1000, Some(50))), None);
        assert_eq!(
            expected.refuses(&granted(5, &other, 1000, Some(0))),
            Some(Violation::Mismatch { id: 5 })
        );
        let released = Answer {
            id: 5,
            key: k.to_wire(),
            kind: AnswerKind::Released,
        };
        assert_eq!(
            expected.refuses(&released),
            Some(Violation::Mismatch { id: 5 }),
            "another op"
        );
        assert_eq!(
            expected.refuses(&granted(5, &k, 1001, Some(0))),
            Some(Violation::LeaseAboveAsked { id: 5 })
        );
        assert_eq!(
            expected.refuses(&granted(5, &k, 1000, None)),
            Some(Violation::WaitedMissing { id: 5 })
        );
        assert_eq!(
            expected.refuses(&granted(5, &k, 1000, Some(51))),
            Some(Violation::WaitedAboveAsked { id: 5 })
        );
    }
}
