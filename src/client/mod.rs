//! The client core: every rule of PROTOCOL.md section 5, sans-IO.
//!
//! [`Client`] is a router over four parts, each a type that owns its state
//! and is told the time, the configuration and where its effects go (an
//! `Fx`: actions, events, the send buffer, and a request to close). No
//! part reads another's fields: the client routes each input to the part
//! it is for, looks an answer's id up, hands the answer to the part that
//! sent it, and folds the parts' deadlines.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Client`]: the driver contract, routing, time, the window, closing, shutting down |
//! | `link.rs` | the connection: where and when to connect (rounds, hints, stale addresses, backoff, timeouts), the handshake and window, `L`, `M`, `E`, misconfiguration |
//! | `pending.rs` | the requests in flight, by id, each with what its answer must match |
//! | `acquires.rs` | the acquires: queue, wait budget, `B` retries, cancel and abandon, their outcomes |
//! | `holds.rs` | the grants held: renewal, jeopardy, expiry; releases and the release lane; orphans |
//! | `stats.rs` | the counters read with [`Client::stats`] |
//! | `store.rs` | storage: tables of records with one timer each, queues, the send buffer |
//! | `outcome.rs`, `config.rs` | what the core hands out; its configuration |
//!
//! # Where each rule of section 5 lives
//!
//! | situation (PROTOCOL.md section 5) | where |
//! |---|---|
//! | matching an answer; the same (op, key) several times in flight | `Pending::claim`, `Expected::refuses`, what each owner expects: `Acquires::expected`, `Holds::release_expected`, a renewal's in `Pending` |
//! | when to register | `Client::fill_window`, `Pending::register` |
//! | `G` / `T` / `D` / `N` matched | `Client::on_answer`, `Acquires::granted`, `Holds::hold`, `Holds::release_answer` |
//! | a `waited_ms` missing or above the `wait_ms` asked | `Expected::refuses` |
//! | `B` matched | `Acquires::busy` |
//! | the client's own capacity is full | `Acquires::submit`, `Holds::release`, `Holds::release_token` |
//! | `L addr`, `M addr` | `Link::notice`, `Link::take_hint`; the round goes on with the hint: `Link::next_address` |
//! | `E no_leader`, `E not_active`, `E auth_failed`, `E unsupported_version` | `Link::notice`, `Link::after_close`, `Link::ended` |
//! | a round refused by every address: *misconfigured* | `Round::misconfigures`, `Link::after_close`, `Acquires::refused`, `Acquires::submit` |
//! | other `E`, unknown kind, bad pairing, framing error, over-long line | `Client::read`, `Link::notice` |
//! | an id no pending request holds, a second answer; an id pending with another op or key | `Pending::claim`, `Client::stray_answer` |
//! | the transport ends or fails | [`Client::handle_transport_closed`] |
//! | any close | `Client::close`, `Client::settle` |
//! | cancel before and after bytes went out; `KeepWaiter` | `Client::cancel_op`, `Acquires::cancel`, `Acquires::abandon`, `Pending::abandon` |
//! | a sent acquire past `sent_at + wait_ms + answer_grace` | `Acquires::fire` |
//! | an acquire not yet sent, and why it could not be | `Acquires::submit`, `Acquires::fire`, `Acquires::unsent`, `Link::last_end` |
//! | giving up while unreachable (*added*, off by default) | `Link::unreachable`, `Link::after_close`, `Acquires::submit`, `Acquires::unreachable` |
//! | a Granted outcome the embedder cannot take | `Holds::undeliverable` |
//! | never asking again whether an Indeterminate acquire holds | `Acquires::in_doubt` |
//! | the Indeterminate bound | `Acquire::settles_by` |
//! | releases before acquires; `window - reserved` acquires at most | `Client::fill_window` |
//! | a release in flight at a close is sent again, bounded | `Holds::requeue_release` |
//! | a release ignores cancellation | `Client::cancel_op` |
//! | shutting down with a budget | `Client::start_shutdown`, `Client::check_shutdown`, `Client::finish_shutdown` |
//! | a release's outcomes, the accepted boundary | `Holds::end_release`, [`Outcome::Lapsed`] |
//! | endpoints, allowlist | `Config::allows`, `Link::take_hint` |
//! | rounds: where the next attempt goes, at once inside a round | `Link::next_address`, `Link::ended`, `Link::connect` |
//! | stale hints | `Link::is_stale`, `Link::ended` |
//! | backoff between rounds, by the round's cause | `Link::ended`, `Round::cause`, `Link::delay` |
//! | a held lease shortens the wait and the timeouts | `Holds::lease_cap`, `Held::keeps_renewing`, `Link::delay`, `Link::connect`, `Link::connected` |
//! | only `W` resets the count; the first step after a connection that had its `W` | `Link::welcomed`, `Link::ended` |
//! | forgetting the hint | `Link::forget_hint_after` |
//! | a sent release past its answer grace | `Holds::fire` |
//! | a second `W`, an answer before `W` | `Link::notice` |
//! | *Renewal*: who renews | [`Client::renew`], [`Client::auto_renew`], [`Client::acquire_renewing`], `Holds::renew`, `Holds::auto_renew` |
//! | *Renewal*: when; jeopardy; expiry | `Held::tend`, `Held::renew_at`, `Held::jeopardy_at`, `Holds::tend` |
//! | *Renewal*: in the lane, one in flight per grant | `Client::fill_window`, `Holds::send_renewal` |
//! | *Renewal*: `G` and `N` to an `X` | `Holds::renewal_answer`, `Holds::lose` |
//! | *Renewal*: a close, no answer | `Holds::requeue_renewal`, `Held::tend` |
//! | *Renewal*: stopping | [`Client::stop_renewing`], `Holds::release`, `Holds::stop_renewals` |

