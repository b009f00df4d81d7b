//! The deterministic simulator (feature `sim`): many client cores and a
//! cluster of server cores over a simulated network, driven by one virtual
//! clock and one seed, with faults, and checks after every step.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`SimConfig`], [`run`], [`run_seeds`], the [`Report`] and its parts |
//! | `world/` | the event loop: the clock, the schedule, stepping client cores under their [`Checker`](crate::testkit::Checker)s, handing each delivery to its core, carrying out what the network, the cluster and the workload hand back |
//! | `driven.rs` | the client a slot drives: a core, or a bad client around one |
//! | `sabotage.rs` | the bad clients, one per `Sabotage` (feature `sabotage`) |
//! | `net.rs` | the network: connections and the bytes in flight, latency, writes split into chunks, resets, refusals, partitions between clients and nodes |
//! | `cluster.rs` | the server nodes: crashes and restarts, leadership moving with the lock table, hints, `not_active` windows, refused credentials; in [`Scenario::LeaderCrash`], the leader's crashes and the elections after them |
//! | `workload.rs` | what the embedders do: acquire (a third of the time renewing automatically), hold, write, renew (by hand, or automatically, asked later and maybe stopped), release, cancel, abandon, let a lease lapse, shut down; in [`Scenario::LeaderCrash`], hold keys of their own, renewed, beside light traffic |
//! | `check.rs` | the global checks and the ground truth they use |
//! | `failover.rs` | what leader changes cost the holders that renew ([`Failovers`]) |
//! | `raft.rs` | the replicated cluster of `Scenario::Raft` (feature `raft`): real member cores on in-memory disks, the peers' network, its faults, and the answer-before-commit check |
//!
//! # One seeded run
//!
//! A run ([`run`]) draws everything from its seed, with an
//! [`Rng`] seeded with it and the generators it seeds for
//! the cluster and the workload: the cluster's settings (window, queue
//! limits, longest lease, credential), each client's settings (endpoints and
//! allowlist, reserved slots, cancel and busy policies, answer grace), the
//! rate of every fault, the workload, every latency and every chunk
//! boundary. Nothing reads a clock or draws entropy: the same seed gives the
//! same run, byte for byte, and the same [`Report::trace_hash`].
//!
//! A run has three phases: for [`SimConfig::fault_time`] the workload runs
//! and faults are injected; for [`SimConfig::calm_time`] the workload goes
//! on with no new fault (the ones under way finish: nodes restart, windows
//! close, partitions heal); then every client shuts down with a budget, and
//! the run goes on until every client has finished and every lease has run
//! out.
//!
//! # The faults
//!
//! In the default scenario, [`Scenario::Mixed`], each with a rate drawn
//! from the seed (see [`FaultKind`]): latency spikes; writes split into
//! random chunks; connection resets; connect refusals; node crashes (loud,
//! or silent: the node's connections go dead) and restarts; partitions
//! between a client and one node or all of them (short ones delay the
//! bytes, long ones cut the connections); leadership moving, the old
//! leader sending `M <new>` or `E no_leader` or just vanishing, with the
//! lock table and the token counter carried to the new leader as a
//! correctly replicated service would, or (half the times a leader
//! crashes) lost with it, the next leader then beginning a term of a later
//! epoch with a recovery grace (PROTOCOL.md 4.1); `L` hints, some naming
//! an impostor outside every allowlist; windows of `E not_active`;
//! credentials refused for a while; and `B` answers under tight queue
//! limits.
//!
//! The network keeps the protocol's assumption about delay: a byte that is
//! delivered at all arrives within 800 ms of being written (less than the
//! clients' settle margin of 1 s); a partition longer than that cuts the
//! connections instead.
//!
//! # The leader-crash scenario
//!
//! [`Scenario::LeaderCrash`] (`ticketing sim --scenario leader-crash`)
//! shows the promise of PROTOCOL.md 4.2: a holder that renews keeps its
//! grant when the leader dies. No fault is drawn. Each client holds one or
//! two keys of its own from the start until it shuts down, renewed
//! automatically with no limit, with a lease of at least three election
//! TTLs (7.5 to 15 s); beside them, now and then, a plain acquire of a
//! shared key. The clients have the default timeouts and backoffs, and at
//! least two nodes as endpoints. During [`SimConfig::fault_time`] the
//! leader crashes loudly (its connections are reset, as a process killed
//! with SIGKILL would have them), several times, spaced out: the
//! followers still name it (`M <crashed leader>`) for an election TTL
//! drawn per crash (1 to 2.5 s), as etcd names a leader until its lease
//! runs out; then another node leads, handed the lock table, or half the
//! time beginning a term without it, with a recovery grace in which the
//! holders reclaim their grants by renewing them (PROTOCOL.md 4.1). The
//! crashed node restarts 0.3 to 1.5 s after that election, and the next
//! crash comes 1 to 3 s after the restart.
//!
//! [`Report::failovers`] counts, in every scenario, the leader changes and
//! the renewing holders of a valid grant at each: how many kept it (a
//! leader renewed it after the change, and the holder was told so before
//! it ran out), lost it, or gave it up first. `tests/sim.rs` asserts that
//! every holder keeps its grant in this scenario, and shows that a client
//! that follows stale hints (the sabotage `stale-hints`) is caught in it
//! at once.
//!
//! # The Raft scenarios
//!
//! `Scenario::Raft` and `Scenario::Raft5` (feature `raft`; `ticketing sim
//! --scenario raft`, `raft5`) run the replicated cluster of PROTOCOL.md
//! 4.3: 3 or 5 real member cores (`ticketing::raft::Replica`), each with
//! its server core and a raft-rs node, on in-memory disks that sync after a
//! delay, over a peer network with its own latency. The election timeout of
//! each member is pinned from the seed (distinct, above raft-rs's election
//! tick), so raft-rs draws nothing and the run stays a function of the
//! seed. The clients and the workload are those of the leader-crash
//! scenario (holders that renew, light traffic beside them), with latency
//! spikes and split writes on their side. During [`SimConfig::fault_time`]
//! the members suffer crashes (a minority at most at a time, the leader
//! half the time), some with the loss of their disk (the member then
//! rejoins empty, and counts as down until it has caught up), partitions
//! between members, leadership transfers asked of the leader (to the most
//! caught-up member, or to one drawn, which may be down or behind),
//! members replaced (a new one added in a spare slot, then an old one
//! removed, the leader killed mid-change among them), and peer messages
//! delayed and lost. `raft.rs` says how.
//!
//! On top of the checks below, three that only a view of every member and
//! disk can make:
//!
//! * invariant 8 over the grants the members answered ([`Check::ServerGrants`]):
//!   for each key, every `G` to an acquire that a member writes carries a
//!   token above every earlier one of the key, and no earlier grant of the
//!   key is live then, by the lease ends of the members that answered
//!   (extended by the renewals they answered, ended by the releases they
//!   answered). Only answers count: a decision a leader made and never
//!   answered (its entry was never committed) is no grant;
//! * answer before commit ([`Check::Uncommitted`]), at send time: the entry
//!   holding the decision behind every `G` a member writes (a grant's or a
//!   renewal's) must be committed, judged from the disks: a majority of
//!   members synced that index with that term;
//! * no member's message refused ([`Check::Refused`]): a member drops only
//!   what raft-rs would fail on (PROTOCOL.md 4.3), which members do not
//!   send, however late or out of order it arrives.
//!
//! [`Report::replication`] counts the members' faults and what these checks
//! looked at; [`Report::failovers`] counts each leadership that ended, and
//! the renewing holders that kept their grants across it.
//!
//! # The checks, after every step
//!
//! * invariants 1 to 7 of PROTOCOL.md section 5, renewal included (every
//!   `valid_until` the client reports or gives is what the `G`s prove, and
//!   a renewal goes only for a held, unreleased, unexpired grant), by one
//!   [`Checker`](crate::testkit::Checker) per client core, fed exactly as
//!   its documentation requires ([`Check::Invariant`]); the clients speak
//!   protocol version 2 to the cluster;
//! * no two grants of one key are valid at the same moment, a grant being
//!   valid from its delivery until the client's own conservative expiry
//!   ([`Grant::valid_until`](crate::client::Grant::valid_until), moved by
//!   every [`Event::Renewed`](crate::client::Event::Renewed)) or until the
//!   embedder releases or abandons it, or is told its lease was lost
//!   ([`Check::MutualExclusion`]);
//! * each key guards a resource that accepts a write only with a token at
//!   least the last one it accepted; a write under a valid grant must never
//!   be refused ([`Check::Fencing`]);
//! * every operation ends within its wait budget plus its lease plus a grace
//!   (`queue_grace + answer_grace + settle_margin`), counted from its
//!   submission, so also while faults go on ([`Check::Deadline`]), and a
//!   shutdown completes within its budget;
//! * every grant the clients lost track of is released by exact token or
//!   expires, and none lingers: the grant of an acquire that ended
//!   Indeterminate is gone by the `settles_by` it promised, and once the
//!   cluster is healthy again, a grant whose release is under way is gone
//!   within a bounded time unless that release lapsed
//!   ([`Check::Lingering`]);
//! * a client takes leader hints from, and connects to, only its endpoints
//!   and allowlist ([`Check::Allowlist`]);
//! * the run ends: every client finishes ([`Check::Stuck`]), and once every
//!   lease has run out the cluster's lock table is empty
//!   ([`Check::Lingering`]).
//!
//! A violation stops its seed's run; the [`Violation`] names the seed, the
//! check, and [`Violation::replay`], one command that replays it.
//! [`Report::checked`] counts what the global checks looked at, so a sweep
//! can show that they had something to check.
//!
//! # Showing that the checks can fail
//!
//! The client core carries no switch that breaks a rule. With the feature
//! `sabotage` (which `cli` does not turn on), `SimConfig::sabotage` names a
//! rule that every client breaks: its core, unmodified, runs inside a bad
//! client that misbehaves the way a buggy one would, between the core and
//! the network or the workload. It matches answers by arrival order,
//! resends an acquire after a close, fills the reserved slots, drops the
//! orphan release, takes hints from any address, follows a hint to an
//! address that failed a moment ago, or counts a renewed grant's validity
//! from the arrival of the renewal's `G` instead of its send time
//! (`sabotage.rs` says how each works). The checks see what the bad
//! client does on the simulated wire and what it tells the workload, never
//! what it shows the core, and hold it to the configuration the seed drew.
//! One sabotage breaks a rule of the server's instead, with honest
//! clients: `no-grace` starts the term of a leader elected after the lock
//! table was lost as if it had been handed the table, with no recovery
//! grace; `answer-before-commit` makes the replicated cluster's members
//! answer as soon as they decide, before the commit (`tests/sim_raft.rs`).
//! `tests/sim.rs` shows each one caught, and within how many seeds;
//! a hidden `SimConfig::forget_lock_table` does the same for the global
//! checks, with a cluster whose new leader starts with an empty table.
//!
//! ```
//! use ticketing::sim::{self, SimConfig};
//!
//! let config = SimConfig::default();
//! let report = sim::run(7, &config);
//! assert!(report.violations.is_empty(), "{report}");
//! assert!(report.events > 0);
//! // The same seed gives the same trace.
//! assert_eq!(sim::run(7, &config).trace_hash, report.trace_hash);
//! ```

