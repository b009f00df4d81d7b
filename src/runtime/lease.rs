//! What every adapter's held-grant guard shares with its driver: where the
//! grant stands (valid until when, in jeopardy, lost, expired), as the
//! core's renewal notices tell it, and a way to wait for that to change.
//!
//! The rules are the core's (PROTOCOL.md section 5, "Renewal"): the driver
//! only copies each notice about a guarded grant into the guard's state.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::client::{Event, Grant, OpId, Outcome};
use crate::hash::IdMap;
use crate::names::Key;
use crate::sync::register;
use crate::time::Time;

/// Where a held grant stands, as its client knows it. Its `Display` (and
/// `Debug`) say the times from now: `valid for another 7.4 s`, `expired 1.2
/// s ago`.
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseStatus {
    /// The holder may count on the key until `valid_until`.
    Valid {
        /// Until when, renewals included.
        valid_until: Instant,
    },
    /// Renewals have gone unanswered: less than a third of the lease is
    /// left before `valid_until`. The work should be ready to stop; a
    /// renewal that gets through makes it [`Valid`](LeaseStatus::Valid)
    /// again.
    Jeopardy {
        /// Until when the holder may still count on the key.
        valid_until: Instant,
    },
    /// The server no longer has the grant (a renewal was answered `N`):
    /// stop using the key at once.
    Lost,
    /// `valid_until` has passed: the holder can no longer count on the key
    /// (fencing tokens still protect the storage). Still the holder's to
    /// release.
    Expired {
        /// When it passed.
        valid_until: Instant,
    },
}

impl LeaseStatus {
    /// Until when the holder may count on the key; `None` once lost.
    pub fn valid_until(self) -> Option<Instant> {
        match self {
            LeaseStatus::Valid { valid_until }
            | LeaseStatus::Jeopardy { valid_until }
            | LeaseStatus::Expired { valid_until } => Some(valid_until),
            LeaseStatus::Lost => None,
        }
    }

    /// Whether the holder can no longer count on the key.
    pub fn is_over(self) -> bool {
        matches!(self, LeaseStatus::Lost | LeaseStatus::Expired { .. })
    }
}

/// Seconds from now to `at` (negative: past), to a tenth.
fn seconds_from_now(at: Instant) -> f64 {
    let now = Instant::now();
    match at.checked_duration_since(now) {
        Some(ahead) => ahead.as_secs_f64(),
        None => -now.duration_since(at).as_secs_f64(),
    }
}

impl std::fmt::Display for LeaseStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            LeaseStatus::Valid { valid_until } => {
                write!(
                    f,
                    "valid for another {:.1} s",
                    seconds_from_now(valid_until).max(0.0)
                )
            }
            LeaseStatus::Jeopardy { valid_until } => write!(
                f,
                "in jeopardy: renewals unanswered, {:.1} s left",
                seconds_from_now(valid_until).max(0.0)
            ),
            LeaseStatus::Lost => f.write_str("lost: the server no longer has the grant"),
            LeaseStatus::Expired { valid_until } => {
                write!(
                    f,
                    "expired {:.1} s ago",
                    (-seconds_from_now(valid_until)).max(0.0)
                )
            }
        }
    }
}

impl std::fmt::Debug for LeaseStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            LeaseStatus::Valid { .. } => "Valid",
            LeaseStatus::Jeopardy { .. } => "Jeopardy",
            LeaseStatus::Lost => "Lost",
            LeaseStatus::Expired { .. } => "Expired",
        };
        match self.valid_until() {
            // An `Instant` says nothing readable by itself: from now.
            Some(at) => f
                .debug_struct(name)
                .field(
                    "valid_until",
                    &format_args!("{:+.3}s from now", seconds_from_now(at)),
                )
                .finish(),
            None => f.write_str(name),
        }
    }
}

