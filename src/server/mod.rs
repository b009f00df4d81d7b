//! The reference server core: PROTOCOL.md section 4, sans-IO.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Server`]: connections, the handshake and its versions, the window, roles, terms, the driver contract |
//! | `table.rs` | [`LockTable`]: grants, FIFO wait queues, leases, wait deadlines, renewals, tokens, the recovery grace (rules 2 to 5 and 9, section 4.1) |
//! | `term.rs` | [`Term`], [`EpochSource`], [`TermError`]: how a term begins, `token = epoch * 2^22 + n` |
//! | `image.rs` | [`EpochRecord`], [`TableImage`]: what a server keeps, with a checksum |
//! | `config.rs` | [`Config`] and [`Role`] |
//! | `credential.rs` | the required credential, compared in a time that depends on neither side |
//! | `action.rs` | [`Action`] and [`ConnId`] |
//!
//! Where each rule of section 4 lives:
//!
//! 1. one answer per request: [`LockTable`] answers every acquire it queued
//!    exactly once (grant or `T`) unless its connection closes;
//!    [`Server`] answers everything else at once;
//! 2. acquire: `LockTable::acquire`;
//! 3. leases and expiry: `LockTable::advance`; how long a grant waited
//!    (`waited_ms`, version 2 only): `LockTable::promote`, and
//!    `Server::answer_at_once`, which leaves it out on version 1;
//! 4. release: `LockTable::release`;
//! 5. closed connections: `LockTable::drop_conn`, called by every close;
//! 6. the window: `Server::on_request`;
//! 7. roles: `Server::on_hello`, [`Server::set_role`],
//!    [`Server::announce_leader`]; a leader that grants only while its
//!    leadership is certain (section 4.2): [`Server::lead_until`], fired
//!    by `Server::advance` before anything else at its time;
//! 8. credentials: `Server::on_hello`, compared by `credential.rs`;
//!    refusals counted ([`ServerStats::auth_failures`]);
//! 9. renewal (`X`): `LockTable::renew`; refused on version 1 connections
//!    by `Server::on_request` (the version is kept per connection from its
//!    `H`, [`VERSIONS`]);
//! 10. a connection whose answers are not read is not read from:
//!     [`Server::is_reading`], from what [`Server::handle_written`] reports
//!     ([`Config::max_unwritten`]); the handshake timeout: a deadline per
//!     connection from [`Server::handle_accept`] until `Server::on_hello`,
//!     fired by `Server::advance` ([`Config::handshake_timeout`]). Running
//!     out of descriptors is the adapter's to survive (`ticketing::serve`
//!     backs off when accepting fails): the core has none.
//!
//! And section 4.1, terms, epochs and recovery:
//!
//! - epochs: inputs, never read from a clock: [`Server::begin_term`]
//!   ([`Term`]) and [`Server::begin_epoch`] (after [`Action::NeedEpoch`]);
//! - tokens `epoch * 2^22 + n`, and the term begun at `n = 2^22`: the
//!   table's counter (`Counter::next` in `table.rs`, [`token`]);
//! - the recovery grace: [`Term::Recovered`]; nothing granted meanwhile:
//!   `LockTable::acquire` and `LockTable::promote`; reclaiming:
//!   `LockTable::renew`; its end: `LockTable::advance`;
//! - the table written out and read back: [`Server::table_image`],
//!   [`TableImage`], [`Term::Resumed`]; a leadership handed over with the
//!   table: [`Server::take_lock_table`], [`Server::install_lock_table`].

mod action;
mod admin;
mod config;
pub(crate) mod credential;
mod decision;
#[cfg(feature = "raft")]
mod holdback;
mod image;
#[cfg(feature = "raft")]
pub mod raft;
#[cfg(feature = "raft")]
mod replicated;
mod stats;
mod table;
mod term;
mod token;

use core::mem;
use core::num::NonZeroU64;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::BytesMut;

pub use action::{Action, ConnId};
pub use admin::AdminAccess;
pub use config::{Config, ConfigError, Role};
pub use decision::{Decision, DecisionError};
#[cfg(all(feature = "fuzzing", feature = "raft"))]
pub(crate) use image::seal;
pub use image::{EpochRecord, ImageError, ImageGrant, OutOfRange, TableImage};
pub use stats::ServerStats;
pub use table::{Holder, LockTable};
pub use term::{next_epoch, EpochSource, Term, TermError};
pub use token::{count_of, epoch_of, token, COUNTER_BITS, MAX_EPOCH, TERM_GRANTS};

use core::time::Duration;

use self::admin::AdminDesk;
use self::credential::Credential;
#[cfg(feature = "raft")]
use self::holdback::Holdback;
use self::table::{Acquired, Limits, Renewal, Reply};
use crate::admin::{AdminReply, AdminRequest, ADMIN_VERSION};
use crate::names::Endpoint;
use crate::time::Time;
use crate::wire::{Answer, AnswerKind, Atom, ClientFrame, LineReader, ServerFrame, Window};

/// The protocol versions this server speaks (PROTOCOL.md section 3):
/// version 1 is version 2 without `X`, and without `waited_ms` in grants.
pub const VERSIONS: core::ops::RangeInclusive<u64> = 1..=2;

/// Why the server ends a connection, sent as `E <reason>` (or `M <addr>`)
/// before it closes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Farewell {
    /// `M <leader>`.
    Moved(Endpoint),
    /// `E <reason>`.
    Error(Reason),
}

