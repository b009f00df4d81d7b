//! The client core: every rule of PROTOCOL.md section 5, sans-IO.
//!
//! The rule files read as their parts of section 5. They keep what they
//! know in the containers of `store.rs` and never look inside them.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Client`]: the driver contract, time and timers, finishing a shutdown |
//! | `operations.rs` | the operations: acquire, release, cancel, undeliverable grants, shutdown; what their deadlines mean |
//! | `matching.rs` | answers: matched by id, op and key; grants, `T`, `D`, `N`, `B` retries; answers nobody claims |
//! | `lane.rs` | the release lane, the reserved slots, the window, sending |
//! | `link.rs` | `Link`, which owns where and when to connect (rounds, hints, stale addresses, backoff, timeouts, misconfiguration); the handshake, `M` and `E`, any close |
//! | `renewal.rs` | renewal: when, in the lane, `G` and `N` to an `X`, jeopardy, expiry, stopping |
//! | `stats.rs` | the counters read with [`Client::stats`] |
//! | `store.rs` | storage: slabs with one timer per entry, queues, requests in flight |
//! | `outcome.rs`, `config.rs` | what the core hands out; its configuration |
//!
//! # Where each rule of section 5 lives
//!
//! | situation (PROTOCOL.md section 5) | where |
//! |---|---|
//! | matching an answer; the same (op, key) several times in flight | `Client::on_answer` |
//! | when to register | `Client::send_acquire`, `Client::send_release` |
//! | `G` / `T` / `D` / `N` matched | `Client::on_acquire_answer`, `Client::grant`, `Client::on_release_answer` |
//! | `B` matched | `Client::on_busy`, `Client::busy_retry_at` |
//! | the client's own capacity is full | `Client::submit_acquire`, `Client::submit_release` |
//! | `L addr`, `M addr` | `Client::on_frame`, `Client::take_hint`; the round goes on with the hint: `Link::next_address` |
//! | `E no_leader`, `E not_active`, `E auth_failed`, `E unsupported_version` | `Client::on_frame`, `Client::close`, `Link::ended` |
//! | a round refused by every address: *misconfigured* | `Round::misconfigures`, `Link::misconfigured`, `Client::end_unsendable_acquires`, `Client::submit_acquire` |
//! | other `E`, unknown kind, bad pairing, framing error, over-long line | `Client::read` |
//! | an id no pending request holds, a second answer | `Client::on_answer`, `Client::stray_answer` |
//! | an id pending with another op or key | `Client::on_answer` |
//! | the transport ends or fails | [`Client::handle_transport_closed`] |
//! | any close | `Client::close`, `Client::settle_on_close` |
//! | cancel before and after bytes went out; `KeepWaiter` | `Client::cancel_op`, `Client::abandon_waiter` |
//! | a sent acquire past `sent_at + wait_ms + answer_grace` | `Client::fire_acquire` |
//! | an acquire not yet sent, and why it could not be | `Client::submit_acquire`, `Client::fire_acquire`, `Client::unsent_outcome`, `Link::last_end`, `Client::send_acquire` |
//! | a Granted outcome the embedder cannot take | `Client::hand_back` |
//! | never asking again whether an Indeterminate acquire holds | `Client::settle_on_close` |
//! | the Indeterminate bound | `Client::settles_by` |
//! | releases before acquires; `window - reserved` acquires at most | `Client::fill_window`, `Client::acquire_limit` |
//! | a release in flight at a close is sent again, bounded | `Client::requeue_release` |
//! | a release ignores cancellation | `Client::cancel_op` |
//! | shutting down with a budget | `Client::start_shutdown`, `Client::check_shutdown`, `Client::finish_shutdown` |
//! | a release's outcomes, the accepted boundary | `Client::end_release`, [`Outcome::Lapsed`] |
//! | endpoints, allowlist | `Config::allows`, `Client::take_hint` |
//! | rounds: where the next attempt goes, at once inside a round | `Link::next_address`, `Link::ended`, `Client::connect` |
//! | stale hints | `Link::is_stale`, `Link::ended` |
//! | backoff between rounds, by the round's cause | `Link::ended`, `Round::cause`, `Link::delay` |
//! | a held lease shortens the wait and the timeouts | `Client::lease_cap`, `Held::keeps_renewing`, `Link::delay`, `Client::capped` |
//! | only `W` resets the count; the first step after a connection that had its `W` | `Link::welcomed`, `Link::ended` |
//! | forgetting the hint | `Link::forget_hint_after` |
//! | a sent release past its answer grace | `Client::fire_hold` |
//! | a second `W`, an answer before `W` | `Client::on_frame` |
//! | a `waited_ms` missing or above the `wait_ms` asked | `Client::on_acquire_answer` |
//! | *Renewal*: who renews | [`Client::renew`], [`Client::auto_renew`], [`Client::acquire_renewing`], `Client::submit_renew`, `Client::set_auto_renew` |
//! | *Renewal*: when; jeopardy; expiry | `Client::tend`, `Held::renew_at`, `Held::jeopardy_at`, `Client::fire_hold` |
//! | *Renewal*: in the lane, one in flight per grant | `Client::fill_window`, `Client::send_renewal` |
//! | *Renewal*: `G` and `N` to an `X` | `Client::on_renewal_answer`, `Client::lose` |
//! | *Renewal*: a close, no answer | `Client::requeue_renewal`, `Client::fire_hold` |
//! | *Renewal*: stopping | [`Client::stop_renewing`], `Client::queue_release`, `Client::stop_renewals` |

