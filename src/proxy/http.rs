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
//! connection holds hyper's state (its buffers, 16 KiB) only while a request is read and
//! answered ([`connection`]): one that is idle, before its first request or between
//! keep-alive requests, holds only its socket and a task, so thousands cost little memory.

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
            rt.spawn(trimmer());
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
        opened(-1);
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

/// Connections open, process-wide (both servers), and whether buffers get pages of their own.
static OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static APART: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Above this many open connections, buffers of 8 KiB and more (hyper's, one pair per turn)
/// are served by mmap, each on pages of its own that go back to the kernel when it is freed;
/// below [`APART_BELOW`], by the heap again. Thousands of connections whose turns' buffers
/// came from the heap would leave those pages interleaved with the connections' small
/// long-lived allocations, resident after a burst (10,000 idle connections: 54 MiB instead of
/// 30); a few keep-alive clients keep the heap's speed (a turn's buffers are reallocated per
/// request, which mmap would make a system call each).
const APART_ABOVE: usize = 256;
const APART_BELOW: usize = 128;

fn opened(delta: isize) {
    use std::sync::atomic::Ordering::Relaxed;
    let open = if delta > 0 {
        OPEN.fetch_add(1, Relaxed) + 1
    } else {
        OPEN.fetch_sub(1, Relaxed) - 1
    };
    let apart = APART.load(Relaxed);
    let want = if apart {
        open >= APART_BELOW
    } else {
        open > APART_ABOVE
    };
    if want != apart && APART.swap(want, Relaxed) != want {
        let threshold = if want { 8 * 1024 } else { 128 * 1024 };
        // SAFETY: mallopt only changes the size from which the allocator serves with mmap.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, threshold);
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
            opened(1);
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
            let _ =
                tokio::time::timeout(limits.lifetime, connection(stream, conn, limits, handler))
                    .await;
        });
    }
}

/// Serves one connection, one turn of hyper's connection state per request: between requests
/// the connection holds only its socket and this task, never hyper's buffers (8 KiB to read
/// and 8 KiB to write), so thousands of idle keep-alive connections cost little memory.
///
/// Each turn starts when the client sends (within `header_timeout`, the bound on an idle
/// connection, as hyper's header-read timeout is between keep-alive requests) and ends after
/// a response has been written and the client has nothing more to read yet: [`Turn`] then
/// ends hyper's reading as a clean close would, and the socket is taken back. A connection
/// hyper itself closes (`Connection: close`, an error, a timeout, the client's close) ends
/// here too.
async fn connection(
    mut stream: tokio::net::TcpStream,
    conn: Conn,
    limits: Limits,
    handler: Handler,
) {
    let mut pending = Bytes::new();
    loop {
        if pending.is_empty() {
            match tokio::time::timeout(limits.header_timeout, stream.readable()).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
        let _busy = Busy::enter();
        let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let service = {
            let handler = handler.clone();
            let answered = answered.clone();
            hyper::service::service_fn(move |req| {
                // A request began: only its own response lets the turn end.
                answered.store(false, std::sync::atomic::Ordering::Relaxed);
                let h = handler.clone();
                async move { Ok::<_, std::convert::Infallible>(h(req, conn).await) }
            })
        };
        let turn = Turn {
            stream,
            pending,
            answered,
            wrote: false,
            linger: None,
            lingering: false,
            parked: false,
            closed: false,
        };
        // Boxed: hyper's state exists only for the turn, not in the idle task.
        let served = Box::pin(
            hyper::server::conn::http1::Builder::new()
                .timer(Timer)
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(limits.max_head)
                .keep_alive(limits.keep_alive)
                .serve_connection(Io(turn), service)
                .without_shutdown(),
        );
        let parts = match served.await {
            Ok(p) => p,
            Err(_) => return,
        };
        let Io(turn) = parts.io;
        if !turn.parked || turn.closed {
            // hyper ended the connection itself: close it as hyper would have.
            let mut s = turn.stream;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut s).await;
            return;
        }
        stream = turn.stream;
        // Copied: hyper's read-ahead is a view of its whole read buffer, which it would keep.
        pending = Bytes::copy_from_slice(&parts.read_buf);
    }
}

/// How many turns are being served, process-wide, and whether one ended since the allocator
/// last gave memory back.
static BUSY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static ENDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long a turn stays after its answer for the client's next request: a client that keeps
/// its connection busy (one request after another) is served by one turn, without building
/// hyper's state anew per request. Shorter than any header timeout.
const LINGER: Duration = Duration::from_millis(20);
/// Above this many turns at once, a turn ends as soon as it has answered: lingering turns never
/// hold more than this many connections' buffers (a few MiB), whatever the number of clients.
const LINGER_MAX: usize = 256;

/// How many turns ended with the connection idle (for the tests).
#[cfg(test)]
static PARKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One turn being served.
struct Busy;

