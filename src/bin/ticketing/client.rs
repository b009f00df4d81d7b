//! `ticketing client`: a line-oriented driver of the client core, like
//! `redis-cli` for scripts. Commands on standard input, one JSON object a
//! line on standard output (CLI.md).
//!
//! A script runs as written: a line that needs an acquire's grant waits for
//! that acquire's outcome, and the end of input waits for every outcome
//! before the client shuts down. The session only orders the commands and
//! prints; every rule of the protocol is the core's.

use std::collections::{HashMap, HashSet};
use std::error::Error;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use serde_json::{json, Value};
use ticketing::client::{self as core, CloseReason, Event, Grant, OpId, Outcome, ReleaseResult};
use ticketing::tokio::{AcquireError, Canceller, Handle, RequestError};
use ticketing::{Endpoint, Key, Name, Time};
use tokio::io::BufReader;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::common::{client_config, spawn_configured, ClientOptions};
use crate::input::{self, quote, Lines};

/// Options of `ticketing client` (CLI.md).
#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    client: ClientOptions,
}

/// What the input asks for. One line, parsed.
enum Line {
    Acquire {
        tag: String,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        /// Renew automatically once granted, for at most this long
        /// (`Some(None)`: with no limit).
        renew: Option<Option<Duration>>,
    },
    Renew {
        acquire: String,
        lease: Option<Duration>,
    },
    AutoRenew {
        acquire: String,
        /// `Some(limit)`: on, for at most `limit`; `None`: off.
        on: Option<Option<Duration>>,
    },
    Release {
        tag: String,
        key: Key,
        token: u64,
    },
    ReleaseGrant {
        tag: String,
        acquire: String,
    },
    Cancel {
        tag: String,
    },
    Abandon {
        tag: String,
    },
    Stats,
    Shutdown {
        budget: Duration,
    },
}

fn parse(line: &str) -> Result<Option<Line>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let want = |n: usize, usage: &str| {
        if words.len() == n {
            Ok(())
        } else {
            Err(format!("usage: {usage}"))
        }
    };
    let tag = |i: usize| -> Result<String, String> {
        Name::new(words[i]).map_err(|e| format!("bad tag {}: {e}", quote(words[i])))?;
        Ok(words[i].to_string())
    };
    let key =
        |i: usize| Key::new(words[i]).map_err(|e| format!("bad key {}: {e}", quote(words[i])));
    let number = |i: usize, what: &str| {
        words[i]
            .parse::<u64>()
            .map_err(|_| format!("bad {what} {}: not a number", quote(words[i])))
    };
    let parsed = match words[0] {
        "acquire" => {
            let usage = "acquire TAG KEY OWNER WAIT_MS LEASE_MS [renew[=UNTIL_MS]]";
            if words.len() != 7 {
                want(6, usage)?;
            }
            let renew = match words.get(6) {
                None => None,
                Some(word) => {
                    Some(switch(word, "renew").ok_or_else(|| format!("usage: {usage}"))??)
                }
            };
            Line::Acquire {
                tag: tag(1)?,
                key: key(2)?,
                owner: Name::new(words[3])
                    .map_err(|e| format!("bad owner {}: {e}", quote(words[3])))?,
                wait: Duration::from_millis(number(4, "WAIT_MS")?),
                lease: Duration::from_millis(number(5, "LEASE_MS")?),
                renew,
            }
        }
        "renew" => {
            let usage = "renew ACQUIRE_TAG [LEASE_MS]";
            if words.len() != 3 {
                want(2, usage)?;
            }
            let lease = match words.get(2) {
                Some(_) => Some(Duration::from_millis(number(2, "LEASE_MS")?)),
                None => None,
            };
            Line::Renew {
                acquire: words[1].to_string(),
                lease,
            }
        }
        "auto-renew" => {
            let usage = "auto-renew ACQUIRE_TAG on[=UNTIL_MS]|off";
            want(3, usage)?;
            let on = match switch(words[2], "on") {
                Some(limit) => Some(limit?),
                None if words[2] == "off" => None,
                None => return Err(format!("usage: {usage}")),
            };
            Line::AutoRenew {
                acquire: words[1].to_string(),
                on,
            }
        }
        "release" => {
            want(4, "release TAG KEY TOKEN")?;
            Line::Release {
                tag: tag(1)?,
                key: key(2)?,
                token: number(3, "TOKEN")?,
            }
        }
        "release-grant" => {
            want(3, "release-grant TAG ACQUIRE_TAG")?;
            Line::ReleaseGrant {
                tag: tag(1)?,
                acquire: words[2].to_string(),
            }
        }
        "cancel" => {
            want(2, "cancel TAG")?;
            Line::Cancel {
                tag: words[1].to_string(),
            }
        }
        "abandon" => {
            want(2, "abandon TAG")?;
            Line::Abandon {
                tag: words[1].to_string(),
            }
        }
        "stats" => {
            want(1, "stats")?;
            Line::Stats
        }
        "shutdown" => {
            want(2, "shutdown BUDGET_MS")?;
            Line::Shutdown {
                budget: Duration::from_millis(number(1, "BUDGET_MS")?),
            }
        }
        other => return Err(format!("unknown command {}", quote(other))),
    };
    Ok(Some(parsed))
}

