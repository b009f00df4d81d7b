//! The async driver shared by the tokio and futures-io adapters: one future
//! that owns the client core and its connection, and the cloneable
//! [`Handle`] that tasks use to reach it.
//!
//! The driver is written against two small traits, [`Transport`] (read and
//! write bytes) and [`Clock`] (wake me at an instant; run a driver on a
//! thread of its own), so that each runtime adapter is only the glue
//! between those traits and its runtime.
//!
//! Requests reach the driver through one queue behind a lock (the
//! [`Inbox`]), which the driver swaps for an empty one: a request allocates
//! nothing of its own, and a batch of them wakes the driver once. Each
//! request's answer comes back through a one-value slot shared by the
//! driver and the caller's future.
//!
//! # When the runtime goes away
//!
//! A runtime that shuts down drops its tasks without polling them (that is
//! what happens when `#[tokio::main]` returns). A driver dropped so while
//! it still has work to finish (releases to send or to be answered, grants
//! held) moves to a thread of its own with a runtime of its own, over a new
//! connection, and goes on there as it would have: the core decides, as
//! ever. The drop waits, at most [`EXIT_FLUSH`], until no release is left;
//! a guard dropped later (by a task the runtime drops after the driver)
//! waits as long at most for its own release, and so does the last handle
//! for the client's end. A wait that runs out makes the later ones not
//! wait: a server that cannot be reached holds the program up once.

use std::collections::VecDeque;
use std::future::{Future, IntoFuture};
use std::io;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::client::{
    Client, ClientStats, Config, ConfigError, ConnId, Error, Grant, Outcome, TransportEnd,
};
use crate::names::{Endpoint, Key};
use crate::runtime::error::{AcquireError, ConnectError, RequestError, RunError};
use crate::runtime::lease::{self, HeldGrant, LeaseStatus};
use crate::runtime::notices::Sink;
use crate::runtime::reply::{self, Receiver};
use crate::runtime::shell::{
    acquire_options, AcquireArgs, AcquireResult, Command, Io, Shell, EXIT_FLUSH,
};
use crate::sync::lock;
use crate::sync::register;
use crate::time::Time;

/// A connected byte stream, as the driver sees it.
pub(crate) trait Transport: Send + Unpin + 'static {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>>;
    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>>;
    /// Writes out what the stream holds of what it was given (a TLS
    /// stream's records).
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// The future of a driver that goes on on a thread of its own.
pub(crate) type Detached = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A timer of the runtime, and a runtime of the same kind on a thread of
/// its own.
pub(crate) trait Clock: Send + Unpin + 'static {
    fn new() -> Self;
    /// Ready once `at` has passed.
    fn poll_until(&mut self, cx: &mut Context<'_>, at: Instant) -> Poll<()>;
    /// Has the task polled again once the other tasks that are ready have
    /// had their turn (at the latest).
    fn defer(&mut self, cx: &mut Context<'_>) {
        cx.waker().wake_by_ref();
    }
    /// Runs `driver` to its end on a new thread, with a runtime of its own:
    /// where a driver whose runtime went away finishes its work.
    fn run_detached(driver: Detached) -> io::Result<()>;
}

/// Opens transports.
pub(crate) trait Dial: Send + Sync + Unpin + 'static {
    type Transport: Transport;
    fn dial(
        &self,
        addr: Endpoint,
    ) -> Pin<Box<dyn Future<Output = io::Result<Self::Transport>> + Send>>;
}

/// Where the handles leave their requests for the driver: one queue behind
/// a lock, which the driver swaps for an empty one, so that a request costs
/// no allocation of its own and a batch of them one wake of the driver.
struct Inbox {
    state: Mutex<InboxState>,
    /// Handles, acquire futures and cancellers alive: at 0 the driver shuts
    /// the client down.
    senders: AtomicUsize,
    /// The driver has ended (set once, for those who wait for a detached
    /// driver's end).
    ended: Mutex<bool>,
    ended_now: Condvar,
    /// A wait for a detached driver ran out: the later ones do not wait.
    stalled: AtomicBool,
}

struct InboxState {
    commands: Vec<Command>,
    /// The driver's waker, while it wants to be woken by a request. Taken
    /// by the request that wakes it.
    driver: Option<Waker>,
    /// How many requests must be queued for one to wake the driver: 0
    /// (any) unless the driver holds requests back, when only the request
    /// that completes the batch it waits for wakes it.
    wake_at: usize,
    /// The driver is gone: requests are refused.
    closed: bool,
    /// The driver's runtime went away and it goes on on a thread of its
    /// own: a guard or the last handle dropped now waits for its work.
    detached: bool,
}

