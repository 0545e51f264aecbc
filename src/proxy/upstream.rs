//! The proxy's client side: one request to exactly one upstream, the metadata endpoint the
//! pod's connection was first sent to, from the node's network namespace (natguard's DNAT
//! applies to pods only). The request is built here from the canonical target and the
//! cloud's own headers; nothing of the pod's request is copied. Connect, answer and body
//! each have a deadline, and the body a size bound.
//!
//! Connections to the upstream are kept for the next request (at most [`POOL_IDLE`] idle per
//! upstream, each for at most [`POOL_IDLE_FOR`]), as a metadata client's own keep-alive would.
//!
//! On clouds with session tokens (AWS IMDSv2, Alibaba's hardened mode) the proxy holds the
//! node's own token ([`NodeTokens`]), fetched by the node itself so the instance keeps a hop
//! limit of 1, and renewed well before it expires.

use super::io::Io;
use super::rules::{Api, Ttl, IBM_FIRST_VERSION};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest upstream body passed on (metadata documents are a few KiB).
pub const MAX_BODY: usize = 1024 * 1024;

/// How many idle connections are kept per upstream, and for how long: as many as requests a
/// busy node has in flight at once (64 keep-alive clients, nginx's `keepalive 64`), so that a
/// steady load never opens an upstream connection per request.
pub const POOL_IDLE: usize = 128;
pub const POOL_IDLE_FOR: Duration = Duration::from_secs(30);
/// How many requests are sent upstream at once, over all upstreams: a burst of pods asking
/// at once waits its turn (each within [`ANSWER_TIMEOUT`]) rather than opening a connection
/// each to the metadata API, which throttles per instance.
pub const IN_FLIGHT: usize = POOL_IDLE;

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Idle upstream connections, per upstream, and the bound on requests in flight.
pub struct Pool {
    idle: Mutex<HashMap<SocketAddr, Vec<(Sender, Instant)>>>,
    in_flight: tokio::sync::Semaphore,
}

impl Default for Pool {
    fn default() -> Pool {
        Pool {
            idle: Mutex::default(),
            in_flight: tokio::sync::Semaphore::new(IN_FLIGHT),
        }
    }
}

impl Pool {
    /// An idle connection to `upstream` that is still open, if one is kept.
    fn take(&self, upstream: SocketAddr) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(&upstream)?;
        while let Some((s, since)) = list.pop() {
            if !s.is_closed() && since.elapsed() < POOL_IDLE_FOR && s.is_ready() {
                return Some(s);
            }
        }
        None
    }

    fn put(&self, upstream: SocketAddr, s: Sender) {
        if s.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(upstream).or_default();
        list.retain(|(s, since)| !s.is_closed() && since.elapsed() < POOL_IDLE_FOR);
        if list.len() < POOL_IDLE {
            list.push((s, Instant::now()));
        }
    }
}

