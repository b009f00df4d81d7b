//! The reference server against a model of PROTOCOL.md section 4.
//!
//! A seeded quickcheck property runs random multi-connection traffic
//! (connects with and without `H`, acquires, releases, malformed frames,
//! closes, role changes, leader announcements, timer jumps, handshakes that
//! come too late or never, and every byte
//! stream cut at random places) through the server and through a small,
//! obviously-correct model of the lock table written here with plain vectors
//! and linear scans. After every step the bytes each connection got, the
//! connections closed, every key's holder and queue, the window counts and
//! the next timeout must agree.
//!
//! The generator's seed is printed; set `TICKETING_QC_SEED=<u64>` to run
//! another seed or to replay a failure, and `TICKETING_QC_CASES=<n>` to
//! run more or fewer cases (default 1000).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use quickcheck::{Arbitrary, Gen, QuickCheck, TestResult};
use ticketing::server::{Action, Config, ConnId, Role, Server, TableImage, Term};
use ticketing::{Endpoint, Name, Time};

const DEFAULT_SEED: u64 = 0x7ec4_e7a1;
const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
const MS: u64 = 1_000_000;
const SLOTS: u64 = 5;

fn below(g: &mut Gen, n: u64) -> u64 {
    u64::arbitrary(g) % n
}

// ----- the traffic --------------------------------------------------------

/// One step of the traffic. Steps that name a slot without an open
/// connection (or, for `Connect`, with one) do nothing, so any subsequence
/// of a scenario is a scenario: that is what shrinking relies on.
#[derive(Debug, Clone)]
enum Op {
    /// Accept a connection in `slot`; queue its `H` unless `hello` is
    /// false, with version 2 if `v2`.
    Connect { slot: u64, hello: bool, v2: bool },
    Acquire {
        slot: u64,
        key: usize,
        wait_ms: u64,
        lease_ms: u64,
        deliver: u8,
    },
    Release {
        slot: u64,
        key: usize,
        pick: u8,
        deliver: u8,
    },
    /// `X` (a protocol violation on version 1).
    Renew {
        slot: u64,
        key: usize,
        pick: u8,
        lease_ms: u64,
        deliver: u8,
    },
    /// A frame that is malformed, or a second `H`.
    Junk { slot: u64, kind: u8, deliver: u8 },
    /// Deliver more of what the slot has queued, in chunks of `chunk` bytes.
    Deliver { slot: u64, chunk: u8 },
    /// The transport of `slot` ends.
    Drop { slot: u64 },
    /// The clock moves on by `ns` nanoseconds.
    Wait { ns: u64 },
    /// The clock moves to the server's next timeout, if any is near.
    ToDeadline,
    /// The node's role changes: 0 leader, 1 follower, 2 no leader, 3 not
    /// active.
    Role { which: u8 },
    /// `announce_leader` to all.
    Announce,
    /// The server stops and a new one begins a term after `stopped_ms`:
    /// with the table written out and read back (a clean stop), or
    /// without it (a crash: a recovery grace).
    Restart { with_table: bool, stopped_ms: u64 },
}

impl Arbitrary for Op {
    fn arbitrary(g: &mut Gen) -> Op {
        let slot = below(g, SLOTS);
        let deliver = u8::arbitrary(g);
        match below(g, 100) {
            0..=9 => Op::Connect {
                slot,
                hello: below(g, 12) != 0,
                v2: below(g, 4) != 0,
            },
            10..=39 => Op::Acquire {
                slot,
                key: below(g, KEYS.len() as u64) as usize,
                wait_ms: *g
                    .choose(&[0, 0, 1, 5, 10, 40, 100, 250, 1000, u64::MAX])
                    .unwrap_or(&0),
                lease_ms: *g
                    .choose(&[1, 3, 10, 50, 100, 149, 150, 151, 400, u64::MAX])
                    .unwrap_or(&1),
                deliver,
            },
            40..=45 => Op::Renew {
                slot,
                key: below(g, KEYS.len() as u64) as usize,
                pick: u8::arbitrary(g),
                lease_ms: *g.choose(&[1, 10, 100, 400, u64::MAX]).unwrap_or(&1),
                deliver,
            },
            46..=59 => Op::Release {
                slot,
                key: below(g, KEYS.len() as u64) as usize,
                pick: u8::arbitrary(g),
                deliver,
            },
            60..=62 => Op::Junk {
                slot,
                kind: u8::arbitrary(g),
                deliver,
            },
            63..=69 => Op::Deliver {
                slot,
                chunk: u8::arbitrary(g).max(1),
            },
            70..=73 => Op::Drop { slot },
            74..=88 => Op::Wait {
                ns: match below(g, 4) {
                    0 => below(g, 3 * MS),
                    1 => below(g, 60) * MS,
                    2 => below(g, 300) * MS + below(g, MS),
                    _ => 0,
                },
            },
            89..=95 => Op::ToDeadline,
            96 => Op::Role {
                which: *g.choose(&[0, 0, 1, 2, 3]).unwrap_or(&0),
            },
            97 => Op::Restart {
                with_table: bool::arbitrary(g),
                stopped_ms: *g.choose(&[0, 0, 1, 20, 100, 500]).unwrap_or(&0),
            },
            _ => Op::Announce,
        }
    }
}

