//! `ticketing::serve`, the server core on tokio and TCP, over real loopback
//! sockets, for what only a driver that holds sockets can get wrong
//! (`tests/cli_serve.rs` runs the same adapter as `ticketing serve`).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use ticketing::serve::RETIRE_TIMEOUT;
use ticketing::server::{Config, Role, Server};
use ticketing::{Name, Time};

/// How long any single expected thing may take before the test fails.
const WAIT: Duration = Duration::from_secs(15);

/// Writes `R` requests and reads nothing until the socket has taken nothing
/// for 2 s in a row: the server stopped reading and TCP pushes back.
/// Returns how many requests got out whole.
fn flood_until_pushback(stream: &mut TcpStream) -> u64 {
    stream
        .set_write_timeout(Some(Duration::from_millis(500)))
        .expect("write timeout");
    let started = Instant::now();
    let mut pending = Vec::new();
    let mut id = 1u64;
    let mut stuck_since = None::<Instant>;
    loop {
        assert!(
            started.elapsed() < 4 * WAIT,
            "TCP never pushed back: the server reads what it cannot answer"
        );
        if pending.is_empty() {
            for _ in 0..4096 {
                writeln!(pending, "R {id} k 1").expect("format");
                id += 1;
            }
        }
        match stream.write(&pending) {
            Ok(n) => {
                pending.drain(..n);
                stuck_since = None;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                let since = *stuck_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(2) {
                    // The requests of `pending` are not all out.
                    let unsent = pending.iter().filter(|&&b| b == b'\n').count() as u64;
                    return id - 1 - unsent;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("flood: {e}"),
        }
    }
}

#[test]
fn a_closed_connection_whose_peer_reads_nothing_is_let_go_after_the_retire_timeout() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let core = Server::new(Config::new(Name::new("n1").unwrap()), Time::ZERO).unwrap();
    let handle = runtime
        .block_on(ticketing::serve::bind("127.0.0.1:0", core))
        .expect("bind");

    let mut client = TcpStream::connect(handle.local_addr()).expect("connect");
    client.write_all(b"H 1 c -\n").expect("write H");
    let mut w = [0u8; 8];
    client.read_exact(&mut w).expect("read W");
    assert_eq!(&w, b"W n1 64\n");
    // The server has answers for it that no socket buffer has room for.
    let requests = flood_until_pushback(&mut client);

    // The server closes it, with answers and a farewell still to write,
    // and the peer goes on reading nothing.
    let closed = Instant::now();
    handle.set_role(Role::NotActive);
    let reset = loop {
        // The server lets go of the socket with the flood unread: the
        // kernel resets the connection.
        if let Some(e) = client.take_error().expect("SO_ERROR") {
            break e;
        }
        assert!(
            closed.elapsed() < RETIRE_TIMEOUT + WAIT,
            "the server still holds the connection {:?} after closing it",
            closed.elapsed()
        );
        thread::sleep(Duration::from_millis(20));
    };
    let held = closed.elapsed();
    assert!(
        held >= RETIRE_TIMEOUT,
        "let go after {held:?}, before the retire timeout ({RETIRE_TIMEOUT:?}): {reset}"
    );

    // What the peer can still read is what reached it before: the rest,
    // the farewell last, was given up.
    client.set_read_timeout(Some(WAIT)).expect("read timeout");
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match client.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read after the reset: {e}"),
        }
    }
    let answers = got.iter().filter(|&&b| b == b'\n').count() as u64;
    eprintln!(
        "{requests} requests out; let go after {held:?} ({reset}); {answers} answers had reached the peer"
    );
    assert!(
        !got.ends_with(b"E not_active\n"),
        "the farewell came through: nothing was given up"
    );
    assert!(
        answers < requests,
        "{answers} answers for {requests} requests"
    );
    drop(handle);
}
