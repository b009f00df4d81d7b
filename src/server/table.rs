//! The lock table: per key the current grant and a FIFO queue of waiting
//! acquires, the token counter, and the timers (lease expiries, wait
//! deadlines). It knows nothing of bytes or handshakes, which is what lets a
//! simulator carry it from one server to another.

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash, Hasher};
use core::num::NonZeroU64;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use siphasher::sip::SipHasher13;

use super::action::ConnId;
use crate::names::Key;
use crate::time::{millis, Time};
use crate::wire::{AnswerKind, Atom};

/// A key as a map key that can be looked up by `&str`, without allocating.
#[derive(Clone, PartialEq, Eq)]
struct KeyName(Key);

/// The lock table's hashing: SipHash-1-3 under a secret key, so that
/// clients, who choose the keys, cannot choose ones that collide (see
/// `Config::hash_key`). Deterministic for a given key.
#[derive(Clone, Copy, Default)]
struct KeyHashing(u128);

impl BuildHasher for KeyHashing {
    type Hasher = SipHasher13;

    fn build_hasher(&self) -> SipHasher13 {
        // The two 64-bit halves of the secret.
        SipHasher13::new_with_keys(self.0 as u64, (self.0 >> 64) as u64)
    }
}

/// Hashes as its `&str`, as [`Borrow`] requires.
impl Hash for KeyName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.as_str().hash(state);
    }
}

impl Borrow<str> for KeyName {
    fn borrow(&self) -> &str {
        self.0.as_str()
    }
}

/// The current grant of a key, as [`LockTable::holder`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The fencing token.
    pub token: u64,
    /// The lease given, in milliseconds (the one asked, capped by the
    /// server's maximum).
    pub lease_ms: NonZeroU64,
    /// When the grant was made; the lease started then.
    pub granted_at: Time,
    /// When the lease runs out and the key is freed, unless released first.
    pub expires_at: Time,
    /// The connection the grant was made to, on the server that made it.
    /// For diagnostics only: a grant is released by its token from any
    /// connection, and outlives the connection it was made to.
    pub conn: ConnId,
}

/// One key's state. A key is in the table only while it is held; an
/// acquire waits only behind a holder, so a free key never has waiters.
#[derive(Clone, Default)]
struct Slot {
    grant: Option<Holder>,
    /// Sequence numbers of the waiters, which increase with arrival: the
    /// set's order is the queue's first-in-first-out order.
    queue: BTreeSet<u64>,
}

/// An acquire waiting for its turn.
#[derive(Clone)]
struct Waiter {
    conn: ConnId,
    id: u64,
    key: Key,
    deadline: Time,
    /// The lease it will get, already capped.
    lease_ms: NonZeroU64,
}

/// When a grant's lease ends, and its token: leases end in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Expiry {
    at: Time,
    token: u64,
}

impl Expiry {
    fn of(grant: &Holder) -> Expiry {
        Expiry {
            at: grant.expires_at,
            token: grant.token,
        }
    }
}

/// The limits a server applies to the table (from its configuration).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) queue_limit: usize,
    pub(crate) max_waiters: usize,
    pub(crate) max_lease_ms: u64,
}

/// What an acquire got at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// `G`: the key was free.
    Granted { token: u64, lease_ms: NonZeroU64 },
    /// `T`: the key was held and `wait_ms` was 0.
    TimedOut,
    /// `B`: the key's queue or the server's waiters were at their limit.
    Busy,
    /// Waiting: answered later, by a [`Reply`].
    Queued,
}

/// An answer to a waiting acquire, made later than its request: a grant
/// when its turn came, or `T` when its wait ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) conn: ConnId,
    pub(crate) id: u64,
    pub(crate) key: Key,
    pub(crate) kind: AnswerKind,
}