/// A configuration and the traffic.
#[derive(Debug, Clone)]
struct Scenario {
    window: u64,
    queue_limit: usize,
    max_waiters: usize,
    max_lease_ms: u64,
    handshake_timeout_ms: u64,
    hint: bool,
    /// The server's hashing secret: what it answers must not depend on it.
    hash_key: u128,
    grace_margin_ms: u64,
    ops: Vec<Op>,
}

impl Arbitrary for Scenario {
    fn arbitrary(g: &mut Gen) -> Scenario {
        Scenario {
            window: 2 + below(g, 5),
            queue_limit: below(g, 4) as usize,
            max_waiters: below(g, 6) as usize,
            max_lease_ms: *g.choose(&[1, 50, 150, 1000]).unwrap_or(&150),
            handshake_timeout_ms: *g.choose(&[1, 40, 300, 10_000]).unwrap_or(&300),
            hint: bool::arbitrary(g),
            hash_key: u128::arbitrary(g),
            grace_margin_ms: *g.choose(&[0, 1, 50, 1000]).unwrap_or(&0),
            ops: Vec::arbitrary(g),
        }
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Scenario>> {
        let base = self.clone();
        Box::new(self.ops.shrink().map(move |ops| Scenario {
            ops,
            ..base.clone()
        }))
    }
}

// ----- the model ----------------------------------------------------------

/// A frame as the model sees it.
#[derive(Debug, Clone)]
enum Frame {
    Hello {
        v2: bool,
    },
    Acquire {
        id: u64,
        key: String,
        wait_ms: u64,
        lease_ms: u64,
    },
    Release {
        id: u64,
        key: String,
        token: u64,
    },
    Renew {
        id: u64,
        key: String,
        token: u64,
        lease_ms: u64,
    },
    Bad,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MRole {
    Leader,
    Follower,
    NoLeader,
    NotActive,
}

struct MGrant {
    key: String,
    token: u64,
    expires: u64,
}

/// A grant as its answers promised it: live from its `G` until `end`,
/// unless released first.
struct Promise {
    token: u64,
    end: u64,
    released: bool,
}

struct MWaiter {
    conn: usize,
    id: u64,
    key: String,
    deadline: u64,
    lease_ms: u64,
    since: u64,
    wait_ms: u64,
}

#[derive(Default)]
struct MConn {
    open: bool,
    ready: bool,
    /// Its `H` said version 2.
    v2: bool,
    /// When it is closed if it is not `ready` by then.
    hello_deadline: u64,
    unanswered: u64,
    closed_by_server: bool,
    out: String,
}

/// The lock table and the connections, the naive way.
struct Model {
    window: u64,
    queue_limit: usize,
    max_waiters: usize,
    max_lease_ms: u64,
    handshake_timeout_ms: u64,
    role: MRole,
    hint: Option<String>,
    grace_margin_ms: u64,
    epoch: u64,
    /// The term's grants so far (the `n` of its latest token).
    count: u64,
    /// Nothing is granted before this; earlier epochs' tokens reclaim.
    grace_until: Option<u64>,
    /// Invariant 8's ground truth, across restarts: per key, every grant
    /// the clients were told of, as its answers promised it.
    truth: BTreeMap<String, Vec<Promise>>,
    /// Breaches of invariant 8 seen.
    breaches: Vec<String>,
    /// Grants reclaimed, and graces that ended with a grant: evidence
    /// that the traffic reached section 4.1.
    reclaims: u64,
    grace_grants: u64,
    grants: Vec<MGrant>,
    /// In arrival order.
    waiters: Vec<MWaiter>,
    conns: Vec<MConn>,
}

impl Model {
    fn say(&mut self, conn: usize, line: &str) {
        self.conns[conn].out.push_str(line);
        self.conns[conn].out.push('\n');
    }

    fn answer(&mut self, conn: usize, line: &str) {
        self.conns[conn].unanswered -= 1;
        self.say(conn, line);
    }

    fn close(&mut self, conn: usize, farewell: &str) {
        self.say(conn, farewell);
        self.conns[conn].open = false;
        self.conns[conn].closed_by_server = true;
        self.waiters.retain(|w| w.conn != conn);
    }

    fn farewell(&self) -> Option<&'static str> {
        match self.role {
            MRole::Leader => None,
            MRole::Follower => Some("M n2:7878"),
            MRole::NoLeader => Some("E no_leader"),
            MRole::NotActive => Some("E not_active"),
        }
    }