/// `word` as `NAME` or `NAME=MS`: `None` if it is neither; else the
/// limit it gives (`Ok(None)`: none), or why that limit is bad.
fn switch(word: &str, name: &str) -> Option<Result<Option<Duration>, String>> {
    let rest = word.strip_prefix(name)?;
    if rest.is_empty() {
        return Some(Ok(None));
    }
    let ms = rest.strip_prefix('=')?;
    Some(
        ms.parse::<u64>()
            .map(|ms| Some(Duration::from_millis(ms)))
            .map_err(|_| format!("bad UNTIL_MS {}: not a number", quote(ms))),
    )
}

/// What the session knows of a tag.
enum Tagged {
    /// An acquire under way, and the lines that wait for its outcome, in
    /// the order they came.
    Acquiring {
        canceller: Canceller,
        waiting: Vec<FollowUp>,
    },
    /// An acquire that was granted; the grant, until released or abandoned.
    Granted(Option<Grant>),
    /// An acquire that ended otherwise: how (`timed_out`, ...), for the
    /// lines that name it later.
    NotGranted(String),
    /// A release (`release` or `release-grant`).
    Release,
}

/// A line that needs the grant of the acquire it names. It waits for that
/// acquire's outcome (CLI.md), so that a script runs as written however
/// long the acquire takes.
enum FollowUp {
    ReleaseGrant { tag: String },
    Renew { lease: Option<Duration> },
    AutoRenew { on: Option<Option<Duration>> },
}

impl FollowUp {
    /// The tag of the `error` object that drops it (CLI.md): a release's
    /// own, a renewal's the acquire's.
    fn tag<'a>(&'a self, acquire: &'a str) -> &'a str {
        match self {
            FollowUp::ReleaseGrant { tag } => tag,
            FollowUp::Renew { .. } | FollowUp::AutoRenew { .. } => acquire,
        }
    }
}

