//! A small synchronous netfilter netlink client: message building, attribute parsing, and a
//! socket that sends a whole batch at once and checks every ACK against its sequence number.
//!
//! natguard lives for milliseconds, so there is no async runtime and no per-object round trip:
//! callers build all messages into one [`MsgBuf`], send it with one `sendmsg`, and read back the
//! replies. Messages are laid out by hand (`nlmsghdr` + `nfgenmsg` + attributes) because the
//! crates that model nf_tables either bind GPL C libraries or cannot express NAT, masquerade and
//! reject expressions; the layout is small and fixed by the kernel ABI.

use crate::error::{Error, Result};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

pub const NLMSG_HDRLEN: usize = 16;
pub const NFGEN_HDRLEN: usize = 4;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_DUMP_INTR: u16 = 0x10;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_REPLACE: u16 = 0x100;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
pub const NLM_F_DUMP: u16 = 0x300;

pub const NLMSG_ERROR: u16 = 0x2;
pub const NLMSG_DONE: u16 = 0x3;

pub const NLA_F_NESTED: u16 = 0x8000;
pub const NLA_F_NET_BYTEORDER: u16 = 0x4000;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

pub const NFNL_SUBSYS_CTNETLINK: u8 = 1;
pub const NFNL_SUBSYS_NFTABLES: u8 = 10;
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub const NFNL_MSG_BATCH_END: u16 = 0x11;

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A buffer of one or more netlink messages, built in place.
#[derive(Default, Debug, Clone)]
pub struct MsgBuf {
    buf: Vec<u8>,
    msg_start: Option<usize>,
    next_seq: u32,
    /// (seq, wants_ack) of each message, in order.
    seqs: Vec<(u32, bool)>,
}

impl MsgBuf {
    pub fn new(first_seq: u32) -> Self {
        MsgBuf {
            buf: Vec::with_capacity(4096),
            msg_start: None,
            next_seq: first_seq,
            seqs: Vec::new(),
        }
    }

    /// Starts a netfilter message: `nlmsghdr` then `nfgenmsg {family, version 0, res_id}`.
    pub fn begin(&mut self, msg_type: u16, flags: u16, family: u8, res_id: u16) -> u32 {
        assert!(self.msg_start.is_none(), "netlink message not ended");
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.msg_start = Some(self.buf.len());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in end()
        self.buf.extend_from_slice(&msg_type.to_ne_bytes());
        self.buf
            .extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
        self.buf.push(family);
        self.buf.push(0); // NFNETLINK_V0
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        self.seqs.push((seq, flags & NLM_F_ACK != 0));
        seq
    }

    pub fn end(&mut self) {
        let start = self.msg_start.take().expect("no netlink message begun");
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    pub fn attr(&mut self, ty: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    /// A NUL-terminated string attribute.
    pub fn attr_str(&mut self, ty: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.attr(ty, &v);
    }

    pub fn attr_u32_be(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_be_bytes());
    }

    pub fn attr_u64_be(&mut self, ty: u16, v: u64) {
        self.attr(ty, &v.to_be_bytes());
    }

    pub fn attr_u8(&mut self, ty: u16, v: u8) {
        self.attr(ty, &[v]);
    }

    pub fn attr_u16_be(&mut self, ty: u16, v: u16) {
        self.attr(ty, &v.to_be_bytes());
    }

    /// Opens a nested attribute; close it with [`MsgBuf::nest_end`].
    pub fn nest_begin(&mut self, ty: u16) -> usize {
        let pos = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        pos
    }

    pub fn nest_end(&mut self, pos: usize) {
        let len = (self.buf.len() - pos) as u16;
        self.buf[pos..pos + 2].copy_from_slice(&len.to_ne_bytes());
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn message_count(&self) -> usize {
        self.seqs.len()
    }

    pub fn acked_seqs(&self) -> impl Iterator<Item = u32> + '_ {
        self.seqs.iter().filter(|(_, a)| *a).map(|(s, _)| *s)
    }

    pub fn seqs(&self) -> &[(u32, bool)] {
        &self.seqs
    }
}

/// One attribute: its type (flags masked off) and payload.
#[derive(Debug, Clone, Copy)]
pub struct Attr<'a> {
    pub ty: u16,
    pub payload: &'a [u8],
}

