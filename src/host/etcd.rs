//! A cluster on etcd (feature `etcd`): PROTOCOL.md 4.2 around a running
//! [`ServerHandle`]. This is what `ticketing serve --etcd` runs.
//!
//! etcd holds the leadership and the epoch; the leader serves from memory.
//! The node here only talks to etcd and tells the server core what came of
//! it; every rule of the protocol stays in the core:
//!
//! - it campaigns through etcd's election API (`ticketing/<cluster>/leader`,
//!   its value the address clients reach the node at) under an etcd lease
//!   of the election TTL, kept alive every third of it;
//! - while it does not lead, it asks etcd who does, every third of the TTL,
//!   and gives the core the role that says so: `M <leader>`, or
//!   `E no_leader` when etcd names nobody (or names this node, whose old
//!   key is still there);
//! - when it wins, it reads the cluster's epoch record
//!   (`ticketing/<cluster>/epoch`), takes the next term by the core's rule
//!   ([`Term::next`]: `max(epoch + 1, now in ms)`, and a recovery grace
//!   after any earlier term, since no table is handed over), writes the
//!   record in a transaction that holds only while its election key is the
//!   one it won with and nobody else wrote the record meanwhile, and only
//!   then begins the term and leads;
//! - it leads only until the send time of its latest answered keep-alive
//!   plus the TTL etcd granted ([`ServerHandle::lead_until`]): the core
//!   steps down by itself past that, even if this task is late (a paused
//!   process), and says `E no_leader` to every client;
//! - when etcd says it lost (a keep-alive answered with TTL 0, or another
//!   key leads), or its certainty ran out, it steps down (`M <new>` or
//!   `E no_leader` to every client), revokes its lease, and campaigns again
//!   with a new one. It keeps no table across terms;
//! - when it is stopped ([`run_until`]'s `stop`: `ticketing serve` on
//!   SIGINT or SIGTERM), it stops granting (`E no_leader` to every client)
//!   and revokes its etcd lease, which deletes its election key: another
//!   node wins at once instead of after the TTL, and begins its term with a
//!   recovery grace as after any change of leader.
//!
//! etcd counts leases in whole seconds: the election TTL is rounded up to
//! one, and the TTL etcd answers is the one the certainty counts with.
//!
//! A cluster's name is an atom without `/` ([`check_cluster_name`]), so
//! that the prefixes of two clusters never nest: were `a/leader` a name,
//! its election would run inside cluster `a`'s, and `a`'s nodes would
//! follow (and, once it stopped, wait for) a leader of the other cluster.
//! The key layout stays as it is: a new one would split the nodes of a
//! rolling upgrade into two elections.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LeaderKey, ResignOptions, Txn, TxnOp,
};
use thiserror::Error;
use tokio::sync::{watch, Notify};

use crate::host::serve::ServerHandle;
use crate::host::state::{unix_now, Epochs};
use crate::names::Endpoint;
use crate::server::{next_epoch, EpochRecord, ImageError, Role, Term, TermError};
use crate::sync::lock;

/// Where a node finds etcd and how it campaigns.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// etcd's client URLs (`http://host:port`).
    pub endpoints: Vec<String>,
    /// The cluster's name: its keys in etcd are under `ticketing/<name>/`.
    /// An atom without `/` ([`check_cluster_name`]); [`run`] and
    /// [`run_until`] refuse any other at once.
    pub cluster: String,
    /// The address clients reach this node at: its election value, and what
    /// the other nodes' `M` names.
    pub advertise: Endpoint,
    /// The election TTL (default 5 s), rounded up to whole seconds.
    pub election_ttl: Duration,
    /// The server's longest lease, kept with the epoch.
    pub max_lease: Duration,
    /// The server's grace margin, for the notices only (the core applies
    /// it).
    pub grace_margin: Duration,
}

impl ClusterConfig {
    /// A node of `cluster` reached at `advertise`, with the default TTL,
    /// the server's default longest lease (60 s) and grace margin (1 s).
    pub fn new(endpoints: Vec<String>, cluster: String, advertise: Endpoint) -> ClusterConfig {
        ClusterConfig {
            endpoints,
            cluster,
            advertise,
            election_ttl: Duration::from_secs(5),
            max_lease: Duration::from_secs(60),
            grace_margin: Duration::from_secs(1),
        }
    }

