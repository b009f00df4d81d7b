//! What every adapter does around the client core, whatever its runtime:
//! turning the embedder's requests into commands, the core's outcomes into
//! replies, and grants whose caller has gone into exact-token releases.
//!
//! No protocol rule lives here. The shell only keeps the bookkeeping an
//! adapter needs (which reply belongs to which operation, what the latest
//! connection attempt's I/O error was) and hands every decision to the
//! core. Every adapter answers its callers through the same reply channel
//! ([`reply`](super::reply)) and supplies its own I/O.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::client::{
    AcquireOptions, Action, BackoffCause, Client, ClientStats, CloseReason, ConnId, Error, Event,
    Grant, OpId, Outcome,
};
use crate::hash::IdMap;
use crate::names::{Endpoint, Key, Name};
use crate::runtime::conn::{ConnState, Watch};
use crate::runtime::error::{AcquireError, ConnectError};
use crate::runtime::lease::{self, Guards};
use crate::runtime::notices::Sink;
use crate::runtime::reply::Sender;
use crate::runtime::tls;
use crate::time::Time;

/// A release's result as the adapters hand it out.
pub(crate) type OpResult = Result<Outcome, Error>;

/// An acquire's result as the adapters hand it out.
pub(crate) type AcquireResult = Result<Grant, AcquireError>;

/// How long an acquire waits for its turn unless told: as `ticketing run`.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// The lease an acquire asks for unless told: as `ticketing run`.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How long a drop waits, at most, for the work of a driver whose runtime
/// or program is going away: the releases it still has to send and have
/// answered (see the documentation of each adapter's `Lease`).
pub const EXIT_FLUSH: Duration = Duration::from_secs(1);

/// What an acquire asks for, as the adapters' builders collect it.
#[derive(Debug, Clone)]
pub(crate) struct AcquireArgs {
    pub(crate) key: Key,
    /// `None`: the client id.
    pub(crate) owner: Option<Name>,
    pub(crate) wait: Duration,
    pub(crate) lease: Duration,
    /// Renewed once granted; giving up while unreachable.
    pub(crate) options: AcquireOptions,
}

impl AcquireArgs {
    /// An acquire of `key` with the defaults: wait [`DEFAULT_WAIT`], lease
    /// [`DEFAULT_LEASE`], owned by the client id, not renewed.
    pub(crate) fn new(key: Key) -> AcquireArgs {
        AcquireArgs {
            key,
            owner: None,
            wait: DEFAULT_WAIT,
            lease: DEFAULT_LEASE,
            options: AcquireOptions::new(),
        }
    }
}

/// The setters every acquire builder has, the same in every adapter, for
/// a type with an `args: AcquireArgs` field.
macro_rules! acquire_options {
    () => {
        /// How long to wait for the key, in total, across every attempt
        /// (default 10 s; `Duration::ZERO`: try once). Until a connection
        /// can take it, the acquire waits for one at least the client's
        /// `queue_grace` (2 s by default), so that a try-lock made before the
        /// connection is up is still tried.
        pub fn wait(mut self, wait: std::time::Duration) -> Self {
            self.args.wait = wait;
            self
        }

        /// The lease to ask for (default 30 s): how long the key is held
        /// unless released or renewed. The server may grant less (its
        /// maximum); the grant says what it gave.
        pub fn lease(mut self, lease: std::time::Duration) -> Self {
            self.args.lease = lease;
            self
        }

        /// Renews the grant automatically, a third of the way through each
        /// lease, until it is released (each renewal asks for the
        /// [`lease`](Self::lease)).
        pub fn renew(mut self) -> Self {
            self.args.options = self.args.options.renewing(None);
            self
        }

        /// Renews the grant automatically, as [`renew`](Self::renew) does,
        /// for at most `limit` of holding: no renewal is sent after it, so
        /// that a holder that hangs cannot keep the key for ever.
        pub fn renew_for(mut self, limit: std::time::Duration) -> Self {
            self.args.options = self.args.options.renewing(Some(limit));
            self
        }

        /// The owner named in the request (default: the client id). The
        /// server only shows it; what proves a grant is its fencing token.
        pub fn owner(mut self, owner: crate::names::Name) -> Self {
            self.args.owner = Some(owner);
            self
        }

        /// Gives up at once while the service is unreachable, instead of
        /// waiting for a connection as long as the wait allows: when the
        /// client's last round of connection attempts failed at every
        /// address and no connection is up, the acquire ends at once,
        /// [`AcquireError::TimedOut`](crate::runtime::error::AcquireError::TimedOut)
        /// never sent, with how the latest attempt ended. For a caller
        /// that would rather turn elsewhere at once. The client-wide
        /// default is
        /// [`Config::give_up_while_unreachable`](crate::client::Config::give_up_while_unreachable)
        /// (off); `false` here waits whatever it says.
        pub fn give_up_while_unreachable(mut self, give_up: bool) -> Self {
            self.args.options = self.args.options.give_up_while_unreachable(give_up);
            self
        }
    };
}
pub(crate) use acquire_options;

