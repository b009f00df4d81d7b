//! `ticketing client`: a line-oriented driver of the client core, like
//! `redis-cli` for scripts. Commands on standard input, one JSON object a
//! line on standard output (CLI.md).

use std::collections::HashMap;
use std::error::Error;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args as ClapArgs;
use serde_json::{json, Value};
use ticketing::client::{self as core, Event, Grant, OpId, Outcome, ReleaseResult};
use ticketing::tokio::{Canceller, Handle, RequestError};
use ticketing::{Key, Name, Time};
use tokio::io::BufReader;
use tokio::sync::mpsc;

use crate::common::{spawn_client, ClientOptions};
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

/// The shutdown under way.
type Shutdown = Pin<Box<dyn Future<Output = Result<(), RequestError>> + Send>>;

/// Budget of the shutdown at end of input (CLI.md: "end of input means:
/// shutdown 5000").
const END_OF_INPUT_BUDGET: Duration = Duration::from_millis(5000);

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
    /// An acquire under way.
    Acquiring(Canceller),
    /// An acquire that was granted; the grant, until released or abandoned.
    Granted(Option<Grant>),
    /// Anything else (a release, an acquire that ended otherwise).
    Done,
}

/// An operation's end, reported back to the session.
struct Done {
    tag: String,
    op: &'static str,
    key: Key,
    result: Result<Outcome, RequestError>,
}

pub async fn run(args: Args) -> Result<ExitCode, Box<dyn Error>> {
    let (handle, mut notices) = spawn_client(&args.client)?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut tags: HashMap<String, Tagged> = HashMap::new();
    // The tags of the acquires whose grants the renewal notices name.
    let mut renewals = Renewals::default();
    let mut open = 0usize;
    // Each line is read whatever it holds, keeping at most `MAX_LINE` bytes
    // of it: a bad line is an error to print, never the end of the input.
    let mut input = Lines::new(BufReader::new(tokio::io::stdin()));
    let mut shutdown: Option<Duration> = None;

    // The session: commands until a shutdown (or end of input), then the
    // shutdown itself, with outcomes and notices printed as they come.
    let mut shutting_down: Option<Shutdown> = None;
    loop {
        tokio::select! {
            // Notices first: the core emits a close before the outcomes it
            // causes, and the output keeps that order.
            biased;
            Some(event) = notices.recv() => renewals.notice(event, handle.now()),
            line = input.next(), if shutdown.is_none() => match line {
                Ok(Some(input::Line::Bad(message))) => {
                    emit(json!({"type": "error", "message": message}));
                }
                Ok(Some(input::Line::Text(line))) => match parse(&line) {
                    Ok(None) => {}
                    Ok(Some(Line::Shutdown { budget })) => shutdown = Some(budget),
                    Ok(Some(command)) => {
                        if let Err(message) = start(command, &handle, &mut tags, &done_tx, &mut open) {
                            emit(json!({"type": "error", "message": message}));
                        }
                    }
                    Err(message) => emit(json!({"type": "error", "message": message})),
                },
                Ok(None) | Err(_) => shutdown = Some(END_OF_INPUT_BUDGET),
            },
            Some(done) = done_rx.recv() => {
                open -= 1;
                if let Some((grant, tag)) = finish(done, &handle, &mut tags) {
                    renewals.granted(grant, tag, handle.now());
                }
            }
            result = async { shutting_down.as_mut().expect("guarded").await }, if shutting_down.is_some() => {
                if let Err(e) = result {
                    emit(json!({"type": "error", "message": format!("shutdown: {e}")}));
                }
                break;
            }
        }
        if let (Some(budget), None) = (shutdown, &shutting_down) {
            shutting_down = Some(Box::pin(handle.shutdown(budget)));
        }
    }
    // Every operation has its outcome once the shutdown is done.
    while open > 0 {
        let Some(done) = done_rx.recv().await else {
            break;
        };
        open -= 1;
        if let Some((grant, tag)) = finish(done, &handle, &mut tags) {
            renewals.granted(grant, tag, handle.now());
        }
    }
    while let Some(event) = notices.try_recv() {
        renewals.notice(event, handle.now());
    }
    emit(json!({"type": "done"}));
    Ok(ExitCode::SUCCESS)
}

