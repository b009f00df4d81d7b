//! End-to-end lock-and-unlock pairs per second: the tokio adapter over ONE
//! loopback TCP connection against `ticketing serve` running in another
//! process, or over ONE TLS connection (`--tls-ca`). `benches/e2e.sh` runs
//! it beside the Redis lock benchmark of `shared/bench/redis-lock`, plain
//! and over TLS, and prints them side by side.
//!
//! The methodology is the Redis benchmark's, step for step:
//!
//! * one client (one connection) per concurrency level, shared by `C` tasks
//!   on a multi-threaded tokio runtime with the default number of workers;
//! * each task loops: pick a key at random among `K` (default 1,000), try
//!   to acquire it (wait 0, lease 30 s); if granted, release it by its exact
//!   token at once;
//! * a warm-up (default 1 s) then a measured window (default 5 s); an
//!   iteration counts if its acquire started inside the window;
//! * a *pair* is an acquire answered Granted followed by a release answered
//!   Released; pairs/s = pairs in the window / window length;
//! * acquire latency: every acquire attempt in the window, from the call to
//!   its outcome (granted or not); pair latency: acquire call to release
//!   outcome, for each pair;
//! * p50/p99 are nearest-rank on the sorted samples, as in the Redis bench.
//!
//! Usage:
//!
//! ```text
//! e2e --addr 127.0.0.1:PORT [--secs 5] [--warmup 1] [--keys 1000] [--conc 1,16,256]
//!     [--tls-ca FILE]      # over TLS, trusting the CA certificate of FILE
//! e2e --make-certs DIR     # DIR/ca.pem, and server.pem/.key for 127.0.0.1
//! ```
//!
//! Without `--addr` (as under a plain `cargo bench`) it only says how to run
//! it. Prints one human line per level, then one `RESULT` line per level for
//! scripts: `RESULT NAME C pairs_per_s acq_p50_us acq_p99_us pair_p50_us
//! pair_p99_us acquires_per_s contended_pct busy errors`, NAME being
//! `ticketing`, or `ticketing-tls` over TLS.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ticketing::client::{Config, Outcome};
use ticketing::tls::ClientTls;
use ticketing::tokio::{AcquireError, Handle, TcpConnector, TlsConnector};
use ticketing::{Endpoint, Key, Name};

const LEASE: Duration = Duration::from_secs(30);

struct Opts {
    addr: Option<String>,
    secs: f64,
    warmup: f64,
    keys: usize,
    conc: Vec<usize>,
    tls_ca: Option<String>,
    make_certs: Option<String>,
}

