//! Options and configuration shared by the subcommands that run a client,
//! the parser of credentials, which never echoes one, and the operating
//! system's entropy for the subcommands that run a server.

use std::error::Error;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::builder::TypedValueParser;
use clap::error::ErrorKind;
use clap::{Args as ClapArgs, ValueEnum};
use ticketing::client::{BusyPolicy, CancelPolicy, Config};
use ticketing::tls::{ClientTls, Identity};
use ticketing::tokio::{Handle, Notices, TcpConnector, TlsConnector};
use ticketing::wire::MAX_ATOM;
use ticketing::{Endpoint, Name};

#[derive(Clone, Copy, ValueEnum)]
pub enum BusyArg {
    Retry,
    FailFast,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum CancelArg {
    Close,
    KeepWaiter,
}

/// How to reach the service, and the client core's settings.
#[derive(ClapArgs)]
pub struct ClientOptions {
    /// A server address (host:port); repeat for several.
    #[arg(long = "endpoint", value_name = "ADDR", required = true)]
    pub endpoints: Vec<Endpoint>,
    /// An extra address a leader hint may name; repeat for several.
    #[arg(long = "allow", value_name = "ADDR")]
    pub allow: Vec<Endpoint>,
    /// Sent in the handshake.
    #[arg(long, value_name = "ID", default_value = "ticketing-cli")]
    pub client_id: Name,
    /// Sent in the handshake. Better from the environment: a command line
    /// is visible to every user of the machine (`ps`).
    #[arg(
        long,
        value_name = "C",
        value_parser = Secret,
        allow_hyphen_values = true,
        env = CREDENTIAL_ENV,
        hide_env_values = true
    )]
    pub credential: Option<Name>,
    /// Window slots kept for releases.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub reserved: u32,
    /// What a B answer does.
    #[arg(long, value_enum, default_value = "retry")]
    pub busy: BusyArg,
    /// What cancelling a sent acquire does.
    #[arg(long = "on-cancel", value_enum, default_value = "close")]
    pub on_cancel: CancelArg,
    /// How late an answer may be before the connection is deemed unwell.
    #[arg(long, value_name = "N")]
    pub answer_grace_ms: Option<u64>,
    /// How long an unsent acquire waits for a connection at least.
    #[arg(long, value_name = "N")]
    pub queue_grace_ms: Option<u64>,
    /// Seed of the backoff jitter (default: from the clock and process id).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub tls: TlsOptions,
}

/// How a client speaks TLS (CLI.md): with `--tls-ca`, only TLS.
#[derive(ClapArgs)]
pub struct TlsOptions {
    /// Speak only TLS, trusting the CA certificates of FILE (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// The name the servers' certificates must be for (default: the host
    /// part of each address).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// Present the certificate chain of FILE (PEM) to servers that ask for
    /// one (mutual TLS).
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsOptions {
    /// The client's TLS, if it speaks TLS.
    pub fn client_tls(&self) -> Result<Option<ClientTls>, Box<dyn Error>> {
        let Some(ca) = &self.tls_ca else {
            return Ok(None);
        };
        let mut builder = ClientTls::builder().ca_file(ca)?;
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            builder = builder.identity(Identity::from_pem_files(cert, key)?);
        }
        let mut tls = builder.build()?;
        if let Some(name) = &self.tls_server_name {
            tls = tls.server_name(name)?;
        }
        Ok(Some(tls))
    }
}

/// Starts the client of the options on the current runtime, over TLS if
/// asked: its handle and its notices.
pub fn spawn_client(o: &ClientOptions) -> Result<(Handle, Notices), Box<dyn Error>> {
    spawn_configured(o, client_config(o)?)
}

/// As [`spawn_client`], with the configuration made by [`client_config`]
/// (for a caller that needs to know it too).
pub fn spawn_configured(
    o: &ClientOptions,
    config: Config,
) -> Result<(Handle, Notices), Box<dyn Error>> {
    let tls = o.tls.client_tls()?;
    if config.credential.is_some() && tls.is_none() {
        eprintln!("ticketing: warning: --credential without --tls-ca: the credential crosses the network in the clear");
    }
    let spawned = match tls {
        Some(tls) => ticketing::tokio::spawn_with_notices(config, TlsConnector::new(tls)),
        None => ticketing::tokio::spawn_with_notices(config, TcpConnector),
    };
    Ok(spawned?)
}

/// The environment variable a credential may come from instead of
/// `--credential` (which wins when both are there).
pub const CREDENTIAL_ENV: &str = "TICKETING_CREDENTIAL";
/// Where `--raft-credential` may come from instead.
pub const RAFT_CREDENTIAL_ENV: &str = "TICKETING_RAFT_CREDENTIAL";

/// Parses a credential (an atom) without ever showing it: clap's own
/// message for a bad value quotes the value.
#[derive(Clone, Copy)]
pub struct Secret;

impl TypedValueParser for Secret {
    type Value = Name;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<Name, clap::Error> {
        value
            .to_str()
            .and_then(|v| Name::new(v).ok())
            .ok_or_else(|| {
                let arg = match arg {
                    Some(arg) => match arg.get_env() {
                        Some(env) => format!("{arg} (or {})", env.to_string_lossy()),
                        None => arg.to_string(),
                    },
                    None => "the credential".to_owned(),
                };
                let message = format!(
                    "the value of {arg} is not an atom (1 to {MAX_ATOM} printable ASCII bytes, no spaces); it is not shown\n"
                );
                clap::Error::raw(ErrorKind::ValueValidation, message).with_cmd(cmd)
            })
    }
}

/// The client core's configuration from the options.
pub fn client_config(o: &ClientOptions) -> Result<Config, Box<dyn Error>> {
    let mut config = Config::new(o.endpoints.iter().cloned(), o.client_id.clone());
    config.allow = o.allow.clone();
    config.credential = o.credential.clone();
    config.reserved = o.reserved;
    config.busy = match o.busy {
        BusyArg::Retry => BusyPolicy::Retry,
        BusyArg::FailFast => BusyPolicy::FailFast,
    };
    config.cancel = match o.on_cancel {
        CancelArg::Close => CancelPolicy::Close,
        CancelArg::KeepWaiter => CancelPolicy::KeepWaiter,
    };
    if let Some(ms) = o.answer_grace_ms {
        config.answer_grace = Duration::from_millis(ms);
    }
    if let Some(ms) = o.queue_grace_ms {
        config.queue_grace = Duration::from_millis(ms);
    }
    // The core takes its randomness from the seed; the binary may pick one
    // from the clock so that two processes do not back off in lockstep.
    config.seed = o.seed.unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ u64::from(std::process::id()).rotate_left(32)
    });
    Ok(config)
}

/// 128 bits of the operating system's entropy (the lock table's hashing key,
/// a replicated cluster's identity), by way of std's randomly keyed hasher.
pub(crate) fn secret() -> u128 {
    use std::hash::{BuildHasher, RandomState};
    let half = |n: u8| u128::from(RandomState::new().hash_one(n));
    (half(0) << 64) | half(1)
}
