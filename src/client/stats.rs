//! What operators watch: the client's counters, kept as plain data and
//! read with one call, [`Client::stats`](super::Client::stats).
//!
//! Most of them count the notices and outcomes the core hands out (every
//! event is counted where it is queued); the rest count what no event
//! shows (operations started, renewals sent, why an acquire ended
//! Indeterminate). Nothing here allocates.

use std::collections::VecDeque;

use super::outcome::{BackoffCause, CloseReason, Event, Outcome, ReleaseResult};

/// Counts by how an acquire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AcquireOutcomes {
    /// `Granted`.
    pub granted: u64,
    /// `TimedOut`, answered `T` or never sent.
    pub timed_out: u64,
    /// `Busy`.
    pub busy: u64,
    /// `Cancelled`.
    pub cancelled: u64,
    /// `Indeterminate`, for any cause.
    pub indeterminate: u64,
}

/// Why acquires ended Indeterminate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct IndeterminateCauses {
    /// The connection closed (it ended, failed, or broke the protocol)
    /// with the acquire in flight.
    pub close: u64,
    /// Cancelled after it was sent (either cancel policy), or given up by
    /// a shutdown.
    pub cancel: u64,
    /// Its answer did not come within its deadline.
    pub answer_timeout: u64,
}

/// Counts by how a release ended (the embedder's, or the client's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReleaseOutcomes {
    /// `Released`.
    pub released: u64,
    /// `NotHeld`.
    pub not_held: u64,
    /// `Lapsed`.
    pub lapsed: u64,
}

/// Renewal's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RenewalCounts {
    /// Renewals sent (each attempt).
    pub sent: u64,
    /// Answered `G`: the grant was extended (`Renewed` notices).
    pub renewed: u64,
    /// Answered `N`: the grant was lost (`LeaseLost`).
    pub lost: u64,
    /// `LeaseJeopardy` notices.
    pub jeopardy: u64,
    /// `LeaseExpired` notices.
    pub expired: u64,
}

/// Closes by reason, as [`CloseReason`] names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CloseCounts {
    /// `eof`.
    pub eof: u64,
    /// `io`.
    pub io: u64,
    /// `connect_failed`.
    pub connect_failed: u64,
    /// `connect_timeout`.
    pub connect_timeout: u64,
    /// `tls:<detail>`.
    pub tls: u64,
    /// `handshake_timeout`.
    pub handshake_timeout: u64,
    /// `moved`.
    pub moved: u64,
    /// `no_leader`.
    pub no_leader: u64,
    /// `not_active`.
    pub not_active: u64,
    /// `auth_failed`.
    pub auth_failed: u64,
    /// `unsupported_version`.
    pub unsupported_version: u64,
    /// `error:<reason>`: another `E`.
    pub server_error: u64,
    /// `protocol:<detail>`: the server broke the protocol.
    pub protocol: u64,
    /// `cancel`.
    pub cancel: u64,
    /// `answer_timeout`.
    pub answer_timeout: u64,
    /// `shutdown`.
    pub shutdown: u64,
}

/// Backoffs by cause, as [`BackoffCause`] names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BackoffCounts {
    /// A transport failure, a timeout, a protocol violation.
    pub transport: u64,
    /// `E no_leader`.
    pub no_leader: u64,
    /// `E not_active`.
    pub not_active: u64,
    /// `E auth_failed`.
    pub auth_failed: u64,
    /// `E unsupported_version`.
    pub unsupported_version: u64,
    /// Redirects after the third in a row.
    pub redirect: u64,
    /// A `B` answer, before the next attempt of an acquire.
    pub busy: u64,
}

/// A histogram of milliseconds in powers of two, kept without allocation:
/// bucket 0 counts 0 ms, bucket `i` counts `[2^(i-1), 2^i)` ms, the last
/// one everything from 2^30 ms on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Histogram {
    /// The counts per bucket.
    pub buckets: [u64; 32],
    /// How many values.
    pub count: u64,
    /// Their sum, in milliseconds (saturating).
    pub sum_ms: u64,
    /// The largest, in milliseconds.
    pub max_ms: u64,
}

impl Histogram {
    /// Counts one value.
    pub(crate) fn record(&mut self, ms: u64) {
        let bucket = (64 - ms.leading_zeros() as usize).min(self.buckets.len() - 1);
        self.buckets[bucket] += 1;
        self.count += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.max_ms = self.max_ms.max(ms);
    }

    /// The upper bound, in milliseconds, of the bucket that holds the
    /// `q`-th quantile (`0.0..=1.0`); `None` while empty.
    pub fn quantile_bound_ms(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(if i == 0 { 0 } else { (1u64 << i) - 1 });
            }
        }
        Some(self.max_ms)
    }
}