mod check;
mod cluster;
mod driven;
mod failover;
mod net;
#[cfg(feature = "raft")]
mod raft;
#[cfg(feature = "sabotage")]
mod sabotage;
mod workload;
mod world;

use core::fmt;
use core::time::Duration;

use crate::rng::Rng;
pub use crate::testkit::Invariant;
use crate::testkit::TraceHash;
use crate::time::Time;
#[cfg(feature = "sabotage")]
pub use sabotage::{Sabotage, UnknownSabotage};

/// What to simulate. [`SimConfig::default`] is what `cargo test` and
/// `ticketing sim` run; everything else about a run comes from its seed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimConfig {
    /// What happens to the cluster, and what the clients do (default
    /// [`Scenario::Mixed`]).
    pub scenario: Scenario,
    /// Client cores (default 4).
    pub clients: usize,
    /// Server nodes in the cluster (default 3).
    pub nodes: usize,
    /// How long the workload runs with faults (default 10 s of virtual
    /// time); in [`Scenario::LeaderCrash`], how long leaders crash.
    pub fault_time: Duration,
    /// How long the workload goes on after faults stop, before the clients
    /// shut down (default 15 s).
    pub calm_time: Duration,
    /// Whether faults are injected at all (default `true`); in
    /// [`Scenario::LeaderCrash`], whether leaders crash.
    pub faults: bool,
    /// Keep a readable log of the run in [`Report::log`] (default `false`).
    pub trace: bool,
    /// A rule every client breaks on purpose (default none), to show that
    /// the checks catch it (feature `sabotage`).
    #[cfg(feature = "sabotage")]
    pub sabotage: Option<Sabotage>,
    /// The cluster breaks its own promise on purpose: a new leader starts
    /// with an empty lock table (the grants and the token counter are
    /// lost), to show that the global checks catch it.
    #[doc(hidden)]
    pub forget_lock_table: bool,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            scenario: Scenario::default(),
            clients: 4,
            nodes: 3,
            fault_time: Duration::from_secs(10),
            calm_time: Duration::from_secs(15),
            faults: true,
            trace: false,
            #[cfg(feature = "sabotage")]
            sabotage: None,
            forget_lock_table: false,
        }
    }
}

