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
    /// `E unsupported_version`: 1 s up to 60 s.
    pub unsupported_version: Backoff,
    /// Rounds in which every attempt ended in a redirect (`M`): 50 ms up
    /// to 2 s.
    pub redirect: Backoff,
    /// A `B` answer, between attempts of one acquire: 10 ms up to 500 ms.
    pub busy: Backoff,
}

impl Backoffs {
    /// Each backoff with the name of its field, as [`ConfigError`] names it.
    fn by_cause(&self) -> [(&'static str, Backoff); 7] {
        [
            ("backoff.transport", self.transport),
            ("backoff.no_leader", self.no_leader),
            ("backoff.not_active", self.not_active),
            ("backoff.auth_failed", self.auth_failed),
            ("backoff.unsupported_version", self.unsupported_version),
            ("backoff.redirect", self.redirect),
            ("backoff.busy", self.busy),
        ]
    }
}

impl Default for Backoffs {
    fn default() -> Backoffs {
        let ms = Duration::from_millis;
        Backoffs {
            transport: Backoff::new(ms(50), ms(5_000)),
            no_leader: Backoff::new(ms(50), ms(2_000)),
            not_active: Backoff::new(ms(200), ms(5_000)),
            auth_failed: Backoff::new(ms(1_000), ms(60_000)),
            unsupported_version: Backoff::new(ms(1_000), ms(60_000)),
            redirect: Backoff::new(ms(50), ms(2_000)),
            busy: Backoff::new(ms(10), ms(500)),
        }
    }
}

/// Everything the client core is told when it is made. Build one with
/// [`Config::new`] and change the fields you need; [`Client::new`]
/// refuses, with a [`ConfigError`] naming the field, a value outside the
/// range each field documents.
///
/// [`Client::new`]: super::Client::new
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    /// The service's addresses, tried in turn. At least one.
    pub endpoints: Vec<Endpoint>,
    /// Addresses besides the endpoints that a leader hint (`L`, `M`) may name.
    /// A hint outside the endpoints and these is ignored.
    pub allow: Vec<Endpoint>,
    /// Sent in `H`.
    pub client_id: Name,
    /// Sent in `H`; `-` on the wire when `None`. It cannot be `-` itself
    /// (that means "none"). Never printed: `Debug` shows `<secret>`.
    pub credential: Option<Name>,
    /// Window slots kept free of acquires for releases: at least 1
    /// (default 1). With a server window `w`, at most `w - reserved`
    /// acquires are in flight, so a server whose window is not above
    /// `reserved` is sent no acquire at all.
    pub reserved: u32,
    /// What a `B` answer does (default [`BusyPolicy::Retry`]).
    pub busy: BusyPolicy,
    /// What cancelling a sent acquire does (default [`CancelPolicy::Close`]).
    pub cancel: CancelPolicy,
    /// How long past `sent_at + wait_ms` an acquire's answer may be late, and
    /// how long a release's answer may take, before the connection is deemed
    /// unwell and closed: positive (default 5 s).
    pub answer_grace: Duration,
    /// How long an unsent acquire waits for a connection at least, even with
    /// a shorter wait budget: positive, so that a try-lock submitted before
    /// the connection is up is still tried (default 2 s).
    pub queue_grace: Duration,
    /// Added to every time the client derives from a lease, for network delay
    /// and clock drift: positive (default 1 s).
    pub settle_margin: Duration,
    /// How long a release of a raw `(key, token)`, whose lease the client
    /// never saw, may keep trying: positive (default 60 s).
    pub release_horizon: Duration,
    /// How many attempts one release makes at most: at least 1 (default 8).
    pub release_attempts: u32,
    /// How long a connect may take before it is given up: positive
    /// (default 5 s).
    pub connect_timeout: Duration,
    /// How long after connecting the handshake answer may take: positive
    /// (default 5 s).
    pub handshake_timeout: Duration,
    /// Backoff between rounds per cause, and between the attempts of an
    /// acquire answered `B`: every base positive, every cap at least its
    /// base.
    pub backoff: Backoffs,
    /// How long an address whose latest connection ended by a transport
    /// failure (a failed or timed-out connect or handshake, the transport
    /// ending or failing) is not followed as a leader hint: positive
    /// (default 1 s). A follower that still names a leader that just died
    /// then costs no attempt while the death is fresh.
    pub stale_hint: Duration,
    /// Most acquires open at once, at least 1; one more is refused with
    /// [`Error::Busy`](super::Error::Busy) (default 65 536).
    pub max_acquires: usize,
    /// Most releases the embedder has open at once, at least 1 (default
    /// 65 536). Releases the client issues itself for orphaned grants are
    /// never refused.
    pub max_releases: usize,
    /// Give up while unreachable (default `false`): when the last round
    /// of connection attempts failed at every address and no connection
    /// is up, an acquire not yet sent ends at once, `TimedOut` never sent
    /// with the round's cause, instead of waiting up to `max(wait,
    /// queue_grace)` for a connection: at its submission, or when such a
    /// round ends. For a caller that would rather turn elsewhere at once
    /// than wait for the service to come back. Releases and renewals are
    /// never given up. One acquire can say otherwise
    /// ([`AcquireOptions::give_up_while_unreachable`]).
    pub give_up_while_unreachable: bool,
    /// Seed of the generator behind every random choice (backoff jitter).
    pub seed: u64,
}

