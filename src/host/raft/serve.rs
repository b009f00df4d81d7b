//! A member of a replicated cluster on tokio (feature `raft`): the sans-IO
//! [`Replica`] behind the same serving task as a single server
//! (`serve.rs`), with its two sources of its own:
//!
//! - **Peers** ([`Peers`]): Raft's messages come in authenticated and go
//!   out through bounded queues.
//! - **The disk** ([`RaftDisk`]): each [`Persist`] is written and synced
//!   before the replica is told it is durable, in one of two places
//!   ([`Writer`]). A leader whose syncs are slow writes on a thread of its
//!   own, so that its clients are read and answered while it syncs; what
//!   comes meanwhile goes into the next write (group commit). A follower,
//!   which has no clients to keep serving, and a leader whose syncs take
//!   less than the hand-off to that thread and back, write in place on
//!   the serving task: the two wake-ups of the hand-off were most of a
//!   commit on tmpfs. A write or sync that fails (a full disk, say) stops
//!   the disk for good, and is said ([`MemberNotice::DiskFailed`]): after
//!   a failed sync what the file holds is not known, so the member
//!   acknowledges nothing more, and its driver should stop it (`ticketing
//!   serve` exits): it costs the cluster a member, never a promise. A
//!   restart reads back what was synced.
//!
//! Every rule is the replica's; this module only moves bytes.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use ::tokio::sync::{mpsc, oneshot};
use raft::prelude::{Message, Snapshot};

use crate::host::raft::disk::RaftDisk;
use crate::host::raft::peers::Peers;
use crate::host::serve::{Core, Hosted, Listener};
use crate::host::state::WallClock;
use crate::names::Endpoint;
use crate::server::raft::{
    AdminRefusal, ClusterStatus, MemberAddrs, Output, Persist, Replica, ReplicaEvent,
};
use crate::server::{Action, ConnId, Server, ServerStats};
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
    /// The configuration names peer addresses its links cannot take (off
    /// loopback without TLS, or not `IP:PORT`): those links stay as they
    /// were.
    PeersRefused(String),
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

/// A write and sync quicker than this goes in place even on a leader: the
/// hand-off to the disk thread and back costs about this much when the
/// machine is busy (measured: 80-100 µs per round trip on a three-member
/// cluster at 256 tasks, where a tmpfs write and sync took under 10 µs),
/// whereas a sync to a disk (hundreds of µs) would keep the leader's
/// clients waiting.
const IN_PLACE_BELOW: Duration = Duration::from_micros(50);

enum DiskJob {
    Persist(Persist),
    Compact(Snapshot),
}

enum DiskDone {
    /// The oldest Persist handed to the thread is durable; the write and
    /// sync it went out in took this long.
    Persisted(Duration),
    /// The oldest snapshot handed to it is kept.
    Compacted,
    Failed(String),
}

/// Where a member's state is written: in place on the serving task, or
/// on the disk thread ([`keep`]). They share the disk, and a write goes in
/// place only when the thread has nothing waiting, so that what is
/// written stays in the order it was handed out.
struct Writer {
    disk: Arc<Mutex<RaftDisk>>,
    jobs: std_mpsc::Sender<DiskJob>,
    done: mpsc::UnboundedReceiver<DiskDone>,
    /// Jobs handed to the thread and not yet done: while any are, the
    /// next write goes there too.
    queued: usize,
    /// How long the latest write and sync took.
    last_sync: Duration,
    /// A write or sync failed: nothing more is written or acknowledged.
    failed: bool,
}

/// What became of a Persist handed to the [`Writer`].
enum Written {
    /// Durable now.
    Durable,
    /// On the thread: its [`DiskDone`] says when.
    Queued,
    /// It failed, or an earlier one did: never acknowledged.
    Failed(Option<String>),
}

