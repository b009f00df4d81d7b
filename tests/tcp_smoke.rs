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

#[test]
fn three_adapters_acquire_and_release_over_tcp() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let srv = start_server(&rt);
    let addr = srv.local_addr();
    // tokio
    rt.block_on(async {
        let h = ticketing::tokio::spawn(config(addr), ticketing::tokio::TcpConnector).unwrap();
        let o = h
            .acquire(
                Key::new("k").unwrap(),
                Name::new("o").unwrap(),
                Duration::from_secs(1),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let Outcome::Granted(g) = o else {
            panic!("{o:?}")
        };
        assert_eq!(h.release(&g).await.unwrap(), Outcome::Released);
        h.shutdown(Duration::from_secs(1)).await.unwrap();
    });
    // smol
    smol::block_on(async {
        let (h, d) =
            ticketing::futures_io::client(config(addr), ticketing::futures_io::TcpConnector)
                .unwrap();
        let task = smol::spawn(d);
        let o = h
            .acquire(
                Key::new("k").unwrap(),
                Name::new("o").unwrap(),
                Duration::from_secs(1),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let Outcome::Granted(g) = o else {
            panic!("{o:?}")
        };
        assert_eq!(h.release(&g).await.unwrap(), Outcome::Released);
        h.shutdown(Duration::from_secs(1)).await.unwrap();
        task.await;
    });
    // blocking
    let h = ticketing::blocking::connect(config(addr), ticketing::blocking::TcpConnector).unwrap();
    let o = h
        .acquire(
            Key::new("k").unwrap(),
            Name::new("o").unwrap(),
            Duration::from_secs(1),
            Duration::from_secs(5),
        )
        .unwrap();
    let Outcome::Granted(g) = o else {
        panic!("{o:?}")
    };
    assert_eq!(h.release(&g).unwrap(), Outcome::Released);
    h.shutdown(Duration::from_secs(1)).unwrap();
    rt.block_on(srv.stop()).unwrap();
}
