//! A nemesis over real processes (issue 33): the `ticketing` binary as a
//! replicated cluster behind a fault proxy (`net.rs`), clients of the
//! library at work on shared and private keys (`clients.rs`), faults
//! scheduled from a seed and logged with their times, every operation in
//! a history (`history.rs`), and a checker over it (`check.rs`).
#![allow(dead_code)]

pub mod check;
pub mod clients;
pub mod cluster;
pub mod history;
pub mod net;
pub mod netns;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use check::{Report, AVAILABILITY_PROBE, MINORITY_PROBE};
use clients::{Rng, Shared};
use cluster::{Cluster, Mode, ETCD_TTL_MS};
use history::{Entry, FencedStore, History};
use net::{Net, Party};

/// A fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    KillLeader,
    KillFollower,
    PauseLeader,
    PauseFollower,
    /// SIGTERM and a start again from the state directory.
    RestartMember,
    /// The leader cut off from every other member, both ways.
    IsolateLeader,
    /// A minority of followers cut off from the rest.
    SplitMinority,
    /// The leader's messages to one follower held; the follower's pass.
    OneWay,
    /// Two members cut apart; a third sees both.
    Bridge,
    /// The clients cut off from the leader; the members still see it.
    ClientsFromLeader,
    /// Every link of the leader slowed.
    SlowLeader,
    /// Every peer connection of the leader reset.
    ResetLeader,
    /// Leadership handed to another member (`ticketing cluster transfer`).
    Transfer,
    /// A member replaced: a new one added, then the old one (the leader a
    /// third of the time) removed (`ticketing cluster add`, `remove`).
    Replace,
}

/// Every kind, each injected at least once per run.
pub const EVERY_FAULT: [Fault; 14] = [
    Fault::KillLeader,
    Fault::KillFollower,
    Fault::PauseLeader,
    Fault::PauseFollower,
    Fault::RestartMember,
    Fault::IsolateLeader,
    Fault::SplitMinority,
    Fault::OneWay,
    Fault::Bridge,
    Fault::ClientsFromLeader,
    Fault::SlowLeader,
    Fault::ResetLeader,
    Fault::Transfer,
    Fault::Replace,
];

/// The network a run breaks: a fault proxy in front of every port on
/// loopback, or a namespace for each member with nftables rules.
pub enum Network {
    Proxy(Net),
    Netns(netns::Netns),
}

impl Network {
    /// Whether `fault` can be made on this network: namespaces have no
    /// slow links (no netem) and no resets.
    pub fn makes(&self, fault: Fault) -> bool {
        match self {
            Network::Proxy(_) => true,
            // A spare's namespace would have to be made on the way.
            Network::Netns(_) => !matches!(
                fault,
                Fault::SlowLeader | Fault::ResetLeader | Fault::Replace
            ),
        }
    }

    fn cut(&self, from: Party, to: Party) {
        match self {
            Network::Proxy(net) => net.cut(from, to),
            Network::Netns(netns) => netns.cut(from, to),
        }
    }

    fn cut_both(&self, a: Party, b: Party) {
        match self {
            Network::Proxy(net) => net.cut_both(a, b),
            Network::Netns(netns) => netns.cut_both(a, b),
        }
    }

    fn heal(&self) {
        match self {
            Network::Proxy(net) => net.heal(),
            Network::Netns(netns) => netns.heal(),
        }
    }

    /// The proxy, for what only it makes.
    fn proxy(&self) -> &Net {
        match self {
            Network::Proxy(net) => net,
            Network::Netns(_) => panic!("this fault is made by the proxy alone"),
        }
    }
}

/// What a run is against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A replicated cluster of this many members.
    Raft(u64),
    /// A cluster of three nodes led through a real etcd.
    Etcd,
    /// One server with a state directory.
    Single,
}

impl Target {
    /// Whether `fault` means anything here: the members of an etcd-led
    /// cluster never talk to each other (their partitions are from etcd),
    /// and a single server has no peer, follower or leadership to hand.
    pub fn takes(self, fault: Fault) -> bool {
        match self {
            Target::Raft(_) => true,
            Target::Etcd => !matches!(fault, Fault::Bridge | Fault::Transfer | Fault::Replace),
            Target::Single => matches!(
                fault,
                Fault::KillLeader
                    | Fault::PauseLeader
                    | Fault::RestartMember
                    | Fault::ClientsFromLeader
                    | Fault::SlowLeader
                    | Fault::ResetLeader
            ),
        }
    }