mod config;
mod lane;
mod link;
mod matching;
mod operations;
mod outcome;
mod renewal;
mod stats;
mod store;

use core::time::Duration;
use std::collections::VecDeque;

pub use config::{Backoff, Backoffs, BusyPolicy, CancelPolicy, Config, ConfigError};
pub use outcome::{
    Action, BackoffCause, CloseReason, ConnId, Error, Event, Grant, InFlight, OpId, OpenOperations,
    Outcome, ReleaseResult, TransportEnd, Violation,
};
pub use stats::{
    AcquireOutcomes, BackoffCounts, ClientStats, CloseCounts, Histogram, IndeterminateCauses,
    ReleaseOutcomes, RenewalCounts,
};

use self::link::{Link, LinkState, Phase};
use self::operations::{Acquire, Held, Hold};
use self::outcome::{Issuer, OpKind};
use self::stats::Told;
use self::store::{Fifo, Handle, Pending, SendBuffer, Slab};
use crate::hash::IdMap;
use crate::names::{Endpoint, Key, Name};
use crate::rng::Rng;
use crate::time::Time;
use crate::wire::LineReader;

/// A request in flight: which operation's attempt it is. The pending
/// table keeps it as that operation's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    Acquire(Handle),
    Release(Handle),
    /// A renewal of the held grant `Handle`.
    Renew(Handle),
}

impl Request {
    /// The operation the request is an attempt of.
    fn op(self) -> OpId {
        match self {
            Request::Acquire(handle) => OpId::of(OpKind::Acquire, handle),
            Request::Release(handle) => OpId::of(OpKind::Release, handle),
            Request::Renew(handle) => OpId::of(OpKind::Grant, handle),
        }
    }

    /// The request whose operation is `op` (one the pending table holds).
    fn of(op: OpId) -> Request {
        match op.parts() {
            Some((OpKind::Acquire, handle)) => Request::Acquire(handle),
            Some((OpKind::Release, handle)) => Request::Release(handle),
            Some((OpKind::Grant, handle)) => Request::Renew(handle),
            None => unreachable!("only requests are in flight"),
        }
    }
}

/// What a due timer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    Acquire,
    Hold,
    Link,
    Shutdown,
}

