//! The real-TCP adapter scenarios (issue 3), written once for every adapter.
//!
//! Each `tests/tcp_<adapter>.rs` implements [`Adapter`] (the adapter's
//! operations, plus its runtime's `block_on`, `spawn` and `sleep`) and
//! expands [`adapter_tests!`], which makes one `#[test]` per scenario.
//!
//! The server is the sans-IO server core behind `ticketing::serve`, on a real
//! loopback socket, on a tokio runtime of its own (the [`Lab`]) whatever the
//! adapter's runtime. Where a scenario must know what went on the wire, the
//! client talks to the server through a [`Tap`]: a TCP relay that records
//! every frame the client sent, per connection.
//!
//! With the feature `tls`, the scenarios of `tls.rs` run on every adapter
//! too, over TLS with certificates made for the test (`tests/pki`).
//!
//! Every wait is bounded by [`within`], which fails the test naming what it
//! was waiting for. Sleeps only stand for work inside a critical section;
//! every other wait is for an event: a notice, an outcome, or bytes seen on
//! the wire.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use ticketing::client::{
    BackoffCause, CancelPolicy, CloseReason, Config, Event, Grant, Outcome, ReleaseResult,
};
use ticketing::serve::ServerHandle;
use ticketing::server::{self, Role, Server};
pub use ticketing::tokio::{AcquireError, RequestError};
use ticketing::{Endpoint, Key, Name, Time};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;

#[cfg(feature = "tls")]
#[path = "../pki/mod.rs"]
pub mod pki;
#[cfg(feature = "tls")]
pub mod tls;

pub use ticketing::tokio::LeaseStatus;

/// The notices of one client, as every adapter hands them to the tests.
#[allow(dead_code)] // each test binary builds the variant of its adapter
pub enum NoticeRx {
    /// Forwarded from the blocking adapter's receiver by a thread.
    Channel(UnboundedReceiver<Event>),
    /// The async adapters' receiver (the same type in both).
    Async(ticketing::tokio::Notices),
}

impl NoticeRx {
    async fn recv(&mut self) -> Option<Event> {
        match self {
            NoticeRx::Channel(rx) => rx.recv().await,
            NoticeRx::Async(rx) => rx.recv().await,
        }
    }

    fn try_recv(&mut self) -> Option<Event> {
        match self {
            NoticeRx::Channel(rx) => rx.try_recv().ok(),
            NoticeRx::Async(rx) => rx.try_recv(),
        }
    }
}

/// One adapter on one runtime, as the scenarios drive it.
pub trait Adapter: 'static {
    /// Shown in failure messages.
    const NAME: &'static str;
    /// A handle on a running client.
    type Client: Clone + Send + Sync + 'static;
    /// An acquire under way; dropping it cancels the acquire.
    type Pending: Send + 'static;

    /// Runs a scenario to completion on the adapter's runtime.
    fn block_on<T>(fut: impl Future<Output = T>) -> T;
    /// Starts a task; the returned future is its result.
    fn spawn<T: Send + 'static>(
        fut: impl Future<Output = T> + Send + 'static,
    ) -> impl Future<Output = T> + Send + 'static;
    /// The runtime's timer.
    fn sleep(d: Duration) -> impl Future<Output = ()> + Send + 'static;
    /// Starts a client that connects in the background, with its notices.
    fn connect(config: Config) -> (Self::Client, NoticeRx);
    /// The same, over TLS: the adapter's `TlsConnector` with `tls`.
    #[cfg(feature = "tls")]
    fn connect_tls(config: Config, tls: ticketing::tls::ClientTls) -> (Self::Client, NoticeRx);
    /// The adapter's own acquire call.
    fn acquire(
        client: &Self::Client,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> impl Future<Output = Result<Grant, AcquireError>> + Send + 'static;
    /// Submits an acquire now and hands back something to wait on or drop.
    fn start_acquire(
        client: &Self::Client,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
    ) -> Self::Pending;
    /// The outcome of a started acquire.
    fn finish(
        pending: Self::Pending,
    ) -> impl Future<Output = Result<Grant, AcquireError>> + Send + 'static;
    /// Releases a grant by its exact token.
    fn release(
        client: &Self::Client,
        grant: Grant,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static;
    /// Shuts the client down within `budget`.
    fn shutdown(
        client: &Self::Client,
        budget: Duration,
    ) -> impl Future<Output = Result<(), RequestError>> + Send + 'static;
    /// A held grant, as the adapter's guard.
    type Lease: Send + 'static;
    /// The adapter's lock with automatic renewal (`renew`), or without.
    fn lock(
        client: &Self::Client,
        key: Key,
        lease: Duration,
        renew: bool,
    ) -> impl Future<Output = Result<Self::Lease, String>> + Send + 'static;
    /// The guard's token and where its grant stands.
    fn lease_state(lease: &Self::Lease) -> (u64, LeaseStatus);
    /// Waits, at most `limit`, for the guard's status to change.
    fn lease_changed(
        lease: Self::Lease,
        limit: Duration,
    ) -> impl Future<Output = (Self::Lease, LeaseStatus)> + Send + 'static;
    /// Releases the guard's grant; its outcome.
    fn release_lease(
        lease: Self::Lease,
    ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static;
}

/// The [`Adapter`] methods of an async adapter (tokio, futures-io), whose
/// handle, acquire future and request error are the driver's: expands to
/// them inside `impl Adapter`, given the adapter's TLS connector and a
/// function `start(config, connector)` in scope.
#[allow(unused_macros)] // not in the blocking adapter's tests
macro_rules! async_handle_methods {
    ($tls_connector:path) => {
        fn connect(config: Config) -> (Handle, tcp::NoticeRx) {
            start(config, TcpConnector)
        }

        #[cfg(feature = "tls")]
        fn connect_tls(config: Config, tls: ticketing::tls::ClientTls) -> (Handle, tcp::NoticeRx) {
            start(config, <$tls_connector>::new(tls))
        }

        fn acquire(
            client: &Handle,
            key: Key,
            owner: Name,
            wait: Duration,
            lease: Duration,
        ) -> impl Future<Output = Result<Grant, tcp::AcquireError>> + Send + 'static {
            Self::start_acquire(client, key, owner, wait, lease)
        }

        fn start_acquire(
            client: &Handle,
            key: Key,
            owner: Name,
            wait: Duration,
            lease: Duration,
        ) -> Acquire {
            client
                .acquire(key)
                .owner(owner)
                .wait(wait)
                .lease(lease)
                .start()
        }

        fn finish(
            pending: Acquire,
        ) -> impl Future<Output = Result<Grant, tcp::AcquireError>> + Send + 'static {
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

        type Lease = Lease;

        fn lock(
            client: &Handle,
            key: Key,
            lease: Duration,
            renew: bool,
        ) -> impl Future<Output = Result<Lease, String>> + Send + 'static {
            let owner = ticketing::Name::new("me").expect("a name");
            let lock = client
                .lock(key)
                .owner(owner)
                .wait(Duration::ZERO)
                .lease(lease);
            let lock = match renew {
                true => lock.renew(),
                false => lock,
            };
            async move { lock.await.map_err(|e| format!("{e:?}")) }
        }

        fn lease_state(lease: &Lease) -> (u64, tcp::LeaseStatus) {
            (lease.token(), lease.status())
        }

        fn lease_changed(
            lease: Lease,
            limit: Duration,
        ) -> impl Future<Output = (Lease, tcp::LeaseStatus)> + Send + 'static {
            async move {
                let changed = tcp::within_opt::<Self, _>(limit, lease.changed()).await;
                let status = changed.unwrap_or_else(|| lease.status());
                (lease, status)
            }
        }

        fn release_lease(
            lease: Lease,
        ) -> impl Future<Output = Result<Outcome, RequestError>> + Send + 'static {
            lease.release()
        }
    };
}
#[allow(unused_imports)]
pub(crate) use async_handle_methods;

