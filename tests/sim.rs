//! The simulator (`ticketing::sim`): a thousand seeds under faults with no
//! violation, leader crashes that cost no renewing holder its grant,
//! determinism, and proof that the checks can fail.
//!
//! Every sabotage (feature `sabotage`) is a bad client around an unmodified
//! core that breaks one client rule of PROTOCOL.md section 5 (or, for
//! `no-grace`, a cluster that breaks the server's recovery grace); each
//! test states within how many seeds the simulator catches it, and asserts
//! it for runs starting at several seeds. The numbers are the worst waits
//! measured over seeds 0..1000, from any starting seed, rounded up
//! (`ticketing sim --seeds 1000 --sabotage NAME` lists every seed caught),
//! with the clients on protocol version 2 and the workload renewing:
//!
//! | sabotage | seeds caught of 1,000 | worst wait | stated | first caught by |
//! |---|---|---|---|---|
//! | match-by-arrival | 642 | 9 | 10 | invariant 2 (537), 3 (93), 1 (8), protocol (4) |
//! | resend-after-close | 953 | 3 | 3 | invariant 1 |
//! | use-reserved-slot | 760 | 5 | 5 | invariant 4 |
//! | drop-orphan-release | 514 | 11 | 12 | invariant 5 (323), protocol (187), lingering (4) |
//! | any-hint | 350 | 16 | 16 | protocol: a `LeaderHint` where `HintIgnored` was due |
//! | stale-hints | 793 | 5 | 5 | protocol: a connect to a stale hint where the round called for another address or a backoff |
//! | valid-until-from-arrival | 861 | 4 | 4 | invariant 7 |
//! | (the server) no-grace | 294 | 17 | 20 | mutual exclusion (293), fencing (1) |
//! | (the cluster) forget-lock-table | 878 | 4 | 5 | mutual exclusion (391), fencing (478), other (9) |
//!
//! `drop-orphan-release` is caught two ways: once the release lapses while
//! the grant's lease still runs (or the grant outlives the release's
//! deadline), and, since the workload renews, as soon as a renewal waits
//! for a slot that the dropped `R` still fills in the core's window while
//! the wire shows it free. With a short lease and no renewal, lease expiry
//! frees the grant first and nothing shows.
//!
//! `stale-hints` is caught in the default scenario wherever a connection
//! failed (a refused connect, a reset, a crash) and a node named that
//! address within the second after; in the leader-crash scenario, where
//! the followers name the leader that just crashed, in every seed of
//! 1,000, at its first crash.
//!
//! `forget-lock-table` makes a new leader start over with an empty table
//! and its token counter lost, so tokens repeat. In 9 seeds of 1,000 that
//! shows first elsewhere: to a client's checker, which tells grants apart
//! by key and token, as a renewal nobody asked for or one of an expired
//! grant (8), or to the settle watch of an Indeterminate acquire, which
//! follows tokens (1). The test asserts the global checks from its
//! starting seeds.

use std::collections::BTreeSet;
use std::time::Duration;

use ticketing::sim::{self, Check, FaultKind, Report, Scenario, SimConfig, Violation};

/// The sweep's seeds.
const SWEEP: u64 = 1_000;
/// The leader-crash scenario's sweep: some 400 crashes, two a seed on
/// average, in a few seconds.
const LEADER_CRASH_SWEEP: u64 = 200;

/// The default configuration in `scenario`.
fn in_scenario(scenario: Scenario) -> SimConfig {
    let mut config = SimConfig::default();
    config.scenario = scenario;
    config
}

