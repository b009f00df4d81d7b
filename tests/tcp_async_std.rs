//! The real-TCP scenarios of `tests/tcp/mod.rs` on the futures-io adapter,
//! driven by async-std.

mod tcp;

use std::future::Future;
use std::time::Duration;

use ticketing::client::{Config, Grant, Outcome};
use ticketing::futures_io::{Acquire, Connector, Handle, Lease, RequestError, TcpConnector};
use ticketing::{Key, Name};

struct AsyncStd;

impl tcp::Adapter for AsyncStd {
    const NAME: &'static str = "futures-io on async-std";
    type Client = Handle;
    type Pending = Acquire;

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

    tcp::async_handle_methods!(ticketing::futures_io::TlsConnector);
}

fn start(config: Config, connector: impl Connector) -> (Handle, tcp::NoticeRx) {
    tcp::futures_io_client(config, connector, |driver| {
        async_std::task::spawn(driver);
    })
}

tcp::adapter_tests!(AsyncStd);
