//! A member of a replicated cluster on tokio (feature `raft`): the sans-IO
//! [`Replica`] behind the same serving task as a single server
//! (`serve.rs`), with its two sources of its own:
//!
//! - **Peers** ([`Peers`]): Raft's messages come in authenticated and go
//!   out through bounded queues.
//! - **The disk** ([`RaftDisk`]): each [`Persist`] is written and synced
//!   on a thread of its own, so that clients are read and answered while
//!   it syncs; what comes meanwhile goes into the next write (group
//!   commit). The replica goes on once it is durable. A write that fails
//!   (a full disk, say) is tried again, a pause doubling from 10 ms to a
//!   second, and said ([`MemberNotice::DiskFailed`]): until it works, the
//!   member acknowledges nothing, so it costs the cluster a member, never
//!   a promise.
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
    /// Making its state durable failed; it is tried again.
    DiskFailed(String),
    /// It works again.
    DiskRecovered,
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
    Recovered,
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

/// The disk thread: each job in turn, a write that fails tried again
/// until it works.
fn keep(
    mut disk: RaftDisk,
    jobs: &std_mpsc::Receiver<DiskJob>,
    done: &mpsc::UnboundedSender<DiskDone>,
) {
    while let Ok(job) = jobs.recv() {
        let mut pause = Duration::from_millis(10);
        let mut failed = false;
        loop {
            let result = match &job {
                DiskJob::Persist(p) => disk.persist(p),
                DiskJob::Compact(s) => disk.compact(s),
            };
            match result {
                Ok(()) => break,
                Err(e) => {
                    failed = true;
                    if done.send(DiskDone::Failed(e.to_string())).is_err() {
                        return;
                    }
                    thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
        if failed {
            let _ = done.send(DiskDone::Recovered);
        }
        if matches!(job, DiskJob::Persist(_)) && done.send(DiskDone::Persisted).is_err() {
            return;
        }
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
                _ => {}
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
                DiskDone::Recovered => (self.notify)(MemberNotice::DiskRecovered),
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
