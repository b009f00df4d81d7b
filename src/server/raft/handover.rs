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
}

impl AdminRefusal {
    /// The `error` value CLI.md gives it.
    pub fn code(&self) -> &'static str {
        match self {
            AdminRefusal::NotLeader { .. } => "not_leader",
            AdminRefusal::UnknownMember { .. } => "unknown_member",
            AdminRefusal::NotCaughtUp => "not_caught_up",
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
        prs.iter()
            .filter(|&(&id, p)| id != me && p.recent_active && voters.contains(id))
            .max_by(|(a, p), (b, q)| p.matched.cmp(&q.matched).then(b.cmp(a)))
            .map(|(&id, _)| id)
            .ok_or(AdminRefusal::NotCaughtUp)
    }
}