/// The Ticketing client: a deterministic state machine with no I/O, no
/// clock and no threads.
///
/// # The driver contract
///
/// The core is driven by three kinds of calls, and it never does anything
/// on its own:
///
/// * **Commands** start or change operations, and return at once:
///   [`acquire`](Client::acquire), [`release`](Client::release),
///   [`release_token`](Client::release_token),
///   [`cancel`](Client::cancel), [`undeliverable`](Client::undeliverable),
///   [`shutdown`](Client::shutdown). A command that is misuse, or that the
///   client's own capacity cannot take, is refused with an [`Error`] and
///   changes nothing.
/// * **Inputs** report what happened in the world, each with the current
///   time: [`handle_connected`](Client::handle_connected),
///   [`handle_connect_failed`](Client::handle_connect_failed),
///   [`handle_bytes`](Client::handle_bytes),
///   [`handle_transport_closed`](Client::handle_transport_closed) and
///   [`handle_timeout`](Client::handle_timeout). Inputs about a connection
///   the core has already closed are ignored.
/// * **Outputs** are drained, after any command or input, until they return
///   `None`, in this order:
///   1. [`poll_action`](Client::poll_action): connect, send, close, in the
///      order given. The requests in a [`Action::Send`] count as sent the
///      moment it is returned, so write its bytes promptly and in order.
///   2. [`poll_event`](Client::poll_event): outcomes of operations and
///      notices.
///   3. [`poll_timeout`](Client::poll_timeout): when to call
///      [`handle_timeout`](Client::handle_timeout) if nothing else happens
///      first. It returns the time of the latest input while outputs are
///      still queued, so a driver that only watches it cannot stall.
///
/// Time is a [`Time`] passed in with every command and input; it must not go
/// backwards (an earlier time is taken as the latest one seen). All
/// randomness comes from [`Config::seed`]. The same calls with the same
/// times produce the same actions, byte for byte.
///
/// Every command and input first fires the timers that are due at its
/// time, in deadline order, as if `handle_timeout` had been called at each;
/// so a late driver sees the same result as a punctual one, only later.
///
/// # Example: a run loop
///
/// A driver over an in-memory "server" that accepts the handshake and
/// grants every acquire (protocol version 2: a grant says how long it
/// waited). The crate's documentation drives a client against
/// the real server core; the adapters do the same with sockets and a clock.
///
/// ```
/// use std::time::Duration;
/// use ticketing::client::{Action, Client, Config, Event, Outcome};
/// use ticketing::{Endpoint, Key, Name, Time};
///
/// let config = Config::new([Endpoint::new("127.0.0.1:7878")?], Name::new("demo")?);
/// let mut now = Time::ZERO;
/// let mut client = Client::new(config, now)?;
/// let op = client.acquire(now, Key::new("printer")?, Name::new("me")?,
///                         Duration::from_secs(1), Duration::from_secs(30))?;
///
/// let mut to_client: Vec<u8> = Vec::new(); // bytes "on the wire" to the client
/// let mut granted = None;
/// while granted.is_none() {
///     // 1. Actions: connect, send, close.
///     while let Some(action) = client.poll_action() {
///         match action {
///             Action::Connect { conn, .. } => client.handle_connected(now, conn),
///             Action::Send { data, .. } => {
///                 // The toy server: W after H, G for every A.
///                 for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
///                     let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
///                     match fields[0] {
///                         b"H" => to_client.extend_from_slice(b"W node-1 16\n"),
///                         b"A" => {
///                             let (id, key) = (fields[1], fields[2]);
///                             // Token 1, lease 30000 ms, waited 0 ms.
///                             to_client.extend_from_slice(&[b"G ", id, b" A ", key, b" 1 30000 0\n"].concat());
///                         }
///                         _ => {}
///                     }
///                 }
///             }
///             Action::Close { .. } => {}
///             _ => {}
///         }
///     }
///     // 2. Events: outcomes and notices.
///     while let Some(event) = client.poll_event() {
///         if let Event::Outcome { op: done, outcome } = event {
///             assert_eq!(done, op);
///             match outcome {
///                 Outcome::Granted(grant) => granted = Some(grant),
///                 other => panic!("not granted: {other:?}"),
///             }
///         }
///     }
///     // 3. Wait for input or the next deadline, then hand it in.
///     if !to_client.is_empty() {
///         let conn = client.connection().expect("connected");
///         client.handle_bytes(now, conn, &std::mem::take(&mut to_client));
///     } else if let Some(deadline) = client.poll_timeout() {
///         now = now.max(deadline);
///         client.handle_timeout(now);
///     }
/// }
/// let grant = granted.unwrap();
/// assert_eq!((grant.key().as_str(), grant.token()), ("printer", 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Client {
    config: Config,
    now: Time,
    rng: Rng,
    /// What the grants this client issues carry, so that it knows them.
    issuer: Issuer,
    /// Acquire operations, and abandoned waiters.
    acquires: Slab<Acquire>,
    /// Grants the embedder holds, and releases (the embedder's, and the
    /// client's own for orphaned grants).
    holds: Slab<Hold>,
    /// The requests in flight on the connection: the operation whose
    /// attempt each is.
    pending: Pending<OpId>,
    /// Acquires waiting to be sent.
    queue: Fifo,
    /// The release lane: releases waiting to be sent.
    lane: Fifo,
    /// Renewals waiting to be sent, after releases and before acquires.
    renewals: Fifo,
    /// Acquires that asked for automatic renewal of their grant, and for
    /// how long at most.
    renew_on_grant: IdMap<Handle, Duration>,
    /// The id of the next request.
    next_id: u64,
    /// Acquires among the requests in flight.
    acquires_in_flight: usize,
    /// Acquire operations that have not ended.
    open_acquires: usize,
    /// The embedder's releases that have not ended.
    open_releases: usize,
    link: Link,
    actions: VecDeque<Action>,
    /// The events for the embedder, and the counters.
    events: Told,
    /// Requests encoded and not yet handed out.
    out: SendBuffer,
    reader: LineReader,
    /// The shutdown deadline, once shutting down.
    shutdown: Option<Time>,
    /// The shutdown is ending: no reconnect, every release lapses.
    finishing: bool,
}

