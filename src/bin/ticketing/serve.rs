//! `ticketing serve`: the reference server until SIGINT or SIGTERM.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args as ClapArgs, ValueEnum};
use ticketing::serve::TlsListener;
use ticketing::server::{Config, Role, Server};
use ticketing::tls::{Identity, ServerTls};
use ticketing::{Endpoint, Name, Time};
use tokio::net::TcpListener;

use crate::common::Secret;

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    Leader,
    Follower,
    NoLeader,
    NotActive,
}

/// Options of `ticketing serve` (CLI.md).
#[derive(ClapArgs)]
pub struct Args {
    /// Address to listen on; port 0 picks a free one (printed on stderr).
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: String,
    /// Node id sent in W.
    #[arg(long, default_value = "node-1")]
    node_id: Name,
    /// Credential clients must present (default: any).
    #[arg(long, value_parser = Secret, allow_hyphen_values = true)]
    credential: Option<Name>,
    /// Requests a client may have unanswered.
    #[arg(long, default_value_t = 64)]
    window: u64,
    /// Most acquires waiting on one key.
    #[arg(long, default_value_t = 1024)]
    queue_limit: usize,
    /// Most acquires waiting in all.
    #[arg(long, default_value_t = 65_536)]
    max_waiters: usize,
    /// Longest lease granted, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    max_lease_ms: u64,
    /// Send `L ADDR` after W.
    #[arg(long, value_name = "ADDR")]
    leader_hint: Option<Endpoint>,
    /// The node's role.
    #[arg(long, value_enum, default_value = "leader")]
    role: RoleArg,
    /// The leader a follower redirects to.
    #[arg(long, value_name = "ADDR", required_if_eq("role", "follower"))]
    leader: Option<Endpoint>,
    /// Close a connection that has sent no whole H this long after it was
    /// accepted, in milliseconds (at least 1).
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    handshake_timeout_ms: u64,
    /// Speak only TLS, presenting the certificate chain of FILE (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Refuse, before their H, clients without a certificate that the CA
    /// certificates of FILE (PEM) signed.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
}

impl Args {
    /// The server's TLS, if it speaks TLS.
    fn tls(&self) -> Result<Option<ServerTls>, Box<dyn Error>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let mut builder = ServerTls::builder().identity(Identity::from_pem_files(cert, key)?);
        if let Some(ca) = &self.tls_client_ca {
            builder = builder.client_ca_file(ca)?;
        }
        Ok(Some(builder.build()?))
    }
}

pub async fn run(args: Args) -> Result<ExitCode, Box<dyn Error>> {
    let tls = args.tls()?;
    let mut config = Config::new(args.node_id);
    config.window = args.window;
    config.queue_limit = args.queue_limit;
    config.max_waiters = args.max_waiters;
    config.max_lease = Duration::from_millis(args.max_lease_ms);
    config.credential = args.credential;
    config.leader_hint = args.leader_hint;
    config.handshake_timeout = Duration::from_millis(args.handshake_timeout_ms);
    config.hash_key = secret();
    config.role = match (args.role, args.leader) {
        (RoleArg::Leader, _) => Role::Leader,
        (RoleArg::Follower, Some(leader)) => Role::Follower { leader },
        (RoleArg::Follower, None) => return Err("--role follower needs --leader ADDR".into()),
        (RoleArg::NoLeader, _) => Role::NoLeader,
        (RoleArg::NotActive, _) => Role::NotActive,
    };
    // The handlers are in place before `listening on` is printed: a signal
    // sent as soon as that line is seen must stop the server cleanly.
    let stop = stop_signal()?;
    let core = Server::new(config, Time::ZERO)?;
    let listener = TcpListener::bind(&args.listen).await?;
    let handle = match tls {
        Some(tls) => ticketing::serve::spawn(TlsListener::new(listener, tls), core)?,
        None => ticketing::serve::spawn(listener, core)?,
    };
    eprintln!("listening on {}", handle.local_addr());
    stop.await;
    handle.stop().await?;
    Ok(ExitCode::SUCCESS)
}

/// Installs the SIGINT and SIGTERM handlers now; the future resolves on
/// either signal.
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// 128 bits of the operating system's entropy, for the lock table's
/// hashing, by way of std's randomly keyed hasher.
fn secret() -> u128 {
    use std::hash::{BuildHasher, RandomState};
    let half = |n: u8| u128::from(RandomState::new().hash_one(n));
    (half(0) << 64) | half(1)
}