impl SimConfig {
    /// The options of `ticketing sim` that give this configuration (empty
    /// for the default).
    pub fn cli_args(&self) -> String {
        let default = SimConfig::default();
        let mut args = String::new();
        if self.scenario != default.scenario {
            args.push_str(&format!(" --scenario {}", self.scenario));
        }
        if self.clients != default.clients {
            args.push_str(&format!(" --clients {}", self.clients));
        }
        if self.nodes != default.nodes {
            args.push_str(&format!(" --nodes {}", self.nodes));
        }
        if self.fault_time != default.fault_time {
            args.push_str(&format!(" --fault-ms {}", self.fault_time.as_millis()));
        }
        if self.calm_time != default.calm_time {
            args.push_str(&format!(" --calm-ms {}", self.calm_time.as_millis()));
        }
        if !self.faults {
            args.push_str(" --no-faults");
        }
        if self.forget_lock_table {
            args.push_str(" --forget-lock-table");
        }
        #[cfg(feature = "sabotage")]
        if let Some(sabotage) = self.sabotage {
            args.push_str(&format!(" --sabotage {sabotage}"));
        }
        args
    }
}

/// What a run does to the cluster, and what its clients do
/// ([`SimConfig::scenario`], `ticketing sim --scenario NAME`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Scenario {
    /// Every kind of fault, each at a rate the seed draws, under a workload
    /// of every kind of operation (see the module documentation).
    #[default]
    Mixed,
    /// No random fault: the leader crashes loudly, several times, spaced
    /// out, under clients that hold keys of their own and renew them
    /// automatically, with light traffic beside them. Until the crashed
    /// leader's election key expires, the followers still name it (`M`),
    /// as etcd does (PROTOCOL.md 4.2); then another node leads, with the
    /// lock table handed over, or half the time lost (a recovery grace,
    /// PROTOCOL.md 4.1). [`Report::failovers`] tells whether the holders
    /// kept their grants.
    LeaderCrash,
    /// A replicated cluster of 3 members (PROTOCOL.md 4.3, feature
    /// `raft`) under crashes (some losing their disk), partitions between
    /// members, and peer messages delayed and lost, with the clients of
    /// [`Scenario::LeaderCrash`] (see the module documentation).
    #[cfg(feature = "raft")]
    Raft,
    /// `Scenario::Raft` with 5 members.
    #[cfg(feature = "raft")]
    Raft5,
}

