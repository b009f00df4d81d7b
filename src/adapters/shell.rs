//! What every adapter does around the client core, whatever its runtime:
//! turning the embedder's requests into commands, the core's outcomes into
//! replies, and grants whose caller has gone into exact-token releases.
//!
//! No protocol rule lives here. The shell only keeps the bookkeeping an
//! adapter needs (which reply belongs to which operation) and hands every
//! decision to the core. Every adapter answers its callers through the
//! same reply channel ([`reply`](super::reply)) and supplies its own I/O.

use std::time::{Duration, Instant};

use bytes::Bytes;

use std::sync::Arc;

use crate::adapters::lease::{self, Guards};
use crate::adapters::notices::Sink;
use crate::adapters::reply::Sender;
use crate::client::{Action, Client, ClientStats, ConnId, Error, Event, Grant, OpId, Outcome};
use crate::hash::IdMap;
use crate::names::{Endpoint, Key, Name};
use crate::time::Time;

/// An operation's result as the adapters hand it out.
pub(crate) type OpResult = Result<Outcome, Error>;

/// Why an adapter could not give an operation's outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The core refused the request at once (misuse, or its own capacity is
    /// full: [`Error::Busy`]).
    #[error(transparent)]
    Refused(#[from] Error),
    /// The driver has stopped (it shut down, or its runtime went away).
    #[error("the client's driver has stopped")]
    Stopped,
}

/// Why a lock gave no held grant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The acquire ended without a grant: timed out, busy, cancelled, or
    /// Indeterminate (the outcome says which).
    #[error("not acquired: {0:?}")]
    NotAcquired(Outcome),
    /// The request failed.
    #[error(transparent)]
    Request(#[from] RequestError),
}

/// What an acquire asks for, as the adapters' `acquire`, `lock` and their
/// `_renewing` forms take it.
pub(crate) struct AcquireArgs {
    pub(crate) key: Key,
    pub(crate) owner: Name,
    pub(crate) wait: Duration,
    pub(crate) lease: Duration,
    /// Renew the grant automatically, for at most this long.
    pub(crate) renew: Option<Duration>,
}

impl AcquireArgs {
    /// The arguments of `acquire`/`lock` (`limit: None`), or of their
    /// `_renewing` forms (`Some(limit)`, whose `None` is: until released).
    pub(crate) fn new(
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        limit: Option<Option<Duration>>,
    ) -> AcquireArgs {
        let renew = limit.map(|limit| limit.unwrap_or(Duration::MAX));
        AcquireArgs {
            key,
            owner,
            wait,
            lease,
            renew,
        }
    }
}

/// A request from the embedder to the driver.
pub(crate) enum Command {
    Acquire {
        ticket: u64,
        args: AcquireArgs,
        /// The guard that will hold the grant, kept up to date.
        guard: Option<Arc<lease::Shared>>,
        reply: Sender<OpResult>,
    },
    Release {
        grant: Grant,
        reply: Sender<OpResult>,
    },
    ReleaseToken {
        key: Key,
        token: u64,
        reply: Sender<OpResult>,
    },
    /// Cancel the acquire with this ticket (its caller went away, or asked).
    Cancel { ticket: u64 },
    /// A grant its receiver could not take: release it by exact token.
    Undeliverable { grant: Grant },
    /// Renew a held grant once.
    Renew {
        grant: Grant,
        lease: Option<Duration>,
        reply: Sender<Result<(), Error>>,
    },
    /// Start (for at most `limit`) or stop renewing a held grant.
    AutoRenew {
        grant: Grant,
        on: bool,
        limit: Option<Duration>,
        reply: Sender<Result<(), Error>>,
    },
    /// A guard went away without a release: release its grant by exact
    /// token (which stops its renewal), its outcome to nobody.
    DropGuard { grant: Grant },
    /// A guard's grant is left to run out: no more renewal.
    LetExpire { grant: Grant },
    /// The core's counters.
    Stats { reply: Sender<ClientStats> },
    Shutdown {
        budget: Duration,
        reply: Sender<Result<(), Error>>,
    },
}

