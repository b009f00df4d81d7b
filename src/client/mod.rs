//! The client core: every rule of PROTOCOL.md section 5, sans-IO.
//!
//! | file | rules |
//! |---|---|
//! | `mod.rs` | operations (acquire, release, cancel, undeliverable grants, shutdown), timers, the driver contract |
//! | `pending.rs` | matching answers by id, op and key; stray and second answers; `B` retries |
//! | `lane.rs` | the release lane, the reserved slots, the window, sending |
//! | `link.rs` | connecting, the handshake, leader hints, `M`/`E`, closing, backoff |
//! | `outcome.rs` | outcomes, events, actions, errors |

mod config;
mod lane;
mod link;
mod outcome;
mod owners;
mod pending;
mod ring;
mod table;

use core::hint::black_box;
use core::num::NonZeroU64;
use core::time::Duration;
use std::collections::VecDeque;

use bytes::BytesMut;

#[cfg(feature = "sim")]
#[doc(hidden)]
pub use config::Sabotage;
pub use config::{Backoff, Backoffs, BusyPolicy, CancelPolicy, Config, ConfigError};
pub use outcome::{
    Action, BackoffCause, CloseReason, ConnId, Error, Event, Grant, OpId, Outcome, ReleaseResult,
    TransportEnd, Violation,
};

use self::lane::Queue;
use self::link::{Link, LinkState, Phase};
use self::owners::{OwnerId, Owners};
use self::pending::PendingTable;
use self::ring::Ring;
use self::table::{Lane, Table};
use crate::names::{Key, Name};
use crate::rng::Rng;
use crate::time::{duration_millis, duration_nanos, Time};
use crate::wire::{AnswerKind, IdDigits, LineReader, NumberDigits, RawAnswer, ServerFrame};

// The timer lanes of the table (see `table.rs`): one per kind of deadline
// that is "now plus the same duration" for every entry of its kind, so
// that their timers come in deadline order.
/// Acquires waiting to be sent: the queue deadline. They leave in order.
const LANE_QUEUED: Lane = Lane::Queue(0);
/// Grants held, and releases waiting to be sent: the lease's end.
const LANE_HELD: Lane = Lane::Queue(1);
/// Acquires in flight (and abandoned waiters): the answer deadline. They
/// are answered in any order.
const LANE_SENT: Lane = Lane::Group(0);
/// Releases in flight: the answer deadline.
const LANE_RELEASE_SENT: Lane = Lane::Group(1);
/// Anything else (`B` backoffs): the heap.
const LANE_OTHER: Lane = Lane::Heap;

/// Answers parsed and read ahead together (see `Client::read_answers`).
const BATCH: usize = 16;

/// The send buffer's capacity kept across sends: more than steady traffic
/// writes between two polls (about 72 KiB for 2,400 requests), so that it
/// never allocates in steady state, and little beside 10,000 pending
/// acquires. A burst that grew it further gives the memory back.
const SEND_BUFFER_KEPT: usize = 256 * 1024;

/// Where an acquire is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquirePhase {
    /// Waiting to be sent (first attempt, or a retry after `B`).
    Queued,
    /// Answered `B`; the next attempt starts when the timer fires.
    Backoff,
    /// An attempt is in flight.
    Sent,
    /// In flight, but its operation already ended (cancelled under
    /// `KeepWaiter`, or shut down): the answer is still claimed.
    Abandoned,
}

/// An acquire operation (or an abandoned waiter).
pub(crate) struct Acquire {
    key: Key,
    /// The owner, kept once for all the acquires that share it.
    owner: OwnerId,
    lease_ms: NonZeroU64,
    /// The end of the wait budget, across all attempts.
    budget_end: Time,
    /// When the current attempt was handed out.
    sent_at: Time,
    /// Attempts handed out so far, up to 255: only whether there was one
    /// matters, and how many in a row were refused with `B` up to 31 (the
    /// backoff's step stops growing there).
    attempts: u8,
    phase: AcquirePhase,
}

