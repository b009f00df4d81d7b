//! The client runtime: everything between an embedder's call and the
//! client core ([`Client`](crate::client::Client)), on a real runtime,
//! real sockets and a real clock. Each adapter is behind its cargo
//! feature and re-exported at the crate root (`ticketing::tokio`,
//! `ticketing::futures_io`, `ticketing::blocking`).
//!
//! No rule of the protocol lives here: the runtime moves bytes between
//! sockets and the core, turns instants into the core's [`Time`], and
//! hands outcomes to whoever waits for them. It never imports the server
//! host (`crate::host`), nor the host it.
//!
//! | module | what |
//! |---|---|
//! | `tokio`, `futures_io`, `blocking` | the client adapters |
//! | `driver` | the poll-driven driver future and the cloneable handle shared by the tokio and futures-io adapters |
//! | `shell` | what every client adapter does around the core: reply bookkeeping, grants whose caller went away handed back to the core, the acquire builders' options, the latest attempt's I/O error |
//! | `reply` | the one-value reply channel from a driver to the caller waiting for an operation |
//! | `lease` | what a held-grant guard shares with its driver: where the grant stands, renewals and the connection included |
//! | `conn` | where the connection stands, as the driver publishes it to every handle (`ConnState`) |
//! | `wait` | a thread's wait on either of those, with a timeout |
//! | `notices` | the bounded queue of notices, and reading paused while it is full |
//! | `error` | what the client adapters answer when they cannot give what was asked: one error per kind of call |
//! | `trace` | the notices as `tracing` events (feature `tracing`) |
//! | `tls` | each adapter's `TlsConnector`, and what a failed handshake is called (feature `tls`) |
//!
//! [`Time`]: crate::Time

#[cfg(feature = "blocking")]
pub mod blocking;
mod conn;
#[cfg(any(feature = "tokio", feature = "futures-io"))]
mod driver;
mod error;
#[cfg(feature = "futures-io")]
pub mod futures_io;
mod lease;
mod notices;
mod reply;
mod shell;
mod tls;
#[cfg(feature = "tokio")]
pub mod tokio;
#[cfg(feature = "tracing")]
mod trace;
mod wait;