impl Inbox {
    /// Waits at most [`EXIT_FLUSH`] for `done` (for a detached driver's
    /// work); unless a wait already ran out.
    fn wait_detached<T>(&self, done: impl FnOnce(Duration) -> Option<T>) {
        if self.stalled.load(Ordering::Relaxed) {
            return;
        }
        if done(EXIT_FLUSH).is_none() {
            self.stalled.store(true, Ordering::Relaxed);
        }
    }

    /// The driver has ended.
    fn end(&self) {
        *lock(&self.ended) = true;
        self.ended_now.notify_all();
    }

    /// Blocks until the driver has ended, at most `limit`; `None` if it
    /// has not.
    fn wait_end(&self, limit: Duration) -> Option<()> {
        let ended = lock(&self.ended);
        let (ended, _) = self
            .ended_now
            .wait_timeout_while(ended, limit, |ended| !*ended)
            .unwrap_or_else(PoisonError::into_inner);
        ended.then_some(())
    }
}

/// One sender of requests (a handle, an acquire future or a canceller).
#[derive(Debug)]
struct Sender(Arc<Inbox>);

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("senders", &self.senders.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Sender {
    /// Queues `command` for the driver (`Err`: the driver is gone).
    fn send(&self, command: Command) -> Result<(), Command> {
        let mut command = Some(command);
        self.send_with(|_| command.take().expect("made once"))
            .map(drop)
            .map_err(|()| command.take().expect("not made"))
    }

    /// Queues the command `make` makes, told whether the driver goes on on
    /// a thread of its own (under the lock that queues it, so that this
    /// holds when the driver takes it); whether it does (`Err`: the driver
    /// is gone, and `make` was not called).
    fn send_with(&self, make: impl FnOnce(bool) -> Command) -> Result<bool, ()> {
        let (waker, detached) = {
            let mut state = lock(&self.0.state);
            if state.closed {
                return Err(());
            }
            let command = make(state.detached);
            state.commands.push(command);
            let waker = match state.commands.len() >= state.wake_at {
                true => state.driver.take(),
                false => None,
            };
            (waker, state.detached)
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(detached)
    }
}

impl Clone for Sender {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::Relaxed);
        Sender(Arc::clone(&self.0))
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last one: the driver shuts the client down.
            let (waker, detached) = {
                let mut state = lock(&self.0.state);
                (state.driver.take(), state.detached)
            };
            if let Some(waker) = waker {
                waker.wake();
            }
            if detached {
                self.0.wait_detached(|limit| self.0.wait_end(limit));
            }
        }
    }
}

/// How long after handing out outcomes the driver holds back requests, one
/// runtime turn at a time, for the callers it woke to send theirs too.
const BATCH_WAIT: Duration = Duration::from_millis(1);

/// Requests that go out at once even while the driver holds requests back:
/// the server starts on them while the callers still to run write theirs,
/// rather than every caller waiting for the slowest of its wave.
const BATCH_SIZE: usize = 64;

/// Budget of the shutdown that starts when every handle is dropped.
const ORPHANED_SHUTDOWN: Duration = Duration::from_secs(5);

/// A cloneable handle on a client whose driver runs on an async runtime.
/// Every clone shares the one connection.
#[derive(Clone, Debug)]
pub struct Handle {
    commands: Sender,
    tickets: Arc<AtomicU64>,
    start: Instant,
}

impl Handle {
    /// The client core's time now: the core's times ([`Grant::valid_until`],
    /// [`Grant::expires_by`]) count from the same origin.
    pub fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    /// The client core's time for `instant`.
    pub fn time_of(&self, instant: Instant) -> Time {
        let since = instant.saturating_duration_since(self.start);
        Time::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The instant of a client core's time (`None` beyond what `Instant`
    /// can represent).
    pub fn instant_of(&self, time: Time) -> Option<Instant> {
        self.start
            .checked_add(Duration::from_nanos(time.as_nanos()))
    }

    /// Waits until a server has taken the client (its handshake was
    /// accepted), or until a whole round of connection attempts has failed:
    /// then `Err` says how the round's latest attempt ended (the I/O error
    /// of a failed connect, a TLS handshake refused, a credential refused,
    /// ...). At once when the client is connected, and at once with the
    /// cause when every server refused it (a wrong credential: acquires
    /// are refused too). While the client backs off between rounds, this
    /// waits for the next round.
    ///
    /// The client keeps trying whatever this says; it is a way to learn
    /// early, at start, that the configuration or the network is wrong.
    pub fn connected(&self) -> impl Future<Output = Result<(), ConnectError>> + Send + 'static {
        let (reply, rx) = reply::channel();
        let sent = self.request(Command::Connected { reply });
        async move {
            if sent.is_err() {
                return Err(ConnectError::stopped());
            }
            std::future::poll_fn(|cx| rx.poll(cx))
                .await
                .unwrap_or_else(|| Err(ConnectError::stopped()))
        }
    }

