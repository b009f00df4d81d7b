//! The real-TCP scenarios of `tests/tcp/mod.rs` on the futures-io adapter,
//! driven by async-std.

mod tcp;

use std::future::Future;
use std::time::Duration;

use ticketing::client::{Config, Grant, Outcome};
use ticketing::futures_io::{Acquire, Connector, Handle, RequestError, TcpConnector};
use ticketing::{Key, Name};

struct AsyncStd;

impl tcp::Adapter for AsyncStd {
    const NAME: &'static str = "futures-io on async-std";
    type Client = Handle;
    type Pending = Acquire;
    type Error = RequestError;

    fn block_on<T>(fut: impl Future<Output = T>) -> T {
        async_std::task::block_on(fut)
    }

    fn spawn<T: Send + 'static>(
        fut: impl Future<Output = T> + Send + 'static,
    ) -> impl Future<Output = T> + Send + 'static {
        async_std::task::spawn(fut)
    }

    fn sleep(d: Duration) -> impl Future<Output = ()> + Send + 'static {
        async_std::task::sleep(d)
    }

    fn connect(config: Config) -> (Handle, tcp::NoticeRx) {
        start(config, TcpConnector)
    }

    #[cfg(feature = "tls")]
    fn connect_tls(config: Config, tls: ticketing::tls::ClientTls) -> (Handle, tcp::NoticeRx) {
        start(config, ticketing::futures_io::TlsConnector::new(tls))
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
    tcp::futures_io_client(config, connector, |driver| {
        async_std::task::spawn(driver);
    })
}

tcp::adapter_tests!(AsyncStd);