/// What every adapter's held-grant guard (`Lease`) shows: its grant, and
/// where it stands now. A `Lease` derefs to it; a clone is a view that
/// follows the same grant (what a lock builder's `run` hands the work),
/// with no power to release it.
#[derive(Debug, Clone)]
pub struct HeldGrant {
    /// `None` once released or left to run out.
    grant: Option<Grant>,
    shared: Arc<Shared>,
    /// The status version the caller has seen.
    seen: u64,
}

impl HeldGrant {
    /// A guard for `grant`, kept up to date through `shared`.
    pub(crate) fn new(grant: Grant, shared: Arc<Shared>) -> HeldGrant {
        HeldGrant {
            grant: Some(grant),
            shared,
            seen: 0,
        }
    }

    /// The grant (as it was granted; [`valid_until`](HeldGrant::valid_until)
    /// is where it stands now).
    pub fn grant(&self) -> &Grant {
        self.grant.as_ref().expect("held until consumed")
    }

    /// The key held.
    pub fn key(&self) -> &Key {
        self.grant().key()
    }

    /// The fencing token: quote it to the storage the lock protects.
    pub fn token(&self) -> u64 {
        self.grant().token()
    }

    /// The lease the server gave. A server caps every lease at its
    /// maximum (`ticketing serve --max-lease-ms`, 60 s by default): when it
    /// did, this is shorter than [`lease_asked`](HeldGrant::lease_asked)
    /// (and, with the feature `tracing`, a warning says so).
    pub fn lease(&self) -> Duration {
        self.grant().lease()
    }

    /// The lease the acquire asked for.
    pub fn lease_asked(&self) -> Duration {
        self.shared.asked
    }

    /// Where the grant stands now: valid, in jeopardy, lost or expired.
    pub fn status(&self) -> LeaseStatus {
        self.shared.status().0
    }

    /// Until when the holder may count on the key now, renewals included
    /// (`None` once lost).
    pub fn valid_until(&self) -> Option<Instant> {
        self.status().valid_until()
    }

    /// How long the holder may still count on the key: until
    /// [`valid_until`](HeldGrant::valid_until), zero once it has passed or
    /// the lease is lost.
    pub fn remaining(&self) -> Duration {
        self.valid_until().map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    /// The grant, taken out of the guard: once it is released or left to
    /// run out, or when the guard is dropped (`None` then if it was).
    pub(crate) fn take(&mut self) -> Option<Grant> {
        self.grant.take()
    }

    /// Waits until the status changes from the last one this returned
    /// (or, the first time, from the grant's), and returns it.
    pub async fn changed(&mut self) -> LeaseStatus {
        let (shared, seen) = (&self.shared, self.seen.max(1));
        let (status, version) = std::future::poll_fn(|cx| shared.poll_change(seen, cx)).await;
        self.seen = version;
        status
    }

    /// Ready with the status once it changed from the last one seen.
    #[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
    pub(crate) fn poll_changed(&mut self, cx: &Context<'_>) -> Poll<LeaseStatus> {
        let (status, version) = std::task::ready!(self.shared.poll_change(self.seen.max(1), cx));
        self.seen = version;
        Poll::Ready(status)
    }

    /// Blocks until the status changed from the last one the caller saw;
    /// `None` if `timeout` passed first (`None` timeout: no limit).
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn wait_change(&mut self, timeout: Option<Duration>) -> Option<LeaseStatus> {
        let (status, version) = self.shared.wait_change(self.seen.max(1), timeout);
        let changed = version > self.seen.max(1);
        self.seen = version;
        changed.then_some(status)
    }
}

/// A guard's state, written by the driver, read by the guard.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// The status changed (for blocking waiters).
    changed: Condvar,
    /// The lease the acquire asked for.
    asked: Duration,
}

struct State {
    status: LeaseStatus,
    /// Bumped at every change.
    version: u64,
    /// A task waiting for a change.
    waker: Option<Waker>,
    /// Threads waiting for a change on the condition variable (only they
    /// need a notification, which costs a system call).
    blocked: usize,
}

