//! `ticketing run`: holds a lock while a command runs, like `flock(1)`
//! across machines (CLI.md).
//!
//! The grant is renewed automatically while the child runs (unless
//! `--no-renew`; for at most `--max-hold-ms` of holding if given), so a
//! command may run as long as it needs and a `ticketing run` that dies
//! frees the key within one lease. The child gets `TICKETING_KEY` and
//! `TICKETING_TOKEN`, and not `TICKETING_CREDENTIAL`.
//!
//! Exit statuses: the child's (128 + the signal if a signal ended it); 75
//! when the lock was not acquired (timed out, busy) or the acquire is
//! Indeterminate (the command is then not run); 124 when the lease was lost
//! or about to run out and the child had to be stopped (SIGTERM, then
//! SIGKILL after `--kill-grace-ms`); 128 + the signal when `ticketing run`
//! itself got SIGINT or SIGTERM (the child gets SIGTERM first). The grant is
//! released by its exact token on every path.

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use ticketing::client::Outcome;
use ticketing::tokio::{AcquireError, Handle, Lease, LeaseStatus};
use ticketing::{Key, Name};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::common::{spawn_client, ClientOptions, CREDENTIAL_ENV};

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
    /// The lease to ask for, of the acquire and of each renewal, in
    /// milliseconds.
    #[arg(long, value_name = "N", default_value_t = 30_000)]
    lease_ms: u64,
    /// Never renew: the command must end within one lease.
    #[arg(long)]
    no_renew: bool,
    /// Stop renewing after this much holding, in milliseconds.
    #[arg(long, value_name = "N", conflicts_with = "no_renew")]
    max_hold_ms: Option<u64>,
    /// How long the child has between SIGTERM and SIGKILL, in milliseconds
    /// (at most a third of the lease): it gets SIGTERM that long before the
    /// lease runs out.
    #[arg(long, value_name = "N", default_value_t = 2_000)]
    kill_grace_ms: u64,
    /// The owner named in the request (default: run-<pid>).
    #[arg(long)]
    owner: Option<Name>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Not acquired, or Indeterminate (sysexits' EX_TEMPFAIL).
const NOT_ACQUIRED: u8 = 75;
/// The lease was lost, or ran out, while the child ran (as `timeout(1)`
/// says it).
const LEASE_EXPIRED: u8 = 124;
/// The command could not be started.
const CANNOT_START: u8 = 127;
/// How long the shutdown may take to drain the release.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(5);

pub async fn run(args: Args) -> Result<ExitCode, Box<dyn Error>> {
    // Its notices are not read: the errors say what went wrong.
    let (handle, _) = spawn_client(&args.client)?;
    let owner = match args.owner {
        Some(owner) => owner,
        None => Name::new(format!("run-{}", std::process::id()))?,
    };
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;

    let (key, wait, lease) = (
        args.key.clone(),
        Duration::from_millis(args.wait_ms),
        Duration::from_millis(args.lease_ms),
    );
    let lock = handle.lock(key).owner(owner).wait(wait).lease(lease);
    let lock = match (args.no_renew, args.max_hold_ms) {
        (true, _) => lock,
        (false, None) => lock.renew(),
        (false, Some(ms)) => lock.renew_for(Duration::from_millis(ms)),
    };
    // A signal while waiting: dropping the lock cancels the acquire through
    // the core (and a grant that still comes is released by its exact token).
    let locked = tokio::select! {
        locked = lock => locked,
        _ = sigint.recv() => return stop(&handle, 128 + Signal::SIGINT as u8).await,
        _ = sigterm.recv() => return stop(&handle, 128 + Signal::SIGTERM as u8).await,
    };
    let lease = match locked {
        Ok(lease) => lease,
        Err(AcquireError::Indeterminate { .. }) => {
            eprintln!(
                "ticketing run: the acquire of {} is indeterminate (the connection failed after it was sent); not running the command",
                args.key
            );
            return stop(&handle, NOT_ACQUIRED).await;
        }
        Err(e @ (AcquireError::Stopped | AcquireError::Refused(_))) => return Err(e.into()),
        // Not acquired, and why: timed out (held by another owner, or no
        // server took the request, with the cause), busy, misconfigured.
        Err(e) => {
            eprintln!("ticketing run: {}: {e}", args.key);
            return stop(&handle, NOT_ACQUIRED).await;
        }
    };

    // A grace longer than a third of the lease would stop every command at
    // once: it is cut to that.
    let grace =
        Duration::from_millis(args.kill_grace_ms).min(Duration::from_millis(args.lease_ms) / 3);
    let mut lease = lease;
    let status = supervise(&mut lease, &args.command, grace, &mut sigint, &mut sigterm).await;
    let (key, token) = (lease.key().clone(), lease.token());
    match lease.release().await {
        Ok(Outcome::Released) => {}
        Ok(other) => eprintln!("ticketing run: release of {key} token {token}: {other:?}"),
        Err(e) => eprintln!("ticketing run: release of {key} token {token}: {e}"),
    }
    stop(&handle, status).await
}

/// Runs the command while the grant is valid; returns the exit status.
/// The child is stopped once the lease is lost, or `grace` before its
/// `valid_until` as the client knows it (renewals move it on), so that it
/// has ended by then.
async fn supervise(
    lease: &mut Lease,
    command: &[String],
    grace: Duration,
    sigint: &mut tokio::signal::unix::Signal,
    sigterm: &mut tokio::signal::unix::Signal,
) -> u8 {
    let key = lease.key().clone();
    // The credential is for talking to the lock service, which this
    // process does for the command: the command, and whatever it runs or
    // logs its environment to, does not get it.
    let mut child = match Command::new(&command[0])
        .args(&command[1..])
        .env_remove(CREDENTIAL_ENV)
        .env("TICKETING_KEY", key.as_str())
        .env("TICKETING_TOKEN", lease.token().to_string())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("ticketing run: cannot run {:?}: {e}", command[0]);
            return CANNOT_START;
        }
    };
    loop {
        let term_at = lease
            .valid_until()
            .map(|at| at.checked_sub(grace).unwrap_or(at))
            .unwrap_or_else(Instant::now);
        tokio::select! {
            status = child.wait() => return exit_status(status),
            status = lease.changed() => match status {
                LeaseStatus::Jeopardy { .. } => eprintln!(
                    "ticketing run: the lease of {key} is in jeopardy: renewals go unanswered"
                ),
                LeaseStatus::Lost => {
                    eprintln!("ticketing run: the lease of {key} was lost; stopping the command");
                    end(&mut child, grace).await;
                    return LEASE_EXPIRED;
                }
                _ => {}
            },
            // A renewal moves `valid_until` on: so does the next `term_at`.
            Some(_) = lease.renewed() => {}
            _ = tokio::time::sleep_until(term_at.into()) => {
                eprintln!(
                    "ticketing run: the lease of {key} is about to run out; stopping the command"
                );
                end(&mut child, grace).await;
                return LEASE_EXPIRED;
            }
            _ = sigint.recv() => {
                end(&mut child, grace).await;
                return 128 + Signal::SIGINT as u8;
            }
            _ = sigterm.recv() => {
                end(&mut child, grace).await;
                return 128 + Signal::SIGTERM as u8;
            }
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
