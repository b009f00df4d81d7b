//! A bounded queue of notices (the events that are not outcomes) from a
//! driver to whoever reads them, and what the shell does when it is full.
//!
//! A server that floods the client with frames that each make a notice
//! must not grow the client without bound. The queue holds at most
//! [`CAPACITY`] notices; when it is full, the shell keeps the few that one
//! read of the socket made, and the driver reads nothing more from the
//! server until the reader makes room. So a slow reader slows the
//! connection down, as TCP would, and nothing is dropped. Outcomes never go
//! through this queue: they go to their callers' reply slots.

#[cfg(feature = "tokio")]
use std::collections::VecDeque;
use std::task::Context;

use crate::client::Event;

/// The bounded queue of the tokio adapter's notices.
#[cfg(feature = "tokio")]
mod queue {
    use std::collections::VecDeque;
    use std::future::poll_fn;
    use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
    use std::task::{Context, Poll, Waker};

    use crate::adapters::reply::register;
    use crate::client::Event;

    /// How many notices wait unread before the driver stops reading.
    pub const CAPACITY: usize = 1024;

    struct Shared {
        state: Mutex<State>,
    }

    #[derive(Default)]
    struct State {
        queue: VecDeque<Event>,
        /// The reader went away: notices are dropped from now on.
        reader_gone: bool,
        /// The driver went away: no notice will come any more.
        driver_gone: bool,
        /// The reader, waiting for a notice.
        reader: Option<Waker>,
        /// The driver, waiting for room.
        driver: Option<Waker>,
    }

    impl Shared {
        fn lock(&self) -> MutexGuard<'_, State> {
            // Nothing is ever left half-changed under this lock.
            self.state.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// A new queue: the driver's end and the reader's.
    pub(crate) fn channel() -> (Sender, Notices) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
        });
        (
            Sender {
                shared: Arc::clone(&shared),
            },
            Notices { shared },
        )
    }

    /// The notices of a client: connected, closed, hints, backoff, orphan
    /// releases, shutdown complete. Read them, or drop this: while
    /// [`CAPACITY`] of them wait unread, the client reads nothing more from
    /// the server (its outcomes wait too). Once it is dropped, notices are
    /// not kept.
    pub struct Notices {
        shared: Arc<Shared>,
    }

    impl Notices {
        /// The next notice; `None` once the client has stopped and every
        /// notice was read.
        pub async fn recv(&mut self) -> Option<Event> {
            poll_fn(|cx| self.poll_recv(cx)).await
        }

        /// The next notice, if one is there: `Ready(None)` once the client has
        /// stopped and every notice was read.
        pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
            let mut state = self.shared.lock();
            match take(&mut state) {
                Some(event) => Poll::Ready(Some(event)),
                None if state.driver_gone => Poll::Ready(None),
                None => {
                    register(&mut state.reader, cx);
                    Poll::Pending
                }
            }
        }

        /// A notice waiting now, if any.
        pub fn try_recv(&mut self) -> Option<Event> {
            take(&mut self.shared.lock())
        }

        /// How many notices wait unread.
        pub fn len(&self) -> usize {
            self.shared.lock().queue.len()
        }

        /// Whether no notice waits.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }
    }

    /// Takes the first notice, waking a driver that waits for room.
    fn take(state: &mut State) -> Option<Event> {
        let event = state.queue.pop_front()?;
        if state.queue.len() < CAPACITY {
            if let Some(driver) = state.driver.take() {
                driver.wake();
            }
        }
        Some(event)
    }

    impl Drop for Notices {
        fn drop(&mut self) {
            let mut state = self.shared.lock();
            state.reader_gone = true;
            state.queue = VecDeque::new();
            if let Some(driver) = state.driver.take() {
                driver.wake();
            }
        }
    }

    impl std::fmt::Debug for Notices {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Notices")
                .field("waiting", &self.len())
                .finish()
        }
    }

    /// The driver's end.
    pub(crate) struct Sender {
        shared: Arc<Shared>,
    }

    impl Sender {
        /// Queues `event`, unless the queue is full (it comes back).
        pub(crate) fn offer(&self, event: Event) -> Result<(), Event> {
            let mut state = self.shared.lock();
            if state.reader_gone {
                return Ok(());
            }
            if state.queue.len() >= CAPACITY {
                return Err(event);
            }
            state.queue.push_back(event);
            if let Some(reader) = state.reader.take() {
                reader.wake();
            }
            Ok(())
        }

        /// Ready when there is room; else `cx` is woken when there is.
        fn poll_room(&self, cx: &Context<'_>) -> Poll<()> {
            let mut state = self.shared.lock();
            if state.reader_gone || state.queue.len() < CAPACITY {
                return Poll::Ready(());
            }
            register(&mut state.driver, cx);
            Poll::Pending
        }
    }

    impl Drop for Sender {
        fn drop(&mut self) {
            let mut state = self.shared.lock();
            state.driver_gone = true;
            if let Some(reader) = state.reader.take() {
                reader.wake();
            }
        }
    }

    /// Hands on the held notices that fit; whether some are still held (`cx`
    /// is then woken when there is room).
    pub(crate) fn hand_on(sender: &Sender, held: &mut VecDeque<Event>, cx: &Context<'_>) -> bool {
        loop {
            while let Some(event) = held.pop_front() {
                if let Err(event) = sender.offer(event) {
                    held.push_front(event);
                    break;
                }
            }
            if held.is_empty() {
                return false;
            }
            // Room made between the offer and now is seen here.
            if sender.poll_room(cx).is_pending() {
                return true;
            }
        }
    }
}

