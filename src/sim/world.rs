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
//! The world owns the clock, the schedule, the clients and their checkers,
//! the ground truth of the global checks, and the tally of what leader
//! changes cost the holders; it draws the fault schedule from the seed's
//! generator, and lends that generator to the [`Net`] for the network's
//! draws. The [`Net`], the [`Cluster`] and the [`Workload`] own their
//! state (the cluster and the workload generators of their own, seeded
//! from the seed's): the world hands them their events, the faults due and
//! the clients' outcomes, and carries out the effects they hand back, in
//! their order. Nothing else acts on the world.

use core::cmp::Ordering;
use core::time::Duration;
use std::collections::{BTreeMap, BinaryHeap};

use super::check::{Answered, Failure, Ledger, OpInfo};
use super::cluster::{self, Cluster, IMPOSTOR};
use super::driven::Driven;
use super::failover::Tally;
use super::net::{self, Delivery, Ending, Env, Input, LinkId, Net, Request, Target, MAX_DELAY};
#[cfg(feature = "raft")]
use super::raft::{self as replicated, Members};
use super::workload::{self, client_config, Command, Params, RenewHow, Workload};
use super::{Check, FaultKind, Faults, Operations, Replication, Report, SimConfig, Violation};
use crate::client::{
    Action, Config as ClientConfig, Error as ClientError, Event, Grant, OpId, Outcome,
    ReleaseResult,
};
use crate::names::{Endpoint, Key, Name};
use crate::rng::Rng;
use crate::server::{Action as ServerAction, ConnId, Holder};
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