    fn election(&self) -> String {
        format!("ticketing/{}/leader", self.cluster)
    }

    fn epoch_key(&self) -> String {
        format!("ticketing/{}/epoch", self.cluster)
    }

    /// How long an etcd request may take: the TTL, at least 1 s.
    fn patience(&self) -> Duration {
        self.election_ttl.max(Duration::from_secs(1))
    }

    /// The TTL asked of etcd, in whole seconds (at least 1).
    fn ttl_secs(&self) -> i64 {
        let ms = self.election_ttl.as_millis().max(1);
        i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX)
    }
}

/// The epochs of terms a leader's core begins by itself (its counter about
/// to reach 2^22), kept in etcd first: give one to
/// [`serve::spawn_with_epochs`](crate::serve::spawn_with_epochs) and a
/// clone to [`run`]. Asked for by the server, the leader writes the epoch
/// in a transaction that holds only while it leads; the server gets it on
/// a later turn, and grants nothing meanwhile.
#[derive(Debug, Clone, Default)]
pub struct ClusterEpochs(Arc<EpochSlot>);

#[derive(Debug, Default)]
struct EpochSlot {
    state: Mutex<Asked>,
    asked: Notify,
}

#[derive(Debug, Default)]
struct Asked {
    /// The epoch after which a new one is wanted.
    after: Option<u64>,
    /// The one kept for it: (after, epoch).
    kept: Option<(u64, u64)>,
}

impl ClusterEpochs {
    /// An empty slot.
    pub fn new() -> ClusterEpochs {
        ClusterEpochs::default()
    }
}

impl Epochs for ClusterEpochs {
    fn next(&mut self, after: u64) -> Option<u64> {
        let mut state = lock(&self.0.state);
        if let Some((kept_after, epoch)) = state.kept {
            if kept_after == after {
                state.kept = None;
                state.after = None;
                return Some(epoch);
            }
        }
        if state.after != Some(after) {
            state.after = Some(after);
            self.0.asked.notify_one();
        }
        None
    }
}

/// What a node tells its embedder (`ticketing serve` prints each on a
/// line of stderr).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// It leads, from a term with this epoch; with a recovery grace of
    /// that long (none on the cluster's first term).
    Leading {
        /// The term's epoch.
        epoch: u64,
        /// How long nothing is granted.
        grace: Option<Duration>,
    },
    /// The recovery grace of the term it leads is over.
    GraceOver {
        /// The term's epoch.
        epoch: u64,
    },
    /// It stopped leading.
    SteppedDown {
        /// Why, readably.
        why: String,
    },
    /// It follows the leader etcd names, or none.
    Following {
        /// The leader's address.
        leader: Option<Endpoint>,
    },
    /// etcd could not be reached or answered an error; it tries again.
    Trouble {
        /// What happened.
        what: String,
    },
}

