//! The server's TLS listener, on tokio-rustls.
//!
//! A handshake's crypto is the most expensive thing a client can make the
//! server do (an RSA-4096 signature takes milliseconds), and a client can
//! make it do one per connection, for the price of a ClientHello. So
//! handshakes never run on the task that serves the core: the listener
//! accepts a connection, hands its handshake to threads of its own
//! ([`HandshakeLimits::threads`], each with a current-thread runtime), and
//! hands the connection to the server once its handshake is done. The server's established
//! connections are answered whatever the handshakes cost, and whatever a
//! certificate resolver of the embedder's does.
//!
//! - **Bounded.** At most [`HandshakeLimits::max_concurrent`] handshakes
//!   are under way at once. Beyond that the listener accepts nothing:
//!   further connections wait in the kernel's listen backlog until a
//!   handshake ends (and once the backlog is full, the kernel refuses new
//!   ones), holding none of the server's descriptors or memory.
//! - **Timed.** A handshake not done within the handshake timeout (the
//!   core's, [`Config::handshake_timeout`], which `serve::spawn` tells
//!   the listener) is dropped, and its socket closed, at that moment.
//!   The core then hears of the connection and gives it the same timeout
//!   again for its `H`.
//! - **Refused before `H`.** Nothing the client sends reaches the core
//!   before its handshake is done: a client the server's TLS refuses (one
//!   without a certificate its client CA signed, say) is closed (after
//!   the alert that says why) without the core ever hearing of it.
//!
//! [`Config::handshake_timeout`]: crate::server::Config::handshake_timeout

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::host::serve::Listener;
use crate::tls::ServerTls;

/// How a [`TlsListener`] runs handshakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandshakeLimits {
    /// The threads handshakes run on: their crypto competes with the
    /// server's thread for nothing else (default: every core but one, at
    /// least one).
    pub threads: NonZeroUsize,
    /// The most handshakes under way at once (default 128). Beyond, the
    /// listener accepts nothing: connections wait in the listen backlog.
    pub max_concurrent: NonZeroUsize,
}

impl Default for HandshakeLimits {
    fn default() -> HandshakeLimits {
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        HandshakeLimits {
            threads: NonZeroUsize::new(cores - 1).unwrap_or(NonZeroUsize::MIN),
            max_concurrent: NonZeroUsize::new(128).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// Accepts connections from another listener (TCP unless told otherwise)
/// and speaks TLS on them, the handshakes on threads of its own.
///
/// ```no_run
/// # async fn demo(core: ticketing::server::Server) -> Result<(), Box<dyn std::error::Error>> {
/// use ticketing::serve::{spawn, TlsListener};
/// use ticketing::tls::{Identity, ServerTls};
///
/// let tls = ServerTls::builder()
///     .identity(Identity::from_pem_files("server.pem", "server.key")?)
///     .client_ca_file("clients-ca.pem")? // only for mutual TLS
///     .build()?;
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:7878").await?;
/// let server = spawn(TlsListener::new(listener, tls), core)?;
/// # Ok(()) }
/// ```
pub struct TlsListener<L: Listener = TcpListener> {
    inner: L,
    acceptor: TlsAcceptor,
    limits: HandshakeLimits,
    timeout: Duration,
    /// The handshakes' runtime, made at the first accept.
    pool: Option<Pool>,
    /// Handshakes handed to the pool and not yet over.
    under_way: usize,
    /// What became of each: the stream, or nothing (failed, timed out).
    over: mpsc::UnboundedReceiver<Option<TlsStream<L::Stream>>>,
    tell: mpsc::UnboundedSender<Option<TlsStream<L::Stream>>>,
}

impl<L: Listener> std::fmt::Debug for TlsListener<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("limits", &self.limits)
            .field("timeout", &self.timeout)
            .field("under_way", &self.under_way)
            .finish_non_exhaustive()
    }
}

/// The handshake timeout until the server tells its own: the core's
/// default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl<L: Listener> TlsListener<L> {
    /// TLS on the connections of `inner`, within the default
    /// [`HandshakeLimits`].
    pub fn new(inner: L, tls: ServerTls) -> TlsListener<L> {
        let (tell, over) = mpsc::unbounded_channel();
        TlsListener {
            inner,
            acceptor: TlsAcceptor::from(tls.config),
            limits: HandshakeLimits::default(),
            timeout: DEFAULT_TIMEOUT,
            pool: None,
            under_way: 0,
            over,
            tell,
        }
    }

