//! `ticketing demo`: the whole system on one machine for a few seconds.
//!
//! Two reference servers on free loopback ports (one leads, one follows),
//! many clients over real TCP contending for a few keys, each grant
//! writing to a resource that refuses writes with an older fencing token.
//! Mid-run every connection is cut; later leadership moves to the other
//! node with the lock table carried over; later still that leader crashes
//! without handing the table over, and the first node leads again from a
//! new term with a recovery grace (PROTOCOL.md 4.1): nothing is granted
//! until every grant of the lost table has run out. Then a second act
//! (`demo_raft.rs`): a replicated cluster (PROTOCOL.md 4.3) whose leader
//! stops dead costs an election, not a lease. The run ends with a table
//! and exits non-zero if any safety check failed.

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use ticketing::client::{CancelPolicy, Config, Event, Grant, Outcome, ReleaseResult};
use ticketing::rng::Rng;
use ticketing::server::{self, Role, Server, Term};
use ticketing::tokio::{AcquireError, Handle};
use ticketing::{Endpoint, Key, Name, Time};
use tokio::net::TcpListener;

/// The longest lease the demo's servers give (the workers ask 0.5 to 1.5 s).
const MAX_LEASE: Duration = Duration::from_millis(1_500);

/// Options of `ticketing demo`.
#[derive(ClapArgs)]
pub struct Args {
    /// How long the clients run, in seconds.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = seconds)]
    secs: Duration,
    /// Client connections.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Tasks sharing each connection.
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// Keys they contend for (at least 1).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Seed of the workload and of the clients' jitter.
    #[arg(long, default_value_t = 2026)]
    seed: u64,
}

/// A number of seconds, fractions allowed, as a duration: refused (rather
/// than a panic later) if negative, not finite, or too long to represent.
fn seconds(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| format!("{s:?} is not a number of seconds, at least 0"))
}

/// The storage the locks protect: per key, the highest fencing token it
/// accepted; a write with an older token is refused.
#[derive(Default)]
struct Fenced {
    keys: HashMap<Key, KeyState>,
}

#[derive(Default)]
struct KeyState {
    /// The highest token a write was accepted with.
    accepted: u64,
    /// The highest token granted so far.
    granted: u64,
    /// The current holder as the clients see it: token and valid until.
    holder: Option<(u64, Instant)>,
}

/// What the run counts.
#[derive(Default)]
struct Stats {
    outcomes: Mutex<BTreeMap<&'static str, u64>>,
    latencies_us: Mutex<Vec<u64>>,
    writes: AtomicU64,
    stale_refused: AtomicU64,
    violations: Mutex<Vec<String>>,
}

impl Stats {
    fn count(&self, what: &'static str) {
        *self
            .outcomes
            .lock()
            .expect("stats")
            .entry(what)
            .or_default() += 1;
    }

    fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.lock().expect("stats").push(what);
    }

    fn get(&self, what: &str) -> u64 {
        self.outcomes
            .lock()
            .expect("stats")
            .get(what)
            .copied()
            .unwrap_or(0)
    }
}

struct World {
    fenced: Mutex<Fenced>,
    stats: Stats,
}

impl World {
    /// A grant arrived: no other valid holder, tokens strictly increasing.
    fn granted(&self, key: &Key, token: u64, valid_until: Instant) {
        let now = Instant::now();
        let mut fenced = self.fenced.lock().expect("fenced");
        let state = fenced.keys.entry(key.clone()).or_default();
        if token <= state.granted {
            self.stats.violation(format!(
                "{key}: token {token} granted after token {}",
                state.granted
            ));
        }
        if let Some((other, until)) = state.holder {
            if until > now {
                self.stats.violation(format!(
                    "{key}: token {token} granted while token {other} is valid for {:?} more",
                    until - now
                ));
            }
        }
        state.granted = state.granted.max(token);
        state.holder = Some((token, valid_until));
    }

    /// The holder gave the grant up.
    fn released(&self, key: &Key, token: u64) {
        let mut fenced = self.fenced.lock().expect("fenced");
        if let Some(state) = fenced.keys.get_mut(key) {
            if state.holder.is_some_and(|(t, _)| t == token) {
                state.holder = None;
            }
        }
    }

