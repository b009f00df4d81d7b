//! The cluster: server nodes that crash, restart, step down and take over,
//! with the lock table and its token counter carried to each new leader as
//! a correctly replicated service would; and the impostor, a server outside
//! every allowlist that `L` hints sometimes name.
//!
//! At any moment the cluster's lock table is in exactly one place: the
//! leader's server core, or "in transit" while no node leads (taken from
//! the old leader with [`Server::take_lock_table`], installed into the new
//! one with [`Server::install_lock_table`]).

use core::time::Duration;

use super::net::{Target, MAX_DELAY};
use super::workload::Params;
use super::world::{Ev, World};
use super::FaultKind;
use crate::names::{Endpoint, Key, Name};
use crate::server::{Config, Holder, LockTable, Role, Server};
use crate::time::Time;

/// The index the impostor goes by where nodes are numbered.
pub(super) const IMPOSTOR: usize = usize::MAX;

/// One node of the cluster.
pub(super) struct Node {
    pub(super) addr: Endpoint,
    name: Name,
    /// `None` while the node is down.
    pub(super) server: Option<Server>,
    /// Bumped whenever the server core is replaced: connections to an
    /// older instance are gone.
    pub(super) instance: u64,
    /// Bumped by every crash: timers of an earlier life are void.
    pub(super) life: u64,
    /// Out of its `not_active` window (and up).
    pub(super) active: bool,
    /// The instance refuses the clients' credential.
    pub(super) bad_credential: bool,
}

/// The nodes, the impostor, and where the lock table is.
pub(super) struct Cluster {
    pub(super) nodes: Vec<Node>,
    impostor: Server,
    impostor_addr: Endpoint,
    pub(super) leader: Option<usize>,
    transit: Option<LockTable>,
    template: Config,
}

impl Cluster {
    /// `count` nodes; the first leads.
    pub(super) fn new(params: &Params, count: usize, now: Time) -> Cluster {
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
            template: params.server.clone(),
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
        cluster
    }

    /// The impostor's address.
    pub(super) fn impostor_addr(&self) -> &Endpoint {
        &self.impostor_addr
    }

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

    /// A grant still in the cluster's lock table, if any.
    pub(super) fn holder_left(&self) -> Option<(Key, Holder)> {
        let table = match self.leader {
            Some(l) => self.nodes[l].server.as_ref().map(Server::lock_table),
            None => self.transit.as_ref(),
        }?;
        table.holders().next().map(|(k, h)| (k.clone(), h))
    }

    /// The role of a node that is up, active and does not lead.
    fn follower_role(&self) -> Role {
        match self.leader {
            Some(l) => Role::Follower {
                leader: self.nodes[l].addr.clone(),
            },
            None => Role::NoLeader,
        }
    }
}

