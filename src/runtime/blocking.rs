//! The blocking adapter (feature `blocking`): the client core on a driver
//! thread over `std::net`, for programs without an async runtime. The
//! handle, the builders and the guard are the async adapters', with calls
//! that block: `.send()` where those `.await`.
//!
//! ```no_run
//! use std::time::Duration;
//! use ticketing::blocking::{connect, TcpConnector};
//! use ticketing::client::Config;
//! use ticketing::{Endpoint, Key, Name};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let config = Config::new([Endpoint::new("127.0.0.1:7878")?], Name::new("cron-7")?);
//!     let client = connect(config, TcpConnector)?;
//!     client.connected()?; // fails with why (refused, TLS, credential)
//!     let lease = client
//!         .lock(Key::new("nightly-report")?)
//!         .wait(Duration::from_secs(5))
//!         .lease(Duration::from_secs(60))
//!         .send()?;
//!     // ... the work, quoting lease.token() to storage ...
//!     lease.release()?;
//!     client.shutdown(Duration::from_secs(5))?;
//!     Ok(())
//! }
//! ```
//!
//! A call blocks until the core gives its outcome, which the core bounds:
//! an acquire ends within its wait budget (or the queue grace, if longer)
//! plus the answer grace. Every rule is the core's; the adapter moves bytes
//! between threads and sockets.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::client::{Client, ClientStats, Config, ConnId, Error, Grant, Outcome, TransportEnd};
use crate::names::{Endpoint, Key};
use crate::runtime::conn::Observer;
use crate::runtime::error::unresolved;
use crate::runtime::lease;
use crate::runtime::notices::Sink;
use crate::runtime::reply::{self, Receiver};
use crate::runtime::shell::{acquire_options, AcquireArgs, AcquireResult, Command, Io, Shell};
use crate::sync::lock;
use crate::time::Time;

pub use crate::runtime::conn::ConnState;
pub use crate::runtime::error::{AcquireError, ConnectError, RequestError, RunError, SpawnError};
pub use crate::runtime::lease::{HeldGrant, LeaseStatus};
pub use crate::runtime::notices::{BlockingNotices as Notices, CAPACITY as NOTICES_CAPACITY};
pub use crate::runtime::shell::EXIT_FLUSH;
#[cfg(feature = "tls")]
pub use crate::runtime::tls::blocking::{TlsConnector, TlsStream};

/// A blocking byte stream the adapter can read on one thread while it
/// writes on another.
pub trait BlockingStream: Read + Write + Send + Sized + 'static {
    /// Another handle on the same stream.
    fn try_clone(&self) -> io::Result<Self>;
    /// Ends both directions, waking a thread blocked reading it.
    fn shutdown(&self) -> io::Result<()>;
}

impl BlockingStream for TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        TcpStream::try_clone(self)
    }

    fn shutdown(&self) -> io::Result<()> {
        TcpStream::shutdown(self, std::net::Shutdown::Both)
    }
}

#[cfg(unix)]
impl BlockingStream for std::os::unix::net::UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        std::os::unix::net::UnixStream::try_clone(self)
    }

    fn shutdown(&self) -> io::Result<()> {
        std::os::unix::net::UnixStream::shutdown(self, std::net::Shutdown::Both)
    }
}

/// Opens connections for the client.
pub trait Connector: Send + Sync + 'static {
    /// The connected stream.
    type Stream: BlockingStream;

    /// Connects to `addr` within `timeout` (the core's connect timeout).
    fn connect(&self, addr: &Endpoint, timeout: Duration) -> io::Result<Self::Stream>;

    /// Whether the streams this connector makes run TLS (`false` unless
    /// told; the adapter's `TlsConnector` says `true`). A plain client
    /// whose connection ends before the server's hello hints at TLS in the
    /// error's text ([`ConnectError`]): that is how a TLS server ends a
    /// plain client's connection. A connector of your own that runs TLS
    /// (or another layer that speaks first) says `true`.
    fn is_tls(&self) -> bool {
        false
    }
}

