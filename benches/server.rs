//! Requests through the server core, as the end-to-end benchmark sends
//! them: lock and unlock pairs from 256 callers over one connection.
//!
//! Each round is two waves of 256 requests, each wave one buffer handed to
//! `handle_bytes`, its answers drained with `poll_action`:
//! 1. 256 acquires (`A <id> lock/<n> bench 0 30000`, wait 0) of keys drawn
//!    at random among 1,000 (256 distinct ones, so every acquire is granted
//!    at once);
//! 2. 256 releases of those grants by their exact tokens, which frees every
//!    key again.
//!
//! The waves are written outside the measured part (tokens are known
//! beforehand: one counter, one more per grant). The measured part
//! (`Steady::server_round`) is what a driver does with them: `handle_bytes`
//! and draining `poll_action` (taking the bytes of each `Send`, then
//! dropping them), twice, then asking `poll_timeout`. Criterion reports it
//! with `Throughput::Elements(512)`: requests per second.
//!
//! `cargo bench --bench server` first checks the answers of one round
//! against what the protocol says, byte for byte.
//!
//! `TICKETING_BENCH_ROUNDS=<n>` runs 200 warm-up rounds and `n` more, then
//! prints how many requests went through `server_round` in all, and nothing
//! else, for counting instructions per request with callgrind:
//!
//! ```text
//! cargo bench --bench server --no-run   # prints the executable
//! TICKETING_BENCH_ROUNDS=2000 valgrind --tool=callgrind \
//!     --toggle-collect='*server_round*' target/release/deps/server-<hash>
//! ```
//!
//! and divide the `Collected` count by the requests printed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use ticketing::server::{self, Action, Config, ConnId, Server};
use ticketing::{Name, Time};

/// Callers, each with one request per wave.
const CALLERS: usize = 256;
/// Distinct keys the callers draw from.
const KEYS: usize = 1_000;
/// Requests per round: an acquire and a release per caller.
const REQUESTS_PER_ROUND: usize = 2 * CALLERS;
const LEASE_MS: u64 = 30_000;
/// Time that passes per round.
const ROUND_TIME: Duration = Duration::from_micros(100);

/// A small deterministic generator (xorshift64*).
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((u128::from(r) * n as u128) >> 64) as usize
    }
}

/// The token of the grant after the one with `token`, by the core's rule
/// (PROTOCOL.md 4.1): the next `n` of the term, or the first of the next
/// epoch when `n` would reach 2^22 (which criterion's runs do: 4 million
/// grants take about a second).
fn token_after(token: u64) -> u64 {
    let n = server::count_of(token) + 1;
    if n < server::TERM_GRANTS {
        token + 1
    } else {
        server::token(server::epoch_of(token) + 1, 1).expect("far below 2109")
    }
}

struct Steady {
    server: Server,
    conn: ConnId,
    now: Time,
    rng: XorShift,
    /// Key numbers, the first `CALLERS` of them drawn for this round.
    keys: Vec<usize>,
    next_id: u64,
    /// The token the next grant gets.
    next_token: u64,
    /// The tokens of this round's grants, in order.
    tokens: Vec<u64>,
    acquires: Vec<u8>,
    releases: Vec<u8>,
    /// What the server sent this round, as a driver's write buffer.
    sent: Vec<u8>,
}

impl Steady {
    fn new(warm: usize) -> Steady {
        let now = Time::from_millis(1);
        let mut config = Config::new(Name::new("node-1").expect("a name"));
        config.window = 4 * CALLERS as u64;
        config.hash_key = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
        let mut server = Server::new(config, now).expect("a valid config");
        let conn = server.handle_accept(now);
        server.handle_bytes(now, conn, b"H 1 bench -\n");
        let mut steady = Steady {
            server,
            conn,
            now,
            rng: XorShift(0x9E37_79B9_7F4A_7C15),
            keys: (0..KEYS).collect(),
            next_id: 1,
            next_token: 1,
            tokens: Vec::with_capacity(CALLERS),
            acquires: Vec::with_capacity(64 * CALLERS),
            releases: Vec::with_capacity(64 * CALLERS),
            sent: Vec::with_capacity(64 * REQUESTS_PER_ROUND),
        };
        steady.drain();
        assert_eq!(steady.sent, b"W node-1 1024\n");
        for _ in 0..warm {
            steady.round();
        }
        steady
    }

