//! The event loop: one virtual clock, one schedule.
//!
//! The loop takes the earliest of: a server core's timer, a client core's
//! timer, a scheduled event (a delivery, a fault, an event the cluster or
//! an embedder scheduled for itself). At
//! equal times server timers come first, then client timers (in client
//! order), then events (in the order they were scheduled), so the order is
//! a function of the seed alone.
//!
//! Every call into a client core is one step of its
//! [`Checker`](crate::testkit::Checker), fed as the checker's documentation
//! requires: the call and its result, then every action and event drained
//! from the core (until both are empty), then
//! [`end_step`](crate::testkit::Checker::end_step). Before bytes are handed
//! to a client, its due timers are fired first, in the same step. After
//! every event the global checks run.
//!
//! The world owns the clock, the schedule, the network, the clients and
//! their checkers, the ground truth of the global checks, and the tally of
//! what leader changes cost the holders; it draws the network's randomness
//! and the fault schedule from the seed's generator.
//! The [`Cluster`] and the [`Workload`] own their state and generators of
//! their own (seeded from the seed's): the world hands them their events,
//! the faults due and the clients' outcomes, and carries out the effects
//! they hand back, in their order. Nothing else acts on the world.

use core::cmp::Ordering;
use core::time::Duration;
use std::collections::{BTreeMap, BinaryHeap};

use bytes::Bytes;

use super::check::{Answered, Failure, Ledger, OpInfo};
use super::cluster::{self, Cluster, Ending, IMPOSTOR};
use super::driven::Driven;
use super::failover::Tally;
use super::net::{LinkId, Net, Partition, Request, Target, DELAY_PARTITION, MAX_DELAY};
#[cfg(feature = "raft")]
use super::raft::{self as replicated, Members};
use super::workload::{self, client_config, Command, Params, Workload};
use super::{
    millis_between, Check, FaultKind, Faults, Operations, Replication, Report, SimConfig, Violation,
};
use crate::client::{
    Action, Config as ClientConfig, ConnId, Error as ClientError, Event, Grant, OpId, Outcome,
    ReleaseResult, TransportEnd,
};
use crate::names::{Key, Name};
use crate::rng::Rng;
use crate::server::Action as ServerAction;
use crate::testkit::{Checker, InvariantViolation, TraceHash};
use crate::time::Time;
use crate::wire::{AnswerKind, ClientFrame, ServerFrame};

/// What a step returns: a violation stops the run.
type Step = Result<(), Box<Violation>>;

/// The most events one seed may take before it is declared stuck.
const MAX_EVENTS: u64 = 20_000_000;
/// How long after the clients' shutdowns the run may go on (every lease
/// runs out within the cluster's longest lease, at most 60 s).
const WIND_DOWN: Duration = Duration::from_secs(120);

/// Something scheduled to happen.
#[derive(Debug)]
enum Ev {
    /// A connect reaches its target.
    ConnectArrive { link: LinkId, gen: u32 },
    /// The answer to a connect reaches the client.
    ConnectReply { link: LinkId, gen: u32, ok: bool },
    /// Bytes reach the server.
    ToServer { link: LinkId, gen: u32, data: Bytes },
    /// Bytes reach the client.
    ToClient { link: LinkId, gen: u32, data: Bytes },
    /// The client's close reaches the server, after its bytes.
    FinToServer { link: LinkId, gen: u32 },
    /// The server's close reaches the client, after its bytes.
    FinToClient { link: LinkId, gen: u32 },
    /// The server learns that the connection was reset.
    ResetToServer { link: LinkId },
    /// The client learns that the connection was reset.
    ResetToClient { link: LinkId },
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

/// One client and its checker.
struct Slot {
    /// The client core, or a bad client around one (feature `sabotage`).
    client: Driven,
    /// Fed what the client does on the network and tells the workload.
    checker: Checker,
    /// The configuration the seed drew, which the checks hold the client
    /// to (the core of a bad client may have another).
    config: ClientConfig,
    finished: bool,
    /// The core's `poll_timeout` after its latest step (it changes only
    /// when the core is called).
    next_timeout: Option<Time>,
    /// The deadline grace of an operation: `queue_grace + answer_grace +
    /// settle_margin`.
    op_grace: Duration,
    /// How long, once the cluster is healthy, a release under way may take.
    release_grace: Duration,
    /// The embedder's releases without an outcome yet, with their token.
    release_ops: BTreeMap<OpId, u64>,
    /// For each grant it renewed, the latest end a renewal sent could
    /// give it: the send time plus the lease asked.
    renewal_ends: BTreeMap<(Key, u64), Time>,
}

/// The whole simulated world of one seed.
pub(super) struct World {
    config: SimConfig,
    seed: u64,
    /// The network's draws and the schedule of faults (the cluster and the
    /// workload draw from generators of their own).
    rng: Rng,
    now: Time,
    heap: BinaryHeap<Scheduled>,
    seq: u64,
    clients: Vec<Slot>,
    cluster: Cluster,
    /// The replicated cluster, in `Scenario::Raft`: it serves the clients
    /// in the place of the cluster's nodes (which then stay idle, but for
    /// their addresses).
    #[cfg(feature = "raft")]
    raft: Option<Members>,
    /// Invariant 8 over the grants the replicated cluster answered.
    answered: Answered,
    /// A check of the replicated cluster's that failed, for the end of the
    /// step.
    raft_failure: Option<Failure>,
    workload: Workload,
    net: Net,
    ledger: Ledger,
    /// What leader changes cost the holders that renew.
    failovers: Tally,
    params: Params,
    ops: Operations,
    faults: Faults,
    trace: TraceHash,
    log: Option<Vec<String>>,
    faults_end: Time,
    work_end: Time,
    heal_at: Option<Time>,
    events: u64,
}

impl World {
    pub(super) fn new(seed: u64, config: &SimConfig) -> World {
        let mut rng = Rng::new(seed);
        let params = Params::draw(&mut rng, config);
        let now = Time::ZERO;
        let faults_end = if config.faults {
            now.saturating_add(config.fault_time)
        } else {
            now
        };
        // In the Raft scenarios the cluster's nodes only lend their
        // addresses to the members.
        let mut cluster_config = config.clone();
        if let Some(members) = config.scenario.raft_members() {
            cluster_config.nodes = members;
        }
        let (cluster, planned) = Cluster::new(
            &params.server,
            &cluster_config,
            Rng::new(rng.next_u64()),
            now,
            faults_end,
        );
        let work_end = now
            .saturating_add(config.fault_time)
            .saturating_add(config.calm_time);
        let (workload, first) = Workload::new(
            Rng::new(rng.next_u64()),
            &params,
            config.clients,
            now,
            work_end,
        );
        let addrs: Vec<_> = cluster.addrs().cloned().collect();
        #[cfg(feature = "raft")]
        let (raft, raft_first) = match config.scenario.raft_members() {
            Some(_) => {
                let (members, first) = Members::new(
                    &params.server,
                    config,
                    &addrs,
                    Rng::new(rng.next_u64()),
                    now,
                    faults_end,
                );
                (Some(members), first)
            }
            None => (None, Vec::new()),
        };
        let hintable: Vec<_> = addrs
            .iter()
            .chain([cluster.impostor_addr()])
            .cloned()
            .collect();
        let clients = (0..config.clients)
            .map(|c| {
                let client_config = client_config(c, &mut rng, &addrs, &params);
                let checker = Checker::new(&client_config, now);
                let client = Driven::new(&client_config, config, &hintable, now);
                let op_grace = client_config.queue_grace
                    + client_config.answer_grace
                    + client_config.settle_margin;
                let b = &client_config.backoff;
                let longest_backoff = [
                    b.transport.cap,
                    b.no_leader.cap,
                    b.not_active.cap,
                    b.auth_failed.cap,
                    b.redirect.cap,
                ]
                .into_iter()
                .max()
                .unwrap_or_default();
                let release_grace = 2
                    * (client_config.connect_timeout
                        + client_config.handshake_timeout
                        + client_config.answer_grace)
                    + longest_backoff
                    + Duration::from_secs(2);
                Slot {
                    client,
                    checker,
                    config: client_config,
                    finished: false,
                    next_timeout: None,
                    op_grace,
                    release_grace,
                    release_ops: BTreeMap::new(),
                    renewal_ends: BTreeMap::new(),
                }
            })
            .collect();
        let mut world = World {
            config: config.clone(),
            seed,
            rng,
            now,
            heap: BinaryHeap::new(),
            seq: 0,
            clients,
            cluster,
            #[cfg(feature = "raft")]
            raft,
            answered: Answered::default(),
            raft_failure: None,
            workload,
            net: Net::default(),
            ledger: Ledger::default(),
            failovers: Tally::default(),
            params,
            ops: Operations::default(),
            faults: Faults::default(),
            trace: TraceHash::new(),
            log: config.trace.then(Vec::new),
            faults_end,
            work_end,
            heal_at: None,
            events: 0,
        };
        for (at, ev) in first {
            world.schedule(at, Ev::Workload(ev));
        }
        world.cluster_effects(planned);
        #[cfg(feature = "raft")]
        world.raft_effects(raft_first);
        if config.faults {
            for (kind, mean) in world.params.fault_means.clone() {
                if let Some(mean) = mean {
                    let first = world.rng.up_to(2 * mean);
                    world.schedule_in(Duration::from_millis(first), Ev::Fault(kind));
                }
            }
        }
        world
    }