fn parse_args() -> Opts {
    let mut o = Opts {
        addr: None,
        secs: 5.0,
        warmup: 1.0,
        keys: 1000,
        conc: vec![1, 16, 256],
        tls_ca: None,
        make_certs: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        // `cargo bench` passes `--bench` to a harness-less bench.
        if flag == "--bench" {
            continue;
        }
        let v = args.next().unwrap_or_default();
        match flag.as_str() {
            "--addr" => o.addr = Some(v),
            "--secs" => o.secs = v.parse().expect("--secs"),
            "--warmup" => o.warmup = v.parse().expect("--warmup"),
            "--keys" => o.keys = v.parse().expect("--keys"),
            "--tls-ca" => o.tls_ca = Some(v),
            "--make-certs" => o.make_certs = Some(v),
            "--conc" => {
                o.conc = v
                    .split(',')
                    .map(|s| s.trim().parse().expect("--conc"))
                    .collect()
            }
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

/// xorshift64*, seeded per task: enough to pick keys.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Nearest-rank percentile of sorted nanoseconds, in microseconds.
fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx] as f64 / 1000.0
}

#[derive(Default)]
struct TaskStats {
    /// Granted, then Released, acquire started in the window.
    pairs: u64,
    /// Acquire answered TimedOut (someone else holds the key).
    contended: u64,
    /// Acquire answered Busy (never expected with wait 0).
    busy: u64,
    /// Release answered anything but Released (never expected).
    release_miss: u64,
    /// Any other outcome or a refused request.
    errors: u64,
    acq_lat_ns: Vec<u64>,
    pair_lat_ns: Vec<u64>,
}

struct Row {
    conc: usize,
    pairs_per_s: f64,
    acq: (f64, f64),
    pair: (f64, f64),
    acquires_per_s: f64,
    contended_pct: f64,
    busy: u64,
    release_miss: u64,
    errors: u64,
}

async fn run_task(
    handle: Handle,
    keys: Arc<Vec<Key>>,
    owner: Name,
    task_id: usize,
    start: Instant,
    end: Instant,
) -> TaskStats {
    let mut st = TaskStats::default();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((task_id as u64 + 1) * 0xD1B5_4A32_D192_ED03));
    loop {
        let t_acq = Instant::now();
        if t_acq >= end {
            break;
        }
        let in_window = t_acq >= start;
        let key = keys[(rng.next() % keys.len() as u64) as usize].clone();
        let r = handle
            .acquire(key)
            .owner(owner.clone())
            .wait(Duration::ZERO)
            .lease(LEASE)
            .await;
        let t_acq_done = Instant::now();
        if in_window {
            st.acq_lat_ns.push((t_acq_done - t_acq).as_nanos() as u64);
        }
        let grant = match r {
            Ok(grant) => grant,
            Err(AcquireError::TimedOut { .. }) => {
                st.contended += u64::from(in_window);
                continue;
            }
            Err(AcquireError::Busy) => {
                st.busy += u64::from(in_window);
                continue;
            }
            _ => {
                st.errors += u64::from(in_window);
                continue;
            }
        };
        let r = handle.release(&grant).await;
        let t_rel_done = Instant::now();
        if !in_window {
            continue;
        }
        match r {
            Ok(Outcome::Released) => {
                st.pairs += 1;
                st.pair_lat_ns.push((t_rel_done - t_acq).as_nanos() as u64);
            }
            Ok(_) => st.release_miss += 1,
            Err(_) => st.errors += 1,
        }
    }
    st
}

async fn bench_level(o: &Opts, addr: &str, tls: Option<&ClientTls>, conc: usize) -> Row {
    let endpoint = Endpoint::new(addr).expect("--addr is not an endpoint");
    let config = Config::new([endpoint], Name::new("e2e-bench").expect("name"));
    let handle = match tls {
        Some(tls) => ticketing::tokio::spawn(config, TlsConnector::new(tls.clone())),
        None => ticketing::tokio::spawn(config, TcpConnector),
    }
    .expect("config");
    // Connect and warm the path before the clock starts (the Redis bench
    // connects, loads its script and flushes before its clock starts).
    let probe = Key::new("e2e-probe").expect("key");
    let owner = Name::new("probe").expect("name");
    match handle
        .acquire(probe)
        .owner(owner)
        .wait(Duration::from_secs(5))
        .lease(LEASE)
        .await
    {
        Ok(g) => {
            let _ = handle.release(&g).await;
        }
        other => panic!("cannot reach the server at {addr}: {other:?}"),
    }

    let keys: Arc<Vec<Key>> = Arc::new(
        (0..o.keys)
            .map(|i| Key::new(format!("lock:{i}")).expect("key"))
            .collect(),
    );
    let t0 = Instant::now();
    let start = t0 + Duration::from_secs_f64(o.warmup);
    let end = start + Duration::from_secs_f64(o.secs);
    let tasks: Vec<_> = (0..conc)
        .map(|task_id| {
            let owner = Name::new(format!("task-{task_id}")).expect("name");
            tokio::spawn(run_task(
                handle.clone(),
                keys.clone(),
                owner,
                task_id,
                start,
                end,
            ))
        })
        .collect();

    let mut total = TaskStats::default();
    for t in tasks {
        let st = t.await.expect("task");
        total.pairs += st.pairs;
        total.contended += st.contended;
        total.busy += st.busy;
        total.release_miss += st.release_miss;
        total.errors += st.errors;
        total.acq_lat_ns.extend_from_slice(&st.acq_lat_ns);
        total.pair_lat_ns.extend_from_slice(&st.pair_lat_ns);
    }
    let _ = handle.shutdown(Duration::from_secs(1)).await;
    total.acq_lat_ns.sort_unstable();
    total.pair_lat_ns.sort_unstable();
    let attempts = total.acq_lat_ns.len() as u64;
    Row {
        conc,
        pairs_per_s: total.pairs as f64 / o.secs,
        acq: (pct(&total.acq_lat_ns, 0.50), pct(&total.acq_lat_ns, 0.99)),
        pair: (pct(&total.pair_lat_ns, 0.50), pct(&total.pair_lat_ns, 0.99)),
        acquires_per_s: attempts as f64 / o.secs,
        contended_pct: 100.0 * total.contended as f64 / attempts.max(1) as f64,
        busy: total.busy,
        release_miss: total.release_miss,
        errors: total.errors,
    }
}