/// Starts the operation of one command line.
fn start(
    command: Line,
    handle: &Handle,
    tags: &mut HashMap<String, Tagged>,
    done: &mpsc::UnboundedSender<Done>,
    open: &mut usize,
) -> Result<(), String> {
    let fresh = |tags: &HashMap<String, Tagged>, tag: &str| {
        if tags.contains_key(tag) {
            Err(format!("tag {} is already used", quote(tag)))
        } else {
            Ok(())
        }
    };
    match command {
        Line::Acquire {
            tag,
            key,
            owner,
            wait,
            lease,
            renew,
        } => {
            fresh(tags, &tag)?;
            let acquire = match renew {
                None => handle.acquire(key.clone(), owner, wait, lease),
                Some(limit) => handle.acquire_renewing(key.clone(), owner, wait, lease, limit),
            };
            tags.insert(tag.clone(), Tagged::Acquiring(acquire.canceller()));
            spawn_op(done, open, tag, "acquire", key, acquire);
        }
        // A release is queued by the call itself, here and now, so that it
        // is in the client before a shutdown on a later line (or the end of
        // input) is; queued from the spawned task, it could come after it
        // and be refused.
        Line::Release { tag, key, token } => {
            fresh(tags, &tag)?;
            tags.insert(tag.clone(), Tagged::Done);
            let release = handle.release_token(key.clone(), token);
            spawn_op(done, open, tag, "release", key, release);
        }
        Line::ReleaseGrant { tag, acquire } => {
            fresh(tags, &tag)?;
            let grant = take_grant(tags, &acquire)?;
            tags.insert(tag.clone(), Tagged::Done);
            let key = grant.key().clone();
            let release = handle.release(&grant);
            spawn_op(done, open, tag, "release", key, release);
        }
        Line::Cancel { tag } => match tags.get(&tag) {
            Some(Tagged::Acquiring(canceller)) => canceller.cancel(),
            // A release ignores cancellation; an ended acquire has nothing
            // left to cancel.
            Some(_) => {}
            None => return Err(format!("no operation tagged {}", quote(&tag))),
        },
        Line::Abandon { tag } => {
            let grant = take_grant(tags, &tag)?;
            handle
                .undeliverable(grant)
                .map_err(|e| format!("abandon {}: {e}", quote(&tag)))?;
        }
        Line::Renew { acquire, lease } => {
            let grant = held_grant(tags, &acquire)?;
            report_refusal(
                format!("renew {}", quote(&acquire)),
                handle.renew(&grant, lease),
            );
        }
        Line::AutoRenew { acquire, on } => {
            let grant = held_grant(tags, &acquire)?;
            let request = handle.auto_renew(&grant, on.is_some(), on.flatten());
            report_refusal(format!("auto-renew {}", quote(&acquire)), request);
        }
        Line::Stats => {
            let stats = handle.stats();
            tokio::spawn(async move {
                match stats.await {
                    Ok(stats) => emit(stats_line(&stats)),
                    Err(e) => emit(json!({"type": "error", "message": format!("stats: {e}")})),
                }
            });
        }
        Line::Shutdown { .. } => unreachable!("handled by the session"),
    }
    Ok(())
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

/// The grant of acquire `tag`, while held.
fn held_grant(tags: &HashMap<String, Tagged>, tag: &str) -> Result<Grant, String> {
    match tags.get(tag) {
        Some(Tagged::Granted(Some(grant))) => Ok(grant.clone()),
        Some(Tagged::Granted(None)) => Err(format!(
            "the grant of {} was already released or abandoned",
            quote(tag)
        )),
        Some(Tagged::Acquiring(_)) => Err(format!("acquire {} has no outcome yet", quote(tag))),
        Some(Tagged::Done) => Err(format!("{} holds no grant", quote(tag))),
        None => Err(format!("no operation tagged {}", quote(tag))),
    }
}

/// Prints an `error` object if the core refuses `request`.
fn report_refusal(
    what: String,
    request: impl Future<Output = Result<(), RequestError>> + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(e) = request.await {
            emit(json!({"type": "error", "message": format!("{what}: {e}")}));
        }
    });
}

