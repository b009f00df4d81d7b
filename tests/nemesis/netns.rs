//! The network the nemesis breaks, the other way: every member in a
//! network namespace of its own, the namespaces on one bridge, the test's
//! clients in the root namespace, and the faults nftables rules in the
//! members' namespaces (`benches/nemesis.sh`; CI uses the proxy).
//!
//! - **cut one way** (A's bytes to B held, B's to A pass): B drops what
//!   comes from A on connections A opened (`ct direction original`).
//!   Dropping A's packets outright would drop A's acknowledgements of
//!   B's bytes too, and make the cut two-way.
//! - **cut both ways**: each drops everything from the other.
//! - the clients are the root namespace's address, on the member's client
//!   port.
//!
//! Slow links need netem, which this machine's kernel does not have, and
//! resets a socket killer: neither is done here. Names are unique to the
//! process (`tkn<pid>-...`), deleted when dropped, and those of processes
//! gone are deleted at the next start. A step that fails panics, naming
//! the command and what it said: a run never passes without its network.

use std::collections::HashSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::net::Party;

/// Where a member listens for clients, in its namespace.
pub const CLIENT_PORT: u16 = 7878;
/// Where it listens for its peers.
pub const PEER_PORT: u16 = 7979;

/// Runs `ip`/`nft` with `args` (and `stdin`), panicking with what it said
/// if it fails.
fn run(program: &str, args: &[&str], stdin: Option<&str>) {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program} (install iproute2 and nftables): {e}"));
    if let Some(text) = stdin {
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(text.as_bytes()).expect("write to nft");
        }
    }
    let out = child.wait_with_output().expect("wait for ip/nft");
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[derive(Default)]
struct Rules {
    one_way: HashSet<(Party, Party)>,
    both: HashSet<(Party, Party)>,
}

pub struct Netns {
    prefix: String,
    /// `10.<net>.0.0/24`.
    net: u8,
    members: Vec<u64>,
    rules: Mutex<Rules>,
}

