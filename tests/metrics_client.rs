//! The client adapters publish their client's counters to the `metrics`
//! facade (feature `metrics`), into whatever recorder the embedder
//! installed: here a Prometheus one, rendered as text.

use std::time::Duration;

use ticketing::client::{Config, Outcome};
use ticketing::server::{Config as ServerConfig, Server};
use ticketing::{Endpoint, Key, Name, Time};

#[test]
fn the_tokio_adapter_publishes_its_clients_counters() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test process");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let core = Server::new(ServerConfig::new(Name::new("n1").unwrap()), Time::ZERO).unwrap();
        let server = ticketing::serve::bind("127.0.0.1:0", core)
            .await
            .expect("serve");
        let endpoint = Endpoint::new(server.local_addr().to_string()).unwrap();
        let client = ticketing::tokio::spawn(
            Config::new([endpoint], Name::new("c").unwrap()),
            ticketing::tokio::TcpConnector,
        )
        .expect("a client");
        let (key, owner) = (Key::new("k").unwrap(), Name::new("me").unwrap());
        let grant = client
            .acquire(key.clone())
            .owner(owner.clone())
            .wait(Duration::ZERO)
            .await
            .expect("a grant");
        let timed_out = client.acquire(key).owner(owner).wait(Duration::ZERO).await;
        assert!(
            matches!(
                timed_out,
                Err(ticketing::tokio::AcquireError::TimedOut {
                    sent: true,
                    cause: None
                })
            ),
            "{timed_out:?}"
        );
        assert_eq!(client.release(&grant).await, Ok(Outcome::Released));
        // Published at most once a second, when the driver next works. A
        // request makes it work, but it answers every request queued
        // before it publishes, so the render may come first: ask until the
        // counters show (the first ask comes more than a second after the
        // first publish, so the driver publishes right after answering it).
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let stats = client.stats().await.expect("the counters");
        assert_eq!(stats.acquires.granted, 1);
        let expected = [
            ("ticketing_client_acquires_total{outcome=\"granted\"}", "1"),
            (
                "ticketing_client_acquires_total{outcome=\"timed_out\"}",
                "1",
            ),
            (
                "ticketing_client_releases_total{whose=\"embedder\",outcome=\"released\"}",
                "1",
            ),
            ("ticketing_client_connected_total", "1"),
        ];
        let shows = |text: &str| {
            expected
                .iter()
                .all(|(line, value)| text.lines().any(|l| l == format!("{line} {value}")))
        };
        let mut text = recorder.render();
        for _ in 0..100 {
            if shows(&text) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            client.stats().await.expect("the counters");
            text = recorder.render();
        }
        for (line, value) in expected {
            assert!(
                text.lines().any(|l| l == format!("{line} {value}")),
                "no {line} {value} in:\n{text}"
            );
        }
        client
            .shutdown(Duration::from_secs(2))
            .await
            .expect("shut down");
        server.stop().await.expect("stopped");
    });
}
