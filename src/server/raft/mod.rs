//! A member of a replicated cluster (PROTOCOL.md 4.3), sans-IO: the server
//! core with a Raft node beside it (feature `raft`; the engine is raft-rs's
//! [`RawNode`], itself sans-IO).
//!
//! | part | owns | rule |
//! |---|---|---|
//! | [`Server`] | connections, the leader's table, answers held back | sections 4 and 4.3 "An answer waits" (`holdback.rs`) |
//! | `RawNode<LogStore>` | terms, votes, the log in memory | Raft itself |
//! | [`Replica::copy`] | the committed table, every lease counted from when this member applied it | 4.3 "Leases survive a leader change" |
//! | `Unapplied` | entries committed and not yet applied to the copy | when the copy catches up ([`Replica::defer_apply`]) |
//! | `Leadership` | whether this member serves, and since which entry | 4.3 "No recovery grace", "Who answers" |
//! | `Proposals` | the leader's turns not yet committed, by Raft index | 4.3 "What is replicated", one entry per turn |
//! | `Handover` | the member a leader is handing over to (`handover.rs`) | 4.4 "Leadership transfer" |
//! | `Roster`, `Membership` | every member's addresses, who was heard from lately (`membership.rs`) | 4.4 "Membership changes", "Adding", "Removing" |
//!
//! The driver contract is [`Server`]'s, plus the disk and the peers:
//!
//! ```text
//! loop {
//!     // inputs: clients (handle_accept/bytes/written/closed), peers
//!     // (handle_message), the disk (handle_persisted), the clock
//!     // (handle_timeout); then drain every output:
//!     while let Some(out) = replica.poll_output() {
//!         match out {
//!             Output::Client(action) => { /* send or close */ }
//!             Output::Persist(p) => { /* write and sync, in order; then */ replica.handle_persisted(now) }
//!             Output::Compact(snapshot) => { /* write it, drop the log before it */ }
//!             Output::Send(message) => { /* to message.to */ }
//!             Output::Event(e) => { /* `leading`, `following ADDR` */ }
//!             _ => {}
//!         }
//!     }
//!     // and sleep until replica.poll_timeout()
//! }
//! ```
//!
//! The inputs since the last `poll_output` are one turn of the leader's
//! loop: their decisions go into one Raft entry when `poll_output` is next
//! called. [`Persist`]s are handed out in order, and several may be under
//! way: the driver makes them durable in that order (it may fold those
//! waiting into one write and one sync) and says so once per `Persist`
//! with [`Replica::handle_persisted`]. What must follow one (its
//! messages, what it lets commit) waits for that.
//!
//! A driver that can send before it does more work may ask for the copy
//! to be brought up to date later ([`Replica::defer_apply`]): committed
//! entries then still release the leader's answers at once, but go into
//! the copy only at [`Replica::handle_deferred`], once what the turn said
//! is on its way. A follower's acknowledgement and a leader's answers no
//! longer wait for the copy.

mod backup;
mod handover;
mod identity;
mod membership;
mod operate;
mod parts;
mod screen;
mod snapshot;
mod store;

use core::num::NonZeroU128;
use core::time::Duration;
use std::collections::{BTreeMap, VecDeque};
use std::panic::AssertUnwindSafe;

use raft::prelude::{ConfState, Entry, EntryType, HardState, Message, MessageType, Snapshot};
use raft::{RawNode, StateRole};
use thiserror::Error;

pub use self::backup::{Backup, BackupError};
pub use self::handover::AdminRefusal;
use self::handover::Handover;
pub use self::identity::{ClusterId, ClusterIdError};
pub use self::membership::{MemberAddrs, PROMOTE_WITHIN};
use self::membership::{Membership, Roster};
pub use self::operate::{ClusterStatus, MemberStatus};
use self::parts::{Persists, Proposal, Proposals, Settled, Ticker};
pub use self::screen::Refusal;
use self::snapshot::SnapshotData;
use self::store::LogStore;
use super::{Action, AdminAccess, ConnId, Decision, LockTable, Role, Server};
use crate::names::Endpoint;
use crate::time::Time;

/// raft-rs counts time in ticks: an election timeout is this many.
pub const ELECTION_TICKS: usize = 10;
/// A leader's heartbeat, in ticks.
pub const HEARTBEAT_TICKS: usize = 2;

/// How a member takes part in its cluster.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplicaConfig {
    /// This member's Raft id (not 0).
    pub id: u64,
    /// Every member, itself included: its Raft id and the address its
    /// clients reach it at (what `M` names).
    pub members: BTreeMap<u64, Endpoint>,
    /// The least time a follower waits without hearing from a leader
    /// before it stands for election: [`ELECTION_TICKS`] ticks.
    pub election_timeout: Duration,
    /// The election timeout, in ticks, pinned (at least
    /// [`ELECTION_TICKS`]): raft-rs then draws nothing, which a
    /// deterministic simulation needs. `None`: raft-rs draws each one
    /// between one and two election timeouts.
    pub pinned_election_ticks: Option<usize>,
    /// Entries applied between two snapshots of the table, which the log
    /// is then compacted behind.
    pub snapshot_every: u64,
    /// The most entries the leader has proposed and not seen committed;
    /// decisions made meanwhile wait for the next entry. Fewer, larger
    /// entries under load (less to send, write and sync per decision); a
    /// quiet leader proposes at once.
    pub max_in_flight: usize,
    /// The wall clock (milliseconds since 1970) at the `now` the replica
    /// is made at: a first leader's floor for tokens ([`Decision::Floor`]).
    pub wall_ms: u64,
    /// It lost its state directory and starts empty (a simulated fault; a
    /// real member refuses to start so): it votes for nobody until a
    /// leader has sent it the log, since it may have voted in this term
    /// before. This narrows, not closes, the gap a lost vote opens.
    pub rejoining: bool,
    /// Random bits from the driver: the cluster's identity
    /// ([`ClusterId`]) if this member is the first leader of a cluster
    /// that has none (0 is taken as 1). The core draws nothing itself.
    pub draw: u128,
    /// Who may open an administrative connection on its client address
    /// (PROTOCOL.md 4.4, "Who may ask"; `operate.rs`); `None`: nobody.
    pub admin: Option<AdminAccess>,
    /// Every member's peer address, where known: what its status says,
    /// and what a member added with it carries.
    pub peers: BTreeMap<u64, Endpoint>,
    /// A new cluster begins from this backup (PROTOCOL.md 4.4, "Backup
    /// and restore"; `backup.rs`): give every member of it the same one.
    /// Refused on a member whose state is not a new cluster's.
    pub restore: Option<Backup>,
}

