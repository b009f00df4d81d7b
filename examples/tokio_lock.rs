//! The tokio adapter as a newcomer meets it: connect (and learn why not),
//! lock, write with the fencing token, release; a lock renewed while work
//! runs, its renewals and its status followed (confirmed while a server
//! has the client); two workers contending for one key; work run under a
//! lock; an acquire that gives up at once while the service is unreachable.
//!
//! Start a server, then run this against it:
//!
//! ```sh
//! cargo run --features cli -- serve --listen 127.0.0.1:7878 &
//! cargo run --features tokio --example tokio_lock -- 127.0.0.1:7878
//! ```

use std::time::{Duration, Instant};

use ticketing::client::Config;
use ticketing::tokio::{spawn, AcquireError, Handle, LeaseStatus, TcpConnector};
use ticketing::{Endpoint, Key, Name};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7878".into());
    let config = Config::new([Endpoint::new(addr)?], Name::new("tokio-example")?);
    let handle = spawn(config, TcpConnector)?;
    // A server that is down, a wrong credential, a TLS refusal: said here.
    handle.connected().await?;
    println!("{}", handle.connection()); // connected to ... (node ...) for 0.0 s
    let key = Key::new("invoices")?;

    // Lock, write quoting the fencing token, release.
    let lease = handle
        .lock(key.clone())
        .wait(Duration::from_secs(5))
        .await?;
    println!(
        "locked {} with token {} for {:?}",
        lease.key(),
        lease.token(),
        lease.remaining()
    );
    lease.release().await?;

    // A short lease renewed while the work runs (longer than one lease):
    // `renewed()` tells each renewal; `changed()` a change of state only (the
    // connection lost or back, jeopardy, the lease lost or run out).
    let lease = handle
        .lock(key.clone())
        .lease(Duration::from_millis(600))
        .renew()
        .await?;
    let work = tokio::time::sleep(Duration::from_millis(1500));
    tokio::pin!(work);
    let mut renewals = 0;
    loop {
        tokio::select! {
            () = &mut work => break,
            Some(until) = lease.renewed() => {
                renewals += 1;
                println!("renewed: {:?} left", until.saturating_duration_since(Instant::now()));
            }
            status = lease.changed() => match status {
                // The server went away: the lease holds until `valid_until`,
                // and is confirmed again if a server takes the client in time.
                LeaseStatus::Valid { .. } => println!("{status}; {}", handle.connection()),
                other => return Err(format!("the lease ended: {other}").into()),
            },
        }
    }
    if renewals == 0 {
        return Err("a 600 ms lease held for 1.5 s was never renewed".into());
    }
    lease.release().await?;

    // Two workers want the key: the second gets it once the first is done,
    // with a greater token.
    let (first, second) = tokio::join!(worker(&handle, &key), worker(&handle, &key));
    let (first, second) = (first?, second?);
    println!(
        "tokens in turn: {} then {}",
        first.min(second),
        first.max(second)
    );

    // Work under the lock: released when it is done, stopped if the lease
    // is lost first.
    let token = handle
        .lock(key.clone())
        .renew()
        .run(|lease| async move { lease.token() })
        .await?;
    println!("ran under token {token}");

    handle.shutdown(Duration::from_secs(5)).await?;

    // A caller that would rather turn elsewhere at once than wait for a
    // service that is down: against an address where nothing listens, an
    // acquire that gives up while unreachable ends as soon as a round of
    // attempts has failed, naming why (the client-wide default is
    // `Config::give_up_while_unreachable`).
    let down = Config::new([Endpoint::new("127.0.0.1:9")?], Name::new("tokio-example")?);
    let down = spawn(down, TcpConnector)?;
    let started = Instant::now();
    let attempt = down
        .lock(key)
        .wait(Duration::from_secs(5))
        .give_up_while_unreachable(true)
        .await;
    match attempt {
        Err(e @ AcquireError::TimedOut { sent: false, .. }) if started.elapsed() < WAIT => {
            println!("gave up after {:?}: {e}", started.elapsed());
        }
        other => return Err(format!("expected to give up at once: {other:?}").into()),
    }
    down.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}

/// Well under the 5 s an acquire would otherwise wait.
const WAIT: Duration = Duration::from_secs(1);

/// Holds the key for a while; its token.
async fn worker(handle: &Handle, key: &Key) -> Result<u64, ticketing::tokio::AcquireError> {
    let lease = handle
        .lock(key.clone())
        .wait(Duration::from_secs(5))
        .await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let token = lease.token();
    drop(lease); // released by exact token
    Ok(token)
}
