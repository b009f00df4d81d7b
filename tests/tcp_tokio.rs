//! The real-TCP scenarios of `tests/tcp/mod.rs` on the tokio adapter.

mod tcp;

use std::future::Future;
use std::time::Duration;

use ticketing::client::{Config, Grant, Outcome};
use ticketing::tokio::{Acquire, Connector, Handle, Lease, RequestError, TcpConnector};
use ticketing::{Key, Name};

struct Tokio;

impl tcp::Adapter for Tokio {
    const NAME: &'static str = "tokio";
    type Client = Handle;
    type Pending = Acquire;

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

    tcp::async_handle_methods!(ticketing::tokio::TlsConnector);
}

fn start(config: Config, connector: impl Connector) -> (Handle, tcp::NoticeRx) {
    let (handle, notices) = ticketing::tokio::spawn_with_notices(config, connector)
        .expect("a valid client configuration");
    (handle, tcp::NoticeRx::Async(notices))
}

tcp::adapter_tests!(Tokio);
