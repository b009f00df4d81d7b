//! The checker of a run's history, and its report.
//!
//! - **No two grants of one key overlap.** A grant counts from when its
//!   acquire returned (the `G` read) to the earlier of the client's last
//!   `valid_until` (renewals extend it) and the invocation of its release.
//! - **Tokens strictly increase per key** in grant order.
//! - **Every fenced write falls within its grant**, and the store accepts
//!   none out of token order.
//! - **An acknowledged release frees the key**: an acquire answered `T`
//!   (another holds it for the whole wait) while no grant, no acquire in
//!   doubt and no cancelled one could have held the key, and with no fault
//!   under way, is a violation.
//! - **A minority grants nothing**: a probe that talks only to a member cut
//!   off from the others, from the cut on, is never granted before it
//!   heals.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::history::{Acquired, Entry, Ns};

const MS: Ns = 1_000_000;

/// Clients from this id on are probes of a member cut off into a minority.
pub const MINORITY_PROBE: usize = 10_000;
/// The client that measures how often a free key can be had.
pub const AVAILABILITY_PROBE: usize = 9_999;

#[derive(Debug, Clone)]
struct Grant {
    client: usize,
    key: String,
    token: u64,
    invoked: Ns,
    /// When the client had it.
    start: Ns,
    /// The end the client saw: `min(valid_until, release invoked)`.
    end: Ns,
    /// The latest the server may hold it: the release's acknowledgement,
    /// else past every renewal it may have taken.
    server_until: Ns,
    renew: bool,
    status: String,
}

/// How a hold ended: when, the last `valid_until`, the lease's status,
/// and its release (invoked, completed, how).
type HoldEnded = (Ns, Ns, String, Option<(Ns, Ns, String)>);

/// What a run showed.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub faults: BTreeMap<String, usize>,
    pub outcomes: BTreeMap<String, usize>,
    pub grants: usize,
    pub writes: usize,
    pub writes_refused: usize,
    /// Renewing holds that spanned a fault's start, by how they ended.
    pub holds_through_faults: BTreeMap<String, usize>,
    /// Time from each fault's heal to the first grant after it, by kind.
    pub first_grant_after_heal: BTreeMap<String, Vec<Ns>>,
    /// The availability probe's try-locks on a free key: (granted, all).
    pub free_key: (usize, usize),
    /// The minority probes' acquires while their member was cut off, by
    /// outcome.
    pub minority: BTreeMap<String, usize>,
}

fn outcome_name(outcome: &Acquired) -> String {
    match outcome {
        Acquired::Granted { .. } => "granted".into(),
        Acquired::TimedOut { sent: true, .. } => "timed_out".into(),
        Acquired::TimedOut { sent: false, cause } => {
            format!("not_sent:{}", cause.as_deref().unwrap_or("none"))
        }
        Acquired::Busy => "busy".into(),
        Acquired::Cancelled => "cancelled".into(),
        Acquired::Indeterminate { .. } => "indeterminate".into(),
        Acquired::Misconfigured(_) => "misconfigured".into(),
        Acquired::Other(what) => format!("other:{what}"),
    }
}

/// What the service may do, by the protocol, that the checker allows.
pub struct Bounds {
    /// How long the server may hold a grant past the client's view
    /// (network delay, clock drift, a renewal in flight).
    pub margin: Ns,
    /// How long after a fault heals a free key may still be refused (a
    /// recovery grace).
    pub settle: Ns,
    /// How long a member cut off may still grant after the cut.
    pub minority_grace: Ns,
}