/// A new connection to `upstream`, its driver on the runtime (it ends when the connection
/// closes or its last sender is dropped).
async fn connect(upstream: SocketAddr) -> Result<Sender, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(upstream))
        .await
        .map_err(|_| format!("connecting to {upstream} timed out"))?
        .map_err(|e| format!("connecting to {upstream}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(Io(stream))
        .await
        .map_err(|e| format!("{upstream}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// An upstream answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

/// Sends one request (`method` `target`, `headers`, an empty body) to `upstream` and reads the
/// whole answer, on a kept connection when one is idle. A kept connection that fails (the
/// upstream closed it meanwhile) is replaced by a new one once: metadata requests are
/// idempotent.
pub async fn send(
    pool: &Pool,
    upstream: SocketAddr,
    method: hyper::Method,
    target: &str,
    headers: &[(&str, String)],
) -> Result<Answer, String> {
    send_body(pool, upstream, method, target, headers, Bytes::new()).await
}

/// [`send`] with `body` (a token request's JSON).
pub async fn send_body(
    pool: &Pool,
    upstream: SocketAddr,
    method: hyper::Method,
    target: &str,
    headers: &[(&str, String)],
    body: Bytes,
) -> Result<Answer, String> {
    let _permit = tokio::time::timeout(ANSWER_TIMEOUT, pool.in_flight.acquire())
        .await
        .map_err(|_| {
            format!(
                "{upstream}: no request slot within {} s ({IN_FLIGHT} in flight)",
                ANSWER_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("{upstream}: {e}"))?;
    if let Some(kept) = pool.take(upstream) {
        if let Ok(a) = attempt(
            pool,
            kept,
            upstream,
            (method.clone(), target),
            headers,
            body.clone(),
        )
        .await
        {
            return Ok(a);
        }
    }
    let fresh = connect(upstream).await?;
    attempt(pool, fresh, upstream, (method, target), headers, body).await
}

async fn attempt(
    pool: &Pool,
    mut sender: Sender,
    upstream: SocketAddr,
    (method, target): (hyper::Method, &str),
    headers: &[(&str, String)],
    body: Bytes,
) -> Result<Answer, String> {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(target)
        .header(hyper::header::HOST, host_of(upstream));
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| format!("building the upstream request: {e}"))?;
    let answer = tokio::time::timeout(ANSWER_TIMEOUT, async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("{upstream}: {e}"))?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("{upstream}: reading the answer: {e}"))?
            .to_bytes();
        Ok::<_, String>(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    })
    .await
    .map_err(|_| {
        format!(
            "{upstream} did not answer within {} s",
            ANSWER_TIMEOUT.as_secs()
        )
    })??;
    pool.put(upstream, sender);
    Ok(answer)
}

/// The Host header for an endpoint (`[v6]` bracketed, port only when not 80).
fn host_of(a: SocketAddr) -> String {
    let ip = match a {
        SocketAddr::V4(v) => v.ip().to_string(),
        SocketAddr::V6(v) => format!("[{}]", v.ip()),
    };
    if a.port() == 80 {
        ip
    } else {
        format!("{ip}:{}", a.port())
    }
}

/// The node's own session tokens, per upstream.
#[derive(Default)]
pub struct NodeTokens {
    held: Mutex<HashMap<SocketAddr, (String, Instant)>>,
}

impl NodeTokens {
    /// The node's token for `upstream`, fetched or renewed when needed.
    pub async fn get(&self, pool: &Pool, api: Api, upstream: SocketAddr) -> Result<String, String> {
        let p = api.token().ok_or("this cloud has no session tokens")?;
        if let Some((t, until)) = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&upstream)
        {
            // Renewed with a tenth of its life left.
            if until.saturating_duration_since(Instant::now())
                > Duration::from_secs(p.node_ttl / 10)
            {
                return Ok(t.clone());
            }
        }
        // The node's own token request, in the cloud's protocol.
        let (target, mut headers, body) = match p.ttl {
            Ttl::Header(h) => (p.target(), vec![(h, p.node_ttl.to_string())], Bytes::new()),
            Ttl::JsonBody { key, .. } => (
                format!("{}?version={IBM_FIRST_VERSION}", p.target()),
                vec![("content-type", "application/json".to_string())],
                Bytes::from(serde_json::json!({ key: p.node_ttl }).to_string()),
            ),
        };
        headers.extend(p.put_headers.iter().map(|(k, v)| (*k, v.to_string())));
        let a = send_body(pool, upstream, hyper::Method::PUT, &target, &headers, body).await?;
        let refused = || {
            format!(
                "{upstream} answered the node's token request with {}",
                a.status
            )
        };
        if a.status != 200 {
            return Err(refused());
        }
        let (token, ttl) = match p.ttl {
            Ttl::Header(h) => (
                std::str::from_utf8(&a.body)
                    .unwrap_or("")
                    .trim()
                    .to_string(),
                a.headers
                    .get(h)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok()),
            ),
            Ttl::JsonBody { .. } => {
                let v: serde_json::Value =
                    serde_json::from_slice(&a.body).map_err(|_| refused())?;
                (
                    v["access_token"].as_str().unwrap_or("").to_string(),
                    v["expires_in"].as_u64(),
                )
            }
        };
        if token.is_empty() || token.len() > 4096 {
            return Err(refused());
        }
        let ttl = ttl.unwrap_or(p.node_ttl).min(p.node_ttl);
        self.held.lock().unwrap_or_else(|e| e.into_inner()).insert(
            upstream,
            (token.clone(), Instant::now() + Duration::from_secs(ttl)),
        );
        Ok(token)
    }

    /// Forgets the token for `upstream` (the upstream refused it).
    pub fn forget(&self, upstream: SocketAddr) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&upstream);
    }
}