    /// An acquire of `key`: set how long to wait, the lease, renewal and
    /// the owner, then `.await` it for the grant (a plain [`Grant`], the
    /// caller's to release; [`lock`](Handle::lock) gives a guard instead).
    ///
    /// ```no_run
    /// # async fn demo(handle: ticketing::tokio::Handle) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ticketing::Key;
    ///
    /// let grant = handle
    ///     .acquire(Key::new("invoices")?)
    ///     .wait(Duration::from_secs(5))
    ///     .lease(Duration::from_secs(30))
    ///     .await?;
    /// // ... write to storage, quoting grant.token() ...
    /// handle.release(&grant).await?;
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self, key: Key) -> AcquireBuilder {
        AcquireBuilder {
            handle: self.clone(),
            args: AcquireArgs::new(key),
        }
    }

    /// A lock of `key`: set how long to wait, the lease, renewal and the
    /// owner, then `.await` it for a [`Lease`], a guard that releases the
    /// grant by exact token when dropped; or hand it work to
    /// [`run`](LockBuilder::run) under the lock.
    ///
    /// ```no_run
    /// # async fn demo(handle: ticketing::tokio::Handle) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ticketing::Key;
    ///
    /// let lease = handle.lock(Key::new("invoices")?).lease(Duration::from_secs(10)).renew().await?;
    /// // ... write to storage, quoting lease.token() ...
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, key: Key) -> LockBuilder {
        LockBuilder {
            handle: self.clone(),
            args: AcquireArgs::new(key),
        }
    }

    /// The client core's counters ([`Client::stats`](crate::client::Client::stats)).
    pub fn stats(
        &self,
    ) -> impl Future<Output = Result<ClientStats, RequestError>> + Send + 'static {
        let (reply, rx) = reply::channel();
        let sent = self.request(Command::Stats { reply });
        async move {
            sent?;
            std::future::poll_fn(|cx| rx.poll(cx))
                .await
                .ok_or(RequestError::Stopped)
        }
    }

    /// Renews a held grant once, asking for `lease` (`None`: its acquire's).
    /// Resolves when the renewal is queued; the core's notices tell how it
    /// went.
    pub fn renew(
        &self,
        grant: &Grant,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<(), RequestError>> + Send + 'static {
        let grant = grant.clone();
        ask(&self.commands, |reply| Command::Renew {
            grant,
            lease,
            reply,
        })
    }

    /// Starts (`on`, for at most `limit`) or stops renewing a held grant
    /// automatically.
    pub fn auto_renew(
        &self,
        grant: &Grant,
        on: bool,
        limit: Option<Duration>,
    ) -> impl Future<Output = Result<(), RequestError>> + Send + 'static {
        let grant = grant.clone();
        ask(&self.commands, |reply| Command::AutoRenew {
            grant,
            on,
            limit,
            reply,
        })
    }

    fn start_acquire(&self, args: AcquireArgs, guard: Option<Arc<lease::Shared>>) -> Acquire {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = reply::channel();
        let command = Command::Acquire {
            ticket,
            args,
            guard,
            reply,
        };
        let sent = self.commands.send(command).is_ok();
        Acquire {
            rx,
            ticket,
            commands: self.commands.clone(),
            done: !sent,
        }
    }

    /// Releases a grant by its exact token. Resolves to `Released`,
    /// `NotHeld` or `Lapsed`. The release is queued when this is called,
    /// not when the future is first polled, and dropping the future does
    /// not stop it: a release is always settled.
    pub fn release(
        &self,
        grant: &Grant,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static {
        let grant = grant.clone();
        ask(&self.commands, |reply| Command::Release { grant, reply })
    }

    /// Hands back a grant that can no longer be used (its receiver went
    /// away): the client releases it by its exact token.
    pub fn undeliverable(&self, grant: Grant) -> Result<(), RequestError> {
        self.request(Command::Undeliverable { grant })
    }

    /// Releases a raw `(key, token)` whose lease this client never saw.
    /// Queued when this is called, like [`release`](Handle::release).
    pub fn release_token(
        &self,
        key: Key,
        token: u64,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static {
        ask(&self.commands, |reply| Command::ReleaseToken {
            key,
            token,
            reply,
        })
    }

    /// Shuts down: new acquires are refused, acquires in flight are
    /// cancelled under the cancel policy, the release lane drains within
    /// `budget`, then the connection closes. Starts when this is called;
    /// the future resolves when that is done.
    pub fn shutdown(
        &self,
        budget: Duration,
    ) -> impl Future<Output = Result<(), RequestError>> + Send + 'static {
        ask(&self.commands, |reply| Command::Shutdown { budget, reply })
    }

    fn request(&self, command: Command) -> Result<(), RequestError> {
        request(&self.commands, command)
    }
}

