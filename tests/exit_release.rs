//! Release on drop that holds (issue 23): a program that returns from
//! `main` holding a guard leaves its key free within 100 ms of its exit,
//! with the tokio adapter (the guard in `main`, or in a task the runtime
//! drops) and with the blocking adapter, over TCP and over TLS.
//!
//! Each program is a real process: this test binary started again as a
//! child, in which one test (`child_process_entry_point`) runs a client
//! that locks `k` with a 30 s lease, prints its token, and returns, as a
//! `main` would (the tokio ones through a real `#[tokio::main]`). The
//! server is a real `ticketing serve`; after the child has exited, a raw
//! client (a plain socket, or rustls over one) asks for `k` with a wait of
//! 100 ms and must be granted it.
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
    let lease = handle
        .lock(Key::new("k").expect("a key"))
        .wait(Duration::from_secs(5))
        .lease(LEASE)
        .await
        .expect("the lock");
    println!("locked {}", lease.token());
    if in_task {
        tokio::spawn(async move {
            let _held = lease;
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
    let lease = handle
        .lock(Key::new("k").expect("a key"))
        .wait(Duration::from_secs(5))
        .lease(LEASE)
        .send()
        .expect("the lock");
    println!("locked {}", lease.token());
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
    let locked = out.until("the child's lock", |l| l.starts_with("locked "));
    let token: u64 = locked["locked ".len()..].parse().expect("a token");
    // Connected before the child ends, so that the ask below goes out as
    // soon as it has.
    let mut probe = Probe::connect(&serve.addr, tls.then_some(&ca));
    let status = wait_exit(&mut child, WAIT, mode);
    assert!(status.success(), "the child failed: {status}");

    probe.send("A 1 k probe 100 1000\n");
    let answer = probe.line();
    let fields: Vec<&str> = answer.split(' ').collect();
    assert!(
        answer.starts_with("G 1 A k "),
        "[{mode}, tls {tls}] the key of a program that returned from main holding it \
         was not free within 100 ms of its exit: {answer:?}"
    );
    let probed: u64 = fields[4].parse().expect("a token");
    assert!(probed > token, "{answer:?} after token {token}");
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
