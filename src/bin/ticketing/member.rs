//! `ticketing serve --raft-id N ...`: a member of a replicated cluster
//! (PROTOCOL.md 4.3, CLI.md). Everything it decides is the library's
//! (`ticketing::raft`); this reads the options, opens the state directory
//! and the peer links, and says on stderr how the member's role changes.

use std::collections::BTreeMap;
use std::error::Error;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use ticketing::raft::{
    spawn_member, Member, MemberNotice, PeerAuth, PeerConfig, Peers, RaftDisk, Replica,
    ReplicaConfig, ReplicaEvent,
};
use ticketing::serve::TlsListener;
use ticketing::server::{AdminAccess, Config, Server};
use ticketing::state::unix_now;
use ticketing::tls::{ClientTls, Identity, ServerTls};
use ticketing::{Endpoint, Name, Time};
use tokio::net::TcpListener;

use crate::common::secret;
use crate::report::{warn_if_exposed, watch, EpochNews};

/// One `--raft-peer ID=CLIENT_ADDR/RAFT_ADDR`.
#[derive(Debug, Clone)]
pub struct RaftPeer {
    id: u64,
    client: Endpoint,
    raft: SocketAddr,
}

impl RaftPeer {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn client(&self) -> &Endpoint {
        &self.client
    }

    /// The peer address, as the configuration carries it.
    pub fn peer_endpoint(&self) -> Result<Endpoint, String> {
        Endpoint::new(self.raft.to_string()).map_err(|e| format!("{}: {e}", self.raft))
    }
}

impl FromStr for RaftPeer {
    type Err = String;

    fn from_str(s: &str) -> Result<RaftPeer, String> {
        let bad = || {
            format!("{s:?}: expected ID=CLIENT_ADDR/RAFT_ADDR, as 3=10.0.0.3:7878/10.0.0.3:7979")
        };
        let (id, addrs) = s.split_once('=').ok_or_else(bad)?;
        let (client, raft) = addrs.split_once('/').ok_or_else(bad)?;
        let id: u64 = id.parse().map_err(|_| bad())?;
        if id == 0 {
            return Err(format!("{s:?}: member ids start at 1"));
        }
        Ok(RaftPeer {
            id,
            client: Endpoint::new(client).map_err(|e| format!("{s:?}: {e}"))?,
            raft: raft
                .parse()
                .map_err(|e| format!("{s:?}: the peer address must be IP:PORT ({e})"))?,
        })
    }
}

/// What `serve` hands over for a member.
pub struct MemberArgs<'a> {
    pub id: u64,
    pub listen: &'a str,
    pub raft_listen: SocketAddr,
    pub peers: &'a [RaftPeer],
    pub state_dir: &'a Path,
    pub new_cluster: bool,
    /// `--restore FILE`: the backup a new cluster begins from.
    pub restore: Option<&'a Path>,
    /// `--raft-join`: an empty directory, to be added to a running cluster.
    pub join: bool,
    pub election_timeout: Duration,
    pub credential: Option<Name>,
    /// `--raft-insecure`: peers do not authenticate (loopback only).
    pub insecure: bool,
    pub snapshot_every: u64,
    pub tls: Option<ServerTls>,
    /// With `--tls-client-ca`: the peers speak mutual TLS, with this
    /// identity and CA.
    pub peer_tls: Option<(Identity, &'a Path)>,
}

/// How the peers authenticate: mutual TLS (with `--tls-client-ca`), a
/// peer credential, or, when told so, not at all (loopback only, which
/// the peer links check); a member never starts without being told which.
fn peer_auth(
    credential: Option<Name>,
    insecure: bool,
    peer_tls: Option<(Identity, &Path)>,
    tls: &Option<ServerTls>,
) -> Result<PeerAuth, Box<dyn Error>> {
    let credential = credential.map(|c| c.as_str().to_owned());
    match (peer_tls, tls, credential) {
        (Some((identity, ca)), Some(server_tls), credential) => {
            let client = ClientTls::builder()
                .ca_file(ca)?
                .identity(identity)
                .build()?;
            Ok(PeerAuth::tls(server_tls, &client, credential))
        }
        (_, _, Some(credential)) => Ok(PeerAuth::Credential(credential)),
        (_, _, None) if insecure => {
            eprintln!(
                "raft peers: --raft-insecure: members do not authenticate each other; allowed \
                 only with every peer address on loopback, where any process of this machine \
                 could act as a member"
            );
            Ok(PeerAuth::InsecureLoopback)
        }
        (_, _, None) => Err(
            "a member's peers must authenticate: give --raft-credential C (or \
             TICKETING_RAFT_CREDENTIAL), or mutual TLS (--tls-cert, --tls-key and \
             --tls-client-ca), or --raft-insecure for a cluster on one machine (loopback \
             addresses only)"
                .into(),
        ),
    }
}