    /// Every timer due by `now`, earliest first; at the same time an
    /// expiry, then a wait deadline, then a handshake timeout; expiries by
    /// token, deadlines by arrival, handshake timeouts by connection.
    fn advance(&mut self, now: u64) {
        loop {
            let expiry = (0..self.grants.len())
                .filter(|&i| self.grants[i].expires <= now)
                .min_by_key(|&i| (self.grants[i].expires, self.grants[i].token))
                .map(|i| (self.grants[i].expires, 0, i));
            let deadline = (0..self.waiters.len())
                .filter(|&i| self.waiters[i].deadline <= now)
                .min_by_key(|&i| (self.waiters[i].deadline, i))
                .map(|i| (self.waiters[i].deadline, 2, i));
            let hello = (0..self.conns.len())
                .filter(|&c| {
                    let c = &self.conns[c];
                    c.open && !c.ready && c.hello_deadline <= now
                })
                .min_by_key(|&c| (self.conns[c].hello_deadline, c))
                .map(|c| (self.conns[c].hello_deadline, 3, c));
            let grace = self.grace_until.filter(|&g| g <= now).map(|g| (g, 1, 0));
            match [expiry, grace, deadline, hello].into_iter().flatten().min() {
                Some((_, 0, e)) => {
                    let grant = self.grants.remove(e);
                    self.grant_next(&grant.key, grant.expires);
                }
                Some((at, 1, _)) => {
                    self.grace_until = None;
                    let mut free: Vec<String> = Vec::new();
                    for w in &self.waiters {
                        if !free.contains(&w.key) && !self.grants.iter().any(|g| g.key == w.key) {
                            free.push(w.key.clone());
                        }
                    }
                    self.grace_grants += free.len() as u64;
                    for key in free {
                        self.grant_next(&key, at);
                    }
                }
                Some((_, 2, d)) => {
                    let w = self.waiters.remove(d);
                    self.answer(w.conn, &format!("T {} A {}", w.id, w.key));
                }
                Some((_, _, c)) => self.close(c, "E handshake_timeout"),
                None => break,
            }
        }
    }

    /// Grants `key` to request `id` of `conn`, which waited `waited` ms.
    fn grant(&mut self, conn: usize, id: u64, key: &str, lease_ms: u64, at: u64, waited: u64) {
        self.count += 1;
        let token = (self.epoch << 22) | self.count;
        self.promise(key, token, at, lease_ms);
        self.grants.push(MGrant {
            key: key.to_string(),
            token,
            expires: at.saturating_add(lease_ms.saturating_mul(MS)),
        });
        let line = if self.conns[conn].v2 {
            format!("G {id} A {key} {token} {lease_ms} {waited}")
        } else {
            format!("G {id} A {key} {token} {lease_ms}")
        };
        self.answer(conn, &line);
    }

    /// Grants `key`, now free, to its first waiter, if any.
    fn grant_next(&mut self, key: &str, at: u64) {
        if self.grace_until.is_some() {
            return;
        }
        if let Some(i) = self.waiters.iter().position(|w| w.key == key) {
            let w = self.waiters.remove(i);
            let waited = ((at - w.since) / MS).min(w.wait_ms);
            self.grant(w.conn, w.id, &w.key, w.lease_ms, at, waited);
        }
    }

