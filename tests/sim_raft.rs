//! The simulator's replicated cluster (PROTOCOL.md 4.3; `ticketing sim
//! --scenario raft` and `raft5`): 3 and 5 real members (`Replica`s) on
//! in-memory disks, under crashes (some losing their disk), partitions
//! between members, leadership transfers, members replaced (a new one
//! added, an old one removed, the leader killed mid-change among them),
//! and peer messages delayed and lost, with holders that renew beside
//! light traffic.
//!
//! What the sweeps assert, and why it can be asserted exactly:
//!
//! * no violation of any check, invariant 8 over the answered grants, the
//!   answer-before-commit check and no member's message refused included;
//! * leader changes happened (several per seed), and every renewing
//!   holder of a valid grant at a change kept it, but in a seed whose
//!   faults left it without a leader for a second or more at a stretch: a
//!   crash of a minority costs an election (a few hundred milliseconds
//!   with a 200 ms election timeout, plus a reconnect), far less than the
//!   holders' leases of 7.5 s at least, and the clients keep the default
//!   backoffs, capped by what is left of a held lease; partitions, lost
//!   disks and a fourth voter during a replacement (whose majority is 3)
//!   can leave no majority for longer;
//! * the same seed gives the same run (the same report, the trace hash
//!   included), and other seeds other traces;
//! * with the sabotage `answer-before-commit` (feature `sabotage`), every
//!   seed of a sweep is caught by the check at send time, at the first
//!   grant a member answers.
//!
//! Measured over seeds 0..60 (2026-12-07, with replacements): 3 members,
//! 349 leader changes, 153 transfers, 87 members added and 56 removed (16
//! leaders killed mid-change), 2,098 renewing holders at the changes, 2,093
//! kept, 5 lost in seed 21 (a fourth voter during a replacement, then the
//! voters split two and two: 2.1 s and 1.2 s without a leader within four
//! seconds); 5 members, 357 changes, 152 transfers, 105 added, 72 removed
//! (29 killed mid-change), 2,156 holders, all kept. Over seeds 0..2000:
//! no violation, 149 of 67,795 holders lost with 3 members, 19 of 72,664
//! with 5.

use std::collections::BTreeSet;

use ticketing::sim::{self, Check, Report, Scenario, SimConfig};

/// Seeds per sweep: some 170 leader changes for each cluster size.
const SWEEP: u64 = 60;

/// A holder renewing a lease of 7.5 s at least loses it only in a seed
/// whose cluster went this long at a stretch without a leader, several
/// times over as a rule (with a reconnect and the clients' backoffs).
const LONG_OUTAGE: core::time::Duration = core::time::Duration::from_secs(1);

fn raft(scenario: Scenario) -> SimConfig {
    let mut config = SimConfig::default();
    config.scenario = scenario;
    config
}

/// Runs a sweep of `scenario` and asserts what every sweep must show.
fn sweep(scenario: Scenario, members: u64) -> Report {
    let report = sim::run_seeds(0, SWEEP, &raft(scenario), 2);
    assert!(report.violations.is_empty(), "{scenario}: {report}");
    assert_eq!(report.seeds, SWEEP);
    let r = report.replication;
    assert_eq!(r.members, members * SWEEP, "{report}");
    // Every fault happened, many times; disk losses in the seeds that
    // replace no member (a quarter), where a member that lost its disk
    // comes back with an empty one.
    for (what, count, least) in [
        ("crashes", r.crashes, SWEEP / 2),
        ("disk losses", r.disk_losses, SWEEP / 8),
        ("restarts", r.restarts, SWEEP / 2),
        ("partitions", r.partitions, SWEEP / 2),
        ("leadership transfers", r.transfers, SWEEP / 2),
        ("members added", r.members_added, SWEEP / 2),
        ("members removed", r.members_removed, SWEEP / 2),
        ("leaders killed mid-change", r.joint_kills, SWEEP / 6),
        ("lost messages", r.lost, SWEEP / 2),
        ("delayed messages", r.delayed, SWEEP / 2),
    ] {
        assert!(count >= least, "{scenario}: only {count} {what}\n{report}");
    }
    // The checks had plenty to look at.
    assert!(r.answers_checked > 50 * SWEEP, "{report}");
    assert!(r.grants_checked > 30 * SWEEP, "{report}");
    assert!(report.operations.renewed > 10 * SWEEP, "{report}");
    // Leader changes, and every renewing holder kept its grant across
    // each one, but in a seed whose faults left it without a leader for
    // seconds at a stretch.
    let f = report.failovers;
    assert!(f.leader_changes >= 2 * SWEEP, "{report}");
    assert!(f.holders > 10 * SWEEP, "{report}");
    assert_eq!(f.given_up, 0, "{report}");
    let mut lost = 0;
    for seed in 0..SWEEP {
        let one = sim::run(seed, &raft(scenario));
        if one.failovers.lost > 0 {
            assert!(
                one.replication.longest_leaderless >= LONG_OUTAGE,
                "{scenario}: seed {seed} lost a holder after at most {:?} without a leader\n{one}",
                one.replication.longest_leaderless
            );
            lost += one.failovers.lost;
        }
    }
    assert_eq!(lost, f.lost, "{report}");
    assert!(
        f.lost * 100 <= f.holders,
        "{scenario}: more than 1% of the holders lost their grant\n{report}"
    );
    report
}

#[test]
fn three_members_under_faults_break_no_check_and_every_renewing_holder_keeps_its_grant() {
    let report = sweep(Scenario::Raft, 3);
    println!("{report}");
}

