//! A model server: answers legally, in a random order drawn from a seed,
//! and injects faults on request.
//!
//! It keeps a lock table the way PROTOCOL.md section 4 says a server must:
//! tokens strictly increase per key, acquires that must wait queue first in
//! first out with their wait deadline, grants carry a lease of
//! `min(asked, maximum)` and end when it runs out, a release frees a grant
//! only by its exact token, a full queue answers `B`, and the handshake is
//! answered with `W`. It speaks versions 1 and 2 as the `H` asks: on
//! version 2 a `G` to an acquire says how long it waited in the key's queue
//! (`waited_ms`), and a renewal `X` is answered by rule 9 (extend-only, by
//! exact token, never queued, never `B` or `T`); on version 1 an `X` is a
//! violation. It is sans-IO like the client: the driver hands it
//! bytes per connection ([`ModelServer::receive`]) and the time
//! ([`ModelServer::advance`]), and takes its frames one at a time with
//! [`ModelServer::emit`], which picks at random among every frame that is
//! ready on that connection. That is the freedom the protocol gives a
//! server: answers to different requests come in any order.
//!
//! [`ModelServer::inject`] adds a [`Fault`]: legal ones (`L`, `M`, `E`),
//! and illegal ones on purpose (a second answer to one id, an answer to an
//! id never sent, an answer naming another key, a lease longer than asked,
//! a `G` to an acquire without `waited_ms` or with more than it asked, a
//! `G` to a renewal with another token),
//! after which the client must close and the invariants must still hold.
//!
//! If the client breaks the protocol (a request before `W`, more requests
//! than the window, an unparsable frame), the server answers `E` and closes,
//! and records a complaint ([`ModelServer::complaints`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::rng::Rng;
use crate::time::{millis, Time};
use crate::wire::{Answer, AnswerKind, Atom, ClientFrame, LineReader, ServerFrame};

/// How the model server behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The node id sent in `W`.
    pub node: String,
    /// The window sent in `W` (at least 2).
    pub window: u64,
    /// The longest lease granted, in milliseconds.
    pub max_lease_ms: u64,
    /// The most waiters one key's queue holds; one more is answered `B`.
    pub queue_limit: usize,
    /// The most waiters over all keys.
    pub total_waiters: usize,
    /// The seed of every random choice.
    pub seed: u64,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            node: "model-1".to_owned(),
            window: 4,
            max_lease_ms: 60_000,
            queue_limit: 4,
            total_waiters: 64,
            seed: 0,
        }
    }
}

/// A fault to inject on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// `L <addr>`: a leader hint (legal).
    Leader {
        /// The address named.
        addr: String,
    },
    /// `M <addr>`, then the server closes; answers not yet sent are lost
    /// (legal).
    Moved {
        /// The address named.
        addr: String,
    },
    /// `E <reason>`, then the server closes; answers not yet sent are lost
    /// (legal).
    Error {
        /// The reason.
        reason: String,
    },
    /// A second copy of an answer already sent (illegal).
    Duplicate,
    /// An answer to an id the client never sent (illegal). With `grant`, a
    /// `G` that really holds the key if it is free (a grant nobody asked
    /// for), else a `T`.
    UnknownId {
        /// The key named.
        key: String,
        /// Whether it is a `G`.
        grant: bool,
    },
    /// A ready answer is sent naming `key` instead of its own (illegal).
    WrongKey {
        /// The key named instead.
        key: String,
    },
    /// A ready `G` (to an acquire or a renewal) is sent with a longer lease
    /// than asked (illegal).
    LongerLease,
    /// A ready `G` to an acquire is sent without its `waited_ms`, as on
    /// version 1 (illegal on version 2).
    WaitedMissing,
    /// A ready `G` to an acquire says it waited longer than the `wait_ms`
    /// asked (illegal).
    WaitedAbove,
    /// A ready `G` to a renewal names another token than the renewal's
    /// (illegal).
    WrongToken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplyKind {
    /// `G .. A`; `waited_ms` is `None` on version 1.
    Granted {
        token: u64,
        lease_ms: u64,
        waited_ms: Option<u64>,
    },
    TimedOut,
    Busy,
    Released,
    NotHeld,
    /// `G .. X`.
    Renewed {
        token: u64,
        lease_ms: u64,
    },
    /// `N .. X`.
    Gone,
}