/// A request from the embedder to the driver.
pub(crate) enum Command {
    Acquire {
        ticket: u64,
        args: AcquireArgs,
        /// The guard that will hold the grant, kept up to date.
        guard: Option<Arc<lease::Shared>>,
        reply: Sender<AcquireResult>,
    },
    Release {
        grant: Grant,
        reply: Sender<OpResult>,
    },
    ReleaseToken {
        key: Key,
        token: u64,
        reply: Sender<OpResult>,
    },
    /// Cancel the acquire with this ticket (its caller went away, or asked).
    Cancel { ticket: u64 },
    /// A grant its receiver could not take: release it by exact token.
    Undeliverable { grant: Grant },
    /// Renew a held grant once.
    Renew {
        grant: Grant,
        lease: Option<Duration>,
        reply: Sender<Result<(), Error>>,
    },
    /// Start (for at most `limit`) or stop renewing a held grant.
    AutoRenew {
        grant: Grant,
        on: bool,
        limit: Option<Duration>,
        reply: Sender<Result<(), Error>>,
    },
    /// A guard went away without a release: release its grant by exact
    /// token (which stops its renewal); its outcome to `reply`, if the
    /// guard waits for it.
    DropGuard {
        grant: Grant,
        reply: Option<Sender<OpResult>>,
    },
    /// A guard's grant is left to run out: no more renewal.
    LetExpire { grant: Grant },
    /// The core's counters.
    Stats { reply: Sender<ClientStats> },
    /// Answered once a server has taken the client, or once a round of
    /// attempts has failed (with how its latest attempt ended).
    Connected {
        reply: Sender<Result<(), ConnectError>>,
    },
    /// Answered once no release is left to send or to be answered.
    #[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
    Flush { reply: Sender<()> },
    Shutdown {
        budget: Duration,
        reply: Sender<Result<(), Error>>,
    },
}

impl Command {
    /// What the core must hear when the caller of the acquire `ticket`
    /// goes away, given what its reply slot held (`taken`, handed back by
    /// giving the slot up): a grant nobody will take is released by exact
    /// token, an acquire still under way is cancelled, any other outcome
    /// needs nothing.
    pub(crate) fn for_abandoned(ticket: u64, taken: Option<AcquireResult>) -> Option<Self> {
        match taken {
            Some(Ok(grant)) => Some(Command::Undeliverable { grant }),
            Some(Err(_)) => None,
            None => Some(Command::Cancel { ticket }),
        }
    }
}

/// The I/O an adapter performs for the core's actions.
pub(crate) trait Io {
    fn connect(&mut self, conn: ConnId, addr: Endpoint);
    fn send(&mut self, conn: ConnId, data: Bytes);
    fn close(&mut self, conn: ConnId);
}

/// Who waits for an operation's outcome.
enum Waiter {
    /// The caller of the acquire of this ticket.
    Acquire {
        ticket: u64,
        reply: Sender<AcquireResult>,
    },
    Release(Sender<OpResult>),
}