/// Writes `ca.pem`, and `server.pem` and `server.key` for 127.0.0.1 signed
/// by it, into `dir`: what `ticketing serve --tls-cert --tls-key` and
/// `e2e --tls-ca` take.
fn make_certs(dir: &str) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let dir = std::path::Path::new(dir);
    std::fs::create_dir_all(dir).expect("--make-certs: create the directory");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("a key")).expect("a CA");
    let key = KeyPair::generate().expect("a key");
    let server = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .and_then(|params| params.signed_by(&key, &ca))
        .expect("a server certificate");
    for (file, pem) in [
        ("ca.pem", ca.pem()),
        ("server.pem", server.pem()),
        ("server.key", key.serialize_pem()),
    ] {
        std::fs::write(dir.join(file), pem).expect("--make-certs: write");
    }
}

#[tokio::main]
async fn main() {
    let o = parse_args();
    if let Some(dir) = &o.make_certs {
        make_certs(dir);
        return;
    }
    let tls = o.tls_ca.as_ref().map(|ca| {
        ClientTls::builder()
            .ca_file(ca)
            .and_then(|b| b.build())
            .expect("--tls-ca")
    });
    let name = if tls.is_some() {
        "ticketing-tls"
    } else {
        "ticketing"
    };
    let Some(addr) = o.addr.clone() else {
        // `cargo bench` runs every bench: this one needs a server in
        // another process, which benches/e2e.sh starts.
        println!("e2e: no --addr; run benches/e2e.sh (it starts the servers)");
        return;
    };
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    println!(
        "# e2e: ticketing tokio adapter -> `ticketing serve` at {}{}, {}s window (+{}s warmup), K={} keys (random), tokio workers={}",
        addr,
        if tls.is_some() { " over TLS" } else { "" },
        o.secs,
        o.warmup,
        o.keys,
        workers
    );
    for &c in &o.conc {
        let r = bench_level(&o, &addr, tls.as_ref(), c).await;
        println!(
            "{name} C={} {:.0}/s acq p50 {:.0}us p99 {:.0}us | pair p50/p99 {:.0}/{:.0} us; A/s {:.0}; contended {:.1}%; busy {}; rel_miss {}; err {}",
            r.conc,
            r.pairs_per_s,
            r.acq.0,
            r.acq.1,
            r.pair.0,
            r.pair.1,
            r.acquires_per_s,
            r.contended_pct,
            r.busy,
            r.release_miss,
            r.errors
        );
        println!(
            "RESULT {name} {} {:.0} {:.1} {:.1} {:.1} {:.1} {:.0} {:.2} {} {}",
            r.conc,
            r.pairs_per_s,
            r.acq.0,
            r.acq.1,
            r.pair.0,
            r.pair.1,
            r.acquires_per_s,
            r.contended_pct,
            r.busy,
            r.errors + r.release_miss
        );
    }
}
