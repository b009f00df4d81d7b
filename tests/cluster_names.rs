//! Cluster names (issue 20, item 7): an atom without `/`, so that no
//! cluster's keys in etcd lie inside another's election. A name that
//! could nest is refused at start, by the binary and by the library; two
//! clusters whose names are alike lead apart on one real etcd.

mod cli;
mod etcd;

use std::time::Duration;

use cli::{dead_endpoint, free_addr, Proc, WAIT};
use etcd::{leader, Etcd, Node};
use ticketing::cluster::{run_until, ClusterConfig, ClusterEpochs};
use ticketing::server::{Config, Role, Server};
use ticketing::{Endpoint, Name, Time};

#[test]
fn a_name_that_could_nest_is_refused_at_start_naming_it() {
    let etcd = Etcd::start("names-refused");
    let a = [Node::start(&etcd, "a", "a1", &[])];
    assert_eq!(leader(&a, None), 0, "cluster a leads itself");
    for name in ["a/leader", "a/", "/a", "", "a b"] {
        let advertise = free_addr();
        let done = Proc::start(&[
            "serve",
            "--listen",
            &advertise,
            "--etcd",
            &etcd.url,
            "--cluster",
            name,
            "--advertise",
            &advertise,
        ])
        .finish(WAIT);
        assert_eq!(done.code, Some(2), "--cluster {name:?}: {done:?}");
        assert!(
            done.stderr.contains(&format!("{name:?}")),
            "--cluster {name:?}: {done:?}"
        );
        assert!(!done.stderr.contains("listening on"), "{done:?}");
    }
    // Nothing came into cluster a's election: it still leads itself.
    let hello = a[0].hello();
    assert!(hello.starts_with("W a1 "), "{hello}");
}

#[test]
fn clusters_of_alike_names_lead_apart_on_one_etcd() {
    let etcd = Etcd::start("names-apart");
    let a = [Node::start(&etcd, "a", "a1", &[])];
    let b = [Node::start(&etcd, "a-leader", "b1", &[])];
    // Each leads its own cluster; neither follows the other.
    assert_eq!(leader(&a, None), 0);
    assert_eq!(leader(&b, None), 0);
    assert!(a[0].hello().starts_with("W a1 "), "{}", a[0].hello());
    assert!(b[0].hello().starts_with("W b1 "), "{}", b[0].hello());
}

#[test]
fn the_library_refuses_a_name_that_could_nest_before_it_reaches_etcd() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut config = Config::new(Name::new("n1").expect("a name"));
        config.role = Role::NoLeader;
        let core = Server::new(config, Time::ZERO).expect("a server");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let handle = ticketing::serve::spawn(listener, core).expect("serving");
        let advertise = Endpoint::new(handle.local_addr().to_string()).expect("an address");
        // Nobody listens there: a node that tried etcd would retry for
        // ever.
        let etcd = format!("http://{}", dead_endpoint());
        let node = ClusterConfig::new(vec![etcd], "a/leader".into(), advertise);
        let epochs = ClusterEpochs::new();
        let stopped = tokio::time::timeout(
            Duration::from_secs(5),
            run_until(&handle, &node, &epochs, |_| {}, std::future::pending()),
        )
        .await
        .expect("refused at once, not retried");
        let error = stopped.expect_err("refused").to_string();
        assert!(error.contains("\"a/leader\""), "{error}");
        handle.stop().await.expect("stopped");
    });
}
