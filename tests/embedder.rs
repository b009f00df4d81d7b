//! The library as an embedder meets it (issue 23), one test per thing the
//! issue found wrong, against the reference server on a loopback socket
//! (`ticketing::serve`, the same as `ticketing serve` runs), with the
//! tokio, futures-io (smol) and blocking adapters:
//!
//! - failures say why: `connected()` with the I/O, TLS or credential
//!   cause; a never-sent `TimedOut` with its cause; an acquire refused
//!   while misconfigured; a host that does not resolve; a URL refused;
//! - the builder asks for what it is told, and the owner is the client id;
//! - "not acquired" has one shape, and a sentence for `Display`;
//! - the guard shows its key, lease (capped or not) and time left;
//!   `now()` everywhere; a change is told from a timeout; notices come the
//!   same way in every adapter;
//! - `run` stops work whose lease is lost, and releases when it is done;
//! - `spawn` outside a runtime is an error.
//!
//! What happens when a program returns from `main` holding a guard is in
//! `tests/exit_release.rs`.

#[path = "pki/mod.rs"]
mod pki;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ticketing::client::{CloseReason, Config, Event};
use ticketing::serve::{ServerHandle, TlsListener};
use ticketing::server::{self, Server};
use ticketing::tokio::{AcquireError, LeaseStatus, RunError, SpawnError};
use ticketing::{Endpoint, Key, Name, Time};

use pki::{client_tls, server_tls, Ca};

/// How long any one wait may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// The servers of a test, on a runtime of their own.
struct Lab {
    rt: tokio::runtime::Runtime,
    servers: Vec<ServerHandle>,
}

impl Lab {
    fn new() -> Lab {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        Lab {
            rt,
            servers: Vec::new(),
        }
    }

    /// A server whose configuration `tweak` changes; its address.
    fn serve(&mut self, tweak: impl FnOnce(&mut server::Config)) -> Endpoint {
        let mut config = server::Config::new(name("n1"));
        tweak(&mut config);
        let core = Server::new(config, Time::ZERO).expect("a server");
        let server = self
            .rt
            .block_on(ticketing::serve::bind("127.0.0.1:0", core))
            .expect("serve");
        let ep = endpoint(server.local_addr());
        self.servers.push(server);
        ep
    }

    /// An address whose server `tweak` configures, and which takes no
    /// connection until [`serve_now`](Lab::serve_now): a client's
    /// connection waits in the listener's backlog meanwhile.
    fn serve_later(&mut self, tweak: impl FnOnce(&mut server::Config)) -> (Endpoint, Later) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        listener.set_nonblocking(true).expect("non-blocking");
        let ep = endpoint(listener.local_addr().expect("its address"));
        let mut config = server::Config::new(name("n1"));
        tweak(&mut config);
        let core = Server::new(config, Time::ZERO).expect("a server");
        (ep, Later { listener, core })
    }

    /// Starts serving what [`serve_later`](Lab::serve_later) made.
    fn serve_now(&mut self, later: Later) {
        let _entered = self.rt.enter();
        let listener = tokio::net::TcpListener::from_std(later.listener).expect("a listener");
        let server = ticketing::serve::spawn(listener, later.core).expect("serve");
        self.servers.push(server);
    }

    /// A server over TLS with a certificate `ca` signed; with `client_ca`,
    /// it requires client certificates that CA signed.
    fn serve_tls(&mut self, ca: &Ca, client_ca: Option<&Ca>) -> Endpoint {
        let core = Server::new(server::Config::new(name("n1")), Time::ZERO).expect("a server");
        let tls = server_tls(&ca.server(), client_ca);
        let server = self
            .rt
            .block_on(async {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                ticketing::serve::spawn(TlsListener::new(listener, tls), core)
            })
            .expect("serve over TLS");
        let ep = endpoint(server.local_addr());
        self.servers.push(server);
        ep
    }
}

/// A server not serving yet, and the listener it will serve.
struct Later {
    listener: TcpListener,
    core: Server,
}

