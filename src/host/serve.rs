//! The reference server on tokio and TCP (feature `server`): the sans-IO
//! [`Server`] core behind a listener. This is what `ticketing serve` runs.
//!
//! One task owns the core, its timer, the listener and every connection's
//! socket: it reads what a connection has, hands it to the core, and writes
//! the core's answers at once, with no other task or channel in between.
//! Every rule is the core's; what is left here is what only the holder of
//! the sockets can do, the parts of PROTOCOL.md 4 rule 10 about buffers
//! and descriptors:
//!
//! - Reading is its own backpressure: the task reads only once the core has
//!   taken the last bytes, so a client that sends faster than the core
//!   answers is slowed by TCP, not buffered here.
//! - A client that does not read its answers is not read from while the
//!   core says so ([`Server::is_reading`], from the written bytes the task
//!   reports): TCP holds the client back. Other connections are served as
//!   before.
//! - A closed connection's last bytes are written by a task of its own,
//!   for at most [`RETIRE_TIMEOUT`]: a peer that does not read them cannot
//!   keep the socket and the bytes.
//! - Accepting that fails (out of descriptors, say) is tried again after a
//!   pause, from [`ACCEPT_BACKOFF_MIN`] doubling to [`ACCEPT_BACKOFF_MAX`]
//!   and back to the start after an accept that works, so the task neither
//!   spins nor stops serving the connections it has.
//!
//! Connections come from a [`Listener`]: a tokio `TcpListener`, or (feature
//! `tls`) a `TlsListener` that speaks TLS on each and hands it over once
//! its handshake is done: the handshakes run on threads of their own, at
//! most so many at once, each bounded by the core's handshake timeout, so
//! that their crypto never delays the answers of this task.

