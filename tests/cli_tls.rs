//! The binary over TLS (CLI.md): `ticketing serve --tls-cert --tls-key
//! --tls-client-ca` with `ticketing client` and `ticketing run` speaking
//! TLS, the close reasons of the ways a session can fail to start, and a
//! credential that appears in none of the binary's output, nor, when it
//! comes from the environment, on any command line.

mod cli;
mod pki;

use std::path::{Path, PathBuf};

use cli::{ticketing, Client, Serve, WAIT};
use pki::Ca;
use serde_json::Value;

/// A directory of PEM files for one test, removed when dropped.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(test: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("ticketing-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the certificates");
        Files { dir }
    }

    fn path(&self, name: &str) -> String {
        path_str(&self.dir.join(name))
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn path_str(path: &Path) -> String {
    path.to_str().expect("a UTF-8 temporary path").to_owned()
}

/// The PKI of a test, as files: `ca.pem` (the CA that signs the server's
/// and the client's certificates), `server.pem`/`.key` for 127.0.0.1,
/// `client.pem`/`.key`, and `other-ca.pem`, a CA nobody uses.
fn files(test: &str) -> Files {
    let files = Files::new(test);
    let (ca, other) = (Ca::new("test CA"), Ca::new("other CA"));
    std::fs::write(files.dir.join("ca.pem"), ca.cert_pem()).expect("write ca.pem");
    std::fs::write(files.dir.join("other-ca.pem"), other.cert_pem()).expect("write other-ca.pem");
    ca.server().write(&files.dir, "server");
    ca.client("c").write(&files.dir, "client");
    files
}

/// `ticketing serve` over TLS, requiring client certificates of `ca.pem`.
fn serve_tls(f: &Files, extra: &[&str]) -> Serve {
    serve_tls_with(f, extra, |_| {})
}

/// The same, with `configure` applied to the command first.
fn serve_tls_with(
    f: &Files,
    extra: &[&str],
    configure: impl FnOnce(&mut std::process::Command),
) -> Serve {
    let (cert, key, ca) = (f.path("server.pem"), f.path("server.key"), f.path("ca.pem"));
    let mut args = vec![
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca,
    ];
    args.extend_from_slice(extra);
    Serve::start_with(&args, configure)
}

/// The client options of a TLS client trusting `ca.pem` and presenting
/// `client.pem`.
fn client_tls_args(f: &Files) -> Vec<String> {
    vec![
        "--tls-ca".into(),
        f.path("ca.pem"),
        "--tls-cert".into(),
        f.path("client.pem"),
        "--tls-key".into(),
        f.path("client.key"),
    ]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// A client whose session never starts: its first `closed` is `reason`,
/// no `connected` comes, and it ends cleanly.
fn refused(addr: &str, args: &[&str], reason: &str) {
    let mut c = Client::start(&[addr], args);
    assert_eq!(c.closed(), reason, "{args:?}");
    c.send("shutdown 200");
    let welcomed = |v: &Value| v["event"] == "connected";
    let before = c.count(welcomed);
    let after = c.finish_without_closing_stdin();
    assert_eq!(before, 0, "{args:?}: welcomed");
    assert!(!after.iter().any(welcomed), "{args:?}: welcomed");
}

#[test]
fn client_sessions_over_tls_with_a_client_ca() {
    let f = files("cli-tls-client");
    let serve = serve_tls(&f, &[]);
    let tls = client_tls_args(&f);

    let mut c = Client::start(&[&serve.addr], &strs(&tls));
    let connected = c.event("connected");
    assert_eq!(connected["addr"], serve.addr.as_str());
    c.send("acquire a1 k me 0 30000");
    c.granted("a1", "k");
    c.send("release-grant r1 a1");
    c.outcome_is("r1", "released");
    let rest = c.finish();
    assert!(
        !rest
            .iter()
            .any(|v| v["event"] == "closed" && v["reason"] != "shutdown"),
        "{rest:?}"
    );

    // A client without a certificate is refused by the server's TLS before
    // its H; with TLS 1.3 it learns so once its own side of the handshake
    // is done, as the connection ends: io.
    let ca = f.path("ca.pem");
    refused(&serve.addr, &["--tls-ca", &ca], "io");
    let other = f.path("other-ca.pem");
    refused(&serve.addr, &["--tls-ca", &other], "tls:unknown_ca");
    let mut wrong_name = strs(&tls);
    wrong_name.extend(["--tls-server-name", "locks.example"]);
    refused(&serve.addr, &wrong_name, "tls:name_mismatch");
    // Plain TCP gets a TLS alert, which is no frame, and the end.
    refused(&serve.addr, &[], "eof");

    // A TLS client of a plain server: its E answer is not TLS.
    let plain = Serve::start(&["--handshake-timeout-ms", "100"]);
    refused(&plain.addr, &strs(&tls), "tls:not_tls");
}

#[test]
fn run_holds_a_lock_over_tls() {
    let f = files("cli-tls-run");
    let serve = serve_tls(&f, &[]);
    let tls = client_tls_args(&f);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--endpoint",
            &serve.addr,
            "--key",
            "k",
            "--wait-ms",
            "300",
        ];
        args.extend_from_slice(extra);
        args.extend(["--", "sh", "-c", "echo token $TICKETING_TOKEN"]);
        ticketing(&args, WAIT)
    };

    let done = run(&strs(&tls));
    assert_eq!(done.code, Some(0), "{done:?}");
    assert!(done.stdout.starts_with("token "), "{done:?}");

    // Not acquired, and the message says why no connection came up.
    let other = f.path("other-ca.pem");
    let refused = run(&["--tls-ca", &other]);
    assert_eq!(refused.code, Some(75), "{refused:?}");
    assert!(
        refused.stderr.contains("not acquired") && refused.stderr.contains("tls:unknown_ca"),
        "{refused:?}"
    );
}