impl ReplicaConfig {
    /// A member `id` of `members`, with raft-rs's random election waits,
    /// a snapshot every 10,000 entries.
    pub fn new(
        id: u64,
        members: BTreeMap<u64, Endpoint>,
        election_timeout: Duration,
        wall_ms: u64,
    ) -> ReplicaConfig {
        ReplicaConfig {
            id,
            members,
            election_timeout,
            pinned_election_ticks: None,
            snapshot_every: 10_000,
            max_in_flight: 2,
            wall_ms,
            rejoining: false,
            draw: 1,
            admin: None,
            peers: BTreeMap::new(),
            restore: None,
        }
    }
}

/// Why a replica cannot be made.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The id is 0 or not among the members, or the members' ids are not
    /// the voters the state holds.
    #[error("member {id}: {why}")]
    Members {
        /// This member's id.
        id: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// raft-rs refused its configuration or state.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The snapshot held is not a table image.
    #[error("the snapshot in the state directory is not a table image")]
    Snapshot,
    /// A backup to restore was given to a member whose state is not a new
    /// cluster's.
    #[error("a backup is restored only by the members of a new cluster, on their first start")]
    RestoreIntoExisting,
    /// The election timeout is shorter than a tick of a millisecond.
    #[error("the election timeout must be at least {ELECTION_TICKS} ms")]
    ElectionTimeout,
    /// The state directory recorded one cluster's identity, and its
    /// snapshot holds another's.
    #[error(
        "the state directory is cluster {recorded}'s, but its snapshot is cluster {committed}'s"
    )]
    OtherCluster {
        /// The identity recorded.
        recorded: ClusterId,
        /// The identity in the snapshot.
        committed: ClusterId,
    },
}

/// What a member's state directory held at start (its driver reads it).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Restored {
    /// The latest hard state (term, vote, commit).
    pub hard_state: HardState,
    /// The voters.
    pub conf_state: ConfState,
    /// The latest snapshot, if any.
    pub snapshot: Option<Snapshot>,
    /// Every entry after it.
    pub entries: Vec<Entry>,
    /// The cluster's identity, once this member recorded it.
    pub cluster: Option<ClusterId>,
}

impl Restored {
    /// The state of a member of a new cluster of `voters`.
    pub fn new_cluster(voters: impl IntoIterator<Item = u64>) -> Restored {
        Restored {
            conf_state: ConfState {
                voters: voters.into_iter().collect(),
                ..ConfState::default()
            },
            ..Restored::default()
        }
    }
}

/// A member's durable state kept in memory: what a driver's disk must do
/// with each [`Persist`] and [`Output::Compact`], for simulations and
/// tests (the real one is `ticketing::raft::RaftDisk`). Losing it is a crash
/// with disk loss.
#[derive(Debug, Default)]
pub struct MemoryDisk {
    log: LogStore,
    cluster: Option<ClusterId>,
}

impl MemoryDisk {
    /// A new cluster member's disk.
    pub fn new(restored: Restored) -> MemoryDisk {
        MemoryDisk {
            log: LogStore::restored(
                restored.hard_state,
                restored.conf_state,
                restored.snapshot,
                restored.entries,
            ),
            cluster: restored.cluster,
        }
    }

    /// Makes `p` durable.
    pub fn persist(&mut self, p: &Persist) {
        if let Some(snapshot) = &p.snapshot {
            self.log.install(snapshot.clone());
        }
        self.log.append(&p.entries);
        if let Some(hs) = &p.hard_state {
            self.log.set_hard_state(hs.clone());
        }
        if p.cluster.is_some() {
            self.cluster = p.cluster;
        }
    }

    /// Keeps `snapshot` and drops the log before it.
    pub fn compact(&mut self, snapshot: &Snapshot) {
        self.log.install(snapshot.clone());
    }

    /// What a start reads back.
    pub fn restored(&self) -> Restored {
        Restored {
            cluster: self.cluster,
            ..self.log.to_restored()
        }
    }

    /// How many entries it holds after its snapshot.
    pub fn entries(&self) -> u64 {
        let (first, last) = (self.log.first(), self.log.last());
        (last + 1).saturating_sub(first)
    }
}

/// State to make durable before the node goes on: one write and one sync
/// (group commit). Then [`Replica::handle_persisted`].
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Persist {
    /// The new hard state, if it changed.
    pub hard_state: Option<HardState>,
    /// Entries to append; the first replaces the entry at its index and
    /// every one after it.
    pub entries: Vec<Entry>,
    /// A leader's snapshot: it replaces the log up to its index.
    pub snapshot: Option<Snapshot>,
    /// The cluster's identity, which this member has just learnt (applied
    /// from the log, or read in a snapshot): recorded beside its Raft id.
    pub cluster: Option<ClusterId>,
}

impl Persist {
    fn is_empty(&self) -> bool {
        self.hard_state.is_none()
            && self.entries.is_empty()
            && self.snapshot.is_none()
            && self.cluster.is_none()
    }
}

