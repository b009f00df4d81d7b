use std::time::Duration;
use ticketing::client::{Config, Outcome};
use ticketing::server::{self, Server};
use ticketing::{Endpoint, Key, Name, Time};

fn start_server(rt: &tokio::runtime::Runtime) -> ticketing::serve::ServerHandle {
    rt.block_on(async {
        let core = Server::new(server::Config::new(Name::new("n1").unwrap()), Time::ZERO).unwrap();
        ticketing::serve::bind("127.0.0.1:0", core).await.unwrap()
    })
}

fn config(addr: std::net::SocketAddr) -> Config {
    Config::new(
        [Endpoint::new(addr.to_string()).unwrap()],
        Name::new("c").unwrap(),
    )
}

/// What every adapter asks for: `k` for `o`, waiting 1 s, for 5 s.
fn request() -> (Key, Name, Duration, Duration) {
    (
        Key::new("k").unwrap(),
        Name::new("o").unwrap(),
        Duration::from_secs(1),
        Duration::from_secs(5),
    )
}

/// Acquires [`request`] through an async handle (tokio's and
/// futures_io's are the same type), releases it and shuts down.
async fn acquire_and_release(h: &ticketing::tokio::Handle) {
    let (key, owner, wait, lease) = request();
    let g = h
        .acquire(key)
        .owner(owner)
        .wait(wait)
        .lease(lease)
        .await
        .unwrap();
    assert_eq!(h.release(&g).await.unwrap(), Outcome::Released);
    h.shutdown(Duration::from_secs(1)).await.unwrap();
}

#[test]
fn three_adapters_acquire_and_release_over_tcp() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = start_server(&rt);
    let addr = srv.local_addr();
    // tokio
    rt.block_on(async {
        let h = ticketing::tokio::spawn(config(addr), ticketing::tokio::TcpConnector).unwrap();
        acquire_and_release(&h).await;
    });
    // smol
    smol::block_on(async {
        let (h, d) =
            ticketing::futures_io::client(config(addr), ticketing::futures_io::TcpConnector)
                .unwrap();
        let task = smol::spawn(d);
        acquire_and_release(&h).await;
        task.await;
    });
    // blocking
    let h = ticketing::blocking::connect(config(addr), ticketing::blocking::TcpConnector).unwrap();
    let (key, owner, wait, lease) = request();
    let g = h
        .acquire(key)
        .owner(owner)
        .wait(wait)
        .lease(lease)
        .send()
        .unwrap();
    assert_eq!(h.release(&g).unwrap(), Outcome::Released);
    h.shutdown(Duration::from_secs(1)).unwrap();
    rt.block_on(srv.stop()).unwrap();
}
