//! `ticketing client` runs a script as written (CLI.md, "Commands are read
//! as they come ..."): a `release-grant`, `renew` or `auto-renew` waits for
//! the acquire it names, and is dropped with an `error` object carrying its
//! tag if that acquire is not granted; the end of input waits for every
//! outcome and every renewal's answer before it shuts the client down;
//! SIGINT and SIGTERM shut it down at once. Each script is written in one
//! piece and its input closed at once, as `printf ... | ticketing
//! client` does: the end of input comes before the connection is up.

mod cli;
mod pki;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use cli::{dead_endpoint, Client, Serve};
use nix::sys::signal::Signal;
use pki::Ca;
use serde_json::Value;
use ticketing::client::Config;
use ticketing::{Endpoint, Name};

/// The budget of the shutdown at the end of input or on a signal (CLI.md).
const STOP_BUDGET: Duration = Duration::from_millis(5000);

/// Runs `script` through a client of `endpoints`, its input closed at once;
/// every line it printed (`done` the last, exit status 0: checked).
fn run_script(endpoints: &[&str], extra: &[&str], script: &str) -> Vec<Value> {
    let mut c = Client::start(endpoints, extra);
    c.send_bytes(script.as_bytes());
    c.finish()
}

/// The lines of `all` that satisfy `pred`.
fn find(all: &[Value], pred: impl Fn(&Value) -> bool) -> Vec<&Value> {
    all.iter().filter(|v| pred(v)).collect()
}

/// The one outcome of `tag` in `all`.
fn outcome_of<'a>(all: &'a [Value], tag: &str) -> &'a Value {
    let found = find(all, |v| v["type"] == "outcome" && v["tag"] == tag);
    assert_eq!(found.len(), 1, "one outcome of {tag} in:\n{}", show(all));
    found[0]
}

/// Where the first line that satisfies `pred` is in `all`.
fn position(all: &[Value], what: &str, pred: impl Fn(&Value) -> bool) -> usize {
    all.iter()
        .position(pred)
        .unwrap_or_else(|| panic!("no {what} in:\n{}", show(all)))
}

