//! The nemesis over real processes (issue 33), at the size CI runs: the
//! `ticketing` binary behind a fault proxy, six clients of the library and
//! two probes at work, every fault kind the service takes injected at
//! least once from a seed, and every history checked:
//!
//! - a replicated cluster of three members (13 kinds of fault: kills and
//!   pauses of the leader and of followers, restarts, the leader isolated,
//!   a minority cut off, one-way, a bridge, the clients cut off from the
//!   leader, slow links, resets, leadership transfers);
//! - a cluster of three nodes led through a real etcd (11: its partitions
//!   are between the nodes and etcd);
//! - one server with a state directory that restarts (6).
//!
//! No violation, in each: no overlapping grants of a key, tokens
//! increasing per key, fenced writes within their leases and in token
//! order, acknowledged releases freeing their keys, and nothing granted by
//! a member cut off into a minority (after its TTL, for etcd). A client
//! that writes past its lease's end is caught, every run.
//!
//! The seed is 2026 unless `NEMESIS_SEED` says otherwise; it is printed,
//! with the fault log, the report, and where the history (JSON lines) is.
//! `benches/nemesis.sh` runs the long version (`--ignored long_run`).

mod cli;
mod etcd;
#[path = "nemesis/mod.rs"]
mod nemesis;
mod pki;

use std::sync::{Mutex, MutexGuard};

use nemesis::{run, Run, Settings, Target, EVERY_FAULT};

