//! `ticketing client`: a line-oriented driver of the client core, like
//! `redis-cli` for scripts. Commands on standard input, one JSON object a
//! line on standard output (CLI.md).
//!
//! A script runs as written: a line that needs an acquire's grant waits for
//! that acquire's outcome, and the end of input waits for every outcome
//! before the client shuts down. The session only orders the commands and
//! prints; every rule of the protocol is the core's.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the options, and the run: input, notices, reports and signals until the shutdown is done |
//! | `parse.rs` | a line of input, parsed into a command |
//! | `session.rs` | what each tag stands for, the lines that wait for an acquire, the renewals awaited |
//! | `output.rs` | the JSON objects printed, one a line |

mod output;
mod parse;
mod session;

use std::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use serde_json::json;
use ticketing::tokio::RequestError;
use tokio::io::BufReader;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use self::output::{emit, error};
use self::parse::parse;
use self::session::Session;
use crate::common::{client_config, spawn_configured, ClientOptions};
use crate::input::{self, Lines};

/// Options of `ticketing client` (CLI.md).
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    client: ClientOptions,
}

/// The shutdown under way.
type Shutdown = Pin<Box<dyn Future<Output = Result<(), RequestError>> + Send>>;

/// Budget of the shutdown that ends a run at the end of input, or on
/// SIGINT or SIGTERM (CLI.md: "then does `shutdown 5000`").
const STOP_BUDGET: Duration = Duration::from_millis(5000);

pub async fn run(args: Args) -> Result<ExitCode, Box<dyn Error>> {
    // The signals are ours before the client starts: from then on, SIGINT
    // and SIGTERM stop it cleanly instead of killing the process.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let config = client_config(&args.client)?;
    let max_waiting = config.max_acquires;
    let (handle, mut notices) = spawn_configured(&args.client, config)?;
    let (reports, mut reported) = mpsc::unbounded_channel();
    let mut session = Session::new(handle, reports, max_waiting);
    // Each line is read whatever it holds, keeping at most `MAX_LINE` bytes
    // of it: a bad line is an error to print, never the end of the input.
    let mut input = Lines::new(BufReader::new(tokio::io::stdin()));
    // Lines are read until the end of input, a `shutdown` line or a signal.
    let mut reading = true;
    // The shutdown asked for (its budget), and once started, under way.
    let mut stop: Option<Duration> = None;
    let mut stopping: Option<Shutdown> = None;

    loop {
        tokio::select! {
            // Notices first: the core emits a close before the outcomes it
            // causes, and the output keeps that order. And a renewal's
            // answer that was out before a `renew` line's renewal was
            // queued is never taken for that renewal's.
            biased;
            Some(event) = notices.recv() => session.notice(event),
            () = sleep_until(session.hints.due()), if session.hints.due().is_some() => {
                session.hints.flush(Instant::now());
            }
            Some(report) = reported.recv() => session.report(report),
            Some(()) = sigint.recv(), if stop.is_none() => stop = Some(STOP_BUDGET),
            Some(()) = sigterm.recv(), if stop.is_none() => stop = Some(STOP_BUDGET),
            result = async { stopping.as_mut().expect("guarded").await }, if stopping.is_some() => {
                if let Err(e) = result {
                    error(None, format!("shutdown: {e}"));
                }
                break;
            }
            line = input.next(), if reading && stop.is_none() => match line {
                Ok(Some(input::Line::Bad(message))) => error(None, message),
                Ok(Some(input::Line::Text(line))) => match parse(&line) {
                    Ok(None) => {}
                    Ok(Some(command)) => stop = session.command(command),
                    Err(message) => error(None, message),
                },
                Ok(None) | Err(_) => reading = false,
            },
        }
        if stopping.is_none() {
            // End of input is not a cancel: the shutdown waits until every
            // operation has its outcome and every renewal asked for has
            // its answer, each of which comes in bounded time.
            if !reading && stop.is_none() && session.settled() {
                stop = Some(STOP_BUDGET);
            }
            if let Some(budget) = stop {
                stopping = Some(Box::pin(session.handle.shutdown(budget)));
            }
        }
    }
    // Every operation has its outcome once the shutdown is done: what is
    // still to print comes now, notices first.
    loop {
        while let Some(event) = notices.try_recv() {
            session.notice(event);
        }
        if session.open == 0 {
            break;
        }
        let Some(report) = reported.recv().await else {
            break;
        };
        session.report(report);
    }
    session.hints.flush(Instant::now());
    emit(json!({"type": "done"}));
    Ok(ExitCode::SUCCESS)
}

/// Sleeps until `at`, for ever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
