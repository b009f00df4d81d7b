//! The real-TCP scenarios of `tests/tcp/mod.rs` on the blocking adapter.
//!
//! The scenarios are async so that they can be written once; here every
//! blocking call runs on a thread of its own and the scenario awaits its
//! result, so that a call that hangs still meets the scenario's timeouts.
//! A spawned task is a thread; the executor is a thread that parks.

mod tcp;

use std::future::Future;
use std::pin::pin;
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use ticketing::blocking::{
    AcquireError, Connector, Handle, Lease, PendingAcquire, RequestError, TcpConnector,
};
use ticketing::client::{Config, Grant, Outcome};
use ticketing::{Key, Name};

struct Blocking;

/// Runs `f` on a new thread; the future is its result.
fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> impl Future<Output = T> + Send + 'static {
    let (tx, rx) = tokio::sync::oneshot::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    async move { rx.await.expect("the thread ran to its end") }
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

impl tcp::Adapter for Blocking {
    const NAME: &'static str = "blocking";
    type Client = Handle;
    type Pending = PendingAcquire;

    fn block_on<T>(fut: impl Future<Output = T>) -> T {
        let mut fut = pin!(fut);
        let waker = Waker::from(Arc::new(Unpark(thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(value) = fut.as_mut().poll(&mut cx) {
                return value;
            }
            thread::park();
        }
    }

    fn spawn<T: Send + 'static>(
        fut: impl Future<Output = T> + Send + 'static,
    ) -> impl Future<Output = T> + Send + 'static {
        off_thread(move || Self::block_on(fut))
    }

    fn sleep(d: Duration) -> impl Future<Output = ()> + Send + 'static {
        // Dropping the future (a timeout that did not fire) ends the thread.
        let (cancel, cancelled) = mpsc::channel::<()>();
        let done = off_thread(move || {
            let _ = cancelled.recv_timeout(d);
        });
        async move {
            done.await;
            drop(cancel);
        }
    }

    fn connect(config: Config) -> (Handle, tcp::NoticeRx) {
        start(config, TcpConnector)
    }

    #[cfg(feature = "tls")]
    fn connect_tls(config: Config, tls: ticketing::tls::ClientTls) -> (Handle, tcp::NoticeRx) {
        start(config, ticketing::blocking::TlsConnector::new(tls))
    }

    fn acquire(
        client: &Handle,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> impl Future<Output = Result<Grant, AcquireError>> + Send + 'static {
        let client = client.clone();
        off_thread(move || {
            client
                .acquire(key)
                .owner(owner)
                .wait(wait)
                .lease(lease)
                .send()
        })
    }

    fn start_acquire(
        client: &Handle,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> PendingAcquire {
        client
            .acquire(key)
            .owner(owner)
            .wait(wait)
            .lease(lease)
            .start()
    }

    fn finish(
        pending: PendingAcquire,
    ) -> impl Future<Output = Result<Grant, AcquireError>> + Send + 'static {
        off_thread(move || pending.wait())
    }

    fn release(
        client: &Handle,
        grant: Grant,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static {
        let client = client.clone();
        off_thread(move || client.release(&grant))
    }

    fn shutdown(
        client: &Handle,
        budget: Duration,
    ) -> impl Future<Output = Result<(), RequestError>> + Send + 'static {
        let client = client.clone();
        off_thread(move || client.shutdown(budget))
    }

    type Lease = Lease;

    fn lock(
        client: &Handle,
        key: Key,
        lease: Duration,
        renew: bool,
    ) -> impl Future<Output = Result<Lease, String>> + Send + 'static {
        let client = client.clone();
        off_thread(move || {
            let owner = Name::new("me").expect("a name");
            let lock = client
                .lock(key)
                .owner(owner)
                .wait(Duration::ZERO)
                .lease(lease);
            let lock = match renew {
                true => lock.renew(),
                false => lock,
            };
            lock.send().map_err(|e| format!("{e:?}"))
        })
    }

    fn lease_state(lease: &Lease) -> (u64, tcp::LeaseStatus) {
        (lease.token(), lease.status())
    }

    fn lease_changed(
        lease: Lease,
        limit: Duration,
    ) -> impl Future<Output = (Lease, tcp::LeaseStatus)> + Send + 'static {
        off_thread(move || {
            let status = lease
                .changed_timeout(limit)
                .unwrap_or_else(|| lease.status());
            (lease, status)
        })
    }

    fn release_lease(
        lease: Lease,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static {
        off_thread(move || lease.release())
    }
}

fn start(config: Config, connector: impl Connector) -> (Handle, tcp::NoticeRx) {
    let (handle, mut notices) = ticketing::blocking::connect_with_notices(config, connector)
        .expect("a valid client configuration");
    // The scenarios read notices by awaiting them: a thread forwards them.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    thread::spawn(move || {
        while let Some(event) = notices.recv() {
            if tx.send(event).is_err() {
                break;
            }
        }
    });
    (handle, tcp::NoticeRx::Channel(rx))
}

tcp::adapter_tests!(Blocking);
