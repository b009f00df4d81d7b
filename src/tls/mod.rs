//! TLS for the client adapters and the server (feature `tls`, on rustls
//! with its ring provider).
//!
//! TLS lives in connectors and a listener; the adapters and the cores do
//! not know it is there (the types below come with the feature `tls`):
//!
//! - `ClientTls`: what a client trusts (a root store, or the CA
//!   certificates of a PEM file), the `Identity` it presents if the
//!   server asks for one (mutual TLS), the name it expects (by default the
//!   host part of each address), and how long a handshake may take.
//! - Each client adapter has a `TlsConnector` over its TCP connector (or
//!   any other): `ticketing::tokio::TlsConnector`,
//!   `ticketing::futures_io::TlsConnector`, `ticketing::blocking::TlsConnector`.
//! - `ServerTls` and `ticketing::serve::TlsListener`: the server's
//!   certificate, and the CA whose certificates it requires of clients.
//!
//! ```no_run
//! # #[cfg(all(feature = "tokio", feature = "tls"))]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ticketing::client::Config;
//! use ticketing::tls::{ClientTls, Identity};
//! use ticketing::tokio::{spawn, TlsConnector};
//! use ticketing::{Endpoint, Name};
//!
//! let tls = ClientTls::builder()
//!     .ca_file("ca.pem")?
//!     .identity(Identity::from_pem_files("client.pem", "client.key")?) // mutual TLS
//!     .build()?;
//! let config = Config::new([Endpoint::new("locks.internal:7878")?], Name::new("worker-1")?);
//! let handle = spawn(config, TlsConnector::new(tls))?;
//! # Ok(()) }
//! ```
//!
//! # Failures
//!
//! A handshake that fails ends the connect attempt: the connector returns
//! an [`io::Error`] that carries a [`TlsFailure`], and the adapter hands it
//! to the core as [`Client::handle_tls_failed`], which closes with
//! [`CloseReason::Tls`] (shown as `tls:<detail>`, the detail being
//! [`TlsFailure::detail`]) and backs off as for a failed connect. A
//! connector of your own (another TLS stack, say) reports its failures the
//! same way: return `io::Error::from(TlsFailure::...)`. [`TlsFailure`] is
//! there whenever a client adapter is, with or without the feature `tls`.
//!
//! A handshake that stalls is bounded by the connector
//! (`ClientTls::handshake_timeout`, 3 s by default): shorter than the
//! core's connect timeout (5 s by default), so that a peer that accepted
//! the connection and then never spoke TLS is named for what it is,
//! `tls:handshake_timeout`, rather than `connect_timeout`, which would send
//! whoever reads it to look at the network. The core's connect timeout
//! still bounds the whole attempt, whatever a connector does: set it below
//! the handshake timeout and it fires first, as `connect_timeout`.
//!
//! With TLS 1.3, a client learns that the server refused its certificate
//! only after its own side of the handshake is done (that is how TLS 1.3
//! works): the refusal arrives as the connection ends before the server's
//! `W`, and the core reports it as it does any transport that fails then
//! (`io`). The server never reads a byte from such a client: it refuses it
//! before its `H`.
//!
//! [`Client::handle_tls_failed`]: crate::client::Client::handle_tls_failed
//! [`CloseReason::Tls`]: crate::client::CloseReason::Tls

use std::borrow::Cow;
use std::io;

#[cfg(feature = "tls")]
mod config;

#[cfg(feature = "tls")]
pub use config::{ClientTls, ClientTlsBuilder, Identity, ServerTls, ServerTlsBuilder, TlsError};
/// The rustls this crate is built with, for embedders that make their own
/// [`rustls::ClientConfig`] or [`rustls::ServerConfig`].
#[cfg(feature = "tls")]
pub use rustls;

use crate::names::Name;