    /// Writes the round's two waves (not measured).
    fn prepare(&mut self) {
        self.now = self.now.saturating_add(ROUND_TIME);
        self.sent.clear();
        self.acquires.clear();
        self.releases.clear();
        self.tokens.clear();
        for i in 0..CALLERS {
            let pick = i + self.rng.below(KEYS - i);
            self.keys.swap(i, pick);
        }
        for &key in &self.keys[..CALLERS] {
            let id = self.next_id;
            self.next_id += 1;
            self.acquires
                .extend_from_slice(format!("A {id} lock/{key:04} bench 0 {LEASE_MS}\n").as_bytes());
        }
        for &key in &self.keys[..CALLERS] {
            let (id, token) = (self.next_id, self.next_token);
            self.next_id += 1;
            self.next_token = token_after(token);
            self.tokens.push(token);
            self.releases
                .extend_from_slice(format!("R {id} lock/{key:04} {token}\n").as_bytes());
        }
    }

    fn drain(&mut self) {
        while let Some(action) = self.server.poll_action() {
            match action {
                Action::Send { data, .. } => self.sent.extend_from_slice(&data),
                other => panic!("unexpected action {other:?}"),
            }
        }
    }

    /// What the driver does with the round's two waves: the measured part.
    #[inline(never)]
    fn server_round(&mut self) {
        self.server
            .handle_bytes(self.now, self.conn, &self.acquires);
        self.drain();
        self.server
            .handle_bytes(self.now, self.conn, &self.releases);
        self.drain();
        black_box(self.server.poll_timeout());
    }

    /// One round; returns the time of the measured part.
    fn round(&mut self) -> Duration {
        self.prepare();
        let start = Instant::now();
        self.server_round();
        start.elapsed()
    }

    /// The answers the round should have sent.
    fn expected(&self) -> Vec<u8> {
        let mut expected = Vec::new();
        for (line, token) in self
            .acquires
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .zip(&self.tokens)
        {
            let fields: Vec<&str> = std::str::from_utf8(line).unwrap().split(' ').collect();
            expected.extend_from_slice(
                format!("G {} A {} {token} {LEASE_MS}\n", fields[1], fields[2]).as_bytes(),
            );
        }
        for line in self
            .releases
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
        {
            let fields: Vec<&str> = std::str::from_utf8(line).unwrap().split(' ').collect();
            expected.extend_from_slice(format!("D {} R {}\n", fields[1], fields[2]).as_bytes());
        }
        expected
    }
}

/// Checks one round's answers byte for byte, and that every key is free
/// after it.
fn check_answers() {
    let mut steady = Steady::new(3);
    steady.round();
    assert_eq!(
        String::from_utf8_lossy(&steady.sent),
        String::from_utf8_lossy(&steady.expected())
    );
    assert_eq!(steady.server.lock_table().holders().count(), 0);
    assert_eq!(steady.server.unanswered(steady.conn), Some(0));
    // Across the term begun at n = 2^22, as the measured rounds go.
    while server::epoch_of(steady.next_token) == 0 {
        steady.round();
    }
    steady.round();
    assert_eq!(steady.server.epoch(), 1);
    assert_eq!(
        String::from_utf8_lossy(&steady.sent),
        String::from_utf8_lossy(&steady.expected())
    );
}

fn bench_requests(c: &mut Criterion, warm: usize) {
    let mut steady = Steady::new(warm);
    let mut group = c.benchmark_group("server_core");
    group.throughput(Throughput::Elements(REQUESTS_PER_ROUND as u64));
    group.bench_function("lock_unlock_256_per_wave", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += steady.round();
            }
            total
        });
    });
    group.finish();
}

fn main() {
    check_answers();
    if let Ok(rounds) = std::env::var("TICKETING_BENCH_ROUNDS") {
        let rounds: usize = rounds.parse().expect("a number of rounds");
        let warm = 200;
        let mut steady = Steady::new(warm);
        let mut time = Duration::ZERO;
        for _ in 0..rounds {
            time += steady.round();
        }
        eprintln!(
            "{:.1} ns per request in the measured rounds",
            time.as_nanos() as f64 / (rounds * REQUESTS_PER_ROUND) as f64
        );
        eprintln!(
            "requests through server_round: {} ({warm} warm-up + {rounds} rounds of {REQUESTS_PER_ROUND})",
            (warm + rounds) * REQUESTS_PER_ROUND
        );
        return;
    }
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let mut criterion = Criterion::default()
        .sample_size(30)
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    bench_requests(&mut criterion, if benchmarking { 200 } else { 2 });
    criterion.final_summary();
}
