//! The netfilter netlink socket: one batch in one `sendmsg`, replies read against a deadline,
//! and the release of the socket handed to the kernel. The same socket type, opened on
//! rtnetlink, answers the interface and route lookups of `kernel::link`.

use super::*;

/// Socket memory budgeted per reply that may come back (an error with its extended ACK).
const REPLY_BUDGET: usize = 1024;

/// The largest receive buffer natguard asks for. A batch whose error replies would need more
/// still ends correctly: its first reply is an error, which proves the batch was aborted.
pub const MAX_RCVBUF: usize = 8 << 20;

/// Whether a failed read or ctnetlink request may be sent again: a "try again" errno from the
/// kernel or an overflow, but not a timeout (waiting again would only double the wait).
pub fn is_retryable(e: &Error) -> bool {
    e.is_transient() && e.errno() != Some(TIMEOUT_ERRNO)
}

/// Why an nf_tables batch did not succeed.
#[derive(Debug)]
pub enum BatchError {
    /// Nothing of the batch was applied: the kernel answered with an error (on the message
    /// whose sequence number is given: the first error reply), or `sendmsg` failed and the
    /// kernel never saw it (`None`). Resending is safe (worth it for a "try again" errno).
    Rejected(Error, Option<u32>),
    /// The batch may or may not have been committed: replies were lost (`ENOBUFS`) or none came
    /// in time. It must not be resent.
    Unknown(Error),
}

/// One wait for replies.
enum Received {
    Msgs(Vec<Msg>),
    /// The receive buffer overflowed: the kernel dropped replies (`ENOBUFS`).
    Overflow,
    TimedOut,
}

/// A netfilter netlink socket in the network namespace of the calling thread.
pub struct NfSocket {
    sock: std::mem::ManuallyDrop<Socket>,
    seq: u32,
    recv_buf: Vec<u8>,
    reply_timeout: std::time::Duration,
    /// The kernel's `sk_sndbuf` and `sk_rcvbuf`, once read.
    sndbuf: Option<usize>,
    rcvbuf: Option<usize>,
    /// The buffer sent last: its id, first sequence number and message count.
    last_sent: Option<(u64, u32, u32)>,
    /// A netfilter socket, whose release [`defer_release`] defers (rtnetlink's is not).
    deferrable: bool,
}

/// The most messages one buffer may hold: far beyond any batch natguard builds (a GC of
/// thousands of pods is tens of thousands), far below where sequence numbers could wrap
/// into a range still awaiting replies.
pub const MAX_MESSAGES: usize = 1 << 24;

// Netfilter sockets dropped after `defer_release`, for `release_deferred`.
static DEFER_RELEASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static DEFERRED_FDS: std::sync::Mutex<Vec<std::os::fd::RawFd>> = std::sync::Mutex::new(Vec::new());

/// From now on, dropped netfilter sockets are kept open for [`release_deferred`].
pub fn defer_release() {
    DEFER_RELEASE.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// How [`release_deferred`] released the sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// There were none.
    Nothing,
    /// Registered in an io_uring that was closed after them: the ring's teardown, on a kernel
    /// worker, dropped the last references.
    HandedOver(usize),
    /// Closed in this process, which paid the kernel's wait; why io_uring was not used.
    Closed(usize, String),
}

