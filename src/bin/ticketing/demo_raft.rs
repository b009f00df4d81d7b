//! `ticketing demo`'s second act: a replicated cluster (PROTOCOL.md 4.3)
//! whose leader stops dead. Three members on loopback, their Raft state in
//! a temporary directory; a holder renews one key, then the leader's task
//! ends with nothing handed over. What it shows: a new leader within an
//! election, no recovery grace (a key nobody held is granted at once), and
//! the holder keeps its grant with the same token.

use std::collections::BTreeMap;
use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ticketing::client::Config;
use ticketing::raft::{
    spawn_member, Member, MemberHandle, MemberNotice, PeerAuth, PeerConfig, Peers, RaftDisk,
    Replica, ReplicaConfig, ReplicaEvent,
};
use ticketing::server::{self, Server};
use ticketing::tokio::{spawn, LeaseStatus, TcpConnector};
use ticketing::{Endpoint, Key, Name, Time};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const ELECTION_TIMEOUT: Duration = Duration::from_millis(300);
const LEASE: Duration = Duration::from_millis(2_000);

/// The cluster: each member's client address, raft address, state
/// directory, and its running task (if it runs).
struct Cluster {
    clients: BTreeMap<u64, Endpoint>,
    rafts: BTreeMap<u64, SocketAddr>,
    dirs: BTreeMap<u64, PathBuf>,
    running: BTreeMap<u64, MemberHandle>,
    news: mpsc::UnboundedSender<(u64, ReplicaEvent, Instant)>,
    /// The peer credential, drawn for this run: members authenticate
    /// each other always.
    credential: String,
}

impl Cluster {
    /// Starts member `id` (on the very first start, as a new cluster).
    async fn start(&mut self, id: u64, new: bool) -> Result<(), Box<dyn Error>> {
        let voters: Vec<u64> = self.clients.keys().copied().collect();
        let start = if new {
            ticketing::raft::Start::NewCluster
        } else {
            ticketing::raft::Start::Existing
        };
        let (disk, restored) = RaftDisk::open(&self.dirs[&id], start, id, &voters)?;
        let wall_ms = u64::try_from(ticketing::state::unix_now().as_millis()).unwrap_or(0);
        let mut config = ReplicaConfig::new(id, self.clients.clone(), ELECTION_TIMEOUT, wall_ms);
        config.draw = crate::common::secret();
        let server = Server::new(
            server::Config::new(Name::new(format!("member-{id}"))?),
            Time::ZERO,
        )?;
        let replica = Replica::new(config, server, restored, Time::ZERO)?;
        let raft_listener = Peers::listener(self.rafts[&id])?;
        let auth = PeerAuth::Credential(self.credential.clone());
        let (peers, inbound) =
            Peers::start(PeerConfig::new(id, self.rafts.clone(), auth), raft_listener)?;
        let listener = TcpListener::bind(self.clients[&id].as_str()).await?;
        let news = self.news.clone();
        let member = Member {
            replica,
            disk,
            peers,
            inbound,
        };
        let handle = spawn_member(listener, member, Instant::now(), move |notice| {
            if let MemberNotice::Replica(e) = notice {
                let _ = news.send((id, e, Instant::now()));
            }
        })?;
        self.running.insert(id, handle);
        Ok(())
    }
}

