//! Three parts of a [`Replica`](super::Replica) that own their state: when
//! raft-rs's ticks are due, what the driver is making durable, and the
//! leader's entries proposed and not yet committed.

use core::time::Duration;
use std::collections::VecDeque;

use raft::prelude::Message;

use crate::server::Decision;
use crate::time::Time;

/// raft-rs counts time in ticks; inputs come with times.
#[derive(Debug)]
pub(super) struct Ticker {
    tick: Duration,
    next: Time,
    /// The most ticks fired by one input, less one: after a long stop,
    /// enough for every timer to fire once.
    max: usize,
}

impl Ticker {
    pub(super) fn new(tick: Duration, now: Time, max: usize) -> Ticker {
        Ticker {
            tick,
            next: now.saturating_add(tick),
            max,
        }
    }

    /// How many ticks to fire at `now`, the clock passed on past them;
    /// none when `hold` (they are passed, not kept).
    pub(super) fn due(&mut self, now: Time, hold: bool) -> usize {
        let mut ticks = 0;
        while self.next <= now {
            if ticks <= self.max && !hold {
                ticks += 1;
            }
            self.next = self.next.saturating_add(self.tick);
        }
        ticks
    }

    /// When the next tick is due.
    pub(super) fn next(&self) -> Time {
        self.next
    }

    /// The election timeout: [`ELECTION_TICKS`](super::ELECTION_TICKS)
    /// ticks.
    pub(super) fn election_timeout(&self) -> Duration {
        self.tick * super::ELECTION_TICKS as u32
    }
}

/// One [`Persist`](super::Persist) handed out, or a Ready with nothing to
/// write behind one, whose durability the driver has still to say.
#[derive(Debug)]
struct InFlight {
    /// The raft-rs Ready it came from; none for one that only records the
    /// cluster's identity.
    ready: Option<u64>,
    /// Messages that may go only once it is durable.
    after: Vec<Message>,
    /// Whether it was handed out (a Ready with nothing to write is durable
    /// with the write before it).
    wrote: bool,
}

/// What the driver is making durable, in the order it was handed out:
/// several writes may be under way.
#[derive(Debug, Default)]
pub(super) struct Persists {
    queue: VecDeque<InFlight>,
}

impl Persists {
    /// Nothing is under way.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Ready `number` was handed out to be written (`wrote`), or had
    /// nothing to write and waits behind a write under way; `after` goes
    /// once it is durable.
    pub(super) fn push_ready(&mut self, number: u64, after: Vec<Message>, wrote: bool) {
        self.queue.push_back(InFlight {
            ready: Some(number),
            after,
            wrote,
        });
    }

    /// A write that only records the cluster's identity was handed out.
    pub(super) fn push_record(&mut self) {
        self.queue.push_back(InFlight {
            ready: None,
            after: Vec::new(),
            wrote: true,
        });
    }

    /// The oldest write handed out is durable, and with it the Readies
    /// with nothing to write right behind it: what waited for each is
    /// handed to `send`, in order. The latest Ready among them, for
    /// raft-rs.
    pub(super) fn durable(&mut self, mut send: impl FnMut(Vec<Message>)) -> Option<u64> {
        let mut said = false;
        let mut last = None;
        while let Some(next) = self.queue.pop_front() {
            if next.wrote && said {
                self.queue.push_front(next);
                break;
            }
            said = true;
            last = next.ready.or(last);
            send(next.after);
        }
        last
    }
}

/// One entry the leader proposed and has not seen committed.
#[derive(Debug)]
pub(super) struct Proposal {
    /// The server's turn (0: none, the floor or the identity alone).
    pub(super) turn: u64,
    pub(super) index: u64,
    pub(super) term: u64,
    /// What it holds, so that the leader applies it to its copy without
    /// reading its own bytes back.
    pub(super) decisions: Vec<Decision>,
}

/// What the commit of an entry made of the proposal it reached.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Settled {
    /// The proposal of `turn` is committed.
    Committed { turn: u64 },
    /// Another leader's entry took a proposal's place: none of the others
    /// will be committed as proposed either.
    Replaced,
}

/// The leader's entries proposed and not yet committed, in order, at most
/// `max` at once (decisions made meanwhile wait for the next one).
#[derive(Debug)]
pub(super) struct Proposals {
    queue: VecDeque<Proposal>,
    max: usize,
}

