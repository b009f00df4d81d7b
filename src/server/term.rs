//! Terms and epochs (PROTOCOL.md 4.1): how a term begins, from what a
//! server kept; its tokens' arithmetic is [`super::token`]'s.
//!
//! The core reads no clock and touches no file: the epoch of a term, and
//! whether it begins with the previous term's table, are the driver's to
//! say ([`Server::begin_term`](super::Server::begin_term)).

use core::time::Duration;

use thiserror::Error;

use super::image::{EpochRecord, TableImage};
use super::token::MAX_EPOCH;
use crate::time::duration_millis;

/// Where the epoch of a term that the core begins by itself comes from:
/// one whose counter is about to reach 2^22 (PROTOCOL.md 4.1). Such a term
/// keeps its table and has no grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EpochSource {
    /// The core takes `epoch + 1` at once. For drivers whose epochs are not
    /// tied to a clock or to storage: tests, simulations, benchmarks.
    #[default]
    Core,
    /// The driver gives it: the core hands out [`Action::NeedEpoch`]
    /// (`after` the current epoch), grants nothing meanwhile (acquires
    /// queue as usual), and goes on when
    /// [`Server::begin_epoch`](super::Server::begin_epoch) gives the new
    /// epoch: `max(epoch + 1, now in ms)`, kept durably first by a driver
    /// that keeps state. What `ticketing serve` does.
    ///
    /// [`Action::NeedEpoch`]: super::Action::NeedEpoch
    Driver,
}

/// How a term begins ([`Server::begin_term`](super::Server::begin_term)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Term {
    /// With nothing before it: the first term of a state directory or a
    /// cluster that never had one, or a server that keeps no state (which
    /// cannot tell a first start from a restart). No grace; an empty table.
    First {
        /// The term's epoch.
        epoch: u64,
    },
    /// Without the previous term's table (a crash, a new leader that was
    /// not handed it): an empty table and a recovery grace of
    /// `max_lease + grace_margin` ([`Config::grace_margin`](super::Config::grace_margin)),
    /// in which nothing is granted and holders reclaim their grants by
    /// renewing them.
    Recovered {
        /// The term's epoch.
        epoch: u64,
        /// The greatest lease an earlier term could have given, kept with
        /// the epoch.
        max_lease: Duration,
    },
    /// With the previous term's table, written out and read back
    /// ([`Server::table_image`](super::Server::table_image)): its grants
    /// carry on, their leases shortened by `stopped`; no grace (unless the
    /// table was written during one: what was left of it, less `stopped`,
    /// goes on).
    Resumed {
        /// The term's epoch, greater than the image's.
        epoch: u64,
        /// The previous term's table.
        image: TableImage,
        /// How long no server ran (by the wall clock, never below zero):
        /// counted against every lease.
        stopped: Duration,
    },
}

impl Term {
    /// The term's epoch.
    pub fn epoch(&self) -> u64 {
        match self {
            Term::First { epoch } | Term::Recovered { epoch, .. } | Term::Resumed { epoch, .. } => {
                *epoch
            }
        }
    }
}

impl Term {
    /// The term of a server that keeps no state, started at `now` (the
    /// wall clock, since 1970): epoch the first whole millisecond after
    /// `now`, so that a restart can never reuse it; no grace, since such a
    /// server cannot tell a first start from a restart. The driver makes
    /// no grant before that millisecond has begun.
    pub fn stateless(now: Duration) -> Term {
        Term::First {
            epoch: duration_millis(now).saturating_add(1),
        }
    }

    /// The term a server that keeps state begins at `now` (the wall clock,
    /// since 1970), from what it kept: the `previous` epoch record, if it
    /// ever had a term, and the `table` its last clean stop wrote, if one
    /// was there and intact (PROTOCOL.md 4.1):
    ///
    /// - the epoch is `max(previous + 1, now in ms)`;
    /// - with the table of the previous term ([`Term::Resumed`]): the time
    ///   stopped is `now - table.written_at`, never below zero;
    /// - without it, after a term ([`Term::Recovered`]): a grace of the
    ///   previous record's greatest lease plus the margin;
    /// - never a term before ([`Term::First`]): no grace.
    ///
    /// Also the record to keep durably before the term's first grant: its
    /// epoch, and the greatest lease still live from it or from before it
    /// (at least `max_lease`, what this term may give). A table that is
    /// not of the previous record's epoch is stale and not used.
    pub fn next(
        previous: Option<&EpochRecord>,
        table: Option<TableImage>,
        now: Duration,
        max_lease: Duration,
    ) -> (Term, EpochRecord) {
        let now_ms = duration_millis(now);
        let epoch = match previous {
            Some(p) => p.epoch.saturating_add(1).max(now_ms),
            None => now_ms,
        };
        let table = table.filter(|t| previous.map_or(true, |p| t.epoch == p.epoch));
        let (term, carried) = match (previous, table) {
            (_, Some(image)) => {
                let stopped = now.saturating_sub(image.written_at);
                let carried = image.max_lease_ms;
                (
                    Term::Resumed {
                        epoch,
                        image,
                        stopped,
                    },
                    carried,
                )
            }
            (Some(p), None) => (
                Term::Recovered {
                    epoch,
                    max_lease: Duration::from_millis(p.max_lease_ms),
                },
                p.max_lease_ms,
            ),
            (None, None) => (Term::First { epoch }, 0),
        };
        let record = EpochRecord {
            epoch,
            max_lease_ms: duration_millis(max_lease).max(carried),
        };
        (term, record)
    }
}