/// Serves as a member until `stop`.
pub async fn serve_member(
    config: Config,
    args: MemberArgs<'_>,
    prometheus: Option<PrometheusHandle>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<ExitCode, Box<dyn Error>> {
    let mut clients = BTreeMap::new();
    let mut raft_addrs = BTreeMap::new();
    for p in args.peers {
        if clients.insert(p.id, p.client.clone()).is_some() {
            return Err(format!("--raft-peer names member {} twice", p.id).into());
        }
        raft_addrs.insert(p.id, p.raft);
    }
    if !clients.contains_key(&args.id) {
        return Err(format!("--raft-id {} is not among the --raft-peer members", args.id).into());
    }
    // Operators are authenticated as peers are (PROTOCOL.md 4.4): by a
    // certificate the peer CA signed, by the peer credential, or by
    // nothing where the peers are not either.
    // With mutual TLS, every client of this member's client address
    // presented a certificate the peers' CA signed: each may ask.
    let admin = match (&args.credential, args.insecure, &args.peer_tls) {
        (_, _, Some(_)) => Some(AdminAccess::Certified),
        (Some(credential), _, None) => Some(AdminAccess::Credential(credential.clone())),
        (None, true, None) => Some(AdminAccess::Open),
        (None, false, None) => None,
    };
    let auth = peer_auth(args.credential, args.insecure, args.peer_tls, &args.tls)?;
    let voters: Vec<u64> = clients.keys().copied().collect();
    let start = if args.new_cluster {
        ticketing::raft::Start::NewCluster
    } else if args.join {
        ticketing::raft::Start::Join
    } else {
        ticketing::raft::Start::Existing
    };
    let (disk, restored) = RaftDisk::open(args.state_dir, start, args.id, &voters)?;
    for tail in disk.dropped() {
        eprintln!("{tail}");
    }
    let wall_ms = u64::try_from(unix_now().as_millis()).unwrap_or(u64::MAX);
    let mut replica_config = ReplicaConfig::new(args.id, clients, args.election_timeout, wall_ms);
    replica_config.snapshot_every = args.snapshot_every;
    if let Some(path) = args.restore {
        let backup = ticketing::raft::read_backup(path)?;
        eprintln!(
            "restoring the backup at index {} of cluster {}: {} grants, every later token above {}",
            backup.index,
            backup
                .cluster
                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
            backup.grants.len(),
            backup.max_token()
        );
        replica_config.restore = Some(backup);
    }
    // The cluster's identity if this member is its first leader.
    replica_config.draw = secret();
    replica_config.admin = admin;
    replica_config.peers = raft_addrs
        .iter()
        .filter_map(|(&id, addr)| Some((id, Endpoint::new(addr.to_string()).ok()?)))
        .collect();
    let server = Server::new(config, Time::ZERO)?;
    let replica = Replica::new(replica_config, server, restored, Time::ZERO)?;
    let client_credential = replica.server().config().credential.is_some();

    let raft_listener = Peers::listener(args.raft_listen)?;
    let (peers, inbound) = Peers::start(PeerConfig::new(args.id, raft_addrs, auth), raft_listener)?;
    let member = Member {
        replica,
        disk,
        peers,
        inbound,
    };

    let listener = TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    warn_if_exposed(addr, client_credential, args.tls.is_some());
    let origin = Instant::now();
    let raft_id = args.id;
    let mut given: BTreeMap<u64, String> = args
        .peers
        .iter()
        .map(|p| (p.id, p.raft.to_string()))
        .collect();
    let notify = move |notice: MemberNotice| match notice {
        MemberNotice::Replica(ReplicaEvent::Leading { term, index }) => {
            eprintln!(
                "leading (term {term}, from entry {index}; unix ms {})",
                unix_now().as_millis()
            );
        }
        MemberNotice::Replica(ReplicaEvent::Following {
            leader: Some(leader),
            term,
        }) => eprintln!("following {leader} (term {term})"),
        MemberNotice::Replica(ReplicaEvent::Following { leader: None, term }) => {
            eprintln!("no leader known (term {term})");
        }
        MemberNotice::Replica(ReplicaEvent::BadEntry { index }) => {
            eprintln!("entry {index} of the log cannot be read: this member stops serving");
        }
        MemberNotice::Replica(ReplicaEvent::Failed { peer }) => {
            eprintln!("the Raft engine failed on a message from member {peer}: stopping, with what was made durable before it");
            std::process::exit(1);
        }
        MemberNotice::Replica(ReplicaEvent::Cluster { id }) => {
            eprintln!("cluster {id}, member {raft_id}");
        }
        MemberNotice::Replica(ReplicaEvent::RestoreDiffers {
            index,
            grants,
            committed,
        }) => {
            match committed {
                Some((at, n)) => eprintln!(
                    "this member was given the backup at index {index} ({grants} grants), and the cluster restored the one at index {at} ({n} grants): stopping"
                ),
                None => eprintln!(
                    "this member was given the backup at index {index} ({grants} grants), and the cluster's first leader restored none: stopping; start every member of a new cluster with the same --restore FILE"
                ),
            }
            std::process::exit(1);
        }
        MemberNotice::Replica(ReplicaEvent::OtherCluster {
            recorded,
            committed,
        }) => {
            eprintln!("this state directory is cluster {recorded}'s, and the log of the cluster it was started in committed {committed}: stopping");
            std::process::exit(1);
        }
        MemberNotice::Replica(ReplicaEvent::Members { peers, .. }) => {
            let now: BTreeMap<u64, String> =
                peers.iter().map(|(&id, a)| (id, a.to_string())).collect();
            if now != given {
                let mut said: Vec<String> = Vec::new();
                for (id, addr) in &now {
                    match given.get(id) {
                        None => said.push(format!("member {id} at {addr} (not given)")),
                        Some(g) if g != addr => {
                            said.push(format!("member {id} at {addr} (given {g})"))
                        }
                        Some(_) => {}
                    }
                }
                for (id, g) in &given {
                    if !now.contains_key(id) {
                        said.push(format!("no member {id} (given at {g})"));
                    }
                }
                eprintln!(
                    "the configuration differs from --raft-peer, and wins: {}",
                    said.join(", ")
                );
                given = now;
            }
        }
        MemberNotice::Replica(ReplicaEvent::ToldRemoved { by, index }) => {
            eprintln!(
                "member {by} says this member is not in its configuration as of entry {index}, past all this member knew committed: it was removed while it was down"
            );
        }
        MemberNotice::Replica(ReplicaEvent::Removed) => {
            eprintln!(
                "removed from the cluster: stopping; this state directory never starts again"
            );
            std::process::exit(0);
        }
        MemberNotice::PeersRefused(why) => {
            eprintln!("the configuration's peer addresses cannot all be linked: {why}");
        }
        MemberNotice::DiskFailed(why) => {
            // A crash, as far as the cluster can tell: a restart reads
            // back what was synced.
            eprintln!("cannot keep the Raft state ({why}): stopping; the cluster goes on without this member");
            std::process::exit(1);
        }
        _ => {}
    };
    let handle = match args.tls {
        Some(tls) => spawn_member(TlsListener::new(listener, tls), member, origin, notify)?,
        None => spawn_member(listener, member, origin, notify)?,
    };
    eprintln!("listening on {addr}");
    let no_news = EpochNews::default();
    // The cluster as this member sees it, beside the server's counters.
    let publishing = prometheus.is_some();
    let publish = async {
        if !publishing {
            return std::future::pending().await;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            match handle.status().await {
                Ok(status) => ticketing::metrics::record_cluster(&status),
                Err(_) => return,
            }
        }
    };
    tokio::select! {
        () = stop => {}
        () = watch(|| handle.stats(), prometheus, &no_news) => {}
        () = publish => {}
    }
    // A leader hands over first (PROTOCOL.md 4.4): its clients are sent to
    // the new leader, with no election timeout to wait out.
    match handle.hand_over(2 * args.election_timeout).await? {
        Some(to) => eprintln!("stopping: handed the leadership over to member {to}"),
        None => eprintln!("stopping"),
    }
    handle.stop().await?;
    Ok(ExitCode::SUCCESS)
}