    /// How long after a fault heals the service may still refuse a free
    /// key: a new Raft leader grants as soon as it commits; an etcd-led
    /// leader and a crashed server wait out a recovery grace (the longest
    /// lease, 3 s, plus 0.3 s), the former after the old leader's TTL.
    fn settle_ms(self) -> u64 {
        match self {
            Target::Raft(_) => 2_000,
            Target::Etcd => ETCD_TTL_MS + 3_300 + 1_000,
            Target::Single => 3_300 + 1_000,
        }
    }

    /// How long a member cut off may still grant: nothing for a Raft
    /// member (it cannot commit); an etcd-led leader until its last
    /// keep-alive's TTL has run out.
    fn minority_grace_ms(self) -> u64 {
        match self {
            Target::Etcd => ETCD_TTL_MS,
            _ => 0,
        }
    }
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "kill:leader",
            Fault::KillFollower => "kill:follower",
            Fault::PauseLeader => "pause:leader",
            Fault::PauseFollower => "pause:follower",
            Fault::RestartMember => "restart",
            Fault::IsolateLeader => "partition:isolate-leader",
            Fault::SplitMinority => "partition:minority",
            Fault::OneWay => "partition:one-way",
            Fault::Bridge => "partition:bridge",
            Fault::ClientsFromLeader => "partition:clients-leader",
            Fault::SlowLeader => "slow:leader",
            Fault::ResetLeader => "reset:leader",
            Fault::Transfer => "transfer",
            Fault::Replace => "replace",
        }
    }
}

/// What a run is.
#[derive(Debug, Clone)]
pub struct Settings {
    pub name: String,
    pub target: Target,
    /// How long faults are injected after the warm-up.
    pub secs: u64,
    pub clients: usize,
    pub keys: usize,
    pub seed: u64,
    pub faults: bool,
    /// A client that writes past its lease's end.
    pub sabotage: bool,
    /// Members in network namespaces, faults by nftables (else the proxy).
    pub netns: bool,
}

/// A run's outcome: the report, the fault log, and where the history is.
pub struct Run {
    pub report: Report,
    pub log: Vec<String>,
    pub history: PathBuf,
}

/// The election timeout of the members, short so that a run sees many
/// leaders.
const ELECTION_TIMEOUT_MS: u64 = 300;