/// Checks `entries` within `bounds`.
pub fn check(entries: &[Entry], bounds: &Bounds) -> Report {
    let margin = bounds.margin;
    let mut report = Report::default();
    let mut faults = Vec::new();
    let mut acquires = Vec::new();
    let mut ends: HashMap<(usize, String, u64), HoldEnded> = HashMap::new();
    let mut writes = Vec::new();
    for entry in entries {
        match entry {
            Entry::Fault {
                kind, start, end, ..
            } => {
                *report.faults.entry(kind.clone()).or_default() += 1;
                faults.push((kind.clone(), *start, *end));
            }
            Entry::Acquire { .. } => acquires.push(entry),
            Entry::HoldEnd {
                client,
                key,
                token,
                at,
                valid_until,
                status,
                released,
            } => {
                ends.insert(
                    (*client, key.clone(), *token),
                    (*at, *valid_until, status.clone(), released.clone()),
                );
            }
            Entry::Write { .. } => writes.push(entry),
        }
    }

    // Grants, with the interval the client held each.
    let mut grants: Vec<Grant> = Vec::new();
    // Who may have held a key without a grant in the history: acquires in
    // doubt or cancelled, from their invocation to a bound.
    let mut unknown: Vec<(String, Ns, Ns)> = Vec::new();
    for entry in &acquires {
        let Entry::Acquire {
            client,
            key,
            invoked,
            completed,
            lease_ms,
            renew,
            outcome,
        } = entry
        else {
            continue;
        };
        *report.outcomes.entry(outcome_name(outcome)).or_default() += 1;
        let lease = lease_ms * MS;
        match outcome {
            Acquired::Granted { token, valid_until } => {
                let Some((at, last_valid, status, released)) =
                    ends.remove(&(*client, key.clone(), *token))
                else {
                    report.violations.push(format!(
                        "harness: client {client}'s grant of {key} token {token} has no end"
                    ));
                    continue;
                };
                let valid = last_valid.max(*valid_until);
                let (end, server_until) = match &released {
                    Some((r_invoked, r_completed, how)) if how == "released" => {
                        (valid.min(*r_invoked), *r_completed)
                    }
                    Some((r_invoked, _, _)) => (valid.min(*r_invoked), valid + lease + margin),
                    None => (valid.min(at.max(*completed)), valid + lease + margin),
                };
                grants.push(Grant {
                    client: *client,
                    key: key.clone(),
                    token: *token,
                    invoked: *invoked,
                    start: *completed,
                    end,
                    server_until,
                    renew: *renew,
                    status,
                });
            }
            Acquired::Indeterminate { settles_by } => {
                unknown.push((key.clone(), *invoked, *settles_by + margin));
            }
            Acquired::Cancelled | Acquired::Other(_) => {
                unknown.push((key.clone(), *invoked, completed + lease + margin));
            }
            _ => {}
        }
    }
    for ((client, key, token), _) in ends {
        report.violations.push(format!(
            "harness: a hold of {key} token {token} by client {client} ended without its grant"
        ));
    }
    report.grants = grants.len();

    // No overlap, tokens increasing: per key, by the start of each hold.
    let mut by_key: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in &grants {
        by_key.entry(g.key.as_str()).or_default().push(g);
    }
    for (key, list) in &mut by_key {
        list.sort_by_key(|g| (g.start, g.token));
        let mut seen_tokens: HashMap<u64, usize> = HashMap::new();
        for g in list.iter() {
            if let Some(other) = seen_tokens.insert(g.token, g.client) {
                report.violations.push(format!(
                    "{key}: token {} granted twice (clients {other} and {})",
                    g.token, g.client
                ));
            }
        }
        let held: Vec<&&Grant> = list.iter().filter(|g| g.start < g.end).collect();
        let mut latest: Option<&Grant> = None;
        for g in held {
            if let Some(prev) = latest {
                if g.start < prev.end {
                    report.violations.push(format!(
                        "{key}: grants overlap: token {} (client {}) held {}..{} ms and token {} (client {}) from {} ms",
                        prev.token, prev.client, prev.start / MS, prev.end / MS,
                        g.token, g.client, g.start / MS
                    ));
                }
                if g.token <= prev.token {
                    report.violations.push(format!(
                        "{key}: token {} (client {}, from {} ms) after token {} (client {}, from {} ms)",
                        g.token, g.client, g.start / MS, prev.token, prev.client, prev.start / MS
                    ));
                }
            }
            if latest.map_or(true, |p| g.end > p.end) {
                latest = Some(g);
            }
        }
    }

    // Fenced writes: within their grant; the store in token order.
    let grant_of: HashMap<(usize, &str, u64), &Grant> = grants
        .iter()
        .map(|g| ((g.client, g.key.as_str(), g.token), g))
        .collect();
    let mut accepted: BTreeMap<&str, Vec<(Ns, u64)>> = BTreeMap::new();
    for entry in &writes {
        let Entry::Write {
            client,
            key,
            token,
            at,
            accepted: ok,
        } = entry
        else {
            continue;
        };
        report.writes += 1;
        if *ok {
            accepted
                .entry(key.as_str())
                .or_default()
                .push((*at, *token));
        } else {
            report.writes_refused += 1;
        }
        match grant_of.get(&(*client, key.as_str(), *token)) {
            Some(g) if g.start <= *at && *at <= g.end => {}
            Some(g) => report.violations.push(format!(
                "{key}: client {client} wrote with token {token} at {} ms, outside its lease {}..{} ms",
                at / MS,
                g.start / MS,
                g.end / MS
            )),
            None => report.violations.push(format!(
                "{key}: client {client} wrote with token {token}, which it was never granted"
            )),
        }
    }
    for (key, list) in &mut accepted {
        list.sort();
        if list.windows(2).any(|w| w[1].1 < w[0].1) {
            report.violations.push(format!(
                "{key}: the store accepted a write out of token order"
            ));
        }
    }

    // An acknowledged release frees the key. Who may have held each key,
    // and when: grants from their acquire's invocation to the latest the
    // server may hold them; acquires in doubt or cancelled, to their bound.
    let mut held_by_key: HashMap<&str, Vec<(Ns, Ns)>> = HashMap::new();
    for g in &grants {
        held_by_key
            .entry(g.key.as_str())
            .or_default()
            .push((g.invoked, g.server_until));
    }
    let mut unknown_by_key: HashMap<&str, Vec<(Ns, Ns)>> = HashMap::new();
    for (key, from, to) in &unknown {
        unknown_by_key
            .entry(key.as_str())
            .or_default()
            .push((*from, *to));
    }
    let fault_near = |from: Ns, to: Ns| {
        faults
            .iter()
            .any(|(_, start, end)| *start <= to && from <= end + bounds.settle)
    };
    for entry in &acquires {
        let Entry::Acquire {
            client,
            key,
            invoked,
            completed,
            outcome: Acquired::TimedOut { sent: true, .. },
            ..
        } = entry
        else {
            continue;
        };
        if fault_near(*invoked, *completed) {
            continue;
        }
        let may_hold = |spans: Option<&Vec<(Ns, Ns)>>| {
            spans.is_some_and(|spans| {
                spans
                    .iter()
                    .any(|(from, to)| *from <= *completed && *invoked <= *to)
            })
        };
        let granted = may_hold(held_by_key.get(key.as_str()));
        let doubt = may_hold(unknown_by_key.get(key.as_str()));
        if !granted && !doubt {
            report.violations.push(format!(
                "{key}: client {client} was answered T over {}..{} ms, when no grant could hold the key",
                invoked / MS,
                completed / MS
            ));
        }
    }

    // Renewing holders through each fault.
    for (_, start, _) in &faults {
        for g in grants
            .iter()
            .filter(|g| g.renew && g.start <= *start && *start < g.end)
        {
            *report
                .holds_through_faults
                .entry(g.status.clone())
                .or_default() += 1;
        }
    }

    // Time to the first grant after each heal.
    for (kind, _, end) in &faults {
        if let Some(first) = grants
            .iter()
            .filter(|g| g.client < AVAILABILITY_PROBE && g.start > *end)
            .map(|g| g.start)
            .min()
        {
            report
                .first_grant_after_heal
                .entry(kind.clone())
                .or_default()
                .push(first - end);
        }
    }

    // The probes.
    for entry in &acquires {
        let Entry::Acquire {
            client,
            invoked,
            completed,
            outcome,
            ..
        } = entry
        else {
            continue;
        };
        if *client == AVAILABILITY_PROBE {
            report.free_key.1 += 1;
            if matches!(outcome, Acquired::Granted { .. }) {
                report.free_key.0 += 1;
            }
        }
        if *client >= MINORITY_PROBE {
            let window = faults
                .iter()
                .find(|(kind, start, end)| {
                    kind.starts_with("partition")
                        && start + bounds.minority_grace <= *invoked
                        && *invoked < *end
                })
                .map(|(_, start, end)| (*start, *end));
            if let Some((_, end)) = window {
                *report.minority.entry(outcome_name(outcome)).or_default() += 1;
                if matches!(outcome, Acquired::Granted { .. }) && *completed < end {
                    report.violations.push(format!(
                        "a member cut off into a minority granted client {client} at {} ms",
                        completed / MS
                    ));
                }
            }
        }
    }
    report
}

