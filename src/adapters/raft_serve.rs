//! A member of a replicated cluster on tokio (feature `raft`): the sans-IO
//! [`Replica`] behind the same serving task as a single server
//! (`serve.rs`), with its two sources of its own:
//!
//! - **Peers** ([`Peers`]): Raft's messages come in authenticated and go
//!   out through bounded queues.
//! - **The disk** ([`RaftDisk`]): each [`Persist`] is written and synced
//!   on a thread of its own, so that clients are read and answered while
//!   it syncs; what comes meanwhile goes into the next write (group
//!   commit). The replica goes on once it is durable. A write or sync
//!   that fails (a full disk, say) stops the disk for good, and is said
//!   ([`MemberNotice::DiskFailed`]): after a failed sync what the file
//!   holds is not known, so the member acknowledges nothing more, and its
//!   driver should stop it (`ticketing serve` exits): it costs the
//!   cluster a member, never a promise. A restart reads back what was
//!   synced.
//!
//! Every rule is the replica's; this module only moves bytes.

use std::io;
use std::sync::mpsc as std_mpsc;
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use ::tokio::sync::mpsc;
use raft::prelude::{Message, Snapshot};

use crate::adapters::raft_disk::RaftDisk;
use crate::adapters::raft_peers::Peers;
use crate::adapters::serve::{Control, Core, Listener, ServerHandle};
use crate::adapters::state::WallClock;
use crate::server::raft::{Output, Persist, Replica, ReplicaEvent};
use crate::server::{Action, ConnId, Server};
use crate::time::Time;

/// Peer messages taken in one pass at most, before clients get a turn.
const MESSAGES_PER_PASS: usize = 256;

/// What a member says to its operator.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemberNotice {
    /// The replica's news: leading, following, a bad entry.
    Replica(ReplicaEvent),
    /// Making its state durable failed: the member acknowledges nothing
    /// more, and should be stopped.
    DiskFailed(String),
}

/// A member ready to serve: its replica, its state directory's Raft
/// files, and its peer links with what comes in on them.
pub struct Member {
    /// The replica, made from what `disk` read back.
    pub replica: Replica,
    /// Where its state is kept.
    pub disk: RaftDisk,
    /// Its links to the other members.
    pub peers: Peers,
    /// What the other members send it.
    pub inbound: mpsc::Receiver<Message>,
}

enum DiskJob {
    Persist(Persist),
    Compact(Snapshot),
}

enum DiskDone {
    Persisted,
    Failed(String),
}

/// The replica and its sources, as the serving task drives them.
struct MemberCore {
    replica: Replica,
    peers: Peers,
    inbound: mpsc::Receiver<Message>,
    jobs: std_mpsc::Sender<DiskJob>,
    done: mpsc::UnboundedReceiver<DiskDone>,
    notify: Box<dyn FnMut(MemberNotice) + Send>,
}

/// Serves `member` on `listener`, its time counting from `origin`;
/// `notify` hears its news. The handle's commands about the table and the
/// role are for single servers and do nothing here; stats and stopping
/// work as for a single server.
pub fn spawn_member<L: Listener>(
    listener: L,
    member: Member,
    origin: Instant,
    notify: impl FnMut(MemberNotice) + Send + 'static,
) -> io::Result<ServerHandle> {
    let Member {
        replica,
        disk,
        peers,
        inbound,
    } = member;
    let (jobs, jobs_rx) = std_mpsc::channel();
    let (done_tx, done) = mpsc::unbounded_channel();
    thread::Builder::new()
        .name("ticketing-raft-disk".into())
        .spawn(move || keep(disk, &jobs_rx, &done_tx))?;
    let core = MemberCore {
        replica,
        peers,
        inbound,
        jobs,
        done,
        notify: Box::new(notify),
    };
    ServerHandle::spawn_core(listener, core, origin, Box::new(WallClock))
}