/// Connects over TCP, with `TCP_NODELAY` set.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    type Stream = TcpStream;

    fn connect(&self, addr: &Endpoint, timeout: Duration) -> io::Result<TcpStream> {
        let sockets = addr
            .as_str()
            .to_socket_addrs()
            .map_err(|e| unresolved(addr, e))?;
        let mut last = unresolved(addr, io::ErrorKind::NotFound.into());
        for socket in sockets {
            match TcpStream::connect_timeout(&socket, timeout) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    return Ok(stream);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// What reaches the driver thread.
enum Msg<S> {
    Command(Command),
    /// The last [`Handle`] was dropped.
    Orphaned,
    Connected(ConnId, io::Result<S>),
    Bytes(ConnId, Bytes),
    Ended(ConnId, TransportEnd),
    /// The notices' reader made room.
    Room,
}

/// Budget of the shutdown that starts when every handle is dropped.
const ORPHANED_SHUTDOWN: Duration = Duration::from_secs(5);

/// Starts a client on a driver thread. It connects in the background (see
/// [`Handle::connected`] to wait for that); the thread ends once the
/// client has shut down (after [`Handle::shutdown`], or when every handle
/// is dropped).
///
/// Nothing reads the notices of a client started so; with the feature
/// `tracing` they are traced. [`connect_with_notices`] hands them out.
pub fn connect<C: Connector>(config: Config, connector: C) -> Result<Handle, SpawnError> {
    start(config, connector, Sink::Nowhere)
}

/// As [`connect`], also handing out the notices, as the async adapters do.
/// Read them or drop the receiver: while [`NOTICES_CAPACITY`] of them wait
/// unread, the client reads nothing more from the server.
pub fn connect_with_notices<C: Connector>(
    config: Config,
    connector: C,
) -> Result<(Handle, Notices), SpawnError> {
    let (sink, notices) = Sink::queue();
    Ok((start(config, connector, sink)?, notices.blocking()))
}

fn start<C: Connector>(config: Config, connector: C, notices: Sink) -> Result<Handle, SpawnError> {
    let connect_timeout = config.connect_timeout;
    let client = Client::new(config, Time::ZERO)?;
    let (tx, rx) = mpsc::channel::<Msg<C::Stream>>();
    let start = Instant::now();
    let shell = Shell::new(client, start, notices).over_tls(connector.is_tls());
    let conn = Observer::new(shell.conn_watch());
    let gauges = Arc::new(Gauges::default());
    let io = ThreadIo {
        connector: Arc::new(connector),
        connect_timeout,
        msgs: tx.clone(),
        conns: HashMap::new(),
        gauges: Arc::clone(&gauges),
    };
    let room = Waker::from(Arc::new(RoomWaker(Mutex::new(tx.clone()))));
    let commands: Box<dyn Fn(Command) -> bool + Send + Sync> = Box::new({
        let tx = tx.clone();
        move |cmd| tx.send(Msg::Command(cmd)).is_ok()
    });
    let orphaned: Box<dyn Fn() + Send + Sync> = Box::new(move || {
        let _ = tx.send(Msg::Orphaned);
    });
    let (ended_tx, ended) = mpsc::channel::<()>();
    thread::Builder::new()
        .name("ticketing-driver".into())
        .spawn(move || {
            drive(shell, io, rx, room);
            drop(ended_tx);
        })
        .map_err(SpawnError::Thread)?;
    Ok(Handle {
        inner: Arc::new(Inner {
            commands,
            orphaned,
            tickets: AtomicU64::new(1),
            gauges,
            start,
            ended: Mutex::new(ended),
        }),
        conn,
    })
}

/// Wakes the driver thread when the notices' reader makes room.
struct RoomWaker<S>(Mutex<mpsc::Sender<Msg<S>>>);

impl<S: Send + 'static> Wake for RoomWaker<S> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ = lock(&self.0).send(Msg::Room);
    }
}

/// Locks a mutex whose holders never leave its data half-changed.
struct Inner {
    commands: Box<dyn Fn(Command) -> bool + Send + Sync>,
    orphaned: Box<dyn Fn() + Send + Sync>,
    tickets: AtomicU64,
    gauges: Arc<Gauges>,
    /// The instant of the core's time zero.
    start: Instant,
    /// Disconnected once the driver thread has ended.
    ended: Mutex<mpsc::Receiver<()>>,
}

