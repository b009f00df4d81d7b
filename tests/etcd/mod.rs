//! A real etcd for the tests of `ticketing serve --etcd` (PROTOCOL.md 4.2):
//! Debian's `etcd-server` (`.ci/install-etcd` installs it, and the tests
//! run it themselves when etcd is missing), one member on
//! free loopback ports in a temporary directory, stopped by its pid when
//! dropped. Its heartbeat and election timeout are short, so that leases
//! of one second are granted as asked and the tests stay quick.
#![allow(dead_code)]

use std::fs;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::cli::{free_addr, Raw, Serve, WAIT};

/// The etcd binary: `$ETCD`, else `etcd` on the PATH, else Debian's;
/// when there is none, `.ci/install-etcd` installs Debian's `etcd-server`
/// first (once for all the tests of the run), so that the README's test
/// command passes on a fresh machine.
fn etcd_binary() -> String {
    if let Ok(path) = std::env::var("ETCD") {
        return path;
    }
    static INSTALLED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    if let Some(found) = find_etcd() {
        return found;
    }
    let installed = INSTALLED.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/install-etcd");
        match Command::new("bash").arg(script).status() {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("{script} failed: {status}")),
            Err(e) => Err(format!("{script} did not start: {e}")),
        }
    });
    match (installed, find_etcd()) {
        (_, Some(found)) => found,
        (Err(why), None) => panic!(
            "no etcd, and installing Debian's etcd-server did not work ({why}); set ETCD=/path/to/etcd"
        ),
        (Ok(()), None) => panic!("no etcd even after .ci/install-etcd; set ETCD=/path/to/etcd"),
    }
}

/// `etcd` on the PATH, else Debian's.
fn find_etcd() -> Option<String> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("etcd"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.is_file());
    match on_path {
        Some(p) => Some(p.to_string_lossy().into_owned()),
        None if std::path::Path::new("/usr/bin/etcd").is_file() => Some("/usr/bin/etcd".into()),
        None => None,
    }
}

/// One etcd member, killed (by its pid) and its directory removed when
/// dropped.
pub struct Etcd {
    child: Child,
    dir: PathBuf,
    /// Its client URL.
    pub url: String,
}

impl Etcd {
    pub fn start(name: &str) -> Etcd {
        let dir =
            std::env::temp_dir().join(format!("ticketing-etcd-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("a directory for etcd");
        let (client, peer) = (free_addr(), free_addr());
        let url = format!("http://{client}");
        let peer_url = format!("http://{peer}");
        let log = fs::File::create(dir.join("etcd.log")).expect("etcd's log");
        let child = Command::new(etcd_binary())
            .args(["--name", "t", "--data-dir"])
            .arg(dir.join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let etcd = Etcd { child, dir, url };
        let deadline = Instant::now() + WAIT;
        while TcpStream::connect(&client).is_err() {
            assert!(Instant::now() < deadline, "etcd did not listen on {client}");
            thread::sleep(Duration::from_millis(20));
        }
        etcd
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A node of cluster `cluster` on `etcd`, at a free loopback address.
pub struct Node {
    pub serve: Serve,
    pub addr: String,
}

impl Node {
    pub fn start(etcd: &Etcd, cluster: &str, id: &str, extra: &[&str]) -> Node {
        let addr = free_addr();
        let mut args = vec![
            "--node-id",
            id,
            "--etcd",
            &etcd.url,
            "--cluster",
            cluster,
            "--advertise",
            &addr,
        ];
        args.extend_from_slice(extra);
        let serve = Serve::start_on(&addr, &args, |_| {});
        Node { serve, addr }
    }

    /// Starts the node again after it was killed, at the same address
    /// (its clients were told that one), with `extra` as before.
    pub fn restart(&mut self, etcd: &Etcd, cluster: &str, id: &str, extra: &[&str]) {
        let mut args = vec![
            "--node-id",
            id,
            "--etcd",
            &etcd.url,
            "--cluster",
            cluster,
            "--advertise",
            &self.addr,
        ];
        args.extend_from_slice(extra);
        self.serve = Serve::start_on(&self.addr, &args, |_| {});
    }

    /// What a handshake of version 2 gets: the first line, `W ...` from the
    /// leader.
    pub fn hello(&self) -> String {
        let mut raw = Raw::connect(&self.addr);
        raw.send("H 2 probe -\n");
        raw.line("the answer to H")
    }
}

/// The index of the node among `nodes` that accepts a handshake, waiting
/// for one (skipping `except`).
pub fn leader(nodes: &[Node], except: Option<usize>) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        for (i, node) in nodes.iter().enumerate() {
            if Some(i) != except && node.hello().starts_with("W ") {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "no node led within {WAIT:?}");
        thread::sleep(Duration::from_millis(50));
    }
}
