//! The global checks, and the ground truth they use.
//!
//! The per-client invariants are the [`Checker`](crate::testkit::Checker)'s.
//! What no single client can see is checked here, from the simulator's
//! view of everything:
//!
//! * the ground truth of the cluster's grants: every `G` a cluster node
//!   wrote (its token, key, lease end, and the operation whose request it
//!   answers), every `G` to a renewal (a later lease end; in a recovery
//!   grace, a grant the cluster holds again), every `D` (when the grant
//!   was released), and every lock table lost with a leader that crashed
//!   (its grants no longer held by the cluster);
//! * the grants the embedders hold, for mutual exclusion, and the fenced
//!   resources;
//! * every operation's deadline, and every shutdown's;
//! * watches on grants that must be gone by a time: the grant of an acquire
//!   that ended Indeterminate (by its `settles_by`), and a grant whose
//!   release is under way once the cluster is healthy again.

use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};

use super::{Check, Checked, Writes};
use crate::client::OpId;
use crate::names::Key;
use crate::time::Time;

/// A failed check: which, which client, and what happened.
pub(super) type Failure = (Check, Option<usize>, String);

/// What the cluster did with one grant.
#[derive(Debug, Clone)]
struct Truth {
    key: Key,
    client: usize,
    expires_at: Time,
    released_at: Option<Time>,
}

/// An operation in progress, for its deadline.
#[derive(Debug, Clone)]
pub(super) struct OpInfo {
    pub(super) what: String,
    pub(super) submitted: Time,
    pub(super) deadline: Time,
}

/// A grant an embedder holds.
#[derive(Debug, Clone)]
struct Hold {
    client: usize,
    token: u64,
    since: Time,
    valid_until: Time,
    ended: Option<Time>,
}

impl Hold {
    /// The mutual-exclusion failure of `client`, of which `what` tells,
    /// while this grant is valid.
    fn excludes(&self, client: usize, what: String) -> Failure {
        (
            Check::MutualExclusion,
            Some(client),
            format!(
                "{what} while c{} holds it with token {}, handed at {} and valid until {}",
                self.client, self.token, self.since, self.valid_until
            ),
        )
    }
}

/// The global checks' state.
#[derive(Default)]
pub(super) struct Ledger {
    grants: BTreeMap<u64, Truth>,
    by_op: BTreeMap<(usize, OpId), Vec<u64>>,
    indeterminate: BTreeMap<(usize, OpId), Time>,
    settle_watch: BTreeSet<(Time, u64, usize)>,
    ops: BTreeMap<(usize, OpId), OpInfo>,
    deadlines: BTreeSet<(Time, usize, OpId)>,
    shutdowns: BTreeSet<(Time, usize)>,
    shutdown_at: BTreeMap<usize, Time>,
    owners: BTreeMap<(usize, String), OpId>,
    /// Releases under way before the cluster was healthy again: when they
    /// started, whose, which token.
    release_waiting: Vec<(Time, usize, u64)>,
    release_watch: BTreeSet<(Time, usize, u64)>,
    lapsed: BTreeSet<(usize, u64)>,
    holds: BTreeMap<Key, Vec<Hold>>,
    resources: BTreeMap<Key, u64>,
    pub(super) writes: Writes,
    pub(super) checked: Checked,
}

impl Ledger {
    // ----- ground truth ---------------------------------------------------

    /// A cluster node granted `token` of `key` to a request of `client`'s
    /// operation `op` (if the sim could tell which).
    pub(super) fn grant_made(
        &mut self,
        token: u64,
        key: Key,
        client: usize,
        op: Option<OpId>,
        expires_at: Time,
    ) {
        self.grants.insert(
            token,
            Truth {
                key,
                client,
                expires_at,
                released_at: None,
            },
        );
        if let Some(op) = op {
            self.by_op.entry((client, op)).or_default().push(token);
            if let Some(&settles_by) = self.indeterminate.get(&(client, op)) {
                self.settle_watch.insert((settles_by, token, client));
            }
        }
    }

