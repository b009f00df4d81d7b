//! The schedule: every event to come, earliest first, and at equal times
//! in the order it was scheduled, so that the order is a function of the
//! seed alone.

use core::cmp::Ordering;
use std::collections::BinaryHeap;

#[cfg(feature = "raft")]
use crate::sim::raft as replicated;
use crate::sim::{cluster, net, workload, FaultKind};
use crate::time::Time;

/// Something scheduled to happen.
#[derive(Debug)]
pub(super) enum Ev {
    /// Something on its way along a link.
    Net(net::Ev),
    /// A fault of a scheduled kind is due.
    Fault(FaultKind),
    /// Something the cluster scheduled.
    Cluster(cluster::Ev),
    /// Something an embedder scheduled.
    Workload(workload::Ev),
    /// Something the replicated cluster scheduled.
    #[cfg(feature = "raft")]
    Raft(replicated::Ev),
}

impl Ev {
    /// The event for the trace: its kind and two numbers.
    pub(super) fn trace(&self) -> (u64, u64, u64) {
        match self {
            Ev::Net(ev) => ev.trace(),
            Ev::Workload(ev) => match ev {
                workload::Ev::Work { client } => (9, *client as u64, 0),
                workload::Ev::Fate { client, no } => (10, *client as u64, *no),
                workload::Ev::Write { client, no } => (11, *client as u64, *no),
                workload::Ev::Zombie { client, token, .. } => (12, *client as u64, *token),
                workload::Ev::Shutdown { client } => (13, *client as u64, 0),
                workload::Ev::Renew { client, no, .. } => (19, *client as u64, *no),
                workload::Ev::Hold { client, no } => (22, *client as u64, *no),
            },
            Ev::Fault(kind) => (14, kind.index() as u64, 0),
            Ev::Cluster(ev) => match ev {
                cluster::Ev::Restart { node } => (15, *node as u64, 0),
                cluster::Ev::Activate { node, life } => (16, *node as u64, *life),
                cluster::Ev::FixCredential { node, life } => (17, *node as u64, *life),
                cluster::Ev::Elect => (18, 0, 0),
                cluster::Ev::CrashLeader => (20, 0, 0),
                cluster::Ev::KeyExpired { node } => (21, *node as u64, 0),
            },
            #[cfg(feature = "raft")]
            Ev::Raft(ev) => ev.trace(),
        }
    }
}

/// The events to come.
#[derive(Default)]
pub(super) struct Schedule {
    heap: BinaryHeap<Scheduled>,
    seq: u64,
}

impl Schedule {
    /// Schedules `ev` at `at`, after everything scheduled at `at` before.
    pub(super) fn push(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// When the earliest event is due.
    pub(super) fn next_at(&self) -> Option<Time> {
        self.heap.peek().map(|s| s.at)
    }

    /// Takes the earliest event.
    pub(super) fn pop(&mut self) -> Option<Ev> {
        self.heap.pop().map(|s| s.ev)
    }
}

struct Scheduled {
    at: Time,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Scheduled) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Scheduled) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    /// Reversed: the heap's top is the earliest.
    fn cmp(&self, other: &Scheduled) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}
