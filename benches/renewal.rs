//! Renewals through the client core with 10,000 automatically renewed
//! grants held (issue 11).
//!
//! A client holds 10,000 grants of 30 s leases, granted over one lease
//! third so that their renewals are due evenly: one every millisecond of
//! the core's time. Each round moves the core's time on by 250 ms, so that
//! 250 renewals come due, and a fake server (not measured) answers every
//! `X` with its `G`. The measured parts (`Renewing::core_sends` and
//! `core_answers`) are what a driver does: `handle_timeout` (the renewals
//! come due and are queued), draining `poll_action` (each `X` encoded and
//! copied out); then handing the answers back with `handle_bytes` in reads
//! of 16 KiB, as the adapters read, draining `poll_event` (a `Renewed`
//! notice per renewal) after each.
//!
//! `cargo bench --bench renewal` prints (stderr):
//! * live heap bytes per held grant besides its key, renewed automatically
//!   or not (the difference is what renewal costs a grant);
//! * heap allocations per renewal in the measured part, after warm-up;
//! * renewal round trips per second.
//!
//! `TICKETING_BENCH_ROUNDS=<n>` runs 1,000 warm-up rounds and `n` more and
//! prints the renewals that went through the measured parts, for
//! callgrind (`--toggle-collect='*core_sends*' --toggle-collect='*core_answers*'`),
//! as `benches/core.rs` does.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ticketing::client::{Action, Client, Config, ConnId, Event, Outcome};
use ticketing::{Endpoint, Key, Name, Time};

#[path = "support/counting.rs"]
mod counting;
use counting::{allocations, live_bytes};

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

const GRANTS: usize = 10_000;
const LEASE: Duration = Duration::from_secs(30);
const LEASE_MS: u64 = 30_000;
/// Time per round: a fortieth of the 10 s between two renewals of a
/// grant, so that 250 renewals come due, as a driver woken by the core's
/// timer finds them.
const ROUND: Duration = Duration::from_millis(250);
const RENEWALS_PER_ROUND: usize = 250;
/// Rounds measured.
const ROUNDS: usize = 20_000;
/// The adapters' read buffer.
const READ: usize = 16 * 1024;

fn keys(n: usize) -> Vec<Key> {
    (0..n)
        .map(|i| Key::new(format!("lock/{i:06}")).expect("a valid key"))
        .collect()
}

/// A client connected with a window of 2 × `GRANTS`.
fn connected() -> (Client, ConnId, Time) {
    let config = Config::new(
        [Endpoint::new("127.0.0.1:7878").expect("an endpoint")],
        Name::new("bench").expect("a name"),
    );
    let now = Time::from_millis(1);
    let mut client = Client::new(config, now).expect("a valid config");
    let conn = match client.poll_action() {
        Some(Action::Connect { conn, .. }) => conn,
        other => panic!("expected a connect, got {other:?}"),
    };
    client.handle_connected(now, conn);
    while client.poll_action().is_some() {}
    let welcome = format!("W node-1 {}\n", 2 * GRANTS);
    client.handle_bytes(now, conn, welcome.as_bytes());
    while client.poll_action().is_some() {}
    while client.poll_event().is_some() {}
    (client, conn, now)
}

/// Answers every request in `sent` the way a server does: `G` to `A`
/// (token = the id, granted at once) and to `X` (the lease asked).
fn answer(sent: &[u8], out: &mut Vec<u8>) {
    for line in sent.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        out.extend_from_slice(b"G ");
        out.extend_from_slice(fields[1]);
        match fields[0] {
            b"A" => {
                out.extend_from_slice(b" A ");
                out.extend_from_slice(fields[2]);
                out.push(b' ');
                out.extend_from_slice(fields[1]);
                out.push(b' ');
                out.extend_from_slice(fields[5]);
                out.extend_from_slice(b" 0\n");
            }
            b"X" => {
                out.extend_from_slice(b" X ");
                out.extend_from_slice(fields[2]);
                out.push(b' ');
                out.extend_from_slice(fields[3]);
                out.push(b' ');
                out.extend_from_slice(fields[4]);
                out.push(b'\n');
            }
            other => panic!("unexpected {:?}", String::from_utf8_lossy(other)),
        }
    }
}

struct Renewing {
    client: Client,
    conn: ConnId,
    now: Time,
    sent: Vec<u8>,
    answers: Vec<u8>,
    renewed: usize,
}

impl Renewing {
    /// `GRANTS` grants, renewed automatically if `auto`, granted evenly
    /// over a third of a lease.
    fn new(auto: bool) -> Renewing {
        let (client, conn, now) = connected();
        let mut r = Renewing {
            client,
            conn,
            now,
            sent: Vec::with_capacity(1 << 20),
            answers: Vec::with_capacity(1 << 20),
            renewed: 0,
        };
        let owner = Name::new("worker-1").expect("a name");
        let step = LEASE / 3 / GRANTS as u32;
        for key in keys(GRANTS) {
            let op = match auto {
                true => r.client.acquire_renewing(
                    r.now,
                    key,
                    owner.clone(),
                    Duration::ZERO,
                    LEASE,
                    None,
                ),
                false => r
                    .client
                    .acquire(r.now, key, owner.clone(), Duration::ZERO, LEASE),
            };
            black_box(op.expect("room"));
            r.exchange();
            r.now = r.now.saturating_add(step);
        }
        r
    }