impl World {
    /// Injects a fault of a scheduled kind.
    pub(super) fn inject(&mut self, kind: FaultKind) {
        match kind {
            FaultKind::Reset => self.reset_a_connection(),
            FaultKind::Crash => {
                let n = self.rng.up_to(self.cluster.nodes.len() as u64 - 1) as usize;
                if self.cluster.nodes[n].server.is_some() {
                    let vanish = self.rng.chance(1, 2);
                    self.note(|| format!("fault: n{n} crashes (silently: {vanish})"));
                    self.faults.bump(FaultKind::Crash);
                    self.crash(n, vanish);
                }
            }
            FaultKind::Partition => self.partition(),
            FaultKind::Moved => self.move_leader(),
            FaultKind::NoLeader => self.step_down(),
            FaultKind::Vanished => {
                if let Some(l) = self.cluster.leader {
                    self.note(|| format!("fault: the leader n{l} vanishes"));
                    self.faults.bump(FaultKind::Vanished);
                    self.crash(l, true);
                }
            }
            FaultKind::Hint => {
                if let Some(l) = self.cluster.leader {
                    let count = self.cluster.nodes.len() as u64;
                    let addr = if self.rng.chance(1, 3) {
                        self.cluster.impostor_addr().clone()
                    } else {
                        self.cluster.nodes[self.rng.up_to(count - 1) as usize]
                            .addr
                            .clone()
                    };
                    self.note(|| format!("fault: the leader n{l} hints L {addr}"));
                    self.faults.bump(FaultKind::Hint);
                    let now = self.now;
                    if let Some(server) = self.cluster.server_mut(l) {
                        server.announce_leader(now, addr);
                    }
                    self.drain_server(l);
                }
            }
            FaultKind::NotActive => {
                let n = self.rng.up_to(self.cluster.nodes.len() as u64 - 1) as usize;
                let node = &self.cluster.nodes[n];
                if self.cluster.leader != Some(n) && node.server.is_some() && node.active {
                    let window = self.millis_between(100, 1_500);
                    self.note(|| format!("fault: n{n} is not active for {window:?}"));
                    self.faults.bump(FaultKind::NotActive);
                    let now = self.now;
                    let node = &mut self.cluster.nodes[n];
                    node.active = false;
                    let life = node.life;
                    if let Some(server) = node.server.as_mut() {
                        server.set_role(now, Role::NotActive);
                    }
                    self.drain_server(n);
                    self.schedule_in(window, Ev::Activate { node: n, life });
                }
            }
            FaultKind::AuthRefused => {
                let n = self.rng.up_to(self.cluster.nodes.len() as u64 - 1) as usize;
                let node = &self.cluster.nodes[n];
                if node.server.is_some() && !node.bad_credential {
                    let window = self.millis_between(200, 3_000);
                    self.note(|| format!("fault: n{n} refuses the credential for {window:?}"));
                    self.faults.bump(FaultKind::AuthRefused);
                    self.replace_instance(n, true);
                    let life = self.cluster.nodes[n].life;
                    self.schedule_in(window, Ev::FixCredential { node: n, life });
                }
            }
            FaultKind::Latency
            | FaultKind::Split
            | FaultKind::Refused
            | FaultKind::Restart
            | FaultKind::Busy => unreachable!("not a scheduled kind"),
        }
    }

    /// Resets one established connection: both sides learn it after a
    /// delay, and the bytes in flight are lost.
    fn reset_a_connection(&mut self) {
        let open: Vec<u64> = self
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
            Some(self.rng.up_to(self.cluster.nodes.len() as u64 - 1) as usize)
        };
        let cut = self.rng.chance(1, 2);
        let length = if cut {
            self.millis_between(500, 3_000)
        } else {
            self.millis_between(50, super::net::DELAY_PARTITION.as_millis() as u64)
        };
        let until = self.now.saturating_add(length);
        self.note(|| format!("fault: c{c} cut off from {node:?} for {length:?} (cut: {cut})"));
        self.faults.bump(FaultKind::Partition);
        self.net.heal(self.now);
        let partition = super::net::Partition {
            client: c,
            node,
            until,
        };
        self.net.partitions.push(partition);
        if !cut {
            return;
        }
        let cut_links: Vec<u64> = self
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

    /// The leader steps down with `M <new>`; the lock table moves to the
    /// new leader at once.
    fn move_leader(&mut self) {
        let Some(old) = self.cluster.leader else {
            return;
        };
        let candidates: Vec<usize> = (0..self.cluster.nodes.len())
            .filter(|&i| i != old && self.is_candidate(i))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let new = candidates[self.rng.up_to(candidates.len() as u64 - 1) as usize];
        let addr = self.cluster.nodes[new].addr.clone();
        self.note(|| format!("fault: the leader n{old} moves to n{new} (M)"));
        self.faults.bump(FaultKind::Moved);
        let now = self.now;
        if self.rng.chance(1, 2) {
            // "L addr: the leader is, or is about to be, addr."
            if let Some(server) = self.cluster.server_mut(old) {
                server.announce_leader(now, addr.clone());
            }
            self.drain_server(old);
        }
        let server = self.cluster.server_mut(old).expect("the leader is up");
        server.set_role(now, Role::Follower { leader: addr });
        let table = server.take_lock_table(now);
        self.drain_server(old);
        self.cluster.transit = Some(table);
        self.cluster.leader = None;
        self.install_leader(new);
    }

