//! A leadership transfer (PROTOCOL.md 4.4, "Leadership transfer"): to
//! whom a leader hands over, and what it says to its clients when it does.
//!
//! The transfer itself is raft-rs's: the leader brings the member it names
//! up to date, then tells it to stand at once (a timeout-now), and gives
//! up if that has not made it leader within an election timeout. While a
//! transfer runs raft-rs drops every proposal, so the leader proposes
//! nothing meanwhile: the decisions it makes wait in its table and go in
//! the next entry if the transfer is given up, or are dropped with its
//! table when it ends, as at any loss of leadership (what was sent is
//! Indeterminate to its clients). A leader that stops leading while it
//! hands over sends its clients `M <the member it handed to>` before it
//! closes them, rather than `E no_leader`: the new leader is known before
//! it has said a word.

use raft::ProgressTracker;
use thiserror::Error;

/// Why an administrative request was refused: its `error` value in
/// CLI.md's `ticketing cluster` is [`AdminRefusal::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AdminRefusal {
    /// This member does not lead; `leader` is the one it knows, if any.
    #[error("this member does not lead (the leader is {})", match .leader { Some(id) => format!("member {id}"), None => "unknown".to_string() })]
    NotLeader {
        /// The leader's Raft id, when known.
        leader: Option<u64>,
    },
    /// No member of the configuration has this id.
    #[error("member {id} is not in the configuration")]
    UnknownMember {
        /// The id asked for.
        id: u64,
    },
    /// No other voter is in touch and caught up enough to hand over to.
    #[error("no other member is caught up")]
    NotCaughtUp,
    /// The member to add is in the configuration already.
    #[error("member {id} is in the configuration already")]
    AlreadyMember {
        /// The id asked for.
        id: u64,
    },
    /// A change of the configuration is under way: one at a time.
    #[error("another change of the configuration is under way")]
    ChangeInFlight,
    /// The voters that would remain, of those the leader hears from,
    /// could not form a majority of the new configuration.
    #[error("the members that would remain and answer could not form a majority")]
    WouldLoseMajority,
    /// The leader was asked to remove itself: it hands over to `to`
    /// first, which is to be asked again.
    #[error("this member leads: it hands over to member {to} first, which is to be asked")]
    HandingOver {
        /// The member it hands over to.
        to: u64,
    },
}

impl AdminRefusal {
    /// The `error` value CLI.md gives it.
    pub fn code(&self) -> &'static str {
        match self {
            AdminRefusal::NotLeader { .. } => "not_leader",
            AdminRefusal::UnknownMember { .. } => "unknown_member",
            AdminRefusal::NotCaughtUp => "not_caught_up",
            AdminRefusal::AlreadyMember { .. } => "already_member",
            AdminRefusal::ChangeInFlight => "change_in_flight",
            AdminRefusal::WouldLoseMajority => "would_lose_majority",
            AdminRefusal::HandingOver { .. } => "handing_over",
        }
    }
}

#[cfg(test)]
#[test]
fn every_code_is_an_atom() {
    for refusal in [
        AdminRefusal::NotLeader { leader: None },
        AdminRefusal::UnknownMember { id: 1 },
        AdminRefusal::NotCaughtUp,
        AdminRefusal::AlreadyMember { id: 1 },
        AdminRefusal::ChangeInFlight,
        AdminRefusal::WouldLoseMajority,
        AdminRefusal::HandingOver { to: 2 },
    ] {
        assert!(
            crate::names::Name::new(refusal.code()).is_ok(),
            "{refusal:?}"
        );
    }
}

/// The member a leader is handing over to, from the moment it was asked
/// until it stops leading or raft-rs gives the transfer up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Handover {
    pub(super) to: u64,
}

impl Handover {
    /// The member to hand over to: `named`, if it is another voter; else
    /// the voter, other than `me`, the leader heard from lately whose log
    /// matches the most of its own (the lowest id among equals).
    pub(super) fn choose(
        prs: &ProgressTracker,
        me: u64,
        named: Option<u64>,
    ) -> Result<u64, AdminRefusal> {
        let voters = prs.conf().voters();
        if let Some(id) = named {
            return if voters.contains(id) {
                Ok(id)
            } else {
                Err(AdminRefusal::UnknownMember { id })
            };
        }
        Handover::most_caught_up(prs, me, |id| voters.contains(id)).ok_or(AdminRefusal::NotCaughtUp)
    }

    /// Of the members `eligible` says, other than `me`, the one the leader
    /// heard from lately whose log matches the most of its own (the
    /// lowest id among equals).
    pub(super) fn most_caught_up(
        prs: &ProgressTracker,
        me: u64,
        eligible: impl Fn(u64) -> bool,
    ) -> Option<u64> {
        prs.iter()
            .filter(|&(&id, p)| id != me && p.recent_active && eligible(id))
            .max_by(|(a, p), (b, q)| p.matched.cmp(&q.matched).then(b.cmp(a)))
            .map(|(&id, _)| id)
    }
}
