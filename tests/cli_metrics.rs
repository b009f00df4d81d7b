//! `ticketing serve --metrics-listen ADDR` (issue 14): a scrape parses as
//! Prometheus text and shows the grants a test just made.

mod cli;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use cli::{scrape, Raw, Serve};

/// A free loopback port, as an address.
fn free_addr() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").to_string()
}

/// Each sample line of a Prometheus text body, as (name with labels,
/// value); checks that every line is a comment or a sample.
fn samples(body: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (name, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("not a sample: {line:?}"));
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("not a number in {line:?}"));
            let bare = name.split('{').next().unwrap_or_default();
            assert!(
                !bare.is_empty()
                    && bare
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "not a metric name: {line:?}"
            );
            if let Some(labels) = name.strip_prefix(bare) {
                assert!(
                    labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                    "bad labels: {line:?}"
                );
            }
            (name.to_string(), value)
        })
        .collect()
}

#[test]
fn a_scrape_shows_the_grants_just_made() {
    let metrics = free_addr();
    let serve = Serve::start(&["--metrics-listen", &metrics]);
    let mut raw = Raw::connect(&serve.addr);
    raw.send("H 2 scraper -\n");
    raw.next("W");
    for id in 1..=5 {
        raw.send(&format!("A {id} k{id} me 0 10000\n"));
        raw.next("G");
    }
    raw.send("A 6 k1 me 0 10000\n");
    raw.next("T");
    let granted = "ticketing_server_answers_total{answer=\"granted\"}";
    let start = Instant::now();
    loop {
        let found = samples(&scrape(&metrics));
        let value = |name: &str| found.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        // The server publishes once a second: a scrape may come between
        // the grants and the `T`.
        let timed_out = value("ticketing_server_answers_total{answer=\"timed_out\"}");
        if value(granted) == Some(5.0) && timed_out == Some(1.0) {
            assert_eq!(value("ticketing_server_connections"), Some(1.0));
            assert_eq!(value("ticketing_server_in_grace"), Some(0.0));
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no 5 grants and 1 timed out in the scrape: {found:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