    /// A write with `token`: accepted if no newer token wrote before.
    fn write(&self, key: &Key, token: u64) -> bool {
        let mut fenced = self.fenced.lock().expect("fenced");
        let state = fenced.keys.entry(key.clone()).or_default();
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        if token >= state.accepted {
            state.accepted = token;
            true
        } else {
            false
        }
    }
}

pub async fn run(args: Args) -> Result<ExitCode, Box<dyn Error>> {
    let origin = Instant::now();
    let secs = args.secs.as_secs_f64();
    let (listener_a, listener_b) = (
        TcpListener::bind("127.0.0.1:0").await?,
        TcpListener::bind("127.0.0.1:0").await?,
    );
    let (addr_a, addr_b) = (
        Endpoint::new(listener_a.local_addr()?.to_string())?,
        Endpoint::new(listener_b.local_addr()?.to_string())?,
    );
    let node = |name: &str, role: Role| -> Result<Server, Box<dyn Error>> {
        let mut config = server::Config::new(Name::new(name)?);
        config.role = role;
        config.queue_limit = 64;
        // The workers' leases are at most 1.5 s: a grace is 1.8 s.
        config.max_lease = MAX_LEASE;
        config.grace_margin = Duration::from_millis(300);
        Ok(Server::new(config, Time::ZERO)?)
    };
    let server_a =
        ticketing::serve::spawn_with_origin(listener_a, node("node-a", Role::Leader)?, origin)?;
    let server_b = ticketing::serve::spawn_with_origin(
        listener_b,
        node(
            "node-b",
            Role::Follower {
                leader: addr_a.clone(),
            },
        )?,
        origin,
    )?;
    println!("ticketing demo: node-a {addr_a} leads, node-b {addr_b} follows");
    println!(
        "{} clients x {} tasks on {} keys for {:.1} s; every grant writes to a fenced resource",
        args.clients, args.tasks, args.keys, secs
    );

    let world = Arc::new(World {
        fenced: Mutex::new(Fenced::default()),
        stats: Stats::default(),
    });
    let orphans = Arc::new(Mutex::new(BTreeMap::<&'static str, u64>::new()));
    let keys: Arc<Vec<Key>> = Arc::new(
        (0..args.keys)
            .map(|i| Key::new(format!("key-{i}")))
            .collect::<Result<_, _>>()?,
    );
    let stop_at = Instant::now()
        .checked_add(args.secs)
        .ok_or("--secs is too long a run")?;
    let mut handles = Vec::new();
    let mut workers = Vec::new();
    let mut listeners = Vec::new();
    for c in 0..args.clients {
        let mut config = Config::new(
            [addr_a.clone(), addr_b.clone()],
            Name::new(format!("demo-{c}"))?,
        );
        config.seed = args.seed.wrapping_add(c as u64);
        config.cancel = if c % 2 == 0 {
            CancelPolicy::Close
        } else {
            CancelPolicy::KeepWaiter
        };
        let (handle, mut notices) =
            ticketing::tokio::spawn_with_notices(config, ticketing::tokio::TcpConnector)?;
        let orphans = Arc::clone(&orphans);
        listeners.push(tokio::spawn(async move {
            while let Some(event) = notices.recv().await {
                if let Event::OrphanSettled { result, .. } = event {
                    let what = match result {
                        ReleaseResult::Released => "released",
                        ReleaseResult::NotHeld => "not held",
                        _ => "lapsed",
                    };
                    *orphans.lock().expect("orphans").entry(what).or_default() += 1;
                }
            }
        }));
        for t in 0..args.tasks {
            let seed = args.seed ^ ((c * 1000 + t) as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let owner = Name::new(format!("c{c}t{t}"))?;
            workers.push(tokio::spawn(worker(
                handle.clone(),
                Arc::clone(&world),
                Arc::clone(&keys),
                owner,
                seed,
                stop_at,
            )));
        }
        handles.push(handle);
    }

    // The timeline: cut every connection at a fifth, move leadership at
    // two fifths, crash the new leader at half time, report progress twice
    // a second.
    let started = Instant::now();
    let (mut cut, mut moved, mut crashed) = (false, false, false);
    while Instant::now() < stop_at {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let elapsed = started.elapsed().as_secs_f64();
        if !cut && elapsed >= secs / 5.0 {
            cut = true;
            server_a.drop_connections();
            println!("[{elapsed:4.1}s] every connection to node-a cut mid-flight");
        }
        if !moved && elapsed >= 2.0 * secs / 5.0 {
            moved = true;
            server_b.set_role(Role::NotActive);
            server_a.set_role(Role::Follower {
                leader: addr_b.clone(),
            });
            let table = server_a.take_lock_table().await?;
            server_b.install_lock_table(table);
            server_b.set_role(Role::Leader);
            println!("[{elapsed:4.1}s] leadership moved to node-b, lock table carried over");
        }
        if moved && !crashed && elapsed >= secs / 2.0 {
            crashed = true;
            // node-b's clients lose it at once, and its table is lost with
            // it: node-a leads from a term of a later epoch, with a grace.
            server_b.drop_connections();
            server_b.set_role(Role::NoLeader);
            let now = ticketing::state::unix_now();
            let epoch = ticketing::server::next_epoch(0, now);
            let grace = MAX_LEASE + Duration::from_millis(300);
            server_a
                .begin_term(Term::Recovered {
                    epoch,
                    max_lease: MAX_LEASE,
                })
                .await??;
            server_a.set_role(Role::Leader);
            server_b.set_role(Role::Follower {
                leader: addr_a.clone(),
            });
            println!(
                "[{elapsed:4.1}s] node-b crashed without handing its table over: node-a leads a new term (epoch {epoch}), no grant for {:.1} s (recovery grace)",
                grace.as_secs_f64()
            );
        }
        progress(elapsed, &world.stats);
    }
    // Every operation ends: each worker's last await returns, and each
    // shutdown drains its release lane.
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(30), worker)
            .await
            .map_err(|_| "a worker never got its outcome")??;
    }
    for handle in &handles {
        handle.shutdown(Duration::from_secs(3)).await?;
    }
    drop(handles);
    for listener in listeners {
        listener.await?;
    }
    server_a.stop().await?;
    server_b.stop().await?;

    // The second act: a leader crash on a replicated cluster.
    let replicated = crate::demo_raft::run().await?;
    world
        .stats
        .violations
        .lock()
        .expect("stats")
        .extend(replicated);

    let stats = &world.stats;
    report(stats, &orphans.lock().expect("orphans"));
    let failed = !stats.violations.lock().expect("stats").is_empty();
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One task: acquire a random key, write, hold a little, write again,
/// release; now and then drop a waiting acquire, hand a grant back, forget
/// one (its lease frees it), or write late with an old token.
async fn worker(
    handle: Handle,
    world: Arc<World>,
    keys: Arc<Vec<Key>>,
    owner: Name,
    seed: u64,
    stop_at: Instant,
) {
    let mut rng = Rng::new(seed);
    let stats = &world.stats;
    while Instant::now() < stop_at {
        let key = keys[rng.up_to(keys.len() as u64 - 1) as usize].clone();
        let wait = Duration::from_millis(100 + rng.up_to(400));
        let lease = Duration::from_millis(500 + rng.up_to(1_000));
        let began = Instant::now();
        let acquire = handle
            .acquire(key.clone())
            .owner(owner.clone())
            .wait(wait)
            .lease(lease)
            .start();
        let outcome = if rng.chance(1, 25) {
            // The caller gives up early: dropping the future cancels it.
            let patience = Duration::from_millis(1 + rng.up_to(30));
            match tokio::time::timeout(patience, acquire).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    stats.count("acquire dropped by its caller");
                    continue;
                }
            }
        } else {
            acquire.await
        };
        stats
            .latencies_us
            .lock()
            .expect("stats")
            .push(began.elapsed().as_micros() as u64);
        let grant = match outcome {
            Ok(grant) => {
                stats.count("acquire granted");
                grant
            }
            Err(AcquireError::TimedOut { .. }) => {
                stats.count("acquire timed out");
                continue;
            }
            Err(AcquireError::Busy) => {
                stats.count("acquire busy");
                continue;
            }
            Err(AcquireError::Indeterminate { .. }) => {
                stats.count("acquire indeterminate");
                continue;
            }
            Err(AcquireError::Cancelled) => {
                stats.count("acquire cancelled");
                continue;
            }
            Err(e) => {
                stats.count("acquire refused");
                if Instant::now() < stop_at {
                    stats.violation(format!("an acquire was refused: {e}"));
                }
                continue;
            }
        };
        hold(&handle, &world, &mut rng, grant, stop_at).await;
    }
}

