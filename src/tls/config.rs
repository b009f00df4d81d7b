//! What both sides of a TLS connection are configured with, on rustls and
//! its ring provider.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::TlsFailure;
use crate::names::Endpoint;

/// Why a TLS configuration could not be made. API misuse and bad files;
/// a handshake that fails is a [`TlsFailure`] of the connection instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{}: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: pem::Error,
    },
    /// A PEM file holds no certificate.
    #[error("{}: no certificate in it", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A PEM file holds no private key.
    #[error("{}: no private key in it", path.display())]
    NoPrivateKey {
        /// The file.
        path: PathBuf,
    },
    /// A certificate of a CA file cannot be a trusted root.
    #[error("{}: a certificate that cannot be a trusted root: {source}", path.display())]
    BadRoot {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// A client with nothing to trust: give a CA file or a root store.
    #[error("nothing to trust: give a CA file or a root store")]
    NoRoots,
    /// A server without a certificate: give one, with its key.
    #[error("no certificate for the server: give one, with its private key")]
    NoServerCertificate,
    /// A server name that is neither a DNS name nor an IP address.
    #[error("{name:?} is neither a DNS name nor an IP address")]
    ServerName {
        /// The name given.
        name: String,
    },
    /// A handshake timeout of zero.
    #[error("the TLS handshake timeout must be positive")]
    ZeroHandshakeTimeout,
    /// rustls refused the configuration (a key that does not match its
    /// certificate, say).
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
    /// rustls refused the client CA (an empty one, say).
    #[error(transparent)]
    ClientCa(#[from] VerifierBuilderError),
}

/// The crypto provider of every configuration made here: ring, named
/// rather than taken from the process default, so that another crate's
/// choice cannot change (or break) ours.
fn provider() -> Arc<CryptoProvider> {
    // rustls 0.23.48 deprecates ring's provider for having no post-quantum
    // key exchange, and offers none other for ring: the one that has it is
    // aws-lc-rs, whose build wants cmake (Cargo.toml). The deprecation is
    // about what ring lacks, not a path to move to; builds on both the
    // locked rustls and the newest stay free of warnings.
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file, at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key of a PEM file.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| match source {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: path.to_owned(),
        },
        source => TlsError::Pem {
            path: path.to_owned(),
            source,
        },
    })
}

