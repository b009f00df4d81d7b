//! The tokio adapter as a newcomer meets it: connect (and learn why not),
//! lock, write with the fencing token, release; a lock renewed while work
//! runs, its status followed; two workers contending for one key; work run
//! under a lock.
//!
//! Start a server, then run this against it:
//!
//! ```sh
//! cargo run --features cli -- serve --listen 127.0.0.1:7878 &
//! cargo run --features tokio --example tokio_lock -- 127.0.0.1:7878
//! ```

use std::time::Duration;

use ticketing::client::Config;
use ticketing::tokio::{spawn, Handle, LeaseStatus, TcpConnector};
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

    // A short lease renewed while the work runs (longer than one lease).
    let mut lease = handle
        .lock(key.clone())
        .lease(Duration::from_millis(600))
        .renew()
        .await?;
    let work = tokio::time::sleep(Duration::from_millis(1500));
    tokio::pin!(work);
    loop {
        tokio::select! {
            () = &mut work => break,
            status = lease.changed() => match status {
                LeaseStatus::Valid { .. } => println!("renewed: {:?} left", lease.remaining()),
                other => return Err(format!("the lease ended: {other:?}").into()),
            },
        }
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
        .lock(key)
        .renew()
        .run(|lease| async move { lease.token() })
        .await?;
    println!("ran under token {token}");

    handle.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}

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
