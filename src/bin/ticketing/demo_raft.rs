//! `ticketing demo`'s second act: a replicated cluster (PROTOCOL.md 4.3)
//! whose leader stops dead, and one of whose members is then replaced
//! (4.4). Three members on loopback, their Raft state in a temporary
//! directory; a holder renews one key, then the leader's task ends with
//! nothing handed over. What it shows: a new leader within an election, no
//! recovery grace (a key nobody held is granted at once), and the holder
//! keeps its grant with the same token. Then a fourth member joins, is
//! added and votes, and the first is removed, while the holder renews on.

use std::collections::BTreeMap;
use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ticketing::admin::MemberRole;
use ticketing::client::Config;
use ticketing::raft::{
    spawn_member, Member, MemberAddrs, MemberHandle, MemberNotice, PeerAuth, PeerConfig, Peers,
    RaftDisk, Replica, ReplicaConfig, ReplicaEvent, Start,
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
    /// Starts member `id` as `start` says.
    async fn start(&mut self, id: u64, start: Start) -> Result<(), Box<dyn Error>> {
        let voters: Vec<u64> = self.clients.keys().copied().collect();
        let (disk, restored) = RaftDisk::open(&self.dirs[&id], start, id, &voters)?;
        let wall_ms = u64::try_from(ticketing::state::unix_now().as_millis()).unwrap_or(0);
        let mut config = ReplicaConfig::new(id, self.clients.clone(), ELECTION_TIMEOUT, wall_ms);
        config.draw = crate::common::secret();
        config.peers = self
            .rafts
            .iter()
            .map(|(&id, addr)| Ok((id, Endpoint::new(addr.to_string())?)))
            .collect::<Result<_, ticketing::InvalidValue>>()?;
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

impl Cluster {
    /// The member that leads now, as its own status says (waiting up to
    /// 10 s for one).
    async fn leading(&self) -> Result<u64, Box<dyn Error>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            for (&id, member) in &self.running {
                if member.status().await?.leader == Some(id) {
                    return Ok(id);
                }
            }
            if Instant::now() >= deadline {
                return Err("no member led within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

/// Waits, at most 10 s, until `member`'s status satisfies `done`.
async fn wait_for_status(
    member: &MemberHandle,
    done: impl Fn(&ticketing::raft::ClusterStatus) -> bool,
) -> Result<(), Box<dyn Error>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(&member.status().await?) {
        if Instant::now() >= deadline {
            return Err("the change did not complete within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
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
        cluster.start(id, Start::NewCluster).await?;
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
    let held = handle.lock(Key::new("held")?).lease(LEASE).renew().await?;
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
    cluster.start(first, Start::Existing).await?;
    println!(
        "[{:4.1}s] member-{first} restarts from its state directory and follows",
        started.elapsed().as_secs_f64()
    );

    // Replaced while the holder renews: member-4 joins and is added, then
    // member-first is removed (PROTOCOL.md 4.4).
    let client = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let raft = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let client = Endpoint::new(client.to_string())?;
    cluster.clients.insert(4, client.clone());
    cluster.rafts.insert(4, raft);
    cluster.dirs.insert(4, root.join("member-4"));
    cluster.start(4, Start::Join).await?;
    let addrs = MemberAddrs::new(client, Some(Endpoint::new(raft.to_string())?));
    let lead = cluster.leading().await?;
    cluster.running[&lead]
        .add_member(4, addrs)
        .await?
        .map_err(|e| format!("adding member-4: {e}"))?;
    let votes = |s: &ticketing::raft::ClusterStatus| {
        s.members
            .iter()
            .any(|m| m.id == 4 && m.role != MemberRole::Learner)
    };
    wait_for_status(&cluster.running[&lead], votes).await?;
    println!(
        "[{:4.1}s] member-4 joins as a learner, catches up from a snapshot and votes",
        started.elapsed().as_secs_f64()
    );
    let lead = cluster.leading().await?;
    cluster.running[&lead]
        .remove_member(first, false)
        .await?
        .map_err(|e| format!("removing member-{first}: {e}"))?;
    let gone = |s: &ticketing::raft::ClusterStatus| s.members.iter().all(|m| m.id != first);
    wait_for_status(&cluster.running[&lead], gone).await?;
    println!(
        "[{:4.1}s] member-{first} is removed; members now {:?}",
        started.elapsed().as_secs_f64(),
        cluster.running[&lead]
            .status()
            .await?
            .members
            .iter()
            .map(|m| m.id)
            .collect::<Vec<_>>()
    );
    let kept = matches!(held.status(), LeaseStatus::Valid { .. }) && held.token() == token;
    println!(
        "[{:4.1}s] the holder {} (token {})",
        started.elapsed().as_secs_f64(),
        if kept {
            "kept its grant through the replacement"
        } else {
            "LOST its grant"
        },
        held.token()
    );
    if !kept {
        violations.push("the holder did not keep its grant through the replacement".into());
    }
    held.release().await?;
    handle.shutdown(Duration::from_secs(3)).await?;
    for (_, member) in std::mem::take(&mut cluster.running) {
        member.stop().await?;
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(violations)
}
