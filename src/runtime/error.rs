//! What the client adapters answer when they cannot give what was asked:
//! one error per kind of call, each a value a person can read and a
//! program can match.
//!
//! - [`AcquireError`]: an acquire or a lock that gave no grant, whichever
//!   way it was asked for. "Not acquired" has this one shape everywhere.
//! - [`ConnectError`]: why no server took the client (a failed connect
//!   and its I/O error, a TLS handshake refused, a credential refused, ...).
//!   It is what [`AcquireError::TimedOut`] and
//!   [`AcquireError::Misconfigured`] carry, and what `connected()` returns.
//! - [`RequestError`]: any other call (release, renew, shutdown, ...).
//! - [`SpawnError`]: a client that could not be started.
//!
//! The decisions are the core's; these types only carry them, with what
//! the adapter saw of the I/O beside them.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use crate::client::{CloseReason, ConfigError, Error};
use crate::names::Endpoint;
use crate::runtime::lease::LeaseStatus;

/// Why a request other than an acquire gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The core refused the request at once: misuse (a grant released
    /// twice, one another client issued, ...), or its own capacity is full
    /// ([`Error::Busy`]).
    #[error(transparent)]
    Refused(#[from] Error),
    /// The driver has stopped (it shut down, or its runtime went away).
    #[error("the client's driver has stopped")]
    Stopped,
}

/// Why an acquire (or a lock) gave no grant. Its `Display` says it in a
/// sentence; match it to act on it.
///
/// Only [`Indeterminate`](AcquireError::Indeterminate) and
/// [`Stopped`](AcquireError::Stopped) leave it open whether the key was
/// granted: every other variant means nothing is held.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The wait ran out. With `sent`, the server answered that another
    /// owner held the key for the whole wait. Without, the acquire was
    /// never sent: no connection could take it within
    /// `max(wait, queue_grace)` (or, for an acquire that gives up while
    /// unreachable, at once once a round of attempts failed at every
    /// address), and `cause` says why (how the latest connection attempt
    /// ended), if an attempt had ended. A cause that is
    /// a refusal ([`ConnectError::is_refusal`]) is never here: that is
    /// [`Misconfigured`](AcquireError::Misconfigured).
    #[error("{}", timed_out(*sent, cause.as_ref()))]
    TimedOut {
        /// Whether the request reached a server.
        sent: bool,
        /// Why it could not be sent (`None` when it was, or when no
        /// attempt had ended yet).
        cause: Option<ConnectError>,
    },
    /// The key's queue on the server was full and the wait fitted no
    /// further attempt (or the client fails fast), or this client's own
    /// capacity for open acquires was full. Nothing is held.
    #[error(
        "not acquired: busy (the server's queue for the key, or this client's capacity, is full)"
    )]
    Busy,
    /// Cancelled before any byte of it went out: nothing was asked.
    #[error("not acquired: cancelled before it was sent")]
    Cancelled,
    /// The request went out and no answer that can be trusted came back
    /// (the connection failed, or the acquire was cancelled after it was
    /// sent): the key may be held by this client until `settles_by`, when
    /// lease expiry has ended it at the latest.
    #[error("{}", indeterminate(*settles_by))]
    Indeterminate {
        /// When the grant, if there is one, has certainly ended.
        settles_by: Instant,
    },
    /// The acquire was never sent because a server refused this client for
    /// its configuration, which trying again does not fix: a credential or
    /// a protocol version the server refused, or a TLS handshake that
    /// failed on trust (see [`ConnectError::is_refusal`]). The error carries
    /// that refusal, whichever the order of calls (`connected()` awaited
    /// first or not).
    ///
    /// Once every server of a round refused the credential or the version,
    /// the core refuses new acquires at once, and ends those waiting for a
    /// connection, until a server accepts the client. After a TLS failure
    /// it keeps taking acquires and trying to connect: an acquire waits
    /// for a connection as any does (`max(wait, queue_grace)`) and ends
    /// so if the latest attempt was still refused.
    #[error("{}", misconfigured(.0))]
    Misconfigured(ConnectError),
    /// The core refused the request at once: a lease under a millisecond,
    /// or the client is shutting down.
    #[error("not acquired: {0}")]
    Refused(Error),
    /// The driver has stopped (it shut down, or its runtime went away).
    #[error("the client's driver has stopped")]
    Stopped,
}

