//! Answers through the client core with 10,000 requests in flight.
//!
//! A fake server, outside the measured part, answers the client's requests
//! in chunks of 2,400 answers (about 64 KiB): half of each chunk is `D` for
//! the oldest releases (a real server frees a grant without waiting), the
//! other half `G` for acquires picked at random among the 10,000 in flight
//! (answers come back in any order). In steady state about 2,400 releases
//! are in flight beside the 10,000 acquires, on 10,000 keys built once.
//! Every chunk is cut a few bytes into its next line, so each
//! `handle_bytes` also finishes a line cut by the previous chunk, as reads
//! from a socket would.
//!
//! The measured part (`Steady::core_round`) is what a driver does with a
//! chunk: `handle_bytes`; draining `poll_action` (copying each `Send` into
//! the driver's write buffer, then dropping it) and `poll_event`, releasing
//! every grant and submitting a new acquire for each one granted, so that
//! 10,000 acquires stay in flight; and asking `poll_timeout`. Criterion
//! reports it with `Throughput::Elements(answers)`.
//!
//! `cargo bench --bench core` first prints (stderr):
//! * live heap bytes per pending acquire, besides its key, with 10,000 and
//!   100,000 acquires in flight (a counting global allocator; the baseline
//!   is a connected client with the keys already built), both for a driver
//!   that drains `poll_action` every 64 acquires and for one that submits
//!   them all before draining once (the send buffer then keeps the capacity
//!   of one send of every request);
//! * heap allocations per answer in the measured part over 9.6 million
//!   answers after warm-up;
//! * a rough answers per second of that run.
//!
//! Set `TICKETING_BENCH_FIGURES_ONLY=1` to stop after the figures.
//!
//! `TICKETING_BENCH_ROUNDS=<n>` runs 200 warm-up rounds and `n` more, then
//! prints how many answers went through `core_round` in all, and nothing
//! else, for counting instructions per answer with callgrind:
//!
//! ```text
//! cargo bench --bench core --no-run   # prints the executable
//! TICKETING_BENCH_ROUNDS=200 valgrind --tool=callgrind \
//!     --toggle-collect='*core_round*' target/release/deps/core-<hash>
//! ```
//!
//! and divide the `Collected` count by the answers printed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use ticketing::client::{Action, Client, Config, ConnId, Event, Outcome};
use ticketing::{Endpoint, Key, Name, Time};

// ----- a counting allocator ------------------------------------------------

#[path = "support/counting.rs"]
mod counting;
use counting::{allocations, live_bytes};

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

// ----- the setting ---------------------------------------------------------

/// Acquires kept in flight.
const IN_FLIGHT: usize = 10_000;
/// Distinct keys, built once.
const KEYS: usize = 10_000;
/// Answers per `handle_bytes`: about 64 KiB of frames.
const ANSWERS_PER_CHUNK: usize = 2_400;
/// How far into its next line each chunk is cut.
const CUT_INTO_NEXT_LINE: usize = 7;
/// Time that passes per chunk.
const ROUND_TIME: Duration = Duration::from_micros(100);
const WAIT: Duration = Duration::from_secs(60);
const LEASE: Duration = Duration::from_secs(30);
const LEASE_MS: u64 = 30_000;

fn keys(n: usize) -> Vec<Key> {
    (0..n)
        .map(|i| Key::new(format!("lock/{i:06}")).expect("a valid key"))
        .collect()
}

/// The key's index, from the six digits that end its name.
fn key_index(key: &[u8]) -> usize {
    key[key.len() - 6..]
        .iter()
        .fold(0, |n, &d| n * 10 + usize::from(d - b'0'))
}