impl<'a> Attr<'a> {
    pub fn nested(&self) -> Attrs<'a> {
        Attrs::new(self.payload)
    }
    pub fn str(&self) -> &'a str {
        let p = self.payload;
        let end = p.iter().position(|&b| b == 0).unwrap_or(p.len());
        std::str::from_utf8(&p[..end]).unwrap_or("")
    }
    pub fn u32_be(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.payload.get(..4)?.try_into().ok()?))
    }
    pub fn u64_be(&self) -> Option<u64> {
        Some(u64::from_be_bytes(self.payload.get(..8)?.try_into().ok()?))
    }
    pub fn u16_be(&self) -> Option<u16> {
        Some(u16::from_be_bytes(self.payload.get(..2)?.try_into().ok()?))
    }
}

/// Iterates the attributes of a payload; stops at the first malformed one.
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    rest: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Attrs { rest: buf }
    }
    /// The first attribute of the given type.
    pub fn get(&self, ty: u16) -> Option<Attr<'a>> {
        self.clone().find(|a| a.ty == ty)
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Attr<'a>;
    fn next(&mut self) -> Option<Attr<'a>> {
        if self.rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([self.rest[0], self.rest[1]]) as usize;
        let ty = u16::from_ne_bytes([self.rest[2], self.rest[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > self.rest.len() {
            self.rest = &[];
            return None;
        }
        let payload = &self.rest[4..len];
        self.rest = &self.rest[align4(len).min(self.rest.len())..];
        Some(Attr { ty, payload })
    }
}

/// A received netlink message.
#[derive(Debug, Clone)]
pub struct Msg {
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    /// Everything after the nlmsghdr.
    pub body: Vec<u8>,
}

impl Msg {
    /// For netfilter messages: the attributes after the nfgenmsg header.
    pub fn nf_attrs(&self) -> Attrs<'_> {
        Attrs::new(self.body.get(NFGEN_HDRLEN..).unwrap_or(&[]))
    }
    pub fn nf_family(&self) -> u8 {
        self.body.first().copied().unwrap_or(0)
    }
    /// For NLMSG_ERROR: the (negative) errno, 0 for an ACK.
    pub fn error_code(&self) -> Option<i32> {
        if self.msg_type != NLMSG_ERROR {
            return None;
        }
        Some(i32::from_ne_bytes(self.body.get(..4)?.try_into().ok()?))
    }
}

