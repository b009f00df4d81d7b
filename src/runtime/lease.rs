//! What every adapter's held-grant guard shares with its driver: where the
//! grant stands (valid until when, confirmed or not, in jeopardy, lost,
//! expired), as the core's renewal and connection notices tell it, and
//! ways to wait for that to change and for each renewal.
//!
//! The rules are the core's (PROTOCOL.md section 5, "Renewal"): the driver
//! only copies each notice about a guarded grant, and each connection
//! that begins or ends, into the guard's state.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::client::{Event, Grant, OpId, Outcome};
use crate::hash::IdMap;
use crate::names::Key;
use crate::time::Time;

/// Where a held grant stands, as its client knows it. Its `Display` (and
/// `Debug`) say the times from now: `valid for another 7.4 s`, `valid for
/// another 2.9 s, unconfirmed: no connection to the server`, `expired 1.2
/// s ago`.
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseStatus {
    /// The holder may count on the key until `valid_until`.
    Valid {
        /// Until when, renewals included.
        valid_until: Instant,
        /// Whether a server has the client now, so that this grant's
        /// renewals can reach it: true when granted, false from the moment
        /// the connection ends (the server died, the network failed) until
        /// a server takes the client again. Unconfirmed, the grant still
        /// holds until `valid_until`, but the holder learns early that it
        /// may not be renewed: [`Jeopardy`](LeaseStatus::Jeopardy) follows
        /// if no server is reached in time.
        confirmed: bool,
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
            LeaseStatus::Valid { valid_until, .. }
            | LeaseStatus::Jeopardy { valid_until }
            | LeaseStatus::Expired { valid_until } => Some(valid_until),
            LeaseStatus::Lost => None,
        }
    }

    /// Whether the holder can no longer count on the key.
    pub fn is_over(self) -> bool {
        matches!(self, LeaseStatus::Lost | LeaseStatus::Expired { .. })
    }

    /// Whether `self` and `other` are the same state, whatever their
    /// times: what `changed()` tells is a change of this.
    fn same_state(self, other: LeaseStatus) -> bool {
        match (self, other) {
            (LeaseStatus::Valid { confirmed: a, .. }, LeaseStatus::Valid { confirmed: b, .. }) => {
                a == b
            }
            (a, b) => std::mem::discriminant(&a) == std::mem::discriminant(&b),
        }
    }
}

/// Seconds from now to `at` (negative: past).
pub(crate) fn seconds_from_now(at: Instant) -> f64 {
    let now = Instant::now();
    match at.checked_duration_since(now) {
        Some(ahead) => ahead.as_secs_f64(),
        None => -now.duration_since(at).as_secs_f64(),
    }
}

impl std::fmt::Display for LeaseStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            LeaseStatus::Valid {
                valid_until,
                confirmed,
            } => {
                write!(
                    f,
                    "valid for another {:.1} s",
                    seconds_from_now(valid_until).max(0.0)
                )?;
                match confirmed {
                    true => Ok(()),
                    false => f.write_str(", unconfirmed: no connection to the server"),
                }
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
        let Some(at) = self.valid_until() else {
            return f.write_str(name);
        };
        let mut debug = f.debug_struct(name);
        // An `Instant` says nothing readable by itself: from now.
        debug.field(
            "valid_until",
            &format_args!("{:+.3}s from now", seconds_from_now(at)),
        );
        if let LeaseStatus::Valid { confirmed, .. } = self {
            debug.field("confirmed", confirmed);
        }
        debug.finish()
    }
}

/// What every adapter's held-grant guard (`Lease`) shows: its grant, and
/// where it stands now. A `Lease` derefs to it; a clone is a view that
/// follows the same grant (what a lock builder's `run` hands the work),
/// with no power to release it.
///
/// Its waits take `&self`, so that one task can wait for a change and for
/// a renewal side by side (in a `select!`).
#[derive(Debug)]
pub struct HeldGrant {
    /// `None` once released or left to run out.
    grant: Option<Grant>,
    shared: Arc<Shared>,
    /// The status version the caller has seen.
    seen: AtomicU64,
    /// The renewals the caller has seen.
    seen_renewals: AtomicU64,
}