    /// A cluster node answered `D` to a release of `(key, token)`.
    pub(super) fn released(&mut self, key: &Key, token: u64, at: Time) {
        if let Some(t) = self.grants.get_mut(&token) {
            if &t.key == key && t.released_at.is_none() {
                t.released_at = Some(at);
            }
        }
    }

    /// A cluster node renewed `(key, token)` until `expires_at` at least
    /// (extend-only), or, in a recovery grace, reclaimed it: the cluster
    /// holds it again, the table it was lost with or not.
    pub(super) fn renewed(&mut self, key: &Key, token: u64, expires_at: Time) {
        if let Some(t) = self.grants.get_mut(&token) {
            if &t.key == key {
                t.expires_at = t.expires_at.max(expires_at);
                t.released_at = None;
            }
        }
    }

    /// The cluster's lock table was lost at `at` (a leader crashed without
    /// handing it over): no server holds its grants from then on. The
    /// embedders may still hold them, until their own expiry: that is what
    /// the recovery grace of the next leader protects.
    pub(super) fn table_lost(&mut self, at: Time) {
        for t in self.grants.values_mut() {
            if t.released_at.is_none() && t.expires_at > at {
                t.released_at = Some(at);
            }
        }
    }

    /// Whether the cluster made the grant `token` and it is neither
    /// released nor expired at `at`.
    fn live_at(&self, token: u64, at: Time) -> Option<&Truth> {
        self.grants
            .get(&token)
            .filter(|t| t.expires_at > at && t.released_at.map_or(true, |r| r > at))
    }

    // ----- operations -----------------------------------------------------

    /// The acquire of `client` with `owner` is `op`.
    pub(super) fn owner(&mut self, client: usize, owner: String, op: OpId) {
        self.owners.insert((client, owner), op);
    }

    /// The operation of `client` that sent an acquire with `owner`.
    pub(super) fn op_of_owner(&self, client: usize, owner: &str) -> Option<OpId> {
        self.owners.get(&(client, owner.to_owned())).copied()
    }

    /// An operation started; it must end by `info.deadline`.
    pub(super) fn op_started(&mut self, client: usize, op: OpId, info: OpInfo) {
        self.deadlines.insert((info.deadline, client, op));
        self.ops.insert((client, op), info);
    }

    /// An operation ended.
    pub(super) fn op_ended(&mut self, client: usize, op: OpId) {
        if let Some(info) = self.ops.remove(&(client, op)) {
            self.deadlines.remove(&(info.deadline, client, op));
        }
    }

    /// An acquire ended Indeterminate: its grant, if any, must be gone by
    /// `settles_by`.
    pub(super) fn indeterminate(&mut self, client: usize, op: OpId, settles_by: Time) {
        self.indeterminate.insert((client, op), settles_by);
        if let Some(tokens) = self.by_op.get(&(client, op)) {
            for &token in tokens {
                self.settle_watch.insert((settles_by, token, client));
            }
        }
    }

    /// A shutdown started at `now`; it must complete by `deadline`.
    pub(super) fn shutdown_started(&mut self, client: usize, now: Time, deadline: Time) {
        self.shutdown_at.insert(client, now);
        self.shutdowns.insert((deadline, client));
    }

    /// A shutdown completed.
    pub(super) fn shutdown_complete(&mut self, client: usize) {
        self.shutdowns.retain(|&(_, c)| c != client);
    }

    // ----- releases -------------------------------------------------------

    /// `client` put a release of `token` under way at `now` (an embedder's,
    /// or one for an orphaned grant). Once the cluster is healthy (from
    /// `healthy_since`), the grant must be gone within `grace`.
    pub(super) fn release_started(
        &mut self,
        client: usize,
        token: u64,
        now: Time,
        healthy_since: Option<Time>,
        grace: Duration,
    ) {
        match healthy_since {
            Some(h) => {
                let deadline = now.max(h).saturating_add(grace);
                self.release_watch.insert((deadline, client, token));
            }
            None => self.release_waiting.push((now, client, token)),
        }
    }

    /// The cluster is healthy again since `at`: the releases under way get
    /// their deadlines.
    pub(super) fn healthy(&mut self, at: Time, grace: impl Fn(usize) -> Duration) {
        for (started, client, token) in core::mem::take(&mut self.release_waiting) {
            let deadline = started.max(at).saturating_add(grace(client));
            self.release_watch.insert((deadline, client, token));
        }
    }

