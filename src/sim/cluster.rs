//! The cluster: server nodes that crash, restart, step down and take over,
//! with the lock table and its token counter carried to each new leader as
//! a correctly replicated service would; and the impostor, a server outside
//! every allowlist that `L` hints sometimes name.
//!
//! In [`Scenario::LeaderCrash`] the cluster plans its own faults: the
//! leader crashes loudly, the followers name it (`M`) until its election
//! key expires an election TTL later, as etcd does (PROTOCOL.md 4.2), then
//! another node is elected; the crashed node restarts a while later, and
//! the next leader crashes a while after that, until the end of the crash
//! window.
//!
//! At any moment the cluster's lock table is in exactly one place: the
//! leader's server core, or "in transit" while no node leads (taken from
//! the old leader with [`Server::take_lock_table`], installed into the new
//! one with [`Server::install_lock_table`]).
//!
//! The [`Cluster`] owns its nodes and draws its faults from a generator of
//! its own. It touches nothing else: each fault, and each of its own
//! [`Ev`]ents, hands back its [`Effect`]s in order (what its server cores
//! did, the connections of a core that is gone, what to schedule), and the
//! world carries them out.

use core::time::Duration;

use super::net::{Ending, Target};
use super::{millis_between, FaultKind, Scenario, SimConfig};
use crate::names::{Endpoint, Key, Name};
use crate::rng::Rng;
use crate::server::{Action, Config, Holder, LockTable, Role, Server, Term};
use crate::time::Time;

/// The index the impostor goes by where nodes are numbered.
pub(super) const IMPOSTOR: usize = usize::MAX;

/// In [`Scenario::LeaderCrash`], how long after a leader crashes its
/// election key expires, drawn per crash, in milliseconds: an election TTL
/// (etcd lets the key go when the lease runs out, up to a TTL after the
/// last keep-alive).
pub(super) const ELECTION_TTL_MS: (u64, u64) = (1_000, 2_500);

/// Something the cluster has scheduled for itself.
#[derive(Debug)]
pub(super) enum Ev {
    /// A crashed node restarts.
    Restart { node: usize },
    /// A node's `not_active` window ends.
    Activate { node: usize, life: u64 },
    /// A node's credential is fixed.
    FixCredential { node: usize, life: u64 },
    /// The cluster elects a leader, if it has none.
    Elect,
    /// The leader crashes ([`Scenario::LeaderCrash`]).
    CrashLeader,
    /// The election key of `node`, a leader that crashed, expires with its
    /// etcd lease: another node is elected ([`Scenario::LeaderCrash`]).
    KeyExpired { node: usize },
}

/// What the world must do for the cluster, in order.
#[derive(Debug)]
pub(super) enum Effect {
    /// Schedule `Ev` at a time.
    At(Time, Ev),
    /// An action of the server core of `node` (the impostor is
    /// [`IMPOSTOR`]) at `instance`, for the network.
    Served {
        node: usize,
        instance: u64,
        action: Action,
    },
    /// The server core of `node` at `instance` is gone, and the
    /// connections it had end as `ending` says.
    Gone {
        node: usize,
        instance: u64,
        ending: Ending,
    },
    /// A fault happened.
    Fault(FaultKind),
    /// The leader stopped leading (it crashed or vanished, moved, or
    /// stepped down): a leader change.
    LeaderChange,
    /// The lock table was lost: no server holds its grants any more.
    TableLost,
    /// A line for the log.
    Note(String),
}

/// One node of the cluster.
struct Node {
    addr: Endpoint,
    name: Name,
    /// `None` while the node is down.
    server: Option<Server>,
    /// Bumped whenever the server core is replaced: connections to an
    /// older instance are gone.
    instance: u64,
    /// Bumped by every crash: timers of an earlier life are void.
    life: u64,
    /// Out of its `not_active` window (and up).
    active: bool,
    /// The instance refuses the clients' credential.
    bad_credential: bool,
}