/// Every field, the credential left out.
impl core::fmt::Debug for Config {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Config")
            .field("endpoints", &self.endpoints)
            .field("allow", &self.allow)
            .field("client_id", &self.client_id)
            .field("credential", &self.credential.as_ref().map(|_| "<secret>"))
            .field("reserved", &self.reserved)
            .field("busy", &self.busy)
            .field("cancel", &self.cancel)
            .field("answer_grace", &self.answer_grace)
            .field("queue_grace", &self.queue_grace)
            .field("settle_margin", &self.settle_margin)
            .field("release_horizon", &self.release_horizon)
            .field("release_attempts", &self.release_attempts)
            .field("connect_timeout", &self.connect_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("backoff", &self.backoff)
            .field("stale_hint", &self.stale_hint)
            .field("max_acquires", &self.max_acquires)
            .field("max_releases", &self.max_releases)
            .field("give_up_while_unreachable", &self.give_up_while_unreachable)
            .field("seed", &self.seed)
            .finish()
    }
}

/// How one acquire is taken, beyond its key, owner, wait and lease
/// ([`Client::acquire_with`](super::Client::acquire_with)). Starts as
/// [`AcquireOptions::new`]: not renewed, and giving up while unreachable
/// as [`Config::give_up_while_unreachable`] says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireOptions {
    /// Renewed automatically once granted, for at most this long from
    /// then (`Duration::MAX`: until released); `None`: not automatically.
    pub renew: Option<Duration>,
    /// Whether this acquire gives up while unreachable (see
    /// [`Config::give_up_while_unreachable`]); `None`: as the
    /// configuration says.
    pub give_up_while_unreachable: Option<bool>,
}

impl AcquireOptions {
    /// Not renewed; giving up while unreachable as the configuration says.
    pub fn new() -> AcquireOptions {
        AcquireOptions::default()
    }

    /// Renewed automatically once granted, for at most `limit` from then
    /// (`None`: until released).
    pub fn renewing(mut self, limit: Option<Duration>) -> AcquireOptions {
        self.renew = Some(limit.unwrap_or(Duration::MAX));
        self
    }

