//! Release on drop that holds (issue 23): a program that returns from
//! `main` holding a guard leaves its key free within 100 ms of its exit,
//! with the tokio adapter (the guard in `main`, or in a task the runtime
//! drops) and with the blocking adapter, over TCP and over TLS.
//!
//! Each program is a real process: this test binary started again as a
//! child, in which one test (`child_process_entry_point`) runs a client
//! that locks [`KEYS`] keys with a 30 s lease, prints their tokens, and
//! returns holding them all (so that a release left to chance loses the
//! race with the exit at least once), as a
//! `main` would (the tokio ones through a real `#[tokio::main]`), after
//! which the process ends at once, as after `main`. The
//! server is a real `ticketing serve`; after the child has exited, a raw
//! client (a plain socket, or rustls over one) asks for every key with a
//! wait of 100 ms and must be granted each.
//!
//! On the code before issue 23 the child's grant stayed for its whole
//! lease: the probe got `T`.

mod cli;
mod pki;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cli::{wait_exit, Lines, Serve, WAIT};
use pki::Ca;
use ticketing::client::Config;
use ticketing::tls::{rustls, ClientTls};
use ticketing::{Endpoint, Key, Name};

/// The child's mode (`tokio`, `tokio-task`, `blocking`); unset in the
/// test run itself.
const MODE: &str = "TICKETING_EXIT_MODE";
/// The server's address.
const ADDR: &str = "TICKETING_EXIT_ADDR";
/// The CA file to trust: TLS when set.
const CA: &str = "TICKETING_EXIT_CA";

/// The lease the child asks for: far longer than the test, so that only a
/// release frees the key in time.
const LEASE: Duration = Duration::from_secs(30);

/// How many keys the child holds as it returns.
const KEYS: usize = 8;

fn key(n: usize) -> Key {
    Key::new(format!("k{n}")).expect("a key")
}

// ----- the child --------------------------------------------------------

/// Not a test of its own: the body of the child processes the tests
/// below start. In the test run itself (no mode set) it does nothing.
#[test]
fn child_process_entry_point() {
    let Ok(mode) = std::env::var(MODE) else {
        return;
    };
    let addr = std::env::var(ADDR).expect("the server's address");
    let config = Config::new(
        [Endpoint::new(addr).expect("an endpoint")],
        Name::new("exiting").expect("a name"),
    );
    let tls = std::env::var(CA).ok().map(|ca| {
        ClientTls::builder()
            .ca_file(ca)
            .expect("the CA file")
            .build()
            .expect("a client TLS")
    });
    match mode.as_str() {
        "tokio" => hold_with_tokio(config, tls, false),
        "tokio-task" => hold_with_tokio(config, tls, true),
        "blocking" => hold_with_blocking(config, tls),
        other => panic!("no mode {other}"),
    }
    // What follows a `main` that returns: the process ends, at once (the
    // test harness would report first, giving threads time to finish).
    std::process::exit(0);
}