/// Why a TLS handshake failed, as a connector tells the adapter. Carried
/// in the [`io::Error`] a connector returns (`io::Error::from(failure)`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The peer's certificate does not lead to a CA this side trusts.
    #[error("the peer's certificate is not signed by a trusted CA")]
    UnknownCa,
    /// The server's certificate is not for the name asked for.
    #[error("the server's certificate is not for the name asked for")]
    NameMismatch,
    /// The peer's certificate has expired.
    #[error("the peer's certificate has expired")]
    Expired,
    /// The peer's certificate is not valid yet.
    #[error("the peer's certificate is not valid yet")]
    NotYetValid,
    /// The peer's certificate is unusable otherwise (a bad signature or
    /// encoding, a wrong purpose, revoked), or it sent none.
    #[error("the peer's certificate is not acceptable")]
    BadCertificate,
    /// The peer answered with something that is not TLS (a plain-TCP
    /// server, say).
    #[error("the peer does not speak TLS")]
    NotTls,
    /// The peer closed the connection during the handshake.
    #[error("the peer closed the connection during the TLS handshake")]
    Eof,
    /// The handshake took longer than the connector allows.
    #[error("the TLS handshake took too long")]
    HandshakeTimeout,
    /// The name to check the server's certificate against is neither a
    /// DNS name nor an IP address.
    #[error("the server name is neither a DNS name nor an IP address")]
    BadServerName,
    /// The peer refused the handshake with this TLS alert (its name in
    /// snake case, such as `handshake_failure` or `protocol_version`).
    #[error("the peer refused the TLS handshake: {0}")]
    Alert(Name),
    /// The handshake failed for another reason.
    #[error("the TLS handshake failed")]
    Failed,
}

impl TlsFailure {
    /// The atom in the close reason `tls:<detail>`: `unknown_ca`,
    /// `name_mismatch`, `expired`, `not_yet_valid`, `bad_certificate`,
    /// `not_tls`, `eof`, `handshake_timeout`, `bad_server_name`,
    /// `alert_<name>`, `handshake_failed`.
    pub fn detail(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            TlsFailure::UnknownCa => "unknown_ca",
            TlsFailure::NameMismatch => "name_mismatch",
            TlsFailure::Expired => "expired",
            TlsFailure::NotYetValid => "not_yet_valid",
            TlsFailure::BadCertificate => "bad_certificate",
            TlsFailure::NotTls => "not_tls",
            TlsFailure::Eof => "eof",
            TlsFailure::HandshakeTimeout => "handshake_timeout",
            TlsFailure::BadServerName => "bad_server_name",
            TlsFailure::Alert(name) => return Cow::Owned(format!("alert_{name}")),
            TlsFailure::Failed => "handshake_failed",
        })
    }

    /// The failure an I/O error carries, if it carries one.
    pub fn of(error: &io::Error) -> Option<&TlsFailure> {
        error.get_ref()?.downcast_ref()
    }
}

impl From<TlsFailure> for io::Error {
    fn from(failure: TlsFailure) -> io::Error {
        let kind = match failure {
            TlsFailure::HandshakeTimeout => io::ErrorKind::TimedOut,
            TlsFailure::Eof => io::ErrorKind::UnexpectedEof,
            TlsFailure::BadServerName => io::ErrorKind::InvalidInput,
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_detail_is_an_atom_and_survives_an_io_error() {
        let alert = TlsFailure::Alert(Name::new("protocol_version").expect("an atom"));
        let all = [
            TlsFailure::UnknownCa,
            TlsFailure::NameMismatch,
            TlsFailure::Expired,
            TlsFailure::NotYetValid,
            TlsFailure::BadCertificate,
            TlsFailure::NotTls,
            TlsFailure::Eof,
            TlsFailure::HandshakeTimeout,
            TlsFailure::BadServerName,
            alert,
            TlsFailure::Failed,
        ];
        for failure in all {
            assert!(Name::new(failure.detail()).is_ok(), "{failure:?}");
            let error = io::Error::from(failure.clone());
            assert_eq!(TlsFailure::of(&error), Some(&failure));
        }
        assert_eq!(
            TlsFailure::Alert(Name::new("protocol_version").expect("an atom")).detail(),
            "alert_protocol_version"
        );
        assert_eq!(TlsFailure::of(&io::Error::other("refused")), None);
    }
}