impl Clone for HeldGrant {
    /// A view that starts from what this one has seen.
    fn clone(&self) -> HeldGrant {
        HeldGrant {
            grant: self.grant.clone(),
            shared: Arc::clone(&self.shared),
            seen: AtomicU64::new(self.seen.load(Ordering::Relaxed)),
            seen_renewals: AtomicU64::new(self.seen_renewals.load(Ordering::Relaxed)),
        }
    }
}

impl HeldGrant {
    /// A guard for `grant`, kept up to date through `shared`.
    pub(crate) fn new(grant: Grant, shared: Arc<Shared>) -> HeldGrant {
        HeldGrant {
            grant: Some(grant),
            shared,
            seen: AtomicU64::new(0),
            seen_renewals: AtomicU64::new(0),
        }
    }

    /// The status version this view has seen: its grant's at least.
    fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed).max(1)
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

    /// Where the grant stands now: valid (confirmed or not), in jeopardy,
    /// lost or expired.
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
    /// (or, the first time, from the grant's), and returns it. A change is
    /// one of state: valid to unconfirmed and back, jeopardy, lost,
    /// expired; a renewal that only moves `valid_until` is not one (see
    /// [`renewed`](HeldGrant::renewed)).
    pub async fn changed(&self) -> LeaseStatus {
        let seen = self.seen();
        std::future::poll_fn(|cx| self.poll_changed_from(seen, cx)).await
    }

    /// Ready with the status once it changed from the last one seen.
    #[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
    pub(crate) fn poll_changed(&self, cx: &Context<'_>) -> Poll<LeaseStatus> {
        self.poll_changed_from(self.seen(), cx)
    }

    fn poll_changed_from(&self, seen: u64, cx: &Context<'_>) -> Poll<LeaseStatus> {
        let (status, version) =
            std::task::ready!(self.shared.poll_until(cx, |state| state.changed(seen)));
        self.seen.fetch_max(version, Ordering::Relaxed);
        Poll::Ready(status)
    }

    /// Blocks until the status changed from the last one the caller saw;
    /// `None` if `timeout` passed first (`None` timeout: no limit).
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn wait_change(&self, timeout: Option<Duration>) -> Option<LeaseStatus> {
        let seen = self.seen();
        let (status, version) = self
            .shared
            .wait_until(timeout, |state| state.changed(seen))?;
        self.seen.fetch_max(version, Ordering::Relaxed);
        Some(status)
    }

    /// Waits until the grant is renewed (a renewal answered after the last
    /// one this returned, or, the first time, after the grant), and
    /// returns its new `valid_until`. `None` once the lease is over (lost
    /// or expired): no renewal will come.
    pub async fn renewed(&self) -> Option<Instant> {
        let seen = self.seen_renewals.load(Ordering::Relaxed);
        std::future::poll_fn(|cx| self.poll_renewed(seen, cx)).await
    }

    /// Ready with the latest renewal's `valid_until` once one came after
    /// `seen`, or with `None` once the lease is over.
    fn poll_renewed(&self, seen: u64, cx: &Context<'_>) -> Poll<Option<Instant>> {
        let (until, renewals) =
            std::task::ready!(self.shared.poll_until(cx, |state| state.renewed(seen)));
        self.seen_renewals.fetch_max(renewals, Ordering::Relaxed);
        Poll::Ready(until)
    }

    /// Blocks until the grant is renewed after the last renewal the caller
    /// saw, with its new `valid_until`, or the lease is over (`Some(None)`);
    /// `None` if `timeout` passed first (`None` timeout: no limit).
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn wait_renewal(&self, timeout: Option<Duration>) -> Option<Option<Instant>> {
        let seen = self.seen_renewals.load(Ordering::Relaxed);
        let (until, renewals) = self
            .shared
            .wait_until(timeout, |state| state.renewed(seen))?;
        self.seen_renewals.fetch_max(renewals, Ordering::Relaxed);
        Some(until)
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

impl crate::runtime::wait::Blocked for State {
    fn blocked(&mut self) -> &mut usize {
        &mut self.blocked
    }
}

struct State {
    status: LeaseStatus,
    /// Bumped at every change of state (not at a renewal that keeps it).
    version: u64,
    /// Bumped at every renewal.
    renewals: u64,
    /// The `valid_until` the latest renewal gave.
    renewed_until: Option<Instant>,
    /// Tasks waiting for a change or a renewal.
    wakers: Vec<Waker>,
    /// Threads waiting for a change on the condition variable (only they
    /// need a notification, which costs a system call).
    blocked: usize,
}

impl State {
    /// The status and its version, if its version is past `seen`.
    fn changed(&self, seen: u64) -> Option<(LeaseStatus, u64)> {
        (self.version > seen).then_some((self.status, self.version))
    }

    /// The latest renewal's `valid_until` and the count of renewals, if
    /// that count is past `seen`; `None` with the count once the lease is
    /// over.
    fn renewed(&self, seen: u64) -> Option<(Option<Instant>, u64)> {
        if self.renewals > seen {
            Some((self.renewed_until, self.renewals))
        } else if self.status.is_over() {
            Some((None, self.renewals))
        } else {
            None
        }
    }
}

impl Shared {
    /// A guard's state before its grant comes, for an acquire that asked
    /// for `asked`.
    pub(crate) fn new(asked: Duration) -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(State {
                status: LeaseStatus::Lost,
                version: 0,
                renewals: 0,
                renewed_until: None,
                wakers: Vec::new(),
                blocked: 0,
            }),
            changed: Condvar::new(),
            asked,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Changes the state under the lock with `update`, then wakes every
    /// waiter (each looks again at what it waits for).
    fn update(&self, update: impl FnOnce(&mut State)) {
        let (wakers, blocked) = {
            let mut state = self.lock();
            update(&mut state);
            (std::mem::take(&mut state.wakers), state.blocked > 0)
        };
        if blocked {
            self.changed.notify_all();
        }
        for waker in wakers {
            waker.wake();
        }
    }

    /// The grant stands at `status` now; its version moves if that is
    /// another state (or the grant's first).
    fn set(&self, status: LeaseStatus) {
        self.update(|state| {
            if state.version == 0 || !state.status.same_state(status) {
                state.version += 1;
            }
            state.status = status;
        });
    }

    /// A renewal made the grant valid until `valid_until`.
    fn renew(&self, valid_until: Instant, confirmed: bool) {
        self.update(|state| {
            let status = LeaseStatus::Valid {
                valid_until,
                confirmed,
            };
            if !state.status.same_state(status) {
                state.version += 1;
            }
            state.status = status;
            state.renewals += 1;
            state.renewed_until = Some(valid_until);
        });
    }

    /// A connection began (`true`) or ended: a valid grant is confirmed,
    /// or unconfirmed, from now on.
    fn confirm(&self, connected: bool) {
        // Only the driver writes: what is read here stays so until the set.
        let status = self.lock().status;
        if let LeaseStatus::Valid {
            valid_until,
            confirmed,
        } = status
        {
            if confirmed != connected {
                self.set(LeaseStatus::Valid {
                    valid_until,
                    confirmed: connected,
                });
            }
        }
    }

    /// The status now, and its version.
    pub(crate) fn status(&self) -> (LeaseStatus, u64) {
        let state = self.lock();
        (state.status, state.version)
    }

    /// Ready with what `found` finds in the state; else `cx` is woken at
    /// the next update.
    fn poll_until<T>(&self, cx: &Context<'_>, found: impl FnOnce(&State) -> Option<T>) -> Poll<T> {
        let mut state = self.lock();
        if let Some(found) = found(&state) {
            return Poll::Ready(found);
        }
        if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Blocks until `found` finds something in the state, or `timeout`
    /// passes (`None`: then).
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    fn wait_until<T>(
        &self,
        timeout: Option<Duration>,
        found: impl Fn(&State) -> Option<T>,
    ) -> Option<T> {
        crate::runtime::wait::wait_on(self.lock(), &self.changed, timeout, found)
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
    /// A server has the client, as the last connection notice said.
    connected: bool,
}

impl Guards {
    pub(crate) fn new(start: Instant) -> Guards {
        Guards {
            start,
            waiting: IdMap::default(),
            held: IdMap::default(),
            connected: false,
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
                // A grant comes over a connection a server welcomed.
                confirmed: self.connected,
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

    /// Copies a notice into the guards it concerns: a renewal notice into
    /// the guard of its grant, if it has one; a connection that a server
    /// took, or that ended, into every valid guard (`connected` is where
    /// the connection stands after the notice).
    pub(crate) fn notice(&mut self, event: &Event, connected: bool) {
        if let Event::Connected { .. } | Event::Closed { .. } = event {
            if connected != self.connected {
                self.connected = connected;
                for shared in self.held.values() {
                    shared.confirm(connected);
                }
            }
            return;
        }
        let (grant, status) = match *event {
            Event::Renewed {
                grant, valid_until, ..
            } => {
                if let Some(shared) = self.held.get(&grant) {
                    shared.renew(self.instant(valid_until), self.connected);
                }
                return;
            }
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
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    /// Counts its wakes.
    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn valid(valid_until: Instant, confirmed: bool) -> LeaseStatus {
        LeaseStatus::Valid {
            valid_until,
            confirmed,
        }
    }

    /// A guard as a grant leaves it: valid, confirmed, until `until`.
    fn granted(until: Instant) -> (Arc<Shared>, Arc<Shared>) {
        let shared = Shared::new(Duration::from_secs(1));
        shared.set(valid(until, true));
        (Arc::clone(&shared), shared)
    }

    /// The version a new guard starts from: its grant's.
    const GRANTED: u64 = 1;

    /// A thread blocked in a wait, with no timeout or with one too long
    /// for an `Instant`, is woken by the change.
    #[test]
    fn a_thread_waiting_for_a_change_is_woken_by_it() {
        for timeout in [None, Some(Duration::MAX)] {
            let (shared, waiting) = granted(Instant::now() + Duration::from_secs(1));
            let (done_tx, done) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                done_tx.send(waiting.wait_until(timeout, |s| s.changed(GRANTED)))
            });
            while shared.lock().blocked == 0 {
                std::thread::yield_now();
            }
            shared.set(LeaseStatus::Lost);
            let woken = done.recv_timeout(Duration::from_secs(10));
            assert_eq!(woken, Ok(Some((LeaseStatus::Lost, 2))), "{timeout:?}");
            assert_eq!(shared.lock().blocked, 0);
        }
    }

    #[test]
    fn a_wait_with_a_timeout_is_none_when_it_passes() {
        let (shared, _) = granted(Instant::now() + Duration::from_secs(1));
        let waited = shared.wait_until(Some(Duration::from_millis(5)), |s| s.changed(GRANTED));
        assert_eq!(waited, None);
    }

    /// Issue 32: a renewal that keeps the grant valid is no change of
    /// state: `changed()` stays quiet and `renewed()` tells it; losing the
    /// connection and getting it back are changes.
    #[test]
    fn a_renewal_is_no_change_but_a_connection_lost_and_back_are() {
        let now = Instant::now();
        let (shared, _) = granted(now + Duration::from_secs(3));
        let seen = GRANTED;
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(Arc::clone(&counter));
        let cx = Context::from_waker(&waker);

        let later = now + Duration::from_secs(4);
        shared.renew(later, true);
        assert_eq!(shared.status(), (valid(later, true), GRANTED), "same state");
        assert!(shared.poll_until(&cx, |s| s.changed(seen)).is_pending());
        let renewed = shared.poll_until(&cx, |s| s.renewed(0));
        assert_eq!(renewed, Poll::Ready((Some(later), 1)));
        assert!(shared.poll_until(&cx, |s| s.renewed(1)).is_pending());

        // The connection ends: unconfirmed at once, and both waits woken.
        let before = counter.0.load(Ordering::SeqCst);
        shared.confirm(false);
        assert_eq!(counter.0.load(Ordering::SeqCst), before + 1, "woken");
        let changed = shared.poll_until(&cx, |s| s.changed(seen));
        assert_eq!(changed, Poll::Ready((valid(later, false), 2)));
        // Told once: confirming what is already so changes nothing.
        shared.confirm(false);
        assert!(shared.poll_until(&cx, |s| s.changed(2)).is_pending());
        assert!(shared.poll_until(&cx, |s| s.renewed(1)).is_pending());

        shared.confirm(true);
        let changed = shared.poll_until(&cx, |s| s.changed(2));
        assert_eq!(changed, Poll::Ready((valid(later, true), 3)));

        // A renewal that ends a jeopardy is a change.
        shared.set(LeaseStatus::Jeopardy { valid_until: later });
        let jeopardy = shared.poll_until(&cx, |s| s.changed(3));
        assert_eq!(
            jeopardy,
            Poll::Ready((LeaseStatus::Jeopardy { valid_until: later }, 4))
        );
        let last = now + Duration::from_secs(5);
        shared.renew(last, true);
        assert_eq!(
            shared.poll_until(&cx, |s| s.changed(4)),
            Poll::Ready((valid(last, true), 5))
        );
        assert_eq!(
            shared.poll_until(&cx, |s| s.renewed(1)),
            Poll::Ready((Some(last), 2))
        );
        // A jeopardy or an end is not confirmed or unconfirmed.
        shared.set(LeaseStatus::Lost);
        shared.confirm(false);
        assert_eq!(shared.status(), (LeaseStatus::Lost, 6));
    }

    /// Once the lease is over no renewal will come: `renewed()` says so
    /// rather than waiting for ever.
    #[test]
    fn a_wait_for_a_renewal_ends_when_the_lease_does() {
        let now = Instant::now();
        let (shared, waiting) = granted(now + Duration::from_secs(1));
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || done_tx.send(waiting.wait_until(None, |s| s.renewed(0))));
        while shared.lock().blocked == 0 {
            std::thread::yield_now();
        }
        shared.set(LeaseStatus::Expired {
            valid_until: now + Duration::from_secs(1),
        });
        let woken = done.recv_timeout(Duration::from_secs(10));
        assert_eq!(woken, Ok(Some((None, 0))));
    }

    /// A client core whose every notice is copied into its guards, as
    /// the shell copies them; answers are written by hand.
    struct Core {
        client: crate::client::Client,
        conn: Option<crate::client::ConnId>,
        guards: Guards,
        connected: bool,
        now: Time,
        /// What the client sent, not yet looked at.
        sent: String,
        granted: Option<Grant>,
    }

    impl Core {
        fn new() -> Core {
            let config = crate::client::Config::new(
                [crate::names::Endpoint::new("a:1").expect("an endpoint")],
                crate::names::Name::new("c1").expect("a name"),
            );
            let client = crate::client::Client::new(config, Time::ZERO).expect("a client");
            let mut core = Core {
                client,
                conn: None,
                guards: Guards::new(Instant::now()),
                connected: false,
                now: Time::ZERO,
                sent: String::new(),
                granted: None,
            };
            core.welcome();
            core
        }

        fn pump(&mut self) {
            loop {
                while let Some(action) = self.client.poll_action() {
                    match action {
                        crate::client::Action::Connect { conn, .. } => self.conn = Some(conn),
                        crate::client::Action::Send { data, .. } => {
                            self.sent.push_str(&String::from_utf8_lossy(&data));
                        }
                        crate::client::Action::Close { .. } => {}
                    }
                }
                let Some(event) = self.client.poll_event() else {
                    return;
                };
                match &event {
                    Event::Outcome { op, outcome } => {
                        self.guards.acquired(*op, outcome);
                        if let Outcome::Granted(grant) = outcome {
                            self.granted = Some(grant.clone());
                        }
                        continue;
                    }
                    Event::Connected { .. } => self.connected = true,
                    Event::Closed { .. } => self.connected = false,
                    _ => {}
                }
                self.guards.notice(&event, self.connected);
            }
        }

        fn at_ms(&mut self, ms: u64) {
            self.now = Time::from_nanos(ms * 1_000_000);
            self.client.handle_timeout(self.now);
            self.pump();
        }

        /// Connects, and the server welcomes the client.
        fn welcome(&mut self) {
            self.pump();
            let conn = self.conn.expect("a connect");
            self.client.handle_connected(self.now, conn);
            self.pump();
            self.answer("W node-1 4\n");
        }

        fn answer(&mut self, line: &str) {
            let conn = self.conn.expect("a connection");
            self.client.handle_bytes(self.now, conn, line.as_bytes());
            self.pump();
        }

        /// The id of the one request sent since last asked, which starts
        /// with `op`.
        fn request(&mut self, op: &str) -> String {
            let sent = std::mem::take(&mut self.sent);
            let line = sent
                .lines()
                .rfind(|l| l.starts_with(op))
                .unwrap_or_else(|| panic!("no {op} in {sent:?}"));
            line.split(' ').nth(1).expect("an id").to_owned()
        }

        /// A guard of `k`, token 7, lease 3 s, renewed automatically,
        /// granted at 0.
        fn lock(&mut self) -> HeldGrant {
            let shared = Shared::new(Duration::from_secs(3));
            let op = self
                .client
                .acquire_renewing(
                    self.now,
                    Key::new("k").expect("a key"),
                    crate::names::Name::new("o").expect("a name"),
                    Duration::ZERO,
                    Duration::from_secs(3),
                    None,
                )
                .expect("an acquire");
            self.guards.expect(op, Arc::clone(&shared));
            self.pump();
            let id = self.request("A ");
            self.answer(&format!("G {id} A k 7 3000 0\n"));
            let grant = self.granted.take().expect("granted");
            HeldGrant::new(grant, shared)
        }
    }

    /// The guard's `changed()` and `renewed()`, as an embedder polls them
    /// side by side in one task (a `select!`), fed by a real core: a
    /// renewal is told by `renewed()` alone; the connection's end and a
    /// server taking the client again by `changed()`.
    #[test]
    fn a_guard_tells_changes_and_renewals_apart() {
        let mut core = Core::new();
        let held = core.lock();
        let start = core.guards.start;
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(held.status(), valid(at(3_000), true));
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        assert!(pin!(held.changed()).poll(&mut cx).is_pending());
        assert!(pin!(held.renewed()).poll(&mut cx).is_pending());
        assert_eq!(held.shared.lock().wakers.len(), 1, "one task, one waker");

        // Renewed a third of the way through: `valid_until` moves, the
        // state does not.
        core.at_ms(1_000);
        let id = core.request("X ");
        core.answer(&format!("G {id} X k 7 3000\n"));
        assert_eq!(counter.0.load(Ordering::SeqCst), 1, "the renewal woke it");
        assert!(pin!(held.changed()).poll(&mut cx).is_pending());
        assert_eq!(
            pin!(held.renewed()).poll(&mut cx),
            Poll::Ready(Some(at(4_000)))
        );
        assert!(pin!(held.renewed()).poll(&mut cx).is_pending());

        // The server goes away: unconfirmed at once.
        core.now = Time::from_nanos(1_100_000_000);
        let conn = core.conn.expect("a connection");
        core.client
            .handle_transport_closed(core.now, conn, crate::client::TransportEnd::Eof);
        core.pump();
        assert_eq!(
            pin!(held.changed()).poll(&mut cx),
            Poll::Ready(valid(at(4_000), false))
        );
        assert_eq!(held.wait_change(Some(Duration::ZERO)), None);
        assert_eq!(held.wait_renewal(Some(Duration::ZERO)), None);

        // A server takes the client again: confirmed.
        let deadline = core.client.poll_timeout().expect("a backoff");
        core.at_ms(deadline.as_nanos() / 1_000_000 + 1);
        core.welcome();
        assert_eq!(
            held.wait_change(Some(Duration::ZERO)),
            Some(valid(at(4_000), true))
        );

        // Unanswered, the renewals leave it in jeopardy, then expired.
        core.at_ms(3_100);
        let jeopardy = held.wait_change(Some(Duration::ZERO));
        assert!(
            matches!(jeopardy, Some(LeaseStatus::Jeopardy { .. })),
            "{jeopardy:?}"
        );
        core.at_ms(4_001);
        let expired = held.wait_change(Some(Duration::ZERO));
        assert!(
            matches!(expired, Some(LeaseStatus::Expired { .. })),
            "{expired:?}"
        );
        assert_eq!(held.wait_renewal(None), Some(None), "no renewal will come");
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
        let valid_text = valid(ten, true).to_string();
        let left = seconds(&valid_text, "valid for another ", " s");
        assert!((9.0..=10.0).contains(&left), "{valid_text}");
        let unconfirmed = valid(ten, false).to_string();
        let left = seconds(
            &unconfirmed,
            "valid for another ",
            " s, unconfirmed: no connection to the server",
        );
        assert!((9.0..=10.0).contains(&left), "{unconfirmed}");
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
        let debug = format!("{:?}", valid(ten, false));
        assert!(debug.starts_with("Valid { valid_until: +"), "{debug}");
        assert!(debug.ends_with("s from now, confirmed: false }"), "{debug}");
        assert!(
            !debug.contains("tv_sec") && !debug.contains("Instant"),
            "{debug}"
        );
        let debug = format!("{:?}", LeaseStatus::Jeopardy { valid_until: ten });
        assert!(debug.ends_with("s from now }"), "{debug}");
        assert_eq!(format!("{:?}", LeaseStatus::Lost), "Lost");
    }
}