impl Client {
    /// Makes a client. It wants to connect at once: the first
    /// [`poll_action`](Client::poll_action) is an [`Action::Connect`].
    ///
    /// A configuration with a value outside its field's documented range is
    /// refused with a [`ConfigError`] naming the field.
    pub fn new(config: Config, now: Time) -> Result<Client, ConfigError> {
        config.validate()?;
        let link = Link::new(config.endpoints.len());
        let mut client = Client {
            rng: Rng::new(config.seed),
            config,
            now,
            issuer: Issuer::new(),
            acquires: Slab::default(),
            holds: Slab::default(),
            pending: Pending::default(),
            queue: Fifo::default(),
            lane: Fifo::default(),
            renewals: Fifo::default(),
            renew_on_grant: IdMap::default(),
            next_id: 1,
            acquires_in_flight: 0,
            open_acquires: 0,
            open_releases: 0,
            link,
            actions: VecDeque::new(),
            events: Told::default(),
            out: SendBuffer::default(),
            reader: LineReader::new(),
            shutdown: None,
            finishing: false,
        };
        client.connect();
        Ok(client)
    }

    /// What every command and input does around its own work: fire the
    /// timers due by `now`, then finish a shutdown whose work is done.
    fn step<R>(&mut self, now: Time, work: impl FnOnce(&mut Client) -> R) -> R {
        self.advance(now);
        let result = work(self);
        self.check_shutdown();
        result
    }

    // ----- commands -------------------------------------------------------

