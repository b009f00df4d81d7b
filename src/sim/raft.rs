//! The replicated cluster of [`Scenario::Raft`](super::Scenario::Raft) and
//! [`Scenario::Raft5`](super::Scenario::Raft5): 3 or 5 [`Replica`]s (the
//! real member core, PROTOCOL.md 4.3) on [`MemoryDisk`]s, over a simulated
//! peer network, under faults, with the checks only a view of every member
//! and every disk can make (feature `raft`). The world lends it one more
//! address than it has members: the spare slot, where a member added
//! starts (every client knows every slot's address, as operators are told
//! to list future members).
//!
//! # What the members are given
//!
//! * **Election timeouts pinned** per member from the seed
//!   ([`ReplicaConfig::pinned_election_ticks`]): distinct, two ticks apart,
//!   each above [`ELECTION_TICKS`], so that raft-rs draws nothing and votes
//!   do not split for ever.
//! * **Copies that trail** on the members with an even id, as under the
//!   tokio driver ([`Replica::defer_apply`]): what commits goes into the
//!   copy 1 ms after the turn that committed it.
//! * **Disks** that sync after a delay drawn from the seed, in the order
//!   they were given their writes: a member's [`Persist`] becomes durable
//!   (written to its [`MemoryDisk`]) only then, and is lost if the member
//!   crashes first.
//! * **Peers** that deliver each Raft message after a base latency drawn
//!   from the seed, sometimes after a delay spike, sometimes never (loss),
//!   in any order; a message between two members on opposite sides of a
//!   partition is lost, whether the partition was there when it was sent or
//!   when it arrives.
//!
//! # The faults (while [`SimConfig::fault_time`] runs)
//!
//! * **Crashes** of a minority at most at a time, the leader half the
//!   time: what was not synced is lost, the clients' connections are reset.
//!   The member restarts from its disk 0.3 to 2 s later, or, a third of the
//!   time, **without it** (disk loss: a new disk, started with
//!   [`ReplicaConfig::rejoining`]); a member that lost its disk counts as
//!   down until it has caught up with what was committed when it crashed,
//!   so that no majority ever depends on members that forgot.
//! * **Partitions** between members: one member (the leader half the time)
//!   cut off from the others, or the members split in two, for 0.2 to 3 s.
//! * **Leadership transfers** (PROTOCOL.md 4.4), in three seeds of four:
//!   the member that serves is asked to hand over, to the most caught-up
//!   member half the time, else to a member drawn, which may be down, cut
//!   off or behind (raft-rs then gives up after an election timeout and
//!   the leader goes on). Its clients are sent to the new leader.
//! * **Members replaced** (PROTOCOL.md 4.4, "Replacing"), in three seeds of
//!   four, a step every 0.5 to 2 s: a new member (a new id) started with an
//!   empty disk in the spare slot and added by whoever serves (a learner,
//!   promoted once caught up); once it votes, an old member removed (the
//!   leader a third of the time, which hands over first), and in a third
//!   of the removals the leader killed as soon as it proposed it, the
//!   configuration joint; once the old member is out of the configuration,
//!   its slot is the spare. What the cluster refuses is asked again at the
//!   next step. In those seeds a crash never loses the disk (a member that
//!   lost its disk is replaced, never started again empty under its id),
//!   and a crash needs the members up to remain a majority of every voter
//!   set of the configurations in effect.
//! * **Message delays and loss**, at rates drawn from the seed.
//!
//! The world adds the clients' side: latency, spikes and split writes.
//!
//! # The checks this module makes
//!
//! * **Answer before commit** ([`Check::Uncommitted`]), at send time:
//!   every `G` a member writes to a client (a grant, `G <id> A`, or a
//!   renewal, `G <id> X`) depends on the entry that holds its decision;
//!   that entry must be committed, judged from the disks, not from the
//!   member's own claim: a majority of the voters (and, while joint, of the
//!   outgoing voters) of a configuration the member applied, the one in
//!   effect when the entry was appended (raft-rs counts a commit under the
//!   configuration it has applied, so an entry appended after a change's
//!   entry but before the change was applied may commit under the one
//!   before) or a later one, must have synced
//!   that index with that term (a member removed since counts with its
//!   disk) (an entry of an earlier term than the sender's counts
//!   only below one of the sender's term that a majority synced, Raft's
//!   rule). What a member synced is mirrored as its disk is written (index
//!   and term of every entry, kept while a later write does not replace
//!   them): an acknowledgement given from a disk that is lost later still
//!   counted when it was given.
//! * **No member's message refused** ([`Check::Refused`]), as it is
//!   delivered: however late or out of order, or to a member that lost its
//!   disk since it was sent, a message from a member of the receiver's
//!   configuration is stepped (the receiver's
//!   [`ReplicaStats`](crate::server::raft::ReplicaStats) say whether).
//! * **Leader changes** for [`Failovers`](super::Failovers): a leadership
//!   (a member serving in a term) ends when its member crashes or stops
//!   serving, or when another member serves in a later term.
//!
//! The world checks invariant 8 over the answered grants
//! ([`Answered`](super::check::Answered)), with the lease ends of the
//! member that answered ([`Members::lease_end`]).

use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ::raft::prelude::{Entry, EntryType, Message};

use super::check::Failure;
use super::{millis_between, Check, FaultKind, Replication, SimConfig};
use crate::names::{Endpoint, Key, Name};
use crate::rng::Rng;
use crate::server::raft::{
    ClusterId, MemberAddrs, MemoryDisk, Output, Persist, Replica, ReplicaConfig, ReplicaEvent,
    Restored, ELECTION_TICKS,
};
use crate::server::{Action, Config, ConnId, Decision, Holder, Server};
use crate::time::Time;
use crate::wire::{AnswerKind, ServerFrame};

/// The election timeout: ten ticks of 20 ms.
const ELECTION_TIMEOUT: Duration = Duration::from_millis(200);
/// How long after a turn a member that defers its copy (the even ids,
/// [`Replica::defer_apply`]) brings it up to date.
const CATCH_UP_AFTER: Duration = Duration::from_millis(1);
/// The wall clock at the simulation's time zero (a first leader's floor
/// for tokens).
const WALL_MS_AT_ZERO: u64 = 1_700_000_000_000;
/// How long after the clients have finished the members run on: every
/// lease they were given runs out within the longest lease.
const WIND_DOWN_MARGIN: Duration = Duration::from_secs(2);

/// Mixed into the members' seed for the stream the transfers draw from.
const TRANSFER_STREAM: u64 = 0x7472_616e_7366_6572;
/// Mixed into the members' seed for the stream membership changes draw
/// from.
const CHANGE_STREAM: u64 = 0x6d65_6d62_6572_7321;

