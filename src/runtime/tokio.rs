//! The tokio adapter (feature `tokio`): the client core driven by a tokio
//! task, shared by any number of tasks through a cloneable [`Handle`].
//!
//! ```no_run
//! use std::time::Duration;
//! use ticketing::client::Config;
//! use ticketing::tokio::{spawn, TcpConnector};
//! use ticketing::{Endpoint, Key, Name};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let config = Config::new([Endpoint::new("127.0.0.1:7878")?], Name::new("worker-1")?);
//!     let handle = spawn(config, TcpConnector)?;
//!     handle.connected().await?; // fails with why (refused, TLS, credential)
//!     let lease = handle
//!         .lock(Key::new("invoices")?)
//!         .wait(Duration::from_secs(5))
//!         .lease(Duration::from_secs(30))
//!         .await?;
//!     // ... write to storage, quoting lease.token() as the fencing token ...
//!     lease.release().await?;
//!     handle.shutdown(Duration::from_secs(5)).await?;
//!     Ok(())
//! }
//! ```
//!
//! The adapter is glue: bytes between a tokio stream and the core, and the
//! core's deadlines on tokio's timer. Every rule is the core's. Dropping an
//! [`Acquire`] or a [`Lock`] future before it resolves cancels the acquire
//! through the core; a grant that arrives for a dropped future is released
//! by its exact token. What dropping a [`Lease`] guarantees, also when the
//! runtime goes away, is on [`Lease`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use ::tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use ::tokio::time::Sleep;

use crate::client::Config;
use crate::names::Endpoint;
use crate::runtime::driver::{self, Clock, Detached, Dial, Transport};
use crate::runtime::notices::Sink;

pub use crate::runtime::conn::ConnState;
pub use crate::runtime::driver::{
    Acquire, AcquireBuilder, Canceller, Handle, Lease, Lock, LockBuilder,
};
pub use crate::runtime::error::{AcquireError, ConnectError, RequestError, RunError, SpawnError};
pub use crate::runtime::lease::{HeldGrant, LeaseStatus};
pub use crate::runtime::shell::EXIT_FLUSH;
#[cfg(feature = "tls")]
pub use crate::runtime::tls::tokio::TlsConnector;

/// Opens connections for the client: TCP, TLS, a Unix socket, anything
/// that reads and writes bytes.
pub trait Connector: Send + Sync + Unpin + 'static {
    /// The connected stream.
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// Connects to `addr`. The core bounds how long it may take (its
    /// connect timeout) and backs off after a failure.
    fn connect(&self, addr: Endpoint) -> impl Future<Output = io::Result<Self::Stream>> + Send;

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
    type Stream = ::tokio::net::TcpStream;

    async fn connect(&self, addr: Endpoint) -> io::Result<Self::Stream> {
        let sockets = ::tokio::net::lookup_host(addr.as_str())
            .await
            .map_err(|e| crate::runtime::error::unresolved(&addr, e))?;
        let mut last = crate::runtime::error::unresolved(&addr, io::ErrorKind::NotFound.into());
        for socket in sockets {
            match ::tokio::net::TcpStream::connect(socket).await {
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

pub use crate::runtime::notices::{Notices, CAPACITY as NOTICES_CAPACITY};

/// Starts a client on the current tokio runtime: its driver is a task of
/// that runtime, and it connects in the background (see
/// [`Handle::connected`] to wait for that). The driver task ends when the
/// client has shut down: after [`Handle::shutdown`], or once every handle
/// is dropped. Outside a runtime, [`SpawnError::NoRuntime`].
///
/// Nothing reads the notices of a client started so; with the feature
/// `tracing` they are traced. [`spawn_with_notices`] hands them out.
pub fn spawn<C: Connector>(config: Config, connector: C) -> Result<Handle, SpawnError> {
    start(config, connector, Sink::Nowhere)
}

/// As [`spawn`], also handing out the notices. Read them or drop the
/// receiver: while [`NOTICES_CAPACITY`] of them wait unread, the client
/// reads nothing more from the server.
pub fn spawn_with_notices<C: Connector>(
    config: Config,
    connector: C,
) -> Result<(Handle, Notices), SpawnError> {
    let (sink, notices) = Sink::queue();
    Ok((start(config, connector, sink)?, notices))
}

fn start<C: Connector>(config: Config, connector: C, sink: Sink) -> Result<Handle, SpawnError> {
    let runtime = ::tokio::runtime::Handle::try_current().map_err(|_| SpawnError::NoRuntime)?;
    let (handle, driver) = driver::new::<_, TokioClock>(config, Dialer(Arc::new(connector)), sink)?;
    runtime.spawn(driver);
    Ok(handle)
}

struct Dialer<C>(Arc<C>);

impl<C: Connector> Dial for Dialer<C> {
    type Transport = Stream<C::Stream>;

    fn is_tls(&self) -> bool {
        self.0.is_tls()
    }

    fn dial(
        &self,
        addr: Endpoint,
    ) -> Pin<Box<dyn Future<Output = io::Result<Self::Transport>> + Send>> {
        let connector = Arc::clone(&self.0);
        Box::pin(async move { connector.connect(addr).await.map(Stream) })
    }
}

struct Stream<S>(S);

impl<S: AsyncRead + AsyncWrite + Send + Unpin + 'static> Transport for Stream<S> {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let mut buf = ReadBuf::new(buf);
        ready!(Pin::new(&mut self.0).poll_read(cx, &mut buf))?;
        Poll::Ready(Ok(buf.filled().len()))
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
}

struct TokioClock {
    sleep: Option<Pin<Box<Sleep>>>,
    at: Option<Instant>,
}

impl Clock for TokioClock {
    fn new() -> Self {
        TokioClock {
            sleep: None,
            at: None,
        }
    }

    fn poll_until(&mut self, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(::tokio::time::sleep_until(at.into())));
        if self.at != Some(at) {
            sleep.as_mut().reset(at.into());
            self.at = Some(at);
        }
        sleep.as_mut().poll(cx)
    }

    fn defer(&mut self, cx: &mut Context<'_>) {
        // tokio wakes a yielded task once its worker has run out of other
        // ready tasks (or at once, outside a runtime).
        let mut yielded = std::pin::pin!(::tokio::task::yield_now());
        let _ = yielded.as_mut().poll(cx);
    }

    fn run_detached(driver: Detached) -> io::Result<()> {
        std::thread::Builder::new()
            .name("ticketing-detached".into())
            .spawn(move || {
                // A thread of its own: the runtime that went away may still
                // be this thread's context.
                match ::tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(driver),
                    // Dropped here: the driver refuses requests from now on.
                    Err(_) => drop(driver),
                }
            })
            .map(drop)
    }
}