    /// Asks for `key` for `lease`, waiting at most `wait` for its turn in
    /// total, across every attempt (`Duration::ZERO`: try once). The
    /// outcome comes as [`Event::Outcome`] with the returned id.
    ///
    /// Until a connection can take it, the acquire waits at most
    /// `max(wait, queue_grace)`, then ends `TimedOut { sent: false }`.
    pub fn acquire(
        &mut self,
        now: Time,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> Result<OpId, Error> {
        self.step(now, |client| {
            client.submit_acquire(key, owner, wait, lease, None)
        })
    }

    /// As [`acquire`](Client::acquire), and the grant, once granted, is
    /// renewed automatically (PROTOCOL.md section 5, "Renewal") for at
    /// most `limit` from then (`None`: until released).
    ///
    /// An automatically renewed grant is renewed, asking for `lease`,
    /// whenever less than two thirds of its lease is left: [`Event::Renewed`]
    /// says how long it is good for now; [`Event::LeaseJeopardy`] that
    /// renewals have gone unanswered for a third of a lease;
    /// [`Event::LeaseLost`] that the server no longer has it;
    /// [`Event::LeaseExpired`] that its `valid_until` has passed.
    pub fn acquire_renewing(
        &mut self,
        now: Time,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        limit: Option<Duration>,
    ) -> Result<OpId, Error> {
        let limit = limit.unwrap_or(Duration::MAX);
        self.step(now, |client| {
            client.submit_acquire(key, owner, wait, lease, Some(limit))
        })
    }

    /// Renews a held grant once, by its exact token, asking for `lease`
    /// (`None`: its acquire's lease). At most one renewal of a grant is in
    /// flight: with one already asked for, this changes nothing. Refused for
    /// a grant this client does not hold ([`Error::GrantNotHeld`]), one
    /// another client issued, one whose `valid_until` has passed
    /// ([`Error::LeaseExpired`]), and while shutting down.
    pub fn renew(
        &mut self,
        now: Time,
        grant: &Grant,
        lease: Option<Duration>,
    ) -> Result<(), Error> {
        self.step(now, |client| client.submit_renew(grant, lease))
    }

    /// Starts renewing a held grant automatically, for at most `limit` from
    /// now (`None`: until released); see
    /// [`acquire_renewing`](Client::acquire_renewing). Refused as
    /// [`renew`](Client::renew) is.
    pub fn auto_renew(
        &mut self,
        now: Time,
        grant: &Grant,
        limit: Option<Duration>,
    ) -> Result<(), Error> {
        self.step(now, |client| client.set_auto_renew(grant, true, limit))
    }

    /// Stops renewing a held grant automatically (a renewal already in
    /// flight is still answered). It then runs out at its `valid_until`
    /// unless renewed or released.
    pub fn stop_renewing(&mut self, now: Time, grant: &Grant) -> Result<(), Error> {
        self.step(now, |client| client.set_auto_renew(grant, false, None))
    }

    /// The client's counters: totals since it was made (operations by
    /// outcome, Indeterminate by cause, orphan releases, renewals,
    /// connections, closes by reason, backoffs by cause, two histograms),
    /// and what is open now. Cheap enough to call every second; it counts
    /// the held grants.
    pub fn stats(&self) -> ClientStats {
        let mut stats = self.events.stats.clone();
        stats.in_flight = self.pending.len() as u64;
        stats.acquires_in_flight = self.acquires_in_flight as u64;
        stats.acquires_queued = self.queue.len() as u64;
        stats.releases_queued = self.lane.len() as u64;
        stats.renewals_queued = self.renewals.len() as u64;
        stats.acquires_open = self.open_acquires as u64;
        stats.releases_open = self.open_releases as u64;
        stats.held = self
            .holds
            .iter()
            .filter(|(_, hold)| hold.held().is_some())
            .count() as u64;
        stats
    }

    /// Until when the holder may count on `grant` now, renewals included:
    /// `None` once this client no longer holds it (released, handed back,
    /// lost, or issued by another client). It may lie in the past: an
    /// expired grant is still the holder's to release.
    pub fn valid_until(&self, grant: &Grant) -> Option<Time> {
        self.current_valid_until(grant)
    }

    /// Releases a grant this client handed out, by its exact token. The
    /// release is retried on later connections until its answer comes, until
    /// [`Grant::expires_by`] (after which the server has freed the grant
    /// itself), or until [`Config::release_attempts`]: then it ends
    /// [`Outcome::Lapsed`].
    ///
    /// Releasing a grant twice, or one handed back with
    /// [`undeliverable`](Client::undeliverable), is refused with
    /// [`Error::GrantNotHeld`]; a grant another client issued, with
    /// [`Error::ForeignGrant`]. A grant past its `expires_by` ends `Lapsed`
    /// at once: the server has already freed it.
    pub fn release(&mut self, now: Time, grant: &Grant) -> Result<OpId, Error> {
        self.step(now, |client| client.submit_release(grant))
    }

    /// Releases a raw `(key, token)` whose lease this client never saw (a
    /// grant from an earlier process, say). It keeps trying until
    /// [`Config::release_horizon`] from now.
    pub fn release_token(&mut self, now: Time, key: Key, token: u64) -> Result<OpId, Error> {
        self.step(now, |client| client.submit_release_token(key, token))
    }

    /// Cancels an operation.
    ///
    /// * An acquire none of whose bytes were handed out ends
    ///   [`Outcome::Cancelled`]: nothing was asked.
    /// * An acquire in flight ends [`Outcome::Indeterminate`]. Under
    ///   [`CancelPolicy::Close`] the connection is closed (every acquire in
    ///   flight on it ends Indeterminate too); under
    ///   [`CancelPolicy::KeepWaiter`] its answer is still claimed and a grant
    ///   it brings is released by exact token.
    /// * A release ignores cancellation: it is always settled.
    ///
    /// An operation that has already ended is [`Error::UnknownOperation`];
    /// if its outcome was a grant the caller can no longer deliver, hand the
    /// grant to [`undeliverable`](Client::undeliverable).
    pub fn cancel(&mut self, now: Time, op: OpId) -> Result<(), Error> {
        self.step(now, |client| client.cancel_op(op))
    }

    /// Hands back a grant whose [`Outcome::Granted`] could not be delivered
    /// (its waiter is gone): the client releases it by its exact token and
    /// reports [`Event::OrphanRelease`], then [`Event::OrphanSettled`].
    ///
    /// A grant already released or handed back is [`Error::GrantNotHeld`];
    /// one past its [`Grant::expires_by`] needs nothing and is accepted. A
    /// grant another client issued is [`Error::ForeignGrant`].
    pub fn undeliverable(&mut self, now: Time, grant: &Grant) -> Result<(), Error> {
        self.step(now, |client| client.hand_back(grant))
    }

    /// Shuts down within `budget`: new acquires are refused; queued acquires
    /// end Cancelled; acquires in flight are cancelled under the cancel
    /// policy; the release lane (including releases of grants that still
    /// arrive) drains; then the connection closes, every operation still
    /// open gets its outcome (releases `Lapsed`) and
    /// [`Event::ShutdownComplete`] is the last event. Grants the embedder
    /// still holds are not released behind its back.
    pub fn shutdown(&mut self, now: Time, budget: Duration) -> Result<(), Error> {
        self.step(now, |client| client.start_shutdown(budget))
    }

    // ----- inputs ---------------------------------------------------------

    /// The transport of `conn` is connected: the handshake starts.
    pub fn handle_connected(&mut self, now: Time, conn: ConnId) {
        self.step(now, |client| {
            if matches!(client.link.current(conn), Some(Phase::Connecting { .. })) {
                client.on_connected();
            }
        });
    }

    /// Connecting `conn` failed. The client backs off, and forgets the
    /// leader hint if that is where it was connecting.
    pub fn handle_connect_failed(&mut self, now: Time, conn: ConnId) {
        self.step(now, |client| match client.link.current(conn) {
            Some(Phase::Connecting { .. }) => client.close(CloseReason::ConnectFailed),
            Some(_) => client.close(CloseReason::Io),
            None => {}
        });
    }

    /// The TLS handshake of the connect attempt `conn` failed, for the
    /// reason `detail` (closed as [`CloseReason::Tls`]): the client backs
    /// off as for a failed connect, and forgets the leader hint if that is
    /// where it was connecting.
    pub fn handle_tls_failed(&mut self, now: Time, conn: ConnId, detail: Name) {
        self.step(now, |client| match client.link.current(conn) {
            Some(Phase::Connecting { .. }) => client.close(CloseReason::Tls(detail)),
            Some(_) => client.close(CloseReason::Io),
            None => {}
        });
    }

    /// Bytes arrived on `conn`, in any chunking. Every frame in them is
    /// handled in order, until one closes the connection; the rest of the
    /// bytes are then ignored.
    pub fn handle_bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) {
        self.step(now, |client| {
            if matches!(
                client.link.current(conn),
                Some(Phase::Handshaking { .. } | Phase::Ready { .. })
            ) {
                client.read(conn, data);
            }
        });
    }