/// Something the members scheduled for themselves.
#[derive(Debug)]
pub(super) enum Ev {
    /// A Raft message reaches member `to` (an index), if it is still in
    /// the life it was sent to.
    Deliver {
        from: usize,
        to: usize,
        life: u64,
        message: Box<Message>,
    },
    /// Member `member`'s disk has synced the oldest write it was given in
    /// `life`.
    Synced { member: usize, life: u64 },
    /// A member crashes, and the next crash is planned.
    Crash,
    /// A partition between members begins, and the next is planned.
    Partition,
    /// The leader is asked to hand its leadership over, and the next such
    /// request is planned.
    Transfer,
    /// The replacement of a member moves a step on (`Change`), and the
    /// next step is planned.
    Change,
    /// A crashed member starts again.
    Restart { member: usize, life: u64 },
    /// Member `member` brings its copy up to what is committed (it defers
    /// that, [`Replica::defer_apply`]).
    CatchUp { member: usize, life: u64 },
}

impl Ev {
    /// For the trace: a kind and two numbers.
    pub(super) fn trace(&self) -> (u64, u64, u64) {
        match self {
            Ev::Deliver {
                from, to, message, ..
            } => (
                30,
                (*from as u64) << 8 | *to as u64,
                (message.msg_type as u64) << 48 ^ message.index ^ message.term << 32,
            ),
            Ev::Synced { member, life } => (31, *member as u64, *life),
            Ev::Crash => (32, 0, 0),
            Ev::Partition => (33, 0, 0),
            Ev::Restart { member, life } => (34, *member as u64, *life),
            Ev::CatchUp { member, life } => (35, *member as u64, *life),
            Ev::Transfer => (36, 0, 0),
            Ev::Change => (37, 0, 0),
        }
    }
}

/// What the world must do for the members, in order.
#[derive(Debug)]
pub(super) enum Effect {
    /// Schedule an event.
    At(Time, Ev),
    /// An action of member `node`'s server core at `instance`, for the
    /// clients' network.
    Served {
        node: usize,
        instance: u64,
        action: Action,
    },
    /// Member `node` crashed: the connections of its `instance` are reset.
    Gone { node: usize, instance: u64 },
    /// A fault happened.
    Fault(FaultKind),
    /// A leadership ended.
    LeaderChange,
    /// A check failed.
    Failure(Failure),
    /// A line for the log.
    Note(String),
}

/// One slot of the cluster: the member that runs at its address, or
/// none (the spare, where the next member added starts).
struct Member {
    name: Name,
    /// The Raft id of the member in this slot; `None`: the spare.
    id: Option<u64>,
    /// The configurations it applied, each with the applied index it was
    /// first seen at, oldest first (the last [`CONF_HISTORY`]): an entry
    /// is committed under the one in effect when it was appended, or a
    /// later one.
    confs: Vec<(u64, Conf)>,
    /// Its pinned election timeout, in ticks.
    ticks: usize,
    /// `None` while it is down.
    replica: Option<Replica>,
    disk: MemoryDisk,
    /// What it handed its disk and the disk has not synced yet, oldest
    /// first (several may be under way; they sync in order).
    syncing: VecDeque<Persist>,
    /// When the latest of them syncs.
    synced_at: Time,
    /// Bumped at every crash: events of an earlier life are void.
    life: u64,
    /// Bumped at every start: connections to an earlier one are gone.
    instance: u64,
    /// It lost its disk and has not yet caught up with this commit index.
    amnesia: Option<u64>,
    /// Its [`Ev::CatchUp`] is planned.
    catch_up_due: bool,
    /// Every (index, term) its disks synced, while no later write replaced
    /// it.
    synced: BTreeMap<u64, u64>,
}

/// A partition: `side` apart from the others until `until`.
#[derive(Debug, Clone)]
struct Cut {
    side: BTreeSet<usize>,
    until: Time,
}

/// A configuration's voters, and its outgoing voters while it is joint.
type Conf = (Vec<u64>, Vec<u64>);

/// How many configurations each member's history keeps.
const CONF_HISTORY: usize = 16;

/// Where the replacement of a member stands (PROTOCOL.md 4.4: a new member
/// added, then an old one removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// None under way.
    Idle,
    /// Member `id` started in the spare slot and is being added; `victim`,
    /// once chosen, is to be removed after it votes.
    Adding { id: u64, victim: Option<u64> },
    /// Member `id` is being removed.
    Removing { id: u64 },
}

/// What a decision did to a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Did {
    Grant,
    Renew,
    Release,
}

/// A decision as the checks name it: what it did, key, token.
type DecisionKey = (Did, Key, u64);

/// The replicated cluster.
pub(super) struct Members {
    members: Vec<Member>,
    /// Each member's client address, by Raft id: what a member starts
    /// with.
    ids: BTreeMap<u64, Endpoint>,
    /// Each member's slot, by Raft id.
    slot_of: BTreeMap<u64, usize>,
    /// The id the next member added gets.
    next_id: u64,
    /// The replacement under way.
    change: Change,
    /// Mean interval of the steps of replacements, in milliseconds.
    change_mean: Option<u64>,
    /// What the replacements draw from.
    change_rng: Rng,
    /// What the disks of removed members synced, by their id: an answer
    /// may still have been committed with their acknowledgement.
    retired: BTreeMap<u64, BTreeMap<u64, u64>>,
    /// The latest configuration a serving leader applied.
    conf: Conf,
    template: Config,
    rng: Rng,
    snapshot_every: u64,
    /// One-way peer latency, in microseconds.
    latency_us: (u64, u64),
    /// Per mille of peer messages delayed by a spike.
    spike_pm: u64,
    /// Per mille of peer messages lost.
    loss_pm: u64,
    /// Mean intervals of crashes and partitions, in milliseconds.
    crash_mean: Option<u64>,
    partition_mean: Option<u64>,
    /// Mean interval of leadership transfers asked, in milliseconds.
    transfer_mean: Option<u64>,
    /// What the transfers draw from.
    transfer_rng: Rng,
    /// Disk sync delay, in microseconds.
    sync_us: (u64, u64),
    cuts: Vec<Cut>,
    faults_end: Time,
    /// The cluster's identity, as the first member to learn it told it.
    identity: Option<ClusterId>,
    /// Where each decision is in the logs handed to the disks: the
    /// entries (index, term) that hold it, and how many times each does
    /// (a token renewed twice in one turn).
    entries_of: BTreeMap<DecisionKey, BTreeMap<(u64, u64), u64>>,
    /// How many `G` answers to each decision each term's leader sent: the
    /// k-th answers the k-th such decision of the term.
    answered: BTreeMap<(DecisionKey, u64), u64>,
    /// The leadership under way: member and term.
    leader: Option<(usize, u64)>,
    /// The latest term a leadership was seen in.
    last_term: u64,
    /// When the last leadership ended, while none has begun since.
    leaderless_since: Option<Time>,
    /// From then on the members stop (the clients are done).
    stop_at: Option<Time>,
    /// Answer-before-commit: the members' answers skip the hold-back.
    #[cfg(feature = "sabotage")]
    answer_before_commit: bool,
    trace: bool,
    pub(super) counts: Replication,
    /// Every slot's client address.
    addrs: Vec<Endpoint>,
}