impl Writer {
    fn start(disk: RaftDisk) -> io::Result<Writer> {
        let disk = Arc::new(Mutex::new(disk));
        let (jobs, jobs_rx) = std_mpsc::channel();
        let (done_tx, done) = mpsc::unbounded_channel();
        let on_thread = Arc::clone(&disk);
        thread::Builder::new()
            .name("ticketing-raft-disk".into())
            .spawn(move || keep(&on_thread, &jobs_rx, &done_tx))?;
        Ok(Writer {
            disk,
            jobs,
            done,
            queued: 0,
            last_sync: Duration::ZERO,
            failed: false,
        })
    }

    /// Writes `p`, in place if nothing waits on the thread and either
    /// the member does not lead or its syncs are quick; else on the
    /// thread.
    fn persist(&mut self, p: Persist, leads: bool) -> Written {
        if self.failed {
            return Written::Failed(None);
        }
        if self.queued > 0 || (leads && self.last_sync >= IN_PLACE_BELOW) {
            self.hand_off(DiskJob::Persist(p));
            return Written::Queued;
        }
        let begun = Instant::now();
        let result = lock_disk(&self.disk).persist(&p);
        self.last_sync = begun.elapsed();
        match result {
            Ok(()) => Written::Durable,
            Err(e) => {
                self.failed = true;
                Written::Failed(Some(e.to_string()))
            }
        }
    }

    /// Records that the member was removed, in place: a small file,
    /// once.
    fn record_removed(&self) -> Result<(), crate::host::raft::disk::RaftDiskError> {
        lock_disk(&self.disk).record_removed()
    }

    /// Keeps a snapshot on the thread, whatever the member's role: it may
    /// be large, and the Persists after it wait there behind it.
    fn compact(&mut self, snapshot: Snapshot) {
        if !self.failed {
            self.hand_off(DiskJob::Compact(snapshot));
        }
    }

    fn hand_off(&mut self, job: DiskJob) {
        // The thread lives as long as the sender, unless a write failed,
        // which its DiskDone says.
        if self.jobs.send(job).is_ok() {
            self.queued += 1;
        }
    }

