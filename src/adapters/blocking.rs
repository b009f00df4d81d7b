//! The blocking adapter (feature `blocking`): the client core on a driver
//! thread over `std::net`, for programs without an async runtime.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use ticketing::blocking::{connect, TcpConnector};
//! use ticketing::client::{Config, Outcome};
//! use ticketing::{Endpoint, Key, Name};
//!
//! let config = Config::new([Endpoint::new("127.0.0.1:7878")?], Name::new("cron-7")?);
//! let client = connect(config, TcpConnector)?;
//! let (key, me) = (Key::new("nightly-report")?, Name::new("cron-7")?);
//! if let Outcome::Granted(grant) = client.acquire(key, me, Duration::from_secs(5), Duration::from_secs(60))? {
//!     // ... the work, quoting grant.token() to storage ...
//!     client.release(&grant)?;
//! }
//! client.shutdown(Duration::from_secs(5))?;
//! # Ok(()) }
//! ```
//!
//! A call blocks until the core gives its outcome, which the core bounds:
//! an acquire ends within its wait budget (or the queue grace, if longer)
//! plus the answer grace. Every rule is the core's; the adapter moves bytes
//! between threads and sockets.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::adapters::lease;
use crate::adapters::notices::Sink;
use crate::adapters::reply::{self, Receiver};
use crate::adapters::shell::{AcquireArgs, Command, Io, OpResult, Shell};
use crate::adapters::tls;
use crate::client::{
    Client, ClientStats, Config, ConfigError, ConnId, Error, Event, Grant, Outcome, TransportEnd,
};
use crate::names::{Endpoint, Key, Name};
use crate::time::Time;

pub use crate::adapters::lease::{HeldGrant, LeaseStatus};
pub use crate::adapters::shell::{LockError, RequestError};
#[cfg(feature = "tls")]
pub use crate::adapters::tls::blocking::{TlsConnector, TlsStream};

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
}

/// Connects over TCP, with `TCP_NODELAY` set.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    type Stream = TcpStream;

    fn connect(&self, addr: &Endpoint, timeout: Duration) -> io::Result<TcpStream> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
        for socket in addr.as_str().to_socket_addrs()? {
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
}

/// Budget of the shutdown that starts when every handle is dropped.
const ORPHANED_SHUTDOWN: Duration = Duration::from_secs(5);

/// Starts a client on a driver thread. It connects in the background; the
/// thread ends once the client has shut down (after [`Handle::shutdown`],
/// or when every handle is dropped).
pub fn connect<C: Connector>(config: Config, connector: C) -> Result<Handle, ConfigError> {
    start(config, connector, Sink::Nowhere)
}

/// As [`connect`], with every notice (the events that are not outcomes)
/// passed to `notices` on the driver thread.
pub fn connect_with_notices<C: Connector>(
    config: Config,
    connector: C,
    notices: impl FnMut(Event) + Send + 'static,
) -> Result<Handle, ConfigError> {
    start(config, connector, Sink::Call(Box::new(notices)))
}

fn start<C: Connector>(config: Config, connector: C, notices: Sink) -> Result<Handle, ConfigError> {
    let connect_timeout = config.connect_timeout;
    let client = Client::new(config, Time::ZERO)?;
    let (tx, rx) = mpsc::channel::<Msg<C::Stream>>();
    let shell = Shell::new(client, Instant::now(), notices);
    let gauges = Arc::new(Gauges::default());
    let io = ThreadIo {
        connector: Arc::new(connector),
        connect_timeout,
        msgs: tx.clone(),
        conns: HashMap::new(),
        gauges: Arc::clone(&gauges),
    };
    let commands: Box<dyn Fn(Command) -> bool + Send + Sync> = Box::new({
        let tx = tx.clone();
        move |cmd| tx.send(Msg::Command(cmd)).is_ok()
    });
    let orphaned: Box<dyn Fn() + Send + Sync> = Box::new(move || {
        let _ = tx.send(Msg::Orphaned);
    });
    thread::Builder::new()
        .name("ticketing-driver".into())
        .spawn(move || drive(shell, io, rx))
        .expect("spawn the driver thread");
    Ok(Handle {
        inner: Arc::new(Inner {
            commands,
            orphaned,
            tickets: std::sync::atomic::AtomicU64::new(1),
            gauges,
        }),
    })
}

struct Inner {
    commands: Box<dyn Fn(Command) -> bool + Send + Sync>,
    orphaned: Box<dyn Fn() + Send + Sync>,
    tickets: std::sync::atomic::AtomicU64,
    gauges: Arc<Gauges>,
}

/// How many bytes the reader threads may have read ahead of the driver:
/// past this, they stop reading until the driver has handled some, so a
/// slow driver (a slow notice function, a flood of input) slows the
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
}

impl Gauges {
    fn read_ahead(&self) -> MutexGuard<'_, usize> {
        // Nothing is ever left half-changed under this lock.
        self.read_ahead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
    }
}

