//! What a holder knows of its connection (issue 32): a real `ticketing
//! serve` (with a state directory, so that the grant outlives it) is
//! SIGKILLed under a holder renewing a 3 s lease, then started again on the
//! same port. With the tokio adapter and with the blocking one:
//!
//! - while connected, renewals come through `renewed()` and no `changed()`
//!   fires for them;
//! - the holder is told its lease is unconfirmed within one connection
//!   attempt of the kill (well under a second, and seconds before the
//!   lease would be in jeopardy), and the handle says `Disconnected`, with
//!   how the latest attempt ended;
//! - it is told the lease is confirmed again once the new server takes the
//!   client, within the client's (small) backoff of its start, and the
//!   grant, reclaimed, is renewed through it with the same token.
//!
//! Before issue 32 the status stayed `Valid` until `Jeopardy`, 2 s after
//! the kill, and `changed()` fired at every renewal.

mod cli;

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cli::Serve;
use ticketing::client::{Backoff, CloseReason, Config, Outcome};
use ticketing::{Endpoint, Key, Name};

/// The holder's lease: renewed every second; in jeopardy with less than a
/// second left.
const LEASE: Duration = Duration::from_secs(3);

/// How long the holder may take to hear that its connection ended: well
/// under a second, and far less than the two seconds until jeopardy.
const TOLD_UNCONFIRMED: Duration = Duration::from_millis(500);

/// How long after the new server listens the holder may take to be
/// confirmed again: its backoff between attempts is 100 ms at most.
const TOLD_CONFIRMED: Duration = Duration::from_millis(900);

/// For what only has to happen at all (a renewal, a second apart).
const PATIENCE: Duration = Duration::from_secs(10);

/// A fresh directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "ticketing-conn-state-{}-{name}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `ticketing serve` on `listen`, keeping its state in `dir`, as `node`.
fn serve(listen: &str, dir: &Scratch, node: &str) -> Serve {
    let args = [
        "--state-dir",
        dir.path(),
        "--node-id",
        node,
        "--max-lease-ms",
        "3000",
        "--grace-margin-ms",
        "300",
    ];
    Serve::start_on(listen, &args, |_| {})
}

/// A client of `addr` that tries again soon after a failed attempt.
fn config(addr: &str) -> Config {
    let mut config = Config::new(
        [Endpoint::new(addr).expect("an endpoint")],
        Name::new("holder").expect("a name"),
    );
    config.backoff.transport = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
    config
}

fn key() -> Key {
    Key::new("conn-state").expect("a key")
}

/// The instant of the jeopardy of a lease valid until `until`.
fn jeopardy_at(until: Instant) -> Instant {
    until.checked_sub(LEASE / 3).unwrap_or(until)
}

mod tokio_adapter {
    use super::*;
    use ticketing::tokio::{spawn, ConnState, LeaseStatus, TcpConnector};
    use tokio::time::timeout;

