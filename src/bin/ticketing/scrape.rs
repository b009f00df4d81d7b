//! `ticketing serve --metrics-listen ADDR`: the server's counters in the
//! Prometheus text format at `GET /metrics`, from an HTTP server that
//! cannot take what the lock port needs.
//!
//! It shares the process's descriptors and its one thread with the lock
//! server, so it is bounded on both:
//!
//! - at most [`MAX_SCRAPES`] connections at once; beyond, connections wait
//!   in the listen backlog, unaccepted, and hold no descriptor of ours;
//! - a request's head must arrive within [`HEAD_TIMEOUT`], and a
//!   connection serves one request and lasts [`CONNECTION_TIMEOUT`] at
//!   most, so that a client that sends half a request, or never reads the
//!   answer, gives its slot back;
//! - only `GET /metrics` (and `HEAD`) answers 200; another path is 404,
//!   another method on it 405.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once, at most.
pub const MAX_SCRAPES: usize = 8;

/// How long a request's head may take to arrive, from the connection.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may last, its one request and answer included.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The one path served.
const PATH: &str = "/metrics";

/// What the Prometheus text is.
const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The longest pause after accepting failed (out of descriptors, say).
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Serves `render()` at `GET /metrics` on `listener`, for as long as it is
/// polled.
pub async fn serve(listener: TcpListener, render: impl Fn() -> String + Send + Sync + 'static) {
    let render = Arc::new(render);
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    let mut backoff = Duration::from_millis(10);
    loop {
        // Accept only with a slot free: the rest wait in the backlog.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        backoff = Duration::from_millis(10);
        let render = Arc::clone(&render);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let response = answer(&request, &*render);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            // Ended, failed or given up: the socket closes either way.
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
            drop(slot);
        });
    }
}

/// The answer to `request`.
fn answer(request: &Request<Incoming>, render: &dyn Fn() -> String) -> Response<Full<Bytes>> {
    if request.uri().path() != PATH {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    match *request.method() {
        // hyper leaves the body out of an answer to HEAD.
        Method::GET | Method::HEAD => {
            let mut response = Response::new(Full::new(Bytes::from(render())));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT));
            response
        }
        _ => {
            let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            response
        }
    }
}

/// A short plain-text answer with `status`.
fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