/// The lock table of a Ticketing service: every key's grant and wait
/// queue, the timers that end leases and waits, and the token counter.
///
/// A [`Server`](super::Server) keeps one and applies PROTOCOL.md section 4
/// to it. The table is a value of its own so that leadership can move
/// between servers with the cluster's state carried over, as a correctly
/// replicated service would: [`Server::take_lock_table`](super::Server::take_lock_table)
/// takes it out of the old leader and
/// [`Server::install_lock_table`](super::Server::install_lock_table) puts
/// it into the new one. Grants (token, lease, expiry) and the token counter
/// travel; waiting acquires do not, because they belong to connections of
/// the server they were queued on.
///
/// Tokens come from one counter for all keys, so every grant's token is
/// greater than every earlier grant's, for one key and across keys.
///
/// Timers fire in time order, each at its own time: a lease that ends at
/// `t` grants the key's next waiter at `t`, whose lease then starts at `t`.
/// At equal times lease expiries come before wait deadlines (so a waiter
/// whose wait ends exactly when the key frees is granted, not timed out),
/// expiries among themselves in token order and deadlines in arrival order.
#[derive(Clone, Default)]
pub struct LockTable {
    /// Hashed, for speed: every request looks its key up. Nothing depends
    /// on this map's order.
    keys: HashMap<KeyName, Slot, KeyHashing>,
    waiters: BTreeMap<u64, Waiter>,
    by_conn: BTreeSet<(ConnId, u64)>,
    deadlines: BTreeSet<(Time, u64)>,
    /// The `Expiry` of every grant, with its key.
    expiries: BTreeMap<Expiry, Key>,
    last_token: u64,
    next_seq: u64,
}

impl LockTable {
    /// An empty table whose first grant will get token 1, hashing keys
    /// under the secret 0 (a server uses its `Config::hash_key`).
    pub fn new() -> LockTable {
        LockTable::default()
    }

    /// An empty table hashing keys under the secret `hash_key`.
    pub(crate) fn with_hash_key(hash_key: u128) -> LockTable {
        LockTable {
            keys: HashMap::with_hasher(KeyHashing(hash_key)),
            ..LockTable::default()
        }
    }

    /// The current grant of `key`, if it is held.
    pub fn holder(&self, key: &str) -> Option<Holder> {
        self.keys.get(key).and_then(|slot| slot.grant)
    }

    /// How many acquires wait in `key`'s queue (the holder not counted).
    pub fn queue_len(&self, key: &str) -> usize {
        self.keys.get(key).map_or(0, |slot| slot.queue.len())
    }

    /// How many acquires wait, in all queues together.
    pub fn waiters(&self) -> usize {
        self.waiters.len()
    }