impl Members {
    /// `count` members at `addrs` (the world's node addresses, in order),
    /// with `template`'s limits; with the events to schedule first.
    pub(super) fn new(
        template: &Config,
        sim: &SimConfig,
        addrs: &[Endpoint],
        mut rng: Rng,
        now: Time,
        faults_end: Time,
    ) -> (Members, Vec<Effect>) {
        // The last address is the spare's: members are added there.
        let slots = addrs.len();
        let count = slots - 1;
        // Distinct election timeouts, two ticks apart, above ELECTION_TICKS.
        let mut ticks: Vec<usize> = (0..slots).map(|i| ELECTION_TICKS + 1 + 2 * i).collect();
        for i in (1..ticks.len()).rev() {
            let j = rng.up_to(i as u64) as usize;
            ticks.swap(i, j);
        }
        let ids: BTreeMap<u64, Endpoint> = addrs[..count]
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u64 + 1, a.clone()))
            .collect();
        let voters: Vec<u64> = ids.keys().copied().collect();
        let members = addrs
            .iter()
            .enumerate()
            .map(|(i, _)| Member {
                name: Name::new(format!("n{i}")).expect("an atom"),
                id: (i < count).then_some(i as u64 + 1),
                confs: Vec::new(),
                ticks: ticks[i],
                replica: None,
                disk: MemoryDisk::new(if i < count {
                    Restored::new_cluster(voters.iter().copied())
                } else {
                    Restored::default()
                }),
                syncing: VecDeque::new(),
                synced_at: now,
                life: 0,
                instance: 0,
                amnesia: None,
                catch_up_due: false,
                synced: BTreeMap::new(),
            })
            .collect();
        let low = 100 + rng.up_to(1_000);
        let latency_us = (low, low + rng.up_to(5_000));
        let spike_pm = [0, 5, 20][rng.up_to(2) as usize];
        let loss_pm = [0, 5, 30][rng.up_to(2) as usize];
        let crash_mean = Some(1_500 + rng.up_to(2_500));
        let partition_mean = rng.chance(3, 4).then(|| 1_500 + rng.up_to(3_000));
        let sync_us = (20, 20 + rng.up_to(2_000));
        let snapshot_every = [16, 64, 10_000][rng.up_to(2) as usize];
        // Transfers draw from a stream of their own, so that the crashes
        // and partitions of a seed are those it had before transfers were
        // added.
        let mut transfer_rng = Rng::new(rng.clone().next_u64() ^ TRANSFER_STREAM);
        let transfer_mean = transfer_rng
            .chance(3, 4)
            .then(|| 1_000 + transfer_rng.up_to(3_000));
        // So do the replacements: in three seeds of four, a step every
        // 0.5 to 2 s on average (a replacement takes three at least).
        let mut change_rng = Rng::new(rng.clone().next_u64() ^ CHANGE_STREAM);
        let change_mean = change_rng
            .chance(3, 4)
            .then(|| 500 + change_rng.up_to(1_500));
        let slot_of = (0..count).map(|i| (i as u64 + 1, i)).collect();
        let mut m = Members {
            members,
            slot_of,
            next_id: count as u64 + 1,
            change: Change::Idle,
            change_mean,
            change_rng,
            retired: BTreeMap::new(),
            conf: (voters.clone(), Vec::new()),
            ids,
            template: template.clone(),
            rng,
            snapshot_every,
            latency_us,
            spike_pm,
            loss_pm,
            crash_mean,
            partition_mean,
            transfer_mean,
            transfer_rng,
            sync_us,
            cuts: Vec::new(),
            faults_end,
            identity: None,
            entries_of: BTreeMap::new(),
            answered: BTreeMap::new(),
            leader: None,
            last_term: 0,
            leaderless_since: None,
            stop_at: None,
            #[cfg(feature = "sabotage")]
            answer_before_commit: sim.sabotage == Some(super::Sabotage::AnswerBeforeCommit),
            trace: sim.trace,
            counts: Replication {
                members: count as u64,
                ..Replication::default()
            },
            addrs: addrs.to_vec(),
        };
        let mut out = Vec::new();
        for i in 0..count {
            m.start(i, false, now, &mut out);
        }
        m.note(&mut out, || {
            let ticks: Vec<String> = m
                .members
                .iter()
                .map(|x| format!("{} {}", x.name, x.ticks))
                .collect();
            format!(
                "raft: {count} members, election ticks {}, peer latency {:?} us, spikes {}/1000, loss {}/1000, snapshot every {}",
                ticks.join(", "),
                m.latency_us,
                m.spike_pm,
                m.loss_pm,
                m.snapshot_every
            )
        });
        if sim.faults {
            if let Some(mean) = m.crash_mean {
                // After the holders have their grants.
                let at = now.saturating_add(millis_between(&mut m.rng, 1_000, 1_000 + 2 * mean));
                out.push(Effect::At(at, Ev::Crash));
            }
            if let Some(mean) = m.partition_mean {
                let at = now.saturating_add(millis_between(&mut m.rng, 500, 500 + 2 * mean));
                out.push(Effect::At(at, Ev::Partition));
            }
            if let Some(mean) = m.transfer_mean {
                let at = now.saturating_add(millis_between(
                    &mut m.transfer_rng,
                    1_000,
                    1_000 + 2 * mean,
                ));
                out.push(Effect::At(at, Ev::Transfer));
            }
            if let Some(mean) = m.change_mean {
                let at =
                    now.saturating_add(millis_between(&mut m.change_rng, 1_000, 1_000 + 2 * mean));
                out.push(Effect::At(at, Ev::Change));
            }
        }
        (m, out)
    }

    fn note(&self, out: &mut Vec<Effect>, line: impl FnOnce() -> String) {
        if self.trace {
            out.push(Effect::Note(line()));
        }
    }

    fn stopped(&self, now: Time) -> bool {
        self.stop_at.is_some_and(|at| now >= at)
    }

    // ----- what the world asks --------------------------------------------

    /// The instance of member `n`'s server core.
    pub(super) fn instance(&self, n: usize) -> u64 {
        self.members.get(n).map_or(u64::MAX, |m| m.instance)
    }

    /// Whether member `n` is up (it accepts connections).
    pub(super) fn is_up(&self, n: usize) -> bool {
        self.members.get(n).is_some_and(|m| m.replica.is_some())
    }

    /// The earliest member timer, and whose.
    pub(super) fn next_timeout(&self) -> Option<(Time, usize)> {
        if self.stop_at.is_some_and(|at| {
            self.members
                .iter()
                .filter_map(|m| m.replica.as_ref()?.poll_timeout())
                .all(|t| t >= at)
        }) {
            return None;
        }
        self.members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| Some((m.replica.as_ref()?.poll_timeout()?, i)))
            .min()
    }

    /// Every member up and caught up, no partition, and a leader serving.
    pub(super) fn is_healthy(&self, now: Time) -> bool {
        self.leader.is_some()
            && self.cuts.iter().all(|c| c.until <= now)
            && self
                .members
                .iter()
                .filter(|m| m.id.is_some())
                .all(|m| m.replica.is_some() && m.amnesia.is_none())
    }

    /// A grant still in the serving leader's table, if any.
    pub(super) fn holder_left(&self) -> Option<(Key, Holder)> {
        let (l, _) = self.leader?;
        let table = self.members[l].replica.as_ref()?.server().lock_table();
        table.holders().next().map(|(k, h)| (k.clone(), h))
    }

    /// The end of the grant `(key, token)` by member `n`'s table, which
    /// just answered for it: the lease end it holds, or `now` if its table
    /// no longer has it (it ran out or was released before the answer
    /// left, which held back until the commit).
    pub(super) fn lease_end(&self, n: usize, key: &Key, token: u64, now: Time) -> Time {
        self.members
            .get(n)
            .and_then(|m| m.replica.as_ref())
            .and_then(|r| r.server().holder(key.as_str()))
            .filter(|h| h.token == token)
            .map_or(now, |h| h.expires_at)
    }

    /// Whether the release of `(key, token)` is committed, judged from the
    /// disks as for member `n`: a grant its holder released, whose `D` may
    /// never have been said (a leader stepped down before the commit, and
    /// a later one committed the entry with its own).
    pub(super) fn release_committed(&self, n: usize, key: &Key, token: u64) -> bool {
        let Some(term_now) = self
            .members
            .get(n)
            .and_then(|m| Some(m.replica.as_ref()?.term()))
        else {
            return false;
        };
        self.entries_of
            .get(&(Did::Release, key.clone(), token))
            .is_some_and(|held| held.keys().any(|&(i, t)| self.committed(n, i, t, term_now)))
    }

    /// The clients are done at `now`: the members run on until every lease
    /// could have run out, then stop.
    pub(super) fn wind_down(&mut self, now: Time) {
        if self.stop_at.is_none() {
            let at = now
                .saturating_add(self.template.max_lease)
                .saturating_add(WIND_DOWN_MARGIN);
            self.stop_at = Some(at);
        }
    }

    // ----- inputs from the clients' network --------------------------------

    /// A client connects to member `n`.
    pub(super) fn accept(&mut self, n: usize, now: Time) -> Option<ConnId> {
        Some(
            self.members
                .get_mut(n)?
                .replica
                .as_mut()?
                .handle_accept(now),
        )
    }

    /// Bytes from a client.
    pub(super) fn bytes(&mut self, n: usize, now: Time, conn: ConnId, data: &[u8]) {
        if let Some(r) = self.members.get_mut(n).and_then(|m| m.replica.as_mut()) {
            r.handle_bytes(now, conn, data);
        }
    }

    /// A client's connection closed.
    pub(super) fn closed(&mut self, n: usize, now: Time, conn: ConnId) {
        if let Some(r) = self.members.get_mut(n).and_then(|m| m.replica.as_mut()) {
            r.handle_closed(now, conn);
        }
    }

    /// Member `n`'s timer.
    pub(super) fn timeout(&mut self, n: usize, now: Time, out: &mut Vec<Effect>) {
        if let Some(r) = self.members.get_mut(n).and_then(|m| m.replica.as_mut()) {
            r.handle_timeout(now);
        }
        self.drain(n, now, out);
    }

    // ----- the members' own events ------------------------------------------

    /// One of the members' own events.
    pub(super) fn handle(&mut self, ev: Ev, now: Time, out: &mut Vec<Effect>) {
        if self.stopped(now) {
            return;
        }
        match ev {
            Ev::Deliver {
                from,
                to,
                life,
                message,
            } => {
                if self.members[to].life != life || self.is_cut(from, to, now) {
                    self.counts.lost += 1;
                    return;
                }
                if let Some(r) = self.members[to].replica.as_mut() {
                    let (before, kind) = (r.stats().refused, message.msg_type);
                    // A member refuses whom its configuration does not
                    // name (one removed, or added after what it applied):
                    // only a member's message must be stepped.
                    let (incoming, outgoing, learners) = r.configuration();
                    let member = [incoming, outgoing, learners]
                        .iter()
                        .any(|ids| ids.contains(&message.from));
                    r.handle_message(now, *message);
                    let stats = r.stats();
                    if stats.refused > before && member {
                        let (name, sender) = (&self.members[to].name, &self.members[from].name);
                        let why = stats
                            .last_refusal
                            .map(|why| why.to_string())
                            .unwrap_or_default();
                        out.push(Effect::Failure((
                            Check::Refused,
                            None,
                            format!("member {name} refused a message (type {kind}) from {sender}: {why}"),
                        )));
                    }
                    self.drain(to, now, out);
                }
            }
            Ev::Synced { member, life } => {
                let m = &mut self.members[member];
                if m.life != life {
                    return;
                }
                let Some(p) = m.syncing.pop_front() else {
                    return;
                };
                m.disk.persist(&p);
                mirror(&mut m.synced, &p);
                if let Some(r) = m.replica.as_mut() {
                    r.handle_persisted(now);
                }
                self.drain(member, now, out);
            }
            Ev::Crash => {
                if now < self.faults_end {
                    self.crash(now, out);
                    if let Some(mean) = self.crash_mean {
                        let next = millis_between(&mut self.rng, mean / 2, mean * 3 / 2);
                        out.push(Effect::At(now.saturating_add(next), Ev::Crash));
                    }
                }
            }
            Ev::Partition => {
                if now < self.faults_end {
                    self.partition(now, out);
                    if let Some(mean) = self.partition_mean {
                        let next = millis_between(&mut self.rng, mean / 2, mean * 3 / 2);
                        out.push(Effect::At(now.saturating_add(next), Ev::Partition));
                    }
                }
            }
            Ev::Transfer => {
                if now < self.faults_end {
                    self.transfer(now, out);
                    if let Some(mean) = self.transfer_mean {
                        let next = millis_between(&mut self.transfer_rng, mean / 2, mean * 3 / 2);
                        out.push(Effect::At(now.saturating_add(next), Ev::Transfer));
                    }
                }
            }
            Ev::Change => {
                if now < self.faults_end {
                    self.change(now, out);
                    if let Some(mean) = self.change_mean {
                        let next = millis_between(&mut self.change_rng, mean / 2, mean * 3 / 2);
                        out.push(Effect::At(now.saturating_add(next), Ev::Change));
                    }
                }
            }
            Ev::CatchUp { member, life } => {
                let m = &mut self.members[member];
                if m.life != life {
                    return;
                }
                m.catch_up_due = false;
                if let Some(r) = m.replica.as_mut() {
                    r.handle_deferred(now);
                }
                self.drain(member, now, out);
            }
            Ev::Restart { member, life } => {
                if self.members[member].life == life && self.members[member].replica.is_none() {
                    let lost = self.members[member].amnesia.is_some();
                    self.start(member, lost, now, out);
                    out.push(Effect::Fault(FaultKind::Restart));
                    self.counts.restarts += 1;
                    self.drain(member, now, out);
                }
            }
        }
    }

    /// Whether a message between `a` and `b` is cut at `now`.
    fn is_cut(&self, a: usize, b: usize, now: Time) -> bool {
        self.cuts
            .iter()
            .any(|c| c.until > now && c.side.contains(&a) != c.side.contains(&b))
    }

    /// Starts member `i` from its disk (`rejoining`: a new one).
    fn start(&mut self, i: usize, rejoining: bool, now: Time, out: &mut Vec<Effect>) {
        let m = &mut self.members[i];
        let mut server_config = self.template.clone();
        server_config.node_id = m.name.clone();
        #[allow(unused_mut)]
        let mut server =
            Server::new(server_config, now).expect("the simulator's configs are valid");
        #[cfg(feature = "sabotage")]
        if self.answer_before_commit {
            server.answer_before_commit();
        }
        let Some(id) = m.id else {
            return;
        };
        let wall_ms = WALL_MS_AT_ZERO + now.as_nanos() / 1_000_000;
        let mut config = ReplicaConfig::new(id, self.ids.clone(), ELECTION_TIMEOUT, wall_ms);
        config.pinned_election_ticks = Some(m.ticks);
        config.snapshot_every = self.snapshot_every;
        config.rejoining = rejoining;
        // Each member's own bits, whichever leads first: no draw from the
        // run's generator, whose sequence the scenarios come from.
        config.draw = u128::from(id) << 64 | 0x5eed;
        let mut replica = Replica::new(config, server, m.disk.restored(), now)
            .expect("a member starts from its own disk");
        if id % 2 == 0 {
            // As the tokio driver does: its copy trails, caught up after
            // what each turn said has gone ([`CATCH_UP_AFTER`] here).
            replica.defer_apply();
        }
        m.replica = Some(replica);
        m.catch_up_due = false;
        m.instance += 1;
        let (name, rejoining) = (m.name.clone(), rejoining);
        self.note(out, || {
            format!("raft: {name} starts (rejoining with an empty disk: {rejoining})")
        });
    }

    /// A minority at most down at a time (counting those that lost their
    /// disk and have not caught up): crashes the leader half the time,
    /// else any member that is up; a third of the time with its disk.
    fn crash(&mut self, now: Time, out: &mut Vec<Effect>) {
        let n = self.members.len();
        let up: Vec<usize> = (0..n)
            .filter(|&i| {
                let m = &self.members[i];
                m.id.is_some() && m.replica.is_some() && m.amnesia.is_none()
            })
            .collect();
        if up.is_empty() {
            return;
        }
        let victim = match self.leader {
            Some((l, _)) if up.contains(&l) && self.rng.chance(1, 2) => l,
            _ => up[self.rng.up_to(up.len() as u64 - 1) as usize],
        };
        if !self.majorities_without(victim) {
            return;
        }
        self.crash_member(victim, now, out);
    }

    /// Whether the members up (and not forgetful) other than slot
    /// `victim` are a majority of every voter set of the configurations
    /// known: the latest a leader applied, and the one each member up
    /// applied.
    fn majorities_without(&self, victim: usize) -> bool {
        let up = |id: &u64| {
            self.slot_of.get(id).is_some_and(|&i| {
                let m = &self.members[i];
                i != victim && m.replica.is_some() && m.amnesia.is_none()
            })
        };
        let mut sets: Vec<&Vec<u64>> = vec![&self.conf.0, &self.conf.1];
        for m in self.members.iter().filter(|m| m.replica.is_some()) {
            if let Some((_, (incoming, outgoing))) = m.confs.last() {
                sets.push(incoming);
                sets.push(outgoing);
            }
        }
        sets.iter()
            .filter(|v| !v.is_empty())
            .all(|v| v.iter().filter(|id| up(id)).count() > v.len() / 2)
    }

    /// Crashes the member in slot `victim`; a third of the time with its
    /// disk (not in the seeds that replace members, where a member that
    /// lost its disk comes back as a new one).
    fn crash_member(&mut self, victim: usize, now: Time, out: &mut Vec<Effect>) {
        let disk_loss = self.rng.chance(1, 3) && self.change_mean.is_none();
        let committed = self
            .members
            .iter()
            .filter_map(|m| m.replica.as_ref().map(Replica::committed))
            .max()
            .unwrap_or(0);
        self.note(out, || {
            format!("fault: raft member n{victim} crashes (disk lost: {disk_loss}, cluster committed {committed})")
        });
        out.push(Effect::Fault(FaultKind::Crash));
        self.counts.crashes += 1;
        let instance = self.members[victim].instance;
        let m = &mut self.members[victim];
        m.replica = None;
        m.syncing.clear();
        m.life += 1;
        let life = m.life;
        if disk_loss {
            self.counts.disk_losses += 1;
            let voters: Vec<u64> = self.ids.keys().copied().collect();
            m.disk = MemoryDisk::new(Restored::new_cluster(voters));
            m.amnesia = Some(committed);
        }
        out.push(Effect::Gone {
            node: victim,
            instance,
        });
        let at = now.saturating_add(millis_between(&mut self.rng, 300, 2_000));
        out.push(Effect::At(
            at,
            Ev::Restart {
                member: victim,
                life,
            },
        ));
        self.follow_leadership(now, out);
    }

    /// Asks the member that serves to hand its leadership over: to the
    /// most caught-up member half the time, else to one drawn (which may
    /// be down, cut off or behind: raft-rs then gives up after an election
    /// timeout, and the leader goes on).
    fn transfer(&mut self, now: Time, out: &mut Vec<Effect>) {
        let Some((l, _)) = self.leader else {
            return;
        };
        let n = self.members.len() as u64;
        let ids: Vec<u64> = self.members.iter().filter_map(|m| m.id).collect();
        let to = if self.transfer_rng.chance(1, 2) {
            None
        } else if self.change_mean.is_none() {
            Some(1 + self.transfer_rng.up_to(n - 2))
        } else {
            Some(ids[self.transfer_rng.up_to(ids.len() as u64 - 1) as usize])
        };
        let Some(r) = self.members[l].replica.as_mut() else {
            return;
        };
        let result = r.transfer_leadership(now, to);
        self.note(out, || {
            format!("fault: raft member n{l} asked to hand over to {to:?}: {result:?}")
        });
        if result.is_ok() {
            self.counts.transfers += 1;
        }
        self.drain(l, now, out);
    }

    /// Moves the replacement under way a step on (PROTOCOL.md 4.4,
    /// "Replacing"), asking whoever serves: a new member started in the
    /// spare slot with an empty disk and added (a learner, promoted once
    /// caught up); once it votes, an old one (the leader a third of the
    /// time, which hands over first) removed; once that is out of the
    /// configuration, its slot emptied for the next. A third of the
    /// removals, the leader is killed as soon as it proposed the change,
    /// the configuration joint. Whatever the cluster refuses (a change
    /// under way, no majority answering) is asked again at the next step.
    fn change(&mut self, now: Time, out: &mut Vec<Effect>) {
        let Some((l, _)) = self.leader else {
            return;
        };
        let Some((incoming, outgoing, learners)) =
            self.members[l].replica.as_ref().map(Replica::configuration)
        else {
            return;
        };
        let known =
            |id: u64| incoming.contains(&id) || outgoing.contains(&id) || learners.contains(&id);
        match self.change {
            Change::Idle => {
                let Some(spare) = self.members.iter().position(|m| m.id.is_none()) else {
                    return;
                };
                let id = self.next_id;
                self.next_id += 1;
                let addr = self.addr_of(spare);
                let m = &mut self.members[spare];
                m.id = Some(id);
                m.disk = MemoryDisk::new(Restored::default());
                m.synced.clear();
                m.confs.clear();
                m.amnesia = None;
                self.ids.insert(id, addr);
                self.slot_of.insert(id, spare);
                self.start(spare, false, now, out);
                self.drain(spare, now, out);
                self.change = Change::Adding { id, victim: None };
                self.counts.members_added += 1;
                self.ask_add(l, id, now, out);
            }
            Change::Adding { id, victim } => {
                if !known(id) {
                    self.ask_add(l, id, now, out);
                    return;
                }
                if !incoming.contains(&id) || !outgoing.is_empty() {
                    // A learner catching up, or its promotion under way.
                    return;
                }
                let victim = victim.unwrap_or_else(|| {
                    let leader_id = self.members[l].id.unwrap_or(0);
                    let others: Vec<u64> = incoming.iter().copied().filter(|&v| v != id).collect();
                    if others.contains(&leader_id) && self.change_rng.chance(1, 3) {
                        leader_id
                    } else {
                        others[self.change_rng.up_to(others.len() as u64 - 1) as usize]
                    }
                });
                let Some(r) = self.members[l].replica.as_mut() else {
                    return;
                };
                let result = r.remove_member(now, victim, false);
                let name = self.members[l].name.clone();
                self.note(out, || {
                    format!("change: {name} asked to remove member {victim}: {result:?}")
                });
                self.change = match result {
                    Ok(()) => Change::Removing { id: victim },
                    Err(_) => Change::Adding {
                        id,
                        victim: Some(victim),
                    },
                };
                self.drain(l, now, out);
                if matches!(self.change, Change::Removing { .. })
                    && self.change_rng.chance(1, 3)
                    && self.leader.is_some_and(|(now_l, _)| now_l == l)
                    && self.majorities_without(l)
                {
                    self.note(out, || {
                        format!("fault: the leader {name} killed with the configuration joint")
                    });
                    self.counts.joint_kills += 1;
                    self.crash_member(l, now, out);
                }
            }
            Change::Removing { id } => {
                if known(id) {
                    if outgoing.is_empty() {
                        // Its removal was lost with a leadership: again.
                        if let Some(r) = self.members[l].replica.as_mut() {
                            let _ = r.remove_member(now, id, false);
                        }
                        self.drain(l, now, out);
                    }
                    return;
                }
                self.retire(id, now, out);
                self.change = Change::Idle;
            }
        }
    }

    /// Asks the leader in slot `l` to add member `id` (a learner).
    fn ask_add(&mut self, l: usize, id: u64, now: Time, out: &mut Vec<Effect>) {
        let Some(slot) = self.slot_of.get(&id).copied() else {
            return;
        };
        let client = self.addr_of(slot);
        let Some(r) = self.members[l].replica.as_mut() else {
            return;
        };
        let result = r.add_member(now, id, MemberAddrs::new(client, None));
        let name = self.members[l].name.clone();
        self.note(out, || {
            format!("change: {name} asked to add member {id}: {result:?}")
        });
        self.drain(l, now, out);
    }

    /// The client address of slot `i`.
    fn addr_of(&self, i: usize) -> Endpoint {
        self.addrs[i].clone()
    }

    /// Member `id`, out of the configuration, leaves its slot: stopped if
    /// it still runs (it stopped serving when it applied its removal), its
    /// disk kept aside for the checks, the slot the spare from now on.
    fn retire(&mut self, id: u64, now: Time, out: &mut Vec<Effect>) {
        let Some(slot) = self.slot_of.remove(&id) else {
            return;
        };
        self.ids.remove(&id);
        self.counts.members_removed += 1;
        let m = &mut self.members[slot];
        let instance = m.instance;
        let (name, running) = (m.name.clone(), m.replica.is_some());
        m.replica = None;
        m.syncing.clear();
        m.life += 1;
        m.id = None;
        m.amnesia = None;
        m.confs.clear();
        let synced = core::mem::take(&mut m.synced);
        self.retired.insert(id, synced);
        if running {
            out.push(Effect::Gone {
                node: slot,
                instance,
            });
        }
        self.note(out, || {
            format!("change: member {id} removed, its slot {name} empty at {now}")
        });
        self.follow_leadership(now, out);
    }

    /// Cuts one member (the leader half the time) off from the others, or
    /// splits the members in two, for a while.
    fn partition(&mut self, now: Time, out: &mut Vec<Effect>) {
        // The slots that hold a member (not the spare).
        let slots: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].id.is_some())
            .collect();
        let n = slots.len();
        if n < 2 {
            return;
        }
        let mut side = BTreeSet::new();
        if self.rng.chance(1, 2) {
            let one = match self.leader {
                Some((l, _)) if self.rng.chance(1, 2) => l,
                _ => slots[self.rng.up_to(n as u64 - 1) as usize],
            };
            side.insert(one);
        } else {
            // A random nonempty proper subset.
            while side.is_empty() || side.len() == n {
                side = slots
                    .iter()
                    .copied()
                    .filter(|_| self.rng.chance(1, 2))
                    .collect();
            }
        }
        let length = millis_between(&mut self.rng, 200, 3_000);
        let until = now.saturating_add(length);
        self.note(out, || {
            format!("fault: raft members {side:?} cut off from the others for {length:?}")
        });
        self.counts.partitions += 1;
        self.cuts.retain(|c| c.until > now);
        self.cuts.push(Cut { side, until });
    }

    // ----- the members' outputs ---------------------------------------------

    /// Drains member `n`'s outputs: client actions for the world (each `G`
    /// checked first), disk writes, peer messages, events.
    pub(super) fn drain(&mut self, n: usize, now: Time, out: &mut Vec<Effect>) {
        self.note_conf(n);
        loop {
            let Some(output) = self.members[n]
                .replica
                .as_mut()
                .and_then(Replica::poll_output)
            else {
                break;
            };
            match output {
                Output::Client(action) => {
                    if let Action::Send { data, .. } = &action {
                        if let Err(failure) = self.check_answers(n, data) {
                            out.push(Effect::Failure(failure));
                        }
                    }
                    out.push(Effect::Served {
                        node: n,
                        instance: self.members[n].instance,
                        action,
                    });
                }
                Output::Persist(p) => {
                    self.index_decisions(&p.entries);
                    let delay = millis_us(&mut self.rng, self.sync_us);
                    let m = &mut self.members[n];
                    m.syncing.push_back(p);
                    // In the order they were handed out.
                    m.synced_at = m.synced_at.max(now.saturating_add(delay));
                    let life = m.life;
                    out.push(Effect::At(m.synced_at, Ev::Synced { member: n, life }));
                }
                Output::Compact(snapshot) => self.members[n].disk.compact(&snapshot),
                Output::Send(message) => self.send(n, message, now, out),
                Output::Event(event) => {
                    let name = &self.members[n].name;
                    self.note(out, || format!("raft: {name} {event:?}"));
                    let failure = match event {
                        ReplicaEvent::BadEntry { index } => Some((
                            Check::Uncommitted,
                            format!("member {name} could not read the committed entry {index}"),
                        )),
                        ReplicaEvent::Failed { peer } => Some((
                            Check::Refused,
                            format!("member {name}'s Raft engine failed on a message from member {peer}"),
                        )),
                        ReplicaEvent::OtherCluster {
                            recorded,
                            committed,
                        } => Some((
                            Check::Identity,
                            format!("member {name} recorded cluster {recorded} and its log committed {committed}"),
                        )),
                        ReplicaEvent::Cluster { id } => match self.identity {
                            Some(first) if first != id => Some((
                                Check::Identity,
                                format!("member {name} learnt cluster {id}, another learnt {first}"),
                            )),
                            _ => {
                                self.identity = Some(id);
                                None
                            }
                        },
                        _ => None,
                    };
                    if let Some((check, detail)) = failure {
                        out.push(Effect::Failure((check, None, detail)));
                    }
                }
            }
        }
        self.note_conf(n);
        let m = &mut self.members[n];
        if !m.catch_up_due && m.replica.as_ref().is_some_and(Replica::has_deferred) {
            m.catch_up_due = true;
            let life = m.life;
            out.push(Effect::At(
                now.saturating_add(CATCH_UP_AFTER),
                Ev::CatchUp { member: n, life },
            ));
        }
        if let Some(target) = self.members[n].amnesia {
            let caught_up = self.members[n]
                .replica
                .as_ref()
                .is_some_and(|r| r.committed() >= target && r.applied() >= target);
            if caught_up {
                self.members[n].amnesia = None;
                let name = self.members[n].name.clone();
                self.note(out, || {
                    format!("raft: {name} caught up after its disk loss")
                });
            }
        }
        self.follow_leadership(now, out);
    }

    /// Notes the configuration member `n` applied, if it changed (and, if
    /// it serves, as the cluster's latest).
    fn note_conf(&mut self, n: usize) {
        let Some(r) = self.members[n].replica.as_ref() else {
            return;
        };
        let (incoming, outgoing, _) = r.configuration();
        let (serving, applied) = (r.is_serving(), r.applied());
        let conf = (incoming, outgoing);
        let confs = &mut self.members[n].confs;
        if confs.last().map(|(_, c)| c) != Some(&conf) {
            confs.push((applied, conf.clone()));
            if confs.len() > CONF_HISTORY {
                confs.remove(0);
            }
        }
        if serving {
            self.conf = conf;
        }
    }

    /// A message from member `from` to its peer: delayed, maybe lost.
    fn send(&mut self, from: usize, message: Message, now: Time, out: &mut Vec<Effect>) {
        // A member removed has no slot: what is sent to it is lost.
        let Some(&to) = self.slot_of.get(&message.to) else {
            self.counts.lost += 1;
            return;
        };
        let faults = now < self.faults_end;
        if self.is_cut(from, to, now) || (faults && self.rng.chance(self.loss_pm, 1000)) {
            self.counts.lost += 1;
            return;
        }
        let mut delay = millis_us(&mut self.rng, self.latency_us);
        if faults && self.rng.chance(self.spike_pm, 1000) {
            delay = millis_between(&mut self.rng, 20, 400);
            self.counts.delayed += 1;
        }
        let life = self.members[to].life;
        out.push(Effect::At(
            now.saturating_add(delay),
            Ev::Deliver {
                from,
                to,
                life,
                message: Box::new(message),
            },
        ));
    }

    /// Notes where each decision of `entries` is.
    fn index_decisions(&mut self, entries: &[Entry]) {
        for e in entries {
            if e.entry_type != EntryType::EntryNormal as i32 || e.data.is_empty() {
                continue;
            }
            let Ok(decisions) = Decision::decode_entry(&e.data) else {
                continue;
            };
            let mut counted: BTreeMap<DecisionKey, u64> = BTreeMap::new();
            for d in decisions {
                let key = match d {
                    Decision::Grant { key, token, .. } => (Did::Grant, key, token),
                    Decision::Renew { key, token, .. } => (Did::Renew, key, token),
                    Decision::Release { key, token } => (Did::Release, key, token),
                    _ => continue,
                };
                *counted.entry(key).or_default() += 1;
            }
            // Every member hands out the same entry: counted once.
            for (key, n) in counted {
                self.entries_of
                    .entry(key)
                    .or_default()
                    .insert((e.index, e.term), n);
            }
        }
    }

    /// How many members synced `(index, term)`, of all.
    fn synced_by(&self, index: u64, term: u64) -> usize {
        self.members
            .iter()
            .filter(|m| m.synced.get(&index) == Some(&term))
            .count()
            + self
                .retired
                .values()
                .filter(|synced| synced.get(&index) == Some(&term))
                .count()
    }

    /// Whether the disks of a majority of `voters` synced `(index, term)`
    /// (those of members removed since included).
    fn majority_synced(&self, voters: &[u64], index: u64, term: u64) -> bool {
        let synced = |id: &u64| {
            let disk = match self.slot_of.get(id) {
                Some(&slot) => Some(&self.members[slot].synced),
                None => self.retired.get(id),
            };
            disk.is_some_and(|d| d.get(&index) == Some(&term))
        };
        voters.iter().filter(|id| synced(id)).count() > voters.len() / 2
    }

    /// Whether `(index, term)` is committed by the disks under `conf` (a
    /// majority of its voters, and of its outgoing voters while joint).
    fn committed_under(&self, conf: &Conf, index: u64, term: u64) -> bool {
        self.majority_synced(&conf.0, index, term)
            && (conf.1.is_empty() || self.majority_synced(&conf.1, index, term))
    }

    /// Whether `(index, term)` is committed by the disks, for member `n`
    /// in `term_now`, under a configuration it applied: the one in effect
    /// when the entry was appended, or a later one (a leader counts with
    /// what it applied when it commits). A majority synced it, and, if it
    /// is of an earlier term, a majority synced an entry of `term_now`
    /// after it.
    fn committed(&self, n: usize, index: u64, term: u64, term_now: u64) -> bool {
        let confs = &self.members[n].confs;
        // A configuration is noted with the applied index of the turn that
        // applied it: an entry at or below that index was appended before
        // the turn ended, perhaps before the change was applied (raft-rs
        // counts a commit under the configuration it has applied, so such
        // an entry may be committed under the one before). An entry above
        // it was appended later, under it or a later one.
        let from = confs.iter().rposition(|&(at, _)| at < index).unwrap_or(0);
        confs[from..].iter().any(|(_, conf)| {
            self.committed_under(conf, index, term)
                && (term == term_now
                    || self
                        .entries_of
                        .values()
                        .flat_map(BTreeMap::keys)
                        .any(|&(i, t)| {
                            i > index && t == term_now && self.committed_under(conf, i, t)
                        }))
        })
    }

    /// Every `G` in `data`, written by member `n`, must depend on a
    /// committed entry: the one that holds its decision (a grant's, or a
    /// renewal's). A leader answers in the order it decided, so its k-th
    /// answer to one decision (a holder renews its token again and again,
    /// and may have two renewals of it under way) waits at least for the
    /// k-th entry of its term that holds it; failing such an entry, the
    /// latest of its term or of any.
    fn check_answers(&mut self, n: usize, data: &[u8]) -> Result<(), Failure> {
        // The turn that made these answers may have applied a change.
        self.note_conf(n);
        let Some(term_now) = self.members[n].replica.as_ref().map(Replica::term) else {
            return Ok(());
        };
        for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(ServerFrame::Answer(answer)) = ServerFrame::parse(line) else {
                continue;
            };
            let (renewal, token) = match answer.kind {
                AnswerKind::Granted { token, .. } => (false, token),
                AnswerKind::Renewed { token, .. } => (true, token),
                _ => continue,
            };
            let key = Key::from(answer.key);
            self.counts.answers_checked += 1;
            let what = if renewal { "renewal" } else { "grant" };
            let name = &self.members[n].name;
            let did = if renewal { Did::Renew } else { Did::Grant };
            let decision = (did, key.clone(), token);
            let answered = self
                .answered
                .entry((decision.clone(), term_now))
                .or_default();
            *answered += 1;
            let k = *answered;
            let entry = self.entries_of.get(&decision).and_then(|held| {
                let mut decided = 0;
                held.iter()
                    .filter(|(&(_, t), _)| t == term_now)
                    .find_map(|(&at, &n)| {
                        decided += n;
                        (decided >= k).then_some(at)
                    })
                    .or_else(|| {
                        let of_term = held.keys().rev().find(|&&(_, t)| t == term_now);
                        of_term.or_else(|| held.keys().next_back()).copied()
                    })
            });
            let Some((index, term)) = entry else {
                return Err((
                    Check::Uncommitted,
                    None,
                    format!(
                        "{name} (term {term_now}) answered the {what} of ({key}, {token}) that no entry handed to a disk holds"
                    ),
                ));
            };
            if !self.committed(n, index, term, term_now) {
                return Err((
                    Check::Uncommitted,
                    None,
                    format!(
                        "{name} (term {term_now}) answered the {what} of ({key}, {token}) before its entry {index} of term {term} was committed: {} members synced it, configurations (applied from) {:?}",
                        self.synced_by(index, term),
                        self.members[n].confs
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Follows who serves: a leadership ends when its member crashed or
    /// stopped serving, or another serves in a later term.
    fn follow_leadership(&mut self, now: Time, out: &mut Vec<Effect>) {
        let serving = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let r = m.replica.as_ref()?;
                r.is_serving().then(|| (r.term(), i))
            })
            .max();
        if let Some((l, term)) = self.leader {
            let still = self.members[l]
                .replica
                .as_ref()
                .is_some_and(|r| r.is_serving() && r.term() == term);
            let superseded = serving.is_some_and(|(t, _)| t > term);
            if !still || superseded {
                self.leader = None;
                self.leaderless_since = Some(now);
                self.note(out, || {
                    format!("raft: the leadership of n{l} in term {term} ends at {now}")
                });
                out.push(Effect::LeaderChange);
            }
        }
        if self.leader.is_none() {
            if let Some((term, i)) = serving.filter(|&(t, _)| t > self.last_term) {
                self.leader = Some((i, term));
                self.last_term = term;
                self.counts.leaderships += 1;
                if let Some(since) = self.leaderless_since.take() {
                    let gap = Duration::from_nanos(now.as_nanos().saturating_sub(since.as_nanos()));
                    self.counts.longest_leaderless = self.counts.longest_leaderless.max(gap);
                }
                self.note(out, || format!("raft: n{i} serves in term {term}"));
            }
        }
    }
}

/// Mirrors a disk write: every entry replaces the one at its index and
/// every one after it; a snapshot that the log does not match at its
/// index replaces the whole log.
fn mirror(synced: &mut BTreeMap<u64, u64>, p: &Persist) {
    if let Some(meta) = p.snapshot.as_ref().and_then(|s| s.metadata.as_ref()) {
        if synced.get(&meta.index) != Some(&meta.term) {
            synced.clear();
        }
        synced.insert(meta.index, meta.term);
    }
    if let Some(first) = p.entries.first() {
        synced.split_off(&first.index);
        for e in &p.entries {
            synced.insert(e.index, e.term);
        }
    }
}

/// A draw in `range` microseconds.
fn millis_us(rng: &mut Rng, (lo, hi): (u64, u64)) -> Duration {
    Duration::from_micros(lo + rng.up_to(hi.saturating_sub(lo)))
}