/// An acquire to make ([`Handle::acquire`]): set what it asks for, then
/// `.await` it for the [`Grant`]. Nothing is asked until then.
#[must_use = "an acquire is only made when awaited (or started)"]
#[derive(Debug)]
pub struct AcquireBuilder {
    handle: Handle,
    args: AcquireArgs,
}

impl AcquireBuilder {
    acquire_options!();

    /// Makes the acquire now and hands back its future, whose
    /// [`canceller`](Acquire::canceller) can cancel it from elsewhere.
    pub fn start(self) -> Acquire {
        self.handle.start_acquire(self.args, None)
    }
}

impl IntoFuture for AcquireBuilder {
    type Output = Result<Grant, AcquireError>;
    type IntoFuture = Acquire;

    fn into_future(self) -> Acquire {
        self.start()
    }
}

/// A lock to take ([`Handle::lock`]): set what it asks for, then `.await`
/// it for a [`Lease`], or [`run`](LockBuilder::run) work under it. Nothing
/// is asked until then.
#[must_use = "a lock is only taken when awaited (or run)"]
#[derive(Debug)]
pub struct LockBuilder {
    handle: Handle,
    args: AcquireArgs,
}

impl LockBuilder {
    acquire_options!();

    /// Takes the lock now and hands back its future.
    pub fn start(self) -> Lock {
        let shared = lease::Shared::new(self.args.lease);
        Lock {
            acquire: self
                .handle
                .start_acquire(self.args, Some(Arc::clone(&shared))),
            shared: Some(shared),
            handle: self.handle,
        }
    }

    /// Takes the lock, runs `work` under it, and releases it (awaiting the
    /// release) once the work is done. The work gets a view of the lease
    /// (its token to quote to storage, its status, `changed()` to follow
    /// it); if the lease is lost or runs out first, the work is stopped
    /// (its future dropped) and this returns [`RunError::LeaseLost`].
    /// Renew (`.renew()`) for work that may outlast one lease.
    ///
    /// ```no_run
    /// # async fn demo(handle: ticketing::tokio::Handle) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ticketing::Key;
    ///
    /// let written = handle
    ///     .lock(Key::new("invoices")?)
    ///     .lease(Duration::from_secs(10))
    ///     .renew()
    ///     .run(|lease| async move {
    ///         // ... write to storage, quoting lease.token() ...
    ///         lease.token()
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<F, Fut, T>(self, work: F) -> Result<T, RunError>
    where
        F: FnOnce(HeldGrant) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut lease = self.await?;
        let view = lease.held.clone();
        let ended = {
            let mut work = std::pin::pin!(work(view));
            std::future::poll_fn(|cx| {
                if let Poll::Ready(value) = work.as_mut().poll(cx) {
                    return Poll::Ready(Ok(value));
                }
                while let Poll::Ready(status) = lease.held.poll_changed(cx) {
                    if status.is_over() {
                        return Poll::Ready(Err(status));
                    }
                }
                Poll::Pending
            })
            .await
        };
        // The work is done, or stopped: its lease goes back either way.
        let _ = lease.release().await;
        ended.map_err(|status| RunError::LeaseLost { status })
    }
}

impl IntoFuture for LockBuilder {
    type Output = Result<Lease, AcquireError>;
    type IntoFuture = Lock;

    fn into_future(self) -> Lock {
        self.start()
    }
}

/// The reply to a request that was (or could not be) sent.
struct Answer<T> {
    sent: Result<(), RequestError>,
    rx: Receiver<Result<T, Error>>,
}

impl<T> Future for Answer<T> {
    type Output = Result<T, RequestError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.sent.clone()?;
        let reply = std::task::ready!(self.rx.poll(cx)).ok_or(RequestError::Stopped);
        Poll::Ready(reply.and_then(|r| r.map_err(RequestError::from)))
    }
}

/// The future of an acquire. Dropping it before it resolves cancels the
/// acquire through the core; a grant that arrives for it is then released
/// by its exact token.
#[must_use = "an acquire only resolves when awaited; dropping it cancels it"]
pub struct Acquire {
    rx: Receiver<AcquireResult>,
    ticket: u64,
    commands: Sender,
    done: bool,
}

impl std::fmt::Debug for Acquire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("ticket", &self.ticket)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Acquire {
    /// A handle that cancels this acquire without dropping the future: the
    /// future then resolves to the cancel's outcome
    /// ([`AcquireError::Cancelled`] if nothing was sent yet,
    /// [`AcquireError::Indeterminate`] if it was).
    pub fn canceller(&self) -> Canceller {
        Canceller {
            ticket: self.ticket,
            commands: self.commands.clone(),
        }
    }
}