fn timed_out(sent: bool, cause: Option<&ConnectError>) -> String {
    match (sent, cause) {
        (true, _) => "not acquired: another owner held the key for the whole wait".into(),
        (false, Some(cause)) => {
            format!("not acquired: no server could take the request ({cause})")
        }
        (false, None) => "not acquired: no connection was up in time to send the request".into(),
    }
}

fn misconfigured(cause: &ConnectError) -> String {
    match cause.refused() {
        Some(until) => format!("not acquired: {cause}; no acquire succeeds until {until}"),
        // Never made so by the adapters; said plainly all the same.
        None => format!("not acquired: {cause}"),
    }
}

fn indeterminate(settles_by: Instant) -> String {
    let left = settles_by.saturating_duration_since(Instant::now());
    format!(
        "not known whether acquired: the request went out and no answer came back; \
         lease expiry settles it within {:.1} s",
        left.as_secs_f64()
    )
}

impl AcquireError {
    /// Whether the key may be held by this client after all
    /// ([`Indeterminate`](AcquireError::Indeterminate), or
    /// [`Stopped`](AcquireError::Stopped) with the request perhaps sent).
    pub fn is_indeterminate(&self) -> bool {
        matches!(
            self,
            AcquireError::Indeterminate { .. } | AcquireError::Stopped
        )
    }
}

impl From<RequestError> for AcquireError {
    fn from(error: RequestError) -> AcquireError {
        match error {
            RequestError::Refused(Error::Busy) => AcquireError::Busy,
            RequestError::Refused(e) => AcquireError::Refused(e),
            RequestError::Stopped => AcquireError::Stopped,
        }
    }
}

/// Why work run under a lock (a lock builder's `run`) did not give its
/// result.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The lock was not taken: the work did not run.
    #[error(transparent)]
    NotAcquired(#[from] AcquireError),
    /// The lease was lost, or ran out, before the work ended: the work was
    /// stopped (async adapters), or its result dropped (blocking adapter,
    /// whose work is told through the status of the lease it is handed).
    /// The grant was released all the same.
    #[error("{}", lease_lost(*status))]
    LeaseLost {
        /// Where the lease stood then.
        status: LeaseStatus,
    },
}

fn lease_lost(status: LeaseStatus) -> &'static str {
    match status {
        LeaseStatus::Lost => {
            "the lease was lost (the server no longer has it) before the work ended"
        }
        _ => "the lease ran out before the work ended",
    }
}

/// Why no server took the client: how its latest connection attempt
/// ended, with the I/O error behind it when there was one.
///
/// `Display` names the address and says what went wrong:
/// `cannot connect to 127.0.0.1:7878: Connection refused (os error 111)`,
/// `127.0.0.1:7878 refused this client's credential (auth_failed)`,
/// `TLS handshake with locks.internal:7878 failed: the peer's certificate
/// is not signed by a trusted CA (tls:unknown_ca)`.
///
/// When the connection of a plain client (its connector is not TLS: see
/// the adapter's `Connector::is_tls`) ended before the server's hello
/// (`W`), the text hints at TLS, since that is how a TLS server ends a
/// plain client's connection: `the connection to 127.0.0.1:7878 ended
/// (eof) before the server's hello; if the server uses TLS, connect with a
/// TlsConnector and the server's CA`. The [`reason`](Self::reason) stays
/// what the core says (`eof`).
#[derive(Clone)]
pub struct ConnectError {
    addr: Option<Endpoint>,
    reason: CloseReason,
    io: Option<Arc<io::Error>>,
    /// A plain client's connection ended before the server's hello: the
    /// text hints at TLS.
    tls_hint: bool,
}

impl ConnectError {
    /// An attempt to `addr` that ended for `reason`, with the I/O error
    /// the connector returned, if any.
    pub(crate) fn new(
        addr: Option<Endpoint>,
        reason: CloseReason,
        io: Option<Arc<io::Error>>,
    ) -> ConnectError {
        ConnectError {
            addr,
            reason,
            io,
            tls_hint: false,
        }
    }

    /// The same, said to be the end of a plain client's connection before
    /// the server's hello, when its reason is one a TLS server's refusal
    /// of a plain client can take (the stream ended or failed, or what
    /// came was not the protocol): its text then hints at TLS.
    pub(crate) fn plain_before_hello(mut self) -> ConnectError {
        self.tls_hint = matches!(
            self.reason,
            CloseReason::Eof | CloseReason::Io | CloseReason::Protocol(_)
        );
        self
    }

