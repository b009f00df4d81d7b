//! `ticketing serve --etcd` (PROTOCOL.md 4.2): three nodes on a real etcd,
//! spoken to by raw clients of protocol version 2. A leader killed is
//! replaced by one that starts with a recovery grace, in which the holder
//! reclaims its grant by renewing it; no key has two live grants; tokens
//! never go back. A leader paused past its election TTL steps down without
//! granting, and comes back as a follower. And tokio clients that renew,
//! each write fenced by its token, keep working through a killed leader and
//! then a paused one, with no two live grants of a key, no token going back
//! and no write refused by fencing; a holder keeps its key through both.
//! A leader stopped by SIGTERM gives up its election key: another node
//! leads at once, not after the TTL.

mod cli;
mod etcd;

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use cli::{End, Raw, WAIT};
use etcd::{leader, Etcd, Node};
use nix::sys::signal::Signal;

/// Leases of 1 s in etcd, leases of at most 3 s granted, a grace margin of
/// 300 ms.
const NODE: [&str; 6] = [
    "--election-ttl-ms",
    "1000",
    "--max-lease-ms",
    "3000",
    "--grace-margin-ms",
    "300",
];

fn three(etcd: &Etcd, cluster: &str) -> Vec<Node> {
    (1..=3)
        .map(|i| Node::start(etcd, cluster, &format!("n{i}"), &NODE))
        .collect()
}

fn connect_v2(node: &Node) -> Raw {
    let mut raw = Raw::connect(&node.addr);
    raw.hello_v2();
    raw
}