    /// Runs the seed to its end and reports.
    pub(super) fn run(mut self) -> Report {
        let result = self.main();
        let mut trace = self.trace;
        for slot in &self.clients {
            trace.write_u64(slot.checker.trace_hash());
        }
        Report {
            seeds: 1,
            events: self.events,
            virtual_time: self.now.saturating_duration_since(Time::ZERO),
            operations: self.ops,
            faults: self.faults,
            writes: self.ledger.writes,
            checked: self.ledger.checked,
            failovers: self.failovers.counts,
            replication: self.replication(),
            violations: result.err().map(|v| *v).into_iter().collect(),
            trace_hash: trace.get(),
            log: self.log.take().unwrap_or_default(),
        }
    }

    fn main(&mut self) -> Step {
        for c in 0..self.clients.len() {
            self.end_client_step(c)?;
        }
        let hard_end = self
            .work_end
            .saturating_add(Duration::from_secs(1))
            .saturating_add(WIND_DOWN);
        loop {
            let event = self.heap.peek().map(|s| s.at);
            let server = self.next_server_timeout();
            let client = self
                .clients
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.finished)
                .filter_map(|(c, s)| s.next_timeout.map(|t| (t, c)))
                .min();
            let Some(next) = [event, server.map(|s| s.0), client.map(|c| c.0)]
                .into_iter()
                .flatten()
                .min()
            else {
                break;
            };
            if next > hard_end || self.events >= MAX_EVENTS {
                return Err(self.violation(
                    Check::Stuck,
                    None,
                    format!(
                        "still running at {next} after {} events (the clients shut down from {})",
                        self.events, self.work_end
                    ),
                ));
            }
            self.now = self.now.max(next);
            self.events += 1;
            match (server, client) {
                (Some((at, node)), _) if at == next => self.server_timeout(node),
                (_, Some((at, c))) if at == next => self.client_timeout(c)?,
                _ => {
                    let scheduled = self.heap.pop().expect("the earliest is an event");
                    self.handle(scheduled.ev)?;
                }
            }
            self.after_event()?;
        }
        self.finish()
    }

    /// The checks once nothing is left to happen.
    fn finish(&mut self) -> Step {
        if let Some(c) = self.clients.iter().position(|s| !s.finished) {
            return Err(self.violation(
                Check::Stuck,
                Some(c),
                "the client never finished its shutdown".to_owned(),
            ));
        }
        if let Some((key, holder)) = self.holder_left() {
            return Err(self.violation(
                Check::Lingering,
                None,
                format!(
                    "({key}, {}) is still held at {} though its lease ended at {}",
                    holder.token, self.now, holder.expires_at
                ),
            ));
        }
        // Every watch, whatever its time: the ground truth is complete.
        if let Err((check, client, detail)) = self.ledger.check(Time::MAX) {
            return Err(self.violation(check, client, detail));
        }
        Ok(())
    }

    /// Global checks, and noticing that the cluster is healthy again.
    fn after_event(&mut self) -> Step {
        if let Some(failure) = self.raft_failure.take() {
            return Err(self.failure(failure));
        }
        if self.heal_at.is_none()
            && self.now >= self.faults_end
            && self.cluster_is_healthy()
            && !self.net.any_partition(self.now)
        {
            self.heal_at = Some(self.now);
            let graces: Vec<Duration> = self.clients.iter().map(|s| s.release_grace).collect();
            self.ledger.healthy(self.now, |c| graces[c]);
            self.note(|| "the cluster is healthy again".to_owned());
        }
        match self.ledger.check(self.now) {
            Ok(()) => Ok(()),
            Err((check, client, detail)) => Err(self.violation(check, client, detail)),
        }
    }

    // ----- plumbing -------------------------------------------------------

    fn violation(&self, check: Check, client: Option<usize>, detail: String) -> Box<Violation> {
        Box::new(Violation {
            seed: self.seed,
            at: self.now,
            check,
            client,
            detail,
            replay: format!(
                "ticketing sim --seed {} --seeds 1 --trace{}",
                self.seed,
                self.config.cli_args()
            ),
        })
    }

    fn checker_violation(&self, c: usize, v: InvariantViolation) -> Box<Violation> {
        let detail = format!("at the checker's step {}: {}", v.step, v.detail);
        self.violation(Check::Invariant(v.invariant), Some(c), detail)
    }

