//! The round trip of an established TLS connection to `ticketing serve`,
//! alone and under a flood of TLS handshakes against the same server
//! (issue 20): what a handshake's crypto costs the answers of connections
//! that are already up. `benches/tls_flood.sh` starts the server with an
//! RSA-4096 certificate (each handshake then costs the server an RSA-4096
//! signature) and runs this, for one build or an old and a new side by
//! side.
//!
//! * The measured connection: one TLS connection, its handshake done
//!   before the window; it sends an acquire (wait 0), reads the grant,
//!   releases it by its token, reads the `D`, one request at a time, a
//!   request every millisecond at most; every request's round trip (write
//!   to the answer read) is a sample.
//! * The flood: F threads, each in a loop connecting, writing one
//!   ClientHello captured once (so the flood costs the flooders next to
//!   nothing, and the server a full handshake's crypto each time), reading
//!   the server's first flight, closing.
//! * Phases `quiet` (no flood) and `flood` alternate, ROUNDS times, each
//!   for SECS; p50 and p99 are nearest-rank.
//!
//! Usage:
//!
//! ```text
//! tls_flood --addr 127.0.0.1:PORT --tls-ca FILE [--secs 5] [--flooders 4] [--rounds 2]
//!           [--first-round 1] [--label NAME]
//! ```
//!
//! Without `--addr` (as under a plain `cargo bench`) it only says how to run
//! it. Prints one line per phase, then one `RESULT` line per phase for
//! scripts: `RESULT LABEL PHASE ROUND samples p50_us p99_us max_us
//! handshakes_per_s`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ticketing::tls::rustls::crypto::ring;
use ticketing::tls::rustls::pki_types::pem::PemObject;
use ticketing::tls::rustls::pki_types::{CertificateDer, ServerName};
use ticketing::tls::rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

struct Opts {
    addr: Option<String>,
    ca: Option<String>,
    secs: f64,
    flooders: usize,
    rounds: usize,
    first_round: usize,
    label: String,
}

fn parse_args() -> Opts {
    let mut o = Opts {
        addr: None,
        ca: None,
        secs: 5.0,
        flooders: 4,
        rounds: 2,
        first_round: 1,
        label: "ticketing".into(),
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
            "--tls-ca" => o.ca = Some(v),
            "--secs" => o.secs = v.parse().expect("--secs"),
            "--flooders" => o.flooders = v.parse().expect("--flooders"),
            "--rounds" => o.rounds = v.parse().expect("--rounds"),
            "--first-round" => o.first_round = v.parse().expect("--first-round"),
            "--label" => o.label = v,
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

/// A client configuration trusting the CA certificates of `ca`.
// ring's provider, deprecated by rustls 0.23.48 for want of post-quantum
// key exchange: as `src/tls/config.rs` says, the one to keep.
#[allow(deprecated)]
fn client_config(ca: &str) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("the CA file") {
        roots.add(cert.expect("a certificate")).expect("a root");
    }
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

fn host(addr: &str) -> ServerName<'static> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    ServerName::try_from(host.to_owned()).expect("a server name")
}

/// The first flight of a client: one ClientHello, to replay.
fn client_hello(config: &Arc<ClientConfig>, addr: &str) -> Vec<u8> {
    let mut conn = ClientConnection::new(Arc::clone(config), host(addr)).expect("a client");
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).expect("the ClientHello");
    }
    hello
}