/// What a task of the session reports back to it.
enum Report {
    /// An operation ended.
    Ended {
        tag: String,
        op: &'static str,
        key: Key,
        result: Result<Outcome, RequestError>,
    },
    /// The renewal a `renew` line asked for was queued (its answer comes
    /// as a notice), or refused.
    Renew {
        acquire: String,
        grant: OpId,
        result: Result<(), RequestError>,
    },
    /// An `auto-renew` line was taken, or refused.
    AutoRenew {
        acquire: String,
        result: Result<(), RequestError>,
    },
    /// A `stats` line's counters (boxed: they outweigh the rest).
    Stats(Result<Box<core::ClientStats>, RequestError>),
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
    let mut session = Session {
        handle,
        tags: HashMap::new(),
        renewals: Renewals::default(),
        hints: IgnoredHints::default(),
        reports,
        open: 0,
        waiting: 0,
        max_waiting,
    };
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

/// A run's state: what each tag stands for, and what is still to come.
struct Session {
    handle: Handle,
    tags: HashMap<String, Tagged>,
    renewals: Renewals,
    hints: IgnoredHints,
    reports: mpsc::UnboundedSender<Report>,
    /// Tasks started whose report has not come back.
    open: usize,
    /// Lines that wait for an acquire's outcome, and how many may: as many
    /// as the client takes acquires. One more is dropped at once, so that
    /// a script cannot make the session hold more than the client does.
    waiting: usize,
    max_waiting: usize,
}

impl Session {
    /// Nothing more to wait for before the shutdown at the end of input:
    /// every operation has its outcome (so no line waits either), and
    /// every renewal that a `renew` line asked for has its answer.
    fn settled(&self) -> bool {
        self.open == 0 && self.renewals.awaited.is_empty()
    }

    /// Runs one command line, or, for `shutdown`, returns its budget.
    fn command(&mut self, command: Line) -> Option<Duration> {
        match command {
            Line::Acquire {
                tag,
                key,
                owner,
                wait,
                lease,
                renew,
            } => {
                if self.fresh(&tag) {
                    let acquire = self.handle.acquire(key.clone()).owner(owner).wait(wait);
                    let acquire = match renew {
                        None => acquire,
                        Some(None) => acquire.renew(),
                        Some(Some(limit)) => acquire.renew_for(limit),
                    };
                    let acquire = acquire.lease(lease).start();
                    let canceller = acquire.canceller();
                    let waiting = Vec::new();
                    self.tags
                        .insert(tag.clone(), Tagged::Acquiring { canceller, waiting });
                    let handle = self.handle.clone();
                    let outcome = async move { as_outcome(&handle, acquire.await) };
                    self.spawn_op(tag, "acquire", key, outcome);
                }
            }
            // A release is queued by the call itself, here and now, so that
            // it is in the client before a shutdown on a later line is;
            // queued from the spawned task, it could come after it and be
            // refused.
            Line::Release { tag, key, token } => {
                if self.fresh(&tag) {
                    self.tags.insert(tag.clone(), Tagged::Release);
                    let release = self.handle.release_token(key.clone(), token);
                    self.spawn_op(tag, "release", key, release);
                }
            }
            Line::ReleaseGrant { tag, acquire } => {
                if self.fresh(&tag) {
                    self.tags.insert(tag.clone(), Tagged::Release);
                    self.follow_up(acquire, FollowUp::ReleaseGrant { tag });
                }
            }
            Line::Renew { acquire, lease } => self.follow_up(acquire, FollowUp::Renew { lease }),
            Line::AutoRenew { acquire, on } => {
                self.follow_up(acquire, FollowUp::AutoRenew { on });
            }
            Line::Cancel { tag } => match self.tags.get(&tag) {
                Some(Tagged::Acquiring { canceller, .. }) => canceller.cancel(),
                // A release ignores cancellation; an ended acquire has
                // nothing left to cancel.
                Some(_) => {}
                None => error(None, format!("no operation tagged {}", quote(&tag))),
            },
            Line::Abandon { tag } => self.abandon(&tag),
            Line::Stats => {
                let stats = self.handle.stats();
                self.spawn(async move { Report::Stats(stats.await.map(Box::new)) });
            }
            Line::Shutdown { budget } => return Some(budget),
        }
        None
    }

    /// Whether `tag` is new to the run; if not, says so.
    fn fresh(&self, tag: &str) -> bool {
        let fresh = !self.tags.contains_key(tag);
        if !fresh {
            error(None, format!("tag {} is already used", quote(tag)));
        }
        fresh
    }

