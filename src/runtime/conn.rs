//! Where the client's connection stands, as every adapter's handle shows
//! it: a watch the driver publishes to (from the core's notices, in
//! [`Shell`](super::shell::Shell)) and every handle reads or waits on.
//!
//! No protocol rule lives here: the state is what the core's `Connected`
//! and `Closed` notices said, and when.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::names::{Endpoint, Name};
use crate::runtime::error::ConnectError;
use crate::runtime::lease::seconds_from_now;

/// Where the client's connection stands, as its handle's
/// `connection()` tells it. Its `Display` (and `Debug`) say the times from
/// now: `connected to 127.0.0.1:7878 (node n1) for 12.0 s`,
/// `disconnected for 0.4 s; last attempt: cannot connect to 127.0.0.1:7878:
/// Connection refused (os error 111)`.
#[derive(Clone)]
#[non_exhaustive]
pub enum ConnState {
    /// A server took the client (it accepted the handshake) and the
    /// connection is up: renewals and releases can reach it.
    Connected {
        /// The server's address.
        addr: Endpoint,
        /// Its node id, as it said in its hello.
        node: Name,
        /// When it took the client.
        since: Instant,
    },
    /// No server has the client: it is connecting, or waiting between
    /// rounds of attempts. Held grants are unconfirmed meanwhile
    /// (`LeaseStatus::Valid { confirmed: false, .. }`).
    Disconnected {
        /// When the last connection ended, or when the client started if
        /// no server has taken it yet.
        since: Instant,
        /// How the latest attempt (or connection) ended, if one has since
        /// a server last took the client.
        last_error: Option<ConnectError>,
    },
    /// The client has shut down: it connects no more.
    Stopped,
}

impl ConnState {
    /// Whether a server has the client now.
    pub fn is_connected(&self) -> bool {
        matches!(self, ConnState::Connected { .. })
    }
}

impl std::fmt::Display for ConnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnState::Connected { addr, node, since } => write!(
                f,
                "connected to {addr} (node {node}) for {:.1} s",
                (-seconds_from_now(*since)).max(0.0)
            ),
            ConnState::Disconnected { since, last_error } => {
                write!(
                    f,
                    "disconnected for {:.1} s",
                    (-seconds_from_now(*since)).max(0.0)
                )?;
                match last_error {
                    Some(error) => write!(f, "; last attempt: {error}"),
                    None => Ok(()),
                }
            }
            ConnState::Stopped => f.write_str("stopped"),
        }
    }
}

impl std::fmt::Debug for ConnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // An `Instant` says nothing readable by itself: from now.
        let ago = |at: Instant| format!("{:.3}s ago", -seconds_from_now(at));
        match self {
            ConnState::Connected { addr, node, since } => f
                .debug_struct("Connected")
                .field("addr", addr)
                .field("node", node)
                .field("since", &format_args!("{}", ago(*since)))
                .finish(),
            ConnState::Disconnected { since, last_error } => f
                .debug_struct("Disconnected")
                .field("since", &format_args!("{}", ago(*since)))
                .field("last_error", last_error)
                .finish(),
            ConnState::Stopped => f.write_str("Stopped"),
        }
    }
}

/// The state, written by the driver, read by every handle.
pub(crate) struct Watch {
    state: Mutex<State>,
    /// The state changed (for blocked threads).
    changed: Condvar,
}

impl crate::runtime::wait::Blocked for State {
    fn blocked(&mut self) -> &mut usize {
        &mut self.blocked
    }
}

struct State {
    conn: ConnState,
    /// Bumped at every change.
    version: u64,
    /// Tasks waiting for a change, each under the key of its wait.
    wakers: Vec<(u64, Waker)>,
    next_key: u64,
    /// Threads waiting on the condition variable.
    blocked: usize,
}

impl State {
    /// The state, if it is past `seen` or can change no more.
    fn past(&self, seen: u64) -> Option<(ConnState, u64)> {
        (self.version > seen || matches!(self.conn, ConnState::Stopped))
            .then(|| (self.conn.clone(), self.version))
    }
}