/// Uses a grant, then gives it up one way or another.
async fn hold(handle: &Handle, world: &World, rng: &mut Rng, grant: Grant, stop_at: Instant) {
    let stats = &world.stats;
    let key = grant.key().clone();
    let valid_until = handle
        .instant_of(grant.valid_until())
        .unwrap_or_else(Instant::now);
    world.granted(&key, grant.token(), valid_until);
    for _ in 0..2 {
        if Instant::now() >= valid_until {
            break;
        }
        if !world.write(&key, grant.token()) {
            stats.violation(format!(
                "{key}: a write with valid token {} was refused",
                grant.token()
            ));
        }
        tokio::time::sleep(Duration::from_millis(1 + rng.up_to(5))).await;
    }
    if rng.chance(1, 80) && Instant::now() < stop_at {
        // The holder "crashes": nobody releases; the lease frees the key.
        stats.count("grant forgotten (lease expiry frees it)");
        return;
    }
    world.released(&key, grant.token());
    if rng.chance(1, 30) {
        // The grant cannot be delivered any more: the core releases it.
        stats.count("grant handed back (orphan release)");
        let _ = handle.undeliverable(grant);
        return;
    }
    let outcome = handle.release(&grant).await;
    stats.count(match outcome {
        Ok(Outcome::Released) => "release released",
        Ok(Outcome::NotHeld) => "release not held",
        Ok(Outcome::Lapsed) => "release lapsed",
        _ => "release failed",
    });
    if rng.chance(1, 8) {
        // A late write with the old token, as a paused process would make.
        tokio::time::sleep(Duration::from_millis(rng.up_to(20))).await;
        if !world.write(&key, grant.token()) {
            stats.stale_refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn progress(elapsed: f64, stats: &Stats) {
    println!(
        "[{elapsed:4.1}s] granted {:>6}  timed out {:>6}  indeterminate {:>4}  released {:>6}  stale writes refused {:>4}  violations {}",
        stats.get("acquire granted"),
        stats.get("acquire timed out"),
        stats.get("acquire indeterminate"),
        stats.get("release released"),
        stats.stale_refused.load(Ordering::Relaxed),
        stats.violations.lock().expect("stats").len(),
    );
}

fn report(stats: &Stats, orphans: &BTreeMap<&'static str, u64>) {
    println!();
    println!("operations by outcome");
    for (what, n) in stats.outcomes.lock().expect("stats").iter() {
        println!("  {what:<42} {n:>8}");
    }
    let mut lat = stats.latencies_us.lock().expect("stats").clone();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len().saturating_sub(1)) as f64 * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "acquire latency                              p50 {:.2} ms   p99 {:.2} ms",
        pct(0.50) as f64 / 1000.0,
        pct(0.99) as f64 / 1000.0
    );
    println!(
        "fenced writes                                {:>8}",
        stats.writes.load(Ordering::Relaxed)
    );
    println!(
        "stale writes refused                         {:>8}",
        stats.stale_refused.load(Ordering::Relaxed)
    );
    let orphan_total: u64 = orphans.values().sum();
    let detail: Vec<String> = orphans.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "orphans released by exact token              {orphan_total:>8}   ({})",
        detail.join(", ")
    );
    // The report ends with the number of violations (CLI.md), after them.
    let violations = stats.violations.lock().expect("stats");
    for v in violations.iter() {
        println!("violation: {v}");
    }
    println!(
        "violations                                   {:>8}",
        violations.len()
    );
}
