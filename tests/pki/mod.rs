//! Certificates for the TLS tests, made by rcgen when a test starts: a CA,
//! the certificates it signs (servers, clients, expired ones, ones for the
//! wrong name), and a second CA nobody trusts. ECDSA P-256 keys: making
//! one takes well under a millisecond.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use ticketing::tls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use ticketing::tls::rustls::RootCertStore;
use ticketing::tls::{self, ClientTls, ServerTls};

/// The names a server certificate is for unless a test says otherwise:
/// what the tests connect to.
pub const SERVER_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

/// A certificate and its private key.
pub struct Identity {
    pub cert: CertificateDer<'static>,
    pub cert_pem: String,
    key: KeyPair,
}

impl Identity {
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()))
    }

    /// As the TLS configurations take it.
    pub fn tls(&self) -> tls::Identity {
        tls::Identity::new(vec![self.cert.clone()], self.key())
    }

    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// Writes `NAME.pem` and `NAME.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write a certificate");
        std::fs::write(&key, self.key_pem()).expect("write a key");
        (cert, key)
    }
}

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a CA certificate");
        Ca { issuer }
    }

    pub fn cert(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A root store with this CA in it.
    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert()).expect("a valid root");
        roots
    }

    /// A certificate for `names`, changed by `tweak` (its validity, say).
    pub fn issue(&self, names: &[&str], tweak: impl FnOnce(&mut CertificateParams)) -> Identity {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("valid names");
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, first);
        }
        tweak(&mut params);
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        Identity {
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
            key,
        }
    }

    /// A server certificate for [`SERVER_NAMES`].
    pub fn server(&self) -> Identity {
        self.issue(&SERVER_NAMES, |_| {})
    }

    /// A server certificate for [`SERVER_NAMES`] that expired in 2001.
    pub fn expired_server(&self) -> Identity {
        self.issue(&SERVER_NAMES, |p| {
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(2001, 1, 1);
        })
    }

    /// A client certificate.
    pub fn client(&self, name: &str) -> Identity {
        self.issue(&[name], |_| {})
    }
}

/// The server's TLS with `identity`; with `client_ca`, it requires client
/// certificates that CA signed.
pub fn server_tls(identity: &Identity, client_ca: Option<&Ca>) -> ServerTls {
    let mut builder = ServerTls::builder().identity(identity.tls());
    if let Some(ca) = client_ca {
        builder = builder.client_ca(ca.roots());
    }
    builder.build().expect("a server TLS configuration")
}

/// A client's TLS trusting `ca`, presenting `identity` if given.
pub fn client_tls(ca: &Ca, identity: Option<&Identity>) -> ClientTls {
    let mut builder = ClientTls::builder().roots(ca.roots());
    if let Some(identity) = identity {
        builder = builder.identity(identity.tls());
    }
    builder.build().expect("a client TLS configuration")
}
