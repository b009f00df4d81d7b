//! The real-TCP scenarios of `tests/tcp/mod.rs` on the futures-io adapter,
//! driven by smol.

mod tcp;

use std::future::Future;
use std::time::Duration;

use ticketing::client::{Config, Grant, Outcome};
use ticketing::futures_io::{Acquire, Connector, Handle, Lease, RequestError, TcpConnector};
use ticketing::{Key, Name};

struct Smol;

impl tcp::Adapter for Smol {
    const NAME: &'static str = "futures-io on smol";
    type Client = Handle;
    type Pending = Acquire;

    fn block_on<T>(fut: impl Future<Output = T>) -> T {
        smol::block_on(fut)
    }

    fn spawn<T: Send + 'static>(
        fut: impl Future<Output = T> + Send + 'static,
    ) -> impl Future<Output = T> + Send + 'static {
        smol::spawn(fut)
    }

    fn sleep(d: Duration) -> impl Future<Output = ()> + Send + 'static {
        let timer = smol::Timer::after(d);
        async move {
            timer.await;
        }
    }

    tcp::async_handle_methods!(ticketing::futures_io::TlsConnector);
}

fn start(config: Config, connector: impl Connector) -> (Handle, tcp::NoticeRx) {
    tcp::futures_io_client(config, connector, |driver| {
        smol::spawn(driver).detach();
    })
}

tcp::adapter_tests!(Smol);