    /// A line that needs the grant of acquire `acquire`: run at once if it
    /// was granted, kept until its outcome if it has none yet, and dropped
    /// otherwise, with an `error` object carrying its tag.
    fn follow_up(&mut self, acquire: String, line: FollowUp) {
        match self.tags.get_mut(&acquire) {
            Some(Tagged::Acquiring { waiting, .. }) if self.waiting < self.max_waiting => {
                waiting.push(line);
                self.waiting += 1;
            }
            Some(Tagged::Acquiring { .. }) => error(
                Some(line.tag(&acquire)),
                format!(
                    "acquire {} has no outcome yet, and {} lines already wait for acquires (as many as the client takes)",
                    quote(&acquire),
                    self.waiting
                ),
            ),
            Some(Tagged::Granted(held)) => {
                let grant = match line {
                    FollowUp::ReleaseGrant { .. } => held.take(),
                    FollowUp::Renew { .. } | FollowUp::AutoRenew { .. } => held.clone(),
                };
                match grant {
                    Some(grant) => self.go_ahead(acquire, line, grant),
                    None => {
                        let message = no_grant(&acquire, self.tags.get(&acquire));
                        error(Some(line.tag(&acquire)), message);
                    }
                }
            }
            other => {
                let message = no_grant(&acquire, other.map(|state| &*state));
                error(Some(line.tag(&acquire)), message);
            }
        }
    }

    /// Runs a line that needs the grant of acquire `acquire`, `grant`.
    fn go_ahead(&mut self, acquire: String, line: FollowUp, grant: Grant) {
        match line {
            FollowUp::ReleaseGrant { tag } => {
                // No renewal of a grant being released is answered.
                self.renewals.given_up(grant.id());
                let key = grant.key().clone();
                let release = self.handle.release(&grant);
                self.spawn_op(tag, "release", key, release);
            }
            FollowUp::Renew { lease } => {
                let request = self.handle.renew(&grant, lease);
                let grant = grant.id();
                self.spawn(async move {
                    let result = request.await;
                    Report::Renew {
                        acquire,
                        grant,
                        result,
                    }
                });
            }
            FollowUp::AutoRenew { on } => {
                let request = self.handle.auto_renew(&grant, on.is_some(), on.flatten());
                self.spawn(async move {
                    let result = request.await;
                    Report::AutoRenew { acquire, result }
                });
            }
        }
    }

    /// `abandon TAG`: hands the grant of acquire `tag` back to the client.
    fn abandon(&mut self, tag: &str) {
        let grant = match self.tags.get_mut(tag) {
            Some(Tagged::Granted(held)) => held.take(),
            _ => None,
        };
        let Some(grant) = grant else {
            return error(None, no_grant(tag, self.tags.get(tag)));
        };
        self.renewals.given_up(grant.id());
        if let Err(e) = self.handle.undeliverable(grant) {
            error(None, format!("abandon {}: {e}", quote(tag)));
        }
    }

    /// What a task reported.
    fn report(&mut self, report: Report) {
        self.open -= 1;
        match report {
            Report::Ended {
                tag,
                op,
                key,
                result,
            } => self.ended(tag, op, &key, result),
            Report::Renew {
                acquire,
                grant,
                result: Ok(()),
            } => {
                // Queued: the grant's next renewal notice answers it,
                // unless the grant was given up meanwhile.
                let held = matches!(
                    self.tags.get(&acquire),
                    Some(Tagged::Granted(Some(held))) if held.id() == grant
                );
                if held {
                    self.renewals.await_answer(grant);
                }
            }
            Report::Renew {
                acquire,
                result: Err(e),
                ..
            } => error(Some(&acquire), format!("renew {}: {e}", quote(&acquire))),
            Report::AutoRenew { acquire, result } => {
                if let Err(e) = result {
                    error(
                        Some(&acquire),
                        format!("auto-renew {}: {e}", quote(&acquire)),
                    );
                }
            }
            Report::Stats(Ok(stats)) => emit(stats_line(&stats)),
            Report::Stats(Err(e)) => error(None, format!("stats: {e}")),
        }
    }

