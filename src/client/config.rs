//! The client's configuration.

use core::time::Duration;

use thiserror::Error;

use crate::names::{Endpoint, Name};

/// What the client does with a `B` (busy) answer from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BusyPolicy {
    /// Try again with a new request id after a jittered backoff, with
    /// `wait_ms` set to what is left of the wait budget, while the budget
    /// still fits an attempt (PROTOCOL.md section 5, "B matched").
    #[default]
    Retry,
    /// End the acquire `Busy` at the first `B`.
    FailFast,
}

/// What cancelling an acquire whose bytes were already handed out does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CancelPolicy {
    /// Close the connection, so that no answer is left without a claimant;
    /// every acquire sent on it ends Indeterminate (as the seed says).
    #[default]
    Close,
    /// Keep the pending entry as an abandoned waiter: its answer is still
    /// claimed, a `G` for it is released by its exact token, and the other
    /// operations on the connection are untouched.
    KeepWaiter,
}

/// An exponential backoff with equal jitter: the n-th delay in a row is
/// `d/2 + random(0, d/2)` with `d = min(cap, base * 2^n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first step.
    pub base: Duration,
    /// No step is longer.
    pub cap: Duration,
}

impl Backoff {
    /// A backoff from `base` up to `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff { base, cap }
    }

    /// The step `d` of the `n`-th delay in a row (from 0), before jitter.
    pub fn step(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// One [`Backoff`] per cause (PROTOCOL.md section 5, "Connecting and backing
/// off").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoffs {
    /// A transport failure or a protocol violation: 50 ms up to 5 s.
    pub transport: Backoff,
    /// `E no_leader`: 50 ms up to 2 s.
    pub no_leader: Backoff,
    /// `E not_active`: 200 ms up to 5 s.
    pub not_active: Backoff,
    /// `E auth_failed`: 1 s up to 60 s.
    pub auth_failed: Backoff,
    /// Redirects (`M`) after the third in a row without a `W`: 50 ms up to 2 s.
    pub redirect: Backoff,
    /// A `B` answer, between attempts of one acquire: 10 ms up to 500 ms.
    pub busy: Backoff,
}

impl Default for Backoffs {
    fn default() -> Backoffs {
        let ms = Duration::from_millis;
        Backoffs {
            transport: Backoff::new(ms(50), ms(5_000)),
            no_leader: Backoff::new(ms(50), ms(2_000)),
            not_active: Backoff::new(ms(200), ms(5_000)),
            auth_failed: Backoff::new(ms(1_000), ms(60_000)),
            redirect: Backoff::new(ms(50), ms(2_000)),
            busy: Backoff::new(ms(10), ms(500)),
        }
    }
}

/// Everything the client core is told when it is made. Build one with
/// [`Config::new`] and change the fields you need.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The service's addresses, tried in turn. At least one.
    pub endpoints: Vec<Endpoint>,
    /// Addresses besides the endpoints that a leader hint (`L`, `M`) may name.
    /// A hint outside the endpoints and these is ignored.
    pub allow: Vec<Endpoint>,
    /// Sent in `H`.
    pub client_id: Name,
    /// Sent in `H`; `-` on the wire when `None`.
    pub credential: Option<Name>,
    /// Window slots kept free of acquires for releases (at least 1; default
    /// 1). With a server window `w`, at most `w - min(reserved, w - 1)`
    /// acquires are in flight.
    pub reserved: u32,
    /// What a `B` answer does (default [`BusyPolicy::Retry`]).
    pub busy: BusyPolicy,
    /// What cancelling a sent acquire does (default [`CancelPolicy::Close`]).
    pub cancel: CancelPolicy,
    /// How long past `sent_at + wait_ms` an acquire's answer may be late, and
    /// how long a release's answer may take, before the connection is deemed
    /// unwell and closed (default 5 s).
    pub answer_grace: Duration,
    /// How long an unsent acquire waits for a connection at least, even with
    /// a shorter wait budget (default 2 s).
    pub queue_grace: Duration,
    /// Added to every time the client derives from a lease, for network delay
    /// and clock drift (default 1 s).
    pub settle_margin: Duration,
    /// How long a release of a raw `(key, token)`, whose lease the client
    /// never saw, may keep trying (default 60 s).
    pub release_horizon: Duration,
    /// How many attempts one release makes at most (default 8).
    pub release_attempts: u32,
    /// How long a connect may take before it is given up (default 5 s).
    pub connect_timeout: Duration,
    /// How long after connecting the handshake answer may take (default 5 s).
    pub handshake_timeout: Duration,
    /// Backoff per cause.
    pub backoff: Backoffs,
    /// Most acquires open at once; one more is refused with
    /// [`Error::Busy`](super::Error::Busy) (default 65 536).
    pub max_acquires: usize,
    /// Most releases the embedder has open at once (default 65 536). Releases
    /// the client issues itself for orphaned grants are never refused.
    pub max_releases: usize,
    /// Seed of the generator behind every random choice (backoff jitter).
    pub seed: u64,
    /// Breaks one rule on purpose, so that the simulator can show that its
    /// checks catch it. Exists only with the `sim` feature; never set it
    /// outside a test of the checks.
    #[cfg(feature = "sim")]
    #[doc(hidden)]
    pub sabotage: Sabotage,
}

