//! `ticketing serve --metrics-listen ADDR` against clients that misbehave
//! (issue 20, item 4): the metrics port answers `GET /metrics` alone,
//! closes a request whose head does not come, and can never take the
//! descriptors the lock port needs.

mod cli;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::thread;
use std::time::{Duration, Instant};

use cli::{free_addr, Raw, Serve, WAIT};
use nix::sys::resource::{setrlimit, Resource};

/// How long a request's head may take to arrive (README.md, Watching it).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// One request on a connection of its own: the status line, the head and
/// the body of the answer.
fn request(addr: &str, method: &str, path: &str) -> (String, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).expect("request");
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}; read so far: {answer:?}"));
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: no head in {answer:?}"));
    let status = head.lines().next().unwrap_or_default().to_string();
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[test]
fn only_get_and_head_of_metrics_answer_200() {
    let metrics = free_addr();
    let _serve = Serve::start(&["--metrics-listen", &metrics]);

    let (status, head, body) = request(&metrics, "GET", "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(head.contains("content-type: text/plain"), "{head}");
    // The counters are published within a second of the start.
    let start = Instant::now();
    let mut body = body;
    while !body.contains("ticketing_server_accepted_total") {
        assert!(start.elapsed() < WAIT, "no server counters in {body:?}");
        thread::sleep(Duration::from_millis(200));
        body = request(&metrics, "GET", "/metrics").2;
    }

    let (status, head, body) = request(&metrics, "HEAD", "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(head.contains("content-type: text/plain"), "{head}");
    assert_eq!(body, "", "an answer to HEAD has no body");

    for path in ["/", "/metricsx", "/metrics/", "/other"] {
        let (status, _, _) = request(&metrics, "GET", path);
        assert!(status.starts_with("HTTP/1.1 404"), "GET {path}: {status}");
    }
    for method in ["POST", "PUT", "DELETE"] {
        let (status, head, _) = request(&metrics, method, "/metrics");
        assert!(status.starts_with("HTTP/1.1 405"), "{method}: {status}");
        assert!(head.contains("allow: get, head"), "{method}: {head}");
    }
}

#[test]
fn a_request_whose_head_does_not_come_is_closed_at_the_timeout() {
    let metrics = free_addr();
    let _serve = Serve::start(&["--metrics-listen", &metrics]);
    let mut stream = TcpStream::connect(&metrics).expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: loc")
        .expect("half a request");
    let sent = Instant::now();
    stream
        .set_read_timeout(Some(HEAD_TIMEOUT * 3))
        .expect("timeout");
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("not closed after {:?}: {e}", sent.elapsed()),
    }
    let after = sent.elapsed();
    assert!(
        after < HEAD_TIMEOUT + Duration::from_secs(3),
        "closed only after {after:?}"
    );
}

#[test]
fn the_metrics_port_cannot_take_the_lock_ports_descriptors() {
    const NOFILE: u64 = 64;
    let metrics = free_addr();
    let serve = Serve::start_with(&["--metrics-listen", &metrics], |command| {
        // SAFETY: setrlimit is a plain system call, safe between fork and
        // exec.
        unsafe {
            command.pre_exec(|| {
                setrlimit(Resource::RLIMIT_NOFILE, NOFILE, NOFILE).map_err(std::io::Error::from)
            });
        }
    });

    // Twice as many half-sent requests as the server may have descriptors.
    let half_sent: Vec<TcpStream> = (0..2 * NOFILE)
        .map(|_| {
            let mut stream = TcpStream::connect(&metrics).expect("connect");
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\n")
                .expect("half a request");
            stream
        })
        .collect();
    // Time for the server to accept all it would.
    thread::sleep(Duration::from_millis(500));

    // A lock client is still welcomed, well before any head timeout could
    // have freed a descriptor.
    let asked = Instant::now();
    let mut raw = Raw::connect(&serve.addr);
    raw.send("H 2 t -\n");
    let welcome = raw.line("W while the metrics port is flooded");
    let took = asked.elapsed();
    assert!(welcome.starts_with("W "), "{welcome}");
    assert!(
        took < HEAD_TIMEOUT / 2,
        "the lock port answered only after {took:?}"
    );
    raw.grant_v2(1, "k", 0, 1000);

    // Once the flood is gone, scrapes are answered again.
    drop(half_sent);
    let (status, _, _) = request(&metrics, "GET", "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
}