/// Splits a receive buffer into messages.
pub fn parse_msgs(mut buf: &[u8]) -> Vec<Msg> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            break;
        }
        out.push(Msg {
            msg_type: u16::from_ne_bytes(buf[4..6].try_into().unwrap()),
            flags: u16::from_ne_bytes(buf[6..8].try_into().unwrap()),
            seq: u32::from_ne_bytes(buf[8..12].try_into().unwrap()),
            body: buf[NLMSG_HDRLEN..len].to_vec(),
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    out
}

/// How many times a request that failed with a "try again" errno is resent.
pub const TRANSIENT_RETRIES: usize = 5;

/// A netfilter netlink socket in the network namespace of the calling thread.
pub struct NfSocket {
    sock: std::mem::ManuallyDrop<Socket>,
    seq: u32,
    recv_buf: Vec<u8>,
}

/// Releasing a netfilter netlink socket waits until the kernel has freed every committed
/// nf_tables transaction (`nft_rcv_nl_event` flushes the destroy work, an RCU grace period:
/// 7 to 9 ms here), even though the transaction took effect at commit. A CNI invocation has
/// nothing left to do by then, so [`defer_release`] lets its sockets outlive the reply: they
/// are handed to a short-lived child that closes them 100 ms later, once the kernel is done.
static DEFER_RELEASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static DEFERRED_FDS: std::sync::Mutex<Vec<std::os::fd::RawFd>> = std::sync::Mutex::new(Vec::new());

/// From now on, dropped sockets are kept open for [`release_deferred`].
pub fn defer_release() {
    DEFER_RELEASE.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Releases the sockets kept by [`defer_release`] in a detached child, so this process can exit
/// at once. Call it last, after the reply is written: the child closes stdin, stdout and
/// stderr first, so the runtime reading them sees end-of-file when this process exits.
pub fn release_deferred() {
    let fds = std::mem::take(&mut *DEFERRED_FDS.lock().unwrap_or_else(|e| e.into_inner()));
    if fds.is_empty() {
        return;
    }
    // SAFETY: the process is single-threaded here (conntrack worker threads have been joined);
    // the child only calls async-signal-safe functions (close, setsid, nanosleep, _exit).
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            libc::close(0);
            libc::close(1);
            libc::close(2);
            libc::setsid();
            // The kernel frees the transaction one RCU grace period after the commit. Released
            // after that, the sockets cost nothing; released before, their release would hold
            // nf_tables' commit mutex while it waits, stalling the next invocation's commit.
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            };
            libc::nanosleep(&pause, std::ptr::null_mut());
            libc::_exit(0); // exiting releases the sockets; nobody waits for this child
        }
        // Parent (or a failed fork): our references go; with a child holding them this is
        // not the last one, so no wait.
        for fd in fds {
            libc::close(fd);
        }
    }
}