/// Waits for a member other than `not` to lead; which one, and when.
async fn leader(
    news: &mut mpsc::UnboundedReceiver<(u64, ReplicaEvent, Instant)>,
    not: Option<u64>,
) -> Result<(u64, Instant), Box<dyn Error>> {
    let wait = async {
        while let Some((id, event, at)) = news.recv().await {
            if matches!(event, ReplicaEvent::Leading { .. }) && Some(id) != not {
                return Some((id, at));
            }
        }
        None
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .ok()
        .flatten()
        .ok_or_else(|| "no member led within 10 s".into())
}

/// Runs the act; its violations (empty if none).
pub async fn run() -> Result<Vec<String>, Box<dyn Error>> {
    let mut violations = Vec::new();
    let root = std::env::temp_dir().join(format!("ticketing-demo-{}", std::process::id()));
    let (news, mut heard) = mpsc::unbounded_channel();
    let mut cluster = Cluster {
        clients: BTreeMap::new(),
        rafts: BTreeMap::new(),
        dirs: BTreeMap::new(),
        running: BTreeMap::new(),
        news,
        credential: format!("demo-{:032x}", crate::common::secret()),
    };
    for id in 1..=3 {
        // Free ports, bound again by the members at once.
        let client = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
        let raft = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
        cluster
            .clients
            .insert(id, Endpoint::new(client.to_string())?);
        cluster.rafts.insert(id, raft);
        cluster.dirs.insert(id, root.join(format!("member-{id}")));
    }
    println!();
    println!(
        "the replicated cluster (PROTOCOL.md 4.3): three members on Raft, election timeout {} ms",
        ELECTION_TIMEOUT.as_millis()
    );
    let started = Instant::now();
    for id in 1..=3 {
        cluster.start(id, true).await?;
    }
    let (first, _) = leader(&mut heard, None).await?;
    println!(
        "[{:4.1}s] member-{first} leads; the others answer clients with M <its address>",
        started.elapsed().as_secs_f64()
    );

    let endpoints: Vec<Endpoint> = cluster.clients.values().cloned().collect();
    let handle = spawn(
        Config::new(endpoints, Name::new("demo-raft")?),
        TcpConnector,
    )?;
    handle.connected().await?;
    let mut held = handle.lock(Key::new("held")?).lease(LEASE).renew().await?;
    let token = held.token();
    println!(
        "[{:4.1}s] a holder holds \"held\" with token {token}, lease {} ms, renewed",
        started.elapsed().as_secs_f64(),
        LEASE.as_millis()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let stopped = Instant::now();
    if let Some(handle) = cluster.running.remove(&first) {
        handle.stop().await?;
    }
    println!(
        "[{:4.1}s] member-{first} (the leader) stops dead: nothing handed over",
        started.elapsed().as_secs_f64()
    );
    let (next, led_at) = leader(&mut heard, Some(first)).await?;
    println!(
        "[{:4.1}s] member-{next} leads {} ms later, with no recovery grace",
        started.elapsed().as_secs_f64(),
        led_at.duration_since(stopped).as_millis()
    );
    let probe = handle
        .lock(Key::new("never-held")?)
        .wait(Duration::from_secs(5))
        .await?;
    println!(
        "[{:4.1}s] a key nobody held granted {} ms after the stop (token {})",
        started.elapsed().as_secs_f64(),
        stopped.elapsed().as_millis(),
        probe.token()
    );
    if probe.token() <= token {
        violations.push(format!(
            "a grant after the leader change has token {} <= {token}",
            probe.token()
        ));
    }
    probe.release().await?;

    // A lease on: the holder renewed through the new leader, or lost it.
    let until = Instant::now() + LEASE + Duration::from_millis(500);
    while Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, held.changed()).await {
            Err(_) => break,
            Ok(LeaseStatus::Valid { .. } | LeaseStatus::Jeopardy { .. }) => {}
            Ok(other) => {
                violations.push(format!("the holder's lease ended: {other:?}"));
                break;
            }
        }
    }
    let kept = matches!(held.status(), LeaseStatus::Valid { .. }) && held.token() == token;
    println!(
        "[{:4.1}s] the holder {} (token {})",
        started.elapsed().as_secs_f64(),
        if kept {
            "kept its grant across the change"
        } else {
            "LOST its grant"
        },
        held.token()
    );
    if !kept {
        violations.push("the holder did not keep its grant across the leader change".into());
    }
    held.release().await?;

    cluster.start(first, false).await?;
    println!(
        "[{:4.1}s] member-{first} restarts from its state directory and follows",
        started.elapsed().as_secs_f64()
    );
    handle.shutdown(Duration::from_secs(3)).await?;
    for (_, member) in std::mem::take(&mut cluster.running) {
        member.stop().await?;
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(violations)
}