/// The epoch after `after` at `now` (the wall clock, since 1970), for
/// [`Action::NeedEpoch`](super::Action::NeedEpoch):
/// `max(after + 1, now in ms)` (PROTOCOL.md 4.1).
pub fn next_epoch(after: u64, now: Duration) -> u64 {
    after.saturating_add(1).max(duration_millis(now))
}

/// Why a term or an epoch was refused: API misuse, nothing a client did.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TermError {
    /// Tokens must increase: a new epoch must be greater than every epoch
    /// the server (or the image) has granted in.
    #[error("epoch {epoch} is not greater than epoch {current}, which granted already")]
    EpochNotGreater {
        /// The epoch given.
        epoch: u64,
        /// The epoch it must exceed.
        current: u64,
    },
    /// Its tokens would not fit a `u64` (after May 2109).
    #[error("epoch {epoch} is past the last one whose tokens fit 64 bits ({MAX_EPOCH})")]
    EpochTooLarge {
        /// The epoch given.
        epoch: u64,
    },
    /// [`Server::begin_epoch`](super::Server::begin_epoch) without an
    /// [`Action::NeedEpoch`](super::Action::NeedEpoch) waiting for it.
    #[error("no new epoch was asked for")]
    NotAsked,
}

/// Checks that a term may begin with `epoch` after `current`, whose term
/// has granted if `granted`.
pub(crate) fn check_epoch(epoch: u64, current: u64, granted: bool) -> Result<(), TermError> {
    if epoch > MAX_EPOCH {
        return Err(TermError::EpochTooLarge { epoch });
    }
    if epoch < current || (epoch == current && granted) {
        return Err(TermError::EpochNotGreater { epoch, current });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_term_follows_what_was_kept() {
        let now = Duration::from_millis(1_000_000);
        let max = Duration::from_millis(500);
        // Never a term: the first, no grace, the clock's epoch.
        let (term, record) = Term::next(None, None, now, max);
        assert!(matches!(term, Term::First { epoch: 1_000_000 }));
        assert_eq!((record.epoch, record.max_lease_ms), (1_000_000, 500));
        // A crash: a grace of the kept lease, which the record carries on.
        let crashed = EpochRecord {
            epoch: 2_000_000,
            max_lease_ms: 9_000,
        };
        let (term, record) = Term::next(Some(&crashed), None, now, max);
        assert!(matches!(
            term,
            Term::Recovered { epoch: 2_000_001, max_lease } if max_lease == Duration::from_secs(9)
        ));
        assert_eq!(
            record.max_lease_ms, 9_000,
            "a grant of 9 s may still be live"
        );
        // A clean stop 300 ms ago: the table, the time stopped.
        let image = |epoch| TableImage {
            epoch,
            count: 1,
            max_lease_ms: 700,
            grace_ms: 0,
            written_at: Duration::from_millis(999_700),
            grants: Vec::new(),
        };
        let stopped = EpochRecord {
            epoch: 999_000,
            max_lease_ms: 700,
        };
        let (term, record) = Term::next(Some(&stopped), Some(image(999_000)), now, max);
        assert!(matches!(
            term,
            Term::Resumed { epoch: 1_000_000, stopped, .. } if stopped == Duration::from_millis(300)
        ));
        assert_eq!(
            record,
            EpochRecord {
                epoch: 1_000_000,
                max_lease_ms: 700
            }
        );
        // A clock that went back: never below zero, the epoch still later.
        let back = Duration::from_millis(10);
        let (term, _) = Term::next(Some(&stopped), Some(image(999_000)), back, max);
        assert!(matches!(
            term,
            Term::Resumed {
                epoch: 999_001,
                stopped: Duration::ZERO,
                ..
            }
        ));
        // A table of another epoch is stale: a grace instead.
        let (term, _) = Term::next(Some(&stopped), Some(image(5)), now, max);
        assert!(matches!(term, Term::Recovered { .. }));
        // No state: the first whole millisecond after the start.
        let start = Duration::from_micros(1_000_000_400);
        assert!(matches!(
            Term::stateless(start),
            Term::First { epoch: 1_000_001 }
        ));
    }

    #[test]
    fn an_epoch_must_grow_once_it_granted() {
        assert_eq!(check_epoch(5, 5, false), Ok(()));
        assert_eq!(
            check_epoch(5, 5, true),
            Err(TermError::EpochNotGreater {
                epoch: 5,
                current: 5
            })
        );
        assert!(check_epoch(4, 5, false).is_err());
        assert_eq!(check_epoch(6, 5, true), Ok(()));
        assert_eq!(
            check_epoch(MAX_EPOCH + 1, 0, false),
            Err(TermError::EpochTooLarge {
                epoch: MAX_EPOCH + 1
            })
        );
    }
}