    /// The leader steps down with `E no_leader`; a new one is elected after
    /// a gap.
    fn step_down(&mut self) {
        let Some(old) = self.cluster.leader else {
            return;
        };
        self.note(|| format!("fault: the leader n{old} steps down (E no_leader)"));
        self.faults.bump(FaultKind::NoLeader);
        let now = self.now;
        let server = self.cluster.server_mut(old).expect("the leader is up");
        server.set_role(now, Role::NoLeader);
        let table = server.take_lock_table(now);
        self.drain_server(old);
        self.cluster.transit = Some(table);
        self.cluster.leader = None;
        self.set_follower_roles();
        let gap = self.millis_between(0, 1_000);
        self.schedule_in(gap, Ev::Elect);
    }

    /// Node `n` crashes: its connections are reset, or silently dead; a
    /// leader's lock table survives it (replicated), and a new leader is
    /// elected after a gap. It restarts later.
    fn crash(&mut self, n: usize, vanish: bool) {
        let now = self.now;
        let Some(mut server) = self.cluster.nodes[n].server.take() else {
            return;
        };
        if self.cluster.leader == Some(n) {
            // What the crashed node would have sent is lost with it.
            self.cluster.transit = Some(server.take_lock_table(now));
            self.cluster.leader = None;
            self.set_follower_roles();
            let gap = self.millis_between(0, 1_000);
            self.schedule_in(gap, Ev::Elect);
        }
        drop(server);
        let instance = self.cluster.nodes[n].instance;
        let dead: Vec<u64> = self
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
        for id in dead {
            let link = self.net.links.get_mut(&id).expect("listed");
            link.gen += 1;
            link.server_closed = true;
            if vanish {
                link.blackhole = true;
            } else if !link.client_closed && !link.blackhole {
                // (A link cut by a partition hears of it when the
                // partition ends.)
                let at = self.arrival(id, false);
                self.schedule(at, Ev::ResetToClient { link: id });
            }
            self.reap(id);
        }
        let node = &mut self.cluster.nodes[n];
        node.instance += 1;
        node.life += 1;
        node.active = false;
        node.bad_credential = false;
        let downtime = self.millis_between(100, 3_000);
        self.schedule_in(downtime, Ev::Restart { node: n });
    }

    /// A crashed node comes back, empty, `not_active` for a while.
    pub(super) fn restart(&mut self, n: usize) {
        if self.cluster.nodes[n].server.is_some() {
            return;
        }
        let now = self.now;
        let server = self.cluster.make(n, Role::NotActive, false, now);
        let node = &mut self.cluster.nodes[n];
        node.instance += 1;
        node.server = Some(server);
        node.active = false;
        let life = node.life;
        self.faults.bump(FaultKind::Restart);
        let window = if self.rng.chance(1, 3) {
            Duration::ZERO
        } else {
            self.faults.bump(FaultKind::NotActive);
            self.millis_between(50, 1_000)
        };
        self.note(|| format!("n{n} restarts, not active for {window:?}"));
        self.schedule_in(window, Ev::Activate { node: n, life });
    }

    /// A node's `not_active` window ends.
    pub(super) fn activate(&mut self, n: usize, life: u64) {
        let node = &self.cluster.nodes[n];
        if node.life != life || node.server.is_none() || node.active {
            return;
        }
        self.note(|| format!("n{n} is active"));
        let role = self.cluster.follower_role();
        let now = self.now;
        let node = &mut self.cluster.nodes[n];
        node.active = true;
        if let Some(server) = node.server.as_mut() {
            server.set_role(now, role);
        }
        self.drain_server(n);
        if self.cluster.leader.is_none() {
            self.elect();
        }
    }

