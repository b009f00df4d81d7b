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
//! * Adapters (each behind a feature, none in the defaults): `tokio`,
//!   `futures_io` (smol, async-std), `blocking` (a driver thread over
//!   `std::net`), and `serve` (the server core on tokio and TCP).
//! * `sim` — a deterministic simulator of many clients and a failing
//!   cluster; `testkit` — the invariant checker, a model server and the
//!   fuzz entry points.
//!
//! # Features
//!
//! | feature | what it adds | dependencies beyond `bytes` and `thiserror` |
//! |---|---|---|
//! | *(none)* | the wire codec, the client and server cores | — |
//! | `tokio` | `ticketing::tokio`: the tokio adapter | tokio, futures-channel |
//! | `futures-io` | `ticketing::futures_io`: the adapter for smol and async-std | futures-io, futures-channel, async-io |
//! | `blocking` | `ticketing::blocking`: the blocking adapter | — |
//! | `server` | `ticketing::serve` and `ticketing::state`: the server core on tokio and TCP, a state directory | tokio |
//! | `etcd` | `ticketing::cluster`: a node of a cluster on etcd (PROTOCOL.md 4.2) | etcd-client (its protoc from protoc-bin-vendored) |
//! | `fuzzing` | `ticketing::testkit` | arbitrary |
//! | `sim` | `ticketing::sim` | arbitrary |
//! | `sabotage` | `ticketing::sim::Sabotage`: bad clients, to show that the simulator's checks catch them (never in `cli`) | arbitrary |
//! | `cli` | the `ticketing` binary | clap, serde_json, nix, and the above |
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod adapters;
pub mod client;
mod hash;
pub mod names;
pub mod rng;
pub mod server;
#[cfg(feature = "sim")]
pub mod sim;
#[cfg(feature = "fuzzing")]
pub mod testkit;
pub mod time;
pub mod wire;

#[cfg(feature = "blocking")]
pub use adapters::blocking;
#[cfg(feature = "etcd")]
pub use adapters::cluster;
#[cfg(feature = "futures-io")]
pub use adapters::futures_io;
#[cfg(feature = "server")]
pub use adapters::serve;
#[cfg(feature = "server")]
pub use adapters::state;
#[cfg(feature = "tokio")]
pub use adapters::tokio;

pub use names::{Endpoint, Key, Name};
pub use time::Time;
