//! What leader changes cost the holders that renew: the tally behind
//! [`Failovers`].
//!
//! The [`Tally`] follows every grant an embedder holds and has asked to
//! renew automatically, as the embedder knows it: its `valid_until` (from
//! its `Granted` and each `Renewed`) and the limit of its renewal. When a
//! leader stops leading, each such grant that is valid and still renewing
//! is one holder at that change. It is kept once a leader has renewed it
//! after the change (the simulator sees the `G` written) and its holder is
//! told `Renewed` while it is still valid; lost at a `LeaseLost`, or at a
//! `LeaseExpired` while its renewal was on; given up if its holder lets it
//! go first. A `G` written before the change and read after it (a leader
//! that stepped down answered it first) keeps nothing: the grant must
//! outlive the leader that granted it.

use core::time::Duration;
use std::collections::BTreeMap;

use super::Failovers;
use crate::client::{OpId, Outcome};
use crate::names::Key;
use crate::time::Time;

/// A grant held and renewed automatically.
#[derive(Debug)]
struct Renewing {
    /// Until when its holder may count on it.
    valid_until: Time,
    /// No renewal is sent from then on (the limit of its renewal).
    renew_until: Time,
    /// When a leader last renewed it (wrote a `G` to its `X`).
    renewed_at: Option<Time>,
    /// The leader changes it was a holder at and that are not settled yet,
    /// oldest first.
    changes: Vec<Time>,
}

/// The grants held and renewed automatically, and the counts.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Acquires that renew once granted, with the limit of their renewal.
    acquires: BTreeMap<(usize, OpId), Duration>,
    /// By client, key and token.
    grants: BTreeMap<(usize, Key, u64), Renewing>,
    pub(super) counts: Failovers,
}

impl Tally {
    /// `client` submitted the acquire `op`, to be renewed automatically for
    /// at most `limit` once granted (`None`: until released).
    pub(super) fn acquired(&mut self, client: usize, op: OpId, limit: Option<Duration>) {
        self.acquires
            .insert((client, op), limit.unwrap_or(Duration::MAX));
    }

    /// `client`'s operation `op` ended with `outcome` at `now`: a grant of
    /// an acquire that renews is followed from now on.
    pub(super) fn outcome(&mut self, client: usize, op: OpId, outcome: &Outcome, now: Time) {
        let Some(limit) = self.acquires.remove(&(client, op)) else {
            return;
        };
        if let Outcome::Granted(grant) = outcome {
            let key = (client, grant.key().clone(), grant.token());
            self.start(key, grant.valid_until(), now.saturating_add(limit));
        }
    }

    /// The embedder of `client` asked at `now` for the automatic renewal of
    /// `(key, token)`, valid until `valid_until`, for at most `limit`.
    pub(super) fn auto_renew(
        &mut self,
        client: usize,
        key: &Key,
        token: u64,
        valid_until: Time,
        limit: Option<Duration>,
        now: Time,
    ) {
        let renew_until = now.saturating_add(limit.unwrap_or(Duration::MAX));
        self.start((client, key.clone(), token), valid_until, renew_until);
    }

    fn start(&mut self, key: (usize, Key, u64), valid_until: Time, renew_until: Time) {
        let grant = self.grants.entry(key).or_insert(Renewing {
            valid_until,
            renew_until,
            renewed_at: None,
            changes: Vec::new(),
        });
        grant.valid_until = grant.valid_until.max(valid_until);
        grant.renew_until = renew_until;
    }

    /// The embedder of `client` let `(key, token)` go: released it, handed
    /// it back, or stopped renewing it.
    pub(super) fn given_up(&mut self, client: usize, key: &Key, token: u64) {
        if let Some(grant) = self.grants.remove(&(client, key.clone(), token)) {
            self.counts.given_up += grant.changes.len() as u64;
        }
    }

    /// `client` is shutting down: every renewal stops.
    pub(super) fn shutdown(&mut self, client: usize) {
        let counts = &mut self.counts;
        self.grants.retain(|&(c, _, _), grant| {
            if c == client {
                counts.given_up += grant.changes.len() as u64;
            }
            c != client
        });
    }

    /// A leader stopped leading at `now`: every grant valid and still
    /// renewing is a holder at this change.
    pub(super) fn leader_change(&mut self, now: Time) {
        self.counts.leader_changes += 1;
        for grant in self.grants.values_mut() {
            if grant.valid_until > now && grant.renew_until > now {
                grant.changes.push(now);
                self.counts.holders += 1;
            }
        }
    }

    /// A leader wrote a `G` to a renewal of `client`'s `(key, token)` at
    /// `now`.
    pub(super) fn cluster_renewed(&mut self, client: usize, key: &Key, token: u64, now: Time) {
        if let Some(grant) = self.grants.get_mut(&(client, key.clone(), token)) {
            grant.renewed_at = Some(now);
        }
    }