mod acquires;
mod config;
#[cfg(test)]
mod harness;
mod holds;
mod link;
mod outcome;
mod pending;
mod stats;
mod store;

use core::mem;
use core::time::Duration;
use std::collections::VecDeque;

pub use config::{
    AcquireOptions, Backoff, Backoffs, BusyPolicy, CancelPolicy, Config, ConfigError,
};
pub use outcome::{
    Action, BackoffCause, CloseReason, ConnId, Error, Event, Grant, InFlight, OpId, OpenOperations,
    Outcome, ReleaseResult, TransportEnd, Violation,
};
pub use stats::{
    AcquireOutcomes, BackoffCounts, ClientStats, CloseCounts, Histogram, IndeterminateCauses,
    ReleaseOutcomes, RenewalCounts,
};

use self::acquires::{Acquires, Asked, Standing};
use self::holds::{AutoRenew, Holds};
use self::link::{Link, Phase, Plan, RoundFailed};
use self::outcome::OpKind;
use self::pending::{Claimed, Owner, Pending};
use self::stats::EventQueue;
use self::store::SendBuffer;
use crate::names::{Endpoint, Key, Name};
use crate::rng::Rng;
use crate::time::Time;
use crate::wire::{Answer, AnswerKind, FrameError, LineReader, ServerFrame, BATCH};

/// What a part is told besides its own state, and where its effects go.
pub(crate) struct Fx<'a> {
    /// The time of the input being handled (or of the timer firing).
    pub(crate) now: Time,
    pub(crate) config: &'a Config,
    /// Connect, send and close, for the driver.
    pub(crate) actions: &'a mut VecDeque<Action>,
    /// Outcomes and notices, for the embedder, counted as they go.
    pub(crate) events: &'a mut EventQueue,
    /// Requests encoded and not yet handed out.
    pub(crate) send: &'a mut SendBuffer,
}

/// Where the client is in its life: what a shutdown (PROTOCOL.md section
/// 5, "Shutting down with a budget") changes for the parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Life {
    /// It takes operations.
    Running,
    /// It shuts down by `deadline`: no new acquire and no renewal, and the
    /// release lane drains.
    ShuttingDown { deadline: Time },
    /// The shutdown ends (drained, or its budget spent): no reconnect, and
    /// every release still open lapses.
    Ending,
}

/// What a part's timer found: an answer it waits for is past its grace,
/// so the connection or the server is unwell (PROTOCOL.md section 5, the
/// rows on answers that come too late). The client closes the connection
/// (`answer_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "the connection must be closed"]
pub(crate) struct Unwell;

/// Where the parts' effects wait for the driver and the embedder.
#[derive(Default)]
struct Out {
    actions: VecDeque<Action>,
    events: EventQueue,
    send: SendBuffer,
}

/// Lends the parts an [`Fx`] over `$client`'s output for `$body`, a
/// borrow of the output beside the parts' own: the body's value.
macro_rules! with_fx {
    ($client:ident, $fx:ident => $body:expr) => {{
        let mut $fx = Fx {
            now: $client.now,
            config: &$client.config,
            actions: &mut $client.out.actions,
            events: &mut $client.out.events,
            send: &mut $client.out.send,
        };
        $body
    }};
}

/// The earliest of `deadlines`; of those that tie, the first listed.
fn earliest(deadlines: [(Option<Time>, Due); 4]) -> Option<(Time, Due)> {
    let mut next: Option<(Time, Due)> = None;
    for (at, due) in deadlines {
        if let Some(at) = at {
            if next.map_or(true, |(earliest, _)| at < earliest) {
                next = Some((at, due));
            }
        }
    }
    next
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
    link: Link,
    pending: Pending,
    acquires: Acquires,
    holds: Holds,
    reader: LineReader,
    out: Out,
    /// Where it is in its life: running, shutting down, ending.
    life: Life,
}

