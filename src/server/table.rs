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

use core::time::Duration;

use super::action::ConnId;
use super::decision::Decision;
use super::image::{ImageGrant, TableImage};
use super::term::EpochSource;
use super::token::{self, MAX_EPOCH, TERM_GRANTS};
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
    /// server's maximum). A renewal moves `expires_at`, not this.
    pub lease_ms: NonZeroU64,
    /// When the grant was made; the lease started then.
    pub granted_at: Time,
    /// When the lease runs out and the key is freed, unless released first.
    pub expires_at: Time,
    /// The connection the grant was made to (or reclaimed by), on the
    /// server that made it; `conn#0` for a grant read back from a table
    /// image. For diagnostics only: a grant is released by its token from
    /// any connection, and outlives the connection it was made to.
    pub conn: ConnId,
}

/// One key's state. A key is in the table only while it is held or waited
/// for; a free key has waiters only while nothing is granted (a recovery
/// grace, or a new epoch awaited).
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
    /// When it was queued: its grant says how long it waited.
    since: Time,
    /// The `wait_ms` it asked: what it waited is never said to be more.
    wait_ms: u64,
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
    /// `T`: the key was held (or nothing is granted yet) and `wait_ms` was 0.
    TimedOut,
    /// `B`: the key's queue or the server's waiters were at their limit.
    Busy,
    /// Waiting: answered later, by a [`Reply`].
    Queued,
}

/// What a renewal did (rule 9, and reclaiming in a recovery grace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The grant with that token lasts at least the lease from now.
    Renewed,
    /// A grant of an earlier epoch was reclaimed in the grace.
    Reclaimed,
    /// No grant of that key has that token.
    Gone,
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

/// The token counter of the term: `token = epoch * 2^22 + n`.
#[derive(Debug, Clone, Copy, Default)]
struct Counter {
    epoch: u64,
    /// The `n` of the term's latest grant (0 before the first).
    count: u64,
    source: EpochSource,
    /// A new epoch was asked of the driver and has not come: nothing is
    /// granted meanwhile.
    awaiting: bool,
    /// The request for it is still to be handed out.
    asked: bool,
}

impl Counter {
    /// The next token, beginning a new term first when `n` would reach
    /// 2^22; `None` while the driver is to give the new epoch (and, in May
    /// 2109, for ever).
    fn next(&mut self) -> Option<u64> {
        if self.awaiting {
            return None;
        }
        let n = self.count.saturating_add(1);
        if n < TERM_GRANTS {
            let token = token::token(self.epoch, n)?;
            self.count = n;
            return Some(token);
        }
        match self.source {
            EpochSource::Core => {
                let epoch = self.epoch.checked_add(1).filter(|&e| e <= MAX_EPOCH)?;
                let token = token::token(epoch, 1)?;
                self.epoch = epoch;
                self.count = 1;
                Some(token)
            }
            EpochSource::Driver => {
                self.awaiting = true;
                self.asked = true;
                None
            }
        }
    }

    /// Every token given so far is at most this; every later one is greater.
    fn last(&self) -> u64 {
        // epoch <= MAX_EPOCH and count < 2^22: no overflow.
        (self.epoch << token::COUNTER_BITS) | self.count
    }
}

/// The lock table of a Ticketing service: every key's grant and wait
/// queue, the timers that end leases and waits, the token counter and the
/// term's recovery grace.
///
/// A [`Server`](super::Server) keeps one and applies PROTOCOL.md section 4
/// to it. The table is a value of its own so that leadership can move
/// between servers with the cluster's state carried over, as a correctly
/// replicated service would: [`Server::take_lock_table`](super::Server::take_lock_table)
/// takes it out of the old leader and
/// [`Server::install_lock_table`](super::Server::install_lock_table) puts
/// it into the new one. Grants (token, lease, expiry), the token counter
/// and a grace under way travel; waiting acquires do not, because they
/// belong to connections of the server they were queued on.
///
/// Tokens are `epoch * 2^22 + n` with `n` counting the term's grants from
/// one counter for all keys, so every grant's token is greater than every
/// earlier grant's, for one key and across keys (PROTOCOL.md 4.1).
///
/// Timers fire in time order, each at its own time: a lease that ends at
/// `t` grants the key's next waiter at `t`, whose lease then starts at `t`.
/// At equal times lease expiries come before the end of a grace, and both
/// before wait deadlines (so a waiter whose wait ends exactly when the key
/// frees is granted, not timed out), expiries among themselves in token
/// order and deadlines in arrival order.
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
    counter: Counter,
    next_seq: u64,
    /// The end of the term's recovery grace: nothing is granted before it,
    /// and holders of earlier epochs' grants may reclaim them.
    grace_until: Option<Time>,
    /// The greatest lease, in ms, that a grant in this table may have: the
    /// greatest given, or carried from an earlier term.
    max_lease_ms: u64,
    /// Grants that ran out unreleased.
    expired: u64,
    /// The decisions made since they were last taken, noted only while a
    /// replicated cluster's leader keeps the table (PROTOCOL.md 4.3).
    journal: Journal,
}