/// The disk thread: the jobs waiting are taken together, consecutive
/// writes merged into one write and one sync (group commit); a write that
/// fails is tried again until it works.
fn keep(
    mut disk: RaftDisk,
    jobs: &std_mpsc::Receiver<DiskJob>,
    done: &mpsc::UnboundedSender<DiskDone>,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        batch.extend(jobs.try_iter());
        let mut merged: Vec<(DiskJob, usize)> = Vec::new();
        for job in batch {
            match (merged.last_mut(), job) {
                (Some((DiskJob::Persist(into), n)), DiskJob::Persist(next))
                    if into.snapshot.is_none() && next.snapshot.is_none() =>
                {
                    fold(into, next);
                    *n += 1;
                }
                (_, job) => merged.push((job, 1)),
            }
        }
        for (job, n) in merged {
            if !do_job(&mut disk, &job, done) {
                return;
            }
            if matches!(job, DiskJob::Persist(_)) {
                for _ in 0..n {
                    if done.send(DiskDone::Persisted).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Does one job; `false` if it failed (the thread then stops: after a
/// failed write or sync, what the file holds is not known, so nothing
/// more is written or acknowledged) or nobody listens.
fn do_job(disk: &mut RaftDisk, job: &DiskJob, done: &mpsc::UnboundedSender<DiskDone>) -> bool {
    let result = match job {
        DiskJob::Persist(p) => disk.persist(p),
        DiskJob::Compact(s) => disk.compact(s),
    };
    match result {
        Ok(()) => true,
        Err(e) => {
            let _ = done.send(DiskDone::Failed(e.to_string()));
            false
        }
    }
}

/// Folds `next` into `into`, as writing both in turn would leave the log
/// (neither holds a snapshot).
fn fold(into: &mut Persist, next: Persist) {
    if let Some(first) = next.entries.first() {
        let keep = into
            .entries
            .iter()
            .take_while(|e| e.index < first.index)
            .count();
        into.entries.truncate(keep);
    }
    into.entries.extend(next.entries);
    if next.hard_state.is_some() {
        into.hard_state = next.hard_state;
    }
}

impl Core for MemberCore {
    fn handle_accept(&mut self, now: Time) -> ConnId {
        self.replica.handle_accept(now)
    }
    fn handle_bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) {
        self.replica.handle_bytes(now, conn, data);
    }
    fn handle_closed(&mut self, now: Time, conn: ConnId) {
        self.replica.handle_closed(now, conn);
    }
    fn handle_written(&mut self, now: Time, conn: ConnId, n: usize) {
        self.replica.handle_written(now, conn, n);
    }
    fn handle_timeout(&mut self, now: Time) {
        self.replica.handle_timeout(now);
    }
    fn poll_action(&mut self) -> Option<Action> {
        loop {
            match self.replica.poll_output()? {
                Output::Client(action) => return Some(action),
                Output::Persist(p) => {
                    // The thread lives as long as the sender.
                    let _ = self.jobs.send(DiskJob::Persist(p));
                }
                Output::Compact(s) => {
                    let _ = self.jobs.send(DiskJob::Compact(s));
                }
                Output::Send(m) => self.peers.send(m),
                Output::Event(e) => (self.notify)(MemberNotice::Replica(e)),
            }
        }
    }
    fn poll_timeout(&self) -> Option<Time> {
        self.replica.poll_timeout()
    }
    fn is_reading(&self, conn: ConnId) -> bool {
        self.replica.server().is_reading(conn)
    }
    fn is_open(&self, conn: ConnId) -> bool {
        self.replica.server().is_open(conn)
    }
    fn handshake_timeout(&self) -> Duration {
        self.replica.server().config().handshake_timeout
    }
    fn poll_sources(&mut self, cx: &mut Context<'_>, now: Time) -> bool {
        let mut took = false;
        while let Poll::Ready(Some(done)) = self.done.poll_recv(cx) {
            took = true;
            match done {
                DiskDone::Persisted => self.replica.handle_persisted(now),
                DiskDone::Failed(why) => (self.notify)(MemberNotice::DiskFailed(why)),
            }
        }
        for _ in 0..MESSAGES_PER_PASS {
            match self.inbound.poll_recv(cx) {
                Poll::Ready(Some(m)) => {
                    took = true;
                    self.replica.handle_message(now, m);
                }
                _ => break,
            }
        }
        took
    }
    fn begin_epoch(&mut self, _now: Time, _epoch: u64) {
        // A replica never asks: its tokens come from the log.
    }
    fn command(&mut self, _now: Time, _start: Instant, command: Control) {
        if let Control::Stats(reply) = command {
            let _ = reply.send(self.replica.server().stats());
        }
    }
    fn into_server(self) -> Server {
        self.replica.into_server()
    }
}

#[cfg(test)]
mod tests {
    use raft::prelude::{Entry, HardState};

    use super::*;

    fn entries(range: core::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
        range
            .map(|index| Entry {
                index,
                term,
                ..Entry::default()
            })
            .collect()
    }

    fn persist(entries: Vec<Entry>, commit: Option<u64>) -> Persist {
        Persist {
            entries,
            hard_state: commit.map(|commit| HardState {
                commit,
                ..HardState::default()
            }),
            snapshot: None,
        }
    }

    #[test]
    fn folded_writes_leave_the_log_as_writing_them_in_turn_would() {
        let mut into = persist(entries(1..=4, 1), Some(2));
        // A later leader's entries replace 3 and 4.
        fold(&mut into, persist(entries(3..=5, 2), None));
        let got: Vec<(u64, u64)> = into.entries.iter().map(|e| (e.index, e.term)).collect();
        assert_eq!(got, [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]);
        assert_eq!(into.hard_state.as_ref().map(|h| h.commit), Some(2));
        fold(&mut into, persist(Vec::new(), Some(5)));
        assert_eq!(into.entries.len(), 5);
        assert_eq!(into.hard_state.as_ref().map(|h| h.commit), Some(5));
    }
}