impl Watch {
    /// Disconnected since `start`, the client's start.
    pub(crate) fn new(start: Instant) -> Arc<Watch> {
        Arc::new(Watch {
            state: Mutex::new(State {
                conn: ConnState::Disconnected {
                    since: start,
                    last_error: None,
                },
                version: 0,
                wakers: Vec::new(),
                next_key: 0,
                blocked: 0,
            }),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Publishes `conn`, waking every waiter.
    pub(crate) fn set(&self, conn: ConnState) {
        let (wakers, blocked) = {
            let mut state = self.lock();
            state.conn = conn;
            state.version += 1;
            (std::mem::take(&mut state.wakers), state.blocked > 0)
        };
        if blocked {
            self.changed.notify_all();
        }
        for (_, waker) in wakers {
            waker.wake();
        }
    }

    /// Publishes [`ConnState::Stopped`] unless it is published already.
    pub(crate) fn stop(&self) {
        if !matches!(self.lock().conn, ConnState::Stopped) {
            self.set(ConnState::Stopped);
        }
    }

    /// The state now, and its version.
    pub(crate) fn get(&self) -> (ConnState, u64) {
        let state = self.lock();
        (state.conn.clone(), state.version)
    }

    /// Ready with the state once its version is past `seen` (or it is
    /// `Stopped`); else `cx` is woken at the next change, under `key`.
    fn poll_change(
        &self,
        seen: u64,
        key: &mut Option<u64>,
        cx: &Context<'_>,
    ) -> Poll<(ConnState, u64)> {
        let mut state = self.lock();
        if let Some(found) = state.past(seen) {
            if let Some(key) = key.take() {
                state.wakers.retain(|(k, _)| *k != key);
            }
            return Poll::Ready(found);
        }
        let key = *key.get_or_insert_with(|| {
            state.next_key += 1;
            state.next_key
        });
        match state.wakers.iter_mut().find(|(k, _)| *k == key) {
            Some((_, waker)) if waker.will_wake(cx.waker()) => {}
            Some((_, waker)) => *waker = cx.waker().clone(),
            None => state.wakers.push((key, cx.waker().clone())),
        }
        Poll::Pending
    }

    /// A wait under `key` is given up.
    fn forget(&self, key: u64) {
        self.lock().wakers.retain(|(k, _)| *k != key);
    }

    /// Blocks until the version is past `seen` (or the state is
    /// `Stopped`), or `timeout` passes (`None`: then).
    fn wait_change(&self, seen: u64, timeout: Option<Duration>) -> Option<(ConnState, u64)> {
        crate::runtime::wait::wait_on(self.lock(), &self.changed, timeout, |state| {
            state.past(seen)
        })
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Watch").field(&self.get().0).finish()
    }
}

/// One handle's view of the watch: what it read last. A clone starts from
/// what this one read.
#[derive(Debug)]
pub(crate) struct Observer {
    watch: Arc<Watch>,
    /// The version this handle read last.
    seen: Arc<AtomicU64>,
}

impl Clone for Observer {
    fn clone(&self) -> Observer {
        Observer {
            watch: Arc::clone(&self.watch),
            seen: Arc::new(AtomicU64::new(self.seen.load(Ordering::Relaxed))),
        }
    }
}

impl Observer {
    /// A view of `watch` that has read nothing yet.
    pub(crate) fn new(watch: Arc<Watch>) -> Observer {
        Observer {
            watch,
            seen: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The state now, which counts as read.
    pub(crate) fn now(&self) -> ConnState {
        let (conn, version) = self.watch.get();
        self.seen.fetch_max(version, Ordering::Relaxed);
        conn
    }

    /// Resolves with the state once it differs from the one read last (at
    /// once once it is `Stopped`).
    #[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
    pub(crate) fn changed(&self) -> Changed {
        Changed {
            watch: Arc::clone(&self.watch),
            seen: Arc::clone(&self.seen),
            key: None,
        }
    }

    /// Blocks until the state differs from the one read last (at once
    /// once it is `Stopped`), for at most `timeout` (`None`: no limit);
    /// `None` if that passed first.
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn wait_changed(&self, timeout: Option<Duration>) -> Option<ConnState> {
        let seen = self.seen.load(Ordering::Relaxed);
        let (conn, version) = self.watch.wait_change(seen, timeout)?;
        self.seen.fetch_max(version, Ordering::Relaxed);
        Some(conn)
    }
}

/// The future of [`Observer::changed`]. Dropped before it resolves, it
/// leaves no waker behind.
pub(crate) struct Changed {
    watch: Arc<Watch>,
    seen: Arc<AtomicU64>,
    /// The key of its waker in the watch, once it waits.
    key: Option<u64>,
}

impl std::future::Future for Changed {
    type Output = ConnState;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ConnState> {
        let this = &mut *self;
        let seen = this.seen.load(Ordering::Relaxed);
        let (conn, version) = std::task::ready!(this.watch.poll_change(seen, &mut this.key, cx));
        this.seen.fetch_max(version, Ordering::Relaxed);
        Poll::Ready(conn)
    }
}

impl Drop for Changed {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.watch.forget(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use super::*;
    use crate::client::CloseReason;

    /// Counts its wakes.
    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn connected() -> ConnState {
        ConnState::Connected {
            addr: Endpoint::new("127.0.0.1:7878").expect("an endpoint"),
            node: Name::new("n1").expect("a name"),
            since: Instant::now(),
        }
    }

    fn refused() -> ConnectError {
        ConnectError::new(
            Some(Endpoint::new("127.0.0.1:7878").expect("an endpoint")),
            CloseReason::ConnectFailed,
            None,
        )
    }

    #[test]
    fn a_task_is_woken_by_a_change_and_then_waits_for_the_next() {
        let watch = Watch::new(Instant::now());
        let observer = Observer::new(Arc::clone(&watch));
        assert!(matches!(
            observer.now(),
            ConnState::Disconnected {
                last_error: None,
                ..
            }
        ));
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        let mut changed = pin!(observer.changed());
        assert!(changed.as_mut().poll(&mut cx).is_pending());
        watch.set(connected());
        assert_eq!(counter.0.load(Ordering::SeqCst), 1, "woken once");
        let Poll::Ready(conn) = changed.as_mut().poll(&mut cx) else {
            panic!("ready after the change");
        };
        assert!(conn.is_connected(), "{conn:?}");
        // Read: the next wait is for the next change.
        let mut next = pin!(observer.changed());
        assert!(next.as_mut().poll(&mut cx).is_pending());
        assert!(observer.now().is_connected());
    }

    /// Each handle follows the watch on its own: a change read by one is
    /// still news to another.
    #[test]
    fn every_handle_sees_every_change() {
        let watch = Watch::new(Instant::now());
        let one = Observer::new(Arc::clone(&watch));
        let two = one.clone();
        watch.set(connected());
        assert!(one
            .wait_changed(Some(Duration::ZERO))
            .is_some_and(|c| c.is_connected()));
        assert!(one.wait_changed(Some(Duration::ZERO)).is_none(), "read");
        assert!(two
            .wait_changed(Some(Duration::ZERO))
            .is_some_and(|c| c.is_connected()));
        // A clone starts from what its original read.
        let three = two.clone();
        assert!(three.wait_changed(Some(Duration::ZERO)).is_none());
    }

    #[test]
    fn a_blocked_thread_is_woken_by_the_change_and_a_timeout_is_none() {
        let watch = Watch::new(Instant::now());
        let observer = Observer::new(Arc::clone(&watch));
        assert!(observer
            .wait_changed(Some(Duration::from_millis(5)))
            .is_none());
        for timeout in [None, Some(Duration::MAX)] {
            let waiting = observer.clone();
            let (done_tx, done) = std::sync::mpsc::channel();
            std::thread::spawn(move || done_tx.send(waiting.wait_changed(timeout)));
            while watch.lock().blocked == 0 {
                std::thread::yield_now();
            }
            watch.set(ConnState::Disconnected {
                since: Instant::now(),
                last_error: Some(refused()),
            });
            let woken = done
                .recv_timeout(Duration::from_secs(10))
                .expect("woken by the change");
            assert!(
                matches!(
                    woken,
                    Some(ConnState::Disconnected {
                        last_error: Some(_),
                        ..
                    })
                ),
                "{timeout:?}: {woken:?}"
            );
            assert_eq!(watch.lock().blocked, 0);
            observer.now();
        }
    }

    /// Once stopped, nothing more will change: a wait ends at once.
    #[test]
    fn a_stopped_client_ends_every_wait_at_once() {
        let watch = Watch::new(Instant::now());
        let observer = Observer::new(Arc::clone(&watch));
        watch.stop();
        watch.stop();
        assert_eq!(watch.get().1, 1, "published once");
        assert!(matches!(observer.now(), ConnState::Stopped));
        let again = observer.wait_changed(Some(Duration::from_secs(10)));
        assert!(matches!(again, Some(ConnState::Stopped)), "{again:?}");
        let waker = Waker::from(Arc::new(Counter::default()));
        let mut cx = Context::from_waker(&waker);
        assert!(matches!(
            pin!(observer.changed()).poll(&mut cx),
            Poll::Ready(ConnState::Stopped)
        ));
    }

    /// A wait given up (its future dropped, as in a `select!`) leaves no
    /// waker behind, however often it is given up.
    #[test]
    fn a_dropped_wait_leaves_no_waker() {
        let watch = Watch::new(Instant::now());
        let observer = Observer::new(Arc::clone(&watch));
        for _ in 0..100 {
            let waker = Waker::from(Arc::new(Counter::default()));
            let mut cx = Context::from_waker(&waker);
            let mut changed = pin!(observer.changed());
            assert!(changed.as_mut().poll(&mut cx).is_pending());
            assert!(changed.as_mut().poll(&mut cx).is_pending());
            assert_eq!(watch.lock().wakers.len(), 1);
        }
        assert!(watch.lock().wakers.is_empty());
    }

    #[test]
    fn a_state_says_its_times_from_now() {
        let connected = connected().to_string();
        assert!(
            connected.starts_with("connected to 127.0.0.1:7878 (node n1) for 0."),
            "{connected}"
        );
        let past = Instant::now()
            .checked_sub(Duration::from_secs(2))
            .unwrap_or_else(Instant::now);
        let down = ConnState::Disconnected {
            since: past,
            last_error: Some(refused()),
        };
        let text = down.to_string();
        assert!(text.starts_with("disconnected for 2."), "{text}");
        assert!(
            text.ends_with("; last attempt: cannot connect to 127.0.0.1:7878"),
            "{text}"
        );
        let debug = format!("{down:?}");
        assert!(debug.starts_with("Disconnected { since: 2."), "{debug}");
        assert!(!debug.contains("tv_sec"), "{debug}");
        assert_eq!(ConnState::Stopped.to_string(), "stopped");
    }
}