/// How many bytes the reader threads may have read ahead of the driver:
/// past this, they stop reading until the driver has handled some, so a
/// slow driver (a flood of input, notices nobody reads) slows the
/// connection down instead of growing the process.
pub const READ_AHEAD: usize = 256 * 1024;

/// What the driver and its threads hold, as the handle reports it.
#[derive(Default)]
struct Gauges {
    /// Bytes read from a socket and not yet handled by the core.
    read_ahead: Mutex<usize>,
    /// `read_ahead` went down, or the driver ended.
    room: Condvar,
    /// The driver thread has ended.
    ended: AtomicBool,
    /// Connections the driver keeps threads or state for.
    connections: AtomicUsize,
    /// A server has taken the client and the connection is up.
    welcomed: AtomicBool,
    /// A guard's drop waited for its release in vain: the later ones do
    /// not wait (until a server takes the client again).
    stalled: AtomicBool,
}

impl Gauges {
    fn read_ahead(&self) -> MutexGuard<'_, usize> {
        lock(&self.read_ahead)
    }

    /// Waits for room to read `n` more bytes ahead; `false` once the
    /// driver has ended.
    fn reserve(&self, n: usize) -> bool {
        let mut ahead = self.read_ahead();
        while *ahead >= READ_AHEAD && !self.ended.load(Ordering::Acquire) {
            ahead = self
                .room
                .wait(ahead)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *ahead += n;
        !self.ended.load(Ordering::Acquire)
    }

    /// `n` bytes read ahead were handled.
    fn release(&self, n: usize) {
        let mut ahead = self.read_ahead();
        *ahead = ahead.saturating_sub(n);
        self.room.notify_all();
    }

    /// The driver has ended: no reader waits for room any more.
    fn end(&self) {
        let _ahead = self.read_ahead();
        self.ended.store(true, Ordering::Release);
        self.room.notify_all();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        (self.orphaned)();
        // The program may be about to exit, killing the driver thread: the
        // shutdown that drains the release lane is waited for, a while.
        let _ = lock(&self.ended).recv_timeout(EXIT_FLUSH);
    }
}

/// A cloneable handle on a client driven by its own thread. Every clone
/// shares the one connection.
///
/// Dropping the last handle (the guards and pending acquires hold one each)
/// shuts the client down with a budget of 5 s, and waits, at most
/// [`EXIT_FLUSH`] (1 s), for that to finish: the releases still queued are
/// sent before `main` returns and the process ends.
#[derive(Clone)]
pub struct Handle {
    inner: Arc<Inner>,
    /// Where the connection stands, and what this handle read of it.
    conn: Observer,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").finish_non_exhaustive()
    }
}

impl Handle {
    /// Bytes read from the server that the client has not handled yet: at
    /// most about [`READ_AHEAD`] plus one read.
    pub fn read_ahead(&self) -> usize {
        *self.inner.gauges.read_ahead()
    }

    /// Connections the driver keeps threads or state for: the one in use
    /// or being attempted, and any it is closing.
    pub fn connections(&self) -> usize {
        self.inner.gauges.connections.load(Ordering::Relaxed)
    }

