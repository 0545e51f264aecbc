//! A small synchronous netfilter netlink client: message building, attribute parsing, and a
//! socket that sends a whole batch at once and reads back exactly the replies it asked for.
//!
//! natguard lives for milliseconds, so there is no async runtime and no per-object round trip:
//! callers build all messages into one [`MsgBuf`], send it with one `sendmsg`, and read back the
//! replies. Messages are laid out by hand (`nlmsghdr` + `nfgenmsg` + attributes) because the
//! crates that model nf_tables either bind GPL C libraries or cannot express NAT, masquerade and
//! reject expressions; the layout is small and fixed by the kernel ABI.
//!
//! # What the kernel answers (nfnetlink, checked on 6.18)
//!
//! * nfnetlink runs a batch synchronously inside `sendmsg`: when `sendmsg` returns, every reply
//!   the batch will ever produce is already queued on the socket (or was dropped, see below).
//! * Inside a batch, a message gets a reply when it carries `NLM_F_ACK` **or fails**: errors are
//!   reported without `NLM_F_ACK`. The replies are queued in message order after the commit
//!   (or the abort), so the reply to the last `NLM_F_ACK` message is the last one of the batch.
//! * Any error reply means the kernel aborted the whole batch: nothing of it was applied. A
//!   commit that fails is answered with an error on the BATCH_BEGIN sequence number, followed
//!   by the per-message replies. Errors that stop the batch before its messages are processed
//!   (`ERESTART` for a stale generation id, `ENOMEM`, `EOPNOTSUPP`) are answered on the
//!   BATCH_BEGIN sequence number alone.
//! * A batch whose BATCH_BEGIN carries `NFNL_BATCH_GENID` is refused with `ERESTART`, before
//!   any of its messages runs, when the namespace's nf_tables generation is no longer that one:
//!   another writer (natguard, `nft`, kube-proxy, firewalld...) committed since it was read.
//!   natguard sends the generation it read before a read-modify-write, so a batch built from
//!   a stale read never lands; the store reads again and rebuilds it (`store::view`).
//! * `NLM_F_ACK` on BATCH_BEGIN or BATCH_END is answered on 6.18, but older kernels ignore
//!   it, so natguard does not rely on it.
//! * A batch that is malformed as a whole (a second BATCH_BEGIN inside it) is dropped without
//!   any reply: only a deadline ends that wait.
//!
//! `tests/batches.rs` checks on the running kernel that errors come without `NLM_F_ACK`, that
//! one error aborts the whole batch, that the last message's ACK ends a committed one, and the
//! silent drop; the BATCH_BEGIN replies are read from nfnetlink's source (`nfnetlink_rcv_batch`).
//!
//! So a batch asks for ONE acknowledgement, on its last real message ([`MsgBuf::ack_last`]):
//! that ACK with no error before it proves the batch was committed; an error proves it was
//! not. Asking for an ACK per message, as this client once did, makes the replies of a large
//! batch (a GC of many pods) overflow the receive buffer.
//!
//! # Buffers, deadlines, retries
//!
//! * Send: netlink refuses a `sendmsg` longer than the socket's send buffer (`EMSGSIZE`); the
//!   buffer is grown to the batch with `SO_SNDBUFFORCE` (same `CAP_NET_ADMIN` that nf_tables
//!   writes need), `SO_SNDBUF` as a fallback.
//! * Receive: the buffer is grown with the number of messages that could fail (about 1 KiB of
//!   socket memory per error reply, capped at [`MAX_RCVBUF`]). If it still overflows, the kernel
//!   drops replies and the next `recvmsg` fails with `ENOBUFS`.
//! * Every wait for a reply is a `poll` bounded by [`REPLY_TIMEOUT`]. On expiry the request
//!   fails with `EAGAIN` ("try again", CNI code 11) and a message saying no reply came; it is
//!   never repeated, so a verb is bounded by a few seconds, lock included.
//! * A batch is resent only when the kernel rejected it with a "try again" errno (`EBUSY`,
//!   ...; [`BatchError::Rejected`]: nothing of it was applied, so sending it again is
//!   harmless), or when `sendmsg` itself failed (the kernel never saw it), at most
//!   [`TRANSIENT_RETRIES`] times. `ERESTART` is not resent: the same bytes carry the same
//!   stale generation, so it is the caller's to read again and rebuild. After
//!   an `ENOBUFS` overflow or a timeout nobody knows whether it was committed
//!   ([`BatchError::Unknown`]): the verb fails with code 11 and the runtime's retry re-reads the
//!   kernel's state, which is safe because every verb is idempotent. Reads (GET, dumps) are
//!   retried on `ENOBUFS`, `EBUSY` and `EINTR` (a dump the kernel marked `NLM_F_DUMP_INTR`),
//!   but not after a timeout.
//! * A dump ends with `NLMSG_DONE`, which carries the dump's own errno (`dump_done_errno`): a
//!   dump the kernel stopped with an error fails with that errno ([`ReplyReader`]); what was
//!   read before it is never returned as if it were the whole list.

use crate::error::{Error, Result};

pub const NLMSG_HDRLEN: usize = 16;
pub const NFGEN_HDRLEN: usize = 4;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_DUMP_INTR: u16 = 0x10;
pub const NLM_F_ACK: u16 = 0x4;

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
/// The batch-begin attribute holding the nf_tables generation the batch was built from
/// (`enum nfnl_batch_attributes`, a big-endian u32).
pub const NFNL_BATCH_GENID: u16 = 1;

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

