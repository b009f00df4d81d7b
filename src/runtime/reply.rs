//! The one-value reply channel between a driver and the caller waiting for
//! an operation's result, shared by every adapter: an async caller polls
//! it, a blocking caller waits on it.
//!
//! Unlike a channel, the caller can give it up and, in the same step, get
//! back a value already sent: a grant that reached an acquire just as its
//! caller went away is then handed back to the core, which releases it by
//! its exact token, and is never lost between "sent" and "dropped".

use crate::sync::register;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

struct Slot<T> {
    state: Mutex<State<T>>,
    /// The value came, or it never will (for blocking callers).
    changed: Condvar,
}

enum State<T> {
    /// Nothing yet: the waker of the task waiting for it, if any, and
    /// whether a thread waits for it on the condition variable (only then
    /// is there a thread to notify: a notification costs a system call
    /// whether anyone waits or not).
    Waiting(Option<Waker>, bool),
    Ready(T),
    /// No value will be taken any more: it was taken, given up, or the
    /// driver dropped its end without sending.
    Closed,
}

impl<T> Slot<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing is ever left half-changed under this lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends the wait: `next` replaces a waiting state, and whoever waits
    /// is woken. `false` if nobody was waiting any more.
    fn settle(&self, next: State<T>) -> Result<(), State<T>> {
        let (waker, blocked) = {
            let mut state = self.lock();
            let State::Waiting(waker, blocked) = &mut *state else {
                return Err(next);
            };
            let woken = (waker.take(), *blocked);
            *state = next;
            woken
        };
        if blocked {
            self.changed.notify_all();
        }
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> State<T> {
    /// Closes the slot, handing back a value it held.
    fn close(&mut self) -> Option<T> {
        match std::mem::replace(self, State::Closed) {
            State::Ready(value) => Some(value),
            State::Waiting(..) | State::Closed => None,
        }
    }
}

/// A new channel: the driver's end and the caller's.
pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State::Waiting(None, false)),
        changed: Condvar::new(),
    });
    (Sender(Some(Arc::clone(&slot))), Receiver(slot))
}

/// The driver's end.
pub(crate) struct Sender<T>(Option<Arc<Slot<T>>>);

impl<T> Sender<T> {
    /// Hands `value` to the caller; it comes back if the caller gave up.
    pub(crate) fn send(mut self, value: T) -> Result<(), T> {
        let Some(slot) = self.0.take() else {
            return Err(value);
        };
        slot.settle(State::Ready(value))
            .map_err(|state| match state {
                State::Ready(value) => value,
                _ => unreachable!("handed in as Ready"),
            })
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            // A caller still waiting learns that no value will come.
            let _ = slot.settle(State::Closed);
        }
    }
}

/// The caller's end.
pub(crate) struct Receiver<T>(Arc<Slot<T>>);

impl<T> Receiver<T> {
    /// The value once sent, `None` if it never will be (for async callers).
    #[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
    pub(crate) fn poll(&self, cx: &Context<'_>) -> Poll<Option<T>> {
        let mut state = self.0.lock();
        match &mut *state {
            State::Waiting(waker, _) => {
                register(waker, cx);
                Poll::Pending
            }
            _ => Poll::Ready(state.close()),
        }
    }

    /// Blocks until the value comes (`None`: it never will).
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn recv(&self) -> Option<T> {
        let mut state = self.0.lock();
        while let State::Waiting(_, blocked) = &mut *state {
            *blocked = true;
            state = self
                .0
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.close()
    }

    /// Blocks until the value comes (`Some(None)`: it never will), or
    /// until `timeout` passes (`None`).
    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Option<Option<T>> {
        // A timeout past what an `Instant` can hold is no timeout.
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.0.lock();
        while let State::Waiting(_, blocked) = &mut *state {
            *blocked = true;
            state = match deadline {
                None => self
                    .0
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.0
                        .changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
        Some(state.close())
    }

    /// The value if it came, `Some(None)` if it never will, `None` if it
    /// may still come.
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn try_recv(&self) -> Option<Option<T>> {
        let mut state = self.0.lock();
        match *state {
            State::Waiting(..) => None,
            _ => Some(state.close()),
        }
    }

    /// Gives the value up: from now on the driver's send fails (and the
    /// driver hands a grant back to the core); a value already sent is
    /// returned.
    pub(crate) fn abandon(&self) -> Option<T> {
        self.0.lock().close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_sent_value_wakes_the_waiting_task_and_is_taken_once() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let cx = Context::from_waker(&waker);
        let (tx, rx) = channel();
        assert_eq!(rx.poll(&cx), Poll::Pending);
        assert_eq!(tx.send(7), Ok(()));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(rx.poll(&cx), Poll::Ready(Some(7)));
        assert_eq!(rx.poll(&cx), Poll::Ready(None));
    }

    #[test]
    fn a_dropped_sender_wakes_the_caller_with_nothing() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let (tx, rx) = channel::<u8>();
        assert_eq!(rx.poll(&Context::from_waker(&waker)), Poll::Pending);
        drop(tx);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(rx.try_recv(), Some(None));
        let (tx, rx) = channel::<u8>();
        let waiter = std::thread::spawn(move || rx.recv());
        drop(tx);
        assert_eq!(waiter.join().unwrap(), None);
    }

    #[test]
    fn giving_up_hands_back_a_value_already_sent_and_refuses_later_ones() {
        let (tx, rx) = channel();
        assert_eq!(rx.try_recv(), None);
        tx.send("grant").unwrap();
        assert_eq!(rx.abandon(), Some("grant"));
        let (tx, rx) = channel();
        assert_eq!(rx.abandon(), None);
        assert_eq!(tx.send("grant"), Err("grant"));
    }

    /// Waits until a thread blocks on `rx`'s condition variable.
    fn until_blocked<T>(rx: &Receiver<T>) {
        while !matches!(*rx.0.lock(), State::Waiting(_, true)) {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_caller_blocked_before_the_value_comes_is_woken_by_it() {
        let (tx, rx) = channel();
        let rx = Arc::new(rx);
        let (done_tx, done) = std::sync::mpsc::channel();
        let waiting = Arc::clone(&rx);
        std::thread::spawn(move || done_tx.send(waiting.recv()));
        until_blocked(&rx);
        assert_eq!(tx.send(7), Ok(()));
        let woken = done.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(woken, Ok(Some(7)), "the blocked caller was notified");
    }

    #[test]
    fn a_wait_with_a_timeout_ends_with_the_value_or_without_it() {
        let (tx, rx) = channel::<u8>();
        assert_eq!(rx.recv_timeout(std::time::Duration::from_millis(5)), None);
        tx.send(3).unwrap();
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Some(Some(3))
        );
        let (tx, rx) = channel::<u8>();
        drop(tx);
        assert_eq!(rx.recv_timeout(std::time::Duration::MAX), Some(None));
    }

    #[test]
    fn a_blocking_caller_gets_a_value_sent_from_another_thread() {
        let (tx, rx) = channel();
        let sender = std::thread::spawn(move || tx.send(42));
        assert_eq!(rx.recv(), Some(42));
        assert_eq!(sender.join().unwrap(), Ok(()));
    }
}