/// Runs the nemesis.
pub fn run(s: &Settings) -> Run {
    let (mode, n) = match s.target {
        Target::Raft(n) => (Mode::Raft, n),
        Target::Etcd => (
            Mode::Etcd {
                etcd: crate::etcd::Etcd::start(&s.name),
            },
            3,
        ),
        Target::Single => (Mode::Single, 1),
    };
    let net = match s.netns {
        false => Network::Proxy(Net::new()),
        true => Network::Netns(netns::Netns::new(&(1..=n).collect::<Vec<_>>())),
    };
    // Spares for the replacements: one per minute of faults, and one.
    let spares = match (s.target, s.netns) {
        (Target::Raft(_), false) => s.secs / 60 + 1,
        _ => 0,
    };
    let mut cluster = Cluster::new(&s.name, mode, (n, spares), &net, ELECTION_TIMEOUT_MS);
    cluster.start_all();
    assert!(
        cluster.leader(Duration::from_secs(20)).is_some(),
        "the cluster elected no leader"
    );
    let start = Instant::now();
    let history = History::new(start);
    let shared = Shared {
        history: history.clone(),
        store: FencedStore::default(),
        stop: Arc::new(AtomicBool::new(false)),
        endpoints: cluster.endpoints(),
        allow: cluster.spare_endpoints(),
        keys: s.keys,
        tls: cluster.tls.as_ref().map(|tls| tls.client.clone()),
    };
    let mut threads = clients::start_workers(&shared, s.clients, s.seed);
    threads.push(clients::start_availability_probe(
        &shared,
        AVAILABILITY_PROBE,
    ));
    if s.sabotage {
        threads.push(clients::start_saboteur(&shared, AVAILABILITY_PROBE - 1));
    }
    let mut log = Vec::new();
    thread::sleep(Duration::from_secs(1));
    let mut rng = Rng::new(s.seed);
    let end = Instant::now() + Duration::from_secs(s.secs);
    let kinds: Vec<Fault> = EVERY_FAULT
        .into_iter()
        .filter(|&f| s.target.takes(f) && net.makes(f))
        .collect();
    let mut order = kinds.clone();
    for i in (1..order.len()).rev() {
        let j = rng.range(0, i as u64) as usize;
        order.swap(i, j);
    }
    let mut n = 0;
    let mut violations = Vec::new();
    while s.faults && (n < order.len() || Instant::now() < end) {
        let fault = match order.get(n) {
            Some(f) => *f,
            None => kinds[rng.range(0, kinds.len() as u64 - 1) as usize],
        };
        let Some(leader) = cluster.leader(Duration::from_secs(10)) else {
            violations.push(format!(
                "no leader 10 s after the fault before {}",
                fault.name()
            ));
            break;
        };
        let hold = Duration::from_millis(rng.range(1_200, 2_500));
        let (detail, started, ended) = inject(
            &mut cluster,
            &net,
            &shared,
            fault,
            leader,
            hold,
            &mut rng,
            n,
        );
        let line = format!(
            "{:>8.3} s  {:<26} {detail} for {:.3} s",
            history.ns(started) as f64 / 1e9,
            fault.name(),
            ended.duration_since(started).as_secs_f64()
        );
        eprintln!("nemesis {}: {line}", s.name);
        log.push(line);
        history.push(Entry::Fault {
            kind: fault.name().to_owned(),
            detail,
            start: history.ns(started),
            end: history.ns(ended),
        });
        n += 1;
        thread::sleep(Duration::from_millis(rng.range(800, 1_500)));
    }
    if !s.faults {
        thread::sleep(Duration::from_secs(s.secs));
    }
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let ms = 1_000_000;
    let bounds = check::Bounds {
        margin: 1_000 * ms,
        settle: s.target.settle_ms() * ms,
        minority_grace: s.target.minority_grace_ms() * ms,
    };
    let mut report = check::check(&history.entries(), &bounds);
    report.violations.extend(violations);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nemesis");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{}-{}.jsonl", s.name, s.seed));
    history.write(&path).expect("write the history");
    Run {
        report,
        log,
        history: path,
    }
}

/// A member other than `leader` that runs, drawn from `rng`.
fn follower(cluster: &Cluster, leader: usize, rng: &mut Rng) -> usize {
    let others: Vec<usize> = (0..cluster.members.len())
        .filter(|&i| i != leader && cluster.running(i))
        .collect();
    others[rng.range(0, others.len() as u64 - 1) as usize]
}

fn party(cluster: &Cluster, i: usize) -> Party {
    Party::Member(cluster.members[i].id)
}