/// Makes one `#[test]` per scenario for an [`Adapter`].
macro_rules! adapter_tests {
    ($adapter:ty) => {
        #[test]
        fn contention_keeps_fencing_tokens_increasing() {
            $crate::tcp::contention::<$adapter>();
        }

        #[test]
        fn server_restart_ends_acquires_indeterminate_and_resends_releases() {
            $crate::tcp::server_restart::<$adapter>();
        }

        #[test]
        fn an_auto_renewed_lock_is_held_past_three_leases() {
            $crate::tcp::renewal_keeps_a_lock::<$adapter>();
        }

        #[test]
        fn a_restart_under_an_auto_renewed_lock_ends_in_lost_or_expired() {
            $crate::tcp::renewal_across_a_restart::<$adapter>();
        }

        #[test]
        fn dropping_a_lease_releases_it_by_exact_token() {
            $crate::tcp::dropping_a_lease_releases_it::<$adapter>();
        }

        #[test]
        fn follower_redirects_to_the_leader() {
            $crate::tcp::follower_redirects::<$adapter>();
        }

        #[test]
        fn leader_hint_moves_the_next_connection() {
            $crate::tcp::leader_hint_moves::<$adapter>();
        }

        #[test]
        fn wrong_credential_is_reported_and_backs_off() {
            $crate::tcp::wrong_credential::<$adapter>();
        }

        #[test]
        fn dropping_a_waiting_acquire_closes_under_close_policy() {
            $crate::tcp::drop_waiting_close::<$adapter>();
        }

        #[test]
        fn dropping_a_waiting_acquire_keeps_the_connection_under_keep_waiter() {
            $crate::tcp::drop_waiting_keep::<$adapter>();
        }

        #[test]
        fn a_grant_never_taken_by_its_caller_is_released_by_token() {
            $crate::tcp::drop_after_grant::<$adapter>();
        }

        #[test]
        fn window_of_two_lets_the_release_pass_a_waiting_acquire() {
            $crate::tcp::window_of_two::<$adapter>();
        }

        #[cfg(feature = "tls")]
        $crate::tcp::tls::tls_tests!($adapter);
    };
}
pub(crate) use adapter_tests;

// ----- waiting, bounded -----------------------------------------------------