/// What a run of `ticketing client` printed, stdout and stderr, once it
/// has ended.
fn all_output(mut c: Client) -> String {
    let mut stderr = c.stderr.take().expect("a client started capturing");
    let mut lines: Vec<String> = c.all.iter().map(Value::to_string).collect();
    lines.extend(c.finish().iter().map(Value::to_string));
    stderr.rest();
    lines.extend(stderr.seen);
    lines.join("\n")
}

#[test]
fn the_credential_appears_in_no_output_of_the_binary() {
    const CANARY: &str = "CANARY-7d1f";
    let (secret, wrong) = ("s3cret-CANARY-7d1f", "wrong-CANARY-7d1f");
    let spaced = "bad CANARY-7d1f";
    let f = files("cli-tls-credential");
    let mut outputs: Vec<(String, String)> = Vec::new();

    let mut serve = serve_tls(&f, &["--credential", secret]);
    let tls = client_tls_args(&f);
    let with = |credential: &'static str| {
        let mut args = strs(&tls);
        args.extend(["--credential", credential]);
        args
    };

    // Let in, then refused: both sent the credential in their H.
    let mut c = Client::start_capturing(&[&serve.addr], &with(secret));
    c.event("connected");
    c.send("acquire a1 k me 0 30000");
    c.granted("a1", "k");
    outputs.push(("client, right credential".into(), all_output(c)));
    let mut c = Client::start_capturing(&[&serve.addr], &with(wrong));
    assert_eq!(c.closed(), "auth_failed");
    c.event("auth_failed");
    c.send("shutdown 200");
    outputs.push(("client, wrong credential".into(), all_output(c)));
    // Over plain TCP: a warning, which names no credential.
    let mut c = Client::start_capturing(&[&serve.addr], &["--credential", secret]);
    c.closed();
    c.send("shutdown 200");
    let plain = all_output(c);
    assert!(plain.contains("in the clear"), "{plain}");
    outputs.push(("client, plain TCP".into(), plain));

    let mut run = vec!["run", "--endpoint", &serve.addr, "--key", "r"];
    run.extend(with(secret));
    run.extend(["--", "true"]);
    let done = ticketing(&run, WAIT);
    assert_eq!(done.code, Some(0), "{done:?}");
    outputs.push(("run".into(), format!("{}\n{}", done.stdout, done.stderr)));

    // A credential that is not an atom is refused, unquoted.
    for args in [
        vec!["client", "--endpoint", &serve.addr, "--credential", spaced],
        vec!["serve", "--credential", spaced],
    ] {
        let bad = ticketing(&args, WAIT);
        assert_eq!(bad.code, Some(2), "{bad:?}");
        assert!(bad.stderr.contains("not an atom"), "{bad:?}");
        outputs.push((format!("{} with a bad credential", args[0]), bad.stderr));
    }

    serve.kill();
    serve.stderr.rest();
    outputs.push(("serve".into(), serve.stderr.seen.join("\n")));

    for (what, output) in &outputs {
        assert!(
            !output.contains(CANARY),
            "{what} printed the credential:\n{output}"
        );
    }
}

#[test]
fn a_credential_from_the_environment_lets_in_and_is_on_no_command_line() {
    const VAR: &str = "TICKETING_CREDENTIAL";
    let secret = "env-s3cret-CANARY-5e2a";
    let f = files("cli-tls-credential-env");
    let serve = serve_tls_with(&f, &[], |c| {
        c.env(VAR, secret);
    });
    let tls = client_tls_args(&f);
    let tls = strs(&tls);
    let on_command_line = |pid: u32| {
        let line = std::fs::read(format!("/proc/{pid}/cmdline")).expect("a command line");
        line.windows(secret.len()).any(|w| w == secret.as_bytes())
    };
    assert!(!on_command_line(serve.pid()), "the server's command line");

    // With it in the environment, let in; without, refused.
    let mut c = Client::start_capturing_with(&[&serve.addr], &tls, |c| {
        c.env(VAR, secret);
    });
    assert!(!on_command_line(c.pid()), "the client's command line");
    c.event("connected");
    c.send("acquire a1 k me 0 30000");
    c.granted("a1", "k");
    c.send("shutdown 200");
    let mut c = Client::start_capturing_with(&[&serve.addr], &tls, |c| {
        c.env_remove(VAR);
    });
    assert_eq!(c.closed(), "auth_failed");
    c.send("shutdown 200");

    // --help names the variable, never its value.
    let help = cli::Proc::start_with(&["serve", "--help"], |c| {
        c.env(VAR, secret);
    })
    .finish(WAIT);
    assert!(help.stdout.contains(VAR), "{}", help.stdout);
    assert!(!help.stdout.contains(secret), "{}", help.stdout);
}