impl Shared {
    /// A guard's state before its grant comes, for an acquire that asked
    /// for `asked`.
    pub(crate) fn new(asked: Duration) -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(State {
                status: LeaseStatus::Lost,
                version: 0,
                waker: None,
                blocked: 0,
            }),
            changed: Condvar::new(),
            asked,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing is ever left half-changed under this lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, status: LeaseStatus) {
        let (waker, blocked) = {
            let mut state = self.lock();
            state.status = status;
            state.version += 1;
            (state.waker.take(), state.blocked > 0)
        };
        if blocked {
            self.changed.notify_all();
        }
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The status now, and its version.
    pub(crate) fn status(&self) -> (LeaseStatus, u64) {
        let state = self.lock();
        (state.status, state.version)
    }

    /// Ready with the status once its version is past `seen`.
    pub(crate) fn poll_change(&self, seen: u64, cx: &Context<'_>) -> Poll<(LeaseStatus, u64)> {
        let mut state = self.lock();
        if state.version > seen {
            return Poll::Ready((state.status, state.version));
        }
        register(&mut state.waker, cx);
        Poll::Pending
    }

    /// Blocks until the version is past `seen`, or `timeout` passes.
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn wait_change(&self, seen: u64, timeout: Option<Duration>) -> (LeaseStatus, u64) {
        let mut state = self.lock();
        // A timeout past what an `Instant` can hold is no timeout.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        while state.version <= seen {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|left| left.is_zero()) {
                break;
            }
            state.blocked += 1;
            state = match left {
                None => self
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(left) => {
                    self.changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            state.blocked -= 1;
        }
        (state.status, state.version)
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Shared").field(&self.status().0).finish()
    }
}

/// The guards the driver keeps up to date: by acquire while it is under
/// way, then by grant. Times become instants from `start`, the instant of
/// the core's time zero.
pub(crate) struct Guards {
    start: Instant,
    waiting: IdMap<OpId, Arc<Shared>>,
    held: IdMap<OpId, Arc<Shared>>,
}

impl Guards {
    pub(crate) fn new(start: Instant) -> Guards {
        Guards {
            start,
            waiting: IdMap::default(),
            held: IdMap::default(),
        }
    }

    fn instant(&self, time: Time) -> Instant {
        instant_of(self.start, time)
    }

    /// The acquire `op` will be held by a guard with `shared`.
    pub(crate) fn expect(&mut self, op: OpId, shared: Arc<Shared>) {
        self.waiting.insert(op, shared);
    }

    /// The acquire `op` ended with `outcome`: a grant is guarded from now
    /// on (until its caller turns out to be gone: [`forget`](Guards::forget)).
    pub(crate) fn acquired(&mut self, op: OpId, outcome: &Outcome) {
        let Some(shared) = self.waiting.remove(&op) else {
            return;
        };
        if let Outcome::Granted(grant) = outcome {
            shared.set(LeaseStatus::Valid {
                valid_until: self.instant(grant.valid_until()),
            });
            #[cfg(feature = "tracing")]
            if grant.lease() < shared.asked {
                tracing::warn!(
                    target: "ticketing",
                    key = %grant.key(),
                    token = grant.token(),
                    asked_ms = shared.asked.as_millis() as u64,
                    lease_ms = grant.lease().as_millis() as u64,
                    "the server granted a shorter lease than asked (its maximum)"
                );
            }
            self.held.insert(grant.id(), shared);
        }
    }

    /// The guard of `grant` is done (released, dropped, or left to run out).
    pub(crate) fn forget(&mut self, grant: &Grant) {
        self.held.remove(&grant.id());
    }

