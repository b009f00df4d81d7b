//! `ticketing run`: holds a lock while a command runs, like `flock(1)`
//! across machines (CLI.md).
//!
//! Exit statuses: the child's (128 + the signal if a signal ended it); 75
//! when the lock was not acquired (timed out, busy) or the acquire is
//! Indeterminate (the command is then not run); 124 when the lease was
//! about to run out and the child had to be stopped; 128 + the signal when
//! `ticketing run` itself got SIGINT or SIGTERM (the child gets SIGTERM
//! first). The grant is released by its exact token on every path.

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use ticketing::client::{Event, Grant, Outcome};
use ticketing::tokio::{Handle, Notices};
use ticketing::{Key, Name};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::common::{spawn_client, ClientOptions};

/// Options of `ticketing run` (CLI.md).
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    client: ClientOptions,
    /// The lock to hold.
    #[arg(long)]
    key: Key,
    /// How long to wait for the lock, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    wait_ms: u64,
    /// The lease to ask for, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = 60_000)]
    lease_ms: u64,
    /// The owner named in the request (default: run-<pid>).
    #[arg(long)]
    owner: Option<Name>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Not acquired, or Indeterminate (sysexits' EX_TEMPFAIL).
const NOT_ACQUIRED: u8 = 75;
/// The lease ran out while the child ran (as `timeout(1)` says it).
const LEASE_EXPIRED: u8 = 124;
/// The command could not be started.
const CANNOT_START: u8 = 127;
/// How long the shutdown may take to drain the release.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(5);

pub async fn run(args: Args) -> Result<ExitCode, Box<dyn Error>> {
    let (handle, mut notices) = spawn_client(&args.client)?;
    let owner = match args.owner {
        Some(owner) => owner,
        None => Name::new(format!("run-{}", std::process::id()))?,
    };
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;

    let acquire = handle.acquire(
        args.key.clone(),
        owner,
        Duration::from_millis(args.wait_ms),
        Duration::from_millis(args.lease_ms),
    );
    // A signal while waiting: dropping the acquire cancels it through the
    // core (and a grant that still comes is released by its exact token).
    let outcome = tokio::select! {
        outcome = acquire => outcome?,
        _ = sigint.recv() => return stop(&handle, 128 + Signal::SIGINT as u8).await,
        _ = sigterm.recv() => return stop(&handle, 128 + Signal::SIGTERM as u8).await,
    };
    let grant = match outcome {
        Outcome::Granted(grant) => grant,
        Outcome::Indeterminate { .. } => {
            eprintln!(
                "ticketing run: the acquire of {} is indeterminate (the connection failed after it was sent); not running the command",
                args.key
            );
            return stop(&handle, NOT_ACQUIRED).await;
        }
        other => {
            eprintln!(
                "ticketing run: {} not acquired: {other:?}{}",
                args.key,
                last_close(&mut notices)
            );
            return stop(&handle, NOT_ACQUIRED).await;
        }
    };
    // Nothing reads the notices from here on: they are not kept.
    drop(notices);

    let status = supervise(&handle, &grant, &args.command, &mut sigint, &mut sigterm).await;
    match handle.release(&grant).await {
        Ok(Outcome::Released) => {}
        Ok(other) => eprintln!(
            "ticketing run: release of {} token {}: {other:?}",
            grant.key(),
            grant.token()
        ),
        Err(e) => eprintln!(
            "ticketing run: release of {} token {}: {e}",
            grant.key(),
            grant.token()
        ),
    }
    stop(&handle, status).await
}

/// Why the last connection (or attempt) closed, if one did, as a clause
/// for a message: what an acquire that never got a connection waited for.
fn last_close(notices: &mut Notices) -> String {
    let mut last = None;
    while let Some(event) = notices.try_recv() {
        if let Event::Closed { addr, reason } = event {
            last = Some(format!(" (the last connection to {addr} closed: {reason})"));
        }
    }
    last.unwrap_or_default()
}

/// Runs the command while the grant is valid; returns the exit status.
async fn supervise(
    handle: &Handle,
    grant: &Grant,
    command: &[String],
    sigint: &mut tokio::signal::unix::Signal,
    sigterm: &mut tokio::signal::unix::Signal,
) -> u8 {
    let mut child = match Command::new(&command[0])
        .args(&command[1..])
        .env("TICKETING_KEY", grant.key().as_str())
        .env("TICKETING_TOKEN", grant.token().to_string())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("ticketing run: cannot run {:?}: {e}", command[0]);
            return CANNOT_START;
        }
    };
    // Stop the child before the lease ends, as the client knows it: SIGTERM
    // two graces before `valid_until`, SIGKILL one grace before.
    let grace = (grant.lease() / 4).min(Duration::from_secs(2));
    let valid_until = handle
        .instant_of(grant.valid_until())
        .unwrap_or_else(Instant::now);
    let term_at = valid_until.checked_sub(grace * 2).unwrap_or(valid_until);
    tokio::select! {
        status = child.wait() => exit_status(status),
        _ = tokio::time::sleep_until(term_at.into()) => {
            eprintln!(
                "ticketing run: the lease of {} is about to run out; stopping the command",
                grant.key()
            );
            end(&mut child, grace).await;
            LEASE_EXPIRED
        }
        _ = sigint.recv() => {
            end(&mut child, grace).await;
            128 + Signal::SIGINT as u8
        }
        _ = sigterm.recv() => {
            end(&mut child, grace).await;
            128 + Signal::SIGTERM as u8
        }
    }
}

/// SIGTERM, then SIGKILL after `grace`; waits for the child to end.
async fn end(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

fn exit_status(status: std::io::Result<std::process::ExitStatus>) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => u8::try_from(code).unwrap_or(1),
            (None, Some(signal)) => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
            (None, None) => 1,
        },
        Err(_) => 1,
    }
}

/// Shuts the client down (draining the release lane) and exits with `code`.
async fn stop(handle: &Handle, code: u8) -> Result<ExitCode, Box<dyn Error>> {
    if let Err(e) = handle.shutdown(SHUTDOWN_BUDGET).await {
        eprintln!("ticketing run: shutdown: {e}");
    }
    Ok(ExitCode::from(code))
}