impl Command {
    /// What the core must hear when the caller of the acquire `ticket`
    /// goes away, given what its reply slot held (`taken`, handed back by
    /// giving the slot up): a grant nobody will take is released by exact
    /// token, an acquire still under way is cancelled, any other outcome
    /// needs nothing.
    pub(crate) fn for_abandoned(ticket: u64, taken: Option<OpResult>) -> Option<Self> {
        match taken {
            Some(Ok(Outcome::Granted(grant))) => Some(Command::Undeliverable { grant }),
            Some(_) => None,
            None => Some(Command::Cancel { ticket }),
        }
    }
}

/// The I/O an adapter performs for the core's actions.
pub(crate) trait Io {
    fn connect(&mut self, conn: ConnId, addr: Endpoint);
    fn send(&mut self, conn: ConnId, data: Bytes);
    fn close(&mut self, conn: ConnId);
}

/// The core plus the adapter's bookkeeping.
pub(crate) struct Shell {
    client: Client,
    start: Instant,
    waiters: IdMap<OpId, (Option<u64>, Sender<OpResult>)>,
    tickets: IdMap<u64, OpId>,
    shutdown_waiters: Vec<Sender<Result<(), Error>>>,
    guards: Guards,
    notices: Sink,
    /// When the counters were last published (feature `metrics`).
    #[cfg(feature = "metrics")]
    published: Option<Instant>,
}

impl Shell {
    /// A shell around `client`, whose times count from `start`.
    pub(crate) fn new(client: Client, start: Instant, notices: Sink) -> Self {
        Shell {
            client,
            start,
            waiters: IdMap::default(),
            tickets: IdMap::default(),
            shutdown_waiters: Vec::new(),
            guards: Guards::default(),
            notices,
            #[cfg(feature = "metrics")]
            published: None,
        }
    }

    /// The core's time for the present instant.
    pub(crate) fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    /// The core's time for `instant`.
    pub(crate) fn time_of(&self, instant: Instant) -> Time {
        let since = instant.saturating_duration_since(self.start);
        Time::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The instant of the core's next deadline (`None`: none, or beyond
    /// what `Instant` can represent).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let at = self.client.poll_timeout()?;
        self.start.checked_add(Duration::from_nanos(at.as_nanos()))
    }

    /// Whether the core has shut down and has nothing left to hand out.
    pub(crate) fn is_done(&self) -> bool {
        self.client.is_finished() && self.client.poll_timeout().is_none()
    }

    /// Whether notices are held back because their reader is behind: the
    /// driver then reads no input, and `cx` is woken when there is room.
    #[cfg_attr(not(any(feature = "tokio", feature = "futures-io")), allow(dead_code))]
    pub(crate) fn notices_full(&mut self, cx: &std::task::Context<'_>) -> bool {
        self.notices.is_full(cx)
    }

    pub(crate) fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Carries out one command.
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn command(&mut self, command: Command) {
        self.command_at(self.now(), command);
    }

