//! The TLS scenarios (issue 13), on every adapter: a session over TLS with
//! a client certificate, and each way a connection attempt can fail over
//! TLS — the client's view of it (`closed` with its reason), the backoff of
//! a failed connect, the next attempt, and an operation submitted meanwhile
//! that still gets its outcome.
//!
//! The server is `ticketing::serve` behind a `TlsListener`, on loopback;
//! the certificates are made for each test (`tests/pki`).

use std::net::SocketAddr;

use ticketing::serve::TlsListener;
use ticketing::tls::ServerTls;

use super::pki::{client_tls, server_tls, Ca};
use super::*;

/// Makes one `#[test]` per TLS scenario for an [`Adapter`].
macro_rules! tls_tests {
    ($adapter:ty) => {
        #[test]
        fn tls_session_with_a_client_certificate() {
            $crate::tcp::tls::session::<$adapter>();
        }

        #[test]
        fn tls_server_of_an_unknown_ca_is_refused() {
            $crate::tcp::tls::unknown_ca::<$adapter>();
        }

        #[test]
        fn tls_server_certificate_for_another_name_is_refused() {
            $crate::tcp::tls::name_mismatch::<$adapter>();
        }

        #[test]
        fn tls_expired_server_certificate_is_refused() {
            $crate::tcp::tls::expired::<$adapter>();
        }

        #[test]
        fn tls_client_of_a_plain_server_says_not_tls() {
            $crate::tcp::tls::plain_server::<$adapter>();
        }

        #[test]
        fn tls_server_refuses_a_plain_client() {
            $crate::tcp::tls::plain_client::<$adapter>();
        }

        #[test]
        fn tls_handshake_that_stalls_times_out() {
            $crate::tcp::tls::stalled::<$adapter>();
        }

        #[test]
        fn tls_client_without_a_certificate_of_the_client_ca_is_refused() {
            $crate::tcp::tls::no_client_certificate::<$adapter>();
        }
    };
}
pub(crate) use tls_tests;

impl Lab {
    /// Serves `core` over TLS on a fresh loopback port.
    pub async fn serve_tls(&self, core: Server, tls: ServerTls) -> ServerHandle {
        self.rt
            .spawn(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await?;
                ticketing::serve::spawn(TlsListener::new(listener, tls), core)
            })
            .await
            .expect("the lab runtime runs")
            .unwrap_or_else(|e| panic!("cannot serve over TLS: {e}"))
    }

    /// A listener that accepts connections and never says a word on them.
    pub async fn mute(&self) -> SocketAddr {
        let (listener, addr) = self.listen("the mute listener").await;
        self.rt.spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        addr
    }
}

fn tls_detail(detail: &str) -> CloseReason {
    CloseReason::Tls(name(detail))
}

/// A server core that needs nothing special.
fn plain_core() -> Server {
    server_core(server_config("n1", |_| {}))
}

/// A client of `ep` whose connect attempts all fail: the first is closed
/// as `want`, without a welcome; the client backs off as for a failed
/// connect and tries again; a try-lock submitted meanwhile waits for a
/// connection for its queue grace and ends without being sent.
async fn refused<A: Adapter>(
    client: A::Client,
    notices: NoticeRx,
    ep: &Endpoint,
    want: CloseReason,
) {
    let mut notices = Notices::new(notices);
    refused_as::<A>(&mut notices, ep, want.clone()).await;
    let (backoff, _) = notices
        .until::<A>("the backoff", |e| matches!(e, Event::Backoff { .. }))
        .await;
    assert!(
        matches!(
            backoff,
            Event::Backoff {
                cause: BackoffCause::Transport,
                ..
            }
        ),
        "[{}] backs off as for a failed connect: {backoff:?}",
        A::NAME
    );
    notices
        .until::<A>(
            "the next attempt",
            |e| matches!(e, Event::Connecting { addr } if addr == ep),
        )
        .await;
    try_lock_unwelcomed::<A>(&client, &want).await;
    shutdown::<A>(&client).await;
    assert!(
        !notices.drain().iter().any(is_connected),
        "[{}] never welcomed",
        A::NAME
    );
}

/// A configuration whose try-locks wait a short while for a connection.
fn impatient(ep: &Endpoint) -> Config {
    let mut config = client_config(ep, "c");
    config.queue_grace = ms(300);
    config
}

/// A client over TLS trusting `ca` meets a TLS server presenting `server`
/// and is refused as `tls:<detail>`.
fn refused_server<A: Adapter>(ca: &Ca, server: ServerTls, detail: &str) {
    let lab = Lab::start();
    A::block_on(async {
        let server = lab.serve_tls(plain_core(), server).await;
        let ep = endpoint(server.local_addr());
        let (client, notices) = A::connect_tls(impatient(&ep), client_tls(ca, None));
        refused::<A>(client, notices, &ep, tls_detail(detail)).await;
        lab.stop(server).await;
    });
}