impl Scenario {
    /// Every scenario.
    #[cfg(not(feature = "raft"))]
    pub const ALL: [Scenario; 2] = [Scenario::Mixed, Scenario::LeaderCrash];
    /// Every scenario.
    #[cfg(feature = "raft")]
    pub const ALL: [Scenario; 4] = [
        Scenario::Mixed,
        Scenario::LeaderCrash,
        Scenario::Raft,
        Scenario::Raft5,
    ];

    /// Its name on the command line (`ticketing sim --scenario NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Mixed => "mixed",
            Scenario::LeaderCrash => "leader-crash",
            #[cfg(feature = "raft")]
            Scenario::Raft => "raft",
            #[cfg(feature = "raft")]
            Scenario::Raft5 => "raft5",
        }
    }

    /// The members of its replicated cluster, if it runs one.
    pub fn raft_members(self) -> Option<usize> {
        match self {
            #[cfg(feature = "raft")]
            Scenario::Raft => Some(3),
            #[cfg(feature = "raft")]
            Scenario::Raft5 => Some(5),
            _ => None,
        }
    }

    /// Whether its clients hold keys of their own, renewed, beside light
    /// traffic (the leader-crash workload).
    pub(crate) fn holds_keys(self) -> bool {
        self != Scenario::Mixed
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for Scenario {
    type Err = UnknownScenario;

    fn from_str(name: &str) -> Result<Scenario, UnknownScenario> {
        Scenario::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| UnknownScenario(name.to_owned()))
    }
}

/// A name that is no [`Scenario`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownScenario(String);

impl fmt::Display for UnknownScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown scenario {:?}; one of: ", self.0)?;
        for (i, s) in Scenario::ALL.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownScenario {}

/// A uniform draw in `lo..=hi` milliseconds.
fn millis_between(rng: &mut Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(lo + rng.up_to(hi.saturating_sub(lo)))
}

/// Runs one seed and reports it. Its [`Report::trace_hash`] is the hash of
/// the run's trace: every byte written on the simulated wire, every
/// scheduled event (deliveries, timers, commands, faults) with its time,
/// and every input, action and event of every client core (through each
/// core's [`Checker`](crate::testkit::Checker) trace).
pub fn run(seed: u64, config: &SimConfig) -> Report {
    world::World::new(seed, config).run()
}