/// Where the connection stands, as the core's notices tell it: what
/// `connected()` answers, and what the cause of an acquire that could not
/// be sent is shown with.
#[derive(Default)]
struct Standing {
    /// A server took the client (`W`), and the connection has not ended.
    welcomed: bool,
    /// A whole round refused the client; until the next `W`.
    misconfigured: bool,
    /// How the latest attempt ended, since the last `W`.
    last_failure: Option<ConnectError>,
    /// The connector's error for the connect that just failed, for the
    /// `Closed` notice that comes of it.
    dial_error: Option<Arc<io::Error>>,
    /// Callers of `connected()`.
    waiters: Vec<Sender<Result<(), ConnectError>>>,
    /// When the last connection a server took ended (`None`: none has
    /// yet, so since the start).
    down_since: Option<Instant>,
}

impl Standing {
    fn answer(&mut self, result: &Result<(), ConnectError>) {
        for reply in self.waiters.drain(..) {
            let _ = reply.send(result.clone());
        }
    }
}

/// The core plus the adapter's bookkeeping.
pub(crate) struct Shell {
    client: Client,
    start: Instant,
    waiters: IdMap<OpId, Waiter>,
    tickets: IdMap<u64, OpId>,
    shutdown_waiters: Vec<Sender<Result<(), Error>>>,
    flush_waiters: Vec<Sender<()>>,
    guards: Guards,
    link: Standing,
    /// Where the connection stands, published to every handle.
    conn: Arc<Watch>,
    /// Whether the connector runs TLS: a plain client's connection that
    /// ends before the server's hello hints at TLS.
    tls: bool,
    notices: Sink,
    /// When the counters were last published (feature `metrics`).
    #[cfg(feature = "metrics")]
    published: Option<Instant>,
}

impl Shell {
    /// A shell around `client`, whose times count from `start`.
    pub(crate) fn new(client: Client, start: Instant, notices: Sink) -> Self {
        Shell {
            client,
            start,
            waiters: IdMap::default(),
            tickets: IdMap::default(),
            shutdown_waiters: Vec::new(),
            flush_waiters: Vec::new(),
            guards: Guards::new(start),
            link: Standing::default(),
            conn: Watch::new(start),
            tls: false,
            notices,
            #[cfg(feature = "metrics")]
            published: None,
        }
    }

    /// The same, its connector running TLS (`tls`) or not.
    pub(crate) fn over_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Where the connection stands, as this shell publishes it.
    pub(crate) fn conn_watch(&self) -> Arc<Watch> {
        Arc::clone(&self.conn)
    }

    /// The core's time for the present instant.
    pub(crate) fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    /// The core's time for `instant`.
    pub(crate) fn time_of(&self, instant: Instant) -> Time {
        let since = instant.saturating_duration_since(self.start);
        Time::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The instant of the core's next deadline (`None`: none, or beyond
    /// what `Instant` can represent).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let at = self.client.poll_timeout()?;
        self.start.checked_add(Duration::from_nanos(at.as_nanos()))
    }

    /// Whether the core has shut down and has nothing left to hand out.
    pub(crate) fn is_done(&self) -> bool {
        self.client.is_finished() && self.client.poll_timeout().is_none()
    }

    /// Whether a server has taken the client and the connection is up.
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn is_connected(&self) -> bool {
        self.link.welcomed
    }

    /// Whether releases are still to be sent or answered, or grants are
    /// held: what a driver whose runtime went away must still finish.
    #[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
    pub(crate) fn has_work_to_finish(&self) -> bool {
        !self.client.is_finished() && (self.release_work() || self.client.stats().held > 0)
    }

    /// Whether a release (the embedder's, or one the client issued itself)
    /// has not ended yet.
    fn release_work(&self) -> bool {
        let s = self.client.stats();
        let orphans_ended = s.orphans.released + s.orphans.not_held + s.orphans.lapsed;
        s.releases_open > 0 || s.orphan_releases > orphans_ended
    }

    /// Whether notices are held back because their reader is behind: the
    /// driver then reads no input, and `cx` is woken when there is room.
    pub(crate) fn notices_full(&mut self, cx: &std::task::Context<'_>) -> bool {
        self.notices.is_full(cx)
    }