/// Where a table notes each decision as it makes it: a replicated
/// cluster's leader's journal (PROTOCOL.md 4.3, feature `raft`), taken one
/// turn at a time as a Raft entry. Nothing is noted, nor built, without the
/// feature or until journaling is on.
#[derive(Debug, Default, Clone)]
struct Journal {
    #[cfg(feature = "raft")]
    noted: Option<Vec<Decision>>,
}

impl Journal {
    /// Notes the decision `made` makes, if notes are kept.
    #[inline]
    fn note(&mut self, made: impl FnOnce() -> Decision) {
        #[cfg(feature = "raft")]
        if let Some(noted) = &mut self.noted {
            noted.push(made());
        }
        #[cfg(not(feature = "raft"))]
        let _ = made;
    }
}

impl LockTable {
    /// An empty table whose first grant will get token 1, hashing keys
    /// under the secret 0 (a server uses its `Config::hash_key`).
    pub fn new() -> LockTable {
        LockTable::default()
    }

    /// An empty table hashing keys under the secret `hash_key`.
    pub(crate) fn with_hash_key(hash_key: u128, source: EpochSource) -> LockTable {
        LockTable {
            keys: HashMap::with_hasher(KeyHashing(hash_key)),
            counter: Counter {
                source,
                ..Counter::default()
            },
            ..LockTable::default()
        }
    }