    /// Prints an operation's outcome; for an acquire, then runs or drops
    /// the lines that waited for it, in their order.
    fn ended(
        &mut self,
        tag: String,
        op: &'static str,
        key: &Key,
        result: Result<Outcome, RequestError>,
    ) {
        let head = json!({"type": "outcome", "tag": tag, "op": op, "key": key.as_str()});
        let (line, state) = match result {
            Ok(Outcome::Granted(grant)) => {
                let fields = json!({
                    "outcome": "granted",
                    "token": grant.token(),
                    "lease_ms": u64::try_from(grant.lease().as_millis()).unwrap_or(u64::MAX),
                });
                (merge(head, fields), Tagged::Granted(Some(grant)))
            }
            Ok(Outcome::TimedOut { sent, cause }) => (
                merge(head, timed_out(sent, cause.as_ref())),
                not_granted("timed_out"),
            ),
            // A client that every server refused takes no acquire until one
            // accepts it. To the script that acquire timed out unsent, as
            // those queued when the refusals came did, for the same cause.
            Err(RequestError::Refused(core::Error::Misconfigured(cause))) => (
                merge(head, timed_out(false, Some(&cause))),
                not_granted("timed_out"),
            ),
            Ok(Outcome::Busy) | Err(RequestError::Refused(core::Error::Busy)) => {
                (merge(head, json!({"outcome": "busy"})), not_granted("busy"))
            }
            Ok(Outcome::Cancelled) => (
                merge(head, json!({"outcome": "cancelled"})),
                not_granted("cancelled"),
            ),
            Ok(Outcome::Indeterminate { settles_by }) => {
                let fields = json!({
                    "outcome": "indeterminate",
                    "settled_within_ms": millis_until(settles_by, self.handle.now()),
                });
                (merge(head, fields), not_granted("indeterminate"))
            }
            Ok(Outcome::Released) => (merge(head, json!({"outcome": "released"})), Tagged::Release),
            Ok(Outcome::NotHeld) => (merge(head, json!({"outcome": "not_held"})), Tagged::Release),
            Ok(Outcome::Lapsed) => (merge(head, json!({"outcome": "lapsed"})), Tagged::Release),
            Ok(other) => {
                let outcome = format!("{other:?}");
                (
                    merge(head, json!({"outcome": outcome})),
                    Tagged::NotGranted(outcome),
                )
            }
            Err(e) => {
                let message = e.to_string();
                let line = json!({"type": "error", "tag": tag, "message": message});
                (line, Tagged::NotGranted(message))
            }
        };
        emit(line);
        let waiting = match self.tags.get_mut(&tag) {
            Some(Tagged::Acquiring { waiting, .. }) => std::mem::take(waiting),
            // A release's outcome: its tag stays a release's.
            _ => return,
        };
        if let Tagged::Granted(Some(grant)) = &state {
            self.renewals
                .granted(grant.id(), tag.clone(), self.handle.now());
        }
        self.tags.insert(tag.clone(), state);
        self.waiting -= waiting.len();
        for line in waiting {
            self.follow_up(tag.clone(), line);
        }
    }

    fn notice(&mut self, event: Event) {
        match event {
            Event::HintIgnored { addr } => self.hints.ignored(addr, Instant::now()),
            event => {
                if matches!(event, Event::Closed { .. }) {
                    // What its connection folded goes before its end.
                    self.hints.end(Instant::now());
                }
                self.renewals.notice(event, self.handle.now());
            }
        }
    }

    /// Starts a task whose report the session waits for.
    fn spawn(&mut self, task: impl Future<Output = Report> + Send + 'static) {
        self.open += 1;
        let reports = self.reports.clone();
        tokio::spawn(async move {
            let _ = reports.send(task.await);
        });
    }