/// Cancels one acquire through the core; see [`Acquire::canceller`].
#[derive(Debug, Clone)]
pub struct Canceller {
    ticket: u64,
    commands: Sender,
}

impl Canceller {
    /// Cancels the acquire. Harmless if it already ended.
    pub fn cancel(&self) {
        let _ = self.commands.send(Command::Cancel {
            ticket: self.ticket,
        });
    }
}

impl Future for Acquire {
    type Output = Result<Grant, AcquireError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.done {
            return Poll::Ready(Err(AcquireError::Stopped));
        }
        let result = std::task::ready!(self.rx.poll(cx)).unwrap_or(Err(AcquireError::Stopped));
        self.done = true;
        Poll::Ready(result)
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(command) = Command::for_abandoned(self.ticket, self.rx.abandon()) {
            let _ = self.commands.send(command);
        }
    }
}

/// The future of a lock ([`LockBuilder`]): the grant as a [`Lease`], or
/// why there is none. Dropping it cancels the acquire, as dropping an
/// [`Acquire`] does.
#[must_use = "a lock only resolves when awaited; dropping it cancels it"]
#[derive(Debug)]
pub struct Lock {
    acquire: Acquire,
    shared: Option<Arc<lease::Shared>>,
    handle: Handle,
}

impl Future for Lock {
    type Output = Result<Lease, AcquireError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let grant = std::task::ready!(Pin::new(&mut self.acquire).poll(cx))?;
        let shared = self.shared.take().expect("polled after it resolved");
        Poll::Ready(Ok(Lease {
            held: HeldGrant::new(grant, shared),
            handle: self.handle.clone(),
        }))
    }
}

/// A held grant: a guard, as a lock is in Rust. Its key, token, lease and
/// where it stands come from [`HeldGrant`], which it derefs to.
///
/// # Releasing
///
/// [`release`](Lease::release) releases the grant by its exact token and
/// reports the outcome; [`let_expire`](Lease::let_expire) keeps the grant
/// to run out. Dropping the guard releases the grant by exact token too,
/// which also stops its renewal, so an automatically renewed lock never
/// outlives the code that held it. What a drop guarantees:
///
/// - While the client runs: the release is queued at once and sent before
///   any acquire, on this connection or the next (retried until its
///   lease would have ended anyway).
/// - When the runtime goes away (`#[tokio::main]` returns, a `Runtime` is
///   dropped): the driver still sends the releases of the guards dropped
///   until then, and of those dropped as the runtime drops its tasks, over
///   a new connection, waiting at most [`EXIT_FLUSH`] (1 s) for their
///   answers before the program goes on to exit.
/// - Not when the process ends without unwinding: `std::process::exit`, a
///   signal that kills it, `panic = "abort"`, a crash; nor when the
///   runtime is never dropped (a runtime in a `static`, smol's or
///   async-std's global executor: await [`Handle::shutdown`] before `main`
///   returns). The grant then ends when its lease does: at most one lease
///   after the last renewal.
#[derive(Debug)]
pub struct Lease {
    held: HeldGrant,
    handle: Handle,
}

impl Deref for Lease {
    type Target = HeldGrant;

    fn deref(&self) -> &HeldGrant {
        &self.held
    }
}

impl Lease {
    /// Waits until the status changes from the last one this returned
    /// (or, the first time, from the grant's), and returns it.
    pub async fn changed(&mut self) -> LeaseStatus {
        self.held.changed().await
    }

    /// Renews the grant once, asking for `lease` (`None`: the acquire's).
    /// Resolves when the request is queued; the renewal's answer shows in
    /// [`status`](HeldGrant::status).
    pub fn renew(
        &self,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<(), RequestError>> + Send + 'static {
        self.handle.renew(self.grant(), lease)
    }

    /// Renews the grant automatically from now on, for at most `limit`
    /// (`None`: until released).
    pub fn auto_renew(
        &self,
        limit: Option<Duration>,
    ) -> impl Future<Output = Result<(), RequestError>> + Send + 'static {
        self.handle.auto_renew(self.grant(), true, limit)
    }

    /// Stops renewing the grant automatically.
    pub fn stop_renewing(&self) -> impl Future<Output = Result<(), RequestError>> + Send + 'static {
        self.handle.auto_renew(self.grant(), false, None)
    }

    /// Releases the grant by its exact token; resolves to `Released`,
    /// `NotHeld` or `Lapsed`.
    pub fn release(
        mut self,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static {
        let grant = self.held.take().expect("held until consumed");
        self.handle.release(&grant)
    }

    /// Keeps the grant without its guard: renewal stops, and the grant
    /// runs out at its `valid_until` unless released by other means.
    pub fn let_expire(mut self) -> Grant {
        let grant = self.held.take().expect("held until consumed");
        let _ = self.handle.request(Command::LetExpire {
            grant: grant.clone(),
        });
        grant
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(grant) = self.held.take() else {
            return;
        };
        // Once the runtime has gone away the program may be about to exit:
        // the release is waited for then.
        let commands = &self.handle.commands;
        let (reply, rx) = reply::channel();
        let sent = commands.send_with(|detached| Command::DropGuard {
            grant,
            reply: detached.then_some(reply),
        });
        if sent == Ok(true) {
            commands.0.wait_detached(|limit| rx.recv_timeout(limit));
        }
    }
}

