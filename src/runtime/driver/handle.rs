//! What an embedder holds and calls: the cloneable [`Handle`], the
//! builders of an acquire and of a lock, and the futures and guards they
//! give.

use std::future::{Future, IntoFuture};
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::inbox::Sender;
use crate::client::{ClientStats, Error, Grant, Outcome};
use crate::names::Key;
use crate::runtime::conn::{ConnState, Observer, Watch};
use crate::runtime::error::{AcquireError, ConnectError, RequestError, RunError};
use crate::runtime::lease::{self, HeldGrant, LeaseStatus};
use crate::runtime::reply::{self, Receiver};
use crate::runtime::shell::{acquire_options, AcquireArgs, AcquireResult, Command};
use crate::time::Time;

/// A cloneable handle on a client whose driver runs on an async runtime.
/// Every clone shares the one connection.
#[derive(Clone, Debug)]
pub struct Handle {
    commands: Sender,
    tickets: Arc<AtomicU64>,
    start: Instant,
    /// Where the connection stands, and what this handle read of it.
    conn: Observer,
}

impl Handle {
    /// The first handle on the client whose driver reads `inbox` and
    /// publishes to `conn`; its times count from `start`.
    pub(super) fn new(commands: Sender, start: Instant, conn: Arc<Watch>) -> Handle {
        Handle {
            commands,
            tickets: Arc::new(AtomicU64::new(1)),
            start,
            conn: Observer::new(conn),
        }
    }

    /// Where the client's connection stands now: connected to a server
    /// (which one, since when), disconnected (since when, and how the
    /// latest attempt ended), or stopped. The client keeps connecting by
    /// itself; this only tells. While it is not connected, held leases
    /// are unconfirmed ([`LeaseStatus::Valid`]`{ confirmed: false, .. }`).
    ///
    /// ```no_run
    /// # #[cfg(feature = "tokio")]
    /// # fn demo(handle: ticketing::tokio::Handle) {
    /// use ticketing::tokio::ConnState;
    ///
    /// match handle.connection() {
    ///     ConnState::Connected { addr, node, .. } => println!("on {addr} ({node})"),
    ///     other => println!("{other}"), // "disconnected for 0.4 s; last attempt: ..."
    /// }
    /// # }
    /// ```
    pub fn connection(&self) -> ConnState {
        self.conn.now()
    }

    /// Waits until the connection's state differs from the last one this
    /// handle returned (from [`connection`](Handle::connection) or from
    /// this), and returns it: a server took the client, the connection
    /// ended, or an attempt to connect failed again (a new `last_error`).
    /// At once with [`ConnState::Stopped`] once the client has stopped.
    /// Each clone of a handle follows on its own, starting from what the
    /// handle it was cloned from had read.
    ///
    /// ```no_run
    /// # #[cfg(feature = "tokio")]
    /// # async fn demo(handle: ticketing::tokio::Handle) {
    /// use ticketing::tokio::ConnState;
    ///
    /// loop {
    ///     match handle.connection_changed().await {
    ///         ConnState::Stopped => break,
    ///         state => eprintln!("lock service: {state}"),
    ///     }
    /// }
    /// # }
    /// ```
    pub fn connection_changed(&self) -> impl Future<Output = ConnState> + Send + 'static {
        self.conn.changed()
    }

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
    /// # #[cfg(feature = "tokio")]
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
    /// # #[cfg(feature = "tokio")]
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
    /// # #[cfg(feature = "tokio")]
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
        let lease = self.await?;
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
///
/// [`EXIT_FLUSH`]: crate::runtime::shell::EXIT_FLUSH
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
    /// (or, the first time, from the grant's), and returns it. A change is
    /// one of state: confirmed to unconfirmed (the connection ended) and
    /// back, jeopardy, lost, expired. A renewal that keeps the lease valid
    /// is none: [`renewed`](Lease::renewed) tells those.
    pub async fn changed(&self) -> LeaseStatus {
        self.held.changed().await
    }

    /// Waits until the grant is renewed (after the last renewal this
    /// returned, or, the first time, after the grant), and returns its new
    /// `valid_until`. `None` once the lease is over (lost or expired): no
    /// renewal will come.
    pub async fn renewed(&self) -> Option<Instant> {
        self.held.renewed().await
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
