//! The history of a run: every operation with its invocation and
//! completion times as its client saw them (`Instant`, which is
//! `CLOCK_MONOTONIC` on Linux, as nanoseconds since the run began), every
//! fenced write, and every fault. Written out as JSON lines.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde_json::{json, Value};

/// Nanoseconds since the run began.
pub type Ns = u64;

/// How an acquire ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Acquired {
    /// Granted: its token, and `valid_until` as the client computed it.
    Granted {
        token: u64,
        valid_until: Ns,
    },
    /// `T` (sent), or never sent, with why.
    TimedOut {
        sent: bool,
        cause: Option<String>,
    },
    Busy,
    Cancelled,
    /// May be held until `settles_by`.
    Indeterminate {
        settles_by: Ns,
    },
    /// Every server refused the client.
    Misconfigured(String),
    Other(String),
}

/// One entry of the history.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Acquire {
        client: usize,
        key: String,
        invoked: Ns,
        completed: Ns,
        lease_ms: u64,
        renew: bool,
        outcome: Acquired,
    },
    /// A grant's hold ended: released (`released` is the release's
    /// invocation and how it ended), or let run out. `valid_until`: the
    /// last the client knew when the hold ended; `status`: where the lease
    /// stood (`valid`, `jeopardy`, `lost`, `expired`).
    HoldEnd {
        client: usize,
        key: String,
        token: u64,
        at: Ns,
        valid_until: Ns,
        status: String,
        released: Option<(Ns, Ns, String)>,
    },
    /// A write to the fenced store, with the grant's token.
    Write {
        client: usize,
        key: String,
        token: u64,
        at: Ns,
        accepted: bool,
    },
    Fault {
        kind: String,
        detail: String,
        start: Ns,
        end: Ns,
    },
}

impl Entry {
    fn json(&self) -> Value {
        match self {
            Entry::Acquire {
                client,
                key,
                invoked,
                completed,
                lease_ms,
                renew,
                outcome,
            } => {
                let outcome = match outcome {
                    Acquired::Granted { token, valid_until } => {
                        json!({"granted": {"token": token, "valid_until": valid_until}})
                    }
                    Acquired::TimedOut { sent, cause } => {
                        json!({"timed_out": {"sent": sent, "cause": cause}})
                    }
                    Acquired::Busy => json!("busy"),
                    Acquired::Cancelled => json!("cancelled"),
                    Acquired::Indeterminate { settles_by } => {
                        json!({"indeterminate": {"settles_by": settles_by}})
                    }
                    Acquired::Misconfigured(why) => json!({"misconfigured": why}),
                    Acquired::Other(what) => json!({"other": what}),
                };
                json!({"op": "acquire", "client": client, "key": key, "invoked": invoked,
                       "completed": completed, "lease_ms": lease_ms, "renew": renew,
                       "outcome": outcome})
            }
            Entry::HoldEnd {
                client,
                key,
                token,
                at,
                valid_until,
                status,
                released,
            } => {
                let released = released.as_ref().map(|(invoked, completed, outcome)| {
                    json!({"invoked": invoked, "completed": completed, "outcome": outcome})
                });
                json!({"op": "hold_end", "client": client, "key": key, "token": token, "at": at,
                       "valid_until": valid_until, "status": status, "release": released})
            }
            Entry::Write {
                client,
                key,
                token,
                at,
                accepted,
            } => json!({"op": "write", "client": client, "key": key, "token": token, "at": at,
                        "accepted": accepted}),
            Entry::Fault {
                kind,
                detail,
                start,
                end,
            } => json!({"op": "fault", "kind": kind, "detail": detail, "start": start, "end": end}),
        }
    }
}

/// The history, shared by every client of a run.
#[derive(Clone)]
pub struct History {
    start: Instant,
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl History {
    pub fn new(start: Instant) -> History {
        History {
            start,
            entries: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// `at` as nanoseconds since the run began.
    pub fn ns(&self, at: Instant) -> Ns {
        u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn now(&self) -> Ns {
        self.ns(Instant::now())
    }

    pub fn push(&self, entry: Entry) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry);
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Writes every entry to `path`, one JSON object per line.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for entry in self.entries() {
            writeln!(out, "{}", entry.json())?;
        }
        out.flush()
    }
}

/// A store that refuses a token lower than one it has seen, per key, as a
/// storage system guarding itself with fencing tokens would.
#[derive(Clone, Default)]
pub struct FencedStore {
    highest: Arc<Mutex<std::collections::HashMap<String, u64>>>,
}

impl FencedStore {
    /// Writes with `token`: accepted unless a higher token wrote first.
    pub fn write(&self, key: &str, token: u64) -> bool {
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = highest.entry(key.to_owned()).or_insert(0);
        if token < *seen {
            return false;
        }
        *seen = token;
        true
    }
}
