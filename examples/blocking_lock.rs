//! The blocking adapter as a newcomer meets it: connect (and learn why
//! not), lock, write with the fencing token, release; a lock renewed while
//! work runs, its status followed; two threads contending for one key;
//! work run under a lock.
//!
//! Start a server, then run this against it:
//!
//! ```sh
//! cargo run --features cli -- serve --listen 127.0.0.1:7878 &
//! cargo run --features blocking --example blocking_lock -- 127.0.0.1:7878
//! ```

use std::thread;
use std::time::{Duration, Instant};

use ticketing::blocking::{connect, Handle, LeaseStatus, TcpConnector};
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

    // A short lease renewed while the work runs (longer than one lease).
    let mut lease = handle
        .lock(key.clone())
        .lease(Duration::from_millis(600))
        .renew()
        .send()?;
    let done = Instant::now() + Duration::from_millis(1500);
    while let Some(left) = done.checked_duration_since(Instant::now()) {
        match lease.changed_timeout(left) {
            Some(LeaseStatus::Valid { .. }) => println!("renewed: {:?} left", lease.remaining()),
            Some(other) => return Err(format!("the lease ended: {other:?}").into()),
            None => break, // the work is done
        }
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
    let token = handle.lock(key).renew().run(|lease| lease.token())?;
    println!("ran under token {token}");

    handle.shutdown(Duration::from_secs(5))?;
    Ok(())
}

/// Holds the key for a while; its token.
fn worker(handle: &Handle, key: &Key) -> Result<u64, ticketing::blocking::AcquireError> {
    let lease = handle
        .lock(key.clone())
        .wait(Duration::from_secs(5))
        .send()?;
    thread::sleep(Duration::from_millis(50));
    Ok(lease.token()) // the guard goes here: released by exact token
}
