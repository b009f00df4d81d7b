//! A scripted driver: one client core against the [`ModelServer`](crate::testkit::model::ModelServer), step by
//! step, with the [`Checker`](crate::testkit::checker::Checker) watching every step.
//!
//! A run is a [`Setup`] (the client's and the server's settings) and a list
//! of [`Step`]s: what the embedder asks for, what the network does, what the
//! server does, and how time passes. Steps that cannot apply (delivering
//! bytes when there are none, cancelling when nothing was ever submitted)
//! do nothing, so every list of steps is a valid run. After the steps,
//! [`Runner::settle`] gives the client a healthy server until every
//! operation has ended, then shuts it down and checks the end of the run.
//!
//! Both [`Setup`] and [`Step`] have a compact byte encoding
//! ([`Setup::decode`], [`Step::decode`] and their inverses), which is what
//! the `client` fuzz target reads: one byte per field, so a mutation of one
//! byte changes one thing.

mod runner;
mod setup;
mod step;

use core::time::Duration;

use arbitrary::Unstructured;

pub use self::runner::{Report, Runner};
pub use self::setup::Setup;
pub use self::step::{foreign_grant, Step};
use crate::names::Endpoint;

/// The keys acquires use (`Step::Acquire` takes the first four; forged
/// answers may name all six).
pub const KEYS: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];
/// Wait budgets, in milliseconds, indexed by `wait % 8`.
pub const WAITS_MS: [u64; 8] = [0, 1, 10, 50, 200, 1_000, 3_000, 10_000];
/// Leases, in milliseconds, indexed by `lease % 8`.
pub const LEASES_MS: [u64; 8] = [1, 5, 30, 100, 500, 2_000, 10_000, 60_000];
/// Shutdown budgets, in milliseconds, indexed by `budget % 6`.
pub const BUDGETS_MS: [u64; 6] = [0, 10, 100, 1_000, 5_000, 30_000];
/// Answer graces, in milliseconds, indexed by `answer_grace % 3`.
pub const GRACES_MS: [u64; 3] = [20, 200, 5_000];
/// The server's longest lease, in milliseconds, indexed by `max_lease % 4`.
pub const MAX_LEASES_MS: [u64; 4] = [1, 50, 1_000, 60_000];
/// Limits on automatic renewal (`renew_until`), in milliseconds, indexed
/// by `limit % 8`; `None` renews until released.
pub const RENEW_LIMITS_MS: [Option<u64>; 8] = [
    None,
    Some(0),
    Some(10),
    Some(100),
    Some(1_000),
    Some(5_000),
    Some(30_000),
    None,
];
/// The addresses a hint flood names, indexed by `kind % 5`: allowlisted
/// ones (endpoints and the extra allowlist), and two outside it.
pub const FLOOD_ADDRS: [&str; 5] = ["a:1", "b:2", "c:3", "evil:666", "evil:667"];

/// How long [`Runner::settle`] lets a live client work before shutting it
/// down: longer than any wait, lease or backoff the setups allow.
pub const SETTLE_TIME: Duration = Duration::from_secs(600);
/// The shutdown budget [`Runner::settle`] gives.
pub const SETTLE_BUDGET: Duration = Duration::from_secs(30);

fn ep(s: &str) -> Endpoint {
    Endpoint::new(s).expect("a valid address")
}

fn byte(u: &mut Unstructured<'_>) -> u8 {
    u.arbitrary::<u8>().unwrap_or(0)
}

/// A renewal limit of [`RENEW_LIMITS_MS`].
fn renew_limit(limit: u8) -> Option<Duration> {
    RENEW_LIMITS_MS[usize::from(limit % 8)].map(Duration::from_millis)
}
