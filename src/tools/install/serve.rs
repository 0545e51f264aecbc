//! `install --watch --metrics-port`: natguard's metrics over HTTP, for a Prometheus scrape (a
//! PodMonitor, a ServiceMonitor or a static scrape config), next to the textfile of
//! `--metrics-file`.
//!
//! The server is the metadata proxy's HTTP serving ([`crate::proxy::http`]): hyper on a
//! current-thread runtime of a thread of its own, so nothing it does (a slow client, a scrape
//! of a node with many pods) ever holds up the watcher's loop, its self-repair or the proxy.
//! Connections are served concurrently, each a task: an idle client holds a descriptor, not
//! the server, so a pod holding connections open never delays a scrape. [`LIMITS`] caps them
//! in all and per source (a connection over a cap is closed at once); each request head must
//! arrive within [`IO_TIMEOUT`] and fit in [`MAX_REQUEST`] bytes; one request per connection.
//! Only `GET /metrics` (and `HEAD`) is served, with `200` and the same text `natguard metrics`
//! prints, less the per-pod series unless `--metrics-pod-labels` asks for them (they name every
//! pod); any other path is `404`, any other method `405`. The metrics are collected at each
//! scrape on tokio's blocking pool, as the `metrics` command does, so a scrape sees the
//! kernel's counters of that moment.

use crate::error::{Error, Result};
use crate::proxy::http::{self, text, Limits};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long a client may take to send its request head.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request head read; a scrape sends a few hundred bytes.
pub(crate) const MAX_REQUEST: usize = 8 * 1024;
/// The Prometheus text format's content type.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The scrape endpoint's bounds: a few scrapers, never starved by one source.
const LIMITS: Limits = Limits {
    max_conns: 1024,
    per_source: 64,
    header_timeout: IO_TIMEOUT,
    lifetime: Duration::from_secs(60),
    max_head: MAX_REQUEST,
    // One scrape per connection (`Connection: close`), as scrapers expect of a small endpoint.
    keep_alive: false,
};

/// Binds `addr` and answers scrapes on a thread of its own from then on.
pub(crate) fn start(addr: SocketAddr, pod_labels: bool) -> Result<()> {
    // Bound here, so a port that is taken is the caller's error at once.
    let std_listener = std::net::TcpListener::bind(addr)
        .map_err(|e| Error::io(format!("--metrics-port: listening on {addr}"), e))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("--metrics-port: a non-blocking listener", e))?;
    let bound = std_listener.local_addr().unwrap_or(addr);
    http::spawn("metrics-http", move || async move {
        let listener = match tokio::net::TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                crate::warn!("metrics endpoint: {e}");
                return;
            }
        };
        let handler: http::Handler = Arc::new(move |req, _conn| {
            Box::pin(answer(
                req.method().clone(),
                req.uri().path().to_string(),
                pod_labels,
            ))
        });
        http::serve(listener, LIMITS, handler, |_| None).await;
    })
    .map_err(|e| Error::io("--metrics-port: starting its thread", e))?;
    crate::info!("serving metrics on http://{bound}/metrics");
    Ok(())
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    MethodNotAllowed,
}

fn route(method: &str, path: &str) -> Route {
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics { head_only: false },
        ("HEAD", "/metrics") => Route::Metrics { head_only: true },
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::MethodNotAllowed,
    }
}

async fn answer(method: hyper::Method, path: String, pod_labels: bool) -> http::Reply {
    match route(method.as_str(), &path) {
        Route::Metrics { head_only } => {
            let body = tokio::task::spawn_blocking(move || {
                crate::tools::metrics::exposition_for_scrape(pod_labels)
            })
            .await
            .unwrap_or_default();
            let len = body.len();
            let mut r = text(200, if head_only { String::new() } else { body });
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(CONTENT_TYPE),
            );
            if head_only {
                r.headers_mut()
                    .insert(hyper::header::CONTENT_LENGTH, len.into());
            }
            r
        }
        Route::NotFound => text(404, "natguard serves GET /metrics only\n"),
        Route::MethodNotAllowed => {
            let mut r = text(405, "natguard serves GET /metrics only\n");
            r.headers_mut().insert(
                hyper::header::ALLOW,
                hyper::header::HeaderValue::from_static("GET, HEAD"),
            );
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_metrics_is_served() {
        assert_eq!(
            route("GET", "/metrics"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route("HEAD", "/metrics"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(route("GET", "/"), Route::NotFound);
        assert_eq!(route("GET", "/metricsx"), Route::NotFound);
        assert_eq!(route("POST", "/metrics"), Route::MethodNotAllowed);
    }
}
