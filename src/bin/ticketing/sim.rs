//! `ticketing sim`: the deterministic simulator over many seeds, and its
//! report (the library's `ticketing::sim`).
//!
//! Every seed is a whole run (client cores, a cluster of server cores, a
//! simulated network with faults, checks after every step). The report
//! gives seeds, events, operations by outcome, faults injected by kind,
//! leader changes and how many renewing holders kept their grants across
//! them, violations, the trace hash, and events per second (wall clock: the only
//! clock read, here, outside the simulation). A violation prints its seed,
//! what broke, and one command that replays it; the exit status is then 1.

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
#[cfg(feature = "sabotage")]
use ticketing::sim::Sabotage;
use ticketing::sim::{self, Scenario, SimConfig};

/// Options of `ticketing sim`.
#[derive(ClapArgs)]
pub struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print each run's readable log (meant for one seed).
    #[arg(long)]
    trace: bool,
    /// Threads to run seeds on (default: the available parallelism). The
    /// report, trace hash included, does not depend on it.
    #[arg(long)]
    jobs: Option<usize>,
    /// What happens: mixed (every kind of fault), leader-crash (the
    /// leader crashes, again and again, under holders that renew), or
    /// raft and raft5 (a replicated cluster of 3 or 5 members, under
    /// crashes, disk losses, partitions and lost messages, with the
    /// holders of leader-crash).
    #[arg(long, default_value_t = Scenario::Mixed)]
    scenario: Scenario,
    /// Client cores per run.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Server nodes per run.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Virtual milliseconds of workload with faults.
    #[arg(long, default_value_t = 10_000)]
    fault_ms: u64,
    /// Virtual milliseconds of workload after faults stop.
    #[arg(long, default_value_t = 15_000)]
    calm_ms: u64,
    /// Inject no faults.
    #[arg(long)]
    no_faults: bool,
    /// Break one rule on purpose, to see the checks catch it:
    /// match-by-arrival, resend-after-close, use-reserved-slot,
    /// drop-orphan-release, any-hint, stale-hints,
    /// valid-until-from-arrival (the clients' rules), no-grace (the
    /// server's), or answer-before-commit (the replicated cluster's, with
    /// --scenario raft or raft5).
    #[cfg(feature = "sabotage")]
    #[arg(long)]
    sabotage: Option<Sabotage>,
    /// Break the cluster on purpose instead: a new leader starts with an
    /// empty lock table, to see the global checks catch it. A broken
    /// server like the sabotages, so only where they are (CLI.md: the
    /// shipped binary has none).
    #[cfg(feature = "sabotage")]
    #[arg(long, hide = true)]
    forget_lock_table: bool,
}

pub async fn run(args: Args) -> Result<ExitCode, Box<dyn Error>> {
    let mut config = SimConfig::default();
    config.scenario = args.scenario;
    config.clients = args.clients;
    config.nodes = args.nodes.max(1);
    config.fault_time = Duration::from_millis(args.fault_ms);
    config.calm_time = Duration::from_millis(args.calm_ms);
    config.faults = !args.no_faults;
    config.trace = args.trace;
    #[cfg(feature = "sabotage")]
    {
        config.sabotage = args.sabotage;
        config.forget_lock_table = args.forget_lock_table;
    }
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let started = Instant::now();
    let report =
        tokio::task::block_in_place(|| sim::run_seeds(args.seed, args.seeds, &config, jobs));
    let wall = started.elapsed();
    for line in &report.log {
        println!("{line}");
    }
    println!(
        "seeds {}..{} ({} clients, {} nodes{})",
        args.seed,
        args.seed.wrapping_add(args.seeds),
        config.clients,
        config.nodes,
        config.cli_args()
    );
    println!("{report}");
    let per_second = report.events as f64 / wall.as_secs_f64().max(1e-9);
    println!(
        "events per second: {per_second:.0} ({:.2} s wall, {jobs} thread{})",
        wall.as_secs_f64(),
        if jobs == 1 { "" } else { "s" }
    );
    if report.violations.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for v in &report.violations {
            eprintln!("VIOLATION {v}");
        }
        Ok(ExitCode::FAILURE)
    }
}
