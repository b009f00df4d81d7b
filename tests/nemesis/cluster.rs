//! What the nemesis runs against, on loopback, every port behind a proxy
//! so that every address a member or a client is told (`--raft-peer`,
//! `--advertise`, leader hints, etcd's URL) is a proxy's:
//!
//! - a replicated cluster (`ticketing serve --raft-id`, PROTOCOL.md 4.3),
//!   each member behind a proxy on its client port and one on its peer
//!   port;
//! - a cluster led through etcd (`--etcd`, 4.2): a real etcd, each node
//!   reaching it through a proxy of its own;
//! - a single server with a state directory that keeps its promises
//!   across restarts (4.1).

use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::cli::{free_addr, Serve};
use crate::etcd::Etcd;
use ticketing::tls::ClientTls;

use super::net::{Dialer, Party};
use super::netns::{CLIENT_PORT, PEER_PORT};
use super::Network;

/// The credential the members authenticate each other with, and that
/// `ticketing cluster` presents.
pub const PEER_CREDENTIAL: &str = "nemesis-peers";

pub struct Member {
    pub id: u64,
    real_client: String,
    real_peer: String,
    pub client_proxy: String,
    peer_proxy: String,
    dir: PathBuf,
    /// Where it reaches etcd (a proxy's URL), in an etcd-led cluster.
    etcd_url: Option<String>,
    /// Its network namespace, if it runs in one.
    ns: Option<String>,
    serve: Option<Serve>,
    /// SIGSTOPped.
    pub paused: bool,
    /// In the configuration (or joining it); a spare not yet added, or a
    /// member removed, is not.
    pub live: bool,
}

/// What kind of service.
pub enum Mode {
    Raft,
    Etcd { etcd: Etcd },
    Single,
}

/// The election TTL of an etcd-led node: it grants for at most this long
/// after its latest answered keep-alive.
pub const ETCD_TTL_MS: u64 = 1_000;
/// The longest lease a server grants (clients ask for at most 1.5 s): it
/// bounds the recovery grace after a crash, with the grace margin.
const MAX_LEASE_MS: &str = "3000";
const GRACE_MARGIN_MS: &str = "300";

/// Mutual TLS, where the members are off loopback (in namespaces): a peer
/// credential would travel in the clear, and a member refuses to start
/// so. Every member has a certificate for its address, signed by one CA
/// that the members require of their peers and of their clients.
pub struct Tls {
    ca: String,
    /// Each member's certificate and key files.
    members: Vec<(String, String)>,
    /// The operator's, for `ticketing cluster`.
    operator: (String, String),
    /// The library clients' configuration.
    pub client: ClientTls,
}

pub struct Cluster {
    pub mode: Mode,
    pub tls: Option<Tls>,
    name: String,
    root: PathBuf,
    pub members: Vec<Member>,
    pub election_timeout_ms: u64,
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("a socket address")
}

/// Whether the server at `addr` answers a hello with `W`, within a
/// second.
fn welcomes(addr: &str) -> bool {
    use std::io::{BufRead, BufReader, Write};
    let Ok(mut stream) =
        std::net::TcpStream::connect_timeout(&self::addr(addr), Duration::from_millis(500))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"H 2 nemesis -\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("W ")
}