impl Acquire {
    /// The `wait_ms` of an attempt sent at `sent_at`: what is left of the
    /// budget, at least 0.
    fn wire_wait_ms(&self) -> u64 {
        self.budget_end.millis_since(self.sent_at)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleasePhase {
    Queued,
    Sent,
}

/// A release: the embedder's, or one the client issued for an orphaned
/// grant.
pub(crate) struct Release {
    key: Key,
    token: u64,
    /// No new attempt starts at or after this.
    until: Time,
    sent_at: Time,
    attempts: u32,
    phase: ReleasePhase,
    orphan: bool,
}

impl Release {
    /// A release waiting in the lane for its first attempt, trying until
    /// `until` at the latest.
    fn queued(key: Key, token: u64, until: Time, orphan: bool) -> Release {
        Release {
            key,
            token,
            until,
            sent_at: Time::ZERO,
            attempts: 0,
            phase: ReleasePhase::Queued,
            orphan,
        }
    }
}

/// A grant handed to the embedder and not yet released or handed back.
pub(crate) struct Held {
    key: Key,
    token: u64,
}

pub(crate) enum Entry {
    Acquire(Acquire),
    Release(Release),
    Held(Held),
}

impl Entry {
    /// The key the entry is about.
    fn key(&self) -> &Key {
        match self {
            Entry::Acquire(acquire) => &acquire.key,
            Entry::Release(release) => &release.key,
            Entry::Held(held) => &held.key,
        }
    }
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
/// Every input first fires the timers that are due at its time, in deadline
/// order, as if `handle_timeout` had been called at each; so a late driver
/// sees the same result as a punctual one, only later.
///
/// # Example: a run loop
///
/// A driver over an in-memory "server" that accepts the handshake and
/// grants every acquire. A real driver does the same with sockets and a
/// clock; see the adapters.
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
///                             to_client.extend_from_slice(&[b"G ", id, b" A ", key, b" 1 30000\n"].concat());
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
///         if let Event::Outcome { op: done, outcome: Outcome::Granted(grant) } = event {
///             assert_eq!(done, op);
///             granted = Some(grant);
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
    table: Table<Entry>,
    /// The owners of the acquires in `table`.
    owners: Owners,
    pending: PendingTable,
    /// Releases waiting to be sent.
    lane: Queue,
    /// Acquires waiting to be sent.
    queue: Queue,
    /// The id of the next request, and its digits.
    next_request: IdDigits,
    /// The digits of the latest `wait_ms` and `lease_ms` sent.
    wait_digits: NumberDigits,
    lease_digits: NumberDigits,
    /// `config.answer_grace`, `config.settle_margin` and
    /// `config.queue_grace` in nanoseconds (saturated), as deadlines add them.
    answer_grace_ns: u64,
    settle_margin_ns: u64,
    queue_grace_ns: u64,
    acquires_in_flight: usize,
    open_acquires: usize,
    open_releases: usize,
    link: Link,
    actions: VecDeque<Action>,
    events: Ring<Event>,
    out: BytesMut,
    reader: LineReader,
    /// The shutdown deadline, once shutting down.
    shutdown: Option<Time>,
    /// The shutdown is ending: no reconnect, every release lapses.
    finishing: bool,
    scratch: Vec<(u64, u32)>,
}

impl Client {
    /// Makes a client. It wants to connect at once: the first
    /// [`poll_action`](Client::poll_action) is an [`Action::Connect`].
    pub fn new(config: Config, now: Time) -> Result<Client, ConfigError> {
        config.validate()?;
        let mut client = Client {
            rng: Rng::new(config.seed),
            answer_grace_ns: duration_nanos(config.answer_grace),
            settle_margin_ns: duration_nanos(config.settle_margin),
            queue_grace_ns: duration_nanos(config.queue_grace),
            config,
            now,
            table: Table::new(),
            owners: Owners::default(),
            pending: PendingTable::default(),
            lane: Queue::default(),
            queue: Queue::default(),
            next_request: IdDigits::new(1),
            wait_digits: NumberDigits::default(),
            lease_digits: NumberDigits::default(),
            acquires_in_flight: 0,
            open_acquires: 0,
            open_releases: 0,
            link: Link::new(),
            actions: VecDeque::new(),
            events: Ring::default(),
            out: BytesMut::new(),
            reader: LineReader::new(),
            shutdown: None,
            finishing: false,
            scratch: Vec::new(),
        };
        client.connect();
        Ok(client)
    }

    // ----- commands -------------------------------------------------------

    /// Asks for `key` for `lease`, waiting at most `wait` for its turn in
    /// total, across every attempt (`Duration::ZERO`: try once). The
    /// outcome comes as [`Event::Outcome`] with the returned id.
    ///
    /// Until a connection can take it, the acquire waits at most
    /// `max(wait, queue_grace)`, then ends `TimedOut { sent: false }`.
    // Inlined into the driver, which calls it for about every answer: around
    // the call to `submit_acquire` there are only two quick checks, and a
    // call across the crate boundary, its values passed and returned through
    // memory, cost more than they do (the core benchmark: 8% of the time).
    #[inline]
    pub fn acquire(
        &mut self,
        now: Time,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> Result<OpId, Error> {
        self.advance(now);
        let result = self.submit_acquire(key, owner, wait, lease);
        self.check_shutdown();
        result
    }

    #[inline(never)]
    fn submit_acquire(
        &mut self,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> Result<OpId, Error> {
        if matches!(self.link.state, LinkState::Finished) {
            return Err(Error::Finished);
        }
        if self.shutdown.is_some() {
            return Err(Error::ShuttingDown);
        }
        let lease_ms = NonZeroU64::new(duration_millis(lease)).ok_or(Error::ZeroLease)?;
        if self.open_acquires >= self.config.max_acquires {
            return Err(Error::Busy);
        }
        let budget_end = self.now.saturating_add(wait);
        let queue_deadline = budget_end.max(self.now.saturating_add_nanos(self.queue_grace_ns));
        let owner = self.owners.intern(owner);
        let (idx, gen) = self.table.insert(Entry::Acquire(Acquire {
            key,
            owner,
            lease_ms,
            budget_end,
            sent_at: Time::ZERO,
            attempts: 0,
            phase: AcquirePhase::Queued,
        }));
        self.open_acquires += 1;
        self.queue.push_back(idx, gen);
        self.table.set_timer(idx, queue_deadline, LANE_QUEUED);
        Ok(OpId::new(idx, gen))
    }

    /// Releases a grant this client handed out, by its exact token. The
    /// release is retried on later connections until its answer comes, until
    /// [`Grant::expires_by`] (after which the server has freed the grant
    /// itself), or until [`Config::release_attempts`]: then it ends
    /// [`Outcome::Lapsed`].
    ///
    /// Releasing a grant twice, or one handed back with
    /// [`undeliverable`](Client::undeliverable), is refused with
    /// [`Error::GrantNotHeld`]. A grant past its `expires_by` ends `Lapsed`
    /// at once: the server has already freed it.
    // Inlined into the driver, as `acquire`.
    #[inline]
    pub fn release(&mut self, now: Time, grant: &Grant) -> Result<OpId, Error> {
        self.advance(now);
        let result = self.submit_release(grant);
        self.check_shutdown();
        result
    }

    #[inline(never)]
    fn submit_release(&mut self, grant: &Grant) -> Result<OpId, Error> {
        if matches!(self.link.state, LinkState::Finished) {
            return Err(Error::Finished);
        }
        let (idx, gen) = (grant.handle.slot(), grant.handle.gen());
        let held = matches!(self.table.get_checked(idx, gen), Some(Entry::Held(h)) if h.token == grant.token);
        if !held {
            if self.now < grant.expires_by {
                return Err(Error::GrantNotHeld {
                    key: grant.key.clone(),
                    token: grant.token,
                });
            }
            // Already freed by lease expiry: nothing to ask.
            let (idx, gen) = self.table.insert(Entry::Release(Release {
                // Not in the lane: it ends at once.
                phase: ReleasePhase::Sent,
                ..Release::queued(grant.key.clone(), grant.token, grant.expires_by, false)
            }));
            self.open_releases += 1;
            self.end_release(idx, ReleaseResult::Lapsed);
            return Ok(OpId::new(idx, gen));
        }
        if self.open_releases >= self.config.max_releases {
            return Err(Error::Busy);
        }
        self.table.bump(idx);
        let until = grant.expires_by;
        self.table.replace_with(idx, |entry| {
            let Entry::Held(Held { key, token }) = entry else {
                unreachable!("checked above");
            };
            Entry::Release(Release::queued(key, token, until, false))
        });
        self.open_releases += 1;
        // The grant's timer is armed at its `expires_by` already: the
        // release's deadline.
        Ok(self.enqueue_release(idx, false))
    }

    /// Releases a raw `(key, token)` whose lease this client never saw (a
    /// grant from an earlier process, say). It keeps trying until
    /// [`Config::release_horizon`] from now.
    pub fn release_token(&mut self, now: Time, key: Key, token: u64) -> Result<OpId, Error> {
        self.advance(now);
        let result = if matches!(self.link.state, LinkState::Finished) {
            Err(Error::Finished)
        } else if self.open_releases >= self.config.max_releases {
            Err(Error::Busy)
        } else {
            let until = self.now.saturating_add(self.config.release_horizon);
            let (idx, _) = self
                .table
                .insert(Entry::Release(Release::queued(key, token, until, false)));
            self.open_releases += 1;
            Ok(self.enqueue_release(idx, true))
        };
        self.check_shutdown();
        result
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
        self.advance(now);
        let result = self.cancel_op(op);
        self.check_shutdown();
        result
    }

    fn cancel_op(&mut self, op: OpId) -> Result<(), Error> {
        let idx = op.slot();
        let phase = match self.table.get_checked(idx, op.gen()) {
            Some(Entry::Acquire(a)) if a.phase != AcquirePhase::Abandoned => a.phase,
            Some(Entry::Release(_)) => return Ok(()),
            _ => return Err(Error::UnknownOperation(op)),
        };
        match phase {
            AcquirePhase::Queued | AcquirePhase::Backoff => {
                self.emit_outcome(idx, Outcome::Cancelled);
                self.retire(idx);
            }
            AcquirePhase::Sent => match self.config.cancel {
                CancelPolicy::Close => self.close(CloseReason::Cancel),
                CancelPolicy::KeepWaiter => self.abandon_waiter(idx),
            },
            AcquirePhase::Abandoned => unreachable!("excluded above"),
        }
        Ok(())
    }

    /// Ends a sent acquire Indeterminate at once but keeps claiming its
    /// answer.
    fn abandon_waiter(&mut self, idx: u32) {
        let Some(Entry::Acquire(a)) = self.table.get(idx) else {
            unreachable!("only acquires are abandoned");
        };
        let settles_by = self.settles_by(a);
        self.emit_outcome(idx, Outcome::Indeterminate { settles_by });
        self.open_acquires -= 1;
        self.table.bump(idx);
        if let Some(Entry::Acquire(a)) = self.table.get_mut(idx) {
            a.phase = AcquirePhase::Abandoned;
        }
    }

    /// When lease expiry settles an acquire in flight that is given up now.
    fn settles_by(&self, a: &Acquire) -> Time {
        self.now
            .saturating_add_millis(a.wire_wait_ms())
            .saturating_add_millis(a.lease_ms.get())
            .saturating_add_nanos(self.settle_margin_ns)
    }

    /// Hands back a grant whose [`Outcome::Granted`] could not be delivered
    /// (its waiter is gone): the client releases it by its exact token and
    /// reports [`Event::OrphanRelease`], then [`Event::OrphanSettled`].
    ///
    /// A grant already released or handed back is [`Error::GrantNotHeld`];
    /// one past its [`Grant::expires_by`] needs nothing and is accepted.
    pub fn undeliverable(&mut self, now: Time, grant: &Grant) -> Result<(), Error> {
        self.advance(now);
        if self.is_finished() {
            // The connection is gone for good: lease expiry frees the grant.
            return Err(Error::Finished);
        }
        let (idx, gen) = (grant.handle.slot(), grant.handle.gen());
        let held = matches!(self.table.get_checked(idx, gen), Some(Entry::Held(h)) if h.token == grant.token);
        let result = if held {
            self.free(idx);
            self.queue_orphan_release(grant.key.clone(), grant.token, grant.expires_by);
            Ok(())
        } else if self.now >= grant.expires_by {
            Ok(())
        } else {
            Err(Error::GrantNotHeld {
                key: grant.key.clone(),
                token: grant.token,
            })
        };
        self.check_shutdown();
        result
    }

    /// Shuts down within `budget`: new acquires are refused; queued acquires
    /// end Cancelled; acquires in flight are cancelled under the cancel
    /// policy; the release lane (including releases of grants that still
    /// arrive) drains; then the connection closes, every operation still
    /// open gets its outcome (releases `Lapsed`) and
    /// [`Event::ShutdownComplete`] is the last event. Grants the embedder
    /// still holds are not released behind its back.
    pub fn shutdown(&mut self, now: Time, budget: Duration) -> Result<(), Error> {
        self.advance(now);
        if self.shutdown.is_some() || matches!(self.link.state, LinkState::Finished) {
            return Err(Error::ShuttingDown);
        }
        self.shutdown = Some(self.now.saturating_add(budget));
        let mut sent_any = false;
        let indices: Vec<u32> = self.table.indices().collect();
        for idx in indices {
            let Some(Entry::Acquire(a)) = self.table.get(idx) else {
                continue;
            };
            match a.phase {
                AcquirePhase::Queued | AcquirePhase::Backoff => {
                    self.emit_outcome(idx, Outcome::Cancelled);
                    self.retire(idx);
                }
                AcquirePhase::Sent => match self.config.cancel {
                    CancelPolicy::Close => sent_any = true,
                    CancelPolicy::KeepWaiter => self.abandon_waiter(idx),
                },
                AcquirePhase::Abandoned => {}
            }
        }
        if sent_any {
            self.close(CloseReason::Cancel);
        }
        self.check_shutdown();
        Ok(())
    }

    // ----- inputs ---------------------------------------------------------

    /// The transport of `conn` is connected: the handshake starts.
    pub fn handle_connected(&mut self, now: Time, conn: ConnId) {
        self.advance(now);
        if matches!(self.link.current(conn), Some(Phase::Connecting { .. })) {
            self.on_connected();
        }
        self.check_shutdown();
    }

    /// Connecting `conn` failed. The client backs off, and forgets the
    /// leader hint if that is where it was connecting.
    pub fn handle_connect_failed(&mut self, now: Time, conn: ConnId) {
        self.advance(now);
        match self.link.current(conn) {
            Some(Phase::Connecting { .. }) => self.close(CloseReason::ConnectFailed),
            Some(_) => self.close(CloseReason::Io),
            None => {}
        }
        self.check_shutdown();
    }

    /// Bytes arrived on `conn`, in any chunking. Every frame in them is
    /// handled in order, until one closes the connection; the rest of the
    /// bytes are then ignored.
    pub fn handle_bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) {
        self.advance(now);
        if matches!(
            self.link.current(conn),
            Some(Phase::Handshaking { .. } | Phase::Ready { .. })
        ) {
            self.read(conn, data);
        }
        self.check_shutdown();
    }

    fn read(&mut self, conn: ConnId, data: &[u8]) {
        let mut reader = core::mem::take(&mut self.reader);
        let mut input = data;
        loop {
            // Whole answer lines straight from the input, while the
            // connection is ready: what the reader and the general parser
            // would make of them, without a pass to find each line's end.
            if reader.at_line_start() && self.is_ready() {
                if !self.read_answers(&mut input) {
                    break;
                }
                if input.is_empty() {
                    break;
                }
            }
            // Anything else, one line at a time.
            let Some(line) = reader.next_line(&mut input) else {
                break;
            };
            let verdict = match line {
                Err(e) => Err(CloseReason::Protocol(Violation::Framing(e))),
                Ok(line) => match ServerFrame::parse(line) {
                    Err(e) => Err(CloseReason::Protocol(Violation::Framing(e))),
                    Ok(frame) => self.on_frame(frame),
                },
            };
            if let Err(reason) = verdict {
                self.close(reason);
                break;
            }
        }
        if self.link.current(conn).is_some() {
            self.reader = reader;
        } else {
            // The connection closed: keep the buffer's memory, not its bytes.
            reader.reset();
            self.reader = reader;
        }
    }

    /// Handles the whole answer lines at the start of `input`, on a ready
    /// connection, advancing `input` past them; `false` if one closed the
    /// connection (the rest of the input is then to be ignored).
    ///
    /// Answers are handled one by one, in order, exactly as
    /// [`on_answer`](Client::on_answer) would one at a time, in batches of
    /// up to [`BATCH`] lines parsed first. Before a batch is handled, what
    /// handling it will read is read for all its answers at once, one step
    /// of the chain at a time: the ids' buckets and the requests' slots,
    /// then their keys' bytes. Answers are spread at random over memory
    /// larger than the caches, and this way the reads of a batch wait for
    /// memory together, a few times a batch, instead of a few times an
    /// answer.
    #[inline(never)]
    fn read_answers(&mut self, input: &mut &[u8]) -> bool {
        let placeholder = RawAnswer {
            id: 0,
            key: &[],
            kind: AnswerKind::Busy,
        };
        let mut batch = [placeholder; BATCH];
        let mut slots = [u32::MAX; BATCH];
        let mut found = [None; BATCH];
        loop {
            let mut len = 0;
            while len < BATCH {
                let Some((answer, used)) = crate::wire::leading_answer(input) else {
                    break;
                };
                *input = &input[used..];
                batch[len] = answer;
                len += 1;
            }
            if len == 0 {
                return true;
            }
            for ((answer, slot), found) in batch[..len].iter().zip(&mut slots).zip(&mut found) {
                *found = self.pending.find(answer.id);
                *slot = found.map_or(u32::MAX, |found| {
                    let slot = self.pending.slot(found);
                    black_box(self.table.touch(slot));
                    slot
                });
            }
            for &slot in &slots[..len] {
                if let Some(entry) = self.table.get(slot) {
                    black_box(entry.key().as_bytes().first().copied());
                }
            }
            for (answer, &found) in batch[..len].iter().zip(&found) {
                // Where its id was found, unless an answer before moved it.
                if let Err(reason) = self.on_answer_found(answer, found) {
                    self.close(reason);
                    return false;
                }
            }
            if len < BATCH {
                return true;
            }
        }
    }

    /// The transport of `conn` ended (end of stream, or an error).
    pub fn handle_transport_closed(&mut self, now: Time, conn: ConnId, end: TransportEnd) {
        self.advance(now);
        if self.link.current(conn).is_some() {
            self.close(match end {
                TransportEnd::Eof => CloseReason::Eof,
                TransportEnd::Error => CloseReason::Io,
            });
        }
        self.check_shutdown();
    }

    /// Time passed: fires every timer due at or before `now`. Calling it
    /// early, or more often than needed, is harmless.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
        self.check_shutdown();
    }

    // ----- outputs --------------------------------------------------------

    /// The next thing the driver must do: connect, send or close.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        if let Some(action) = self.actions.pop_front() {
            return Some(action);
        }
        let (conn, window) = match &self.link.state {
            LinkState::Up {
                conn,
                phase: Phase::Handshaking { .. },
            } => (conn.id, None),
            LinkState::Up {
                conn,
                phase: Phase::Ready { window, .. },
            } => (conn.id, Some(*window)),
            _ => return None,
        };
        match window {
            None => self.fill_hello(),
            Some(window) => self.fill_window(window),
        }
        let action = self.take_send(conn);
        // Releases that lapsed at send time may have finished a shutdown.
        self.check_shutdown();
        action
    }

