//! A bounded queue of notices (the events that are not outcomes) from a
//! driver to whoever reads them, and what the shell does when it is full.
//! Every adapter hands its notices out this one way: a receiver, read with
//! `recv().await` (`Notices`) or with a blocking `recv()`
//! (`BlockingNotices`, the blocking adapter's `Notices`).
//!
//! A server that floods the client with frames that each make a notice
//! must not grow the client without bound. The queue holds at most
//! [`CAPACITY`] notices; when it is full, the shell keeps the few that one
//! read of the socket made, and the driver reads nothing more from the
//! server until the reader makes room. So a slow reader slows the
//! connection down, as TCP would, and nothing is dropped. Outcomes never go
//! through this queue: they go to their callers' reply slots.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::client::Event;
use crate::sync::register;

/// How many notices wait unread before the driver stops reading.
pub const CAPACITY: usize = 1024;

struct Shared {
    state: Mutex<State>,
    /// A notice came, or the driver went away (for blocking readers).
    arrived: Condvar,
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
    /// A thread waits for a notice on the condition variable.
    blocked: bool,
    /// The driver, waiting for room.
    driver: Option<Waker>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing is ever left half-changed under this lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes whoever reads.
    fn wake_reader(&self, state: &mut State) {
        if let Some(reader) = state.reader.take() {
            reader.wake();
        }
        if state.blocked {
            self.arrived.notify_all();
        }
    }
}

/// A new queue: the driver's end and the reader's.
pub(crate) fn channel() -> (Sender, Notices) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        arrived: Condvar::new(),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Notices { shared },
    )
}

/// The notices of a client: connecting, connected, closed (with why),
/// hints, backoff, misconfigured, renewals, orphan releases, shutdown
/// complete. Read them, or drop this: while [`CAPACITY`] of them wait
/// unread, the client reads nothing more from the server (its outcomes
/// wait too). Once it is dropped, notices are not kept.
pub struct Notices {
    shared: Arc<Shared>,
}

#[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
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

    /// The same queue, read by blocking calls.
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn blocking(self) -> BlockingNotices {
        BlockingNotices(self)
    }
}

/// The notices of a client, read by blocking calls: the blocking
/// adapter's `Notices`. The same queue as the async adapters' `Notices`,
/// with the same bound.
pub struct BlockingNotices(Notices);

#[cfg_attr(not(feature = "blocking"), allow(dead_code))]
impl BlockingNotices {
    /// Blocks until the next notice; `None` once the client has stopped
    /// and every notice was read.
    pub fn recv(&mut self) -> Option<Event> {
        self.wait(None).ok()
    }

    /// Blocks until the next notice, or until `timeout` passes
    /// ([`RecvTimeoutError::Timeout`]) or the client has stopped and every
    /// notice was read ([`RecvTimeoutError::Disconnected`]).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Event, RecvTimeoutError> {
        self.wait(Some(timeout))
    }

    /// A notice waiting now, if any.
    pub fn try_recv(&mut self) -> Option<Event> {
        self.0.try_recv()
    }

    /// How many notices wait unread.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no notice waits.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<Event, RecvTimeoutError> {
        let shared = &self.0.shared;
        // A timeout past what an `Instant` can hold is no timeout.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut state = shared.lock();
        loop {
            if let Some(event) = take(&mut state) {
                return Ok(event);
            }
            if state.driver_gone {
                return Err(RecvTimeoutError::Disconnected);
            }
            state.blocked = true;
            state = match deadline {
                None => shared
                    .arrived
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        state.blocked = false;
                        return Err(RecvTimeoutError::Timeout);
                    }
                    shared
                        .arrived
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            state.blocked = false;
        }
    }
}

impl std::fmt::Debug for BlockingNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notices")
            .field("waiting", &self.len())
            .finish()
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
        self.shared.wake_reader(&mut state);
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
        self.shared.wake_reader(&mut state);
    }
}

/// Hands on the held notices that fit; whether some are still held (`cx`
/// is then woken when there is room).
fn hand_on(sender: &Sender, held: &mut VecDeque<Event>, cx: &Context<'_>) -> bool {
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

/// Where the shell's notices go.
pub(crate) enum Sink {
    /// Nowhere (with the feature `tracing`, they are still traced).
    Nowhere,
    /// Into a bounded queue; what does not fit waits in `held`.
    Queue {
        sender: Sender,
        held: VecDeque<Event>,
    },
}

impl Sink {
    /// A sink into a new queue, and the queue's reader.
    pub(crate) fn queue() -> (Sink, Notices) {
        let (sender, notices) = channel();
        let sink = Sink::Queue {
            sender,
            held: VecDeque::new(),
        };
        (sink, notices)
    }

    /// Hands `event` on, or holds it while the queue is full.
    pub(crate) fn notify(&mut self, event: Event) {
        match self {
            Sink::Nowhere => {}
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
    pub(crate) fn is_full(&mut self, cx: &Context<'_>) -> bool {
        match self {
            Sink::Queue { sender, held } => hand_on(sender, held, cx),
            Sink::Nowhere => false,
        }
    }

    /// How many notices are held back, beyond the queue.
    #[cfg(test)]
    fn held(&self) -> usize {
        match self {
            Sink::Queue { held, .. } => held.len(),
            Sink::Nowhere => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Endpoint;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

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

    #[test]
    fn a_blocking_reader_is_woken_by_a_notice_and_by_the_end() {
        let (sender, notices) = channel();
        let mut notices = notices.blocking();
        assert_eq!(
            notices.recv_timeout(Duration::from_millis(5)),
            Err(RecvTimeoutError::Timeout)
        );
        let reader = std::thread::spawn(move || (notices.recv(), notices.recv()));
        sender.offer(notice(7)).unwrap();
        drop(sender);
        assert_eq!(reader.join().unwrap(), (Some(notice(7)), None));
    }
}