fn request(commands: &Sender, command: Command) -> Result<(), RequestError> {
    commands.send(command).map_err(|_| RequestError::Stopped)
}

/// Sends the command that `command` makes with a reply slot, and answers
/// with what comes into the slot.
fn ask<T>(
    commands: &Sender,
    command: impl FnOnce(reply::Sender<Result<T, Error>>) -> Command,
) -> Answer<T> {
    let (reply, rx) = reply::channel();
    let sent = request(commands, command(reply));
    Answer { sent, rx }
}

/// Makes a client core and the future that drives it. Nothing happens
/// until the future is polled (spawned on a runtime).
pub(crate) fn new<D: Dial, K: Clock>(
    config: Config,
    dial: D,
    notices: Sink,
) -> Result<(Handle, Driver<D, K>), ConfigError> {
    let start = Instant::now();
    let client = Client::new(config, Time::ZERO)?;
    let inbox = Arc::new(Inbox {
        state: Mutex::new(InboxState {
            commands: Vec::new(),
            driver: None,
            wake_at: 0,
            closed: false,
            detached: false,
        }),
        senders: AtomicUsize::new(1),
        ended: Mutex::new(false),
        ended_now: Condvar::new(),
        stalled: AtomicBool::new(false),
    });
    let handle = Handle {
        commands: Sender(Arc::clone(&inbox)),
        tickets: Arc::new(AtomicU64::new(1)),
        start,
    };
    let running = Running {
        shell: Shell::new(client, start, notices),
        inbox,
        taken: Vec::new(),
        handles_alive: true,
        io: DriverIo {
            dial,
            connecting: None,
            stream: None,
            writes: VecDeque::new(),
            written: 0,
            unflushed: false,
        },
        clock: K::new(),
        buf: vec![0; 16 * 1024].into_boxed_slice(),
        delivered_at: start,
        deferred: false,
        unsent: 0,
        expected: 0,
        detached: false,
    };
    Ok((handle, Driver(Some(running))))
}

/// The future that owns a client core and its connection. It resolves once
/// the client has shut down: after [`Handle::shutdown`], or once every
/// handle is dropped (a shutdown with a five-second budget). Dropped
/// before that, with work left to finish, it goes on on a thread of its
/// own (see the module's documentation).
#[must_use = "the driver does nothing unless polled: spawn it"]
pub struct Driver<D: Dial, K: Clock>(Option<Running<D, K>>);

/// A driver's state.
struct Running<D: Dial, K: Clock> {
    shell: Shell,
    inbox: Arc<Inbox>,
    /// The requests taken from the inbox (kept for its capacity).
    taken: Vec<Command>,
    handles_alive: bool,
    io: DriverIo<D>,
    clock: K,
    buf: Box<[u8]>,
    /// When outcomes were last handed to callers.
    delivered_at: Instant,
    /// `step` deferred to the runtime: return `Pending` at once.
    deferred: bool,
    /// Requests handed to the core while holding back, not yet written.
    unsent: usize,
    /// Outcomes handed to callers, less the requests taken since: how many
    /// woken callers may still be about to send one.
    expected: usize,
    /// It runs on a thread of its own, its first runtime gone.
    detached: bool,
}

type Connecting<T> = Pin<Box<dyn Future<Output = io::Result<T>> + Send>>;

struct DriverIo<D: Dial> {
    dial: D,
    connecting: Option<(ConnId, Connecting<D::Transport>)>,
    stream: Option<(ConnId, D::Transport)>,
    writes: VecDeque<Bytes>,
    /// Bytes of the front write already written.
    written: usize,
    /// Written bytes the stream still holds: flushed on every pass until
    /// it has none.
    unflushed: bool,
}

impl<D: Dial> Io for DriverIo<D> {
    fn connect(&mut self, conn: ConnId, addr: Endpoint) {
        self.connecting = Some((conn, self.dial.dial(addr)));
    }

    fn send(&mut self, conn: ConnId, data: Bytes) {
        if matches!(&self.stream, Some((c, _)) if *c == conn) {
            self.writes.push_back(data);
        }
    }