/// The nodes, the impostor, and where the lock table is.
pub(super) struct Cluster {
    nodes: Vec<Node>,
    impostor: Server,
    impostor_addr: Endpoint,
    leader: Option<usize>,
    transit: Option<LockTable>,
    /// No node leads and the lock table was lost with the leader that
    /// crashed, whose term had this epoch: the next leader begins a term
    /// without it, with a recovery grace.
    lost: Option<u64>,
    /// The sabotage `no-grace`: that term begins as if it had the table.
    #[cfg(feature = "sabotage")]
    no_grace: bool,
    scenario: Scenario,
    /// A leader that crashed and that etcd still names: its election key
    /// has not expired ([`Scenario::LeaderCrash`]).
    named: Option<usize>,
    /// No leader crashes from then on ([`Scenario::LeaderCrash`]).
    crashes_end: Time,
    template: Config,
    rng: Rng,
    /// A new leader starts with an empty table (the broken cluster of the
    /// global checks' own test).
    forget_lock_table: bool,
    /// Notes are written for the log.
    trace: bool,
}

impl Cluster {
    /// `sim.nodes` nodes (at least one) made from `template`; the first
    /// leads. Faults the cluster plans itself end at `faults_end`. With the
    /// events to schedule first.
    pub(super) fn new(
        template: &Config,
        sim: &SimConfig,
        rng: Rng,
        now: Time,
        faults_end: Time,
    ) -> (Cluster, Vec<Effect>) {
        let count = sim.nodes.max(1);
        let nodes: Vec<Node> = (0..count)
            .map(|i| Node {
                addr: Endpoint::new(format!("n{i}:{}", 7000 + i)).expect("an address"),
                name: Name::new(format!("n{i}")).expect("an atom"),
                server: None,
                instance: 0,
                life: 0,
                active: true,
                bad_credential: false,
            })
            .collect();
        let mut impostor_config = Config::new(Name::new("rogue").expect("an atom"));
        impostor_config.window = 64;
        let impostor = Server::new(impostor_config, now).expect("a valid config");
        let mut cluster = Cluster {
            nodes,
            impostor,
            impostor_addr: Endpoint::new("rogue:6666").expect("an address"),
            leader: Some(0),
            transit: None,
            lost: None,
            #[cfg(feature = "sabotage")]
            no_grace: sim.sabotage == Some(super::Sabotage::NoGrace),
            scenario: sim.scenario,
            named: None,
            crashes_end: faults_end,
            template: template.clone(),
            rng,
            forget_lock_table: sim.forget_lock_table,
            trace: sim.trace,
        };
        let leader = cluster.nodes[0].addr.clone();
        for i in 0..count {
            let role = if i == 0 {
                Role::Leader
            } else {
                Role::Follower {
                    leader: leader.clone(),
                }
            };
            let server = cluster.make(i, role, false, now);
            cluster.nodes[i].server = Some(server);
        }
        let mut first = Vec::new();
        if cluster.scenario == Scenario::LeaderCrash {
            // After the holders have their grants.
            cluster.plan_crash(now.saturating_add(Duration::from_millis(500)), &mut first);
        }
        (cluster, first)
    }

    /// The nodes' addresses, in node order.
    pub(super) fn addrs(&self) -> impl Iterator<Item = &Endpoint> {
        self.nodes.iter().map(|n| &n.addr)
    }

    /// How many nodes there are.
    pub(super) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The impostor's address.
    pub(super) fn impostor_addr(&self) -> &Endpoint {
        &self.impostor_addr
    }

    /// Where a connect to `addr` goes.
    pub(super) fn target_of(&self, addr: &Endpoint) -> Target {
        if addr == &self.impostor_addr {
            return Target::Impostor;
        }
        match self.nodes.iter().position(|n| &n.addr == addr) {
            Some(i) => Target::Node(i),
            None => Target::Nowhere,
        }
    }