impl Proposals {
    pub(super) fn new(max: usize) -> Proposals {
        Proposals {
            queue: VecDeque::new(),
            max: max.max(1),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    /// As many wait for their commit as may.
    pub(super) fn is_full(&self) -> bool {
        self.queue.len() >= self.max
    }

    pub(super) fn push(&mut self, proposal: Proposal) {
        self.queue.push_back(proposal);
    }

    /// None will be committed as proposed (leadership ended).
    pub(super) fn clear(&mut self) {
        self.queue.clear();
    }

    /// The decisions of the entry at `index` of `term`, if it is this
    /// leader's own proposal: taken, for its copy.
    pub(super) fn take_decisions(&mut self, index: u64, term: u64) -> Option<Vec<Decision>> {
        match self.queue.front_mut() {
            Some(p) if p.index == index && p.term == term => {
                Some(core::mem::take(&mut p.decisions))
            }
            _ => None,
        }
    }

    /// The entry at `index` of `term` is committed: what that makes of
    /// the proposals it reaches (none if the oldest is later).
    pub(super) fn settle(&mut self, index: u64, term: u64) -> Option<Settled> {
        let front = self.queue.front()?;
        if front.index > index {
            return None;
        }
        let proposal = self.queue.pop_front()?;
        Some(if proposal.index == index && proposal.term == term {
            Settled::Committed {
                turn: proposal.turn,
            }
        } else {
            Settled::Replaced
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposal(turn: u64, index: u64, term: u64) -> Proposal {
        Proposal {
            turn,
            index,
            term,
            decisions: vec![Decision::Floor { epoch: turn }],
        }
    }

    #[test]
    fn ticks_fire_as_time_passes_at_most_a_bound_after_a_stop_and_none_held() {
        let tick = Duration::from_millis(10);
        let mut t = Ticker::new(tick, Time::ZERO, 3);
        let at = |ms| Time::ZERO.saturating_add(Duration::from_millis(ms));
        assert_eq!(t.due(at(9), false), 0);
        assert_eq!(t.due(at(10), false), 1);
        assert_eq!(t.next(), at(20));
        assert_eq!(t.due(at(45), false), 3);
        // A long stop: every timer once, the clock passed on.
        assert_eq!(t.due(at(10_000), false), 4);
        assert_eq!(t.next(), at(10_010));
        // Held: passed, not kept.
        assert_eq!(t.due(at(10_100), true), 0);
        assert_eq!(t.due(at(10_100), false), 0);
        assert_eq!(t.next(), at(10_110));
    }

    #[test]
    fn a_write_is_durable_with_the_empty_readies_behind_it_in_order() {
        let mut p = Persists::default();
        let msg = |to| Message {
            to,
            ..Message::default()
        };
        p.push_ready(1, vec![msg(1)], true);
        p.push_ready(2, vec![msg(2)], false);
        p.push_record();
        p.push_ready(3, vec![msg(3)], true);
        let mut sent = Vec::new();
        assert_eq!(p.durable(|m| sent.extend(m)), Some(2));
        assert_eq!(sent.iter().map(|m| m.to).collect::<Vec<_>>(), [1, 2]);
        // The identity's record: durable, no Ready of its own.
        assert_eq!(p.durable(|m| sent.extend(m)), None);
        assert_eq!(p.durable(|m| sent.extend(m)), Some(3));
        assert!(p.is_empty());
        assert_eq!(p.durable(|_| unreachable!("nothing under way")), None);
    }

    #[test]
    fn a_commit_settles_the_proposal_it_reaches_or_says_it_was_replaced() {
        let mut p = Proposals::new(2);
        p.push(proposal(7, 5, 2));
        assert!(!p.is_full());
        p.push(proposal(8, 6, 2));
        assert!(p.is_full());
        assert_eq!(p.settle(4, 2), None, "before the oldest");
        assert_eq!(
            p.take_decisions(5, 2),
            Some(vec![Decision::Floor { epoch: 7 }])
        );
        assert_eq!(p.take_decisions(5, 3), None, "another term's entry");
        assert_eq!(p.settle(5, 2), Some(Settled::Committed { turn: 7 }));
        // Entry 6 committed of another term: another leader's.
        assert_eq!(p.settle(6, 3), Some(Settled::Replaced));
        assert_eq!(p.len(), 0);
        assert_eq!(Proposals::new(0).max, 1);
    }
}