    fn schedule(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at: at.max(self.now),
            seq: self.seq,
            ev,
        });
    }

    fn schedule_in(&mut self, after: Duration, ev: Ev) {
        self.schedule(self.now.saturating_add(after), ev);
    }

    fn note(&mut self, what: impl FnOnce() -> String) {
        if let Some(log) = &mut self.log {
            log.push(format!("{} {}", self.now, what()));
        }
    }

    fn trace_tag(&mut self, tag: &[u8], a: u64) {
        self.trace.write(tag);
        self.trace.write_u64(self.now.as_nanos());
        self.trace.write_u64(a);
    }

    fn faults_on(&self) -> bool {
        self.config.faults && self.now < self.faults_end
    }

    /// A failed global check, as a violation.
    fn failure(&self, failure: Failure) -> Box<Violation> {
        let (check, client, detail) = failure;
        self.violation(check, client, detail)
    }

    // ----- the server side: the cluster's nodes, or the replicated one ----

    /// The earliest server timer, and whose.
    fn next_server_timeout(&self) -> Option<(Time, usize)> {
        #[cfg(feature = "raft")]
        if let Some(members) = &self.raft {
            return members.next_timeout();
        }
        self.cluster.next_timeout()
    }

    /// Whether the cluster is whole again.
    fn cluster_is_healthy(&self) -> bool {
        #[cfg(feature = "raft")]
        if let Some(members) = &self.raft {
            return members.is_healthy(self.now);
        }
        self.cluster.is_healthy()
    }

    /// A grant still held once every lease has run out, if any.
    fn holder_left(&self) -> Option<(Key, crate::server::Holder)> {
        #[cfg(feature = "raft")]
        if let Some(members) = &self.raft {
            return members.holder_left();
        }
        self.cluster.holder_left()
    }

    /// The instance of node `n`'s server core.
    fn node_instance(&self, n: usize) -> u64 {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_ref().filter(|_| n != IMPOSTOR) {
            return members.instance(n);
        }
        self.cluster.instance(n)
    }

    /// Whether node `n` is up.
    fn node_is_up(&mut self, n: usize) -> bool {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_ref().filter(|_| n != IMPOSTOR) {
            return members.is_up(n);
        }
        self.cluster.server_mut(n).is_some()
    }

    /// Node `n` accepts a connection, if it is up.
    fn node_accept(&mut self, n: usize) -> Option<crate::server::ConnId> {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_mut().filter(|_| n != IMPOSTOR) {
            return members.accept(n, self.now);
        }
        Some(self.cluster.server_mut(n)?.handle_accept(self.now))
    }

    /// Bytes reach node `n`.
    fn node_bytes(&mut self, n: usize, sconn: crate::server::ConnId, data: &[u8]) {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_mut().filter(|_| n != IMPOSTOR) {
            return members.bytes(n, self.now, sconn, data);
        }
        if let Some(server) = self.cluster.server_mut(n) {
            server.handle_bytes(self.now, sconn, data);
        }
    }

    /// Node `n` learns that a connection closed.
    fn node_closed(&mut self, n: usize, sconn: crate::server::ConnId) {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_mut().filter(|_| n != IMPOSTOR) {
            return members.closed(n, self.now, sconn);
        }
        if let Some(server) = self.cluster.server_mut(n) {
            server.handle_closed(self.now, sconn);
        }
    }

    /// The replicated cluster's counts, with the answered grants checked.
    fn replication(&self) -> Replication {
        #[cfg(feature = "raft")]
        let counts = self
            .raft
            .as_ref()
            .map_or_else(Replication::default, |m| m.counts);
        #[cfg(not(feature = "raft"))]
        let counts = Replication::default();
        Replication {
            grants_checked: self.answered.grants,
            ..counts
        }
    }

    /// Carries out what the replicated cluster did, in order.
    #[cfg(feature = "raft")]
    fn raft_effects(&mut self, effects: Vec<replicated::Effect>) {
        for effect in effects {
            match effect {
                replicated::Effect::At(at, ev) => self.schedule(at, Ev::Raft(ev)),
                replicated::Effect::Served {
                    node,
                    instance,
                    action,
                } => self.serve(node, instance, action),
                replicated::Effect::Gone { node, instance } => {
                    self.connections_gone(node, instance, Ending::Crash { silent: false })
                }
                replicated::Effect::Fault(kind) => self.faults.bump(kind),
                replicated::Effect::LeaderChange => self.failovers.leader_change(self.now),
                replicated::Effect::Failure(failure) => {
                    self.raft_failure.get_or_insert(failure);
                }
                replicated::Effect::Note(line) => self.note(|| line),
            }
        }
    }

    // ----- the network ----------------------------------------------------

    /// One write's delay: the base latency, or a spike.
    fn delay(&mut self) -> Duration {
        let (lo, hi) = self.params.latency_us;
        let mut us = lo + self.rng.up_to(hi - lo);
        if self.faults_on() && self.rng.chance(self.params.spike_pm, 1000) {
            us = 100_000 + self.rng.up_to(700_000);
            self.faults.bump(FaultKind::Latency);
        }
        Duration::from_micros(us)
    }

    /// When a write on `link` made now arrives: after its delay, after a
    /// short partition that covers it, and after the writes before it.
    fn arrival(&mut self, id: LinkId, to_server: bool) -> Time {
        let delay = self.delay();
        let now = self.now;
        let mut at = now.saturating_add(delay);
        let Some(link) = self.net.links.get(&id) else {
            return at;
        };
        if let Some(until) = self.net.partition(link.client, link.target, now) {
            at = at.max(until);
        }
        let link = self.net.links.get_mut(&id).expect("present");
        let last = if to_server {
            &mut link.last_to_server
        } else {
            &mut link.last_to_client
        };
        at = at.max(*last);
        *last = at;
        debug_assert!(at.saturating_duration_since(now) <= MAX_DELAY);
        at
    }

    /// Schedules `data` on `link`, maybe split into chunks.
    fn send_segments(&mut self, id: LinkId, to_server: bool, data: Bytes) {
        self.trace.write(if to_server { b">" } else { b"<" });
        self.trace.write_u64(id);
        self.trace.write(&data);
        let split =
            data.len() > 1 && self.faults_on() && self.rng.chance(self.params.split_pm, 1000);
        let mut pieces = Vec::new();
        if split {
            self.faults.bump(FaultKind::Split);
            let cuts = 1 + self.rng.up_to(2) as usize;
            let mut at: Vec<usize> = (0..cuts)
                .map(|_| 1 + self.rng.up_to(data.len() as u64 - 2) as usize)
                .collect();
            at.sort_unstable();
            at.dedup();
            let mut from = 0;
            for cut in at {
                pieces.push(data.slice(from..cut));
                from = cut;
            }
            pieces.push(data.slice(from..));
        } else {
            pieces.push(data);
        }
        for piece in pieces {
            let at = self.arrival(id, to_server);
            let gen = self.net.links[&id].gen;
            let ev = if to_server {
                Ev::ToServer {
                    link: id,
                    gen,
                    data: piece,
                }
            } else {
                Ev::ToClient {
                    link: id,
                    gen,
                    data: piece,
                }
            };
            self.schedule(at, ev);
        }
    }

    fn reap(&mut self, id: LinkId) {
        self.net.reap(id, |t| match t {
            Target::Node(n) => n,
            _ => IMPOSTOR,
        });
    }

    /// A client's action, carried out on the network.
    fn route_client_action(&mut self, c: usize, action: Action) -> Step {
        match action {
            Action::Connect { conn, addr } => {
                self.check_allowed(c, &addr, "connects to")?;
                let target = self.cluster.target_of(&addr);
                let id = self.net.open(c, conn, target);
                self.trace_tag(b"connect", id);
                if self.net.partition(c, target, self.now).is_none() {
                    let at = self.arrival(id, true);
                    self.schedule(at, Ev::ConnectArrive { link: id, gen: 0 });
                }
            }
            Action::Send { conn, data } => {
                let Some(id) = self.net.of_client(c, conn) else {
                    return Ok(());
                };
                self.record_requests(c, id, &data);
                let link = &self.net.links[&id];
                if link.client_closed
                    || link.server_closed
                    || link.blackhole
                    || link.sconn.is_none()
                {
                    return Ok(());
                }
                self.send_segments(id, true, data);
            }
            Action::Close { conn } => {
                let Some(id) = self.net.of_client(c, conn) else {
                    return Ok(());
                };
                let link = self.net.links.get_mut(&id).expect("indexed");
                link.client_closed = true;
                let fin = !link.server_closed && link.sconn.is_some() && !link.blackhole;
                let gen = link.gen;
                if fin {
                    let at = self.arrival(id, true);
                    self.schedule(at, Ev::FinToServer { link: id, gen });
                }
                self.reap(id);
            }
        }
        Ok(())
    }

    /// Notes the requests a client writes, for the ground truth.
    fn record_requests(&mut self, c: usize, id: LinkId, data: &[u8]) {
        let mut found = Vec::new();
        for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            match ClientFrame::parse(line) {
                Ok(ClientFrame::Acquire { id: rid, owner, .. }) => {
                    let op = self.ledger.op_of_owner(c, owner.as_str());
                    found.push((rid, Request::Acquire { op }));
                }
                Ok(ClientFrame::Release {
                    id: rid,
                    key,
                    token,
                }) => {
                    let key = Key::from(key);
                    found.push((rid, Request::Release { key, token }));
                }
                Ok(ClientFrame::Renew {
                    id: rid,
                    key,
                    token,
                    lease_ms,
                }) => {
                    let key = Key::from(key);
                    let end = self.now.saturating_add_millis(lease_ms.get());
                    let ends = &mut self.clients[c].renewal_ends;
                    let latest = ends.entry((key.clone(), token)).or_insert(end);
                    *latest = (*latest).max(end);
                    found.push((rid, Request::Renew { key, token }));
                }
                _ => {}
            }
        }
        if let Some(link) = self.net.links.get_mut(&id) {
            link.requests.extend(found);
        }
    }

    /// Drains a server core's actions onto the network.
    fn drain_server(&mut self, n: usize) {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_mut().filter(|_| n != IMPOSTOR) {
            let mut effects = Vec::new();
            members.drain(n, self.now, &mut effects);
            return self.raft_effects(effects);
        }
        let instance = self.cluster.instance(n);
        while let Some(action) = self.cluster.server_mut(n).and_then(|s| s.poll_action()) {
            self.serve(n, instance, action);
        }
    }

    /// An action of the server core of node `n` at `instance`, carried out
    /// on the network.
    fn serve(&mut self, n: usize, instance: u64, action: ServerAction) {
        match action {
            ServerAction::Send { conn, data } => {
                let Some(id) = self.net.of_server(n, instance, conn) else {
                    return;
                };
                if n != IMPOSTOR {
                    self.observe_answers(n, id, &data);
                }
                let link = &self.net.links[&id];
                if link.client_closed || link.blackhole {
                    return;
                }
                self.send_segments(id, false, data);
            }
            ServerAction::Close { conn } => {
                let Some(id) = self.net.of_server(n, instance, conn) else {
                    return;
                };
                let link = self.net.links.get_mut(&id).expect("indexed");
                link.server_closed = true;
                let fin = !link.client_closed && !link.blackhole;
                let gen = link.gen;
                if fin {
                    let at = self.arrival(id, false);
                    self.schedule(at, Ev::FinToClient { link: id, gen });
                }
                self.reap(id);
            }
            // The simulator's cores take their epochs themselves
            // (`EpochSource::Core`): they never ask.
            ServerAction::NeedEpoch { .. } => {}
        }
    }

    /// The connections of node `n`'s server core at `instance` end with
    /// it, as `ending` says.
    fn connections_gone(&mut self, n: usize, instance: u64, ending: Ending) {
        let gone: Vec<LinkId> = self
            .net
            .links
            .iter()
            .filter(|(_, l)| {
                l.target == Target::Node(n)
                    && l.instance == instance
                    && l.sconn.is_some()
                    && !l.server_closed
            })
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            let link = self.net.links.get_mut(&id).expect("listed");
            link.server_closed = true;
            // (A link cut by a partition hears of it when the partition
            // ends.)
            let heard = !link.client_closed && !link.blackhole;
            let ev = match ending {
                Ending::Crash { silent } => {
                    link.gen += 1;
                    link.blackhole |= silent;
                    (heard && !silent).then_some(Ev::ResetToClient { link: id })
                }
                Ending::Replaced => heard.then_some(Ev::FinToClient {
                    link: id,
                    gen: link.gen,
                }),
            };
            if let Some(ev) = ev {
                let at = self.arrival(id, false);
                self.schedule(at, ev);
            }
            self.reap(id);
        }
    }

    /// Resets one established connection: both sides learn it after a
    /// delay, and the bytes in flight are lost.
    fn reset_a_connection(&mut self) {
        let open: Vec<LinkId> = self
            .net
            .links
            .iter()
            .filter(|(_, l)| l.is_established())
            .map(|(&id, _)| id)
            .collect();
        if open.is_empty() {
            return;
        }
        let id = open[self.rng.up_to(open.len() as u64 - 1) as usize];
        self.note(|| format!("fault: link {id} is reset"));
        self.faults.bump(FaultKind::Reset);
        let link = self.net.links.get_mut(&id).expect("listed");
        link.gen += 1;
        let to_client = self.arrival(id, false);
        let to_server = self.arrival(id, true);
        self.schedule(to_client, Ev::ResetToClient { link: id });
        self.schedule(to_server, Ev::ResetToServer { link: id });
    }

    /// Cuts a client off from one node, or from all, for a while. A short
    /// partition delays the bytes until it heals; a long one cuts the
    /// connections: the server side learns after [`MAX_DELAY`], the client
    /// when the partition heals (if its own timers have not told it first).
    fn partition(&mut self) {
        let c = self.rng.up_to(self.clients.len().max(1) as u64 - 1) as usize;
        let node = if self.rng.chance(1, 3) {
            None
        } else {
            Some(self.rng.up_to(self.cluster.node_count() as u64 - 1) as usize)
        };
        let cut = self.rng.chance(1, 2);
        let length = if cut {
            millis_between(&mut self.rng, 500, 3_000)
        } else {
            millis_between(&mut self.rng, 50, DELAY_PARTITION.as_millis() as u64)
        };
        let until = self.now.saturating_add(length);
        self.note(|| format!("fault: c{c} cut off from {node:?} for {length:?} (cut: {cut})"));
        self.faults.bump(FaultKind::Partition);
        self.net.heal(self.now);
        let partition = Partition {
            client: c,
            node,
            until,
        };
        self.net.partitions.push(partition);
        if !cut {
            return;
        }
        let cut_links: Vec<LinkId> = self
            .net
            .links
            .iter()
            .filter(|(_, l)| !l.is_done() && partition.covers(l.client, l.target))
            .map(|(&id, _)| id)
            .collect();
        for id in cut_links {
            let link = self.net.links.get_mut(&id).expect("listed");
            link.gen += 1;
            link.blackhole = true;
            let (server_side, client_side) = (
                link.sconn.is_some() && !link.server_closed,
                !link.client_closed,
            );
            if server_side {
                self.schedule_in(MAX_DELAY, Ev::ResetToServer { link: id });
            }
            if client_side {
                self.schedule(until, Ev::ResetToClient { link: id });
            }
        }
    }

    /// Reads what a cluster node answered, for the ground truth: grants,
    /// releases, and `B` answers.
    fn observe_answers(&mut self, n: usize, id: LinkId, data: &[u8]) {
        for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(ServerFrame::Answer(answer)) = ServerFrame::parse(line) else {
                continue;
            };
            let Some(link) = self.net.links.get_mut(&id) else {
                return;
            };
            let client = link.client;
            let request = link.requests.remove(&answer.id);
            match (answer.kind, request) {
                (
                    AnswerKind::Granted {
                        token, lease_ms, ..
                    },
                    Some(Request::Acquire { op }),
                ) => {
                    let key = Key::from(answer.key);
                    #[cfg(feature = "raft")]
                    if let Some(members) = &self.raft {
                        let end = members.lease_end(n, &key, token, self.now);
                        let released = |old| members.release_committed(n, &key, old);
                        let checked = self.answered.granted(&key, token, end, self.now, released);
                        if let Err(failure) = checked {
                            self.raft_failure.get_or_insert(failure);
                        }
                    }
                    let expires_at = self
                        .cluster
                        .server_mut(n)
                        .and_then(|s| s.holder(key.as_str()))
                        .filter(|h| h.token == token)
                        .map_or_else(
                            || {
                                self.now
                                    .saturating_add(Duration::from_millis(lease_ms.get()))
                            },
                            |h| h.expires_at,
                        );
                    self.ledger.grant_made(token, key, client, op, expires_at);
                }
                (AnswerKind::Released, Some(Request::Release { key, token })) => {
                    self.answered.released(&key, token, self.now);
                    self.ledger.released(&key, token, self.now);
                }
                (AnswerKind::Renewed { lease_ms, .. }, Some(Request::Renew { key, token })) => {
                    let expires_at = self
                        .now
                        .saturating_add(Duration::from_millis(lease_ms.get()));
                    #[cfg(feature = "raft")]
                    if let Some(members) = &self.raft {
                        let end = members.lease_end(n, &key, token, self.now);
                        self.answered.renewed(&key, token, end);
                    }
                    self.ledger.renewed(&key, token, expires_at);
                    self.failovers
                        .cluster_renewed(client, &key, token, self.now);
                }
                (AnswerKind::Busy, _) => self.faults.bump(FaultKind::Busy),
                _ => {}
            }
        }
    }

    fn server_timeout(&mut self, n: usize) {
        self.trace_tag(b"server-timeout", n as u64);
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_mut() {
            let mut effects = Vec::new();
            members.timeout(n, self.now, &mut effects);
            return self.raft_effects(effects);
        }
        if let Some(server) = self.cluster.server_mut(n) {
            server.handle_timeout(self.now);
        }
        self.drain_server(n);
    }

    // ----- events ---------------------------------------------------------

    /// Adds an event to the trace, ignored or not.
    fn trace_event(&mut self, ev: &Ev) {
        let (kind, a, b): (u64, u64, u64) = match ev {
            Ev::ConnectArrive { link, gen } => (1, *link, u64::from(*gen)),
            Ev::ConnectReply { link, gen, ok } => (2, *link, u64::from(*gen) << 1 | u64::from(*ok)),
            Ev::ToServer { link, gen, .. } => (3, *link, u64::from(*gen)),
            Ev::ToClient { link, gen, .. } => (4, *link, u64::from(*gen)),
            Ev::FinToServer { link, gen } => (5, *link, u64::from(*gen)),
            Ev::FinToClient { link, gen } => (6, *link, u64::from(*gen)),
            Ev::ResetToServer { link } => (7, *link, 0),
            Ev::ResetToClient { link } => (8, *link, 0),
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
        };
        self.trace.write_u64(self.now.as_nanos());
        self.trace.write_u64(kind);
        self.trace.write_u64(a);
        self.trace.write_u64(b);
    }

    fn handle(&mut self, ev: Ev) -> Step {
        self.trace_event(&ev);
        match ev {
            Ev::ConnectArrive { link, gen } => self.connect_arrive(link, gen),
            Ev::ConnectReply { link, gen, ok } => {
                let Some(l) = self.net.links.get_mut(&link) else {
                    return Ok(());
                };
                if l.gen != gen || l.client_closed {
                    return Ok(());
                }
                let (c, conn) = (l.client, l.cconn);
                if !ok {
                    l.client_closed = true;
                }
                self.trace_tag(b"connect-reply", link);
                if ok {
                    self.client_input(c, Input::Connected(conn))
                } else {
                    self.reap(link);
                    self.client_input(c, Input::ConnectFailed(conn))
                }
            }
            Ev::ToServer { link, gen, data } => {
                let Some(l) = self.net.links.get(&link) else {
                    return Ok(());
                };
                if l.gen != gen || l.server_closed {
                    return Ok(());
                }
                let (Some(sconn), n) = (l.sconn, node_index(l.target)) else {
                    return Ok(());
                };
                if self.node_instance(n) != l.instance {
                    return Ok(());
                }
                self.trace_tag(b"to-server", link);
                self.note(|| {
                    format!(
                        "{} reads link {link}: {:?}",
                        node_name(n),
                        String::from_utf8_lossy(&data)
                    )
                });
                self.node_bytes(n, sconn, &data);
                self.drain_server(n);
                Ok(())
            }
            Ev::ToClient { link, gen, data } => {
                let Some(l) = self.net.links.get(&link) else {
                    return Ok(());
                };
                if l.gen != gen || l.client_closed {
                    return Ok(());
                }
                let (c, conn) = (l.client, l.cconn);
                self.trace_tag(b"to-client", link);
                self.client_input(c, Input::Bytes(conn, data))
            }
            Ev::FinToServer { link, gen } => {
                let Some(l) = self.net.links.get(&link) else {
                    return Ok(());
                };
                if l.gen != gen {
                    return Ok(());
                }
                self.server_learns_closed(link);
                Ok(())
            }
            Ev::ResetToServer { link } => {
                self.server_learns_closed(link);
                Ok(())
            }
            Ev::FinToClient { link, gen } => {
                let Some(l) = self.net.links.get(&link) else {
                    return Ok(());
                };
                if l.gen != gen || l.client_closed {
                    return Ok(());
                }
                let (c, conn) = (l.client, l.cconn);
                self.trace_tag(b"fin-to-client", link);
                self.client_input(c, Input::Closed(conn, TransportEnd::Eof))
            }
            Ev::ResetToClient { link } => {
                let Some(l) = self.net.links.get(&link) else {
                    return Ok(());
                };
                if l.client_closed {
                    return Ok(());
                }
                let (c, conn) = (l.client, l.cconn);
                self.trace_tag(b"reset-to-client", link);
                self.client_input(c, Input::Closed(conn, TransportEnd::Error))
            }
            Ev::Workload(ev) => {
                let c = ev.client();
                let mut effects = Vec::new();
                self.workload.handle(ev, self.now, &mut effects);
                self.embedder_effects(c, effects)
            }
            Ev::Fault(kind) => {
                if self.faults_on() {
                    self.trace_tag(b"fault", kind as u64);
                    self.inject(kind);
                    let mean = self
                        .params
                        .fault_means
                        .iter()
                        .find(|(k, _)| *k == kind)
                        .and_then(|(_, m)| *m)
                        .expect("scheduled kinds have a mean");
                    let next = self.rng.up_to(2 * mean);
                    self.schedule_in(Duration::from_millis(next), Ev::Fault(kind));
                }
                Ok(())
            }
            Ev::Cluster(ev) => {
                let mut effects = Vec::new();
                self.cluster.handle(ev, self.now, &mut effects);
                self.cluster_effects(effects);
                Ok(())
            }
            #[cfg(feature = "raft")]
            Ev::Raft(ev) => {
                let mut effects = Vec::new();
                if let Some(members) = self.raft.as_mut() {
                    members.handle(ev, self.now, &mut effects);
                }
                self.raft_effects(effects);
                Ok(())
            }
        }
    }

    /// Injects a fault of a scheduled kind: the network's here, the
    /// cluster's by the cluster.
    fn inject(&mut self, kind: FaultKind) {
        match kind {
            FaultKind::Reset => self.reset_a_connection(),
            FaultKind::Partition => self.partition(),
            _ => {
                let mut effects = Vec::new();
                self.cluster.inject(kind, self.now, &mut effects);
                self.cluster_effects(effects);
            }
        }
    }

    /// Carries out what the cluster did, in order.
    fn cluster_effects(&mut self, effects: Vec<cluster::Effect>) {
        for effect in effects {
            match effect {
                cluster::Effect::At(at, ev) => self.schedule(at, Ev::Cluster(ev)),
                cluster::Effect::Served {
                    node,
                    instance,
                    action,
                } => self.serve(node, instance, action),
                cluster::Effect::Gone {
                    node,
                    instance,
                    ending,
                } => self.connections_gone(node, instance, ending),
                cluster::Effect::Fault(kind) => self.faults.bump(kind),
                cluster::Effect::LeaderChange => self.failovers.leader_change(self.now),
                cluster::Effect::TableLost => self.ledger.table_lost(self.now),
                cluster::Effect::Note(line) => self.note(|| line),
            }
        }
    }

    /// Carries out what client `c`'s embedder does, in order: each command
    /// is one checked step.
    fn embedder_effects(&mut self, c: usize, effects: Vec<workload::Effect>) -> Step {
        for effect in effects {
            match effect {
                workload::Effect::At(at, ev) => self.schedule(at, Ev::Workload(ev)),
                workload::Effect::Write { key, token } => {
                    if let Err(failure) = self.ledger.write(c, &key, token, self.now) {
                        return Err(self.failure(failure));
                    }
                }
                workload::Effect::Command(command) => self.command(c, command)?,
            }
        }
        Ok(())
    }

    fn connect_arrive(&mut self, id: LinkId, gen: u32) -> Step {
        let Some(l) = self.net.links.get(&id) else {
            return Ok(());
        };
        if l.gen != gen || l.client_closed {
            return Ok(());
        }
        let (c, target) = (l.client, l.target);
        if self.net.partition(c, target, self.now).is_some() {
            // The connect is lost: the client's connect timeout fires.
            return Ok(());
        }
        self.trace_tag(b"connect-arrive", id);
        let n = node_index(target);
        let up = target != Target::Nowhere && self.node_is_up(n);
        let refused = up
            && target != Target::Impostor
            && self.faults_on()
            && self.rng.chance(self.params.refuse_pm, 1000);
        if refused {
            self.faults.bump(FaultKind::Refused);
        }
        let ok = up && !refused;
        if ok {
            let instance = self.node_instance(n);
            let sconn = self.node_accept(n).expect("up");
            self.net.accepted(id, n, instance, sconn);
            self.note(|| format!("{} accepts c{c}'s link {id}", node_name(n)));
            self.drain_server(n);
        }
        let at = self.arrival(id, false);
        self.schedule(at, Ev::ConnectReply { link: id, gen, ok });
        Ok(())
    }

    /// The server side of `link` learns that the connection is gone.
    fn server_learns_closed(&mut self, id: LinkId) {
        let Some(l) = self.net.links.get_mut(&id) else {
            return;
        };
        if l.server_closed {
            return;
        }
        let Some(sconn) = l.sconn else {
            return;
        };
        let n = node_index(l.target);
        l.server_closed = true;
        let instance = l.instance;
        if self.node_instance(n) == instance {
            self.trace_tag(b"server-closed", id);
            self.node_closed(n, sconn);
            self.drain_server(n);
        }
        self.reap(id);
    }

    // ----- client steps ---------------------------------------------------

    /// Hands an input to a client core, as one checked step.
    fn client_input(&mut self, c: usize, input: Input) -> Step {
        if self.clients[c].finished {
            return Ok(());
        }
        let now = self.now;
        match input {
            Input::Connected(conn) => {
                let slot = &mut self.clients[c];
                slot.client.handle_connected(now, conn);
                slot.checker.connected(now, conn);
            }
            Input::ConnectFailed(conn) => {
                let slot = &mut self.clients[c];
                slot.client.handle_connect_failed(now, conn);
                slot.checker.connect_failed(now, conn);
            }
            Input::Closed(conn, end) => {
                let slot = &mut self.clients[c];
                slot.client.handle_transport_closed(now, conn, end);
                slot.checker.transport_closed(now, conn);
            }
            Input::Bytes(conn, data) => {
                // Due timers first (the checker's rule for drivers).
                let slot = &mut self.clients[c];
                slot.client.handle_timeout(now);
                slot.checker.timeout(now);
                self.drain_client(c)?;
                self.note(|| format!("c{c} reads {conn}: {:?}", String::from_utf8_lossy(&data)));
                let slot = &mut self.clients[c];
                slot.client.handle_bytes(now, conn, &data);
                if let Err(v) = slot.checker.bytes(now, conn, &data) {
                    return Err(self.checker_violation(c, v));
                }
            }
        }
        self.end_client_step(c)
    }

    fn client_timeout(&mut self, c: usize) -> Step {
        self.trace_tag(b"client-timeout", c as u64);
        let now = self.now;
        let slot = &mut self.clients[c];
        slot.client.handle_timeout(now);
        slot.checker.timeout(now);
        self.end_client_step(c)
    }

    /// Drains the client, ends the checker's step, and finishes the
    /// checker when the client has shut down.
    fn end_client_step(&mut self, c: usize) -> Step {
        self.drain_client(c)?;
        let slot = &mut self.clients[c];
        if let Err(v) = slot.checker.end_step(slot.client.core()) {
            return Err(self.checker_violation(c, v));
        }
        let slot = &mut self.clients[c];
        slot.next_timeout = slot.client.poll_timeout().filter(|&t| t < Time::MAX);
        if slot.client.is_finished() && !slot.finished {
            slot.finished = true;
            if let Err(v) = slot.checker.finish(slot.client.core()) {
                return Err(self.checker_violation(c, v));
            }
            self.workload.finished(c);
            #[cfg(feature = "raft")]
            if self.clients.iter().all(|s| s.finished) {
                if let Some(members) = self.raft.as_mut() {
                    members.wind_down(self.now);
                }
            }
        }
        Ok(())
    }

    fn drain_client(&mut self, c: usize) -> Step {
        loop {
            let mut any = false;
            while let Some(action) = self.clients[c].client.poll_action() {
                any = true;
                if let Err(v) = self.clients[c].checker.action(&action) {
                    return Err(self.checker_violation(c, v));
                }
                self.note(|| format!("c{c} action {action:?}"));
                self.route_client_action(c, action)?;
            }
            while let Some(event) = self.clients[c].client.poll_event() {
                any = true;
                if let Err(v) = self.clients[c].checker.event(&event) {
                    return Err(self.checker_violation(c, v));
                }
                self.note(|| format!("c{c} event {event:?}"));
                self.on_client_event(c, event)?;
            }
            if !any {
                return Ok(());
            }
        }
    }

    fn on_client_event(&mut self, c: usize, event: Event) -> Step {
        match event {
            Event::Outcome { op, outcome } => {
                self.ledger.op_ended(c, op);
                self.failovers.outcome(c, op, &outcome, self.now);
                let release_token = self.clients[c].release_ops.remove(&op);
                let o = &mut self.ops;
                match &outcome {
                    Outcome::Granted(_) => o.granted += 1,
                    Outcome::TimedOut { sent: true, .. } => o.timed_out += 1,
                    Outcome::TimedOut { sent: false, .. } => o.timed_out_unsent += 1,
                    Outcome::Busy => o.busy += 1,
                    Outcome::Cancelled => o.cancelled += 1,
                    Outcome::Indeterminate { .. } => o.indeterminate += 1,
                    Outcome::Released => o.released += 1,
                    Outcome::NotHeld => o.not_held += 1,
                    Outcome::Lapsed => o.lapsed += 1,
                }
                match &outcome {
                    Outcome::Granted(grant) => self.hold(c, grant)?,
                    Outcome::Indeterminate { settles_by } => {
                        self.ledger.indeterminate(c, op, *settles_by)
                    }
                    Outcome::Lapsed => {
                        if let Some(token) = release_token {
                            self.ledger.release_lapsed(c, token);
                        }
                    }
                    _ => {}
                }
                let mut effects = Vec::new();
                self.workload
                    .outcome(c, op, &outcome, self.now, &mut effects);
                debug_assert!(
                    !effects
                        .iter()
                        .any(|e| matches!(e, workload::Effect::Command(_))),
                    "no command while the client is drained"
                );
                self.embedder_effects(c, effects)?;
            }
            Event::OrphanRelease { token, .. } => {
                self.ops.orphan_releases += 1;
                let grace = self.clients[c].release_grace;
                self.ledger
                    .release_started(c, token, self.now, self.heal_at, grace);
            }
            Event::OrphanSettled {
                token,
                result: ReleaseResult::Lapsed,
                ..
            } => self.ledger.release_lapsed(c, token),
            Event::ShutdownComplete => self.ledger.shutdown_complete(c),
            Event::LeaderHint { addr } => self.check_allowed(c, &addr, "takes a leader hint to")?,
            Event::Renewed {
                key,
                token,
                valid_until,
                ..
            } => {
                self.ops.renewed += 1;
                self.failovers
                    .renewed(c, &key, token, valid_until, self.now);
                if let Err(failure) = self.ledger.extend(c, &key, token, valid_until, self.now) {
                    return Err(self.failure(failure));
                }
            }
            Event::LeaseJeopardy { .. } => self.ops.jeopardies += 1,
            Event::LeaseLost { key, token, .. } => {
                // The grant is gone: the holder stops counting on it.
                self.ops.leases_lost += 1;
                self.ledger.unhold(c, &key, token, self.now);
                self.failovers.ended(c, &key, token, false, self.now);
            }
            Event::LeaseExpired { key, token, .. } => {
                self.ops.leases_expired += 1;
                self.failovers.ended(c, &key, token, true, self.now);
            }
            _ => {}
        }
        Ok(())
    }

    /// A client may go only to its endpoints and allowlist.
    fn check_allowed(&self, c: usize, addr: &crate::names::Endpoint, what: &str) -> Step {
        let config = &self.clients[c].config;
        if config
            .endpoints
            .iter()
            .chain(&config.allow)
            .any(|e| e == addr)
        {
            return Ok(());
        }
        let detail = format!(
            "c{c} {what} {addr}, which is neither an endpoint ({:?}) nor allowlisted ({:?})",
            config.endpoints, config.allow
        );
        Err(self.violation(Check::Allowlist, Some(c), detail))
    }

    // ----- the embedder's commands, each one checked step -------------------

    /// Gives client `c` a command of its embedder's.
    fn command(&mut self, c: usize, command: Command) -> Step {
        match command {
            Command::Acquire {
                key,
                owner,
                wait,
                lease,
                renew,
            } => self.cmd_acquire(c, key, owner, wait, lease, renew),
            Command::Renew(grant, how) => self.cmd_renew(c, &grant, how),
            Command::Cancel(op) => self.cmd_cancel(c, op),
            Command::Release(grant) => self.cmd_release(c, &grant),
            Command::Undeliverable(grant) => self.cmd_undeliverable(c, &grant),
            Command::Shutdown(budget) => self.cmd_shutdown(c, budget),
        }
    }

    fn cmd_acquire(
        &mut self,
        c: usize,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        renew: Option<Option<Duration>>,
    ) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let (result, checked) = match renew {
            None => {
                let result = slot
                    .client
                    .acquire(now, key.clone(), owner.clone(), wait, lease);
                let checked = slot
                    .checker
                    .acquire(now, &key, &owner, wait, lease, &result);
                (result, checked)
            }
            Some(limit) => {
                let result = slot.client.acquire_renewing(
                    now,
                    key.clone(),
                    owner.clone(),
                    wait,
                    lease,
                    limit,
                );
                let checked = slot
                    .checker
                    .acquire_renewing(now, &key, &owner, wait, lease, limit, &result);
                (result, checked)
            }
        };
        if let Err(v) = checked {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| {
            format!("c{c} acquire {key} as {owner} wait {wait:?} lease {lease:?} renew {renew:?}: {result:?}")
        });
        match result {
            Ok(op) => {
                if let Some(limit) = renew {
                    self.failovers.acquired(c, op, limit);
                }
                let grace = self.clients[c].op_grace;
                self.ledger.owner(c, owner.as_str().to_owned(), op);
                self.ledger.op_started(
                    c,
                    op,
                    OpInfo {
                        what: format!(
                            "acquire {key} waiting {} ms for a lease of {} ms",
                            wait.as_millis(),
                            lease.as_millis()
                        ),
                        submitted: now,
                        deadline: now.saturating_add(wait + lease + grace),
                    },
                );
                self.workload.acquired(c, op, renew.is_some());
            }
            Err(ClientError::Busy) => self.ops.refused += 1,
            Err(_) => {}
        }
        self.end_client_step(c)
    }

    fn cmd_release(&mut self, c: usize, grant: &Grant) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let result = slot.client.release(now, grant);
        if let Err(v) = slot.checker.release(now, grant, &result) {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| format!("c{c} release {} {}: {result:?}", grant.key(), grant.token()));
        self.ledger.unhold(c, grant.key(), grant.token(), now);
        self.failovers.given_up(c, grant.key(), grant.token());
        // A renewed grant's release keeps trying until the latest end its
        // renewals could give it (plus the margin), and the renewal's
        // answer may come a round trip later than its send.
        let renewed_until = self.clients[c]
            .renewal_ends
            .remove(&(grant.key().clone(), grant.token()))
            .map(|end| end.saturating_add(ROUND_TRIP));
        if let Ok(op) = result {
            let grace = self.clients[c].op_grace;
            let deadline = now
                .saturating_add(grant.lease())
                .max(renewed_until.unwrap_or(Time::ZERO))
                .saturating_add(grace);
            self.ledger.op_started(
                c,
                op,
                OpInfo {
                    what: format!(
                        "release ({}, {}) of a lease of {} ms",
                        grant.key(),
                        grant.token(),
                        grant.lease().as_millis()
                    ),
                    submitted: now,
                    deadline,
                },
            );
            self.clients[c].release_ops.insert(op, grant.token());
            let grace = self.clients[c].release_grace;
            self.ledger
                .release_started(c, grant.token(), now, self.heal_at, grace);
        }
        self.end_client_step(c)
    }

    fn cmd_undeliverable(&mut self, c: usize, grant: &Grant) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let result = slot.client.undeliverable(now, grant);
        if let Err(v) = slot.checker.undeliverable(now, grant, &result) {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| {
            format!(
                "c{c} undeliverable {} {}: {result:?}",
                grant.key(),
                grant.token()
            )
        });
        self.ledger.unhold(c, grant.key(), grant.token(), now);
        self.failovers.given_up(c, grant.key(), grant.token());
        self.end_client_step(c)
    }

    fn cmd_renew(&mut self, c: usize, grant: &Grant, how: workload::RenewHow) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let (result, checked) = match how {
            workload::RenewHow::Manual { lease } => {
                let result = slot.client.renew(now, grant, lease);
                let checked = slot.checker.renew(now, grant, lease, &result);
                (result, checked)
            }
            workload::RenewHow::Auto { limit } => {
                let result = slot.client.auto_renew(now, grant, limit);
                let checked = slot.checker.auto_renew(now, grant, limit, &result);
                (result, checked)
            }
            workload::RenewHow::Stop => {
                let result = slot.client.stop_renewing(now, grant);
                let checked = slot.checker.stop_renewing(now, grant, &result);
                (result, checked)
            }
        };
        if let Err(v) = checked {
            return Err(self.checker_violation(c, v));
        }
        self.ops.renew_calls += 1;
        self.note(|| format!("c{c} {how:?} {} {}: {result:?}", grant.key(), grant.token()));
        if result.is_ok() {
            let (key, token) = (grant.key(), grant.token());
            match how {
                workload::RenewHow::Auto { limit } => {
                    let core = self.clients[c].client.core();
                    if let Some(valid_until) = core.valid_until(grant) {
                        self.failovers
                            .auto_renew(c, key, token, valid_until, limit, now);
                    }
                }
                workload::RenewHow::Stop => self.failovers.given_up(c, key, token),
                workload::RenewHow::Manual { .. } => {}
            }
        }
        self.end_client_step(c)
    }

    fn cmd_cancel(&mut self, c: usize, op: OpId) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let result = slot.client.cancel(now, op);
        if let Err(v) = slot.checker.cancel(now, op, &result) {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| format!("c{c} cancel {op}: {result:?}"));
        self.end_client_step(c)
    }

    fn cmd_shutdown(&mut self, c: usize, budget: Duration) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let result = slot.client.shutdown(now, budget);
        if let Err(v) = slot.checker.shutdown(now, budget, &result) {
            return Err(self.checker_violation(c, v));
        }
        self.note(|| format!("c{c} shutdown within {budget:?}: {result:?}"));
        if result.is_ok() {
            self.ledger
                .shutdown_started(c, now, now.saturating_add(budget));
            self.failovers.shutdown(c);
        }
        self.end_client_step(c)
    }

    /// The embedder of `c` was handed `grant`: it holds it, checked for
    /// mutual exclusion.
    fn hold(&mut self, c: usize, grant: &Grant) -> Step {
        let (key, token) = (grant.key(), grant.token());
        match self
            .ledger
            .hold(c, key, token, grant.valid_until(), self.now)
        {
            Ok(()) => Ok(()),
            Err(failure) => Err(self.failure(failure)),
        }
    }
}

/// An input for a client core.
enum Input {
    Connected(ConnId),
    ConnectFailed(ConnId),
    Bytes(ConnId, Bytes),
    Closed(ConnId, TransportEnd),
}

/// The longest a request and its answer take on the simulated network:
/// [`MAX_DELAY`] each way at most (a longer partition cuts the
/// connection).
const ROUND_TRIP: Duration = MAX_DELAY.saturating_mul(2);

/// How the log names a server.
fn node_name(n: usize) -> String {
    if n == IMPOSTOR {
        "rogue".to_owned()
    } else {
        format!("n{n}")
    }
}

/// The server index of a link's target (the impostor's is [`IMPOSTOR`]).
fn node_index(target: Target) -> usize {
    match target {
        Target::Node(n) => n,
        Target::Impostor | Target::Nowhere => IMPOSTOR,
    }
}