    /// What the thread finished: `Some(Ok(()))` for each Persist made
    /// durable, in the order they were handed to it.
    fn poll_done(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<(), String>>> {
        loop {
            let done = match self.done.poll_recv(cx) {
                Poll::Ready(Some(done)) => done,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            match done {
                DiskDone::Persisted(took) => {
                    self.queued = self.queued.saturating_sub(1);
                    self.last_sync = took;
                    return Poll::Ready(Some(Ok(())));
                }
                DiskDone::Compacted => self.queued = self.queued.saturating_sub(1),
                DiskDone::Failed(why) => {
                    self.failed = true;
                    return Poll::Ready(Some(Err(why)));
                }
            }
        }
    }
}

/// The disk, for one write: a thread that panicked while holding it left
/// it as a failed write would, and [`RaftDisk`] refuses more after one.
fn lock_disk(disk: &Mutex<RaftDisk>) -> std::sync::MutexGuard<'_, RaftDisk> {
    disk.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The replica and its sources, as the serving task drives them.
struct MemberCore {
    replica: Replica,
    peers: Peers,
    inbound: mpsc::Receiver<Message>,
    writer: Writer,
    notify: Box<dyn FnMut(MemberNotice) + Send>,
}

/// The commands a member takes: an operator's (PROTOCOL.md 4.4), which
/// its replica carries out and may refuse.
pub(crate) enum MemberCommand {
    /// [`Replica::transfer_leadership`].
    Transfer {
        to: Option<u64>,
        reply: oneshot::Sender<Result<u64, AdminRefusal>>,
    },
    /// [`Replica::leads`].
    Leads(oneshot::Sender<bool>),
    /// [`Replica::status`].
    Status(oneshot::Sender<ClusterStatus>),
    /// [`Replica::add_member`].
    Add {
        id: u64,
        addrs: MemberAddrs,
        reply: oneshot::Sender<Result<(), AdminRefusal>>,
    },
    /// [`Replica::remove_member`].
    Remove {
        id: u64,
        force: bool,
        reply: oneshot::Sender<Result<(), AdminRefusal>>,
    },
}

/// A member served on a tokio task ([`spawn_member`]). Unlike a single
/// server's [`ServerHandle`](crate::serve::ServerHandle), it has no command
/// about the lock table or the role: a member's come from its log. What
/// it has are an operator's, which its replica may refuse.
#[derive(Debug)]
pub struct MemberHandle {
    hosted: Hosted<MemberCommand>,
}

impl MemberHandle {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.hosted.local_addr()
    }

    /// The instant the member's time counts from.
    pub fn origin(&self) -> Instant {
        self.hosted.origin()
    }

    /// The counters of the member's server core (see
    /// [`Server::stats`]).
    pub async fn stats(&self) -> io::Result<ServerStats> {
        self.hosted.stats().await
    }

    /// Cuts every client connection at once, as a network failure would;
    /// the member and its peer links keep running.
    pub fn drop_connections(&self) {
        self.hosted.drop_connections();
    }

    /// Stops taking bytes from client connections until
    /// [`resume`](MemberHandle::resume): a member whose clients hang.
    /// Its timers, peers and disk still run.
    pub fn pause(&self) {
        self.hosted.pause(true);
    }

    /// Takes bytes from client connections again.
    pub fn resume(&self) {
        self.hosted.pause(false);
    }

    /// Stops accepting, closes every connection, and returns the server
    /// core.
    pub async fn stop(self) -> io::Result<Server> {
        self.hosted.stop().await
    }

    /// Hands the leadership over to member `to`, or to the most caught up
    /// (see [`Replica::transfer_leadership`]): the member chosen, or why
    /// not. It returns once the transfer has begun; [`leads`] tells when
    /// it is over.
    ///
    /// [`leads`]: MemberHandle::leads
    pub async fn transfer_leadership(
        &self,
        to: Option<u64>,
    ) -> io::Result<Result<u64, AdminRefusal>> {
        self.hosted
            .ask(|reply| MemberCommand::Transfer { to, reply })
            .await
    }

    /// Whether the member is Raft's leader ([`Replica::leads`]).
    pub async fn leads(&self) -> io::Result<bool> {
        self.hosted.ask(MemberCommand::Leads).await
    }

    /// The member's view of its cluster ([`Replica::status`]).
    pub async fn status(&self) -> io::Result<ClusterStatus> {
        self.hosted.ask(MemberCommand::Status).await
    }

    /// Proposes member `id`, reached at `addrs`, as a learner
    /// ([`Replica::add_member`]); [`status`](MemberHandle::status) tells
    /// when it votes.
    pub async fn add_member(
        &self,
        id: u64,
        addrs: MemberAddrs,
    ) -> io::Result<Result<(), AdminRefusal>> {
        self.hosted
            .ask(|reply| MemberCommand::Add { id, addrs, reply })
            .await
    }

    /// Proposes the removal of member `id` ([`Replica::remove_member`]).
    pub async fn remove_member(
        &self,
        id: u64,
        force: bool,
    ) -> io::Result<Result<(), AdminRefusal>> {
        self.hosted
            .ask(|reply| MemberCommand::Remove { id, force, reply })
            .await
    }

    /// What a member does before it stops (PROTOCOL.md 4.4, "Leadership
    /// transfer"): if it leads, it hands over to the most caught-up
    /// member, and waits, at most `within`, until it no longer leads. The
    /// member handed to, once it no longer leads; `None` when it did not
    /// lead, or no other member could take over in time (the cluster
    /// then elects one as after a crash).
    pub async fn hand_over(&self, within: Duration) -> io::Result<Option<u64>> {
        if !self.leads().await? {
            return Ok(None);
        }
        let Ok(to) = self.transfer_leadership(None).await? else {
            return Ok(None);
        };
        let deadline = ::tokio::time::Instant::now() + within;
        while ::tokio::time::Instant::now() < deadline {
            if !self.leads().await? {
                return Ok(Some(to));
            }
            ::tokio::time::sleep(HAND_OVER_POLL).await;
        }
        Ok(None)
    }
}

/// How often [`MemberHandle::hand_over`] looks whether the member still
/// leads.
const HAND_OVER_POLL: Duration = Duration::from_millis(5);

/// Serves `member` on `listener`, its time counting from `origin`;
/// `notify` hears its news.
pub fn spawn_member<L: Listener>(
    listener: L,
    member: Member,
    origin: Instant,
    notify: impl FnMut(MemberNotice) + Send + 'static,
) -> io::Result<MemberHandle> {
    let Member {
        mut replica,
        disk,
        peers,
        inbound,
    } = member;
    // Its acknowledgements and answers go before its copy catches up.
    replica.defer_apply();
    let core = MemberCore {
        replica,
        peers,
        inbound,
        writer: Writer::start(disk)?,
        notify: Box::new(notify),
    };
    let hosted = Hosted::spawn(listener, core, origin, Box::new(WallClock))?;
    Ok(MemberHandle { hosted })
}

/// The disk thread: the jobs waiting are taken together, consecutive
/// writes merged into one write and one sync (group commit). After a
/// write that failed it stops: what the file holds is then not known.
fn keep(
    disk: &Mutex<RaftDisk>,
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
            let begun = Instant::now();
            let result = match &job {
                DiskJob::Persist(p) => lock_disk(disk).persist(p),
                DiskJob::Compact(s) => lock_disk(disk).compact(s),
            };
            let took = begun.elapsed();
            if let Err(e) = result {
                let _ = done.send(DiskDone::Failed(e.to_string()));
                return;
            }
            for _ in 0..n {
                let said = match job {
                    DiskJob::Persist(_) => DiskDone::Persisted(took),
                    DiskJob::Compact(_) => DiskDone::Compacted,
                };
                if done.send(said).is_err() {
                    return;
                }
            }
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
    if next.cluster.is_some() {
        into.cluster = next.cluster;
    }
}

impl MemberCore {
    /// Links to the members the configuration names, and lets only them
    /// in.
    fn link_members(&mut self, peers: &BTreeMap<u64, Endpoint>, index: u64) {
        let mut addrs = BTreeMap::new();
        for (&id, addr) in peers {
            match addr.as_str().parse::<SocketAddr>() {
                Ok(addr) => {
                    addrs.insert(id, addr);
                }
                Err(_) => (self.notify)(MemberNotice::PeersRefused(format!(
                    "member {id}'s peer address {addr} is not IP:PORT"
                ))),
            }
        }
        if let Err(e) = self.peers.set_members_at(addrs, index) {
            (self.notify)(MemberNotice::PeersRefused(e.to_string()));
        }
    }
}

impl Core for MemberCore {
    /// An operator's: none about the table or the role, which come from
    /// its log.
    type Command = MemberCommand;

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
                Output::Persist(p) => match self.writer.persist(p, self.replica.leads()) {
                    // Durable as of the latest input's time.
                    Written::Durable => self.replica.handle_persisted(self.replica.now()),
                    Written::Queued | Written::Failed(None) => {}
                    Written::Failed(Some(why)) => (self.notify)(MemberNotice::DiskFailed(why)),
                },
                Output::Compact(s) => self.writer.compact(s),
                Output::Send(m) => self.peers.send(m),
                Output::Event(e) => {
                    match &e {
                        // Hellos carry it from now on; a peer of another
                        // cluster is refused.
                        ReplicaEvent::Cluster { id } => self.peers.set_cluster(*id),
                        ReplicaEvent::Members { peers, index } => self.link_members(peers, *index),
                        ReplicaEvent::Removed => {
                            // Said before anything else: it never starts
                            // again from this directory.
                            if let Err(e) = self.writer.record_removed() {
                                (self.notify)(MemberNotice::DiskFailed(e.to_string()));
                            }
                        }
                        _ => {}
                    }
                    (self.notify)(MemberNotice::Replica(e));
                }
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
        while let Poll::Ready(Some(done)) = self.writer.poll_done(cx) {
            took = true;
            match done {
                Ok(()) => self.replica.handle_persisted(now),
                Err(why) => (self.notify)(MemberNotice::DiskFailed(why)),
            }
        }
        if let Some((from, index)) = self.peers.take_not_member() {
            took = true;
            self.replica.handle_not_member(now, from, index);
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
    fn has_deferred(&self) -> bool {
        self.replica.has_deferred()
    }
    fn handle_deferred(&mut self, now: Time) {
        self.replica.handle_deferred(now);
    }
    fn begin_epoch(&mut self, _now: Time, _epoch: u64) {
        // A replica never asks: its tokens come from the log.
    }
    fn stats(&self) -> ServerStats {
        self.replica.server().stats()
    }
    fn command(&mut self, now: Time, _start: Instant, command: MemberCommand) {
        match command {
            MemberCommand::Transfer { to, reply } => {
                let _ = reply.send(self.replica.transfer_leadership(now, to));
            }
            MemberCommand::Leads(reply) => {
                let _ = reply.send(self.replica.leads());
            }
            MemberCommand::Status(reply) => {
                let _ = reply.send(self.replica.status());
            }
            MemberCommand::Add { id, addrs, reply } => {
                let _ = reply.send(self.replica.add_member(now, id, addrs));
            }
            MemberCommand::Remove { id, force, reply } => {
                let _ = reply.send(self.replica.remove_member(now, id, force));
            }
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
            cluster: None,
        }
    }

    /// A follower writes in place; a leader whose sync was slow hands
    /// its write to the thread, and while one waits there every write
    /// goes there too. What is durable is said in the order it was handed
    /// out, and the log reads back whole and in order.
    #[::tokio::test]
    async fn writes_go_in_place_or_to_the_thread_and_stay_in_order() {
        let dir =
            std::env::temp_dir().join(format!("ticketing-raft-writer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (disk, _) = RaftDisk::open(
            &dir,
            crate::host::raft::disk::Start::NewCluster,
            1,
            &[1, 2, 3],
        )
        .expect("a new state directory");
        let mut writer = Writer::start(disk).expect("the disk thread");

        // A follower, its sync as slow as can be: in place.
        writer.last_sync = Duration::from_secs(1);
        let first = writer.persist(persist(entries(1..=2, 1), Some(1)), false);
        assert!(matches!(first, Written::Durable));
        assert_eq!(writer.queued, 0);
        // A leader whose last sync was slow: on the thread.
        writer.last_sync = IN_PLACE_BELOW;
        let second = writer.persist(persist(entries(3..=4, 1), Some(2)), true);
        assert!(matches!(second, Written::Queued));
        // Behind it even a follower's write waits its turn there, and so
        // does a leader's whose syncs are quick.
        let third = writer.persist(persist(entries(5..=5, 2), None), false);
        assert!(matches!(third, Written::Queued));
        writer.last_sync = Duration::ZERO;
        let fourth = writer.persist(persist(entries(6..=6, 2), Some(5)), true);
        assert!(matches!(fourth, Written::Queued));
        assert_eq!(writer.queued, 3);
        for _ in 0..3 {
            let done = std::future::poll_fn(|cx| writer.poll_done(cx)).await;
            assert_eq!(done, Some(Ok(())));
        }
        assert_eq!(writer.queued, 0);
        // Nothing waits on the thread: a leader whose syncs are quick
        // writes in place again.
        writer.last_sync = Duration::ZERO;
        let fifth = writer.persist(persist(entries(7..=7, 2), Some(6)), true);
        assert!(matches!(fifth, Written::Durable));

        // The thread lets the directory go once its queue is gone.
        drop(writer);
        let mut reopened = None;
        for _ in 0..500 {
            if let Ok(opened) = RaftDisk::open(
                &dir,
                crate::host::raft::disk::Start::Existing,
                1,
                &[1, 2, 3],
            ) {
                reopened = Some(opened);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let (_, restored) = reopened.expect("the directory reopened");
        let got: Vec<(u64, u64)> = restored.entries.iter().map(|e| (e.index, e.term)).collect();
        assert_eq!(
            got,
            [(1, 1), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2), (7, 2)]
        );
        assert_eq!(restored.hard_state.commit, 6);
        let _ = std::fs::remove_dir_all(&dir);
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
