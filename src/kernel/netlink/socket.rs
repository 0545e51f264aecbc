//! The netfilter netlink socket: one batch in one `sendmsg`, replies read against a deadline,
//! and the release of the socket handed to the kernel. The same socket type, opened on
//! rtnetlink, answers the interface and route lookups of `kernel::link`.

use super::*;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::io::Errno;
use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{sockopt, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// Socket memory budgeted per reply that may come back (an error with its extended ACK).
const REPLY_BUDGET: usize = 1024;

/// The room for one datagram of replies; a larger datagram is refused as a protocol error,
/// never read cut short.
const RECV_BUF: usize = 1 << 16;

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
    /// `None` only while being dropped.
    sock: Option<OwnedFd>,
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
static DEFERRED_FDS: std::sync::Mutex<Vec<OwnedFd>> = std::sync::Mutex::new(Vec::new());

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
    let status = crate::sys::read_small("/proc/self/status", 4096);
    let disabled = crate::sys::read_small("/proc/sys/kernel/io_uring_disabled", 64);
    // With the hand-over, the ring is closed only after the sockets (below): it holds the
    // last references.
    let ring = match io_uring_allowed(status.as_deref(), disabled.as_deref()) {
        Err(why) => Err(why.to_string()),
        Ok(()) => register_in_a_ring(&fds),
    };
    let outcome = ring.as_ref().map(|_| ()).map_err(Clone::clone);
    // Registered or not, this process's descriptors are closed here (dropped).
    drop(fds);
    let release = match outcome {
        Ok(()) => Release::HandedOver(n),
        Err(why) => Release::Closed(n, why),
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

/// Registers `fds` as fixed files of a new io_uring and returns the ring: once the caller has
/// closed its descriptors, closing the ring makes its teardown (a kernel worker) drop the last
/// references. `Err` when the kernel refused the ring or the registration.
fn register_in_a_ring(fds: &[OwnedFd]) -> std::result::Result<OwnedFd, String> {
    let mut params = rustix::io_uring::io_uring_params::default();
    // SAFETY: `params` is a valid, zeroed io_uring_params the kernel fills in; the ring is
    // used for nothing but the registration below.
    let ring = unsafe { rustix::io_uring::io_uring_setup(1, &mut params) }
        .map_err(|e| format!("io_uring_setup: {e}"))?;
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    // SAFETY: `raw` is an array of `raw.len()` open descriptors, alive for the call; the kernel
    // takes its own references to the files.
    unsafe {
        rustix::io_uring::io_uring_register(
            &ring,
            rustix::io_uring::IoringRegisterOp::RegisterFiles,
            raw.as_ptr().cast(),
            raw.len() as u32,
        )
    }
    .map_err(|e| format!("io_uring_register: {e}"))?;
    Ok(ring)
}

impl Drop for NfSocket {
    fn drop(&mut self) {
        let Some(fd) = self.sock.take() else { return };
        if self.deferrable && DEFER_RELEASE.load(std::sync::atomic::Ordering::SeqCst) {
            DEFERRED_FDS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(fd);
        }
    }
}

/// Turns on a netlink socket option that takes an int (`NETLINK_EXT_ACK`, `NETLINK_CAP_ACK`),
/// which rustix does not wrap. Best effort: kernels without the option keep working.
fn set_netlink_flag(fd: BorrowedFd<'_>, opt: libc::c_int) {
    let v: libc::c_int = 1;
    // SAFETY: plain setsockopt on a socket we own, with a c_int option value of its size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            opt,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// An errno as natguard's error.
fn netlink_error(what: impl Into<String>, e: Errno) -> Error {
    Error::netlink(what, e.raw_os_error())
}

impl NfSocket {
    pub fn open() -> Result<Self> {
        Self::open_protocol(Some(rustix::net::netlink::NETFILTER), "netfilter netlink")
    }

    /// An rtnetlink socket with the same deadlines, for interface and route lookups.
    pub fn open_route() -> Result<Self> {
        // NETLINK_ROUTE is protocol 0, which rustix spells `None`.
        Self::open_protocol(None, "rtnetlink")
    }

    fn open_protocol(protocol: Option<rustix::net::Protocol>, name: &str) -> Result<Self> {
        let sock = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            protocol,
        )
        .map_err(|e| Error::io(format!("open {name} socket"), e.into()))?;
        // Port id 0: the kernel picks one.
        rustix::net::bind(&sock, &SocketAddrNetlink::new(0, 0))
            .map_err(|e| Error::io(format!("bind {name} socket"), e.into()))?;
        // Errors carry the kernel's extended ACK text, and not the whole request back.
        for opt in [libc::NETLINK_EXT_ACK, libc::NETLINK_CAP_ACK] {
            set_netlink_flag(sock.as_fd(), opt);
        }
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Ok(NfSocket {
            sock: Some(sock),
            seq,
            // Filled from its spare capacity: no page of it is zeroed or touched before a reply
            // needs it.
            recv_buf: Vec::with_capacity(RECV_BUF),
            reply_timeout: REPLY_TIMEOUT,
            sndbuf: None,
            rcvbuf: None,
            last_sent: None,
            deferrable: protocol == Some(rustix::net::netlink::NETFILTER),
        })
    }

    /// Replaces [`REPLY_TIMEOUT`] for this socket (tests of the deadline itself).
    pub fn set_reply_timeout(&mut self, t: std::time::Duration) {
        self.reply_timeout = t;
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_ref().expect("socket is open").as_fd()
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
        let have = match self.sndbuf {
            Some(h) => h,
            None => sockopt::socket_send_buffer_size(self.fd()).unwrap_or(0),
        };
        self.sndbuf = Some(have);
        if have >= need {
            return Ok(());
        }
        // The kernel doubles the value it is given.
        let ask = need.div_ceil(2).min(i32::MAX as usize);
        if sockopt::set_socket_send_buffer_size_force(self.fd(), ask).is_err() {
            let _ = sockopt::set_socket_send_buffer_size(self.fd(), ask);
        }
        let got = sockopt::socket_send_buffer_size(self.fd()).unwrap_or(have);
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
        let have = match self.rcvbuf {
            Some(h) => h,
            None if want <= 128 * REPLY_BUDGET => return, // far below every default
            None => sockopt::socket_recv_buffer_size(self.fd()).unwrap_or(0),
        };
        self.rcvbuf = Some(have);
        if have >= want {
            return;
        }
        let ask = want.div_ceil(2);
        if sockopt::set_socket_recv_buffer_size_force(self.fd(), ask).is_err() {
            let _ = sockopt::set_socket_recv_buffer_size(self.fd(), ask);
        }
        self.rcvbuf = Some(sockopt::socket_recv_buffer_size(self.fd()).unwrap_or(have));
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
        let kernel = SocketAddrNetlink::new(0, 0);
        let n = rustix::net::sendto(self.fd(), buf.as_bytes(), SendFlags::empty(), &kernel)
            .map_err(|e| netlink_error("send netlink request", e))?;
        if n != buf.as_bytes().len() {
            return Err(Error::Protocol(format!(
                "short netlink send: {n} of {} bytes",
                buf.as_bytes().len()
            )));
        }
        Ok(())
    }

    /// Waits up to `timeout` for replies and reads one datagram's worth. The read is tried
    /// first and the wait only when nothing is queued: the kernel answers nf_tables and
    /// ctnetlink requests inside the send, so a reply is usually there already and the poll
    /// would be one more system call per exchange.
    fn recv_within(&mut self, timeout: std::time::Duration) -> Result<Received> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let fd = self.sock.as_ref().expect("socket is open");
            self.recv_buf.clear();
            match rustix::net::recv(
                fd,
                rustix::buffer::spare_capacity(&mut self.recv_buf),
                RecvFlags::DONTWAIT | RecvFlags::TRUNC,
            ) {
                Ok((_, n)) => {
                    if n > self.recv_buf.len() {
                        return Err(Error::Protocol(format!(
                            "a {n}-byte netlink reply is larger than the {}-byte receive buffer",
                            self.recv_buf.capacity()
                        )));
                    }
                    return Ok(Received::Msgs(parse_msgs(&self.recv_buf)));
                }
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => {}
                Err(Errno::NOBUFS) => return Ok(Received::Overflow),
                Err(e) => return Err(netlink_error("receive netlink reply", e)),
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(Received::TimedOut);
            }
            let wait = Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            };
            let fd = self.fd();
            let mut pfd = [PollFd::new(&fd, PollFlags::IN)];
            match rustix::event::poll(&mut pfd, Some(&wait)) {
                Ok(0) => return Ok(Received::TimedOut),
                Ok(_) | Err(Errno::INTR) => {}
                Err(e) => return Err(Error::io("wait for a netlink reply", e.into())),
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
        let fd = self.fd();
        let mut pfd = [PollFd::new(&fd, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        !matches!(rustix::event::poll(&mut pfd, Some(&zero)), Ok(n) if n > 0)
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