    /// The next outcome or notice for the embedder.
    #[must_use]
    // Inlined into the driver, as `acquire`.
    #[inline]
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
        earliest(
            earliest(self.table.next_deadline(), self.link.deadline()),
            self.shutdown_deadline(),
        )
    }

    fn can_send(&self) -> bool {
        match &self.link.state {
            LinkState::Up {
                phase: Phase::Handshaking { hello_sent, .. },
                ..
            } => !hello_sent,
            LinkState::Up {
                phase: Phase::Ready { window, .. },
                ..
            } => self.has_sendable(*window),
            _ => false,
        }
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
    pub fn leader_hint(&self) -> Option<&crate::names::Endpoint> {
        self.link.hint.as_ref()
    }

    /// Requests unanswered on the current connection: all of them, and the
    /// acquires among them.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.pending.len(), self.acquires_in_flight)
    }

    /// Operations open: acquires, and the embedder's releases.
    pub fn open_operations(&self) -> (usize, usize) {
        (self.open_acquires, self.open_releases)
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

    // ----- internals ------------------------------------------------------

    fn shutdown_deadline(&self) -> Option<Time> {
        if self.is_finished() {
            None
        } else {
            self.shutdown
        }
    }

    /// Fires everything due at or before `now`, in deadline order, each at
    /// its own time.
    #[inline]
    fn advance(&mut self, now: Time) {
        let target = now.max(self.now);
        // Nothing due: the usual case, decided without the loop.
        let others = earliest(self.link.deadline(), self.shutdown_deadline());
        if others.map_or(true, |due| due > target) && self.table.none_due(target) {
            self.now = target;
            return;
        }
        self.advance_to(target);
    }

    /// [`advance`](Client::advance) when something is due.
    #[inline(never)]
    fn advance_to(&mut self, target: Time) {
        loop {
            let entry = self.table.next_deadline();
            let link = self.link.deadline();
            let shutdown = self.shutdown_deadline();
            let Some(next) = earliest(earliest(entry, link), shutdown) else {
                break;
            };
            if next > target {
                break;
            }
            self.now = self.now.max(next);
            if entry == Some(next) {
                let idx = self.table.pop_due(next).expect("due");
                self.fire(idx);
            } else if link == Some(next) {
                self.fire_link();
            } else {
                self.finish_shutdown();
            }
            self.check_shutdown();
        }
        self.now = target;
    }

    /// An entry's timer fired.
    fn fire(&mut self, idx: u32) {
        match self.table.get_mut(idx) {
            Some(Entry::Acquire(a)) => match a.phase {
                AcquirePhase::Queued => {
                    // It could not be sent in time.
                    let outcome = if a.attempts == 0 {
                        Outcome::TimedOut { sent: false }
                    } else {
                        // Every earlier attempt was refused with B.
                        Outcome::Busy
                    };
                    self.emit_outcome(idx, outcome);
                    self.retire(idx);
                }
                AcquirePhase::Backoff => {
                    a.phase = AcquirePhase::Queued;
                    let budget_end = a.budget_end;
                    let gen = self.table.gen(idx).expect("occupied");
                    self.queue.push_back(idx, gen);
                    self.table.set_timer(idx, budget_end, LANE_QUEUED);
                }
                AcquirePhase::Sent | AcquirePhase::Abandoned => {
                    self.close(CloseReason::AnswerTimeout)
                }
            },
            Some(Entry::Release(r)) => match r.phase {
                ReleasePhase::Queued => self.end_release(idx, ReleaseResult::Lapsed),
                ReleasePhase::Sent => self.close(CloseReason::AnswerTimeout),
            },
            Some(Entry::Held(_)) => {
                // Past its lease: the server has freed it.
                self.free(idx);
            }
            None => unreachable!("timers belong to occupied slots"),
        }
    }

    fn fire_link(&mut self) {
        match &self.link.state {
            LinkState::Down { .. } => self.connect(),
            LinkState::Up {
                phase: Phase::Connecting { .. },
                ..
            } => self.close(CloseReason::ConnectTimeout),
            LinkState::Up {
                phase: Phase::Handshaking { .. },
                ..
            } => self.close(CloseReason::HandshakeTimeout),
            LinkState::Up { .. } | LinkState::Finished => {}
        }
    }

    /// Puts the release just stored in `idx` at the back of the lane, with
    /// its deadline armed (`arm`; else it is armed already), and makes sure
    /// a connection is coming.
    fn enqueue_release(&mut self, idx: u32, arm: bool) -> OpId {
        let gen = self.table.gen(idx).expect("occupied");
        let Some(Entry::Release(release)) = self.table.get(idx) else {
            unreachable!("only releases enter the lane");
        };
        let until = release.until;
        self.lane.push_back(idx, gen);
        if arm {
            self.table.set_timer(idx, until, LANE_HELD);
        } else {
            #[cfg(test)]
            debug_assert_eq!(self.table.timer(idx), Some(until));
        }
        self.wake_link();
        OpId::new(idx, gen)
    }

    /// A release was queued: make sure a connection is coming.
    fn wake_link(&mut self) {
        if let LinkState::Down { until } = self.link.state {
            if until == Time::MAX {
                self.connect();
            }
        }
    }

    /// Finishes a shutdown whose work is done, or whose budget is spent.
    #[inline]
    fn check_shutdown(&mut self) {
        // Also when the budget is already spent (a zero budget): its
        // deadline is due now, and a command fires no timer by itself.
        if let Some(deadline) = self.shutdown {
            if !self.is_finished() && (!self.has_work_to_drain() || self.now >= deadline) {
                self.finish_shutdown();
            }
        }
    }

    /// Ends the shutdown, drained or not: closes, lapses every release still
    /// open, forgets held grants, and stops.
    fn finish_shutdown(&mut self) {
        self.finishing = true;
        self.close(CloseReason::Shutdown);
        let open: Vec<u32> = self.table.indices().collect();
        for idx in open {
            match self.table.get(idx) {
                Some(Entry::Release(_)) => self.end_release(idx, ReleaseResult::Lapsed),
                Some(Entry::Acquire(a)) => {
                    // Acquires end when the shutdown starts or at the close;
                    // should one remain, it was never handed out.
                    if a.phase != AcquirePhase::Abandoned {
                        self.emit_outcome(idx, Outcome::Cancelled);
                    }
                    self.retire(idx);
                }
                _ => {
                    self.free(idx);
                }
            }
        }
        self.link.state = LinkState::Finished;
        debug_assert_eq!(self.owners.uses(), 0, "every owner was handed back");
        self.events.push_back(Event::ShutdownComplete);
    }

    /// Queues the outcome of the operation in `idx` under its current id.
    fn emit_outcome(&mut self, idx: u32, outcome: Outcome) {
        let gen = self.table.gen(idx).expect("occupied");
        self.events.push_back(Event::Outcome {
            op: OpId::new(idx, gen),
            outcome,
        });
    }

    /// Empties slot `idx` (every slot is emptied here, so that the owner of
    /// an acquire is handed back), returning the key of its entry.
    #[inline]
    fn free(&mut self, idx: u32) -> Option<Key> {
        Some(match self.table.remove(idx)? {
            Entry::Acquire(acquire) => {
                self.owners.release(acquire.owner);
                acquire.key
            }
            Entry::Release(release) => release.key,
            Entry::Held(held) => held.key,
        })
    }

    /// Frees `idx`, keeping the counters true.
    fn retire(&mut self, idx: u32) {
        match self.table.get(idx) {
            Some(Entry::Acquire(a)) => {
                match a.phase {
                    AcquirePhase::Queued => self.queue.forget(&self.table),
                    AcquirePhase::Backoff | AcquirePhase::Sent => {}
                    AcquirePhase::Abandoned => {
                        self.free(idx);
                        return;
                    }
                }
                self.open_acquires -= 1;
            }
            Some(Entry::Release(r)) => {
                if r.phase == ReleasePhase::Queued {
                    self.lane.forget(&self.table);
                }
                if !r.orphan {
                    self.open_releases -= 1;
                }
            }
            Some(Entry::Held(_)) | None => {}
        }
        self.free(idx);
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
            .field("queued", &(self.queue.live(), self.lane.live()))
            .finish_non_exhaustive()
    }
}

/// The earlier of two optional deadlines.
fn earliest(a: Option<Time>, b: Option<Time>) -> Option<Time> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