    /// Every key held, with its grant, in key order.
    pub fn holders(&self) -> impl Iterator<Item = (&Key, Holder)> + '_ {
        let mut held: Vec<(&Key, Holder)> = self
            .keys
            .iter()
            .filter_map(|(key, slot)| slot.grant.map(|g| (&key.0, g)))
            .collect();
        held.sort_unstable_by(|a, b| a.0.cmp(b.0));
        held.into_iter()
    }

    /// The token of the latest grant (0 before the first). The next grant
    /// gets a greater one.
    pub fn last_token(&self) -> u64 {
        self.last_token
    }

    /// The earliest lease expiry or wait deadline.
    pub fn next_deadline(&self) -> Option<Time> {
        let expiry = self.expiries.keys().next().map(|e| e.at);
        let deadline = self.deadlines.first().map(|&(at, _)| at);
        match (expiry, deadline) {
            (Some(e), Some(d)) => Some(e.min(d)),
            (e, d) => e.or(d),
        }
    }

    /// Applies rule 2 to an acquire of `key` by request `id` on `conn`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn acquire(
        &mut self,
        now: Time,
        limits: &Limits,
        conn: ConnId,
        id: u64,
        key: Atom<'_>,
        wait_ms: u64,
        lease_ms: NonZeroU64,
    ) -> Acquired {
        let lease_ms =
            lease_ms.min(NonZeroU64::new(limits.max_lease_ms).unwrap_or(NonZeroU64::MIN));
        // A key is in the table only while it is held, so one lookup tells
        // a free key (the usual case, granted at once: its name is needed
        // then) from a held one.
        let mut held = match self.keys.entry(KeyName(Key::from(key))) {
            Entry::Vacant(vacant) => {
                let (token, grant) = Self::new_grant(
                    &mut self.last_token,
                    &mut self.expiries,
                    now,
                    &vacant.key().0,
                    conn,
                    lease_ms,
                );
                vacant.insert(Slot {
                    grant: Some(grant),
                    queue: BTreeSet::new(),
                });
                return Acquired::Granted { token, lease_ms };
            }
            Entry::Occupied(held) => held,
        };
        debug_assert!(held.get().grant.is_some(), "a key in the table is held");
        if wait_ms == 0 {
            return Acquired::TimedOut;
        }
        if held.get().queue.len() >= limits.queue_limit || self.waiters.len() >= limits.max_waiters
        {
            return Acquired::Busy;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let deadline = now.saturating_add(millis(wait_ms));
        held.get_mut().queue.insert(seq);
        // The table's own name of the key, shared.
        let key = held.key().0.clone();
        self.by_conn.insert((conn, seq));
        self.deadlines.insert((deadline, seq));
        self.waiters.insert(
            seq,
            Waiter {
                conn,
                id,
                key,
                deadline,
                lease_ms,
            },
        );
        Acquired::Queued
    }

    /// Applies rule 4: frees `key` if its grant has exactly `token`, and
    /// grants the next waiter (its answer goes to `out`). Whether it did.
    pub(crate) fn release(
        &mut self,
        now: Time,
        key: &str,
        token: u64,
        out: &mut Vec<Reply>,
    ) -> bool {
        // The usual release frees a key nobody waits for, which is then
        // forgotten: one lookup takes it out. Anything else puts it back.
        let Some((name, mut slot)) = self.keys.remove_entry(key) else {
            return false;
        };
        match slot.grant {
            Some(grant) if grant.token == token => {
                self.expiries.remove(&Expiry::of(&grant));
                if !slot.queue.is_empty() {
                    slot.grant = None;
                    self.keys.insert(name, slot);
                    self.promote(now, key, out);
                }
                true
            }
            _ => {
                self.keys.insert(name, slot);
                false
            }
        }
    }

    /// Fires every timer due at or before `now`, in order, each at its own
    /// time: expired leases free their keys and grant the next waiters,
    /// waits that ran out are answered `T`.
    pub(crate) fn advance(&mut self, now: Time, out: &mut Vec<Reply>) {
        loop {
            let expiry = self.expiries.keys().next().map(|e| e.at);
            let deadline = self.deadlines.first().map(|&(at, _)| at);
            let expiry_first = match (expiry, deadline) {
                (Some(e), Some(d)) => e <= d,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if expiry_first {
                let Some((expiry, key)) = self.expiries.pop_first() else {
                    break;
                };
                let Expiry { at, token } = expiry;
                if at > now {
                    self.expiries.insert(expiry, key);
                    break;
                }
                if let Some(slot) = self.keys.get_mut(key.as_str()) {
                    if slot.grant.is_some_and(|g| g.token == token) {
                        slot.grant = None;
                    }
                }
                self.promote(at, key.as_str(), out);
            } else {
                let Some(&(at, seq)) = self.deadlines.first() else {
                    break;
                };
                if at > now {
                    break;
                }
                if let Some(waiter) = self.remove_waiter(seq) {
                    out.push(Reply {
                        conn: waiter.conn,
                        id: waiter.id,
                        key: waiter.key,
                        kind: AnswerKind::TimedOut,
                    });
                }
            }
        }
    }

    /// Applies rule 5: drops every acquire waiting for `conn`, without an
    /// answer. Its grants stay. Returns how many were dropped.
    pub(crate) fn drop_conn(&mut self, conn: ConnId) -> usize {
        let seqs: Vec<u64> = self
            .by_conn
            .range((conn, 0)..=(conn, u64::MAX))
            .map(|&(_, seq)| seq)
            .collect();
        for &seq in &seqs {
            self.remove_waiter(seq);
        }
        seqs.len()
    }

    /// Whether an acquire of `conn` waits.
    pub(crate) fn has_waiters(&self, conn: ConnId) -> bool {
        self.by_conn
            .range((conn, 0)..=(conn, u64::MAX))
            .next()
            .is_some()
    }

    /// Drops every waiting acquire, without an answer.
    pub(crate) fn drop_all_waiters(&mut self) {
        self.waiters.clear();
        self.by_conn.clear();
        self.deadlines.clear();
        self.keys.retain(|_, slot| {
            slot.queue.clear();
            slot.grant.is_some()
        });
    }

    /// An empty table that goes on from this one's token counter.
    pub(crate) fn successor(&self) -> LockTable {
        LockTable {
            last_token: self.last_token,
            next_seq: self.next_seq,
            ..LockTable::with_hash_key(self.keys.hasher().0)
        }
    }

    /// Makes sure no later grant gets a token at or below `token`.
    pub(crate) fn tokens_after(&mut self, token: u64) {
        self.last_token = self.last_token.max(token);
    }

    /// Grants `key` to `holder` at `at`, returning the token.
    fn grant(&mut self, at: Time, key: Key, holder: ConnId, lease_ms: NonZeroU64) -> u64 {
        let (token, grant) = Self::new_grant(
            &mut self.last_token,
            &mut self.expiries,
            at,
            &key,
            holder,
            lease_ms,
        );
        self.keys.entry(KeyName(key)).or_default().grant = Some(grant);
        token
    }

    /// A grant of `key` at `at` with the next token, its expiry set: the
    /// token and the holder to put in the key's slot.
    fn new_grant(
        last_token: &mut u64,
        expiries: &mut BTreeMap<Expiry, Key>,
        at: Time,
        key: &Key,
        holder: ConnId,
        lease_ms: NonZeroU64,
    ) -> (u64, Holder) {
        // 2^64 grants cannot happen; saturate rather than wrap all the same.
        *last_token = last_token.saturating_add(1);
        let token = *last_token;
        let expires_at = at.saturating_add(millis(lease_ms.get()));
        let grant = Holder {
            token,
            lease_ms,
            granted_at: at,
            expires_at,
            conn: holder,
        };
        expiries.insert(Expiry::of(&grant), key.clone());
        (token, grant)
    }

    /// If `key` is free: grants it to the head of its queue at `at`, or
    /// forgets the key when nobody waits.
    fn promote(&mut self, at: Time, key: &str, out: &mut Vec<Reply>) {
        let Some(slot) = self.keys.get_mut(key) else {
            return;
        };
        if slot.grant.is_some() {
            return;
        }
        let Some(&seq) = slot.queue.first() else {
            self.keys.remove(key);
            return;
        };
        let Some(waiter) = self.remove_waiter(seq) else {
            return;
        };
        let token = self.grant(at, waiter.key.clone(), waiter.conn, waiter.lease_ms);
        out.push(Reply {
            conn: waiter.conn,
            id: waiter.id,
            key: waiter.key,
            kind: AnswerKind::Granted {
                token,
                lease_ms: waiter.lease_ms,
                waited_ms: None,
            },
        });
    }

    /// Takes a waiter out of every index.
    fn remove_waiter(&mut self, seq: u64) -> Option<Waiter> {
        let waiter = self.waiters.remove(&seq)?;
        self.by_conn.remove(&(waiter.conn, seq));
        self.deadlines.remove(&(waiter.deadline, seq));
        if let Some(slot) = self.keys.get_mut(waiter.key.as_str()) {
            slot.queue.remove(&seq);
            if slot.grant.is_none() && slot.queue.is_empty() {
                self.keys.remove(waiter.key.as_str());
            }
        }
        Some(waiter)
    }

    /// Checks that every index agrees with every other.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut queued = 0;
        for (key, slot) in &self.keys {
            assert!(slot.grant.is_some(), "{:?} is in the table but free", key.0);
            let g = slot.grant.unwrap();
            assert_eq!(self.expiries.get(&Expiry::of(&g)), Some(&key.0));
            for seq in &slot.queue {
                let w = &self.waiters[seq];
                assert_eq!(w.key, key.0);
                assert!(self.by_conn.contains(&(w.conn, *seq)));
                assert!(self.deadlines.contains(&(w.deadline, *seq)));
            }
            queued += slot.queue.len();
        }
        assert_eq!(queued, self.waiters.len());
        assert_eq!(self.by_conn.len(), self.waiters.len());
        assert_eq!(self.deadlines.len(), self.waiters.len());
        assert_eq!(self.expiries.len(), self.keys.len());
    }
}

