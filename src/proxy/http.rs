//! The HTTP serving both of the watcher's servers share (the metadata proxy and the scrape
//! endpoint): hyper's HTTP/1 server on a current-thread tokio runtime of a thread of its own,
//! with bounds a hostile client cannot get around.
//!
//! Every connection is accepted at once and costs one task, never a thread, so an idle
//! client only holds a descriptor and a few kilobytes. [`Limits`] caps the connections in all
//! and per source address: a connection over either cap is closed as soon as it is accepted,
//! so the listen backlog never fills and one source cannot starve the others. The request head
//! must arrive within `header_timeout` (hyper's header-read timeout, also between keep-alive
//! requests), its size is bounded by `max_head`, and a connection lives at most `lifetime`. A
//! connection that has sent nothing yet holds no HTTP state (hyper's buffers come with its
//! first bytes), so thousands of idle ones cost little memory.

use super::io::{Io, Timer};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The bounds of one server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_conns: usize,
    pub per_source: usize,
    pub header_timeout: Duration,
    pub lifetime: Duration,
    /// hyper's read buffer, which bounds the request head (at least 8 KiB).
    pub max_head: usize,
    /// Whether a connection may carry more than one request.
    pub keep_alive: bool,
}

/// What is known of a connection when its requests are answered.
#[derive(Debug, Clone, Copy)]
pub struct Conn {
    pub peer: SocketAddr,
    /// Where the client first sent it, before a DNAT (`SO_ORIGINAL_DST`); `None` when the
    /// kernel has no NAT record of it.
    pub original_dst: Option<SocketAddr>,
}

pub type Reply = Response<Full<Bytes>>;
pub type Handler = Arc<
    dyn Fn(Request<Incoming>, Conn) -> Pin<Box<dyn Future<Output = Reply> + Send>> + Send + Sync,
>;

/// A reply with a plain-text body.
pub fn text(status: u16, body: impl Into<String>) -> Reply {
    let body: String = body.into();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::FORBIDDEN);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Runs `serve` on a current-thread runtime of a new thread named `name`; the thread ends
/// when `serve` does.
pub fn spawn<F, Fut>(name: &str, serve: F) -> std::io::Result<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    crate::warn!("starting an HTTP server's runtime: {e}");
                    return;
                }
            };
            rt.block_on(serve());
        })
        .map(|_| ())
}

/// Binds `addr` (with `IP_FREEBIND`, so an address the node does not have yet, such as a
/// proxy address that comes up later, can still be bound) for a listener of the current runtime.
pub fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    use std::os::fd::AsRawFd;
    let s = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    s.set_reuseaddr(true)?;
    let one: libc::c_int = 1;
    let set = |level, opt| {
        // SAFETY: a valid socket descriptor and a c_int option value of the right size.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                level,
                opt,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    if addr.is_ipv6() {
        set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY);
    }
    set(libc::IPPROTO_IP, libc::IP_FREEBIND);
    s.bind(addr)?;
    s.listen(1024)
}

/// How many connections each source holds, and in all.
#[derive(Default)]
struct Counts {
    total: usize,
    per: HashMap<IpAddr, usize>,
}

struct Slot {
    counts: Arc<Mutex<Counts>>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total -= 1;
        if let Some(n) = c.per.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.per.remove(&self.ip);
            }
        }
    }
}

/// Accepts on `listener` until the runtime ends, answering every request with `handler`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    limits: Limits,
    handler: Handler,
    original_dst: fn(&tokio::net::TcpStream) -> Option<SocketAddr>,
) {
    let counts: Arc<Mutex<Counts>> = Arc::default();
    let mut failing = false;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => {
                failing = false;
                x
            }
            Err(e) => {
                if !failing {
                    crate::warn!("HTTP server: accepting a connection: {e}");
                    failing = true;
                }
                // Descriptors exhausted: no busy loop.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let slot = {
            let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
            let mine = c.per.get(&peer.ip()).copied().unwrap_or(0);
            if c.total >= limits.max_conns || mine >= limits.per_source {
                // Closed at once (dropped): over a cap, never left waiting in the backlog.
                continue;
            }
            c.total += 1;
            *c.per.entry(peer.ip()).or_insert(0) += 1;
            Slot {
                counts: counts.clone(),
                ip: peer.ip(),
            }
        };
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            peer,
            original_dst: original_dst(&stream),
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _slot = slot;
            // hyper reserves its read buffer (8 KiB) at its first read: a client that has sent
            // nothing yet costs only this task until it does, and is closed if it never does.
            match tokio::time::timeout(limits.header_timeout, stream.readable()).await {
                Ok(Ok(())) => {}
                _ => return,
            }
            let service = hyper::service::service_fn(move |req| {
                let h = handler.clone();
                async move { Ok::<_, std::convert::Infallible>(h(req, conn).await) }
            });
            // Boxed: the connection's state is allocated only now, not in every waiting task.
            let served = Box::pin(
                hyper::server::conn::http1::Builder::new()
                    .timer(Timer)
                    .header_read_timeout(limits.header_timeout)
                    .max_buf_size(limits.max_head)
                    .keep_alive(limits.keep_alive)
                    .serve_connection(Io(stream), service),
            );
            let _ = tokio::time::timeout(limits.lifetime, served).await;
        });
    }
}
