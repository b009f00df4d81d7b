//! `ticketing serve --etcd` (PROTOCOL.md 4.2): three nodes on a real etcd,
//! spoken to by raw clients of protocol version 2. A leader killed is
//! replaced by one that starts with a recovery grace, in which the holder
//! reclaims its grant by renewing it; no key has two live grants; tokens
//! never go back. A leader paused past its election TTL steps down without
//! granting, and comes back as a follower.

mod cli;
mod etcd;

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
    // The others redirect to the leader.
    for (i, node) in nodes.iter().enumerate() {
        if i != first {
            assert_eq!(node.hello(), format!("M {}", nodes[first].addr));
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