    /// The transport of `conn` ended (end of stream, or an error).
    pub fn handle_transport_closed(&mut self, now: Time, conn: ConnId, end: TransportEnd) {
        self.step(now, |client| {
            if client.link.current(conn).is_some() {
                client.close(match end {
                    TransportEnd::Eof => CloseReason::Eof,
                    TransportEnd::Error => CloseReason::Io,
                });
            }
        });
    }

    /// Time passed: fires every timer due at or before `now`. Calling it
    /// early, or more often than needed, is harmless.
    pub fn handle_timeout(&mut self, now: Time) {
        self.step(now, |_| {});
    }

    // ----- outputs --------------------------------------------------------

    /// The next thing the driver must do: connect, send or close.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        if let Some(action) = self.actions.pop_front() {
            return Some(action);
        }
        let LinkState::Up { conn, phase } = &self.link.state else {
            return None;
        };
        let conn = conn.id;
        match *phase {
            Phase::Handshaking { .. } => self.fill_hello(),
            Phase::Ready { window, .. } => self.fill_window(window),
            Phase::Connecting { .. } => return None,
        }
        self.take_send(conn)
    }

    /// The next outcome or notice for the embedder.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When the driver must call [`handle_timeout`](Client::handle_timeout)
    /// at the latest: the earliest deadline, or the time of the latest input
    /// while outputs are queued. `None` when no deadline is pending: the
    /// client is idle on a ready connection (it waits for input), or it has
    /// shut down ([`is_finished`](Client::is_finished)) and everything is
    /// drained. `None` is not a reason to stop driving an unfinished client.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        if !self.actions.is_empty() || !self.events.is_empty() || self.can_send() {
            return Some(self.now);
        }
        self.next_timer().map(|(at, _)| at)
    }

    // ----- introspection --------------------------------------------------

    /// The connection the core is using or opening, if any.
    pub fn connection(&self) -> Option<ConnId> {
        match &self.link.state {
            LinkState::Up { conn, .. } => Some(conn.id),
            _ => None,
        }
    }

    /// The window of the current connection, once `W` arrived.
    pub fn window(&self) -> Option<u64> {
        match &self.link.state {
            LinkState::Up {
                phase: Phase::Ready { window, .. },
                ..
            } => Some(*window),
            _ => None,
        }
    }

    /// The node id of the current connection, once `W` arrived.
    pub fn node(&self) -> Option<&Name> {
        match &self.link.state {
            LinkState::Up {
                phase: Phase::Ready { node, .. },
                ..
            } => Some(node),
            _ => None,
        }
    }

    /// The leader hint in use, if any.
    pub fn leader_hint(&self) -> Option<&Endpoint> {
        self.link.hint.as_ref()
    }

    /// Requests unanswered on the current connection: all of them, and the
    /// acquires among them.
    pub fn in_flight(&self) -> InFlight {
        InFlight {
            requests: self.pending.len(),
            acquires: self.acquires_in_flight,
        }
    }

    /// Operations open: acquires, and the embedder's releases.
    pub fn open_operations(&self) -> OpenOperations {
        OpenOperations {
            acquires: self.open_acquires,
            releases: self.open_releases,
        }
    }

    /// Whether the client has shut down for good.
    pub fn is_finished(&self) -> bool {
        matches!(self.link.state, LinkState::Finished)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The latest time the core has seen.
    pub fn now(&self) -> Time {
        self.now
    }

    // ----- time -----------------------------------------------------------

    /// The earliest deadline, and what it belongs to. Deadlines that tie
    /// come in the order of [`Due`].
    fn next_timer(&self) -> Option<(Time, Due)> {
        let shutdown = self.shutdown.filter(|_| !self.is_finished());
        let mut next: Option<(Time, Due)> = None;
        for (at, due) in [
            (self.acquires.next_deadline(), Due::Acquire),
            (self.holds.next_deadline(), Due::Hold),
            (self.link.deadline(), Due::Link),
            (shutdown, Due::Shutdown),
        ] {
            if let Some(at) = at {
                if next.map_or(true, |(earliest, _)| at < earliest) {
                    next = Some((at, due));
                }
            }
        }
        next
    }

    /// The earliest timer due at or before `target`, if one is: what
    /// [`Client::next_timer`] gives, when it is due, found without ordering
    /// the timers when none is.
    #[inline]
    fn next_due(&mut self, target: Time) -> Option<(Time, Due)> {
        let due = |at: Option<Time>| at.is_some_and(|at| at <= target);
        let any = self.acquires.due_by(target)
            | self.holds.due_by(target)
            | due(self.link.deadline())
            | due(self.shutdown);
        match any {
            true => self.next_timer().filter(|&(at, _)| at <= target),
            false => None,
        }
    }

    /// Fires everything due at or before `now`, in deadline order, each at
    /// its own time.
    fn advance(&mut self, now: Time) {
        let target = now.max(self.now);
        while let Some((at, due)) = self.next_due(target) {
            self.now = self.now.max(at);
            match due {
                Due::Acquire => {
                    let acquire = self.acquires.pop_due(at).expect("due");
                    self.fire_acquire(acquire);
                }
                Due::Hold => {
                    let hold = self.holds.pop_due(at).expect("due");
                    self.fire_hold(hold);
                }
                Due::Link => self.fire_link(),
                Due::Shutdown => self.finish_shutdown(),
            }
            self.check_shutdown();
        }
        self.now = target;
    }

    // ----- shutting down --------------------------------------------------

    /// Finishes a shutdown whose work is done, or whose budget is spent.
    fn check_shutdown(&mut self) {
        // Also when the budget is already spent (a zero budget): its
        // deadline is due now, and a command fires no timer by itself.
        if let Some(deadline) = self.shutdown {
            if !self.is_finished() && (!self.has_work_to_drain() || self.now >= deadline) {
                self.finish_shutdown();
            }
        }
    }

    /// Whether a shutting-down client still needs a connection.
    fn has_work_to_drain(&self) -> bool {
        self.lane.len() > 0 || self.pending.len() > 0
    }

    /// Ends the shutdown, drained or not: closes, lapses every release still
    /// open, forgets held grants, and stops.
    fn finish_shutdown(&mut self) {
        self.finishing = true;
        self.close(CloseReason::Shutdown);
        for hold in self.holds.handles() {
            match self.holds.get(hold) {
                Some(Hold::Release(_)) => self.end_release(hold, ReleaseResult::Lapsed),
                // Not released behind the embedder's back.
                _ => drop(self.holds.remove(hold)),
            }
        }
        for acquire in self.acquires.handles() {
            // Acquires end when the shutdown starts or at the close; should
            // one remain, it was never handed out.
            self.end_acquire(acquire, Outcome::Cancelled);
        }
        self.link.state = LinkState::Finished;
        self.events.push_back(Event::ShutdownComplete);
    }

    /// Queues the outcome of an operation.
    fn emit(&mut self, op: OpId, outcome: Outcome) {
        self.events.push_back(Event::Outcome { op, outcome });
    }
}

impl core::fmt::Debug for Client {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Client")
            .field("now", &self.now)
            .field("connection", &self.connection())
            .field("window", &self.window())
            .field("in_flight", &self.in_flight())
            .field("open", &self.open_operations())
            .field("queued", &(self.queue.len(), self.lane.len()))
            .finish_non_exhaustive()
    }
}
