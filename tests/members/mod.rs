//! The replicated cluster as real processes: three members of
//! `ticketing serve --raft-id` on loopback, their state directories under
//! a temporary directory, and what the tests of `raft_*.rs` say to them.
#![allow(dead_code)]

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use raft::eraftpb::{Message, MessageType};

use crate::cli::{free_addr, End, Raw, Serve, WAIT};

/// The election timeout of every member (`--election-timeout-ms`): Raft
/// draws each wait between it and twice it.
pub const TIMEOUT_MS: u64 = 400;

/// One test at a time: the failover figures are timed.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn unix_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_millis()).expect("ms fit in u64")
}

/// `leading (term T, from entry I; unix ms MS)`: (T, MS).
pub fn parse_leading(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("leading (term ")?;
    let (term, rest) = rest.split_once(", from entry ")?;
    let (_, ms) = rest.split_once("; unix ms ")?;
    Some((term.parse().ok()?, ms.strip_suffix(')')?.parse().ok()?))
}

/// One member: its addresses, its state directory, its process if it runs.
pub struct Member {
    pub id: u64,
    /// Where clients reach it.
    pub addr: String,
    /// Where its peers reach it.
    pub raft: String,
    pub dir: PathBuf,
    pub serve: Option<Serve>,
    /// In the configuration (or about to join it): what the others'
    /// `--raft-peer` lists name. Reserved members and removed ones are not.
    pub live: bool,
}

/// Three members on free loopback ports, their state directories under a
/// temporary directory that goes when the cluster is dropped (after every
/// process it started is killed).
pub struct Cluster {
    pub root: PathBuf,
    pub members: Vec<Member>,
    /// Given to every start after the cluster's own options.
    pub extra: Vec<String>,
    /// Given to the starts of member `i` only, after `extra`.
    pub own: Vec<Vec<String>>,
}