/// Releasing a netfilter netlink socket waits until the kernel has freed every committed
/// nf_tables transaction of the namespace (`nft_rcv_nl_event` flushes the destroy work, which
/// waits for an RCU grace period: 7 to 9 ms here), even though the transaction took effect at
/// commit. A CNI invocation has nothing left to do by then, so [`defer_release`] keeps its
/// netfilter sockets open until [`release_deferred`], which hands them to the kernel instead
/// of closing them in this process. rtnetlink sockets have no such wait and are closed when
/// dropped.
///
/// The hand-over registers the sockets in a new io_uring instance, closes this process's
/// descriptors of them, and closes the ring last: the ring then holds the last references,
/// so its teardown (`io_ring_exit_work`, a kernel worker) releases the sockets, and the wait
/// happens there, whatever the timing of that worker. No process is created (nothing for a
/// subreaper to reap, nothing a pid limit can refuse) and no other descriptor is kept: only
/// the netlink sockets are registered. The worker's release holds nf_tables' commit mutex
/// while it waits, so a commit in the same namespace during that grace period waits for its
/// end, as it would behind a release in this process; nothing else is affected.
///
/// io_uring is not touched where the process runs under any seccomp filter (`Seccomp:` in
/// `/proc/self/status` is not 0, or cannot be read): a filter whose action for
/// `io_uring_setup` is to kill the process would turn a successful ADD, already replied to,
/// into a dead plugin. Nor where `kernel.io_uring_disabled` is set. There, and when the
/// kernel refuses the ring, the sockets are closed here and the invocation pays the wait.
/// The outcome is logged at debug level.
///
/// Call it last, after the reply is written.
pub fn release_deferred() -> Release {
    let fds = std::mem::take(&mut *DEFERRED_FDS.lock().unwrap_or_else(|e| e.into_inner()));
    let n = fds.len();
    if n == 0 {
        return Release::Nothing;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok();
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok();
    let outcome = match io_uring_allowed(status.as_deref(), disabled.as_deref()) {
        Err(why) => Err(why.to_string()),
        Ok(()) => hand_to_kernel(&fds),
    };
    let release = match outcome {
        Ok(()) => Release::HandedOver(n),
        Err(why) => {
            for fd in fds {
                // SAFETY: each fd was a socket of ours, kept open by Drop for exactly this close.
                unsafe { libc::close(fd) };
            }
            Release::Closed(n, why)
        }
    };
    match &release {
        Release::HandedOver(n) => {
            crate::debug!("released {n} netfilter socket(s): handed to the kernel through io_uring")
        }
        Release::Closed(n, why) => {
            crate::debug!("released {n} netfilter socket(s): closed here ({why})")
        }
        Release::Nothing => {}
    }
    release
}

/// Whether io_uring may be used for the hand-over, from `/proc/self/status` and
/// `/proc/sys/kernel/io_uring_disabled` (either `None` when unreadable; the sysctl exists from
/// 6.6 on). `Err` says why not.
pub fn io_uring_allowed(status: Option<&str>, disabled: Option<&str>) -> Result<(), &'static str> {
    let Some(status) = status else {
        return Err("/proc/self/status is unreadable, so a seccomp filter cannot be ruled out");
    };
    let seccomp = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(str::trim);
    match seccomp {
        Some("0") => {}
        Some(_) => return Err("the process runs under a seccomp filter"),
        None => return Err("/proc/self/status has no Seccomp line"),
    }
    match disabled.map(str::trim) {
        None | Some("0") => Ok(()),
        Some(_) => Err("kernel.io_uring_disabled is set"),
    }
}

/// Registers `fds` as fixed files of a new io_uring, closes them, then closes the ring, so
/// that the ring's teardown holds and drops the last references. On `Err` (the kernel refused
/// the ring or the registration) the descriptors are still open, for the caller to close.
fn hand_to_kernel(fds: &[std::os::fd::RawFd]) -> Result<(), String> {
    const IORING_REGISTER_FILES: libc::c_long = 2;
    // struct io_uring_params (120 bytes), zeroed: no flags, the kernel fills in the rest.
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup writes into a buffer of the size of struct io_uring_params.
    let ring = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            1 as libc::c_long,
            params.as_mut_ptr(),
        )
    };
    if ring < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("io_uring_setup: {e}"));
    }
    let ring = ring as libc::c_int;
    // SAFETY: `fds` is a valid array of `fds.len()` descriptors for the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring as libc::c_long,
            IORING_REGISTER_FILES,
            fds.as_ptr(),
            fds.len() as libc::c_long,
        )
    };
    let registered = if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "io_uring_register: {}",
            std::io::Error::last_os_error()
        ))
    };
    if registered.is_ok() {
        for &fd in fds {
            // SAFETY: each fd was a socket of ours, kept open by Drop for exactly this close;
            // the ring holds its own reference to the file.
            unsafe { libc::close(fd) };
        }
    }
    // SAFETY: the ring fd was created above and is closed once, after the sockets.
    unsafe { libc::close(ring) };
    registered
}

