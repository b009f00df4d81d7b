//! The driver future: the loop that owns the client core and its
//! connection, takes the handles' requests from the inbox, moves bytes
//! between the transport and the core, and fires the core's timers.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::inbox::Inbox;
use super::{Clock, Dial, Transport};
use crate::client::{ConnId, TransportEnd};
use crate::names::Endpoint;
use crate::runtime::reply;
use crate::runtime::shell::{Command, Io, Shell};
use crate::sync::{lock, register};
use crate::time::Time;

/// How long after handing out outcomes the driver holds back requests, one
/// runtime turn at a time, for the callers it woke to send theirs too.
const BATCH_WAIT: Duration = Duration::from_millis(1);

/// Requests that go out at once even while the driver holds requests back:
/// the server starts on them while the callers still to run write theirs,
/// rather than every caller waiting for the slowest of its wave.
const BATCH_SIZE: usize = 64;

/// Budget of the shutdown that starts when every handle is dropped.
const ORPHANED_SHUTDOWN: Duration = Duration::from_secs(5);

/// The future that owns a client core and its connection. It resolves once
/// the client has shut down: after [`Handle::shutdown`], or once every
/// handle is dropped (a shutdown with a five-second budget). Dropped
/// before that, with work left to finish, it goes on on a thread of its
/// own (see [the driver module's documentation](super)).
///
/// [`Handle::shutdown`]: super::Handle::shutdown
#[must_use = "the driver does nothing unless polled: spawn it"]
pub struct Driver<D: Dial, K: Clock>(Option<Running<D, K>>);

impl<D: Dial, K: Clock> Driver<D, K> {
    /// The driver of the core in `shell`, reading requests from `inbox`
    /// and connecting through `dial`.
    pub(super) fn new(shell: Shell, inbox: Arc<Inbox>, dial: D, start: Instant) -> Self {
        Driver(Some(Running {
            shell,
            inbox,
            taken: Vec::new(),
            handles_alive: true,
            io: DriverIo {
                dial,
                connecting: None,
                stream: None,
                writes: VecDeque::new(),
                written: 0,
                unflushed: false,
            },
            clock: K::new(),
            buf: vec![0; 16 * 1024].into_boxed_slice(),
            delivered_at: start,
            deferred: false,
            unsent: 0,
            expected: 0,
            detached: false,
        }))
    }
}

/// A driver's state.
struct Running<D: Dial, K: Clock> {
    shell: Shell,
    inbox: Arc<Inbox>,
    /// The requests taken from the inbox (kept for its capacity).
    taken: Vec<Command>,
    handles_alive: bool,
    io: DriverIo<D>,
    clock: K,
    buf: Box<[u8]>,
    /// When outcomes were last handed to callers.
    delivered_at: Instant,
    /// `step` deferred to the runtime: return `Pending` at once.
    deferred: bool,
    /// Requests handed to the core while holding back, not yet written.
    unsent: usize,
    /// Outcomes handed to callers, less the requests taken since: how many
    /// woken callers may still be about to send one.
    expected: usize,
    /// It runs on a thread of its own, its first runtime gone.
    detached: bool,
}

type Connecting<T> = Pin<Box<dyn Future<Output = io::Result<T>> + Send>>;

struct DriverIo<D: Dial> {
    dial: D,
    connecting: Option<(ConnId, Connecting<D::Transport>)>,
    stream: Option<(ConnId, D::Transport)>,
    writes: VecDeque<Bytes>,
    /// Bytes of the front write already written.
    written: usize,
    /// Written bytes the stream still holds: flushed on every pass until
    /// it has none.
    unflushed: bool,
}

impl<D: Dial> Io for DriverIo<D> {
    fn connect(&mut self, conn: ConnId, addr: Endpoint) {
        self.connecting = Some((conn, self.dial.dial(addr)));
    }

    fn send(&mut self, conn: ConnId, data: Bytes) {
        if matches!(&self.stream, Some((c, _)) if *c == conn) {
            self.writes.push_back(data);
        }
    }

    fn close(&mut self, conn: ConnId) {
        if matches!(&self.connecting, Some((c, _)) if *c == conn) {
            self.connecting = None;
        }
        if matches!(&self.stream, Some((c, _)) if *c == conn) {
            self.stream = None;
            self.writes.clear();
            self.written = 0;
            self.unflushed = false;
        }
    }
}

