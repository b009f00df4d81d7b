//! What the serving task drives ([`crate::host::serve`]): a [`Server`], or
//! (feature `raft`) a member of a replicated cluster, which answers the
//! same client inputs and has sources of its own (its peers, its disk).
//! Every rule is the core's; the task only moves bytes.
//!
//! The handle's commands are of two kinds. Every core takes those of the
//! task ([`Control`]: stats, dropping connections, pausing, stopping).
//! Those about the lock table and the role ([`TableCommand`]) only a
//! single server takes, whose table and role its driver sets; a member's
//! come from its log. A core says which it takes in its type
//! ([`Core::Command`]): a member takes an operator's (`MemberCommand`:
//! a leadership transfer, its status), none about the table or the role,
//! so the handle a member is served with has no method that would send
//! one: refused where it is written, not dropped where it arrives.

use std::task::Context;
use std::time::{Duration, Instant};

use ::tokio::sync::oneshot;

use crate::names::Endpoint;
use crate::server::{Action, ConnId, LockTable, Role, Server, ServerStats, Term, TermError};
use crate::time::Time;

/// A command of a handle to its serving task.
pub(crate) enum Control<K> {
    /// The core's counters.
    Stats(oneshot::Sender<ServerStats>),
    /// Cut every connection, as a network failure would.
    DropConnections,
    /// Stop (`true`) or start again taking bytes from connections.
    Pause(bool),
    /// Close every connection and hand the core back.
    Stop,
    /// One of the core's own ([`Core::Command`]).
    Core(K),
}

/// The commands about the lock table and the role: a single server's.
pub(crate) enum TableCommand {
    TakeTable(oneshot::Sender<LockTable>),
    InstallTable(LockTable),
    BeginTerm(Term, oneshot::Sender<Result<(), TermError>>),
    LeadUntil {
        until: Instant,
        /// Take the leader role first.
        lead: bool,
        reply: oneshot::Sender<bool>,
    },
    Role(Role),
    Announce(Endpoint),
}

/// A core the serving task drives.
pub(crate) trait Core: Send + 'static {
    /// The commands it takes besides the task's own.
    type Command: Send + 'static;

    fn handle_accept(&mut self, now: Time) -> ConnId;
    fn handle_bytes(&mut self, now: Time, conn: ConnId, data: &[u8]);
    fn handle_closed(&mut self, now: Time, conn: ConnId);
    fn handle_written(&mut self, now: Time, conn: ConnId, n: usize);
    fn handle_timeout(&mut self, now: Time);
    fn poll_action(&mut self) -> Option<Action>;
    fn poll_timeout(&self) -> Option<Time>;
    fn is_reading(&self, conn: ConnId) -> bool;
    fn is_open(&self, conn: ConnId) -> bool;
    fn handshake_timeout(&self) -> Duration;
    fn stats(&self) -> ServerStats;
    /// Takes what the core's other sources have; whether anything came.
    fn poll_sources(&mut self, cx: &mut Context<'_>, now: Time) -> bool {
        let _ = (cx, now);
        false
    }
    /// Whether the core put work off until what it said is on its way (a
    /// replica's copy of the table): the task then lets the runtime run
    /// the tasks that write it, and calls [`Core::handle_deferred`].
    fn has_deferred(&self) -> bool {
        false
    }
    /// Does the work put off.
    fn handle_deferred(&mut self, now: Time) {
        let _ = now;
    }
    /// Gives the core the epoch it asked for ([`Action::NeedEpoch`]).
    fn begin_epoch(&mut self, now: Time, epoch: u64);
    /// Carries out one of its own commands; `start` is the instant its
    /// time counts from.
    fn command(&mut self, now: Time, start: Instant, command: Self::Command);
    /// The server core, once the task is over.
    fn into_server(self) -> Server;
}

impl Core for Server {
    type Command = TableCommand;

    fn handle_accept(&mut self, now: Time) -> ConnId {
        Server::handle_accept(self, now)
    }
    fn handle_bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) {
        Server::handle_bytes(self, now, conn, data);
    }
    fn handle_closed(&mut self, now: Time, conn: ConnId) {
        Server::handle_closed(self, now, conn);
    }
    fn handle_written(&mut self, now: Time, conn: ConnId, n: usize) {
        Server::handle_written(self, now, conn, n);
    }
    fn handle_timeout(&mut self, now: Time) {
        Server::handle_timeout(self, now);
    }
    fn poll_action(&mut self) -> Option<Action> {
        Server::poll_action(self)
    }
    fn poll_timeout(&self) -> Option<Time> {
        Server::poll_timeout(self)
    }
    fn is_reading(&self, conn: ConnId) -> bool {
        Server::is_reading(self, conn)
    }
    fn is_open(&self, conn: ConnId) -> bool {
        Server::is_open(self, conn)
    }
    fn handshake_timeout(&self) -> Duration {
        self.config().handshake_timeout
    }
    fn stats(&self) -> ServerStats {
        Server::stats(self)
    }
    fn begin_epoch(&mut self, now: Time, epoch: u64) {
        // Refused only for an epoch past 2109.
        let _ = Server::begin_epoch(self, now, epoch);
    }
    fn command(&mut self, now: Time, start: Instant, command: TableCommand) {
        match command {
            TableCommand::TakeTable(reply) => {
                let _ = reply.send(self.take_lock_table(now));
            }
            TableCommand::InstallTable(table) => self.install_lock_table(now, table),
            TableCommand::BeginTerm(term, reply) => {
                let _ = reply.send(Server::begin_term(self, now, term));
            }
            TableCommand::LeadUntil { until, lead, reply } => {
                let until = Time::ZERO.saturating_add(until.saturating_duration_since(start));
                if lead {
                    self.set_role(now, Role::Leader);
                }
                let _ = reply.send(Server::lead_until(self, now, until));
            }
            TableCommand::Role(role) => self.set_role(now, role),
            TableCommand::Announce(addr) => self.announce_leader(now, addr),
        }
    }
    fn into_server(self) -> Server {
        self
    }
}