/// How long any one wait may take before the test fails. Far above what a
/// healthy run needs: it only turns a hang into a clear failure.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// `fut`'s output, or `None` if `limit` passes first.
pub async fn within_opt<A: Adapter, T>(limit: Duration, fut: impl Future<Output = T>) -> Option<T> {
    let mut fut = pin!(fut);
    let mut timer = pin!(A::sleep(limit));
    poll_fn(|cx| {
        if let Poll::Ready(value) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(value));
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// `fut`'s output; fails the test if it takes longer than `limit`.
pub async fn within_for<A: Adapter, T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = T>,
) -> T {
    match within_opt::<A, T>(limit, fut).await {
        Some(value) => value,
        None => panic!("[{}] timed out after {limit:?} waiting for {what}", A::NAME),
    }
}

/// `fut`'s output; fails the test if it takes longer than [`PATIENCE`].
pub async fn within<A: Adapter, T>(what: &str, fut: impl Future<Output = T>) -> T {
    within_for::<A, T>(PATIENCE, what, fut).await
}

/// A client's notices, read in order.
pub struct Notices {
    rx: NoticeRx,
}

impl Notices {
    pub fn new(rx: NoticeRx) -> Notices {
        Notices { rx }
    }

    /// Skips notices until one matches `pred`; returns it and the ones
    /// skipped, in order.
    pub async fn until<A: Adapter>(
        &mut self,
        what: &str,
        mut pred: impl FnMut(&Event) -> bool,
    ) -> (Event, Vec<Event>) {
        let mut skipped = Vec::new();
        let rx = &mut self.rx;
        let found = within_opt::<A, _>(PATIENCE, async {
            while let Some(event) = rx.recv().await {
                if pred(&event) {
                    return Some(event);
                }
                skipped.push(event);
            }
            None
        })
        .await;
        match found {
            Some(Some(event)) => (event, skipped),
            Some(None) => panic!(
                "[{}] the notices ended before {what}; seen: {skipped:?}",
                A::NAME
            ),
            None => panic!(
                "[{}] timed out after {PATIENCE:?} waiting for {what}; seen: {skipped:?}",
                A::NAME
            ),
        }
    }

    /// The next notice.
    pub async fn next<A: Adapter>(&mut self, what: &str) -> Event {
        self.until::<A>(what, |_| true).await.0
    }

    /// Waits for an orphan release (a grant nobody took, released by its
    /// exact token) and for it to settle `Released`; returns its key and
    /// token, and the other notices seen meanwhile.
    pub async fn orphan_released<A: Adapter>(&mut self) -> (Key, u64, Vec<Event>) {
        let (orphan, mut seen) = self
            .until::<A>("the orphan release", |e| {
                matches!(e, Event::OrphanRelease { .. })
            })
            .await;
        let Event::OrphanRelease { key, token } = orphan else {
            unreachable!("matched above")
        };
        let (settled, between) = self
            .until::<A>("the orphan settled", |e| {
                matches!(e, Event::OrphanSettled { .. })
            })
            .await;
        assert_eq!(
            settled,
            Event::OrphanSettled {
                key: key.clone(),
                token,
                result: ReleaseResult::Released
            },
            "[{}]",
            A::NAME
        );
        seen.extend(between);
        (key, token, seen)
    }

    /// The notices already delivered, without waiting.
    pub fn drain(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.rx.try_recv() {
            events.push(event);
        }
        events
    }
}

// ----- the server side ------------------------------------------------------

/// A tokio runtime of its own for the servers and taps.
pub struct Lab {
    rt: tokio::runtime::Runtime,
}

impl Lab {
    pub fn start() -> Lab {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tcp-lab")
            .enable_all()
            .build()
            .expect("a tokio runtime for the servers");
        Lab { rt }
    }

    /// Serves `core` on a fresh loopback port.
    pub async fn serve(&self, core: Server) -> ServerHandle {
        self.serve_at(core, "127.0.0.1:0".parse().expect("an address"))
            .await
    }

    /// Serves `core` on `addr` (a port a stopped server used, say).
    pub async fn serve_at(&self, core: Server, addr: SocketAddr) -> ServerHandle {
        self.rt
            .spawn(async move { ticketing::serve::bind(&addr.to_string(), core).await })
            .await
            .expect("the lab runtime runs")
            .unwrap_or_else(|e| panic!("cannot serve on {addr}: {e}"))
    }

    /// Stops a server and hands back its core.
    pub async fn stop(&self, server: ServerHandle) -> Server {
        self.rt
            .spawn(async move { tokio::time::timeout(PATIENCE, server.stop()).await })
            .await
            .expect("the lab runtime runs")
            .expect("the server stops in time")
            .expect("the server task ends cleanly")
    }

    /// A relay to `upstream` that records what clients send.
    pub async fn tap(&self, upstream: SocketAddr) -> Tap {
        let (seen, _) = watch::channel(0u64);
        let log = Arc::new(TapLog {
            conns: Mutex::new(Vec::new()),
            seen,
        });
        let (listener, addr) = self.listen("the tap").await;
        self.rt.spawn(relay(listener, upstream, Arc::clone(&log)));
        Tap { addr, log }
    }

    /// A listener on a fresh loopback port, on the lab's runtime, and its
    /// address.
    async fn listen(&self, what: &str) -> (TcpListener, SocketAddr) {
        let listener = self
            .rt
            .spawn(TcpListener::bind("127.0.0.1:0"))
            .await
            .expect("the lab runtime runs")
            .unwrap_or_else(|e| panic!("bind {what}: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("the address of {what}: {e}"));
        (listener, addr)
    }
}

/// A server configuration named `node`, changed by `tweak`.
pub fn server_config(node: &str, tweak: impl FnOnce(&mut server::Config)) -> server::Config {
    let mut config = server::Config::new(name(node));
    tweak(&mut config);
    config
}

/// Nobody holds or waits for `key` at `core`.
#[track_caller]
pub fn assert_free(core: &Server, key: &str, why: &str) {
    assert!(
        core.holder(key).is_none() && core.queue_len(key) == 0,
        "{why}"
    );
}

/// A fresh server core.
pub fn server_core(config: server::Config) -> Server {
    Server::new(config, Time::ZERO).expect("a valid server configuration")
}

/// One frame, split into its fields.
pub type Frame = Vec<String>;

struct TapLog {
    /// Bytes from the client, per accepted connection, in accept order.
    conns: Mutex<Vec<Vec<u8>>>,
    /// Bumped whenever bytes are recorded.
    seen: watch::Sender<u64>,
}

impl TapLog {
    fn conns(&self) -> MutexGuard<'_, Vec<Vec<u8>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A TCP relay in front of a server that records every frame the client
/// sends, per connection. It is a pure relay: each client connection gets
/// its own connection to the server, and an end on either side is passed on.
pub struct Tap {
    addr: SocketAddr,
    log: Arc<TapLog>,
}

impl Tap {
    pub fn endpoint(&self) -> Endpoint {
        endpoint(self.addr)
    }

    /// The whole frames each connection carried from the client, in order.
    pub fn frames(&self) -> Vec<Vec<Frame>> {
        self.log
            .conns()
            .iter()
            .map(|bytes| frames_of(bytes))
            .collect()
    }

    /// Waits until what the clients sent satisfies `pred`.
    /// Waits until the client has sent `count` acquires of `k`, over every
    /// connection.
    pub async fn wait_for_acquires<A: Adapter>(&self, what: &str, k: &str, count: usize) {
        self.wait_for::<A>(what, |conns| {
            conns.iter().flatten().filter(|f| is_acquire(f, k)).count() == count
        })
        .await;
    }

    pub async fn wait_for<A: Adapter>(&self, what: &str, pred: impl Fn(&[Vec<Frame>]) -> bool) {
        let mut changes = self.log.seen.subscribe();
        let done = within_opt::<A, _>(PATIENCE, async {
            loop {
                if pred(&self.frames()) {
                    return;
                }
                changes
                    .changed()
                    .await
                    .expect("the tap lives as long as the test");
            }
        })
        .await;
        if done.is_none() {
            panic!(
                "[{}] timed out after {PATIENCE:?} waiting for {what} on the wire; sent so far: {:?}",
                A::NAME,
                self.frames()
            );
        }
    }
}

fn frames_of(bytes: &[u8]) -> Vec<Frame> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines: Vec<&str> = text.split('\n').collect();
    // The unfinished tail (empty when the bytes end with a whole frame).
    lines.pop();
    lines
        .into_iter()
        .map(|line| line.split(' ').map(str::to_owned).collect())
        .collect()
}

async fn relay(listener: TcpListener, upstream: SocketAddr, log: Arc<TapLog>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let conn = {
            let mut conns = log.conns();
            conns.push(Vec::new());
            conns.len() - 1
        };
        let log = Arc::clone(&log);
        tokio::spawn(async move {
            // No server there: the client sees its connection end.
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let up = async {
                let mut buf = vec![0u8; 4096];
                loop {
                    match client_read.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            log.conns()[conn].extend_from_slice(&buf[..n]);
                            log.seen.send_modify(|n| *n += 1);
                            if server_write.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = server_write.shutdown().await;
            };
            let down = async {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                let _ = client_write.shutdown().await;
            };
            tokio::join!(up, down);
        });
    }
}

fn is_acquire(frame: &Frame, key: &str) -> bool {
    frame.first().map(String::as_str) == Some("A") && frame.get(2).map(String::as_str) == Some(key)
}

fn is_release(frame: &Frame, key: &str, token: u64) -> bool {
    frame.first().map(String::as_str) == Some("R")
        && frame.get(2).map(String::as_str) == Some(key)
        && frame.get(3) == Some(&token.to_string())
}

// ----- small helpers ---------------------------------------------------------

pub fn key(s: &str) -> Key {
    Key::new(s).expect("a valid key")
}

pub fn name(s: &str) -> Name {
    Name::new(s).expect("a valid name")
}

pub fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::new(addr.to_string()).expect("a valid endpoint")
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Starts a futures-io client with its notices; `spawn` runs its driver.
#[cfg(feature = "futures-io")]
#[allow(dead_code)] // in the crates of the other adapters
pub fn futures_io_client<C: ticketing::futures_io::Connector>(
    config: Config,
    connector: C,
    spawn: impl FnOnce(ticketing::futures_io::Driver<C>),
) -> (ticketing::futures_io::Handle, NoticeRx) {
    let (handle, driver, notices) = ticketing::futures_io::client_with_notices(config, connector)
        .expect("a valid client configuration");
    spawn(driver);
    (handle, NoticeRx::Async(notices))
}

/// A client of the endpoint, with the defaults of PROTOCOL.md.
pub fn client_config(endpoint: &Endpoint, id: &str) -> Config {
    Config::new([endpoint.clone()], name(id))
}

/// A client of `endpoint` named `id`, with its configuration changed by
/// `tweak`, and its notices.
pub fn connect_with<A: Adapter>(
    endpoint: &Endpoint,
    id: &str,
    tweak: impl FnOnce(&mut Config),
) -> (A::Client, Notices) {
    let mut config = client_config(endpoint, id);
    tweak(&mut config);
    let (client, notices) = A::connect(config);
    (client, Notices::new(notices))
}

/// A lease no scenario outlives: what ends a grant is a release.
const LONG_LEASE: Duration = Duration::from_secs(30);
/// A wait no scenario outlives: what ends a waiting acquire is an event.
const LONG_WAIT: Duration = Duration::from_secs(20);

fn granted(what: &str, outcome: Result<Grant, AcquireError>) -> Grant {
    match outcome {
        Ok(grant) => grant,
        other => panic!("{what}: expected a grant, got {other:?}"),
    }
}

fn is_connected(event: &Event) -> bool {
    matches!(event, Event::Connected { .. })
}

fn is_closed(event: &Event) -> bool {
    matches!(event, Event::Closed { .. })
}

async fn acquire_now<A: Adapter>(client: &A::Client, k: &str) -> Grant {
    let what = format!("the grant of {k}");
    let outcome = within::<A, _>(
        &what,
        A::acquire(client, key(k), name("me"), Duration::ZERO, LONG_LEASE),
    )
    .await;
    granted(&what, outcome)
}

/// A renewed lock of `r` for `lease`, taken at once.
async fn lock_r<A: Adapter>(client: &A::Client, lease: Duration) -> A::Lease {
    within::<A, _>("the lock", A::lock(client, key("r"), lease, true))
        .await
        .unwrap_or_else(|e| panic!("[{}] the lock: {e}", A::NAME))
}

async fn release<A: Adapter>(client: &A::Client, grant: &Grant) {
    let what = format!(
        "the release of {} (token {})",
        grant.key().as_str(),
        grant.token()
    );
    let outcome = within::<A, _>(&what, A::release(client, grant.clone())).await;
    assert!(
        matches!(outcome, Ok(Outcome::Released)),
        "{what}: {outcome:?}"
    );
}

/// Waits for the first close, which must be for `reason`, with no welcome
/// before it.
async fn refused_as<A: Adapter>(notices: &mut Notices, ep: &Endpoint, reason: CloseReason) {
    let (closed, before) = notices.until::<A>("the refusal", is_closed).await;
    let want = Event::Closed {
        addr: ep.clone(),
        reason,
    };
    assert_eq!(closed, want, "[{}]", A::NAME);
    assert!(
        !before.iter().any(is_connected),
        "[{}] no handshake was accepted: {before:?}",
        A::NAME
    );
}

/// Every connection attempt fails: a try-lock waits for a connection for
/// its queue grace and ends without being sent, carrying why the latest
/// attempt failed: as `Misconfigured` if that is a refusal (TLS trust),
/// else as `TimedOut`.
pub(crate) async fn try_lock_unwelcomed<A: Adapter>(client: &A::Client, why: &CloseReason) {
    let outcome = within::<A, _>(
        "a try-lock while every attempt fails",
        A::acquire(client, key("k"), name("me"), Duration::ZERO, LONG_LEASE),
    )
    .await;
    let cause = match &outcome {
        Err(AcquireError::TimedOut {
            sent: false,
            cause: Some(cause),
        }) if !cause.is_refusal() => cause,
        Err(AcquireError::Misconfigured(cause)) if cause.is_refusal() => cause,
        _ => panic!(
            "[{}] nothing is asked without a welcome, and the outcome says why ({why}): {outcome:?}",
            A::NAME
        ),
    };
    assert_eq!(cause.reason(), why, "[{}] {outcome:?}", A::NAME);
}

/// Every handshake of a round was refused with `auth_failed`: the client
/// is misconfigured, and a try-lock is refused at once with that cause.
async fn try_lock_misconfigured<A: Adapter>(client: &A::Client) {
    let outcome = within::<A, _>(
        "a try-lock while every attempt is refused",
        A::acquire(client, key("k"), name("me"), Duration::ZERO, LONG_LEASE),
    )
    .await;
    assert!(
        matches!(&outcome, Err(AcquireError::Misconfigured(cause)) if *cause.reason() == CloseReason::AuthFailed),
        "[{}] refused at once, with the cause: {outcome:?}",
        A::NAME
    );
}

async fn shutdown<A: Adapter>(client: &A::Client) {
    let result = within::<A, _>("the shutdown", A::shutdown(client, Duration::from_secs(2))).await;
    assert!(result.is_ok(), "shutdown: {result:?}");
}

// ----- 1. contention ----------------------------------------------------------

const CLIENTS: usize = 4;
const WORKERS: usize = 32;
const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
const CONTENTION_RUN: Duration = Duration::from_millis(2500);
const CONTENTION_WAIT: Duration = Duration::from_secs(2);
const CONTENTION_LEASE: Duration = Duration::from_secs(2);
const CRITICAL_SECTION: Duration = Duration::from_millis(1);

/// Storage guarded by fencing tokens: it takes a write for a key only with
/// a token at least the last one it took for that key.
#[derive(Default)]
struct Fenced {
    state: Mutex<FencedState>,
}

#[derive(Default)]
struct FencedState {
    last: HashMap<&'static str, u64>,
    /// Per key, every token that wrote, in the order it first wrote.
    history: HashMap<&'static str, Vec<u64>>,
    refused: Vec<String>,
}

impl Fenced {
    fn write(&self, key: &'static str, token: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let last = state.last.get(key).copied().unwrap_or(0);
        if token < last {
            state
                .refused
                .push(format!("{key}: token {token} after {last}"));
        } else if token > last {
            state.last.insert(key, token);
            state.history.entry(key).or_default().push(token);
        }
    }
}

/// What the workers saw.
#[derive(Default)]
struct Tally {
    acquires: usize,
    /// Per key, the tokens granted.
    granted: HashMap<&'static str, Vec<u64>>,
    not_granted: usize,
    releases: usize,
    released: usize,
    unexpected: Vec<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.acquires += other.acquires;
        for (k, tokens) in other.granted {
            self.granted.entry(k).or_default().extend(tokens);
        }
        self.not_granted += other.not_granted;
        self.releases += other.releases;
        self.released += other.released;
        self.unexpected.extend(other.unexpected);
    }

    fn grants(&self) -> usize {
        self.granted.values().map(Vec::len).sum()
    }
}

async fn contend<A: Adapter>(
    client: A::Client,
    worker: usize,
    end: Instant,
    fenced: Arc<Fenced>,
) -> Tally {
    let owner = name(&format!("w{worker}"));
    let mut tally = Tally::default();
    let mut round = 0;
    while Instant::now() < end {
        let k = KEYS[(worker + round) % KEYS.len()];
        round += 1;
        tally.acquires += 1;
        match A::acquire(
            &client,
            key(k),
            owner.clone(),
            CONTENTION_WAIT,
            CONTENTION_LEASE,
        )
        .await
        {
            Ok(grant) => {
                tally.granted.entry(k).or_default().push(grant.token());
                fenced.write(k, grant.token());
                A::sleep(CRITICAL_SECTION).await;
                fenced.write(k, grant.token());
                tally.releases += 1;
                match A::release(&client, grant).await {
                    Ok(Outcome::Released) => tally.released += 1,
                    other => tally.unexpected.push(format!("release of {k}: {other:?}")),
                }
            }
            Err(AcquireError::TimedOut { .. } | AcquireError::Busy) => tally.not_granted += 1,
            other => tally.unexpected.push(format!("acquire of {k}: {other:?}")),
        }
    }
    tally
}

/// 32 tasks on 4 clients contend for 4 keys, writing to fenced storage in a
/// short critical section between acquire and release.
pub fn contention<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let server = lab.serve(server_core(server_config("n1", |_| {}))).await;
        let ep = endpoint(server.local_addr());
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let (client, notices) = A::connect(client_config(&ep, &format!("c{c}")));
            let mut notices = Notices::new(notices);
            notices
                .until::<A>("a contender's Connected", is_connected)
                .await;
            clients.push((client, notices));
        }
        let fenced = Arc::new(Fenced::default());
        let end = Instant::now() + CONTENTION_RUN;
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let client = clients[w % CLIENTS].0.clone();
                A::spawn(contend::<A>(client, w, end, Arc::clone(&fenced)))
            })
            .collect();
        let mut tally = Tally::default();
        for (w, worker) in workers.into_iter().enumerate() {
            tally.merge(within::<A, _>(&format!("contention worker {w} to finish"), worker).await);
        }

        assert!(
            tally.unexpected.is_empty(),
            "unexpected results: {:?}",
            tally.unexpected
        );
        assert_eq!(
            tally.acquires,
            tally.grants() + tally.not_granted,
            "every acquire ends in exactly one outcome"
        );
        assert_eq!(
            tally.releases, tally.released,
            "every release ends Released"
        );
        {
            let state = fenced.state.lock().unwrap_or_else(|e| e.into_inner());
            assert!(
                state.refused.is_empty(),
                "the fenced storage refused writes: {:?}",
                state.refused
            );
            for k in KEYS {
                let mut tokens = tally.granted.get(k).cloned().unwrap_or_default();
                assert!(!tokens.is_empty(), "nobody ever held {k}");
                tokens.sort_unstable();
                // The storage saw each grant's token once, in increasing order:
                // every grant had its own token, greater than every earlier one.
                assert_eq!(
                    state.history.get(k),
                    Some(&tokens),
                    "the grants of {k} in the order they held it"
                );
            }
        }

        for (client, _) in &clients {
            shutdown::<A>(client).await;
        }
        let core = lab.stop(server).await;
        assert_eq!(
            core.lock_table().last_token(),
            u64::try_from(tally.grants()).unwrap(),
            "the server made exactly the grants the clients were told of"
        );
        assert_eq!(
            core.lock_table().holders().count(),
            0,
            "every grant was released"
        );
        assert_eq!(core.lock_table().waiters(), 0, "nothing waits");
        eprintln!(
            "[{}] contention: {} acquires, {} grants, {} not granted",
            A::NAME,
            tally.acquires,
            tally.grants(),
            tally.not_granted
        );
    });
}