    fn spawn_op(
        &mut self,
        tag: String,
        op: &'static str,
        key: Key,
        future: impl Future<Output = Result<Outcome, RequestError>> + Send + 'static,
    ) {
        self.spawn(async move {
            let result = future.await;
            Report::Ended {
                tag,
                op,
                key,
                result,
            }
        });
    }
}

/// An acquire's result as the session prints it: the core's outcome, which
/// the adapter's error carries whole.
fn as_outcome(
    handle: &Handle,
    result: Result<Grant, AcquireError>,
) -> Result<Outcome, RequestError> {
    match result {
        Ok(grant) => Ok(Outcome::Granted(grant)),
        Err(AcquireError::TimedOut { sent, cause }) => Ok(Outcome::TimedOut {
            sent,
            cause: cause.map(|cause| cause.reason().clone()),
        }),
        Err(AcquireError::Busy) => Ok(Outcome::Busy),
        Err(AcquireError::Cancelled) => Ok(Outcome::Cancelled),
        Err(AcquireError::Indeterminate { settles_by }) => Ok(Outcome::Indeterminate {
            settles_by: handle.time_of(settles_by),
        }),
        Err(AcquireError::Misconfigured(cause)) => Err(RequestError::Refused(
            core::Error::Misconfigured(cause.reason().clone()),
        )),
        Err(AcquireError::Refused(e)) => Err(RequestError::Refused(e)),
        Err(_) => Err(RequestError::Stopped),
    }
}

/// The state of an acquire that ended without a grant: `how` it ended.
fn not_granted(how: &str) -> Tagged {
    Tagged::NotGranted(how.to_owned())
}

/// The fields of a `timed_out` outcome: `cause`, why its last connection
/// attempt failed, for one that was never sent (CLI.md).
fn timed_out(sent: bool, cause: Option<&CloseReason>) -> Value {
    match cause {
        Some(cause) => json!({"outcome": "timed_out", "sent": sent, "cause": cause.to_string()}),
        None => json!({"outcome": "timed_out", "sent": sent}),
    }
}

/// Why a line that needs the grant of acquire `tag`, whose state is
/// `state` (`None`: an unknown tag), cannot have it.
fn no_grant(tag: &str, state: Option<&Tagged>) -> String {
    let tag = quote(tag);
    match state {
        None => format!("no acquire tagged {tag}"),
        Some(Tagged::Granted(_)) => {
            format!("the grant of {tag} was already released or abandoned")
        }
        Some(Tagged::Acquiring { .. }) => format!("acquire {tag} has no outcome yet"),
        Some(Tagged::NotGranted(how)) => format!("acquire {tag} was not granted: {how}"),
        Some(Tagged::Release) => format!("{tag} is a release, not an acquire"),
    }
}

/// Prints an `error` object, with the tag of the line it drops if any.
fn error(tag: Option<&str>, message: impl std::fmt::Display) {
    let message = message.to_string();
    emit(match tag {
        Some(tag) => json!({"type": "error", "tag": tag, "message": message}),
        None => json!({"type": "error", "message": message}),
    });
}

/// The `stats` object (CLI.md; README.md lists its fields).
fn stats_line(s: &core::ClientStats) -> Value {
    let histogram = |h: &core::Histogram| {
        json!({
            "count": h.count,
            "sum": h.sum_ms,
            "max": h.max_ms,
            "p50_at_most": h.quantile_bound_ms(0.5),
            "p99_at_most": h.quantile_bound_ms(0.99),
        })
    };
    let releases = |r: &core::ReleaseOutcomes| json!({"released": r.released, "not_held": r.not_held, "lapsed": r.lapsed});
    let (a, i, r, c, b) = (
        &s.acquires,
        &s.indeterminate,
        &s.renewals,
        &s.closes,
        &s.backoffs,
    );
    json!({
        "type": "stats",
        "acquires": {
            "started": s.acquires_started,
            "granted": a.granted,
            "timed_out": a.timed_out,
            "busy": a.busy,
            "cancelled": a.cancelled,
            "indeterminate": a.indeterminate,
        },
        "indeterminate": {"close": i.close, "cancel": i.cancel, "answer_timeout": i.answer_timeout},
        "releases": merge(json!({"started": s.releases_started}), releases(&s.releases)),
        "orphans": merge(json!({"queued": s.orphan_releases}), releases(&s.orphans)),
        "renewals": {
            "sent": r.sent,
            "renewed": r.renewed,
            "lost": r.lost,
            "jeopardy": r.jeopardy,
            "expired": r.expired,
        },
        "connects": s.connects,
        "connected": s.connected,
        "closes": {
            "eof": c.eof, "io": c.io, "connect_failed": c.connect_failed,
            "connect_timeout": c.connect_timeout, "tls": c.tls,
            "handshake_timeout": c.handshake_timeout, "moved": c.moved,
            "no_leader": c.no_leader, "not_active": c.not_active,
            "auth_failed": c.auth_failed, "unsupported_version": c.unsupported_version,
            "server_error": c.server_error, "protocol": c.protocol, "cancel": c.cancel,
            "answer_timeout": c.answer_timeout, "shutdown": c.shutdown,
        },
        "backoffs": {
            "transport": b.transport, "no_leader": b.no_leader, "not_active": b.not_active,
            "auth_failed": b.auth_failed, "unsupported_version": b.unsupported_version,
            "redirect": b.redirect, "busy": b.busy,
        },
        "hints": {"taken": s.hints_taken, "ignored": s.hints_ignored},
        "grant_wait_ms": histogram(&s.grant_wait),
        "lease_left_at_release_ms": histogram(&s.lease_left_at_release),
        "now": {
            "in_flight": s.in_flight,
            "acquires_in_flight": s.acquires_in_flight,
            "acquires_queued": s.acquires_queued,
            "releases_queued": s.releases_queued,
            "renewals_queued": s.renewals_queued,
            "acquires_open": s.acquires_open,
            "releases_open": s.releases_open,
            "held": s.held,
        },
    })
}

/// The renewal notices name a grant by its id; the output names it by the
/// tag of its acquire. A notice that comes before its grant's outcome (a
/// grant in jeopardy at once) waits for it.
///
/// It also keeps the renewals that `renew` lines asked for until their
/// answers come, for the end of input to wait for them. [`Handle::renew`]
/// resolves once the renewal is queued, and the answer comes later as the
/// grant's next `Renewed`, `LeaseLost` or `LeaseExpired`: a grant lost or
/// expired has nothing more to wait for. If another renewal of the grant
/// (automatic, or another line's) was answered between the queueing and
/// its report here, the next answer is waited for: at the latest the
/// grant's expiry.
#[derive(Default)]
struct Renewals {
    tags: HashMap<OpId, String>,
    early: Vec<Event>,
    /// Grants with a renewal asked by a `renew` line, not yet answered.
    awaited: HashSet<OpId>,
    /// Grants lost or expired: no renewal of theirs is answered any more.
    over: HashSet<OpId>,
}

impl Renewals {
    fn granted(&mut self, grant: OpId, tag: String, now: Time) {
        self.tags.insert(grant, tag);
        let early = std::mem::take(&mut self.early);
        for event in early {
            self.notice(event, now);
        }
    }

