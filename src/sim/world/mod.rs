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
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the [`World`], the loop, and each event handed to whom it concerns |
//! | `schedule.rs` | the events to come, in their order |
//! | `servers.rs` | the server side: the cluster's nodes or the replicated cluster, what they send, and the answers the ground truth reads |
//! | `clients.rs` | the client cores, each call one checked step, and what they do on the network |
//! | `embedders.rs` | what the workload's embedders ask of their clients, each command one checked step |

mod clients;
mod embedders;
mod schedule;
mod servers;

use core::time::Duration;

use self::clients::Slot;
use self::schedule::{Ev, Schedule};
use super::check::{Answered, Failure, Ledger};
use super::cluster::{Cluster, IMPOSTOR};
use super::failover::Tally;
use super::net::{self, Delivery, Env, LinkId, Net, Target};
#[cfg(feature = "raft")]
use super::raft::Members;
use super::workload::{Params, Workload};
use super::{Check, FaultKind, Faults, Operations, Report, SimConfig, Violation};
use crate::rng::Rng;
use crate::testkit::{InvariantViolation, TraceHash};
use crate::time::Time;

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
            // And one spare address, where members added start.
            cluster_config.nodes = members + 1;
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