#[derive(Debug, Clone)]
struct Reply {
    id: u64,
    key: String,
    kind: ReplyKind,
    asked_lease: u64,
    /// The `wait_ms` of an acquire (0 for other requests).
    asked_wait: u64,
}

impl Reply {
    fn encode(&self, out: &mut Vec<u8>) {
        let Ok(key) = Atom::new(&self.key) else {
            return;
        };
        let kind = match self.kind {
            ReplyKind::Granted {
                token,
                lease_ms,
                waited_ms,
            } => AnswerKind::Granted {
                token,
                lease_ms: core::num::NonZeroU64::new(lease_ms.max(1)).expect("non-zero"),
                waited_ms,
            },
            ReplyKind::TimedOut => AnswerKind::TimedOut,
            ReplyKind::Busy => AnswerKind::Busy,
            ReplyKind::Released => AnswerKind::Released,
            ReplyKind::NotHeld => AnswerKind::NotHeld,
            ReplyKind::Renewed { token, lease_ms } => AnswerKind::Renewed {
                token,
                lease_ms: core::num::NonZeroU64::new(lease_ms.max(1)).expect("non-zero"),
            },
            ReplyKind::Gone => AnswerKind::Gone,
        };
        ServerFrame::Answer(Answer {
            id: self.id,
            key,
            kind,
        })
        .encode(out);
    }
}

enum Out {
    Notice(Vec<u8>),
    Answer {
        reply: Reply,
        /// An answer to a request the client made (not a fabricated one).
        real: bool,
    },
}

struct ServerConn {
    reader: LineReader,
    hello: bool,
    /// The version the `H` asked for (1 or 2).
    version: u64,
    welcomed: bool,
    /// `M` or `E` is queued (and is the only frame left): the server closes
    /// once it is sent.
    closing: bool,
    unanswered: u64,
    /// Someone else may have answered on this connection (forged frames):
    /// the window and handshake checks no longer apply.
    forgiven: bool,
    ready: Vec<Out>,
    history: VecDeque<Reply>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TimerRef {
    Lease { key: String, token: u64 },
    Wait { key: String, conn: u64, id: u64 },
}

struct Waiter {
    conn: u64,
    id: u64,
    lease_ms: u64,
    wait_ms: u64,
    /// When it was queued: a `G` on version 2 says how long it waited.
    queued_at: Time,
    timer: u64,
}

#[derive(Default)]
struct Lock {
    /// The token of the current grant and its lease timer.
    holder: Option<(u64, u64)>,
    queue: VecDeque<Waiter>,
    last_token: u64,
}

/// A legal Ticketing server with a random answer order and optional
/// faults; see the module documentation.
pub struct ModelServer {
    config: ServerConfig,
    rng: Rng,
    now: Time,
    locks: BTreeMap<String, Lock>,
    conns: BTreeMap<u64, ServerConn>,
    timers: BTreeSet<(Time, u64)>,
    timer_refs: BTreeMap<u64, (Time, TimerRef)>,
    next_timer: u64,
    waiters: usize,
    next_phantom: u64,
    complaints: Vec<String>,
    grants: u64,
    renewals: u64,
}

impl ModelServer {
    /// A server with no connection and every key free.
    pub fn new(config: ServerConfig) -> ModelServer {
        ModelServer {
            rng: Rng::new(config.seed),
            config,
            now: Time::ZERO,
            locks: BTreeMap::new(),
            conns: BTreeMap::new(),
            timers: BTreeSet::new(),
            timer_refs: BTreeMap::new(),
            next_timer: 0,
            waiters: 0,
            next_phantom: 0,
            complaints: Vec::new(),
            grants: 0,
            renewals: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// What the client did wrong, as the server saw it.
    pub fn complaints(&self) -> &[String] {
        &self.complaints
    }

    /// How many grants were made so far.
    pub fn grants(&self) -> u64 {
        self.grants
    }

    /// The token of `key`'s current grant, if it is held.
    pub fn holder(&self, key: &str) -> Option<u64> {
        self.locks.get(key).and_then(|l| l.holder.map(|(t, _)| t))
    }

    /// A connection `conn` (any number the driver picks) is accepted.
    pub fn open(&mut self, now: Time, conn: u64) {
        self.advance(now);
        self.conns.insert(
            conn,
            ServerConn {
                reader: LineReader::new(),
                hello: false,
                version: 2,
                welcomed: false,
                closing: false,
                unanswered: 0,
                forgiven: false,
                ready: Vec::new(),
                history: VecDeque::new(),
            },
        );
    }

    /// Whether `conn` is open on the server's side.
    pub fn is_open(&self, conn: u64) -> bool {
        self.conns.contains_key(&conn)
    }

    /// Whether the server has sent `M` or `E` on `conn` and has nothing
    /// more to send: the driver should end the transport (end of stream).
    pub fn wants_close(&self, conn: u64) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.closing && c.ready.is_empty())
    }