    fn frame(&mut self, conn: usize, frame: Frame, now: u64) {
        if !self.conns[conn].open {
            return;
        }
        if !self.conns[conn].ready {
            match frame {
                Frame::Hello { v2 } => match self.farewell() {
                    Some(farewell) => self.close(conn, farewell),
                    None => {
                        self.conns[conn].ready = true;
                        self.conns[conn].v2 = v2;
                        self.say(conn, &format!("W n1 {}", self.window));
                        if let Some(hint) = self.hint.clone() {
                            self.say(conn, &format!("L {hint}"));
                        }
                    }
                },
                Frame::Bad => self.close(conn, "E bad_frame"),
                _ => self.close(conn, "E hello_required"),
            }
            return;
        }
        match frame {
            Frame::Hello { .. } => self.close(conn, "E duplicate_hello"),
            Frame::Bad => self.close(conn, "E bad_frame"),
            Frame::Renew { .. } if !self.conns[conn].v2 => self.close(conn, "E bad_frame"),
            Frame::Acquire { .. } | Frame::Release { .. } | Frame::Renew { .. }
                if self.conns[conn].unanswered + 1 > self.window =>
            {
                self.close(conn, "E window")
            }
            Frame::Acquire {
                id,
                key,
                wait_ms,
                lease_ms,
            } => {
                self.conns[conn].unanswered += 1;
                let lease_ms = lease_ms.min(self.max_lease_ms);
                let held = self.grants.iter().any(|g| g.key == key);
                let queued = self.waiters.iter().filter(|w| w.key == key).count();
                if !held && queued == 0 && self.grace_until.is_none() {
                    self.grant(conn, id, &key, lease_ms, now, 0);
                } else if wait_ms == 0 {
                    self.answer(conn, &format!("T {id} A {key}"));
                } else if queued >= self.queue_limit || self.waiters.len() >= self.max_waiters {
                    self.answer(conn, &format!("B {id} A {key}"));
                } else {
                    self.waiters.push(MWaiter {
                        conn,
                        id,
                        key,
                        deadline: now.saturating_add(wait_ms.saturating_mul(MS)),
                        lease_ms,
                        since: now,
                        wait_ms,
                    });
                }
            }
            Frame::Release { id, key, token } => {
                self.conns[conn].unanswered += 1;
                match self
                    .grants
                    .iter()
                    .position(|g| g.key == key && g.token == token)
                {
                    Some(i) => {
                        self.grants.remove(i);
                        self.released(&key, token);
                        self.answer(conn, &format!("D {id} R {key}"));
                        self.grant_next(&key, now);
                    }
                    None => self.answer(conn, &format!("N {id} R {key}")),
                }
            }
            Frame::Renew {
                id,
                key,
                token,
                lease_ms,
            } => {
                self.conns[conn].unanswered += 1;
                let lease_ms = lease_ms.min(self.max_lease_ms);
                match self
                    .grants
                    .iter_mut()
                    .find(|g| g.key == key && g.token == token)
                {
                    Some(g) => {
                        let end = now.saturating_add(lease_ms.saturating_mul(MS));
                        g.expires = g.expires.max(end);
                        self.renewed(&key, token, now, lease_ms);
                        self.answer(conn, &format!("G {id} X {key} {token} {lease_ms}"));
                    }
                    None => {
                        let earlier = token & ((1 << 22) - 1) != 0 && token >> 22 < self.epoch;
                        let held = self.grants.iter().position(|g| g.key == key);
                        let reclaims = self.grace_until.is_some()
                            && earlier
                            && held.map_or(true, |i| self.grants[i].token < token);
                        if reclaims {
                            if let Some(i) = held {
                                self.grants.remove(i);
                            }
                            self.grants.push(MGrant {
                                key: key.clone(),
                                token,
                                expires: now.saturating_add(lease_ms.saturating_mul(MS)),
                            });
                            self.renewed(&key, token, now, lease_ms);
                            self.reclaims += 1;
                            self.answer(conn, &format!("G {id} X {key} {token} {lease_ms}"));
                        } else {
                            self.answer(conn, &format!("N {id} X {key}"));
                        }
                    }
                }
            }
        }
    }

    /// Invariant 8 at a grant of `key` with `token` at `at`: no other grant
    /// of the key is live, and every earlier token is smaller.
    fn promise(&mut self, key: &str, token: u64, at: u64, lease_ms: u64) {
        let promises = self.truth.entry(key.to_string()).or_default();
        for p in promises.iter() {
            if !p.released && p.end > at {
                self.breaches
                    .push(format!("{key}: {token} granted while {} is live", p.token));
            }
            if p.token >= token {
                self.breaches
                    .push(format!("{key}: {token} granted after {}", p.token));
            }
        }
        promises.push(Promise {
            token,
            end: at.saturating_add(lease_ms.saturating_mul(MS)),
            released: false,
        });
    }

    /// A renewal of `key`'s `token` answered `G` at `now`: the promise
    /// lasts to `now + lease` at least. A `G` for a token whose promise
    /// had ended is none: an honest client renews only what it holds.
    fn renewed(&mut self, key: &str, token: u64, now: u64, lease_ms: u64) {
        let end = now.saturating_add(lease_ms.saturating_mul(MS));
        let promises = self.truth.entry(key.to_string()).or_default();
        if let Some(p) = promises
            .iter_mut()
            .find(|p| p.token == token && !p.released && p.end > now)
        {
            p.end = p.end.max(end);
        }
    }

    fn released(&mut self, key: &str, token: u64) {
        if let Some(promises) = self.truth.get_mut(key) {
            for p in promises.iter_mut().filter(|p| p.token == token) {
                p.released = true;
            }
        }
    }

    /// A token of an earlier grant of `key` (the `i`-th, wrapping).
    fn historic(&self, key: &str, i: usize) -> Option<u64> {
        let promises = self.truth.get(key)?;
        promises.get(i % promises.len().max(1)).map(|p| p.token)
    }

    /// The token of `key`'s grant, if it is held.
    fn holder(&self, key: &str) -> Option<u64> {
        self.grants.iter().find(|g| g.key == key).map(|g| g.token)
    }

    fn last_token(&self) -> u64 {
        (self.epoch << 22) | self.count
    }