/// A whole session over TLS, the server requiring a client certificate:
/// many acquires and releases at once, then a clean shutdown.
pub fn session<A: Adapter>() {
    let lab = Lab::start();
    let ca = Ca::new("test CA");
    A::block_on(async {
        let tls = server_tls(&ca.server(), Some(&ca));
        let server = lab.serve_tls(plain_core(), tls).await;
        let ep = endpoint(server.local_addr());
        let me = ca.client("c");
        let (client, notices) = A::connect_tls(client_config(&ep, "c"), client_tls(&ca, Some(&me)));
        let mut notices = Notices::new(notices);
        let (connected, before) = notices.until::<A>("Connected over TLS", is_connected).await;
        assert!(
            matches!(&connected, Event::Connected { addr, .. } if *addr == ep),
            "{connected:?}"
        );
        assert!(!before.iter().any(is_closed), "[{}] {before:?}", A::NAME);
        let pairs: Vec<_> = (0..64)
            .map(|i| {
                let client = client.clone();
                A::spawn(async move {
                    let grant = acquire_now::<A>(&client, &format!("k{i}")).await;
                    release::<A>(&client, &grant).await;
                })
            })
            .collect();
        for pair in pairs {
            within::<A, _>("an acquire and its release over TLS", pair).await;
        }
        shutdown::<A>(&client).await;
        // The close's notice may come just after the shutdown's answer (the
        // blocking driver's thread hands it on after replying).
        let (closed, before) = notices.until::<A>("the shutdown's close", is_closed).await;
        let closes: Vec<Event> = before
            .into_iter()
            .chain([closed])
            .chain(notices.drain())
            .filter(is_closed)
            .collect();
        assert_eq!(
            closes,
            [Event::Closed {
                addr: ep.clone(),
                reason: CloseReason::Shutdown
            }],
            "[{}] one connection, closed by the shutdown",
            A::NAME
        );
        lab.stop(server).await;
    });
}

/// The server's certificate was signed by a CA the client does not trust.
pub fn unknown_ca<A: Adapter>() {
    let (trusted, other) = (Ca::new("trusted CA"), Ca::new("other CA"));
    refused_server::<A>(&trusted, server_tls(&other.server(), None), "unknown_ca");
}

/// The server's certificate is for another name than the one connected to.
pub fn name_mismatch<A: Adapter>() {
    let ca = Ca::new("test CA");
    let wrong = ca.issue(&["locks.example"], |_| {});
    refused_server::<A>(&ca, server_tls(&wrong, None), "name_mismatch");
}

/// The server's certificate has expired.
pub fn expired<A: Adapter>() {
    let ca = Ca::new("test CA");
    refused_server::<A>(&ca, server_tls(&ca.expired_server(), None), "expired");
}

/// A TLS client of a plain-TCP server: the server takes the ClientHello
/// for a line and answers it with `E` (at once if it holds a newline,
/// after its handshake timeout if not): not TLS.
pub fn plain_server<A: Adapter>() {
    let lab = Lab::start();
    let ca = Ca::new("test CA");
    A::block_on(async {
        let core = server_core(server_config("n1", |c| c.handshake_timeout = ms(100)));
        let server = lab.serve(core).await;
        let ep = endpoint(server.local_addr());
        let (client, notices) = A::connect_tls(impatient(&ep), client_tls(&ca, None));
        refused::<A>(client, notices, &ep, tls_detail("not_tls")).await;
        lab.stop(server).await;
    });
}

/// A plain-TCP client of a TLS server: the server takes its `H` for a TLS
/// record that is not one, answers with an alert and closes. The client,
/// which does not speak TLS, sees the bytes of the alert, which are no
/// frame, and the end of the stream.
pub fn plain_client<A: Adapter>() {
    let lab = Lab::start();
    let ca = Ca::new("test CA");
    A::block_on(async {
        let server = lab
            .serve_tls(plain_core(), server_tls(&ca.server(), None))
            .await;
        let ep = endpoint(server.local_addr());
        let (client, notices) = A::connect(impatient(&ep));
        refused::<A>(client, notices, &ep, CloseReason::Eof).await;
        lab.stop(server).await;
    });
}

/// A server that accepts the connection and never answers the ClientHello:
/// the connector gives up after its handshake timeout, well before the
/// core's connect timeout (5 s).
pub fn stalled<A: Adapter>() {
    let lab = Lab::start();
    let ca = Ca::new("test CA");
    A::block_on(async {
        let ep = endpoint(lab.mute().await);
        let tls = client_tls(&ca, None)
            .handshake_timeout(ms(200))
            .expect("a positive timeout");
        let (client, notices) = A::connect_tls(impatient(&ep), tls);
        refused::<A>(client, notices, &ep, tls_detail("handshake_timeout")).await;
    });
}

/// A server that requires a certificate its client CA signed refuses a
/// client without one, and one whose certificate another CA signed, before
/// their `H`: neither is ever welcomed. With TLS 1.3 the client's side of
/// the handshake is done before the server says no, so the refusal reaches
/// it as the end of the connection during the protocol's handshake (`io`);
/// a client with the right certificate is welcomed.
pub fn no_client_certificate<A: Adapter>() {
    let lab = Lab::start();
    let (ca, other) = (Ca::new("test CA"), Ca::new("other CA"));
    A::block_on(async {
        let tls = server_tls(&ca.server(), Some(&ca));
        let server = lab.serve_tls(plain_core(), tls).await;
        let ep = endpoint(server.local_addr());
        let stranger = other.client("c");
        for tls in [client_tls(&ca, None), client_tls(&ca, Some(&stranger))] {
            let (client, notices) = A::connect_tls(impatient(&ep), tls);
            refused::<A>(client, notices, &ep, CloseReason::Io).await;
        }
        let me = ca.client("c");
        let (client, notices) = A::connect_tls(impatient(&ep), client_tls(&ca, Some(&me)));
        Notices::new(notices)
            .until::<A>("Connected with the right certificate", is_connected)
            .await;
        let grant = acquire_now::<A>(&client, "k").await;
        release::<A>(&client, &grant).await;
        shutdown::<A>(&client).await;
        lab.stop(server).await;
    });
}