impl Client {
    /// Makes a client. It wants to connect at once: the first
    /// [`poll_action`](Client::poll_action) is an [`Action::Connect`].
    ///
    /// A configuration with a value outside its field's documented range is
    /// refused with a [`ConfigError`] naming the field.
    pub fn new(config: Config, now: Time) -> Result<Client, ConfigError> {
        config.validate()?;
        let mut client = Client {
            rng: Rng::new(config.seed),
            link: Link::new(config.endpoints.len()),
            config,
            now,
            pending: Pending::default(),
            acquires: Acquires::default(),
            holds: Holds::default(),
            reader: LineReader::new(),
            out: Out::default(),
            life: Life::Running,
        };
        with_fx!(client, fx => client.link.connect(&mut fx, None));
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
    /// `max(wait, queue_grace)`, then ends `TimedOut { sent: false }`;
    /// at once while the client is unreachable, if it gives up then
    /// ([`Config::give_up_while_unreachable`]).
    pub fn acquire(
        &mut self,
        now: Time,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> Result<OpId, Error> {
        self.acquire_with(now, key, owner, wait, lease, AcquireOptions::new())
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
        let options = AcquireOptions::new().renewing(limit);
        self.acquire_with(now, key, owner, wait, lease, options)
    }

    /// As [`acquire`](Client::acquire), with `options`: renewed
    /// automatically once granted (as
    /// [`acquire_renewing`](Client::acquire_renewing)), and whether it
    /// gives up while unreachable
    /// ([`Config::give_up_while_unreachable`]). An acquire that gives up
    /// while the client is unreachable is taken and ends at once:
    /// `TimedOut` never sent, with how the latest attempt ended.
    pub fn acquire_with(
        &mut self,
        now: Time,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        options: AcquireOptions,
    ) -> Result<OpId, Error> {
        self.step(now, |client| {
            client.submit_acquire(key, owner, wait, lease, options)
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
        self.step(now, |client| {
            client.unfinished()?;
            let life = client.life;
            with_fx!(client, fx => client.holds.renew(&mut fx, grant, lease, life))
        })
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
        self.step(now, |client| {
            client.set_auto_renew(grant, AutoRenew::On { limit })
        })
    }

    /// Stops renewing a held grant automatically (a renewal already in
    /// flight is still answered). It then runs out at its `valid_until`
    /// unless renewed or released.
    pub fn stop_renewing(&mut self, now: Time, grant: &Grant) -> Result<(), Error> {
        self.step(now, |client| client.set_auto_renew(grant, AutoRenew::Off))
    }

    /// The client's counters: totals since it was made (operations by
    /// outcome, Indeterminate by cause, orphan releases, renewals,
    /// connections, closes by reason, backoffs by cause, two histograms),
    /// and what is open now. Cheap enough to call every second; it counts
    /// the held grants.
    pub fn stats(&self) -> ClientStats {
        let mut stats = self.out.events.stats.clone();
        stats.in_flight = self.pending.len() as u64;
        stats.acquires_in_flight = self.pending.acquires() as u64;
        stats.acquires_queued = self.acquires.queued() as u64;
        stats.releases_queued = self.holds.lane_len() as u64;
        stats.renewals_queued = self.holds.renewals_len() as u64;
        stats.acquires_open = self.acquires.open() as u64;
        stats.releases_open = self.holds.releases_open() as u64;
        stats.held = self.holds.held_count() as u64;
        stats
    }

    /// Until when the holder may count on `grant` now, renewals included:
    /// `None` once this client no longer holds it (released, handed back,
    /// lost, or issued by another client). It may lie in the past: an
    /// expired grant is still the holder's to release.
    pub fn valid_until(&self, grant: &Grant) -> Option<Time> {
        self.holds.valid_until(grant)
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
        self.step(now, |client| {
            client.unfinished()?;
            let op = with_fx!(client, fx => client.holds.release(&mut fx, grant))?;
            client.wake();
            Ok(op)
        })
    }

    /// Releases a raw `(key, token)` whose lease this client never saw (a
    /// grant from an earlier process, say). It keeps trying until
    /// [`Config::release_horizon`] from now.
    pub fn release_token(&mut self, now: Time, key: Key, token: u64) -> Result<OpId, Error> {
        self.step(now, |client| {
            client.unfinished()?;
            let op = with_fx!(client, fx => client.holds.release_token(&mut fx, key, token))?;
            client.wake();
            Ok(op)
        })
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
        self.step(now, |client| {
            // Once shut down the connection is gone for good: lease expiry
            // frees the grant.
            client.unfinished()?;
            with_fx!(client, fx => client.holds.undeliverable(&mut fx, grant))?;
            client.wake();
            Ok(())
        })
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
            let cap = client.holds.lease_cap(client.now);
            with_fx!(client, fx => client.link.connected(&mut fx, conn, cap));
        });
    }

    /// Connecting `conn` failed. The round goes on with its next address,
    /// or the client backs off; it forgets the leader hint if that is where
    /// it was connecting.
    pub fn handle_connect_failed(&mut self, now: Time, conn: ConnId) {
        self.step(now, |client| match client.link.current(conn) {
            Some(Phase::Connecting { .. }) => client.close(CloseReason::ConnectFailed),
            Some(_) => client.close(CloseReason::Io),
            None => {}
        });
    }

    /// The TLS handshake of the connect attempt `conn` failed, for the
    /// reason `detail` (closed as [`CloseReason::Tls`]): as for a failed
    /// connect.
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
        if let Some(action) = self.out.actions.pop_front() {
            return Some(action);
        }
        let conn = self.link.connection()?;
        self.fill_window();
        let data = self.out.send.take()?;
        Some(Action::Send { conn, data })
    }

    /// The next outcome or notice for the embedder.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.out.events.pop_front()
    }

