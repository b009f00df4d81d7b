//! Answers held back until what they depend on is committed: a replicated
//! cluster's leader (PROTOCOL.md 4.3, "An answer waits for what it depends
//! on").
//!
//! The leader's table notes its decisions; the driver takes those of one
//! turn at a time ([`Server::take_decisions`](super::Server::take_decisions))
//! as one Raft entry, and says when that turn's entry is committed
//! ([`Server::handle_committed`](super::Server::handle_committed)). An
//! answer is computed at once, against the table with every decision
//! applied, but goes out only once every turn up to the one that was open
//! when it was computed is committed: the turn still being filled if it
//! holds decisions (the answer may depend on one of them), else the last
//! one taken. Those barriers never decrease, so answers leave in the order
//! they were made. An answer held back still counts against its
//! connection's window.

use std::collections::VecDeque;

use bytes::BytesMut;

use super::action::ConnId;

/// One answer waiting: the turn it waits for, its connection, and how
/// many bytes of [`Holdback`]'s buffer its frame takes.
#[derive(Debug)]
struct Held {
    after: u64,
    conn: ConnId,
    len: usize,
}

/// The turns taken and committed, and the answers waiting for them.
#[derive(Debug, Default)]
pub(crate) struct Holdback {
    /// Turns whose decisions the driver took (each one entry).
    taken: u64,
    /// The latest turn whose entry is committed.
    committed: u64,
    held: VecDeque<Held>,
    /// The frames of `held`, one after another, in one buffer (an answer
    /// costs no allocation of its own).
    frames: BytesMut,
    /// The simulator's sabotage `answer-before-commit`: nothing is ever
    /// held back.
    #[cfg(feature = "sabotage")]
    pub(crate) never_hold: bool,
}

impl Holdback {
    /// The turn an answer computed now waits for, if it must wait:
    /// `open` tells whether the turn being filled holds decisions.
    pub(crate) fn barrier(&self, open: bool) -> Option<u64> {
        #[cfg(feature = "sabotage")]
        if self.never_hold {
            return None;
        }
        let after = if open { self.taken + 1 } else { self.taken };
        (after > self.committed).then_some(after)
    }

    /// Holds the answer `encode` writes for `conn` until turn `after` is
    /// committed.
    pub(crate) fn hold(&mut self, after: u64, conn: ConnId, encode: impl FnOnce(&mut BytesMut)) {
        let before = self.frames.len();
        encode(&mut self.frames);
        let len = self.frames.len() - before;
        self.held.push_back(Held { after, conn, len });
    }

    /// Counts a turn taken; its number.
    pub(crate) fn take_turn(&mut self) -> u64 {
        self.taken += 1;
        self.taken
    }

    /// Notes that `turn`'s entry is committed, and hands `out` each answer
    /// that may go now, in order, with its connection.
    pub(crate) fn commit(&mut self, turn: u64, mut out: impl FnMut(ConnId, &[u8])) {
        self.committed = self.committed.max(turn.min(self.taken));
        let mut at = 0;
        while let Some(held) = self.held.front() {
            if held.after > self.committed {
                break;
            }
            out(held.conn, &self.frames[at..at + held.len]);
            at += held.len;
            self.held.pop_front();
        }
        if self.held.is_empty() {
            // Its capacity stays for the next ones.
            self.frames.clear();
        } else {
            let _ = self.frames.split_to(at);
        }
    }

    /// Forgets every answer held and every turn not committed: the
    /// leadership they were made under is over. Later turns count on.
    pub(crate) fn discard(&mut self) -> usize {
        self.committed = self.taken;
        let n = self.held.len();
        self.held.clear();
        self.frames.clear();
        n
    }

    /// How many answers wait.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(h: &mut Holdback, after: u64, conn: u64) {
        h.hold(after, ConnId(conn), |buf| {
            buf.extend_from_slice(format!("frame {conn}\n").as_bytes())
        });
    }

    /// The connections (and their frames) `turn`'s commit lets go.
    fn commit(h: &mut Holdback, turn: u64) -> Vec<u64> {
        let mut out = Vec::new();
        h.commit(turn, |conn, frame| {
            assert_eq!(frame, format!("frame {}\n", conn.0).as_bytes());
            out.push(conn.0);
        });
        out
    }

    #[test]
    fn answers_wait_for_their_turn_and_leave_in_order() {
        let mut h = Holdback::default();
        // Nothing taken, nothing open: nothing to wait for.
        assert_eq!(h.barrier(false), None);
        // Decisions in the open turn: wait for turn 1.
        assert_eq!(h.barrier(true), Some(1));
        hold(&mut h, 1, 1);
        assert_eq!(h.take_turn(), 1);
        // Computed after turn 1 was taken, no decision since: turn 1 too.
        assert_eq!(h.barrier(false), Some(1));
        hold(&mut h, 1, 2);
        hold(&mut h, 2, 3);
        assert_eq!(h.take_turn(), 2);
        // A commit of a turn not taken yet counts only as far as taken.
        assert_eq!(commit(&mut h, 0), [0u64; 0]);
        assert_eq!(commit(&mut h, 1), [1, 2]);
        assert_eq!(h.len(), 1);
        assert_eq!(h.barrier(false), Some(2));
        // Held after a commit let some go: its frame is still whole.
        hold(&mut h, 2, 4);
        assert_eq!(commit(&mut h, 5), [3, 4]);
        assert_eq!(h.barrier(false), None);
    }

    #[cfg(feature = "sabotage")]
    #[test]
    fn the_sabotage_holds_nothing_back() {
        let mut h = Holdback {
            never_hold: true,
            ..Holdback::default()
        };
        assert_eq!(h.barrier(true), None);
        h.take_turn();
        assert_eq!(h.barrier(false), None);
    }

    #[test]
    fn a_discard_drops_what_was_held_and_later_turns_count_on() {
        let mut h = Holdback::default();
        hold(&mut h, 1, 1);
        h.take_turn();
        assert_eq!(h.discard(), 1);
        assert_eq!(h.barrier(false), None);
        assert_eq!(commit(&mut h, 1), [0u64; 0]);
        assert_eq!(h.barrier(true), Some(2));
    }
}