/// Runs `count` seeds from `first` on, on `jobs` threads (at least one),
/// and adds up their reports in seed order. The trace hash of the sum is a
/// hash of every seed with its own trace hash, so it does not depend on
/// `jobs`.
pub fn run_seeds(first: u64, count: u64, config: &SimConfig, jobs: usize) -> Report {
    let jobs = jobs.clamp(1, count.max(1) as usize);
    let reports: Vec<(u64, Report)> = if jobs == 1 {
        (0..count)
            .map(|i| {
                let seed = first.wrapping_add(i);
                (seed, run(seed, config))
            })
            .collect()
    } else {
        let next = std::sync::atomic::AtomicU64::new(0);
        let mut all: Vec<(u64, Report)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..jobs)
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= count {
                                return mine;
                            }
                            let seed = first.wrapping_add(i);
                            mine.push((i, run(seed, config)));
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("a simulation thread panicked"))
                .collect()
        });
        all.sort_by_key(|(i, _)| *i);
        all.into_iter()
            .map(|(i, report)| (first.wrapping_add(i), report))
            .collect()
    };
    let mut total = Report::default();
    let mut trace = TraceHash::new();
    for (seed, report) in reports {
        trace.write_u64(seed);
        trace.write_u64(report.trace_hash);
        total.add(report);
    }
    total.trace_hash = trace.get();
    total
}

/// Which check a [`Violation`] broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Check {
    /// One of invariants 1 to 7 of PROTOCOL.md section 5 (or another rule
    /// of the protocol), as a client's [`Checker`](crate::testkit::Checker)
    /// saw it.
    Invariant(Invariant),
    /// Two grants of one key were valid at the same moment.
    MutualExclusion,
    /// A resource refused a write made under a valid grant.
    Fencing,
    /// An operation did not end within its wait budget plus its lease plus
    /// the grace, or a shutdown overran its budget.
    Deadline,
    /// A grant the clients lost track of outlived what it was allowed to.
    Lingering,
    /// A client took a leader hint to, or connected to, an address outside
    /// its endpoints and allowlist.
    Allowlist,
    /// The run did not end.
    Stuck,
    /// Invariant 8 over the grants a replicated cluster's members answered:
    /// a key's token not above an earlier one, or two of its grants live at
    /// once.
    ServerGrants,
    /// A member of a replicated cluster answered before the entry holding
    /// the answer's decision was committed (PROTOCOL.md 4.3).
    Uncommitted,
    /// Members of one replicated cluster learnt two identities of it, or
    /// one refused the identity its log committed (PROTOCOL.md 4.3).
    Identity,
    /// A member of a replicated cluster refused another member's message,
    /// or its Raft engine failed on one: one is refused only if raft-rs
    /// would fail on it (PROTOCOL.md 4.3), which members do not send.
    Refused,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Check::Invariant(invariant) => write!(f, "{invariant}"),
            Check::MutualExclusion => f.write_str("mutual exclusion"),
            Check::Fencing => f.write_str("fencing"),
            Check::Deadline => f.write_str("operation deadline"),
            Check::Lingering => f.write_str("lingering grant"),
            Check::Allowlist => f.write_str("allowlist"),
            Check::Stuck => f.write_str("run did not end"),
            Check::ServerGrants => f.write_str("invariant 8 (answered grants)"),
            Check::Uncommitted => f.write_str("answer before commit"),
            Check::Identity => f.write_str("cluster identity"),
            Check::Refused => f.write_str("member's message refused"),
        }
    }
}

/// A broken check: which seed, when, which client, what happened, and how
/// to replay it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The seed of the run.
    pub seed: u64,
    /// The virtual time.
    pub at: Time,
    /// The check broken.
    pub check: Check,
    /// The client concerned, if one is.
    pub client: Option<usize>,
    /// What happened, readably.
    pub detail: String,
    /// One command that replays the run with its log.
    pub replay: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {} at {}: {}", self.seed, self.at, self.check)?;
        if let Some(c) = self.client {
            write!(f, " (client c{c})")?;
        }
        write!(f, ": {}\n  replay: {}", self.detail, self.replay)
    }
}

/// A kind of fault, as counted in [`Faults`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FaultKind {
    /// A write delayed by a latency spike (100 to 800 ms).
    Latency,
    /// A write split into random chunks, each delivered on its own.
    Split,
    /// An established connection reset.
    Reset,
    /// A connect refused.
    Refused,
    /// A node crashed: its connections are reset, or go silent.
    Crash,
    /// A node restarted (empty, answering `not_active` for a while).
    Restart,
    /// A client cut off from one node or from all, for a while.
    Partition,
    /// The leader stepped down with `M <new leader>`.
    Moved,
    /// The leader stepped down with `E no_leader`.
    NoLeader,
    /// The leader vanished: its connections went silent.
    Vanished,
    /// The leader sent `L <addr>`, allowlisted or not.
    Hint,
    /// A node answered `E not_active` for a while.
    NotActive,
    /// A node refused the credential for a while.
    AuthRefused,
    /// A `B` answer, under tight queue limits.
    Busy,
    /// A crashed leader's lock table was lost with it (no handover): the
    /// next leader began a term with a recovery grace.
    LostTable,
}

