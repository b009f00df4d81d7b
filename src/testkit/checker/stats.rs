//! What a run did ([`Stats`]), for checking that tests exercise what they
//! claim to. The router counts as it routes; nothing here is a rule.

use super::holds::Notice;
use crate::client::Outcome;

/// What a run did, for checking that tests exercise what they claim to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Steps ended.
    pub steps: u64,
    /// Requests (`A` and `R`) handed out.
    pub requests: u64,
    /// Answers matched to a pending request.
    pub matched: u64,
    /// Answers no pending request could claim (unknown id, mismatch, before `W`).
    pub strays: u64,
    /// Connections closed by the client.
    pub closes: u64,
    /// `Granted` outcomes.
    pub granted: u64,
    /// `TimedOut` outcomes.
    pub timed_out: u64,
    /// `Busy` outcomes.
    pub busy: u64,
    /// `Cancelled` outcomes.
    pub cancelled: u64,
    /// `Indeterminate` outcomes.
    pub indeterminate: u64,
    /// `Released` outcomes.
    pub released: u64,
    /// `NotHeld` outcomes.
    pub not_held: u64,
    /// `Lapsed` outcomes.
    pub lapsed: u64,
    /// Releases the client issued by itself (`OrphanRelease`).
    pub orphan_releases: u64,
    /// Acquire attempts after a `B`.
    pub retries: u64,
    /// Renewals (`X`) handed out.
    pub renewals: u64,
    /// `Renewed` notices.
    pub renewed: u64,
    /// `LeaseJeopardy` notices.
    pub jeopardies: u64,
    /// `LeaseLost` notices.
    pub lost: u64,
    /// `LeaseExpired` notices.
    pub expired: u64,
    /// Leader hint notices (`LeaderHint`, `HintIgnored`).
    pub hint_notices: u64,
    /// `L` lines read.
    pub hints_read: u64,
    /// Calls with a grant of another client, refused.
    pub foreign_refused: u64,
}

impl Stats {
    /// Adds another run's counts.
    pub fn add(&mut self, other: &Stats) {
        self.steps += other.steps;
        self.requests += other.requests;
        self.matched += other.matched;
        self.strays += other.strays;
        self.closes += other.closes;
        self.granted += other.granted;
        self.timed_out += other.timed_out;
        self.busy += other.busy;
        self.cancelled += other.cancelled;
        self.indeterminate += other.indeterminate;
        self.released += other.released;
        self.not_held += other.not_held;
        self.lapsed += other.lapsed;
        self.orphan_releases += other.orphan_releases;
        self.retries += other.retries;
        self.renewals += other.renewals;
        self.renewed += other.renewed;
        self.jeopardies += other.jeopardies;
        self.lost += other.lost;
        self.expired += other.expired;
        self.hint_notices += other.hint_notices;
        self.hints_read += other.hints_read;
        self.foreign_refused += other.foreign_refused;
    }

    /// Counts an outcome told.
    pub(super) fn outcome(&mut self, outcome: &Outcome) {
        let count = match outcome {
            Outcome::Granted(_) => &mut self.granted,
            Outcome::TimedOut { .. } => &mut self.timed_out,
            Outcome::Busy => &mut self.busy,
            Outcome::Cancelled => &mut self.cancelled,
            Outcome::Indeterminate { .. } => &mut self.indeterminate,
            Outcome::Released => &mut self.released,
            Outcome::NotHeld => &mut self.not_held,
            Outcome::Lapsed => &mut self.lapsed,
        };
        *count += 1;
    }

    /// Counts a notice about a held grant's lease.
    pub(super) fn notice(&mut self, notice: Notice) {
        let count = match notice {
            Notice::Renewed => &mut self.renewed,
            Notice::LeaseJeopardy => &mut self.jeopardies,
            Notice::LeaseLost => &mut self.lost,
            Notice::LeaseExpired => &mut self.expired,
        };
        *count += 1;
    }
}
