//! Ticketing: a lock/lease protocol client and server, sans-IO.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "blocking")]
pub mod blocking;
pub mod client;
#[cfg(any(feature = "tokio", feature = "futures-io"))]
mod driver;
#[cfg(feature = "futures-io")]
pub mod futures_io;
pub mod names;
pub mod rng;
#[cfg(feature = "server")]
pub mod serve;
pub mod server;
#[cfg(any(feature = "tokio", feature = "futures-io", feature = "blocking"))]
mod shell;
#[cfg(feature = "sim")]
pub mod sim;
#[cfg(feature = "fuzzing")]
pub mod testkit;
pub mod time;
#[cfg(feature = "tokio")]
pub mod tokio;
pub mod wire;

pub use names::{Endpoint, Key, Name};
pub use time::Time;