static NEXT_BUF_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A buffer of one or more netlink messages, built in place.
#[derive(Debug, Clone)]
pub struct MsgBuf {
    buf: Vec<u8>,
    msg_start: Option<usize>,
    /// Where the last message that was begun starts, for [`MsgBuf::ack_last`].
    last_start: Option<usize>,
    next_seq: u32,
    /// (seq, wants_ack) of each message, in order.
    seqs: Vec<(u32, bool)>,
    /// An attribute or nest grew past the 16-bit `nla_len`: the buffer must not be sent.
    oversized: bool,
    /// Something could not be encoded (a value past its field's width): the buffer must not
    /// be sent, and this says what.
    unencodable: Option<String>,
    /// Which buffer this is (a clone is the same buffer), so a socket can tell a resend of
    /// the buffer it sent last from another one built on the same sequence numbers.
    id: u64,
}

impl MsgBuf {
    pub fn new(first_seq: u32) -> Self {
        MsgBuf {
            buf: Vec::with_capacity(4096),
            msg_start: None,
            last_start: None,
            next_seq: first_seq,
            seqs: Vec::new(),
            oversized: false,
            unencodable: None,
            id: NEXT_BUF_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Which buffer this is (see the field).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Starts a netfilter message: `nlmsghdr` then `nfgenmsg {family, version 0, res_id}`.
    pub fn begin(&mut self, msg_type: u16, flags: u16, family: u8, res_id: u16) -> u32 {
        let seq = self.begin_header(msg_type, flags);
        self.buf.push(family);
        self.buf.push(0); // NFNETLINK_V0
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        seq
    }

    /// Starts a message with the `nlmsghdr` only: the family header that follows (an
    /// rtnetlink `ifinfomsg` or `rtmsg`) is the caller's, added with [`MsgBuf::bytes`].
    pub fn begin_header(&mut self, msg_type: u16, flags: u16) -> u32 {
        assert!(self.msg_start.is_none(), "netlink message not ended");
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.msg_start = Some(self.buf.len());
        self.last_start = Some(self.buf.len());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in end()
        self.buf.extend_from_slice(&msg_type.to_ne_bytes());
        self.buf
            .extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
        self.seqs.push((seq, flags & NLM_F_ACK != 0));
        seq
    }

    /// Appends raw bytes (a family header) to the message begun.
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// Adds `NLM_F_ACK` to the last message begun, and returns its sequence number. A batch
    /// asks for this one acknowledgement only (see the module documentation).
    pub fn ack_last(&mut self) -> Option<u32> {
        let start = self.last_start?;
        let at = start + 6;
        let flags = u16::from_ne_bytes([self.buf[at], self.buf[at + 1]]) | NLM_F_ACK;
        self.buf[at..at + 2].copy_from_slice(&flags.to_ne_bytes());
        let last = self.seqs.last_mut()?;
        last.1 = true;
        Some(last.0)
    }

    /// Bytes in the buffer so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn end(&mut self) {
        let start = self.msg_start.take().expect("no netlink message begun");
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    pub fn attr(&mut self, ty: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.oversized |= len > u16::MAX as usize;
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

    /// An attribute holding one libnftnl user-data TLV: `udata_type`, a one-byte length, then
    /// `text` with its NUL (how nft stores a rule's or an element's comment). The length byte
    /// is checked here, where it is written: a text of more than 254 bytes cannot be encoded,
    /// and marks the buffer so that it is refused instead of sent with a cut length.
    pub fn attr_udata_text(&mut self, ty: u16, udata_type: u8, text: &str) {
        let Ok(len) = u8::try_from(text.len() + 1) else {
            self.unencodable.get_or_insert_with(|| {
                format!(
                    "a {}-byte comment (a user-data text holds at most {} bytes)",
                    text.len(),
                    u8::MAX - 1
                )
            });
            return;
        };
        let mut v = Vec::with_capacity(text.len() + 3);
        v.push(udata_type);
        v.push(len);
        v.extend_from_slice(text.as_bytes());
        v.push(0);
        self.attr(ty, &v);
    }

    /// The encoded size of [`MsgBuf::attr_udata_text`]'s attribute, padding included.
    pub fn udata_text_attr_size(text: &str) -> usize {
        align4(4 + 2 + text.len() + 1)
    }

    /// What could not be encoded, if anything: the buffer must not be sent.
    pub fn unencodable(&self) -> Option<&str> {
        self.unencodable.as_deref()
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
        let len = self.buf.len() - pos;
        self.oversized |= len > u16::MAX as usize;
        self.buf[pos..pos + 2].copy_from_slice(&(len as u16).to_ne_bytes());
    }

    /// Whether an attribute outgrew its 16-bit length, which would corrupt the message.
    pub fn is_oversized(&self) -> bool {
        self.oversized
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

    /// Whether `seq` is the sequence number of one of this buffer's messages (they are
    /// consecutive), in constant time however many messages a batch has.
    pub fn has_seq(&self, seq: u32) -> bool {
        match self.seqs.first() {
            Some(&(first, _)) => (seq.wrapping_sub(first) as usize) < self.seqs.len(),
            None => false,
        }
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

/// The longest wait for the next reply of a request or batch. The kernel queues a batch's
/// replies before `sendmsg` returns and produces each part of a dump within the `recvmsg` that
/// asks for it, so a healthy exchange never comes near this; it bounds a verb (and the time it
/// holds natguard's lock) when a reply is lost or never sent.
pub const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The errno of a reply that did not come within [`REPLY_TIMEOUT`]: "try again" (code 11).
/// nfnetlink replays `EAGAIN` internally and never answers with it, so it cannot be confused
/// with a kernel reply.
pub const TIMEOUT_ERRNO: i32 = libc::EAGAIN;

mod socket;
pub use socket::*;

#[cfg(test)]
mod tests;