    /// Carries out one command at `now` (the core's time, from
    /// [`now`](Shell::now): one reading may serve several commands).
    pub(crate) fn command_at(&mut self, now: Time, command: Command) {
        match command {
            Command::Acquire {
                ticket,
                args:
                    AcquireArgs {
                        key,
                        owner,
                        wait,
                        lease,
                        renew,
                    },
                guard,
                reply,
            } => {
                let started = match renew {
                    None => self.client.acquire(now, key, owner, wait, lease),
                    Some(limit) => {
                        self.client
                            .acquire_renewing(now, key, owner, wait, lease, Some(limit))
                    }
                };
                if let (Ok(op), Some(guard)) = (&started, guard) {
                    self.guards.expect(*op, guard);
                }
                self.await_outcome(started, Some(ticket), reply);
            }
            Command::Release { grant, reply } => {
                self.guards.forget(&grant);
                let started = self.client.release(now, &grant);
                self.await_outcome(started, None, reply);
            }
            Command::ReleaseToken { key, token, reply } => {
                let started = self.client.release_token(now, key, token);
                self.await_outcome(started, None, reply);
            }
            Command::Cancel { ticket } => {
                if let Some(op) = self.tickets.remove(&ticket) {
                    // An operation that already ended is no error here: its
                    // outcome finds no receiver, and a grant goes back.
                    let _ = self.client.cancel(now, op);
                }
            }
            Command::Undeliverable { grant } => {
                // A grant already released or expired needs nothing more.
                let _ = self.client.undeliverable(now, &grant);
            }
            Command::Renew {
                grant,
                lease,
                reply,
            } => {
                let _ = reply.send(self.client.renew(now, &grant, lease));
            }
            Command::AutoRenew {
                grant,
                on,
                limit,
                reply,
            } => {
                let result = match on {
                    true => self.client.auto_renew(now, &grant, limit),
                    false => self.client.stop_renewing(now, &grant),
                };
                let _ = reply.send(result);
            }
            Command::DropGuard { grant } => {
                self.guards.forget(&grant);
                // Released or gone already: nothing more to do.
                let _ = self.client.release(now, &grant);
            }
            Command::LetExpire { grant } => {
                self.guards.forget(&grant);
                let _ = self.client.stop_renewing(now, &grant);
            }
            Command::Stats { reply } => {
                let _ = reply.send(self.client.stats());
            }
            Command::Shutdown { budget, reply } => match self.client.shutdown(now, budget) {
                Ok(()) => self.shutdown_waiters.push(reply),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
        }
    }

    /// Publishes the core's counters to the `metrics` facade, at most once
    /// a second.
    #[cfg(feature = "metrics")]
    fn publish(&mut self) {
        let now = Instant::now();
        if self
            .published
            .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
        {
            return;
        }
        self.published = Some(now);
        crate::adapters::metrics::record_client(&self.client.stats());
    }

    /// Keeps `reply` for the outcome of the operation just `started` (the
    /// acquire of `ticket`, if one), or answers at once with its refusal.
    fn await_outcome(
        &mut self,
        started: Result<OpId, Error>,
        ticket: Option<u64>,
        reply: Sender<OpResult>,
    ) {
        match started {
            Ok(op) => {
                self.waiters.insert(op, (ticket, reply));
                if let Some(ticket) = ticket {
                    self.tickets.insert(ticket, op);
                }
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// Drains the core: actions to `io`, outcomes to their callers, notices
    /// to the notice sink. A grant whose caller is gone is handed back to
    /// the core, which releases it by its exact token. Returns how many
    /// outcomes went to callers (each may wake a task).
    pub(crate) fn pump(&mut self, io: &mut impl Io) -> usize {
        #[cfg(feature = "metrics")]
        self.publish();
        let mut delivered = 0;
        loop {
            while let Some(action) = self.client.poll_action() {
                match action {
                    Action::Connect { conn, addr } => io.connect(conn, addr),
                    Action::Send { conn, data } => io.send(conn, data),
                    Action::Close { conn } => io.close(conn),
                }
            }
            let Some(event) = self.client.poll_event() else {
                break delivered;
            };
            match event {
                Event::Outcome { op, outcome } => {
                    delivered += 1;
                    self.deliver(op, outcome);
                }
                Event::ShutdownComplete => {
                    for reply in self.shutdown_waiters.drain(..) {
                        let _ = reply.send(Ok(()));
                    }
                    self.notify(Event::ShutdownComplete);
                }
                other => {
                    self.guards.notice(&other);
                    self.notify(other);
                }
            }
        }
    }

    fn deliver(&mut self, op: OpId, outcome: Outcome) {
        let undelivered = match self.waiters.remove(&op) {
            Some((ticket, reply)) => {
                if let Some(ticket) = ticket {
                    self.tickets.remove(&ticket);
                }
                // The guard is kept up to date before its caller can look.
                self.guards.acquired(op, &outcome, true);
                let undelivered = reply.send(Ok(outcome)).err().and_then(Result::ok);
                if let Some(Outcome::Granted(grant)) = &undelivered {
                    self.guards.forget(grant);
                }
                undelivered
            }
            None => Some(outcome),
        };
        if let Some(Outcome::Granted(grant)) = undelivered {
            let now = self.now();
            let _ = self.client.undeliverable(now, &grant);
        }
    }

    fn notify(&mut self, event: Event) {
        self.notices.notify(event);
    }
}
