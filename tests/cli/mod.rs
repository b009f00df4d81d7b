//! Helpers for the tests that run the built `ticketing` binary (CLI.md).
//!
//! - [`Serve`]: `ticketing serve --listen 127.0.0.1:0` as a child process;
//!   its address is read from the `listening on ADDR` line on stderr; it is
//!   killed when dropped.
//! - [`Raw`]: a raw TCP connection speaking the wire protocol line by line
//!   (version 1, or version 2 with `hello_v2`).
//! - [`Client`]: `ticketing client` as a coprocess: commands to its stdin,
//!   JSON lines from its stdout.
//! - [`Fake`]: a scripted server, for what the reference server never does.
//! - [`Proc`]: any other run of the binary (`run`, `demo`), with its output.
//!
//! Every wait is bounded (by [`WAIT`] unless told otherwise) and fails the
//! test naming what it waited for and what it saw instead.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ticketing");

/// How long any single expected thing may take before the test fails.
/// Generous: the machine is shared and slow, and a pass never waits this long.
pub const WAIT: Duration = Duration::from_secs(15);

/// Sends `signal` to the process `pid`.
pub fn signal(pid: u32, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(pid).expect("pid fits in i32"));
    kill(pid, signal).unwrap_or_else(|e| panic!("cannot send {signal} to {pid}: {e}"));
}

/// Waits for `child` to exit within `within`; kills it and fails otherwise.
pub fn wait_exit(child: &mut Child, within: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what}: still running after {within:?}");
            }
            Err(e) => panic!("{what}: cannot wait: {e}"),
        }
    }
}

/// A field of `/proc/<pid>/status` in kB, such as `VmRSS`.
pub fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status:\n{status}"))
}

/// A loopback address with a port free now, for a process that must be
/// told its port before it starts. Below the kernel's range of ephemeral
/// ports, which outgoing connections take theirs from: a port the OS had
/// just handed out could be taken by one of them (a member's peer link,
/// say) before the process binds it ("address in use"). Never the same
/// port twice in one test binary.
pub fn free_addr() -> String {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    // A different start per process, so that test binaries run side by
    // side rarely try the same ports.
    let mut port = 10_000 + (std::process::id() as u16 % 1_000) * 7;
    for _ in 0..20_000 {
        port = if port + 1 >= low { 10_000 } else { port + 1 };
        if given.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            given.insert(port);
            return listener.local_addr().expect("local addr").to_string();
        }
    }
    panic!("no free port between 10000 and {low}");
}

/// An address nobody listens on: a port the OS just handed out, closed
/// again. On 127.0.0.3, where none of the servers of these tests listen
/// (they all take 127.0.0.1), so the port cannot be taken by one of them.
pub fn dead_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.3:0").expect("bind a free port");
    let addr = listener.local_addr().expect("local addr").to_string();
    drop(listener);
    addr
}

/// The lines of a pipe, read by a thread.
pub struct Lines {
    name: String,
    rx: Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
    eof: bool,
}