impl Cluster {
    pub fn new(name: &str, extra: &[&str]) -> Cluster {
        let root =
            std::env::temp_dir().join(format!("ticketing-raft-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("the cluster's directory");
        let members = (1..=3)
            .map(|id| Member {
                id,
                addr: free_addr(),
                raft: free_addr(),
                dir: root.join(format!("n{id}")),
                serve: None,
                live: true,
            })
            .collect();
        Cluster {
            root,
            members,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            own: vec![Vec::new(); 3],
        }
    }

    /// The arguments of `ticketing serve` for member `i` on `dir`.
    pub fn args(&self, i: usize, new_cluster: bool, dir: &Path) -> Vec<String> {
        let m = &self.members[i];
        let mut args = vec![
            "--raft-id".to_string(),
            m.id.to_string(),
            "--raft-listen".to_string(),
            m.raft.clone(),
            "--state-dir".to_string(),
            dir.to_string_lossy().into_owned(),
            "--election-timeout-ms".to_string(),
            TIMEOUT_MS.to_string(),
        ];
        for p in self.members.iter().filter(|p| p.live || p.id == m.id) {
            args.push("--raft-peer".to_string());
            args.push(format!("{}={}/{}", p.id, p.addr, p.raft));
        }
        if new_cluster {
            args.push("--raft-new-cluster".to_string());
        }
        // Peers authenticate always: by the cluster's credential or mutual
        // TLS if it has either, else insecurely, as loopback allows.
        if !self
            .extra
            .iter()
            .any(|a| a == "--raft-credential" || a == "--tls-client-ca")
        {
            args.push("--raft-insecure".to_string());
        }
        args.extend(self.extra.iter().cloned());
        args.extend(self.own[i].iter().cloned());
        args
    }

    /// Starts member `i` on its state directory; waits for `listening on`.
    pub fn start(&mut self, i: usize, new_cluster: bool) {
        assert!(self.members[i].serve.is_none(), "member {i} runs already");
        let args = self.args(i, new_cluster, &self.members[i].dir);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let serve = Serve::start_on(&self.members[i].addr, &args, |_| {});
        self.members[i].serve = Some(serve);
    }

    pub fn start_all(&mut self, new_cluster: bool) {
        for i in 0..self.members.len() {
            if self.members[i].live {
                self.start(i, new_cluster);
            }
        }
    }

    /// Makes room for `n` more members, not started and in no
    /// configuration: their addresses are known from now on.
    ///
    /// Each on a loopback address of its own (127.0.<id>.1), where nothing
    /// else binds: a port free now on 127.0.0.1 may be taken by an
    /// outgoing connection before the member starts.
    pub fn reserve(&mut self, n: usize) {
        for _ in 0..n {
            let id = self.members.len() as u64 + 1;
            let own = |_| {
                let listener = std::net::TcpListener::bind(format!("127.0.{id}.1:0"))
                    .expect("bind a free port on a loopback address of its own");
                listener.local_addr().expect("local addr").to_string()
            };
            self.members.push(Member {
                id,
                addr: own(0),
                raft: own(1),
                dir: self.root.join(format!("n{id}")),
                serve: None,
                live: false,
            });
            self.own.push(Vec::new());
        }
    }

    /// Starts reserved member `i` with `--raft-join` on its empty
    /// directory, naming the live members and itself.
    pub fn join(&mut self, i: usize) {
        self.members[i].live = true;
        let mut args = self.args(i, false, &self.members[i].dir);
        args.push("--raft-join".to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let serve = Serve::start_on(&self.members[i].addr, &args, |_| {});
        self.members[i].serve = Some(serve);
    }

    /// Member `i`, removed from the configuration, stops by itself (exit
    /// 0); it is no longer named to the others.
    pub fn removed(&mut self, i: usize) {
        self.members[i].live = false;
        let mut serve = self.members[i].serve.take().expect("a running member");
        let status = serve.wait_exit(WAIT);
        assert!(status.success(), "member {i} removed ended with {status}");
    }

    /// The client addresses of the live members.
    pub fn live_addrs(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.live)
            .map(|m| m.addr.clone())
            .collect()
    }

    pub fn serve(&mut self, i: usize) -> &mut Serve {
        self.members[i]
            .serve
            .as_mut()
            .unwrap_or_else(|| panic!("member {i} does not run"))
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self, i: usize) {
        let mut serve = self.members[i].serve.take().expect("a running member");
        serve.signal(Signal::SIGKILL);
        serve.kill();
    }

    /// SIGTERM; it must exit 0.
    pub fn stop(&mut self, i: usize) {
        self.serve(i).signal(Signal::SIGTERM);
        self.stop_signalled(i);
    }

    /// Waits for member `i`, already sent SIGTERM, to exit 0.
    pub fn stop_signalled(&mut self, i: usize) {
        let mut serve = self.members[i].serve.take().expect("a running member");
        let status = serve.wait_exit(WAIT);
        assert!(status.success(), "member {i} stopped with {status}");
    }

    /// Member `i` as `ticketing cluster add` and `--raft-peer` name it:
    /// `ID=CLIENT_ADDR/RAFT_ADDR`.
    pub fn spec(&self, i: usize) -> String {
        let m = &self.members[i];
        format!("{}={}/{}", m.id, m.addr, m.raft)
    }

    pub fn addr(&self, i: usize) -> String {
        self.members[i].addr.clone()
    }

    pub fn addrs(&self) -> Vec<String> {
        self.members.iter().map(|m| m.addr.clone()).collect()
    }

    /// The first line a version 2 handshake gets from member `i`.
    pub fn hello(&self, i: usize) -> String {
        let mut raw = Raw::connect(&self.members[i].addr);
        raw.send("H 2 probe -\n");
        raw.line("the answer to H")
    }

    /// The running member (not `except`) that accepts a handshake,
    /// waiting for one.
    pub fn leader(&self, except: Option<usize>) -> usize {
        let deadline = Instant::now() + WAIT;
        loop {
            for i in 0..self.members.len() {
                if Some(i) != except
                    && self.members[i].serve.is_some()
                    && self.hello(i).starts_with("W ")
                {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no member led within {WAIT:?}");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every running member answers `H`, exactly one with `W`
    /// and every other with `M <its client address>`; returns its index.
    pub fn settled(&self) -> usize {
        let deadline = Instant::now() + WAIT;
        loop {
            let answers: Vec<(usize, String)> = (0..self.members.len())
                .filter(|&i| self.members[i].serve.is_some())
                .filter(|&i| self.members[i].live)
                .map(|i| (i, self.hello(i)))
                .collect();
            let leaders: Vec<usize> = answers
                .iter()
                .filter(|(_, a)| a.starts_with("W "))
                .map(|&(i, _)| i)
                .collect();
            if let [lead] = leaders[..] {
                let want = format!("M {}", self.members[lead].addr);
                if answers.iter().all(|(i, a)| *i == lead || *a == want) {
                    return lead;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no single leader named by the others within {WAIT:?}; last answers: {answers:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The first `leading` line of member `i` printed at or after
    /// `unix_ms`: (term, unix ms).
    pub fn leading_since(&mut self, i: usize, unix_ms: u64) -> (u64, u64) {
        let line = self.serve(i).stderr.until(
            &format!("a `leading` line at or after unix ms {unix_ms}"),
            |l| parse_leading(l).is_some_and(|(_, at)| at >= unix_ms),
        );
        parse_leading(&line).expect("a leading line")
    }

    /// A version 2 connection to the leader, once the others name it:
    /// (its index, the connection). A leader can change between the
    /// probe and the connection: then again.
    pub fn connect_leader(&self) -> (usize, Raw) {
        self.connect_leader_but(None)
    }

    /// The same, `except` left out (and not asked: it may be stopped),
    /// without waiting for the others to name the leader.
    pub fn connect_leader_but(&self, except: Option<usize>) -> (usize, Raw) {
        let deadline = Instant::now() + WAIT;
        loop {
            let lead = match except {
                None => self.settled(),
                Some(_) => self.leader(except),
            };
            let mut raw = Raw::connect(&self.members[lead].addr);
            raw.send("H 2 test -\n");
            match raw.next("the answer to H") {
                End::Line(w) if w.starts_with("W ") => return (lead, raw),
                other => assert!(
                    Instant::now() < deadline,
                    "the leader's handshake: {other:?}"
                ),
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            drop(m.serve.take());
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

pub fn median(sorted: &[Duration]) -> Duration {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2
    }
}

/// Until a grant: every 50 ms, on each of `addrs`, a fresh connection that
/// says `H` and, if it gets `W`, asks for `key` (never held) without
/// waiting. Returns the time since `since` and the token.
pub fn first_grant(addrs: &[String], key: &str, since: Instant) -> (Duration, u64) {
    let deadline = since + WAIT;
    loop {
        for addr in addrs {
            let mut raw = Raw::connect(addr);
            raw.send("H 2 probe -\n");
            match raw.next("the answer to H") {
                End::Line(w) if w.starts_with("W ") => {}
                End::Line(_) | End::Closed => continue,
            }
            raw.send(&format!("A 1 {key} probe 0 1000\n"));
            match raw.next("the answer to A") {
                End::Line(g) if g.starts_with(&format!("G 1 A {key} ")) => {
                    let token = g.split(' ').nth(4).and_then(|t| t.parse().ok());
                    return (since.elapsed(), token.expect("a token"));
                }
                // The leader stepped down under it: try again.
                End::Line(e) if e.starts_with("M ") || e == "E no_leader" => {}
                End::Closed => {}
                End::Line(other) => panic!("{key}, never held, answered {other:?}"),
            }
        }
        assert!(
            Instant::now() < deadline,
            "no grant of {key} within {WAIT:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// A peer hello (src/host/raft/hello.rs): a frame of 4 bytes of length, then `TKRP`,
/// version 2, from and to (8 bytes each), the cluster's identity (16 bytes:
/// 0, not known yet, which every member takes), the credential's length
/// (2) and its bytes; all big-endian.
pub fn peer_hello(from: u64, to: u64, credential: &[u8]) -> Vec<u8> {
    let mut body = b"TKRP".to_vec();
    body.extend_from_slice(&2u16.to_be_bytes());
    body.extend_from_slice(&from.to_be_bytes());
    body.extend_from_slice(&to.to_be_bytes());
    body.extend_from_slice(&0u128.to_be_bytes());
    body.extend_from_slice(&u16::try_from(credential.len()).unwrap().to_be_bytes());
    body.extend_from_slice(credential);
    frame(&body)
}

pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// A heartbeat of a leader `from` in a term far above any: a member that
/// took it would follow `from` in that term (a leader would step down).
pub fn forged_heartbeat(from: u64, to: u64) -> Vec<u8> {
    let m = Message {
        msg_type: MessageType::MsgHeartbeat as i32,
        from,
        to,
        term: 1_000,
        ..Message::default()
    };
    frame(&prost::Message::encode_to_vec(&m))
}

/// Connects to a peer listener, sends `bytes`, and returns what comes back
/// until the connection ends (at most 8 s: an unauthenticated link lasts
/// at most 1 s) and whether it ended.
pub fn peer_exchange(raft_addr: &str, bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(raft_addr).unwrap_or_else(|e| panic!("{raft_addr}: {e}"));
    let _ = s.write_all(bytes);
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (got, false);
        }
        s.set_read_timeout(Some(left.min(Duration::from_millis(500))))
            .expect("timeout");
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                // An answered hello: the link is up; no need to wait more.
                if got.len() >= 4 + 4 + 2 + 8 + 8 + 16 + 2 {
                    return (got, false);
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return (got, true),
        }
    }
}