// ----- 2. the server stops mid-flight and starts again -----------------------

/// A release and an acquire are in flight when the server stops; a new
/// server with the old lock table starts on the same port.
pub fn server_restart<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let first = lab.serve(server_core(server_config("n1", |_| {}))).await;
        let port = first.local_addr();
        let tap = lab.tap(port).await;
        let (client, notices) = A::connect(client_config(&tap.endpoint(), "c"));
        let mut notices = Notices::new(notices);
        notices
            .until::<A>(
                "Connected to n1",
                |e| matches!(e, Event::Connected { node, .. } if node.as_str() == "n1"),
            )
            .await;
        let held = acquire_now::<A>(&client, "r").await;

        // Hang n1: its core takes no more bytes. An L announced after the
        // pause, on the same control queue, shows when the pause holds.
        first.pause();
        let nowhere = Endpoint::new("127.0.0.1:9").expect("an endpoint");
        first.announce_leader(nowhere.clone());
        notices
            .until::<A>(
                "the L sent after the pause",
                |e| matches!(e, Event::HintIgnored { addr } if *addr == nowhere),
            )
            .await;

        let release_done = A::spawn(A::release(&client, held.clone()));
        let acquire_done = A::spawn(A::acquire(
            &client,
            key("x"),
            name("me"),
            ms(5000),
            LONG_LEASE,
        ));
        // The connection that carried the acquire of r is the one in use.
        let in_use = tap
            .frames()
            .iter()
            .position(|frames| frames.iter().any(|f| is_acquire(f, "r")))
            .expect("the acquire of r went through the tap");
        tap.wait_for::<A>("the R of r and the A of x", |conns| {
            let frames = &conns[in_use];
            frames.iter().any(|f| is_release(f, "r", held.token()))
                && frames.iter().any(|f| is_acquire(f, "x"))
        })
        .await;

        let mut old = lab.stop(first).await;
        assert_eq!(
            old.holder("r").map(|h| h.token),
            Some(held.token()),
            "the hung server never took the release"
        );
        assert_free(&old, "x", "the hung server never took the acquire");
        let now = old.now();
        let table = old.take_lock_table(now);
        let mut core =
            Server::new(server_config("n2", |_| {}), now).expect("a valid server configuration");
        core.install_lock_table(now, table);
        let second = lab.serve_at(core, port).await;

        let released = within::<A, _>("the release in flight", release_done).await;
        assert!(
            matches!(released, Ok(Outcome::Released)),
            "the release is sent again and settles: {released:?}"
        );
        let acquired = within::<A, _>("the acquire in flight", acquire_done).await;
        assert!(
            matches!(acquired, Err(AcquireError::Indeterminate { .. })),
            "an acquire in flight when the connection closes ends Indeterminate: {acquired:?}"
        );
        let (_, before) = notices
            .until::<A>(
                "Connected to n2",
                |e| matches!(e, Event::Connected { node, .. } if node.as_str() == "n2"),
            )
            .await;
        assert!(
            before.iter().any(is_closed),
            "the connection to n1 closed: {before:?}"
        );

        let conns = tap.frames();
        let later: Vec<&Frame> = conns[in_use + 1..].iter().flatten().collect();
        assert!(
            later.iter().any(|f| is_release(f, "r", held.token())),
            "the release went out again on a later connection: {conns:?}"
        );
        assert_eq!(
            conns
                .iter()
                .flatten()
                .filter(|f| is_acquire(f, "x"))
                .count(),
            1,
            "the acquire went out once and was never sent again: {conns:?}"
        );

        shutdown::<A>(&client).await;
        let new = lab.stop(second).await;
        assert!(
            new.holder("r").is_none(),
            "the resent release freed r on the new server"
        );
        assert_free(&new, "x", "the new server never saw the acquire of x");
        assert_eq!(
            new.lock_table().last_token(),
            held.token(),
            "the new server granted nothing"
        );
    });
}

