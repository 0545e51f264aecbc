//! `install --watch --metrics-port`: natguard's metrics over HTTP, for a Prometheus scrape (a
//! PodMonitor, a ServiceMonitor or a static scrape config), next to the textfile of
//! `--metrics-file`.
//!
//! The server is plain std networking on a thread of its own, so nothing it does (a slow
//! client, a scrape of a node with many pods) ever holds up the watcher's loop or its
//! self-repair. It answers one connection at a time: a scrape every few seconds needs no
//! more, and further clients wait in the listen backlog instead of costing a thread each. Each
//! connection has [`IO_TIMEOUT`] to send its request head (at most [`MAX_REQUEST`] bytes) and
//! the same per write of the reply, then it is closed (`Connection: close`, no keep-alive).
//! Only `GET /metrics` (and `HEAD`) is served, with `200` and the same text `natguard metrics`
//! prints; any other path is `404`, any other method `405`, a request that is not HTTP `400`.
//! The metrics are collected at each scrape, as the `metrics` command does, so a scrape sees
//! the kernel's counters of that moment.

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long a client may take to send its request, and each write of the reply.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request head read; a scrape sends a few hundred bytes.
pub(crate) const MAX_REQUEST: usize = 8 * 1024;
/// The Prometheus text format's content type.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// How long accepting pauses after it failed (descriptors exhausted): no busy loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// Binds `addr` and answers scrapes on a thread of its own from then on.
pub(crate) fn start(addr: SocketAddr) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| Error::io(format!("--metrics-port: listening on {addr}"), e))?;
    let bound = listener.local_addr().unwrap_or(addr);
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || serve(listener))
        .map_err(|e| Error::io("--metrics-port: starting its thread", e))?;
    crate::info!("serving metrics on http://{bound}/metrics");
    Ok(())
}

fn serve(listener: TcpListener) {
    let mut failing = false;
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                failing = false;
                answer(conn);
            }
            Err(e) => {
                if !failing {
                    crate::warn!("metrics endpoint: accepting a connection: {e}");
                    failing = true;
                }
                std::thread::sleep(ACCEPT_BACKOFF);
            }
        }
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

/// The route of a request head's first line ("GET /metrics HTTP/1.1").
fn route(head: &[u8]) -> Route {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics { head_only: false },
        ("HEAD", "/metrics") => Route::Metrics { head_only: true },
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::MethodNotAllowed,
    }
}

/// Reads the request head (bounded in size and time), writes one reply, closes.
fn answer(mut conn: TcpStream) {
    let _ = conn.set_write_timeout(Some(IO_TIMEOUT));
    let Some(head) = read_head(&mut conn) else {
        return;
    };
    let reply = match route(&head) {
        Route::Metrics { head_only } => {
            let (body, _) = crate::tools::metrics::exposition();
            reply("200 OK", CONTENT_TYPE, &body, head_only)
        }
        Route::NotFound => reply(
            "404 Not Found",
            "text/plain",
            "natguard serves GET /metrics only\n",
            false,
        ),
        Route::MethodNotAllowed => reply(
            "405 Method Not Allowed",
            "text/plain",
            "natguard serves GET /metrics only\n",
            false,
        ),
        Route::BadRequest => reply("400 Bad Request", "text/plain", "bad request\n", false),
    };
    let _ = conn.write_all(&reply);
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// The request head up to its blank line, or `None` when the client took too long, closed, or
/// sent more than [`MAX_REQUEST`] bytes without one.
fn read_head(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        conn.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        let n = conn.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Some(head);
        }
        if head.len() > MAX_REQUEST {
            return None;
        }
    }
}

fn reply(status: &str, content_type: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_metrics_is_served() {
        let r = |s: &str| route(s.as_bytes());
        assert_eq!(
            r("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            r("GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            r("HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(r("GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("GET /metricsx HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("POST /metrics HTTP/1.1\r\n\r\n"), Route::MethodNotAllowed);
        assert_eq!(r("GET /metrics\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("GET /metrics SPDY/3\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("\r\n\r\n"), Route::BadRequest);
    }

    #[test]
    fn replies_have_a_length_and_close() {
        let a = String::from_utf8(reply("200 OK", CONTENT_TYPE, "x 1\n", false)).unwrap();
        assert_eq!(
            a,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
             Content-Length: 4\r\nConnection: close\r\n\r\nx 1\n"
        );
        let h = String::from_utf8(reply("200 OK", CONTENT_TYPE, "x 1\n", true)).unwrap();
        assert!(h.ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n"));
        let m =
            String::from_utf8(reply("405 Method Not Allowed", "text/plain", "", false)).unwrap();
        assert!(m.contains("\r\nAllow: GET, HEAD\r\n"));
    }
}