impl FaultKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [FaultKind; 15] = [
        FaultKind::Latency,
        FaultKind::Split,
        FaultKind::Reset,
        FaultKind::Refused,
        FaultKind::Crash,
        FaultKind::Restart,
        FaultKind::Partition,
        FaultKind::Moved,
        FaultKind::NoLeader,
        FaultKind::Vanished,
        FaultKind::Hint,
        FaultKind::NotActive,
        FaultKind::AuthRefused,
        FaultKind::Busy,
        FaultKind::LostTable,
    ];

    /// A short name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Latency => "latency",
            FaultKind::Split => "split",
            FaultKind::Reset => "reset",
            FaultKind::Refused => "refused",
            FaultKind::Crash => "crash",
            FaultKind::Restart => "restart",
            FaultKind::Partition => "partition",
            FaultKind::Moved => "moved",
            FaultKind::NoLeader => "no_leader",
            FaultKind::Vanished => "vanished",
            FaultKind::Hint => "hint",
            FaultKind::NotActive => "not_active",
            FaultKind::AuthRefused => "auth_refused",
            FaultKind::Busy => "busy",
            FaultKind::LostTable => "lost_table",
        }
    }

    pub(crate) fn index(self) -> usize {
        FaultKind::ALL
            .iter()
            .position(|&k| k == self)
            .expect("listed")
    }
}

/// How many faults of each kind were injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults([u64; 15]);

impl Faults {
    /// The count of `kind`.
    pub fn get(&self, kind: FaultKind) -> u64 {
        self.0[kind.index()]
    }

    /// All faults.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub(crate) fn bump(&mut self, kind: FaultKind) {
        self.0[kind.index()] += 1;
    }

    fn add(&mut self, other: &Faults) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }
}

/// Operations by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Operations {
    /// Acquires granted.
    pub granted: u64,
    /// Acquires answered `T`.
    pub timed_out: u64,
    /// Acquires that could not be sent in time (`TimedOut { sent: false }`).
    pub timed_out_unsent: u64,
    /// Acquires that ended Busy.
    pub busy: u64,
    /// Acquires cancelled before they were sent.
    pub cancelled: u64,
    /// Acquires that ended Indeterminate.
    pub indeterminate: u64,
    /// Releases answered `D`.
    pub released: u64,
    /// Releases answered `N`.
    pub not_held: u64,
    /// Releases that lapsed.
    pub lapsed: u64,
    /// Acquires the client refused at once (its own capacity full).
    pub refused: u64,
    /// Releases the clients issued by themselves for orphaned grants.
    pub orphan_releases: u64,
    /// Calls to `renew`, `auto_renew` and `stop_renewing`.
    pub renew_calls: u64,
    /// `Renewed` notices.
    pub renewed: u64,
    /// `LeaseJeopardy` notices.
    pub jeopardies: u64,
    /// `LeaseLost` notices.
    pub leases_lost: u64,
    /// `LeaseExpired` notices.
    pub leases_expired: u64,
}

impl Operations {
    /// Operations that ended (refused ones and orphan releases not
    /// counted).
    pub fn total(&self) -> u64 {
        self.granted
            + self.timed_out
            + self.timed_out_unsent
            + self.busy
            + self.cancelled
            + self.indeterminate
            + self.released
            + self.not_held
            + self.lapsed
    }

    fn add(&mut self, o: &Operations) {
        self.granted += o.granted;
        self.timed_out += o.timed_out;
        self.timed_out_unsent += o.timed_out_unsent;
        self.busy += o.busy;
        self.cancelled += o.cancelled;
        self.indeterminate += o.indeterminate;
        self.released += o.released;
        self.not_held += o.not_held;
        self.lapsed += o.lapsed;
        self.refused += o.refused;
        self.orphan_releases += o.orphan_releases;
        self.renew_calls += o.renew_calls;
        self.renewed += o.renewed;
        self.jeopardies += o.jeopardies;
        self.leases_lost += o.leases_lost;
        self.leases_expired += o.leases_expired;
    }
}

/// Writes to the fenced resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Writes {
    /// Writes under a valid grant (all accepted, or a violation).
    pub valid: u64,
    /// Late writes (after the grant's validity or release) that the
    /// resource still accepted: no newer token had written.
    pub stale_accepted: u64,
    /// Late writes the resource refused: a newer token had written.
    pub stale_refused: u64,
}

impl Writes {
    fn add(&mut self, o: &Writes) {
        self.valid += o.valid;
        self.stale_accepted += o.stale_accepted;
        self.stale_refused += o.stale_refused;
    }
}