// ----- 2b. renewal -------------------------------------------------------------

/// The lease of the renewal scenarios: short, so that three of them pass
/// quickly.
const SHORT_LEASE: Duration = Duration::from_millis(300);

/// A lock renewed automatically is held past three times its lease while
/// another client's try-locks keep timing out; released, the other gets it.
pub fn renewal_keeps_a_lock<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let server = lab.serve(server_core(server_config("n1", |_| {}))).await;
        let ep = endpoint(server.local_addr());
        let (holder, _notices) = A::connect(client_config(&ep, "holder"));
        let (other, _other_notices) = A::connect(client_config(&ep, "other"));
        let lease = lock_r::<A>(&holder, SHORT_LEASE).await;
        let (token, status) = A::lease_state(&lease);
        let first_until = status.valid_until().expect("valid");
        let start = std::time::Instant::now();
        let mut tries = 0;
        while start.elapsed() < SHORT_LEASE * 4 {
            let outcome = within::<A, _>(
                "a try-lock of the held key",
                A::acquire(&other, key("r"), name("other"), Duration::ZERO, SHORT_LEASE),
            )
            .await;
            assert!(
                matches!(
                    outcome,
                    Err(AcquireError::TimedOut {
                        sent: true,
                        cause: None
                    })
                ),
                "[{}] the key is held: {outcome:?}",
                A::NAME
            );
            tries += 1;
            A::sleep(Duration::from_millis(50)).await;
        }
        let (_, status) = A::lease_state(&lease);
        assert!(
            matches!(status, LeaseStatus::Valid { .. }),
            "[{}] still held: {status:?}",
            A::NAME
        );
        let until = status.valid_until().expect("valid");
        assert!(
            until >= first_until + 3 * SHORT_LEASE,
            "[{}] renewed on and on: valid until {until:?}, first {first_until:?}",
            A::NAME
        );
        let released = within::<A, _>("the release", A::release_lease(lease)).await;
        assert!(matches!(released, Ok(Outcome::Released)), "{released:?}");
        let grant = granted(
            "the other's lock once released",
            within::<A, _>(
                "the other's acquire",
                A::acquire(&other, key("r"), name("other"), Duration::ZERO, SHORT_LEASE),
            )
            .await,
        );
        assert!(grant.token() > token);
        assert!(tries >= 10, "{tries} tries");
        shutdown::<A>(&holder).await;
        shutdown::<A>(&other).await;
        lab.stop(server).await;
    });
}