/// What a member tells its operator.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplicaEvent {
    /// This member leads `term`: the first entry of its term is committed
    /// (at `index`), and it grants from now on.
    Leading {
        /// The Raft term.
        term: u64,
        /// The first entry of the term.
        index: u64,
    },
    /// Another member leads; its clients' address, if known.
    Following {
        /// The Raft term.
        term: u64,
        /// The leader's client address (`M`), if one is known.
        leader: Option<Endpoint>,
    },
    /// The members' peer addresses, as the configuration has them: at
    /// start, and after each change (PROTOCOL.md 4.4). The driver links to
    /// these members, and lets only them in.
    Members {
        /// Every member whose peer address is known, this one's included.
        peers: BTreeMap<u64, Endpoint>,
        /// The applied index the configuration is as of: what the driver
        /// may tell a peer that is not in it
        /// ([`Replica::handle_not_member`]).
        index: u64,
    },
    /// This member was removed from the configuration (PROTOCOL.md 4.4,
    /// "Removing"): it stops serving for good, and its driver should record
    /// it, so that it refuses to start again from its state directory.
    Removed,
    /// Member `by` answered this member's peer hello that it is not in
    /// its configuration as of entry `index`, which this member takes as
    /// its removal ([`Replica::handle_not_member`]): [`ReplicaEvent::Removed`]
    /// follows.
    ToldRemoved {
        /// The member that said so.
        by: u64,
        /// The applied index its configuration is as of.
        index: u64,
    },
    /// A committed entry could not be read: this member stops serving.
    BadEntry {
        /// Its index.
        index: u64,
    },
    /// This member knows its cluster's identity (from its state
    /// directory, a snapshot, or the entry that committed it): its peer
    /// links carry it from now on, and refuse a peer of another cluster.
    Cluster {
        /// The identity.
        id: ClusterId,
    },
    /// raft-rs panicked stepping a message from member `peer`, which the
    /// screen let through: this member stops for good, its Raft engine
    /// never touched again (nothing is made durable past what already
    /// was), and its driver should exit with an error naming the peer.
    Failed {
        /// The member whose message it was.
        peer: u64,
    },
    /// This member was given a backup to restore (`backup.rs`), and the
    /// cluster's first leader restored another one, or none: it stops
    /// serving.
    RestoreDiffers {
        /// The applied index of this member's backup.
        index: u64,
        /// How many grants it holds.
        grants: u64,
        /// The index and number of grants of the backup the cluster
        /// restored; `None`: it restored none.
        committed: Option<(u64, u64)>,
    },
    /// The log committed another cluster's identity than the one this
    /// member recorded: it stops serving.
    OtherCluster {
        /// The identity it recorded.
        recorded: ClusterId,
        /// The identity the log holds.
        committed: ClusterId,
    },
}

/// What a member made of its peers' messages ([`Replica::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaStats {
    /// Messages refused and dropped, never stepped into Raft: not from a
    /// member, or not what a member sends, or what raft-rs would fail on
    /// in this member's state (PROTOCOL.md 4.3, "Peers are authenticated,
    /// always"). Members' own messages, however late or reordered, are not
    /// refused, but for a leadership transfer's timeout-now that comes
    /// while a snapshot is being made durable, which raft-rs cannot take.
    pub refused: u64,
    /// Why the latest one was.
    pub last_refusal: Option<Refusal>,
}

/// One thing for the driver to do.
#[derive(Debug)]
#[non_exhaustive]
pub enum Output {
    /// A client connection's bytes or close.
    Client(Action),
    /// Make this durable, then call [`Replica::handle_persisted`].
    Persist(Persist),
    /// This member's snapshot of its table: write it, and the log before
    /// its index may go.
    Compact(Snapshot),
    /// A Raft message for member `to`.
    Send(Message),
    /// For the operator.
    Event(ReplicaEvent),
}

/// Whether this member serves clients, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leadership {
    /// It does not lead, and follows Raft's leader (0: none known).
    Following {
        leader: u64,
        /// Whether it votes: a learner serves no client.
        voting: bool,
    },
    /// It stopped leading; who leads is still to be said.
    SteppedDown,
    /// Raft elected it; it serves once `index`, its term's first entry,
    /// is committed and applied.
    Elected { term: u64, index: u64 },
    /// It serves.
    Serving { term: u64 },
    /// A committed entry could not be read, or the log is another
    /// cluster's: it never serves again.
    Stopped,
    /// raft-rs panicked: the engine is never touched again, whatever its
    /// state.
    Failed,
}

/// One committed entry not yet applied to the copy.
#[derive(Debug)]
enum Committed {
    /// This leader's own: the decisions it proposed.
    Own {
        index: u64,
        decisions: Vec<Decision>,
    },
    /// Another leader's, still to be read.
    Read(Entry),
}

impl Committed {
    fn index(&self) -> u64 {
        match self {
            Committed::Own { index, .. } => *index,
            Committed::Read(entry) => entry.index,
        }
    }
}

/// Entries committed and not yet in the copy, in order: empty after every
/// turn unless the driver defers them ([`Replica::defer_apply`]).
#[derive(Debug, Default)]
struct Unapplied {
    entries: VecDeque<Committed>,
    /// The driver brings the copy up to date itself.
    deferred: bool,
}

/// A member of a replicated cluster: see the module's documentation.
pub struct Replica {
    server: Server,
    node: RawNode<LogStore>,
    /// The committed table, as this member applied it.
    copy: LockTable,
    /// The cluster's floor for tokens (0 until the first leader set it).
    floor: u64,
    /// Every member's addresses (`membership.rs`).
    roster: Roster,
    /// Who was heard from lately, and whether this member was ever in its
    /// configuration (`membership.rs`).
    membership: Membership,
    /// A learner was added: the log is compacted at once, so that it is
    /// sent a snapshot (`membership.rs`).
    compact_now: bool,
    leadership: Leadership,
    /// The leader's entries not yet committed.
    proposals: Proposals,
    unapplied: Unapplied,
    /// The member this leader is handing over to.
    handover: Option<Handover>,
    /// A floor this leader decided and has still to propose.
    floor_to_propose: Option<u64>,
    /// An identity this leader drew and has still to propose.
    cluster_to_propose: Option<NonZeroU128>,
    /// The backup this member was given to restore, until the cluster's
    /// first floor is applied (`backup.rs`).
    restore: Option<Backup>,
    /// The marker of a restore this leader has still to propose.
    restore_to_propose: Option<Decision>,
    /// The index applied to `copy`.
    applied: u64,
    snapshot_every: u64,
    rejoining: bool,
    /// When raft-rs's ticks are due.
    ticker: Ticker,
    /// What the driver is making durable, in order.
    persists: Persists,
    /// The cluster's identity, once known: committed in the log, and
    /// recorded by this member.
    cluster: Option<ClusterId>,
    /// The driver's random bits, for an identity if this member is the
    /// first leader of a cluster that has none.
    draw: u128,
    /// Inputs came since the last turn.
    dirty: bool,
    /// The peer messages it refused.
    stats: ReplicaStats,
    outputs: VecDeque<Output>,
    start: Time,
    wall_ms: u64,
    now: Time,
}