fn name(s: &str) -> Name {
    Name::new(s).expect("a name")
}

fn key(s: &str) -> Key {
    Key::new(s).expect("a key")
}

fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::new(addr.to_string()).expect("an endpoint")
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An address nobody listens on (a port just handed out, closed again).
fn dead_endpoint() -> Endpoint {
    let listener = TcpListener::bind("127.0.0.3:0").expect("a free port");
    let ep = endpoint(listener.local_addr().expect("its address"));
    drop(listener);
    ep
}

fn config(ep: &Endpoint, id: &str) -> Config {
    let mut config = Config::new([ep.clone()], name(id));
    // A try-lock waits for a connection this long: keep the tests short.
    config.queue_grace = ms(300);
    config
}

/// A runtime for the client side of a test.
fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Asserts that `error` is how a refused connection to `ep` reads.
fn refused_connection(error: &ticketing::tokio::ConnectError, ep: &Endpoint) {
    assert_eq!(error.reason(), &CloseReason::ConnectFailed, "{error:?}");
    assert_eq!(error.addr(), Some(ep), "{error:?}");
    let io = error.io_error().expect("the connector's error");
    assert_eq!(io.kind(), ErrorKind::ConnectionRefused, "{error:?}");
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!("cannot connect to {ep}: ")) && shown.contains("refused"),
        "{shown}"
    );
}

// ----- failures say why -------------------------------------------------------

#[test]
fn connected_says_why_a_server_that_is_down_cannot_be_reached() {
    let ep = dead_endpoint();
    let rt = tokio_rt();
    let error = rt.block_on(async {
        let handle = ticketing::tokio::spawn(config(&ep, "c"), ticketing::tokio::TcpConnector)
            .expect("a client");
        tokio::time::timeout(PATIENCE, handle.connected())
            .await
            .expect("an answer")
            .expect_err("no server")
    });
    refused_connection(&error, &ep);

    let error = smol::block_on(async {
        let (handle, driver) =
            ticketing::futures_io::client(config(&ep, "c"), ticketing::futures_io::TcpConnector)
                .expect("a client");
        smol::spawn(driver).detach();
        handle.connected().await.expect_err("no server")
    });
    refused_connection(&error, &ep);

    let handle = ticketing::blocking::connect(config(&ep, "c"), ticketing::blocking::TcpConnector)
        .expect("a client");
    refused_connection(&handle.connected().expect_err("no server"), &ep);
}

#[test]
fn connected_and_acquires_say_a_credential_was_refused() {
    let mut lab = Lab::new();
    let ep = lab.serve(|c| c.credential = Some(name("s3cret")));
    let wrong = |id| {
        let mut config = config(&ep, id);
        config.credential = Some(name("wrong"));
        config
    };
    let refused = |error: &ticketing::tokio::ConnectError| {
        assert_eq!(error.reason(), &CloseReason::AuthFailed, "{error:?}");
        assert!(error.is_refusal());
        assert_eq!(
            error.to_string(),
            format!("{ep} refused this client's credential (auth_failed)")
        );
    };
    let rt = tokio_rt();
    rt.block_on(async {
        let handle =
            ticketing::tokio::spawn(wrong("c"), ticketing::tokio::TcpConnector).expect("a client");
        let error = handle.connected().await.expect_err("refused");
        refused(&error);
        // Misconfigured now: an acquire is refused at once, with the cause.
        let started = Instant::now();
        match handle.lock(key("k")).await {
            Err(AcquireError::Misconfigured(cause)) => refused(&cause),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < ms(200), "refused at once");
    });
    let handle = ticketing::blocking::connect(wrong("b"), ticketing::blocking::TcpConnector)
        .expect("a client");
    refused(&handle.connected().expect_err("refused"));
    let error = handle.acquire(key("k")).send().expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("refused this client's credential"),
        "{error}"
    );
}