impl Cluster {
    /// `n` members of a service of `mode`, their proxies on `net`, not
    /// started (a single server: `n` is 1), and `spares` more that may
    /// replace them, their addresses known from the start.
    pub fn new(
        name: &str,
        mode: Mode,
        (n, spares): (u64, u64),
        network: &Network,
        election_timeout_ms: u64,
    ) -> Cluster {
        let root =
            std::env::temp_dir().join(format!("ticketing-nemesis-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("the run's directory");
        let tls = match network {
            Network::Netns(netns) => Some(make_tls(&root, netns, n)),
            Network::Proxy(_) => None,
        };
        let members = (1..=n + spares)
            .map(|id| {
                let net = match network {
                    Network::Proxy(net) => net,
                    Network::Netns(netns) => {
                        assert!(
                            !matches!(mode, Mode::Etcd { .. }),
                            "no etcd in network namespaces"
                        );
                        let addr = netns.addr(id);
                        let client = format!("{addr}:{CLIENT_PORT}");
                        let peer = format!("{addr}:{PEER_PORT}");
                        return Member {
                            id,
                            real_client: client.clone(),
                            real_peer: peer.clone(),
                            client_proxy: client,
                            peer_proxy: peer,
                            dir: root.join(format!("n{id}")),
                            etcd_url: None,
                            ns: Some(netns.ns(id)),
                            serve: None,
                            paused: false,
                            live: id <= n,
                        };
                    }
                };
                let (real_client, real_peer) = (free_addr(), free_addr());
                let to = Party::Member(id);
                let client_proxy = net
                    .proxy(
                        "127.0.0.1:0",
                        to,
                        Dialer::Known(Party::Clients),
                        addr(&real_client),
                    )
                    .to_string();
                let peer_proxy = net
                    .proxy("127.0.0.1:0", to, Dialer::PeerHello, addr(&real_peer))
                    .to_string();
                let etcd_url = match &mode {
                    Mode::Etcd { etcd } => {
                        let upstream = etcd.url.trim_start_matches("http://");
                        let proxy = net.proxy(
                            "127.0.0.1:0",
                            Party::Etcd,
                            Dialer::Known(to),
                            addr(upstream),
                        );
                        Some(format!("http://{proxy}"))
                    }
                    _ => None,
                };
                Member {
                    id,
                    real_client,
                    real_peer,
                    client_proxy,
                    peer_proxy,
                    dir: root.join(format!("n{id}")),
                    etcd_url,
                    ns: None,
                    serve: None,
                    paused: false,
                    live: id <= n,
                }
            })
            .collect();
        Cluster {
            mode,
            tls,
            name: name.to_owned(),
            root,
            members,
            election_timeout_ms,
        }
    }

    /// Starts member `i` (index) from its state directory.
    pub fn start(&mut self, i: usize, new_cluster: bool) {
        let args = match &self.mode {
            Mode::Raft => self.raft_args(i, new_cluster),
            Mode::Etcd { .. } => {
                let m = &self.members[i];
                let url = m.etcd_url.clone().expect("a proxy to etcd");
                [
                    "--node-id",
                    &format!("n{}", m.id),
                    "--etcd",
                    &url,
                    "--cluster",
                    &self.name,
                    "--advertise",
                    &m.client_proxy,
                    "--election-ttl-ms",
                    &ETCD_TTL_MS.to_string(),
                    "--max-lease-ms",
                    MAX_LEASE_MS,
                    "--grace-margin-ms",
                    GRACE_MARGIN_MS,
                ]
                .map(str::to_owned)
                .to_vec()
            }
            Mode::Single => [
                "--state-dir",
                &self.members[i].dir.to_string_lossy(),
                "--max-lease-ms",
                MAX_LEASE_MS,
                "--grace-margin-ms",
                GRACE_MARGIN_MS,
            ]
            .map(str::to_owned)
            .to_vec(),
        };
        let mut args = args;
        if let Some(tls) = &self.tls {
            let (cert, key) = &tls.members[i];
            for arg in [
                "--tls-cert",
                cert,
                "--tls-key",
                key,
                "--tls-client-ca",
                &tls.ca,
            ] {
                args.push(arg.to_owned());
            }
        }
        let m = &self.members[i];
        let serve = match &m.ns {
            None => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Serve::start_on(&m.real_client, &args, |_| {})
            }
            Some(ns) => {
                let mut command = std::process::Command::new("ip");
                command
                    .args(["netns", "exec", ns, crate::cli::BIN, "serve", "--listen"])
                    .arg(&m.real_client)
                    .args(&args);
                Serve::spawn(command)
            }
        };
        self.members[i].serve = Some(serve);
        self.members[i].paused = false;
    }

    fn raft_args(&self, i: usize, new_cluster: bool) -> Vec<String> {
        let m = &self.members[i];
        let mut args = vec![
            "--raft-id".to_string(),
            m.id.to_string(),
            "--raft-listen".to_string(),
            m.real_peer.clone(),
            "--state-dir".to_string(),
            m.dir.to_string_lossy().into_owned(),
            "--election-timeout-ms".to_string(),
            self.election_timeout_ms.to_string(),
        ];
        if self.tls.is_none() {
            // Off loopback the peers are held to mutual TLS instead.
            args.push("--raft-credential".to_string());
            args.push(PEER_CREDENTIAL.to_string());
        }
        for p in self.members.iter().filter(|p| p.live || p.id == m.id) {
            args.push("--raft-peer".to_string());
            args.push(format!("{}={}/{}", p.id, p.client_proxy, p.peer_proxy));
        }
        if new_cluster {
            args.push("--raft-new-cluster".to_string());
        }
        args
    }

    pub fn start_all(&mut self) {
        for i in self.live() {
            self.start(i, true);
        }
    }

    /// The members in the configuration.
    pub fn live(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].live)
            .collect()
    }

    /// The spares' client addresses: what the clients may be sent to.
    pub fn spare_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| !m.live)
            .map(|m| m.client_proxy.clone())
            .collect()
    }

    /// A spare never started, if one is left.
    pub fn spare(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| !self.members[i].live && !self.members[i].dir.exists())
    }

    /// Member `old` replaced by spare `new` (PROTOCOL.md 4.4): `new`
    /// started with `--raft-join` and added, then `old` removed (a
    /// leader hands over first), which stops by itself. What was done.
    pub fn replace(&mut self, old: usize, new: usize) -> String {
        self.members[new].live = true;
        let mut args = self.raft_args(new, false);
        args.push("--raft-join".to_string());
        let m = &self.members[new];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.members[new].serve = Some(Serve::start_on(&m.real_client, &args, |_| {}));
        let spec = format!(
            "{}={}/{}",
            self.members[new].id, self.members[new].client_proxy, self.members[new].peer_proxy
        );
        let (added, said) = self.operate(&["add", &spec, "--wait-ms", "20000"]);
        if !added {
            self.kill(new);
            self.members[new].live = false;
            return format!("n{} not added: {said}", self.members[new].id);
        }
        let old_id = self.members[old].id.to_string();
        let (removed, said) = self.operate(&["remove", &old_id]);
        if !removed {
            return format!(
                "n{} added; n{old_id} not removed: {said}",
                self.members[new].id
            );
        }
        self.members[old].live = false;
        if let Some(mut serve) = self.members[old].serve.take() {
            let status = serve.wait_exit(Duration::from_secs(15));
            assert!(status.success(), "n{old_id}, removed, ended with {status}");
        }
        format!("n{old_id} replaced by n{}", self.members[new].id)
    }

    /// `ticketing cluster ARGS` through every running member's own port:
    /// whether it was done, and what it printed.
    fn operate(&self, args: &[&str]) -> (bool, String) {
        let mut command = std::process::Command::new(crate::cli::BIN);
        command.arg("cluster").args(&args[..1]);
        for i in (0..self.members.len()).filter(|&i| self.running(i)) {
            command.args(["--endpoint", &self.members[i].real_client]);
        }
        command
            .args(["--raft-credential", PEER_CREDENTIAL])
            .args(&args[1..]);
        let out = command.output().expect("run ticketing cluster");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.live)
            .map(|m| m.client_proxy.clone())
            .collect()
    }

    pub fn running(&self, i: usize) -> bool {
        self.members[i].serve.is_some() && !self.members[i].paused
    }

    /// The member that welcomes a client on its own port, past the
    /// proxies (`None` if none does now).
    pub fn leader_now(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| {
            self.running(i)
                && match &self.tls {
                    None => welcomes(&self.members[i].real_client),
                    Some(tls) => welcomes_over_tls(&self.members[i].real_client, &tls.client),
                }
        })
    }

    /// Waits up to `within` for a leader.
    pub fn leader(&self, within: Duration) -> Option<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(i) = self.leader_now() {
                return Some(i);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut serve) = self.members[i].serve.take() {
            serve.signal(Signal::SIGKILL);
            serve.kill();
        }
        self.members[i].paused = false;
    }

    /// SIGTERM, waited for: a clean stop.
    pub fn terminate(&mut self, i: usize) {
        if let Some(mut serve) = self.members[i].serve.take() {
            if self.members[i].paused {
                serve.signal(Signal::SIGCONT);
            }
            serve.signal(Signal::SIGTERM);
            let status = serve.wait_exit(Duration::from_secs(15));
            assert!(status.success(), "member {} stopped with {status}", i + 1);
        }
        self.members[i].paused = false;
    }

    pub fn pause(&mut self, i: usize) {
        if let Some(serve) = &self.members[i].serve {
            serve.signal(Signal::SIGSTOP);
            self.members[i].paused = true;
        }
    }

    pub fn resume(&mut self, i: usize) {
        if let Some(serve) = &self.members[i].serve {
            serve.signal(Signal::SIGCONT);
        }
        self.members[i].paused = false;
    }

    /// `ticketing cluster transfer` to member `to` (index), through the
    /// leader's own port; whether it was done.
    pub fn transfer(&self, leader: usize, to: usize) -> bool {
        let mut command = std::process::Command::new(crate::cli::BIN);
        command.args([
            "cluster",
            "transfer",
            "--endpoint",
            &self.members[leader].real_client,
        ]);
        match &self.tls {
            None => command.args(["--raft-credential", PEER_CREDENTIAL]),
            Some(tls) => command.args([
                "--tls-ca",
                &tls.ca,
                "--tls-cert",
                &tls.operator.0,
                "--tls-key",
                &tls.operator.1,
            ]),
        };
        let out = command
            .arg(self.members[to].id.to_string())
            .output()
            .expect("run ticketing cluster transfer");
        out.status.success()
    }
}

