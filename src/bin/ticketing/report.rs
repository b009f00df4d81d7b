//! What a running server says on stderr and publishes, whether it serves
//! alone, in a cluster on etcd or as a member of a replicated one: the
//! warning for a listener others can reach, then every second its
//! counters for Prometheus, and handshakes refused and epochs not kept,
//! each said at most so often.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use ticketing::server::ServerStats;
use ticketing::state::Keeping;

/// Says on stderr, for a server that others can reach (any address but a
/// loopback one), what its options leave open: with no credential, anyone
/// who reaches the port can take and release every lock; with one but no
/// TLS, the credential crosses the network in the clear.
pub(crate) fn warn_if_exposed(addr: SocketAddr, credential: bool, tls: bool) {
    if addr.ip().is_loopback() {
        return;
    }
    if !credential {
        eprintln!("ticketing: warning: listening on {addr} with no --credential: anyone who can reach it can take and release any lock (README.md, Security model)");
    } else if !tls {
        eprintln!("ticketing: warning: --credential without --tls-cert on {addr}: the credential crosses the network in the clear");
    }
}

/// How often something that keeps going wrong is said on stderr, at most.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Every second, for as long as it is polled and the server runs: the
/// server's counters published for Prometheus (with a recorder), and on
/// stderr, each at most once every [`REPORT_EVERY`], handshakes refused
/// for a wrong credential and epochs that could not be kept.
pub(crate) async fn watch<F: Future<Output = io::Result<ServerStats>>>(
    stats: impl Fn() -> F,
    prometheus: Option<PrometheusHandle>,
    news: &EpochNews,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut refused = Report::default();
    let mut unkept = Report::default();
    loop {
        tick.tick().await;
        let Ok(stats) = stats().await else {
            // The server task has ended: stopping says why.
            return;
        };
        let epochs = news.take();
        if prometheus.is_some() {
            ticketing::metrics::record_server(&stats);
            ticketing::metrics::record_epoch_write_failures(epochs.failures);
        }
        if let Some(prometheus) = &prometheus {
            prometheus.run_upkeep();
        }
        let now = Instant::now();
        if let Some(new) = refused.due(stats.auth_failures, now) {
            eprintln!(
                "handshakes refused for a wrong credential: {new} since the last report, {} in all",
                stats.auth_failures
            );
        }
        if let Some(new) = unkept.due(epochs.failures, now) {
            let error = epochs.last_error.as_deref().unwrap_or("unknown");
            eprintln!(
                "cannot keep the next epoch, so nothing is granted until it can ({new} more failed tries, {} in a row): {error}",
                epochs.in_a_row
            );
        }
        if let Some(failures) = epochs.recovered {
            eprintln!("the next epoch is kept after {failures} failed tries: granting");
        }
    }
}

/// A count said on stderr as it grows, at most once every
/// [`REPORT_EVERY`].
#[derive(Default)]
struct Report {
    said: u64,
    next: Option<Instant>,
}

impl Report {
    /// How much `total` grew since it was last said, if it grew and may
    /// be said at `now`.
    fn due(&mut self, total: u64, now: Instant) -> Option<u64> {
        if total <= self.said || self.next.is_some_and(|next| now < next) {
            return None;
        }
        let new = total - self.said;
        self.said = total;
        self.next = Some(now + REPORT_EVERY);
        Some(new)
    }
}

/// What the state directory's epochs came to, noted on the server's task
/// ([`KeptEpochs::watch`](ticketing::state::KeptEpochs::watch)) and said
/// by [`watch`].
#[derive(Default)]
pub(crate) struct EpochNews(Mutex<EpochTrouble>);

/// The news so far.
#[derive(Default, Clone)]
struct EpochTrouble {
    /// Tries that failed, in all.
    failures: u64,
    /// Tries that failed since the latest epoch kept.
    in_a_row: u64,
    /// Why the latest one failed.
    last_error: Option<String>,
    /// Kept after that many failed tries, since the last look.
    recovered: Option<u64>,
}

impl EpochNews {
    /// Notes how keeping an epoch went.
    pub(crate) fn note(&self, keeping: &Keeping<'_>) {
        let mut news = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match keeping {
            Keeping::Failed {
                error, failures, ..
            } => {
                news.failures += 1;
                news.in_a_row = *failures;
                news.last_error = Some(error.to_string());
            }
            Keeping::Recovered { failures, .. } => {
                news.in_a_row = 0;
                news.recovered = Some(*failures);
            }
            _ => {}
        }
    }

    /// The news, the recovery taken (it is said once).
    fn take(&self) -> EpochTrouble {
        let mut news = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let seen = news.clone();
        news.recovered = None;
        seen
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_growing_count_is_said_at_once_then_at_most_once_every_report_every() {
        let mut report = Report::default();
        let start = Instant::now();
        assert_eq!(report.due(0, start), None, "nothing to say");
        assert_eq!(report.due(3, start), Some(3), "the first, at once");
        let soon = start + REPORT_EVERY / 2;
        assert_eq!(report.due(9, soon), None, "too soon");
        let later = start + REPORT_EVERY;
        assert_eq!(report.due(9, later), Some(6), "what grew meanwhile");
        assert_eq!(report.due(9, later + REPORT_EVERY), None, "no growth");
        assert_eq!(report.due(10, later + REPORT_EVERY), Some(1));
    }

    #[test]
    fn epoch_news_counts_every_failure_and_tells_a_recovery_once() {
        let news = EpochNews::default();
        let error = ticketing::state::StateError::NotRegular {
            path: PathBuf::from("/state/epoch"),
        };
        for failures in 1..=3 {
            news.note(&Keeping::Failed {
                epoch: 7,
                error: &error,
                failures,
            });
        }
        let seen = news.take();
        assert_eq!((seen.failures, seen.in_a_row, seen.recovered), (3, 3, None));
        assert!(seen
            .last_error
            .is_some_and(|e| e.starts_with("/state/epoch: ")));
        news.note(&Keeping::Recovered {
            epoch: 7,
            failures: 3,
        });
        let seen = news.take();
        assert_eq!(
            (seen.failures, seen.in_a_row, seen.recovered),
            (3, 0, Some(3))
        );
        assert_eq!(news.take().recovered, None, "said once");
    }
}