    /// A release of `token` by `client` lapsed: lease expiry ends the grant
    /// (the accepted boundary).
    pub(super) fn release_lapsed(&mut self, client: usize, token: u64) {
        self.lapsed.insert((client, token));
    }

    // ----- holders and resources ------------------------------------------

    /// `client` was handed the grant `token` of `key` at `now`, valid until
    /// `valid_until`: no other grant of the key may be valid now.
    pub(super) fn hold(
        &mut self,
        client: usize,
        key: &Key,
        token: u64,
        valid_until: Time,
        now: Time,
    ) -> Result<(), Failure> {
        if valid_until <= now {
            // Handed over already past its validity (it waited long in the
            // queue): never valid, held by nobody.
            return Ok(());
        }
        let holds = self.holds.entry(key.clone()).or_default();
        holds.retain(|h| h.ended.is_none() && h.valid_until > now);
        if let Some(other) = holds.first() {
            return Err(other.excludes(
                client,
                format!(
                    "c{client} was handed {key} with token {token} (valid until {valid_until})"
                ),
            ));
        }
        self.checked.holds += 1;
        holds.push(Hold {
            client,
            token,
            since: now,
            valid_until,
            ended: None,
        });
        Ok(())
    }

    /// A renewal of `client`'s grant `token` of `key` was answered at
    /// `now`: it is valid until `valid_until` from now on (never shorter).
    /// No other grant of the key may be valid now.
    pub(super) fn extend(
        &mut self,
        client: usize,
        key: &Key,
        token: u64,
        valid_until: Time,
        now: Time,
    ) -> Result<(), Failure> {
        let Some(holds) = self.holds.get_mut(key) else {
            return Ok(());
        };
        let Some(i) = holds
            .iter()
            .position(|h| h.client == client && h.token == token && h.ended.is_none())
        else {
            return Ok(());
        };
        holds[i].valid_until = holds[i].valid_until.max(valid_until);
        if valid_until <= now {
            return Ok(());
        }
        self.checked.renewals += 1;
        if let Some(other) = holds
            .iter()
            .enumerate()
            .find(|&(j, h)| j != i && h.ended.is_none() && h.valid_until > now)
            .map(|(_, h)| h)
        {
            return Err(other.excludes(
                client,
                format!(
                    "c{client}'s grant of {key} with token {token} was renewed until {valid_until}"
                ),
            ));
        }
        Ok(())
    }

    /// The embedder of `client` gave the grant up (released or abandoned
    /// it) at `now`.
    pub(super) fn unhold(&mut self, client: usize, key: &Key, token: u64, now: Time) {
        if let Some(holds) = self.holds.get_mut(key) {
            for h in holds
                .iter_mut()
                .filter(|h| h.client == client && h.token == token && h.ended.is_none())
            {
                h.ended = Some(now);
            }
        }
    }

    /// `client` writes to `key`'s resource with `token` at `now`. A write
    /// under a grant the client holds and that is still valid must be
    /// accepted; a late one is accepted only if no newer token has written.
    pub(super) fn write(
        &mut self,
        client: usize,
        key: &Key,
        token: u64,
        now: Time,
    ) -> Result<(), Failure> {
        let valid = self.holds.get(key).is_some_and(|holds| {
            holds.iter().any(|h| {
                h.client == client && h.token == token && h.ended.is_none() && h.valid_until > now
            })
        });
        let last = self.resources.entry(key.clone()).or_insert(0);
        if token >= *last {
            *last = token;
            if valid {
                self.writes.valid += 1;
            } else {
                self.writes.stale_accepted += 1;
            }
            Ok(())
        } else if valid {
            Err((
                Check::Fencing,
                Some(client),
                format!(
                    "the resource of {key} refused c{client}'s write with token {token}, under a valid grant: token {} wrote before",
                    *last
                ),
            ))
        } else {
            self.writes.stale_refused += 1;
            Ok(())
        }
    }

    // ----- the checks after every step ------------------------------------