    /// Runs handshakes within `limits`. Takes effect at the first accept.
    pub fn limits(mut self, limits: HandshakeLimits) -> TlsListener<L> {
        self.limits = limits;
        self
    }

    /// The threads handshakes run on, started the first time.
    fn pool(&mut self) -> io::Result<&mut Pool> {
        if self.pool.is_none() {
            self.pool = Some(Pool::start(self.limits.threads)?);
        }
        // Just made if it was not there.
        self.pool
            .as_mut()
            .ok_or_else(|| io::Error::other("no handshake threads"))
    }
}

impl<L: Listener> Listener for TlsListener<L>
where
    L::Stream: Send,
{
    type Stream = TlsServerStream<L::Stream>;

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Stream>> {
        loop {
            // Handshakes that are over first: they are what the server
            // waits for, and each frees room for another.
            while let Poll::Ready(Some(over)) = self.over.poll_recv(cx) {
                self.under_way -= 1;
                if let Some(stream) = over {
                    return Poll::Ready(Ok(TlsServerStream(stream)));
                }
            }
            if self.under_way >= self.limits.max_concurrent.get() {
                // Woken when one is over.
                return Poll::Pending;
            }
            let stream = std::task::ready!(self.inner.poll_accept(cx))?;
            let handshake = handshake(
                self.acceptor.clone(),
                stream,
                self.timeout,
                self.tell.clone(),
            );
            self.pool()?.spawn(handshake);
            self.under_way += 1;
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn set_handshake_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
        self.inner.set_handshake_timeout(timeout);
    }
}

/// One handshake, on the pool: its stream told to the listener when it is
/// done, nothing when it failed or took longer than `timeout` (its socket
/// then closed at once).
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    acceptor: TlsAcceptor,
    stream: S,
    timeout: Duration,
    tell: mpsc::UnboundedSender<Option<TlsStream<S>>>,
) {
    let done = tokio::time::timeout(timeout, acceptor.accept(stream)).await;
    // A listener that is gone no longer counts.
    let _ = tell.send(done.ok().and_then(Result::ok));
}

/// The threads handshakes run on: each runs a current-thread runtime, and
/// they are given handshakes in turn. Dropped (with the listener, perhaps
/// on a runtime's thread, where waiting is not allowed), they stop
/// without being waited for: the handshakes under way end with them,
/// their sockets closed.
struct Pool {
    workers: Vec<Worker>,
    next: usize,
}

/// One thread of a [`Pool`]: its runtime runs until `_stop` is dropped.
struct Worker {
    runtime: Handle,
    _stop: oneshot::Sender<()>,
}

impl Pool {
    fn start(threads: NonZeroUsize) -> io::Result<Pool> {
        let workers = (0..threads.get())
            .map(Worker::start)
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Pool { workers, next: 0 })
    }

    fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        let worker = &self.workers[self.next % self.workers.len()];
        self.next = self.next.wrapping_add(1);
        worker.runtime.spawn(task);
    }
}

impl Worker {
    fn start(index: usize) -> io::Result<Worker> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("ticketing-tls-{index}"))
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Worker {
            runtime: handle,
            _stop: stop,
        })
    }
}

/// A connection of a [`TlsListener`], its handshake done.
pub struct TlsServerStream<S>(TlsStream<S>);

impl<S> std::fmt::Debug for TlsServerStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServerStream").finish_non_exhaustive()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsServerStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsServerStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    /// Sends close_notify first.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}