#[test]
fn connected_says_a_tls_handshake_was_refused() {
    let mut lab = Lab::new();
    let ep = lab.serve_tls(&Ca::new("the server's CA"), None);
    let other = Ca::new("another CA");
    let rt = tokio_rt();
    let error = rt.block_on(async {
        let tls = ticketing::tokio::TlsConnector::new(client_tls(&other, None));
        let handle = ticketing::tokio::spawn(config(&ep, "c"), tls).expect("a client");
        handle.connected().await.expect_err("refused")
    });
    assert_eq!(
        error.reason(),
        &CloseReason::Tls(name("unknown_ca")),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        format!(
            "TLS handshake with {ep} failed: the peer's certificate is not signed by a trusted CA \
             (tls:unknown_ca)"
        )
    );
}

// ----- one answer to a refusal -------------------------------------------------

/// A client of `ep` with a credential the server refuses.
fn wrong_credential(ep: &Endpoint, id: &str) -> Config {
    let mut config = config(ep, id);
    config.credential = Some(name("wrong"));
    config
}

/// Asserts that `error` is the refusal of this client's credential by
/// `ep`, said as such.
fn credential_refused(error: &AcquireError, ep: &Endpoint) {
    let AcquireError::Misconfigured(cause) = error else {
        panic!("{error:?}");
    };
    assert_eq!(cause.reason(), &CloseReason::AuthFailed, "{error:?}");
    assert_eq!(
        error.to_string(),
        format!(
            "not acquired: {ep} refused this client's credential (auth_failed); no acquire \
             succeeds until the client's credential is one the server accepts"
        )
    );
}

#[test]
fn a_wrong_credential_is_misconfigured_whatever_the_order_of_calls() {
    let mut lab = Lab::new();
    let (ep, later) = lab.serve_later(|c| c.credential = Some(name("s3cret")));
    let rt = tokio_rt();
    // Acquires made before the refusal: their clients' connections wait
    // in the backlog until the server starts.
    let handle = {
        let _entered = rt.enter();
        ticketing::tokio::spawn(wrong_credential(&ep, "t"), ticketing::tokio::TcpConnector)
            .expect("a client")
    };
    let locking = rt.spawn({
        let handle = handle.clone();
        async move { handle.lock(key("k")).wait(PATIENCE).await.err() }
    });
    let blocking = ticketing::blocking::connect(
        wrong_credential(&ep, "b"),
        ticketing::blocking::TcpConnector,
    )
    .expect("a client");
    let pending = blocking.acquire(key("k")).wait(PATIENCE).start();
    thread::sleep(ms(100));
    let served = Instant::now();
    lab.serve_now(later);
    let tokio_error = rt.block_on(locking).expect("the task").expect("refused");
    let blocking_error = pending.wait().expect_err("refused");
    assert!(
        served.elapsed() < ms(1000),
        "ended by the refusal, not by their wait: {:?}",
        served.elapsed()
    );
    credential_refused(&tokio_error, &ep);
    credential_refused(&blocking_error, &ep);

    // And after `connected()` has said so.
    rt.block_on(async {
        let cause = handle.connected().await.expect_err("refused");
        assert!(cause.is_refusal(), "{cause:?}");
        let started = Instant::now();
        let error = handle.lock(key("k")).await.expect_err("refused");
        assert!(started.elapsed() < ms(200), "refused at once");
        credential_refused(&error, &ep);
    });
    let cause = blocking.connected().expect_err("refused");
    assert!(cause.is_refusal(), "{cause:?}");
    let started = Instant::now();
    let error = blocking.acquire(key("k")).send().expect_err("refused");
    assert!(started.elapsed() < ms(200), "refused at once");
    credential_refused(&error, &ep);
}

