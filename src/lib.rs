//! Ticketing: a lock/lease protocol client and server, sans-IO.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod client;
pub mod names;
pub mod rng;
pub mod server;
#[cfg(feature = "fuzzing")]
pub mod testkit;
pub mod time;
pub mod wire;

pub use names::{Endpoint, Key, Name};
pub use time::Time;
