//! The server's side of a replicated cluster (PROTOCOL.md 4.3, feature
//! `raft`): the seam between [`Server`] and the member that drives it
//! ([`Replica`](super::raft::Replica)). A member's table notes every
//! decision (its journal, `LockTable::note`); the replica takes them one
//! turn at a time, as one Raft entry, and says when an entry is
//! committed; the answers that depend on it wait until then
//! (`holdback.rs`). A single server has none of this: its answers go out
//! as they are made.

use super::holdback::Holdback;
use super::{Decision, LockTable, Phase, Role, Server};
use crate::server::action::ConnId;
use crate::time::Time;
use crate::wire::ServerFrame;

impl Server {
    /// Makes this server a member of a replicated cluster: its table notes
    /// every decision as a leader's, and its answers wait for the commit of
    /// what they depend on (`holdback.rs`). The driver (the Raft node)
    /// takes the decisions of each turn ([`Server::take_decisions`]) and
    /// says what is committed ([`Server::handle_committed`]).
    pub(crate) fn replicate(&mut self) {
        self.table.set_journaling(true);
        self.holdback.get_or_insert_with(Holdback::default);
    }

    /// The decisions made since the last call, as one turn: its number,
    /// which [`Server::handle_committed`] is given back once their entry
    /// is committed. `None` when none was made.
    pub(crate) fn take_decisions(&mut self) -> Option<(u64, Vec<Decision>)> {
        if !self.table.has_journal() {
            return None;
        }
        let turn = self.holdback.as_mut()?.take_turn();
        Some((turn, self.table.take_journal()))
    }

    /// The entry of `turn` (and so every one before it) is committed: the
    /// answers that waited for it go out.
    pub(crate) fn handle_committed(&mut self, now: Time, turn: u64) {
        self.advance(now);
        let Some(mut holdback) = self.holdback.take() else {
            return;
        };
        holdback.commit(turn, |conn, frame| {
            let Some(Phase::Ready { unanswered, .. }) =
                self.conns.get_mut(&conn).map(|c| &mut c.phase)
            else {
                // Its connection closed meanwhile.
                return;
            };
            *unanswered = unanswered.saturating_sub(1);
            self.output(conn).extend_from_slice(frame);
        });
        self.holdback = Some(holdback);
    }

    /// Leads with `table`, a member's copy of the committed table: tokens
    /// from here on are of `epoch` (`floor + index` of the next entry).
    pub(crate) fn lead_replicated(&mut self, now: Time, mut table: LockTable, epoch: u64) {
        self.advance(now);
        self.close_waiting_connections();
        table.drop_all_waiters();
        table.set_journaling(true);
        table.set_entry_epoch(epoch);
        self.table = table;
        self.discard_held();
        self.step_down(Role::Leader);
        self.advance(now);
    }

    /// Stops leading (if it did) and takes `role`: clients are closed with
    /// its farewell, answers held back are never sent, and the leader's
    /// table, with what was not committed, is dropped.
    pub(crate) fn follow_replicated(&mut self, now: Time, role: Role) {
        self.advance(now);
        self.step_down(role);
        self.discard_held();
        let mut table = self.table.successor();
        table.set_journaling(true);
        self.table = table;
    }

    /// A new leader takes `decisions` over as its own (the grants of a
    /// backup it restores): in its table, and in the next entry.
    pub(crate) fn restore_replicated(&mut self, now: Time, decisions: Vec<Decision>) {
        self.advance(now);
        for d in decisions {
            self.table.take_over(now, d);
        }
    }

    /// Tokens of decisions from here on are of `epoch`: the next entry's.
    pub(crate) fn set_entry_epoch(&mut self, epoch: u64) {
        self.table.set_entry_epoch(epoch);
    }

    /// Holds `frame`, an answer on `conn`, back until what it may depend
    /// on is committed, if this server replicates: whether it did. An
    /// answer held back counts against its connection's window.
    pub(super) fn hold_back(&mut self, conn: ConnId, frame: &ServerFrame<'_>) -> bool {
        let open = self.table.has_journal();
        let Some(holdback) = &mut self.holdback else {
            return false;
        };
        let Some(after) = holdback.barrier(open) else {
            return false;
        };
        if let Some(Phase::Ready { unanswered, .. }) =
            self.conns.get_mut(&conn).map(|c| &mut c.phase)
        {
            *unanswered = unanswered.saturating_add(1);
        }
        holdback.hold(after, conn, |buf| frame.encode(buf));
        true
    }

    /// What was not committed may never be: none of the answers held back
    /// is said.
    pub(super) fn discard_held(&mut self) {
        if let Some(holdback) = &mut self.holdback {
            holdback.discard();
        }
    }
}

/// The simulator's sabotage `answer-before-commit` (feature `sabotage`).
#[cfg(feature = "sabotage")]
impl Server {
    /// Breaks PROTOCOL.md 4.3 on purpose, for the simulator to catch: as a
    /// member of a replicated cluster, this server sends every answer as
    /// soon as it is computed, never holding one back for the commit of
    /// what it depends on. Call it before the server is handed to its
    /// replica.
    #[doc(hidden)]
    pub fn answer_before_commit(&mut self) {
        self.holdback
            .get_or_insert_with(Holdback::default)
            .never_hold = true;
    }
}
