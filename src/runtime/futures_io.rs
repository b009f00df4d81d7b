//! The futures-io adapter (feature `futures-io`): the client core on any
//! runtime whose streams implement the `futures-io` traits — smol, and
//! async-std (deprecated upstream in favour of smol) alike.
//!
//! [`client`] returns a [`Handle`] and the [`Driver`] future; spawn the
//! driver on your runtime. Timers come from `async-io`, the reactor both
//! smol and async-std run on. The handle, the builders and the guard are
//! the same as the tokio adapter's.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use ticketing::client::Config;
//! use ticketing::futures_io::{client, TcpConnector};
//! use ticketing::{Endpoint, Key, Name};
//!
//! let config = Config::new([Endpoint::new("127.0.0.1:7878")?], Name::new("worker-1")?);
//! let (handle, driver) = client(config, TcpConnector)?;
//! # let spawn = |_driver| ();
//! spawn(driver); // smol::spawn(driver).detach(), async_std::task::spawn(driver), ...
//! # let _ = async move {
//! let lease = handle.lock(Key::new("invoices")?).wait(Duration::from_secs(5)).await?;
//! // ... write to storage, quoting lease.token() ...
//! lease.release().await?;
//! handle.shutdown(Duration::from_secs(5)).await?;
//! # Ok::<(), Box<dyn std::error::Error>>(()) };
//! # Ok(()) }
//! ```
//!
//! smol's and async-std's global executors are never dropped: a driver
//! spawned on one does not see `main` return, so await
//! [`Handle::shutdown`] before it does (a runtime that is dropped, such as
//! an `async_executor::Executor` of your own, is seen, as tokio's is: see
//! [`Lease`]).

use std::future::Future;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use async_io::{Async, Timer};
use futures_io::{AsyncRead, AsyncWrite};

use crate::client::{Config, ConfigError};
use crate::names::Endpoint;
use crate::runtime::driver::{self, Clock, Detached, Dial, Transport};
use crate::runtime::error::unresolved;
use crate::runtime::notices::Sink;

pub use crate::runtime::conn::ConnState;
pub use crate::runtime::driver::{
    Acquire, AcquireBuilder, Canceller, Handle, Lease, Lock, LockBuilder,
};
pub use crate::runtime::error::{AcquireError, ConnectError, RequestError, RunError, SpawnError};
pub use crate::runtime::lease::{HeldGrant, LeaseStatus};
pub use crate::runtime::notices::{Notices, CAPACITY as NOTICES_CAPACITY};
pub use crate::runtime::shell::EXIT_FLUSH;
#[cfg(feature = "tls")]
pub use crate::runtime::tls::futures_io::TlsConnector;

/// Opens connections for the client: TCP, TLS, a Unix socket, anything
/// that reads and writes bytes through the `futures-io` traits.
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

/// Connects over TCP through `async-io`, with `TCP_NODELAY` set. A host name
/// is resolved with the system resolver, which may block; IP addresses
/// never do.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    type Stream = Async<TcpStream>;

    async fn connect(&self, addr: Endpoint) -> io::Result<Self::Stream> {
        let sockets = addr
            .as_str()
            .to_socket_addrs()
            .map_err(|e| unresolved(&addr, e))?;
        let mut last = unresolved(&addr, io::ErrorKind::NotFound.into());
        for socket in sockets {
            match Async::<TcpStream>::connect(socket).await {
                Ok(stream) => {
                    stream.get_ref().set_nodelay(true)?;
                    return Ok(stream);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// The future that drives the client: spawn it on your runtime. It
/// resolves once the client has shut down.
#[must_use = "the driver does nothing unless polled: spawn it"]
pub struct Driver<C: Connector>(driver::Driver<Dialer<C>, AsyncIoClock>);

impl<C: Connector> Future for Driver<C> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// Makes a client: the handle tasks share, and the driver to spawn. It
/// connects once the driver runs (see [`Handle::connected`] to wait for
/// that).
///
/// Nothing reads the notices of a client made so; with the feature
/// `tracing` they are traced. [`client_with_notices`] hands them out.
pub fn client<C: Connector>(
    config: Config,
    connector: C,
) -> Result<(Handle, Driver<C>), ConfigError> {
    let (handle, driver) = driver::new(config, Dialer(Arc::new(connector)), Sink::Nowhere)?;
    Ok((handle, Driver(driver)))
}

/// As [`client`], also handing out the notices, as the tokio adapter does.
/// Read them or drop the receiver: while [`NOTICES_CAPACITY`] of them wait
/// unread, the client reads nothing more from the server.
pub fn client_with_notices<C: Connector>(
    config: Config,
    connector: C,
) -> Result<(Handle, Driver<C>, Notices), ConfigError> {
    let (sink, notices) = Sink::queue();
    let (handle, driver) = driver::new(config, Dialer(Arc::new(connector)), sink)?;
    Ok((handle, Driver(driver), notices))
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
        Pin::new(&mut self.0).poll_read(cx, buf)
    }

    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
}

struct AsyncIoClock {
    timer: Timer,
    at: Option<Instant>,
}

impl Clock for AsyncIoClock {
    fn new() -> Self {
        AsyncIoClock {
            timer: Timer::never(),
            at: None,
        }
    }

    fn poll_until(&mut self, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
        if self.at != Some(at) {
            self.timer.set_at(at);
            self.at = Some(at);
        }
        Pin::new(&mut self.timer).poll(cx).map(|_| ())
    }

    fn run_detached(driver: Detached) -> io::Result<()> {
        // async-io's reactor runs on a thread of its own: blocking on the
        // driver is all a runtime it needs.
        std::thread::Builder::new()
            .name("ticketing-detached".into())
            .spawn(move || async_io::block_on(driver))
            .map(drop)
    }
}
