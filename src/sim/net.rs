//! The simulated network: one [`SimConn`] per connection a client core opens,
//! to a node of the cluster, to the impostor, or to nowhere.
//!
//! Each direction of a link is first-in first-out, like TCP: a write is
//! delivered no earlier than the writes before it. Its delay is a base
//! latency drawn from the seed's range, or a latency spike (a fault), and
//! never more than [`MAX_DELAY`]: the clients' settle margin (1 s) covers
//! the network's delay, as PROTOCOL.md assumes. A write may be split into
//! random chunks (a fault), each delivered on its own.
//!
//! A link loses the bytes in flight when its generation is bumped (a reset,
//! a crash, a partition that cuts it); events that carry an older
//! generation are ignored. A black-holed link drops everything silently:
//! its client finds out only through its own timers.

use core::time::Duration;
use std::collections::BTreeMap;

use crate::client::ConnId as ClientConn;
use crate::client::OpId;
use crate::names::Key;
use crate::server::ConnId as ServerConn;
use crate::time::Time;

/// The longest one-way delay of a byte that is delivered at all.
pub(super) const MAX_DELAY: Duration = Duration::from_millis(800);
/// Partitions up to this long delay the bytes; longer ones cut the
/// connections.
pub(super) const DELAY_PARTITION: Duration = Duration::from_millis(400);

/// Names a link.
pub(super) type LinkId = u64;

/// Where a link goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// A node of the cluster, by index.
    Node(usize),
    /// The impostor: a server outside every allowlist.
    Impostor,
    /// An address nobody serves.
    Nowhere,
}

/// What a request on a link asked, for the ground truth.
#[derive(Debug, Clone)]
pub(super) enum Request {
    /// An acquire of the operation `op` of the link's client.
    Acquire { op: Option<OpId> },
    /// A release of `(key, token)`.
    Release { key: Key, token: u64 },
    /// A renewal of `(key, token)` (protocol version 2).
    Renew { key: Key, token: u64 },
}

/// One connection.
pub(super) struct SimConn {
    pub(super) client: usize,
    pub(super) cconn: ClientConn,
    pub(super) target: Target,
    /// The target node's instance when it accepted.
    pub(super) instance: u64,
    /// The server's id for it, once accepted.
    pub(super) sconn: Option<ServerConn>,
    /// Bumped when the bytes in flight are lost.
    pub(super) gen: u32,
    /// The client core has closed it (or was told it failed).
    pub(super) client_closed: bool,
    /// The server side is gone: closed, reset, or its node crashed.
    pub(super) server_closed: bool,
    /// Everything written is dropped silently.
    pub(super) blackhole: bool,
    /// The latest delivery time scheduled in each direction.
    pub(super) last_to_server: Time,
    pub(super) last_to_client: Time,
    /// Requests written by the client, by id, until answered.
    pub(super) requests: BTreeMap<u64, Request>,
}

impl SimConn {
    /// Whether neither side will do anything more with it.
    pub(super) fn is_done(&self) -> bool {
        self.client_closed && (self.server_closed || self.sconn.is_none())
    }

    /// Whether it is up on both sides and carries bytes.
    pub(super) fn is_established(&self) -> bool {
        self.sconn.is_some() && !self.client_closed && !self.server_closed && !self.blackhole
    }
}

/// A partition between a client and one node (or all nodes) until `until`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Partition {
    pub(super) client: usize,
    /// `None`: every node, and the impostor.
    pub(super) node: Option<usize>,
    pub(super) until: Time,
}

impl Partition {
    pub(super) fn covers(&self, client: usize, target: Target) -> bool {
        self.client == client
            && match (self.node, target) {
                (None, _) => true,
                (Some(n), Target::Node(m)) => n == m,
                (Some(_), _) => false,
            }
    }
}

/// Every link, and the indexes to find one.
#[derive(Default)]
pub(super) struct Net {
    pub(super) links: BTreeMap<LinkId, SimConn>,
    pub(super) by_client: BTreeMap<(usize, u64), LinkId>,
    /// `(node, instance, server conn)`; the impostor is node `usize::MAX`.
    pub(super) by_server: BTreeMap<(usize, u64, u64), LinkId>,
    pub(super) partitions: Vec<Partition>,
    next: LinkId,
}

impl Net {
    /// Opens a link for a client's connect.
    pub(super) fn open(&mut self, client: usize, cconn: ClientConn, target: Target) -> LinkId {
        self.next += 1;
        let id = self.next;
        self.links.insert(
            id,
            SimConn {
                client,
                cconn,
                target,
                instance: 0,
                sconn: None,
                gen: 0,
                client_closed: false,
                server_closed: false,
                blackhole: false,
                last_to_server: Time::ZERO,
                last_to_client: Time::ZERO,
                requests: BTreeMap::new(),
            },
        );
        self.by_client.insert((client, cconn.get()), id);
        id
    }

    /// The link of a client's connection.
    pub(super) fn of_client(&self, client: usize, cconn: ClientConn) -> Option<LinkId> {
        self.by_client.get(&(client, cconn.get())).copied()
    }

    /// The link of a server's connection.
    pub(super) fn of_server(
        &self,
        node: usize,
        instance: u64,
        sconn: ServerConn,
    ) -> Option<LinkId> {
        self.by_server.get(&(node, instance, sconn.get())).copied()
    }

    /// Records that the server accepted the link.
    pub(super) fn accepted(&mut self, id: LinkId, node: usize, instance: u64, sconn: ServerConn) {
        if let Some(link) = self.links.get_mut(&id) {
            link.instance = instance;
            link.sconn = Some(sconn);
            self.by_server.insert((node, instance, sconn.get()), id);
        }
    }

    /// Forgets a link that neither side uses any more.
    pub(super) fn reap(&mut self, id: LinkId, node_of: impl Fn(Target) -> usize) {
        let Some(link) = self.links.get(&id) else {
            return;
        };
        if !link.is_done() {
            return;
        }
        let link = self.links.remove(&id).expect("present");
        self.by_client.remove(&(link.client, link.cconn.get()));
        if let Some(sconn) = link.sconn {
            self.by_server
                .remove(&(node_of(link.target), link.instance, sconn.get()));
        }
    }

    /// The partition that covers `client` and `target` at `now`, if any
    /// (the latest ending one).
    pub(super) fn partition(&self, client: usize, target: Target, now: Time) -> Option<Time> {
        self.partitions
            .iter()
            .filter(|p| p.until > now && p.covers(client, target))
            .map(|p| p.until)
            .max()
    }

    /// Whether any partition is still on at `now`.
    pub(super) fn any_partition(&self, now: Time) -> bool {
        self.partitions.iter().any(|p| p.until > now)
    }

    /// Forgets partitions that ended.
    pub(super) fn heal(&mut self, now: Time) {
        self.partitions.retain(|p| p.until > now);
    }
}
