//! Feature `tracing` (issue 23): a client started with a plain `spawn`,
//! whose notices nobody reads, still says what happens, as `tracing`
//! events of the target `ticketing`: a failed connect with its reason and
//! the connector's error, then a connection made.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ticketing::client::Config;
use ticketing::server::{self, Server};
use ticketing::{Endpoint, Name, Time};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One event: its level, target and fields, as text.
#[derive(Debug, Clone)]
struct Seen {
    level: Level,
    target: String,
    fields: Vec<(String, String)>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Keeps every event.
#[derive(Clone, Default)]
struct Keep(Arc<Mutex<Vec<Seen>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl Subscriber for Keep {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().expect("the events").push(Seen {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields,
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Keep {
    /// Waits until an event matches `pred`; fails after 10 s.
    fn until(&self, what: &str, pred: impl Fn(&Seen) -> bool) -> Seen {
        let start = Instant::now();
        loop {
            if let Some(seen) = self.0.lock().expect("the events").iter().find(|s| pred(s)) {
                return seen.clone();
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no event for {what}: {:?}",
                self.0.lock().expect("the events")
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
fn a_plain_spawn_is_not_blind() {
    let keep = Keep::default();
    tracing::subscriber::set_global_default(keep.clone()).expect("the only subscriber");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");

    // Nobody listens there.
    let dead = std::net::TcpListener::bind("127.0.0.3:0").expect("a port");
    let dead_addr = dead.local_addr().expect("its address").to_string();
    drop(dead);
    let config = Config::new(
        [Endpoint::new(&dead_addr).expect("an endpoint")],
        Name::new("c").expect("a name"),
    );
    let _down = rt.block_on(async {
        ticketing::tokio::spawn(config, ticketing::tokio::TcpConnector).expect("a client")
    });
    let failed = keep.until("the failed connect", |s| {
        s.field("message") == Some("connection failed")
    });
    assert_eq!(
        (failed.level, failed.target.as_str()),
        (Level::WARN, "ticketing")
    );
    assert_eq!(failed.field("addr"), Some(dead_addr.as_str()));
    assert_eq!(failed.field("reason"), Some("connect_failed"));
    let error = failed.field("error").expect("the I/O error");
    assert!(error.contains("refused"), "{error}");

    // A server there: connected, with its node.
    let core = Server::new(
        server::Config::new(Name::new("n1").expect("a name")),
        Time::ZERO,
    )
    .expect("a server");
    let server = rt
        .block_on(ticketing::serve::bind("127.0.0.1:0", core))
        .expect("serve");
    let addr = server.local_addr().to_string();
    let config = Config::new(
        [Endpoint::new(&addr).expect("an endpoint")],
        Name::new("c").expect("a name"),
    );
    let _up = rt.block_on(async {
        ticketing::tokio::spawn(config, ticketing::tokio::TcpConnector).expect("a client")
    });
    let connected = keep.until("the connection", |s| {
        s.field("message") == Some("connected") && s.field("addr") == Some(addr.as_str())
    });
    assert_eq!(connected.level, Level::INFO);
    assert_eq!(connected.field("node"), Some("n1"));
}