/// The `E` reasons this server sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// A framing error, an unknown kind, or wrong fields.
    BadFrame,
    /// A request before `H`.
    HelloRequired,
    /// A second `H`.
    DuplicateHello,
    /// `H` with a version this server does not speak ([`VERSIONS`]).
    UnsupportedVersion,
    /// More than `window` requests unanswered (rule 6).
    Window,
    /// No complete `H` within the handshake timeout (rule 10).
    HandshakeTimeout,
    /// The credential was refused (rule 8).
    AuthFailed,
    /// No leader is known (rule 7).
    NoLeader,
    /// Starting up or draining (rule 7).
    NotActive,
}

impl Reason {
    #[cfg(test)]
    const ALL: [Reason; 9] = [
        Reason::BadFrame,
        Reason::HelloRequired,
        Reason::DuplicateHello,
        Reason::UnsupportedVersion,
        Reason::Window,
        Reason::HandshakeTimeout,
        Reason::AuthFailed,
        Reason::NoLeader,
        Reason::NotActive,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Reason::BadFrame => "bad_frame",
            Reason::HelloRequired => "hello_required",
            Reason::DuplicateHello => "duplicate_hello",
            Reason::UnsupportedVersion => "unsupported_version",
            Reason::Window => "window",
            Reason::HandshakeTimeout => "handshake_timeout",
            Reason::AuthFailed => "auth_failed",
            Reason::NoLeader => "no_leader",
            Reason::NotActive => "not_active",
        }
    }
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for `H`, until `deadline` (rule 10).
    Hello {
        /// When the connection is closed if no `H` was handled by then.
        deadline: Time,
    },
    /// `W` was sent; requests are served.
    Ready {
        /// Requests received and not answered yet.
        unanswered: u64,
        /// What its `H` said.
        version: Version,
    },
    /// `WA` was sent: an administrative connection (`admin.rs`), whose
    /// requests go to the desk.
    Admin,
}

/// What a connection's `H` said, and so what its frames may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// Version 1: no `X`; grants without `waited_ms`.
    V1,
    /// Version 2.
    V2,
}

struct Conn {
    reader: LineReader,
    phase: Phase,
    /// Bytes handed out in `Send` actions that the driver has not reported
    /// written (rule 10).
    unwritten: usize,
    /// Not to be read from until its unwritten answers are down to half
    /// of `Config::max_unwritten` (rule 10).
    held_back: bool,
}

/// Bytes waiting to be handed out for one connection.
#[derive(Default)]
struct Outgoing {
    buf: BytesMut,
    /// A `Flush` for this connection is in the queue.
    queued: bool,
}

#[derive(Debug, Clone, Copy)]
enum Pending {
    Flush(ConnId),
    Close(ConnId),
}

/// The Ticketing reference server: a deterministic state machine for many
/// connections, with no I/O, no clock and no threads. It does exactly what
/// PROTOCOL.md section 4 says.
///
/// # The driver contract
///
/// * **Inputs** report what happened, each with the current time:
///   [`handle_accept`](Server::handle_accept) (a connection was accepted; it
///   returns the id to quote for it), [`handle_bytes`](Server::handle_bytes)
///   (bytes arrived, in any chunking),
///   [`handle_closed`](Server::handle_closed) (the transport ended) and
///   [`handle_timeout`](Server::handle_timeout). Inputs about a connection
///   the server has closed, or never had, are ignored.
/// * **Commands** change the node: [`set_role`](Server::set_role),
///   [`announce_leader`](Server::announce_leader), and moving the lock
///   table: [`take_lock_table`](Server::take_lock_table),
///   [`install_lock_table`](Server::install_lock_table).
/// * **Outputs** are drained after any input or command:
///   1. [`poll_action`](Server::poll_action) until `None`: send bytes, close
///      connections, in the order given (a connection's `Send`s come before
///      its `Close`). Answers for one connection are batched into one `Send`.
///   2. [`poll_timeout`](Server::poll_timeout): when to call
///      [`handle_timeout`](Server::handle_timeout) if nothing else happens
///      first (the next lease expiry, wait deadline or handshake timeout).
///      It returns the time of the latest input while actions are still
///      queued, so a driver that only watches it cannot stall.
///
/// Time must not go backwards (an earlier time is taken as the latest one
/// seen). Every input and command first fires the timers that are due at its
/// time, each at its own time and in order, so a late driver sees the same
/// answers as a punctual one, only later. The same calls at the same times
/// give the same actions, byte for byte.
///
/// Bad input from a client never panics and only ever ends that client's
/// connection; the server never buffers more than 1024 bytes of an
/// unfinished line per connection.
///
/// # Example: a run loop
///
/// ```
/// use ticketing::server::{Action, Config, Server};
/// use ticketing::{Name, Time};
///
/// let mut now = Time::ZERO;
/// let mut server = Server::new(Config::new(Name::new("node-1")?), now)?;
///
/// // Two clients connect: the first takes the lock, the second waits 5 s.
/// let a = server.handle_accept(now);
/// let b = server.handle_accept(now);
/// server.handle_bytes(now, a, b"H 1 alice -\nA 1 printer alice 0 1000\n");
/// server.handle_bytes(now, b, b"H 1 bob -\nA 9 printer bob 5000 1000\n");
///
/// let mut wire: Vec<(u64, String)> = Vec::new(); // what was written, per connection
/// let mut drain = |server: &mut Server| {
///     while let Some(action) = server.poll_action() {
///         match action {
///             Action::Send { conn, data } => {
///                 wire.push((conn.get(), String::from_utf8(data.to_vec()).unwrap()))
///             }
///             Action::Close { .. } => { /* close the socket */ }
///             _ => {}
///         }
///     }
/// };
/// drain(&mut server);
/// // Nothing to read: sleep until the next deadline (alice's lease ends at 1 s).
/// while let Some(deadline) = server.poll_timeout() {
///     if server.holder("printer").is_some_and(|h| h.token == 2) {
///         break;
///     }
///     now = now.max(deadline);
///     server.handle_timeout(now);
///     drain(&mut server);
/// }
/// assert_eq!(now, Time::from_millis(1000));
/// assert_eq!(
///     wire,
///     [
///         (a.get(), "W node-1 64\nG 1 A printer 1 1000\n".to_string()),
///         (b.get(), "W node-1 64\n".to_string()),
///         (b.get(), "G 9 A printer 2 1000\n".to_string()),
///     ]
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Server {
    config: Config,
    /// `config.credential`, as it is compared.
    credential: Option<Credential>,
    role: Role,
    hint: Option<Endpoint>,
    now: Time,
    table: LockTable,
    /// A leader leads until then at most (PROTOCOL.md 4.2).
    lead_until: Option<Time>,
    conns: BTreeMap<ConnId, Conn>,
    /// The handshake deadline of every connection still waiting for `H`,
    /// earliest first (rule 10).
    hellos: BTreeSet<(Time, ConnId)>,
    next_conn: u64,
    outbox: BTreeMap<ConnId, Outgoing>,
    pending: VecDeque<Pending>,
    replies: Vec<Reply>,
    /// A replicated cluster's answers waiting for their commits
    /// (PROTOCOL.md 4.3, `replicated.rs`); `None` on a server that does
    /// not replicate.
    #[cfg(feature = "raft")]
    holdback: Option<Holdback>,
    /// Administrative connections' desk, once opened (`admin.rs`).
    admin: Option<AdminDesk>,
    /// The counters (the current values are filled in when read).
    stats: ServerStats,
}