    /// `client` was told at `now` that `(key, token)` is renewed until
    /// `valid_until`: the changes before the `G` it reads are settled,
    /// kept, if the grant was still valid.
    pub(super) fn renewed(
        &mut self,
        client: usize,
        key: &Key,
        token: u64,
        valid_until: Time,
        now: Time,
    ) {
        let Some(grant) = self.grants.get_mut(&(client, key.clone(), token)) else {
            return;
        };
        // At most one renewal of a grant is in flight: the `G` read is the
        // latest written.
        if let Some(written) = grant.renewed_at.filter(|_| now < grant.valid_until) {
            let settled = grant.changes.partition_point(|&change| change <= written);
            if settled > 0 {
                grant.changes.drain(..settled);
                let counts = &mut self.counts;
                counts.kept += settled as u64;
                let left = grant.valid_until.saturating_duration_since(now);
                counts.least_left = Some(counts.least_left.map_or(left, |l| l.min(left)));
            }
        }
        grant.valid_until = grant.valid_until.max(valid_until);
    }

    /// `client` was told at `now` that `(key, token)` is lost
    /// (`LeaseLost`), or, `expired`, that its `valid_until` passed
    /// (`LeaseExpired`): either way automatic renewal stops. An expiry
    /// after the limit of the renewal is the embedder's own doing.
    pub(super) fn ended(&mut self, client: usize, key: &Key, token: u64, expired: bool, now: Time) {
        let Some(grant) = self.grants.remove(&(client, key.clone(), token)) else {
            return;
        };
        let unsettled = grant.changes.len() as u64;
        if expired && grant.renew_until <= now {
            self.counts.given_up += unsettled;
        } else {
            self.counts.lost += unsettled;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Time {
        Time::ZERO.saturating_add_millis(ms)
    }

    fn key(k: &str) -> Key {
        Key::new(k).unwrap()
    }

    #[test]
    fn a_grant_renewed_by_a_leader_after_the_change_is_kept() {
        let mut tally = Tally::default();
        tally.auto_renew(0, &key("k"), 7, t(3_000), None, t(0));
        tally.leader_change(t(1_000));
        // A `G` written before the change and read after it keeps nothing.
        tally.cluster_renewed(0, &key("k"), 7, t(990));
        tally.renewed(0, &key("k"), 7, t(3_990), t(1_010));
        assert_eq!(tally.counts.kept, 0);
        // The next renewal, by the new leader, does.
        tally.cluster_renewed(0, &key("k"), 7, t(2_500));
        tally.renewed(0, &key("k"), 7, t(5_500), t(2_510));
        assert_eq!(
            tally.counts,
            Failovers {
                leader_changes: 1,
                holders: 1,
                kept: 1,
                least_left: Some(Duration::from_millis(1_480)),
                ..Failovers::default()
            }
        );
    }

    #[test]
    fn a_renewal_read_after_the_grant_ran_out_keeps_nothing() {
        let mut tally = Tally::default();
        tally.auto_renew(0, &key("k"), 7, t(3_000), None, t(0));
        tally.leader_change(t(1_000));
        tally.cluster_renewed(0, &key("k"), 7, t(2_900));
        tally.renewed(0, &key("k"), 7, t(4_000), t(3_000));
        assert_eq!(tally.counts.kept, 0);
        tally.ended(0, &key("k"), 7, true, t(4_000));
        assert_eq!(tally.counts.lost, 1);
    }

    #[test]
    fn only_valid_grants_still_renewing_are_holders() {
        let mut tally = Tally::default();
        // Expired by the change; renewal limit passed; a plain holder.
        tally.auto_renew(0, &key("a"), 1, t(500), None, t(0));
        tally.auto_renew(
            0,
            &key("b"),
            2,
            t(3_000),
            Some(Duration::from_millis(800)),
            t(0),
        );
        tally.auto_renew(1, &key("c"), 3, t(3_000), None, t(0));
        tally.leader_change(t(1_000));
        assert_eq!(tally.counts.holders, 1);
        // A second change before the holder was renewed: both are settled
        // by the renewal after them.
        tally.leader_change(t(1_500));
        tally.cluster_renewed(1, &key("c"), 3, t(2_000));
        tally.renewed(1, &key("c"), 3, t(5_000), t(2_010));
        assert_eq!((tally.counts.holders, tally.counts.kept), (2, 2));
    }

    #[test]
    fn a_grant_let_go_is_given_up_and_one_lost_or_expired_is_lost() {
        let mut tally = Tally::default();
        for (client, token) in [(0, 1), (0, 2), (1, 3), (2, 4), (2, 5)] {
            tally.auto_renew(client, &key("k"), token, t(3_000), None, t(0));
        }
        // The limit of this one's renewal passes after the change.
        tally.auto_renew(
            3,
            &key("k"),
            6,
            t(3_000),
            Some(Duration::from_millis(1_500)),
            t(0),
        );
        tally.leader_change(t(1_000));
        tally.given_up(0, &key("k"), 1);
        tally.shutdown(0);
        tally.ended(1, &key("k"), 3, false, t(1_200));
        tally.ended(2, &key("k"), 4, true, t(3_000));
        tally.ended(3, &key("k"), 6, true, t(3_000));
        // Shutting down client 2 leaves the others alone.
        tally.shutdown(2);
        assert_eq!(
            tally.counts,
            Failovers {
                leader_changes: 1,
                holders: 6,
                kept: 0,
                lost: 2,
                given_up: 4,
                least_left: None,
            }
        );
    }
}
