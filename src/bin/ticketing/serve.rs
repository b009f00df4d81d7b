//! `ticketing serve`: the reference server until SIGINT or SIGTERM.

use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, ValueEnum};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use ticketing::cluster::{self, check_cluster_name, ClusterConfig, ClusterEpochs, Notice};
use ticketing::serve::{ServerHandle, TlsListener};
use ticketing::server::{Config, EpochSource, Role, Server, Term};
use ticketing::state::{unix_now, Epochs, KeptEpochs, StateDir, WallClock};
use ticketing::tls::{Identity, ServerTls};
use ticketing::{Endpoint, Name, Time};
use tokio::net::TcpListener;

use crate::common::{secret, Secret, CREDENTIAL_ENV, RAFT_CREDENTIAL_ENV};
use crate::member::{serve_member, MemberArgs, RaftPeer};
use crate::report::{warn_if_exposed, watch, EpochNews};
use crate::scrape;

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    Leader,
    Follower,
    NoLeader,
    NotActive,
}

/// Options of `ticketing serve` (CLI.md).
#[derive(ClapArgs)]
pub struct Args {
    /// Address to listen on; port 0 picks a free one (printed on stderr).
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: String,
    /// Node id sent in W (default: `node-1`, or a member's Raft id).
    #[arg(long)]
    node_id: Option<Name>,
    /// Credential clients must present (default: any). Better from the
    /// environment: a command line is visible to every user of the
    /// machine (`ps`).
    #[arg(
        long,
        value_parser = Secret,
        allow_hyphen_values = true,
        env = CREDENTIAL_ENV,
        hide_env_values = true
    )]
    credential: Option<Name>,
    /// Requests a client may have unanswered.
    #[arg(long, default_value_t = 64)]
    window: u64,
    /// Most acquires waiting on one key.
    #[arg(long, default_value_t = 1024)]
    queue_limit: usize,
    /// Most acquires waiting in all.
    #[arg(long, default_value_t = 65_536)]
    max_waiters: usize,
    /// Longest lease granted, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    max_lease_ms: u64,
    /// Send `L ADDR` after W.
    #[arg(long, value_name = "ADDR")]
    leader_hint: Option<Endpoint>,
    /// The node's role.
    #[arg(long, value_enum, default_value = "leader")]
    role: RoleArg,
    /// The leader a follower redirects to.
    #[arg(long, value_name = "ADDR", required_if_eq("role", "follower"))]
    leader: Option<Endpoint>,
    /// Close a connection that has sent no whole H this long after it was
    /// accepted, in milliseconds (at least 1).
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    handshake_timeout_ms: u64,
    /// Speak only TLS, presenting the certificate chain of FILE (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Refuse, before their H, clients without a certificate that the CA
    /// certificates of FILE (PEM) signed.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Keep the epoch here, and the lock table on a clean stop, so that a
    /// restart keeps every promise (PROTOCOL.md 4.1).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// A recovery grace is the longest earlier lease plus this, in
    /// milliseconds.
    #[arg(long, value_name = "N", default_value_t = 1_000)]
    grace_margin_ms: u64,
    /// Join a cluster on etcd at these client URLs (PROTOCOL.md 4.2): lead
    /// or redirect. `--role` is then not used.
    #[arg(
        long,
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        requires_all = ["cluster", "advertise"],
        conflicts_with = "state_dir"
    )]
    etcd: Vec<String>,
    /// This node's Raft id in a replicated cluster (PROTOCOL.md 4.3).
    /// `--role` is then not used.
    #[arg(
        long,
        value_name = "N",
        requires_all = ["raft_listen", "raft_peer", "state_dir"],
        conflicts_with = "etcd"
    )]
    raft_id: Option<u64>,
    /// Where the other members reach this one.
    #[arg(long, value_name = "ADDR", requires = "raft_id")]
    raft_listen: Option<SocketAddr>,
    /// Every member, this one included, once each:
    /// `ID=CLIENT_ADDR/RAFT_ADDR`.
    #[arg(long, value_name = "ID=CLIENT_ADDR/RAFT_ADDR", requires = "raft_id")]
    raft_peer: Vec<RaftPeer>,
    /// The very first start of a new cluster (every member, empty state
    /// directories); refused on a directory that holds state.
    #[arg(long, requires = "raft_id")]
    raft_new_cluster: bool,
    /// With --raft-new-cluster: begin from this backup (`ticketing cluster
    /// snapshot` wrote it), given to every member alike. The new cluster
    /// holds every grant in it with its token, counts each lease from now,
    /// and grants every later token above the file's.
    #[arg(long, value_name = "FILE", requires = "raft_new_cluster")]
    restore: Option<PathBuf>,
    /// The first start of a member to be added to a running cluster
    /// (`ticketing cluster add`), on an empty state directory: it serves
    /// no client until it votes. Give --raft-peer for the members it is to
    /// reach, itself included.
    #[arg(long, requires = "raft_id", conflicts_with = "raft_new_cluster")]
    raft_join: bool,
    /// The least time a member waits without hearing from a leader before
    /// it stands for election, in milliseconds (Raft draws each wait
    /// between it and twice it).
    #[arg(long, value_name = "N", default_value_t = 1_000, requires = "raft_id")]
    election_timeout_ms: u64,
    /// The credential members present to each other. Better from the
    /// environment. Not used without --raft-id (so that the variable may
    /// be set where single servers run too).
    #[arg(
        long,
        value_parser = Secret,
        allow_hyphen_values = true,
        env = RAFT_CREDENTIAL_ENV,
        hide_env_values = true
    )]
    raft_credential: Option<Name>,
    /// Members do not authenticate each other: for a cluster on one
    /// machine only (every peer address a loopback one), where any local
    /// process could act as a member. Said on stderr at every start.
    #[arg(long, requires = "raft_id", conflicts_with_all = ["raft_credential", "tls_client_ca"])]
    raft_insecure: bool,
    /// Entries applied between two snapshots of the table, which the log
    /// is then compacted behind (tests and benchmarks).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 10_000,
        requires = "raft_id",
        hide = true
    )]
    raft_snapshot_every: u64,
    /// The cluster's name in etcd: an atom without '/'.
    #[arg(long, value_name = "NAME", requires = "etcd", value_parser = cluster_name)]
    cluster: Option<String>,
    /// The address clients reach this node at: its election value, and what
    /// `M` names it by.
    #[arg(long, value_name = "ADDR", requires = "etcd")]
    advertise: Option<Endpoint>,
    /// The TTL of the etcd lease the node campaigns under, in milliseconds
    /// (etcd counts whole seconds: rounded up).
    #[arg(long, value_name = "N", default_value_t = 5_000)]
    election_ttl_ms: u64,
    /// Serve the server's counters at http://ADDR/metrics in the
    /// Prometheus text format. Keep it private: it shows how busy the
    /// server is.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
}