    /// A restart after `stopped_ms`, the clock already moved on to `now`:
    /// every connection is gone without a word; the table goes on (what
    /// was left of each lease and of a grace, in whole ms rounded up, less
    /// the time stopped) or a grace of the longest lease plus the margin
    /// begins. The new epoch is `epoch`.
    fn restart(&mut self, with_table: bool, stopped_ms: u64, now: u64, epoch: u64) {
        let stopped_at = now - stopped_ms * MS;
        for c in &mut self.conns {
            c.open = false;
        }
        self.waiters.clear();
        self.role = MRole::Leader;
        self.epoch = epoch;
        self.count = 0;
        let left = |end: u64| {
            let ms = (end.saturating_sub(stopped_at)).div_ceil(MS);
            ms.checked_sub(stopped_ms).filter(|&ms| ms > 0)
        };
        if with_table {
            self.grace_until = self.grace_until.and_then(left).map(|ms| now + ms * MS);
            self.grants.retain_mut(|g| match left(g.expires) {
                Some(ms) => {
                    g.expires = now + ms * MS;
                    true
                }
                None => false,
            });
        } else {
            self.grants.clear();
            self.grace_until = Some(now + (self.max_lease_ms + self.grace_margin_ms) * MS);
        }
    }

    fn set_role(&mut self, role: MRole) {
        let was_leader = self.role == MRole::Leader;
        self.role = role;
        if was_leader {
            if let Some(farewell) = self.farewell() {
                for conn in 0..self.conns.len() {
                    if self.conns[conn].open {
                        self.close(conn, farewell);
                    }
                }
            }
        }
    }

    fn next_deadline(&self) -> Option<u64> {
        let e = self
            .grants
            .iter()
            .map(|g| g.expires)
            .chain(self.grace_until);
        let d = self.waiters.iter().map(|w| w.deadline);
        let h = self
            .conns
            .iter()
            .filter(|c| c.open && !c.ready)
            .map(|c| c.hello_deadline);
        e.chain(d).chain(h).min()
    }
}

// ----- running both -------------------------------------------------------

/// A client in a slot: its ids in the server and the model, and the bytes
/// it has queued but not yet delivered, with the frames they hold.
struct Client {
    server: ConnId,
    model: usize,
    next_id: u64,
    bytes: VecDeque<u8>,
    /// Frames not yet delivered whole: length in bytes and the frame.
    lines: VecDeque<(usize, Frame)>,
    /// Bytes of the first line already delivered.
    head_done: usize,
}

struct Run {
    config: Config,
    server: Server,
    /// Every connection of the current server, with its model index.
    tracked: Vec<(ConnId, usize)>,
    /// Everything every server said, restarts and all.
    heard: String,
    model: Model,
    now: u64,
    slots: BTreeMap<u64, Client>,
    got: BTreeMap<ConnId, String>,
    closed: BTreeSet<ConnId>,
}

impl Run {
    fn new(s: &Scenario) -> Run {
        let mut config = Config::new(Name::new("n1").unwrap());
        config.window = s.window;
        config.queue_limit = s.queue_limit;
        config.max_waiters = s.max_waiters;
        config.max_lease = Duration::from_millis(s.max_lease_ms);
        config.handshake_timeout = Duration::from_millis(s.handshake_timeout_ms);
        config.hash_key = s.hash_key;
        let hint = s.hint.then(|| "hint:1".to_string());
        config.leader_hint = hint.as_ref().map(|h| Endpoint::new(h).unwrap());
        config.grace_margin = Duration::from_millis(s.grace_margin_ms);
        Run {
            server: Server::new(config.clone(), Time::ZERO).unwrap(),
            config,
            tracked: Vec::new(),
            heard: String::new(),
            model: Model {
                window: s.window,
                queue_limit: s.queue_limit,
                max_waiters: s.max_waiters,
                max_lease_ms: s.max_lease_ms,
                handshake_timeout_ms: s.handshake_timeout_ms,
                role: MRole::Leader,
                hint,
                grace_margin_ms: s.grace_margin_ms,
                epoch: 0,
                count: 0,
                grace_until: None,
                truth: BTreeMap::new(),
                breaches: Vec::new(),
                reclaims: 0,
                grace_grants: 0,
                grants: Vec::new(),
                waiters: Vec::new(),
                conns: Vec::new(),
            },
            now: 0,
            slots: BTreeMap::new(),
            got: BTreeMap::new(),
            closed: BTreeSet::new(),
        }
    }

    fn time(&self) -> Time {
        Time::from_nanos(self.now)
    }

    /// The open client in `slot`, if any (closed ones are forgotten).
    fn open(&mut self, slot: u64) -> Option<&mut Client> {
        let model_conn = self.slots.get(&slot)?.model;
        if !self.model.conns[model_conn].open {
            self.slots.remove(&slot);
            return None;
        }
        self.slots.get_mut(&slot)
    }

    fn queue(&mut self, slot: u64, line: String, frame: Frame, deliver: u8) {
        let Some(client) = self.open(slot) else {
            return;
        };
        client.bytes.extend(line.as_bytes());
        client.bytes.push_back(b'\n');
        client.lines.push_back((line.len() + 1, frame));
        // Mostly everything at once; else a prefix, cutting a frame.
        if deliver < 170 {
            self.deliver(slot, usize::MAX, 255);
        } else {
            let len = self.slots[&slot].bytes.len();
            let n = usize::from(deliver) * 7 % (len + 1);
            self.deliver(slot, n, deliver / 3 + 1);
        }
    }