impl Drop for NfSocket {
    fn drop(&mut self) {
        if DEFER_RELEASE.load(std::sync::atomic::Ordering::SeqCst) {
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

impl NfSocket {
    pub fn open() -> Result<Self> {
        let mut sock = Socket::new(NETLINK_NETFILTER)
            .map_err(|e| Error::io("open netfilter netlink socket", e))?;
        sock.bind_auto()
            .map_err(|e| Error::io("bind netfilter netlink socket", e))?;
        // Errors carry the kernel's extended ACK text, and not the whole request back.
        let one: libc::c_int = 1;
        for opt in [libc::NETLINK_EXT_ACK, libc::NETLINK_CAP_ACK] {
            // SAFETY: plain setsockopt on a socket we own, with a c_int option value.
            unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&sock),
                    libc::SOL_NETLINK,
                    opt,
                    &one as *const _ as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Ok(NfSocket {
            sock: std::mem::ManuallyDrop::new(sock),
            seq,
            recv_buf: vec![0u8; 1 << 16],
        })
    }

    /// A fresh buffer whose sequence numbers continue this socket's.
    pub fn msgbuf(&mut self) -> MsgBuf {
        let b = MsgBuf::new(self.seq);
        self.seq = self.seq.wrapping_add(1 << 16);
        b
    }

    fn send(&self, buf: &MsgBuf) -> Result<()> {
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

    fn recv(&mut self) -> Result<Vec<Msg>> {
        loop {
            match self.sock.recv(&mut &mut self.recv_buf[..], 0) {
                Ok(n) => return Ok(parse_msgs(&self.recv_buf[..n])),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    return Err(match e.raw_os_error() {
                        Some(errno) => Error::netlink("receive netlink reply", errno),
                        None => Error::io("receive netlink reply", e),
                    })
                }
            }
        }
    }

    /// Sends every message of `buf` in one write and waits for the ACK of each message that
    /// asked for one. Fails with the first non-zero error, naming the message's `what`.
    ///
    /// Netfilter processes a batch synchronously and answers each ACK-flagged message, so the
    /// ACK of the last such message ends the exchange.
    pub fn transact(&mut self, buf: &MsgBuf, what: &dyn Fn(u32) -> String) -> Result<()> {
        self.send(buf)?;
        let mut pending: Vec<u32> = buf.acked_seqs().collect();
        let mut first_err: Option<Error> = None;
        while !pending.is_empty() {
            for m in self.recv()? {
                if let Some(code) = m.error_code() {
                    if let Some(i) = pending.iter().position(|&s| s == m.seq) {
                        pending.remove(i);
                        if code != 0 && first_err.is_none() {
                            let text = ext_ack_msg(&m);
                            let mut w = what(m.seq);
                            if let Some(t) = text {
                                w = format!("{w} ({t})");
                            }
                            first_err = Some(Error::netlink(w, -code));
                        }
                    }
                }
            }
            // A failed batch is aborted as a whole; the kernel may not answer the rest.
            if first_err.is_some() && self.nothing_queued() {
                break;
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn nothing_queued(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&*self.sock),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        r <= 0
    }

    /// Sends one request (a GET, with or without NLM_F_DUMP) and collects the reply messages
    /// until NLMSG_DONE, or the single reply of a non-dump GET.
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
        let mut out = Vec::new();
        let mut interrupted = false;
        loop {
            for m in self.recv()? {
                if m.seq != seq {
                    continue;
                }
                // The kernel changed the table under a multi-part dump: its answer may be
                // inconsistent. Read it to the end, then EINTR makes `request_retry` ask again.
                interrupted |= m.flags & NLM_F_DUMP_INTR != 0;
                match m.msg_type {
                    NLMSG_DONE if interrupted => {
                        return Err(Error::netlink(
                            format!("{what} (dump interrupted)"),
                            libc::EINTR,
                        ))
                    }
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let code = m.error_code().unwrap_or(0);
                        if code == 0 {
                            return Ok(out);
                        }
                        let mut w = what.to_string();
                        if let Some(t) = ext_ack_msg(&m) {
                            w = format!("{w} ({t})");
                        }
                        return Err(Error::netlink(w, -code));
                    }
                    _ => {
                        let more = dump && m.flags & NLM_F_MULTI != 0;
                        out.push(m);
                        if !more {
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }

    /// Like [`NfSocket::request`], retried on "try again" errnos (EBUSY, ENOBUFS, EINTR for an
    /// interrupted dump) a bounded number of times.
    pub fn request_retry(&mut self, build: &dyn Fn(&mut MsgBuf), what: &str) -> Result<Vec<Msg>> {
        let mut attempt = 0;
        loop {
            let mut b = self.msgbuf();
            build(&mut b);
            match self.request(&b, what) {
                Err(e) if e.is_transient() && attempt < TRANSIENT_RETRIES => {
                    attempt += 1;
                    backoff(attempt);
                }
                r => return r,
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_and_parses_nested_attributes() {
        let mut b = MsgBuf::new(7);
        b.begin(0x0a00, NLM_F_ACK, 1, 0);
        b.attr_str(1, "natguard");
        let n = b.nest_begin(2);
        b.attr_u32_be(1, 0xdead_beef);
        b.attr_u8(2, 9);
        b.nest_end(n);
        b.end();
        let msgs = parse_msgs(b.as_bytes());
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].seq, 7);
        assert_eq!(msgs[0].nf_family(), 1);
        let attrs = msgs[0].nf_attrs();
        assert_eq!(attrs.get(1).unwrap().str(), "natguard");
        let inner = attrs.get(2).unwrap().nested();
        assert_eq!(inner.get(1).unwrap().u32_be(), Some(0xdead_beef));
        assert_eq!(inner.get(2).unwrap().payload, &[9]);
        assert_eq!(b.acked_seqs().collect::<Vec<_>>(), vec![7]);
    }

    #[test]
    fn malformed_attributes_end_iteration() {
        let junk = [0xff, 0xff, 1, 0, 1, 2];
        assert_eq!(Attrs::new(&junk).count(), 0);
        assert!(parse_msgs(&[1, 2, 3]).is_empty());
    }
}
