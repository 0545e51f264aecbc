//! Clients that run inside a namespace: the calling thread never moves. Each runs on a fresh
//! thread that joined the namespace with `setns(2)` ([`in_netns`]), so the test process itself
//! never leaves the root namespace. Every network operation is bounded by [`IO_TIMEOUT`].

use super::*;

/// Moves the calling thread into `ns` (setns affects only that thread), and makes sure it got
/// there: code meant for a test's namespace never runs against the root namespace.
pub fn join_netns(ns: &Netns) {
    let path = ns.path();
    let file = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: fd is a valid namespace file; CLONE_NEWNET moves only this thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", io::Error::last_os_error());
    let here = fs::metadata("/proc/thread-self/ns/net")
        .expect("stat /proc/thread-self/ns/net")
        .ino();
    let want = file.metadata().expect("stat the namespace file").ino();
    assert_eq!(here, want, "the thread is not in {path} after setns");
}

/// Runs `f` on a fresh thread that has joined `ns` ([`join_netns`]); the caller never moves.
pub fn in_netns<T, F>(ns: &Netns, f: F) -> T
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    std::thread::scope(|s| {
        let handle = s.spawn(|| {
            join_netns(ns);
            f()
        });
        match handle.join() {
            Ok(v) => v,
            Err(e) => std::panic::resume_unwind(e),
        }
    })
}

/// What a client saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server answered with this body (HTTP) or this text.
    Body(String),
    /// The connection was refused: a TCP reset (or an ICMP port unreachable) came back.
    Refused,
    /// Nothing came back within [`IO_TIMEOUT`].
    TimedOut,
    /// Any other error.
    Error(String),
}

impl Outcome {
    fn from_io(e: io::Error) -> Outcome {
        match e.kind() {
            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => Outcome::Refused,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Outcome::TimedOut,
            _ => Outcome::Error(e.to_string()),
        }
    }
}

/// `Outcome::Body(s)` for short assertions.
pub fn body(s: &str) -> Outcome {
    Outcome::Body(s.to_string())
}

/// HTTP GET `/` from inside `ns`; the body is trimmed.
pub fn http_get(ns: &Netns, addr: SocketAddr) -> Outcome {
    in_netns(ns, move || {
        let go = || -> io::Result<Outcome> {
            let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_write_timeout(Some(IO_TIMEOUT))?;
            write!(
                s,
                "GET / HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: natguard-test\r\n\r\n"
            )?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf)?;
            let text = String::from_utf8_lossy(&buf).into_owned();
            Ok(match text.split_once("\r\n\r\n") {
                Some((head, body)) if head.starts_with("HTTP/1.") => {
                    Outcome::Body(body.trim().to_string())
                }
                _ => Outcome::Error(format!("not an HTTP response: {text:?}")),
            })
        };
        go().unwrap_or_else(Outcome::from_io)
    })
}

/// Parses a peer address as printed by socat (`1.2.3.4` or `[0000:...:0001]`).
pub fn parse_peer(text: &str) -> Result<IpAddr, String> {
    let t = text.trim().trim_start_matches('[').trim_end_matches(']');
    t.parse::<IpAddr>()
        .map(|a| a.to_canonical())
        .map_err(|e| format!("not an address: {text:?} ({e})"))
}

/// Asks the TCP who-am-i server at `addr` which source address it sees, from inside `ns`.
pub fn tcp_whoami(ns: &Netns, addr: SocketAddr) -> Result<IpAddr, Outcome> {
    // Every caller expects the answer: its wait is a bound, stretched under emulation.
    tcp_whoami_within(ns, addr, super::deadline(IO_TIMEOUT))
}

/// [`tcp_whoami`] with `wait` bounding the connect, the write and the read.
pub fn tcp_whoami_within(ns: &Netns, addr: SocketAddr, wait: Duration) -> Result<IpAddr, Outcome> {
    in_netns(ns, move || {
        let go = || -> io::Result<String> {
            let mut s = TcpStream::connect_timeout(&addr, wait)?;
            s.set_read_timeout(Some(wait))?;
            s.set_write_timeout(Some(wait))?;
            s.write_all(b"who\n")?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        };
        match go() {
            Ok(text) => parse_peer(&text).map_err(Outcome::Error),
            Err(e) => Err(Outcome::from_io(e)),
        }
    })
}

/// Asks the UDP who-am-i server at `addr` which source address it sees, from inside `ns`.
/// The datagram is sent again every third of [`IO_TIMEOUT`] (the first one may wait for
/// neighbour resolution), until an answer comes or `deadline(IO_TIMEOUT)` has passed: every
/// caller expects the answer, so its wait is a bound, stretched under emulation (where the
/// server's fork of a shell per datagram can take seconds).
pub fn udp_whoami(ns: &Netns, addr: SocketAddr) -> Result<IpAddr, Outcome> {
    let end = std::time::Instant::now() + super::deadline(IO_TIMEOUT);
    in_netns(ns, move || {
        let go = || -> io::Result<String> {
            let bind: SocketAddr = if addr.is_ipv4() {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let s = UdpSocket::bind(bind)?;
            s.connect(addr)?;
            s.set_read_timeout(Some(IO_TIMEOUT / 3))?;
            let mut last = io::Error::from(io::ErrorKind::TimedOut);
            for i in 0.. {
                if i >= 3 && std::time::Instant::now() >= end {
                    break;
                }
                s.send(b"who\n")?;
                let mut buf = [0u8; 512];
                match s.recv(&mut buf) {
                    Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
                    Err(e) => last = e,
                }
            }
            Err(last)
        };
        match go() {
            Ok(text) => parse_peer(&text).map_err(Outcome::Error),
            Err(e) => Err(Outcome::from_io(e)),
        }
    })
}

/// One read, again where a signal interrupted it (the socket's read timeout still bounds it).
fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match s.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// Reads one HTTP response (headers and a Content-Length body) from `s`; returns the body.
pub fn read_response(s: &mut TcpStream) -> io::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = read_some(s, &mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed by the peer",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    if !head.starts_with("HTTP/1.") {
        return Err(io::Error::other(format!("not an HTTP response: {head:?}")));
    }
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .ok_or_else(|| io::Error::other(format!("no Content-Length in {head:?}")))?;
    while buf.len() < head_end + len {
        let n = read_some(s, &mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed in the body",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf[head_end..head_end + len])
        .trim()
        .to_string())
}
