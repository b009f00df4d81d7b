//! Where the handles leave their requests for the driver, and how the
//! driver's end reaches those who wait for it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::Waker;
use std::time::Duration;

use crate::runtime::shell::{Command, EXIT_FLUSH};
use crate::sync::lock;

/// Where the handles leave their requests for the driver: one queue behind
/// a lock, which the driver swaps for an empty one, so that a request costs
/// no allocation of its own and a batch of them one wake of the driver.
pub(super) struct Inbox {
    pub(super) state: Mutex<InboxState>,
    /// Handles, acquire futures and cancellers alive: at 0 the driver shuts
    /// the client down.
    pub(super) senders: AtomicUsize,
    /// The driver has ended (set once, for those who wait for a detached
    /// driver's end).
    ended: Mutex<bool>,
    ended_now: Condvar,
    /// A wait for a detached driver ran out: the later ones do not wait.
    stalled: AtomicBool,
}

pub(super) struct InboxState {
    pub(super) commands: Vec<Command>,
    /// The driver's waker, while it wants to be woken by a request. Taken
    /// by the request that wakes it.
    pub(super) driver: Option<Waker>,
    /// How many requests must be queued for one to wake the driver: 0
    /// (any) unless the driver holds requests back, when only the request
    /// that completes the batch it waits for wakes it.
    pub(super) wake_at: usize,
    /// The driver is gone: requests are refused.
    pub(super) closed: bool,
    /// The driver's runtime went away and it goes on on a thread of its
    /// own: a guard or the last handle dropped now waits for its work.
    pub(super) detached: bool,
}

impl Inbox {
    /// An empty inbox, with one sender counted: the first handle's.
    pub(super) fn new() -> Arc<Inbox> {
        Arc::new(Inbox {
            state: Mutex::new(InboxState {
                commands: Vec::new(),
                driver: None,
                wake_at: 0,
                closed: false,
                detached: false,
            }),
            senders: AtomicUsize::new(1),
            ended: Mutex::new(false),
            ended_now: Condvar::new(),
            stalled: AtomicBool::new(false),
        })
    }

    /// Waits at most [`EXIT_FLUSH`] for `done` (for a detached driver's
    /// work); unless a wait already ran out.
    pub(super) fn wait_detached<T>(&self, done: impl FnOnce(Duration) -> Option<T>) {
        if self.stalled.load(Ordering::Relaxed) {
            return;
        }
        if done(EXIT_FLUSH).is_none() {
            self.stalled.store(true, Ordering::Relaxed);
        }
    }

    /// The driver has ended.
    pub(super) fn end(&self) {
        *lock(&self.ended) = true;
        self.ended_now.notify_all();
    }

    /// Blocks until the driver has ended, at most `limit`; `None` if it
    /// has not.
    fn wait_end(&self, limit: Duration) -> Option<()> {
        let ended = lock(&self.ended);
        let (ended, _) = self
            .ended_now
            .wait_timeout_while(ended, limit, |ended| !*ended)
            .unwrap_or_else(PoisonError::into_inner);
        ended.then_some(())
    }
}

/// One sender of requests (a handle, an acquire future or a canceller).
#[derive(Debug)]
pub(super) struct Sender(pub(super) Arc<Inbox>);

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("senders", &self.senders.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Sender {
    /// Queues `command` for the driver (`Err`: the driver is gone).
    pub(super) fn send(&self, command: Command) -> Result<(), Command> {
        let mut command = Some(command);
        self.send_with(|_| command.take().expect("made once"))
            .map(drop)
            .map_err(|()| command.take().expect("not made"))
    }

    /// Queues the command `make` makes, told whether the driver goes on on
    /// a thread of its own (under the lock that queues it, so that this
    /// holds when the driver takes it); whether it does (`Err`: the driver
    /// is gone, and `make` was not called).
    pub(super) fn send_with(&self, make: impl FnOnce(bool) -> Command) -> Result<bool, ()> {
        let (waker, detached) = {
            let mut state = lock(&self.0.state);
            if state.closed {
                return Err(());
            }
            let command = make(state.detached);
            state.commands.push(command);
            let waker = match state.commands.len() >= state.wake_at {
                true => state.driver.take(),
                false => None,
            };
            (waker, state.detached)
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(detached)
    }
}

impl Clone for Sender {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::Relaxed);
        Sender(Arc::clone(&self.0))
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last one: the driver shuts the client down.
            let (waker, detached) = {
                let mut state = lock(&self.0.state);
                (state.driver.take(), state.detached)
            };
            if let Some(waker) = waker {
                waker.wake();
            }
            if detached {
                self.0.wait_detached(|limit| self.0.wait_end(limit));
            }
        }
    }
}
