//! The cores' counters in the [`metrics`] facade (feature `metrics`): no
//! recorder is installed here; the embedder chooses one (Prometheus, say),
//! and these calls publish into it.
//!
//! The client adapters publish their client's counters by themselves, at
//! most once a second while they run; a server's are published with
//! [`record_server`] (`ticketing serve --metrics-listen` does it every
//! second). Totals are counters (`_total`), what holds now is a gauge, and
//! each histogram is published as its count, sum and bucket counts (a
//! gauge per bucket, labelled with the bucket's upper bound in ms).

use metrics::{counter, gauge};

use crate::client::{ClientStats, Histogram};
use crate::server::ServerStats;

/// Publishes a client's counters, under `ticketing_client_*`.
pub fn record_client(stats: &ClientStats) {
    let a = &stats.acquires;
    counter!("ticketing_client_acquires_started_total").absolute(stats.acquires_started);
    for (outcome, n) in [
        ("granted", a.granted),
        ("timed_out", a.timed_out),
        ("busy", a.busy),
        ("cancelled", a.cancelled),
        ("indeterminate", a.indeterminate),
    ] {
        counter!("ticketing_client_acquires_total", "outcome" => outcome).absolute(n);
    }
    let i = &stats.indeterminate;
    for (cause, n) in [
        ("close", i.close),
        ("cancel", i.cancel),
        ("answer_timeout", i.answer_timeout),
    ] {
        counter!("ticketing_client_indeterminate_total", "cause" => cause).absolute(n);
    }
    counter!("ticketing_client_releases_started_total").absolute(stats.releases_started);
    for (whose, r) in [("embedder", &stats.releases), ("orphan", &stats.orphans)] {
        for (outcome, n) in [
            ("released", r.released),
            ("not_held", r.not_held),
            ("lapsed", r.lapsed),
        ] {
            counter!("ticketing_client_releases_total", "whose" => whose, "outcome" => outcome)
                .absolute(n);
        }
    }
    counter!("ticketing_client_orphan_releases_total").absolute(stats.orphan_releases);
    let r = &stats.renewals;
    for (what, n) in [
        ("sent", r.sent),
        ("renewed", r.renewed),
        ("lost", r.lost),
        ("jeopardy", r.jeopardy),
        ("expired", r.expired),
    ] {
        counter!("ticketing_client_renewals_total", "what" => what).absolute(n);
    }
    counter!("ticketing_client_connects_total").absolute(stats.connects);
    counter!("ticketing_client_connected_total").absolute(stats.connected);
    let c = &stats.closes;
    for (reason, n) in [
        ("eof", c.eof),
        ("io", c.io),
        ("connect_failed", c.connect_failed),
        ("connect_timeout", c.connect_timeout),
        ("tls", c.tls),
        ("handshake_timeout", c.handshake_timeout),
        ("moved", c.moved),
        ("no_leader", c.no_leader),
        ("not_active", c.not_active),
        ("auth_failed", c.auth_failed),
        ("unsupported_version", c.unsupported_version),
        ("server_error", c.server_error),
        ("protocol", c.protocol),
        ("cancel", c.cancel),
        ("answer_timeout", c.answer_timeout),
        ("shutdown", c.shutdown),
    ] {
        counter!("ticketing_client_closes_total", "reason" => reason).absolute(n);
    }
    let b = &stats.backoffs;
    for (cause, n) in [
        ("transport", b.transport),
        ("no_leader", b.no_leader),
        ("not_active", b.not_active),
        ("auth_failed", b.auth_failed),
        ("unsupported_version", b.unsupported_version),
        ("redirect", b.redirect),
        ("busy", b.busy),
    ] {
        counter!("ticketing_client_backoffs_total", "cause" => cause).absolute(n);
    }
    counter!("ticketing_client_hints_total", "taken" => "yes").absolute(stats.hints_taken);
    counter!("ticketing_client_hints_total", "taken" => "no").absolute(stats.hints_ignored);
    histogram("ticketing_client_grant_wait_ms", &stats.grant_wait);
    histogram(
        "ticketing_client_lease_left_at_release_ms",
        &stats.lease_left_at_release,
    );
    for (what, n) in [
        ("in_flight", stats.in_flight),
        ("acquires_in_flight", stats.acquires_in_flight),
        ("acquires_queued", stats.acquires_queued),
        ("releases_queued", stats.releases_queued),
        ("renewals_queued", stats.renewals_queued),
        ("acquires_open", stats.acquires_open),
        ("releases_open", stats.releases_open),
        ("held", stats.held),
    ] {
        gauge!("ticketing_client_now", "what" => what).set(n as f64);
    }
}