/// Asserts that `error` is the refusal of `ep`'s certificate, signed by a
/// CA this client does not trust.
fn unknown_ca(error: &AcquireError, ep: &Endpoint) {
    let AcquireError::Misconfigured(cause) = error else {
        panic!("{error:?}");
    };
    assert_eq!(
        cause.reason(),
        &CloseReason::Tls(name("unknown_ca")),
        "{error:?}"
    );
    assert!(cause.is_refusal(), "{cause:?}");
    assert_eq!(
        error.to_string(),
        format!(
            "not acquired: TLS handshake with {ep} failed: the peer's certificate is not signed \
             by a trusted CA (tls:unknown_ca); no acquire succeeds until the server presents a \
             certificate this client trusts"
        )
    );
}

#[test]
fn a_server_certificate_of_an_unknown_ca_is_misconfigured_whatever_the_order_of_calls() {
    let mut lab = Lab::new();
    let ep = lab.serve_tls(&Ca::new("the server's CA"), None);
    let other = Ca::new("another CA");
    // The core keeps taking acquires after a TLS failure: a try-lock waits
    // for a connection its queue grace (300 ms), then ends with the cause.
    let bound = ms(1000);
    let rt = tokio_rt();
    rt.block_on(async {
        let tls = ticketing::tokio::TlsConnector::new(client_tls(&other, None));
        let handle = ticketing::tokio::spawn(config(&ep, "t"), tls).expect("a client");
        let started = Instant::now();
        let error = handle.lock(key("k")).wait(Duration::ZERO).await;
        assert!(started.elapsed() < bound, "{:?}", started.elapsed());
        unknown_ca(&error.expect_err("refused"), &ep);

        let cause = handle.connected().await.expect_err("refused");
        assert!(cause.is_refusal(), "{cause:?}");
        let started = Instant::now();
        let error = handle.lock(key("k")).wait(Duration::ZERO).await;
        assert!(started.elapsed() < bound, "{:?}", started.elapsed());
        unknown_ca(&error.expect_err("refused"), &ep);
    });
    let tls = ticketing::blocking::TlsConnector::new(client_tls(&other, None));
    let handle = ticketing::blocking::connect(config(&ep, "b"), tls).expect("a client");
    let started = Instant::now();
    let error = handle.acquire(key("k")).wait(Duration::ZERO).send();
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    unknown_ca(&error.expect_err("refused"), &ep);
    let cause = handle.connected().expect_err("refused");
    assert!(cause.is_refusal(), "{cause:?}");
    let started = Instant::now();
    let error = handle.acquire(key("k")).wait(Duration::ZERO).send();
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    unknown_ca(&error.expect_err("refused"), &ep);
}

#[test]
fn a_plain_client_of_a_tls_server_is_told_of_tls_in_the_text_alone() {
    let mut lab = Lab::new();
    let ca = Ca::new("the server's CA");
    let ep = lab.serve_tls(&ca, None);
    let hinted = format!(
        "the connection to {ep} ended (eof) before the server's hello; if the server uses TLS, \
         connect with a TlsConnector and the server's CA"
    );
    let rt = tokio_rt();
    rt.block_on(async {
        let handle = ticketing::tokio::spawn(config(&ep, "t"), ticketing::tokio::TcpConnector)
            .expect("a client");
        let cause = handle.connected().await.expect_err("not TLS");
        // The TLS server's alert is no frame; then the stream ends.
        assert_eq!(cause.reason(), &CloseReason::Eof, "{cause:?}");
        assert!(!cause.is_refusal(), "{cause:?}");
        assert_eq!(cause.to_string(), hinted);
        // Not a refusal: an acquire that could not be sent timed out.
        let error = handle.lock(key("k")).wait(Duration::ZERO).await;
        let Err(AcquireError::TimedOut {
            sent: false,
            cause: Some(cause),
        }) = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(cause.reason(), &CloseReason::Eof, "{error:?}");
        assert_eq!(
            error.as_ref().expect_err("timed out").to_string(),
            format!("not acquired: no server could take the request ({hinted})")
        );
    });
    let handle = ticketing::blocking::connect(config(&ep, "b"), ticketing::blocking::TcpConnector)
        .expect("a client");
    let cause = handle.connected().expect_err("not TLS");
    assert_eq!(cause.reason(), &CloseReason::Eof, "{cause:?}");
    assert_eq!(cause.to_string(), hinted);

    // A TLS client whose connection ends before the hello (the server
    // wants a client certificate; TLS 1.3 says so after the handshake) is
    // given no hint at TLS.
    let strict = lab.serve_tls(&ca, Some(&ca));
    let tls = ticketing::blocking::TlsConnector::new(client_tls(&ca, None));
    let handle = ticketing::blocking::connect(config(&strict, "b"), tls).expect("a client");
    let cause = handle.connected().expect_err("no client certificate");
    assert_eq!(cause.reason(), &CloseReason::Io, "{cause:?}");
    assert_eq!(
        cause.to_string(),
        format!("the connection to {strict} ended (io)")
    );
}