/// The client's counters ([`Client::stats`](super::Client::stats)):
/// totals since the client was made, and what is open now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ClientStats {
    /// Acquires the embedder started.
    pub acquires_started: u64,
    /// How they ended.
    pub acquires: AcquireOutcomes,
    /// Why the Indeterminate ones did.
    pub indeterminate: IndeterminateCauses,
    /// Releases the embedder started.
    pub releases_started: u64,
    /// How they ended.
    pub releases: ReleaseOutcomes,
    /// Grants nobody could take, put into the release lane by the client.
    pub orphan_releases: u64,
    /// How those releases ended.
    pub orphans: ReleaseOutcomes,
    /// Renewal.
    pub renewals: RenewalCounts,
    /// Connection attempts.
    pub connects: u64,
    /// Handshakes accepted (`W`).
    pub connected: u64,
    /// Closes, by reason.
    pub closes: CloseCounts,
    /// Backoffs, by cause.
    pub backoffs: BackoffCounts,
    /// Leader hints taken, and ignored (outside the allowlist).
    pub hints_taken: u64,
    /// See `hints_taken`.
    pub hints_ignored: u64,
    /// Rounds that every address refused (`auth_failed`,
    /// `unsupported_version`), leaving the client misconfigured.
    pub misconfigured: u64,
    /// How long granted acquires waited in the key's queue (the `waited_ms`
    /// of their `G`).
    pub grant_wait: Histogram,
    /// How much of a grant's lease was left (`valid_until` less now) when
    /// the embedder released it; 0 when past.
    pub lease_left_at_release: Histogram,
    /// Now: requests unanswered on the connection.
    pub in_flight: u64,
    /// Now: acquires among them.
    pub acquires_in_flight: u64,
    /// Now: acquires waiting to be sent.
    pub acquires_queued: u64,
    /// Now: releases waiting to be sent.
    pub releases_queued: u64,
    /// Now: renewals waiting to be sent.
    pub renewals_queued: u64,
    /// Now: acquire operations that have not ended.
    pub acquires_open: u64,
    /// Now: the embedder's releases that have not ended.
    pub releases_open: u64,
    /// Now: grants the embedder holds.
    pub held: u64,
}

impl ClientStats {
    /// Counts what an event shows.
    pub(crate) fn count(&mut self, event: &Event) {
        match event {
            Event::Outcome { outcome, .. } => match outcome {
                Outcome::Granted(_) => self.acquires.granted += 1,
                Outcome::TimedOut { .. } => self.acquires.timed_out += 1,
                Outcome::Busy => self.acquires.busy += 1,
                Outcome::Cancelled => self.acquires.cancelled += 1,
                Outcome::Indeterminate { .. } => self.acquires.indeterminate += 1,
                Outcome::Released => self.releases.released += 1,
                Outcome::NotHeld => self.releases.not_held += 1,
                Outcome::Lapsed => self.releases.lapsed += 1,
            },
            Event::Connecting { .. } => self.connects += 1,
            Event::Connected { .. } => self.connected += 1,
            Event::Closed { reason, .. } => self.count_close(reason),
            Event::LeaderHint { .. } => self.hints_taken += 1,
            Event::HintIgnored { .. } => self.hints_ignored += 1,
            Event::Backoff { cause, .. } => {
                let b = &mut self.backoffs;
                *match cause {
                    BackoffCause::Transport => &mut b.transport,
                    BackoffCause::NoLeader => &mut b.no_leader,
                    BackoffCause::NotActive => &mut b.not_active,
                    BackoffCause::AuthFailed => &mut b.auth_failed,
                    BackoffCause::UnsupportedVersion => &mut b.unsupported_version,
                    BackoffCause::Redirect => &mut b.redirect,
                    BackoffCause::Busy => &mut b.busy,
                } += 1;
            }
            Event::OrphanRelease { .. } => self.orphan_releases += 1,
            Event::OrphanSettled { result, .. } => {
                let o = &mut self.orphans;
                *match result {
                    ReleaseResult::Released => &mut o.released,
                    ReleaseResult::NotHeld => &mut o.not_held,
                    ReleaseResult::Lapsed => &mut o.lapsed,
                } += 1;
            }
            Event::Misconfigured { .. } => self.misconfigured += 1,
            Event::Renewed { .. } => self.renewals.renewed += 1,
            Event::LeaseJeopardy { .. } => self.renewals.jeopardy += 1,
            Event::LeaseLost { .. } => self.renewals.lost += 1,
            Event::LeaseExpired { .. } => self.renewals.expired += 1,
            Event::AuthFailed { .. }
            | Event::UnsupportedVersion { .. }
            | Event::ShutdownComplete => {}
        }
    }

