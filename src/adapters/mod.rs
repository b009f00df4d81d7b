//! Everything that touches a runtime, a socket, a thread or a clock: the
//! adapters that put the sans-IO cores on real I/O. Each is behind its
//! cargo feature and re-exported at the crate root (`ticketing::tokio`,
//! `ticketing::futures_io`, `ticketing::blocking`, `ticketing::serve`).
//!
//! No rule of the protocol lives here: the adapters move bytes between
//! sockets and the cores, turn instants into the cores' [`Time`], and hand
//! outcomes to whoever waits for them.
//!
//! | module | what |
//! |---|---|
//! | `error` | what the client adapters answer when they cannot give what was asked: one error per kind of call |
//! | `lease` | what a held-grant guard shares with its driver: where the grant stands, renewals included |
//! | `metrics` | the cores' counters in the `metrics` facade (feature `metrics`) |
//! | `notices` | the bounded queue of notices, and reading paused while it is full |
//! | `reply` | the one-value reply channel from a driver to the caller waiting for an operation |
//! | `shell` | what every client adapter does around the core: reply bookkeeping, grants whose caller went away handed back to the core, the acquire builders' options, the latest attempt's I/O error |
//! | `trace` | the notices as `tracing` events (feature `tracing`) |
//! | `driver` | the poll-driven driver future and the cloneable handle shared by the tokio and futures-io adapters |
//! | `tokio`, `futures_io`, `blocking` | the client adapters |
//! | `serve` | the server core on tokio and TCP |
//! | `tls` | TLS for all of them (feature `tls`): the connectors, the listener, and what a failed handshake is called |
//! | `state` | a state directory: the epoch and the table, kept durably |
//! | `cluster` | a node of a cluster on etcd: leadership and epochs (feature `etcd`) |
//!
//! [`Time`]: crate::Time

#[cfg(feature = "blocking")]
pub mod blocking;
#[cfg(feature = "etcd")]
pub mod cluster;
#[cfg(any(feature = "tokio", feature = "futures-io"))]
pub(crate) mod driver;
#[cfg(any(feature = "tokio", feature = "futures-io", feature = "blocking"))]
pub(crate) mod error;
#[cfg(feature = "futures-io")]
pub mod futures_io;
#[cfg(any(feature = "tokio", feature = "futures-io", feature = "blocking"))]
pub(crate) mod lease;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(any(feature = "tokio", feature = "futures-io", feature = "blocking"))]
pub(crate) mod notices;
#[cfg(feature = "raft")]
pub mod raft_disk;
#[cfg(any(feature = "tokio", feature = "futures-io", feature = "blocking"))]
pub(crate) mod reply;
#[cfg(feature = "server")]
pub mod serve;
#[cfg(any(feature = "tokio", feature = "futures-io", feature = "blocking"))]
pub(crate) mod shell;
#[cfg(feature = "server")]
pub mod state;
#[cfg(any(
    feature = "tls",
    feature = "tokio",
    feature = "futures-io",
    feature = "blocking"
))]
pub mod tls;
#[cfg(feature = "tokio")]
pub mod tokio;
#[cfg(all(
    feature = "tracing",
    any(feature = "tokio", feature = "futures-io", feature = "blocking")
))]
pub(crate) mod trace;