impl<D: Dial, K: Clock> Running<D, K> {
    /// One pass over every source of input; `true` if anything happened.
    fn step(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        let mut now = None;
        // What is queued, without asking to be woken: while the driver
        // holds requests back (below), more of them need not wake it.
        let commands = self.take(false, cx, &mut now);
        progress |= commands > 0;
        self.unsent += commands;
        self.expected = self.expected.saturating_sub(commands);
        // Requests came in while callers just woken by outcomes have not
        // all sent theirs yet: let those run first, so that one write
        // carries all their requests (or a full batch of them). The core
        // has not handed out these requests yet (that is the pump's doing),
        // and the next poll does, whatever else comes in. Callers that send
        // nothing soon (they hold their grant for a while, or are gone)
        // stop counting.
        if commands > 0 && self.expected > 0 && self.unsent < BATCH_SIZE {
            if self.delivered_at.elapsed() < BATCH_WAIT {
                self.hold(cx);
                self.deferred = true;
                self.clock.defer(cx);
                return true;
            }
            self.expected = 0;
        }
        // Asks to be woken by the next request (taking any that slipped in).
        let late = self.take(true, cx, &mut now);
        self.unsent = 0;
        progress |= late > 0;
        self.expected = self.expected.saturating_sub(late);
        // Nothing more is read while the notices' reader is behind.
        let reading = !self.shell.notices_full(cx);
        if let Some((conn, stream)) = self.io.stream.as_mut().filter(|_| reading) {
            let conn = *conn;
            if let Poll::Ready(result) = stream.poll_read(cx, &mut self.buf) {
                let now = self.shell.now();
                let client = self.shell.client();
                match result {
                    Ok(0) => client.handle_transport_closed(now, conn, TransportEnd::Eof),
                    Ok(n) => client.handle_bytes(now, conn, &self.buf[..n]),
                    Err(_) => client.handle_transport_closed(now, conn, TransportEnd::Error),
                }
                progress = true;
            }
        }
        let delivered = self.shell.pump(&mut self.io);
        self.delivered(delivered);
        // After the pump: a connect it just started (the first one comes
        // from `Client::new`, with no input to count as progress) must be
        // polled now, or nothing wakes the driver until the connect timeout.
        if let Some((conn, connecting)) = &mut self.io.connecting {
            if let Poll::Ready(result) = connecting.as_mut().poll(cx) {
                let conn = *conn;
                self.io.connecting = None;
                let now = self.shell.now();
                match result {
                    Ok(stream) => {
                        self.io.stream = Some((conn, stream));
                        self.shell.client().handle_connected(now, conn);
                    }
                    Err(e) => self.shell.connect_failed(now, conn, e),
                }
                progress = true;
            }
        }
        progress |= self.write(cx);
        if let Some(at) = self.shell.deadline() {
            if self.clock.poll_until(cx, at).is_ready() {
                // A timer may fire a hair before the clock reads `at`.
                let now = self.shell.now().max(self.shell.time_of(at));
                self.shell.client().handle_timeout(now);
                progress = true;
            }
        }
        progress
    }

    /// Hands the queued requests to the shell; how many there were. With
    /// `listen`, the driver is woken by the next request. Once every
    /// handle is gone, the client shuts down. `now`: the time read for this
    /// pass, if read yet.
    fn take(&mut self, listen: bool, cx: &Context<'_>, now: &mut Option<Time>) -> usize {
        let mut count = 0;
        while self.handles_alive {
            let orphaned = {
                let mut state = lock(&self.inbox.state);
                if listen {
                    state.wake_at = 0;
                }
                // Read under the lock, which the last sender takes after
                // counting itself out: either this sees it gone, or that
                // sender finds the waker registered here.
                let orphaned = self.inbox.senders.load(Ordering::Acquire) == 0;
                if state.commands.is_empty() && listen && !orphaned {
                    register(&mut state.driver, cx);
                }
                std::mem::swap(&mut state.commands, &mut self.taken);
                orphaned
            };
            if self.taken.is_empty() && !orphaned {
                break;
            }
            let now = *now.get_or_insert_with(|| self.shell.now());
            count += self.taken.len();
            for command in self.taken.drain(..) {
                self.shell.command_at(now, command);
            }
            if orphaned {
                self.handles_alive = false;
                let _ = self.shell.client().shutdown(now, ORPHANED_SHUTDOWN);
            }
            if !listen {
                break;
            }
        }
        count
    }

    /// Holds requests back: the driver is woken by the request that
    /// completes the batch, or polled once its worker is idle.
    fn hold(&mut self, cx: &Context<'_>) {
        let batch = self.expected.min(BATCH_SIZE.saturating_sub(self.unsent));
        let mut state = lock(&self.inbox.state);
        state.wake_at = batch.max(1);
        if state.commands.len() >= state.wake_at {
            // The batch came in meanwhile.
            drop(state);
            cx.waker().wake_by_ref();
            return;
        }
        register(&mut state.driver, cx);
    }