impl Netns {
    /// A namespace for each member id in `ids`, on a bridge with the root
    /// namespace.
    pub fn new(ids: &[u64]) -> Netns {
        sweep_stale();
        let pid = std::process::id();
        let netns = Netns {
            prefix: format!("tkn{pid}"),
            net: (pid % 200 + 20) as u8,
            members: ids.to_vec(),
            rules: Mutex::new(Rules::default()),
        };
        let hub = netns.hub();
        run("ip", &["netns", "add", &hub], None);
        run(
            "ip",
            &["-n", &hub, "link", "add", "br0", "type", "bridge"],
            None,
        );
        run("ip", &["-n", &hub, "link", "set", "br0", "up"], None);
        // The root namespace's leg: the clients' address.
        let (root, root_peer) = (format!("{}r", netns.prefix), format!("{}R", netns.prefix));
        run(
            "ip",
            &[
                "link", "add", &root, "type", "veth", "peer", "name", &root_peer,
            ],
            None,
        );
        run("ip", &["link", "set", &root_peer, "netns", &hub], None);
        run(
            "ip",
            &["-n", &hub, "link", "set", &root_peer, "master", "br0", "up"],
            None,
        );
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", netns.root_addr()),
                "dev",
                &root,
            ],
            None,
        );
        run("ip", &["link", "set", &root, "up"], None);
        for &id in ids {
            let ns = netns.ns(id);
            run("ip", &["netns", "add", &ns], None);
            let (leg, peer) = (
                format!("{}a{id}", netns.prefix),
                format!("{}b{id}", netns.prefix),
            );
            run(
                "ip",
                &["link", "add", &leg, "type", "veth", "peer", "name", &peer],
                None,
            );
            run("ip", &["link", "set", &leg, "netns", &ns], None);
            run("ip", &["link", "set", &peer, "netns", &hub], None);
            run(
                "ip",
                &["-n", &hub, "link", "set", &peer, "master", "br0", "up"],
                None,
            );
            let addr = format!("{}/24", netns.addr(id));
            run("ip", &["-n", &ns, "addr", "add", &addr, "dev", &leg], None);
            run("ip", &["-n", &ns, "link", "set", &leg, "up"], None);
            run("ip", &["-n", &ns, "link", "set", "lo", "up"], None);
        }
        netns.apply();
        netns
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// The namespace of member `id`.
    pub fn ns(&self, id: u64) -> String {
        format!("{}-n{id}", self.prefix)
    }

    /// The address of member `id`.
    pub fn addr(&self, id: u64) -> String {
        format!("10.{}.0.{}", self.net, id + 1)
    }

    /// The root namespace's address: where the clients come from.
    pub fn root_addr(&self) -> String {
        format!("10.{}.0.1", self.net)
    }

    fn lock(&self) -> MutexGuard<'_, Rules> {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn cut(&self, from: Party, to: Party) {
        self.lock().one_way.insert((from, to));
        self.apply();
    }

    pub fn cut_both(&self, a: Party, b: Party) {
        self.lock().both.insert((a, b));
        self.apply();
    }

    pub fn heal(&self) {
        let mut rules = self.lock();
        rules.one_way.clear();
        rules.both.clear();
        drop(rules);
        self.apply();
    }

    /// What drops packets from `other` into member `me`'s namespace
    /// (`input`), and from it to `other` (`output`), for a cut both ways.
    fn both_rules(&self, other: Party) -> (String, String) {
        match other {
            Party::Member(o) => (
                format!("ip saddr {} drop", self.addr(o)),
                format!("ip daddr {} drop", self.addr(o)),
            ),
            Party::Clients => (
                format!("ip saddr {} tcp dport {CLIENT_PORT} drop", self.root_addr()),
                format!("ip daddr {} tcp sport {CLIENT_PORT} drop", self.root_addr()),
            ),
            Party::Etcd => panic!("no etcd in network namespaces"),
        }
    }

    /// Writes every member namespace's ruleset anew from the rules.
    fn apply(&self) {
        let rules = self.lock();
        for &me in &self.members {
            let party = Party::Member(me);
            let (mut input, mut output) = (Vec::new(), Vec::new());
            for &(from, to) in &rules.one_way {
                if to == party {
                    match from {
                        Party::Member(a) => input.push(format!(
                            "ip saddr {} ct direction original drop",
                            self.addr(a)
                        )),
                        // The clients' requests are theirs to open.
                        other => input.push(self.both_rules(other).0),
                    }
                } else if from == party {
                    // What a member says to the clients: its answers.
                    if let Party::Clients = to {
                        output.push(self.both_rules(to).1);
                    }
                }
            }
            for &(a, b) in &rules.both {
                let other = if a == party {
                    b
                } else if b == party {
                    a
                } else {
                    continue;
                };
                let (i, o) = self.both_rules(other);
                input.push(i);
                output.push(o);
            }
            let text = format!(
                "flush ruleset\ntable inet nemesis {{\n chain input {{\n  type filter hook input priority 0; policy accept;\n{}\n }}\n chain output {{\n  type filter hook output priority 0; policy accept;\n{}\n }}\n}}\n",
                input.iter().map(|r| format!("  {r}\n")).collect::<String>(),
                output.iter().map(|r| format!("  {r}\n")).collect::<String>(),
            );
            run(
                "ip",
                &["netns", "exec", &self.ns(me), "nft", "-f", "-"],
                Some(&text),
            );
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for &id in &self.members {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(id)])
                .status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.hub()])
            .status();
        // The root leg goes with its peer; said again in case it did not.
        let _ = Command::new("ip")
            .args(["link", "del", &format!("{}r", self.prefix)])
            .stderr(Stdio::null())
            .status();
    }
}

/// Deletes the namespaces of runs whose process is gone.
fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix("tkn") else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}