    /// When the driver must call [`handle_timeout`](Client::handle_timeout)
    /// at the latest: the earliest deadline, or the time of the latest input
    /// while outputs are queued. `None` when no deadline is pending: the
    /// client is idle on a ready connection (it waits for input), or it has
    /// shut down ([`is_finished`](Client::is_finished)) and everything is
    /// drained. `None` is not a reason to stop driving an unfinished client.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        if !self.out.actions.is_empty() || !self.out.events.is_empty() || self.can_send() {
            return Some(self.now);
        }
        self.next_timer(None).map(|(at, _)| at)
    }

    // ----- introspection --------------------------------------------------

    /// The connection the core is using or opening, if any.
    pub fn connection(&self) -> Option<ConnId> {
        self.link.connection()
    }

    /// The window of the current connection, once `W` arrived.
    pub fn window(&self) -> Option<u64> {
        self.link.window()
    }

    /// The node id of the current connection, once `W` arrived.
    pub fn node(&self) -> Option<&Name> {
        self.link.node()
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
            acquires: self.pending.acquires(),
        }
    }

    /// Operations open: acquires, and the embedder's releases.
    pub fn open_operations(&self) -> OpenOperations {
        OpenOperations {
            acquires: self.acquires.open(),
            releases: self.holds.releases_open(),
        }
    }

    /// Whether the client has shut down for good.
    pub fn is_finished(&self) -> bool {
        self.link.is_finished()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The latest time the core has seen.
    pub fn now(&self) -> Time {
        self.now
    }

    // ----- routing commands -------------------------------------------------

    /// Refuses a command once the client has shut down.
    fn unfinished(&self) -> Result<(), Error> {
        match self.is_finished() {
            true => Err(Error::Finished),
            false => Ok(()),
        }
    }

    /// [`Client::acquire_with`], which every acquire goes through.
    fn submit_acquire(
        &mut self,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        options: AcquireOptions,
    ) -> Result<OpId, Error> {
        self.unfinished()?;
        if self.life != Life::Running {
            return Err(Error::ShuttingDown);
        }
        let link = Standing {
            refused: self.link.misconfigured(),
            unreachable: self.link.unreachable(),
        };
        let asked = Asked {
            key,
            owner,
            wait,
            lease,
            renew: options.renew,
            give_up: options
                .give_up_while_unreachable
                .unwrap_or(self.config.give_up_while_unreachable),
        };
        with_fx!(self, fx => self.acquires.submit(&mut fx, asked, link))
    }

    /// [`Client::auto_renew`] and [`Client::stop_renewing`].
    fn set_auto_renew(&mut self, grant: &Grant, auto: AutoRenew) -> Result<(), Error> {
        self.unfinished()?;
        let life = self.life;
        with_fx!(self, fx => self.holds.auto_renew(&mut fx, grant, auto, life))
    }

    /// [`Client::cancel`]: an acquire in flight is cancelled under the
    /// cancel policy; a release ignores cancellation.
    fn cancel_op(&mut self, op: OpId) -> Result<(), Error> {
        match with_fx!(self, fx => self.acquires.cancel(&mut fx, op)) {
            Ok(None) => Ok(()),
            Ok(Some(id)) => {
                match self.config.cancel {
                    CancelPolicy::Close => self.close(CloseReason::Cancel),
                    CancelPolicy::KeepWaiter => self.abandon(op, id),
                }
                Ok(())
            }
            // A release ignores cancellation: it is always settled.
            Err(_) if self.holds.is_release(op) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Ends the acquire `op`, in flight as request `id`, Indeterminate at
    /// once, its answer still claimed: an abandoned waiter.
    fn abandon(&mut self, op: OpId, id: u64) {
        if let Some((OpKind::Acquire, handle)) = op.parts() {
            match with_fx!(self, fx => self.acquires.abandon(&mut fx, handle)) {
                Some(waiter) => self.pending.abandon(id, waiter),
                // No waiter could be kept: as under the close policy.
                None => self.close(CloseReason::Cancel),
            }
        }
    }

    /// A release is waiting: while shutting down with no connection
    /// planned, one is made.
    fn wake(&mut self) {
        if self.holds.lane_len() > 0 && self.link.is_idle() {
            let cap = self.holds.lease_cap(self.now);
            with_fx!(self, fx => self.link.connect(&mut fx, cap));
        }
    }

    // ----- reading ----------------------------------------------------------

    /// Reads frames from the bytes of the current connection, `conn`, until
    /// they run out or one closes the connection. A framing error, an
    /// unknown kind, a bad pairing or an over-long line is a violation: the
    /// answer cannot be correlated, so the connection is done.
    fn read(&mut self, conn: ConnId, data: &[u8]) {
        let mut reader = mem::take(&mut self.reader);
        let mut input = data;
        loop {
            // Good lines that lie whole in `input` are read where they are;
            // anything else goes through the reader, which buffers a line
            // cut by the end of `input` and tells which rule a bad one
            // breaks.
            let frames = reader.leading_frames(&mut input);
            let verdict = if frames.is_empty() {
                match reader.next_line(&mut input) {
                    Some(line) => line
                        .and_then(ServerFrame::parse)
                        .map_err(|e: FrameError| CloseReason::Protocol(Violation::Framing(e)))
                        .and_then(|frame| self.on_frame(frame)),
                    None => break,
                }
            } else {
                self.on_frames(conn, frames.as_slice())
            };
            if let Err(reason) = verdict {
                self.close(reason);
            }
            if self.link.current(conn).is_none() {
                // Closed, by a violation or by a part (an answer overdue):
                // what follows on this connection is not read.
                break;
            }
        }
        if self.link.current(conn).is_none() {
            // The connection closed: keep the buffer's memory, not its bytes.
            reader.reset();
        }
        self.reader = reader;
    }

    /// Frames read together from `conn`: each run of answers on a ready
    /// connection is matched first, all of it (so that the lookups of a run
    /// overlap in memory instead of waiting one after the other), then
    /// handed on in order; anything else goes frame by frame. A violation
    /// stops the run where it is: the answers before it are handed on, and
    /// `Err` closes the connection. Every answer matched is handed on even
    /// if handing on one before it closed the connection (it was answered
    /// before the close); after that, nothing more is read.
    fn on_frames(&mut self, conn: ConnId, frames: &[ServerFrame<'_>]) -> Result<(), CloseReason> {
        let mut rest = frames;
        while let Some((first, _)) = rest.split_first() {
            if self.link.current(conn).is_none() {
                return Ok(());
            }
            if !matches!(first, ServerFrame::Answer(_)) || self.link.window().is_none() {
                self.on_frame(*first)?;
                rest = &rest[1..];
                continue;
            }
            // The run: `rest[..claimed]` are answers, each matched.
            let mut run = [None; BATCH];
            let mut claimed = 0;
            let mut violation = None;
            for (frame, slot) in rest.iter().zip(&mut run) {
                let ServerFrame::Answer(answer) = frame else {
                    break;
                };
                match self.claim(answer) {
                    Ok(owner) => *slot = Some(owner),
                    Err(v) => {
                        violation = Some((*answer, v));
                        break;
                    }
                }
                claimed += 1;
            }
            for (frame, owner) in rest[..claimed].iter().zip(run) {
                if let (ServerFrame::Answer(answer), Some(owner)) = (frame, owner) {
                    self.deliver(owner, answer.kind);
                }
            }
            if let Some((answer, violation)) = violation {
                if self.link.current(conn).is_none() {
                    // Closed by an answer before it: never read.
                    return Ok(());
                }
                self.stray_answer(&answer);
                return Err(CloseReason::Protocol(violation));
            }
            rest = &rest[claimed..];
        }
        Ok(())
    }

    /// A frame: a notice for the link, or an answer. `Err` closes the
    /// connection.
    fn on_frame(&mut self, frame: ServerFrame<'_>) -> Result<(), CloseReason> {
        let answer = match frame {
            ServerFrame::Answer(answer) => Some(answer),
            _ => None,
        };
        let verdict = with_fx!(self, fx => self.link.notice(&mut fx, frame));
        match (answer, verdict) {
            (Some(answer), Ok(())) => self.on_answer(answer),
            (Some(answer), Err(reason)) => {
                // Before `W`: nothing was sent, so none can be due.
                self.stray_answer(&answer);
                Err(reason)
            }
            (None, verdict) => verdict,
        }
    }

    /// An answer: matched by id, op and key in the pending table, then
    /// handed to the part whose request it answers. `Err` closes the
    /// connection: the session no longer agrees with the server.
    fn on_answer(&mut self, answer: Answer<'_>) -> Result<(), CloseReason> {
        match self.claim(&answer) {
            Ok(claimed) => {
                self.deliver(claimed, answer.kind);
                Ok(())
            }
            Err(violation) => {
                self.stray_answer(&answer);
                Err(CloseReason::Protocol(violation))
            }
        }
    }

    /// Matches `answer` by id, op and key, never by order (PROTOCOL.md
    /// section 5, "matching an answer"): the request its id names is taken
    /// out of the pending table with one lookup, then checked against what
    /// its owner's record says the answer must match. Whose request it
    /// answers; else the violation, and a request whose answer did not
    /// match stays in flight, to be treated as sent and unanswered by the
    /// close.
    fn claim(&mut self, answer: &Answer<'_>) -> Result<Claimed, Violation> {
        let id = answer.id;
        let owner = self.pending.take(id).ok_or(Violation::UnknownId { id })?;
        let expected = match owner {
            Owner::Acquire(acquire) => self.acquires.expected(acquire),
            Owner::Waiter(waiter) => self.acquires.waiter_expected(waiter),
            Owner::Release(release) => self.holds.release_expected(release),
            Owner::Renewal(n) => {
                let awaited = self
                    .pending
                    .renewal_grant(n)
                    .is_some_and(|grant| self.holds.awaits_renewal(grant));
                self.pending.renewal_expected(n, awaited)
            }
        };
        // An owner with no record of its request would be a core that lost
        // track: the answer cannot be correlated.
        let refused = expected.map_or(Some(Violation::UnknownId { id }), |e| e.refuses(answer));
        if let Some(violation) = refused {
            self.pending.put_back(id, owner);
            return Err(violation);
        }
        self.pending
            .claimed(owner)
            .ok_or(Violation::UnknownId { id })
    }

    /// Hands a matched answer to the part whose request it answers.
    fn deliver(&mut self, claimed: Claimed, kind: AnswerKind) {
        with_fx!(self, fx => match (claimed, kind) {
            (Claimed::Waiter(waiter), kind) => {
                // An abandoned waiter's answer is claimed; its grant goes
                // back by exact token, unless the embedder holds it.
                let key = self.acquires.waiter_key(waiter).cloned();
                self.acquires.waiter_done(waiter);
                if let (Some(key), AnswerKind::Granted { token, lease_ms, .. }) = (key, kind) {
                    if !self.holds.knows(&key, token) {
                        self.holds.orphan(&mut fx, key, token, lease_ms);
                    }
                }
            }
            (Claimed::Acquire(acquire), AnswerKind::Granted { token, lease_ms, waited_ms }) => {
                // The acquire's record ends, what the grant needs of it
                // becomes a held grant's, then the acquire is told.
                if let Some((granted, concluding)) = self.acquires.granted(acquire) {
                    let waited = waited_ms.unwrap_or(0);
                    let outcome = match self.holds.hold(&mut fx, token, lease_ms, waited, granted) {
                        Some(grant) => Outcome::Granted(grant),
                        // No record can be kept: lease expiry settles it.
                        None => Outcome::Indeterminate {
                            settles_by: fx
                                .now
                                .saturating_add_millis(lease_ms.get())
                                .saturating_add(fx.config.settle_margin),
                        },
                    };
                    self.acquires.conclude(&mut fx, acquire, concluding, outcome);
                }
            }
            (Claimed::Acquire(acquire), AnswerKind::TimedOut) => {
                let outcome = Outcome::TimedOut {
                    sent: true,
                    cause: None,
                };
                self.acquires.end(&mut fx, acquire, outcome);
            }
            (Claimed::Acquire(acquire), _) => self.acquires.busy(&mut fx, &mut self.rng, acquire),
            (Claimed::Release(release), kind) => {
                let result = match kind {
                    AnswerKind::Released => ReleaseResult::Released,
                    _ => ReleaseResult::NotHeld,
                };
                self.holds.release_answer(&mut fx, release, result);
            }
            (Claimed::Renewal(grant), kind) => self.holds.renewal_answer(&mut fx, grant, kind),
        });
    }

    /// An answer no request in flight claims. If it is a `G` for a grant the
    /// embedder was not given, and no release of it is under way, that
    /// grant is released by its exact token: a grant the embedder holds is
    /// never released behind its back.
    fn stray_answer(&mut self, answer: &Answer<'_>) {
        if let AnswerKind::Granted {
            token, lease_ms, ..
        }
        | AnswerKind::Renewed { token, lease_ms } = answer.kind
        {
            let key = Key::from(answer.key);
            if !self.holds.knows(&key, token) {
                with_fx!(self, fx => self.holds.orphan(&mut fx, key, token, lease_ms));
            }
        }
    }

    // ----- sending ----------------------------------------------------------

    /// Whether a request, or the hello, can go out now.
    fn can_send(&self) -> bool {
        if self.link.hello_due() {
            return true;
        }
        let Some(window) = self.link.window() else {
            return false;
        };
        let free_slot = (self.pending.len() as u64) < window;
        let acquire_slot = (self.pending.acquires() as u64) < self.acquire_limit(window);
        free_slot
            && (self.holds.lane_len() > 0
                || self.holds.renewals_len() > 0
                || (self.acquires.queued() > 0 && acquire_slot))
    }

    /// How many acquires may be in flight with this window: all but the
    /// reserved slots.
    fn acquire_limit(&self, window: u64) -> u64 {
        window.saturating_sub(u64::from(self.config.reserved))
    }

    /// Encodes what may go out now (PROTOCOL.md section 5, "The reserved
    /// release lane"): the hello; on a ready connection releases first,
    /// then renewals, into any free slot of the window; then acquires, never
    /// into the reserved slots, so a window full of acquires waiting for
    /// key K still has room for the release of K. Each request is
    /// registered in the pending table as its bytes are made: from the
    /// moment they are handed out it counts as sent.
    fn fill_window(&mut self) {
        with_fx!(self, fx => self.link.send_hello(&mut fx));
        let Some(window) = self.link.window() else {
            return;
        };
        let limit = self.acquire_limit(window);
        let pending = &mut self.pending;
        with_fx!(self, fx => {
            while (pending.len() as u64) < window {
                match self.holds.send_release(&mut fx, pending.next_id()) {
                    Some(release) => pending.register(Owner::Release(release)),
                    None => break,
                }
            }
            while (pending.len() as u64) < window {
                match self.holds.send_renewal(&mut fx, pending.next_id()) {
                    Some((grant, key, token, lease_ms)) => {
                        pending.register_renewal(grant, key, token, lease_ms);
                    }
                    None => break,
                }
            }
            while (pending.len() as u64) < window && (pending.acquires() as u64) < limit {
                match self.acquires.send_next(&mut fx, pending.next_id()) {
                    Some(acquire) => pending.register(Owner::Acquire(acquire)),
                    None => break,
                }
            }
        });
    }

    // ----- closing ----------------------------------------------------------

    /// Closes the connection (or abandons the connect attempt) for `reason`
    /// and applies "any close" to the requests on it, then the link goes on
    /// with the round at once, or waits before the next one.
    fn close(&mut self, reason: CloseReason) {
        let Some(closed) = with_fx!(self, fx => self.link.close(&mut fx, &reason)) else {
            return;
        };
        self.reader.reset();
        self.settle(&reason);
        let next = match self.life {
            Life::Ending => return,
            Life::ShuttingDown { .. } if !self.has_work_to_drain() => Plan::Idle,
            _ => Plan::Connect,
        };
        let cap = self.holds.lease_cap(self.now);
        let failed = with_fx!(self, fx => self.link.after_close(&mut fx, &mut self.rng, cap, closed, &reason, next));
        match failed {
            Some(RoundFailed::Refused(cause)) => {
                with_fx!(self, fx => self.acquires.refused(&mut fx, &cause));
            }
            Some(RoundFailed::Unreachable(cause)) => {
                with_fx!(self, fx => self.acquires.unreachable(&mut fx, &cause));
            }
            None => {}
        }
    }

    /// Any close: sent acquires end Indeterminate and are never sent again;
    /// abandoned waiters are dropped (lease expiry settles them); sent
    /// releases and renewals go back to the front of the lane, in their
    /// order; unsent requests stay queued for the next connection.
    fn settle(&mut self, reason: &CloseReason) {
        let in_flight = self.pending.drain();
        let life = self.life;
        with_fx!(self, fx => {
            let mut again = Vec::new();
            for claimed in in_flight {
                match claimed {
                    Claimed::Acquire(acquire) => self.acquires.in_doubt(&mut fx, acquire, reason),
                    // Lease expiry settles an abandoned waiter's grant.
                    Claimed::Waiter(waiter) => self.acquires.waiter_done(waiter),
                    other => again.push(other),
                }
            }
            // Back to the front of their queues: the last sent first.
            for claimed in again.into_iter().rev() {
                match claimed {
                    Claimed::Release(release) => {
                        self.holds.requeue_release(&mut fx, release, life);
                    }
                    Claimed::Renewal(grant) => self.holds.requeue_renewal(&mut fx, grant, life),
                    Claimed::Acquire(_) | Claimed::Waiter(_) => {}
                }
            }
        });
    }

    // ----- time -------------------------------------------------------------

    /// The earliest deadline of all, and what it belongs to; with `by`,
    /// the earliest due by then (the parts caught up with it). Deadlines
    /// that tie come in the order of [`Due`]. Every part's timers are
    /// folded here, and only here.
    fn next_timer(&self, by: Option<Time>) -> Option<(Time, Due)> {
        let shutdown = match self.life {
            Life::ShuttingDown { deadline } => Some(deadline),
            Life::Running | Life::Ending => None,
        };
        let within = |at: Option<Time>| at.filter(|&at| by.map_or(true, |by| at <= by));
        earliest([
            (self.acquires.earliest(by), Due::Acquire),
            (self.holds.earliest(by), Due::Hold),
            (within(self.link.deadline()), Due::Link),
            (within(shutdown), Due::Shutdown),
        ])
    }

    /// Fires everything due at or before `now`, in deadline order, each at
    /// its own time.
    fn advance(&mut self, now: Time) {
        let target = now.max(self.now);
        self.acquires.catch_up(target);
        self.holds.catch_up(target);
        while let Some((at, due)) = self.next_timer(Some(target)) {
            self.now = self.now.max(at);
            match due {
                Due::Acquire => {
                    let cause = self.link.last_end();
                    if let Err(Unwell) =
                        with_fx!(self, fx => self.acquires.fire(&mut fx, at, cause))
                    {
                        self.close(CloseReason::AnswerTimeout);
                    }
                }
                Due::Hold => {
                    if let Err(Unwell) = with_fx!(self, fx => self.holds.fire(&mut fx, at)) {
                        self.close(CloseReason::AnswerTimeout);
                    }
                }
                Due::Link => {
                    let cap = self.holds.lease_cap(self.now);
                    if let Some(reason) = with_fx!(self, fx => self.link.fire(&mut fx, cap)) {
                        self.close(reason);
                    }
                }
                Due::Shutdown => self.finish_shutdown(),
            }
            self.check_shutdown();
        }
        self.now = target;
    }

    // ----- shutting down ----------------------------------------------------

    /// [`Client::shutdown`].
    fn start_shutdown(&mut self, budget: Duration) -> Result<(), Error> {
        if self.life != Life::Running || self.is_finished() {
            return Err(Error::ShuttingDown);
        }
        self.life = Life::ShuttingDown {
            deadline: self.now.saturating_add(budget),
        };
        let policy = self.config.cancel;
        let mut abandoned = Vec::new();
        let in_flight = with_fx!(self, fx => {
            self.holds.stop_renewals(&mut fx);
            self.acquires.shut(&mut fx, policy, &mut abandoned)
        });
        let mut in_flight = in_flight;
        for (id, waiter) in abandoned {
            match waiter {
                Some(waiter) => self.pending.abandon(id, waiter),
                None => in_flight = true,
            }
        }
        if in_flight {
            self.close(CloseReason::Cancel);
        }
        Ok(())
    }

    /// Finishes a shutdown whose work is done, or whose budget is spent.
    fn check_shutdown(&mut self) {
        // Also when the budget is already spent (a zero budget): its
        // deadline is due now, and a command fires no timer by itself.
        if let Life::ShuttingDown { deadline } = self.life {
            if !self.has_work_to_drain() || self.now >= deadline {
                self.finish_shutdown();
            }
        }
    }

    /// Whether a shutting-down client still needs a connection.
    fn has_work_to_drain(&self) -> bool {
        self.holds.lane_len() > 0 || self.pending.len() > 0
    }

    /// Ends the shutdown, drained or not: closes, lapses every release still
    /// open, forgets held grants, and stops.
    fn finish_shutdown(&mut self) {
        self.life = Life::Ending;
        self.close(CloseReason::Shutdown);
        with_fx!(self, fx => {
            self.holds.finish(&mut fx);
            // Acquires end when the shutdown starts or at the close; should
            // one remain, it was never handed out.
            self.acquires.cancel_all(&mut fx);
        });
        self.link.finish();
        self.out.events.push_back(Event::ShutdownComplete);
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
            .field("queued", &(self.acquires.queued(), self.holds.lane_len()))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod leftovers {
    use super::*;

    /// An acquire renewed automatically once granted, abandoned under
    /// `KeepWaiter` while in flight, whose connection then closes before
    /// its answer: nothing of it may stay behind. (Before the parts owned
    /// their state, the renewal it asked for stayed in a map for good.)
    #[test]
    fn an_abandoned_renewing_acquire_whose_connection_closes_leaves_nothing_behind() {
        let mut config = Config::new([Endpoint::new("a:1").unwrap()], Name::new("c").unwrap());
        config.cancel = CancelPolicy::KeepWaiter;
        let now = Time::ZERO;
        let mut c = Client::new(config, now).unwrap();
        let conn = c.connection().unwrap();
        c.handle_connected(now, conn);
        while c.poll_action().is_some() {}
        c.handle_bytes(now, conn, b"W n 8\n");
        let op = c
            .acquire_renewing(
                now,
                Key::new("k").unwrap(),
                Name::new("o").unwrap(),
                Duration::from_secs(5),
                Duration::from_secs(30),
                None,
            )
            .unwrap();
        while c.poll_action().is_some() {}
        c.cancel(now, op).unwrap();
        assert_eq!((c.acquires.open(), c.acquires.waiting()), (0, 1));
        c.handle_transport_closed(now, conn, TransportEnd::Eof);
        while c.poll_action().is_some() {}
        while c.poll_event().is_some() {}
        assert_eq!(
            (c.acquires.open(), c.acquires.waiting(), c.pending.len()),
            (0, 0, 0),
            "nothing of the abandoned acquire stays behind"
        );
    }
}
