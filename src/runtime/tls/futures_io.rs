//! The futures-io adapter's TLS connector, on futures-rustls.

use std::time::Duration;

use super::bounded;
use crate::names::Endpoint;
use crate::runtime::futures_io::{Connector, TcpConnector};
use crate::tls::ClientTls;

tls_connector! {
    /// Connects through another connector (TCP unless told otherwise), then
    /// runs a TLS handshake over it, bounded by
    /// [`ClientTls::handshake_timeout`] on `async-io`'s timer. A failed
    /// handshake ends the connect attempt with its
    /// [`TlsFailure`](crate::tls::TlsFailure), closed as `tls:<detail>`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use ticketing::client::Config;
    /// use ticketing::futures_io::{client, TlsConnector};
    /// use ticketing::tls::ClientTls;
    /// use ticketing::{Endpoint, Name};
    ///
    /// let tls = ClientTls::builder().ca_file("ca.pem")?.build()?;
    /// let config = Config::new([Endpoint::new("locks.internal:7878")?], Name::new("worker-1")?);
    /// let (handle, driver) = client(config, TlsConnector::new(tls))?;
    /// # Ok(()) }
    /// ```
    async: futures_rustls, sleep
}

/// `async-io`'s timer, the reactor's of smol and async-std alike.
async fn sleep(duration: Duration) {
    async_io::Timer::after(duration).await;
}