/// Checks that `name` may name a cluster: an atom (1 to 250 printable
/// ASCII bytes, no space) without `/`, so that no cluster's keys in etcd
/// lie under another's.
pub fn check_cluster_name(name: &str) -> Result<(), ClusterError> {
    if crate::wire::Atom::new(name).is_err() || name.contains('/') {
        return Err(ClusterError::BadName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// What stops a node.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The cluster's name is not an atom without `/`
    /// ([`check_cluster_name`]).
    #[error("cluster name {name:?}: a name is 1 to 250 printable ASCII bytes with no space and no '/' (its keys in etcd are under ticketing/<name>/, and a '/' would put one cluster inside another's election)")]
    BadName {
        /// The name given.
        name: String,
    },
    /// The epoch record in etcd exists but is not valid: no epoch is
    /// guessed, since a guess could be smaller than the one lost.
    #[error("{key} in etcd: not a valid epoch record ({source}); refusing to guess an epoch")]
    BadEpoch {
        /// The key.
        key: String,
        /// Why it is not valid.
        source: ImageError,
    },
    /// The server refused the term (an epoch past 2109).
    #[error("the server refused the term: {0}")]
    Term(#[from] TermError),
    /// The server task has stopped.
    #[error("the server has stopped")]
    Stopped,
}

/// Why one session (one etcd lease) ended.
enum End {
    /// Leadership lost or never won with this lease: campaign again.
    Again,
    /// etcd failed: try again after a pause.
    Trouble(String),
    /// Stop the node.
    Fatal(ClusterError),
}

impl From<etcd_client::Error> for End {
    fn from(e: etcd_client::Error) -> End {
        End::Trouble(format!("etcd: {e}"))
    }
}

impl From<std::io::Error> for End {
    fn from(_: std::io::Error) -> End {
        End::Fatal(ClusterError::Stopped)
    }
}

/// Runs the node for `handle`'s server until the server stops or the
/// epoch in etcd cannot be read (at once, for a name that is not a
/// cluster's: [`ClusterError::BadName`]). The server should start in a
/// role that does not lead ([`Role::NoLeader`]); `notify` hears what
/// happens.
///
/// Dropping this future leaves the node's election key in etcd until its
/// lease runs out (up to the election TTL, in which no other node can
/// lead); [`run_until`] hands the leadership over at once instead.
pub async fn run(
    handle: &ServerHandle,
    config: &ClusterConfig,
    epochs: &ClusterEpochs,
    notify: impl FnMut(Notice) + Send,
) -> ClusterError {
    if let Err(e) = check_cluster_name(&config.cluster) {
        return e;
    }
    Node::new(handle, config, epochs).run(notify).await
}

/// [`run`] until `stop` resolves, then stops cleanly: the server stops
/// granting (every client is told `E no_leader` and closed) before the
/// node's etcd lease is revoked, which deletes its election key, so that
/// another node can lead at once. `Ok` once stopped, or the error that
/// stopped the node first. The server itself keeps running: stop it next.
pub async fn run_until(
    handle: &ServerHandle,
    config: &ClusterConfig,
    epochs: &ClusterEpochs,
    mut notify: impl FnMut(Notice) + Send,
    stop: impl Future<Output = ()>,
) -> Result<(), ClusterError> {
    check_cluster_name(&config.cluster)?;
    let node = Node::new(handle, config, epochs);
    tokio::select! {
        e = node.run(&mut notify) => return Err(e),
        () = stop => {}
    }
    handle.set_role(Role::NoLeader);
    // Answered after the role above is taken (one queue, in order): no
    // grant is made once the key is gone. (An error: the server has
    // stopped, and grants nothing either.)
    let taken = handle.lead_until(Instant::now()).await;
    let held = lock(&node.lease).take();
    if let Some(Campaign {
        mut client,
        lease,
        leading,
    }) = held
    {
        if leading {
            notify(Notice::SteppedDown {
                why: "stopping".into(),
            });
        }
        revoke(&mut client, lease, config.patience()).await;
    }
    taken.map(drop).map_err(|_| ClusterError::Stopped)
}

impl<'a> Node<'a> {
    fn new(handle: &'a ServerHandle, config: &'a ClusterConfig, epochs: &'a ClusterEpochs) -> Self {
        Node {
            handle,
            config,
            epochs,
            lease: Mutex::new(None),
        }
    }

    /// Campaigns and leads, session after session, until something fatal.
    async fn run(&self, mut notify: impl FnMut(Notice) + Send) -> ClusterError {
        let (handle, config) = (self.handle, self.config);
        let mut pause = Duration::from_millis(100);
        let mut following = None;
        loop {
            match self.session(&mut notify, &mut following).await {
                End::Again => pause = Duration::from_millis(100),
                End::Trouble(what) => {
                    notify(Notice::Trouble { what });
                    if following != Some(None) {
                        handle.set_role(Role::NoLeader);
                        following = Some(None);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(config.election_ttl.max(Duration::from_millis(100)));
                }
                End::Fatal(e) => {
                    handle.set_role(Role::NoLeader);
                    return e;
                }
            }
        }
    }
}

/// `what`, or `End::Trouble` after `within`.
async fn bounded<T, E: Into<End>>(
    within: Duration,
    what: impl Future<Output = Result<T, E>>,
) -> Result<T, End> {
    match tokio::time::timeout(within, what).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(End::Trouble(format!(
            "etcd did not answer within {within:?}"
        ))),
    }
}

/// One node: its server, its configuration, its epochs, and the etcd
/// lease it campaigns under.
struct Node<'a> {
    handle: &'a ServerHandle,
    config: &'a ClusterConfig,
    epochs: &'a ClusterEpochs,
    /// The lease of the session under way, for a stop to revoke.
    lease: Mutex<Option<Campaign>>,
}

/// An etcd lease a node campaigns (and perhaps leads) under.
struct Campaign {
    client: Client,
    lease: i64,
    /// Whether the node has begun leading a term under it.
    leading: bool,
}

impl Node<'_> {
    /// One etcd lease: campaign under it while following, then lead while
    /// it lasts.
    async fn session(
        &self,
        notify: &mut (impl FnMut(Notice) + Send),
        following: &mut Option<Option<Endpoint>>,
    ) -> End {
        match self.lead_once(notify, following).await {
            Ok(()) => End::Again,
            Err(end) => end,
        }
    }

    async fn lead_once(
        &self,
        notify: &mut (impl FnMut(Notice) + Send),
        following: &mut Option<Option<Endpoint>>,
    ) -> Result<(), End> {
        let config = self.config;
        let patience = config.patience();
        let options = ConnectOptions::new().with_connect_timeout(patience);
        let connect = Client::connect(&config.endpoints, Some(options));
        let mut client = bounded(patience, connect).await?;
        let sent = Instant::now();
        let grant = bounded(patience, client.lease_grant(config.ttl_secs(), None)).await?;
        let lease = grant.id();
        *lock(&self.lease) = Some(Campaign {
            client: client.clone(),
            lease,
            leading: false,
        });
        let ttl = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(0));
        if ttl.is_zero() {
            return Err(End::Trouble("etcd granted a lease of 0 s".into()));
        }
        let (certain_tx, mut certain) = watch::channel(sent + ttl);
        let keeper = KeepAlive(tokio::spawn(keep_alive(
            client.clone(),
            lease,
            ttl,
            certain_tx,
        )));
        let every = ttl / 3;

        // Campaign, following whoever etcd names meanwhile.
        let won = {
            let mut campaigner = client.clone();
            let campaign = campaigner.campaign(config.election(), config.advertise.as_str(), lease);
            tokio::pin!(campaign);
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    won = &mut campaign => break won?.take_leader(),
                    _ = tick.tick() => self.follow(&mut client, notify, following, patience).await?,
                    lost = certain.changed() => if lost.is_err() {
                        self.revoke(&mut client, lease, patience).await;
                        return Ok(());
                    },
                }
            }
        };
        let Some(won) = won else {
            return Err(End::Trouble("etcd elected without a leader key".into()));
        };
        let leading = Leading {
            won: &won,
            every,
            patience,
        };
        let result = self.lead(&mut client, notify, &leading, &mut certain).await;
        *following = None;
        drop(keeper);
        let resign = ResignOptions::new().with_leader(won.clone());
        let _ = bounded(patience, client.resign(Some(resign))).await;
        self.revoke(&mut client, lease, patience).await;
        result
    }

    /// Revokes the session's lease (deleting its election key, if any),
    /// which a stop then need not do.
    async fn revoke(&self, client: &mut Client, lease: i64, patience: Duration) {
        revoke(client, lease, patience).await;
        *lock(&self.lease) = None;
    }

    /// The node won: the term, then leading while it is certain.
    async fn lead(
        &self,
        client: &mut Client,
        notify: &mut (impl FnMut(Notice) + Send),
        leading: &Leading<'_>,
        certain: &mut watch::Receiver<Instant>,
    ) -> Result<(), End> {
        let (config, handle) = (self.config, self.handle);
        let epoch_key = config.epoch_key();
        let got = bounded(leading.patience, client.get(epoch_key.as_str(), None)).await?;
        let (previous, revision) = match got.kvs().first() {
            Some(kv) => {
                let record = EpochRecord::decode(kv.value()).map_err(|source| {
                    End::Fatal(ClusterError::BadEpoch {
                        key: epoch_key.clone(),
                        source,
                    })
                })?;
                (Some(record), kv.mod_revision())
            }
            None => (None, 0),
        };
        let (term, record) = Term::next(previous.as_ref(), None, unix_now(), config.max_lease);
        let read = match previous {
            Some(_) => Expect::At(revision),
            None => Expect::Absent,
        };
        if !self.keep(client, leading, &record, read).await? {
            notify(Notice::SteppedDown {
                why: "the epoch could not be set while leading".into(),
            });
            return Ok(());
        }
        let grace = match &term {
            Term::Recovered { max_lease, .. } => {
                Some(max_lease.saturating_add(config.grace_margin))
            }
            _ => None,
        };
        let epoch = record.epoch;
        handle
            .begin_term(term)
            .await?
            .map_err(|e| End::Fatal(e.into()))?;
        if !handle.lead(*certain.borrow()).await? {
            notify(Notice::SteppedDown {
                why: "its leadership was no longer certain when the term began".into(),
            });
            return Ok(());
        }
        if let Some(campaign) = lock(&self.lease).as_mut() {
            campaign.leading = true;
        }
        notify(Notice::Leading { epoch, grace });
        let grace_over = grace.map(|g| Instant::now() + g);
        let mut tick = tokio::time::interval(leading.every);
        loop {
            let until = *certain.borrow();
            tokio::select! {
                lost = certain.changed() => {
                    if lost.is_err() {
                        handle.set_role(Role::NoLeader);
                        notify(Notice::SteppedDown { why: "etcd ended its lease".into() });
                        return Ok(());
                    }
                    let until = *certain.borrow();
                    if !handle.lead_until(until).await? {
                        notify(Notice::SteppedDown {
                            why: "its leadership ran out before it was renewed".into(),
                        });
                        return Ok(());
                    }
                }
                () = tokio::time::sleep_until(until.into()) => {
                    // The core stepped down by itself at that moment.
                    handle.set_role(Role::NoLeader);
                    notify(Notice::SteppedDown {
                        why: "its leadership was no longer certain".into(),
                    });
                    return Ok(());
                }
                () = sleep_until_opt(grace_over), if grace_over.is_some_and(|at| at > Instant::now()) => {
                    notify(Notice::GraceOver { epoch });
                }
                () = self.epochs.0.asked.notified() => {
                    self.next_epoch(client, leading, record.max_lease_ms, until).await?;
                }
                _ = tick.tick() => {
                    if let Some(next) = self.another_leads(client, leading).await {
                        handle.set_role(next.map_or(Role::NoLeader, |leader| Role::Follower { leader }));
                        notify(Notice::SteppedDown { why: "etcd names another leader".into() });
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Writes `record` as the cluster's epoch, in a transaction that holds
    /// only while the key the node won with leads and the record is as
    /// `read` says: whether it did.
    async fn keep(
        &self,
        client: &mut Client,
        leading: &Leading<'_>,
        record: &EpochRecord,
        read: Expect,
    ) -> Result<bool, End> {
        let epoch_key = self.config.epoch_key();
        let leads =
            Compare::create_revision(leading.won.key(), CompareOp::Equal, leading.won.rev());
        let mut when = vec![leads];
        match read {
            Expect::Absent => when.push(Compare::version(epoch_key.as_str(), CompareOp::Equal, 0)),
            Expect::At(revision) => when.push(Compare::mod_revision(
                epoch_key.as_str(),
                CompareOp::Equal,
                revision,
            )),
            Expect::Any => {}
        }
        let put = TxnOp::put(epoch_key.as_str(), record.encode(), None);
        let txn = Txn::new().when(when).and_then([put]);
        Ok(bounded(leading.patience, client.txn(txn))
            .await?
            .succeeded())
    }

    /// The server asked for the epoch after its current one: kept in etcd
    /// while the node leads, then handed over (the lead extension wakes
    /// the server task, which takes it).
    async fn next_epoch(
        &self,
        client: &mut Client,
        leading: &Leading<'_>,
        max_lease_ms: u64,
        until: Instant,
    ) -> Result<(), End> {
        let Some(after) = lock(&self.epochs.0.state).after else {
            return Ok(());
        };
        let record = EpochRecord {
            epoch: next_epoch(after, unix_now()),
            max_lease_ms,
        };
        // Only while leading; whoever wrote the record since the term
        // began is this leader, so its revision is not compared.
        if self.keep(client, leading, &record, Expect::Any).await? {
            lock(&self.epochs.0.state).kept = Some((after, record.epoch));
            self.handle.lead_until(until).await?;
        }
        Ok(())
    }

    /// `Some(leader)` if etcd names a key other than the one this node won
    /// with (the leader's address, or none that can be followed); `None`
    /// while it still names this node's, or cannot tell.
    async fn another_leads(
        &self,
        client: &mut Client,
        leading: &Leading<'_>,
    ) -> Option<Option<Endpoint>> {
        let answer = bounded(leading.patience, client.leader(self.config.election()));
        let response = answer.await.ok()?;
        let kv = response.kv()?;
        (kv.key() != leading.won.key()).then(|| leader_of(Some(kv.value()), self.config))
    }

    /// Asks etcd who leads, and gives the core the role that says so when
    /// it changed.
    async fn follow(
        &self,
        client: &mut Client,
        notify: &mut (impl FnMut(Notice) + Send),
        following: &mut Option<Option<Endpoint>>,
        patience: Duration,
    ) -> Result<(), End> {
        let leader = match bounded(patience, client.leader(self.config.election())).await {
            Ok(response) => leader_of(response.kv().map(|kv| kv.value()), self.config),
            // etcd answers an error when no key leads.
            Err(End::Trouble(what)) if what.contains("no leader") => None,
            Err(e) => return Err(e),
        };
        if following.as_ref() != Some(&leader) {
            self.handle.set_role(
                leader
                    .clone()
                    .map_or(Role::NoLeader, |leader| Role::Follower { leader }),
            );
            notify(Notice::Following {
                leader: leader.clone(),
            });
            *following = Some(leader);
        }
        Ok(())
    }
}

/// What the epoch record must be for a write of it to hold.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Absent: the cluster never had a term.
    Absent,
    /// As read, at this modification revision.
    At(i64),
    /// Anything (only the leadership is compared).
    Any,
}

/// What a leading node knows of its win.
struct Leading<'a> {
    /// The key it won with.
    won: &'a LeaderKey,
    /// A third of the TTL.
    every: Duration,
    /// How long an etcd request may take.
    patience: Duration,
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The leader an election value names, unless it is this node (an old key
/// of its own, still there) or not an address.
fn leader_of(value: Option<&[u8]>, config: &ClusterConfig) -> Option<Endpoint> {
    let addr = core::str::from_utf8(value?).ok()?;
    let leader = Endpoint::new(addr).ok()?;
    (leader != config.advertise).then_some(leader)
}

async fn revoke(client: &mut Client, lease: i64, patience: Duration) {
    let _ = bounded(patience, client.lease_revoke(lease)).await;
}

/// The keep-alive task, aborted when dropped.
struct KeepAlive(tokio::task::JoinHandle<()>);

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps `lease` alive every third of `ttl`, publishing after every
/// answered keep-alive its send time plus the TTL etcd answered: the end of
/// the certain leadership. Returns (dropping `certain`) when etcd says the
/// lease is gone, or does not answer within the TTL.
async fn keep_alive(
    mut client: Client,
    lease: i64,
    ttl: Duration,
    certain: watch::Sender<Instant>,
) {
    let extend = |sent: Instant, granted: Duration| {
        let until = sent + granted;
        certain.send_if_modified(|at| {
            let later = until > *at;
            if later {
                *at = until;
            }
            later
        });
    };
    let mut sent = Instant::now();
    // etcd-client sends the first keep-alive and reads its answer (a lease
    // of the TTL granted) before it hands the stream over.
    let Ok(Ok((mut keeper, mut stream))) =
        tokio::time::timeout(ttl, client.lease_keep_alive(lease)).await
    else {
        return;
    };
    extend(sent, ttl);
    loop {
        tokio::time::sleep_until((sent + ttl / 3).into()).await;
        sent = Instant::now();
        if keeper.keep_alive().await.is_err() {
            return;
        }
        match tokio::time::timeout(ttl, stream.message()).await {
            Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                let granted = Duration::from_secs(u64::try_from(answer.ttl()).unwrap_or(0));
                extend(sent, granted);
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_name_is_an_atom_without_a_slash() {
        for good in ["a", "a-leader", "locks.prod", "x".repeat(250).as_str()] {
            assert!(check_cluster_name(good).is_ok(), "{good:?}");
        }
        for bad in ["a/leader", "a/", "/", "", "a b", "é", &"x".repeat(251)] {
            let error = check_cluster_name(bad).expect_err(bad);
            assert!(error.to_string().contains(&format!("{bad:?}")), "{error}");
        }
    }
}