use std::collections::{HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use ::tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use ::tokio::net::{TcpListener, TcpStream};
use ::tokio::sync::{mpsc, oneshot};
use ::tokio::task::JoinHandle;
use ::tokio::time::Sleep;
use bytes::Bytes;

pub(crate) use crate::host::core::Core;
use crate::host::core::{Control, TableCommand};
use crate::host::state::{Epochs, WallClock, EPOCH_RETRY};
#[cfg(feature = "tls")]
pub use crate::host::tls::{HandshakeLimits, TlsListener, TlsServerStream};
use crate::names::Endpoint;
use crate::server::{Action, ConnId, LockTable, Role, Server, ServerStats, Term, TermError};
use crate::sync::lock;
use crate::sync::register;
use crate::time::Time;

/// A core served on a tokio task, as the handles of each kind of core
/// hold it: what every core takes (see [`crate::host::core`]).
pub(crate) struct Hosted<K> {
    control: mpsc::UnboundedSender<Control<K>>,
    addr: SocketAddr,
    origin: Instant,
    task: JoinHandle<Server>,
}

impl<K> std::fmt::Debug for Hosted<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hosted")
            .field("addr", &self.addr)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// The error of a handle whose server has stopped.
fn stopped<E>(_: E) -> io::Error {
    io::Error::other("the server has stopped")
}

impl<K: Send + 'static> Hosted<K> {
    /// Serves `core` on `listener` on a task of its own.
    pub(crate) fn spawn<L: Listener, C: Core<Command = K>>(
        mut listener: L,
        core: C,
        origin: Instant,
        epochs: Box<dyn Epochs>,
    ) -> io::Result<Hosted<K>> {
        let addr = Listener::local_addr(&listener)?;
        listener.set_handshake_timeout(core.handshake_timeout());
        let (control, rx) = mpsc::unbounded_channel();
        let task =
            ::tokio::spawn(
                async move { run(listener, core, rx, origin, epochs).await.into_server() },
            );
        Ok(Hosted {
            control,
            addr,
            origin,
            task,
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn origin(&self) -> Instant {
        self.origin
    }

    /// Sends one of the core's own commands.
    pub(crate) fn command(&self, command: K) {
        let _ = self.control.send(Control::Core(command));
    }

    /// Sends the core a command whose reply `ask` makes, and waits for it.
    pub(crate) async fn ask<T>(&self, ask: impl FnOnce(oneshot::Sender<T>) -> K) -> io::Result<T> {
        let (tx, rx) = oneshot::channel();
        self.command(ask(tx));
        rx.await.map_err(stopped)
    }

    pub(crate) async fn stats(&self) -> io::Result<ServerStats> {
        let (tx, rx) = oneshot::channel();
        let _ = self.control.send(Control::Stats(tx));
        rx.await.map_err(stopped)
    }

    pub(crate) fn drop_connections(&self) {
        let _ = self.control.send(Control::DropConnections);
    }

    pub(crate) fn pause(&self, on: bool) {
        let _ = self.control.send(Control::Pause(on));
    }

    pub(crate) async fn stop(self) -> io::Result<Server> {
        let _ = self.control.send(Control::Stop);
        self.task.await.map_err(io::Error::other)
    }
}

/// A server running on a tokio task.
#[derive(Debug)]
pub struct ServerHandle {
    hosted: Hosted<TableCommand>,
}

impl ServerHandle {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.hosted.local_addr()
    }

    /// Changes the node's role (a leader that stops leading tells every
    /// connection and closes it).
    pub fn set_role(&self, role: Role) {
        self.hosted.command(TableCommand::Role(role));
    }

    /// The instant the server core's time counts from.
    pub fn origin(&self) -> Instant {
        self.hosted.origin()
    }

    /// Takes the lock table out of the server (see
    /// [`Server::take_lock_table`]), e.g. to hand it to the next leader.
    /// Its times count from [`origin`](ServerHandle::origin): give the next
    /// server the same origin ([`spawn_with_origin`]).
    pub async fn take_lock_table(&self) -> io::Result<LockTable> {
        self.hosted.ask(TableCommand::TakeTable).await
    }

    /// The core's counters (see [`Server::stats`]).
    pub async fn stats(&self) -> io::Result<ServerStats> {
        self.hosted.stats().await
    }

    /// Installs a lock table (see [`Server::install_lock_table`]).
    pub fn install_lock_table(&self, table: LockTable) {
        self.hosted.command(TableCommand::InstallTable(table));
    }

    /// Begins a term (see [`Server::begin_term`]): with the table it
    /// says, or an empty one and a recovery grace, as a node does that
    /// takes over without being handed the table.
    pub async fn begin_term(&self, term: Term) -> io::Result<Result<(), TermError>> {
        self.hosted
            .ask(|reply| TableCommand::BeginTerm(term, reply))
            .await
    }

    /// Leads only until `until` (see [`Server::lead_until`]): past it the
    /// server steps down by itself. Whether it still leads.
    pub async fn lead_until(&self, until: Instant) -> io::Result<bool> {
        self.limit(until, false).await
    }

    /// Takes the leader role and leads only until `until` (see
    /// [`Server::lead_until`]), in one step: no request is served between
    /// the two. Whether it leads (not if `until` has passed).
    pub async fn lead(&self, until: Instant) -> io::Result<bool> {
        self.limit(until, true).await
    }

    async fn limit(&self, until: Instant, lead: bool) -> io::Result<bool> {
        self.hosted
            .ask(|reply| TableCommand::LeadUntil { until, lead, reply })
            .await
    }

    /// Sends `L addr` to every connection.
    pub fn announce_leader(&self, addr: Endpoint) {
        self.hosted.command(TableCommand::Announce(addr));
    }

    /// Cuts every connection at once, as a network failure would; the
    /// server keeps running and its lock table is untouched.
    pub fn drop_connections(&self) {
        self.hosted.drop_connections();
    }

    /// Stops taking bytes from connections (they queue, then TCP pushes
    /// back) until [`resume`](ServerHandle::resume): a server that hangs.
    /// Timers still run.
    pub fn pause(&self) {
        self.hosted.pause(true);
    }

    /// Takes bytes from connections again.
    pub fn resume(&self) {
        self.hosted.pause(false);
    }

    /// Stops accepting, closes every connection, and returns the core (its
    /// lock table can be carried into the next server).
    pub async fn stop(self) -> io::Result<Server> {
        self.hosted.stop().await
    }
}

/// Where a server's connections come from.
pub trait Listener: Send + 'static {
    /// An accepted connection.
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// The next connection, if one is waiting; else asks to be woken when
    /// one is.
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Stream>>;

    /// The address it listens on.
    fn local_addr(&self) -> io::Result<SocketAddr>;

    /// The server core's handshake timeout
    /// ([`Config::handshake_timeout`](crate::server::Config::handshake_timeout)),
    /// told by [`spawn`] before the first accept: a listener with a
    /// handshake of its own to do before it hands a connection over (TLS)
    /// bounds it by this too. Nothing by default.
    fn set_handshake_timeout(&mut self, timeout: Duration) {
        let _ = timeout;
    }
}

/// Plain TCP, with `TCP_NODELAY` set.
impl Listener for TcpListener {
    type Stream = TcpStream;

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<TcpStream>> {
        TcpListener::poll_accept(self, cx).map_ok(|(stream, _)| {
            let _ = stream.set_nodelay(true);
            stream
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        TcpListener::local_addr(self)
    }
}

/// Starts serving `server` on `listener`; the core's time counts from now.
pub fn spawn<L: Listener>(listener: L, server: Server) -> io::Result<ServerHandle> {
    spawn_with_origin(listener, server, Instant::now())
}

/// Starts serving `server` on `listener`, its time counting from `origin`.
/// Servers that hand a lock table to each other must share an origin.
pub fn spawn_with_origin<L: Listener>(
    listener: L,
    server: Server,
    origin: Instant,
) -> io::Result<ServerHandle> {
    spawn_with_epochs(listener, server, origin, Box::new(WallClock))
}

/// The same, with the epochs the core asks for
/// ([`EpochSource::Driver`](crate::server::EpochSource::Driver)) coming
/// from `epochs`: a state directory keeps each before it is used. While
/// it fails, nothing is granted and it is tried again on every turn.
pub fn spawn_with_epochs<L: Listener>(
    listener: L,
    server: Server,
    origin: Instant,
    epochs: Box<dyn Epochs>,
) -> io::Result<ServerHandle> {
    let hosted = Hosted::spawn(listener, server, origin, epochs)?;
    Ok(ServerHandle { hosted })
}

/// Binds `addr` and serves `server` on it.
pub async fn bind(addr: &str, server: Server) -> io::Result<ServerHandle> {
    let listener = TcpListener::bind(addr).await?;
    spawn(listener, server)
}

/// How many bytes one read takes at most.
const READ_SIZE: usize = 64 * 1024;

/// Reads from one connection in a row before the others get their turn.
const READS_PER_TURN: usize = 4;

/// Connections accepted in one pass at most.
const ACCEPTS_PER_PASS: usize = 64;

/// Passes over every source of input in one poll of the server task, before
/// it yields to the runtime.
const PASSES_PER_POLL: usize = 32;

/// How long a closed connection's last bytes may take to be written before
/// the socket is closed without them.
pub const RETIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The first pause after accepting a connection failed.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(1);

/// The longest pause after accepting failed again and again.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The connections that have something for the server task (bytes to read,
/// room to write, an end), and the task's waker.
#[derive(Default)]
struct Ready {
    conns: Mutex<Vec<ConnId>>,
    task: Mutex<Option<Waker>>,
}

/// The waker a connection's socket is polled with: it puts the connection
/// on the ready list (once) and wakes the server task.
struct ConnWaker {
    conn: ConnId,
    queued: AtomicBool,
    ready: Arc<Ready>,
}

impl Wake for ConnWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            // Already listed, and the task woken since.
            return;
        }
        lock(&self.ready.conns).push(self.conn);
        if let Some(task) = lock(&self.ready.task).as_ref() {
            task.wake_by_ref();
        }
    }
}