impl Busy {
    fn enter() -> Busy {
        BUSY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Busy
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        ENDED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Every 100 ms, once turns have ended and none is being served (the servers are quiet), the
/// allocator gives the pages freed since back to the kernel: after a burst of thousands of
/// requests at once the turns' buffers are free, and an idle server's resident memory is what
/// its idle connections hold, not the burst's high-water mark.
async fn trimmer() {
    use std::sync::atomic::Ordering::Relaxed;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if BUSY.load(Relaxed) == 0 && ENDED.swap(false, Relaxed) {
            // SAFETY: malloc_trim only returns free pages of the allocator's arenas.
            unsafe { libc::malloc_trim(0) };
        }
    }
}

/// A connection's socket for one turn of hyper: bytes hyper read ahead in the previous turn
/// first, then the socket. Once a response has been written and flushed and the client has
/// sent nothing for [`LINGER`] since (at once when more than [`LINGER_MAX`] turns are being
/// served), a read that would wait reads as the end of the stream instead (`parked`): hyper,
/// idle between requests, ends the turn as on a client's clean close.
struct Turn {
    stream: tokio::net::TcpStream,
    pending: Bytes,
    /// Set when a response was flushed, cleared when a request begins (the service) or bytes
    /// arrive.
    answered: Arc<std::sync::atomic::AtomicBool>,
    wrote: bool,
    /// While answered (`lingering`): when the turn ends if the client sends nothing more. One
    /// timer per turn, set again for each answer.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    lingering: bool,
    parked: bool,
    /// The client closed (a real end of stream).
    closed: bool,
}

impl tokio::io::AsyncRead for Turn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::sync::atomic::Ordering::Relaxed;
        use std::task::Poll;
        if !self.pending.is_empty() {
            let n = self.pending.len().min(buf.remaining());
            let head = self.pending.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() == before {
                    self.closed = true;
                } else {
                    self.answered.store(false, Relaxed);
                    self.lingering = false;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.answered.load(Relaxed) => {
                let stay = BUSY.load(Relaxed) <= LINGER_MAX && {
                    let until = tokio::time::Instant::now() + LINGER;
                    let first = !std::mem::replace(&mut self.lingering, true);
                    let timer = self
                        .linger
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                    if first {
                        timer.as_mut().reset(until);
                    }
                    timer.as_mut().poll(cx).is_pending()
                };
                if stay {
                    return Poll::Pending;
                }
                #[cfg(test)]
                PARKED.fetch_add(1, Relaxed);
                self.parked = true;
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl tokio::io::AsyncWrite for Turn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.wrote = true;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_flush(cx);
        if matches!(r, std::task::Poll::Ready(Ok(()))) && self.wrote {
            self.wrote = false;
            self.answered
                .store(true, std::sync::atomic::Ordering::Relaxed);
            // hyper read (and found nothing) before it wrote: polled again, it reads once
            // more, and that read ends the turn.
            cx.waker().wake_by_ref();
        }
        r
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A server answering every request with `ok`, on a port of the loopback.
    fn server() -> SocketAddr {
        let (tx, rx) = std::sync::mpsc::channel();
        spawn("http-test", move || async move {
            let l = bind("127.0.0.1:0".parse().unwrap()).unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            let handler: Handler = Arc::new(|_req, _conn| Box::pin(async { text(200, "ok") }));
            let limits = Limits {
                max_conns: 16,
                per_source: 16,
                header_timeout: Duration::from_secs(5),
                lifetime: Duration::from_secs(30),
                max_head: 16 * 1024,
                keep_alive: true,
            };
            serve(l, limits, handler, |_| None).await;
        })
        .unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    /// Reads until `n` whole answers arrived (or the stream ends); returns what was read.
    fn answers(s: &mut std::net::TcpStream, n: usize) -> String {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while String::from_utf8_lossy(&got).matches("\r\n\r\nok").count() < n {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => got.extend_from_slice(&buf[..k]),
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    const REQ: &[u8] = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n";

    #[test]
    fn keep_alive_requests_are_served_in_turns_whole_split_and_pipelined() {
        let addr = server();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        // One request, then another on the same connection once the first turn has ended.
        s.write_all(REQ).unwrap();
        assert_eq!(answers(&mut s, 1).matches(" 200 OK").count(), 1);
        // The first turn ends, hyper's state dropped, with the connection open and idle.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while PARKED.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            assert!(std::time::Instant::now() < deadline, "no turn ended idle");
            std::thread::sleep(Duration::from_millis(10));
        }
        s.write_all(REQ).unwrap();
        assert_eq!(answers(&mut s, 1).matches(" 200 OK").count(), 1);
        // A head in two pieces: the second turn waits for the rest.
        s.write_all(&REQ[..10]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        s.write_all(&REQ[10..]).unwrap();
        assert_eq!(answers(&mut s, 1).matches(" 200 OK").count(), 1);
        // Three pipelined requests in one write: three answers, in order.
        let three = [REQ, REQ, REQ].concat();
        s.write_all(&three).unwrap();
        assert_eq!(answers(&mut s, 3).matches(" 200 OK").count(), 3);
        // Connection: close ends the connection after its answer.
        s.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let last = answers(&mut s, 1);
        assert_eq!(last.matches(" 200 OK").count(), 1, "{last}");
        let mut rest = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(
            s.read_to_end(&mut rest).unwrap(),
            0,
            "the connection is closed"
        );
    }

    #[test]
    fn an_idle_connection_is_closed_after_the_header_timeout() {
        let addr = server();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(REQ).unwrap();
        assert_eq!(answers(&mut s, 1).matches(" 200 OK").count(), 1);
        // Idle between requests: closed within the header timeout (5 s), not kept for ever.
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut rest = Vec::new();
        assert_eq!(s.read_to_end(&mut rest).unwrap(), 0);
    }
}