impl Lines {
    pub fn new(name: impl Into<String>, pipe: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            name: name.into(),
            rx,
            seen: Vec::new(),
            eof: false,
        }
    }

    /// The next line, `None` at end of input; fails after `within`.
    pub fn next_within(&mut self, within: Duration, what: &str) -> Option<String> {
        if self.eof {
            return None;
        }
        match self.rx.recv_timeout(within) {
            Ok(line) => {
                self.seen.push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.eof = true;
                None
            }
            Err(RecvTimeoutError::Timeout) => panic!(
                "{}: no line within {within:?} while waiting for {what}; seen so far:\n{}",
                self.name,
                self.seen.join("\n")
            ),
        }
    }

    /// Reads until a line satisfies `pred`; fails at end of input or after
    /// [`WAIT`].
    pub fn until(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_within(left, what) {
                Some(line) if pred(&line) => return line,
                Some(_) => {}
                None => panic!(
                    "{}: ended while waiting for {what}; seen:\n{}",
                    self.name,
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Everything until end of input (within [`WAIT`]).
    pub fn rest(&mut self) -> Vec<String> {
        let start = self.seen.len();
        let deadline = Instant::now() + WAIT;
        while self
            .next_within(
                deadline.saturating_duration_since(Instant::now()),
                "end of output",
            )
            .is_some()
        {}
        self.seen[start..].to_vec()
    }
}

/// `ticketing serve` on a free loopback port; killed when dropped.
pub struct Serve {
    child: Child,
    /// The address from `listening on ADDR`.
    pub addr: String,
    pub stderr: Lines,
}

impl Serve {
    /// Starts `ticketing serve --listen 127.0.0.1:0 EXTRA...` and waits for
    /// `listening on ADDR`.
    pub fn start(extra: &[&str]) -> Serve {
        Serve::start_with(extra, |_| {})
    }

    /// The same, with `configure` applied to the command first (to set
    /// resource limits, say).
    pub fn start_with(extra: &[&str], configure: impl FnOnce(&mut Command)) -> Serve {
        Serve::start_on("127.0.0.1:0", extra, configure)
    }

    /// The same, listening on `listen`.
    pub fn start_on(listen: &str, extra: &[&str], configure: impl FnOnce(&mut Command)) -> Serve {
        let mut command = Command::new(BIN);
        command.args(["serve", "--listen", listen]).args(extra);
        configure(&mut command);
        Serve::spawn(command)
    }

    /// Runs `command`, a `ticketing serve` (perhaps behind a wrapper that
    /// execs it, as `ip netns exec` does), and waits for `listening on
    /// ADDR`.
    pub fn spawn(mut command: Command) -> Serve {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start ticketing serve");
        let mut stderr = Lines::new("serve stderr", child.stderr.take().expect("stderr"));
        let line = stderr.until("`listening on ADDR`", |l| l.starts_with("listening on "));
        let addr = line["listening on ".len()..].trim().to_string();
        Serve {
            child,
            addr,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: Signal) {
        signal(self.pid(), sig);
    }

    /// Waits for the server to exit (after a signal).
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        wait_exit(&mut self.child, within, "ticketing serve")
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Kills the server at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A raw TCP connection to a server, read line by line.
pub struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// How a raw connection ended, or did not.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    Closed,
    Line(String),
}

impl Raw {
    pub fn connect(addr: &str) -> Raw {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_nodelay(true).expect("nodelay");
        Raw {
            stream,
            buf: Vec::new(),
        }
    }

    /// Writes `text` as is (add the `\n` yourself).
    pub fn send(&mut self, text: &str) {
        self.send_bytes(text.as_bytes());
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("write {:?}: {e}", String::from_utf8_lossy(bytes)));
    }

    /// Writes what it can; the peer may already have closed.
    pub fn send_lossy(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes);
    }

    /// The next line (without `\n`), or the end of the connection.
    pub fn next(&mut self, what: &str) -> End {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return End::Line(String::from_utf8_lossy(&line[..i]).into_owned());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no line within {WAIT:?} while waiting for {what}; partial: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
            self.stream.set_read_timeout(Some(left)).expect("timeout");
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    assert!(
                        self.buf.is_empty(),
                        "connection ended in the middle of a line: {:?}",
                        String::from_utf8_lossy(&self.buf)
                    );
                    return End::Closed;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                    ) =>
                {
                    return End::Closed
                }
                Err(e) => panic!("read while waiting for {what}: {e}"),
            }
        }
    }

    /// The next line; fails if the connection ends instead.
    pub fn line(&mut self, what: &str) -> String {
        match self.next(what) {
            End::Line(line) => line,
            End::Closed => panic!("connection closed while waiting for {what}"),
        }
    }

    /// Expects exactly `want` as the next line.
    pub fn expect(&mut self, want: &str) {
        let got = self.line(want);
        assert_eq!(got, want, "expected {want:?}, got {got:?}");
    }

    /// Expects the server to close the connection with nothing more said.
    pub fn expect_closed(&mut self, what: &str) {
        match self.next(what) {
            End::Closed => {}
            End::Line(line) => panic!("{what}: expected the connection to close, got {line:?}"),
        }
    }

    /// `H 1 test -`; expects `W`, returns its node id and window.
    pub fn hello(&mut self) -> (String, u64) {
        self.send("H 1 test -\n");
        let w = self.line("W after H");
        let fields: Vec<&str> = w.split(' ').collect();
        assert!(
            fields.len() == 3 && fields[0] == "W",
            "expected `W <node> <window>`, got {w:?}"
        );
        (
            fields[1].to_string(),
            fields[2].parse().expect("window is a number"),
        )
    }

    /// Sends `A id key owner wait lease`; expects `G`, returns (token, lease_ms).
    pub fn grant(&mut self, id: u64, key: &str, wait_ms: u64, lease_ms: u64) -> (u64, u64) {
        self.send(&format!("A {id} {key} test {wait_ms} {lease_ms}\n"));
        let g = self.line("G");
        let fields: Vec<&str> = g.split(' ').collect();
        let prefix = format!("G {id} A {key} ");
        assert!(
            g.starts_with(&prefix) && fields.len() == 6,
            "expected `{prefix}<token> <lease>`, got {g:?}"
        );
        (
            fields[4].parse().expect("token"),
            fields[5].parse().expect("lease"),
        )
    }

    /// `H 2 test -` (protocol version 2); expects `W`.
    pub fn hello_v2(&mut self) {
        self.send("H 2 test -\n");
        let w = self.line("W after H 2");
        assert!(
            w.starts_with("W "),
            "expected `W <node> <window>`, got {w:?}"
        );
    }

    /// Reads a version 2 grant `G id A key <token> <lease> <waited>` of
    /// request `id`; returns (token, waited_ms).
    pub fn granted_v2(&mut self, id: u64, key: &str) -> (u64, u64) {
        let g = self.line("G");
        let fields: Vec<&str> = g.split(' ').collect();
        let prefix = format!("G {id} A {key} ");
        assert!(
            g.starts_with(&prefix) && fields.len() == 7,
            "expected `{prefix}<token> <lease> <waited>`, got {g:?}"
        );
        (
            fields[4].parse().expect("token"),
            fields[6].parse().expect("waited"),
        )
    }

    /// Sends `A id key owner wait lease` on a version 2 connection; expects
    /// `G` at once, returns its token.
    pub fn grant_v2(&mut self, id: u64, key: &str, wait_ms: u64, lease_ms: u64) -> u64 {
        self.send(&format!("A {id} {key} test {wait_ms} {lease_ms}\n"));
        self.granted_v2(id, key).0
    }

    /// Half-closes the writing side.
    pub fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