/// A client connected to a server with `window`, handshake done and every
/// output drained.
fn connected_client(window: u64, max_acquires: usize) -> (Client, ConnId, Time) {
    let mut config = Config::new(
        [Endpoint::new("127.0.0.1:7878").expect("an endpoint")],
        Name::new("bench").expect("a name"),
    );
    config.max_acquires = max_acquires;
    config.max_releases = max_acquires;
    let now = Time::from_millis(1);
    let mut client = Client::new(config, now).expect("a valid config");
    let conn = match client.poll_action() {
        Some(Action::Connect { conn, .. }) => conn,
        other => panic!("expected a connect, got {other:?}"),
    };
    client.handle_connected(now, conn);
    while let Some(action) = client.poll_action() {
        assert!(matches!(action, Action::Send { .. }), "{action:?}");
    }
    client.handle_bytes(now, conn, format!("W node-1 {window}\n").as_bytes());
    while client.poll_action().is_some() {}
    let mut connected = false;
    while let Some(event) = client.poll_event() {
        connected |= matches!(event, Event::Connected { .. });
    }
    assert!(connected, "the handshake is done");
    (client, conn, now)
}

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

/// Writes `n` in decimal.
fn put_u64(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

// ----- the fake server (not measured) ---------------------------------------

/// Reads the client's requests and writes answers. Allocation-free once
/// its buffers have grown.
struct Server {
    /// Acquires not yet answered: (id, key index).
    acquires: Vec<(u64, u32)>,
    /// Releases not yet answered, in the order received.
    releases: Vec<(u64, u32)>,
    /// The last token granted per key.
    tokens: Vec<u64>,
    /// Answers written but not yet handed to the client.
    backlog: Vec<u8>,
    rng: XorShift,
}

impl Server {
    fn new(keys: usize) -> Server {
        Server {
            acquires: Vec::with_capacity(4 * IN_FLIGHT),
            releases: Vec::with_capacity(4 * IN_FLIGHT),
            tokens: vec![0; keys],
            backlog: Vec::with_capacity(256 * 1024),
            rng: XorShift(0x9E37_79B9_7F4A_7C15),
        }
    }

    /// Takes in what the client sent.
    fn receive(&mut self, sent: &[u8]) {
        for line in sent.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let mut fields = line.split(|&b| b == b' ');
            let kind = fields.next().expect("a kind");
            let id = fields
                .next()
                .expect("an id")
                .iter()
                .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
            let key = key_index(fields.next().expect("a key")) as u32;
            match kind {
                b"A" => self.acquires.push((id, key)),
                b"R" => self.releases.push((id, key)),
                other => panic!("unexpected request {:?}", String::from_utf8_lossy(other)),
            }
        }
    }

    fn write_key(&mut self, key: u32) {
        self.backlog.extend_from_slice(b"lock/");
        let at = self.backlog.len();
        put_u64(&mut self.backlog, u64::from(key) + 1_000_000);
        // Drop the leading 1 that kept the six digits.
        self.backlog.remove(at);
    }

    /// Writes `n` more answers: the oldest releases received (at most half
    /// of them), then acquires picked at random.
    fn answer(&mut self, n: usize) {
        let releases = self.releases.len().min(n / 2);
        for i in 0..releases {
            let (id, key) = self.releases[i];
            self.backlog.extend_from_slice(b"D ");
            put_u64(&mut self.backlog, id);
            self.backlog.extend_from_slice(b" R ");
            self.write_key(key);
            self.backlog.push(b'\n');
        }
        self.releases.drain(..releases);
        for _ in releases..n {
            assert!(!self.acquires.is_empty(), "the server ran dry");
            let pick = self.rng.below(self.acquires.len());
            let (id, key) = self.acquires.swap_remove(pick);
            let token = &mut self.tokens[key as usize];
            *token += 1;
            let token = *token;
            self.backlog.extend_from_slice(b"G ");
            put_u64(&mut self.backlog, id);
            self.backlog.extend_from_slice(b" A ");
            self.write_key(key);
            self.backlog.push(b' ');
            put_u64(&mut self.backlog, token);
            self.backlog.push(b' ');
            put_u64(&mut self.backlog, LEASE_MS);
            // waited_ms (protocol version 2): the bench's clock stands still.
            self.backlog.extend_from_slice(b" 0\n");
        }
    }
}

// ----- the steady state ---------------------------------------------------

struct Steady {
    client: Client,
    conn: ConnId,
    now: Time,
    keys: Vec<Key>,
    owner: Name,
    next_key: usize,
    server: Server,
    /// The driver's write buffer: what the client sent this round.
    sent: Vec<u8>,
    /// The chunk handed to the client this round.
    chunk: Vec<u8>,
    /// Answers that completed in the chunk.
    chunk_answers: usize,
}