fn show(all: &[Value]) -> String {
    all.iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Certificates for a TLS server of 127.0.0.1 and localhost, and the CA
/// that signed them, as files; removed when dropped.
struct Tls {
    dir: PathBuf,
}

impl Tls {
    fn new(test: &str) -> Tls {
        let dir = std::env::temp_dir().join(format!("ticketing-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the certificates");
        let ca = Ca::new("test CA");
        std::fs::write(dir.join("ca.pem"), ca.cert_pem()).expect("write ca.pem");
        ca.server().write(&dir, "server");
        Tls { dir }
    }

    fn path(&self, name: &str) -> String {
        let path = self.dir.join(name);
        path.to_str().expect("a UTF-8 temporary path").to_owned()
    }

    /// `ticketing serve` speaking only TLS.
    fn serve(&self) -> Serve {
        let (cert, key) = (self.path("server.pem"), self.path("server.key"));
        Serve::start(&["--tls-cert", &cert, "--tls-key", &key])
    }

    /// The options of a client that trusts the CA, as in the issue:
    /// `--tls-ca ca.pem --tls-server-name localhost`.
    fn client_args(&self) -> Vec<String> {
        let ca = self.path("ca.pem");
        ["--tls-ca", &ca, "--tls-server-name", "localhost"]
            .map(str::to_owned)
            .to_vec()
    }
}

impl Drop for Tls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The first pipeline of issue 19: 20 acquires of keys of their own, each
/// followed at once by the release of its grant, then `stats`. Every pair
/// prints `granted` and `released`, nothing is an error, and the server
/// holds none of the keys afterwards.
fn twenty_pairs(addr: &str, extra: &[&str]) {
    const PAIRS: usize = 20;
    let mut script = String::new();
    for i in 1..=PAIRS {
        script.push_str(&format!(
            "acquire a{i} k{i} o 1000 5000\nrelease-grant r{i} a{i}\n"
        ));
    }
    script.push_str("stats\n");
    let all = run_script(&[addr], extra, &script);
    for i in 1..=PAIRS {
        let (a, r, key) = (format!("a{i}"), format!("r{i}"), format!("k{i}"));
        let acquired = outcome_of(&all, &a);
        assert_eq!(acquired["outcome"], "granted", "{acquired}");
        assert_eq!(acquired["key"], key.as_str(), "{acquired}");
        let released = outcome_of(&all, &r);
        assert_eq!(released["outcome"], "released", "{released}");
        assert_eq!(released["key"], key.as_str(), "{released}");
    }
    assert!(
        find(&all, |v| v["type"] == "error").is_empty(),
        "no error:\n{}",
        show(&all)
    );
    assert_eq!(
        find(&all, |v| v["type"] == "stats").len(),
        1,
        "{}",
        show(&all)
    );
    // Released, not left to their leases: another client gets every key
    // at once.
    let mut script = String::new();
    for i in 1..=PAIRS {
        script.push_str(&format!("acquire t{i} k{i} o 0 1000\n"));
    }
    let all = run_script(&[addr], extra, &script);
    for i in 1..=PAIRS {
        let v = outcome_of(&all, &format!("t{i}"));
        assert_eq!(v["outcome"], "granted", "k{i} is free: {v}");
    }
}

#[test]
fn a_script_of_acquires_each_followed_by_its_release_releases_every_grant() {
    let serve = Serve::start(&[]);
    twenty_pairs(&serve.addr, &[]);
}

#[test]
fn a_script_of_acquires_each_followed_by_its_release_releases_every_grant_over_tls() {
    let tls = Tls::new("script-pairs");
    let serve = tls.serve();
    twenty_pairs(&serve.addr, &strs(&tls.client_args()));
}

/// The second pipeline of issue 19: `printf 'acquire a k o 1000 5000\n
/// release-grant r a\n' | ticketing client ...`. The end of input comes
/// long before the connection is up (over TLS, before the handshake is
/// done), and cancels nothing.
fn one_pair(addr: &str, extra: &[&str]) {
    let all = run_script(
        &[addr],
        extra,
        "acquire a k o 1000 5000\nrelease-grant r a\n",
    );
    let kinds: Vec<(&str, &str)> = all
        .iter()
        .filter(|v| v["type"] != "event")
        .map(|v| {
            let kind = v["type"].as_str().unwrap_or("");
            (kind, v["outcome"].as_str().unwrap_or(""))
        })
        .collect();
    let want = [
        ("outcome", "granted"),
        ("outcome", "released"),
        ("done", ""),
    ];
    assert_eq!(kinds, want, "{}", show(&all));
    assert_eq!(outcome_of(&all, "a")["key"], "k");
    assert_eq!(outcome_of(&all, "r")["key"], "k");
}

#[test]
fn the_end_of_input_before_the_connection_is_up_cancels_nothing() {
    let serve = Serve::start(&[]);
    one_pair(&serve.addr, &[]);
}

#[test]
fn the_end_of_input_before_the_tls_handshake_is_done_cancels_nothing() {
    let tls = Tls::new("script-one-pair");
    let serve = tls.serve();
    one_pair(&serve.addr, &strs(&tls.client_args()));
}

/// A client that holds `k` for 30 s, so that anyone else's acquire of it
/// waits its whole budget.
fn hold_k(serve: &Serve) -> Client {
    let mut holder = Client::start(&[&serve.addr], &[]);
    holder.send("acquire h k holder 0 30000");
    holder.granted("h", "k");
    holder
}

#[test]
fn the_lines_that_follow_an_acquire_that_times_out_are_dropped_with_their_tags() {
    let serve = Serve::start(&[]);
    let _holder = hold_k(&serve);
    let mut c = Client::start(&[&serve.addr], &[]);
    c.send_bytes(b"acquire a1 k o 200 5000\nrelease-grant r1 a1\nrenew a1\nauto-renew a1 on\n");
    let v = c.outcome_is("a1", "timed_out");
    assert_eq!(v["sent"], true, "{v}");
    let want = "acquire \"a1\" was not granted: timed_out";
    // In the order of their lines, each with its tag: the release's own,
    // the renewals' the acquire's.
    for tag in ["r1", "a1", "a1"] {
        let e = c.wait_for(&format!("the error of {tag}"), |v| v["type"] == "error");
        assert_eq!(e["tag"], tag, "{e}");
        assert_eq!(e["message"], want, "{e}");
    }
    let dropped_at = position(&c.all, "an error", |v| v["type"] == "error");
    let ended_at = position(&c.all, "a1's outcome", |v| v["tag"] == "a1");
    assert!(
        ended_at < dropped_at,
        "the lines waited for the outcome:\n{}",
        show(&c.all)
    );
    // A line that names a1 after its outcome is dropped the same way, at once.
    c.send("release-grant r2 a1");
    let e = c.wait_for("the error of r2", |v| v["type"] == "error");
    assert_eq!(e["tag"], "r2", "{e}");
    assert_eq!(e["message"], want, "{e}");
    let rest = c.finish();
    assert!(find(&rest, |v| v["type"] != "event" && v["type"] != "done").is_empty());
}

#[test]
fn a_tag_never_given_to_an_acquire_is_an_error_at_once_while_a_known_one_waits() {
    let serve = Serve::start(&[]);
    let _holder = hold_k(&serve);
    let mut c = Client::start(&[&serve.addr], &[]);
    c.send_bytes(
        b"acquire a k o 1500 5000\nrelease-grant r2 a\nrelease-grant r1 nobody\nrenew nobody\n",
    );
    let e = c.wait_for("the error of r1", |v| v["type"] == "error");
    assert_eq!(e["tag"], "r1", "{e}");
    assert_eq!(e["message"], "no acquire tagged \"nobody\"", "{e}");
    let e = c.wait_for("the error of renew nobody", |v| v["type"] == "error");
    assert_eq!(e["tag"], "nobody", "{e}");
    // Both at once: long before a's outcome, which comes with its budget.
    assert_eq!(c.count(|v| v["tag"] == "a"), 0, "{}", show(&c.all));
    c.outcome_is("a", "timed_out");
    let e = c.wait_for("the error of r2", |v| v["type"] == "error");
    assert_eq!(e["tag"], "r2", "{e}");
    assert_eq!(e["message"], "acquire \"a\" was not granted: timed_out");
    c.finish();
}

#[test]
fn the_lines_that_wait_are_at_most_as_many_as_the_client_takes_acquires() {
    // The binary leaves the core's limit as it is.
    let config = Config::new(
        [Endpoint::new("127.0.0.1:1").expect("an endpoint")],
        Name::new("ticketing-cli").expect("a name"),
    );
    let most = config.max_acquires;
    // No server: the acquire waits until it is cancelled.
    let dead = dead_endpoint();
    let mut script = String::from("acquire a k o 600000 1000\n");
    for i in 1..=most {
        script.push_str(&format!("release-grant w{i} a\n"));
    }
    script.push_str("release-grant over a\nrenew a\ncancel a\n");
    let all = run_script(&[&dead], &[], &script);
    let ended_at = position(&all, "a's outcome", |v| {
        v["tag"] == "a" && v["type"] == "outcome"
    });
    assert_eq!(all[ended_at]["outcome"], "cancelled", "{}", all[ended_at]);
    // The tags of the errors among `lines`, in order.
    let errors = |lines: &[Value]| -> Vec<String> {
        find(lines, |v| v["type"] == "error")
            .iter()
            .map(|v| v["tag"].as_str().unwrap_or("(none)").to_owned())
            .collect()
    };
    let same = |got: &[String], want: &[String], when: &str| {
        assert!(
            got == want,
            "{} errors {when} a's outcome, where {} were due; the first: {:?}",
            got.len(),
            want.len(),
            &got[..got.len().min(4)]
        );
    };
    // One more than the limit, and the renewal after it: dropped at once.
    let at_once = ["over", "a"].map(str::to_owned);
    same(&errors(&all[..ended_at]), &at_once, "before");
    let over = find(&all, |v| v["tag"] == "over")[0];
    let message = over["message"].as_str().expect("a message");
    assert!(message.contains(&most.to_string()), "{message}");
    // The rest waited, and were dropped in their order once a ended.
    let waited: Vec<String> = (1..=most).map(|i| format!("w{i}")).collect();
    same(&errors(&all[ended_at..]), &waited, "after");
}

/// A server that grants every acquire and closes the connection right
/// after, and renews every renewal; version 2 frames. So a renewal asked
/// for just after a grant goes out on the next connection.
fn closing_after_each_grant() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            thread::spawn(move || {
                let Ok(mut writer) = stream.try_clone() else {
                    return;
                };
                // After a grant the server only stops writing (a FIN) and
                // reads on until the client goes: closing with unread bytes
                // would reset the connection, which the client would see
                // as an I/O error rather than the end of the stream.
                let mut done = false;
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if done {
                        continue;
                    }
                    let f: Vec<&str> = line.split(' ').collect();
                    let (answer, close) = match f[..] {
                        ["H", ..] => ("W fake 8".to_owned(), false),
                        ["A", id, key, _, _, lease] => {
                            (format!("G {id} A {key} 7 {lease} 0"), true)
                        }
                        ["X", id, key, token, lease] => {
                            (format!("G {id} X {key} {token} {lease}"), false)
                        }
                        _ => continue,
                    };
                    if writer.write_all(format!("{answer}\n").as_bytes()).is_err() {
                        return;
                    }
                    if close {
                        let _ = writer.shutdown(std::net::Shutdown::Write);
                        done = true;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn the_end_of_input_waits_for_the_answer_to_a_renewal() {
    let addr = closing_after_each_grant();
    let all = run_script(&[&addr], &[], "acquire a k o 1000 5000\nrenew a\n");
    let a = outcome_of(&all, "a");
    assert_eq!(a["outcome"], "granted", "{}", show(&all));
    assert_eq!(a["token"], 7, "{a}");
    let renewed = find(&all, |v| v["event"] == "renewed");
    assert_eq!(renewed.len(), 1, "{}", show(&all));
    assert_eq!(renewed[0]["tag"], "a");
    assert_eq!(renewed[0]["token"], 7);
    // It came on the next connection, after the end of input.
    let closes = find(&all, |v| v["event"] == "closed");
    assert_eq!(
        closes.first().map(|v| &v["reason"]),
        Some(&Value::from("eof"))
    );
    assert!(
        find(&all, |v| v["type"] == "error").is_empty(),
        "{}",
        show(&all)
    );
}

/// How a test stops a client in the middle of its script.
#[derive(Clone, Copy, Debug)]
enum Stop {
    Signal(Signal),
    Line,
}

#[test]
fn a_signal_or_a_shutdown_line_stops_the_script_at_once() {
    let serve = Serve::start(&[]);
    let stops = [
        Stop::Signal(Signal::SIGTERM),
        Stop::Signal(Signal::SIGINT),
        Stop::Line,
    ];
    for (i, stop) in stops.into_iter().enumerate() {
        // Keys of its own: the grants still held at the end stay held.
        let (k, m) = (format!("k{i}"), format!("m{i}"));
        let mut c = Client::start(&[&serve.addr], &[]);
        c.send(&format!("acquire a1 {k} o 0 30000"));
        c.granted("a1", &k);
        // Waits 60 s for the key, and the line after it for a2. The
        // try-lock after them is answered once both lines were read.
        c.send(&format!("acquire a2 {k} o 60000 5000"));
        c.send("release-grant r2 a2");
        c.send(&format!("acquire m {m} o 0 1000"));
        c.granted("m", &m);
        let asked = Instant::now();
        match stop {
            Stop::Signal(signal) => cli::signal(c.pid(), signal),
            Stop::Line => c.send("shutdown 5000"),
        }
        let rest = c.finish_without_closing_stdin();
        let took = asked.elapsed();
        eprintln!("{stop:?}: done and exit {took:?} after");
        assert!(took < STOP_BUDGET, "{stop:?}: {took:?}");
        let a2 = outcome_of(&rest, "a2");
        assert!(
            a2["outcome"] == "cancelled" || a2["outcome"] == "indeterminate",
            "{stop:?}: {a2}"
        );
        let dropped = find(&rest, |v| v["type"] == "error");
        assert_eq!(dropped.len(), 1, "{stop:?}: {}", show(&rest));
        assert_eq!(dropped[0]["tag"], "r2", "{stop:?}: {}", dropped[0]);
    }
}

#[test]
fn an_acquire_a_misconfigured_client_refuses_times_out_unsent_with_the_cause() {
    let serve = Serve::start(&["--credential", "sesame"]);
    let mut c = Client::start(&[&serve.addr], &["--credential", "wrong"]);
    // Every server (the one) refused the credential: the client is
    // misconfigured from this close on, and refuses new acquires.
    assert_eq!(c.closed(), "auth_failed");
    c.send_bytes(b"acquire a k o 0 1000\nrelease-grant r a\n");
    let v = c.outcome_is("a", "timed_out");
    assert_eq!(v["sent"], false, "{v}");
    assert_eq!(v["cause"], "auth_failed", "{v}");
    let e = c.wait_for("the error of r", |v| v["type"] == "error");
    assert_eq!(e["tag"], "r", "{e}");
    assert_eq!(e["message"], "acquire \"a\" was not granted: timed_out");
    c.finish();
}

#[test]
fn an_acquire_made_before_the_refusal_times_out_unsent_with_the_cause() {
    let serve = Serve::start(&["--credential", "sesame"]);
    let mut c = Client::start(&[&serve.addr], &["--credential", "wrong"]);
    // Sent as the client starts, before the refusal comes back: the
    // refusal ends it, with the JSON of one refused at once (the adapter
    // says `Misconfigured` for both; CLI.md's `timed_out` stays).
    c.send_bytes(b"acquire a k o 5000 1000\nrelease-grant r a\n");
    let v = c.outcome_is("a", "timed_out");
    assert_eq!(v["sent"], false, "{v}");
    assert_eq!(v["cause"], "auth_failed", "{v}");
    let e = c.wait_for("the error of r", |v| v["type"] == "error");
    assert_eq!(e["tag"], "r", "{e}");
    assert_eq!(e["message"], "acquire \"a\" was not granted: timed_out");
    c.finish();
}

/// `ticketing demo` (CLI.md) refuses options it cannot run with, as a bad
/// command line (exit status 2), where it used to panic mid-run.
#[test]
fn demo_options_it_cannot_run_with_are_refused() {
    for bad in ["--secs=-1", "--secs=NaN", "--secs=1e30", "--keys=0"] {
        let f = cli::ticketing(&["demo", bad], cli::WAIT);
        assert_eq!(f.code, Some(2), "{bad}: {}\n{}", f.stdout, f.stderr);
        assert!(f.stderr.contains("invalid value"), "{bad}: {}", f.stderr);
        assert!(!f.stderr.contains("panicked"), "{bad}: {}", f.stderr);
    }
}