impl Drop for NfSocket {
    fn drop(&mut self) {
        if self.deferrable && DEFER_RELEASE.load(std::sync::atomic::Ordering::SeqCst) {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&*self.sock);
            DEFERRED_FDS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(fd);
        } else {
            // SAFETY: dropped exactly once, here.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.sock) };
        }
    }
}

fn sockopt_int(fd: libc::c_int, opt: libc::c_int) -> Option<usize> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into a c_int of the given size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0 && v >= 0).then_some(v as usize)
}

fn set_sockopt_int(fd: libc::c_int, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> bool {
    // SAFETY: plain setsockopt on a socket we own, with a c_int option value.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

impl NfSocket {
    pub fn open() -> Result<Self> {
        Self::open_protocol(NETLINK_NETFILTER, "netfilter netlink")
    }

    /// An rtnetlink socket with the same deadlines, for interface and route lookups.
    pub fn open_route() -> Result<Self> {
        Self::open_protocol(netlink_sys::protocols::NETLINK_ROUTE, "rtnetlink")
    }

    fn open_protocol(protocol: isize, name: &str) -> Result<Self> {
        let mut sock =
            Socket::new(protocol).map_err(|e| Error::io(format!("open {name} socket"), e))?;
        sock.bind_auto()
            .map_err(|e| Error::io(format!("bind {name} socket"), e))?;
        // Errors carry the kernel's extended ACK text, and not the whole request back.
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
        for opt in [libc::NETLINK_EXT_ACK, libc::NETLINK_CAP_ACK] {
            set_sockopt_int(fd, libc::SOL_NETLINK, opt, 1);
        }
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Ok(NfSocket {
            sock: std::mem::ManuallyDrop::new(sock),
            seq,
            recv_buf: vec![0u8; 1 << 16],
            reply_timeout: REPLY_TIMEOUT,
            sndbuf: None,
            rcvbuf: None,
            last_sent: None,
            deferrable: protocol == NETLINK_NETFILTER,
        })
    }

    /// Replaces [`REPLY_TIMEOUT`] for this socket (tests of the deadline itself).
    pub fn set_reply_timeout(&mut self, t: std::time::Duration) {
        self.reply_timeout = t;
    }

    fn fd(&self) -> libc::c_int {
        std::os::fd::AsRawFd::as_raw_fd(&*self.sock)
    }

    /// A fresh buffer whose sequence numbers continue this socket's. Its range is sized
    /// when it is sent (sending moves the socket past its last message), so a
    /// batch of any length never shares a number with the buffer after it, and replies to
    /// one exchange are never taken for another's. Build and send one buffer at a time.
    pub fn msgbuf(&mut self) -> MsgBuf {
        MsgBuf::new(self.seq)
    }

    /// Claims the sequence numbers of `buf` as it is sent: a fresh buffer (starting where the
    /// socket stands) moves the socket past its last message; the buffer sent last may be
    /// sent again (a batch the kernel rejected whole). Anything else would reuse numbers of
    /// an earlier exchange, whose late replies could then be read as this one's: refused.
    pub(super) fn claim_seqs(&mut self, buf: &MsgBuf) -> Result<()> {
        let Some(&(first, _)) = buf.seqs().first() else {
            return Ok(());
        };
        let count = buf.message_count();
        if count > MAX_MESSAGES {
            return Err(Error::Protocol(format!(
                "internal error: a netlink buffer of {count} messages (at most {MAX_MESSAGES})"
            )));
        }
        let range = (buf.id(), first, count as u32);
        if first == self.seq {
            self.seq = first.wrapping_add(count as u32);
            self.last_sent = Some(range);
            return Ok(());
        }
        if self.last_sent == Some(range) {
            return Ok(());
        }
        Err(Error::Protocol(format!(
            "internal error: a netlink buffer starting at sequence number {first} was sent out of turn (the socket is at {})",
            self.seq
        )))
    }

    /// Grows the send buffer so that `len` bytes go out in one `sendmsg`: netlink refuses a
    /// message longer than `sk_sndbuf - 32` with `EMSGSIZE`.
    fn make_send_room(&mut self, len: usize) -> Result<()> {
        let need = len + 64;
        let fd = self.fd();
        let have = match self.sndbuf {
            Some(h) => h,
            None => sockopt_int(fd, libc::SO_SNDBUF).unwrap_or(0),
        };
        self.sndbuf = Some(have);
        if have >= need {
            return Ok(());
        }
        // The kernel doubles the value it is given.
        let ask = need.div_ceil(2).min(i32::MAX as usize) as libc::c_int;
        if !set_sockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, ask) {
            set_sockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, ask);
        }
        let got = sockopt_int(fd, libc::SO_SNDBUF).unwrap_or(have);
        self.sndbuf = Some(got);
        if got < need {
            return Err(Error::netlink(
                format!(
                    "send a {len}-byte netlink request: the socket send buffer is {got} bytes and may not grow (SO_SNDBUFFORCE needs CAP_NET_ADMIN)"
                ),
                libc::EMSGSIZE,
            ));
        }
        Ok(())
    }

    /// Grows the receive buffer for `replies` possible replies (best effort, see [`MAX_RCVBUF`]).
    fn make_recv_room(&mut self, replies: usize) {
        let want = replies.saturating_mul(REPLY_BUDGET).min(MAX_RCVBUF);
        let fd = self.fd();
        let have = match self.rcvbuf {
            Some(h) => h,
            None if want <= 128 * REPLY_BUDGET => return, // far below every default
            None => sockopt_int(fd, libc::SO_RCVBUF).unwrap_or(0),
        };
        self.rcvbuf = Some(have);
        if have >= want {
            return;
        }
        let ask = want.div_ceil(2) as libc::c_int;
        if !set_sockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, ask) {
            set_sockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, ask);
        }
        self.rcvbuf = Some(sockopt_int(fd, libc::SO_RCVBUF).unwrap_or(have));
    }

    fn send(&mut self, buf: &MsgBuf) -> Result<()> {
        if buf.is_oversized() {
            // Builders split what could grow; reaching this is a bug, never a kernel refusal.
            return Err(Error::Protocol(
                "internal error: a netlink attribute longer than 65,535 bytes was built".into(),
            ));
        }
        if let Some(what) = buf.unencodable() {
            // Builders bound what they encode; reaching this is a bug, never a kernel refusal.
            return Err(Error::Protocol(format!(
                "internal error: {what} was built into a netlink message"
            )));
        }
        self.claim_seqs(buf)?;
        self.make_send_room(buf.len())?;
        let kernel = SocketAddr::new(0, 0);
        let n =
            self.sock
                .send_to(buf.as_bytes(), &kernel, 0)
                .map_err(|e| match e.raw_os_error() {
                    Some(errno) => Error::netlink("send netlink request", errno),
                    None => Error::io("send netlink request", e),
                })?;
        if n != buf.as_bytes().len() {
            return Err(Error::Protocol(format!(
                "short netlink send: {n} of {} bytes",
                buf.as_bytes().len()
            )));
        }
        Ok(())
    }

    /// Waits up to `timeout` for replies and reads one datagram's worth.
    fn recv_within(&mut self, timeout: std::time::Duration) -> Result<Received> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(Error::io("wait for a netlink reply", e));
            }
            if r == 0 {
                return Ok(Received::TimedOut);
            }
            // SAFETY: recv into our own buffer of the given length.
            let n = unsafe {
                libc::recv(
                    self.fd(),
                    self.recv_buf.as_mut_ptr() as *mut libc::c_void,
                    self.recv_buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                )
            };
            if n >= 0 {
                let n = n as usize;
                if n > self.recv_buf.len() {
                    return Err(Error::Protocol(format!(
                        "a {n}-byte netlink reply is larger than the {}-byte receive buffer",
                        self.recv_buf.len()
                    )));
                }
                return Ok(Received::Msgs(parse_msgs(&self.recv_buf[..n])));
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
                Some(libc::ENOBUFS) => return Ok(Received::Overflow),
                Some(errno) => return Err(Error::netlink("receive netlink reply", errno)),
                None => return Err(Error::io("receive netlink reply", e)),
            }
        }
    }

    fn timed_out(&self, what: &str) -> Error {
        Error::netlink(
            format!(
                "{what}: no reply from the kernel within {} s",
                self.reply_timeout.as_secs_f32()
            ),
            TIMEOUT_ERRNO,
        )
    }

    /// Sends independent (non-batch) messages in one write, and waits for the reply of each
    /// message that asked for an ACK; an error of any message is reported too. Fails with the
    /// first non-zero error, naming the message's `what`. An overflow fails with `ENOBUFS`, no
    /// reply in time with [`TIMEOUT_ERRNO`].
    pub fn transact(&mut self, buf: &MsgBuf, what: &dyn Fn(u32) -> String) -> Result<()> {
        let mine = |seq: u32| buf.has_seq(seq);
        let mut pending: Vec<u32> = buf.acked_seqs().collect();
        self.make_recv_room(buf.message_count());
        self.send(buf)?;
        let mut first_err: Option<Error> = None;
        while !pending.is_empty() {
            let label = what(pending[0]);
            match self.recv_within(self.reply_timeout)? {
                Received::Msgs(msgs) => {
                    for m in msgs {
                        let Some(code) = m.error_code() else { continue };
                        if !mine(m.seq) {
                            continue;
                        }
                        pending.retain(|&s| s != m.seq);
                        if code != 0 && first_err.is_none() {
                            first_err = Some(reply_error(&m, what(m.seq), code));
                        }
                    }
                }
                Received::Overflow => {
                    return Err(first_err.unwrap_or_else(|| {
                        Error::netlink(
                            format!("{label}: replies lost (receive buffer overflow)"),
                            libc::ENOBUFS,
                        )
                    }))
                }
                Received::TimedOut => {
                    return Err(first_err.unwrap_or_else(|| self.timed_out(&label)))
                }
            }
            // The kernel answers within sendmsg: once an error is in, what is not queued yet
            // will not come.
            if first_err.is_some() && self.nothing_queued() {
                break;
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends an nf_tables batch (BATCH_BEGIN ... BATCH_END, built with [`MsgBuf::ack_last`] on
    /// its last real message) and reads its replies; see the module documentation.
    pub fn transact_batch(
        &mut self,
        buf: &MsgBuf,
        what: &dyn Fn(u32) -> String,
    ) -> std::result::Result<(), BatchError> {
        let begin_seq = buf.seqs().first().map(|s| s.0);
        let Some(last) = buf.acked_seqs().last() else {
            return Err(BatchError::Rejected(
                Error::Protocol(
                    "internal error: an nf_tables batch without an acknowledged message".into(),
                ),
                None,
            ));
        };
        let mine = |seq: u32| buf.has_seq(seq);
        self.make_recv_room(buf.message_count());
        // A failed sendmsg delivered nothing.
        self.send(buf).map_err(|e| BatchError::Rejected(e, None))?;
        let mut first_err: Option<(Error, u32)> = None;
        let mut done = false;
        while !done {
            match self.recv_within(self.reply_timeout) {
                Err(e) => return Err(BatchError::Unknown(e)),
                Ok(Received::Msgs(msgs)) => {
                    for m in msgs {
                        let Some(code) = m.error_code() else { continue };
                        if !mine(m.seq) {
                            continue;
                        }
                        if code != 0 && first_err.is_none() {
                            let w = if Some(m.seq) == begin_seq {
                                "nftables transaction".to_string()
                            } else {
                                what(m.seq)
                            };
                            first_err = Some((reply_error(&m, w, code), m.seq));
                        }
                        done |= m.seq == last;
                    }
                    // An error on BATCH_BEGIN may be all there is (see the module
                    // documentation); everything the batch produced is queued by now.
                    if !done && first_err.is_some() && self.nothing_queued() {
                        done = true;
                    }
                }
                // Any error reply proves the batch was aborted, lost replies or not.
                Ok(Received::Overflow) if first_err.is_some() => done = true,
                Ok(Received::TimedOut) if first_err.is_some() => done = true,
                Ok(Received::Overflow) => {
                    return Err(BatchError::Unknown(Error::netlink(
                        format!(
                            "nftables transaction of {} messages: its replies were lost (receive buffer overflow), so whether it was applied is unknown; it was not resent",
                            buf.message_count()
                        ),
                        libc::ENOBUFS,
                    )))
                }
                Ok(Received::TimedOut) => {
                    return Err(BatchError::Unknown(self.timed_out(&format!(
                        "nftables transaction of {} messages (whether it was applied is unknown; it was not resent)",
                        buf.message_count()
                    ))))
                }
            }
        }
        match first_err {
            Some((e, seq)) => Err(BatchError::Rejected(e, Some(seq))),
            None => Ok(()),
        }
    }

    fn nothing_queued(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        r <= 0
    }

    /// Sends one request (a GET, with or without NLM_F_DUMP) and collects the reply messages
    /// until NLMSG_DONE, or the single reply of a non-dump GET. Each reply is awaited at most
    /// the reply timeout; an overflow fails with `ENOBUFS`.
    pub fn request(&mut self, buf: &MsgBuf, what: &str) -> Result<Vec<Msg>> {
        let seq = buf.seqs().first().map(|s| s.0).unwrap_or(0);
        // Some single replies (ctnetlink stats) carry NLM_F_MULTI without a closing DONE:
        // the reply to a request that did not ask for a dump is final whatever its flags.
        let dump = buf
            .as_bytes()
            .get(6..8)
            .map(|f| u16::from_ne_bytes([f[0], f[1]]) & NLM_F_DUMP == NLM_F_DUMP)
            .unwrap_or(false);
        self.send(buf)?;
        let mut reader = ReplyReader::new(seq, dump, what);
        loop {
            let msgs = match self.recv_within(self.reply_timeout)? {
                Received::Msgs(m) => m,
                Received::Overflow => {
                    return Err(Error::netlink(
                        format!("{what}: replies lost (receive buffer overflow)"),
                        libc::ENOBUFS,
                    ))
                }
                Received::TimedOut => return Err(self.timed_out(what)),
            };
            for m in msgs {
                if let Some(end) = reader.take(m) {
                    return end;
                }
            }
        }
    }

    /// Like [`NfSocket::request`], retried on "try again" errnos (EBUSY, ENOBUFS, EINTR for an
    /// interrupted dump) a bounded number of times; never after a timeout.
    pub fn request_retry(&mut self, build: &dyn Fn(&mut MsgBuf), what: &str) -> Result<Vec<Msg>> {
        let mut attempt = 0;
        loop {
            let mut b = self.msgbuf();
            build(&mut b);
            match self.request(&b, what) {
                Err(e) if is_retryable(&e) && attempt < TRANSIENT_RETRIES => {
                    attempt += 1;
                    backoff(attempt);
                }
                r => return r,
            }
        }
    }
}

/// The replies of one request, read message by message until the exchange ends: a dump ends
/// with `NLMSG_DONE`, a single GET with its one reply, anything with an error.
///
/// `NLMSG_DONE` carries the dump's own outcome (the kernel's `dump_done_errno`: 0, or the
/// negative errno that stopped the dump callback, with the extended ACK text after it). A dump
/// that ended with an error is an error, never the short list read so far; one the kernel
/// marked `NLM_F_DUMP_INTR` (the table changed under it) is read to its end and then fails with
/// `EINTR`, which [`NfSocket::request_retry`] sends again.
pub(crate) struct ReplyReader<'a> {
    seq: u32,
    dump: bool,
    what: &'a str,
    interrupted: bool,
    out: Vec<Msg>,
}

impl<'a> ReplyReader<'a> {
    pub(crate) fn new(seq: u32, dump: bool, what: &'a str) -> Self {
        ReplyReader {
            seq,
            dump,
            what,
            interrupted: false,
            out: Vec::new(),
        }
    }

    fn interrupted_error(&self) -> Error {
        Error::netlink(
            format!(
                "{} (dump interrupted: the kernel's state changed during it)",
                self.what
            ),
            libc::EINTR,
        )
    }

    /// Takes one received message; `Some` once the exchange has ended, with its outcome.
    pub(crate) fn take(&mut self, m: Msg) -> Option<Result<Vec<Msg>>> {
        if m.seq != self.seq {
            return None;
        }
        self.interrupted |= m.flags & NLM_F_DUMP_INTR != 0;
        match m.msg_type {
            NLMSG_DONE => {
                let code = done_errno(&m);
                if code < 0 {
                    return Some(Err(done_error(&m, self.what, code)));
                }
                if self.interrupted {
                    return Some(Err(self.interrupted_error()));
                }
                Some(Ok(std::mem::take(&mut self.out)))
            }
            NLMSG_ERROR => {
                let code = m.error_code().unwrap_or(0);
                if code != 0 {
                    return Some(Err(reply_error(&m, self.what.to_string(), code)));
                }
                if self.interrupted {
                    return Some(Err(self.interrupted_error()));
                }
                Some(Ok(std::mem::take(&mut self.out)))
            }
            _ => {
                let more = self.dump && m.flags & NLM_F_MULTI != 0;
                self.out.push(m);
                (!more).then(|| Ok(std::mem::take(&mut self.out)))
            }
        }
    }
}

/// The errno a `NLMSG_DONE` carries (0 or negative); 0 when its body is too short to hold one
/// (kernels before 2.6.x sent an empty DONE for some families).
fn done_errno(m: &Msg) -> i32 {
    m.body
        .get(..4)
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
        .unwrap_or(0)
}

/// The error of a dump the kernel ended with `NLMSG_DONE` and a negative errno, with its
/// extended ACK text (attributes straight after the errno) if any.
fn done_error(m: &Msg, what: &str, code: i32) -> Error {
    const NLM_F_ACK_TLVS: u16 = 0x200;
    const NLMSGERR_ATTR_MSG: u16 = 1;
    let text = (m.flags & NLM_F_ACK_TLVS != 0)
        .then(|| Attrs::new(m.body.get(4..).unwrap_or(&[])).get(NLMSGERR_ATTR_MSG))
        .flatten()
        .map(|a| a.str().to_string())
        .filter(|t| !t.is_empty());
    let w = match text {
        Some(t) => format!("{what} (the dump failed: {t})"),
        None => format!("{what} (the dump failed)"),
    };
    Error::netlink(w, -code)
}

/// The error a NLMSG_ERROR reply carries, with the kernel's extended ACK text if any.
fn reply_error(m: &Msg, what: String, code: i32) -> Error {
    let w = match ext_ack_msg(m) {
        Some(t) => format!("{what} ({t})"),
        None => what,
    };
    Error::netlink(w, -code)
}

/// A short, growing pause between retries of a transient failure.
pub fn backoff(attempt: usize) {
    std::thread::sleep(std::time::Duration::from_millis(2u64 << attempt.min(6)));
}

/// The extended ACK's message text (NLMSGERR_ATTR_MSG), if the kernel sent one.
fn ext_ack_msg(m: &Msg) -> Option<String> {
    const NLM_F_ACK_TLVS: u16 = 0x200;
    const NLM_F_CAPPED: u16 = 0x100;
    const NLMSGERR_ATTR_MSG: u16 = 1;
    if m.flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    // nlmsgerr = error (4) + the request's nlmsghdr (16), plus its payload if not capped.
    let orig_len = u32::from_ne_bytes(m.body.get(4..8)?.try_into().ok()?) as usize;
    let skip = if m.flags & NLM_F_CAPPED != 0 {
        4 + NLMSG_HDRLEN
    } else {
        4 + align4(orig_len)
    };
    let t = Attrs::new(m.body.get(skip..)?)
        .get(NLMSGERR_ATTR_MSG)?
        .str();
    (!t.is_empty()).then(|| t.to_string())
}