/// A server that restarts without its table under an auto-renewed lock:
/// the holder is told the lease is lost, or expired, never nothing.
pub fn renewal_across_a_restart<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let first = lab.serve(server_core(server_config("n1", |_| {}))).await;
        let port = first.local_addr();
        let (client, _notices) = A::connect(client_config(&endpoint(port), "c"));
        let lease = lock_r::<A>(&client, SHORT_LEASE).await;
        drop(lab.stop(first).await);
        let second = lab
            .serve_at(server_core(server_config("n2", |_| {})), port)
            .await;
        let mut lease = lease;
        let mut status = A::lease_state(&lease).1;
        let start = std::time::Instant::now();
        while !status.is_over() {
            assert!(
                start.elapsed() < PATIENCE,
                "[{}] silence after the restart: {status:?}",
                A::NAME
            );
            (lease, status) = A::lease_changed(lease, PATIENCE).await;
        }
        assert!(
            matches!(status, LeaseStatus::Lost | LeaseStatus::Expired { .. }),
            "{status:?}"
        );
        drop(lease);
        shutdown::<A>(&client).await;
        lab.stop(second).await;
    });
}

/// A guard dropped without a release releases its grant by exact token.
pub fn dropping_a_lease_releases_it<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let server = lab.serve(server_core(server_config("n1", |_| {}))).await;
        let ep = endpoint(server.local_addr());
        let (client, _notices) = A::connect(client_config(&ep, "c"));
        let lease = lock_r::<A>(&client, LONG_LEASE).await;
        let token = A::lease_state(&lease).0;
        drop(lease);
        // Another acquire of the key gets it long before the lease ends.
        let grant = granted(
            "the lock once its guard is dropped",
            within::<A, _>(
                "the acquire after the drop",
                A::acquire(
                    &client,
                    key("r"),
                    name("me"),
                    Duration::from_secs(5),
                    LONG_LEASE,
                ),
            )
            .await,
        );
        assert!(grant.token() > token);
        release::<A>(&client, &grant).await;
        shutdown::<A>(&client).await;
        lab.stop(server).await;
    });
}

// ----- 3. redirects, hints, credentials --------------------------------------

/// A follower answers `M leader`; the client follows it to the leader.
pub fn follower_redirects<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let leader = lab
            .serve(server_core(server_config("leader", |_| {})))
            .await;
        let leader_ep = endpoint(leader.local_addr());
        let follower = lab
            .serve(server_core(server_config("follower", |c| {
                c.role = Role::Follower {
                    leader: leader_ep.clone(),
                }
            })))
            .await;
        let follower_ep = endpoint(follower.local_addr());
        let (client, mut notices) =
            connect_with::<A>(&follower_ep, "c", |c| c.allow = vec![leader_ep.clone()]);

        let (connected, before) = notices.until::<A>("Connected", is_connected).await;
        assert!(
            matches!(&connected, Event::Connected { addr, node, .. } if *addr == leader_ep && node.as_str() == "leader"),
            "the Connected notice names the leader {leader_ep:?}: {connected:?}"
        );
        assert!(
            before.contains(&Event::LeaderHint {
                addr: leader_ep.clone()
            }),
            "the M was taken as a hint: {before:?}"
        );
        assert!(
            before.contains(&Event::Closed {
                addr: follower_ep.clone(),
                reason: CloseReason::Moved
            }),
            "the follower's connection closed as moved: {before:?}"
        );

        let grant = acquire_now::<A>(&client, "k").await;
        release::<A>(&client, &grant).await;
        shutdown::<A>(&client).await;
        let leader = lab.stop(leader).await;
        let follower = lab.stop(follower).await;
        assert_eq!(
            leader.lock_table().last_token(),
            1,
            "the leader served the acquire"
        );
        assert_eq!(
            follower.lock_table().last_token(),
            0,
            "the follower served nothing"
        );
    });
}