impl fmt::Debug for LockTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockTable")
            .field("held", &self.keys.len())
            .field("waiters", &self.waiters.len())
            .field("last_token", &self.last_token)
            .field("next_deadline", &self.next_deadline())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        queue_limit: 2,
        max_waiters: 3,
        max_lease_ms: 100,
    };

    fn ms(n: u64) -> Time {
        Time::from_millis(n)
    }

    fn lease(n: u64) -> NonZeroU64 {
        NonZeroU64::new(n).unwrap()
    }

    fn atom(s: &str) -> Atom<'_> {
        Atom::new(s).unwrap()
    }

    fn acquire(t: &mut LockTable, now: u64, conn: u64, id: u64, key: &str, wait: u64) -> Acquired {
        let got = t.acquire(
            ms(now),
            &LIMITS,
            ConnId(conn),
            id,
            atom(key),
            wait,
            lease(50),
        );
        t.check();
        got
    }

    #[test]
    fn a_free_key_is_granted_with_a_capped_lease_and_a_new_token() {
        let mut t = LockTable::new();
        let got = t.acquire(ms(0), &LIMITS, ConnId(1), 7, atom("k"), 0, lease(500));
        assert_eq!(
            got,
            Acquired::Granted {
                token: 1,
                lease_ms: lease(100)
            }
        );
        let h = t.holder("k").unwrap();
        assert_eq!((h.token, h.expires_at, h.conn), (1, ms(100), ConnId(1)));
        assert_eq!(
            acquire(&mut t, 1, 1, 8, "other", 0),
            Acquired::Granted {
                token: 2,
                lease_ms: lease(50)
            }
        );
        assert_eq!(t.last_token(), 2);
        assert_eq!(
            t.holders()
                .map(|(k, h)| (k.as_str(), h.token))
                .collect::<Vec<_>>(),
            [("k", 1), ("other", 2)]
        );
    }

    #[test]
    fn waiters_queue_in_order_within_limits_and_time_out() {
        let mut t = LockTable::new();
        let mut out = Vec::new();
        acquire(&mut t, 0, 1, 1, "k", 0);
        assert_eq!(acquire(&mut t, 0, 2, 2, "k", 0), Acquired::TimedOut);
        assert_eq!(acquire(&mut t, 0, 2, 3, "k", 10), Acquired::Queued);
        assert_eq!(acquire(&mut t, 0, 3, 4, "k", 30), Acquired::Queued);
        assert_eq!(
            acquire(&mut t, 0, 3, 5, "k", 30),
            Acquired::Busy,
            "per-key limit"
        );
        acquire(&mut t, 0, 1, 6, "j", 0);
        assert_eq!(acquire(&mut t, 0, 3, 7, "j", 30), Acquired::Queued);
        assert_eq!(
            acquire(&mut t, 0, 3, 8, "j", 30),
            Acquired::Busy,
            "total limit"
        );
        assert_eq!(t.waiters(), 3);
        assert_eq!(t.next_deadline(), Some(ms(10)));
        t.advance(ms(10), &mut out);
        t.check();
        assert_eq!(
            out,
            [Reply {
                conn: ConnId(2),
                id: 3,
                key: Key::new("k").unwrap(),
                kind: AnswerKind::TimedOut
            }]
        );
        assert_eq!(t.queue_len("k"), 1);
    }

    #[test]
    fn release_and_expiry_grant_the_next_waiter_at_their_own_time() {
        let mut t = LockTable::new();
        let mut out = Vec::new();
        acquire(&mut t, 0, 1, 1, "k", 0); // token 1, expires at 50
        acquire(&mut t, 0, 2, 2, "k", 1000);
        acquire(&mut t, 0, 3, 3, "k", 1000);
        assert!(!t.release(ms(5), "k", 2, &mut out));
        assert!(!t.release(ms(5), "nope", 1, &mut out));
        assert!(t.release(ms(5), "k", 1, &mut out));
        t.check();
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].conn, out[0].id), (ConnId(2), 2));
        assert_eq!(t.holder("k").unwrap().expires_at, ms(55));
        out.clear();
        // Late: the timer fires at 55, and the next lease starts then.
        t.advance(ms(70), &mut out);
        t.check();
        assert_eq!((out[0].conn, out[0].id), (ConnId(3), 3));
        let h = t.holder("k").unwrap();
        assert_eq!((h.token, h.granted_at, h.expires_at), (3, ms(55), ms(105)));
        out.clear();
        t.advance(ms(105), &mut out);
        assert!(out.is_empty());
        assert_eq!(t.holder("k"), None);
        t.check();
    }

    #[test]
    fn an_expiry_at_a_wait_deadline_grants() {
        let mut t = LockTable::new();
        let mut out = Vec::new();
        acquire(&mut t, 0, 1, 1, "k", 0); // expires at 50
        acquire(&mut t, 0, 2, 2, "k", 50); // deadline 50
        t.advance(ms(50), &mut out);
        assert!(matches!(out[0].kind, AnswerKind::Granted { token: 2, .. }));
    }

    #[test]
    fn dropping_a_connection_drops_its_waiters_only() {
        let mut t = LockTable::new();
        acquire(&mut t, 0, 1, 1, "k", 0);
        acquire(&mut t, 0, 1, 2, "k", 100);
        acquire(&mut t, 0, 2, 3, "k", 100);
        assert!(t.has_waiters(ConnId(1)));
        assert_eq!(t.drop_conn(ConnId(1)), 1);
        t.check();
        assert!(!t.has_waiters(ConnId(1)));
        assert_eq!(t.holder("k").unwrap().conn, ConnId(1));
        assert_eq!(t.queue_len("k"), 1);
        t.drop_all_waiters();
        t.check();
        assert_eq!(t.waiters(), 0);
        assert_eq!(t.holder("k").unwrap().token, 1);
        let next = t.successor();
        assert_eq!((next.last_token(), next.holder("k")), (1, None));
    }
}
