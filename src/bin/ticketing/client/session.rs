//! A run's state: what each tag stands for, the lines that wait for an
//! acquire's outcome, the tasks whose report is still to come, and the
//! renewals whose answer is.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::json;
use ticketing::client::{self as core, Event, Grant, OpId, Outcome};
use ticketing::tokio::{AcquireError, Canceller, Handle, RequestError};
use ticketing::{Key, Time};
use tokio::sync::mpsc;

use super::output::{self, emit, error, merge, millis_until, stats_line, timed_out, IgnoredHints};
use super::parse::Line;
use crate::input::quote;

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
pub(super) enum Report {
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

/// A run's state: what each tag stands for, and what is still to come.
pub(super) struct Session {
    pub(super) handle: Handle,
    tags: HashMap<String, Tagged>,
    renewals: Renewals,
    pub(super) hints: IgnoredHints,
    reports: mpsc::UnboundedSender<Report>,
    /// Tasks started whose report has not come back.
    pub(super) open: usize,
    /// Lines that wait for an acquire's outcome, and how many may: as many
    /// as the client takes acquires. One more is dropped at once, so that
    /// a script cannot make the session hold more than the client does.
    waiting: usize,
    max_waiting: usize,
}

impl Session {
    /// A run of the client behind `handle`, whose tasks report to
    /// `reports`; as many lines may wait for acquires as the client takes
    /// acquires (`max_waiting`).
    pub(super) fn new(
        handle: Handle,
        reports: mpsc::UnboundedSender<Report>,
        max_waiting: usize,
    ) -> Session {
        Session {
            handle,
            tags: HashMap::new(),
            renewals: Renewals::default(),
            hints: IgnoredHints::default(),
            reports,
            open: 0,
            waiting: 0,
            max_waiting,
        }
    }

    /// Nothing more to wait for before the shutdown at the end of input:
    /// every operation has its outcome (so no line waits either), and
    /// every renewal that a `renew` line asked for has its answer.
    pub(super) fn settled(&self) -> bool {
        self.open == 0 && self.renewals.awaited.is_empty()
    }

    /// Runs one command line, or, for `shutdown`, returns its budget.
    pub(super) fn command(&mut self, command: Line) -> Option<Duration> {
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
    pub(super) fn report(&mut self, report: Report) {
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

    pub(super) fn notice(&mut self, event: Event) {
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
            _ => return output::notice(&event),
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