    fn close(&mut self, conn: ConnId) {
        if matches!(&self.connecting, Some((c, _)) if *c == conn) {
            self.connecting = None;
        }
        if matches!(&self.stream, Some((c, _)) if *c == conn) {
            self.stream = None;
            self.writes.clear();
            self.written = 0;
            self.unflushed = false;
        }
    }
}

impl<D: Dial, K: Clock> Running<D, K> {
    /// One pass over every source of input; `true` if anything happened.
    fn step(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        let mut now = None;
        // What is queued, without asking to be woken: while the driver
        // holds requests back (below), more of them need not wake it.
        let commands = self.take(false, cx, &mut now);
        progress |= commands > 0;
        self.unsent += commands;
        self.expected = self.expected.saturating_sub(commands);
        // Requests came in while callers just woken by outcomes have not
        // all sent theirs yet: let those run first, so that one write
        // carries all their requests (or a full batch of them). The core
        // has not handed out these requests yet (that is the pump's doing),
        // and the next poll does, whatever else comes in. Callers that send
        // nothing soon (they hold their grant for a while, or are gone)
        // stop counting.
        if commands > 0 && self.expected > 0 && self.unsent < BATCH_SIZE {
            if self.delivered_at.elapsed() < BATCH_WAIT {
                self.hold(cx);
                self.deferred = true;
                self.clock.defer(cx);
                return true;
            }
            self.expected = 0;
        }
        // Asks to be woken by the next request (taking any that slipped in).
        let late = self.take(true, cx, &mut now);
        self.unsent = 0;
        progress |= late > 0;
        self.expected = self.expected.saturating_sub(late);
        // Nothing more is read while the notices' reader is behind.
        let reading = !self.shell.notices_full(cx);
        if let Some((conn, stream)) = self.io.stream.as_mut().filter(|_| reading) {
            let conn = *conn;
            if let Poll::Ready(result) = stream.poll_read(cx, &mut self.buf) {
                let now = self.shell.now();
                let client = self.shell.client();
                match result {
                    Ok(0) => client.handle_transport_closed(now, conn, TransportEnd::Eof),
                    Ok(n) => client.handle_bytes(now, conn, &self.buf[..n]),
                    Err(_) => client.handle_transport_closed(now, conn, TransportEnd::Error),
                }
                progress = true;
            }
        }
        let delivered = self.shell.pump(&mut self.io);
        self.delivered(delivered);
        // After the pump: a connect it just started (the first one comes
        // from `Client::new`, with no input to count as progress) must be
        // polled now, or nothing wakes the driver until the connect timeout.
        if let Some((conn, connecting)) = &mut self.io.connecting {
            if let Poll::Ready(result) = connecting.as_mut().poll(cx) {
                let conn = *conn;
                self.io.connecting = None;
                let now = self.shell.now();
                match result {
                    Ok(stream) => {
                        self.io.stream = Some((conn, stream));
                        self.shell.client().handle_connected(now, conn);
                    }
                    Err(e) => self.shell.connect_failed(now, conn, e),
                }
                progress = true;
            }
        }
        progress |= self.write(cx);
        if let Some(at) = self.shell.deadline() {
            if self.clock.poll_until(cx, at).is_ready() {
                // A timer may fire a hair before the clock reads `at`.
                let now = self.shell.now().max(self.shell.time_of(at));
                self.shell.client().handle_timeout(now);
                progress = true;
            }
        }
        progress
    }

    /// Hands the queued requests to the shell; how many there were. With
    /// `listen`, the driver is woken by the next request. Once every
    /// handle is gone, the client shuts down. `now`: the time read for this
    /// pass, if read yet.
    fn take(&mut self, listen: bool, cx: &Context<'_>, now: &mut Option<Time>) -> usize {
        let mut count = 0;
        while self.handles_alive {
            let orphaned = {
                let mut state = lock(&self.inbox.state);
                if listen {
                    state.wake_at = 0;
                }
                // Read under the lock, which the last sender takes after
                // counting itself out: either this sees it gone, or that
                // sender finds the waker registered here.
                let orphaned = self.inbox.senders.load(Ordering::Acquire) == 0;
                if state.commands.is_empty() && listen && !orphaned {
                    register(&mut state.driver, cx);
                }
                std::mem::swap(&mut state.commands, &mut self.taken);
                orphaned
            };
            if self.taken.is_empty() && !orphaned {
                break;
            }
            let now = *now.get_or_insert_with(|| self.shell.now());
            count += self.taken.len();
            for command in self.taken.drain(..) {
                self.shell.command_at(now, command);
            }
            if orphaned {
                self.handles_alive = false;
                let _ = self.shell.client().shutdown(now, ORPHANED_SHUTDOWN);
            }
            if !listen {
                break;
            }
        }
        count
    }