/// A CA, a certificate for each member's address, and an operator's, in
/// `root`.
fn make_tls(root: &std::path::Path, netns: &super::netns::Netns, n: u64) -> Tls {
    let ca = crate::pki::Ca::new("nemesis CA");
    let ca_path = root.join("ca.pem");
    fs::write(&ca_path, ca.cert_pem()).expect("write the CA");
    let s = |p: PathBuf| p.to_string_lossy().into_owned();
    let members = (1..=n)
        .map(|id| {
            let (cert, key) = ca
                .issue(&[&netns.addr(id)], |_| {})
                .write(root, &format!("n{id}"));
            (s(cert), s(key))
        })
        .collect();
    let operator = ca.client("operator").write(root, "operator");
    let clients = ca.client("clients");
    Tls {
        ca: s(ca_path),
        members,
        operator: (s(operator.0), s(operator.1)),
        client: crate::pki::client_tls(&ca, Some(&clients)),
    }
}

/// Whether the server at `addr` takes a client over TLS (its `W`), within
/// a second.
fn welcomes_over_tls(addr: &str, tls: &ClientTls) -> bool {
    use ticketing::client::Config;
    use ticketing::{Endpoint, Name};
    let Ok(endpoint) = Endpoint::new(addr) else {
        return false;
    };
    let mut config = Config::new([endpoint], Name::new("nemesis-probe").expect("a name"));
    config.connect_timeout = Duration::from_millis(500);
    config.handshake_timeout = Duration::from_millis(500);
    let connector = ticketing::blocking::TlsConnector::new(tls.clone());
    let Ok(handle) = ticketing::blocking::connect(config, connector) else {
        return false;
    };
    let welcomed = handle.connected().is_ok();
    let _ = handle.shutdown(Duration::from_millis(200));
    welcomed
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            if self.members[i].paused {
                self.resume(i);
            }
            self.kill(i);
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}