impl Steady {
    /// A client with `IN_FLIGHT` acquires sent, warmed up over `warm` rounds.
    fn new(warm: usize) -> Steady {
        let keys = keys(KEYS);
        let (client, conn, now) = connected_client(2 * IN_FLIGHT as u64, 65_536);
        let mut steady = Steady {
            client,
            conn,
            now,
            keys,
            owner: Name::new("worker-1").expect("a name"),
            next_key: 0,
            server: Server::new(KEYS),
            sent: Vec::with_capacity(1 << 20),
            chunk: Vec::with_capacity(128 * 1024),
            chunk_answers: 0,
        };
        for _ in 0..IN_FLIGHT {
            steady.submit();
        }
        steady.drain_actions();
        steady.server.receive(&steady.sent);
        steady.sent.clear();
        for _ in 0..warm {
            steady.round();
        }
        steady
    }

    fn submit(&mut self) {
        let key = self.keys[self.next_key].clone();
        self.next_key = (self.next_key + 1) % self.keys.len();
        self.client
            .acquire(self.now, key, self.owner.clone(), WAIT, LEASE)
            .expect("room for the acquire");
    }

    fn drain_actions(&mut self) {
        while let Some(action) = self.client.poll_action() {
            match action {
                Action::Send { data, .. } => self.sent.extend_from_slice(&data),
                other => panic!("unexpected action {other:?}"),
            }
        }
    }

    /// Prepares the next chunk (not measured): exactly `ANSWERS_PER_CHUNK`
    /// lines end in it.
    fn prepare(&mut self) {
        self.server.receive(&self.sent);
        self.sent.clear();
        self.server.answer(ANSWERS_PER_CHUNK);
        let backlog = &self.server.backlog;
        let mut ends = 0;
        let mut end = 0;
        for (at, &b) in backlog.iter().enumerate() {
            if b == b'\n' {
                ends += 1;
                if ends == ANSWERS_PER_CHUNK {
                    end = at + 1;
                    break;
                }
            }
        }
        assert_eq!(ends, ANSWERS_PER_CHUNK);
        // Cut a few bytes into the next line, when there is one.
        let end = (end + CUT_INTO_NEXT_LINE).min(backlog.len());
        self.chunk.clear();
        self.chunk.extend_from_slice(&backlog[..end]);
        self.server.backlog.drain(..end);
        self.chunk_answers = ANSWERS_PER_CHUNK;
        self.now = self.now.saturating_add(ROUND_TIME);
    }

    /// What the driver does with one chunk: the measured part.
    #[inline(never)]
    fn core_round(&mut self) {
        self.client.handle_bytes(self.now, self.conn, &self.chunk);
        loop {
            self.drain_actions();
            let mut any = false;
            while let Some(event) = self.client.poll_event() {
                any = true;
                match event {
                    Event::Outcome {
                        outcome: Outcome::Granted(grant),
                        ..
                    } => {
                        self.client.release(self.now, &grant).expect("a held grant");
                        self.submit();
                    }
                    Event::Outcome {
                        outcome: Outcome::Released,
                        ..
                    } => {}
                    other => panic!("unexpected event {other:?}"),
                }
            }
            if !any {
                break;
            }
        }
        black_box(self.client.poll_timeout());
    }

    /// One round; returns the time and allocations of the measured part.
    fn round(&mut self) -> (Duration, u64) {
        self.prepare();
        let allocs = allocations();
        let start = Instant::now();
        self.core_round();
        let elapsed = start.elapsed();
        (elapsed, allocations() - allocs)
    }
}

// ----- the figures ---------------------------------------------------------