impl Server {
    /// Makes a server with an empty lock table, in the role and with the
    /// leader hint of `config`.
    pub fn new(config: Config, now: Time) -> Result<Server, ConfigError> {
        config.validate()?;
        Ok(Server {
            credential: config.credential.as_ref().map(Credential::new),
            role: config.role.clone(),
            hint: config.leader_hint.clone(),
            table: LockTable::with_hash_key(config.hash_key, config.epochs),
            lead_until: None,
            config,
            now,
            conns: BTreeMap::new(),
            hellos: BTreeSet::new(),
            next_conn: 1,
            outbox: BTreeMap::new(),
            pending: VecDeque::new(),
            replies: Vec::new(),
            #[cfg(feature = "raft")]
            holdback: None,
            admin: None,
            stats: ServerStats::default(),
        })
    }

    // ----- administrative connections ---------------------------------------

    /// Admits administrative connections (`admin.rs`, PROTOCOL.md 4.4):
    /// what a member of a replicated cluster does, as Raft member `member`,
    /// for those `access` lets in. Until then an administrative hello is
    /// answered `E not_active`.
    pub fn open_admin(&mut self, member: u64, access: &AdminAccess) {
        let inbox = self.admin.take().map(|d| d.inbox).unwrap_or_default();
        let mut desk = AdminDesk::new(member, access);
        desk.inbox = inbox;
        self.admin = Some(desk);
    }

    /// The next administrative request, and the connection to answer
    /// ([`Server::answer_admin`]), in the order they came.
    #[must_use]
    pub fn poll_admin(&mut self) -> Option<(ConnId, AdminRequest)> {
        self.admin.as_mut()?.inbox.pop_front()
    }

    /// Sends `reply` on the administrative connection `conn`, if it is
    /// still open.
    pub fn answer_admin(&mut self, conn: ConnId, reply: &AdminReply) {
        if self
            .conns
            .get(&conn)
            .is_some_and(|c| c.phase == Phase::Admin)
        {
            let mut line = Vec::new();
            reply.encode(&mut line);
            self.output(conn).extend_from_slice(&line);
        }
    }

    // ----- inputs ---------------------------------------------------------

    /// A connection was accepted. Quote the returned id in every input about
    /// it. The server says nothing until the client's `H`. If no complete
    /// `H` has been handled by `now + handshake_timeout`
    /// ([`Config::handshake_timeout`]), the connection is sent
    /// `E handshake_timeout` and closed at that time (rule 10).
    pub fn handle_accept(&mut self, now: Time) -> ConnId {
        self.advance(now);
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.stats.accepted += 1;
        let deadline = self.now.saturating_add(self.config.handshake_timeout);
        self.conns.insert(
            conn,
            Conn {
                reader: LineReader::new(),
                phase: Phase::Hello { deadline },
                unwritten: 0,
                held_back: false,
            },
        );
        self.hellos.insert((deadline, conn));
        conn
    }

