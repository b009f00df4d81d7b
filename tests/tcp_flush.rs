//! Streams that keep what they are given until they are flushed, as a TLS
//! stream keeps its records when the socket is full: the async driver and
//! `ticketing::serve` flush after writing. Without it the client's `H`, or
//! the server's `W`, would wait in the stream for a write that never comes.
//!
//! Here the streams are tokio's `BufWriter`s over loopback TCP: nothing
//! they are given leaves before a flush (or 8 KiB of it).

use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::Duration;

use ticketing::client::{Config, Outcome};
use ticketing::serve::Listener;
use ticketing::server::Server;
use ticketing::tokio::{Connector, TcpConnector};
use ticketing::{Endpoint, Key, Name, Time};
use tokio::io::BufWriter;
use tokio::net::{TcpListener, TcpStream};

/// How long the session may take before the test fails; a pass takes
/// milliseconds, a stuck `H` or `W` the handshake timeout (5 s) and more.
const WAIT: Duration = Duration::from_secs(4);

/// Accepts TCP connections and hands them to the server buffered.
struct BufferedListener(TcpListener);

impl Listener for BufferedListener {
    type Stream = BufWriter<TcpStream>;

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Stream>> {
        Listener::poll_accept(&mut self.0, cx).map_ok(BufWriter::new)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Listener::local_addr(&self.0)
    }
}

/// Connects over TCP and hands the connection to the client buffered.
struct BufferedConnector;

impl Connector for BufferedConnector {
    type Stream = BufWriter<TcpStream>;

    async fn connect(&self, addr: Endpoint) -> io::Result<Self::Stream> {
        TcpConnector.connect(addr).await.map(BufWriter::new)
    }
}

fn name(s: &str) -> Name {
    Name::new(s).expect("a valid name")
}

/// A try-lock and its release, with the server's streams buffered or not,
/// and the client's.
fn session(buffered_server: bool, buffered_client: bool) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let core = Server::new(server_config(), Time::ZERO).expect("a server core");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let server = if buffered_server {
            ticketing::serve::spawn(BufferedListener(listener), core)
        } else {
            ticketing::serve::spawn(listener, core)
        }
        .expect("serve");
        let ep = Endpoint::new(server.local_addr().to_string()).expect("an endpoint");
        let config = Config::new([ep], name("c"));
        let client = if buffered_client {
            ticketing::tokio::spawn(config, BufferedConnector)
        } else {
            ticketing::tokio::spawn(config, TcpConnector)
        }
        .expect("a client");
        let key = Key::new("k").expect("a key");
        let acquire = client.acquire(key).owner(name("me")).wait(Duration::ZERO);
        let outcome = tokio::time::timeout(WAIT, acquire).await;
        let Ok(Ok(grant)) = outcome else {
            panic!("a try-lock of a free key: {outcome:?}");
        };
        let released = tokio::time::timeout(WAIT, client.release(&grant)).await;
        assert!(
            matches!(released, Ok(Ok(Outcome::Released))),
            "{released:?}"
        );
        let shutdown = tokio::time::timeout(WAIT, client.shutdown(Duration::from_secs(1))).await;
        assert!(matches!(shutdown, Ok(Ok(()))), "{shutdown:?}");
        server.stop().await.expect("the server stops");
    });
}

fn server_config() -> ticketing::server::Config {
    ticketing::server::Config::new(name("n1"))
}

#[test]
fn serve_flushes_what_its_streams_hold() {
    session(true, false);
}

#[test]
fn the_async_driver_flushes_what_its_stream_holds() {
    session(false, true);
}