/// One rule of PROTOCOL.md section 5 broken on purpose (feature `sim`, for
/// showing that the simulator's checks catch it). Each is a minimal,
/// commented conditional in `src/client/`; [`Sabotage::None`] changes
/// nothing.
#[cfg(feature = "sim")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Sabotage {
    /// Every rule kept.
    #[default]
    None,
    /// Match an answer to the oldest pending request of the same op and key
    /// (arrival order) instead of by its id (`pending.rs`, `on_answer`).
    MatchByArrival,
    /// On a close, put sent acquires back in the queue to be sent again
    /// instead of ending them Indeterminate (`link.rs`,
    /// `settle_pending_on_close`).
    ResendAfterClose,
    /// Let acquires use the reserved slots too (`lane.rs`, `acquire_limit`).
    UseReservedSlot,
    /// Drop the exact-token release of an orphaned grant instead of queueing
    /// it (`pending.rs`, `queue_orphan_release`).
    DropOrphanRelease,
    /// Take leader hints (`L`, `M`) from any address, allowlisted or not
    /// (`config.rs`, `allows`).
    AnyHint,
}

impl Config {
    /// A configuration with the defaults of PROTOCOL.md.
    pub fn new(endpoints: impl IntoIterator<Item = Endpoint>, client_id: Name) -> Config {
        Config {
            endpoints: endpoints.into_iter().collect(),
            allow: Vec::new(),
            client_id,
            credential: None,
            reserved: 1,
            busy: BusyPolicy::default(),
            cancel: CancelPolicy::default(),
            answer_grace: Duration::from_secs(5),
            queue_grace: Duration::from_secs(2),
            settle_margin: Duration::from_secs(1),
            release_horizon: Duration::from_secs(60),
            release_attempts: 8,
            connect_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            backoff: Backoffs::default(),
            max_acquires: 65_536,
            max_releases: 65_536,
            seed: 0,
            #[cfg(feature = "sim")]
            sabotage: Sabotage::None,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.endpoints.is_empty() {
            return Err(ConfigError::NoEndpoints);
        }
        if self.reserved == 0 {
            return Err(ConfigError::NoReservedSlot);
        }
        if self.release_attempts == 0 {
            return Err(ConfigError::NoReleaseAttempts);
        }
        if self.max_acquires == 0 || self.max_releases == 0 {
            return Err(ConfigError::NoCapacity);
        }
        let grace = [
            ("answer_grace", self.answer_grace),
            ("connect_timeout", self.connect_timeout),
            ("handshake_timeout", self.handshake_timeout),
        ];
        for (name, value) in grace {
            if value.is_zero() {
                return Err(ConfigError::ZeroDuration(name));
            }
        }
        Ok(())
    }

    /// Whether a leader hint may name `addr`.
    pub(crate) fn allows(&self, addr: crate::wire::Addr<'_>) -> bool {
        // SABOTAGE (feature `sim` only): take a hint from any address.
        #[cfg(feature = "sim")]
        if self.sabotage == Sabotage::AnyHint {
            return true;
        }
        self.endpoints.iter().chain(&self.allow).any(|e| e.is(addr))
    }
}

/// Why a [`Config`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// There must be at least one endpoint.
    #[error("no endpoints configured")]
    NoEndpoints,
    /// `reserved` must be at least 1, or a window full of acquires could
    /// block the release they wait for.
    #[error("reserved must be at least 1")]
    NoReservedSlot,
    /// `release_attempts` must be at least 1.
    #[error("release_attempts must be at least 1")]
    NoReleaseAttempts,
    /// `max_acquires` and `max_releases` must be at least 1.
    #[error("max_acquires and max_releases must be at least 1")]
    NoCapacity,
    /// A timeout that must be positive is zero.
    #[error("{0} must be positive")]
    ZeroDuration(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_steps_double_up_to_the_cap_without_overflow() {
        let b = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
        assert_eq!(b.step(0), Duration::from_millis(50));
        assert_eq!(b.step(1), Duration::from_millis(100));
        assert_eq!(b.step(6), Duration::from_millis(3200));
        assert_eq!(b.step(7), Duration::from_secs(5));
        assert_eq!(b.step(u32::MAX), Duration::from_secs(5));
        let huge = Backoff::new(Duration::MAX, Duration::MAX);
        assert_eq!(huge.step(40), Duration::MAX);
    }
}