#[test]
fn a_try_lock_that_could_not_be_sent_says_why() {
    let ep = dead_endpoint();
    let rt = tokio_rt();
    let result = rt.block_on(async {
        let handle = ticketing::tokio::spawn(config(&ep, "c"), ticketing::tokio::TcpConnector)
            .expect("a client");
        handle.lock(key("k")).wait(Duration::ZERO).await
    });
    let Err(
        error @ AcquireError::TimedOut {
            sent: false,
            cause: Some(cause),
        },
    ) = &result
    else {
        panic!("{result:?}");
    };
    refused_connection(cause, &ep);
    let shown = error.to_string();
    assert!(
        shown.starts_with("not acquired: no server could take the request (cannot connect to"),
        "{shown}"
    );
}

/// Issue 32: a caller who would rather turn elsewhere at once says so, in
/// the configuration or on one acquire, and an acquire with a wait of 5 s
/// against a server that is down ends at once, naming the connection
/// error; without it, the same acquire waits.
#[test]
fn an_acquire_that_gives_up_while_unreachable_ends_at_once_saying_why() {
    let ep = dead_endpoint();
    // What the bound is measured against: 5 s of wait, and every connect
    // refused at once by the loopback.
    let bound = Duration::from_millis(900);
    let gave_up = |result: &Result<(), AcquireError>, took: Duration, how: &str| {
        assert!(took < bound, "{how}: took {took:?}");
        eprintln!("{how}: ended after {took:?}");
        let Err(AcquireError::TimedOut {
            sent: false,
            cause: Some(cause),
        }) = result
        else {
            panic!("{how}: {result:?}");
        };
        refused_connection(cause, &ep);
    };

    let rt = tokio_rt();
    let (given_up, waited) = rt.block_on(async {
        let mut c = config(&ep, "c");
        c.give_up_while_unreachable = true;
        let handle = ticketing::tokio::spawn(c, ticketing::tokio::TcpConnector).expect("a client");
        let started = Instant::now();
        let result = handle.lock(key("k")).wait(ms(5_000)).await.map(drop);
        let given_up = (result, started.elapsed());
        // One acquire may still wait: it is not given up at once.
        let patient = handle
            .lock(key("k"))
            .wait(ms(5_000))
            .give_up_while_unreachable(false);
        let waited = tokio::time::timeout(ms(300), patient).await.is_err();
        (given_up, waited)
    });
    gave_up(&given_up.0, given_up.1, "tokio, configured");
    assert!(waited, "an acquire that says false waits");

    let result = smol::block_on(async {
        let (handle, driver) =
            ticketing::futures_io::client(config(&ep, "c"), ticketing::futures_io::TcpConnector)
                .expect("a client");
        smol::spawn(driver).detach();
        let started = Instant::now();
        let lock = handle.lock(key("k")).wait(ms(5_000));
        let result = lock.give_up_while_unreachable(true).await.map(drop);
        (result, started.elapsed())
    });
    gave_up(&result.0, result.1, "futures-io, on the acquire");

    let handle = ticketing::blocking::connect(config(&ep, "c"), ticketing::blocking::TcpConnector)
        .expect("a client");
    let started = Instant::now();
    let lock = handle.lock(key("k")).wait(ms(5_000));
    let result = lock.give_up_while_unreachable(true).send().map(drop);
    gave_up(&result, started.elapsed(), "blocking, on the acquire");
}

