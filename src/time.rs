//! The time type the cores take.
//!
//! The cores never read a clock. Every input carries a [`Time`]: a count of
//! nanoseconds since an origin the driver picks (the moment it started, the
//! start of a simulation, zero in a test). Only differences between times
//! matter, so a simulator can start at zero and a real driver can measure from
//! its own start `std::time::Instant`.
//!
//! Arithmetic saturates: a deadline that would lie beyond the end of time is
//! the end of time ([`Time::MAX`]), never a wrapped-around moment in the past.

use core::fmt;
use core::time::Duration;

/// A moment, in nanoseconds since an origin chosen by the driver.
///
/// `Time` is a plain number: it is `Copy`, totally ordered and cannot be
/// constructed from a clock inside the crate. Drivers convert their clock
/// readings with [`Time::from_nanos`] (or [`Time::ZERO`] plus a
/// [`Duration`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);
    /// The latest representable moment; deadlines saturate here.
    pub const MAX: Time = Time(u64::MAX);

    /// The moment `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// The moment `millis` milliseconds after the origin (saturating).
    pub const fn from_millis(millis: u64) -> Time {
        Time(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Whole milliseconds since the origin.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// `self + d`, or [`Time::MAX`] if that is not representable.
    pub fn saturating_add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(duration_nanos(d)))
    }

    /// `self + d`, or `None` if that is not representable.
    pub fn checked_add(self, d: Duration) -> Option<Time> {
        let n = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_add(n).map(Time)
    }

    /// `self` plus `nanos` nanoseconds, or [`Time::MAX`]: the same as
    /// `saturating_add` of that many nanoseconds, without a `Duration`.
    #[inline]
    pub(crate) const fn saturating_add_nanos(self, nanos: u64) -> Time {
        Time(self.0.saturating_add(nanos))
    }

    /// `self` less `nanos` nanoseconds, or [`Time::ZERO`]: the same as
    /// `saturating_sub` of that many nanoseconds, without a `Duration`.
    #[inline]
    pub(crate) const fn saturating_sub_nanos(self, nanos: u64) -> Time {
        Time(self.0.saturating_sub(nanos))
    }

    /// `self` plus `ms` milliseconds, or [`Time::MAX`]: the same as
    /// `saturating_add(millis(ms))`, without a `Duration`.
    #[inline]
    pub(crate) const fn saturating_add_millis(self, ms: u64) -> Time {
        self.saturating_add_nanos(ms.saturating_mul(1_000_000))
    }

    /// Whole milliseconds from `earlier` to `self`, 0 if `self` is not
    /// later: the same as `duration_millis(self.saturating_duration_since(earlier))`.
    #[inline]
    pub(crate) const fn millis_since(self, earlier: Time) -> u64 {
        self.0.saturating_sub(earlier.0) / 1_000_000
    }

    /// `self - d`, or [`Time::ZERO`] if that lies before the origin.
    pub fn saturating_sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(duration_nanos(d)))
    }

    /// How long after `earlier` this moment is; zero if it is not after it.
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// How long after `earlier` this moment is, or `None` if it is before it.
    pub fn checked_duration_since(self, earlier: Time) -> Option<Duration> {
        self.0.checked_sub(earlier.0).map(Duration::from_nanos)
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Time {
    /// Seconds since the origin with millisecond precision, e.g. `t=12.345s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Time::MAX {
            return f.write_str("t=never");
        }
        let ms = self.0 / 1_000_000;
        write!(f, "t={}.{:03}s", ms / 1000, ms % 1000)
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A duration in whole milliseconds (rounded down), saturating.
pub(crate) fn duration_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `ms` milliseconds as a duration (any `u64` fits).
pub(crate) fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let late = Time::from_nanos(u64::MAX - 5);
        assert_eq!(late.saturating_add(Duration::from_secs(1)), Time::MAX);
        assert_eq!(late.checked_add(Duration::from_secs(1)), None);
        assert_eq!(late.saturating_add(Duration::MAX), Time::MAX);
        assert_eq!(
            Time::from_nanos(3).saturating_sub(Duration::from_secs(1)),
            Time::ZERO
        );
        assert_eq!(
            Time::ZERO.saturating_duration_since(Time::from_millis(1)),
            Duration::ZERO
        );
        assert_eq!(
            Time::ZERO.checked_duration_since(Time::from_millis(1)),
            None
        );
        assert_eq!(Time::from_millis(u64::MAX), Time::MAX);
    }

    #[test]
    fn display_is_seconds_with_millis() {
        assert_eq!(Time::from_millis(12_345).to_string(), "t=12.345s");
        assert_eq!(Time::MAX.to_string(), "t=never");
        assert_eq!(duration_millis(Duration::from_micros(2_999)), 2);
    }
}