/// A cloneable handle on a client driven by its own thread. Every clone
/// shares the one connection.
#[derive(Clone)]
pub struct Handle {
    inner: Arc<Inner>,
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

    /// Acquires `key` for `lease`, waiting at most `wait` in total, and
    /// blocks until the outcome.
    pub fn acquire(
        &self,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> Result<Outcome, RequestError> {
        self.start_acquire(key, owner, wait, lease).wait()
    }

    /// Starts an acquire without blocking. Dropping the returned value
    /// before [`PendingAcquire::wait`] returns cancels the acquire.
    pub fn start_acquire(
        &self,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> PendingAcquire {
        self.acquire_with(AcquireArgs::new(key, owner, wait, lease, None), None)
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

    /// Acquires `key` as [`acquire`](Handle::acquire) does, and hands the
    /// grant over as a [`Lease`]: a guard that releases it by exact token
    /// when dropped. Not renewed unless asked ([`Lease::auto_renew`]).
    pub fn lock(
        &self,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> Result<Lease, LockError> {
        self.lock_with(AcquireArgs::new(key, owner, wait, lease, None))
    }

    /// As [`lock`](Handle::lock), with the grant renewed automatically for
    /// at most `limit` of holding (`None`: until released), each renewal
    /// asking for `lease`.
    pub fn lock_renewing(
        &self,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        limit: Option<Duration>,
    ) -> Result<Lease, LockError> {
        self.lock_with(AcquireArgs::new(key, owner, wait, lease, Some(limit)))
    }

    fn lock_with(&self, args: AcquireArgs) -> Result<Lease, LockError> {
        let shared = lease::Shared::new();
        let pending = self.acquire_with(args, Some(Arc::clone(&shared)));
        match pending.wait()? {
            Outcome::Granted(grant) => Ok(Lease {
                held: HeldGrant::new(grant, shared),
                handle: self.clone(),
            }),
            other => Err(LockError::NotAcquired(other)),
        }
    }

    fn acquire_with(&self, args: AcquireArgs, guard: Option<Arc<lease::Shared>>) -> PendingAcquire {
        let ticket = self
            .inner
            .tickets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// A held grant: a guard, as a lock is in Rust. Dropping it releases the
/// grant by its exact token, which also stops its renewal, so an
/// automatically renewed lock never outlives the code that held it.
/// [`release`](Lease::release) does the same and reports the outcome;
/// [`let_expire`](Lease::let_expire) keeps the grant to run out.
/// Its grant, token and status come from [`HeldGrant`], which it derefs to.
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
    /// (or, the first time, from the grant's), or until `timeout` passes;
    /// returns the status then.
    pub fn wait_change(&mut self, timeout: Option<Duration>) -> LeaseStatus {
        self.held.wait_change(timeout)
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
        if let Some(grant) = self.held.take() {
            (self.handle.inner.commands)(Command::DropGuard { grant });
        }
    }
}

/// An acquire under way. Dropping it before [`wait`](PendingAcquire::wait)
/// returns cancels the acquire through the core; a grant that arrives for
/// it is then released by its exact token.
#[must_use = "dropping a pending acquire cancels it"]
pub struct PendingAcquire {
    rx: Receiver<OpResult>,
    ticket: u64,
    handle: Handle,
    done: bool,
}

impl PendingAcquire {
    /// Blocks until the acquire's outcome.
    pub fn wait(mut self) -> Result<Outcome, RequestError> {
        if self.done {
            return Err(RequestError::Stopped);
        }
        let result = self.rx.recv();
        self.done = true;
        result
            .ok_or(RequestError::Stopped)?
            .map_err(RequestError::from)
    }

    /// Cancels the acquire without giving up its outcome: [`wait`] then
    /// returns `Cancelled` (nothing was sent) or `Indeterminate`.
    ///
    /// [`wait`]: PendingAcquire::wait
    pub fn cancel(&self) {
        (self.handle.inner.commands)(Command::Cancel {
            ticket: self.ticket,
        });
    }

    /// The outcome, if it has come.
    pub fn try_wait(&mut self) -> Option<Result<Outcome, RequestError>> {
        if self.done {
            return Some(Err(RequestError::Stopped));
        }
        let result = match self.rx.try_recv()? {
            Some(outcome) => outcome.map_err(RequestError::from),
            None => Err(RequestError::Stopped),
        };
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

fn drive<C: Connector>(mut shell: Shell, mut io: ThreadIo<C>, rx: mpsc::Receiver<Msg<C::Stream>>) {
    loop {
        shell.pump(&mut io);
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
                        Err(_) => {
                            io.forget(conn);
                            shell.client().handle_connect_failed(now, conn);
                        }
                    }
                }
            }
            Ok(Msg::Connected(conn, Err(e))) => {
                io.forget(conn);
                tls::connect_failed(shell.client(), now, conn, &e);
            }
            Ok(Msg::Bytes(conn, data)) => {
                shell.client().handle_bytes(now, conn, &data);
                io.gauges.release(data.len());
            }
            Ok(Msg::Ended(conn, end)) => shell.client().handle_transport_closed(now, conn, end),
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
