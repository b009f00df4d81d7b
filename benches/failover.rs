//! One failover of a cluster on etcd, measured (`benches/cluster.sh` runs
//! it again and again; it is no timed test). With the leader among
//! `--addrs` found, a holder takes a key with a long lease; the leader is
//! killed with SIGKILL (its pid among `--pids`, in the same order); then,
//! on every other node until one leads:
//!
//! * a prober tries a fresh key (wait 0) again and again: the time from the
//!   kill to its first grant is when the new leader grants again (after
//!   the election and its recovery grace);
//! * the holder renews its grant (`X`) again and again: the time to the
//!   first `G` is when it is reclaimed at the new leader;
//! * a probe says `H` to each of them every 10 ms: the time to the first
//!   `W` is when a new leader answers at all.
//!
//! Raw protocol version 2 over std TCP, so that the figures hold no client
//! core's backoff. Prints `FAILOVER <grant_ms> <reclaim_ms> <old> <new>
//! <leader_ms> <killed_at>`, the last the kill's wall-clock time in
//! milliseconds since 1970, for matching it with a client's output.
//!
//! ```text
//! failover --addrs A1,A2,A3 --pids P1,P2,P3 [--lease-ms 15000] [--round N]
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A version 2 connection; `None` unless the node leads (answers `W`).
fn lead_conn(addr: &str) -> Option<(TcpStream, BufReader<TcpStream>)> {
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_nodelay(true).ok()?;
    s.write_all(b"H 2 failover -\n").ok()?;
    let mut r = BufReader::new(s.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    line.starts_with("W ").then_some((s, r))
}

/// Sends `request` and reads its answer line.
fn ask(conn: &mut (TcpStream, BufReader<TcpStream>), request: &str) -> Option<String> {
    conn.0.write_all(request.as_bytes()).ok()?;
    let mut line = String::new();
    match conn.1.read_line(&mut line) {
        Ok(n) if n > 0 => Some(line.trim_end().to_string()),
        _ => None,
    }
}

/// Repeats `request` (its `{id}` replaced) on whichever of `addrs` leads
/// until the answer starts with `want`; the time it took since `since`.
fn until_answered(addrs: &[String], request: &str, want: &str, since: Instant) -> Duration {
    let mut id = 0u64;
    loop {
        for addr in addrs {
            let Some(mut conn) = lead_conn(addr) else {
                continue;
            };
            loop {
                id += 1;
                match ask(&mut conn, &request.replace("{id}", &id.to_string())) {
                    Some(answer) if answer.starts_with(want) => return since.elapsed(),
                    Some(_) => thread::sleep(Duration::from_millis(5)),
                    None => break,
                }
            }
        }
        assert!(
            since.elapsed() < Duration::from_secs(600),
            "no failover within 10 min"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut addrs, mut pids, mut lease_ms, mut round) = (Vec::new(), Vec::new(), 15_000u64, 0u64);
    while let Some(flag) = args.next() {
        if flag == "--bench" {
            continue;
        }
        let v = args.next().unwrap_or_default();
        match flag.as_str() {
            "--addrs" => addrs = v.split(',').map(str::to_string).collect(),
            "--pids" => {
                pids = v
                    .split(',')
                    .map(|p| p.parse::<i32>().expect("--pids"))
                    .collect()
            }
            "--lease-ms" => lease_ms = v.parse().expect("--lease-ms"),
            "--round" => round = v.parse().expect("--round"),
            other => panic!("unknown argument {other}"),
        }
    }
    if addrs.is_empty() || addrs.len() != pids.len() {
        println!(
            "failover: no --addrs/--pids; run benches/cluster.sh (it starts etcd and the nodes)"
        );
        return;
    }
    let old = (0..addrs.len())
        .find(|&i| lead_conn(&addrs[i]).is_some())
        .expect("no node leads");
    let mut holder = lead_conn(&addrs[old]).expect("the leader");
    let key = format!("held-{round}");
    let granted = ask(&mut holder, &format!("A 1 {key} holder 0 {lease_ms}\n")).expect("a grant");
    let token = granted
        .split(' ')
        .nth(4)
        .expect("G 1 A key TOKEN ...")
        .to_string();
    let others: Vec<String> = (0..addrs.len())
        .filter(|&i| i != old)
        .map(|i| addrs[i].clone())
        .collect();
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    kill(Pid::from_raw(pids[old]), Signal::SIGKILL).expect("kill the leader");
    let killed = Instant::now();
    let probe = {
        let others = others.clone();
        thread::spawn(move || loop {
            if others.iter().any(|addr| lead_conn(addr).is_some()) {
                return killed.elapsed();
            }
            assert!(
                killed.elapsed() < Duration::from_secs(600),
                "no leader within 10 min"
            );
            thread::sleep(Duration::from_millis(10));
        })
    };
    let prober = {
        let others = others.clone();
        let request = format!("A {{id}} fresh-{round} prober 0 1000\n");
        thread::spawn(move || until_answered(&others, &request, "G ", killed))
    };
    let request = format!("X {{id}} {key} {token} {lease_ms}\n");
    let reclaim = until_answered(&others, &request, "G ", killed);
    let grant = prober.join().expect("the prober");
    let led = probe.join().expect("the leader probe");
    let new = (0..addrs.len())
        .find(|&i| i != old && lead_conn(&addrs[i]).is_some())
        .map_or("?".to_string(), |i| i.to_string());
    println!(
        "FAILOVER {} {} {old} {new} {} {killed_at}",
        grant.as_millis(),
        reclaim.as_millis(),
        led.as_millis()
    );
}
