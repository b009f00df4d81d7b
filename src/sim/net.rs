//! The simulated network: one [`SimConn`] per connection a client core opens,
//! to a node of the cluster, to the impostor, or to nowhere; the partitions
//! between clients and nodes; and the bytes in flight.
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
//!
//! The [`Net`] owns the links and the partitions, and decides what becomes
//! of every write, connect and close: when it arrives, whether it is lost,
//! split or refused, which links a crash, a reset or a partition ends. It
//! draws from the seed's generator, which the world lends it for each call
//! (an [`Env`]: the world's fault schedule draws from the same generator,
//! in one order), and hands back its [`Effect`]s in order: the link
//! events ([`Ev`]) to schedule, faults, lines for the log. When a link
//! event is due, [`Net::deliver`] says what it brings to whom (a
//! [`Delivery`]); handing it to the client or server core is the world's.

use core::time::Duration;
use std::collections::BTreeMap;

use bytes::Bytes;

use super::workload::Params;
use super::{millis_between, FaultKind};
use crate::client::ConnId as ClientConn;
use crate::client::{OpId, TransportEnd};
use crate::names::Key;
use crate::rng::Rng;
use crate::server::ConnId as ServerConn;
use crate::testkit::TraceHash;
use crate::time::Time;

/// The longest one-way delay of a byte that is delivered at all.
pub(super) const MAX_DELAY: Duration = Duration::from_millis(800);
/// Partitions up to this long delay the bytes; longer ones cut the
/// connections.
const DELAY_PARTITION: Duration = Duration::from_millis(400);

/// Names a link.
pub(super) type LinkId = u64;

/// Where a link goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
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

/// How the connections of a server core that is gone end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// The node crashed: its clients learn of a reset, or, `silent`, learn
    /// nothing (the connections go dead).
    Crash { silent: bool },
    /// The core was replaced: it closed them.
    Replaced,
}

/// One connection.
struct SimConn {
    client: usize,
    cconn: ClientConn,
    target: Target,
    /// The target node's instance when it accepted.
    instance: u64,
    /// The server's id for it, once accepted.
    sconn: Option<ServerConn>,
    /// Bumped when the bytes in flight are lost.
    gen: u32,
    /// The client core has closed it (or was told it failed).
    client_closed: bool,
    /// The server side is gone: closed, reset, or its node crashed.
    server_closed: bool,
    /// Everything written is dropped silently.
    blackhole: bool,
    /// The latest delivery time scheduled in each direction.
    last_to_server: Time,
    last_to_client: Time,
    /// Requests written by the client, by id, until answered.
    requests: BTreeMap<u64, Request>,
}

impl SimConn {
    /// Whether neither side will do anything more with it.
    fn is_done(&self) -> bool {
        self.client_closed && (self.server_closed || self.sconn.is_none())
    }

    /// Whether it is up on both sides and carries bytes.
    fn is_established(&self) -> bool {
        self.sconn.is_some() && !self.client_closed && !self.server_closed && !self.blackhole
    }
}

/// A partition between a client and one node (or all nodes) until `until`.
#[derive(Debug, Clone, Copy)]
struct Partition {
    client: usize,
    /// `None`: every node, and the impostor.
    node: Option<usize>,
    until: Time,
}

impl Partition {
    fn covers(&self, client: usize, target: Target) -> bool {
        self.client == client
            && match (self.node, target) {
                (None, _) => true,
                (Some(n), Target::Node(m)) => n == m,
                (Some(_), _) => false,
            }
    }
}

/// Something on its way along a link.
#[derive(Debug)]
pub(super) enum Ev {
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
}

impl Ev {
    /// The event for the trace: its kind and two numbers.
    pub(super) fn trace(&self) -> (u64, u64, u64) {
        match self {
            Ev::ConnectArrive { link, gen } => (1, *link, u64::from(*gen)),
            Ev::ConnectReply { link, gen, ok } => (2, *link, u64::from(*gen) << 1 | u64::from(*ok)),
            Ev::ToServer { link, gen, .. } => (3, *link, u64::from(*gen)),
            Ev::ToClient { link, gen, .. } => (4, *link, u64::from(*gen)),
            Ev::FinToServer { link, gen } => (5, *link, u64::from(*gen)),
            Ev::FinToClient { link, gen } => (6, *link, u64::from(*gen)),
            Ev::ResetToServer { link } => (7, *link, 0),
            Ev::ResetToClient { link } => (8, *link, 0),
        }
    }
}