fn take_grant(tags: &mut HashMap<String, Tagged>, tag: &str) -> Result<Grant, String> {
    match tags.get_mut(tag) {
        Some(Tagged::Granted(grant)) => grant.take().ok_or_else(|| {
            format!(
                "the grant of {} was already released or abandoned",
                quote(tag)
            )
        }),
        Some(Tagged::Acquiring(_)) => Err(format!("acquire {} has no outcome yet", quote(tag))),
        Some(Tagged::Done) => Err(format!("{} holds no grant", quote(tag))),
        None => Err(format!("no operation tagged {}", quote(tag))),
    }
}

fn spawn_op(
    done: &mpsc::UnboundedSender<Done>,
    open: &mut usize,
    tag: String,
    op: &'static str,
    key: Key,
    future: impl std::future::Future<Output = Result<Outcome, RequestError>> + Send + 'static,
) {
    *open += 1;
    let done = done.clone();
    tokio::spawn(async move {
        let result = future.await;
        let _ = done.send(Done {
            tag,
            op,
            key,
            result,
        });
    });
}

/// Prints an operation's outcome and remembers a grant; a grant's id and
/// the tag of its acquire.
fn finish(
    done: Done,
    handle: &Handle,
    tags: &mut HashMap<String, Tagged>,
) -> Option<(OpId, String)> {
    let Done {
        tag,
        op,
        key,
        result,
    } = done;
    let mut line = json!({"type": "outcome", "tag": tag, "op": op, "key": key.as_str()});
    let fields = match result {
        Ok(Outcome::Granted(grant)) => {
            let fields = json!({
                "outcome": "granted",
                "token": grant.token(),
                "lease_ms": u64::try_from(grant.lease().as_millis()).unwrap_or(u64::MAX),
            });
            let id = grant.id();
            tags.insert(tag.clone(), Tagged::Granted(Some(grant)));
            emit(merge(line, fields));
            return Some((id, tag));
        }
        Ok(Outcome::TimedOut { sent, cause }) => match cause {
            Some(cause) => {
                json!({"outcome": "timed_out", "sent": sent, "cause": cause.to_string()})
            }
            None => json!({"outcome": "timed_out", "sent": sent}),
        },
        Ok(Outcome::Busy) | Err(RequestError::Refused(core::Error::Busy)) => {
            json!({"outcome": "busy"})
        }
        Ok(Outcome::Cancelled) => json!({"outcome": "cancelled"}),
        Ok(Outcome::Indeterminate { settles_by }) => json!({
            "outcome": "indeterminate",
            "settled_within_ms": millis_until(settles_by, handle.now()),
        }),
        Ok(Outcome::Released) => json!({"outcome": "released"}),
        Ok(Outcome::NotHeld) => json!({"outcome": "not_held"}),
        Ok(Outcome::Lapsed) => json!({"outcome": "lapsed"}),
        Ok(other) => json!({"outcome": format!("{other:?}")}),
        Err(e) => {
            tags.insert(tag.clone(), Tagged::Done);
            line = json!({"type": "error", "tag": tag, "message": e.to_string()});
            emit(line);
            return None;
        }
    };
    if matches!(tags.get(&tag), Some(Tagged::Acquiring(_))) {
        tags.insert(tag, Tagged::Done);
    }
    emit(merge(line, fields));
    None
}

/// The renewal notices name a grant by its id; the output names it by the
/// tag of its acquire. A notice that comes before its grant's outcome (a
/// grant in jeopardy at once) waits for it.
#[derive(Default)]
struct Renewals {
    tags: HashMap<OpId, String>,
    early: Vec<Event>,
}

impl Renewals {
    fn granted(&mut self, grant: OpId, tag: String, now: Time) {
        self.tags.insert(grant, tag);
        let early = std::mem::take(&mut self.early);
        for event in early {
            self.notice(event, now);
        }
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
        Event::HintIgnored { addr } => json!({"event": "hint_ignored", "addr": addr.as_str()}),
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
