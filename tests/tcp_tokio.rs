//! The real-TCP scenarios of `tests/tcp/mod.rs` on the tokio adapter.

mod tcp;

use std::future::Future;
use std::time::Duration;

use ticketing::client::{Config, Grant, Outcome};
use ticketing::tokio::{Acquire, Connector, Handle, RequestError, TcpConnector};
use ticketing::{Key, Name};

struct Tokio;

impl tcp::Adapter for Tokio {
    const NAME: &'static str = "tokio";
    type Client = Handle;
    type Pending = Acquire;
    type Error = RequestError;

    fn block_on<T>(fut: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(fut)
    }

    fn spawn<T: Send + 'static>(
        fut: impl Future<Output = T> + Send + 'static,
    ) -> impl Future<Output = T> + Send + 'static {
        let task = tokio::spawn(fut);
        async move { task.await.expect("the task ran to its end") }
    }

    fn sleep(d: Duration) -> impl Future<Output = ()> + Send + 'static {
        tokio::time::sleep(d)
    }

    fn connect(config: Config) -> (Handle, tcp::NoticeRx) {
        start(config, TcpConnector)
    }

    #[cfg(feature = "tls")]
    fn connect_tls(config: Config, tls: ticketing::tls::ClientTls) -> (Handle, tcp::NoticeRx) {
        start(config, ticketing::tokio::TlsConnector::new(tls))
    }

    fn acquire(
        client: &Handle,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static {
        client.acquire(key, owner, wait, lease)
    }

    fn start_acquire(
        client: &Handle,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> Acquire {
        client.acquire(key, owner, wait, lease)
    }

    fn finish(
        pending: Acquire,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static {
        pending
    }

    fn release(
        client: &Handle,
        grant: Grant,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static {
        let client = client.clone();
        async move { client.release(&grant).await }
    }

    fn shutdown(
        client: &Handle,
        budget: Duration,
    ) -> impl Future<Output = Result<(), RequestError>> + Send + 'static {
        let client = client.clone();
        async move { client.shutdown(budget).await }
    }
}

fn start(config: Config, connector: impl Connector) -> (Handle, tcp::NoticeRx) {
    ticketing::tokio::spawn_with_notices(config, connector).expect("a valid client configuration")
}

tcp::adapter_tests!(Tokio);