impl Replica {
    /// A member, with `server` (its configuration: limits, credential,
    /// window) and what its state directory held.
    pub fn new(
        config: ReplicaConfig,
        mut server: Server,
        restored: Restored,
        now: Time,
    ) -> Result<Replica, ReplicaError> {
        let id = config.id;
        if id == 0 || !config.members.contains_key(&id) {
            return Err(ReplicaError::Members {
                id,
                why: "the id must be one of the members' and not 0",
            });
        }
        // A state with no configuration is a member's that joins a running
        // cluster (PROTOCOL.md 4.4, "Adding"; its driver started it so, on
        // an empty directory): it serves no client until it votes, and
        // learns the configuration from the leader's snapshot.
        let empty = restored.snapshot.is_none()
            && restored.entries.is_empty()
            && restored.conf_state == ConfState::default();
        let tick = config.election_timeout / ELECTION_TICKS as u32;
        if tick < Duration::from_millis(1) {
            return Err(ReplicaError::ElectionTimeout);
        }
        // raft-rs draws each timeout in [min, max): one apart, no draw.
        let (min, max) = match config.pinned_election_ticks {
            Some(t) => {
                let t = t.max(ELECTION_TICKS + 1);
                (t, t + 1)
            }
            None => (ELECTION_TICKS, 2 * ELECTION_TICKS),
        };
        let snapshot_index = restored
            .snapshot
            .as_ref()
            .and_then(|s| s.metadata.as_ref())
            .map_or(0, |m| m.index);
        let (copy, floor, in_snapshot, durable) = match &restored.snapshot {
            Some(s) if !s.data.is_empty() => {
                table_of(&server, now, &s.data).ok_or(ReplicaError::Snapshot)?
            }
            _ => (server.lock_table().successor(), 0, None, Roster::default()),
        };
        // The addresses the configuration carried win over those given.
        let mut roster = Roster::given(config.members, &config.peers);
        roster.adopt(&durable);
        if !empty {
            // Members given that the configuration no longer has are not
            // linked to; those added after the snapshot come back as the
            // log is replayed, with their addresses.
            roster.keep(&restored.conf_state);
        }
        let new_cluster = restored.snapshot.is_none()
            && restored.entries.is_empty()
            && restored.hard_state.commit == 0;
        if config.restore.is_some() && (empty || !new_cluster) {
            return Err(ReplicaError::RestoreIntoExisting);
        }
        let seen_self = membership::in_conf(&restored.conf_state, id);
        // A learner, or a member that joins, serves no client until it
        // votes (PROTOCOL.md 4.4, "Adding").
        let voting = membership::votes(&restored.conf_state, id);
        let cluster = match (restored.cluster, in_snapshot) {
            (Some(recorded), Some(committed)) if recorded != committed => {
                return Err(ReplicaError::OtherCluster {
                    recorded,
                    committed,
                })
            }
            (recorded, committed) => recorded.or(committed),
        };
        let store = LogStore::restored(
            restored.hard_state,
            restored.conf_state,
            restored.snapshot,
            restored.entries,
        );
        let raft_config = engine_config(id, (min, max), snapshot_index);
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&raft_config, store, &logger)?;
        server.replicate();
        server.set_role(
            now,
            if voting {
                Role::NoLeader
            } else {
                Role::NotActive
            },
        );
        if let Some(access) = &config.admin {
            server.open_admin(id, access);
        }
        let mut outputs = VecDeque::new();
        if let Some(id) = cluster {
            outputs.push_back(Output::Event(ReplicaEvent::Cluster { id }));
        }
        let mut replica = Replica {
            server,
            node,
            copy,
            floor,
            roster,
            membership: Membership::new(seen_self),
            compact_now: false,
            leadership: Leadership::Following { leader: 0, voting },
            proposals: Proposals::new(config.max_in_flight),
            unapplied: Unapplied::default(),
            handover: None,
            floor_to_propose: None,
            cluster_to_propose: None,
            restore: config.restore,
            restore_to_propose: None,
            applied: snapshot_index,
            snapshot_every: config.snapshot_every.max(1),
            rejoining: config.rejoining,
            ticker: Ticker::new(tick, now, max),
            persists: Persists::default(),
            cluster,
            draw: config.draw.max(1),
            dirty: true,
            stats: ReplicaStats::default(),
            outputs,
            start: now,
            wall_ms: config.wall_ms,
            now,
        };
        if restored.cluster.is_none() && cluster.is_some() {
            // Read in the snapshot only: recorded from now on.
            replica.record_cluster();
        }
        replica.tell_members();
        Ok(replica)
    }

    // ----- inputs -----------------------------------------------------------

    /// A client connection was accepted ([`Server::handle_accept`]).
    pub fn handle_accept(&mut self, now: Time) -> ConnId {
        self.input(now);
        self.server.handle_accept(now)
    }

    /// Bytes from a client ([`Server::handle_bytes`]).
    pub fn handle_bytes(&mut self, now: Time, conn: ConnId, data: &[u8]) {
        self.input(now);
        self.server.handle_bytes(now, conn, data);
    }

    /// A client connection closed ([`Server::handle_closed`]).
    pub fn handle_closed(&mut self, now: Time, conn: ConnId) {
        self.input(now);
        self.server.handle_closed(now, conn);
    }

    /// Bytes written to a client ([`Server::handle_written`]).
    pub fn handle_written(&mut self, now: Time, conn: ConnId, n: usize) {
        self.input(now);
        self.server.handle_written(now, conn, n);
    }

    /// A Raft message from a peer, already authenticated as coming from
    /// the member it names. One that is not what a member sends, or that
    /// raft-rs would fail on, is dropped and counted ([`ReplicaStats`]);
    /// one Raft refuses is dropped (Raft resends).
    pub fn handle_message(&mut self, now: Time, message: Message) {
        if !self.input(now) {
            return;
        }
        let admitted = if self.roster.contains(message.from) {
            screen::admit(message, &self.node.raft, self.cluster)
        } else {
            Err(Refusal::NotAMember)
        };
        let message = match admitted {
            Ok(message) => message,
            Err(why) => {
                self.stats.refused = self.stats.refused.saturating_add(1);
                self.stats.last_refusal = Some(why);
                if let (Refusal::OtherCluster(committed), Some(recorded)) = (why, self.cluster) {
                    // Its directory is another cluster's than its peers'.
                    self.stop(ReplicaEvent::OtherCluster {
                        recorded,
                        committed,
                    });
                }
                return;
            }
        };
        self.membership.heard_from(message.from, self.now);
        let kind = message.msg_type;
        if self.rejoining
            && self.node.store().last() == 0
            && (kind == MessageType::MsgRequestVote as i32
                || kind == MessageType::MsgRequestPreVote as i32)
        {
            // It may have voted in this term before it lost its disk.
            return;
        }
        self.step(message);
    }

    /// Steps a screened message into raft-rs. Should raft-rs panic all the
    /// same, the member stops for good: never go on from the state a panic
    /// left, so nothing more is asked of the engine, and nothing more made
    /// durable.
    fn step(&mut self, message: Message) {
        let peer = message.from;
        let node = &mut self.node;
        let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| node.step(message)));
        if stepped.is_err() {
            self.stop(ReplicaEvent::Failed { peer });
            self.leadership = Leadership::Failed;
        }
    }

    /// Hands the leadership over (PROTOCOL.md 4.4, "Leadership
    /// transfer") to member `to`, or, when `None`, to the voter most
    /// caught up among those it heard from lately; the member chosen. It
    /// proposes nothing until the transfer ends: when the member chosen
    /// leads, this one's clients are sent `M <its address>` and closed;
    /// if it does not within an election timeout, raft-rs gives up and
    /// this member goes on leading. Asked of a member that does not serve
    /// as leader, or about a member that is not a voter, it is refused;
    /// asked to hand over to itself, it does nothing.
    pub fn transfer_leadership(&mut self, now: Time, to: Option<u64>) -> Result<u64, AdminRefusal> {
        self.input(now);
        let me = self.node.raft.id;
        if !self.is_serving() {
            return Err(self.not_leader());
        }
        let to = Handover::choose(self.node.raft.prs(), me, to)?;
        if to != me {
            self.begin_handover(to);
        }
        Ok(to)
    }

    /// Asks raft-rs to hand the leadership to `to`, and remembers it
    /// (`handover.rs`).
    fn begin_handover(&mut self, to: u64) {
        self.handover = Some(Handover { to });
        self.node.transfer_leader(to);
    }

    /// The refusal of an operator's request by a member that does not
    /// serve as leader: with the leader it knows, if another.
    fn not_leader(&self) -> AdminRefusal {
        let raft = &self.node.raft;
        let leader = raft.leader_id;
        AdminRefusal::NotLeader {
            leader: (leader != 0 && leader != raft.id).then_some(leader),
        }
    }

    /// The oldest [`Persist`] handed out and not yet said durable is
    /// durable (they are made durable in the order they were handed out).
    pub fn handle_persisted(&mut self, now: Time) {
        if !self.input(now) {
            return;
        }
        let mut persists = core::mem::take(&mut self.persists);
        let durable = persists.durable(|messages| self.send(messages));
        self.persists = persists;
        if let Some(number) = durable {
            self.node.on_persist_ready(number);
            self.mark_applied();
        }
    }

    /// Tells raft-rs how far the table is applied, as far as it may know
    /// it: a snapshot is applied at once, but counts once it is durable.
    fn mark_applied(&mut self) {
        let log = &self.node.raft.raft_log;
        let to = self.applied.min(log.persisted).min(log.committed);
        if to > log.applied {
            self.node.advance_apply_to(to);
        }
    }

    /// Time passed: Raft's ticks, and the server's timers. The copy
    /// catches up too, so that it never trails by more than a tick.
    pub fn handle_timeout(&mut self, now: Time) {
        self.input(now);
        self.catch_up();
        self.server.handle_timeout(now);
    }

    /// Has the copy trail what is committed until
    /// [`Replica::handle_deferred`] (or the next [`Replica::handle_timeout`]),
    /// instead of applying each entry in the turn that commits it: for a
    /// driver that can send what a turn said (a follower's
    /// acknowledgement, a leader's answers) before it applies, and then
    /// calls [`Replica::handle_deferred`]. Leases in the copy count from
    /// that call, never earlier than from the commit, so a later leader
    /// holds them at least as long.
    pub fn defer_apply(&mut self) {
        self.unapplied.deferred = true;
    }

    /// Whether the copy trails what is committed: the driver calls
    /// [`Replica::handle_deferred`] once what it was told to send is on
    /// its way.
    pub fn has_deferred(&self) -> bool {
        !self.unapplied.entries.is_empty()
    }

    /// Brings the copy up to what is committed.
    pub fn handle_deferred(&mut self, now: Time) {
        self.input(now);
        self.catch_up();
    }

    /// An input at `now`: the clock, and raft-rs's ticks; whether the
    /// engine may be used (not after it panicked).
    fn input(&mut self, now: Time) -> bool {
        self.now = self.now.max(now);
        self.dirty = true;
        if self.is_inert() {
            return false;
        }
        // While the log starts past what raft-rs counts applied (a
        // snapshot installed and not yet durable, or this member's own
        // taken ahead of it), an election would read entries the snapshot
        // replaced (`hup`, which `fatal!`s): its ticks wait.
        let holding = self.node.raft.raft_log.applied + 1 < self.node.store().first();
        for _ in 0..self.ticker.due(self.now, holding) {
            self.node.tick();
        }
        true
    }

    // ----- outputs ----------------------------------------------------------

    /// The next thing to do, ending the turn first: this turn's decisions
    /// go into one entry.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        if self.dirty {
            self.dirty = false;
            self.turn();
        }
        loop {
            if let Some(out) = self.outputs.pop_front() {
                return Some(out);
            }
            match self.server.poll_action()? {
                Action::NeedEpoch { .. } => {
                    // A turn granted 2^22 - 1 times: its entry is full.
                    self.propose_turn(true);
                    let epoch = self.entry_epoch();
                    let _ = self.server.begin_epoch(self.now, epoch);
                    self.dirty = true;
                }
                action => return Some(Output::Client(action)),
            }
        }
    }

    /// When [`Replica::handle_timeout`] is next due.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.dirty || !self.outputs.is_empty() {
            return Some(self.now);
        }
        let server = self.server.poll_timeout();
        if self.is_inert() {
            // Its engine ticks no more: only its clients' timers.
            return server;
        }
        let tick = self.ticker.next();
        Some(server.map_or(tick, |at| at.min(tick)))
    }

    // ----- introspection ----------------------------------------------------

    /// The server core (its table is the leader's, with decisions not yet
    /// committed).
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// The server core, for good (the member stops).
    pub fn into_server(self) -> Server {
        self.server
    }

    /// The committed table as this member applied it (it may trail what is
    /// committed until [`Replica::handle_deferred`], see
    /// [`Replica::defer_apply`]).
    pub fn copy(&self) -> &LockTable {
        &self.copy
    }

    /// Whether this member serves clients (it leads, and its term's first
    /// entry is committed).
    pub fn is_serving(&self) -> bool {
        matches!(self.leadership, Leadership::Serving { .. })
    }

    /// Whether this member is Raft's leader (serving clients, or about to
    /// once its term's first entry is committed).
    pub fn leads(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    /// The member this leader is handing its leadership over to, while
    /// it does ([`Replica::transfer_leadership`]).
    pub fn handing_over(&self) -> Option<u64> {
        self.handover.map(|h| h.to)
    }

    /// The latest time an input came with.
    pub fn now(&self) -> Time {
        self.now
    }

    /// The Raft term.
    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// The leader this member knows of (0: none).
    pub fn leader_id(&self) -> u64 {
        self.node.raft.leader_id
    }

    /// The index applied to the table.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The index committed, as this member knows it.
    pub fn committed(&self) -> u64 {
        self.node.raft.raft_log.committed
    }

    /// The first and last index in its log.
    pub fn log_span(&self) -> (u64, u64) {
        let store = self.node.store();
        (store.first(), store.last())
    }

    /// The cluster's floor for tokens (0 until the first leader set it).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// The cluster's identity, once this member knows it.
    pub fn cluster(&self) -> Option<ClusterId> {
        self.cluster
    }

    /// What it made of its peers' messages: how many it refused, and why
    /// the latest.
    pub fn stats(&self) -> ReplicaStats {
        self.stats
    }

    // ----- a turn -----------------------------------------------------------

    fn turn(&mut self) {
        if self.leadership == Leadership::Failed {
            return;
        }
        self.answer_operators();
        if self.is_inert() {
            return;
        }
        self.drive_membership();
        // Raft's output may commit entries, which may move leadership, make
        // answers go and make room for the next entry: until it has
        // nothing more to say.
        for _ in 0..8 {
            let waiting = self.proposals.len();
            self.propose_turn(false);
            self.ready();
            let before = self.leadership;
            self.follow_raft();
            let moved = self.proposals.len() < waiting && self.server_has_decisions();
            if before == self.leadership && !self.node.has_ready() && !moved {
                break;
            }
        }
    }

    /// Whether the server made decisions not yet proposed.
    fn server_has_decisions(&self) -> bool {
        self.server.lock_table().has_journal()
    }

    /// The tokens of the next entry: `(floor + its index) * 2^22 + n`.
    fn entry_epoch(&self) -> u64 {
        self.floor
            .saturating_add(self.node.raft.raft_log.last_index())
            .saturating_add(1)
    }

    /// Proposes the decisions made since the last entry as one entry,
    /// unless [`ReplicaConfig::max_in_flight`] entries wait for their
    /// commit (`force`: even then, when the entry's tokens ran out).
    fn propose_turn(&mut self, force: bool) {
        let Leadership::Serving { term } = self.leadership else {
            return;
        };
        if !force && self.proposals.is_full() {
            return;
        }
        if self.node.raft.state != StateRole::Leader || self.node.raft.term != term {
            // Its leadership ended since the last turn: what it decided
            // meanwhile rests on a table that may hold what was never
            // committed, and must not be proposed in another term.
            let role = self.role_after_leading();
            self.step_down(role);
            return;
        }
        if self.node.raft.lead_transferee.is_some() {
            // raft-rs would drop the entry: the decisions wait for the
            // transfer's end (`handover.rs`).
            return;
        }
        let restored = self.restore_to_propose.take();
        let floor = self.floor_to_propose.take();
        let cluster = self.cluster_to_propose.take();
        let decisions = self.server.take_decisions();
        if floor.is_none() && cluster.is_none() && decisions.is_none() {
            return;
        }
        let (turn, mut decisions) = decisions.unwrap_or((0, Vec::new()));
        // A restore's marker goes before the floor, which members given a
        // backup check it came with (`backup.rs`).
        let first = restored
            .into_iter()
            .chain(floor.map(|epoch| Decision::Floor { epoch }))
            .chain(cluster.map(|id| Decision::Cluster { id }));
        decisions.splice(0..0, first);
        let index = self.node.raft.raft_log.last_index() + 1;
        let data = Decision::encode_entry(&decisions);
        let proposed = self.node.propose(Vec::new(), data).is_ok()
            && self.node.raft.raft_log.last_index() == index;
        if !proposed {
            // Raft no longer takes this leader's entries: nothing of this
            // turn may be said.
            self.step_down(Role::NoLeader);
            return;
        }
        self.proposals.push(Proposal {
            turn,
            index,
            term,
            decisions,
        });
        self.server.set_entry_epoch(self.entry_epoch());
    }

    /// Hands messages out. A snapshot counts as delivered as soon as it is
    /// handed out: if it is lost, the follower's next answer says where
    /// its log ends, and the leader probes from there (raft-rs would
    /// otherwise wait for a report for ever, and a follower that lost its
    /// disk would never catch up).
    fn send(&mut self, messages: Vec<Message>) {
        for m in messages {
            if m.msg_type == MessageType::MsgSnapshot as i32 {
                self.node
                    .report_snapshot(m.to, raft::SnapshotStatus::Finish);
            }
            self.outputs.push_back(Output::Send(m));
        }
    }

    /// Takes raft-rs's Ready: what it says to send goes now, what it
    /// commits is applied, what it appends is handed out to be made
    /// durable (several may be under way; the driver may write them in
    /// one go), and the messages that must wait for that wait.
    fn ready(&mut self) {
        if !self.node.has_ready() {
            return;
        }
        let mut ready = self.node.ready();
        self.send(ready.take_messages());
        let mut persist = Persist::default();
        if !ready.snapshot().is_empty() {
            let snapshot = ready.snapshot().clone();
            self.install(&snapshot);
            self.node.mut_store().install(snapshot.clone());
            persist.snapshot = Some(snapshot);
        }
        let committed = ready.take_committed_entries();
        self.book(committed);
        if !ready.entries().is_empty() {
            self.node.mut_store().append(ready.entries());
            persist.entries = ready.take_entries();
        }
        if let Some(hs) = ready.hs() {
            self.node.mut_store().set_hard_state(hs.clone());
            persist.hard_state = Some(hs.clone());
        }
        let after = ready.take_persisted_messages();
        let number = ready.number();
        self.node.advance_append_async(ready);
        self.mark_applied();
        if persist.is_empty() && self.persists.is_empty() {
            self.node.on_persist_ready(number);
            self.send(after);
            return;
        }
        // Nothing to write, but behind a write under way: durable when
        // that one is.
        let wrote = !persist.is_empty();
        self.persists.push_ready(number, after, wrote);
        if wrote {
            self.outputs.push_back(Output::Persist(persist));
        }
    }

    /// Hands out the cluster's identity to be recorded beside this
    /// member's Raft id, in order with what it makes durable.
    fn record_cluster(&mut self) {
        self.persists.push_record();
        self.outputs.push_back(Output::Persist(Persist {
            cluster: self.cluster,
            ..Persist::default()
        }));
    }

    /// The cluster's identity, committed in the log (or in a snapshot):
    /// learnt, recorded and told, unless another was recorded, which stops
    /// this member.
    fn learn_cluster(&mut self, id: ClusterId) {
        match self.cluster {
            Some(known) if known == id => {}
            Some(recorded) => self.stop(ReplicaEvent::OtherCluster {
                recorded,
                committed: id,
            }),
            None => {
                self.cluster = Some(id);
                self.record_cluster();
                self.outputs
                    .push_back(Output::Event(ReplicaEvent::Cluster { id }));
            }
        }
    }

    /// Whether it stopped for good, or failed: its engine is never ticked
    /// or stepped again (one removed while it led would fail on the next
    /// answer it counted, its own progress gone); its clients are still
    /// answered (`E not_active`).
    fn is_inert(&self) -> bool {
        matches!(self.leadership, Leadership::Failed | Leadership::Stopped)
    }

    /// Stops serving for good, saying why.
    fn stop(&mut self, why: ReplicaEvent) {
        self.unapplied.entries.clear();
        self.step_down(Role::NotActive);
        self.leadership = Leadership::Stopped;
        self.outputs.push_back(Output::Event(why));
    }

    /// Books committed entries: the leader's answers that waited for them
    /// go, and they wait in [`Unapplied`] for the copy, which takes them
    /// at once unless the driver defers it.
    fn book(&mut self, entries: Vec<Entry>) {
        for entry in entries {
            if entry.index <= self.booked() {
                continue;
            }
            let (index, term) = (entry.index, entry.term);
            let committed = match self.proposals.take_decisions(index, term) {
                Some(decisions) => Committed::Own { index, decisions },
                None => Committed::Read(entry),
            };
            self.unapplied.entries.push_back(committed);
            match self.proposals.settle(index, term) {
                Some(Settled::Committed { turn }) => self.server.handle_committed(self.now, turn),
                Some(Settled::Replaced) => self.step_down(Role::NoLeader),
                None => {}
            }
        }
        if !self.unapplied.deferred {
            self.catch_up();
        }
    }

    /// The last index committed and booked (answers released), which the
    /// copy may trail.
    fn booked(&self) -> u64 {
        self.unapplied
            .entries
            .back()
            .map_or(self.applied, Committed::index)
    }

    /// Applies what is committed to the copy, as of now.
    fn catch_up(&mut self) {
        if self.unapplied.entries.is_empty() {
            return;
        }
        while let Some(committed) = self.unapplied.entries.pop_front() {
            self.applied = committed.index();
            match committed {
                Committed::Own { decisions, .. } => self.apply_decisions(&decisions),
                Committed::Read(entry) => {
                    if entry.entry_type != EntryType::EntryNormal as i32 {
                        if !self.apply_change(&entry) {
                            let index = entry.index;
                            self.stop(ReplicaEvent::BadEntry { index });
                            return;
                        }
                        if self.leadership == Leadership::Stopped {
                            return;
                        }
                        continue;
                    }
                    if entry.data.is_empty() {
                        continue;
                    }
                    match Decision::decode_entry(&entry.data) {
                        Ok(decisions) => self.apply_decisions(&decisions),
                        Err(_) => {
                            let index = entry.index;
                            self.stop(ReplicaEvent::BadEntry { index });
                            return;
                        }
                    }
                }
            }
            if self.leadership == Leadership::Stopped {
                return;
            }
        }
        self.snapshot_if_due();
        self.mark_applied();
    }

    /// Applies one committed entry's decisions to the copy; a floor
    /// among them raises the cluster's.
    fn apply_decisions(&mut self, decisions: &[Decision]) {
        for d in decisions {
            match d {
                Decision::Restored { index, grants } => self.check_restored(*index, *grants),
                Decision::Floor { epoch } => {
                    self.check_first_floor();
                    self.floor = self.floor.max(*epoch);
                }
                Decision::Cluster { id } => {
                    if let Some(id) = ClusterId::new(id.get()) {
                        self.learn_cluster(id);
                    }
                }
                _ => {}
            }
            self.copy.apply(self.now, d);
        }
    }

    /// Takes a snapshot of the copy and compacts the log behind it, every
    /// `snapshot_every` entries applied.
    fn snapshot_if_due(&mut self) {
        let first = self.node.store().first();
        let due = self.applied >= first && self.applied - first + 1 >= self.snapshot_every;
        if !(due || core::mem::take(&mut self.compact_now) && self.applied >= first) {
            return;
        }
        let mut image = self.copy.image(self.now, Duration::ZERO);
        image.epoch = self.floor;
        image.count = 0;
        let data = SnapshotData {
            cluster: self.cluster,
            roster: self.roster.clone(),
            image,
        };
        if let Some(snapshot) = self.node.mut_store().compact(self.applied, data.encode()) {
            self.outputs.push_back(Output::Compact(snapshot));
        }
    }

    /// A leader's snapshot replaces the copy.
    fn install(&mut self, snapshot: &Snapshot) {
        let index = snapshot.metadata.as_ref().map_or(0, |m| m.index);
        let Some((copy, floor, cluster, roster)) = table_of(&self.server, self.now, &snapshot.data)
        else {
            self.stop(ReplicaEvent::BadEntry { index });
            return;
        };
        self.copy = copy;
        self.floor = self.floor.max(floor);
        self.applied = index;
        // What the cluster restored is in the snapshot, past checking.
        self.restore = None;
        // What the copy had still to take is in the snapshot.
        self.unapplied.entries.retain(|c| c.index() > index);
        if let Some(id) = cluster {
            self.learn_cluster(id);
        }
        self.roster.adopt(&roster);
        self.tell_members();
        self.still_member();
    }

    /// Follows Raft's role: serve once elected and caught up, step down
    /// when no longer leading, and say who leads.
    fn follow_raft(&mut self) {
        if self.node.raft.state == StateRole::Leader
            && !matches!(
                self.leadership,
                Leadership::Serving { .. } | Leadership::Stopped
            )
        {
            // It serves from its copy: up to date first.
            self.catch_up();
        }
        let raft = &self.node.raft;
        let (state, term, leader) = (raft.state, raft.term, raft.leader_id);
        let me = raft.id;
        let voting = membership::votes(self.conf(), me);
        if state == StateRole::Leader && raft.lead_transferee.is_none() {
            // raft-rs gave the transfer up, or none runs: it goes on leading.
            self.handover = None;
        }
        match (self.leadership, state) {
            (Leadership::Stopped, _) => {}
            (Leadership::Serving { term: t }, StateRole::Leader) if t == term => {}
            (Leadership::Elected { term: t, index }, StateRole::Leader) if t == term => {
                if self.applied >= index {
                    self.serve(term, index);
                }
            }
            (_, StateRole::Leader) => {
                if matches!(self.leadership, Leadership::Serving { .. }) {
                    let role = self.role_after_leading();
                    self.step_down(role);
                }
                let index = self.node.raft.raft_log.last_index();
                self.leadership = Leadership::Elected { term, index };
                if self.applied >= index {
                    self.serve(term, index);
                }
            }
            (
                Leadership::Following {
                    leader: l,
                    voting: v,
                },
                _,
            ) if l == leader && v == voting => {}
            _ => {
                let addr = self.roster.client(leader).cloned().filter(|_| leader != 0);
                let role = match &addr {
                    // A learner, or a member that joins, serves no client
                    // until it votes (PROTOCOL.md 4.4, "Adding").
                    _ if !voting => Role::NotActive,
                    Some(addr) if leader != me => Role::Follower {
                        leader: addr.clone(),
                    },
                    _ => self.role_after_leading(),
                };
                self.handover = None;
                if matches!(self.leadership, Leadership::Following { .. }) {
                    self.server.set_role(self.now, role);
                } else {
                    self.step_down(role);
                }
                self.leadership = Leadership::Following { leader, voting };
                self.outputs
                    .push_back(Output::Event(ReplicaEvent::Following {
                        term,
                        leader: addr,
                    }));
            }
        }
    }

    /// Serves clients: the committed table becomes the leader's. There is
    /// no grace: every lease in it was counted from when this member
    /// applied it, never earlier than the old leader's.
    fn serve(&mut self, term: u64, index: u64) {
        self.leadership = Leadership::Serving { term };
        // Every committed entry is applied by now: a backup not yet
        // restored was never restored, or its entry was lost with an
        // earlier leadership (`backup.rs`).
        let restoring = self.restore.is_some();
        if self.floor == 0 || restoring {
            // The cluster's first leader: tokens from here on are above
            // every token of PROTOCOL.md 4.1 given before now, and every
            // token of the backup it restores.
            let elapsed = self.now.as_nanos().saturating_sub(self.start.as_nanos()) / 1_000_000;
            let wall = self.wall_ms.saturating_add(elapsed).max(1);
            let floor = self.first_floor(wall).max(self.floor);
            self.floor = floor;
            self.floor_to_propose = Some(floor);
        }
        if self.cluster.is_none() {
            // Every committed entry is applied, and none holds an
            // identity: this cluster is new, or began before identities.
            self.cluster_to_propose = NonZeroU128::new(self.draw);
        }
        if restoring {
            // The backup's grants go into the leader's table, then into
            // the entry with the floor.
            let epoch = self.entry_epoch();
            self.server
                .lead_replicated(self.now, self.copy.clone(), epoch);
            self.seed_restore();
            self.propose_turn(true);
        } else {
            if self.floor_to_propose.is_some() || self.cluster_to_propose.is_some() {
                self.propose_turn(true);
            }
            let epoch = self.entry_epoch();
            self.server
                .lead_replicated(self.now, self.copy.clone(), epoch);
        }
        self.outputs
            .push_back(Output::Event(ReplicaEvent::Leading { term, index }));
    }

    /// What a member that stops leading tells its clients when it does not
    /// know the new leader yet: the member it was handing over to, if it
    /// was (`handover.rs`), else `E no_leader`.
    fn role_after_leading(&mut self) -> Role {
        self.handover
            .take()
            .and_then(|h| self.roster.client(h.to).cloned())
            .map_or(Role::NoLeader, |leader| Role::Follower { leader })
    }

    /// Stops serving, taking `role`: no answer held back is sent, clients
    /// are closed with `M <leader>` or `E no_leader`, the leader's table
    /// (with what was not committed) is dropped; the committed copy stays.
    fn step_down(&mut self, role: Role) {
        self.proposals.clear();
        self.floor_to_propose = None;
        self.cluster_to_propose = None;
        self.restore_to_propose = None;
        if matches!(
            self.leadership,
            Leadership::Serving { .. } | Leadership::Elected { .. }
        ) {
            self.leadership = Leadership::SteppedDown;
        }
        self.server.follow_replicated(self.now, role);
    }
}