/// How much the global checks had to look at: evidence that they ran on
/// something.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checked {
    /// Grants handed to embedders while still valid, each checked for
    /// mutual exclusion.
    pub holds: u64,
    /// Grants of acquires that ended Indeterminate, each checked to be gone
    /// by the promised `settles_by`.
    pub settle_watches: u64,
    /// Releases under way once the cluster was healthy, checked to have
    /// freed their grant in time where lease expiry alone would not have.
    pub release_watches: u64,
    /// Renewals that extended a valid grant, each checked for mutual
    /// exclusion.
    pub renewals: u64,
}

impl Checked {
    fn add(&mut self, o: &Checked) {
        self.holds += o.holds;
        self.settle_watches += o.settle_watches;
        self.release_watches += o.release_watches;
        self.renewals += o.renewals;
    }
}

/// Leader changes, and what they cost the holders that renew: whether a
/// grant renewed automatically outlives the leader that granted it
/// (PROTOCOL.md 4.2). Counted in every scenario; in
/// [`Scenario::LeaderCrash`] every holder should keep its grant, while in
/// [`Scenario::Mixed`] partitions, refused credentials and leases shorter
/// than an outage may legitimately cost some.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Failovers {
    /// Times a leader stopped leading: it crashed or vanished, moved, or
    /// stepped down. (A leader whose server core is replaced, to refuse
    /// the credential for a while, leads on: no change.)
    pub leader_changes: u64,
    /// Grants held at a change, valid and renewed automatically (within
    /// their limit), counted once per change.
    pub holders: u64,
    /// Of those, kept across the change: a leader renewed the grant after
    /// the change, and its holder was told `Renewed` before the grant's
    /// `valid_until` passed, with no `LeaseLost` or `LeaseExpired` before.
    pub kept: u64,
    /// Of those, lost: `LeaseLost`, or `LeaseExpired` while its automatic
    /// renewal was still on.
    pub lost: u64,
    /// Of those, given up first by the holder: released, handed back, its
    /// automatic renewal stopped or past its limit, or its client shut
    /// down. (The rest were still waiting when a violation ended the run.)
    pub given_up: u64,
    /// Of the grants kept, the least time that was left before one's
    /// `valid_until` when its holder was told `Renewed`: how close a
    /// holder came to losing its grant.
    pub least_left: Option<Duration>,
}