/// Adds every certificate of the PEM file `path` to `roots`.
fn add_roots(roots: &mut RootCertStore, path: &Path) -> Result<(), TlsError> {
    for cert in certificates(path)? {
        roots.add(cert).map_err(|source| TlsError::BadRoot {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// A certificate chain and its private key: what a side presents to the
/// other. Its `Debug` leaves the key out.
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Identity {
    /// `chain` (the side's own certificate first), whose private key is
    /// `key`.
    pub fn new(chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>) -> Identity {
        Identity { chain, key }
    }

    /// From PEM files: the chain in `cert_file`, its private key (PKCS #8,
    /// PKCS #1 or SEC1) in `key_file`.
    pub fn from_pem_files(
        cert_file: impl AsRef<Path>,
        key_file: impl AsRef<Path>,
    ) -> Result<Identity, TlsError> {
        Ok(Identity {
            chain: certificates(cert_file.as_ref())?,
            key: private_key(key_file.as_ref())?,
        })
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("certificates", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// A client's TLS: what it trusts and presents (a rustls
/// [`ClientConfig`]), the name it expects of servers, and how long a
/// handshake may take. Cheap to clone; every connection shares it.
#[derive(Clone)]
pub struct ClientTls {
    pub(crate) config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
    pub(crate) handshake_timeout: Duration,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// How long a handshake may take unless told otherwise: less than the
    /// client core's default connect timeout (5 s), so that a stalled
    /// handshake is reported as one.
    pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

    /// Starts a configuration on rustls's ring provider: roots to trust
    /// (required), a client certificate (for mutual TLS).
    pub fn builder() -> ClientTlsBuilder {
        ClientTlsBuilder {
            roots: RootCertStore::empty(),
            identity: None,
        }
    }

    /// A client on a rustls configuration of the embedder's own (a custom
    /// verifier, another provider).
    pub fn new(config: Arc<ClientConfig>) -> ClientTls {
        ClientTls {
            config,
            server_name: None,
            handshake_timeout: ClientTls::DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }

    /// Checks every server's certificate against `name` instead of the host
    /// part of the address connected to.
    pub fn server_name(mut self, name: &str) -> Result<ClientTls, TlsError> {
        let parsed = ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName {
            name: name.to_owned(),
        })?;
        self.server_name = Some(parsed);
        Ok(self)
    }

    /// How long a handshake may take, from the moment the connection is up
    /// (default [`DEFAULT_HANDSHAKE_TIMEOUT`](Self::DEFAULT_HANDSHAKE_TIMEOUT)).
    /// Keep it below the client's connect timeout, which bounds the whole
    /// attempt: the later of the two never fires.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Result<ClientTls, TlsError> {
        if timeout.is_zero() {
            return Err(TlsError::ZeroHandshakeTimeout);
        }
        self.handshake_timeout = timeout;
        Ok(self)
    }

    /// The rustls configuration.
    pub fn rustls_config(&self) -> &Arc<ClientConfig> {
        &self.config
    }

    /// The name to check the certificate of the server at `addr` against:
    /// the one given, or the host part of `addr` (brackets taken off an
    /// IPv6 address).
    pub fn server_name_for(&self, addr: &Endpoint) -> Result<ServerName<'static>, TlsFailure> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        let addr = addr.as_str();
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        ServerName::try_from(host.to_owned()).map_err(|_| TlsFailure::BadServerName)
    }
}

/// Builds a [`ClientTls`]; see [`ClientTls::builder`].
#[derive(Debug)]
pub struct ClientTlsBuilder {
    roots: RootCertStore,
    identity: Option<Identity>,
}

impl ClientTlsBuilder {
    /// Trusts the roots of `roots` too.
    pub fn roots(mut self, roots: RootCertStore) -> ClientTlsBuilder {
        self.roots.roots.extend(roots.roots);
        self
    }

    /// Trusts every CA certificate of the PEM file `path` too.
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Result<ClientTlsBuilder, TlsError> {
        add_roots(&mut self.roots, path.as_ref())?;
        Ok(self)
    }

    /// Presents `identity` to a server that asks for a certificate
    /// (mutual TLS).
    pub fn identity(mut self, identity: Identity) -> ClientTlsBuilder {
        self.identity = Some(identity);
        self
    }

    /// The configuration, on rustls's safe default protocol versions.
    pub fn build(self) -> Result<ClientTls, TlsError> {
        if self.roots.is_empty() {
            return Err(TlsError::NoRoots);
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots);
        let config = match self.identity {
            Some(Identity { chain, key }) => builder.with_client_auth_cert(chain, key)?,
            None => builder.with_no_client_auth(),
        };
        Ok(ClientTls::new(Arc::new(config)))
    }
}

/// A server's TLS: its certificate, and the CA it requires client
/// certificates to be signed by, if any (a rustls [`ServerConfig`]).
/// Cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    pub(crate) config: Arc<ServerConfig>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Starts a configuration on rustls's ring provider: the server's
    /// certificate (required), a client CA (for mutual TLS).
    pub fn builder() -> ServerTlsBuilder {
        ServerTlsBuilder {
            identity: None,
            client_roots: None,
        }
    }

    /// A server on a rustls configuration of the embedder's own.
    pub fn new(config: Arc<ServerConfig>) -> ServerTls {
        ServerTls { config }
    }

    /// The rustls configuration.
    pub fn rustls_config(&self) -> &Arc<ServerConfig> {
        &self.config
    }
}

/// Builds a [`ServerTls`]; see [`ServerTls::builder`].
#[derive(Debug)]
pub struct ServerTlsBuilder {
    identity: Option<Identity>,
    client_roots: Option<RootCertStore>,
}

impl ServerTlsBuilder {
    /// Presents `identity` (required).
    pub fn identity(mut self, identity: Identity) -> ServerTlsBuilder {
        self.identity = Some(identity);
        self
    }

    /// Requires of every client a certificate that leads to a root of
    /// `roots`; one without is refused during the handshake, before a byte
    /// of it reaches the server core.
    pub fn client_ca(mut self, roots: RootCertStore) -> ServerTlsBuilder {
        self.client_roots
            .get_or_insert_with(RootCertStore::empty)
            .roots
            .extend(roots.roots);
        self
    }

    /// As [`client_ca`](Self::client_ca), with the CA certificates of the
    /// PEM file `path`.
    pub fn client_ca_file(mut self, path: impl AsRef<Path>) -> Result<ServerTlsBuilder, TlsError> {
        add_roots(
            self.client_roots.get_or_insert_with(RootCertStore::empty),
            path.as_ref(),
        )?;
        Ok(self)
    }

    /// The configuration, on rustls's safe default protocol versions.
    pub fn build(self) -> Result<ServerTls, TlsError> {
        let Identity { chain, key } = self.identity.ok_or(TlsError::NoServerCertificate)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = match self.client_roots {
            Some(roots) => builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build()?,
            ),
            None => builder.with_no_client_auth(),
        };
        Ok(ServerTls::new(Arc::new(
            builder.with_single_cert(chain, key)?,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_is_the_host_part_unless_given() {
        let tls = ClientTls::new(Arc::new(
            ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .expect("ring's versions")
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth(),
        ));
        let name = |tls: &ClientTls, addr: &str| {
            tls.server_name_for(&Endpoint::new(addr).expect("an endpoint"))
                .map(|n| n.to_str().into_owned())
        };
        assert_eq!(
            name(&tls, "locks.internal:7878"),
            Ok("locks.internal".into())
        );
        assert_eq!(name(&tls, "127.0.0.1:7878"), Ok("127.0.0.1".into()));
        assert_eq!(name(&tls, "[::1]:7878"), Ok("::1".into()));
        assert_eq!(name(&tls, "bad_name!:7878"), Err(TlsFailure::BadServerName));
        let named = tls.server_name("locks.example").expect("a DNS name");
        assert_eq!(name(&named, "127.0.0.1:7878"), Ok("locks.example".into()));
        assert!(matches!(
            ClientTls::builder().build(),
            Err(TlsError::NoRoots)
        ));
    }
}
