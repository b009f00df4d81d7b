//! Test kit: an invariant checker, a model server, a scripted driver and
//! the fuzz entry points, shared by the property tests, the cargo-fuzz
//! targets and the simulator. Enabled by the `fuzzing` feature.
//!
//! | module | what |
//! |---|---|
//! | [`checker`] | [`Checker`]: watches one client core from the outside and checks invariants 1 to 7 of PROTOCOL.md section 5 (renewal included) after every step |
//! | [`model`] | [`ModelServer`]: a legal Ticketing server of version 2 (lock table, FIFO waiters, leases, tokens, renewals by rule 9) that answers in a random order drawn from a seed, and can inject faults on purpose |
//! | [`run`] | [`Setup`], [`Step`] and [`Runner`]: drive a client against the model server step by step, with the checker watching, then settle and shut down |
//! | [`fuzz`] | the bodies of the cargo-fuzz targets: [`fuzz::decode`], [`fuzz::client`] and [`fuzz::decisions`] |
//! | `peer_frames` | (with `raft`) the body of the target `peer_frames`: arbitrary frames from authenticated peers into the members of a replicated cluster |
//!
//! Nothing here reads a clock or draws entropy: every random choice comes
//! from a seed (through [`Rng`](crate::rng::Rng)), so every run can be
//! replayed exactly, and a run that is replayed must give the same trace
//! (invariant 6).
//!
//! ```
//! use ticketing::testkit::{Runner, Setup, Step};
//!
//! let setup = Setup { seed: 42, ..Setup::default() };
//! let steps = [
//!     Step::Acquire { key: 0, wait: 3, lease: 4 },
//!     Step::Connected,
//!     Step::ServerReads { bytes: 0 },
//!     Step::ServerEmits { frames: 0 },
//!     Step::Deliver { bytes: 0 },
//! ];
//! // Runs the steps, settles, shuts down, and runs it all a second time to
//! // compare the traces.
//! let report = Runner::run_twice(&setup, &steps).expect("no invariant broken");
//! assert!(report.stats.granted >= 1);
//! ```

pub mod checker;
pub mod fuzz;
pub mod model;
#[cfg(feature = "raft")]
pub mod peer_frames;
pub mod run;

pub use checker::{Checker, Invariant, InvariantViolation, Stats};
pub use model::{Fault, ModelServer, ServerConfig};
pub use run::{Report, Runner, Setup, Step};

/// A 64-bit FNV-1a hash of everything a run did, for comparing two runs
/// (invariant 6). Independent of the platform and of `std`'s hasher keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceHash(u64);

impl Default for TraceHash {
    fn default() -> TraceHash {
        TraceHash::new()
    }
}

impl TraceHash {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    /// An empty trace.
    pub const fn new() -> TraceHash {
        TraceHash(Self::OFFSET)
    }

    /// Adds bytes, prefixed with their length so that boundaries count.
    pub fn write(&mut self, bytes: &[u8]) {
        self.write_u64(bytes.len() as u64);
        self.write_raw(bytes);
    }

    /// Adds a number.
    pub fn write_u64(&mut self, n: u64) {
        self.write_raw(&n.to_le_bytes());
    }

    fn write_raw(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// The hash so far.
    pub const fn get(&self) -> u64 {
        self.0
    }
}