/// Locks `k` and returns from a `#[tokio::main]` holding the guard: in
/// the function's scope, or (`in_task`) in a task that never ends, which
/// the runtime drops as it goes away.
#[tokio::main]
async fn hold_with_tokio(config: Config, tls: Option<ClientTls>, in_task: bool) {
    use ticketing::tokio::{spawn, TcpConnector, TlsConnector};
    let handle = match tls {
        Some(tls) => spawn(config, TlsConnector::new(tls)),
        None => spawn(config, TcpConnector),
    }
    .expect("a client");
    let mut leases = Vec::new();
    for n in 0..KEYS {
        let lease = handle
            .lock(key(n))
            .wait(Duration::from_secs(5))
            .lease(LEASE);
        leases.push(lease.await.expect("the lock"));
    }
    let tokens: Vec<String> = leases.iter().map(|l| l.token().to_string()).collect();
    println!("locked {}", tokens.join(" "));
    if in_task {
        tokio::spawn(async move {
            let _held = leases;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
    }
}

/// Locks `k` and returns holding the guard.
fn hold_with_blocking(config: Config, tls: Option<ClientTls>) {
    use ticketing::blocking::{connect, TcpConnector, TlsConnector};
    let handle = match tls {
        Some(tls) => connect(config, TlsConnector::new(tls)),
        None => connect(config, TcpConnector),
    }
    .expect("a client");
    let leases: Vec<_> = (0..KEYS)
        .map(|n| {
            let lease = handle
                .lock(key(n))
                .wait(Duration::from_secs(5))
                .lease(LEASE);
            lease.send().expect("the lock")
        })
        .collect();
    let tokens: Vec<String> = leases.iter().map(|l| l.token().to_string()).collect();
    println!("locked {}", tokens.join(" "));
}

// ----- the probe ----------------------------------------------------------

trait Stream: Read + Write {}
impl<S: Read + Write> Stream for S {}

/// A raw client: protocol lines over a socket, or over rustls.
struct Probe {
    stream: BufReader<Box<dyn Stream>>,
}

impl Probe {
    fn connect(addr: &str, ca: Option<&Ca>) -> Probe {
        let socket = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        socket.set_nodelay(true).expect("nodelay");
        socket.set_read_timeout(Some(WAIT)).expect("a read timeout");
        let stream: Box<dyn Stream> = match ca {
            None => Box::new(socket),
            Some(ca) => {
                let config = rustls::ClientConfig::builder()
                    .with_root_certificates(ca.roots())
                    .with_no_client_auth();
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1")
                    .expect("a server name")
                    .to_owned();
                let session =
                    rustls::ClientConnection::new(Arc::new(config), name).expect("a TLS session");
                Box::new(rustls::StreamOwned::new(session, socket))
            }
        };
        let mut probe = Probe {
            stream: BufReader::new(stream),
        };
        probe.send("H 2 probe -\n");
        let welcome = probe.line();
        assert!(welcome.starts_with("W "), "{welcome:?}");
        probe
    }

    fn send(&mut self, line: &str) {
        let stream = self.stream.get_mut();
        stream.write_all(line.as_bytes()).expect("write");
        stream.flush().expect("flush");
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stream.read_line(&mut line).expect("a line");
        line.trim_end().to_owned()
    }
}

// ----- the tests ------------------------------------------------------------

/// A directory for one test's certificates, removed when dropped.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the child in `mode` against a `ticketing serve` (over TLS with
/// `tls`), and checks that once it has exited the key is free within
/// 100 ms.
fn released_at_exit(mode: &str, tls: bool) {
    let dir = Dir(std::env::temp_dir().join(format!(
        "ticketing-exit-{mode}-{tls}-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&dir.0).expect("a directory");
    let ca = Ca::new("exit CA");
    let ca_file = dir.0.join("ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).expect("write ca.pem");
    let (cert, key) = ca.server().write(&dir.0, "server");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let serve = match tls {
        true => Serve::start(&["--tls-cert", &cert, "--tls-key", &key]),
        false => Serve::start(&[]),
    };

    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    command
        .args(["--exact", "child_process_entry_point", "--nocapture"])
        .env(MODE, mode)
        .env(ADDR, &serve.addr)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if tls {
        command.env(CA, &ca_file);
    }
    let mut child = command.spawn().expect("start the child");
    let mut out = Lines::new(
        format!("{mode} child"),
        child.stdout.take().expect("stdout"),
    );
    let locked = out.until("the child's locks", |l| l.starts_with("locked "));
    let tokens: Vec<u64> = locked["locked ".len()..]
        .split(' ')
        .map(|t| t.parse().expect("a token"))
        .collect();
    assert_eq!(tokens.len(), KEYS, "{locked}");
    // Connected before the child ends, so that the ask below goes out as
    // soon as it has.
    let mut probe = Probe::connect(&serve.addr, tls.then_some(&ca));
    let status = wait_exit(&mut child, WAIT, mode);
    assert!(status.success(), "the child failed: {status}");

    let asks: String = (0..KEYS)
        .map(|n| format!("A {n} k{n} probe 100 1000\n"))
        .collect();
    probe.send(&asks);
    let mut held = Vec::new();
    for _ in 0..KEYS {
        let answer = probe.line();
        let fields: Vec<&str> = answer.split(' ').collect();
        match (
            fields[0],
            fields.get(1).and_then(|n| n.parse::<usize>().ok()),
        ) {
            ("G", Some(n)) if n < KEYS => {
                let probed: u64 = fields[4].parse().expect("a token");
                assert!(probed > tokens[n], "{answer:?} after token {}", tokens[n]);
            }
            _ => held.push(answer),
        }
    }
    assert!(
        held.is_empty(),
        "[{mode}, tls {tls}] keys of a program that returned from main holding them \
         were not free within 100 ms of its exit: {held:?}"
    );
}

#[test]
fn tokio_main_returning_with_a_guard_frees_its_key() {
    released_at_exit("tokio", false);
}

#[test]
fn tokio_main_returning_with_a_guard_in_a_task_frees_its_key() {
    released_at_exit("tokio-task", false);
}

#[test]
fn blocking_main_returning_with_a_guard_frees_its_key() {
    released_at_exit("blocking", false);
}

#[test]
fn tokio_main_returning_with_a_guard_frees_its_key_over_tls() {
    released_at_exit("tokio", true);
}

#[test]
fn tokio_main_returning_with_a_guard_in_a_task_frees_its_key_over_tls() {
    released_at_exit("tokio-task", true);
}

#[test]
fn blocking_main_returning_with_a_guard_frees_its_key_over_tls() {
    released_at_exit("blocking", true);
}