    /// From now on notices go nowhere (but to `tracing`): their reader is
    /// on a runtime that went away, and must not hold the driver up.
    #[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
    pub(crate) fn drop_notices(&mut self) {
        self.notices = Sink::Nowhere;
    }

    pub(crate) fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// A connect attempt failed with `error`: the core is told (as a TLS
    /// failure if the error carries one), and the error is kept for the
    /// `Closed` notice that comes of it.
    pub(crate) fn connect_failed(&mut self, now: Time, conn: ConnId, error: io::Error) {
        if self.client.connection() == Some(conn) {
            self.link.dial_error = Some(Arc::new(error));
            let error = self.link.dial_error.as_deref().expect("just set");
            tls::connect_failed(&mut self.client, now, conn, error);
        }
    }

    /// Carries out one command.
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn command(&mut self, command: Command) {
        self.command_at(self.now(), command);
    }

    /// Carries out one command at `now` (the core's time, from
    /// [`now`](Shell::now): one reading may serve several commands).
    pub(crate) fn command_at(&mut self, now: Time, command: Command) {
        match command {
            Command::Acquire {
                ticket,
                args,
                guard,
                reply,
            } => {
                let AcquireArgs {
                    key,
                    owner,
                    wait,
                    lease,
                    options,
                } = args;
                let owner = owner.unwrap_or_else(|| self.client.config().client_id.clone());
                let started = self
                    .client
                    .acquire_with(now, key, owner, wait, lease, options);
                match started {
                    Ok(op) => {
                        if let Some(guard) = guard {
                            self.guards.expect(op, guard);
                        }
                        self.waiters.insert(op, Waiter::Acquire { ticket, reply });
                        self.tickets.insert(ticket, op);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(self.refusal(e)));
                    }
                }
            }
            Command::Release { grant, reply } => {
                self.guards.forget(&grant);
                let started = self.client.release(now, &grant);
                self.await_release(started, reply);
            }
            Command::ReleaseToken { key, token, reply } => {
                let started = self.client.release_token(now, key, token);
                self.await_release(started, reply);
            }
            Command::Cancel { ticket } => {
                if let Some(op) = self.tickets.remove(&ticket) {
                    // An operation that already ended is no error here: its
                    // outcome finds no receiver, and a grant goes back.
                    let _ = self.client.cancel(now, op);
                }
            }
            Command::Undeliverable { grant } => {
                // A grant already released or expired needs nothing more.
                let _ = self.client.undeliverable(now, &grant);
            }
            Command::Renew {
                grant,
                lease,
                reply,
            } => {
                let _ = reply.send(self.client.renew(now, &grant, lease));
            }
            Command::AutoRenew {
                grant,
                on,
                limit,
                reply,
            } => {
                let result = match on {
                    true => self.client.auto_renew(now, &grant, limit),
                    false => self.client.stop_renewing(now, &grant),
                };
                let _ = reply.send(result);
            }
            Command::DropGuard { grant, reply } => {
                self.guards.forget(&grant);
                // Released or gone already: nothing more to do.
                let started = self.client.release(now, &grant);
                if let Some(reply) = reply {
                    self.await_release(started, reply);
                }
            }
            Command::LetExpire { grant } => {
                self.guards.forget(&grant);
                let _ = self.client.stop_renewing(now, &grant);
            }
            Command::Stats { reply } => {
                let _ = reply.send(self.client.stats());
            }
            Command::Connected { reply } => {
                if self.link.welcomed {
                    let _ = reply.send(Ok(()));
                } else if self.client.is_finished() {
                    let _ = reply.send(Err(ConnectError::stopped()));
                } else if let Some(failure) = self
                    .link
                    .last_failure
                    .as_ref()
                    .filter(|_| self.link.misconfigured)
                {
                    // As the core refuses acquires: at once, with the cause.
                    let _ = reply.send(Err(failure.clone()));
                } else {
                    self.link.waiters.push(reply);
                }
            }
            Command::Flush { reply } => self.flush_waiters.push(reply),
            Command::Shutdown { budget, reply } => match self.client.shutdown(now, budget) {
                Ok(()) => self.shutdown_waiters.push(reply),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
        }
    }