    #[test]
    fn a_killed_server_leaves_the_lease_unconfirmed_at_once_and_a_new_one_confirms_it() {
        let dir = Scratch::new("tokio");
        let mut first = serve("127.0.0.1:0", &dir, "before");
        let addr = first.addr.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let handle = spawn(config(&addr), TcpConnector).expect("a client");
            handle.connected().await.expect("connected");
            let conn = handle.connection();
            assert!(
                matches!(&conn, ConnState::Connected { addr: a, node, .. }
                    if a.as_str() == addr && node.as_str() == "before"),
                "{conn:?}"
            );
            let lease = handle
                .lock(key())
                .lease(LEASE)
                .renew()
                .await
                .expect("the lock");
            let token = lease.token();
            let status = lease.status();
            assert!(
                matches!(status, LeaseStatus::Valid { confirmed: true, .. }),
                "granted: {status:?}"
            );

            // Two renewals while connected: told by `renewed()`, and no
            // `changed()` among them.
            let mut until = status.valid_until().expect("valid");
            for n in 1..=2 {
                let renewed = timeout(PATIENCE, async {
                    tokio::select! {
                        status = lease.changed() => panic!("renewal {n}: a change while connected: {status:?}"),
                        renewed = lease.renewed() => renewed,
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("no renewal {n} within {PATIENCE:?}"))
                .expect("renewed, not over");
                assert!(renewed > until, "renewal {n} moved valid_until on");
                until = renewed;
            }
            assert_eq!(
                lease.status(),
                LeaseStatus::Valid {
                    valid_until: until,
                    confirmed: true
                }
            );

            // SIGKILL, just after a renewal: two seconds before jeopardy.
            let killed_at = Instant::now();
            first.kill();
            let status = timeout(PATIENCE, lease.changed())
                .await
                .expect("told of the connection's end");
            let told = killed_at.elapsed();
            eprintln!("tokio: told unconfirmed {told:?} after the kill");
            assert_eq!(
                status,
                LeaseStatus::Valid {
                    valid_until: until,
                    confirmed: false
                },
                "after the kill"
            );
            assert!(
                told < TOLD_UNCONFIRMED,
                "told unconfirmed {told:?} after the kill"
            );
            let before_jeopardy = jeopardy_at(until).saturating_duration_since(Instant::now());
            assert!(
                before_jeopardy >= Duration::from_secs(1),
                "told only {before_jeopardy:?} before the jeopardy"
            );
            assert!(status.to_string().contains("unconfirmed"), "{status}");
            let conn = handle.connection();
            match &conn {
                ConnState::Disconnected {
                    since,
                    last_error: Some(_),
                } => assert!(*since >= killed_at, "{conn:?}"),
                other => panic!("after the kill: {other:?}"),
            }
            // The next attempts are refused, each told as it ends.
            let refused = timeout(TOLD_CONFIRMED, async {
                loop {
                    if let ConnState::Disconnected {
                        last_error: Some(e),
                        ..
                    } = handle.connection_changed().await
                    {
                        if *e.reason() == CloseReason::ConnectFailed && e.io_error().is_some() {
                            return e;
                        }
                    }
                }
            })
            .await
            .expect("an attempt refused, within the backoff");
            assert!(refused.to_string().contains(&addr), "{refused}");

            // A server on the same port, from the same state: confirmed
            // again as it takes the client.
            let second = serve(&addr, &dir, "after");
            let listening_at = Instant::now();
            let status = timeout(PATIENCE, lease.changed())
                .await
                .expect("told of the new connection");
            let told = listening_at.elapsed();
            eprintln!("tokio: confirmed {told:?} after the server listened");
            assert!(
                matches!(status, LeaseStatus::Valid { confirmed: true, .. }),
                "after the restart: {status:?}"
            );
            assert!(
                told < TOLD_CONFIRMED,
                "confirmed {told:?} after the server listened"
            );
            let conn = handle.connection();
            assert!(
                matches!(&conn, ConnState::Connected { node, .. } if node.as_str() == "after"),
                "{conn:?}"
            );
            // The grant outlived the server: renewed through the new one.
            let renewed = timeout(PATIENCE, lease.renewed())
                .await
                .expect("a renewal through the new server")
                .expect("renewed, not over");
            assert!(renewed > until, "renewed past {until:?}");
            assert_eq!(lease.token(), token);
            assert!(
                matches!(lease.status(), LeaseStatus::Valid { confirmed: true, .. }),
                "{:?}",
                lease.status()
            );

            let released = lease.release().await.expect("the release");
            assert_eq!(released, Outcome::Released);
            handle
                .shutdown(Duration::from_secs(5))
                .await
                .expect("the shutdown");
            let conn = handle.connection();
            assert!(matches!(conn, ConnState::Stopped), "{conn:?}");
            drop(second);
        });
    }
}

mod blocking_adapter {
    use super::*;
    use ticketing::blocking::{connect, ConnState, LeaseStatus, TcpConnector};