    /// Drains the sends, answers them, hands the answers back, drains the
    /// events: one exchange with the server.
    fn exchange(&mut self) {
        while let Some(action) = self.client.poll_action() {
            if let Action::Send { data, .. } = action {
                self.sent.extend_from_slice(&data);
            }
        }
        self.answers.clear();
        answer(&self.sent, &mut self.answers);
        self.sent.clear();
        self.client.handle_bytes(self.now, self.conn, &self.answers);
        while let Some(event) = self.client.poll_event() {
            match event {
                Event::Renewed { .. } => self.renewed += 1,
                Event::Outcome {
                    outcome: Outcome::Granted(_),
                    ..
                } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn drain_events(&mut self) {
        while let Some(event) = self.client.poll_event() {
            if let Event::Renewed { .. } = event {
                self.renewed += 1;
            }
        }
    }

    /// The first measured half of a round, once the time moved on: the
    /// renewals come due and go out.
    #[inline(never)]
    fn core_sends(&mut self) {
        self.client.handle_timeout(self.now);
        while let Some(action) = self.client.poll_action() {
            if let Action::Send { data, .. } = action {
                self.sent.extend_from_slice(&data);
            }
        }
    }

    /// The second measured half: the answers come back, each a notice, in
    /// reads of 16 KiB as the adapters read them, the notices drained after
    /// each.
    #[inline(never)]
    fn core_answers(&mut self) {
        let answers = std::mem::take(&mut self.answers);
        for read in answers.chunks(READ) {
            self.client.handle_bytes(self.now, self.conn, read);
            self.drain_events();
        }
        self.answers = answers;
        self.drain_events();
        black_box(self.client.poll_timeout());
    }

    /// One round: the time moves on, the renewals due go out, the server
    /// (not measured) answers them, and the answers come back. Returns the
    /// time and allocations of the measured parts, and the renewals.
    fn round(&mut self) -> (Duration, u64, usize) {
        self.now = self.now.saturating_add(ROUND);
        let before = self.renewed;
        let allocs = allocations();
        let start = Instant::now();
        self.core_sends();
        let mut elapsed = start.elapsed();
        let mut allocated = allocations() - allocs;
        self.answers.clear();
        answer(&self.sent, &mut self.answers);
        self.sent.clear();
        let allocs = allocations();
        let start = Instant::now();
        self.core_answers();
        elapsed += start.elapsed();
        allocated += allocations() - allocs;
        (elapsed, allocated, self.renewed - before)
    }
}

/// Live heap bytes per held grant besides its key, renewed or not, after
/// `rounds` rounds.
fn bytes_per_grant(auto: bool, rounds: usize) -> f64 {
    let keys_bytes = {
        let before = live_bytes();
        let keys = keys(GRANTS);
        let bytes = live_bytes() - before;
        drop(keys);
        bytes
    };
    let before = live_bytes();
    let mut r = Renewing::new(auto);
    for _ in 0..rounds {
        r.round();
    }
    // The driver's own buffers are not the client's.
    let buffers = r.sent.capacity() + r.answers.capacity();
    let bytes = live_bytes() - before - buffers;
    let per = (bytes - keys_bytes) as f64 / GRANTS as f64;
    drop(r);
    per
}

fn main() {
    if let Ok(rounds) = std::env::var("TICKETING_BENCH_ROUNDS") {
        let rounds: usize = rounds.parse().expect("a number of rounds");
        let mut r = Renewing::new(true);
        for _ in 0..1_000 + rounds {
            r.round();
        }
        eprintln!("renewals through the measured parts: {}", r.renewed);
        return;
    }
    eprintln!("== ticketing client core: renewals with {GRANTS} automatically renewed grants ==");
    eprintln!("(an Event is {} bytes)", std::mem::size_of::<Event>());
    // Held and not renewed: as granted (they would run out in 30 s). Renewed:
    // after 20 rounds, every grant renewed several times.
    let (manual, auto) = (bytes_per_grant(false, 0), bytes_per_grant(true, 200));
    eprintln!(
        "memory: {manual:.1} bytes per held grant besides its key, {auto:.1} renewed \
         automatically ({:+.1})",
        auto - manual
    );
    let mut r = Renewing::new(true);
    for _ in 0..1_000 {
        r.round();
    }
    let (mut time, mut allocs, mut renewals) = (Duration::ZERO, 0, 0);
    for _ in 0..ROUNDS {
        let (t, a, n) = r.round();
        time += t;
        allocs += a;
        renewals += n;
    }
    assert_eq!(
        renewals,
        ROUNDS * RENEWALS_PER_ROUND,
        "every renewal due was answered"
    );
    eprintln!(
        "steady state: {renewals} renewals in {ROUNDS} rounds of {RENEWALS_PER_ROUND} \
         ({LEASE_MS} ms leases)"
    );
    eprintln!(
        "  allocations in the core: {allocs} ({:.6} per renewal)",
        allocs as f64 / renewals as f64
    );
    eprintln!(
        "  throughput: {:.2} M renewal round trips/s ({:.1} ns each)",
        renewals as f64 / time.as_secs_f64() / 1e6,
        time.as_nanos() as f64 / renewals as f64
    );
}