/// What the world must do for the network, in order.
#[derive(Debug)]
pub(super) enum Effect {
    /// Schedule `Ev` at a time.
    At(Time, Ev),
    /// A fault happened.
    Fault(FaultKind),
    /// A line for the log.
    Note(String),
}

/// What the world lends the network for one call.
pub(super) struct Env<'a> {
    pub(super) now: Time,
    /// Faults may happen now: latency spikes, split writes, refused
    /// connects.
    pub(super) faults_on: bool,
    /// The seed's generator, which the world's fault schedule draws from
    /// too.
    pub(super) rng: &'a mut Rng,
    pub(super) trace: &'a mut TraceHash,
}

impl Env<'_> {
    /// Adds a step to the trace: `tag`, the time, and `a`.
    pub(super) fn tag(&mut self, tag: &[u8], a: u64) {
        self.trace.write(tag);
        self.trace.write_u64(self.now.as_nanos());
        self.trace.write_u64(a);
    }
}

/// An input for a client core.
pub(super) enum Input {
    Connected(ClientConn),
    ConnectFailed(ClientConn),
    Bytes(ClientConn, Bytes),
    Closed(ClientConn, TransportEnd),
}

/// What a link event brings, for the world to hand over.
pub(super) enum Delivery {
    /// A connect reached `target`, which accepts or not.
    Connect {
        link: LinkId,
        gen: u32,
        client: usize,
        target: Target,
    },
    /// Something for a client core.
    Client { client: usize, input: Input },
    /// Bytes for the server core of `target` at `instance` (unless it was
    /// replaced since it accepted the link).
    Server {
        link: LinkId,
        target: Target,
        instance: u64,
        conn: ServerConn,
        data: Bytes,
    },
    /// The server side of the link learns that it is gone: the core of
    /// `target` at `instance`, if it still runs. The world reaps the link
    /// ([`Net::reap`]) once the core has heard.
    ServerClosed {
        link: LinkId,
        target: Target,
        instance: u64,
        conn: ServerConn,
    },
}

/// Every link, the indexes to find one, and the partitions.
pub(super) struct Net {
    links: BTreeMap<LinkId, SimConn>,
    by_client: BTreeMap<(usize, u64), LinkId>,
    /// `(target, instance, server conn)`.
    by_server: BTreeMap<(Target, u64, u64), LinkId>,
    partitions: Vec<Partition>,
    next: LinkId,
    /// The base one-way latency range, in microseconds.
    latency_us: (u64, u64),
    /// Per mille of writes delayed by a latency spike.
    spike_pm: u64,
    /// Per mille of writes split into chunks.
    split_pm: u64,
    /// Per mille of connects refused.
    refuse_pm: u64,
}

impl Net {
    /// A network with no link yet, as the seed drew it.
    pub(super) fn new(params: &Params) -> Net {
        Net {
            links: BTreeMap::new(),
            by_client: BTreeMap::new(),
            by_server: BTreeMap::new(),
            partitions: Vec::new(),
            next: 0,
            latency_us: params.latency_us,
            spike_pm: params.spike_pm,
            split_pm: params.split_pm,
            refuse_pm: params.refuse_pm,
        }
    }

    /// The link of a client's connection.
    pub(super) fn of_client(&self, client: usize, cconn: ClientConn) -> Option<LinkId> {
        self.by_client.get(&(client, cconn.get())).copied()
    }

    /// The link of a server's connection.
    pub(super) fn of_server(
        &self,
        target: Target,
        instance: u64,
        sconn: ServerConn,
    ) -> Option<LinkId> {
        self.by_server
            .get(&(target, instance, sconn.get()))
            .copied()
    }

    /// Whether any partition is still on at `now`.
    pub(super) fn any_partition(&self, now: Time) -> bool {
        self.partitions.iter().any(|p| p.until > now)
    }

    /// Notes the requests the client wrote on `id`, for the ground truth.
    pub(super) fn requested(&mut self, id: LinkId, found: Vec<(u64, Request)>) {
        if let Some(link) = self.links.get_mut(&id) {
            link.requests.extend(found);
        }
    }

    /// The client of `id` and what its request `request` asked, once the
    /// server answers it.
    pub(super) fn answered(
        &mut self,
        id: LinkId,
        request: u64,
    ) -> Option<(usize, Option<Request>)> {
        let link = self.links.get_mut(&id)?;
        Some((link.client, link.requests.remove(&request)))
    }