/// Injects `fault` for `hold`, then heals it: what it did, when it began
/// and when it was healed.
#[allow(clippy::too_many_arguments)]
fn inject(
    cluster: &mut Cluster,
    net: &Network,
    shared: &Shared,
    fault: Fault,
    leader: usize,
    hold: Duration,
    rng: &mut Rng,
    n: usize,
) -> (String, Instant, Instant) {
    let name = |c: &Cluster, i: usize| format!("n{}", c.members[i].id);
    let all: Vec<usize> = cluster.live();
    let etcd = matches!(cluster.mode, Mode::Etcd { .. });
    let started = Instant::now();
    let detail = match fault {
        Fault::KillLeader | Fault::KillFollower => {
            let i = match fault {
                Fault::KillLeader => leader,
                _ => follower(cluster, leader, rng),
            };
            cluster.kill(i);
            thread::sleep(hold);
            cluster.start(i, false);
            format!("SIGKILL {}, started again", name(cluster, i))
        }
        Fault::PauseLeader | Fault::PauseFollower => {
            let i = match fault {
                Fault::PauseLeader => leader,
                _ => follower(cluster, leader, rng),
            };
            cluster.pause(i);
            thread::sleep(hold);
            cluster.resume(i);
            format!("SIGSTOP {}, SIGCONT", name(cluster, i))
        }
        Fault::RestartMember => {
            let running: Vec<usize> = all
                .iter()
                .copied()
                .filter(|&i| cluster.running(i))
                .collect();
            let i = running[rng.range(0, running.len() as u64 - 1) as usize];
            cluster.terminate(i);
            cluster.start(i, false);
            format!("SIGTERM {}, started again", name(cluster, i))
        }
        Fault::IsolateLeader | Fault::SplitMinority => {
            let minority: Vec<usize> = match fault {
                Fault::IsolateLeader => vec![leader],
                _ => {
                    // Fewer than half, the leader among them in a cluster
                    // of five, else a follower alone.
                    let size = (all.len() - 1) / 2;
                    let mut side = vec![follower(cluster, leader, rng)];
                    if size > 1 {
                        side.push(leader);
                    }
                    side
                }
            };
            for &a in &minority {
                if etcd {
                    // Members led through etcd reach nothing but etcd.
                    net.cut_both(party(cluster, a), Party::Etcd);
                }
                for &b in all.iter().filter(|b| !minority.contains(b)) {
                    net.cut_both(party(cluster, a), party(cluster, b));
                }
            }
            // A probe that talks only to a member of the minority: from
            // the cut on, it must never be granted before the heal.
            let probes: Vec<_> = minority
                .iter()
                .enumerate()
                .map(|(k, &i)| {
                    clients::start_minority_probe(
                        shared,
                        MINORITY_PROBE + n * 8 + k,
                        &cluster.members[i].client_proxy,
                        started + hold,
                    )
                })
                .collect();
            thread::sleep(hold);
            net.heal();
            for p in probes {
                let _ = p.join();
            }
            let names: Vec<String> = minority.iter().map(|&i| name(cluster, i)).collect();
            format!(
                "minority {} cut off, leader {}",
                names.join(","),
                name(cluster, leader)
            )
        }
        Fault::OneWay if etcd => {
            // Its keep-alives are held; what etcd says still comes.
            net.cut(party(cluster, leader), Party::Etcd);
            thread::sleep(hold);
            net.heal();
            format!("etcd no longer hears {}", name(cluster, leader))
        }
        Fault::OneWay => {
            let f = follower(cluster, leader, rng);
            net.cut(party(cluster, leader), party(cluster, f));
            thread::sleep(hold);
            net.heal();
            format!(
                "{} no longer hears {}",
                name(cluster, f),
                name(cluster, leader)
            )
        }
        Fault::Bridge => {
            let f = follower(cluster, leader, rng);
            let bridge: Vec<usize> = all
                .iter()
                .copied()
                .filter(|&i| i != leader && i != f)
                .collect();
            // The leader's side and the follower's side, the others seeing
            // both: in five, two bridges.
            net.cut_both(party(cluster, leader), party(cluster, f));
            thread::sleep(hold);
            net.heal();
            let names: Vec<String> = bridge.iter().map(|&i| name(cluster, i)).collect();
            format!(
                "{} and {} cut apart, {} seeing both",
                name(cluster, leader),
                name(cluster, f),
                names.join(",")
            )
        }
        Fault::ClientsFromLeader => {
            net.cut_both(Party::Clients, party(cluster, leader));
            thread::sleep(hold);
            net.heal();
            format!("clients cut off from {}", name(cluster, leader))
        }
        Fault::SlowLeader => {
            let delay = Duration::from_millis(rng.range(30, 150));
            let me = party(cluster, leader);
            for &b in all.iter().filter(|&&b| b != leader) {
                net.proxy().slow(me, party(cluster, b), delay);
                net.proxy().slow(party(cluster, b), me, delay);
            }
            for other in [Party::Clients, Party::Etcd] {
                net.proxy().slow(me, other, delay);
                net.proxy().slow(other, me, delay);
            }
            thread::sleep(hold);
            net.heal();
            format!(
                "every link of {} slowed by {} ms",
                name(cluster, leader),
                delay.as_millis()
            )
        }
        Fault::ResetLeader => {
            let me = party(cluster, leader);
            for &b in all.iter().filter(|&&b| b != leader) {
                net.proxy().reset(me, party(cluster, b));
            }
            net.proxy().reset(me, Party::Clients);
            net.proxy().reset(me, Party::Etcd);
            format!("every connection of {} reset", name(cluster, leader))
        }
        Fault::Replace => {
            let old = match rng.chance(33) {
                true => leader,
                false => follower(cluster, leader, rng),
            };
            match cluster.spare() {
                Some(new) => cluster.replace(old, new),
                None => "no spare left".to_owned(),
            }
        }
        Fault::Transfer => {
            let to = follower(cluster, leader, rng);
            let done = cluster.transfer(leader, to);
            format!(
                "leadership {} to {} ({})",
                name(cluster, leader),
                name(cluster, to),
                if done { "done" } else { "refused" }
            )
        }
    };
    (detail, started, Instant::now())
}