#[test]
fn five_members_under_faults_break_no_check_and_every_renewing_holder_keeps_its_grant() {
    let report = sweep(Scenario::Raft5, 5);
    println!("{report}");
}

#[test]
fn the_same_seed_gives_the_same_run_and_other_seeds_do_not() {
    for scenario in [Scenario::Raft, Scenario::Raft5] {
        let config = raft(scenario);
        for seed in [0, 7, u64::MAX] {
            let first = sim::run(seed, &config);
            let second = sim::run(seed, &config);
            assert_eq!(
                first, second,
                "{scenario}: seed {seed} ran differently twice"
            );
            assert!(first.replication.crashes > 0, "{first}");
        }
        let hashes: BTreeSet<u64> = (100..110)
            .map(|seed| sim::run(seed, &config).trace_hash)
            .collect();
        assert_eq!(
            hashes.len(),
            10,
            "{scenario}: two seeds gave the same trace"
        );
        // Threads change nothing, the trace hash included.
        assert_eq!(
            sim::run_seeds(0, 4, &config, 1),
            sim::run_seeds(0, 4, &config, 2)
        );
    }
}

/// A holder whose renewal timed out renews again on a new connection
/// while the first renewal is still on its way: the leader decides both,
/// in two entries, and answers each once its own entry is committed. Seed
/// 1193 does this (the answer to the second renewal went out after entry
/// 30 was committed, entry 31 with the other was not yet), and the check
/// took the later entry for both answers: a false alarm, which the check
/// now tells apart.
#[test]
fn two_renewals_of_one_token_are_each_checked_against_their_own_entry() {
    let report = sim::run(1193, &raft(Scenario::Raft));
    assert!(report.violations.is_empty(), "{report}");
    assert!(report.failovers.leader_changes > 0, "{report}");
}

#[test]
fn the_scenarios_go_by_their_names_on_the_command_line() {
    assert_eq!("raft".parse::<Scenario>(), Ok(Scenario::Raft));
    assert_eq!("raft5".parse::<Scenario>(), Ok(Scenario::Raft5));
    assert_eq!(Scenario::Raft.raft_members(), Some(3));
    assert_eq!(Scenario::Raft5.raft_members(), Some(5));
    assert_eq!(Scenario::Mixed.raft_members(), None);
    assert_eq!(raft(Scenario::Raft5).cli_args(), " --scenario raft5");
}

#[test]
fn a_trace_shows_the_members_and_changes_nothing_else() {
    let quiet = sim::run(3, &raft(Scenario::Raft));
    let mut config = raft(Scenario::Raft);
    config.trace = true;
    let traced = sim::run(3, &config);
    assert_eq!(traced.trace_hash, quiet.trace_hash);
    assert!(traced.log.iter().any(|l| l.contains("raft: 3 members")));
    assert!(traced.log.iter().any(|l| l.contains("serves in term")));
    assert!(traced.log.iter().any(|l| l.contains("fault: raft member")));
    // A violation names the check.
    assert_eq!(Check::Uncommitted.to_string(), "answer before commit");
}

/// The sabotage `answer-before-commit`: members that answer as soon as
/// they decide are caught at send time on every seed.
#[cfg(feature = "sabotage")]
mod sabotage {
    use ticketing::sim::{self, Check, Sabotage, Scenario};

    use super::raft;

    fn caught_on_every_seed(scenario: Scenario) {
        let mut config = raft(scenario);
        config.sabotage = Some(Sabotage::AnswerBeforeCommit);
        let report = sim::run_seeds(0, 30, &config, 2);
        assert_eq!(report.violations.len(), 30, "{report}");
        for v in &report.violations {
            assert_eq!(v.check, Check::Uncommitted, "{v}");
            assert!(v.detail.contains("before its entry"), "{v}");
            assert_eq!(
                v.replay,
                format!(
                    "ticketing sim --seed {} --seeds 1 --trace --scenario {scenario} --sabotage answer-before-commit",
                    v.seed
                )
            );
        }
        // The replay finds the same.
        let v = &report.violations[7];
        assert_eq!(sim::run(v.seed, &config).violations.first(), Some(v));
        // Without the sabotage, the same seeds pass.
        let honest = sim::run_seeds(0, 30, &raft(scenario), 2);
        assert!(honest.violations.is_empty(), "{honest}");
    }

    #[test]
    fn answering_before_the_commit_is_caught_on_every_seed_of_three_members() {
        caught_on_every_seed(Scenario::Raft);
    }

    #[test]
    fn answering_before_the_commit_is_caught_on_every_seed_of_five_members() {
        caught_on_every_seed(Scenario::Raft5);
    }
}

/// Seeds that found something, run again: raft5 896, where a member
/// elected in a joint configuration that left it out led on past its own
/// removal and raft-rs failed on the next answer it counted (a member now
/// hands over, and one removed is never stepped again); raft 678, 450 and
/// raft5 347, where the checks judged a commit under too few of the
/// configurations a member had applied; raft5 15, where they judged an
/// entry appended before a change was applied under the change, though
/// raft-rs had committed it under the configuration before.
#[test]
fn the_seeds_that_found_a_fault_in_replacements_break_nothing() {
    for (scenario, seed) in [
        (Scenario::Raft5, 896),
        (Scenario::Raft, 678),
        (Scenario::Raft, 450),
        (Scenario::Raft5, 347),
        (Scenario::Raft5, 15),
    ] {
        let report = sim::run(seed, &raft(scenario));
        assert!(report.violations.is_empty(), "{scenario} {seed}: {report}");
        assert!(
            report.replication.members_added > 0,
            "{scenario} {seed}: {report}"
        );
    }
}