    /// Forgets a link that neither side uses any more.
    pub(super) fn reap(&mut self, id: LinkId) {
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
                .remove(&(link.target, link.instance, sconn.get()));
        }
    }

    // ----- what the client does ---------------------------------------------

    /// A client's connect to `target`: it arrives unless a partition
    /// covers it (then the client's connect timeout fires).
    pub(super) fn connect(
        &mut self,
        env: &mut Env<'_>,
        client: usize,
        cconn: ClientConn,
        target: Target,
        out: &mut Vec<Effect>,
    ) {
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
        env.tag(b"connect", id);
        if self.partition(client, target, env.now).is_none() {
            let at = self.arrival(env, id, true, out);
            out.push(Effect::At(at, Ev::ConnectArrive { link: id, gen: 0 }));
        }
    }

    /// A client's write on `id`, unless the link carries nothing.
    pub(super) fn client_sends(
        &mut self,
        env: &mut Env<'_>,
        id: LinkId,
        data: Bytes,
        out: &mut Vec<Effect>,
    ) {
        let link = &self.links[&id];
        if link.client_closed || link.server_closed || link.blackhole || link.sconn.is_none() {
            return;
        }
        self.send_segments(env, id, true, data, out);
    }

    /// A client's close of `id`: the server hears of it after its bytes.
    pub(super) fn client_closes(&mut self, env: &mut Env<'_>, id: LinkId, out: &mut Vec<Effect>) {
        let link = self.links.get_mut(&id).expect("indexed");
        link.client_closed = true;
        let fin = !link.server_closed && link.sconn.is_some() && !link.blackhole;
        let gen = link.gen;
        if fin {
            let at = self.arrival(env, id, true, out);
            out.push(Effect::At(at, Ev::FinToServer { link: id, gen }));
        }
        self.reap(id);
    }

    // ----- what the server does ---------------------------------------------

    /// Whether the connect that reached `target` is refused (a fault).
    /// Asked only of a target that is up.
    pub(super) fn refuses(&self, env: &mut Env<'_>, target: Target, out: &mut Vec<Effect>) -> bool {
        let refused =
            target != Target::Impostor && env.faults_on && env.rng.chance(self.refuse_pm, 1000);
        if refused {
            out.push(Effect::Fault(FaultKind::Refused));
        }
        refused
    }

    /// Records that the server accepted the link, as `sconn` of the core
    /// at `instance`.
    pub(super) fn accepted(&mut self, id: LinkId, instance: u64, sconn: ServerConn) {
        if let Some(link) = self.links.get_mut(&id) {
            link.instance = instance;
            link.sconn = Some(sconn);
            self.by_server
                .insert((link.target, instance, sconn.get()), id);
        }
    }

    /// The answer to the connect on `id` (`ok`: accepted), on its way
    /// back.
    pub(super) fn answer_connect(
        &mut self,
        env: &mut Env<'_>,
        id: LinkId,
        gen: u32,
        ok: bool,
        out: &mut Vec<Effect>,
    ) {
        let at = self.arrival(env, id, false, out);
        out.push(Effect::At(at, Ev::ConnectReply { link: id, gen, ok }));
    }

    /// A server's write on `id`, unless its client is gone or the link
    /// drops everything.
    pub(super) fn server_sends(
        &mut self,
        env: &mut Env<'_>,
        id: LinkId,
        data: Bytes,
        out: &mut Vec<Effect>,
    ) {
        let link = &self.links[&id];
        if link.client_closed || link.blackhole {
            return;
        }
        self.send_segments(env, id, false, data, out);
    }

    /// A server's close of `id`: the client hears of it after its bytes.
    pub(super) fn server_closes(&mut self, env: &mut Env<'_>, id: LinkId, out: &mut Vec<Effect>) {
        let link = self.links.get_mut(&id).expect("indexed");
        link.server_closed = true;
        let fin = !link.client_closed && !link.blackhole;
        let gen = link.gen;
        if fin {
            let at = self.arrival(env, id, false, out);
            out.push(Effect::At(at, Ev::FinToClient { link: id, gen }));
        }
        self.reap(id);
    }

    /// The connections of node `n`'s server core at `instance` end with
    /// it, as `ending` says.
    pub(super) fn server_gone(
        &mut self,
        env: &mut Env<'_>,
        n: usize,
        instance: u64,
        ending: Ending,
        out: &mut Vec<Effect>,
    ) {
        let gone: Vec<LinkId> = self
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
            let link = self.links.get_mut(&id).expect("listed");
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
                let at = self.arrival(env, id, false, out);
                out.push(Effect::At(at, ev));
            }
            self.reap(id);
        }
    }

    // ----- the network's own faults -------------------------------------

    /// Resets one established connection: both sides learn it after a
    /// delay, and the bytes in flight are lost.
    pub(super) fn reset_one(&mut self, env: &mut Env<'_>, out: &mut Vec<Effect>) {
        let open: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, l)| l.is_established())
            .map(|(&id, _)| id)
            .collect();
        if open.is_empty() {
            return;
        }
        let id = open[env.rng.up_to(open.len() as u64 - 1) as usize];
        out.push(Effect::Note(format!("fault: link {id} is reset")));
        out.push(Effect::Fault(FaultKind::Reset));
        let link = self.links.get_mut(&id).expect("listed");
        link.gen += 1;
        let to_client = self.arrival(env, id, false, out);
        let to_server = self.arrival(env, id, true, out);
        out.push(Effect::At(to_client, Ev::ResetToClient { link: id }));
        out.push(Effect::At(to_server, Ev::ResetToServer { link: id }));
    }

    /// Cuts one of `clients` off from one of `nodes`, or from all, for a
    /// while. A short partition delays the bytes until it heals; a long
    /// one cuts the connections: the server side learns after
    /// [`MAX_DELAY`], the client when the partition heals (if its own
    /// timers have not told it first).
    pub(super) fn cut_off(
        &mut self,
        env: &mut Env<'_>,
        clients: usize,
        nodes: usize,
        out: &mut Vec<Effect>,
    ) {
        let rng = &mut *env.rng;
        let c = rng.up_to(clients.max(1) as u64 - 1) as usize;
        let node = if rng.chance(1, 3) {
            None
        } else {
            Some(rng.up_to(nodes as u64 - 1) as usize)
        };
        let cut = rng.chance(1, 2);
        let length = if cut {
            millis_between(rng, 500, 3_000)
        } else {
            millis_between(rng, 50, DELAY_PARTITION.as_millis() as u64)
        };
        let until = env.now.saturating_add(length);
        out.push(Effect::Note(format!(
            "fault: c{c} cut off from {node:?} for {length:?} (cut: {cut})"
        )));
        out.push(Effect::Fault(FaultKind::Partition));
        self.partitions.retain(|p| p.until > env.now);
        let partition = Partition {
            client: c,
            node,
            until,
        };
        self.partitions.push(partition);
        if !cut {
            return;
        }
        for (&id, link) in &mut self.links {
            if link.is_done() || !partition.covers(link.client, link.target) {
                continue;
            }
            link.gen += 1;
            link.blackhole = true;
            if link.sconn.is_some() && !link.server_closed {
                let at = env.now.saturating_add(MAX_DELAY);
                out.push(Effect::At(at, Ev::ResetToServer { link: id }));
            }
            if !link.client_closed {
                out.push(Effect::At(until, Ev::ResetToClient { link: id }));
            }
        }
    }

    // ----- deliveries -------------------------------------------------------

    /// What `ev`, due now, brings; `None` if it was lost or has no one
    /// left to hear it.
    pub(super) fn deliver(&mut self, env: &mut Env<'_>, ev: Ev) -> Option<Delivery> {
        match ev {
            Ev::ConnectArrive { link, gen } => {
                let l = self.links.get(&link)?;
                if l.gen != gen || l.client_closed {
                    return None;
                }
                let (client, target) = (l.client, l.target);
                if self.partition(client, target, env.now).is_some() {
                    // The connect is lost: the client's connect timeout
                    // fires.
                    return None;
                }
                env.tag(b"connect-arrive", link);
                Some(Delivery::Connect {
                    link,
                    gen,
                    client,
                    target,
                })
            }
            Ev::ConnectReply { link, gen, ok } => {
                let l = self.links.get_mut(&link)?;
                if l.gen != gen || l.client_closed {
                    return None;
                }
                let (client, conn) = (l.client, l.cconn);
                if !ok {
                    l.client_closed = true;
                }
                env.tag(b"connect-reply", link);
                let input = if ok {
                    Input::Connected(conn)
                } else {
                    self.reap(link);
                    Input::ConnectFailed(conn)
                };
                Some(Delivery::Client { client, input })
            }
            Ev::ToServer { link, gen, data } => {
                let l = self.links.get(&link)?;
                if l.gen != gen || l.server_closed {
                    return None;
                }
                Some(Delivery::Server {
                    link,
                    target: l.target,
                    instance: l.instance,
                    conn: l.sconn?,
                    data,
                })
            }
            Ev::ToClient { link, gen, data } => {
                let l = self.links.get(&link)?;
                if l.gen != gen || l.client_closed {
                    return None;
                }
                let (client, conn) = (l.client, l.cconn);
                env.tag(b"to-client", link);
                let input = Input::Bytes(conn, data);
                Some(Delivery::Client { client, input })
            }
            Ev::FinToServer { link, gen } => {
                if self.links.get(&link)?.gen != gen {
                    return None;
                }
                self.server_learns_closed(link)
            }
            Ev::ResetToServer { link } => self.server_learns_closed(link),
            Ev::FinToClient { link, gen } => {
                let l = self.links.get(&link)?;
                if l.gen != gen || l.client_closed {
                    return None;
                }
                let (client, conn) = (l.client, l.cconn);
                env.tag(b"fin-to-client", link);
                let input = Input::Closed(conn, TransportEnd::Eof);
                Some(Delivery::Client { client, input })
            }
            Ev::ResetToClient { link } => {
                let l = self.links.get(&link)?;
                if l.client_closed {
                    return None;
                }
                let (client, conn) = (l.client, l.cconn);
                env.tag(b"reset-to-client", link);
                let input = Input::Closed(conn, TransportEnd::Error);
                Some(Delivery::Client { client, input })
            }
        }
    }

    /// The server side of `id` learns that the connection is gone.
    fn server_learns_closed(&mut self, id: LinkId) -> Option<Delivery> {
        let l = self.links.get_mut(&id)?;
        if l.server_closed {
            return None;
        }
        let conn = l.sconn?;
        l.server_closed = true;
        Some(Delivery::ServerClosed {
            link: id,
            target: l.target,
            instance: l.instance,
            conn,
        })
    }

    // ----- delays -----------------------------------------------------------

    /// The partition that covers `client` and `target` at `now`, if any
    /// (the latest ending one).
    fn partition(&self, client: usize, target: Target, now: Time) -> Option<Time> {
        self.partitions
            .iter()
            .filter(|p| p.until > now && p.covers(client, target))
            .map(|p| p.until)
            .max()
    }

    /// One write's delay: the base latency, or a spike.
    fn delay(&self, env: &mut Env<'_>, out: &mut Vec<Effect>) -> Duration {
        let (lo, hi) = self.latency_us;
        let mut us = lo + env.rng.up_to(hi - lo);
        if env.faults_on && env.rng.chance(self.spike_pm, 1000) {
            us = 100_000 + env.rng.up_to(700_000);
            out.push(Effect::Fault(FaultKind::Latency));
        }
        Duration::from_micros(us)
    }

    /// When a write on `id` made now arrives: after its delay, after a
    /// short partition that covers it, and after the writes before it.
    fn arrival(
        &mut self,
        env: &mut Env<'_>,
        id: LinkId,
        to_server: bool,
        out: &mut Vec<Effect>,
    ) -> Time {
        let delay = self.delay(env, out);
        let now = env.now;
        let mut at = now.saturating_add(delay);
        let Some(link) = self.links.get(&id) else {
            return at;
        };
        if let Some(until) = self.partition(link.client, link.target, now) {
            at = at.max(until);
        }
        let link = self.links.get_mut(&id).expect("present");
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

    /// Schedules `data` on `id`, maybe split into chunks.
    fn send_segments(
        &mut self,
        env: &mut Env<'_>,
        id: LinkId,
        to_server: bool,
        data: Bytes,
        out: &mut Vec<Effect>,
    ) {
        env.trace.write(if to_server { b">" } else { b"<" });
        env.trace.write_u64(id);
        env.trace.write(&data);
        let split = data.len() > 1 && env.faults_on && env.rng.chance(self.split_pm, 1000);
        let mut pieces = Vec::new();
        if split {
            out.push(Effect::Fault(FaultKind::Split));
            let cuts = 1 + env.rng.up_to(2) as usize;
            let mut at: Vec<usize> = (0..cuts)
                .map(|_| 1 + env.rng.up_to(data.len() as u64 - 2) as usize)
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
            let at = self.arrival(env, id, to_server, out);
            let gen = self.links[&id].gen;
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
            out.push(Effect::At(at, ev));
        }
    }
}