    fn count_close(&mut self, reason: &CloseReason) {
        let c = &mut self.closes;
        *match reason {
            CloseReason::Eof => &mut c.eof,
            CloseReason::Io => &mut c.io,
            CloseReason::ConnectFailed => &mut c.connect_failed,
            CloseReason::ConnectTimeout => &mut c.connect_timeout,
            CloseReason::Tls(_) => &mut c.tls,
            CloseReason::HandshakeTimeout => &mut c.handshake_timeout,
            CloseReason::Moved => &mut c.moved,
            CloseReason::NoLeader => &mut c.no_leader,
            CloseReason::NotActive => &mut c.not_active,
            CloseReason::AuthFailed => &mut c.auth_failed,
            CloseReason::UnsupportedVersion => &mut c.unsupported_version,
            CloseReason::ServerError(_) => &mut c.server_error,
            CloseReason::Protocol(_) => &mut c.protocol,
            CloseReason::Cancel => &mut c.cancel,
            CloseReason::AnswerTimeout => &mut c.answer_timeout,
            CloseReason::Shutdown => &mut c.shutdown,
        } += 1;
    }

    /// Counts what a part notes that no event shows.
    pub(crate) fn note(&mut self, note: Note<'_>) {
        match note {
            Note::AcquireStarted => self.acquires_started += 1,
            Note::ReleaseStarted => self.releases_started += 1,
            Note::RenewalSent => self.renewals.sent += 1,
            Note::InDoubt(reason) => {
                let i = &mut self.indeterminate;
                *match reason {
                    None | Some(CloseReason::Cancel | CloseReason::Shutdown) => &mut i.cancel,
                    Some(CloseReason::AnswerTimeout) => &mut i.answer_timeout,
                    Some(_) => &mut i.close,
                } += 1;
            }
            Note::GrantWaited { ms } => self.grant_wait.record(ms),
            Note::LeaseLeftAtRelease { ms } => self.lease_left_at_release.record(ms),
        }
    }
}

/// What a part notes for the counters that no event shows; counted with
/// the events, in [`ClientStats`], the one place counters are kept.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Note<'a> {
    /// An acquire was taken.
    AcquireStarted,
    /// The embedder's release was taken.
    ReleaseStarted,
    /// A renewal's bytes went out.
    RenewalSent,
    /// An acquire in flight is to end Indeterminate: by a close for the
    /// reason given, or by a cancel (`None`).
    InDoubt(Option<&'a CloseReason>),
    /// A granted acquire waited this long in the key's queue.
    GrantWaited { ms: u64 },
    /// This much of a grant's lease was left when the embedder released it.
    LeaseLeftAtRelease { ms: u64 },
}

/// The events waiting for the embedder, each counted as it is queued.
#[derive(Default)]
pub(crate) struct EventQueue {
    queue: VecDeque<Event>,
    pub(crate) stats: ClientStats,
}

impl EventQueue {
    /// Counts what a part notes that no event shows.
    pub(crate) fn note(&mut self, note: Note<'_>) {
        self.stats.note(note);
    }

    /// Queues `event`, and counts it.
    pub(crate) fn push_back(&mut self, event: Event) {
        self.stats.count(&event);
        self.queue.push_back(event);
    }

    /// The next event; a burst's memory goes back once all are taken,
    /// but for what steady traffic needs between two polls.
    pub(crate) fn pop_front(&mut self) -> Option<Event> {
        const KEPT: usize = 4096;
        let event = self.queue.pop_front();
        if self.queue.is_empty() && self.queue.capacity() > KEPT {
            self.queue.shrink_to(KEPT);
        }
        event
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_puts_each_value_in_its_power_of_two() {
        let mut h = Histogram::default();
        for ms in [0, 1, 2, 3, 4, 1_000, u64::MAX] {
            h.record(ms);
        }
        assert_eq!(h.buckets[0], 1, "0 ms");
        assert_eq!(h.buckets[1], 1, "1 ms");
        assert_eq!(h.buckets[2], 2, "2 and 3 ms");
        assert_eq!(h.buckets[3], 1, "4 ms");
        assert_eq!(h.buckets[10], 1, "1000 ms is in [512, 1024)");
        assert_eq!(h.buckets[31], 1, "the rest");
        assert_eq!((h.count, h.max_ms, h.sum_ms), (7, u64::MAX, u64::MAX));
        assert_eq!(h.quantile_bound_ms(0.0), Some(0));
        assert_eq!(h.quantile_bound_ms(0.5), Some(3));
        assert_eq!(Histogram::default().quantile_bound_ms(0.5), None);
    }
}
