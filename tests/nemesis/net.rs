//! The network the nemesis breaks: a fault proxy in front of every port
//! a member listens on, so that every byte between members, and between
//! clients and members, passes through it.
//!
//! On loopback every connection comes from 127.0.0.1, so a proxy knows
//! who dials by what it is in front of: the clients dial a member's
//! client port through that member's client proxy; members dial each
//! other's peer ports, and the proxy reads the dialer's id from the peer
//! hello (`TKRP`, its version, then the sender's id); a node dials etcd
//! through a proxy of its own.
//!
//! What it does to the bytes going from one party to another:
//!
//! - **cut**: held, neither delivered nor dropped, until healed, as TCP
//!   holds them through a partition (a connection opened meanwhile is
//!   accepted and holds its bytes too). A cut one way holds only that
//!   direction: A's messages to B wait, B's to A pass.
//! - **slow**: each chunk waits that long before it goes on.
//! - **reset**: every connection between the two ends now, both ways.
//!
//! Dropping bytes out of a stream would break its framing, which no
//! network does; loss shows as the cut (delay without end) or a reset.

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// One side of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Party {
    /// A member, by its id.
    Member(u64),
    /// Every client of the test.
    Clients,
    /// The etcd a cluster is led through.
    Etcd,
}

impl std::fmt::Display for Party {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Party::Member(id) => write!(f, "n{id}"),
            Party::Clients => f.write_str("clients"),
            Party::Etcd => f.write_str("etcd"),
        }
    }
}

/// Who dials a proxy.
#[derive(Debug, Clone, Copy)]
pub enum Dialer {
    /// Always this party.
    Known(Party),
    /// A member, named by its peer hello.
    PeerHello,
}

/// The magic and version a peer hello starts with, after its length.
const HELLO_MAGIC: &[u8; 4] = b"TKRP";
/// Length, magic, version, sender's id.
const HELLO_PREFIX: usize = 4 + 4 + 2 + 8;

#[derive(Default)]
struct Rules {
    /// Directions whose bytes are held.
    cut: HashSet<(Party, Party)>,
    /// Directions whose chunks are delayed.
    slow: HashMap<(Party, Party), Duration>,
}

/// A connection through a proxy, to end it on a reset.
struct Conn {
    ends: (Party, Party),
    dialer: TcpStream,
    upstream: TcpStream,
}

struct Inner {
    rules: Mutex<Rules>,
    /// Rules changed (a heal wakes what was held).
    changed: Condvar,
    conns: Mutex<HashMap<u64, Conn>>,
    next_conn: AtomicU64,
    stopped: AtomicBool,
    /// Bytes carried, for the report.
    carried: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The fault network of one run. Dropping it stops every proxy.
pub struct Net {
    inner: Arc<Inner>,
}

impl Default for Net {
    fn default() -> Self {
        Net::new()
    }
}

impl Net {
    pub fn new() -> Net {
        Net {
            inner: Arc::new(Inner {
                rules: Mutex::new(Rules::default()),
                changed: Condvar::new(),
                conns: Mutex::new(HashMap::new()),
                next_conn: AtomicU64::new(1),
                stopped: AtomicBool::new(false),
                carried: AtomicU64::new(0),
            }),
        }
    }

    /// A proxy on `bind` (a loopback address, port 0 for any) in front of
    /// `upstream`, for connections to `to` from `dialer`: its address.
    pub fn proxy(&self, bind: &str, to: Party, dialer: Dialer, upstream: SocketAddr) -> SocketAddr {
        let listener = TcpListener::bind(bind).expect("bind a proxy");
        listener
            .set_nonblocking(true)
            .expect("a nonblocking listener");
        let addr = listener.local_addr().expect("the proxy's address");
        let inner = Arc::clone(&self.inner);
        thread::Builder::new()
            .name(format!("proxy {to}"))
            .spawn(move || accept_loop(&inner, &listener, to, dialer, upstream))
            .expect("a proxy thread");
        addr
    }

    /// Holds every byte from `from` to `to` until healed.
    pub fn cut(&self, from: Party, to: Party) {
        lock(&self.inner.rules).cut.insert((from, to));
    }

    /// Holds every byte between `a` and `b`, both ways.
    pub fn cut_both(&self, a: Party, b: Party) {
        self.cut(a, b);
        self.cut(b, a);
    }

    /// Delays every chunk from `from` to `to` by `delay`.
    pub fn slow(&self, from: Party, to: Party, delay: Duration) {
        lock(&self.inner.rules).slow.insert((from, to), delay);
    }

    /// Ends every connection between `a` and `b` now.
    pub fn reset(&self, a: Party, b: Party) {
        let conns = lock(&self.inner.conns);
        for conn in conns.values() {
            if conn.ends == (a, b) || conn.ends == (b, a) {
                let _ = conn.dialer.shutdown(Shutdown::Both);
                let _ = conn.upstream.shutdown(Shutdown::Both);
            }
        }
    }

