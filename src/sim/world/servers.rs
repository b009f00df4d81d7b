//! The server side: the cluster's nodes, or the replicated cluster in
//! their place; what their cores send, carried out on the network; and
//! the answers the ground truth reads on the way.

use core::time::Duration;

use super::{node_target, Ev, World};
use crate::names::Key;
use crate::server::{Action as ServerAction, ConnId, Holder};
use crate::sim::cluster::{self, IMPOSTOR};
use crate::sim::net::{Ending, LinkId, Request};
#[cfg(feature = "raft")]
use crate::sim::raft as replicated;
use crate::sim::{FaultKind, Replication};
use crate::time::Time;
use crate::wire::{AnswerKind, ServerFrame};

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
