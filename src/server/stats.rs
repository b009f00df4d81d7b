//! What operators watch on a server: its counters, kept as plain data and
//! read with one call, [`Server::stats`](super::Server::stats).

/// The server's counters: totals since it was made, and what is true now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ServerStats {
    /// Grants (`G` to an acquire), at once or after a wait.
    pub grants: u64,
    /// Acquires answered `T`.
    pub timed_out: u64,
    /// Acquires answered `B`.
    pub busy: u64,
    /// Releases answered `D`.
    pub releases: u64,
    /// Releases answered `N`.
    pub not_held: u64,
    /// Renewals answered `G` (reclaims included).
    pub renewals: u64,
    /// Renewals answered `N`: the grant was gone.
    pub renewals_gone: u64,
    /// Renewals that reclaimed a grant of an earlier term during a
    /// recovery grace.
    pub reclaims: u64,
    /// Grants that ran out unreleased.
    pub expiries: u64,
    /// Connections accepted.
    pub accepted: u64,
    /// Handshakes refused for a wrong credential, or none, where one is
    /// required (rule 8): guesses, or a client configured wrong.
    pub auth_failures: u64,
    /// Now: connections open.
    pub connections: u64,
    /// Now: acquires waiting in a key's queue.
    pub waiters: u64,
    /// The most acquires that waited at once.
    pub max_waiters: u64,
    /// Now: the epoch of the term (0 before the first).
    pub epoch: u64,
    /// Now: whether a recovery grace holds grants back.
    pub in_grace: bool,
}