    /// Frames that the server did not send were given to the client on
    /// `conn`: answers may have reached it that the server knows nothing
    /// of, so the server stops checking the window and the handshake there.
    pub fn forgive(&mut self, conn: u64) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.forgiven = true;
        }
    }

    /// Frames ready to be sent on `conn`.
    pub fn ready(&self, conn: u64) -> usize {
        self.conns.get(&conn).map_or(0, |c| c.ready.len())
    }

    /// The connection ended: its waiters leave their queues (grants stay),
    /// and answers not yet sent are lost.
    pub fn close(&mut self, now: Time, conn: u64) {
        self.advance(now);
        if self.conns.remove(&conn).is_none() {
            return;
        }
        let mut dropped = Vec::new();
        for lock in self.locks.values_mut() {
            lock.queue.retain(|w| {
                if w.conn == conn {
                    dropped.push(w.timer);
                    false
                } else {
                    true
                }
            });
        }
        self.waiters -= dropped.len();
        for timer in dropped {
            self.cancel_timer(timer);
        }
    }

    /// When the next lease runs out or the next waiter's time is up.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.first().map(|&(t, _)| t)
    }

    /// Moves the server's clock to `now`: leases run out and waiters time
    /// out in deadline order, and the next waiters are granted.
    pub fn advance(&mut self, now: Time) {
        while let Some(&(at, seq)) = self.timers.first() {
            if at > now {
                break;
            }
            self.now = self.now.max(at);
            self.timers.remove(&(at, seq));
            let Some((_, timer)) = self.timer_refs.remove(&seq) else {
                continue;
            };
            match timer {
                TimerRef::Lease { key, token } => {
                    let lock = self.locks.get_mut(&key).expect("timers name known keys");
                    if lock.holder.map(|(t, _)| t) == Some(token) {
                        lock.holder = None;
                        self.grant_next(&key);
                    }
                }
                TimerRef::Wait { key, conn, id } => {
                    let lock = self.locks.get_mut(&key).expect("timers name known keys");
                    if let Some(at) = lock.queue.iter().position(|w| w.conn == conn && w.id == id) {
                        let w = lock.queue.remove(at).expect("found");
                        self.waiters -= 1;
                        self.reply(
                            conn,
                            Reply {
                                id,
                                key,
                                kind: ReplyKind::TimedOut,
                                asked_lease: w.lease_ms,
                                asked_wait: w.wait_ms,
                            },
                        );
                    }
                }
            }
        }
        self.now = self.now.max(now);
    }

    fn add_timer(&mut self, at: Time, timer: TimerRef) -> u64 {
        let seq = self.next_timer;
        self.next_timer += 1;
        self.timers.insert((at, seq));
        self.timer_refs.insert(seq, (at, timer));
        seq
    }

    /// `token` holds the known `key` until `until`, by a new lease timer.
    fn hold(&mut self, key: &str, token: u64, until: Time) {
        let timer = self.add_timer(
            until,
            TimerRef::Lease {
                key: key.to_owned(),
                token,
            },
        );
        self.locks.get_mut(key).expect("known key").holder = Some((token, timer));
    }

    fn cancel_timer(&mut self, seq: u64) {
        if let Some((at, _)) = self.timer_refs.remove(&seq) {
            self.timers.remove(&(at, seq));
        }
    }

    /// Bytes from the client on `conn`, in any chunking.
    pub fn receive(&mut self, now: Time, conn: u64, data: &[u8]) {
        self.advance(now);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.closing {
            return;
        }
        let mut reader = core::mem::take(&mut c.reader);
        let mut input = data;
        while let Some(line) = reader.next_line(&mut input) {
            let verdict = match line {
                Err(e) => Err(format!("framing: {e}")),
                Ok(line) => match ClientFrame::parse(line) {
                    Err(e) => Err(format!(
                        "framing: {e} in {:?}",
                        String::from_utf8_lossy(line)
                    )),
                    Ok(frame) => self.request(conn, frame),
                },
            };
            if let Err(complaint) = verdict {
                self.complaints.push(format!("conn {conn}: {complaint}"));
                let reason = if complaint.starts_with("window") {
                    "window"
                } else {
                    "protocol"
                };
                self.shut(conn, format!("E {reason}\n").into_bytes());
                break;
            }
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.reader = reader;
        }
    }

    fn request(&mut self, conn: u64, frame: ClientFrame<'_>) -> Result<(), String> {
        let window = self.config.window.max(2);
        let c = self.conns.get_mut(&conn).expect("open");
        if c.closing {
            return Ok(());
        }
        if let ClientFrame::Hello { version, .. } = frame {
            if c.hello {
                return Err("a second H".into());
            }
            c.hello = true;
            if version != 1 && version != 2 {
                return Err(format!("{frame}: a version the server does not speak"));
            }
            c.version = version;
            let mut w = Vec::new();
            ServerFrame::Welcome {
                node: Atom::new(&self.config.node).unwrap_or(Atom::new("model").expect("atom")),
                window: crate::wire::Window::new(window).expect("at least 2"),
            }
            .encode(&mut w);
            c.ready.push(Out::Notice(w));
            return Ok(());
        }
        if !c.welcomed && !c.forgiven {
            return Err(format!("{frame} before W was sent"));
        }
        let version = c.version;
        c.unanswered += 1;
        if c.unanswered > window && !c.forgiven {
            return Err(format!(
                "window: {frame} makes {} unanswered, window {window}",
                c.unanswered
            ));
        }
        match frame {
            ClientFrame::Acquire {
                id,
                key,
                wait_ms,
                lease_ms,
                ..
            } => self.acquire(conn, id, key.as_str(), wait_ms, lease_ms.get()),
            ClientFrame::Release { id, key, token } => self.release(conn, id, key.as_str(), token),
            ClientFrame::Renew { .. } if version < 2 => {
                return Err(format!("{frame} on version 1"))
            }
            ClientFrame::Renew {
                id,
                key,
                token,
                lease_ms,
            } => self.renew(conn, id, key.as_str(), token, lease_ms.get()),
            ClientFrame::Hello { .. } => unreachable!("handled above"),
        }
        Ok(())
    }

    fn acquire(&mut self, conn: u64, id: u64, key: &str, wait_ms: u64, lease_ms: u64) {
        let lock = self.locks.entry(key.to_owned()).or_default();
        if lock.holder.is_none() && lock.queue.is_empty() {
            self.grant(conn, id, key, lease_ms, wait_ms, self.now);
            return;
        }
        let kind = if wait_ms == 0 {
            Some(ReplyKind::TimedOut)
        } else if lock.queue.len() >= self.config.queue_limit
            || self.waiters >= self.config.total_waiters
        {
            Some(ReplyKind::Busy)
        } else {
            None
        };
        if let Some(kind) = kind {
            self.answer(conn, id, key, kind, lease_ms, wait_ms);
            return;
        }
        let deadline = self.now.saturating_add(millis(wait_ms));
        let timer = self.add_timer(
            deadline,
            TimerRef::Wait {
                key: key.to_owned(),
                conn,
                id,
            },
        );
        self.waiters += 1;
        self.locks
            .get_mut(key)
            .expect("entered above")
            .queue
            .push_back(Waiter {
                conn,
                id,
                lease_ms,
                wait_ms,
                queued_at: self.now,
                timer,
            });
    }

    /// Grants the free `key` to request `id` on `conn` (the connection may
    /// have closed: the grant stands, its answer is lost), an acquire of
    /// `wait_ms` received at `queued_at`.
    fn grant(
        &mut self,
        conn: u64,
        id: u64,
        key: &str,
        lease_ms: u64,
        wait_ms: u64,
        queued_at: Time,
    ) {
        let lease = lease_ms.min(self.config.max_lease_ms).max(1);
        let until = self.now.saturating_add(millis(lease));
        let lock = self.locks.get_mut(key).expect("known key");
        lock.last_token += 1;
        let token = lock.last_token;
        self.hold(key, token, until);
        self.grants += 1;
        // Whole milliseconds, rounded down; version 1 does not say.
        let waited = self.now.millis_since(queued_at);
        let version = self.conns.get(&conn).map_or(2, |c| c.version);
        let kind = ReplyKind::Granted {
            token,
            lease_ms: lease,
            waited_ms: (version >= 2).then_some(waited),
        };
        self.answer(conn, id, key, kind, lease_ms, wait_ms);
    }

    fn grant_next(&mut self, key: &str) {
        loop {
            let lock = self.locks.get_mut(key).expect("known key");
            if lock.holder.is_some() {
                return;
            }
            let Some(w) = lock.queue.pop_front() else {
                return;
            };
            self.waiters -= 1;
            self.cancel_timer(w.timer);
            self.grant(w.conn, w.id, key, w.lease_ms, w.wait_ms, w.queued_at);
        }
    }

    fn release(&mut self, conn: u64, id: u64, key: &str, token: u64) {
        let lock = self.locks.entry(key.to_owned()).or_default();
        let kind = match lock.holder {
            Some((t, timer)) if t == token => {
                lock.holder = None;
                self.cancel_timer(timer);
                self.grant_next(key);
                ReplyKind::Released
            }
            _ => ReplyKind::NotHeld,
        };
        self.answer(conn, id, key, kind, 0, 0);
    }

    /// Rule 9: a renewal of the key's current grant by its exact token
    /// extends it, never shortens it, and is answered `G` with the lease it
    /// granted; anything else is `N`. Never queued, never `B` or `T`.
    fn renew(&mut self, conn: u64, id: u64, key: &str, token: u64, lease_ms: u64) {
        let lease = lease_ms.min(self.config.max_lease_ms).max(1);
        let now = self.now;
        let lock = self.locks.entry(key.to_owned()).or_default();
        let kind = match lock.holder {
            Some((t, timer)) if t == token => {
                let end = self.timer_refs.get(&timer).map_or(now, |(at, _)| *at);
                let new_end = end.max(now.saturating_add(millis(lease)));
                if new_end > end {
                    self.cancel_timer(timer);
                    self.hold(key, token, new_end);
                }
                self.renewals += 1;
                ReplyKind::Renewed {
                    token,
                    lease_ms: lease,
                }
            }
            _ => ReplyKind::Gone,
        };
        self.answer(conn, id, key, kind, lease_ms, 0);
    }

    /// When the current grant of `key` ends, if it is held.
    pub fn lease_end(&self, key: &str) -> Option<Time> {
        let (_, timer) = self.locks.get(key)?.holder?;
        self.timer_refs.get(&timer).map(|(at, _)| *at)
    }

    /// How many renewals extended (or kept) a grant so far.
    pub fn renewals(&self) -> u64 {
        self.renewals
    }

    /// Answers request `id` of `conn` about `key` with `kind`, the request
    /// having asked for a lease of `asked_lease` and a wait of `asked_wait`.
    fn answer(
        &mut self,
        conn: u64,
        id: u64,
        key: &str,
        kind: ReplyKind,
        asked_lease: u64,
        asked_wait: u64,
    ) {
        self.reply(
            conn,
            Reply {
                id,
                key: key.to_owned(),
                kind,
                asked_lease,
                asked_wait,
            },
        );
    }

    fn reply(&mut self, conn: u64, reply: Reply) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if !c.closing {
                c.ready.push(Out::Answer { reply, real: true });
            }
        }
    }

    /// Queues a closing frame: every other frame not yet sent is lost.
    fn shut(&mut self, conn: u64, frame: Vec<u8>) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.ready.clear();
            c.ready.push(Out::Notice(frame));
            c.closing = true;
        }
    }

    /// Takes one frame ready on `conn`, picked at random among all of them.
    pub fn emit(&mut self, conn: u64) -> Option<Vec<u8>> {
        let c = self.conns.get_mut(&conn)?;
        if c.ready.is_empty() {
            return None;
        }
        let at = self.rng.up_to(c.ready.len() as u64 - 1) as usize;
        let out = c.ready.swap_remove(at);
        let mut bytes = Vec::new();
        match out {
            Out::Notice(frame) => {
                if frame.first() == Some(&b'W') {
                    c.welcomed = true;
                }
                bytes = frame;
            }
            Out::Answer { reply, real } => {
                if real {
                    c.unanswered = c.unanswered.saturating_sub(1);
                }
                reply.encode(&mut bytes);
                c.history.push_back(reply);
                if c.history.len() > 16 {
                    c.history.pop_front();
                }
            }
        }
        Some(bytes)
    }

    /// Injects `fault` on `conn`. Returns whether it could be (a duplicate
    /// needs an answer sent before, a wrong key or a longer lease a ready
    /// answer, and nothing is injected once the server is closing).
    pub fn inject(&mut self, now: Time, conn: u64, fault: Fault) -> bool {
        self.advance(now);
        let Some(c) = self.conns.get_mut(&conn) else {
            return false;
        };
        if c.closing {
            return false;
        }
        match fault {
            Fault::Leader { addr } => {
                c.ready
                    .push(Out::Notice(format!("L {addr}\n").into_bytes()));
                true
            }
            Fault::Moved { addr } => {
                self.shut(conn, format!("M {addr}\n").into_bytes());
                true
            }
            Fault::Error { reason } => {
                self.shut(conn, format!("E {reason}\n").into_bytes());
                true
            }
            Fault::Duplicate => {
                if c.history.is_empty() {
                    return false;
                }
                let at = self.rng.up_to(c.history.len() as u64 - 1) as usize;
                let reply = c.history[at].clone();
                c.ready.push(Out::Answer { reply, real: false });
                true
            }
            Fault::UnknownId { key, grant } => {
                if Atom::new(&key).is_err() {
                    return false;
                }
                self.next_phantom += 1;
                let id = 1_000_000_000 + self.next_phantom;
                let lease = 1 + self.rng.up_to(self.config.max_lease_ms.clamp(1, 5_000) - 1);
                let kind = if grant {
                    let lock = self.locks.entry(key.clone()).or_default();
                    if lock.holder.is_none() && lock.queue.is_empty() {
                        // A grant nobody asked for: it really holds the key.
                        lock.last_token += 1;
                        let token = lock.last_token;
                        let until = self.now.saturating_add(millis(lease));
                        self.hold(&key, token, until);
                        self.grants += 1;
                        ReplyKind::Granted {
                            token,
                            lease_ms: lease,
                            waited_ms: Some(0),
                        }
                    } else {
                        ReplyKind::TimedOut
                    }
                } else {
                    ReplyKind::TimedOut
                };
                let c = self.conns.get_mut(&conn).expect("open");
                c.ready.push(Out::Answer {
                    reply: Reply {
                        id,
                        key,
                        kind,
                        asked_lease: lease,
                        asked_wait: 0,
                    },
                    real: false,
                });
                true
            }
            Fault::WrongKey { key } => {
                if Atom::new(&key).is_err() {
                    return false;
                }
                let answers: Vec<usize> = (0..c.ready.len())
                    .filter(
                        |&i| matches!(&c.ready[i], Out::Answer { reply, .. } if reply.key != key),
                    )
                    .collect();
                if answers.is_empty() {
                    return false;
                }
                let at = answers[self.rng.up_to(answers.len() as u64 - 1) as usize];
                if let Out::Answer { reply, .. } = &mut c.ready[at] {
                    reply.key = key;
                }
                true
            }
            Fault::LongerLease => {
                let at = self.pick_ready(conn, |r| {
                    matches!(
                        r.kind,
                        ReplyKind::Granted { .. } | ReplyKind::Renewed { .. }
                    ) && r.asked_lease < u64::MAX
                });
                let Some(at) = at else {
                    return false;
                };
                let extra = 1 + self.rng.up_to(999);
                self.rewrite_ready(conn, at, |reply| {
                    let longer = reply.asked_lease.saturating_add(extra);
                    match &mut reply.kind {
                        ReplyKind::Granted { lease_ms, .. }
                        | ReplyKind::Renewed { lease_ms, .. } => {
                            *lease_ms = longer;
                        }
                        _ => {}
                    }
                })
            }
            Fault::WaitedMissing => {
                let at = self.pick_ready(conn, |r| {
                    matches!(
                        r.kind,
                        ReplyKind::Granted {
                            waited_ms: Some(_),
                            ..
                        }
                    )
                });
                let Some(at) = at else {
                    return false;
                };
                self.rewrite_ready(conn, at, |reply| {
                    if let ReplyKind::Granted { waited_ms, .. } = &mut reply.kind {
                        *waited_ms = None;
                    }
                })
            }
            Fault::WaitedAbove => {
                let at = self.pick_ready(conn, |r| {
                    matches!(r.kind, ReplyKind::Granted { .. }) && r.asked_wait < u64::MAX
                });
                let Some(at) = at else {
                    return false;
                };
                let extra = 1 + self.rng.up_to(999);
                self.rewrite_ready(conn, at, |reply| {
                    let above = reply.asked_wait.saturating_add(extra);
                    if let ReplyKind::Granted { waited_ms, .. } = &mut reply.kind {
                        *waited_ms = Some(above);
                    }
                })
            }
            Fault::WrongToken => {
                let at = self.pick_ready(conn, |r| matches!(r.kind, ReplyKind::Renewed { .. }));
                let Some(at) = at else {
                    return false;
                };
                let other = 1 + self.rng.up_to(9);
                self.rewrite_ready(conn, at, |reply| {
                    if let ReplyKind::Renewed { token, .. } = &mut reply.kind {
                        *token = token.wrapping_add(other);
                    }
                })
            }
        }
    }
}

