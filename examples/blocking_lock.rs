//! The blocking adapter as a newcomer meets it: connect (and learn why
//! not), lock, write with the fencing token, release; a lock renewed while
//! work runs, its renewals and its status followed (confirmed while a
//! server has the client); two threads contending for one key; work run
//! under a lock; an acquire that gives up at once while the service is
//! unreachable.
//!
//! Start a server, then run this against it:
//!
//! ```sh
//! cargo run --features cli -- serve --listen 127.0.0.1:7878 &
//! cargo run --features blocking --example blocking_lock -- 127.0.0.1:7878
//! ```

use std::thread;
use std::time::{Duration, Instant};

use ticketing::blocking::{connect, AcquireError, Handle, LeaseStatus, TcpConnector};
use ticketing::client::Config;
use ticketing::{Endpoint, Key, Name};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7878".into());
    let config = Config::new([Endpoint::new(addr)?], Name::new("blocking-example")?);
    let handle = connect(config, TcpConnector)?;
    // A server that is down, a wrong credential, a TLS refusal: said here.
    handle.connected()?;
    println!("{}", handle.connection()); // connected to ... (node ...) for 0.0 s
    let key = Key::new("reports")?;

    // Lock, write quoting the fencing token, release.
    let lease = handle
        .lock(key.clone())
        .wait(Duration::from_secs(5))
        .send()?;
    println!(
        "locked {} with token {} for {:?}",
        lease.key(),
        lease.token(),
        lease.remaining()
    );
    lease.release()?;

    // A short lease renewed while the work runs (longer than one lease):
    // `renewed_timeout()` tells each renewal; `status()` where the lease
    // stands (`changed()` waits for that to change): confirmed while a
    // server has the client, unconfirmed once the connection ends,
    // jeopardy, lost, expired.
    let lease = handle
        .lock(key.clone())
        .lease(Duration::from_millis(600))
        .renew()
        .send()?;
    let done = Instant::now() + Duration::from_millis(1500);
    let mut renewals = 0;
    while let Some(left) = done.checked_duration_since(Instant::now()) {
        match lease.renewed_timeout(left) {
            Some(until) => {
                renewals += 1;
                println!(
                    "renewed: {:?} left",
                    until.saturating_duration_since(Instant::now())
                );
            }
            None if lease.status().is_over() => {
                return Err(format!("the lease ended: {}", lease.status()).into());
            }
            None => break, // the work is done
        }
    }
    // "valid for another 0.4 s" (", unconfirmed: ..." while no server has
    // the client: see `handle.connection()`).
    match lease.status() {
        status @ LeaseStatus::Valid { .. } => println!("{status}"),
        other => return Err(format!("the lease ended: {other}").into()),
    }
    if renewals == 0 {
        return Err("a 600 ms lease held for 1.5 s was never renewed".into());
    }
    lease.release()?;

    // Two threads want the key: the second gets it once the first is done,
    // with a greater token.
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (handle, key) = (handle.clone(), key.clone());
            thread::spawn(move || worker(&handle, &key))
        })
        .collect();
    let mut tokens = Vec::new();
    for worker in workers {
        tokens.push(worker.join().expect("the worker ran")?);
    }
    tokens.sort_unstable();
    println!("tokens in turn: {} then {}", tokens[0], tokens[1]);

    // Work under the lock: released when it is done; told (through the
    // lease it is handed) if the lease is lost first.
    let token = handle
        .lock(key.clone())
        .renew()
        .run(|lease| lease.token())?;
    println!("ran under token {token}");

    handle.shutdown(Duration::from_secs(5))?;

    // A caller that would rather turn elsewhere at once than wait for a
    // service that is down: against an address where nothing listens, an
    // acquire that gives up while unreachable ends as soon as a round of
    // attempts has failed, naming why (the client-wide default is
    // `Config::give_up_while_unreachable`).
    let down = Config::new(
        [Endpoint::new("127.0.0.1:9")?],
        Name::new("blocking-example")?,
    );
    let down = connect(down, TcpConnector)?;
    let started = Instant::now();
    let attempt = down
        .lock(key)
        .wait(Duration::from_secs(5))
        .give_up_while_unreachable(true)
        .send();
    match attempt {
        Err(e @ AcquireError::TimedOut { sent: false, .. }) if started.elapsed() < WAIT => {
            println!("gave up after {:?}: {e}", started.elapsed());
        }
        other => return Err(format!("expected to give up at once: {other:?}").into()),
    }
    down.shutdown(Duration::from_secs(1))?;
    Ok(())
}

/// Well under the 5 s an acquire would otherwise wait.
const WAIT: Duration = Duration::from_secs(1);

/// Holds the key for a while; its token.
fn worker(handle: &Handle, key: &Key) -> Result<u64, ticketing::blocking::AcquireError> {
    let lease = handle
        .lock(key.clone())
        .wait(Duration::from_secs(5))
        .send()?;
    thread::sleep(Duration::from_millis(50));
    Ok(lease.token()) // the guard goes here: released by exact token
}