    /// Counts `n` outcomes just handed to callers.
    fn delivered(&mut self, n: usize) {
        if n > 0 {
            self.expected += n;
            self.delivered_at = Instant::now();
        }
    }

    /// Writes what is queued, as far as the transport takes it.
    fn write(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((conn, stream)) = &mut self.io.stream else {
            return false;
        };
        let conn = *conn;
        let mut progress = false;
        while let Some(front) = self.io.writes.front() {
            match stream.poll_write(cx, &front[self.io.written..]) {
                Poll::Ready(Ok(n)) if n > 0 => {
                    progress = true;
                    self.io.written += n;
                    if self.io.written == front.len() {
                        self.io.writes.pop_front();
                        self.io.written = 0;
                    }
                }
                Poll::Ready(_) => {
                    let now = self.shell.now();
                    self.shell
                        .client()
                        .handle_transport_closed(now, conn, TransportEnd::Error);
                    return true;
                }
                Poll::Pending => break,
            }
        }
        if progress || self.io.unflushed {
            match stream.poll_flush(cx) {
                Poll::Ready(Ok(())) => self.io.unflushed = false,
                Poll::Ready(Err(_)) => {
                    let now = self.shell.now();
                    self.shell
                        .client()
                        .handle_transport_closed(now, conn, TransportEnd::Error);
                    return true;
                }
                Poll::Pending => self.io.unflushed = true,
            }
        }
        progress
    }
}

impl<D: Dial, K: Clock> Running<D, K> {
    /// The driver is dropped: if its work is done, or it has none worth
    /// finishing, requests are refused from now on; else it goes on on a
    /// thread of its own, and this waits, at most [`EXIT_FLUSH`], until no
    /// release is left to send or to be answered.
    ///
    /// [`EXIT_FLUSH`]: crate::runtime::shell::EXIT_FLUSH
    fn abandon(mut self) {
        // Requests that came in since the last pass reach the core first:
        // a guard dropped just before the runtime went away is released.
        let queued = std::mem::take(&mut lock(&self.inbox.state).commands);
        if !queued.is_empty() && !self.shell.client().is_finished() {
            let now = self.shell.now();
            for command in queued {
                self.shell.command_at(now, command);
            }
        }
        if self.detached || !self.shell.has_work_to_finish() {
            // Requests from now on are refused; those queued end `Stopped`.
            let queued = {
                let mut state = lock(&self.inbox.state);
                state.closed = true;
                state.driver = None;
                std::mem::take(&mut state.commands)
            };
            drop(queued);
            self.inbox.end();
            return;
        }
        // The connection belongs to the runtime that went away: it ends
        // here, and the core goes on from that (its in-flight releases go
        // back to the lane, for the next connection).
        let now = self.shell.now();
        let client = self.shell.client();
        if let Some(conn) = client.connection() {
            client.handle_transport_closed(now, conn, TransportEnd::Error);
        }
        self.io.connecting = None;
        self.io.stream = None;
        self.io.writes.clear();
        self.io.written = 0;
        self.io.unflushed = false;
        // Whoever reads the notices is on that runtime too.
        self.shell.drop_notices();
        let (reply, flushed) = reply::channel();
        self.shell.command_at(now, Command::Flush { reply });
        {
            let mut state = lock(&self.inbox.state);
            state.detached = true;
            state.driver = None;
            state.wake_at = 0;
        }
        self.detached = true;
        self.clock = K::new();
        (self.deferred, self.unsent, self.expected) = (false, 0, 0);
        let inbox = Arc::clone(&self.inbox);
        if K::run_detached(Box::pin(Driver(Some(self)))).is_ok() {
            inbox.wait_detached(|limit| flushed.recv_timeout(limit));
        }
    }
}

impl<D: Dial, K: Clock> Drop for Driver<D, K> {
    fn drop(&mut self) {
        if let Some(running) = self.0.take() {
            running.abandon();
        }
    }
}

impl<D: Dial, K: Clock> Future for Driver<D, K> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(this) = self.get_mut().0.as_mut() else {
            return Poll::Ready(());
        };
        // Bounded, so that a flood of input cannot starve the runtime.
        for _ in 0..64 {
            let progress = this.step(cx);
            if std::mem::take(&mut this.deferred) {
                return Poll::Pending;
            }
            let delivered = this.shell.pump(&mut this.io);
            this.delivered(delivered);
            if this.shell.is_done() {
                return Poll::Ready(());
            }
            if !progress {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
