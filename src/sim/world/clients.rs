//! The client cores: each call into one is a step of its checker, and what
//! it does is carried out on the network.

use core::time::Duration;
use std::collections::BTreeMap;

use super::{Step, World};
use crate::client::{Action, Config as ClientConfig, Event, OpId, Outcome, ReleaseResult};
use crate::names::{Endpoint, Key};
use crate::rng::Rng;
use crate::sim::driven::Driven;
use crate::sim::net::{Input, LinkId, Request};
use crate::sim::workload::{self, client_config, Params};
use crate::sim::{Check, SimConfig};
use crate::testkit::Checker;
use crate::time::Time;
use crate::wire::ClientFrame;

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
