//! A scripted session: the client core against a server whose every byte is
//! written out below, printing everything that crosses the core's boundary.
//!
//! Run with `cargo run --example scripted`.
//!
//! The core is deterministic, so the request ids it picks are known in
//! advance and the script can answer them by number. The story: answers
//! come back out of order, a hint outside the allowlist is ignored, a busy
//! key is retried inside its wait budget, a release takes the reserved slot
//! while the acquire slots are full, the server answers an id that was
//! never sent (so the client closes and releases that grant by its exact
//! token on the next connection), the connection dies with an acquire in
//! flight (Indeterminate, never resent), and the shutdown drains the release
//! lane.

use std::collections::HashMap;
use std::time::Duration;

use ticketing::client::{Action, Client, Config, Event, OpId, Outcome};
use ticketing::{Endpoint, Key, Name, Time};

/// What the driver does at one moment of the script.
enum Step {
    /// The embedder asks for a lock: (label, key, owner, wait ms, lease ms).
    Acquire(&'static str, &'static str, &'static str, u64, u64),
    /// The embedder releases the grant that acquire `label` got.
    Release(&'static str),
    /// The transport connects.
    Connected,
    /// The server sends these lines.
    Server(&'static str),
    /// The transport dies.
    Drop,
    /// The embedder shuts down with this budget in ms.
    Shutdown(u64),
}

const SCRIPT: &[(u64, Step)] = &[
    (0, Step::Acquire("alice", "printer", "alice", 5_000, 30_000)),
    (0, Step::Acquire("bob", "printer", "bob", 5_000, 30_000)),
    (0, Step::Acquire("carol", "scanner", "carol", 0, 10_000)),
    (5, Step::Connected),
    // A hint to an address outside the allowlist is ignored.
    (9, Step::Server("L 10.9.9.9:7878\nW node-a 4\n")),
    // Answers come in any order: the scanner first, then alice.
    (
        12,
        Step::Server("G 3 A scanner 41 10000 0\nG 1 A printer 42 30000 0\n"),
    ),
    (20, Step::Acquire("dave", "plotter", "dave", 300, 5_000)),
    // Now bob, dave and frank fill the acquire slots (window 4, 1 reserved).
    (
        21,
        Step::Acquire("frank", "printer", "frank", 2_000, 30_000),
    ),
    // Alice's release still goes out, in the reserved slot.
    (30, Step::Release("alice")),
    (
        33,
        Step::Server("D 6 R printer\nG 2 A printer 43 30000 21\n"),
    ),
    // The plotter's queue is full: dave retries within his budget.
    (40, Step::Server("B 4 A plotter\n")),
    (70, Step::Server("G 7 A plotter 44 5000 0\n")),
    (80, Step::Release("carol")),
    // An answer to an id never sent: the session is broken.
    (81, Step::Server("G 99 A ghost 7 60000 0\n")),
    (200, Step::Connected),
    (205, Step::Server("W node-a 4\n")),
    (208, Step::Server("D 9 R scanner\nN 10 R ghost\n")),
    (
        210,
        Step::Acquire("erin", "printer", "erin", 10_000, 30_000),
    ),
    (220, Step::Drop),
    (400, Step::Connected),
    (405, Step::Server("W node-a 4\n")),
    (406, Step::Release("bob")),
    (406, Step::Release("dave")),
    (407, Step::Shutdown(1_000)),
    (410, Step::Server("D 12 R printer\nD 13 R plotter\n")),
];

struct Driver {
    client: Client,
    now: Time,
    labels: HashMap<OpId, &'static str>,
    grants: HashMap<&'static str, ticketing::client::Grant>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::new(
        [
            Endpoint::new("10.0.0.1:7878")?,
            Endpoint::new("10.0.0.2:7878")?,
        ],
        Name::new("scripted-demo")?,
    );
    config.seed = 2026;
    let mut d = Driver {
        client: Client::new(config, Time::ZERO)?,
        now: Time::ZERO,
        labels: HashMap::new(),
        grants: HashMap::new(),
    };
    println!("    time  what");
    d.drain();
    for (ms, step) in SCRIPT {
        d.advance_to(Time::from_millis(*ms));
        d.step(step)?;
        d.drain();
    }
    // Let the remaining timers run out.
    while let Some(deadline) = d.client.poll_timeout() {
        d.advance_to(deadline);
        d.drain();
    }
    println!("finished: {}", d.client.is_finished());
    Ok(())
}

impl Driver {
    fn advance_to(&mut self, at: Time) {
        while let Some(deadline) = self.client.poll_timeout() {
            if deadline > at {
                break;
            }
            self.now = deadline;
            self.client.handle_timeout(deadline);
            self.drain();
        }
        self.now = at;
        self.client.handle_timeout(at);
    }

    fn step(&mut self, step: &Step) -> Result<(), Box<dyn std::error::Error>> {
        let conn = self.client.connection();
        match *step {
            Step::Acquire(label, key, owner, wait, lease) => {
                let op = self.client.acquire(
                    self.now,
                    Key::new(key)?,
                    Name::new(owner)?,
                    Duration::from_millis(wait),
                    Duration::from_millis(lease),
                )?;
                self.labels.insert(op, label);
                self.say(&format!(
                    "{label}: acquire {key} (wait {wait} ms, lease {lease} ms)"
                ));
            }
            Step::Release(label) => {
                let grant = self.grants.remove(label).expect("granted earlier");
                let op = self.client.release(self.now, &grant)?;
                self.labels.insert(op, label);
                self.say(&format!(
                    "{label}: release {} token {}",
                    grant.key(),
                    grant.token()
                ));
            }
            Step::Connected => {
                self.say("transport connected");
                self.client
                    .handle_connected(self.now, conn.expect("connecting"));
            }
            Step::Server(text) => {
                for line in text.lines() {
                    self.say(&format!("<- {line}"));
                }
                self.client
                    .handle_bytes(self.now, conn.expect("connected"), text.as_bytes());
            }
            Step::Drop => {
                self.say("transport dies");
                self.client.handle_transport_closed(
                    self.now,
                    conn.expect("connected"),
                    ticketing::client::TransportEnd::Error,
                );
            }
            Step::Shutdown(budget) => {
                self.say(&format!("shutdown, budget {budget} ms"));
                self.client
                    .shutdown(self.now, Duration::from_millis(budget))?;
            }
        }
        Ok(())
    }

    fn drain(&mut self) {
        while let Some(action) = self.client.poll_action() {
            match action {
                Action::Connect { conn, addr } => self.say(&format!("connect {addr} ({conn})")),
                Action::Send { data, .. } => {
                    for line in String::from_utf8_lossy(&data).lines() {
                        self.say(&format!("-> {line}"));
                    }
                }
                Action::Close { conn } => self.say(&format!("close {conn}")),
                other => self.say(&format!("{other:?}")),
            }
        }
        while let Some(event) = self.client.poll_event() {
            let text = match event {
                Event::Outcome { op, outcome } => {
                    let label = self.labels.get(&op).copied().unwrap_or("?");
                    let text = describe(&outcome, self.now);
                    if let Outcome::Granted(grant) = outcome {
                        self.grants.insert(label, grant);
                    }
                    format!("{label}: {text}")
                }
                // The Connect action was printed already.
                Event::Connecting { .. } => continue,
                Event::Connected { addr, node, window } => {
                    format!("connected to {addr}, node {node}, window {window}")
                }
                Event::Closed { addr, reason } => format!("closed {addr}: {reason}"),
                Event::LeaderHint { addr } => format!("leader hint taken: {addr}"),
                Event::HintIgnored { addr } => {
                    format!("leader hint ignored (not allowlisted): {addr}")
                }
                Event::Backoff { cause, until } => format!("backoff ({cause:?}) until {until}"),
                Event::OrphanRelease { key, token } => {
                    format!("orphan grant {key} token {token}: release queued")
                }
                Event::OrphanSettled { key, token, result } => {
                    format!("orphan grant {key} token {token}: {result:?}")
                }
                other => format!("{other:?}"),
            };
            self.say(&format!("   {text}"));
        }
    }

    fn say(&self, text: &str) {
        println!("{:>6} ms  {text}", self.now.as_millis());
    }
}

fn describe(outcome: &Outcome, now: Time) -> String {
    match outcome {
        Outcome::Granted(g) => format!(
            "GRANTED {} token {} lease {} ms, valid until {}",
            g.key(),
            g.token(),
            g.lease().as_millis(),
            g.valid_until()
        ),
        Outcome::Indeterminate { settles_by } => format!(
            "INDETERMINATE, settled by lease expiry within {} ms",
            settles_by.saturating_duration_since(now).as_millis()
        ),
        other => format!("{other:?}").to_uppercase(),
    }
}