    /// The server core of node `n` (or of the impostor), if it is up.
    pub(super) fn server_mut(&mut self, n: usize) -> Option<&mut Server> {
        if n == IMPOSTOR {
            return Some(&mut self.impostor);
        }
        self.nodes.get_mut(n)?.server.as_mut()
    }

    /// The instance of node `n`'s server core.
    pub(super) fn instance(&self, n: usize) -> u64 {
        if n == IMPOSTOR {
            return 0;
        }
        self.nodes.get(n).map_or(u64::MAX, |node| node.instance)
    }

    /// The earliest server timer, and whose.
    pub(super) fn next_timeout(&self) -> Option<(Time, usize)> {
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((n.server.as_ref()?.poll_timeout()?, i)));
        let impostor = self.impostor.poll_timeout().map(|t| (t, IMPOSTOR));
        nodes.chain(impostor).min()
    }

    /// Every node up, active and taking the right credential, and a leader.
    pub(super) fn is_healthy(&self) -> bool {
        self.leader.is_some()
            && self
                .nodes
                .iter()
                .all(|n| n.server.is_some() && n.active && !n.bad_credential)
    }

    /// A grant still in the cluster's lock table, if any (none while it is
    /// lost).
    pub(super) fn holder_left(&self) -> Option<(Key, Holder)> {
        let table = match self.leader {
            Some(l) => self.nodes[l].server.as_ref().map(Server::lock_table),
            None => self.transit.as_ref(),
        }?;
        table.holders().next().map(|(k, h)| (k.clone(), h))
    }

    // ----- faults and the cluster's own events ----------------------------

    /// Injects a fault of a kind the cluster suffers.
    pub(super) fn inject(&mut self, kind: FaultKind, now: Time, out: &mut Vec<Effect>) {
        match kind {
            FaultKind::Crash => {
                let n = self.random_node();
                if self.nodes[n].server.is_some() {
                    let silent = self.rng.chance(1, 2);
                    self.note(out, || format!("fault: n{n} crashes (silently: {silent})"));
                    out.push(Effect::Fault(FaultKind::Crash));
                    self.crash(n, silent, now, out);
                }
            }
            FaultKind::Moved => self.move_leader(now, out),
            FaultKind::NoLeader => self.step_down(now, out),
            FaultKind::Vanished => {
                if let Some(l) = self.leader {
                    self.note(out, || format!("fault: the leader n{l} vanishes"));
                    out.push(Effect::Fault(FaultKind::Vanished));
                    self.crash(l, true, now, out);
                }
            }
            FaultKind::Hint => {
                if let Some(l) = self.leader {
                    let addr = if self.rng.chance(1, 3) {
                        self.impostor_addr.clone()
                    } else {
                        let n = self.random_node();
                        self.nodes[n].addr.clone()
                    };
                    self.note(out, || format!("fault: the leader n{l} hints L {addr}"));
                    out.push(Effect::Fault(FaultKind::Hint));
                    if let Some(server) = self.server_mut(l) {
                        server.announce_leader(now, addr);
                    }
                    self.drain(l, out);
                }
            }
            FaultKind::NotActive => {
                let n = self.random_node();
                let node = &self.nodes[n];
                if self.leader != Some(n) && node.server.is_some() && node.active {
                    let window = millis_between(&mut self.rng, 100, 1_500);
                    self.note(out, || format!("fault: n{n} is not active for {window:?}"));
                    out.push(Effect::Fault(FaultKind::NotActive));
                    let node = &mut self.nodes[n];
                    node.active = false;
                    let life = node.life;
                    if let Some(server) = node.server.as_mut() {
                        server.set_role(now, Role::NotActive);
                    }
                    self.drain(n, out);
                    let at = now.saturating_add(window);
                    out.push(Effect::At(at, Ev::Activate { node: n, life }));
                }
            }
            FaultKind::AuthRefused => {
                let n = self.random_node();
                let node = &self.nodes[n];
                if node.server.is_some() && !node.bad_credential {
                    let window = millis_between(&mut self.rng, 200, 3_000);
                    self.note(out, || {
                        format!("fault: n{n} refuses the credential for {window:?}")
                    });
                    out.push(Effect::Fault(FaultKind::AuthRefused));
                    self.replace_instance(n, true, now, out);
                    let life = self.nodes[n].life;
                    let at = now.saturating_add(window);
                    out.push(Effect::At(at, Ev::FixCredential { node: n, life }));
                }
            }
            FaultKind::Latency
            | FaultKind::Split
            | FaultKind::Reset
            | FaultKind::Refused
            | FaultKind::Restart
            | FaultKind::Partition
            | FaultKind::Busy
            | FaultKind::LostTable => unreachable!("not a fault of the cluster's"),
        }
    }

    /// One of the cluster's own events.
    pub(super) fn handle(&mut self, ev: Ev, now: Time, out: &mut Vec<Effect>) {
        match ev {
            Ev::Restart { node } => self.restart(node, now, out),
            Ev::Activate { node, life } => self.activate(node, life, now, out),
            Ev::FixCredential { node, life } => self.fix_credential(node, life, now, out),
            Ev::Elect => self.elect(now, out),
            Ev::CrashLeader => self.crash_leader(now, out),
            Ev::KeyExpired { node } => self.key_expired(node, now, out),
        }
    }

    /// The leader steps down with `M <new>`; the lock table moves to the
    /// new leader at once.
    fn move_leader(&mut self, now: Time, out: &mut Vec<Effect>) {
        let Some(old) = self.leader else {
            return;
        };
        let candidates: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| i != old && self.is_candidate(i))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let new = candidates[self.rng.up_to(candidates.len() as u64 - 1) as usize];
        let addr = self.nodes[new].addr.clone();
        self.note(out, || {
            format!("fault: the leader n{old} moves to n{new} (M)")
        });
        out.push(Effect::Fault(FaultKind::Moved));
        if self.rng.chance(1, 2) {
            // "L addr: the leader is, or is about to be, addr."
            if let Some(server) = self.server_mut(old) {
                server.announce_leader(now, addr.clone());
            }
            self.drain(old, out);
        }
        self.take_table(old, Role::Follower { leader: addr }, now, out);
        self.install_leader(new, now, out);
    }

    /// The leader steps down with `E no_leader`; a new one is elected after
    /// a gap.
    fn step_down(&mut self, now: Time, out: &mut Vec<Effect>) {
        let Some(old) = self.leader else {
            return;
        };
        self.note(out, || {
            format!("fault: the leader n{old} steps down (E no_leader)")
        });
        out.push(Effect::Fault(FaultKind::NoLeader));
        self.take_table(old, Role::NoLeader, now, out);
        self.leaderless(now, out);
    }

    /// The leader `old` takes `role` and its lock table goes in transit.
    fn take_table(&mut self, old: usize, role: Role, now: Time, out: &mut Vec<Effect>) {
        let server = self.server_mut(old).expect("the leader is up");
        server.set_role(now, role);
        let table = server.take_lock_table(now);
        self.drain(old, out);
        self.transit = Some(table);
        self.leader = None;
        out.push(Effect::LeaderChange);
    }

    /// No node leads: the others are told, and a leader is elected after a
    /// gap.
    fn leaderless(&mut self, now: Time, out: &mut Vec<Effect>) {
        self.set_follower_roles(now, out);
        let gap = millis_between(&mut self.rng, 0, 1_000);
        out.push(Effect::At(now.saturating_add(gap), Ev::Elect));
    }

    /// Node `n` crashes: its connections are reset, or, `silent`, go dead;
    /// a leader's lock table survives it (replicated), or half the time is
    /// lost with it (no handover); a new leader is elected after a gap (in
    /// [`Scenario::LeaderCrash`], once its election key expires). It
    /// restarts later (in [`Scenario::LeaderCrash`], after that election).
    fn crash(&mut self, n: usize, silent: bool, now: Time, out: &mut Vec<Effect>) {
        let Some(mut server) = self.nodes[n].server.take() else {
            return;
        };
        if self.leader == Some(n) {
            // What the crashed node would have sent is lost with it.
            let table = server.take_lock_table(now);
            if self.rng.chance(1, 2) {
                self.note(out, || {
                    format!(
                        "n{n} crashed without handing over its table (epoch {})",
                        table.epoch()
                    )
                });
                out.push(Effect::Fault(FaultKind::LostTable));
                out.push(Effect::TableLost);
                self.lost = Some(table.epoch());
            } else {
                self.transit = Some(table);
            }
            self.leader = None;
            out.push(Effect::LeaderChange);
            match self.scenario {
                Scenario::LeaderCrash => self.await_key_expiry(n, now, out),
                // (In the Raft scenarios these nodes never crash.)
                _ => self.leaderless(now, out),
            }
        }
        drop(server);
        let node = &mut self.nodes[n];
        out.push(Effect::Gone {
            node: n,
            instance: node.instance,
            ending: Ending::Crash { silent },
        });
        node.instance += 1;
        node.life += 1;
        node.active = false;
        node.bad_credential = false;
        if self.scenario == Scenario::Mixed {
            let downtime = millis_between(&mut self.rng, 100, 3_000);
            let at = now.saturating_add(downtime);
            out.push(Effect::At(at, Ev::Restart { node: n }));
        }
    }

    /// The leader crashes loudly, as a process killed with SIGKILL does
    /// ([`Scenario::LeaderCrash`]): its connections are reset.
    fn crash_leader(&mut self, now: Time, out: &mut Vec<Effect>) {
        match self.leader {
            Some(l) => {
                self.note(out, || format!("fault: the leader n{l} crashes"));
                out.push(Effect::Fault(FaultKind::Crash));
                self.crash(l, false, now, out);
            }
            // No node leads (a lone node that is not back yet): later.
            None => self.plan_crash(now, out),
        }
    }

    /// The leader `dead` crashed without a word ([`Scenario::LeaderCrash`]):
    /// etcd names it until its election key expires, an election TTL from
    /// now, and the followers answer `M <dead>` until then.
    fn await_key_expiry(&mut self, dead: usize, now: Time, out: &mut Vec<Effect>) {
        self.named = Some(dead);
        self.set_follower_roles(now, out);
        let (lo, hi) = ELECTION_TTL_MS;
        let ttl = millis_between(&mut self.rng, lo, hi);
        self.note(out, || format!("etcd names n{dead} for {ttl:?} more"));
        let at = now.saturating_add(ttl);
        out.push(Effect::At(at, Ev::KeyExpired { node: dead }));
    }

    /// The election key of the crashed leader `dead` expired: another node
    /// is elected. `dead` restarts a while later, and the next crash comes
    /// a while after that.
    fn key_expired(&mut self, dead: usize, now: Time, out: &mut Vec<Effect>) {
        self.note(out, || format!("n{dead}'s election key expires"));
        self.named = None;
        self.elect(now, out);
        if self.leader.is_none() {
            // Nobody to elect: the followers know of no leader.
            self.set_follower_roles(now, out);
        }
        let back = now.saturating_add(millis_between(&mut self.rng, 300, 1_500));
        out.push(Effect::At(back, Ev::Restart { node: dead }));
        self.plan_crash(back, out);
    }

    /// Plans the next crash of the leader a while after `after`, if leaders
    /// still crash then.
    fn plan_crash(&mut self, after: Time, out: &mut Vec<Effect>) {
        let at = after.saturating_add(millis_between(&mut self.rng, 1_000, 3_000));
        if at < self.crashes_end {
            out.push(Effect::At(at, Ev::CrashLeader));
        }
    }

    /// A crashed node comes back, empty, `not_active` for a while.
    fn restart(&mut self, n: usize, now: Time, out: &mut Vec<Effect>) {
        if self.nodes[n].server.is_some() {
            return;
        }
        let server = self.make(n, Role::NotActive, false, now);
        let node = &mut self.nodes[n];
        node.instance += 1;
        node.server = Some(server);
        node.active = false;
        let life = node.life;
        out.push(Effect::Fault(FaultKind::Restart));
        let window = if self.rng.chance(1, 3) {
            Duration::ZERO
        } else {
            out.push(Effect::Fault(FaultKind::NotActive));
            millis_between(&mut self.rng, 50, 1_000)
        };
        self.note(out, || format!("n{n} restarts, not active for {window:?}"));
        let at = now.saturating_add(window);
        out.push(Effect::At(at, Ev::Activate { node: n, life }));
    }

    /// A node's `not_active` window ends.
    fn activate(&mut self, n: usize, life: u64, now: Time, out: &mut Vec<Effect>) {
        let node = &self.nodes[n];
        if node.life != life || node.server.is_none() || node.active {
            return;
        }
        self.note(out, || format!("n{n} is active"));
        let role = self.follower_role();
        let node = &mut self.nodes[n];
        node.active = true;
        if let Some(server) = node.server.as_mut() {
            server.set_role(now, role);
        }
        self.drain(n, out);
        if self.leader.is_none() && self.named.is_none() {
            self.elect(now, out);
        }
    }

    /// A node refusing the credential gets the right one back.
    fn fix_credential(&mut self, n: usize, life: u64, now: Time, out: &mut Vec<Effect>) {
        let node = &self.nodes[n];
        if node.life == life && node.server.is_some() && node.bad_credential {
            self.note(out, || format!("n{n} takes the credential again"));
            self.replace_instance(n, false, now, out);
        }
    }

    /// Elects a leader among the nodes up and active, if none leads; it
    /// gets the lock table in transit.
    fn elect(&mut self, now: Time, out: &mut Vec<Effect>) {
        if self.leader.is_some() {
            return;
        }
        let candidates: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.is_candidate(i))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let new = candidates[self.rng.up_to(candidates.len() as u64 - 1) as usize];
        self.install_leader(new, now, out);
    }

    fn is_candidate(&self, i: usize) -> bool {
        let node = &self.nodes[i];
        node.server.is_some() && node.active
    }

    /// Makes `new` the leader with the lock table in transit (or, if it
    /// was lost, with a new term and a recovery grace), and tells every
    /// other active node.
    fn install_leader(&mut self, new: usize, now: Time, out: &mut Vec<Effect>) {
        self.note(out, || format!("n{new} leads"));
        let term = self.lost.take().map(|epoch| self.term_after_loss(epoch));
        let transit = self.transit.take();
        let forget = self.forget_lock_table;
        let server = self.server_mut(new).expect("candidates are up");
        match (term, transit) {
            (Some(term), _) => {
                // Its epoch is above every epoch either table granted in.
                let term = match term {
                    Term::Recovered { epoch, max_lease } => Term::Recovered {
                        epoch: epoch.max(server.epoch().saturating_add(1)),
                        max_lease,
                    },
                    Term::First { epoch } => Term::First {
                        epoch: epoch.max(server.epoch().saturating_add(1)),
                    },
                    other => other,
                };
                server
                    .begin_term(now, term)
                    .expect("a later epoch, far below 2109");
            }
            // The broken cluster of the checks' own test: the grants and
            // the token counter are lost.
            (None, Some(_)) if forget => server.install_lock_table(now, LockTable::new()),
            (None, Some(table)) => server.install_lock_table(now, table),
            (None, None) => unreachable!("without a leader the table is in transit or lost"),
        }
        server.set_role(now, Role::Leader);
        self.leader = Some(new);
        self.drain(new, out);
        self.set_follower_roles(now, out);
    }

    /// Gives every active node but the leader the follower role of the
    /// moment (`Follower { leader }` or `NoLeader`).
    fn set_follower_roles(&mut self, now: Time, out: &mut Vec<Effect>) {
        let role = self.follower_role();
        for i in 0..self.nodes.len() {
            if Some(i) == self.leader || !self.nodes[i].active {
                continue;
            }
            if let Some(server) = self.nodes[i].server.as_mut() {
                server.set_role(now, role.clone());
            }
            self.drain(i, out);
        }
    }

    /// Replaces node `n`'s server core (a reconfiguration): a leader steps
    /// down with `E not_active` and its lock table goes to the new core,
    /// which leads on; connections still open on the old core are closed.
    fn replace_instance(
        &mut self,
        n: usize,
        bad_credential: bool,
        now: Time,
        out: &mut Vec<Effect>,
    ) {
        let was_leader = self.leader == Some(n);
        let mut table = None;
        if was_leader {
            let server = self.server_mut(n).expect("the leader is up");
            server.set_role(now, Role::NotActive);
            table = Some(server.take_lock_table(now));
            self.drain(n, out);
        }
        out.push(Effect::Gone {
            node: n,
            instance: self.nodes[n].instance,
            ending: Ending::Replaced,
        });
        let role = if was_leader {
            Role::Leader
        } else if !self.nodes[n].active {
            Role::NotActive
        } else {
            self.follower_role()
        };
        let mut server = self.make(n, role, bad_credential, now);
        if let Some(table) = table {
            server.install_lock_table(now, table);
        }
        let node = &mut self.nodes[n];
        node.instance += 1;
        node.server = Some(server);
        node.bad_credential = bad_credential;
    }

    // ----- plumbing -------------------------------------------------------

    /// A fresh server core for node `i`.
    fn make(&self, i: usize, role: Role, bad_credential: bool, now: Time) -> Server {
        let mut config = self.template.clone();
        config.node_id = self.nodes[i].name.clone();
        config.role = role;
        if bad_credential {
            config.credential = Some(Name::new("rotated").expect("an atom"));
        }
        Server::new(config, now).expect("the simulator's configs are valid")
    }

    /// The term a leader begins after the table was lost with a leader of
    /// `epoch`: a later epoch, and a recovery grace of the longest lease
    /// plus the margin, so that every grant the lost table held has run
    /// out before any key is granted again (clients of version 1 cannot
    /// reclaim; renewing clients will).
    fn term_after_loss(&self, epoch: u64) -> Term {
        let epoch = epoch.saturating_add(1);
        #[cfg(feature = "sabotage")]
        if self.no_grace {
            return super::sabotage::as_if_handed_the_table(epoch);
        }
        Term::Recovered {
            epoch,
            max_lease: self.template.max_lease,
        }
    }

    /// The role of a node that is up, active and does not lead: a
    /// follower of the leader, or of the crashed one etcd still names.
    fn follower_role(&self) -> Role {
        match self.leader.or(self.named) {
            Some(l) => Role::Follower {
                leader: self.nodes[l].addr.clone(),
            },
            None => Role::NoLeader,
        }
    }

    fn random_node(&mut self) -> usize {
        self.rng.up_to(self.nodes.len() as u64 - 1) as usize
    }

    /// Hands every action of node `n`'s server core to the world.
    fn drain(&mut self, n: usize, out: &mut Vec<Effect>) {
        let instance = self.instance(n);
        let Some(server) = self.server_mut(n) else {
            return;
        };
        while let Some(action) = server.poll_action() {
            out.push(Effect::Served {
                node: n,
                instance,
                action,
            });
        }
    }

    fn note(&self, out: &mut Vec<Effect>, line: impl FnOnce() -> String) {
        if self.trace {
            out.push(Effect::Note(line()));
        }
    }
}