    /// Every cut and slow link healed: held bytes go on.
    pub fn heal(&self) {
        let mut rules = lock(&self.inner.rules);
        rules.cut.clear();
        rules.slow.clear();
        drop(rules);
        self.inner.changed.notify_all();
    }

    /// Bytes carried so far, both ways.
    pub fn carried(&self) -> u64 {
        self.inner.carried.load(Ordering::Relaxed)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.inner.stopped.store(true, Ordering::Relaxed);
        self.heal();
        for conn in lock(&self.inner.conns).values() {
            let _ = conn.dialer.shutdown(Shutdown::Both);
            let _ = conn.upstream.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(
    inner: &Arc<Inner>,
    listener: &TcpListener,
    to: Party,
    dialer: Dialer,
    upstream: SocketAddr,
) {
    while !inner.stopped.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let inner = Arc::clone(inner);
                thread::spawn(move || open(&inner, stream, to, dialer, upstream));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Reads the peer hello's first bytes from `stream`: the sender's id, and
/// the bytes read (to be passed on). `None`: not a hello.
fn read_hello(stream: &mut TcpStream) -> Option<(u64, Vec<u8>)> {
    let mut head = [0u8; HELLO_PREFIX];
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.read_exact(&mut head).ok()?;
    stream.set_read_timeout(None).ok()?;
    if &head[4..8] != HELLO_MAGIC {
        return None;
    }
    let from = u64::from_be_bytes(head[10..18].try_into().ok()?);
    Some((from, head.to_vec()))
}

fn open(
    inner: &Arc<Inner>,
    mut dialer_stream: TcpStream,
    to: Party,
    dialer: Dialer,
    upstream: SocketAddr,
) {
    let _ = dialer_stream.set_nonblocking(false);
    let _ = dialer_stream.set_nodelay(true);
    let (from, first) = match dialer {
        Dialer::Known(party) => (party, Vec::new()),
        Dialer::PeerHello => match read_hello(&mut dialer_stream) {
            Some((id, bytes)) => (Party::Member(id), bytes),
            None => return,
        },
    };
    let Ok(upstream_stream) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = upstream_stream.set_nodelay(true);
    let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
    let (Ok(d2), Ok(u2)) = (dialer_stream.try_clone(), upstream_stream.try_clone()) else {
        return;
    };
    lock(&inner.conns).insert(
        id,
        Conn {
            ends: (from, to),
            dialer: d2,
            upstream: u2,
        },
    );
    let (Ok(d_read), Ok(u_read)) = (dialer_stream.try_clone(), upstream_stream.try_clone()) else {
        return;
    };
    let forward = {
        let inner = Arc::clone(inner);
        thread::spawn(move || pump(&inner, d_read, upstream_stream, (from, to), first))
    };
    let back = {
        let inner = Arc::clone(inner);
        thread::spawn(move || pump(&inner, u_read, dialer_stream, (to, from), Vec::new()))
    };
    let _ = forward.join();
    let _ = back.join();
    lock(&inner.conns).remove(&id);
}

/// Carries bytes from `src` to `dst` in direction `dir` under the rules;
/// `first`: bytes already read from `src`.
fn pump(
    inner: &Arc<Inner>,
    mut src: TcpStream,
    mut dst: TcpStream,
    dir: (Party, Party),
    first: Vec<u8>,
) {
    let (tx, rx): (SyncSender<(Instant, Vec<u8>)>, Receiver<_>) = sync_channel(64);
    if !first.is_empty() && tx.send((Instant::now(), first)).is_err() {
        return;
    }
    let writer = {
        let inner = Arc::clone(inner);
        let mut dst_w = match dst.try_clone() {
            Ok(d) => d,
            Err(_) => return,
        };
        thread::spawn(move || {
            for (read_at, chunk) in rx {
                if !wait_open(&inner, dir, read_at) {
                    break;
                }
                if dst_w.write_all(&chunk).is_err() {
                    break;
                }
                inner
                    .carried
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            // The source ended (or the write failed): so does this way.
            let _ = dst_w.shutdown(Shutdown::Write);
        })
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match src.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
    let _ = src.shutdown(Shutdown::Read);
    let _ = dst.flush();
}

/// Waits while `dir` is cut, then until `read_at` plus its delay; `false`
/// once the network is stopped.
fn wait_open(inner: &Inner, dir: (Party, Party), read_at: Instant) -> bool {
    let mut rules = lock(&inner.rules);
    loop {
        if inner.stopped.load(Ordering::Relaxed) {
            return false;
        }
        if !rules.cut.contains(&dir) {
            break;
        }
        rules = inner
            .changed
            .wait_timeout(rules, Duration::from_millis(20))
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    let delay = rules.slow.get(&dir).copied();
    drop(rules);
    if let Some(delay) = delay {
        let due = read_at + delay;
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
    }
    true
}
