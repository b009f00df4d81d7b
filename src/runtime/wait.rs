//! A thread's wait for a change of the state a driver publishes (a guard's
//! status, the connection's): the blocking adapter's side of the watches
//! in `lease.rs` and `conn.rs`. It reads the clock, so it lives here, in
//! the runtime, and never in a core.

use std::sync::{Condvar, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A state that threads wait on with a condition variable: it counts them,
/// so that a change costs the system call that wakes them only when one
/// waits.
pub(crate) trait Blocked {
    /// How many threads wait now.
    fn blocked(&mut self) -> &mut usize;
}

/// Blocks on `changed` until `found` finds something in the state `guard`
/// holds, or `timeout` passes (`None` then; a `None` timeout, or one too
/// long for an `Instant`, is no limit).
#[cfg_attr(not(feature = "blocking"), allow(dead_code))]
pub(crate) fn wait_on<S: Blocked, T>(
    mut guard: MutexGuard<'_, S>,
    changed: &Condvar,
    timeout: Option<Duration>,
    found: impl Fn(&S) -> Option<T>,
) -> Option<T> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        if let Some(found) = found(&guard) {
            return Some(found);
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|left| left.is_zero()) {
            return None;
        }
        *guard.blocked() += 1;
        guard = match left {
            None => changed.wait(guard).unwrap_or_else(PoisonError::into_inner),
            Some(left) => {
                changed
                    .wait_timeout(guard, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
        *guard.blocked() -= 1;
    }
}