#[test]
fn a_host_that_does_not_resolve_says_so() {
    let ep = Endpoint::new("nosuch.invalid:7878").expect("an endpoint");
    let handle = ticketing::blocking::connect(config(&ep, "c"), ticketing::blocking::TcpConnector)
        .expect("a client");
    let error = handle.connected().expect_err("no such host");
    assert_eq!(error.reason(), &CloseReason::ConnectFailed, "{error:?}");
    assert!(
        error
            .to_string()
            .starts_with("cannot connect to nosuch.invalid:7878: cannot resolve nosuch.invalid: "),
        "{error}"
    );
}

#[test]
fn a_url_is_not_an_endpoint() {
    for url in ["http://127.0.0.1:7878", "https://locks.internal:443"] {
        assert!(Endpoint::new(url).is_err(), "{url}");
    }
}

#[test]
fn spawn_outside_a_runtime_is_an_error() {
    let config = config(&dead_endpoint(), "c");
    let spawned = ticketing::tokio::spawn(config, ticketing::tokio::TcpConnector);
    assert!(matches!(spawned, Err(SpawnError::NoRuntime)), "{spawned:?}");
}

// ----- the builder -------------------------------------------------------------

/// A relay to `upstream` for one connection that keeps what the client
/// sent.
fn tap(upstream: &Endpoint) -> (Endpoint, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let ep = endpoint(listener.local_addr().expect("its address"));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&sent);
    let upstream = upstream.as_str().to_owned();
    thread::spawn(move || {
        let (client, _) = listener.accept().expect("the client");
        let server = TcpStream::connect(upstream).expect("the server");
        let (mut from_server, mut to_client) = (
            server.try_clone().expect("clone"),
            client.try_clone().expect("clone"),
        );
        thread::spawn(move || {
            let _ = std::io::copy(&mut from_server, &mut to_client);
        });
        let (mut from_client, mut to_server) = (client, server);
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = from_client.read(&mut buf) {
            kept.lock().expect("the log").extend_from_slice(&buf[..n]);
            if to_server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    (ep, sent)
}

#[test]
fn the_builder_asks_for_what_it_is_told_and_the_owner_is_the_client_id() {
    let mut lab = Lab::new();
    let server = lab.serve(|_| {});
    let (ep, sent) = tap(&server);
    let handle =
        ticketing::blocking::connect(config(&ep, "worker-1"), ticketing::blocking::TcpConnector)
            .expect("a client");
    let lease = handle
        .lock(key("k"))
        .wait(ms(250))
        .lease(ms(1500))
        .send()
        .expect("the lock");
    lease.release().expect("released");
    let grant = handle
        .acquire(key("j"))
        .owner(name("someone"))
        .wait(Duration::ZERO)
        .lease(ms(2500))
        .send()
        .expect("the grant");
    handle.release(&grant).expect("released");
    let sent = String::from_utf8(sent.lock().expect("the log").clone()).expect("text");
    let acquires: Vec<Vec<&str>> = sent
        .lines()
        .filter(|l| l.starts_with("A "))
        .map(|l| l.split(' ').skip(2).collect())
        .collect();
    // The wait on the wire is what is left of it when the acquire goes out
    // (it waited for the connection first).
    let waited = |fields: &[&str]| fields[2].parse::<u64>().expect("wait_ms");
    assert!(
        acquires.len() == 2 && (200..=250).contains(&waited(&acquires[0])),
        "{sent}"
    );
    assert_eq!(
        (&acquires[0][..2], acquires[0][3]),
        (&["k", "worker-1"][..], "1500"),
        "{sent}"
    );
    assert_eq!(acquires[1], ["j", "someone", "0", "2500"], "{sent}");
}

// ----- one shape for "not acquired" ---------------------------------------------------

#[test]
fn not_acquired_has_one_shape_and_a_sentence() {
    let mut lab = Lab::new();
    let ep = lab.serve(|_| {});
    let rt = tokio_rt();
    rt.block_on(async {
        let holder = ticketing::tokio::spawn(config(&ep, "holder"), ticketing::tokio::TcpConnector)
            .expect("a client");
        let _held = holder.lock(key("k")).await.expect("the lock");
        let other = ticketing::tokio::spawn(config(&ep, "other"), ticketing::tokio::TcpConnector)
            .expect("a client");
        let acquired = other.acquire(key("k")).wait(Duration::ZERO).await;
        let locked = other.lock(key("k")).wait(Duration::ZERO).await;
        for error in [acquired.expect_err("held"), locked.expect_err("held")] {
            assert!(
                matches!(
                    error,
                    AcquireError::TimedOut {
                        sent: true,
                        cause: None
                    }
                ),
                "{error:?}"
            );
            assert_eq!(
                error.to_string(),
                "not acquired: another owner held the key for the whole wait"
            );
        }
    });
}

// ----- the guard and time ----------------------------------------------------------------

#[test]
fn the_guard_shows_its_key_its_lease_and_the_time_left() {
    let mut lab = Lab::new();
    let ep = lab.serve(|_| {});
    let handle = ticketing::blocking::connect(config(&ep, "c"), ticketing::blocking::TcpConnector)
        .expect("a client");
    let before = Instant::now();
    let lease = handle
        .lock(key("k"))
        .lease(ms(5000))
        .send()
        .expect("the lock");
    let after = Instant::now();
    assert_eq!(lease.key().as_str(), "k");
    assert_eq!((lease.lease(), lease.lease_asked()), (ms(5000), ms(5000)));
    let until = lease.valid_until().expect("valid");
    assert!(until > before && until <= after + ms(5000), "{until:?}");
    let left = lease.remaining();
    assert!(left > ms(4000) && left <= ms(5000), "{left:?}");
    // The core's time, on the blocking handle too.
    let now = handle.now();
    assert!(handle.time_of(until) > now);
    assert_eq!(handle.instant_of(handle.time_of(until)), Some(until));
}

#[test]
fn a_lease_above_the_servers_maximum_is_visible_on_the_guard() {
    let mut lab = Lab::new();
    let ep = lab.serve(|c| c.max_lease = ms(1000));
    let rt = tokio_rt();
    rt.block_on(async {
        let handle = ticketing::tokio::spawn(config(&ep, "c"), ticketing::tokio::TcpConnector)
            .expect("a client");
        let lease = handle
            .lock(key("k"))
            .lease(ms(120_000))
            .await
            .expect("the lock");
        assert_eq!(lease.lease_asked(), ms(120_000));
        assert_eq!(lease.lease(), ms(1000), "the server's maximum");
        assert!(lease.remaining() <= ms(1000));
    });
}

/// Issue 32: a renewal is told by `renewed_timeout()`, not as a change:
/// `changed_timeout()` stays quiet (and tells that from a timeout) while
/// renewals keep the lease valid and confirmed.
#[test]
fn the_blocking_guard_tells_a_renewal_from_a_change_and_a_change_from_a_timeout() {
    let mut lab = Lab::new();
    let ep = lab.serve(|_| {});
    let handle = ticketing::blocking::connect(config(&ep, "c"), ticketing::blocking::TcpConnector)
        .expect("a client");
    let lease = handle
        .lock(key("k"))
        .lease(ms(600))
        .renew()
        .send()
        .expect("the lock");
    let granted = lease.valid_until().expect("valid");
    assert_eq!(lease.changed_timeout(ms(20)), None, "no change in 20 ms");
    // Renewed a third of the way through the lease, and again.
    let first = lease.renewed_timeout(PATIENCE).expect("a renewal");
    assert!(first > granted, "{first:?} after {granted:?}");
    let second = lease.renewed_timeout(PATIENCE).expect("another renewal");
    assert!(second > first, "{second:?} after {first:?}");
    // Two renewals came and went: no change of state among them.
    assert_eq!(lease.changed_timeout(ms(20)), None);
    assert!(
        matches!(
            lease.status(),
            LeaseStatus::Valid {
                confirmed: true,
                ..
            }
        ),
        "{:?}",
        lease.status()
    );
}

#[test]
fn every_adapter_hands_out_its_notices_the_same_way() {
    let mut lab = Lab::new();
    let ep = lab.serve(|_| {});
    let first_two = |events: [Event; 2]| {
        assert!(
            matches!(
                &events,
                [Event::Connecting { addr: a }, Event::Connected { addr: b, .. }] if *a == ep && *b == ep
            ),
            "{events:?}"
        );
    };
    let rt = tokio_rt();
    rt.block_on(async {
        let (_handle, mut notices) =
            ticketing::tokio::spawn_with_notices(config(&ep, "c"), ticketing::tokio::TcpConnector)
                .expect("a client");
        first_two([
            notices.recv().await.expect("a notice"),
            notices.recv().await.expect("a notice"),
        ]);
    });
    smol::block_on(async {
        let (_handle, driver, mut notices) = ticketing::futures_io::client_with_notices(
            config(&ep, "c"),
            ticketing::futures_io::TcpConnector,
        )
        .expect("a client");
        smol::spawn(driver).detach();
        first_two([
            notices.recv().await.expect("a notice"),
            notices.recv().await.expect("a notice"),
        ]);
    });
    let (_handle, mut notices) = ticketing::blocking::connect_with_notices(
        config(&ep, "c"),
        ticketing::blocking::TcpConnector,
    )
    .expect("a client");
    first_two([
        notices.recv().expect("a notice"),
        notices.recv().expect("a notice"),
    ]);
}

// ----- work under a lock --------------------------------------------------------------------

#[test]
fn run_stops_the_work_when_the_lease_runs_out_and_releases_it_when_done() {
    let mut lab = Lab::new();
    let ep = lab.serve(|_| {});
    let rt = tokio_rt();
    rt.block_on(async {
        let handle = ticketing::tokio::spawn(config(&ep, "c"), ticketing::tokio::TcpConnector)
            .expect("a client");
        // Done: its value, and the key is free at once after.
        let token = handle
            .lock(key("k"))
            .run(|lease| async move { lease.token() })
            .await
            .expect("the work's value");
        let next = handle
            .acquire(key("k"))
            .wait(Duration::ZERO)
            .await
            .expect("free");
        assert!(next.token() > token);
        handle.release(&next).await.expect("released");
        // A lease of 300 ms, not renewed, under work of 10 s: stopped.
        let started = Instant::now();
        let stopped = handle
            .lock(key("k"))
            .lease(ms(300))
            .run(|_| tokio::time::sleep(PATIENCE))
            .await;
        assert!(
            matches!(
                stopped,
                Err(RunError::LeaseLost {
                    status: LeaseStatus::Expired { .. }
                })
            ),
            "{stopped:?}"
        );
        assert!(
            started.elapsed() < ms(3000),
            "stopped at its expiry: {:?}",
            started.elapsed()
        );
        handle
            .acquire(key("k"))
            .wait(Duration::ZERO)
            .await
            .expect("free");
    });

    let handle = ticketing::blocking::connect(config(&ep, "b"), ticketing::blocking::TcpConnector)
        .expect("a client");
    let told = handle.lock(key("b")).lease(ms(300)).run(|lease| {
        let mut lease = lease;
        // The work is told: it waits for the lease to end, and stops.
        while !lease.status().is_over() {
            thread::sleep(ms(10));
            assert!(lease.remaining() <= ms(300));
            lease = lease.clone();
        }
        "stopped"
    });
    assert!(
        matches!(
            told,
            Err(RunError::LeaseLost {
                status: LeaseStatus::Expired { .. }
            })
        ),
        "{told:?}"
    );
    handle
        .acquire(key("b"))
        .wait(Duration::ZERO)
        .send()
        .expect("free");
}