    /// A renewal of `grant` was queued: its answer is to come.
    fn await_answer(&mut self, grant: OpId) {
        if !self.over.contains(&grant) {
            self.awaited.insert(grant);
        }
    }

    /// `grant` is being released or was handed back: its renewals are
    /// answered no more.
    fn given_up(&mut self, grant: OpId) {
        self.awaited.remove(&grant);
    }

    fn notice(&mut self, event: Event, now: Time) {
        let (grant, name, key, token, valid_until) = match &event {
            Event::Renewed {
                grant,
                key,
                token,
                valid_until,
            } => (grant, "renewed", key, token, Some(*valid_until)),
            Event::LeaseJeopardy {
                grant,
                key,
                token,
                valid_until,
            } => (grant, "lease_jeopardy", key, token, Some(*valid_until)),
            Event::LeaseLost { grant, key, token } => (grant, "lease_lost", key, token, None),
            Event::LeaseExpired { grant, key, token } => (grant, "lease_expired", key, token, None),
            _ => return notice(&event),
        };
        // Renewed, LeaseLost and LeaseExpired answer the grant's renewal;
        // after either of the last two, none is answered any more.
        match name {
            "renewed" => {
                self.awaited.remove(grant);
            }
            "lease_lost" | "lease_expired" => {
                self.awaited.remove(grant);
                self.over.insert(*grant);
            }
            _ => {}
        }
        let Some(tag) = self.tags.get(grant) else {
            self.early.push(event);
            return;
        };
        let mut line = json!({
            "type": "event",
            "event": name,
            "tag": tag,
            "key": key.as_str(),
            "token": token,
        });
        if let Some(valid_until) = valid_until {
            line = merge(
                line,
                json!({"valid_for_ms": millis_until(valid_until, now)}),
            );
        }
        emit(line);
    }
}

/// `hint_ignored` lines, at most one a second per connection (CLI.md): a
/// server that floods hints outside the allowlist makes a line a second,
/// not one a hint. The first of a connection is printed at once; those
/// that come within a second of a line are folded into the next, printed
/// once that second is over (or before the connection's `closed` line, or
/// `done`), with how many it stands for (`count`) and the latest address.
#[derive(Default)]
struct IgnoredHints {
    /// When this connection's latest `hint_ignored` line was printed.
    printed: Option<Instant>,
    /// Hints ignored since then, and the latest one's address.
    folded: u64,
    addr: Option<Endpoint>,
}

impl IgnoredHints {
    const EVERY: Duration = Duration::from_secs(1);