#[test]
fn a_thousand_seeds_under_every_fault_break_no_check() {
    let report = sim::run_seeds(0, SWEEP, &SimConfig::default(), 2);
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.seeds, SWEEP);
    // Every kind of fault actually happened.
    for kind in FaultKind::ALL {
        assert!(
            report.faults.get(kind) > 0,
            "no {kind:?} in {SWEEP} seeds\n{report}"
        );
    }
    // Every outcome occurred.
    let o = report.operations;
    for (name, count) in [
        ("granted", o.granted),
        ("timed_out", o.timed_out),
        ("timed_out_unsent", o.timed_out_unsent),
        ("busy", o.busy),
        ("cancelled", o.cancelled),
        ("indeterminate", o.indeterminate),
        ("released", o.released),
        ("not_held", o.not_held),
        ("lapsed", o.lapsed),
        ("refused", o.refused),
        ("orphan_releases", o.orphan_releases),
        ("renew_calls", o.renew_calls),
        ("renewed", o.renewed),
        ("jeopardies", o.jeopardies),
        ("leases_lost", o.leases_lost),
        ("leases_expired", o.leases_expired),
    ] {
        assert!(count > 0, "no {name} outcome\n{report}");
    }
    // The global checks had something to look at.
    assert!(report.checked.holds > 10_000, "{report}");
    assert!(report.checked.settle_watches > 1_000, "{report}");
    // (Fewer since the workload renews: some of the grants it releases
    // had been renewed, and their renewals' deadlines outlast the watch.)
    assert!(report.checked.release_watches > 300, "{report}");
    assert!(report.checked.renewals > 10_000, "{report}");
    assert!(
        report.writes.valid > 1_000 && report.writes.stale_refused > 0,
        "{report}"
    );
    assert!(report.events > 100 * SWEEP, "{report}");
    // Leader changes are counted here too; faults may cost a holder its
    // grant (a partition, a refused credential, a lease shorter than the
    // outage), but many keep theirs.
    let f = report.failovers;
    assert!(f.leader_changes > SWEEP && f.kept > 1_000, "{report}");
    assert!(f.kept + f.lost + f.given_up <= f.holders, "{report}");
}

#[test]
fn every_renewing_holder_keeps_its_grant_across_leader_crashes() {
    let reports: Vec<Report> = (0..LEADER_CRASH_SWEEP)
        .map(|seed| sim::run(seed, &in_scenario(Scenario::LeaderCrash)))
        .collect();
    let mut all = Report::default();
    for report in reports {
        assert!(report.violations.is_empty(), "{report}");
        // The leader crashes in every seed, each crash a change with
        // holders at it.
        let f = report.failovers;
        assert!(f.leader_changes >= 1, "{report}");
        assert_eq!(f.leader_changes, report.faults.get(FaultKind::Crash));
        assert!(f.holders >= f.leader_changes, "{report}");
        all.add(report);
    }
    let f = all.failovers;
    assert_eq!(f.kept, f.holders, "{all}");
    assert_eq!((f.lost, f.given_up), (0, 0), "{all}");
    assert!(f.leader_changes > LEADER_CRASH_SWEEP, "{all}");
    // The closest call: a renewal in flight lost with the leader leaves two
    // thirds of the shortest lease (7.5 s) to go, 5 s; the new leader comes
    // at most 2.5 s later; the next round within a quarter of what is left
    // (the cap a held lease puts on the wait), 0.63 s; then three round
    // trips (connect, `H`/`W`, `X`/`G`), 0.2 s at most. So more than 1.6 s
    // is left, whatever the seed (1.74 s at the closest in 10,000 seeds).
    let least = f.least_left.expect("grants were kept");
    assert!(least > Duration::from_millis(1_500), "{all}");
    // Half the crashes lose the lock table (the holders reclaim their
    // grants in the new leader's recovery grace), half hand it over.
    let crashes = all.faults.get(FaultKind::Crash);
    let lost_tables = all.faults.get(FaultKind::LostTable);
    assert!(
        lost_tables > crashes / 4 && lost_tables < crashes * 3 / 4,
        "{all}"
    );
    // No random fault: crashes, and the restarts that follow them.
    for kind in FaultKind::ALL {
        if !matches!(
            kind,
            FaultKind::Crash | FaultKind::Restart | FaultKind::NotActive | FaultKind::LostTable
        ) {
            assert_eq!(all.faults.get(kind), 0, "{kind:?}\n{all}");
        }
    }
    // Light traffic beside the holders, written with under valid grants.
    let o = all.operations;
    assert!(o.renewed > f.kept && o.released > 100, "{all}");
    assert!(all.writes.valid > 1_000, "{all}");
}