    /// Bytes arrived on `conn`, in any chunking. Every whole frame in them is
    /// handled in order, until one ends the connection; the rest is then
    /// ignored. An unfinished line is kept for the next bytes (at most 1024
    /// bytes of it: byte 1025 without a `\n` is a framing error).
    pub fn handle_bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) {
        self.advance(now);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let mut reader = mem::take(&mut c.reader);
        let mut input = data;
        while let Some(line) = reader.next_line(&mut input) {
            let verdict = match line {
                Err(_) => Err(Farewell::Error(Reason::BadFrame)),
                Ok(line) if self.is_admin_line(conn, line) => self.on_admin_line(conn, line),
                Ok(line) => match ClientFrame::parse(line) {
                    Err(_) => Err(Farewell::Error(Reason::BadFrame)),
                    Ok(frame) => self.on_frame(conn, frame),
                },
            };
            if let Err(farewell) = verdict {
                self.close(conn, Some(farewell));
                break;
            }
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.reader = reader;
        }
    }

    /// The transport of `conn` ended. Its waiting acquires are dropped
    /// without answers; its grants stay until released by exact token or
    /// their leases run out (rule 5). Nothing more is sent to it.
    pub fn handle_closed(&mut self, now: Time, conn: ConnId) {
        self.advance(now);
        if self.forget(conn) {
            self.outbox.remove(&conn);
        }
    }

    /// The driver wrote `n` more bytes of the `Send` actions of `conn` to
    /// its transport. A driver that reports this learns from
    /// [`is_reading`](Server::is_reading) when to stop reading from a
    /// connection whose answers are not being read (rule 10).
    pub fn handle_written(&mut self, now: Time, conn: ConnId, n: usize) {
        self.advance(now);
        let queued = self.queued_bytes(conn);
        let max = self.config.max_unwritten;
        if let Some(c) = self.conns.get_mut(&conn) {
            c.unwritten = c.unwritten.saturating_sub(n);
            if c.held_back && c.unwritten.saturating_add(queued) <= max / 2 {
                c.held_back = false;
            }
        }
    }

    /// Time passed: fires every lease expiry, wait deadline and handshake
    /// timeout due at or before `now`. Calling it early, or more often than
    /// needed, is harmless.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
    }

    // ----- commands -------------------------------------------------------

    /// Changes the node's role. A leader that stops leading sends every
    /// connection `M <leader>` (new role [`Role::Follower`]), `E no_leader`
    /// or `E not_active`, and closes them all; their waiting acquires are
    /// dropped, the grants stay in the table (rule 7). Handshakes that
    /// arrive later are answered by the new role.
    pub fn set_role(&mut self, now: Time, role: Role) {
        self.advance(now);
        self.step_down(role);
    }

    /// Leads only until `until` (PROTOCOL.md 4.2): the end of the
    /// leadership that the driver is certain of (the send time of its
    /// latest answered keep-alive plus the election TTL). From that moment
    /// on nothing is granted or renewed: the node steps down by itself,
    /// sends every connection `E no_leader` and closes them, unless this is
    /// called again with a later `until` before. Whether the node still
    /// leads: `false` (and nothing changes) for a node that does not, so
    /// that a driver whose extension came too late learns that it must win
    /// again. A role set with [`set_role`](Server::set_role) ends the limit.
    pub fn lead_until(&mut self, now: Time, until: Time) -> bool {
        self.advance(now);
        if !self.role.is_leader() {
            return false;
        }
        self.lead_until = Some(until);
        self.advance(now);
        self.role.is_leader()
    }

    /// The end of the leadership the driver is certain of, while one is set
    /// ([`lead_until`](Server::lead_until)).
    pub fn leading_until(&self) -> Option<Time> {
        self.lead_until
    }

    /// Takes `role`; a leader that stops leading says so to every
    /// connection and closes them (rule 7).
    fn step_down(&mut self, role: Role) {
        self.lead_until = None;
        let was_leader = self.role.is_leader();
        self.role = role;
        #[cfg(feature = "raft")]
        if !self.role.is_leader() {
            self.discard_held();
        }
        if was_leader {
            if let Some(farewell) = self.refusal() {
                let open = self.client_conns();
                for conn in open {
                    self.close(conn, Some(farewell.clone()));
                }
            }
        }
    }

    /// Sends `L <addr>` to every open connection, and from now on after
    /// every `W` (it replaces the configured leader hint). Connections stay.
    pub fn announce_leader(&mut self, now: Time, addr: Endpoint) {
        self.advance(now);
        for conn in self.client_conns() {
            self.write(
                conn,
                &ServerFrame::Leader {
                    addr: addr.to_wire(),
                },
            );
        }
        self.hint = Some(addr);
    }

    /// Takes the lock table out of this server, to install it into another
    /// with [`install_lock_table`](Server::install_lock_table): the grants
    /// and the token counter go with it.
    ///
    /// Waiting acquires cannot go along (they belong to this server's
    /// connections): every connection with one is sent `E not_active` and
    /// closed first. A leader hands its table over after stepping down
    /// ([`set_role`](Server::set_role)), when no connection is left, so this
    /// only matters to a caller that does otherwise. This server keeps an
    /// empty table whose tokens go on after the taken one's.
    pub fn take_lock_table(&mut self, now: Time) -> LockTable {
        self.advance(now);
        self.close_waiting_connections();
        let next = self.table.successor();
        mem::replace(&mut self.table, next)
    }

    /// Installs `table` as this server's lock table: its grants, their
    /// leases and its token counter carry on here, as in a correctly
    /// replicated service. Leases that ended before `now` end at once.
    ///
    /// Waiting acquires in `table` (a copy taken from a live server) are
    /// dropped: they belong to another server's connections. Connections of
    /// this server with acquires waiting in the table being replaced are
    /// sent `E not_active` and closed. The token counter never goes back:
    /// the next grant's token is greater than every token either table gave.
    pub fn install_lock_table(&mut self, now: Time, mut table: LockTable) {
        self.advance(now);
        self.close_waiting_connections();
        table.drop_all_waiters();
        table.tokens_after(self.table.last_token(), self.config.epochs);
        self.table = table;
        self.advance(now);
    }

    /// Begins a term (PROTOCOL.md 4.1) with the table `term` says:
    /// [`Term::First`] and [`Term::Recovered`] an empty one (the latter
    /// with a recovery grace of `max_lease + grace_margin`), and
    /// [`Term::Resumed`] the image's grants, their leases shortened by the
    /// time stopped. Its tokens are `epoch * 2^22 + n`. Connections with
    /// acquires waiting in the table being replaced are sent
    /// `E not_active` and closed; the others stay.
    ///
    /// The epoch must be greater than every epoch this server or the
    /// image has granted in, and at most [`MAX_EPOCH`]: anything else is
    /// refused with a [`TermError`] and changes nothing. Where the epoch
    /// comes from (the clock, a state directory, etcd) is the driver's.
    pub fn begin_term(&mut self, now: Time, term: Term) -> Result<(), TermError> {
        self.advance(now);
        let epoch = term.epoch();
        term::check_epoch(epoch, self.table.epoch(), self.table.has_granted())?;
        let table = match &term {
            Term::First { .. } => self.table.recovered(self.now, epoch, self.now, 0),
            Term::Recovered { max_lease, .. } => {
                let grace = max_lease.saturating_add(self.config.grace_margin);
                let until = self.now.saturating_add(grace);
                let max_lease_ms = crate::time::duration_millis(*max_lease);
                self.table.recovered(self.now, epoch, until, max_lease_ms)
            }
            Term::Resumed { image, stopped, .. } => {
                term::check_epoch(epoch, image.epoch, true)?;
                for g in &image.grants {
                    term::check_epoch(epoch, token::epoch_of(g.token), true)?;
                }
                self.table.resumed(self.now, epoch, image, *stopped)
            }
        };
        self.close_waiting_connections();
        self.table = table;
        self.advance(now);
        Ok(())
    }

    /// Gives the new epoch that [`Action::NeedEpoch`] asked for: the term
    /// goes on with its table under it, from `n = 1`, and what waited for
    /// it is granted. It must be greater than the epoch `after`
    /// ([`TermError::EpochNotGreater`]) and asked for
    /// ([`TermError::NotAsked`]).
    pub fn begin_epoch(&mut self, now: Time, epoch: u64) -> Result<(), TermError> {
        self.advance(now);
        if !self.table.awaiting_epoch() {
            return Err(TermError::NotAsked);
        }
        term::check_epoch(epoch, self.table.epoch(), true)?;
        let mut replies = mem::take(&mut self.replies);
        self.table.begin_epoch(self.now, epoch, &mut replies);
        self.deliver(&mut replies);
        self.replies = replies;
        Ok(())
    }

    /// The lock table written out at `now` (to be encoded with
    /// [`TableImage::encode`] and kept): every grant with what is left of
    /// its lease, the epoch and the counter, the greatest lease given, and
    /// what is left of a grace. `written_at` is the wall-clock time (since
    /// 1970) that the driver reads; the next term counts the time stopped
    /// from it. The server goes on as before.
    pub fn table_image(&mut self, now: Time, written_at: Duration) -> TableImage {
        self.advance(now);
        self.table.image(self.now, written_at)
    }

    /// The server's counters: answers by kind, reclaims, expiries,
    /// connections, waiters now and at most, the epoch, whether a recovery
    /// grace holds.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            expiries: self.table.expiries(),
            connections: self.conns.len() as u64,
            waiters: self.table.waiters() as u64,
            epoch: self.table.epoch(),
            in_grace: self.grace_until().is_some(),
            ..self.stats
        }
    }

    /// Sets the term's counter, as if `n` grants had been made: for the
    /// tests of drivers that must see a term reach `n = 2^22`.
    #[cfg(all(test, feature = "server"))]
    pub(crate) fn set_term_count(&mut self, n: u64) {
        self.table.set_count(n);
    }

    /// The epoch of the current term.
    pub fn epoch(&self) -> u64 {
        self.table.epoch()
    }

    /// When the current term's recovery grace ends, while one is under way.
    pub fn grace_until(&self) -> Option<Time> {
        self.table.grace_until()
    }

    // ----- outputs --------------------------------------------------------

    /// The next thing the driver must do: send bytes, or close a connection.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        if let Some(after) = self.table.take_epoch_request() {
            return Some(Action::NeedEpoch { after });
        }
        while let Some(pending) = self.pending.pop_front() {
            match pending {
                Pending::Flush(conn) => {
                    let Some(out) = self.outbox.get_mut(&conn) else {
                        continue;
                    };
                    out.queued = false;
                    if !out.buf.is_empty() {
                        let data = out.buf.split().freeze();
                        if let Some(c) = self.conns.get_mut(&conn) {
                            c.unwritten = c.unwritten.saturating_add(data.len());
                            if c.unwritten >= self.config.max_unwritten {
                                c.held_back = true;
                            }
                        }
                        return Some(Action::Send { conn, data });
                    }
                }
                Pending::Close(conn) => {
                    if let Some(out) = self.outbox.remove(&conn) {
                        if !out.buf.is_empty() {
                            // Unreachable by construction (a close always
                            // queues its flush first); never lose bytes.
                            self.pending.push_front(Pending::Close(conn));
                            self.outbox.insert(conn, Outgoing::default());
                            return Some(Action::Send {
                                conn,
                                data: out.buf.freeze(),
                            });
                        }
                        return Some(Action::Close { conn });
                    }
                }
            }
        }
        None
    }

    /// When the driver must call [`handle_timeout`](Server::handle_timeout)
    /// at the latest: the next lease expiry, wait deadline or handshake
    /// timeout, or the time of the latest input while actions are queued.
    /// `None` when nothing is due, ever, without new input.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        if !self.pending.is_empty() || self.table.epoch_requested() {
            return Some(self.now);
        }
        let hello = self.hellos.first().map(|&(at, _)| at);
        [self.table.next_deadline(), hello, self.lead_until]
            .into_iter()
            .flatten()
            .min()
    }

    // ----- introspection --------------------------------------------------

    /// The current grant of `key`, if it is held.
    pub fn holder(&self, key: &str) -> Option<Holder> {
        self.table.holder(key)
    }

    /// How many acquires wait in `key`'s queue (the holder not counted).
    pub fn queue_len(&self, key: &str) -> usize {
        self.table.queue_len(key)
    }

    /// The lock table, to look at (or to copy: it is `Clone`).
    pub fn lock_table(&self) -> &LockTable {
        &self.table
    }

    /// Whether `conn` is open (accepted, and neither closed by the server
    /// nor reported closed).
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// How many connections are open.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Requests received on `conn` and not answered yet, once its handshake
    /// was accepted.
    pub fn unanswered(&self, conn: ConnId) -> Option<u64> {
        match self.conns.get(&conn)?.phase {
            Phase::Hello { .. } | Phase::Admin => None,
            Phase::Ready { unanswered, .. } => Some(unanswered),
        }
    }

    /// Whether the driver should read from `conn` (rule 10): not once its
    /// answers not yet written to the transport (those in `Send` actions
    /// not reported by [`handle_written`](Server::handle_written), and
    /// those not handed out yet) reach [`Config::max_unwritten`], until
    /// they are down to half of it; so TCP holds back a client that does
    /// not read its answers, and the server does not buffer for it without
    /// bound. `false` for a connection the server does not have. A driver
    /// that never reports written bytes must not ask.
    pub fn is_reading(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|c| {
            let waiting = c.unwritten.saturating_add(self.queued_bytes(conn));
            !c.held_back && waiting < self.config.max_unwritten
        })
    }

    /// How many bytes the server has written for `conn` that
    /// [`poll_action`](Server::poll_action) has not handed out yet.
    fn queued_bytes(&self, conn: ConnId) -> usize {
        self.outbox.get(&conn).map_or(0, |out| out.buf.len())
    }

    /// The node's current role.
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The leader hint sent after `W`, if any.
    pub fn leader_hint(&self) -> Option<&Endpoint> {
        self.hint.as_ref()
    }

    /// The configuration the server was made with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The latest time the server has seen.
    pub fn now(&self) -> Time {
        self.now
    }

    // ----- internals ------------------------------------------------------

    /// Fires every timer due by `now`, each at its own time and in time
    /// order: the table's (whose answers are delivered) and the handshake
    /// timeouts. At equal times the table's come first, and handshake
    /// timeouts among themselves in connection order. (A connection still
    /// waiting for `H` has nothing in the table, so the order only fixes
    /// the order of the actions.)
    ///
    /// A leader whose leadership ends at or before `now`
    /// ([`lead_until`](Server::lead_until)) fires the timers before that
    /// moment, then steps down, then fires the rest: nothing is granted or
    /// renewed from that moment on.
    fn advance(&mut self, now: Time) {
        self.now = self.now.max(now);
        if let Some(until) = self.lead_until.filter(|&until| until <= self.now) {
            self.fire(Time::from_nanos(until.as_nanos().saturating_sub(1)));
            self.lead_until = None;
            self.step_down(Role::NoLeader);
        }
        self.fire(self.now);
    }

    /// Fires every timer due by `upto` (see [`advance`](Server::advance)).
    fn fire(&mut self, upto: Time) {
        let mut replies = mem::take(&mut self.replies);
        while let Some(&(at, conn)) = self.hellos.first() {
            if at > upto {
                break;
            }
            self.hellos.pop_first();
            self.table.advance(at, &mut replies);
            self.deliver(&mut replies);
            self.close(conn, Some(Farewell::Error(Reason::HandshakeTimeout)));
        }
        self.table.advance(upto, &mut replies);
        self.deliver(&mut replies);
        self.replies = replies;
    }

    /// Sends the table's later answers to their connections.
    fn deliver(&mut self, replies: &mut Vec<Reply>) {
        for reply in replies.drain(..) {
            self.answer(reply.conn, reply.id, reply.key.to_wire(), reply.kind);
        }
    }

    /// Writes an answer, counting it against the connection's window.
    fn answer(&mut self, conn: ConnId, id: u64, key: Atom<'_>, kind: AnswerKind) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let Phase::Ready {
            unanswered,
            version,
        } = &mut c.phase
        else {
            return;
        };
        *unanswered = unanswered.saturating_sub(1);
        let version = *version;
        self.answer_at_once(conn, version, id, key, kind);
    }

    /// Writes the answer to a request of `conn` that is answered as soon as
    /// it is counted. Its count of unanswered requests stays as it was: the
    /// window admitted the request, so counting it up cannot saturate, and
    /// the answer counts it back down. A grant on a version 1 connection
    /// says nothing of its wait (rule 3).
    fn answer_at_once(
        &mut self,
        conn: ConnId,
        version: Version,
        id: u64,
        key: Atom<'_>,
        mut kind: AnswerKind,
    ) {
        if let AnswerKind::Granted { waited_ms, .. } = &mut kind {
            if version == Version::V1 {
                *waited_ms = None;
            }
        }
        let s = &mut self.stats;
        *match kind {
            AnswerKind::Granted { .. } => &mut s.grants,
            AnswerKind::TimedOut => &mut s.timed_out,
            AnswerKind::Busy => &mut s.busy,
            AnswerKind::Released => &mut s.releases,
            AnswerKind::NotHeld => &mut s.not_held,
            AnswerKind::Renewed { .. } => &mut s.renewals,
            AnswerKind::Gone => &mut s.renewals_gone,
        } += 1;
        let frame = ServerFrame::Answer(Answer { id, key, kind });
        #[cfg(feature = "raft")]
        if self.hold_back(conn, &frame) {
            return;
        }
        frame.encode(self.output(conn));
    }

    fn on_frame(&mut self, conn: ConnId, frame: ClientFrame<'_>) -> Result<(), Farewell> {
        let phase = self.conns.get(&conn).map(|c| c.phase);
        match (phase, frame) {
            (None, _) => Ok(()),
            (
                Some(Phase::Hello { .. }),
                ClientFrame::Hello {
                    version,
                    credential,
                    ..
                },
            ) => self.on_hello(conn, version, credential),
            (Some(Phase::Hello { .. }), _) => Err(Farewell::Error(Reason::HelloRequired)),
            // Its lines go to `on_admin_line`.
            (Some(Phase::Admin), _) => Err(Farewell::Error(Reason::BadFrame)),
            (Some(Phase::Ready { .. }), ClientFrame::Hello { .. }) => {
                Err(Farewell::Error(Reason::DuplicateHello))
            }
            (
                Some(Phase::Ready {
                    unanswered,
                    version,
                }),
                request,
            ) => self.on_request(conn, unanswered, version, request),
        }
    }

    /// The handshake: version, then credential (rule 8), then role (rule 7).
    fn on_hello(
        &mut self,
        conn: ConnId,
        version: u64,
        credential: Atom<'_>,
    ) -> Result<(), Farewell> {
        let version = match version {
            1 => Version::V1,
            2 => Version::V2,
            _ => return Err(Farewell::Error(Reason::UnsupportedVersion)),
        };
        if let Some(required) = &self.credential {
            if !required.admits(credential.as_bytes()) {
                self.stats.auth_failures += 1;
                return Err(Farewell::Error(Reason::AuthFailed));
            }
        }
        if let Some(refusal) = self.refusal() {
            return Err(refusal);
        }
        let Some(window) = Window::new(self.config.window) else {
            // Unreachable: the configuration was validated.
            return Err(Farewell::Error(Reason::NotActive));
        };
        let node = self.config.node_id.clone();
        self.write(
            conn,
            &ServerFrame::Welcome {
                node: node.to_wire(),
                window,
            },
        );
        if let Some(hint) = self.hint.clone() {
            self.write(
                conn,
                &ServerFrame::Leader {
                    addr: hint.to_wire(),
                },
            );
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            if let Phase::Hello { deadline } = c.phase {
                self.hellos.remove(&(deadline, conn));
            }
            c.phase = Phase::Ready {
                unanswered: 0,
                version,
            };
        }
        Ok(())
    }

    /// How a node that does not lead answers a handshake; `None` for a
    /// leader.
    /// Whether `line`, on `conn`, is an administrative frame's: every line
    /// of an administrative connection, and a first line that is `HA`.
    fn is_admin_line(&self, conn: ConnId, line: &[u8]) -> bool {
        match self.conns.get(&conn).map(|c| c.phase) {
            Some(Phase::Admin) => true,
            Some(Phase::Hello { .. }) => line.starts_with(b"HA "),
            _ => false,
        }
    }

    /// A line of an administrative connection: its hello, or a request
    /// for the desk.
    fn on_admin_line(&mut self, conn: ConnId, line: &[u8]) -> Result<(), Farewell> {
        let Ok(request) = AdminRequest::parse(line) else {
            return Err(Farewell::Error(Reason::BadFrame));
        };
        let admin = self.conns.get(&conn).map(|c| c.phase) == Some(Phase::Admin);
        match (admin, request) {
            (
                false,
                AdminRequest::Hello {
                    version,
                    credential,
                },
            ) => {
                let Some(desk) = &self.admin else {
                    return Err(Farewell::Error(Reason::NotActive));
                };
                if version != ADMIN_VERSION {
                    return Err(Farewell::Error(Reason::UnsupportedVersion));
                }
                if !desk.admits(credential.as_ref()) {
                    self.stats.auth_failures += 1;
                    return Err(Farewell::Error(Reason::AuthFailed));
                }
                let member = desk.member;
                if let Some(c) = self.conns.get_mut(&conn) {
                    if let Phase::Hello { deadline } = c.phase {
                        self.hellos.remove(&(deadline, conn));
                    }
                    c.phase = Phase::Admin;
                }
                self.answer_admin(conn, &AdminReply::Welcome { member });
                Ok(())
            }
            (false, _) => Err(Farewell::Error(Reason::HelloRequired)),
            (true, AdminRequest::Hello { .. }) => Err(Farewell::Error(Reason::DuplicateHello)),
            (true, request) => {
                if let Some(desk) = &mut self.admin {
                    desk.inbox.push_back((conn, request));
                }
                Ok(())
            }
        }
    }

    /// The connections of clients of the lock table: every open one but
    /// the administrative ones.
    fn client_conns(&self) -> Vec<ConnId> {
        self.conns
            .iter()
            .filter(|(_, c)| c.phase != Phase::Admin)
            .map(|(&conn, _)| conn)
            .collect()
    }

    fn refusal(&self) -> Option<Farewell> {
        match &self.role {
            Role::Leader => None,
            Role::Follower { leader } => Some(Farewell::Moved(leader.clone())),
            Role::NoLeader => Some(Farewell::Error(Reason::NoLeader)),
            Role::NotActive => Some(Farewell::Error(Reason::NotActive)),
        }
    }

    /// A request on an accepted connection: the window (rule 6), then the
    /// lock table (rules 2 to 4).
    fn on_request(
        &mut self,
        conn: ConnId,
        unanswered: u64,
        version: Version,
        request: ClientFrame<'_>,
    ) -> Result<(), Farewell> {
        if version == Version::V1 && matches!(request, ClientFrame::Renew { .. }) {
            // Version 1 has no renewal: a frame of an unknown kind, whatever
            // the window.
            return Err(Farewell::Error(Reason::BadFrame));
        }
        let counted = unanswered.saturating_add(1);
        if counted > self.config.window {
            return Err(Farewell::Error(Reason::Window));
        }
        let limits = Limits {
            queue_limit: self.config.queue_limit,
            max_waiters: self.config.max_waiters,
            max_lease_ms: self.config.max_lease_ms(),
        };
        match request {
            ClientFrame::Acquire {
                id,
                key,
                wait_ms,
                lease_ms,
                ..
            } => {
                let kind = match self
                    .table
                    .acquire(self.now, &limits, conn, id, key, wait_ms, lease_ms)
                {
                    Acquired::Granted { token, lease_ms } => AnswerKind::Granted {
                        token,
                        lease_ms,
                        waited_ms: Some(0),
                    },
                    Acquired::TimedOut => AnswerKind::TimedOut,
                    Acquired::Busy => AnswerKind::Busy,
                    Acquired::Queued => {
                        let waiters = self.table.waiters() as u64;
                        self.stats.max_waiters = self.stats.max_waiters.max(waiters);
                        // Unanswered until the table answers it.
                        if let Some(c) = self.conns.get_mut(&conn) {
                            c.phase = Phase::Ready {
                                unanswered: counted,
                                version,
                            };
                        }
                        return Ok(());
                    }
                };
                self.answer_at_once(conn, version, id, key, kind);
            }
            ClientFrame::Release { id, key, token } => {
                let mut replies = mem::take(&mut self.replies);
                let released = self
                    .table
                    .release(self.now, key.as_str(), token, &mut replies);
                let kind = if released {
                    AnswerKind::Released
                } else {
                    AnswerKind::NotHeld
                };
                self.answer_at_once(conn, version, id, key, kind);
                self.deliver(&mut replies);
                self.replies = replies;
            }
            ClientFrame::Renew {
                id,
                key,
                token,
                lease_ms,
            } => {
                let lease_ms =
                    lease_ms.min(NonZeroU64::new(limits.max_lease_ms).unwrap_or(NonZeroU64::MIN));
                let kind = match self.table.renew(self.now, conn, key, token, lease_ms) {
                    Renewal::Renewed => AnswerKind::Renewed { token, lease_ms },
                    Renewal::Reclaimed => {
                        self.stats.reclaims += 1;
                        AnswerKind::Renewed { token, lease_ms }
                    }
                    Renewal::Gone => AnswerKind::Gone,
                };
                self.answer_at_once(conn, version, id, key, kind);
            }
            ClientFrame::Hello { .. } => return Err(Farewell::Error(Reason::DuplicateHello)),
        }
        Ok(())
    }

    /// Queues `frame` for `conn`.
    fn write(&mut self, conn: ConnId, frame: &ServerFrame<'_>) {
        frame.encode(self.output(conn));
    }

    /// The buffer to write `conn`'s next frames into, its flush queued.
    fn output(&mut self, conn: ConnId) -> &mut BytesMut {
        let out = self.outbox.entry(conn).or_default();
        if !out.queued {
            out.queued = true;
            self.pending.push_back(Pending::Flush(conn));
        }
        &mut out.buf
    }

    /// Ends `conn`: says `farewell` if any, forgets the connection, drops its
    /// waiting acquires (rule 5), and queues the close.
    fn close(&mut self, conn: ConnId, farewell: Option<Farewell>) {
        if !self.conns.contains_key(&conn) {
            return;
        }
        match farewell {
            Some(Farewell::Moved(leader)) => self.write(
                conn,
                &ServerFrame::Moved {
                    addr: leader.to_wire(),
                },
            ),
            Some(Farewell::Error(reason)) => {
                let reason = Atom::new(reason.as_str()).expect("reasons are atoms");
                self.write(conn, &ServerFrame::Error { reason });
            }
            None => {}
        }
        self.forget(conn);
        self.outbox.entry(conn).or_default();
        self.pending.push_back(Pending::Close(conn));
    }

    /// Forgets `conn`, its handshake deadline and its waiting acquires
    /// (rule 5); `false` if it was not open.
    fn forget(&mut self, conn: ConnId) -> bool {
        let Some(c) = self.conns.remove(&conn) else {
            return false;
        };
        if let Phase::Hello { deadline } = c.phase {
            self.hellos.remove(&(deadline, conn));
        }
        self.table.drop_conn(conn);
        true
    }

    /// Closes, after `E not_active`, every connection with an acquire
    /// waiting in the table.
    fn close_waiting_connections(&mut self) {
        let waiting: Vec<ConnId> = self
            .conns
            .keys()
            .copied()
            .filter(|&conn| self.table.has_waiters(conn))
            .collect();
        for conn in waiting {
            self.close(conn, Some(Farewell::Error(Reason::NotActive)));
        }
    }
}

impl core::fmt::Debug for Server {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Server")
            .field("node", &self.config.node_id)
            .field("role", &self.role)
            .field("now", &self.now)
            .field("connections", &self.conns.len())
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
