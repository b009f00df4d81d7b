//! The tokio adapter's TLS connector, on tokio-rustls.

use super::bounded;
use crate::names::Endpoint;
use crate::runtime::tokio::{Connector, TcpConnector};
use crate::tls::ClientTls;

tls_connector! {
    /// Connects through another connector (TCP unless told otherwise), then
    /// runs a TLS handshake over it, bounded by
    /// [`ClientTls::handshake_timeout`] on tokio's timer. A failed handshake
    /// ends the connect attempt with its
    /// [`TlsFailure`](crate::tls::TlsFailure), closed as `tls:<detail>`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use ticketing::client::Config;
    /// use ticketing::tls::ClientTls;
    /// use ticketing::tokio::{spawn, TlsConnector};
    /// use ticketing::{Endpoint, Name};
    ///
    /// let tls = ClientTls::builder().ca_file("ca.pem")?.build()?;
    /// let config = Config::new([Endpoint::new("locks.internal:7878")?], Name::new("worker-1")?);
    /// let handle = spawn(config, TlsConnector::new(tls))?;
    /// # Ok(()) }
    /// ```
    async: tokio_rustls, ::tokio::time::sleep
}