#[test]
fn a_crashed_leader_is_named_by_the_followers_until_its_key_expires() {
    let mut config = in_scenario(Scenario::LeaderCrash);
    config.trace = true;
    let report = sim::run(0, &config);
    assert!(report.violations.is_empty(), "{report}");
    let log = &report.log;
    let at = |what: &str, from: usize| {
        log[from..]
            .iter()
            .position(|line| line.contains(what))
            .map(|i| from + i)
            .unwrap_or_else(|| panic!("no {what:?} after line {from}"))
    };
    let crash = at("fault: the leader n0 crashes", 0);
    let expiry = at("n0's election key expires", crash);
    // Until then the followers answer a handshake with `M n0` (the
    // checker makes sure that no client follows it while n0 is stale).
    let moved = at(r#": "M n0:7000\n""#, crash);
    assert!(moved < expiry, "{}", log[moved]);
    // Then another node leads, and the holders' grants are renewed.
    let leads = at(" leads", expiry);
    assert!(!log[leads].contains("n0 "), "{}", log[leads]);
    at("event Renewed", leads);
}

#[test]
fn the_workload_renews_under_every_fault_kind() {
    // Seed by seed: for every kind of fault, a seed in which it happened
    // and grants were renewed (invariant 7 is checked after every step of
    // each), and over them all, renewals by hand and automatic ones, with
    // and without a limit, told Renewed, in jeopardy, lost and expired.
    let config = SimConfig::default();
    let reports: Vec<Report> = (0..60).map(|seed| sim::run(seed, &config)).collect();
    for report in &reports {
        assert!(report.violations.is_empty(), "{report}");
    }
    for kind in FaultKind::ALL {
        assert!(
            reports
                .iter()
                .any(|r| r.faults.get(kind) > 0 && r.operations.renewed > 0),
            "no seed of 60 renewed under {kind:?}"
        );
    }
    let mut all = Report::default();
    for report in reports {
        all.add(report);
    }
    let o = all.operations;
    assert!(o.renew_calls > 100 && o.renewed > 1_000, "{all}");
    assert!(
        o.jeopardies > 0 && o.leases_lost > 0 && o.leases_expired > 0,
        "{all}"
    );
    assert!(all.checked.renewals > 500, "{all}");
}

#[test]
fn the_same_seed_gives_the_same_trace_and_other_seeds_do_not() {
    for scenario in Scenario::ALL {
        let config = in_scenario(scenario);
        for seed in [0, 7, 12_345, u64::MAX] {
            let first = sim::run(seed, &config);
            let second = sim::run(seed, &config);
            assert_eq!(first, second, "seed {seed} ran differently twice");
            assert!(first.events > 0);
        }
        let hashes: BTreeSet<u64> = (100..140)
            .map(|seed| sim::run(seed, &config).trace_hash)
            .collect();
        assert_eq!(hashes.len(), 40, "two seeds gave the same trace hash");
        // Threads change nothing, the trace hash included.
        assert_eq!(
            sim::run_seeds(0, 12, &config, 1),
            sim::run_seeds(0, 12, &config, 2)
        );
    }
}

#[test]
fn a_trace_is_kept_on_request_and_changes_nothing_else() {
    let quiet = sim::run(3, &SimConfig::default());
    let mut config = SimConfig::default();
    config.trace = true;
    let traced = sim::run(3, &config);
    assert!(quiet.log.is_empty());
    assert!(traced.log.len() > 100);
    assert!(traced.log.iter().any(|line| line.contains("fault:")));
    assert_eq!(traced.trace_hash, quiet.trace_hash);
    assert_eq!(traced.events, quiet.events);
}

#[test]
fn without_faults_nothing_is_injected_and_nothing_breaks() {
    let mut config = SimConfig::default();
    config.faults = false;
    let report = sim::run_seeds(0, 20, &config, 1);
    assert!(report.violations.is_empty(), "{report}");
    for kind in FaultKind::ALL {
        if kind != FaultKind::Busy {
            assert_eq!(report.faults.get(kind), 0, "{kind:?} without faults");
        }
    }
    assert!(report.operations.granted > 0, "{report}");
}

/// Runs seeds `start..start + within` with `config` and returns the first
/// violation.
fn first_catch(config: &SimConfig, start: u64, within: u64) -> Option<Violation> {
    (start..start + within).find_map(|seed| {
        let report: Report = sim::run(seed, config);
        report.violations.into_iter().next()
    })
}

#[test]
fn a_cluster_that_forgets_its_lock_table_is_caught_within_5_seeds() {
    // Not a client rule: the global checks' own evidence. A new leader that
    // starts with an empty table grants keys still held.
    let mut config = SimConfig::default();
    config.forget_lock_table = true;
    for start in [0, 300, 600] {
        let v = first_catch(&config, start, 5).expect("caught");
        assert!(
            matches!(v.check, Check::MutualExclusion | Check::Fencing),
            "{v}"
        );
    }
}

/// The bad clients: each sabotage caught, within how many seeds.
#[cfg(feature = "sabotage")]
mod sabotage {
    use ticketing::sim::{self, Check, Invariant, Sabotage, Scenario};

    use super::{first_catch, in_scenario};

    /// Asserts that `sabotage` is caught within `within` seeds from each of a
    /// few starting seeds, by one of `checks`, and that the violation names a
    /// replay command for its own seed and sabotage.
    fn caught(sabotage: Sabotage, within: u64, checks: &[Check]) {
        caught_in(Scenario::Mixed, sabotage, within, checks);
    }

    /// As [`caught`], in `scenario`.
    fn caught_in(scenario: Scenario, sabotage: Sabotage, within: u64, checks: &[Check]) {
        let mut config = in_scenario(scenario);
        config.sabotage = Some(sabotage);
        let name = sabotage.name();
        let scenario_args = match scenario {
            Scenario::Mixed => String::new(),
            other => format!(" --scenario {other}"),
        };
        for start in [0, 300, 600] {
            let v = first_catch(&config, start, within).unwrap_or_else(|| {
                panic!("{name} was not caught in seeds {start}..{}", start + within)
            });
            assert!(
                checks.contains(&v.check),
                "{name} was caught by an unexpected check: {v}"
            );
            assert_eq!(
                v.replay,
                format!(
                    "ticketing sim --seed {} --seeds 1 --trace{scenario_args} --sabotage {name}",
                    v.seed
                )
            );
            // The replay finds the same.
            let again = sim::run(v.seed, &config);
            assert_eq!(again.violations.first(), Some(&v));
        }
        // Without the sabotage, the same seeds pass.
        let report = sim::run_seeds(0, within, &in_scenario(scenario), 1);
        assert!(report.violations.is_empty(), "{report}");
    }

    #[test]
    fn matching_by_arrival_order_is_caught_within_10_seeds() {
        caught(
            Sabotage::MatchByArrival,
            10,
            &[
                Check::Invariant(Invariant::Attribution),
                Check::Invariant(Invariant::NoResend),
                Check::Invariant(Invariant::OneOutcome),
                Check::Invariant(Invariant::Protocol),
            ],
        );
    }

    #[test]
    fn resending_an_acquire_after_a_close_is_caught_within_3_seeds() {
        caught(
            Sabotage::ResendAfterClose,
            3,
            &[
                Check::Invariant(Invariant::OneOutcome),
                // The close that should have ended it Indeterminate is
                // caught at once; the second `A`, and what is matched to
                // it, would be next.
                Check::Invariant(Invariant::NoResend),
                Check::Invariant(Invariant::Attribution),
            ],
        );
    }

    #[test]
    fn acquires_in_the_reserved_slot_are_caught_within_5_seeds() {
        caught(
            Sabotage::UseReservedSlot,
            5,
            &[Check::Invariant(Invariant::Window)],
        );
    }

    #[test]
    fn dropping_the_orphan_release_is_caught_within_12_seeds() {
        caught(
            Sabotage::DropOrphanRelease,
            12,
            &[
                Check::Invariant(Invariant::OrphanRelease),
                // The dropped `R` still fills a slot of the core's window:
                // a renewal waits although the wire shows a free slot.
                Check::Invariant(Invariant::Protocol),
                // The grant outlives the release's deadline.
                Check::Lingering,
            ],
        );
    }

    #[test]
    fn hints_from_outside_the_allowlist_are_caught_within_16_seeds() {
        caught(
            Sabotage::AnyHint,
            16,
            &[
                Check::Allowlist,
                // The checker, which keeps the honest allowlist, expects a
                // HintIgnored where the bad client tells a LeaderHint.
                Check::Invariant(Invariant::Protocol),
            ],
        );
    }

    #[test]
    fn following_a_stale_hint_is_caught_within_5_seeds() {
        // The checker, which keeps the honest `stale_hint` of 1 s, expects
        // the round to skip the address that failed a moment ago.
        let by = [Check::Invariant(Invariant::Protocol)];
        caught(Sabotage::StaleHints, 5, &by);
        // Where followers name a leader that just crashed: at once.
        caught_in(Scenario::LeaderCrash, Sabotage::StaleHints, 1, &by);
    }

    #[test]
    fn valid_until_from_the_arrival_of_a_renewals_g_is_caught_within_4_seeds() {
        caught(
            Sabotage::ValidUntilFromArrival,
            4,
            &[
                Check::Invariant(Invariant::Renewal),
                Check::MutualExclusion,
                Check::Fencing,
            ],
        );
    }

    #[test]
    fn a_new_leader_without_a_recovery_grace_is_caught_within_20_seeds() {
        // The server's rule, not a client's: a leader elected after the
        // table was lost grants keys whose grants clients still hold.
        caught(
            Sabotage::NoGrace,
            20,
            &[Check::MutualExclusion, Check::Fencing],
        );
    }
}

/// `ticketing sim`, the command line (CLI.md), when the binary is built.
#[cfg(feature = "cli")]
mod command_line {
    use std::process::{Command, Output};

    fn sim(args: &[&str]) -> (Output, String, String) {
        let output = Command::new(env!("CARGO_BIN_EXE_ticketing"))
            .arg("sim")
            .args(args)
            .output()
            .expect("the binary runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output, stdout, stderr)
    }

    #[test]
    fn the_report_has_every_part_and_its_hash_does_not_depend_on_threads() {
        let (out, stdout, stderr) = sim(&["--seeds", "6", "--seed", "40", "--jobs", "2"]);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        for part in [
            "seeds: 6",
            "events: ",
            "operations: ",
            "  acquire: granted ",
            "  release: released ",
            "faults injected: ",
            "latency ",
            "auth_refused ",
            "leader changes: ",
            "violations: 0",
            "trace hash: 0x",
            "events per second: ",
        ] {
            assert!(stdout.contains(part), "no {part:?} in:\n{stdout}");
        }
        let hash = |text: &str| {
            text.lines()
                .find(|l| l.starts_with("trace hash: "))
                .map(str::to_owned)
                .expect("a trace hash")
        };
        let (_, again, _) = sim(&["--seeds", "6", "--seed", "40", "--jobs", "1"]);
        assert_eq!(hash(&stdout), hash(&again));
    }

    #[test]
    fn a_scenario_is_chosen_by_name_and_an_unknown_one_is_refused() {
        let (out, stdout, stderr) = sim(&["--scenario", "leader-crash", "--seeds", "3"]);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(
            stdout.contains("seeds 0..3 (4 clients, 3 nodes --scenario leader-crash)"),
            "{stdout}"
        );
        assert!(
            stdout.contains(" 0 lost it, 0 gave it up first"),
            "{stdout}"
        );
        assert!(stdout.contains("violations: 0"), "{stdout}");
        let (out, _, stderr) = sim(&["--scenario", "nonsense"]);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("leader-crash"), "{stderr}");
    }

    #[cfg(feature = "sabotage")]
    #[test]
    fn a_violation_prints_its_seed_and_a_replay_command_and_fails() {
        let (out, stdout, stderr) = sim(&[
            "--seeds",
            "2",
            "--seed",
            "6",
            "--sabotage",
            "resend-after-close",
        ]);
        assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
        assert!(stdout.contains("violations: 2"), "{stdout}");
        let replay =
            "replay: ticketing sim --seed 6 --seeds 1 --trace --sabotage resend-after-close";
        assert!(stderr.contains("VIOLATION seed 6 "), "{stderr}");
        assert!(stderr.contains(replay), "{stderr}");
        // The replay command, run, shows the log and the same violation.
        let (out, stdout, stderr) = sim(&[
            "--seed",
            "6",
            "--seeds",
            "1",
            "--trace",
            "--sabotage",
            "resend-after-close",
        ]);
        assert_eq!(out.status.code(), Some(1));
        assert!(stdout.contains(" c0 action Connect"), "{stdout}");
        assert!(stderr.contains(replay), "{stderr}");
    }

    #[cfg(feature = "sabotage")]
    #[test]
    fn an_unknown_sabotage_is_refused() {
        let (out, _, stderr) = sim(&["--sabotage", "nonsense"]);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("match-by-arrival"), "{stderr}");
    }
}
