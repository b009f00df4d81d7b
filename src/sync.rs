//! Two small things the client runtime and the server host both need, so
//! that neither imports the other's.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Waker};

/// Locks a mutex whose holders never leave its data half-changed: a
/// panic while holding it (which the crate never lets happen on purpose)
/// does not poison it for everyone after.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps `cx`'s waker in `slot`, cloning it only if it is a new one.
pub(crate) fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        *slot = Some(cx.waker().clone());
    }
}