/// An `L` hint (configured, then announced) moves the next connection.
pub fn leader_hint_moves<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let b = lab.serve(server_core(server_config("b", |_| {}))).await;
        let b_ep = endpoint(b.local_addr());
        let a = lab
            .serve(server_core(server_config("a", |c| {
                c.leader_hint = Some(b_ep.clone())
            })))
            .await;
        let a_ep = endpoint(a.local_addr());
        let (client, mut notices) = connect_with::<A>(&a_ep, "c", |c| c.allow = vec![b_ep.clone()]);
        let connected_to = |ep: &Endpoint, node: &str, event: &Event| matches!(event, Event::Connected { addr, node: n, .. } if addr == ep && n.as_str() == node);

        let (first, _) = notices.until::<A>("Connected to a", is_connected).await;
        assert!(
            connected_to(&a_ep, "a", &first),
            "first connection to a: {first:?}"
        );
        let (hint, skipped) = notices
            .until::<A>("the L after W", |e| matches!(e, Event::LeaderHint { .. }))
            .await;
        assert_eq!(hint, Event::LeaderHint { addr: b_ep.clone() });
        assert!(
            !skipped.iter().any(is_closed),
            "an L keeps the connection: {skipped:?}"
        );

        a.drop_connections();
        let (second, before) = notices.until::<A>("the next Connected", is_connected).await;
        assert!(
            connected_to(&b_ep, "b", &second),
            "the next connection goes to the hint b: {second:?}"
        );
        assert!(
            before
                .iter()
                .any(|e| matches!(e, Event::Closed { addr, .. } if *addr == a_ep)),
            "the connection to a closed: {before:?}"
        );

        b.announce_leader(a_ep.clone());
        let (hint, _) = notices
            .until::<A>("the announced L", |e| matches!(e, Event::LeaderHint { .. }))
            .await;
        assert_eq!(hint, Event::LeaderHint { addr: a_ep.clone() });
        b.drop_connections();
        let (third, _) = notices.until::<A>("the next Connected", is_connected).await;
        assert!(
            connected_to(&a_ep, "a", &third),
            "the next connection goes to the hint a: {third:?}"
        );

        let grant = acquire_now::<A>(&client, "k").await;
        release::<A>(&client, &grant).await;
        shutdown::<A>(&client).await;
        let a = lab.stop(a).await;
        lab.stop(b).await;
        assert_eq!(a.lock_table().last_token(), 1, "a served the acquire");
    });
}

/// A wrong credential: `E auth_failed`, the AuthFailed notice, a long
/// backoff, and nothing asked meanwhile. The right one is welcome.
pub fn wrong_credential<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let server = lab
            .serve(server_core(server_config("n1", |c| {
                c.credential = Some(name("s3cret"))
            })))
            .await;
        let ep = endpoint(server.local_addr());
        let (client, mut notices) = connect_with::<A>(&ep, "c", |c| {
            c.credential = Some(name("wrong"));
            c.queue_grace = ms(300);
        });

        refused_as::<A>(&mut notices, &ep, CloseReason::AuthFailed).await;
        assert_eq!(
            notices.next::<A>("the AuthFailed notice").await,
            Event::AuthFailed { addr: ep.clone() }
        );
        let backoff = notices.next::<A>("the backoff").await;
        assert!(
            matches!(
                backoff,
                Event::Backoff {
                    cause: BackoffCause::AuthFailed,
                    ..
                }
            ),
            "an auth_failed backoff: {backoff:?}"
        );
        assert_eq!(
            notices.next::<A>("misconfigured").await,
            Event::Misconfigured {
                cause: CloseReason::AuthFailed
            }
        );
        try_lock_misconfigured::<A>(&client).await;
        shutdown::<A>(&client).await;

        // An acquire made as the client starts, before the refusal (which
        // takes a round trip): the refusal ends it, not its wait, and in
        // the same shape.
        let (client, _notices) = connect_with::<A>(&ep, "c3", |c| {
            c.credential = Some(name("wrong"));
        });
        let started = Instant::now();
        let outcome = within::<A, _>(
            "an acquire made before the refusal",
            A::acquire(&client, key("k"), name("me"), LONG_WAIT, LONG_LEASE),
        )
        .await;
        assert!(
            matches!(&outcome, Err(AcquireError::Misconfigured(cause)) if *cause.reason() == CloseReason::AuthFailed),
            "[{}] one shape for a refusal: {outcome:?}",
            A::NAME
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "[{}] ended by the refusal: {:?}",
            A::NAME,
            started.elapsed()
        );
        shutdown::<A>(&client).await;

        let (client, mut notices) =
            connect_with::<A>(&ep, "c2", |c| c.credential = Some(name("s3cret")));
        let (connected, before) = notices
            .until::<A>("Connected with the right credential", is_connected)
            .await;
        assert!(
            matches!(&connected, Event::Connected { addr, .. } if *addr == ep),
            "{connected:?}"
        );
        assert!(!before.iter().any(is_closed), "{before:?}");
        shutdown::<A>(&client).await;
        lab.stop(server).await;
    });
}

// ----- 4. dropping a waiting acquire -------------------------------------------

/// The client holds `k`, an acquire of `k` waits in the server's queue, and
/// a grant of `p` made after it proves that the server has queued it.
/// Returns the grants of `k` and `p` and the waiting acquire.
async fn hold_with_waiter<A: Adapter>(client: &A::Client) -> (Grant, Grant, A::Pending) {
    let held = acquire_now::<A>(client, "k").await;
    let waiting = A::start_acquire(client, key("k"), name("waiter"), LONG_WAIT, LONG_LEASE);
    // Requests of one connection are handled in order: once p is granted,
    // the acquire of k sent before it waits in k's queue.
    let probe = acquire_now::<A>(client, "p").await;
    (held, probe, waiting)
}

/// Under `CancelPolicy::Close`, dropping a waiting acquire closes the
/// connection (reason `cancel`); the client works on afterwards.
pub fn drop_waiting_close<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let server = lab.serve(server_core(server_config("n1", |_| {}))).await;
        let ep = endpoint(server.local_addr());
        let (client, mut notices) = connect_with::<A>(&ep, "c", |c| c.cancel = CancelPolicy::Close);
        notices.until::<A>("Connected", is_connected).await;
        let (held, probe, waiting) = hold_with_waiter::<A>(&client).await;

        drop(waiting);
        let (closed, _) = notices.until::<A>("the close", is_closed).await;
        assert_eq!(
            closed,
            Event::Closed {
                addr: ep.clone(),
                reason: CloseReason::Cancel
            }
        );
        notices.until::<A>("the reconnection", is_connected).await;

        // Grants outlive the connection; the dropped waiter does not: the
        // next waiter of k is granted as soon as k is released.
        let next = A::start_acquire(&client, key("k"), name("next"), LONG_WAIT, LONG_LEASE);
        release::<A>(&client, &held).await;
        let what = "the acquire of k after the drop";
        let after = granted(what, within::<A, _>(what, A::finish(next)).await);
        assert!(after.token() > probe.token(), "a fresh grant: {after:?}");
        release::<A>(&client, &after).await;
        release::<A>(&client, &probe).await;

        let seen = notices.drain();
        assert!(
            !seen
                .iter()
                .any(|e| matches!(e, Event::OrphanRelease { .. })),
            "no answer ever came for the dropped acquire: {seen:?}"
        );
        shutdown::<A>(&client).await;
        let core = lab.stop(server).await;
        assert_free(&core, "k", "k is free");
        assert_eq!(
            core.lock_table().last_token(),
            after.token(),
            "the server never granted the dropped acquire"
        );
    });
}

