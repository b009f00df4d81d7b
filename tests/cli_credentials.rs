//! Credentials in the binary (issue 20, item 8): refused handshakes are
//! counted and said (never the credential), `ticketing run` keeps the
//! credential from its command, and `ticketing serve` says what an address
//! beyond this machine leaves open.

mod cli;
mod pki;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use cli::{free_addr, Proc, Raw, Serve, WAIT};

/// The credential the servers require: distinctive, so that a line that
/// shows it is found.
const CREDENTIAL: &str = "open-sesame-7f3a";

/// A wrong one, as distinctive.
const GUESS: &str = "guess-b29c";

/// The value of the sample `name` (no labels) in a scrape of `addr`.
fn sample(addr: &str, name: &str) -> Option<f64> {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    answer
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Connects and presents `credential`: refused.
fn refused(addr: &str, credential: &str) {
    let mut raw = Raw::connect(addr);
    raw.send(&format!("H 2 t {credential}\n"));
    raw.expect("E auth_failed");
}

#[test]
fn refused_handshakes_are_counted_and_said_without_the_credential() {
    let metrics = free_addr();
    let mut serve = Serve::start(&["--credential", CREDENTIAL, "--metrics-listen", &metrics]);
    refused(&serve.addr, GUESS);
    let first = serve
        .stderr
        .until("the refusal said", |l| l.contains("wrong credential"));
    assert!(
        first.contains("1 since the last report, 1 in all"),
        "{first}"
    );

    // A burst, and no credential at all: said once more, together, not
    // once each.
    for _ in 0..19 {
        refused(&serve.addr, GUESS);
    }
    refused(&serve.addr, "-");
    let mut welcome = Raw::connect(&serve.addr);
    welcome.send(&format!("H 2 t {CREDENTIAL}\n"));
    assert!(welcome.line("W").starts_with("W "));
    let name = "ticketing_server_auth_failures_total";
    let start = Instant::now();
    while sample(&metrics, name) != Some(21.0) {
        assert!(
            start.elapsed() < WAIT,
            "{name}: {:?}",
            sample(&metrics, name)
        );
        thread::sleep(Duration::from_millis(200));
    }
    let next = serve
        .stderr
        .until("the burst said", |l| l.contains("wrong credential"));
    assert!(
        next.contains("20 since the last report, 21 in all"),
        "{next}"
    );
    let said = serve
        .stderr
        .seen
        .iter()
        .filter(|l| l.contains("wrong credential"))
        .count();
    assert_eq!(said, 2, "{:?}", serve.stderr.seen);
    for seen in &serve.stderr.seen {
        assert!(
            !seen.contains(CREDENTIAL) && !seen.contains(GUESS),
            "a credential on stderr: {seen}"
        );
    }
}

#[test]
fn run_does_not_hand_the_credential_to_its_command() {
    let serve = Serve::start(&["--credential", CREDENTIAL]);
    let mut run = Proc::start_with(
        &[
            "run",
            "--endpoint",
            &serve.addr,
            "--key",
            "k",
            "--",
            "sh",
            "-c",
            "echo \"credential=${TICKETING_CREDENTIAL-none} token=${TICKETING_TOKEN-none}\"",
        ],
        |command| {
            command.env("TICKETING_CREDENTIAL", CREDENTIAL);
        },
    );
    let line = run
        .stdout
        .until("the command's line", |l| l.starts_with("credential="));
    let (status, _) = run.wait(WAIT);
    assert!(status.success(), "{status}");
    assert!(line.starts_with("credential=none token="), "{line}");
    assert!(!line.ends_with("token=none"), "the token is given: {line}");
}

/// The lines `ticketing serve --listen LISTEN EXTRA...` says before it
/// listens.
fn start_lines(listen: &str, extra: &[&str]) -> Vec<String> {
    let serve = Serve::start_on(listen, extra, |_| {});
    serve.stderr.seen.clone()
}

fn warned(lines: &[String], what: &str) -> bool {
    lines
        .iter()
        .any(|l| l.contains("warning") && l.contains(what))
}

#[test]
fn serve_beyond_loopback_says_what_its_options_leave_open() {
    let open = start_lines("0.0.0.0:0", &[]);
    assert!(warned(&open, "no --credential"), "{open:?}");

    let clear = start_lines("0.0.0.0:0", &["--credential", CREDENTIAL]);
    assert!(warned(&clear, "in the clear"), "{clear:?}");
    assert!(!warned(&clear, "no --credential"), "{clear:?}");
    assert!(!clear.iter().any(|l| l.contains(CREDENTIAL)), "{clear:?}");

    let dir = std::env::temp_dir().join(format!("ticketing-cli-creds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let ca = pki::Ca::new("test CA");
    let (cert, key) = ca.server().write(&dir, "server");
    let (cert, key) = (cert.to_str().expect("UTF-8"), key.to_str().expect("UTF-8"));
    let tls = [
        "--credential",
        CREDENTIAL,
        "--tls-cert",
        cert,
        "--tls-key",
        key,
    ];
    let closed = start_lines("0.0.0.0:0", &tls);
    assert!(!closed.iter().any(|l| l.contains("warning")), "{closed:?}");
    let _ = std::fs::remove_dir_all(&dir);

    // On loopback, neither: nobody else can reach it.
    for extra in [&[][..], &["--credential", CREDENTIAL][..]] {
        let local = start_lines("127.0.0.1:0", extra);
        assert!(!local.iter().any(|l| l.contains("warning")), "{local:?}");
    }
}

/// The members' credential in the environment, where single servers run
/// too: a single server starts, and takes no notice of it.
#[test]
fn a_single_server_starts_with_the_members_credential_in_its_environment() {
    let mut serve = Serve::start_with(&[], |command| {
        command.env("TICKETING_RAFT_CREDENTIAL", CREDENTIAL);
    });
    let mut raw = Raw::connect(&serve.addr);
    raw.send("H 2 t -\n");
    assert!(raw.line("W").starts_with("W "));
    serve.kill();
}