    #[test]
    fn a_killed_server_leaves_the_lease_unconfirmed_at_once_and_a_new_one_confirms_it() {
        let dir = Scratch::new("blocking");
        let mut first = serve("127.0.0.1:0", &dir, "before");
        let addr = first.addr.clone();
        let handle = connect(config(&addr), TcpConnector).expect("a client");
        handle.connected().expect("connected");
        let conn = handle.connection();
        assert!(
            matches!(&conn, ConnState::Connected { addr: a, node, .. }
                if a.as_str() == addr && node.as_str() == "before"),
            "{conn:?}"
        );
        let lease = handle
            .lock(key())
            .lease(LEASE)
            .renew()
            .send()
            .expect("the lock");
        let token = lease.token();
        let status = lease.status();
        assert!(
            matches!(
                status,
                LeaseStatus::Valid {
                    confirmed: true,
                    ..
                }
            ),
            "granted: {status:?}"
        );

        // Two renewals while connected: told by `renewed_timeout()`; no
        // change of state since the grant.
        let mut until = status.valid_until().expect("valid");
        for n in 1..=2 {
            let renewed = lease
                .renewed_timeout(PATIENCE)
                .unwrap_or_else(|| panic!("no renewal {n}: {}", lease.status()));
            assert!(renewed > until, "renewal {n} moved valid_until on");
            until = renewed;
        }
        assert_eq!(
            lease.changed_timeout(Duration::ZERO),
            None,
            "no change while connected"
        );

        // SIGKILL, just after a renewal: two seconds before jeopardy.
        let killed_at = Instant::now();
        first.kill();
        let status = lease
            .changed_timeout(PATIENCE)
            .expect("told of the connection's end");
        let told = killed_at.elapsed();
        eprintln!("blocking: told unconfirmed {told:?} after the kill");
        assert_eq!(
            status,
            LeaseStatus::Valid {
                valid_until: until,
                confirmed: false
            },
            "after the kill"
        );
        assert!(
            told < TOLD_UNCONFIRMED,
            "told unconfirmed {told:?} after the kill"
        );
        let before_jeopardy = jeopardy_at(until).saturating_duration_since(Instant::now());
        assert!(
            before_jeopardy >= Duration::from_secs(1),
            "told only {before_jeopardy:?} before the jeopardy"
        );
        let conn = handle.connection();
        match &conn {
            ConnState::Disconnected {
                since,
                last_error: Some(_),
            } => assert!(*since >= killed_at, "{conn:?}"),
            other => panic!("after the kill: {other:?}"),
        }
        // The next attempts are refused, each told as it ends.
        let deadline = Instant::now() + TOLD_CONFIRMED;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match handle.connection_changed_timeout(left) {
                Some(ConnState::Disconnected {
                    last_error: Some(e),
                    ..
                }) if *e.reason() == CloseReason::ConnectFailed && e.io_error().is_some() => break,
                Some(_) => {}
                None => panic!("no refused attempt within {TOLD_CONFIRMED:?}"),
            }
        }

        // A server on the same port, from the same state: confirmed again
        // as it takes the client.
        let second = serve(&addr, &dir, "after");
        let listening_at = Instant::now();
        let status = lease
            .changed_timeout(PATIENCE)
            .expect("told of the new connection");
        let told = listening_at.elapsed();
        eprintln!("blocking: confirmed {told:?} after the server listened");
        assert!(
            matches!(
                status,
                LeaseStatus::Valid {
                    confirmed: true,
                    ..
                }
            ),
            "after the restart: {status:?}"
        );
        assert!(
            told < TOLD_CONFIRMED,
            "confirmed {told:?} after the server listened"
        );
        let conn = handle.connection();
        assert!(
            matches!(&conn, ConnState::Connected { node, .. } if node.as_str() == "after"),
            "{conn:?}"
        );
        // The grant outlived the server: renewed through the new one.
        let renewed = lease
            .renewed_timeout(PATIENCE)
            .expect("a renewal through the new server");
        assert!(renewed > until, "renewed past {until:?}");
        assert_eq!(lease.token(), token);

        assert_eq!(lease.release().expect("the release"), Outcome::Released);
        handle
            .shutdown(Duration::from_secs(5))
            .expect("the shutdown");
        let conn = handle.connection();
        assert!(matches!(conn, ConnState::Stopped), "{conn:?}");
        drop(second);
    }
}