    /// Hands `n` queued bytes of `slot` to the server in chunks; the model
    /// gets the frames those chunks complete, chunk by chunk.
    fn deliver(&mut self, slot: u64, n: usize, chunk: u8) {
        let Some(client) = self.open(slot) else {
            return;
        };
        let n = n.min(client.bytes.len());
        let data: Vec<u8> = client.bytes.drain(..n).collect();
        let (conn, model_conn) = (client.server, client.model);
        for piece in data.chunks(usize::from(chunk.max(1))) {
            self.server.handle_bytes(self.time(), conn, piece);
            self.model.advance(self.now);
            let mut done = Vec::new();
            let client = self.slots.get_mut(&slot).expect("slot");
            let mut left = piece.len();
            while left > 0 {
                let (len, _) = client.lines.front().expect("bytes belong to lines");
                let rest = len - client.head_done;
                if left >= rest {
                    left -= rest;
                    client.head_done = 0;
                    done.push(client.lines.pop_front().expect("line").1);
                } else {
                    client.head_done += left;
                    left = 0;
                }
            }
            for frame in done {
                self.model.frame(model_conn, frame, self.now);
            }
        }
    }

    /// The next request id of the open client in `slot`.
    fn next_id(&mut self, slot: u64) -> Option<u64> {
        let client = self.open(slot)?;
        let id = client.next_id;
        client.next_id += 1;
        Some(id)
    }

    /// A token to release `KEYS[key]` with: mostly its holder's,
    /// else one near the latest, else any.
    fn pick_token(&self, key: usize, pick: u8) -> u64 {
        let held = self.model.holder(KEYS[key]);
        let last = self.model.last_token();
        match (pick, held) {
            (0..=149, Some(token)) => token,
            (0..=199, _) => last.saturating_sub(u64::from(pick % 3)),
            _ => u64::from(pick),
        }
    }

    /// A token to renew `KEYS[key]` with, as an honest client would: its
    /// holder's, or one the key was granted before (live or not: a stale
    /// renewal is answered `N`, or reclaims a key nobody can still hold),
    /// or one of this epoch. Never an earlier epoch's token that was not
    /// granted: a reclaim believes the token it is shown.
    fn pick_renewal(&self, key: usize, pick: u8) -> u64 {
        let held = self.model.holder(KEYS[key]);
        let historic = self.model.historic(KEYS[key], usize::from(pick));
        match (pick, held, historic) {
            (0..=119, Some(token), _) => token,
            (0..=219, _, Some(token)) => token,
            _ => (self.model.epoch << 22) | u64::from(pick),
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Connect { slot, hello, v2 } => {
                if self.open(slot).is_some() {
                    return;
                }
                let server = self.server.handle_accept(self.time());
                self.model.advance(self.now);
                let model = self.model.conns.len();
                self.model.conns.push(MConn {
                    open: true,
                    hello_deadline: self
                        .now
                        .saturating_add(self.model.handshake_timeout_ms * MS),
                    ..MConn::default()
                });
                self.slots.insert(
                    slot,
                    Client {
                        server,
                        model,
                        next_id: 1,
                        bytes: VecDeque::new(),
                        lines: VecDeque::new(),
                        head_done: 0,
                    },
                );
                if hello {
                    let version = if v2 { 2 } else { 1 };
                    let line = format!("H {version} c{model} -");
                    self.queue(slot, line, Frame::Hello { v2 }, 0);
                }
            }
            Op::Acquire {
                slot,
                key,
                wait_ms,
                lease_ms,
                deliver,
            } => {
                let Some(id) = self.next_id(slot) else {
                    return;
                };
                let key = KEYS[key].to_string();
                let line = format!("A {id} {key} o{slot} {wait_ms} {lease_ms}");
                let frame = Frame::Acquire {
                    id,
                    key,
                    wait_ms,
                    lease_ms,
                };
                self.queue(slot, line, frame, deliver);
            }
            Op::Release {
                slot,
                key,
                pick,
                deliver,
            } => {
                let token = self.pick_token(key, pick);
                let Some(id) = self.next_id(slot) else {
                    return;
                };
                let key = KEYS[key].to_string();
                let line = format!("R {id} {key} {token}");
                self.queue(slot, line, Frame::Release { id, key, token }, deliver);
            }
            Op::Renew {
                slot,
                key,
                pick,
                lease_ms,
                deliver,
            } => {
                let token = self.pick_renewal(key, pick);
                let Some(id) = self.next_id(slot) else {
                    return;
                };
                let key = KEYS[key].to_string();
                let line = format!("X {id} {key} {token} {lease_ms}");
                let frame = Frame::Renew {
                    id,
                    key,
                    token,
                    lease_ms,
                };
                self.queue(slot, line, frame, deliver);
            }
            Op::Junk {
                slot,
                kind,
                deliver,
            } => {
                let (line, frame) = match kind % 6 {
                    0 => ("A 01 k0 o 0 5", Frame::Bad),
                    1 => ("Z", Frame::Bad),
                    2 => ("", Frame::Bad),
                    3 => ("R 1 k0", Frame::Bad),
                    4 => ("A 1 k0 o 0 0", Frame::Bad),
                    _ => ("H 1 again -", Frame::Hello { v2: false }),
                };
                self.queue(slot, line.to_string(), frame, deliver);
            }
            Op::Deliver { slot, chunk } => self.deliver(slot, usize::MAX, chunk),
            Op::Drop { slot } => {
                let Some(client) = self.open(slot) else {
                    return;
                };
                let (conn, model_conn) = (client.server, client.model);
                self.slots.remove(&slot);
                self.server.handle_closed(self.time(), conn);
                self.model.advance(self.now);
                self.model.conns[model_conn].open = false;
                self.model.waiters.retain(|w| w.conn != model_conn);
            }
            Op::Wait { ns } => {
                self.now += ns;
                self.server.handle_timeout(self.time());
                self.model.advance(self.now);
            }
            Op::ToDeadline => {
                if let Some(at) = self.server.poll_timeout() {
                    let at = at.as_nanos();
                    if at > self.now && at - self.now <= 2_000 * MS {
                        self.now = at;
                        self.server.handle_timeout(self.time());
                        self.model.advance(self.now);
                    }
                }
            }
            Op::Role { which } => {
                let (role, mrole) = match which {
                    1 => (
                        Role::Follower {
                            leader: Endpoint::new("n2:7878").unwrap(),
                        },
                        MRole::Follower,
                    ),
                    2 => (Role::NoLeader, MRole::NoLeader),
                    3 => (Role::NotActive, MRole::NotActive),
                    _ => (Role::Leader, MRole::Leader),
                };
                self.server.set_role(self.time(), role);
                self.model.advance(self.now);
                self.model.set_role(mrole);
            }
            Op::Restart {
                with_table,
                stopped_ms,
            } => self.restart(with_table, stopped_ms),
            Op::Announce => {
                let addr = "n3:7878";
                self.server
                    .announce_leader(self.time(), Endpoint::new(addr).unwrap());
                self.model.advance(self.now);
                for conn in 0..self.model.conns.len() {
                    if self.model.conns[conn].open {
                        self.model.say(conn, &format!("L {addr}"));
                    }
                }
                self.model.hint = Some(addr.to_string());
            }
        }
    }