    /// Publishes the core's counters to the `metrics` facade, at most once
    /// a second.
    #[cfg(feature = "metrics")]
    fn publish(&mut self) {
        let now = Instant::now();
        if self
            .published
            .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
        {
            return;
        }
        self.published = Some(now);
        crate::metrics::record_client(&self.client.stats());
    }

    /// Keeps `reply` for the outcome of the release just `started`, or
    /// answers at once with its refusal.
    fn await_release(&mut self, started: Result<OpId, Error>, reply: Sender<OpResult>) {
        match started {
            Ok(op) => {
                self.waiters.insert(op, Waiter::Release(reply));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// Drains the core: actions to `io`, outcomes to their callers, notices
    /// to the notice sink. A grant whose caller is gone is handed back to
    /// the core, which releases it by its exact token. Returns how many
    /// outcomes went to callers (each may wake a task).
    pub(crate) fn pump(&mut self, io: &mut impl Io) -> usize {
        #[cfg(feature = "metrics")]
        self.publish();
        let mut delivered = 0;
        loop {
            while let Some(action) = self.client.poll_action() {
                match action {
                    Action::Connect { conn, addr } => io.connect(conn, addr),
                    Action::Send { conn, data } => io.send(conn, data),
                    Action::Close { conn } => io.close(conn),
                }
            }
            let Some(event) = self.client.poll_event() else {
                break;
            };
            match event {
                Event::Outcome { op, outcome } => {
                    delivered += 1;
                    self.deliver(op, outcome);
                }
                Event::ShutdownComplete => {
                    // Stopped before the callers of `shutdown` hear it.
                    self.conn.stop();
                    for reply in self.shutdown_waiters.drain(..) {
                        let _ = reply.send(Ok(()));
                    }
                    self.link.answer(&Err(ConnectError::stopped()));
                    #[cfg(feature = "tracing")]
                    crate::runtime::trace::notice(&Event::ShutdownComplete, None);
                    self.notices.notify(Event::ShutdownComplete);
                }
                other => {
                    self.observe(&other);
                    self.notices.notify(other);
                }
            }
        }
        if !self.flush_waiters.is_empty() && !self.release_work() {
            for reply in self.flush_waiters.drain(..) {
                let _ = reply.send(());
            }
        }
        delivered
    }

    /// Follows where the connection stands from a notice, and publishes
    /// it to the handles, then to the guards, before `connected()` is
    /// answered: whoever hears of a connection finds the others told.
    fn observe(&mut self, event: &Event) {
        let plain = !self.tls;
        let link = &mut self.link;
        let mut failure = None;
        let mut publish = None;
        match event {
            Event::Connected { addr, node, .. } => {
                link.welcomed = true;
                link.misconfigured = false;
                link.last_failure = None;
                publish = Some(ConnState::Connected {
                    addr: addr.clone(),
                    node: node.clone(),
                    since: Instant::now(),
                });
            }
            Event::Closed { addr, reason } => {
                // No `W` came on this connection: its end may be a TLS
                // server's to a plain client.
                let before_hello = !link.welcomed;
                let ended = std::mem::replace(&mut link.welcomed, false);
                if ended {
                    link.down_since = Some(Instant::now());
                }
                let io = match reason {
                    CloseReason::ConnectFailed | CloseReason::Tls(_) => link.dial_error.take(),
                    _ => None,
                };
                link.dial_error = None;
                if !matches!(reason, CloseReason::Shutdown | CloseReason::Cancel) {
                    let mut end = ConnectError::new(Some(addr.clone()), reason.clone(), io);
                    if plain && before_hello {
                        end = end.plain_before_hello();
                    }
                    failure = Some(end.clone());
                    link.last_failure = Some(end);
                }
                if ended || failure.is_some() {
                    publish = Some(ConnState::Disconnected {
                        since: link.down_since.unwrap_or(self.start),
                        last_error: link.last_failure.clone(),
                    });
                }
            }
            // A round failed: its latest attempt says why.
            Event::Backoff { cause, .. }
                if *cause != BackoffCause::Busy && !link.waiters.is_empty() =>
            {
                let why = link
                    .last_failure
                    .clone()
                    .unwrap_or_else(|| ConnectError::new(None, CloseReason::ConnectFailed, None));
                link.answer(&Err(why));
            }
            Event::Misconfigured { .. } => link.misconfigured = true,
            _ => {}
        }
        // The handles first: a guard told of a connection finds it there.
        if let Some(conn) = publish {
            self.conn.set(conn);
        }
        self.guards.notice(event, self.link.welcomed);
        if let Event::Connected { .. } = event {
            self.link.answer(&Ok(()));
        }
        #[cfg(feature = "tracing")]
        crate::runtime::trace::notice(event, failure.as_ref());
        #[cfg(not(feature = "tracing"))]
        let _ = failure;
    }

    /// Why an acquire was kept from being sent, or refused, by `reason`:
    /// the latest attempt's end if that is what it was, with its address
    /// and I/O error.
    fn cause(&self, reason: CloseReason) -> ConnectError {
        match &self.link.last_failure {
            Some(failure) if *failure.reason() == reason => failure.clone(),
            _ => ConnectError::new(None, reason, None),
        }
    }

    /// An acquire the core refused at once, as the adapters say it.
    fn refusal(&self, error: Error) -> AcquireError {
        match error {
            Error::Busy => AcquireError::Busy,
            Error::Misconfigured(reason) => AcquireError::Misconfigured(self.cause(reason)),
            other => AcquireError::Refused(other),
        }
    }

    /// An acquire's outcome, as the adapters hand it out. One never sent
    /// for a refusal (a credential, a version, TLS trust) is
    /// [`AcquireError::Misconfigured`], as the core's refusal of a new
    /// acquire is ([`refusal`](Shell::refusal)): the core says `TimedOut`
    /// with that cause for the acquires that waited for a connection, and
    /// the adapters give the one answer, whichever came first.
    fn acquire_result(&self, outcome: Outcome) -> AcquireResult {
        Err(match outcome {
            Outcome::Granted(grant) => return Ok(grant),
            Outcome::TimedOut { sent, cause } => {
                let cause = cause.map(|reason| self.cause(reason));
                match cause {
                    Some(cause) if !sent && cause.is_refusal() => {
                        AcquireError::Misconfigured(cause)
                    }
                    cause => AcquireError::TimedOut { sent, cause },
                }
            }
            Outcome::Busy => AcquireError::Busy,
            Outcome::Cancelled => AcquireError::Cancelled,
            Outcome::Indeterminate { settles_by } => AcquireError::Indeterminate {
                settles_by: lease::instant_of(self.start, settles_by),
            },
            Outcome::Released | Outcome::NotHeld | Outcome::Lapsed => {
                unreachable!("an acquire ends granted, timed out, busy, cancelled or indeterminate")
            }
        })
    }

    fn deliver(&mut self, op: OpId, outcome: Outcome) {
        let undelivered = match self.waiters.remove(&op) {
            Some(Waiter::Acquire { ticket, reply }) => {
                self.tickets.remove(&ticket);
                // The guard is kept up to date before its caller can look.
                self.guards.acquired(op, &outcome);
                let result = self.acquire_result(outcome);
                match reply.send(result) {
                    Err(Ok(grant)) => {
                        self.guards.forget(&grant);
                        Some(grant)
                    }
                    _ => None,
                }
            }
            Some(Waiter::Release(reply)) => {
                let _ = reply.send(Ok(outcome));
                None
            }
            None => match outcome {
                Outcome::Granted(grant) => Some(grant),
                _ => None,
            },
        };
        if let Some(grant) = undelivered {
            let now = self.now();
            let _ = self.client.undeliverable(now, &grant);
        }
    }
}

impl Drop for Shell {
    /// Its driver has ended (or was dropped with nothing to finish): the
    /// client connects no more, whatever it last said.
    fn drop(&mut self) {
        self.conn.stop();
    }
}