    /// Grants that ran out unreleased.
    pub fn expiries(&self) -> u64 {
        self.expired
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

    /// The token counter: every token given so far (by this table's terms)
    /// is at most this, and every later one is greater. It is the latest
    /// grant's token, or `epoch * 2^22` before a term's first grant.
    pub fn last_token(&self) -> u64 {
        self.counter.last()
    }

    /// The epoch of the table's term.
    pub fn epoch(&self) -> u64 {
        self.counter.epoch
    }

    /// When the term's recovery grace ends, while one is under way.
    pub fn grace_until(&self) -> Option<Time> {
        self.grace_until
    }

    /// The greatest lease, in milliseconds, that a grant in this table may
    /// have: the greatest given, or carried from an earlier term.
    pub fn max_lease_ms(&self) -> u64 {
        self.max_lease_ms
    }

    /// The earliest lease expiry, end of grace or wait deadline.
    pub fn next_deadline(&self) -> Option<Time> {
        let expiry = self.expiries.keys().next().map(|e| e.at);
        let deadline = self.deadlines.first().map(|&(at, _)| at);
        [expiry, self.grace_until, deadline]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether nothing may be granted now: a grace, or a new epoch awaited.
    fn holding(&self) -> bool {
        self.grace_until.is_some() || self.counter.awaiting
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
        let holding = self.holding();
        let seq = self.next_seq;
        // A key is in the table only while it is held or waited for, so
        // one lookup tells a free key (the usual case, granted at once:
        // its name is needed then) from the others.
        let key = match self.keys.entry(KeyName(Key::from(key))) {
            Entry::Vacant(vacant) => {
                if !holding {
                    if let Some(token) = self.counter.next() {
                        let grant = Self::new_grant(
                            &mut self.expiries,
                            &mut self.max_lease_ms,
                            token,
                            now,
                            &vacant.key().0,
                            conn,
                            lease_ms,
                        );
                        self.journal.note(|| Decision::Grant {
                            key: vacant.key().0.clone(),
                            token,
                            lease_ms,
                        });
                        vacant.insert(Slot {
                            grant: Some(grant),
                            queue: BTreeSet::new(),
                        });
                        return Acquired::Granted { token, lease_ms };
                    }
                }
                // Free, but nothing is granted now (a grace, or a new
                // epoch awaited): it waits as behind a holder.
                if wait_ms == 0 {
                    return Acquired::TimedOut;
                }
                if limits.queue_limit == 0 || self.waiters.len() >= limits.max_waiters {
                    return Acquired::Busy;
                }
                let key = vacant.key().0.clone();
                vacant.insert(Slot {
                    grant: None,
                    queue: BTreeSet::from([seq]),
                });
                key
            }
            Entry::Occupied(mut held) => {
                if wait_ms == 0 {
                    return Acquired::TimedOut;
                }
                if held.get().queue.len() >= limits.queue_limit
                    || self.waiters.len() >= limits.max_waiters
                {
                    return Acquired::Busy;
                }
                held.get_mut().queue.insert(seq);
                // The table's own name of the key, shared.
                held.key().0.clone()
            }
        };
        self.next_seq += 1;
        let deadline = now.saturating_add(millis(wait_ms));
        self.by_conn.insert((conn, seq));
        self.deadlines.insert((deadline, seq));
        self.waiters.insert(
            seq,
            Waiter {
                conn,
                id,
                key,
                deadline,
                since: now,
                wait_ms,
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
                self.journal.note(|| Decision::Release {
                    key: name.0.clone(),
                    token,
                });
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

    /// Applies rule 9 to a renewal of `key`'s grant with `token` for
    /// `lease_ms` (already capped) by `conn`; in a recovery grace, a token
    /// of an earlier epoch reclaims the key (PROTOCOL.md 4.1).
    pub(crate) fn renew(
        &mut self,
        now: Time,
        conn: ConnId,
        key: Atom<'_>,
        token: u64,
        lease_ms: NonZeroU64,
    ) -> Renewal {
        let end = now.saturating_add_millis(lease_ms.get());
        let current = self.keys.get(key.as_str()).and_then(|slot| slot.grant);
        match current {
            Some(grant) if grant.token == token => {
                // Noted even when the lease does not move: a replicated
                // leader answers a renewal only once an entry after it
                // is committed, so a leader that lost its majority never
                // tells a holder it holds.
                self.journal.note(|| Decision::Renew {
                    key: Key::from(key),
                    token,
                    lease_ms,
                });
                if end > grant.expires_at {
                    self.expiries.remove(&Expiry::of(&grant));
                    let renewed = Holder {
                        expires_at: end,
                        ..grant
                    };
                    self.expiries.insert(Expiry::of(&renewed), Key::from(key));
                    if let Some(slot) = self.keys.get_mut(key.as_str()) {
                        slot.grant = Some(renewed);
                    }
                }
                Renewal::Renewed
            }
            _ if self.grace_until.is_none() || !self.is_earlier(token) => Renewal::Gone,
            // A later reclaim of the key carried a greater token: that one
            // is the later grant, the only one that can still be live.
            Some(grant) if grant.token > token => Renewal::Gone,
            earlier => {
                if let Some(replaced) = earlier {
                    self.expiries.remove(&Expiry::of(&replaced));
                }
                let key = Key::from(key);
                let grant = Self::new_grant(
                    &mut self.expiries,
                    &mut self.max_lease_ms,
                    token,
                    now,
                    &key,
                    conn,
                    lease_ms,
                );
                self.keys.entry(KeyName(key)).or_default().grant = Some(grant);
                Renewal::Reclaimed
            }
        }
    }

    /// Whether `token` could have been granted by an earlier term than
    /// this table's.
    fn is_earlier(&self, token: u64) -> bool {
        token::count_of(token) != 0 && token::epoch_of(token) < self.counter.epoch
    }

    /// Fires every timer due at or before `now`, in order, each at its own
    /// time: expired leases free their keys and grant the next waiters, the
    /// end of a grace grants every key waited for, waits that ran out are
    /// answered `T`.
    pub(crate) fn advance(&mut self, now: Time, out: &mut Vec<Reply>) {
        loop {
            let expiry = self.expiries.keys().next().map(|e| (e.at, 0));
            let grace = self.grace_until.map(|at| (at, 1));
            let deadline = self.deadlines.first().map(|&(at, _)| (at, 2));
            let Some((at, which)) = [expiry, grace, deadline].into_iter().flatten().min() else {
                break;
            };
            if at > now {
                break;
            }
            match which {
                0 => {
                    let Some((Expiry { token, .. }, key)) = self.expiries.pop_first() else {
                        break;
                    };
                    if let Some(slot) = self.keys.get_mut(key.as_str()) {
                        if slot.grant.is_some_and(|g| g.token == token) {
                            slot.grant = None;
                            self.expired += 1;
                            self.journal.note(|| Decision::Expire {
                                key: key.clone(),
                                token,
                            });
                        }
                    }
                    self.promote(at, key.as_str(), out);
                }
                1 => {
                    self.grace_until = None;
                    self.promote_all(at, out);
                }
                _ => {
                    let Some(&(_, seq)) = self.deadlines.first() else {
                        break;
                    };
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
            counter: Counter {
                awaiting: false,
                asked: false,
                ..self.counter
            },
            next_seq: self.next_seq,
            ..LockTable::with_hash_key(self.keys.hasher().0, self.counter.source)
        }
    }

    /// Makes sure no later grant gets a token at or below `token`, and
    /// takes `source` for the epochs of terms it begins by itself.
    pub(crate) fn tokens_after(&mut self, token: u64, source: EpochSource) {
        self.counter.source = source;
        if token > self.counter.last() {
            self.counter.epoch = token::epoch_of(token);
            self.counter.count = token::count_of(token);
        }
    }

    /// Begins a term with `epoch` on this table: the table of the term
    /// before it goes on (a new epoch at `n = 0`, no grace, a request for an
    /// epoch answered). The epoch was checked.
    pub(crate) fn begin_epoch(&mut self, now: Time, epoch: u64, out: &mut Vec<Reply>) {
        self.counter.epoch = epoch;
        self.counter.count = 0;
        self.counter.awaiting = false;
        self.counter.asked = false;
        self.promote_all(now, out);
    }

    /// Whether the term's counter has granted.
    pub(crate) fn has_granted(&self) -> bool {
        self.counter.count > 0
    }

    /// Whether the driver has a new epoch to give, and after which one:
    /// taken once.
    pub(crate) fn take_epoch_request(&mut self) -> Option<u64> {
        if self.counter.asked {
            self.counter.asked = false;
            Some(self.counter.epoch)
        } else {
            None
        }
    }

    /// Whether a request for a new epoch is still to be handed out.
    pub(crate) fn epoch_requested(&self) -> bool {
        self.counter.asked
    }

    /// Whether the table waits for a new epoch from the driver.
    pub(crate) fn awaiting_epoch(&self) -> bool {
        self.counter.awaiting
    }

    /// An empty table for a term with `epoch` and a recovery grace until
    /// `grace_until` (none if that is not after `now`), carrying the bound
    /// on leases `max_lease_ms`.
    pub(crate) fn recovered(
        &self,
        now: Time,
        epoch: u64,
        grace_until: Time,
        max_lease_ms: u64,
    ) -> LockTable {
        let mut table = self.successor();
        table.counter.epoch = epoch;
        table.counter.count = 0;
        table.grace_until = (grace_until > now).then_some(grace_until);
        table.max_lease_ms = max_lease_ms;
        table
    }

    /// A table for a term with `epoch` that goes on from `image`, each
    /// lease shortened by `stopped`; leases that ran out meanwhile are
    /// gone. Of two grants of one key (an image not made by a server), the
    /// greater token stays.
    pub(crate) fn resumed(
        &self,
        now: Time,
        epoch: u64,
        image: &TableImage,
        stopped: Duration,
    ) -> LockTable {
        let stopped_ms = crate::time::duration_millis(stopped);
        let grace_ms = image.grace_ms.saturating_sub(stopped_ms);
        let grace_until = now.saturating_add_millis(grace_ms);
        let mut table = self.recovered(now, epoch, grace_until, image.max_lease_ms);
        for g in &image.grants {
            let left = g.remaining_ms.saturating_sub(stopped_ms);
            let Some(lease_ms) = NonZeroU64::new(left) else {
                continue;
            };
            if table
                .holder(g.key.as_str())
                .is_some_and(|h| h.token > g.token)
            {
                continue;
            }
            if let Some(old) = table.holder(g.key.as_str()) {
                table.expiries.remove(&Expiry::of(&old));
            }
            let grant = Self::new_grant(
                &mut table.expiries,
                &mut table.max_lease_ms,
                g.token,
                now,
                &g.key,
                ConnId(0),
                lease_ms,
            );
            table.keys.entry(KeyName(g.key.clone())).or_default().grant = Some(grant);
        }
        table
    }

    /// The table written out at `now`: every grant with what is left of
    /// its lease, the counter, the bound on leases, what is left of a
    /// grace; `written_at` is the wall-clock time the driver gives.
    pub(crate) fn image(&self, now: Time, written_at: Duration) -> TableImage {
        let grants = self
            .holders()
            .filter_map(|(key, h)| {
                // Rounded up: a lease is never cut short by the rounding.
                let ns = h.expires_at.as_nanos().saturating_sub(now.as_nanos());
                let remaining_ms = ns.div_ceil(1_000_000);
                (remaining_ms > 0).then(|| ImageGrant {
                    key: key.clone(),
                    token: h.token,
                    remaining_ms,
                })
            })
            .collect();
        TableImage {
            epoch: self.counter.epoch,
            count: self.counter.count,
            max_lease_ms: self.max_lease_ms,
            grace_ms: self.grace_until.map_or(0, |at| {
                at.as_nanos()
                    .saturating_sub(now.as_nanos())
                    .div_ceil(1_000_000)
            }),
            written_at,
            grants,
        }
    }

    /// A grant of `key` with `token` at `at`, its expiry set: the holder to
    /// put in the key's slot.
    fn new_grant(
        expiries: &mut BTreeMap<Expiry, Key>,
        max_lease_ms: &mut u64,
        token: u64,
        at: Time,
        key: &Key,
        holder: ConnId,
        lease_ms: NonZeroU64,
    ) -> Holder {
        *max_lease_ms = (*max_lease_ms).max(lease_ms.get());
        let expires_at = at.saturating_add_millis(lease_ms.get());
        let grant = Holder {
            token,
            lease_ms,
            granted_at: at,
            expires_at,
            conn: holder,
        };
        expiries.insert(Expiry::of(&grant), key.clone());
        grant
    }

    /// If `key` is free and grants may be made: grants it to the head of
    /// its queue at `at`; forgets the key when nobody waits.
    fn promote(&mut self, at: Time, key: &str, out: &mut Vec<Reply>) {
        let Some(slot) = self.keys.get(key) else {
            return;
        };
        if slot.grant.is_some() {
            return;
        }
        let Some(&seq) = slot.queue.first() else {
            self.keys.remove(key);
            return;
        };
        if self.holding() {
            return;
        }
        let Some(token) = self.counter.next() else {
            return;
        };
        let Some(waiter) = self.remove_waiter(seq) else {
            return;
        };
        let grant = Self::new_grant(
            &mut self.expiries,
            &mut self.max_lease_ms,
            token,
            at,
            &waiter.key,
            waiter.conn,
            waiter.lease_ms,
        );
        self.keys
            .entry(KeyName(waiter.key.clone()))
            .or_default()
            .grant = Some(grant);
        self.journal.note(|| Decision::Grant {
            key: waiter.key.clone(),
            token,
            lease_ms: waiter.lease_ms,
        });
        let waited_ms = at.millis_since(waiter.since).min(waiter.wait_ms);
        out.push(Reply {
            conn: waiter.conn,
            id: waiter.id,
            key: waiter.key,
            kind: AnswerKind::Granted {
                token,
                lease_ms: waiter.lease_ms,
                waited_ms: Some(waited_ms),
            },
        });
    }

    /// Grants every free key that is waited for, first waiter first (the
    /// end of a grace, a new epoch given).
    fn promote_all(&mut self, at: Time, out: &mut Vec<Reply>) {
        let mut free: Vec<(u64, Key)> = self
            .keys
            .iter()
            .filter(|(_, slot)| slot.grant.is_none())
            .filter_map(|(key, slot)| Some((*slot.queue.first()?, key.0.clone())))
            .collect();
        free.sort_unstable();
        for (_, key) in free {
            self.promote(at, key.as_str(), out);
        }
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

    // ----- a replicated cluster (PROTOCOL.md 4.3) --------------------------

    /// Starts noting every decision (a leader's table), or stops.
    #[cfg(feature = "raft")]
    pub(crate) fn set_journaling(&mut self, on: bool) {
        self.journal.noted = on.then(Vec::new);
    }

    /// The decisions noted since the last call.
    #[cfg(feature = "raft")]
    pub(crate) fn take_journal(&mut self) -> Vec<Decision> {
        self.journal
            .noted
            .as_mut()
            .map(core::mem::take)
            .unwrap_or_default()
    }

    /// Whether decisions were noted since they were last taken.
    #[cfg(feature = "raft")]
    pub(crate) fn has_journal(&self) -> bool {
        self.journal.noted.as_ref().is_some_and(|j| !j.is_empty())
    }

    /// Tokens from here on are of `epoch` (the one of the Raft entry the
    /// next decisions go into), counting from 1 in it, and a full count
    /// asks the driver for the next one ([`EpochSource::Driver`]).
    #[cfg(feature = "raft")]
    pub(crate) fn set_entry_epoch(&mut self, epoch: u64) {
        self.counter.source = EpochSource::Driver;
        if epoch > self.counter.epoch {
            self.counter.epoch = epoch;
            self.counter.count = 0;
            self.counter.awaiting = false;
            self.counter.asked = false;
        }
    }

    /// A decision a leader takes over rather than makes (a restored
    /// grant, `server/raft/backup.rs`): applied as a copy applies it, and
    /// noted as the leader's own, so that it is proposed and an answer
    /// that depends on it waits for its commit.
    #[cfg(feature = "raft")]
    pub(crate) fn take_over(&mut self, now: Time, decision: Decision) {
        self.apply(now, &decision);
        self.journal.note(|| decision);
    }

    /// Applies a decision of a committed entry to a member's copy of the
    /// table, at `now`: a lease counts from when it is applied, so that a
    /// member's lease never ends before the leader's. A copy never fires
    /// its own timers: leases end when the leader says so.
    #[cfg(feature = "raft")]
    pub(crate) fn apply(&mut self, now: Time, decision: &Decision) {
        match decision {
            Decision::Floor { .. } | Decision::Cluster { .. } | Decision::Restored { .. } => {}
            Decision::Grant {
                key,
                token,
                lease_ms,
            } => {
                if let Some(old) = self.holder(key.as_str()) {
                    self.expiries.remove(&Expiry::of(&old));
                }
                let grant = Self::new_grant(
                    &mut self.expiries,
                    &mut self.max_lease_ms,
                    *token,
                    now,
                    key,
                    ConnId(0),
                    *lease_ms,
                );
                self.keys.entry(KeyName(key.clone())).or_default().grant = Some(grant);
                if *token > self.counter.last() {
                    self.counter.epoch = token::epoch_of(*token);
                    self.counter.count = token::count_of(*token);
                }
            }
            Decision::Release { key, token } | Decision::Expire { key, token } => {
                let Some(slot) = self.keys.get_mut(key.as_str()) else {
                    return;
                };
                if let Some(grant) = slot.grant.filter(|g| g.token == *token) {
                    self.expiries.remove(&Expiry::of(&grant));
                    slot.grant = None;
                    if matches!(decision, Decision::Expire { .. }) {
                        self.expired += 1;
                    }
                    if slot.queue.is_empty() {
                        self.keys.remove(key.as_str());
                    }
                }
            }
            Decision::Renew {
                key,
                token,
                lease_ms,
            } => {
                let _ = self.renew(now, ConnId(0), key.to_wire(), *token, *lease_ms);
            }
        }
    }

    /// Sets the term's counter, as if `n` grants had been made.
    #[cfg(test)]
    pub(crate) fn set_count(&mut self, n: u64) {
        self.counter.count = n;
    }

    /// Checks that every index agrees with every other.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut queued = 0;
        let mut held = 0;
        for (key, slot) in &self.keys {
            match slot.grant {
                Some(g) => {
                    held += 1;
                    assert_eq!(self.expiries.get(&Expiry::of(&g)), Some(&key.0));
                }
                None => assert!(
                    self.holding() && !slot.queue.is_empty(),
                    "{:?} is in the table but free",
                    key.0
                ),
            }
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
        assert_eq!(self.expiries.len(), held);
    }
}

impl fmt::Debug for LockTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockTable")
            .field("held", &self.expiries.len())
            .field("waiters", &self.waiters.len())
            .field("epoch", &self.counter.epoch)
            .field("last_token", &self.last_token())
            .field("grace_until", &self.grace_until)
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