    /// The client core's time now: the core's times ([`Grant::valid_until`],
    /// [`Grant::expires_by`]) count from the same origin.
    pub fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    /// The client core's time for `instant`.
    pub fn time_of(&self, instant: Instant) -> Time {
        let since = instant.saturating_duration_since(self.inner.start);
        Time::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The instant of a client core's time (`None` beyond what `Instant`
    /// can represent).
    pub fn instant_of(&self, time: Time) -> Option<Instant> {
        self.inner
            .start
            .checked_add(Duration::from_nanos(time.as_nanos()))
    }

    /// Where the client's connection stands now: connected to a server
    /// (which one, since when), disconnected (since when, and how the
    /// latest attempt ended), or stopped. The client keeps connecting by
    /// itself; this only tells. While it is not connected, held leases
    /// are unconfirmed ([`LeaseStatus::Valid`]`{ confirmed: false, .. }`).
    ///
    /// ```no_run
    /// # fn demo(client: ticketing::blocking::Handle) {
    /// use ticketing::blocking::ConnState;
    ///
    /// match client.connection() {
    ///     ConnState::Connected { addr, node, .. } => println!("on {addr} ({node})"),
    ///     other => println!("{other}"), // "disconnected for 0.4 s; last attempt: ..."
    /// }
    /// # }
    /// ```
    pub fn connection(&self) -> ConnState {
        self.conn.now()
    }

    /// Blocks until the connection's state differs from the last one this
    /// handle returned (from [`connection`](Handle::connection) or from
    /// these), and returns it: a server took the client, the connection
    /// ended, or an attempt to connect failed again (a new `last_error`).
    /// At once with [`ConnState::Stopped`] once the client has stopped.
    /// Each clone of a handle follows on its own, starting from what the
    /// handle it was cloned from had read.
    pub fn connection_changed(&self) -> ConnState {
        self.conn
            .wait_changed(None)
            .unwrap_or_else(|| self.conn.now())
    }

    /// As [`connection_changed`](Handle::connection_changed), for at most
    /// `timeout`: `None` if it passed with no change.
    pub fn connection_changed_timeout(&self, timeout: Duration) -> Option<ConnState> {
        self.conn.wait_changed(Some(timeout))
    }

    /// Blocks until a server has taken the client (its handshake was
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
    pub fn connected(&self) -> Result<(), ConnectError> {
        let (reply, rx) = reply::channel();
        if !(self.inner.commands)(Command::Connected { reply }) {
            return Err(ConnectError::stopped());
        }
        rx.recv().unwrap_or_else(|| Err(ConnectError::stopped()))
    }

    /// An acquire of `key`: set how long to wait, the lease, renewal and
    /// the owner, then [`send`](AcquireBuilder::send) it for the grant (a
    /// plain [`Grant`], the caller's to release; [`lock`](Handle::lock)
    /// gives a guard instead).
    pub fn acquire(&self, key: Key) -> AcquireBuilder {
        AcquireBuilder {
            handle: self.clone(),
            args: AcquireArgs::new(key),
        }
    }

    /// A lock of `key`: set how long to wait, the lease, renewal and the
    /// owner, then [`send`](LockBuilder::send) it for a [`Lease`], a guard
    /// that releases the grant by exact token when dropped; or hand it work
    /// to [`run`](LockBuilder::run) under the lock.
    pub fn lock(&self, key: Key) -> LockBuilder {
        LockBuilder {
            handle: self.clone(),
            args: AcquireArgs::new(key),
        }
    }

    /// The client core's counters ([`Client::stats`](crate::client::Client::stats)).
    pub fn stats(&self) -> Result<ClientStats, RequestError> {
        let (reply, rx) = reply::channel();
        if !(self.inner.commands)(Command::Stats { reply }) {
            return Err(RequestError::Stopped);
        }
        rx.recv().ok_or(RequestError::Stopped)
    }

    /// Renews a held grant once, asking for `lease` (`None`: its acquire's).
    /// Returns when the renewal is queued; the core's notices tell how it
    /// went.
    pub fn renew(&self, grant: &Grant, lease: Option<Duration>) -> Result<(), RequestError> {
        let grant = grant.clone();
        self.ask(|reply| Command::Renew {
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
    ) -> Result<(), RequestError> {
        let grant = grant.clone();
        self.ask(|reply| Command::AutoRenew {
            grant,
            on,
            limit,
            reply,
        })
    }

    fn start_acquire(
        &self,
        args: AcquireArgs,
        guard: Option<Arc<lease::Shared>>,
    ) -> PendingAcquire {
        let ticket = self.inner.tickets.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = reply::channel();
        let sent = (self.inner.commands)(Command::Acquire {
            ticket,
            args,
            guard,
            reply,
        });
        PendingAcquire {
            rx,
            ticket,
            handle: self.clone(),
            done: !sent,
        }
    }

    /// Releases a grant by its exact token and blocks until the outcome
    /// (`Released`, `NotHeld` or `Lapsed`).
    pub fn release(&self, grant: &Grant) -> Result<Outcome, RequestError> {
        let grant = grant.clone();
        self.ask(|reply| Command::Release { grant, reply })
    }

    /// Hands back a grant that can no longer be used: the client releases it
    /// by its exact token.
    pub fn undeliverable(&self, grant: Grant) -> Result<(), RequestError> {
        if (self.inner.commands)(Command::Undeliverable { grant }) {
            Ok(())
        } else {
            Err(RequestError::Stopped)
        }
    }

    /// Releases a raw `(key, token)` and blocks until the outcome.
    pub fn release_token(&self, key: Key, token: u64) -> Result<Outcome, RequestError> {
        self.ask(|reply| Command::ReleaseToken { key, token, reply })
    }

    /// Shuts down within `budget` and blocks until that is done.
    pub fn shutdown(&self, budget: Duration) -> Result<(), RequestError> {
        self.ask(|reply| Command::Shutdown { budget, reply })
    }

    /// Sends the command that `command` makes with a reply slot, and
    /// blocks until something comes into the slot.
    fn ask<T>(
        &self,
        command: impl FnOnce(reply::Sender<Result<T, Error>>) -> Command,
    ) -> Result<T, RequestError> {
        let (reply, rx) = reply::channel();
        if !(self.inner.commands)(command(reply)) {
            return Err(RequestError::Stopped);
        }
        rx.recv()
            .ok_or(RequestError::Stopped)?
            .map_err(RequestError::from)
    }
}

/// An acquire to make ([`Handle::acquire`]): set what it asks for, then
/// [`send`](AcquireBuilder::send) it. Nothing is asked until then.
#[must_use = "an acquire is only made when sent (or started)"]
#[derive(Debug)]
pub struct AcquireBuilder {
    handle: Handle,
    args: AcquireArgs,
}

impl AcquireBuilder {
    acquire_options!();

    /// Makes the acquire and blocks until its outcome: the grant, the
    /// caller's to release.
    pub fn send(self) -> Result<Grant, AcquireError> {
        self.start().wait()
    }

    /// Makes the acquire without blocking. Dropping the returned value
    /// before [`PendingAcquire::wait`] returns cancels the acquire.
    pub fn start(self) -> PendingAcquire {
        self.handle.start_acquire(self.args, None)
    }
}

/// A lock to take ([`Handle::lock`]): set what it asks for, then
/// [`send`](LockBuilder::send) it for a [`Lease`], or
/// [`run`](LockBuilder::run) work under it. Nothing is asked until then.
#[must_use = "a lock is only taken when sent (or run)"]
#[derive(Debug)]
pub struct LockBuilder {
    handle: Handle,
    args: AcquireArgs,
}

impl LockBuilder {
    acquire_options!();

    /// Takes the lock and blocks until it is held (or why it is not).
    pub fn send(self) -> Result<Lease, AcquireError> {
        let shared = lease::Shared::new(self.args.lease);
        let pending = self
            .handle
            .start_acquire(self.args, Some(Arc::clone(&shared)));
        let grant = pending.wait()?;
        Ok(Lease {
            held: HeldGrant::new(grant, shared),
            handle: self.handle,
        })
    }

    /// Takes the lock, runs `work` under it on this thread, and releases it
    /// (waiting for the release) once the work returns. The work gets a
    /// view of the lease: its token to quote to storage, and its status,
    /// which it should check between steps (`lease.status().is_over()`): a
    /// thread cannot be stopped from outside. If the lease was lost, or ran
    /// out, before the work returned, its result is dropped and this
    /// returns [`RunError::LeaseLost`]. Renew (`.renew()`) for work that may
    /// outlast one lease.
    ///
    /// ```no_run
    /// # fn demo(client: ticketing::blocking::Handle) -> Result<(), Box<dyn std::error::Error>> {
    /// use ticketing::Key;
    ///
    /// let rows = client.lock(Key::new("nightly-report")?).renew().run(|lease| {
    ///     // ... the work, quoting lease.token(), checking lease.status() ...
    ///     42
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn run<T>(self, work: impl FnOnce(HeldGrant) -> T) -> Result<T, RunError> {
        let lease = self.send()?;
        let value = work((*lease).clone());
        let status = lease.status();
        // Done, or over: its lease goes back either way.
        let _ = lease.release();
        match status.is_over() {
            false => Ok(value),
            true => Err(RunError::LeaseLost { status }),
        }
    }
}

/// A held grant: a guard, as a lock is in Rust. Its key, token, lease and
/// where it stands come from [`HeldGrant`], which it derefs to.
///
/// # Releasing
///
/// [`release`](Lease::release) releases the grant by its exact token and
/// blocks until the outcome; [`let_expire`](Lease::let_expire) keeps the
/// grant to run out. Dropping the guard releases the grant by exact token
/// too, which also stops its renewal, so an automatically renewed lock
/// never outlives the code that held it. What a drop guarantees:
///
/// - While the client is connected, the drop waits for the release's
///   answer, at most [`EXIT_FLUSH`] (1 s): when it returns, the key is
///   free (unless that wait ran out: then the later drops do not wait, until
///   a server takes the client again). While it is not, the release is
///   queued and sent on the next connection.
/// - Returning from `main` drops the guards and the handles there: the
///   last handle's drop waits (at most [`EXIT_FLUSH`]) for the client to
///   shut down, sending what is still queued.
/// - Not when the process ends without unwinding: `std::process::exit`, a
///   signal that kills it, `panic = "abort"`, a crash; nor for a guard
///   still held by another thread when `main` returns. The grant then ends
///   when its lease does: at most one lease after the last renewal.
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
    /// Blocks until the status changes from the last one this returned
    /// (or, the first time, from the grant's), and returns it. A change is
    /// one of state: confirmed to unconfirmed (the connection ended) and
    /// back, jeopardy, lost, expired. A renewal that keeps the lease valid
    /// is none: [`renewed`](Lease::renewed) tells those.
    pub fn changed(&self) -> LeaseStatus {
        self.held
            .wait_change(None)
            .unwrap_or_else(|| self.held.status())
    }

    /// As [`changed`](Lease::changed), for at most `timeout`: `None` if it
    /// passed with no change.
    pub fn changed_timeout(&self, timeout: Duration) -> Option<LeaseStatus> {
        self.held.wait_change(Some(timeout))
    }

    /// Blocks until the grant is renewed (after the last renewal this
    /// returned, or, the first time, after the grant), and returns its new
    /// `valid_until`. `None` once the lease is over (lost or expired): no
    /// renewal will come.
    pub fn renewed(&self) -> Option<Instant> {
        self.held.wait_renewal(None).flatten()
    }

    /// As [`renewed`](Lease::renewed), for at most `timeout`: `None` also
    /// if it passed with no renewal ([`status`](HeldGrant::status) tells
    /// the two apart).
    pub fn renewed_timeout(&self, timeout: Duration) -> Option<Instant> {
        self.held.wait_renewal(Some(timeout)).flatten()
    }

    /// Renews the grant once, asking for `lease` (`None`: the acquire's).
    /// Returns when the request is queued; the renewal's answer shows in
    /// [`status`](HeldGrant::status).
    pub fn renew(&self, lease: Option<Duration>) -> Result<(), RequestError> {
        self.handle.renew(self.grant(), lease)
    }

    /// Renews the grant automatically from now on, for at most `limit`
    /// (`None`: until released).
    pub fn auto_renew(&self, limit: Option<Duration>) -> Result<(), RequestError> {
        self.handle.auto_renew(self.grant(), true, limit)
    }

    /// Stops renewing the grant automatically.
    pub fn stop_renewing(&self) -> Result<(), RequestError> {
        self.handle.auto_renew(self.grant(), false, None)
    }

    /// Releases the grant by its exact token and blocks until the outcome
    /// (`Released`, `NotHeld` or `Lapsed`).
    pub fn release(mut self) -> Result<Outcome, RequestError> {
        let grant = self.held.take().expect("held until consumed");
        self.handle.release(&grant)
    }

    /// Keeps the grant without its guard: renewal stops, and the grant
    /// runs out at its `valid_until` unless released by other means.
    pub fn let_expire(mut self) -> Grant {
        let grant = self.held.take().expect("held until consumed");
        (self.handle.inner.commands)(Command::LetExpire {
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
        let inner = &self.handle.inner;
        let gauges = &inner.gauges;
        let wait =
            gauges.welcomed.load(Ordering::Relaxed) && !gauges.stalled.load(Ordering::Relaxed);
        if !wait {
            (inner.commands)(Command::DropGuard { grant, reply: None });
            return;
        }
        let (reply, rx) = reply::channel();
        let command = Command::DropGuard {
            grant,
            reply: Some(reply),
        };
        if (inner.commands)(command) && rx.recv_timeout(EXIT_FLUSH).is_none() {
            gauges.stalled.store(true, Ordering::Relaxed);
        }
    }
}

/// An acquire under way. Dropping it before [`wait`](PendingAcquire::wait)
/// returns cancels the acquire through the core; a grant that arrives for
/// it is then released by its exact token.
#[must_use = "dropping a pending acquire cancels it"]
pub struct PendingAcquire {
    rx: Receiver<AcquireResult>,
    ticket: u64,
    handle: Handle,
    done: bool,
}

impl PendingAcquire {
    /// Blocks until the acquire's outcome.
    pub fn wait(mut self) -> Result<Grant, AcquireError> {
        if self.done {
            return Err(AcquireError::Stopped);
        }
        let result = self.rx.recv();
        self.done = true;
        result.unwrap_or(Err(AcquireError::Stopped))
    }

    /// Cancels the acquire without giving up its outcome: [`wait`] then
    /// returns [`AcquireError::Cancelled`] (nothing was sent) or
    /// [`AcquireError::Indeterminate`].
    ///
    /// [`wait`]: PendingAcquire::wait
    pub fn cancel(&self) {
        (self.handle.inner.commands)(Command::Cancel {
            ticket: self.ticket,
        });
    }

    /// The outcome, if it has come.
    pub fn try_wait(&mut self) -> Option<Result<Grant, AcquireError>> {
        if self.done {
            return Some(Err(AcquireError::Stopped));
        }
        let result = self.rx.try_recv()?.unwrap_or(Err(AcquireError::Stopped));
        self.done = true;
        Some(result)
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(command) = Command::for_abandoned(self.ticket, self.rx.abandon()) {
            (self.handle.inner.commands)(command);
        }
    }
}

/// One connection's threads.
struct Conn<S> {
    /// Set once connected: the handle used to end the stream.
    control: Option<S>,
    writer: Option<mpsc::Sender<Bytes>>,
}

struct ThreadIo<C: Connector> {
    connector: Arc<C>,
    connect_timeout: Duration,
    msgs: mpsc::Sender<Msg<C::Stream>>,
    conns: HashMap<ConnId, Conn<C::Stream>>,
    gauges: Arc<Gauges>,
}

impl<C: Connector> Io for ThreadIo<C> {
    fn connect(&mut self, conn: ConnId, addr: Endpoint) {
        let (connector, msgs, timeout) = (
            Arc::clone(&self.connector),
            self.msgs.clone(),
            self.connect_timeout,
        );
        let spawned = thread::Builder::new()
            .name("ticketing-connect".into())
            .spawn(move || {
                let result = connector.connect(&addr, timeout);
                let _ = msgs.send(Msg::Connected(conn, result));
            });
        if let Err(e) = spawned {
            let _ = self.msgs.send(Msg::Connected(conn, Err(e)));
        }
        self.conns.insert(
            conn,
            Conn {
                control: None,
                writer: None,
            },
        );
        self.count();
    }

    fn send(&mut self, conn: ConnId, data: Bytes) {
        if let Some(writer) = self.conns.get(&conn).and_then(|c| c.writer.as_ref()) {
            let _ = writer.send(data);
        }
    }

    fn close(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.remove(&conn) {
            // The writer thread writes what it has, then ends; shutting the
            // stream down wakes the reader.
            drop(c.writer);
            if let Some(control) = c.control {
                let _ = control.shutdown();
            }
        }
        self.count();
    }
}

impl<C: Connector> ThreadIo<C> {
    /// Forgets an attempt that failed: the core closes nothing after a
    /// failed connect, so nothing else would.
    fn forget(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
        self.count();
    }

    fn count(&self) {
        self.gauges
            .connections
            .store(self.conns.len(), Ordering::Relaxed);
    }

    /// Starts the reader and writer threads of a connected stream.
    fn attach(&mut self, conn: ConnId, stream: C::Stream) -> io::Result<()> {
        let Some(entry) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        let mut reader = stream.try_clone()?;
        let mut writer = stream.try_clone()?;
        let msgs = self.msgs.clone();
        let gauges = Arc::clone(&self.gauges);
        thread::Builder::new()
            .name("ticketing-read".into())
            .spawn(move || {
                let mut buf = vec![0u8; 16 * 1024];
                let end = loop {
                    match reader.read(&mut buf) {
                        Ok(0) => break TransportEnd::Eof,
                        Ok(n) => {
                            let data = Bytes::copy_from_slice(&buf[..n]);
                            if !gauges.reserve(n) || msgs.send(Msg::Bytes(conn, data)).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break TransportEnd::Error,
                    }
                };
                let _ = msgs.send(Msg::Ended(conn, end));
            })?;
        let (tx, rx) = mpsc::channel::<Bytes>();
        let msgs = self.msgs.clone();
        thread::Builder::new()
            .name("ticketing-write".into())
            .spawn(move || {
                for data in rx {
                    if writer
                        .write_all(&data)
                        .and_then(|()| writer.flush())
                        .is_err()
                    {
                        let _ = msgs.send(Msg::Ended(conn, TransportEnd::Error));
                        return;
                    }
                }
            })?;
        entry.control = Some(stream);
        entry.writer = Some(tx);
        Ok(())
    }
}

/// What came from a connection, in order.
enum Input {
    Bytes(Bytes),
    Ended(TransportEnd),
}

impl Input {
    fn hand_in(self, shell: &mut Shell, gauges: &Gauges, now: Time, conn: ConnId) {
        match self {
            Input::Bytes(data) => {
                shell.client().handle_bytes(now, conn, &data);
                gauges.release(data.len());
            }
            Input::Ended(end) => shell.client().handle_transport_closed(now, conn, end),
        }
    }
}

fn drive<C: Connector>(
    mut shell: Shell,
    mut io: ThreadIo<C>,
    rx: mpsc::Receiver<Msg<C::Stream>>,
    room: Waker,
) {
    let room = Context::from_waker(&room);
    // Input read while the notices' reader is behind: handled once it has
    // made room (the reader threads stop at `READ_AHEAD` meanwhile).
    let mut held: VecDeque<(ConnId, Input)> = VecDeque::new();
    loop {
        shell.pump(&mut io);
        // Hands on the notices held back, and the input held while there is
        // room for its notices; else the reader's next take wakes this.
        while !shell.notices_full(&room) {
            let Some((conn, input)) = held.pop_front() else {
                break;
            };
            let now = shell.now();
            input.hand_in(&mut shell, &io.gauges, now, conn);
            shell.pump(&mut io);
        }
        let connected = shell.is_connected();
        if connected && !io.gauges.welcomed.swap(true, Ordering::Relaxed) {
            // A server took the client again: drops may wait again.
            io.gauges.stalled.store(false, Ordering::Relaxed);
        }
        if !connected {
            io.gauges.welcomed.store(false, Ordering::Relaxed);
        }
        if shell.is_done() {
            break;
        }
        let msg = match shell.deadline() {
            Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let now = shell.now();
        match msg {
            Ok(Msg::Command(command)) => shell.command(command),
            Ok(Msg::Orphaned) => {
                let _ = shell.client().shutdown(now, ORPHANED_SHUTDOWN);
            }
            Ok(Msg::Connected(conn, Ok(stream))) => {
                if shell.client().connection() == Some(conn) {
                    match io.attach(conn, stream) {
                        Ok(()) => shell.client().handle_connected(now, conn),
                        Err(e) => {
                            io.forget(conn);
                            shell.connect_failed(now, conn, e);
                        }
                    }
                }
            }
            Ok(Msg::Connected(conn, Err(e))) => {
                io.forget(conn);
                shell.connect_failed(now, conn, e);
            }
            Ok(Msg::Bytes(conn, data)) => held.push_back((conn, Input::Bytes(data))),
            Ok(Msg::Ended(conn, end)) => held.push_back((conn, Input::Ended(end))),
            Ok(Msg::Room) => {}
            Err(RecvTimeoutError::Timeout) => {
                let at = shell.deadline().map_or(now, |at| shell.time_of(at));
                shell.client().handle_timeout(now.max(at));
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let open: Vec<ConnId> = io.conns.keys().copied().collect();
    for conn in open {
        io.close(conn);
    }
    io.gauges.end();
}