    /// The server stops at `now` and a new one begins a term, with or
    /// without the table written out, `stopped_ms` later. Its connections
    /// are gone; so are their ids, which the new server hands out again.
    /// The clients that had done their handshake connect again at once, as
    /// clients do, to renew (and reclaim) what they hold.
    fn restart(&mut self, with_table: bool, stopped_ms: u64) {
        self.model.advance(self.now);
        let again: Vec<(u64, bool)> = self
            .slots
            .iter()
            .map(|(&slot, c)| (slot, &self.model.conns[c.model]))
            .filter(|(_, m)| m.open && m.ready)
            .map(|(slot, m)| (slot, m.v2))
            .collect();
        let image = self.server.table_image(self.time(), Duration::ZERO);
        let image = TableImage::decode(&image.encode()).expect("reads back");
        self.now += stopped_ms * MS;
        let epoch = self.model.epoch + 1 + stopped_ms % 3;
        let term = if with_table {
            Term::Resumed {
                epoch,
                image,
                stopped: Duration::from_millis(stopped_ms),
            }
        } else {
            Term::Recovered {
                epoch,
                max_lease: self.config.max_lease,
            }
        };
        self.server = Server::new(self.config.clone(), self.time()).unwrap();
        self.server.begin_term(self.time(), term).unwrap();
        self.model.restart(with_table, stopped_ms, self.now, epoch);
        self.model.hint = self.config.leader_hint.as_ref().map(|h| h.to_string());
        self.slots.clear();
        self.tracked.clear();
        self.got.clear();
        self.closed.clear();
        for (slot, v2) in again {
            self.step(&Op::Connect {
                slot,
                hello: true,
                v2,
            });
        }
    }

    fn drain(&mut self) -> Result<(), String> {
        while let Some(action) = self.server.poll_action() {
            match action {
                Action::Send { conn, data } => {
                    if self.closed.contains(&conn) {
                        return Err(format!("{conn} got bytes after its close"));
                    }
                    let text = String::from_utf8(data.to_vec()).map_err(|e| e.to_string())?;
                    self.heard.push_str(&text);
                    self.got.entry(conn).or_default().push_str(&text);
                }
                Action::Close { conn } => {
                    if !self.closed.insert(conn) {
                        return Err(format!("{conn} closed twice"));
                    }
                }
                other => return Err(format!("unexpected action {other:?}")),
            }
        }
        Ok(())
    }