impl ModelServer {
    /// A random ready answer on `conn` that `fits`, by its place.
    fn pick_ready(&mut self, conn: u64, fits: impl Fn(&Reply) -> bool) -> Option<usize> {
        let c = self.conns.get(&conn)?;
        let found: Vec<usize> = (0..c.ready.len())
            .filter(|&i| matches!(&c.ready[i], Out::Answer { reply, .. } if fits(reply)))
            .collect();
        if found.is_empty() {
            return None;
        }
        Some(found[self.rng.up_to(found.len() as u64 - 1) as usize])
    }

    /// Changes the ready answer at `at` on `conn`; `true` if there was one.
    fn rewrite_ready(&mut self, conn: u64, at: usize, change: impl FnOnce(&mut Reply)) -> bool {
        match self.conns.get_mut(&conn).and_then(|c| c.ready.get_mut(at)) {
            Some(Out::Answer { reply, .. }) => {
                change(reply);
                true
            }
            _ => false,
        }
    }
}

impl core::fmt::Debug for ModelServer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ModelServer")
            .field("now", &self.now)
            .field("conns", &self.conns.len())
            .field("keys", &self.locks.len())
            .field("waiters", &self.waiters)
            .field("grants", &self.grants)
            .finish_non_exhaustive()
    }
}