/// An accepted connection.
struct Accepted<S> {
    stream: S,
    ready: Arc<ConnWaker>,
    waker: Waker,
    /// What the core said to it that the socket has not taken yet.
    out: VecDeque<Bytes>,
    /// Bytes of the front of `out` already written.
    written: usize,
    /// Not read from: the core said so ([`Server::is_reading`]). Writing
    /// its answers resumes it.
    stalled: bool,
    /// Written bytes the stream holds (a TLS stream's records that the
    /// socket did not take yet): flushed once the socket has room.
    unflushed: bool,
}

/// What a connection's turn at reading came to.
enum Read {
    /// The socket has nothing more for now (or the core closed it).
    Dry,
    /// Not read from until its answers drain ([`Server::is_reading`]);
    /// writing them resumes it.
    Stalled,
    /// The turn ended with bytes perhaps still waiting.
    More,
    /// The connection ended (end of stream, or an error).
    Ended,
}

impl<S: AsyncRead + AsyncWrite + Send + Unpin + 'static> Accepted<S> {
    fn new(conn: ConnId, stream: S, ready: &Arc<Ready>) -> Accepted<S> {
        let ready = Arc::new(ConnWaker {
            conn,
            queued: AtomicBool::new(false),
            ready: Arc::clone(ready),
        });
        Accepted {
            stream,
            waker: Waker::from(Arc::clone(&ready)),
            ready,
            out: VecDeque::new(),
            written: 0,
            stalled: false,
            unflushed: false,
        }
    }

    /// Queues `data` to be written.
    fn push(&mut self, data: Bytes) {
        self.out.push_back(data);
    }

    /// Reads what the socket has, a few reads at most, handing every byte
    /// to `server` as `conn`'s; `true` with it if bytes went to the core.
    fn read<C: Core>(
        &mut self,
        conn: ConnId,
        server: &mut C,
        buf: &mut [u8],
        start: Instant,
    ) -> (bool, Read) {
        let mut cx = Context::from_waker(&self.waker);
        let mut took = false;
        for _ in 0..READS_PER_TURN {
            if !server.is_reading(conn) {
                self.stalled = true;
                return (took, Read::Stalled);
            }
            let mut filled = ReadBuf::new(buf);
            match Pin::new(&mut self.stream).poll_read(&mut cx, &mut filled) {
                Poll::Pending => return (took, Read::Dry),
                Poll::Ready(Ok(())) if filled.filled().is_empty() => return (took, Read::Ended),
                Poll::Ready(Ok(())) => {
                    took = true;
                    server.handle_bytes(time_since(start), conn, filled.filled());
                    if !server.is_open(conn) {
                        // The core closed it: its Close is queued.
                        return (took, Read::Dry);
                    }
                }
                Poll::Ready(Err(_)) => return (took, Read::Ended),
            }
        }
        (took, Read::More)
    }

    /// Writes what is queued, as far as the socket takes it, telling the
    /// core what was written, and resumes reading a stalled connection once
    /// the core says so. `Err`: the connection is broken.
    fn flush<C: Core>(&mut self, conn: ConnId, server: &mut C, start: Instant) -> io::Result<()> {
        let mut cx = Context::from_waker(&self.waker);
        let mut written = 0;
        while let Some(front) = self.out.front() {
            match Pin::new(&mut self.stream).poll_write(&mut cx, &front[self.written..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => {
                    written += n;
                    self.written += n;
                    if self.written == front.len() {
                        self.out.pop_front();
                        self.written = 0;
                    }
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => break,
            }
        }
        if written > 0 || self.unflushed {
            match Pin::new(&mut self.stream).poll_flush(&mut cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => self.unflushed = true,
            }
        }
        if written > 0 {
            server.handle_written(time_since(start), conn, written);
        }
        if self.stalled && server.is_reading(conn) {
            self.stalled = false;
            // Its bytes may have waited all along: read it on the next pass.
            self.ready.wake_by_ref();
        }
        Ok(())
    }

    /// Lets the connection go: what is still queued is written by a task of
    /// its own (the server does not wait for a slow reader), then the socket
    /// is shut down and closed; after [`RETIRE_TIMEOUT`] it is closed with
    /// whatever is left unwritten.
    fn retire(mut self) {
        if let Some(front) = self.out.front_mut() {
            let _ = front.split_to(self.written);
        }
        let Accepted {
            mut stream, out, ..
        } = self;
        ::tokio::spawn(async move {
            let last_words = async {
                for data in out {
                    if stream.write_all(&data).await.is_err() {
                        return;
                    }
                }
                let _ = stream.shutdown().await;
            };
            // Dropping the unfinished writes drops the socket too.
            let _ = ::tokio::time::timeout(RETIRE_TIMEOUT, last_words).await;
        });
    }
}

/// The core's time at the present instant, its time counting from `start`.
fn time_since(start: Instant) -> Time {
    Time::from_nanos(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// The server task's state.
struct Serving<L: Listener, C: Core> {
    server: C,
    start: Instant,
    listener: L,
    control: mpsc::UnboundedReceiver<Control<C::Command>>,
    links: HashMap<ConnId, Accepted<L::Stream>>,
    ready: Arc<Ready>,
    /// The connections to read (and flush) in this pass.
    turn: Vec<ConnId>,
    /// Connections that became ready while paused: read on resume.
    held: Vec<ConnId>,
    /// Connections with bytes queued to write.
    dirty: Vec<ConnId>,
    paused: bool,
    buf: Box<[u8]>,
    /// The core's timer. It is only ever moved earlier: a wake before the
    /// core's deadline finds nothing due and costs one turn, whereas arming
    /// a timer earlier than the runtime's next one makes tokio wake its
    /// driver (a syscall), which would otherwise happen on every grant.
    sleep: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    /// After accepting failed: no accept is tried before this timer fires.
    accept_pause: Pin<Box<Sleep>>,
    accept_paused: bool,
    /// The next pause if accepting fails again.
    accept_backoff: Duration,
    /// Where the epochs the core asks for come from.
    epochs: Box<dyn Epochs>,
    /// The core asked for the epoch after this one and has not got it.
    wanted_epoch: Option<u64>,
    /// While it waits for one: when to ask `epochs` again if nothing else
    /// wakes the task first.
    epoch_retry: Pin<Box<Sleep>>,
    epoch_retry_armed: bool,
}

impl<L: Listener, C: Core> Serving<L, C> {
    fn now(&self) -> Time {
        time_since(self.start)
    }

    /// Serves until told to stop (or until the handle is gone).
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        register(&mut lock(&self.ready.task), cx);
        if self.server.has_deferred() {
            // The tasks woken since the last poll (a replica's peer
            // links) have run: what the core said is on its way.
            self.server.handle_deferred(self.now());
            self.answer();
        }
        // Bounded, so that a flood of input cannot starve the runtime.
        for _ in 0..PASSES_PER_POLL {
            match self.pass(cx) {
                None => return Poll::Ready(()),
                Some(false) => {
                    if self.server.has_deferred() {
                        // Polled again after the tasks woken meanwhile.
                        cx.waker().wake_by_ref();
                    }
                    return Poll::Pending;
                }
                Some(true) => {}
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// One pass over every source of input, answers written at the end.
    /// `Some(progress)`, or `None` to stop.
    fn pass(&mut self, cx: &mut Context<'_>) -> Option<bool> {
        let mut progress = false;
        loop {
            match self.control.poll_recv(cx) {
                Poll::Ready(Some(command)) => {
                    progress = true;
                    if !self.control(command) {
                        return None;
                    }
                }
                Poll::Ready(None) => return None,
                Poll::Pending => break,
            }
        }
        if self.wanted_epoch.is_some() {
            self.give_epoch();
            self.answer();
        }
        if self.server.poll_sources(cx, self.now()) {
            progress = true;
            self.answer();
        }
        progress |= self.accept(cx);
        self.turn.append(&mut lock(&self.ready.conns));
        let mut turn = std::mem::take(&mut self.turn);
        for &conn in &turn {
            let Some(link) = self.links.get_mut(&conn) else {
                continue;
            };
            link.ready.queued.store(false, Ordering::Release);
            if !link.out.is_empty() || link.unflushed {
                // Woken, perhaps, by room to write.
                self.dirty.push(conn);
            }
            if self.paused {
                self.held.push(conn);
                continue;
            }
            let (took, read) = link.read(conn, &mut self.server, &mut self.buf, self.start);
            progress |= took;
            match read {
                Read::Dry | Read::Stalled => {}
                Read::More => link.ready.wake_by_ref(),
                Read::Ended => {
                    progress = true;
                    if let Some(link) = self.links.remove(&conn) {
                        link.retire();
                    }
                    self.server.handle_closed(self.now(), conn);
                }
            }
        }
        turn.clear();
        self.turn = turn;
        self.answer();
        let deadline = self
            .server
            .poll_timeout()
            .and_then(|at| self.start.checked_add(Duration::from_nanos(at.as_nanos())));
        if let Some(at) = deadline {
            if self.armed.map_or(true, |armed| at < armed) {
                self.sleep.as_mut().reset(at.into());
                self.armed = Some(at);
            }
        }
        if self.armed.is_some() && self.sleep.as_mut().poll(cx).is_ready() {
            self.armed = None;
            self.server.handle_timeout(self.now());
            self.answer();
            progress = true;
        }
        if self.epoch_retry_armed && self.epoch_retry.as_mut().poll(cx).is_ready() {
            // The next pass asks for the epoch again.
            self.epoch_retry_armed = false;
            progress = true;
        }
        Some(progress)
    }

    /// Accepts what connections are waiting, unless accepting failed
    /// lately; `true` if any was.
    fn accept(&mut self, cx: &mut Context<'_>) -> bool {
        if self.accept_paused {
            if self.accept_pause.as_mut().poll(cx).is_pending() {
                return false;
            }
            self.accept_paused = false;
        }
        let mut accepted = false;
        for _ in 0..ACCEPTS_PER_PASS {
            match self.listener.poll_accept(cx) {
                Poll::Ready(Ok(stream)) => {
                    self.accept_backoff = ACCEPT_BACKOFF_MIN;
                    let conn = self.server.handle_accept(self.now());
                    self.links
                        .insert(conn, Accepted::new(conn, stream, &self.ready));
                    // Read it now: that also asks to be woken by its bytes.
                    self.turn.push(conn);
                    accepted = true;
                }
                // Out of descriptors, say. The connection waits in the
                // backlog, and the listener stays ready: trying again at
                // once would spin. Pause, longer each time in a row.
                Poll::Ready(Err(_)) => {
                    let pause = self.accept_backoff;
                    self.accept_backoff = pause.saturating_mul(2).min(ACCEPT_BACKOFF_MAX);
                    let now = ::tokio::time::Instant::now();
                    // At most a second later: it cannot overflow.
                    self.accept_pause
                        .as_mut()
                        .reset(now.checked_add(pause).unwrap_or(now));
                    self.accept_paused = true;
                    // Asks to be woken when it is over.
                    if self.accept_pause.as_mut().poll(cx).is_ready() {
                        self.accept_paused = false;
                        cx.waker().wake_by_ref();
                    }
                    break;
                }
                Poll::Pending => break,
            }
        }
        accepted
    }

    /// Carries out a command of the handle; `false` to stop.
    fn control(&mut self, command: Control<C::Command>) -> bool {
        let now = self.now();
        match command {
            Control::Stats(reply) => {
                let _ = reply.send(self.server.stats());
            }
            Control::DropConnections => {
                // What the core said before goes out first.
                self.take_actions();
                for (conn, link) in self.links.drain() {
                    link.retire();
                    self.server.handle_closed(now, conn);
                }
            }
            Control::Pause(on) => {
                self.paused = on;
                if !on {
                    self.turn.append(&mut self.held);
                }
            }
            Control::Stop => return false,
            Control::Core(command) => self.server.command(now, self.start, command),
        }
        true
    }

    /// Queues the core's actions on the connections.
    fn take_actions(&mut self) {
        while let Some(action) = self.server.poll_action() {
            match action {
                Action::Send { conn, data } => {
                    if let Some(link) = self.links.get_mut(&conn) {
                        if link.out.is_empty() {
                            self.dirty.push(conn);
                        }
                        link.push(data);
                    }
                }
                Action::Close { conn } => {
                    if let Some(link) = self.links.remove(&conn) {
                        link.retire();
                    }
                }
                Action::NeedEpoch { after } => self.new_epoch(after),
            }
        }
    }

    /// Gives the core the epoch after `after` that it asked for, once it
    /// is kept; if keeping it fails, it is tried again on the next turn.
    fn new_epoch(&mut self, after: u64) {
        self.wanted_epoch = Some(after);
        self.give_epoch();
    }

    /// Asks `epochs` for the epoch the core waits for; if it is not
    /// there yet, asks again on every pass, and after [`EPOCH_RETRY`] at
    /// the latest.
    fn give_epoch(&mut self) {
        let Some(after) = self.wanted_epoch else {
            return;
        };
        match self.epochs.next(after) {
            Some(epoch) => {
                self.wanted_epoch = None;
                self.server.begin_epoch(self.now(), epoch);
            }
            None if !self.epoch_retry_armed => {
                let now = ::tokio::time::Instant::now();
                // A tenth of a second later: it cannot overflow.
                let at = now.checked_add(EPOCH_RETRY).unwrap_or(now);
                self.epoch_retry.as_mut().reset(at);
                self.epoch_retry_armed = true;
            }
            None => {}
        }
    }

    /// Writes the core's answers, as far as the sockets take them.
    fn answer(&mut self) {
        self.take_actions();
        while !self.dirty.is_empty() {
            let mut broken = false;
            for conn in std::mem::take(&mut self.dirty) {
                let Some(link) = self.links.get_mut(&conn) else {
                    continue;
                };
                if link.flush(conn, &mut self.server, self.start).is_err() {
                    self.links.remove(&conn);
                    self.server.handle_closed(self.now(), conn);
                    broken = true;
                }
            }
            if !broken {
                break;
            }
            // A closed connection moved the core's time on: its timers may
            // have something to say.
            self.take_actions();
        }
        self.dirty.clear();
    }

    /// Closes every connection and hands back the core.
    fn finish(mut self) -> C {
        self.take_actions();
        let now = self.now();
        for (conn, link) in self.links.drain() {
            link.retire();
            self.server.handle_closed(now, conn);
        }
        while self.server.poll_action().is_some() {}
        self.server
    }
}

async fn run<L: Listener, C: Core>(
    listener: L,
    server: C,
    control: mpsc::UnboundedReceiver<Control<C::Command>>,
    start: Instant,
    epochs: Box<dyn Epochs>,
) -> C {
    let mut serving = Serving {
        server,
        start,
        listener,
        control,
        links: HashMap::new(),
        ready: Arc::new(Ready::default()),
        turn: Vec::new(),
        held: Vec::new(),
        dirty: Vec::new(),
        paused: false,
        buf: vec![0; READ_SIZE].into_boxed_slice(),
        sleep: Box::pin(::tokio::time::sleep_until(start.into())),
        armed: None,
        accept_pause: Box::pin(::tokio::time::sleep_until(start.into())),
        accept_paused: false,
        accept_backoff: ACCEPT_BACKOFF_MIN,
        epochs,
        wanted_epoch: None,
        epoch_retry: Box::pin(::tokio::time::sleep_until(start.into())),
        epoch_retry_armed: false,
    };
    poll_fn(|cx| serving.poll(cx)).await;
    serving.finish()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use ::tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::*;
    use crate::host::state::{Keeping, KeptEpochs, StateDir};
    use crate::names::Name;
    use crate::server::{epoch_of, Config, EpochSource, TERM_GRANTS};

    /// A term about to reach `n = 2^22` whose next epoch cannot be kept:
    /// the server says so (through the watcher) and tries again with no
    /// other input to wake it, grants nothing meanwhile, and grants the
    /// waiting acquire under the new epoch once it can keep it.
    #[::tokio::test]
    async fn an_epoch_that_cannot_be_kept_is_told_and_tried_again_until_it_is() {
        let dir = std::env::temp_dir().join(format!("ticketing-serve-roll-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = StateDir::open(&dir).expect("a state directory");
        // In the way of the record's rename, whoever runs the test.
        let blocker = state.epoch_path();
        std::fs::create_dir_all(blocker.join("in-the-way")).expect("a blocker");
        let told = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&told);
        let epochs = KeptEpochs::new(state, 60_000).watch(move |keeping| {
            let line = match keeping {
                Keeping::Failed { error, .. } => format!("failed: {error}"),
                Keeping::Recovered { failures, .. } => format!("kept after {failures}"),
            };
            seen.lock().expect("not poisoned").push(line);
        });
        let mut config = Config::new(Name::new("n1").expect("a name"));
        config.epochs = EpochSource::Driver;
        let mut core = Server::new(config, Time::ZERO).expect("a server");
        core.begin_term(Time::ZERO, Term::First { epoch: 40 })
            .expect("a term");
        core.set_term_count(TERM_GRANTS - 1);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let handle =
            spawn_with_epochs(listener, core, Instant::now(), Box::new(epochs)).expect("serving");

        let stream = TcpStream::connect(handle.local_addr())
            .await
            .expect("connect");
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        write
            .write_all(b"H 2 t -\nA 1 k o 30000 1000\n")
            .await
            .expect("send");
        let welcome = lines.next_line().await.expect("read");
        assert!(welcome.is_some_and(|w| w.starts_with("W ")));

        // Tried again and again with no other input: the retry timer.
        let failures = || {
            let told = told.lock().expect("not poisoned");
            told.iter().filter(|l| l.starts_with("failed: ")).count()
        };
        let patience = Instant::now() + Duration::from_secs(10);
        while failures() < 3 {
            assert!(
                Instant::now() < patience,
                "{:?}",
                told.lock().expect("lock")
            );
            ::tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            told.lock().expect("lock")[0].contains(&*blocker.to_string_lossy()),
            "the failure names the file"
        );
        assert_eq!(handle.stats().await.expect("stats").grants, 0);

        std::fs::remove_dir_all(&blocker).expect("out of the way");
        let grant = ::tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("granted once the epoch is kept")
            .expect("read")
            .expect("a line");
        let fields: Vec<&str> = grant.split(' ').collect();
        assert_eq!(fields[..4], ["G", "1", "A", "k"], "{grant}");
        let token: u64 = fields[4].parse().expect("a token");
        assert!(epoch_of(token) > 40, "{grant}");
        let last = told.lock().expect("lock").last().cloned();
        assert!(last.is_some_and(|l| l.starts_with("kept after ")));
        handle.stop().await.expect("stopped");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
