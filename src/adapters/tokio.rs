//! The tokio adapter (feature `tokio`): the client core driven by a tokio
//! task, shared by any number of tasks through a cloneable [`Handle`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use ticketing::client::{Config, Outcome};
//! use ticketing::tokio::{spawn, TcpConnector};
//! use ticketing::{Endpoint, Key, Name};
//!
//! let config = Config::new([Endpoint::new("127.0.0.1:7878")?], Name::new("worker-1")?);
//! let handle = spawn(config, TcpConnector)?;
//! let (key, me) = (Key::new("invoices")?, Name::new("worker-1")?);
//! let outcome = handle.acquire(key, me, Duration::from_secs(5), Duration::from_secs(30)).await?;
//! if let Outcome::Granted(grant) = outcome {
//!     // ... write to storage, quoting grant.token() as the fencing token ...
//!     handle.release(&grant).await?;
//! }
//! handle.shutdown(Duration::from_secs(5)).await?;
//! # Ok(()) }
//! ```
//!
//! The adapter is glue: bytes between a tokio stream and the core, and the
//! core's deadlines on tokio's timer. Every rule is the core's. Dropping an
//! [`Acquire`] future before it resolves cancels the acquire through the
//! core; a grant that arrives for a dropped future is released by its exact
//! token.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use ::tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use ::tokio::time::Sleep;

use crate::adapters::driver::{self, Clock, Dial, Transport};
use crate::adapters::notices::{self, Sink};
use crate::client::{Config, ConfigError};
use crate::names::Endpoint;

pub use crate::adapters::driver::{Acquire, Canceller, Handle, Lease, Lock};
pub use crate::adapters::lease::{HeldGrant, LeaseStatus};
pub use crate::adapters::shell::{LockError, RequestError};
#[cfg(feature = "tls")]
pub use crate::adapters::tls::tokio::TlsConnector;

/// Opens connections for the client: TCP, TLS, a Unix socket, anything
/// that reads and writes bytes.
pub trait Connector: Send + Sync + Unpin + 'static {
    /// The connected stream.
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// Connects to `addr`. The core bounds how long it may take (its
    /// connect timeout) and backs off after a failure.
    fn connect(&self, addr: Endpoint) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

/// Connects over TCP, with `TCP_NODELAY` set.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    type Stream = ::tokio::net::TcpStream;

    async fn connect(&self, addr: Endpoint) -> io::Result<Self::Stream> {
        let stream = ::tokio::net::TcpStream::connect(addr.as_str()).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

pub use crate::adapters::notices::{Notices, CAPACITY as NOTICES_CAPACITY};

/// Starts a client on the current tokio runtime (call it from within one).
/// The driver task ends when the client has shut down: after
/// [`Handle::shutdown`], or once every handle is dropped.
pub fn spawn<C: Connector>(config: Config, connector: C) -> Result<Handle, ConfigError> {
    let (handle, driver) =
        driver::new::<_, TokioClock>(config, Dialer(Arc::new(connector)), Sink::Nowhere)?;
    ::tokio::spawn(driver);
    Ok(handle)
}

/// As [`spawn`], also handing out the notices. Read them or drop the
/// receiver: while [`NOTICES_CAPACITY`] of them wait unread, the client
/// reads nothing more from the server.
pub fn spawn_with_notices<C: Connector>(
    config: Config,
    connector: C,
) -> Result<(Handle, Notices), ConfigError> {
    let (sender, notices) = notices::channel();
    let sink = Sink::Queue {
        sender,
        held: Default::default(),
    };
    let (handle, driver) = driver::new::<_, TokioClock>(config, Dialer(Arc::new(connector)), sink)?;
    ::tokio::spawn(driver);
    Ok((handle, notices))
}

struct Dialer<C>(Arc<C>);

impl<C: Connector> Dial for Dialer<C> {
    type Transport = Stream<C::Stream>;

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
}