#[test]
fn a_leader_killed_is_replaced_by_one_with_a_grace_in_which_holders_reclaim() {
    let etcd = Etcd::start("failover");
    let mut nodes = three(&etcd, "failover");
    let first = leader(&nodes, None);
    let mut a = connect_v2(&nodes[first]);
    let k = a.grant_v2(1, "k", 0, 3000);
    let j_sent = Instant::now();
    let j = a.grant_v2(2, "j", 0, 3000);
    // The others redirect to the leader, once they have seen it in etcd
    // (until then they rightly say `E no_leader`).
    let want = format!("M {}", nodes[first].addr);
    for (i, node) in nodes.iter().enumerate() {
        if i != first {
            let deadline = Instant::now() + WAIT;
            loop {
                let hello = node.hello();
                if hello == want {
                    break;
                }
                assert_eq!(hello, "E no_leader", "node {i} before it sees the leader");
                assert!(Instant::now() < deadline, "node {i} never redirected");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    nodes[first].serve.signal(Signal::SIGKILL);
    nodes[first].serve.kill();

    let second = leader(&nodes, Some(first));
    assert_ne!(second, first);
    // The holder of k renews it at the new leader: reclaimed, token kept.
    let mut a = connect_v2(&nodes[second]);
    a.send(&format!("X 1 k {k} 3000\n"));
    a.expect(&format!("G 1 X k {k} 3000"));
    // Nobody else gets k while it is held, and the holder gives it back in
    // the grace; j, whose holder is gone, is granted only once its old
    // lease could have run out, and k after it, in order.
    let mut b = connect_v2(&nodes[second]);
    b.send("A 1 k b 0 1000\n");
    b.expect("T 1 A k");
    a.send(&format!("R 2 k {k}\n"));
    a.expect("D 2 R k");
    b.send("A 2 j b 20000 1000\nA 3 k b 20000 1000\n");
    let (j2, _) = b.granted_v2(2, "j");
    assert!(
        j_sent.elapsed() >= Duration::from_millis(3000),
        "j granted again {:?} after its 3 s grant was asked",
        j_sent.elapsed()
    );
    let (k2, _) = b.granted_v2(3, "k");
    for (new, old) in [(j2, j), (j2, k), (k2, k), (k2, j2)] {
        assert!(new > old, "token {new} after {old}");
    }
    nodes[second]
        .serve
        .stderr
        .until("the grace's line", |l| l.starts_with("recovery grace: "));
}

#[test]
fn a_leader_paused_past_its_ttl_steps_down_without_granting_and_rejoins_as_follower() {
    let etcd = Etcd::start("pause");
    let nodes = three(&etcd, "pause");
    let first = leader(&nodes, None);
    let mut c = connect_v2(&nodes[first]);
    nodes[first].serve.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    // Sent while it is stopped: its answer would come after the pause.
    c.send("A 1 z c 0 3000\n");
    let second = leader(&nodes, Some(first));
    let mut d = connect_v2(&nodes[second]);
    d.send("A 1 z d 20000 1000\n");
    let (z, _) = d.granted_v2(1, "z");
    assert!(stopped.elapsed() > Duration::from_secs(1), "past the TTL");
    nodes[first].serve.signal(Signal::SIGCONT);
    // The old leader says it no longer leads, and grants nothing.
    match c.next("the old leader after SIGCONT") {
        End::Line(line) => {
            assert!(
                line == "E no_leader" || line.starts_with("M "),
                "the paused leader answered {line:?} (z is held with token {z})"
            );
            c.expect_closed("the old leader's connection");
        }
        End::Closed => {}
    }
    // It comes back as a follower of the new leader.
    let want = format!("M {}", nodes[second].addr);
    let deadline = Instant::now() + WAIT;
    while nodes[first].hello() != want {
        assert!(Instant::now() < deadline, "the old leader never followed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_leader_stopped_by_sigterm_hands_over_long_before_its_ttl() {
    let etcd = Etcd::start("handover");
    // A TTL of 10 s: had the stopped leader left its election key, no
    // other node could lead before that key's lease ran out.
    let args = [
        "--election-ttl-ms",
        "10000",
        "--max-lease-ms",
        "3000",
        "--grace-margin-ms",
        "300",
    ];
    let mut nodes: Vec<Node> = (1..=2)
        .map(|i| Node::start(&etcd, "handover", &format!("n{i}"), &args))
        .collect();
    let first = leader(&nodes, None);
    let other = 1 - first;
    let want = format!("M {}", nodes[first].addr);
    let deadline = Instant::now() + WAIT;
    while nodes[other].hello() != want {
        assert!(Instant::now() < deadline, "the other node never followed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut a = connect_v2(&nodes[first]);
    let h = a.grant_v2(1, "h", 0, 3000);

    let stopped = Instant::now();
    nodes[first].serve.signal(Signal::SIGTERM);
    // It stops granting and tells its clients, then exits cleanly.
    a.expect("E no_leader");
    a.expect_closed("the stopped leader's connection");
    assert!(nodes[first].serve.wait_exit(WAIT).success());
    nodes[first].serve.stderr.until("its step-down line", |l| {
        l == "no longer leading cluster handover: stopping"
    });
    assert_eq!(leader(&nodes, Some(first)), other);
    let took = stopped.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the other node led {took:?} after SIGTERM, as if the old key had stayed for its TTL"
    );
    // The new term has a grace, in which the holder keeps its grant.
    let mut a = connect_v2(&nodes[other]);
    a.send(&format!("X 1 h {h} 3000\n"));
    a.expect(&format!("G 1 X h {h} 3000"));
}

// ----- tokio clients on the cluster -------------------------------------

/// The storage the locks protect, and the judge of every claim on it: a
/// write carries the writer's token and is refused when a greater one was
/// seen for the key (fencing); a claim is refused, as a violation, when
/// another holder of the key may still count on it, or when its token does
/// not exceed every token of that key claimed before.
#[derive(Default)]
struct Fenced {
    keys: std::collections::HashMap<String, FencedKey>,
    violations: Vec<String>,
    grants: usize,
    writes: usize,
    fenced_off: usize,
}

#[derive(Default)]
struct FencedKey {
    /// The greatest token claimed or written.
    greatest: u64,
    /// Live claims: holder and until when it may count on the key.
    holders: Vec<(usize, Instant)>,
}

impl Fenced {
    fn claim(&mut self, key: &str, holder: usize, token: u64, until: Instant) {
        let now = Instant::now();
        let k = self.keys.entry(key.to_owned()).or_default();
        for &(other, other_until) in &k.holders {
            if other != holder && other_until > now {
                self.violations.push(format!(
                    "{key}: worker {holder} granted token {token} while worker {other} may count on it for {:?} more",
                    other_until - now
                ));
            }
        }
        if token <= k.greatest {
            self.violations
                .push(format!("{key}: token {token} after {}", k.greatest));
        }
        k.greatest = k.greatest.max(token);
        k.holders.retain(|&(other, _)| other != holder);
        k.holders.push((holder, until));
        self.grants += 1;
    }

    fn write(&mut self, key: &str, token: u64) {
        let k = self.keys.entry(key.to_owned()).or_default();
        if token < k.greatest {
            self.fenced_off += 1;
        } else {
            k.greatest = token;
            self.writes += 1;
        }
    }

    /// A renewal moved the end of `holder`'s claim of `key`.
    fn claim_extend(&mut self, key: &str, holder: usize, until: Instant) {
        if let Some(k) = self.keys.get_mut(key) {
            for claim in k.holders.iter_mut().filter(|c| c.0 == holder) {
                claim.1 = claim.1.max(until);
            }
        }
    }

    fn unclaim(&mut self, key: &str, holder: usize) {
        if let Some(k) = self.keys.get_mut(key) {
            k.holders.retain(|&(other, _)| other != holder);
        }
    }
}

type Shared = std::sync::Arc<std::sync::Mutex<Fenced>>;

fn client_config(nodes: &[Node], id: &str) -> ticketing::client::Config {
    let endpoints = nodes
        .iter()
        .map(|n| ticketing::Endpoint::new(&n.addr).expect("an endpoint"));
    let mut config =
        ticketing::client::Config::new(endpoints, ticketing::Name::new(id).expect("a name"));
    // Quick to come back: the faults below are the only ones.
    let quick = ticketing::client::Backoff {
        base: Duration::from_millis(20),
        cap: Duration::from_millis(200),
    };
    config.backoff.transport = quick;
    config.backoff.no_leader = quick;
    config.backoff.redirect = quick;
    // A paused leader answers nothing: give up on it well within a lease
    // of 3 s, so that a renewal can reach its successor in time.
    // A paused node still accepts connections (the kernel does): give up
    // on its handshake as quickly.
    config.answer_grace = Duration::from_millis(500);
    config.handshake_timeout = Duration::from_millis(500);
    config
}

/// Until `stop`: lock one of `keys` with automatic renewal, claim it, write
/// three times while the lease is valid, release it. Counts the grants.
async fn worker(
    handle: ticketing::tokio::Handle,
    id: usize,
    keys: &'static [&'static str],
    fenced: Shared,
    stop: Instant,
) {
    let owner = ticketing::Name::new(format!("w{id}")).expect("a name");
    let mut n = id;
    while Instant::now() < stop {
        n += 1;
        let key = keys[n % keys.len()];
        let lock = handle
            .lock(ticketing::Key::new(key).expect("a key"))
            .owner(owner.clone())
            .wait(Duration::from_millis(1500))
            .lease(Duration::from_millis(3000))
            .renew();
        let Ok(lease) = lock.await else {
            // Timed out or Indeterminate (a leader died under it): the
            // rules say what it means; try again.
            continue;
        };
        let until = |status: ticketing::tokio::LeaseStatus| {
            status.valid_until().unwrap_or_else(Instant::now)
        };
        fenced
            .lock()
            .unwrap()
            .claim(key, id, lease.token(), until(lease.status()));
        for _ in 0..3 {
            match lease.status() {
                status @ ticketing::tokio::LeaseStatus::Valid { .. } => {
                    let mut f = fenced.lock().unwrap();
                    // A renewal may have moved the claim's end.
                    f.claim_extend(key, id, until(status));
                    f.write(key, lease.token());
                }
                _ => break,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fenced.lock().unwrap().unclaim(key, id);
        let _ = lease.release().await;
    }
}

#[test]
fn tokio_clients_keep_fenced_writes_safe_through_a_killed_and_a_paused_leader() {
    static KEYS: [&str; 3] = ["a", "b", "c"];
    const WORKERS: usize = 4;
    let etcd = Etcd::start("fenced");
    let mut nodes = three(&etcd, "fenced");
    let first = leader(&nodes, None);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fenced = Shared::default();
    let handles: Vec<_> = (0..=WORKERS)
        .map(|i| {
            let _guard = runtime.enter();
            ticketing::tokio::spawn(
                client_config(&nodes, &format!("c{i}")),
                ticketing::tokio::TcpConnector,
            )
            .expect("a valid config")
        })
        .collect();
    // A holder that keeps one key through both faults by renewing it.
    let holder = handles[WORKERS].clone();
    let held = runtime
        .block_on(
            holder
                .lock(ticketing::Key::new("held").expect("a key"))
                .owner(ticketing::Name::new("holder").expect("a name"))
                .wait(Duration::from_secs(5))
                .lease(Duration::from_millis(3000))
                .renew()
                .into_future(),
        )
        .expect("the long hold");
    let stop = Instant::now() + Duration::from_secs(24);
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| runtime.spawn(worker(handles[i].clone(), i, &KEYS, fenced.clone(), stop)))
        .collect();
    let grants = || fenced.lock().unwrap().grants;

    // Work goes on; then the leader dies without a word.
    std::thread::sleep(Duration::from_secs(3));
    let before_kill = grants();
    assert!(before_kill > 0, "no grant before the kill");
    nodes[first].serve.signal(Signal::SIGKILL);
    nodes[first].serve.kill();
    let second = leader(&nodes, Some(first));
    std::thread::sleep(Duration::from_secs(7));
    let before_pause = grants();
    assert!(
        before_pause > before_kill,
        "no grant after the kill ({before_kill} before it)"
    );

    // Then the new leader stops past its election TTL, and comes back.
    nodes[second].serve.signal(Signal::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    nodes[second].serve.signal(Signal::SIGCONT);
    for w in workers {
        runtime.block_on(w).expect("a worker");
    }
    let f = fenced.lock().unwrap();
    assert!(
        f.violations.is_empty(),
        "{} violations: {:#?}",
        f.violations.len(),
        f.violations
    );
    assert!(
        f.grants > before_pause,
        "no grant after the pause ({before_pause} before it)"
    );
    assert!(
        f.writes >= f.grants,
        "{} writes for {} grants",
        f.writes,
        f.grants
    );
    // The holder reclaimed its key at each new leader and holds it still,
    // with the token it was first granted.
    let status = held.status();
    assert!(
        matches!(status, ticketing::tokio::LeaseStatus::Valid { .. }),
        "the long hold after both faults: {status:?}"
    );
    let token = held.token();
    let outcome = runtime.block_on(held.release()).expect("the release");
    assert!(
        matches!(outcome, ticketing::client::Outcome::Released),
        "the long hold (token {token}) released: {outcome:?}"
    );
    eprintln!(
        "{} grants, {} writes, {} fenced off",
        f.grants, f.writes, f.fenced_off
    );
}

// ----- a renewing holder through leader kills ------------------------------

/// Waits until every node but `leader` names it (`M <leader>`).
fn followers_name(nodes: &[Node], leader: usize) {
    let want = format!("M {}", nodes[leader].addr);
    for (i, node) in nodes.iter().enumerate() {
        if i == leader {
            continue;
        }
        let deadline = Instant::now() + WAIT;
        while node.hello() != want {
            assert!(Instant::now() < deadline, "node {i} never followed");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// PROTOCOL.md section 5, "Connecting and backing off", end to end: a
/// `ticketing client` holding `k` with automatic renewal (lease 8 s) on
/// three nodes (election TTL 2 s), its input left open; the leader is
/// killed with SIGKILL and started again, then each new leader in turn, ten
/// times. Every time the holder's grant is renewed, with its token, on the
/// new leader within the TTL plus 3 s of the kill, and the holder is never
/// told its lease was lost or expired. (The followers name the dead leader
/// until etcd drops its key: the client must not spend its lease on them.)
#[test]
fn a_renewing_holder_keeps_its_grant_through_ten_leader_kills() {
    const TTL: Duration = Duration::from_secs(2);
    let args = [
        "--election-ttl-ms",
        "2000",
        "--max-lease-ms",
        "8000",
        "--grace-margin-ms",
        "1000",
    ];
    let etcd = Etcd::start("holder");
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| Node::start(&etcd, "holder", &format!("n{i}"), &args))
        .collect();
    let mut lead = leader(&nodes, None);
    followers_name(&nodes, lead);
    let endpoints: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
    let mut client = cli::Client::start(&endpoints, &[]);
    client.send("acquire a1 k o 5000 8000 renew");
    let (token, _) = client.granted("a1", "k");
    let renewed = |v: &serde_json::Value| v["type"] == "event" && v["event"] == "renewed";
    let mut times = Vec::new();
    for kill in 1..=10 {
        // Renewals flow before each kill.
        client.wait_for("a renewal before the kill", renewed);
        client.forget_printed();
        let killed = Instant::now();
        nodes[lead].serve.signal(Signal::SIGKILL);
        nodes[lead].serve.kill();
        let old = lead;
        // When another node first accepts a handshake, probed every 20 ms.
        let others: Vec<String> = (0..nodes.len())
            .filter(|&i| i != old)
            .map(|i| nodes[i].addr.clone())
            .collect();
        let probe = std::thread::spawn(move || loop {
            for addr in &others {
                let mut raw = Raw::connect(addr);
                raw.send("H 2 probe -\n");
                if raw.line("the answer to H").starts_with("W ") {
                    return killed.elapsed();
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        });
        let v = client.wait_for_within(
            TTL + Duration::from_secs(3),
            "a renewal on the new leader",
            renewed,
        );
        let took = killed.elapsed();
        assert_eq!(
            (v["tag"].as_str(), v["token"].as_u64()),
            (Some("a1"), Some(token)),
            "{v}"
        );
        let led = probe.join().expect("the probe");
        lead = leader(&nodes, Some(old));
        times.push((led, took));
        eprintln!(
            "kill {kill}: a new leader answered after {led:?}, the holder renewed after {took:?}"
        );
        nodes[old].restart(&etcd, "holder", &format!("n{}", old + 1), &args);
        followers_name(&nodes, lead);
    }
    let worst = times.iter().map(|&(_, took)| took).max();
    eprintln!("worst kill to renewal: {worst:?}");
    client.kept_and_released("a1");
}