    /// The client stopped before a server took it.
    pub(crate) fn stopped() -> ConnectError {
        ConnectError::new(None, CloseReason::Shutdown, None)
    }

    /// The address of the attempt (`None` when it is not known).
    pub fn addr(&self) -> Option<&Endpoint> {
        self.addr.as_ref()
    }

    /// How the attempt ended, as the core names it (`connect_failed`,
    /// `tls:<detail>`, `auth_failed`, ...; `shutdown` once the client has
    /// stopped).
    pub fn reason(&self) -> &CloseReason {
        &self.reason
    }

    /// The error the connector returned for a connect that failed (a
    /// refused connection, a host that does not resolve, a TLS handshake
    /// refused, ...).
    pub fn io_error(&self) -> Option<&io::Error> {
        self.io.as_deref()
    }

    /// Whether this client was refused for its configuration, or the
    /// server's, so that trying again does not help until one changes:
    ///
    /// - a credential the server refused (`auth_failed`), or a protocol
    ///   version it does not speak (`unsupported_version`);
    /// - a TLS handshake that failed on trust: a server certificate this
    ///   client does not trust (`tls:unknown_ca`, `tls:name_mismatch`,
    ///   `tls:expired`, `tls:not_yet_valid`, `tls:bad_certificate`), a
    ///   server name that cannot be checked (`tls:bad_server_name`), a
    ///   server that does not speak TLS (`tls:not_tls`), or a TLS alert
    ///   the server refused the handshake with (`tls:alert_<name>`).
    ///
    /// A TLS handshake cut short or too slow (`tls:eof`,
    /// `tls:handshake_timeout`, `tls:handshake_failed`) is not a refusal:
    /// the network or the server may be at fault, and the next attempt may
    /// pass. An acquire never sent for a refusal ends as
    /// [`AcquireError::Misconfigured`].
    pub fn is_refusal(&self) -> bool {
        self.refused().is_some()
    }

    /// For a refusal, what must change before a server accepts this client.
    fn refused(&self) -> Option<&'static str> {
        Some(match &self.reason {
            CloseReason::AuthFailed => "the client's credential is one the server accepts",
            CloseReason::UnsupportedVersion => "a server speaks this client's protocol version",
            CloseReason::Tls(detail) => match detail.as_str() {
                "unknown_ca" | "name_mismatch" | "expired" | "not_yet_valid"
                | "bad_certificate" => "the server presents a certificate this client trusts",
                "bad_server_name" => {
                    "the client's TLS server name is a DNS name or an IP address"
                }
                "not_tls" => "the client and the server agree on whether to use TLS",
                alert if alert.starts_with("alert_") => {
                    "the server accepts this client's TLS handshake (its version, ciphers, certificate)"
                }
                _ => return None,
            },
            _ => return None,
        })
    }
}