    /// Everything observable must agree, and invariant 8 hold.
    fn compare(&self) -> Result<(), String> {
        if let Some(breach) = self.model.breaches.first() {
            return Err(format!("invariant 8: {breach}"));
        }
        for &(conn, m) in &self.tracked {
            let model = &self.model.conns[m];
            let got = self.got.get(&conn).map_or("", String::as_str);
            if got != model.out {
                return Err(format!("{conn} got\n{got}\nthe model says\n{}", model.out));
            }
            if self.closed.contains(&conn) != model.closed_by_server {
                return Err(format!(
                    "{conn}: closed by the server {}, by the model {}",
                    self.closed.contains(&conn),
                    model.closed_by_server
                ));
            }
            let unanswered = (model.open && model.ready).then_some(model.unanswered);
            if self.server.unanswered(conn) != unanswered {
                return Err(format!(
                    "{conn}: {:?} unanswered, the model says {unanswered:?}",
                    self.server.unanswered(conn)
                ));
            }
            if self.server.is_open(conn) != model.open {
                return Err(format!("{conn}: open is {}", self.server.is_open(conn)));
            }
        }
        for key in KEYS {
            let got = self
                .server
                .holder(key)
                .map(|h| (h.token, h.expires_at.as_nanos()));
            let want = self
                .model
                .grants
                .iter()
                .find(|g| g.key == key)
                .map(|g| (g.token, g.expires));
            if got != want {
                return Err(format!("holder of {key}: {got:?}, the model says {want:?}"));
            }
            let want = self.model.waiters.iter().filter(|w| w.key == key).count();
            if self.server.queue_len(key) != want {
                return Err(format!(
                    "queue of {key}: {}, the model says {want}",
                    self.server.queue_len(key)
                ));
            }
        }
        if self.server.lock_table().waiters() != self.model.waiters.len() {
            return Err("total waiters differ".into());
        }
        if self.server.lock_table().last_token() != self.model.last_token() {
            return Err("token counters differ".into());
        }
        let want = self.model.next_deadline();
        let got = self.server.poll_timeout().map(Time::as_nanos);
        if got != want {
            return Err(format!("poll_timeout {got:?}, the model says {want:?}"));
        }
        Ok(())
    }
}

fn check(s: Scenario) -> TestResult {
    let mut run = Run::new(&s);
    for (i, op) in s.ops.iter().enumerate() {
        run.step(op);
        let seen: Vec<(ConnId, usize)> = run.slots.values().map(|c| (c.server, c.model)).collect();
        for pair in seen {
            if !run.tracked.contains(&pair) {
                run.tracked.push(pair);
            }
        }
        if let Err(e) = run.drain().and_then(|()| run.compare()) {
            return TestResult::error(format!("after step {i} ({op:?}): {e}"));
        }
    }
    TestResult::passed()
}

#[test]
fn server_agrees_with_the_model() {
    let seed = match std::env::var("TICKETING_QC_SEED") {
        Ok(s) => s.parse().expect("TICKETING_QC_SEED must be a u64"),
        Err(_) => DEFAULT_SEED,
    };
    let cases = match std::env::var("TICKETING_QC_CASES") {
        Ok(s) => s.parse().expect("TICKETING_QC_CASES must be a number"),
        Err(_) => 1000,
    };
    eprintln!("server_model: seed {seed}, {cases} cases (TICKETING_QC_SEED overrides the seed)");
    QuickCheck::new()
        .rng(Gen::from_size_and_seed(400, seed))
        .tests(cases)
        .max_tests(cases)
        .quickcheck(check as fn(Scenario) -> TestResult);
}

/// The model itself must see the rules happen, or agreeing proves little:
/// a fixed seed's traffic must produce every kind of answer and close.
#[test]
fn the_traffic_reaches_every_rule() {
    let mut g = Gen::from_size_and_seed(400, DEFAULT_SEED);
    let mut seen = String::new();
    let (mut reclaims, mut grace_grants) = (0, 0);
    for _ in 0..50 {
        let s = Scenario::arbitrary(&mut g);
        let mut run = Run::new(&s);
        for op in &s.ops {
            run.step(op);
            run.drain().unwrap();
        }
        seen.push_str(&run.heard);
        reclaims += run.model.reclaims;
        grace_grants += run.model.grace_grants;
    }
    for needle in [
        "\nG ",
        " X ",
        "\nN ",
        "\nT ",
        "\nB ",
        "\nD ",
        "\nN ",
        "W n1",
        "\nL ",
        "M n2:7878",
        "E no_leader",
        "E not_active",
        "E window",
        "E bad_frame",
        "E hello_required",
        "E duplicate_hello",
        "E handshake_timeout",
    ] {
        assert!(seen.contains(needle), "no {needle:?} in the traffic");
    }
    // Version 2 grants that waited, and version 1 grants after a wait.
    let grants: Vec<Vec<&str>> = seen
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f[0] == "G" && f[2] == "A")
        .collect();
    assert!(grants.iter().any(|f| f.len() == 7 && f[6] != "0"));
    assert!(grants.iter().any(|f| f.len() == 6));
    assert!(
        reclaims > 0 && grace_grants > 0,
        "{reclaims} {grace_grants}"
    );
}