    /// Checks every deadline that passed before `now`.
    pub(super) fn check(&mut self, now: Time) -> Result<(), Failure> {
        if let Some(&(deadline, client, op)) = self.deadlines.first() {
            if deadline < now {
                let info = &self.ops[&(client, op)];
                return Err((
                    Check::Deadline,
                    Some(client),
                    format!(
                        "{op} ({}) submitted at {} has no outcome by its deadline {deadline}",
                        info.what, info.submitted
                    ),
                ));
            }
        }
        if let Some(&(deadline, client)) = self.shutdowns.first() {
            if deadline < now {
                return Err((
                    Check::Deadline,
                    Some(client),
                    format!("the shutdown did not complete within its budget, by {deadline}"),
                ));
            }
        }
        while let Some(&(settles_by, token, client)) = self.settle_watch.first() {
            if settles_by >= now {
                break;
            }
            self.settle_watch.pop_first();
            self.checked.settle_watches += 1;
            if let Some(t) = self.live_at(token, settles_by) {
                return Err((
                    Check::Lingering,
                    Some(client),
                    format!(
                        "an acquire of c{client} ended Indeterminate, promising to be settled by {settles_by}, but its grant ({}, {token}) lasts until {}",
                        t.key, t.expires_at
                    ),
                ));
            }
        }
        while let Some(&(deadline, client, token)) = self.release_watch.first() {
            if deadline >= now {
                break;
            }
            self.release_watch.pop_first();
            // A client that shuts down drains its lane within its budget
            // only: what it leaves behind, lease expiry ends.
            let shut = self
                .shutdown_at
                .get(&client)
                .is_some_and(|&s| s <= deadline);
            if shut || self.lapsed.contains(&(client, token)) {
                continue;
            }
            if self
                .grants
                .get(&token)
                .is_some_and(|t| t.expires_at > deadline)
            {
                // Only lease expiry would not have freed it by then: the
                // release had to.
                self.checked.release_watches += 1;
            }
            if let Some(t) = self.live_at(token, deadline) {
                return Err((
                    Check::Lingering,
                    Some(client),
                    format!(
                        "c{client} put a release of ({}, {token}) under way, and with the cluster healthy the grant is still held at {deadline} (its lease runs until {}); granted to c{}",
                        t.key, t.expires_at, t.client
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Invariant 8 over the grants a cluster answered (the replicated
/// cluster's scenarios): for each key, tokens strictly increase, and no
/// two grants are live at once. A grant is live from its `G` until the
/// lease end of the member that answered it (moved by every renewal a
/// member answered, never back), or until a member answered `D` to its
/// release, or its release was committed unanswered (its holder asked; the
/// leader that decided it stepped down before the commit, and a later one
/// committed the entry with its own). Only answers count: a decision never
/// answered is no grant.
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "raft"), allow(dead_code))]
pub(super) struct Answered {
    keys: BTreeMap<Key, AnsweredKey>,
    /// Grants checked.
    pub(super) grants: u64,
}

/// One key's answered grants.
#[derive(Debug, Default)]
struct AnsweredKey {
    /// The greatest token answered.
    last: u64,
    /// Grants that may still be live: token, lease end, release.
    live: Vec<(u64, Time, Option<Time>)>,
}

#[cfg_attr(not(feature = "raft"), allow(dead_code))]
impl Answered {
    /// A `G` to an acquire of `key` with `token`, written at `now`, whose
    /// lease ends at `end` by the member that answered; `released` tells
    /// whether the release of an earlier grant of the key is committed.
    pub(super) fn granted(
        &mut self,
        key: &Key,
        token: u64,
        end: Time,
        now: Time,
        released: impl Fn(u64) -> bool,
    ) -> Result<(), Failure> {
        self.grants += 1;
        let k = self.keys.entry(key.clone()).or_default();
        if token <= k.last {
            return Err((
                Check::ServerGrants,
                None,
                format!(
                    "a grant of {key} with token {token} was answered at {now}, after one with token {}",
                    k.last
                ),
            ));
        }
        k.last = token;
        k.live.retain(|&(token, end, answered)| {
            end > now && answered.map_or(true, |r| r > now) && !released(token)
        });
        if let Some(&(other, other_end, _)) = k.live.first() {
            return Err((
                Check::ServerGrants,
                None,
                format!(
                    "a grant of {key} with token {token} was answered at {now} while the grant with token {other} is live until {other_end}"
                ),
            ));
        }
        k.live.push((token, end, None));
        Ok(())
    }

    /// A `G` to a renewal of `(key, token)`: its lease ends at `end` at
    /// least.
    pub(super) fn renewed(&mut self, key: &Key, token: u64, end: Time) {
        if let Some(k) = self.keys.get_mut(key) {
            for g in k.live.iter_mut().filter(|g| g.0 == token) {
                g.1 = g.1.max(end);
            }
        }
    }

    /// A `D` to a release of `(key, token)`, written at `now`.
    pub(super) fn released(&mut self, key: &Key, token: u64, now: Time) {
        if let Some(k) = self.keys.get_mut(key) {
            for g in k.live.iter_mut().filter(|g| g.0 == token) {
                g.2 = g.2.or(Some(now));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answered_grants_of_a_key_never_overlap_and_their_tokens_increase() {
        let k = key("k");
        let mut a = Answered::default();
        a.granted(&k, 10, t(1_000), t(0), |_| false).unwrap();
        // Another key is independent.
        a.granted(&key("j"), 5, t(1_000), t(0), |_| false).unwrap();
        // Live until 1,000 (renewed to 1,500): a grant before is caught.
        a.renewed(&k, 10, t(1_500));
        let (check, _, detail) = a
            .granted(&k, 11, t(3_000), t(1_200), |_| false)
            .unwrap_err();
        assert_eq!(check, Check::ServerGrants);
        assert!(detail.contains("token 10 is live until"), "{detail}");
        // Its lease over, the next grant is fine; a smaller token is not.
        let mut a = Answered::default();
        a.granted(&k, 10, t(1_000), t(0), |_| false).unwrap();
        a.granted(&k, 11, t(3_000), t(1_000), |_| false).unwrap();
        assert_eq!(
            a.granted(&k, 11, t(9_000), t(5_000), |_| false)
                .unwrap_err()
                .0,
            Check::ServerGrants
        );
        // Released: free from then on.
        let mut a = Answered::default();
        a.granted(&k, 10, t(1_000), t(0), |_| false).unwrap();
        a.released(&k, 10, t(400));
        a.granted(&k, 12, t(1_000), t(400), |_| false).unwrap();
        // Its release committed but never answered: free too.
        a.granted(&k, 13, t(1_000), t(500), |token| token == 12)
            .unwrap();
        assert_eq!(a.grants, 3);
    }

    fn t(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    fn key(s: &str) -> Key {
        Key::new(s).unwrap()
    }

    #[test]
    fn two_valid_grants_of_one_key_are_a_violation_and_expired_or_ended_ones_are_not() {
        let mut ledger = Ledger::default();
        let k = key("k");
        ledger.hold(0, &k, 1, t(1_000), t(0)).unwrap();
        // Another key is independent.
        ledger.hold(1, &key("j"), 2, t(1_000), t(10)).unwrap();
        // Same key, while the first is valid: caught, for any client.
        let (check, client, _) = ledger.hold(1, &k, 3, t(2_000), t(500)).unwrap_err();
        assert_eq!((check, client), (Check::MutualExclusion, Some(1)));
        assert!(ledger.hold(0, &k, 3, t(2_000), t(999)).is_err());
        // At its valid_until, the first is no longer valid.
        ledger.hold(1, &k, 4, t(3_000), t(1_000)).unwrap();
        // Given up early: free from then on.
        ledger.unhold(1, &k, 4, t(1_500));
        ledger.hold(2, &k, 5, t(4_000), t(1_500)).unwrap();
        // Handed over already past its validity: held by nobody.
        ledger.hold(3, &k, 6, t(1_600), t(1_700)).unwrap();
        ledger.hold(3, &key("j"), 7, t(1_200), t(950)).unwrap_err();
        assert_eq!(ledger.checked.holds, 4);
    }

    #[test]
    fn a_resource_refuses_an_older_token_and_a_valid_writer_must_never_meet_that() {
        let mut ledger = Ledger::default();
        let k = key("k");
        ledger.hold(0, &k, 5, t(1_000), t(0)).unwrap();
        ledger.write(0, &k, 5, t(10)).unwrap();
        // A late write with an older token is refused, and that is fine.
        ledger.write(1, &k, 3, t(20)).unwrap();
        // A late write with a newer token is accepted...
        ledger.write(2, &k, 9, t(30)).unwrap();
        // ...and then the valid holder's write is refused: a violation.
        let (check, client, _) = ledger.write(0, &k, 5, t(40)).unwrap_err();
        assert_eq!((check, client), (Check::Fencing, Some(0)));
        assert_eq!(
            ledger.writes,
            Writes {
                valid: 1,
                stale_accepted: 1,
                stale_refused: 1
            }
        );
    }

    #[test]
    fn an_operation_past_its_deadline_and_an_overrun_shutdown_are_violations() {
        let mut ledger = Ledger::default();
        let op = OpId(3);
        let info = OpInfo {
            what: "acquire".into(),
            submitted: t(0),
            deadline: t(100),
        };
        ledger.op_started(0, op, info.clone());
        ledger.check(t(100)).unwrap();
        assert_eq!(ledger.check(t(101)).unwrap_err().0, Check::Deadline);
        ledger.op_ended(0, op);
        ledger.check(t(101)).unwrap();
        ledger.shutdown_started(1, t(0), t(50));
        assert_eq!(ledger.check(t(51)).unwrap_err().0, Check::Deadline);
        ledger.shutdown_complete(1);
        ledger.check(t(51)).unwrap();
    }

    #[test]
    fn an_indeterminate_grant_must_be_gone_by_its_settles_by() {
        let mut ledger = Ledger::default();
        let (a, b, c) = (OpId(1), OpId(2), OpId(3));
        // Granted, then the acquire ended Indeterminate; its lease runs past
        // the promise.
        ledger.grant_made(1, key("k"), 0, Some(a), t(500));
        ledger.indeterminate(0, a, t(400));
        // Ended Indeterminate first, granted later but within the promise.
        ledger.indeterminate(0, b, t(900));
        ledger.grant_made(2, key("k"), 0, Some(b), t(800));
        // Past the promise, but released before it.
        ledger.grant_made(3, key("j"), 0, Some(c), t(2_000));
        ledger.indeterminate(0, c, t(1_000));
        ledger.released(&key("j"), 3, t(950));
        ledger.check(t(400)).unwrap();
        let (check, _, detail) = ledger.check(t(401)).unwrap_err();
        assert_eq!(check, Check::Lingering);
        assert!(detail.contains("(k, 1)"), "{detail}");
        ledger.check(Time::MAX).unwrap();
        assert_eq!(ledger.checked.settle_watches, 3);
    }

    #[test]
    fn a_release_under_way_must_free_the_grant_once_the_cluster_is_healthy() {
        let grace = Duration::from_millis(100);
        let mut ledger = Ledger::default();
        for token in 1..=4 {
            ledger.grant_made(token, key("k"), 0, None, t(10_000));
        }
        // Before healing: deadlines wait for it.
        ledger.release_started(0, 1, t(0), None, grace);
        ledger.release_started(0, 2, t(0), None, grace);
        ledger.release_started(1, 3, t(0), None, grace);
        ledger.check(t(5_000)).unwrap();
        ledger.healthy(t(1_000), |_| grace);
        // Token 1 is released in time; token 2's release lapsed (the
        // accepted boundary); client 1 shut down before the deadline.
        ledger.released(&key("k"), 1, t(1_050));
        ledger.release_lapsed(0, 2);
        ledger.shutdown_started(1, t(1_090), t(1_090));
        ledger.shutdown_complete(1);
        ledger.check(t(1_101)).unwrap();
        // After healing: its own deadline, and it lingers.
        ledger.release_started(0, 4, t(2_000), Some(t(1_000)), grace);
        ledger.check(t(2_100)).unwrap();
        let (check, client, _) = ledger.check(t(2_101)).unwrap_err();
        assert_eq!((check, client), (Check::Lingering, Some(0)));
        assert_eq!(ledger.checked.release_watches, 2);
    }
}
