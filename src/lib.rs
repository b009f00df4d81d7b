//! Ticketing: a lock/lease protocol with fencing tokens — its client, its
//! reference server, and the adapters that put them on real I/O.
//!
//! A client asks for exclusive use of a *key* for a *lease*; the service
//! answers with a *grant* carrying a *fencing token*, strictly increasing
//! per key; the client gives the grant back by quoting that exact token.
//! Many keys and requests share one connection and answers come back in any
//! order. The specification is PROTOCOL.md, the design of record beside
//! this crate's repository.
//!
//! # Quick start
//!
//! With the feature `tokio`, against a `ticketing serve` on
//! `127.0.0.1:7878` (`cargo run --features cli -- serve`):
//!
//! ```no_run
//! # #[cfg(feature = "tokio")]
//! # mod quick_start {
//! use std::time::Duration;
//!
//! use ticketing::client::Config;
//! use ticketing::tokio::{spawn, TcpConnector};
//! use ticketing::{Endpoint, Key, Name};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let config = Config::new([Endpoint::new("127.0.0.1:7878")?], Name::new("worker-1")?);
//!     let handle = spawn(config, TcpConnector)?;
//!     // Err says why: nothing listens there, a credential or TLS refused.
//!     handle.connected().await?;
//!
//!     let lease = handle
//!         .lock(Key::new("invoices")?)
//!         .wait(Duration::from_secs(5)) // for the key, at most
//!         .lease(Duration::from_secs(30)) // the key is ours this long
//!         .renew() // ... renewed while the guard lives
//!         .await?; // Err: not acquired, and why
//!     println!("holding {} with fencing token {}", lease.key(), lease.token());
//!     // ... write to storage, quoting lease.token() ...
//!     lease.release().await?; // or drop it: released by exact token
//!
//!     handle.shutdown(Duration::from_secs(5)).await?;
//!     Ok(())
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! A credential and TLS (feature `tls` too): the credential is sent in the
//! handshake and never printed; TLS lives in the adapter's `TlsConnector`.
//! A refusal of either ends acquires as `AcquireError::Misconfigured`.
//!
//! ```no_run
//! # #[cfg(all(feature = "tokio", feature = "tls"))]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ticketing::client::Config;
//! use ticketing::tls::{ClientTls, Identity};
//! use ticketing::tokio::{spawn, TlsConnector};
//! use ticketing::{Endpoint, Name};
//!
//! let mut config = Config::new([Endpoint::new("locks.internal:7878")?], Name::new("worker-1")?);
//! config.credential = Some(Name::new(std::env::var("TICKETING_CREDENTIAL")?)?);
//! let tls = ClientTls::builder()
//!     .ca_file("ca.pem")? // or .roots(a RootCertStore)
//!     .identity(Identity::from_pem_files("client.pem", "client.key")?) // mutual TLS only
//!     .build()?; // .server_name("locks.internal")? to check another name
//! let handle = spawn(config, TlsConnector::new(tls))?;
//! handle.connected().await?; // Err: the TLS handshake or the credential refused, and why
//! # Ok(()) }
//! ```
//!
//! The futures-io adapter (smol, async-std) and the blocking adapter have
//! the same handle, builders and guard; `examples/tokio_lock.rs` and
//! `examples/blocking_lock.rs` walk through them. The README's table says
//! what each failure (a server down, a credential or TLS refused, a crash,
//! a guard forgotten, a program that exits) gives the caller, and when.
//!
//! # Layers
//!
//! The rules live in pure, deterministic cores that take bytes and times in
//! and give actions out; everything else is a thin shell around them.
//!
//! * [`wire`] — frames, the incremental line reader, parser and encoder.
//! * [`client`] — the client core, [`client::Client`]: every client rule of
//!   PROTOCOL.md section 5. Its documentation states the driver contract and
//!   runs a complete driver loop as a doctest.
//! * [`server`] — the reference server core, [`server::Server`].
//! * [`time`] and [`rng`] — the time type the cores take, and the seeded
//!   generator behind every random choice. The cores never read a clock or
//!   draw entropy: the same inputs at the same times give the same bytes.
//! * Adapters (each behind a feature, none in the defaults; the names link
//!   to the [features](#features) they need where they are not built):
//!   [`tokio`][tokio], [`futures_io`][futures_io] (smol, async-std),
//!   [`blocking`][blocking] (a driver thread over `std::net`), and
//!   [`serve`][serve] (the server core on tokio and TCP); [`tls`][tls]
//!   puts TLS on each of them.
//! * [`sim`][sim] — a deterministic simulator of many clients and a
//!   failing cluster; [`testkit`][testkit] — the invariant checker, a model
//!   server and the fuzz entry points.
//!
//! # Driving a core
//!
//! For embedders of the core itself, with a runtime or an event loop of
//! their own: a core does nothing by itself. Its driver owns the sockets and the
//! clock, and runs one loop:
//!
//! 1. **Make the core** with its configuration and the current time
//!    ([`client::Client::new`], [`server::Server::new`]). Times are
//!    [`Time`]s from any monotonic clock; the core never reads one.
//! 2. **Give it commands** when the application wants something:
//!    [`client::Client::acquire`], [`client::Client::release`], ... Each
//!    returns at once, with an id for its outcome or a typed error for
//!    misuse.
//! 3. **Carry out its actions**, draining `poll_action` until `None`:
//!    open a connection for `Connect` and report how it went
//!    (`handle_connected` or `handle_connect_failed`); write the bytes of
//!    `Send` to the connection it names, in order; close for `Close`.
//! 4. **Take its events**, draining `poll_event` until `None`: the
//!    outcomes of operations, and notices.
//! 5. **Wait** for bytes, a transport ending, or the deadline
//!    `poll_timeout` gives, whichever comes first, and **hand it in** with
//!    the current time: bytes with the connection they arrived on
//!    (`handle_bytes(now, conn, bytes)`), `handle_transport_closed`, or
//!    `handle_timeout(now)`. Then go back to 3.
//!
//! `poll_timeout` returns the time of the latest input while output is
//! still queued, so a driver that waits for it cannot stall; every input
//! first fires the timers due at its time, so a late driver sees the same
//! answers as a punctual one, only later. The adapters are this loop on
//! real sockets and a real clock. Here it is in memory, a client against
//! the server core: each side's bytes go to the other on the connection
//! they belong to, and when neither has anything to do, time jumps to the
//! earlier of their deadlines.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::time::Duration;
//! use ticketing::{client, server};
//! use ticketing::{Endpoint, Key, Name, Time};
//!
//! // 1. The cores.
//! let mut now = Time::ZERO;
//! let config = client::Config::new([Endpoint::new("10.0.0.1:7878")?], Name::new("app")?);
//! let mut client = client::Client::new(config, now)?;
//! let mut server = server::Server::new(server::Config::new(Name::new("node-1")?), now)?;
//! // The client's connection ids and the server's, both ways.
//! let mut to_server: BTreeMap<client::ConnId, server::ConnId> = BTreeMap::new();
//! let mut to_client: BTreeMap<server::ConnId, client::ConnId> = BTreeMap::new();
//!
//! // 2. Commands: two workers want the printer; the second waits up to 5 s.
//! let (wait, lease) = (Duration::from_secs(5), Duration::from_secs(2));
//! let printer = Key::new("printer")?;
//! let first = client.acquire(now, printer.clone(), Name::new("w1")?, wait, lease)?;
//! let second = client.acquire(now, printer.clone(), Name::new("w2")?, wait, lease)?;
//!
//! let mut tokens = BTreeMap::new();
//! while tokens.len() < 2 {
//!     let mut moved = false;
//!     // 3. The client's actions, carried to the server.
//!     while let Some(action) = client.poll_action() {
//!         moved = true;
//!         match action {
//!             client::Action::Connect { conn, .. } => {
//!                 let accepted = server.handle_accept(now);
//!                 to_server.insert(conn, accepted);
//!                 to_client.insert(accepted, conn);
//!                 client.handle_connected(now, conn);
//!             }
//!             client::Action::Send { conn, data } => {
//!                 server.handle_bytes(now, to_server[&conn], &data)
//!             }
//!             client::Action::Close { conn } => server.handle_closed(now, to_server[&conn]),
//!             _ => {}
//!         }
//!     }
//!     // The server's, carried to the client.
//!     while let Some(action) = server.poll_action() {
//!         moved = true;
//!         match action {
//!             server::Action::Send { conn, data } => {
//!                 client.handle_bytes(now, to_client[&conn], &data)
//!             }
//!             server::Action::Close { conn } => client.handle_transport_closed(
//!                 now,
//!                 to_client[&conn],
//!                 client::TransportEnd::Eof,
//!             ),
//!             _ => {}
//!         }
//!     }
//!     // 4. Events: the first grant is given back at once.
//!     while let Some(event) = client.poll_event() {
//!         moved = true;
//!         if let client::Event::Outcome { op, outcome: client::Outcome::Granted(grant) } = event {
//!             tokens.insert(op, grant.token());
//!             if op == first {
//!                 client.release(now, &grant)?;
//!             }
//!         }
//!     }
//!     // 5. Nothing moved: on to the earlier deadline.
//!     if !moved {
//!         let next = [client.poll_timeout(), server.poll_timeout()].into_iter().flatten().min();
//!         now = now.max(next.expect("something is due"));
//!         client.handle_timeout(now);
//!         server.handle_timeout(now);
//!     }
//! }
//! // Fencing tokens go up per key: the waiter got the printer second.
//! assert_eq!((tokens[&first], tokens[&second]), (1, 2));
//! // Released at once, it never waited for the lease to end.
//! assert_eq!(now, Time::ZERO);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Features
//!
//! | feature | what it adds | dependencies beyond `bytes`, `thiserror` and `siphasher` (the server's keyed table hash) |
//! |---|---|---|
//! | *(none)* | the wire codec, the client and server cores | — |
//! | `tokio` | [`ticketing::tokio`][tokio]: the tokio adapter | tokio |
//! | `futures-io` | [`ticketing::futures_io`][futures_io]: the adapter for smol and async-std | futures-io, async-io |
//! | `blocking` | [`ticketing::blocking`][blocking]: the blocking adapter | — |
//! | `server` | [`ticketing::serve`][serve] and [`ticketing::state`][state]: the server core on tokio and TCP, a state directory | tokio |
//! | `tls` | [`ticketing::tls`][tls], a `TlsConnector` in each client adapter, `serve::TlsListener` (rustls with ring) | rustls, tokio-rustls, futures-rustls |
//! | `etcd` | [`ticketing::cluster`][cluster]: a node of a cluster on etcd (PROTOCOL.md 4.2) | etcd-client (its protoc from protoc-bin-vendored) |
//! | `raft` | [`ticketing::raft`][raft]: a member of a replicated cluster (PROTOCOL.md 4.3) | raft (raft-rs, prost codec), prost, slog (its protoc from protoc-bin-vendored) |
//! | `metrics` | [`ticketing::metrics`][metrics]: the cores' counters in the `metrics` facade; the client adapters publish theirs | metrics |
//! | `tracing` | the client adapters' notices as `tracing` events (target `ticketing`) | tracing |
//! | `fuzzing` | [`ticketing::testkit`][testkit] | arbitrary |
//! | `sim` | [`ticketing::sim`][sim] | arbitrary |
//! | `sabotage` | `ticketing::sim::Sabotage`: bad clients, to show that the simulator's checks catch them (never in `cli`) | arbitrary |
//! | `cli` | the `ticketing` binary | clap, serde_json, nix, and the above |
//!
//! On docs.rs every feature an embedder uses is built, and each item says
//! which feature it needs.
//!
// The modules behind a feature, linked where they are built, else to the
// table above: the same page builds with and without them.
#![cfg_attr(feature = "tokio", doc = "[tokio]: crate::tokio")]
#![cfg_attr(not(feature = "tokio"), doc = "[tokio]: #features")]
#![cfg_attr(feature = "futures-io", doc = "[futures_io]: crate::futures_io")]
#![cfg_attr(not(feature = "futures-io"), doc = "[futures_io]: #features")]
#![cfg_attr(feature = "blocking", doc = "[blocking]: crate::blocking")]
#![cfg_attr(not(feature = "blocking"), doc = "[blocking]: #features")]
#![cfg_attr(feature = "server", doc = "[serve]: crate::serve")]
#![cfg_attr(not(feature = "server"), doc = "[serve]: #features")]
#![cfg_attr(feature = "server", doc = "[state]: crate::state")]
#![cfg_attr(not(feature = "server"), doc = "[state]: #features")]
#![cfg_attr(
    any(
        feature = "tls",
        feature = "tokio",
        feature = "futures-io",
        feature = "blocking"
    ),
    doc = "[tls]: crate::tls"
)]
#![cfg_attr(
    not(any(
        feature = "tls",
        feature = "tokio",
        feature = "futures-io",
        feature = "blocking"
    )),
    doc = "[tls]: #features"
)]
#![cfg_attr(feature = "etcd", doc = "[cluster]: crate::cluster")]
#![cfg_attr(not(feature = "etcd"), doc = "[cluster]: #features")]
#![cfg_attr(feature = "raft", doc = "[raft]: crate::raft")]
#![cfg_attr(not(feature = "raft"), doc = "[raft]: #features")]
#![cfg_attr(feature = "metrics", doc = "[metrics]: crate::metrics")]
#![cfg_attr(not(feature = "metrics"), doc = "[metrics]: #features")]
#![cfg_attr(feature = "fuzzing", doc = "[testkit]: crate::testkit")]
#![cfg_attr(not(feature = "fuzzing"), doc = "[testkit]: #features")]
#![cfg_attr(feature = "sim", doc = "[sim]: crate::sim")]
#![cfg_attr(not(feature = "sim"), doc = "[sim]: #features")]
// docs.rs (`--cfg docsrs`, `[package.metadata.docs.rs]`): each item shows
// the features it needs, from its `cfg` (`doc_cfg` does it on its own
// since `doc_auto_cfg` was merged into it).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod admin;
pub mod client;
mod conn_id;
mod hash;
#[cfg(feature = "server")]
mod host;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod names;
pub mod rng;
#[cfg(any(feature = "tokio", feature = "futures-io", feature = "blocking"))]
mod runtime;
// Only the Raft parts' unit tests draw seeded properties so far.
#[cfg(all(test, feature = "raft"))]
mod seeded;
pub mod server;
#[cfg(feature = "sim")]
pub mod sim;
#[cfg(any(
    feature = "server",
    feature = "tokio",
    feature = "futures-io",
    feature = "blocking"
))]
mod sync;
#[cfg(feature = "fuzzing")]
pub mod testkit;
pub mod time;
#[cfg(any(
    feature = "tls",
    feature = "tokio",
    feature = "futures-io",
    feature = "blocking"
))]
pub mod tls;
pub mod wire;

#[cfg(feature = "etcd")]
pub use host::etcd as cluster;
#[cfg(feature = "raft")]
pub use host::raft;
#[cfg(feature = "server")]
pub use host::serve;
#[cfg(feature = "server")]
pub use host::state;
#[cfg(feature = "blocking")]
pub use runtime::blocking;
#[cfg(feature = "futures-io")]
pub use runtime::futures_io;
#[cfg(feature = "tokio")]
pub use runtime::tokio;

pub use names::{Endpoint, InvalidValue, Key, Name, ValueKind};
pub use time::Time;