    /// Holds requests back: the driver is woken by the request that
    /// completes the batch, or polled once its worker is idle.
    fn hold(&mut self, cx: &Context<'_>) {
        let batch = self.expected.min(BATCH_SIZE.saturating_sub(self.unsent));
        let mut state = lock(&self.inbox.state);
        state.wake_at = batch.max(1);
        if state.commands.len() >= state.wake_at {
            // The batch came in meanwhile.
            drop(state);
            cx.waker().wake_by_ref();
            return;
        }
        register(&mut state.driver, cx);
    }

    /// Counts `n` outcomes just handed to callers.
    fn delivered(&mut self, n: usize) {
        if n > 0 {
            self.expected += n;
            self.delivered_at = Instant::now();
        }
    }

    /// Writes what is queued, as far as the transport takes it.
    fn write(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((conn, stream)) = &mut self.io.stream else {
            return false;
        };
        let conn = *conn;
        let mut progress = false;
        while let Some(front) = self.io.writes.front() {
            match stream.poll_write(cx, &front[self.io.written..]) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    progress = true;
                    self.io.written += n;
                    if self.io.written == front.len() {
                        self.io.writes.pop_front();
                        self.io.written = 0;
                    }
                }
                Poll::Ready(_) => {
                    let now = self.shell.now();
                    self.shell
                        .client()
                        .handle_transport_closed(now, conn, TransportEnd::Error);
                    return true;
                }
                Poll::Pending => break,
            }
        }
        if progress || self.io.unflushed {
            match stream.poll_flush(cx) {
                Poll::Ready(Ok(())) => self.io.unflushed = false,
                Poll::Ready(Err(_)) => {
                    let now = self.shell.now();
                    self.shell
                        .client()
                        .handle_transport_closed(now, conn, TransportEnd::Error);
                    return true;
                }
                Poll::Pending => self.io.unflushed = true,
            }
        }
        progress
    }
}

impl<D: Dial, K: Clock> Running<D, K> {
    /// The driver is dropped: if its work is done, or it has none worth
    /// finishing, requests are refused from now on; else it goes on on a
    /// thread of its own, and this waits, at most [`EXIT_FLUSH`], until no
    /// release is left to send or to be answered.
    fn abandon(mut self) {
        // Requests that came in since the last pass reach the core first:
        // a guard dropped just before the runtime went away is released.
        let queued = std::mem::take(&mut lock(&self.inbox.state).commands);
        if !queued.is_empty() && !self.shell.client().is_finished() {
            let now = self.shell.now();
            for command in queued {
                self.shell.command_at(now, command);
            }
        }
        if self.detached || !self.shell.has_work_to_finish() {
            // Requests from now on are refused; those queued end `Stopped`.
            let queued = {
                let mut state = lock(&self.inbox.state);
                state.closed = true;
                state.driver = None;
                std::mem::take(&mut state.commands)
            };
            drop(queued);
            self.inbox.end();
            return;
        }
        // The connection belongs to the runtime that went away: it ends
        // here, and the core goes on from that (its in-flight releases go
        // back to the lane, for the next connection).
        let now = self.shell.now();
        let client = self.shell.client();
        if let Some(conn) = client.connection() {
            client.handle_transport_closed(now, conn, TransportEnd::Error);
        }
        self.io.connecting = None;
        self.io.stream = None;
        self.io.writes.clear();
        self.io.written = 0;
        self.io.unflushed = false;
        // Whoever reads the notices is on that runtime too.
        self.shell.drop_notices();
        let (reply, flushed) = reply::channel();
        self.shell.command_at(now, Command::Flush { reply });
        {
            let mut state = lock(&self.inbox.state);
            state.detached = true;
            state.driver = None;
            state.wake_at = 0;
        }
        self.detached = true;
        self.clock = K::new();
        (self.deferred, self.unsent, self.expected) = (false, 0, 0);
        let inbox = Arc::clone(&self.inbox);
        if K::run_detached(Box::pin(Driver(Some(self)))).is_ok() {
            inbox.wait_detached(|limit| flushed.recv_timeout(limit));
        }
    }
}

impl<D: Dial, K: Clock> Drop for Driver<D, K> {
    fn drop(&mut self) {
        if let Some(running) = self.0.take() {
            running.abandon();
        }
    }
}

impl<D: Dial, K: Clock> Future for Driver<D, K> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(this) = self.get_mut().0.as_mut() else {
            return Poll::Ready(());
        };
        // Bounded, so that a flood of input cannot starve the runtime.
        for _ in 0..64 {
            let progress = this.step(cx);
            if std::mem::take(&mut this.deferred) {
                return Poll::Pending;
            }
            let delivered = this.shell.pump(&mut this.io);
            this.delivered(delivered);
            if this.shell.is_done() {
                return Poll::Ready(());
            }
            if !progress {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