    /// Copies a renewal notice into the guard of its grant, if it has one.
    pub(crate) fn notice(&mut self, event: &Event) {
        let (grant, status) = match *event {
            Event::Renewed {
                grant, valid_until, ..
            } => (
                grant,
                LeaseStatus::Valid {
                    valid_until: self.instant(valid_until),
                },
            ),
            Event::LeaseJeopardy {
                grant, valid_until, ..
            } => (
                grant,
                LeaseStatus::Jeopardy {
                    valid_until: self.instant(valid_until),
                },
            ),
            Event::LeaseLost { grant, .. } => (grant, LeaseStatus::Lost),
            Event::LeaseExpired { grant, .. } => {
                let Some(shared) = self.held.get(&grant) else {
                    return;
                };
                let valid_until = shared.status().0.valid_until().unwrap_or(self.start);
                (grant, LeaseStatus::Expired { valid_until })
            }
            _ => return,
        };
        if let Some(shared) = self.held.get(&grant) {
            shared.set(status);
        }
    }
}

/// The instant of the core's `time`, its time zero being `start` (the
/// latest instant there is, for a time beyond what `Instant` can hold).
pub(crate) fn instant_of(start: Instant, time: Time) -> Instant {
    let mut span = Duration::from_nanos(time.as_nanos());
    loop {
        if let Some(at) = start.checked_add(span) {
            return at;
        }
        span /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread blocked in `wait_change`, with no timeout or with one too
    /// long for an `Instant`, is woken by the change.
    #[test]
    fn a_thread_waiting_for_a_change_is_woken_by_it() {
        for timeout in [None, Some(Duration::MAX)] {
            let shared = Shared::new(Duration::from_secs(1));
            let (done_tx, done) = std::sync::mpsc::channel();
            let waiting = Arc::clone(&shared);
            std::thread::spawn(move || done_tx.send(waiting.wait_change(0, timeout)));
            while shared.lock().blocked == 0 {
                std::thread::yield_now();
            }
            shared.set(LeaseStatus::Lost);
            let woken = done.recv_timeout(Duration::from_secs(10));
            assert_eq!(woken, Ok((LeaseStatus::Lost, 1)), "{timeout:?}");
            assert_eq!(shared.lock().blocked, 0);
        }
    }

    #[test]
    fn a_wait_with_a_timeout_returns_the_status_unchanged_when_it_passes() {
        let shared = Shared::new(Duration::from_secs(1));
        let (status, version) = shared.wait_change(0, Some(Duration::from_millis(5)));
        assert_eq!(version, 0);
        assert_eq!(status, shared.status().0);
    }

    /// Issue 32: a status reads as the times from now, never as an
    /// `Instant`'s insides.
    #[test]
    fn a_status_says_its_times_from_now() {
        let now = Instant::now();
        let ten = now + Duration::from_secs(10);
        let seconds = |text: &str, prefix: &str, suffix: &str| -> f64 {
            let number = text
                .strip_prefix(prefix)
                .and_then(|t| t.strip_suffix(suffix))
                .unwrap_or_else(|| panic!("{text:?}"));
            number.parse().unwrap_or_else(|_| panic!("{text:?}"))
        };
        let valid = LeaseStatus::Valid { valid_until: ten }.to_string();
        let left = seconds(&valid, "valid for another ", " s");
        assert!((9.0..=10.0).contains(&left), "{valid}");
        let jeopardy = LeaseStatus::Jeopardy { valid_until: ten }.to_string();
        let left = seconds(&jeopardy, "in jeopardy: renewals unanswered, ", " s left");
        assert!((9.0..=10.0).contains(&left), "{jeopardy}");
        let past = now.checked_sub(Duration::from_secs(2)).unwrap_or(now);
        let expired = LeaseStatus::Expired { valid_until: past }.to_string();
        let ago = seconds(&expired, "expired ", " s ago");
        assert!((0.0..=3.0).contains(&ago), "{expired}");
        assert_eq!(
            LeaseStatus::Lost.to_string(),
            "lost: the server no longer has the grant"
        );
        let debug = format!("{:?}", LeaseStatus::Valid { valid_until: ten });
        assert!(debug.starts_with("Valid { valid_until: +"), "{debug}");
        assert!(debug.ends_with("s from now }"), "{debug}");
        assert!(
            !debug.contains("tv_sec") && !debug.contains("Instant"),
            "{debug}"
        );
        assert_eq!(format!("{:?}", LeaseStatus::Lost), "Lost");
    }
}
