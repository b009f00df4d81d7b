//! The simulator's own speed: simulated events per second of wall time.
//!
//! `cargo bench --features sim --bench sim` runs seeds 0..N (N = 1,000, or
//! `TICKETING_BENCH_SEEDS`) of the default configuration twice: on one
//! thread, then on every available core, and prints events, wall time and
//! events per second for each (after a warm-up of 20 seeds). An event is
//! one step of the simulation: a delivery on the simulated network, a
//! client or server timer, a workload command, or a fault. Each event
//! includes the work of the checks (six invariants per client, the global
//! checks).

use std::hint::black_box;
use std::time::Instant;

use ticketing::sim::{self, SimConfig};

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects nothing here.
    let seeds: u64 = std::env::var("TICKETING_BENCH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000);
    let config = SimConfig::default();
    black_box(sim::run_seeds(1_000_000, 20, &config, 1));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut jobs_list = vec![1];
    if cores > 1 {
        jobs_list.push(cores);
    }
    let mut hashes = Vec::new();
    for jobs in jobs_list {
        let started = Instant::now();
        let report = black_box(sim::run_seeds(0, seeds, &config, jobs));
        let wall = started.elapsed().as_secs_f64();
        assert!(report.violations.is_empty(), "{report}");
        hashes.push(report.trace_hash);
        println!(
            "sim: {seeds} seeds, {} events, {:.1} s of virtual time, in {wall:.2} s on {jobs} thread{}: {:.0} events/s ({:.0} per thread)",
            report.events,
            report.virtual_time.as_secs_f64(),
            if jobs == 1 { "" } else { "s" },
            report.events as f64 / wall,
            report.events as f64 / wall / jobs as f64,
        );
    }
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "the trace hash depends on the threads"
    );
}