    fn ignored(&mut self, addr: Endpoint, now: Instant) {
        self.folded += 1;
        self.addr = Some(addr);
        if self.due().is_some_and(|due| due <= now) {
            self.flush(now);
        }
    }

    /// When what is folded is to be printed, if anything is.
    fn due(&self) -> Option<Instant> {
        let after = |at: Instant| at + IgnoredHints::EVERY;
        (self.folded > 0).then(|| self.printed.map_or_else(Instant::now, after))
    }

    fn flush(&mut self, now: Instant) {
        let Some(addr) = self.addr.take().filter(|_| self.folded > 0) else {
            return;
        };
        emit(json!({
            "type": "event",
            "event": "hint_ignored",
            "addr": addr.as_str(),
            "count": self.folded,
        }));
        self.folded = 0;
        self.printed = Some(now);
    }

    /// The connection ended: what it folded is printed, and the next one
    /// begins afresh.
    fn end(&mut self, now: Instant) {
        self.flush(now);
        self.printed = None;
    }
}

/// Sleeps until `at`, for ever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn millis_until(at: Time, now: Time) -> u64 {
    u64::try_from(at.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
}

/// Prints a notice.
fn notice(event: &Event) {
    let line = match event {
        Event::Connecting { addr } => json!({"event": "connecting", "addr": addr.as_str()}),
        Event::Connected { addr, node, window } => {
            json!({"event": "connected", "addr": addr.as_str(), "node": node.as_str(), "window": window})
        }
        Event::Closed { addr, reason } => {
            json!({"event": "closed", "addr": addr.as_str(), "reason": reason.to_string()})
        }
        Event::LeaderHint { addr } => json!({"event": "leader_hint", "addr": addr.as_str()}),
        Event::OrphanRelease { key, token } => {
            json!({"event": "orphan_release", "key": key.as_str(), "token": token})
        }
        Event::OrphanSettled { key, token, result } => json!({
            "event": "orphan_settled",
            "key": key.as_str(),
            "token": token,
            "result": match result {
                ReleaseResult::Released => "released",
                ReleaseResult::NotHeld => "not_held",
                _ => "lapsed",
            },
        }),
        Event::AuthFailed { addr } => json!({"event": "auth_failed", "addr": addr.as_str()}),
        // Backoff and the end of the shutdown are not part of the
        // interface: the next `connecting`, and `done`, say as much.
        _ => return,
    };
    emit(merge(json!({"type": "event"}), line));
}

fn merge(mut base: Value, extra: Value) -> Value {
    if let (Value::Object(base), Value::Object(extra)) = (&mut base, extra) {
        base.extend(extra);
    }
    base
}

/// Writes one line of output and flushes it.
fn emit(line: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