/// One run at a time: the members' elections are timed.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn seed() -> u64 {
    let seed = std::env::var("NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2026);
    eprintln!("NEMESIS_SEED={seed}");
    seed
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn show(run: &Run, title: &str) {
    eprintln!("{}", run.report.table(title));
    eprintln!("history: {}", run.history.display());
}

/// A run of every fault kind `target` takes, once each, with the checks
/// every run must pass; its report.
fn every_fault_once(target: Target, name: &str, title: &str) -> Run {
    let _serial = serial();
    let settings = Settings {
        name: name.into(),
        target,
        secs: 0,
        clients: 6,
        keys: 3,
        seed: seed(),
        faults: true,
        sabotage: false,
        netns: false,
    };
    let run = run(&settings);
    show(&run, title);
    let report = &run.report;
    assert!(
        report.violations.is_empty(),
        "{} violations; history in {}",
        report.violations.len(),
        run.history.display()
    );
    for fault in EVERY_FAULT.into_iter().filter(|&f| target.takes(f)) {
        assert!(
            report.faults.contains_key(fault.name()),
            "{} was never injected",
            fault.name()
        );
    }
    assert!(report.grants >= 50, "only {} grants", report.grants);
    assert!(report.writes >= 50, "only {} fenced writes", report.writes);
    run
}

#[test]
fn the_replicated_cluster_keeps_every_promise_under_every_fault() {
    let run = every_fault_once(Target::Raft(3), "raft3", "raft, 3 members");
    let report = &run.report;
    // The member cut off was asked, and answered without a grant.
    let asked: usize = report.minority.values().sum();
    assert!(asked > 0, "no probe reached a member cut off");
    assert!(!report.minority.contains_key("granted"));
    assert!(
        report.holds_through_faults.values().sum::<usize>() > 0,
        "no renewing holder went through a fault"
    );
}

#[test]
fn the_etcd_cluster_keeps_every_promise_under_every_fault() {
    let run = every_fault_once(Target::Etcd, "etcd", "etcd-led, 3 nodes");
    let asked: usize = run.report.minority.values().sum();
    assert!(asked > 0, "no probe reached a node cut off from etcd");
}

#[test]
fn a_single_server_keeps_every_promise_across_restarts() {
    every_fault_once(
        Target::Single,
        "single",
        "one server with a state directory",
    );
}

#[test]
fn a_client_that_writes_past_its_lease_is_caught() {
    let _serial = serial();
    let settings = Settings {
        name: "sabotage".into(),
        target: Target::Raft(3),
        secs: 4,
        clients: 2,
        keys: 1,
        seed: seed(),
        faults: false,
        sabotage: true,
        netns: false,
    };
    let run = run(&settings);
    show(&run, "sabotage");
    let caught = run
        .report
        .violations
        .iter()
        .filter(|v| v.contains("outside its lease"))
        .count();
    assert!(caught > 0, "the saboteur's writes went unseen");
}

/// The long run of `benches/nemesis.sh`: `NEMESIS_TARGET` (`raft3`,
/// `raft5`, `etcd` or `single`), `NEMESIS_SECS` of faults (600), on the
/// proxy or, with `NEMESIS_NET=netns`, in network namespaces.
#[test]
#[ignore]
fn long_run() {
    let _serial = serial();
    let name = std::env::var("NEMESIS_TARGET").unwrap_or_else(|_| "raft3".into());
    let target = match name.as_str() {
        "raft3" => Target::Raft(3),
        "raft5" => Target::Raft(5),
        "etcd" => Target::Etcd,
        "single" => Target::Single,
        other => panic!("NEMESIS_TARGET={other}: raft3, raft5, etcd or single"),
    };
    let secs = env_or("NEMESIS_SECS", 600);
    let netns = std::env::var("NEMESIS_NET").is_ok_and(|n| n == "netns");
    let net = if netns { "netns" } else { "proxy" };
    let settings = Settings {
        name: format!("{name}-{net}-long"),
        target,
        secs,
        clients: 8,
        keys: 4,
        seed: seed(),
        faults: true,
        sabotage: false,
        netns,
    };
    let run = run(&settings);
    let on = match netns {
        true => "network namespaces",
        false => "the proxy",
    };
    show(&run, &format!("{name} on {on}, {secs} s of faults"));
    assert!(
        run.report.violations.is_empty(),
        "history in {}",
        run.history.display()
    );
}

// ----- the checker and the proxy, on their own ----------------------------

mod checker {
    use super::nemesis::check::{check, Bounds, MINORITY_PROBE};
    use super::nemesis::history::{Acquired, Entry};

    const MS: u64 = 1_000_000;
    const BOUNDS: Bounds = Bounds {
        margin: MS,
        settle: 2_000 * MS,
        minority_grace: 0,
    };

    fn granted(client: usize, key: &str, token: u64, at: u64, until: u64) -> Entry {
        Entry::Acquire {
            client,
            key: key.into(),
            invoked: at.saturating_sub(1) * MS,
            completed: at * MS,
            lease_ms: until - at,
            renew: false,
            outcome: Acquired::Granted {
                token,
                valid_until: until * MS,
            },
        }
    }

    fn released(client: usize, key: &str, token: u64, at: u64, until: u64) -> Entry {
        Entry::HoldEnd {
            client,
            key: key.into(),
            token,
            at: at * MS,
            valid_until: until * MS,
            status: "valid".into(),
            released: Some((at * MS, (at + 1) * MS, "released".into())),
        }
    }

    fn write(client: usize, key: &str, token: u64, at: u64) -> Entry {
        Entry::Write {
            client,
            key: key.into(),
            token,
            at: at * MS,
            accepted: true,
        }
    }

    fn timed_out(client: usize, key: &str, from: u64, to: u64) -> Entry {
        Entry::Acquire {
            client,
            key: key.into(),
            invoked: from * MS,
            completed: to * MS,
            lease_ms: 100,
            renew: false,
            outcome: Acquired::TimedOut {
                sent: true,
                cause: None,
            },
        }
    }

    /// Two clients, one after the other, each writing within its lease.
    fn good() -> Vec<Entry> {
        vec![
            granted(1, "k", 5, 10, 110),
            write(1, "k", 5, 20),
            released(1, "k", 5, 50, 110),
            granted(2, "k", 9, 60, 160),
            write(2, "k", 9, 70),
            released(2, "k", 9, 80, 160),
        ]
    }

    #[test]
    fn a_good_history_passes_and_each_breach_is_named() {
        assert_eq!(check(&good(), &BOUNDS).violations, Vec::<String>::new());
        type Breach = Box<dyn Fn(&mut Vec<Entry>)>;
        let breaches: [(&str, Breach); 6] = [
            ("overlap", Box::new(|h| h[3] = granted(2, "k", 9, 40, 160))),
            (
                "after token",
                Box::new(|h| {
                    h[3] = granted(2, "k", 4, 60, 160);
                    h[4] = write(2, "k", 4, 70);
                    h[5] = released(2, "k", 4, 80, 160);
                }),
            ),
            (
                "outside its lease",
                Box::new(|h| h[4] = write(2, "k", 9, 90)),
            ),
            ("never granted", Box::new(|h| h.push(write(3, "k", 9, 70)))),
            (
                "when no grant could hold",
                Box::new(|h| h.push(timed_out(3, "k", 200, 300))),
            ),
            (
                "minority granted",
                Box::new(|h| {
                    h.push(Entry::Fault {
                        kind: "partition:isolate-leader".into(),
                        detail: String::new(),
                        start: 400 * MS,
                        end: 600 * MS,
                    });
                    h.push(granted(MINORITY_PROBE, "m", 1, 500, 600));
                    h.push(released(MINORITY_PROBE, "m", 1, 501, 600));
                }),
            ),
        ];
        for (want, breach) in breaches {
            let mut history = good();
            breach(&mut history);
            let found = check(&history, &BOUNDS).violations;
            assert!(found.iter().any(|v| v.contains(want)), "{want}: {found:?}");
        }
        // A T while a grant may still hold the key is no breach.
        let mut history = good();
        history.push(timed_out(3, "k", 62, 75));
        assert_eq!(check(&history, &BOUNDS).violations, Vec::<String>::new());
    }
}

mod proxy {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::thread;
    use std::time::{Duration, Instant};

    use super::nemesis::net::{Dialer, Net, Party};

    /// An echo server, and a connection to it through a proxy on `net`
    /// from the clients to member 1.
    fn echo_through(net: &Net) -> TcpStream {
        let server = TcpListener::bind("127.0.0.1:0").expect("bind");
        let upstream = server.local_addr().expect("addr");
        thread::spawn(move || {
            for stream in server.incoming().flatten() {
                thread::spawn(move || {
                    let mut stream = stream;
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = stream.read(&mut buf) {
                        if stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = net.proxy(
            "127.0.0.1:0",
            Party::Member(1),
            Dialer::Known(Party::Clients),
            upstream,
        );
        let stream = TcpStream::connect(proxy).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        stream
    }

    fn round_trip(stream: &mut TcpStream, bytes: &[u8]) -> Option<Duration> {
        let started = Instant::now();
        stream.write_all(bytes).ok()?;
        let mut got = vec![0u8; bytes.len()];
        stream.read_exact(&mut got).ok()?;
        assert_eq!(got, bytes);
        Some(started.elapsed())
    }

    #[test]
    fn a_cut_holds_the_bytes_until_healed_one_way_or_both_and_slow_delays_them() {
        let net = Net::new();
        let mut stream = echo_through(&net);
        assert!(
            round_trip(&mut stream, b"a").is_some(),
            "passes when healthy"
        );
        // One way: the clients' bytes to the member are held.
        net.cut(Party::Clients, Party::Member(1));
        assert_eq!(round_trip(&mut stream, b"b"), None, "held");
        net.heal();
        let mut late = [0u8; 1];
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream
            .read_exact(&mut late)
            .expect("delivered after the heal");
        assert_eq!(&late, b"b");
        // The other way: the answer is held.
        net.cut(Party::Member(1), Party::Clients);
        stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        assert_eq!(round_trip(&mut stream, b"c"), None, "held");
        net.heal();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream
            .read_exact(&mut late)
            .expect("delivered after the heal");
        assert_eq!(&late, b"c");
        // Slow: each way waits its delay.
        net.slow(Party::Clients, Party::Member(1), Duration::from_millis(100));
        net.slow(Party::Member(1), Party::Clients, Duration::from_millis(100));
        let took = round_trip(&mut stream, b"d").expect("passes");
        assert!(took >= Duration::from_millis(200), "{took:?}");
        net.heal();
        // A reset ends the connection.
        net.reset(Party::Clients, Party::Member(1));
        let mut buf = [0u8; 1];
        let ended = matches!(stream.read(&mut buf), Ok(0) | Err(_));
        assert!(ended, "the connection ends at a reset");
    }
}