    /// A node refusing the credential gets the right one back.
    pub(super) fn fix_credential(&mut self, n: usize, life: u64) {
        let node = &self.cluster.nodes[n];
        if node.life == life && node.server.is_some() && node.bad_credential {
            self.note(|| format!("n{n} takes the credential again"));
            self.replace_instance(n, false);
        }
    }

    /// Elects a leader among the nodes up and active, if none leads; it
    /// gets the lock table in transit.
    pub(super) fn elect(&mut self) {
        if self.cluster.leader.is_some() {
            return;
        }
        let candidates: Vec<usize> = (0..self.cluster.nodes.len())
            .filter(|&i| self.is_candidate(i))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let new = candidates[self.rng.up_to(candidates.len() as u64 - 1) as usize];
        self.install_leader(new);
    }

    fn is_candidate(&self, i: usize) -> bool {
        let node = &self.cluster.nodes[i];
        node.server.is_some() && node.active
    }

    /// Makes `new` the leader with the lock table in transit, and tells
    /// every other active node.
    fn install_leader(&mut self, new: usize) {
        self.note(|| format!("n{new} leads"));
        let now = self.now;
        let mut table = self
            .cluster
            .transit
            .take()
            .expect("without a leader the table is in transit");
        if self.config.forget_lock_table {
            // The broken cluster of the checks' own test: the grants and
            // the token counter are lost.
            table = LockTable::new();
        }
        let server = self.cluster.server_mut(new).expect("candidates are up");
        server.install_lock_table(now, table);
        server.set_role(now, Role::Leader);
        self.cluster.leader = Some(new);
        self.drain_server(new);
        self.set_follower_roles();
    }

    /// Gives every active node but the leader the follower role of the
    /// moment (`Follower { leader }` or `NoLeader`).
    fn set_follower_roles(&mut self) {
        let role = self.cluster.follower_role();
        let now = self.now;
        for i in 0..self.cluster.nodes.len() {
            if Some(i) == self.cluster.leader || !self.cluster.nodes[i].active {
                continue;
            }
            if let Some(server) = self.cluster.nodes[i].server.as_mut() {
                server.set_role(now, role.clone());
            }
            self.drain_server(i);
        }
    }

    /// Replaces node `n`'s server core (a reconfiguration): a leader steps
    /// down with `E not_active` and its lock table goes to the new core,
    /// which leads on; connections still open on the old core are closed.
    fn replace_instance(&mut self, n: usize, bad_credential: bool) {
        let now = self.now;
        let was_leader = self.cluster.leader == Some(n);
        let mut table = None;
        if was_leader {
            let server = self.cluster.server_mut(n).expect("the leader is up");
            server.set_role(now, Role::NotActive);
            table = Some(server.take_lock_table(now));
            self.drain_server(n);
        }
        let old = self.cluster.nodes[n].instance;
        let open: Vec<u64> = self
            .net
            .links
            .iter()
            .filter(|(_, l)| {
                l.target == Target::Node(n)
                    && l.instance == old
                    && l.sconn.is_some()
                    && !l.server_closed
            })
            .map(|(&id, _)| id)
            .collect();
        for id in open {
            let link = self.net.links.get_mut(&id).expect("listed");
            link.server_closed = true;
            if !link.client_closed && !link.blackhole {
                let gen = link.gen;
                let at = self.arrival(id, false);
                self.schedule(at, Ev::FinToClient { link: id, gen });
            }
            self.reap(id);
        }
        let role = if was_leader {
            Role::Leader
        } else if !self.cluster.nodes[n].active {
            Role::NotActive
        } else {
            self.cluster.follower_role()
        };
        let mut server = self.cluster.make(n, role, bad_credential, now);
        if let Some(table) = table {
            server.install_lock_table(now, table);
        }
        let node = &mut self.cluster.nodes[n];
        node.instance += 1;
        node.server = Some(server);
        node.bad_credential = bad_credential;
    }
}