    /// Gives up at once while unreachable (`true`), or waits for a
    /// connection as long as its budget allows (`false`), whatever
    /// [`Config::give_up_while_unreachable`] says.
    pub fn give_up_while_unreachable(mut self, give_up: bool) -> AcquireOptions {
        self.give_up_while_unreachable = Some(give_up);
        self
    }
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
            stale_hint: Duration::from_secs(1),
            max_acquires: 65_536,
            max_releases: 65_536,
            give_up_while_unreachable: false,
            seed: 0,
        }
    }

    /// Checks every field against its documented range.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.endpoints.is_empty() {
            return Err(ConfigError::NoEndpoints);
        }
        if self.credential.as_ref().is_some_and(|c| c.as_str() == "-") {
            return Err(ConfigError::DashCredential);
        }
        let counts = [
            ("reserved", self.reserved as usize),
            ("release_attempts", self.release_attempts as usize),
            ("max_acquires", self.max_acquires),
            ("max_releases", self.max_releases),
        ];
        let durations = [
            ("answer_grace", self.answer_grace),
            ("queue_grace", self.queue_grace),
            ("settle_margin", self.settle_margin),
            ("release_horizon", self.release_horizon),
            ("connect_timeout", self.connect_timeout),
            ("handshake_timeout", self.handshake_timeout),
            ("stale_hint", self.stale_hint),
        ];
        let zero_count = counts.into_iter().find(|&(_, n)| n == 0);
        let zero_duration = durations.into_iter().find(|(_, d)| d.is_zero());
        if let Some(field) = zero_count
            .map(|(field, _)| field)
            .or(zero_duration.map(|(field, _)| field))
        {
            return Err(ConfigError::NotPositive { field });
        }
        for (field, backoff) in self.backoff.by_cause() {
            if backoff.base.is_zero() {
                return Err(ConfigError::NotPositive { field });
            }
            if backoff.cap < backoff.base {
                return Err(ConfigError::CapBelowBase { field });
            }
        }
        Ok(())
    }

    /// Whether a leader hint may name `addr`.
    pub(crate) fn allows(&self, addr: crate::wire::Addr<'_>) -> bool {
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
    /// `-` on the wire means "no credential": it cannot be one.
    #[error("the credential cannot be \"-\" (it means no credential)")]
    DashCredential,
    /// A count or duration that must be positive is zero (`field` names
    /// it, e.g. `"release_horizon"` or `"backoff.busy"` for a base).
    #[error("{field} must be positive")]
    NotPositive {
        /// The field.
        field: &'static str,
    },
    /// A backoff's cap is below its base (`field` names the backoff).
    #[error("{field}: the cap must be at least the base")]
    CapBelowBase {
        /// The field.
        field: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new([Endpoint::new("a:1").unwrap()], Name::new("c1").unwrap())
    }

    #[test]
    fn every_value_that_makes_a_rule_meaningless_is_refused_by_name() {
        assert_eq!(config().validate(), Ok(()));
        let refused = |change: fn(&mut Config)| {
            let mut c = config();
            change(&mut c);
            c.validate().unwrap_err()
        };
        let not_positive = |field| ConfigError::NotPositive { field };
        assert_eq!(refused(|c| c.endpoints.clear()), ConfigError::NoEndpoints);
        assert_eq!(
            refused(|c| c.credential = Some(Name::new("-").unwrap())),
            ConfigError::DashCredential
        );
        // Each change, and the field it makes meaningless.
        type Change = fn(&mut Config);
        let not_positive_cases: [(Change, &str); 13] = [
            (|c| c.reserved = 0, "reserved"),
            (|c| c.release_attempts = 0, "release_attempts"),
            (|c| c.max_acquires = 0, "max_acquires"),
            (|c| c.max_releases = 0, "max_releases"),
            (|c| c.answer_grace = Duration::ZERO, "answer_grace"),
            (|c| c.queue_grace = Duration::ZERO, "queue_grace"),
            (|c| c.settle_margin = Duration::ZERO, "settle_margin"),
            (|c| c.release_horizon = Duration::ZERO, "release_horizon"),
            (|c| c.connect_timeout = Duration::ZERO, "connect_timeout"),
            (
                |c| c.handshake_timeout = Duration::ZERO,
                "handshake_timeout",
            ),
            (|c| c.stale_hint = Duration::ZERO, "stale_hint"),
            (
                |c| c.backoff.transport.base = Duration::ZERO,
                "backoff.transport",
            ),
            (
                |c| c.backoff.busy = Backoff::new(Duration::ZERO, Duration::ZERO),
                "backoff.busy",
            ),
        ];
        for (change, field) in not_positive_cases {
            assert_eq!(refused(change), not_positive(field), "{field}");
        }
        assert_eq!(
            refused(|c| c.backoff.auth_failed =
                Backoff::new(Duration::from_secs(2), Duration::from_secs(1))),
            ConfigError::CapBelowBase {
                field: "backoff.auth_failed"
            }
        );
        let ms = Duration::from_millis;
        let mut c = config();
        c.backoff.redirect = Backoff::new(ms(1), ms(1));
        c.reserved = 1_000;
        assert_eq!(c.validate(), Ok(()), "the smallest values are allowed");
    }

    #[test]
    fn debug_never_shows_the_credential() {
        let mut c = config();
        c.credential = Some(Name::new("s3cr3t-t0ken").unwrap());
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("<secret>"), "{shown}");
    }

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