/// `ticketing client` as a coprocess.
pub struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Lines,
    /// Its standard error, when captured ([`Client::start_capturing`]).
    pub stderr: Option<Lines>,
    /// Every JSON object printed so far, in order.
    pub all: Vec<Value>,
    /// Printed and not yet claimed by a `wait_for`.
    backlog: Vec<Value>,
    started: Instant,
}

impl Client {
    /// `ticketing client --endpoint E... EXTRA...`, its standard error
    /// the test's.
    pub fn start(endpoints: &[&str], extra: &[&str]) -> Client {
        Client::spawn(endpoints, extra, false, |_| {})
    }

    /// The same, its standard error captured in [`Client::stderr`].
    pub fn start_capturing(endpoints: &[&str], extra: &[&str]) -> Client {
        Client::spawn(endpoints, extra, true, |_| {})
    }

    /// The same, with `configure` applied to the command first (to set
    /// its environment, say).
    pub fn start_capturing_with(
        endpoints: &[&str],
        extra: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Client {
        Client::spawn(endpoints, extra, true, configure)
    }

    fn spawn(
        endpoints: &[&str],
        extra: &[&str],
        capture: bool,
        configure: impl FnOnce(&mut Command),
    ) -> Client {
        let mut cmd = Command::new(BIN);
        configure(&mut cmd);
        cmd.arg("client");
        for e in endpoints {
            cmd.args(["--endpoint", e]);
        }
        let mut child = cmd
            .args(["--seed", "1"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if capture {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .spawn()
            .expect("start ticketing client");
        let stdin = child.stdin.take();
        let out = Lines::new("client stdout", child.stdout.take().expect("stdout"));
        let stderr = child
            .stderr
            .take()
            .map(|pipe| Lines::new("client stderr", pipe));
        Client {
            child,
            stdin,
            out,
            stderr,
            all: Vec::new(),
            backlog: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Writes one command line.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is still open");
        writeln!(stdin, "{line}").unwrap_or_else(|e| panic!("write {line:?}: {e}"));
        stdin.flush().expect("flush");
    }

    /// Writes `bytes` to stdin as they are (add the `\n` yourself).
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is still open");
        stdin
            .write_all(bytes)
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("write {} bytes to the client: {e}", bytes.len()));
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn parse(line: &str) -> Value {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("client printed a line that is not JSON ({e}): {line:?}"));
        assert!(value.is_object(), "not a JSON object: {line}");
        assert!(
            value["type"].is_string(),
            "a line without a string \"type\": {line}"
        );
        value
    }

    fn history(&self) -> String {
        self.all
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The first line, printed earlier or from now on, that satisfies
    /// `pred` and was not claimed before; fails after `within`.
    pub fn wait_for_within(
        &mut self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        match self.next_matching(within, what, pred) {
            Some(value) => value,
            None => panic!(
                "client: no {what} within {within:?}; printed so far:\n{}",
                self.history()
            ),
        }
    }

    /// The same, `None` when `within` passes first.
    pub fn next_matching(
        &mut self,
        within: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        if let Some(i) = self.backlog.iter().position(&pred) {
            return Some(self.backlog.remove(i));
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.out.rx.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "client: output ended while waiting for {what}; printed:\n{}",
                    self.history()
                ),
            };
            self.out.seen.push(line.clone());
            let value = Client::parse(&line);
            self.all.push(value.clone());
            if pred(&value) {
                return Some(value);
            }
            self.backlog.push(value);
        }
    }

    pub fn wait_for(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_for_within(WAIT, what, pred)
    }

    /// The outcome of the operation `tag`.
    pub fn outcome(&mut self, tag: &str) -> Value {
        let v = self.wait_for(&format!("the outcome of {tag}"), |v| {
            v["type"] == "outcome" && v["tag"] == tag
        });
        assert!(v["op"].is_string() && v["key"].is_string(), "{v}");
        v
    }

    /// The outcome of `tag`, which must be `want`.
    pub fn outcome_is(&mut self, tag: &str, want: &str) -> Value {
        let v = self.outcome(tag);
        assert_eq!(
            v["outcome"],
            want,
            "{tag}: expected {want}, got {v}; printed:\n{}",
            self.history()
        );
        v
    }

    /// The acquire `tag` must be granted on `key`; returns (token, lease_ms).
    pub fn granted(&mut self, tag: &str, key: &str) -> (u64, u64) {
        let v = self.outcome_is(tag, "granted");
        assert_eq!(v["op"], "acquire", "{v}");
        assert_eq!(v["key"], key, "{v}");
        (
            v["token"].as_u64().expect("token is a u64"),
            v["lease_ms"].as_u64().expect("lease_ms is a u64"),
        )
    }

    /// The next unclaimed event `name` (with any other fields).
    pub fn event(&mut self, name: &str) -> Value {
        self.wait_for(&format!("event {name}"), |v| {
            v["type"] == "event" && v["event"] == name
        })
    }

    /// The next unclaimed `closed` event; returns its reason.
    pub fn closed(&mut self) -> String {
        let v = self.event("closed");
        v["reason"]
            .as_str()
            .expect("reason is a string")
            .to_string()
    }

    /// The next unclaimed `error` object; returns its message.
    pub fn error(&mut self) -> String {
        let v = self.wait_for("an error object", |v| v["type"] == "error");
        v["message"].as_str().expect("message").to_string()
    }

    /// Reads what the client printed so far without waiting, and leaves
    /// none of it to be claimed: a later `wait_for` sees only what comes
    /// after this call.
    pub fn forget_printed(&mut self) {
        while let Ok(line) = self.out.rx.try_recv() {
            self.out.seen.push(line.clone());
            self.all.push(Client::parse(&line));
        }
        self.backlog.clear();
    }

    /// Lines printed so far that satisfy `pred` (claimed or not).
    pub fn count(&self, pred: impl Fn(&Value) -> bool) -> usize {
        self.all.iter().filter(|v| pred(v)).count()
    }

    /// Time since the client was started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Closes stdin (end of input); everything printed afterwards, then
    /// asserts that `done` is the last line and the exit status is 0.
    /// The holder's end: it was never told that a lease of its ended
    /// (`lease_lost`, `lease_expired`), and its grant of acquire `tag` is
    /// still the current one, released by its token; then the client ends.
    pub fn kept_and_released(mut self, tag: &str) {
        let lost = self.count(|v| {
            v["type"] == "event" && (v["event"] == "lease_lost" || v["event"] == "lease_expired")
        });
        assert_eq!(
            lost, 0,
            "the holder was told its lease ended: {:?}",
            self.all
        );
        self.send(&format!("release-grant r1 {tag}"));
        self.outcome_is("r1", "released");
        self.finish();
    }

    pub fn finish(mut self) -> Vec<Value> {
        drop(self.stdin.take());
        self.drain_to_exit()
    }

    /// After a `shutdown` command: stdin stays open; the client must still
    /// print `done` and exit 0.
    pub fn finish_without_closing_stdin(mut self) -> Vec<Value> {
        self.drain_to_exit()
    }

    fn drain_to_exit(&mut self) -> Vec<Value> {
        let start = self.all.len();
        for line in self.out.rest() {
            let value = Client::parse(&line);
            self.all.push(value.clone());
            self.backlog.push(value);
        }
        let rest = self.all[start..].to_vec();
        assert_eq!(
            self.all.last().map(|v| v["type"].clone()),
            Some(Value::from("done")),
            "`done` must be the last line; printed:\n{}",
            self.history()
        );
        assert_eq!(
            self.count(|v| v["type"] == "done"),
            1,
            "exactly one `done`; printed:\n{}",
            self.history()
        );
        let status = wait_exit(&mut self.child, WAIT, "ticketing client");
        assert!(status.success(), "client exit status {status}");
        rest
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scripted server: each line a connection receives is answered with the
/// lines `respond` returns (each sent with `\n`). Connections stay open
/// until the peer closes them.
pub struct Fake {
    pub addr: String,
}

impl Fake {
    pub fn start(respond: fn(&str) -> Vec<String>) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                thread::spawn(move || {
                    let Ok(mut writer) = stream.try_clone() else {
                        return;
                    };
                    for line in BufReader::new(stream).lines() {
                        let Ok(line) = line else { break };
                        for answer in respond(&line) {
                            if writer.write_all(format!("{answer}\n").as_bytes()).is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Fake { addr }
    }
}

/// Another run of the binary, its output read by threads.
pub struct Proc {
    child: Child,
    pub stdout: Lines,
    pub stderr: Lines,
    started: Instant,
}

impl Proc {
    pub fn start(args: &[&str]) -> Proc {
        Proc::start_with(args, |_| {})
    }

    /// The same, with `configure` applied to the command first.
    pub fn start_with(args: &[&str], configure: impl FnOnce(&mut Command)) -> Proc {
        let mut command = Command::new(BIN);
        configure(&mut command);
        let mut child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start ticketing {args:?}: {e}"));
        let stdout = Lines::new(
            format!("stdout of {args:?}"),
            child.stdout.take().expect("stdout"),
        );
        let stderr = Lines::new(
            format!("stderr of {args:?}"),
            child.stderr.take().expect("stderr"),
        );
        Proc {
            child,
            stdout,
            stderr,
            started: Instant::now(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the exit within `within`; returns the status and how long
    /// the process ran.
    pub fn wait(&mut self, within: Duration) -> (ExitStatus, Duration) {
        let status = wait_exit(&mut self.child, within, "ticketing");
        (status, self.started.elapsed())
    }

    /// Waits for the exit, then collects the rest of both outputs.
    pub fn finish(mut self, within: Duration) -> Finished {
        let (status, elapsed) = self.wait(within);
        self.stdout.rest();
        self.stderr.rest();
        Finished {
            code: status.code(),
            elapsed,
            stdout: self.stdout.seen.join("\n"),
            stderr: self.stderr.seen.join("\n"),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process that ended.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub elapsed: Duration,
    pub stdout: String,
    pub stderr: String,
}

/// `ticketing ARGS...` to its end, within `within`.
pub fn ticketing(args: &[&str], within: Duration) -> Finished {
    Proc::start(args).finish(within)
}

/// The body of `GET /metrics`.
pub fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}