impl fmt::Debug for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectError")
            .field("addr", &self.addr)
            .field("reason", &self.reason)
            .field("io", &self.io)
            .field("tls_hint", &self.tls_hint)
            .finish()
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr: &dyn fmt::Display = match &self.addr {
            Some(addr) => addr,
            None => &"the server",
        };
        match (&self.reason, &self.io) {
            (reason @ CloseReason::Tls(_), Some(io)) => match crate::tls::TlsFailure::of(io) {
                Some(failure) => {
                    write!(f, "TLS handshake with {addr} failed: {failure} ({reason})")
                }
                None => write!(f, "TLS handshake with {addr} failed: {io} ({reason})"),
            },
            (CloseReason::Tls(detail), None) => {
                write!(f, "TLS handshake with {addr} failed ({detail})")
            }
            (CloseReason::ConnectFailed, Some(io)) => write!(f, "cannot connect to {addr}: {io}"),
            (CloseReason::ConnectFailed, None) => write!(f, "cannot connect to {addr}"),
            (CloseReason::ConnectTimeout, _) => {
                write!(
                    f,
                    "connecting to {addr} took longer than the connect timeout"
                )
            }
            (CloseReason::HandshakeTimeout, _) => {
                write!(f, "{addr} did not answer the handshake within its timeout")
            }
            (CloseReason::AuthFailed, _) => {
                write!(f, "{addr} refused this client's credential (auth_failed)")
            }
            (CloseReason::UnsupportedVersion, _) => write!(
                f,
                "{addr} does not speak this client's protocol version (unsupported_version)"
            ),
            (CloseReason::NoLeader, _) => write!(f, "{addr} has no leader to serve (no_leader)"),
            (CloseReason::NotActive, _) => write!(f, "{addr} is not active (not_active)"),
            (CloseReason::Moved, _) => write!(f, "{addr} redirected to a leader (moved)"),
            (CloseReason::Shutdown, _) if self.addr.is_none() => {
                f.write_str("the client has shut down")
            }
            (reason, _) if self.tls_hint => write!(
                f,
                "the connection to {addr} ended ({reason}) before the server's hello; \
                 if the server uses TLS, connect with a TlsConnector and the server's CA"
            ),
            (reason, _) => write!(f, "the connection to {addr} ended ({reason})"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.io
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A host that did not resolve, said so: the connectors' error for it.
pub(crate) fn unresolved(addr: &Endpoint, error: io::Error) -> io::Error {
    let host = addr
        .as_str()
        .rsplit_once(':')
        .map_or(addr.as_str(), |(host, _)| host);
    io::Error::new(error.kind(), format!("cannot resolve {host}: {error}"))
}

/// Why a client could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// A value of the configuration is outside its field's range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `spawn` was called outside a tokio runtime: call it from within one
    /// (inside `#[tokio::main]`, or `Runtime::enter`).
    #[error(
        "no tokio runtime here: start the client from within one (#[tokio::main], Runtime::enter)"
    )]
    NoRuntime,
    /// The driver thread could not be started.
    #[error("cannot start the client's driver thread: {0}")]
    Thread(#[source] io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Violation;
    use crate::names::Name;

    fn ended(reason: CloseReason) -> ConnectError {
        let addr = Endpoint::new("127.0.0.1:7878").expect("an endpoint");
        ConnectError::new(Some(addr), reason, None)
    }

    fn tls(detail: &str) -> CloseReason {
        CloseReason::Tls(Name::new(detail).expect("an atom"))
    }

    #[test]
    fn a_refusal_is_what_configuration_must_fix() {
        let refusals = [
            CloseReason::AuthFailed,
            CloseReason::UnsupportedVersion,
            tls("unknown_ca"),
            tls("name_mismatch"),
            tls("expired"),
            tls("not_yet_valid"),
            tls("bad_certificate"),
            tls("bad_server_name"),
            tls("not_tls"),
            tls("alert_handshake_failure"),
            tls("alert_protocol_version"),
        ];
        for reason in refusals {
            let error = ended(reason.clone());
            assert!(error.is_refusal(), "{reason}");
            let text = AcquireError::Misconfigured(error).to_string();
            assert!(
                text.starts_with("not acquired: ") && text.contains("; no acquire succeeds until "),
                "{text}"
            );
        }
        let others = [
            tls("eof"),
            tls("handshake_timeout"),
            tls("handshake_failed"),
            CloseReason::Eof,
            CloseReason::Io,
            CloseReason::ConnectFailed,
            CloseReason::ConnectTimeout,
            CloseReason::HandshakeTimeout,
            CloseReason::NoLeader,
            CloseReason::NotActive,
            CloseReason::Moved,
        ];
        for reason in others {
            assert!(!ended(reason.clone()).is_refusal(), "{reason}");
        }
    }

    #[test]
    fn the_hint_at_tls_is_for_an_end_before_the_hello_and_only_in_the_text() {
        let hinted = ended(CloseReason::Eof).plain_before_hello();
        assert_eq!(hinted.reason(), &CloseReason::Eof);
        assert_eq!(
            hinted.to_string(),
            "the connection to 127.0.0.1:7878 ended (eof) before the server's hello; if the \
             server uses TLS, connect with a TlsConnector and the server's CA"
        );
        let framing = ended(CloseReason::Protocol(Violation::SecondWelcome)).plain_before_hello();
        assert!(
            framing.to_string().contains("if the server uses TLS"),
            "{framing}"
        );
        // What says plainly what went wrong gets no hint.
        for reason in [
            CloseReason::AuthFailed,
            CloseReason::ConnectFailed,
            CloseReason::NoLeader,
            CloseReason::HandshakeTimeout,
        ] {
            let error = ended(reason).plain_before_hello();
            assert!(!error.to_string().contains("TLS"), "{error}");
        }
        assert_eq!(
            ended(CloseReason::Eof).to_string(),
            "the connection to 127.0.0.1:7878 ended (eof)"
        );
    }
}