/// Allocations per answer and a rough answers per second over `rounds`.
fn steady_state_figures(rounds: usize) {
    let mut steady = Steady::new(500);
    let (mut time, mut allocs) = (Duration::ZERO, 0);
    for _ in 0..rounds {
        let (t, a) = steady.round();
        time += t;
        allocs += a;
    }
    let answers = (rounds * ANSWERS_PER_CHUNK) as f64;
    let counts = steady.client.in_flight();
    let (in_flight, acquires) = (counts.requests, counts.acquires);
    eprintln!(
        "steady state: {answers} answers in {rounds} chunks of {ANSWERS_PER_CHUNK} \
         ({in_flight} requests in flight, {acquires} of them acquires)"
    );
    eprintln!(
        "  allocations in the core: {allocs} ({:.6} per answer)",
        allocs as f64 / answers
    );
    eprintln!(
        "  rough throughput: {:.2} M answers/s ({:.1} ns per answer)",
        answers / time.as_secs_f64() / 1e6,
        time.as_nanos() as f64 / answers
    );
}

/// Live heap bytes per pending acquire with `n` in flight, besides its key.
/// `batch`: how many acquires the driver submits between two drains of
/// `poll_action` (`n`: all at once, one `Send` of every request).
fn bytes_per_pending(n: usize, batch: usize) -> f64 {
    let keys = keys(n);
    let owner = Name::new("worker-1").expect("a name");
    let (mut client, _conn, now) = connected_client(2 * n as u64, 2 * n);
    let base = live_bytes();
    let mut iter = keys.iter();
    let mut submitted = 0;
    while submitted < n {
        for key in iter.by_ref().take(batch) {
            client
                .acquire(now, key.clone(), owner.clone(), WAIT, LEASE)
                .expect("room");
            submitted += 1;
        }
        while let Some(action) = client.poll_action() {
            black_box(action);
        }
    }
    let counts = client.in_flight();
    assert_eq!((counts.requests, counts.acquires), (n, n));
    let per = (live_bytes() - base) as f64 / n as f64;
    drop(client);
    per
}

fn print_figures() {
    eprintln!("== ticketing client core: answers with {IN_FLIGHT} requests in flight ==");
    for n in [10_000, 100_000] {
        eprintln!(
            "memory: {n} pending acquires: {:.1} bytes each besides the key \
             (driver polls every 64 acquires), {:.1} (all submitted before one poll)",
            bytes_per_pending(n, 64),
            bytes_per_pending(n, n),
        );
    }
    steady_state_figures(4_000);
}

// ----- criterion -----------------------------------------------------------

fn bench_answers(c: &mut Criterion, warm: usize) {
    let mut steady = Steady::new(warm);
    let mut group = c.benchmark_group("client_core");
    group.throughput(Throughput::Elements(ANSWERS_PER_CHUNK as u64));
    group.bench_function("answers_10k_in_flight", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += steady.round().0;
            }
            total
        });
    });
    group.finish();
}

fn main() {
    if let Ok(rounds) = std::env::var("TICKETING_BENCH_ROUNDS") {
        let rounds: usize = rounds.parse().expect("a number of rounds");
        let warm = 200;
        let mut steady = Steady::new(warm);
        let mut time = Duration::ZERO;
        for _ in 0..rounds {
            time += steady.round().0;
        }
        eprintln!(
            "{:.1} ns per answer in the measured rounds",
            time.as_nanos() as f64 / (rounds * ANSWERS_PER_CHUNK) as f64
        );
        eprintln!(
            "server holds {} acquires, {} releases; client in flight {:?}, open {:?}",
            steady.server.acquires.len(),
            steady.server.releases.len(),
            steady.client.in_flight(),
            steady.client.open_operations()
        );
        eprintln!(
            "answers through core_round: {} ({warm} warm-up + {rounds} rounds of {ANSWERS_PER_CHUNK})",
            (warm + rounds) * ANSWERS_PER_CHUNK
        );
        return;
    }
    // The figures and a long warm-up only when benchmarking, not under
    // `cargo test --benches`.
    let benchmarking = std::env::args().any(|a| a == "--bench");
    if benchmarking {
        print_figures();
        if std::env::var_os("TICKETING_BENCH_FIGURES_ONLY").is_some() {
            return;
        }
    }
    let mut criterion = Criterion::default()
        .sample_size(30)
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    bench_answers(&mut criterion, if benchmarking { 500 } else { 5 });
    criterion.final_summary();
}