/// The configuration of a member's raft-rs engine: election timeouts
/// drawn in `[min, max)` ticks, `applied` the index its table starts from.
fn engine_config(id: u64, (min, max): (usize, usize), applied: u64) -> raft::Config {
    raft::Config {
        id,
        election_tick: ELECTION_TICKS,
        heartbeat_tick: HEARTBEAT_TICKS,
        min_election_tick: min,
        max_election_tick: max,
        applied,
        check_quorum: true,
        pre_vote: true,
        max_size_per_msg: 1 << 20,
        max_inflight_msgs: 256,
        // A follower learns how far the log is committed from the
        // next append, or a heartbeat when there is none; not from an
        // empty append of its own after every commit, which doubled
        // what each entry cost it (a message in, a write and a
        // message out) and answers no client sooner: the leader
        // answers once it knows the entry committed.
        skip_bcast_commit: true,
        // What is waiting for a follower goes in one message.
        batch_append: true,
        ..raft::Config::default()
    }
}

/// A table, floor and cluster identity from a snapshot's data, or `None`
/// if it is not a snapshot.
fn table_of(
    server: &Server,
    now: Time,
    data: &[u8],
) -> Option<(LockTable, u64, Option<ClusterId>, Roster)> {
    let SnapshotData {
        cluster,
        roster,
        image,
    } = SnapshotData::decode(data)?;
    let empty = server.lock_table().successor();
    Some((
        empty.resumed(now, image.epoch, &image, Duration::ZERO),
        image.epoch,
        cluster,
        roster,
    ))
}

impl core::fmt::Debug for Replica {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.node.raft.id)
            .field("term", &self.node.raft.term)
            .field("leadership", &self.leadership)
            .field("applied", &self.applied)
            .finish_non_exhaustive()
    }
}
#[cfg(test)]
mod tests;