/// The whole simulated world of one seed.
pub(super) struct World {
    config: SimConfig,
    seed: u64,
    /// The fault schedule's draws, lent to the network for its own (the
    /// cluster and the workload draw from generators of their own).
    rng: Rng,
    now: Time,
    pending: Schedule,
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
            .map(|c| Slot::new(c, &mut rng, &addrs, &hintable, &params, config, now))
            .collect();
        let mut world = World {
            config: config.clone(),
            seed,
            rng,
            now,
            pending: Schedule::default(),
            clients,
            cluster,
            #[cfg(feature = "raft")]
            raft,
            answered: Answered::default(),
            raft_failure: None,
            workload,
            net: Net::new(&params),
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
            let event = self.pending.next_at();
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
                    let ev = self.pending.pop().expect("the earliest is an event");
                    self.handle(ev)?;
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

    /// A failed global check, as a violation.
    fn failure(&self, failure: Failure) -> Box<Violation> {
        let (check, client, detail) = failure;
        self.violation(check, client, detail)
    }

    fn schedule(&mut self, at: Time, ev: Ev) {
        self.pending.push(at.max(self.now), ev);
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
        self.net().1.tag(tag, a);
    }

    fn faults_on(&self) -> bool {
        self.config.faults && self.now < self.faults_end
    }

    /// The network, and what it is lent for one call.
    fn net(&mut self) -> (&mut Net, Env<'_>) {
        let env = Env {
            now: self.now,
            faults_on: self.faults_on(),
            rng: &mut self.rng,
            trace: &mut self.trace,
        };
        (&mut self.net, env)
    }

    /// Carries out what the network did, in order.
    fn net_effects(&mut self, effects: Vec<net::Effect>) {
        for effect in effects {
            match effect {
                net::Effect::At(at, ev) => self.schedule(at, Ev::Net(ev)),
                net::Effect::Fault(kind) => self.faults.bump(kind),
                net::Effect::Note(line) => self.note(|| line),
            }
        }
    }

    // ----- events ---------------------------------------------------------

    fn handle(&mut self, ev: Ev) -> Step {
        let (kind, a, b) = ev.trace();
        self.trace.write_u64(self.now.as_nanos());
        self.trace.write_u64(kind);
        self.trace.write_u64(a);
        self.trace.write_u64(b);
        match ev {
            Ev::Net(ev) => {
                let (net, mut env) = self.net();
                match net.deliver(&mut env, ev) {
                    Some(delivery) => self.deliver(delivery),
                    None => Ok(()),
                }
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

    /// Injects a fault of a scheduled kind: the network's by the network,
    /// the cluster's by the cluster.
    fn inject(&mut self, kind: FaultKind) {
        match kind {
            FaultKind::Reset => {
                let mut effects = Vec::new();
                let (net, mut env) = self.net();
                net.reset_one(&mut env, &mut effects);
                self.net_effects(effects);
            }
            FaultKind::Partition => {
                let (clients, nodes) = (self.clients.len(), self.cluster.node_count());
                let mut effects = Vec::new();
                let (net, mut env) = self.net();
                net.cut_off(&mut env, clients, nodes, &mut effects);
                self.net_effects(effects);
            }
            _ => {
                let mut effects = Vec::new();
                self.cluster.inject(kind, self.now, &mut effects);
                self.cluster_effects(effects);
            }
        }
    }

    /// Hands what a link event brought to the core it is for.
    fn deliver(&mut self, delivery: Delivery) -> Step {
        match delivery {
            Delivery::Connect {
                link,
                gen,
                client,
                target,
            } => {
                self.connect_arrive(link, gen, client, target);
                Ok(())
            }
            Delivery::Client { client, input } => self.client_input(client, input),
            Delivery::Server {
                link,
                target,
                instance,
                conn,
                data,
            } => {
                let n = node_index(target);
                if self.node_instance(n) != instance {
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
                self.node_bytes(n, conn, &data);
                self.drain_server(n);
                Ok(())
            }
            Delivery::ServerClosed {
                link,
                target,
                instance,
                conn,
            } => {
                let n = node_index(target);
                if self.node_instance(n) == instance {
                    self.trace_tag(b"server-closed", link);
                    self.node_closed(n, conn);
                    self.drain_server(n);
                }
                self.net.reap(link);
                Ok(())
            }
        }
    }

    /// Client `c`'s connect on `link` reached `target`: it accepts if it is
    /// up, unless the network refuses; the answer goes back either way.
    fn connect_arrive(&mut self, link: LinkId, gen: u32, c: usize, target: Target) {
        let n = node_index(target);
        let up = target != Target::Nowhere && self.node_is_up(n);
        let mut effects = Vec::new();
        let (net, mut env) = self.net();
        let ok = up && !net.refuses(&mut env, target, &mut effects);
        self.net_effects(effects);
        if ok {
            let instance = self.node_instance(n);
            let sconn = self.node_accept(n).expect("up");
            self.net.accepted(link, instance, sconn);
            self.note(|| format!("{} accepts c{c}'s link {link}", node_name(n)));
            self.drain_server(n);
        }
        let mut effects = Vec::new();
        let (net, mut env) = self.net();
        net.answer_connect(&mut env, link, gen, ok, &mut effects);
        self.net_effects(effects);
    }
}

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

/// The target of a link to the server of index `n`.
fn node_target(n: usize) -> Target {
    if n == IMPOSTOR {
        Target::Impostor
    } else {
        Target::Node(n)
    }
}

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

impl World {
    /// The earliest server timer, and whose.
    pub(super) fn next_server_timeout(&self) -> Option<(Time, usize)> {
        #[cfg(feature = "raft")]
        if let Some(members) = &self.raft {
            return members.next_timeout();
        }
        self.cluster.next_timeout()
    }

    /// Whether the cluster is whole again.
    pub(super) fn cluster_is_healthy(&self) -> bool {
        #[cfg(feature = "raft")]
        if let Some(members) = &self.raft {
            return members.is_healthy(self.now);
        }
        self.cluster.is_healthy()
    }

    /// A grant still held once every lease has run out, if any.
    pub(super) fn holder_left(&self) -> Option<(Key, Holder)> {
        #[cfg(feature = "raft")]
        if let Some(members) = &self.raft {
            return members.holder_left();
        }
        self.cluster.holder_left()
    }

    /// The instance of node `n`'s server core.
    pub(super) fn node_instance(&self, n: usize) -> u64 {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_ref().filter(|_| n != IMPOSTOR) {
            return members.instance(n);
        }
        self.cluster.instance(n)
    }

    /// Whether node `n` is up.
    pub(super) fn node_is_up(&mut self, n: usize) -> bool {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_ref().filter(|_| n != IMPOSTOR) {
            return members.is_up(n);
        }
        self.cluster.server_mut(n).is_some()
    }

    /// Node `n` accepts a connection, if it is up.
    pub(super) fn node_accept(&mut self, n: usize) -> Option<ConnId> {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_mut().filter(|_| n != IMPOSTOR) {
            return members.accept(n, self.now);
        }
        Some(self.cluster.server_mut(n)?.handle_accept(self.now))
    }

    /// Bytes reach node `n`.
    pub(super) fn node_bytes(&mut self, n: usize, sconn: ConnId, data: &[u8]) {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_mut().filter(|_| n != IMPOSTOR) {
            return members.bytes(n, self.now, sconn, data);
        }
        if let Some(server) = self.cluster.server_mut(n) {
            server.handle_bytes(self.now, sconn, data);
        }
    }

    /// Node `n` learns that a connection closed.
    pub(super) fn node_closed(&mut self, n: usize, sconn: ConnId) {
        #[cfg(feature = "raft")]
        if let Some(members) = self.raft.as_mut().filter(|_| n != IMPOSTOR) {
            return members.closed(n, self.now, sconn);
        }
        if let Some(server) = self.cluster.server_mut(n) {
            server.handle_closed(self.now, sconn);
        }
    }

    pub(super) fn server_timeout(&mut self, n: usize) {
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

    /// The replicated cluster's counts, with the answered grants checked.
    pub(super) fn replication(&self) -> Replication {
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

    /// Carries out what the cluster did, in order.
    pub(super) fn cluster_effects(&mut self, effects: Vec<cluster::Effect>) {
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

    /// Carries out what the replicated cluster did, in order.
    #[cfg(feature = "raft")]
    pub(super) fn raft_effects(&mut self, effects: Vec<replicated::Effect>) {
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

    /// Drains a server core's actions onto the network.
    pub(super) fn drain_server(&mut self, n: usize) {
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
        let mut effects = Vec::new();
        match action {
            ServerAction::Send { conn, data } => {
                let Some(id) = self.net.of_server(node_target(n), instance, conn) else {
                    return;
                };
                if n != IMPOSTOR {
                    self.observe_answers(n, id, &data);
                }
                let (net, mut env) = self.net();
                net.server_sends(&mut env, id, data, &mut effects);
            }
            ServerAction::Close { conn } => {
                let Some(id) = self.net.of_server(node_target(n), instance, conn) else {
                    return;
                };
                let (net, mut env) = self.net();
                net.server_closes(&mut env, id, &mut effects);
            }
            // The simulator's cores take their epochs themselves
            // (`EpochSource::Core`): they never ask.
            ServerAction::NeedEpoch { .. } => {}
        }
        self.net_effects(effects);
    }

    /// The connections of node `n`'s server core at `instance` end with
    /// it, as `ending` says.
    fn connections_gone(&mut self, n: usize, instance: u64, ending: Ending) {
        let mut effects = Vec::new();
        let (net, mut env) = self.net();
        net.server_gone(&mut env, n, instance, ending, &mut effects);
        self.net_effects(effects);
    }

    /// Reads what a cluster node answered, for the ground truth: grants,
    /// releases, and `B` answers.
    fn observe_answers(&mut self, n: usize, id: LinkId, data: &[u8]) {
        for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(ServerFrame::Answer(answer)) = ServerFrame::parse(line) else {
                continue;
            };
            let Some((client, request)) = self.net.answered(id, answer.id) else {
                return;
            };
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
}

/// One client and its checker.
pub(super) struct Slot {
    /// The client core, or a bad client around one (feature `sabotage`).
    pub(super) client: Driven,
    /// Fed what the client does on the network and tells the workload.
    pub(super) checker: Checker,
    /// The configuration the seed drew, which the checks hold the client
    /// to (the core of a bad client may have another).
    pub(super) config: ClientConfig,
    pub(super) finished: bool,
    /// The core's `poll_timeout` after its latest step (it changes only
    /// when the core is called).
    pub(super) next_timeout: Option<Time>,
    /// The deadline grace of an operation: `queue_grace + answer_grace +
    /// settle_margin`.
    pub(super) op_grace: Duration,
    /// How long, once the cluster is healthy, a release under way may take.
    pub(super) release_grace: Duration,
    /// The embedder's releases without an outcome yet, with their token.
    pub(super) release_ops: BTreeMap<OpId, u64>,
    /// For each grant it renewed, the latest end a renewal sent could
    /// give it: the send time plus the lease asked.
    pub(super) renewal_ends: BTreeMap<(Key, u64), Time>,
}

impl Slot {
    /// Client `c`, its configuration drawn from `rng`: the cluster's nodes
    /// are at `addrs`, and a leader hint may name any of `hintable`.
    pub(super) fn new(
        c: usize,
        rng: &mut Rng,
        addrs: &[Endpoint],
        hintable: &[Endpoint],
        params: &Params,
        config: &SimConfig,
        now: Time,
    ) -> Slot {
        let client_config = client_config(c, rng, addrs, params);
        let checker = Checker::new(&client_config, now);
        let client = Driven::new(&client_config, config, hintable, now);
        let op_grace =
            client_config.queue_grace + client_config.answer_grace + client_config.settle_margin;
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
    }
}

impl World {
    /// Hands an input to a client core, as one checked step.
    pub(super) fn client_input(&mut self, c: usize, input: Input) -> Step {
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

    pub(super) fn client_timeout(&mut self, c: usize) -> Step {
        self.trace_tag(b"client-timeout", c as u64);
        let now = self.now;
        let slot = &mut self.clients[c];
        slot.client.handle_timeout(now);
        slot.checker.timeout(now);
        self.end_client_step(c)
    }

    /// Drains the client, ends the checker's step, and finishes the
    /// checker when the client has shut down.
    pub(super) fn end_client_step(&mut self, c: usize) -> Step {
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

    /// A client's action, carried out on the network.
    fn route_client_action(&mut self, c: usize, action: Action) -> Step {
        let mut effects = Vec::new();
        match action {
            Action::Connect { conn, addr } => {
                self.check_allowed(c, &addr, "connects to")?;
                let target = self.cluster.target_of(&addr);
                let (net, mut env) = self.net();
                net.connect(&mut env, c, conn, target, &mut effects);
            }
            Action::Send { conn, data } => {
                let Some(id) = self.net.of_client(c, conn) else {
                    return Ok(());
                };
                self.record_requests(c, id, &data);
                let (net, mut env) = self.net();
                net.client_sends(&mut env, id, data, &mut effects);
            }
            Action::Close { conn } => {
                let Some(id) = self.net.of_client(c, conn) else {
                    return Ok(());
                };
                let (net, mut env) = self.net();
                net.client_closes(&mut env, id, &mut effects);
            }
        }
        self.net_effects(effects);
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
        self.net.requested(id, found);
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
    fn check_allowed(&self, c: usize, addr: &Endpoint, what: &str) -> Step {
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
}

/// The longest a request and its answer take on the simulated network:
/// [`MAX_DELAY`] each way at most (a longer partition cuts the
/// connection).
const ROUND_TRIP: Duration = MAX_DELAY.saturating_mul(2);

impl World {
    /// Carries out what client `c`'s embedder does, in order: each command
    /// is one checked step.
    pub(super) fn embedder_effects(&mut self, c: usize, effects: Vec<workload::Effect>) -> Step {
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

    fn cmd_renew(&mut self, c: usize, grant: &Grant, how: RenewHow) -> Step {
        let now = self.now;
        let slot = &mut self.clients[c];
        let (result, checked) = match how {
            RenewHow::Manual { lease } => {
                let result = slot.client.renew(now, grant, lease);
                let checked = slot.checker.renew(now, grant, lease, &result);
                (result, checked)
            }
            RenewHow::Auto { limit } => {
                let result = slot.client.auto_renew(now, grant, limit);
                let checked = slot.checker.auto_renew(now, grant, limit, &result);
                (result, checked)
            }
            RenewHow::Stop => {
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
                RenewHow::Auto { limit } => {
                    let core = self.clients[c].client.core();
                    if let Some(valid_until) = core.valid_until(grant) {
                        self.failovers
                            .auto_renew(c, key, token, valid_until, limit, now);
                    }
                }
                RenewHow::Stop => self.failovers.given_up(c, key, token),
                RenewHow::Manual { .. } => {}
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
    pub(super) fn hold(&mut self, c: usize, grant: &Grant) -> Step {
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
