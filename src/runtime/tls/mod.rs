//! TLS in the client runtime (feature `tls`): each adapter's
//! `TlsConnector`, what a failed handshake is called, and how a failed
//! attempt reaches the core. What a client trusts and presents
//! ([`ClientTls`](crate::tls::ClientTls)) and what a failure is
//! ([`TlsFailure`]) are the crate's [`tls`](crate::tls) module, shared
//! with the server host.

use std::io;

use crate::client::{Client, ConnId};
use crate::names::Name;
use crate::time::Time;
use crate::tls::TlsFailure;

/// Defines a client adapter's `TlsConnector`: a connector of the adapter
/// (its `TcpConnector` by default) and a [`ClientTls`]. With `async`, also
/// the adapter's `Connector` on it: the inner connection, then the
/// handshake of the rustls wrapper crate named, bounded by the timer
/// function named (`sleep(duration)`).
#[cfg(feature = "tls")]
macro_rules! tls_connector {
    ($(#[$doc:meta])* async: $rustls:ident, $sleep:path) => {
        tls_connector! { $(#[$doc])* }

        impl<C: Connector> Connector for TlsConnector<C> {
            type Stream = $rustls::client::TlsStream<C::Stream>;

            fn is_tls(&self) -> bool {
                true
            }

            async fn connect(&self, addr: Endpoint) -> std::io::Result<Self::Stream> {
                let name = self.tls.server_name_for(&addr)?;
                let stream = self.inner.connect(addr).await?;
                let tls = $rustls::TlsConnector::from(std::sync::Arc::clone(&self.tls.config));
                bounded(tls.connect(name, stream), $sleep(self.tls.handshake_timeout)).await
            }
        }
    };
    ($(#[$doc:meta])*) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct TlsConnector<C = TcpConnector> {
            inner: C,
            tls: ClientTls,
        }

        impl TlsConnector {
            /// TLS over TCP.
            pub fn new(tls: ClientTls) -> TlsConnector {
                TlsConnector::over(TcpConnector, tls)
            }
        }

        impl<C> TlsConnector<C> {
            /// TLS over the streams of `inner`.
            pub fn over(inner: C, tls: ClientTls) -> TlsConnector<C> {
                TlsConnector { inner, tls }
            }
        }
    };
}

#[cfg(all(feature = "tls", feature = "blocking"))]
pub(crate) mod blocking;
#[cfg(all(feature = "tls", feature = "futures-io"))]
pub(crate) mod futures_io;
#[cfg(feature = "tls")]
mod handshake;
#[cfg(all(feature = "tls", feature = "tokio"))]
pub(crate) mod tokio;

#[cfg(all(feature = "tls", any(feature = "tokio", feature = "futures-io")))]
use handshake::bounded;
#[cfg(all(feature = "tls", feature = "blocking"))]
use handshake::handshake_error;

/// Hands a failed connect attempt to the core: as a TLS failure, with its
/// detail, if `error` carries one, else as a failed connect.
pub(crate) fn connect_failed(client: &mut Client, now: Time, conn: ConnId, error: &io::Error) {
    // Every detail is an atom; were one ever not, the attempt still fails.
    match TlsFailure::of(error).and_then(|f| Name::new(f.detail()).ok()) {
        Some(detail) => client.handle_tls_failed(now, conn, detail),
        None => client.handle_connect_failed(now, conn),
    }
}
