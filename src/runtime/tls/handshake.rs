//! What a handshake that fails is called, and how long one may take.

use std::io;

use crate::names::Name;
use crate::tls::TlsFailure;

/// What a failed handshake is called: the [`TlsFailure`] of `error`, if it
/// is one, as an I/O error that carries it; other I/O errors (a reset
/// connection, say) as they are, reported as a failed connect.
pub(crate) fn handshake_error(error: io::Error) -> io::Error {
    if TlsFailure::of(&error).is_some() {
        return error;
    }
    if error.kind() == io::ErrorKind::UnexpectedEof {
        return TlsFailure::Eof.into();
    }
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls) => failure(tls).into(),
        None => error,
    }
}

/// The failure a rustls error stands for.
fn failure(error: &rustls::Error) -> TlsFailure {
    use rustls::{CertificateError as Cert, Error, InvalidMessage as Message};
    match error {
        Error::InvalidCertificate(Cert::UnknownIssuer) => TlsFailure::UnknownCa,
        Error::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
            TlsFailure::NameMismatch
        }
        Error::InvalidCertificate(Cert::Expired | Cert::ExpiredContext { .. }) => {
            TlsFailure::Expired
        }
        Error::InvalidCertificate(Cert::NotValidYet | Cert::NotValidYetContext { .. }) => {
            TlsFailure::NotYetValid
        }
        Error::InvalidCertificate(_) | Error::NoCertificatesPresented => TlsFailure::BadCertificate,
        // What a record header that is not TLS's looks like: a plain-text
        // line read as a record's type, version and length.
        Error::InvalidMessage(
            Message::InvalidContentType
            | Message::UnknownProtocolVersion
            | Message::MessageTooLarge,
        )
        | Error::PeerSentOversizedRecord => TlsFailure::NotTls,
        Error::AlertReceived(alert) => {
            let name = match alert.as_str() {
                Some(name) => snake_case(name),
                None => u8::from(*alert).to_string(),
            };
            Name::new(name).map_or(TlsFailure::Failed, TlsFailure::Alert)
        }
        _ => TlsFailure::Failed,
    }
}

/// `UnknownPSKIdentity` as `unknown_psk_identity`.
fn snake_case(camel: &str) -> String {
    let chars: Vec<char> = camel.chars().collect();
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            let after_lower = chars[i - 1].is_ascii_lowercase();
            let starts_word = chars[i - 1].is_ascii_uppercase()
                && chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
            if after_lower || starts_word {
                out.push('_');
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// Runs `handshake`, giving it up as [`TlsFailure::HandshakeTimeout`] once
/// `timer` (the runtime's, set to the handshake timeout) fires, and naming
/// its failure ([`handshake_error`]).
#[cfg(any(feature = "tokio", feature = "futures-io"))]
pub(crate) async fn bounded<T>(
    handshake: impl std::future::Future<Output = io::Result<T>>,
    timer: impl std::future::Future<Output = ()>,
) -> io::Result<T> {
    use std::future::poll_fn;
    use std::pin::pin;
    use std::task::Poll;

    let mut handshake = pin!(handshake);
    let mut timer = pin!(timer);
    poll_fn(|cx| {
        if let Poll::Ready(result) = handshake.as_mut().poll(cx) {
            return Poll::Ready(result.map_err(handshake_error));
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(TlsFailure::HandshakeTimeout.into())),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alert_names_are_snake_case() {
        assert_eq!(snake_case("UnknownCA"), "unknown_ca");
        assert_eq!(snake_case("UnknownPSKIdentity"), "unknown_psk_identity");
        assert_eq!(snake_case("CertificateRequired"), "certificate_required");
        assert_eq!(snake_case("CloseNotify"), "close_notify");
    }

    #[test]
    fn rustls_errors_get_their_names() {
        use rustls::{AlertDescription, CertificateError, Error, InvalidMessage};
        let named = |e: Error| {
            let error = handshake_error(io::Error::new(io::ErrorKind::InvalidData, e));
            TlsFailure::of(&error).map(TlsFailure::detail)
        };
        let cases = [
            (
                Error::InvalidCertificate(CertificateError::UnknownIssuer),
                "unknown_ca",
            ),
            (
                Error::InvalidCertificate(CertificateError::NotValidForName),
                "name_mismatch",
            ),
            (
                Error::InvalidCertificate(CertificateError::Expired),
                "expired",
            ),
            (
                Error::InvalidCertificate(CertificateError::NotValidYet),
                "not_yet_valid",
            ),
            (
                Error::InvalidCertificate(CertificateError::BadSignature),
                "bad_certificate",
            ),
            (
                Error::InvalidMessage(InvalidMessage::InvalidContentType),
                "not_tls",
            ),
            (
                Error::AlertReceived(AlertDescription::HandshakeFailure),
                "alert_handshake_failure",
            ),
            (
                Error::AlertReceived(AlertDescription::Unknown(200)),
                "alert_200",
            ),
            (Error::DecryptError, "handshake_failed"),
        ];
        for (error, want) in cases {
            assert_eq!(named(error).as_deref(), Some(want));
        }
        let eof = handshake_error(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "tls handshake eof",
        ));
        assert_eq!(TlsFailure::of(&eof), Some(&TlsFailure::Eof));
        let reset = handshake_error(io::ErrorKind::ConnectionReset.into());
        assert_eq!(
            TlsFailure::of(&reset),
            None,
            "a transport failure stays one"
        );
    }
}