/// Floods `addr` with `hello` until `stop`; counts the handshakes the
/// server answered.
fn flood(addr: String, hello: Arc<Vec<u8>>, stop: Arc<AtomicBool>, answered: Arc<AtomicU64>) {
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut tcp) = TcpStream::connect(&addr) else {
            thread::sleep(Duration::from_millis(1));
            continue;
        };
        let _ = tcp.set_read_timeout(Some(Duration::from_secs(5)));
        if tcp.write_all(&hello).is_err() {
            continue;
        }
        // The server's flight: its crypto is done once any of it comes.
        if matches!(tcp.read(&mut buf), Ok(n) if n > 0) {
            answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The measured connection.
struct Measured {
    tls: BufReader<StreamOwned<ClientConnection, TcpStream>>,
    next_id: u64,
}

impl Measured {
    fn connect(config: &Arc<ClientConfig>, addr: &str) -> Measured {
        let conn = ClientConnection::new(Arc::clone(config), host(addr)).expect("a client");
        let tcp = TcpStream::connect(addr).expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        let mut tls = StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).expect("the handshake");
        }
        let mut measured = Measured {
            tls: BufReader::new(tls),
            next_id: 1,
        };
        let welcome = measured.ask("H 2 bench -\n").1;
        assert!(welcome.starts_with("W "), "{welcome}");
        measured
    }

    /// Sends `line`, reads the answer: its round trip, and the answer.
    fn ask(&mut self, line: &str) -> (Duration, String) {
        let sent = Instant::now();
        let stream = self.tls.get_mut();
        stream.write_all(line.as_bytes()).expect("write");
        stream.flush().expect("flush");
        let mut answer = String::new();
        self.tls.read_line(&mut answer).expect("read");
        (sent.elapsed(), answer)
    }

    /// One acquire and its release: two round trips.
    fn pair(&mut self, samples: &mut Vec<u64>) {
        let id = self.next_id;
        self.next_id += 2;
        let (took, granted) = self.ask(&format!("A {id} bench-key bench 0 30000\n"));
        samples.push(took.as_nanos() as u64);
        let token = granted
            .split(' ')
            .nth(4)
            .unwrap_or_else(|| panic!("not a grant: {granted}"))
            .to_owned();
        let (took, done) = self.ask(&format!("R {} bench-key {token}\n", id + 1));
        assert!(done.starts_with("D "), "{done}");
        samples.push(took.as_nanos() as u64);
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

fn main() {
    let o = parse_args();
    let (Some(addr), Some(ca)) = (o.addr.clone(), o.ca.clone()) else {
        eprintln!(
            "tls_flood: needs a server; run `bash benches/tls_flood.sh` (or tls_flood --addr ADDR --tls-ca FILE)"
        );
        return;
    };
    let config = client_config(&ca);
    let hello = Arc::new(client_hello(&config, &addr));
    let mut measured = Measured::connect(&config, &addr);
    let every = Duration::from_millis(1);
    let window = Duration::from_secs_f64(o.secs);
    for round in o.first_round..o.first_round + o.rounds {
        for phase in ["quiet", "flood"] {
            let stop = Arc::new(AtomicBool::new(false));
            let answered = Arc::new(AtomicU64::new(0));
            let flooders: Vec<_> = (0..if phase == "flood" { o.flooders } else { 0 })
                .map(|_| {
                    let (addr, hello) = (addr.clone(), Arc::clone(&hello));
                    let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered));
                    thread::spawn(move || flood(addr, hello, stop, answered))
                })
                .collect();
            // Let the flood reach its pace before measuring.
            thread::sleep(Duration::from_millis(if flooders.is_empty() {
                0
            } else {
                500
            }));
            let counted_from = answered.load(Ordering::Relaxed);
            let start = Instant::now();
            let mut samples = Vec::new();
            while start.elapsed() < window {
                let began = Instant::now();
                measured.pair(&mut samples);
                if let Some(rest) = (began + every).checked_duration_since(Instant::now()) {
                    thread::sleep(rest);
                }
            }
            let elapsed = start.elapsed().as_secs_f64();
            let handshakes = (answered.load(Ordering::Relaxed) - counted_from) as f64 / elapsed;
            stop.store(true, Ordering::Relaxed);
            for f in flooders {
                let _ = f.join();
            }
            samples.sort_unstable();
            let (p50, p99) = (pct(&samples, 0.50), pct(&samples, 0.99));
            let max = samples.last().map_or(f64::NAN, |&n| n as f64 / 1000.0);
            println!(
                "{} round {round} {phase:>5}: {} round trips, p50 {p50:.0} µs, p99 {p99:.0} µs, max {max:.0} µs; {handshakes:.0} handshakes/s answered",
                o.label,
                samples.len()
            );
            println!(
                "RESULT {} {phase} {round} {} {p50:.1} {p99:.1} {max:.1} {handshakes:.1}",
                o.label,
                samples.len()
            );
        }
    }
}