#[cfg(feature = "tokio")]
pub(crate) use queue::{channel, hand_on, Sender};
#[cfg(feature = "tokio")]
pub use queue::{Notices, CAPACITY};

/// Where the shell's notices go.
pub(crate) enum Sink {
    /// Nowhere.
    Nowhere,
    /// To a function, called on the driver (which waits while it runs).
    #[cfg_attr(
        not(any(feature = "futures-io", feature = "blocking")),
        allow(dead_code)
    )]
    Call(Box<dyn FnMut(Event) + Send>),
    /// Into a bounded queue; what does not fit waits in `held`.
    #[cfg(feature = "tokio")]
    Queue {
        sender: Sender,
        held: VecDeque<Event>,
    },
}

impl Sink {
    /// Hands `event` on, or holds it while the queue is full.
    pub(crate) fn notify(&mut self, event: Event) {
        match self {
            Sink::Nowhere => {}
            Sink::Call(call) => call(event),
            #[cfg(feature = "tokio")]
            Sink::Queue { sender, held } => {
                if !held.is_empty() {
                    held.push_back(event);
                } else if let Err(event) = sender.offer(event) {
                    held.push_back(event);
                }
            }
        }
    }

    /// Whether notices are held because the reader is behind: the driver
    /// then reads no more input, and `cx` is woken when there is room.
    /// Hands on what now fits.
    #[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
    #[cfg_attr(not(feature = "tokio"), allow(unused_variables))]
    pub(crate) fn is_full(&mut self, cx: &Context<'_>) -> bool {
        match self {
            #[cfg(feature = "tokio")]
            Sink::Queue { sender, held } => hand_on(sender, held, cx),
            _ => false,
        }
    }

    /// How many notices are held back, beyond the queue.
    #[cfg(test)]
    fn held(&self) -> usize {
        match self {
            #[cfg(feature = "tokio")]
            Sink::Queue { held, .. } => held.len(),
            _ => 0,
        }
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::*;
    use crate::names::Endpoint;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use std::task::{Poll, Waker};

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn notice(n: usize) -> Event {
        Event::HintIgnored {
            addr: Endpoint::new(format!("h:{n}")).unwrap(),
        }
    }

    #[test]
    fn a_full_queue_holds_notices_back_and_stops_the_driver_until_there_is_room() {
        let (sender, mut notices) = channel();
        let mut sink = Sink::Queue {
            sender,
            held: VecDeque::new(),
        };
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&woken));
        let cx = Context::from_waker(&waker);
        for n in 0..CAPACITY + 10 {
            sink.notify(notice(n));
        }
        assert_eq!((notices.len(), sink.held()), (CAPACITY, 10));
        assert!(sink.is_full(&cx));
        // Reading one makes room for one, and wakes the driver.
        assert_eq!(notices.try_recv(), Some(notice(0)));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(sink.is_full(&cx));
        assert_eq!((notices.len(), sink.held()), (CAPACITY, 9));
        // Nothing is lost, and the order holds.
        for n in 1..CAPACITY + 10 {
            assert_eq!(notices.try_recv(), Some(notice(n)));
            sink.is_full(&cx);
        }
        assert!(!sink.is_full(&cx));
        assert_eq!(notices.try_recv(), None);
    }

    #[test]
    fn a_dropped_reader_lets_the_driver_go_on_and_keeps_nothing() {
        let (sender, notices) = channel();
        let mut sink = Sink::Queue {
            sender,
            held: VecDeque::new(),
        };
        for n in 0..CAPACITY + 1 {
            sink.notify(notice(n));
        }
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        assert!(sink.is_full(&Context::from_waker(&waker)));
        drop(notices);
        assert!(!sink.is_full(&Context::from_waker(&waker)));
        sink.notify(notice(0));
        assert_eq!(sink.held(), 0);
    }

    #[test]
    fn the_reader_sees_the_end_once_the_driver_is_gone() {
        let (sender, mut notices) = channel();
        sender.offer(notice(1)).unwrap();
        drop(sender);
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(notices.poll_recv(&mut cx), Poll::Ready(Some(notice(1))));
        assert_eq!(notices.poll_recv(&mut cx), Poll::Ready(None));
    }
}
