//! How often `ticketing client` tries to connect when nothing works, over
//! real sockets (PROTOCOL.md section 5, "Connecting and backing off"): a
//! round tries each address once, at once, and the rounds back off, so a
//! client with nothing held costs a broken cluster a handful of attempts a
//! second, never a storm.

mod cli;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cli::{dead_endpoint, Client};

/// A listener on a free loopback port that answers every connection with
/// `reply` (after reading its `H`, when `reply` is not empty) and closes
/// it; counts the connections. Runs until the test ends.
fn stub(reply: impl Fn() -> String + Send + 'static) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::Relaxed);
            let reply = reply();
            if !reply.is_empty() {
                let mut hello = String::new();
                let _ = BufReader::new(&stream).read_line(&mut hello);
                let _ = stream.write_all(reply.as_bytes());
            }
        }
    });
    (addr, accepted)
}

/// The `connecting` events the client prints within `window`.
fn attempts_within(client: &mut Client, window: Duration) -> usize {
    let deadline = Instant::now() + window;
    let mut attempts = 0;
    while client
        .next_matching(
            deadline.saturating_duration_since(Instant::now()),
            "a connect",
            |v| v["event"] == "connecting",
        )
        .is_some()
    {
        attempts += 1;
    }
    attempts
}

#[test]
fn a_refused_endpoint_and_one_that_closes_at_once_get_at_most_30_attempts_in_3_s() {
    let refused = dead_endpoint();
    let (closes, accepted) = stub(String::new);
    let start = Instant::now();
    let mut client = Client::start(&[&refused, &closes], &[]);
    let attempts = attempts_within(&mut client, Duration::from_secs(3));
    let window = start.elapsed();
    eprintln!(
        "{attempts} attempts in {window:?}; the closing endpoint accepted {}",
        accepted.load(Ordering::Relaxed)
    );
    assert!(attempts <= 30, "{attempts} attempts in 3 s");
    // It keeps trying, both addresses each round.
    assert!(attempts >= 6, "only {attempts} attempts in 3 s");
    assert!(accepted.load(Ordering::Relaxed) >= 3);
}

#[test]
fn two_endpoints_that_redirect_to_each_other_get_at_most_60_attempts_in_1_5_s() {
    // Each names the other the leader; the second is bound first so that
    // the first can name it.
    let second = TcpListener::bind("127.0.0.1:0").expect("bind");
    let second_addr = second.local_addr().expect("addr").to_string();
    drop(second);
    let to_second = second_addr.clone();
    let (first, _) = stub(move || format!("M {to_second}\n"));
    let to_first = first.clone();
    let listener = TcpListener::bind(&second_addr).expect("bind the second again");
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut hello = String::new();
            let _ = BufReader::new(&stream).read_line(&mut hello);
            let _ = stream.write_all(format!("M {to_first}\n").as_bytes());
        }
    });
    let mut client = Client::start(&[&first, &second_addr], &[]);
    let attempts = attempts_within(&mut client, Duration::from_millis(1_500));
    eprintln!("{attempts} attempts in 1.5 s");
    assert!(attempts <= 60, "{attempts} attempts in 1.5 s");
    assert!(attempts >= 4, "only {attempts} attempts in 1.5 s");
}