impl Failovers {
    fn add(&mut self, o: &Failovers) {
        self.leader_changes += o.leader_changes;
        self.holders += o.holders;
        self.kept += o.kept;
        self.lost += o.lost;
        self.given_up += o.given_up;
        self.least_left = match (self.least_left, o.least_left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// The replicated cluster's side of a run (`Scenario::Raft`, feature
/// `raft`; all zero in the other scenarios): the members' faults, and what
/// the checks only such a cluster has looked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replication {
    /// Members, summed over the runs.
    pub members: u64,
    /// Leaderships: a member serving in a term.
    pub leaderships: u64,
    /// Members that crashed.
    pub crashes: u64,
    /// Of those, members that lost their disk with it.
    pub disk_losses: u64,
    /// Members started again.
    pub restarts: u64,
    /// Partitions between members.
    pub partitions: u64,
    /// Leadership transfers a leader began (PROTOCOL.md 4.4).
    pub transfers: u64,
    /// Members started empty and added (PROTOCOL.md 4.4, "Replacing").
    pub members_added: u64,
    /// Members removed, out of the configuration.
    pub members_removed: u64,
    /// Leaders killed as soon as they proposed a removal, the
    /// configuration joint.
    pub joint_kills: u64,
    /// The longest time no member served, between a leadership's end and
    /// the next one's start (of all the runs, the longest).
    pub longest_leaderless: Duration,
    /// Peer messages lost (at random, or cut by a partition or a crash).
    pub lost: u64,
    /// Peer messages delayed by a spike.
    pub delayed: u64,
    /// `G` answers checked at send time to depend on a committed entry.
    pub answers_checked: u64,
    /// Grants answered, checked for invariant 8.
    pub grants_checked: u64,
}

impl Replication {
    fn add(&mut self, o: &Replication) {
        self.members += o.members;
        self.leaderships += o.leaderships;
        self.crashes += o.crashes;
        self.disk_losses += o.disk_losses;
        self.restarts += o.restarts;
        self.partitions += o.partitions;
        self.transfers += o.transfers;
        self.members_added += o.members_added;
        self.members_removed += o.members_removed;
        self.joint_kills += o.joint_kills;
        self.longest_leaderless = self.longest_leaderless.max(o.longest_leaderless);
        self.lost += o.lost;
        self.delayed += o.delayed;
        self.answers_checked += o.answers_checked;
        self.grants_checked += o.grants_checked;
    }
}

/// What one run, or many, did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Seeds run.
    pub seeds: u64,
    /// Events simulated: deliveries, timers, commands, faults.
    pub events: u64,
    /// Virtual time simulated, all seeds together.
    pub virtual_time: Duration,
    /// Operations by outcome.
    pub operations: Operations,
    /// Faults injected, by kind.
    pub faults: Faults,
    /// Writes to the fenced resources.
    pub writes: Writes,
    /// What the global checks looked at.
    pub checked: Checked,
    /// Leader changes, and whether the holders that renew kept their
    /// grants across them.
    pub failovers: Failovers,
    /// The replicated cluster's faults and checks (zero outside
    /// `Scenario::Raft`).
    pub replication: Replication,
    /// Violations found (at most one per seed: a violation ends its run).
    pub violations: Vec<Violation>,
    /// The trace hash: of one run (from [`run`]), or of every seed with its
    /// own (from [`run_seeds`]).
    pub trace_hash: u64,
    /// The readable log of a run made with [`SimConfig::trace`].
    pub log: Vec<String>,
}

impl Report {
    /// Adds another report's counts, violations and log (not its trace
    /// hash: [`run_seeds`] combines those).
    pub fn add(&mut self, other: Report) {
        self.seeds += other.seeds;
        self.events += other.events;
        self.virtual_time += other.virtual_time;
        self.operations.add(&other.operations);
        self.faults.add(&other.faults);
        self.writes.add(&other.writes);
        self.checked.add(&other.checked);
        self.failovers.add(&other.failovers);
        self.replication.add(&other.replication);
        self.violations.extend(other.violations);
        self.log.extend(other.log);
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.operations;
        writeln!(f, "seeds: {}", self.seeds)?;
        writeln!(f, "events: {}", self.events)?;
        writeln!(f, "virtual time: {:.1} s", self.virtual_time.as_secs_f64())?;
        writeln!(f, "operations: {}", o.total())?;
        writeln!(
            f,
            "  acquire: granted {}, timed_out {}, timed_out_unsent {}, busy {}, cancelled {}, indeterminate {}, refused_at_once {}",
            o.granted, o.timed_out, o.timed_out_unsent, o.busy, o.cancelled, o.indeterminate, o.refused
        )?;
        writeln!(
            f,
            "  release: released {}, not_held {}, lapsed {}; orphan releases {}",
            o.released, o.not_held, o.lapsed, o.orphan_releases
        )?;
        writeln!(
            f,
            "  renewal: {} calls, renewed {}, jeopardy {}, lost {}, expired {}",
            o.renew_calls, o.renewed, o.jeopardies, o.leases_lost, o.leases_expired
        )?;
        writeln!(
            f,
            "writes: {} under valid grants, {} late and accepted, {} late and refused",
            self.writes.valid, self.writes.stale_accepted, self.writes.stale_refused
        )?;
        writeln!(
            f,
            "checked: {} valid grants and {} renewals for mutual exclusion, {} grants of Indeterminate acquires, {} releases that had to free a grant",
            self.checked.holds, self.checked.renewals, self.checked.settle_watches, self.checked.release_watches
        )?;
        let fo = &self.failovers;
        write!(
            f,
            "leader changes: {}, with {} renewing holders of a valid grant: {} kept it, {} lost it, {} gave it up first",
            fo.leader_changes, fo.holders, fo.kept, fo.lost, fo.given_up
        )?;
        match fo.least_left {
            Some(left) => writeln!(
                f,
                "; the closest kept it {:.2} s before it ran out",
                left.as_secs_f64()
            )?,
            None => writeln!(f)?,
        }
        let r = &self.replication;
        if r.members > 0 {
            writeln!(
                f,
                "raft: {} leaderships; member crashes {} ({} losing their disk), restarts {}, partitions {}, leadership transfers {}, members added {} and removed {} ({} leaders killed mid-change), at most {:?} without a leader, peer messages lost {}, delayed {}; {} G answers checked committed, {} answered grants checked for invariant 8",
                r.leaderships, r.crashes, r.disk_losses, r.restarts, r.partitions, r.transfers, r.members_added, r.members_removed, r.joint_kills, r.longest_leaderless, r.lost, r.delayed, r.answers_checked, r.grants_checked
            )?;
        }
        writeln!(f, "faults injected: {}", self.faults.total())?;
        let kinds: Vec<String> = FaultKind::ALL
            .iter()
            .map(|&k| format!("{} {}", k.name(), self.faults.get(k)))
            .collect();
        writeln!(f, "  {}", kinds.join(", "))?;
        writeln!(f, "violations: {}", self.violations.len())?;
        for v in &self.violations {
            writeln!(f, "  {v}")?;
        }
        write!(f, "trace hash: {:#018x}", self.trace_hash)
    }
}