/// Under `CancelPolicy::KeepWaiter`, dropping a waiting acquire keeps the
/// connection; its grant, when it comes, is released by exact token.
pub fn drop_waiting_keep<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let server = lab.serve(server_core(server_config("n1", |_| {}))).await;
        let ep = endpoint(server.local_addr());
        let (client, mut notices) =
            connect_with::<A>(&ep, "c", |c| c.cancel = CancelPolicy::KeepWaiter);
        notices.until::<A>("Connected", is_connected).await;
        let (held, probe, waiting) = hold_with_waiter::<A>(&client).await;

        drop(waiting);
        // The cancel reaches the core before the release: the waiter is
        // abandoned when k is released, and its grant comes back.
        release::<A>(&client, &held).await;
        let (k, token, seen) = notices.orphan_released::<A>().await;
        assert_eq!(k.as_str(), "k");
        assert!(
            token > probe.token(),
            "the waiter's grant came after the probe's: {token}"
        );
        assert!(
            !seen.iter().any(is_closed),
            "the connection stayed: {seen:?}"
        );

        // k is free on the server: a try-lock gets it at once.
        let again = acquire_now::<A>(&client, "k").await;
        assert!(again.token() > token);
        release::<A>(&client, &again).await;
        release::<A>(&client, &probe).await;
        let seen = notices.drain();
        assert!(
            !seen.iter().any(is_closed),
            "the connection stayed: {seen:?}"
        );

        shutdown::<A>(&client).await;
        let core = lab.stop(server).await;
        assert_free(&core, "k", "k is free");
        assert!(core.holder("p").is_none(), "p is free");
    });
}

/// An acquire whose grant reached the client but whose caller never took
/// it (the pending acquire is dropped unpolled after its answer came): the
/// grant goes back to the core and is released by its exact token, under
/// either cancel policy, and the connection stays.
pub fn drop_after_grant<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let server = lab.serve(server_core(server_config("n1", |_| {}))).await;
        let ep = endpoint(server.local_addr());
        for policy in [CancelPolicy::Close, CancelPolicy::KeepWaiter] {
            let (client, mut notices) = connect_with::<A>(&ep, "c", |c| c.cancel = policy);
            notices.until::<A>("Connected", is_connected).await;

            let pending = A::start_acquire(&client, key("k"), name("gone"), LONG_WAIT, LONG_LEASE);
            // One connection answers its requests in order: once the grant
            // of p is in, the grant of k, sent before it, has reached the
            // client and its pending acquire.
            let probe = acquire_now::<A>(&client, "p").await;
            drop(pending);

            let (k, token, seen) = notices.orphan_released::<A>().await;
            assert_eq!(k.as_str(), "k", "{policy:?}");
            assert!(token < probe.token(), "{policy:?}: k was granted before p");
            assert!(
                !seen.iter().any(is_closed),
                "{policy:?}: the acquire had ended, so nothing was cancelled: {seen:?}"
            );
            // k is free on the server, long before its lease would end.
            let again = acquire_now::<A>(&client, "k").await;
            release::<A>(&client, &again).await;
            release::<A>(&client, &probe).await;
            shutdown::<A>(&client).await;
        }
        let core = lab.stop(server).await;
        assert!(core.holder("k").is_none() && core.holder("p").is_none());
    });
}

// ----- 5. a window of two ------------------------------------------------------

/// Server window 2, reserved 1: the only acquire slot holds an acquire of
/// `k` waiting behind the client's own grant of `k`, and the release of that
/// grant still goes out, through the reserved slot.
pub fn window_of_two<A: Adapter>() {
    let lab = Lab::start();
    A::block_on(async {
        let server = lab
            .serve(server_core(server_config("n1", |c| c.window = 2)))
            .await;
        let tap = lab.tap(server.local_addr()).await;
        let (client, mut notices) = connect_with::<A>(&tap.endpoint(), "c", |c| c.reserved = 1);
        let (connected, _) = notices.until::<A>("Connected", is_connected).await;
        assert!(
            matches!(connected, Event::Connected { window: 2, .. }),
            "{connected:?}"
        );

        let held = acquire_now::<A>(&client, "k").await;
        let first = A::start_acquire(&client, key("k"), name("first"), LONG_WAIT, LONG_LEASE);
        tap.wait_for_acquires::<A>("the waiting acquire of k", "k", 2)
            .await;
        // The only acquire slot is taken: this one waits in the client.
        let second = A::start_acquire(&client, key("k"), name("second"), LONG_WAIT, LONG_LEASE);

        // Well before the waiting acquire's budget runs out.
        let released = within_for::<A, _>(
            ms(5000),
            "the release of k",
            A::release(&client, held.clone()),
        )
        .await;
        assert!(matches!(released, Ok(Outcome::Released)), "{released:?}");
        let what = "the first waiting acquire";
        let first = granted(what, within::<A, _>(what, A::finish(first)).await);
        assert!(first.token() > held.token());

        tap.wait_for_acquires::<A>("the second acquire of k", "k", 3)
            .await;
        let conns = tap.frames();
        assert_eq!(conns.len(), 1, "one connection throughout: {conns:?}");
        let order: Vec<usize> = conns[0]
            .iter()
            .enumerate()
            .filter(|(_, f)| is_acquire(f, "k") || is_release(f, "k", held.token()))
            .map(|(i, _)| i)
            .collect();
        let release_at = conns[0]
            .iter()
            .position(|f| is_release(f, "k", held.token()))
            .expect("the release is on the wire");
        assert_eq!(
            order.iter().position(|&i| i == release_at),
            Some(2),
            "the release went out after the waiting acquire and before the second one: {conns:?}"
        );

        release::<A>(&client, &first).await;
        let what = "the second waiting acquire";
        let second = granted(what, within::<A, _>(what, A::finish(second)).await);
        assert!(second.token() > first.token());
        release::<A>(&client, &second).await;
        shutdown::<A>(&client).await;
        let core = lab.stop(server).await;
        assert_free(&core, "k", "k is free");
    });
}