/// Publishes a server's counters, under `ticketing_server_*`.
pub fn record_server(stats: &ServerStats) {
    for (answer, n) in [
        ("granted", stats.grants),
        ("timed_out", stats.timed_out),
        ("busy", stats.busy),
        ("released", stats.releases),
        ("not_held", stats.not_held),
        ("renewed", stats.renewals),
        ("renewal_gone", stats.renewals_gone),
    ] {
        counter!("ticketing_server_answers_total", "answer" => answer).absolute(n);
    }
    counter!("ticketing_server_reclaims_total").absolute(stats.reclaims);
    counter!("ticketing_server_expiries_total").absolute(stats.expiries);
    counter!("ticketing_server_accepted_total").absolute(stats.accepted);
    counter!("ticketing_server_auth_failures_total").absolute(stats.auth_failures);
    gauge!("ticketing_server_connections").set(stats.connections as f64);
    gauge!("ticketing_server_waiters").set(stats.waiters as f64);
    gauge!("ticketing_server_waiters_max").set(stats.max_waiters as f64);
    gauge!("ticketing_server_epoch").set(stats.epoch as f64);
    gauge!("ticketing_server_in_grace").set(if stats.in_grace { 1.0 } else { 0.0 });
}

/// Publishes how many times a server with a state directory failed to keep
/// the epoch of a new term (`ticketing::state::KeptEpochs`), under
/// `ticketing_server_epoch_write_failures_total`.
pub fn record_epoch_write_failures(total: u64) {
    counter!("ticketing_server_epoch_write_failures_total").absolute(total);
}

/// A histogram as its count, sum, and one gauge per non-empty bucket.
fn histogram(name: &'static str, h: &Histogram) {
    counter!(format!("{name}_count")).absolute(h.count);
    counter!(format!("{name}_sum")).absolute(h.sum_ms);
    for (i, &n) in h.buckets.iter().enumerate().filter(|(_, &n)| n > 0) {
        let bound = if i == 0 { 0 } else { (1u64 << i) - 1 };
        gauge!(format!("{name}_bucket"), "le_ms" => bound.to_string()).set(n as f64);
    }
}

/// Publishes a replicated cluster member's view ([`Replica::status`],
/// PROTOCOL.md 4.4 "Status"), under `ticketing_raft_*`: its term, commit
/// and applied indices, the leader it knows (`0`: none), its role (a
/// gauge per role, 1 for the one it has); and, while it leads, each
/// member's match index and lag, labelled with the member's id (the
/// values a member published while it led stay as they were once it no
/// longer does: read them with its role).
///
/// [`Replica::status`]: crate::server::raft::Replica::status
#[cfg(feature = "raft")]
pub fn record_cluster(status: &crate::server::raft::ClusterStatus) {
    use crate::admin::MemberRole;

    gauge!("ticketing_raft_term").set(status.term as f64);
    gauge!("ticketing_raft_commit_index").set(status.commit as f64);
    gauge!("ticketing_raft_applied_index").set(status.applied as f64);
    gauge!("ticketing_raft_leader").set(status.leader.unwrap_or(0) as f64);
    gauge!("ticketing_raft_members").set(status.members.len() as f64);
    let mine = status
        .members
        .iter()
        .find(|m| m.id == status.member)
        .map(|m| m.role);
    for role in [
        MemberRole::Leader,
        MemberRole::Follower,
        MemberRole::Learner,
    ] {
        let is = f64::from(u8::from(mine == Some(role)));
        gauge!("ticketing_raft_role", "role" => role.as_str()).set(is);
    }
    for m in &status.members {
        let member = m.id.to_string();
        if let Some(matched) = m.matched {
            gauge!("ticketing_raft_member_match_index", "member" => member.clone())
                .set(matched as f64);
        }
        if let Some(lag) = m.lag {
            gauge!("ticketing_raft_member_lag", "member" => member).set(lag as f64);
        }
    }
}