/// `kind n, kind n, ...`.
fn counts(map: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = map.iter().map(|(k, n)| format!("{k} {n}")).collect();
    parts.join(", ")
}

impl Report {
    /// The report as a Markdown table and a few lines.
    pub fn table(&self, title: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "### {title}\n");
        let _ = writeln!(out, "| what | figure |\n|---|---|");
        let faults = counts(&self.faults);
        let _ = writeln!(out, "| faults | {} |", faults);
        let outcomes = counts(&self.outcomes);
        let _ = writeln!(out, "| acquires by outcome | {} |", outcomes);
        let _ = writeln!(out, "| grants | {} |", self.grants);
        let _ = writeln!(
            out,
            "| fenced writes (refused) | {} ({}) |",
            self.writes, self.writes_refused
        );
        let holds = counts(&self.holds_through_faults);
        let _ = writeln!(
            out,
            "| renewing holds through a fault's start, by their end | {} |",
            holds
        );
        let heals: Vec<String> = self
            .first_grant_after_heal
            .iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                v.sort_unstable();
                let median = v[v.len() / 2] / MS;
                let max = v[v.len() - 1] / MS;
                format!("{k} {median}/{max}")
            })
            .collect();
        let _ = writeln!(
            out,
            "| first grant after a heal, ms (median/max) | {} |",
            heals.join(", ")
        );
        let (had, tried) = self.free_key;
        let share = if tried == 0 {
            0.0
        } else {
            had as f64 / tried as f64
        };
        let _ = writeln!(
            out,
            "| a free key could be had | {:.1}% of {tried} try-locks |",
            share * 100.0
        );
        let minority = counts(&self.minority);
        let _ = writeln!(
            out,
            "| acquires sent to a member cut off in a minority | {} |",
            minority
        );
        let _ = writeln!(out, "| violations | {} |", self.violations.len());
        for v in self.violations.iter().take(20) {
            let _ = writeln!(out, "\n- {v}");
        }
        out
    }
}