/// A cluster name as `--cluster` takes it (the library's rule).
fn cluster_name(name: &str) -> Result<String, String> {
    check_cluster_name(name)
        .map(|()| name.to_owned())
        .map_err(|e| e.to_string())
}

impl Args {
    /// The server's TLS, if it speaks TLS.
    fn tls(&self) -> Result<Option<ServerTls>, Box<dyn Error>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let mut builder = ServerTls::builder().identity(Identity::from_pem_files(cert, key)?);
        if let Some(ca) = &self.tls_client_ca {
            builder = builder.client_ca_file(ca)?;
        }
        Ok(Some(builder.build()?))
    }
}

pub async fn run(args: Args) -> Result<ExitCode, Box<dyn Error>> {
    let tls = args.tls()?;
    // A member of a replicated cluster says which one it is.
    let node_id = match (args.node_id, args.raft_id) {
        (Some(id), _) => id,
        (None, Some(raft_id)) => Name::new(raft_id.to_string()).expect("a number is an atom"),
        (None, None) => Name::new("node-1").expect("an atom"),
    };
    let mut config = Config::new(node_id);
    config.window = args.window;
    config.queue_limit = args.queue_limit;
    config.max_waiters = args.max_waiters;
    config.max_lease = Duration::from_millis(args.max_lease_ms);
    config.credential = args.credential;
    config.leader_hint = args.leader_hint;
    config.handshake_timeout = Duration::from_millis(args.handshake_timeout_ms);
    config.grace_margin = Duration::from_millis(args.grace_margin_ms);
    config.epochs = EpochSource::Driver;
    config.hash_key = secret();
    config.role = match (args.role, args.leader) {
        (RoleArg::Leader, _) => Role::Leader,
        (RoleArg::Follower, Some(leader)) => Role::Follower { leader },
        (RoleArg::Follower, None) => return Err("--role follower needs --leader ADDR".into()),
        (RoleArg::NoLeader, _) => Role::NoLeader,
        (RoleArg::NotActive, _) => Role::NotActive,
    };
    // The handlers are in place before `listening on` is printed: a signal
    // sent as soon as that line is seen must stop the server cleanly.
    let stop = stop_signal()?;
    let prometheus = serve_metrics(args.metrics_listen).await?;
    if let (Some(id), Some(raft_listen), Some(state_dir)) =
        (args.raft_id, args.raft_listen, args.state_dir.as_deref())
    {
        config.role = Role::NoLeader;
        let peer_tls = match (&args.tls_client_ca, &args.tls_cert, &args.tls_key) {
            (Some(ca), Some(cert), Some(key)) => {
                Some((Identity::from_pem_files(cert, key)?, ca.as_path()))
            }
            _ => None,
        };
        let member = MemberArgs {
            id,
            listen: &args.listen,
            raft_listen,
            peers: &args.raft_peer,
            state_dir,
            new_cluster: args.raft_new_cluster,
            restore: args.restore.as_deref(),
            join: args.raft_join,
            election_timeout: Duration::from_millis(args.election_timeout_ms),
            credential: args.raft_credential.clone(),
            insecure: args.raft_insecure,
            snapshot_every: args.raft_snapshot_every,
            tls,
            peer_tls,
        };
        return serve_member(config, member, prometheus, stop).await;
    }
    if let (Some(cluster), Some(advertise)) = (args.cluster.clone(), args.advertise.clone()) {
        let mut node = ClusterConfig::new(args.etcd.clone(), cluster, advertise);
        node.election_ttl = Duration::from_millis(args.election_ttl_ms);
        node.max_lease = config.max_lease;
        node.grace_margin = config.grace_margin;
        config.role = Role::NoLeader;
        return serve_in_cluster(config, &args.listen, tls, node, prometheus, stop).await;
    }
    let origin = Instant::now();
    let news = Arc::new(EpochNews::default());
    let mut core = Server::new(config, Time::ZERO)?;
    let (state, epochs) = begin_term(&mut core, origin, args.state_dir, &news).await?;
    if let Some(until) = core.grace_until() {
        let ends = origin + Duration::from_nanos(until.as_nanos());
        eprintln!(
            "recovery grace: no grant for {} ms, until every earlier grant has run out or been reclaimed",
            ends.saturating_duration_since(Instant::now()).as_millis()
        );
        tokio::spawn(async move {
            tokio::time::sleep_until(ends.into()).await;
            eprintln!("recovery grace over: granting");
        });
    }
    let (handle, addr) = bind_and_serve(&args.listen, core, tls, origin, epochs).await?;
    eprintln!("listening on {addr}");
    tokio::select! {
        () = stop => {}
        () = watch(|| handle.stats(), prometheus, &news) => {}
    }
    let mut core = handle.stop().await?;
    if let Some(state) = state {
        // A clean stop: the table, kept for the next start.
        let image = core.table_image(since(origin), unix_now());
        state.write_table(&image)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Binds `listen` and serves `core` there (over TLS with `tls`), its
/// epochs from `epochs`; says first what the address and the options
/// leave open.
async fn bind_and_serve(
    listen: &str,
    core: Server,
    tls: Option<ServerTls>,
    origin: Instant,
    epochs: Box<dyn Epochs>,
) -> Result<(ServerHandle, SocketAddr), Box<dyn Error>> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    warn_if_exposed(addr, core.config().credential.is_some(), tls.is_some());
    let handle = match tls {
        Some(tls) => ticketing::serve::spawn_with_epochs(
            TlsListener::new(listener, tls),
            core,
            origin,
            epochs,
        )?,
        None => ticketing::serve::spawn_with_epochs(listener, core, origin, epochs)?,
    };
    Ok((handle, addr))
}

/// A node of a cluster on etcd: it serves as etcd says (PROTOCOL.md 4.2)
/// until a signal, or until it cannot go on.
async fn serve_in_cluster(
    config: Config,
    listen: &str,
    tls: Option<ServerTls>,
    node: ClusterConfig,
    prometheus: Option<PrometheusHandle>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<ExitCode, Box<dyn Error>> {
    let core = Server::new(config, Time::ZERO)?;
    let epochs = ClusterEpochs::new();
    let origin = Instant::now();
    let epochs_box = Box::new(epochs.clone());
    let (handle, addr) = bind_and_serve(listen, core, tls, origin, epochs_box).await?;
    eprintln!("listening on {addr}");
    let name = node.cluster.clone();
    let notify = |notice| match notice {
        Notice::Leading { epoch, grace } => {
            eprintln!("leading cluster {name}: a term of epoch {epoch}");
            if let Some(grace) = grace {
                eprintln!(
                    "recovery grace: no grant for {} ms, until every earlier grant has run out or been reclaimed",
                    grace.as_millis()
                );
            }
        }
        Notice::GraceOver { .. } => eprintln!("recovery grace over: granting"),
        Notice::SteppedDown { why } => eprintln!("no longer leading cluster {name}: {why}"),
        Notice::Following {
            leader: Some(leader),
        } => eprintln!("following {leader}"),
        Notice::Following { leader: None } => eprintln!("no leader known"),
        Notice::Trouble { what } => eprintln!("{what}"),
        _ => {}
    };
    // A signal hands the leadership over at once: the node stops granting
    // and gives up its election key before the server stops.
    let no_news = EpochNews::default();
    let failed = tokio::select! {
        stopped = cluster::run_until(&handle, &node, &epochs, notify, stop) => stopped.err(),
        () = watch(|| handle.stats(), prometheus, &no_news) => None,
    };
    handle.stop().await?;
    match failed {
        None => Ok(ExitCode::SUCCESS),
        Some(e) => Err(e.into()),
    }
}

/// Begins the server's first term (PROTOCOL.md 4.1): from the state
/// directory if there is one (its epoch kept before any grant, its table
/// taken once), else from the clock; and where its later epochs come from
/// (their failures noted in `news`).
async fn begin_term(
    core: &mut Server,
    origin: Instant,
    state_dir: Option<PathBuf>,
    news: &Arc<EpochNews>,
) -> Result<(Option<StateDir>, Box<dyn Epochs>), Box<dyn Error>> {
    let Some(dir) = state_dir else {
        let term = Term::stateless(unix_now());
        let epoch = term.epoch();
        // No grant before the epoch's millisecond has begun, so that a
        // restart can never take the same epoch.
        let begins = Duration::from_millis(epoch);
        tokio::time::sleep(begins.saturating_sub(unix_now())).await;
        core.begin_term(since(origin), term)?;
        eprintln!(
            "no --state-dir: a restart forgets every grant (tokens still increase: epoch {epoch})"
        );
        return Ok((None, Box::new(WallClock)));
    };
    let state = StateDir::open(dir)?;
    let config = core.config();
    let next = state.next_term(unix_now(), config.max_lease, config.grace_margin)?;
    if let Some(refused) = &next.refused_table {
        let then = match next.term {
            Term::Recovered { .. } => ": a recovery grace instead",
            _ => "",
        };
        eprintln!("{refused}: unreadable, not used{then}");
    }
    // The leases and the grace count from now, when the time stopped was
    // measured: never from earlier.
    core.begin_term(since(origin), next.term)?;
    let news = Arc::clone(news);
    let epochs = KeptEpochs::new(state.clone(), next.record.max_lease_ms)
        .watch(move |keeping| news.note(&keeping));
    Ok((Some(state), Box::new(epochs)))
}

/// The core's time now, its time counting from `origin`.
fn since(origin: Instant) -> Time {
    Time::from_nanos(u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// Installs the SIGINT and SIGTERM handlers now; the future resolves on
/// either signal.
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// With `listen`, a Prometheus recorder installed and its text served
/// there (`scrape`); `None` without.
async fn serve_metrics(
    listen: Option<SocketAddr>,
) -> Result<Option<PrometheusHandle>, Box<dyn Error>> {
    let Some(addr) = listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--metrics-listen {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("--metrics-listen {addr}: {e}"))?;
    let recorder = prometheus.clone();
    tokio::spawn(scrape::serve(listener, move || recorder.render()));
    eprintln!("metrics on {bound}");
    Ok(Some(prometheus))
}
