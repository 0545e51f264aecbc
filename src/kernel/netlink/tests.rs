//! Unit tests of the netlink layer: message building and parsing, reply bookkeeping.

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
    assert!(b.has_seq(7) && !b.has_seq(8) && !b.has_seq(6));
    // Sequence numbers wrap.
    let mut w = MsgBuf::new(u32::MAX);
    w.begin(0x0a00, 0, 1, 0);
    w.end();
    w.begin(0x0a00, 0, 1, 0);
    w.end();
    assert!(w.has_seq(u32::MAX) && w.has_seq(0) && !w.has_seq(1));
}

#[test]
fn an_attribute_past_16_bits_marks_the_buffer() {
    let mut b = MsgBuf::new(1);
    b.begin(0x0a0c, 0, 1, 0);
    let n = b.nest_begin(3);
    for _ in 0..5000 {
        b.attr(1, &[0u8; 16]);
    }
    b.nest_end(n);
    b.end();
    assert!(b.is_oversized());
    let mut ok = MsgBuf::new(1);
    ok.begin(0x0a0c, 0, 1, 0);
    ok.attr(1, &[0u8; 60_000]);
    ok.end();
    assert!(!ok.is_oversized());
}

#[test]
fn malformed_attributes_end_iteration() {
    let junk = [0xff, 0xff, 1, 0, 1, 2];
    assert_eq!(Attrs::new(&junk).count(), 0);
    assert!(parse_msgs(&[1, 2, 3]).is_empty());
}

/// A reply message as the kernel would queue it: header fields and body.
fn reply(msg_type: u16, flags: u16, seq: u32, body: &[u8]) -> Msg {
    Msg {
        msg_type,
        flags,
        seq,
        body: body.to_vec(),
    }
}

/// An element of a dump (any netfilter message type; the reader does not look inside).
fn part(seq: u32) -> Msg {
    reply(0x0a0d, NLM_F_MULTI, seq, &[2, 0, 0, 0])
}

/// NLMSG_DONE carrying `errno` (0 or negative, as `dump_done_errno`), optionally with an
/// extended ACK message after it.
fn done(seq: u32, errno: i32, flags: u16, ext_msg: Option<&str>) -> Msg {
    let mut body = errno.to_ne_bytes().to_vec();
    let mut flags = flags | NLM_F_MULTI;
    if let Some(t) = ext_msg {
        flags |= 0x200; // NLM_F_ACK_TLVS
        let mut b = MsgBuf::new(0);
        b.begin_header(0, 0);
        b.attr_str(1, t); // NLMSGERR_ATTR_MSG
        b.end();
        body.extend_from_slice(&b.as_bytes()[NLMSG_HDRLEN..]);
    }
    reply(NLMSG_DONE, flags, seq, &body)
}

/// Feeds messages to a reader until it ends the exchange.
fn read_all(dump: bool, msgs: Vec<Msg>) -> Option<Result<Vec<Msg>>> {
    let mut r = ReplyReader::new(9, dump, "list set x");
    for m in msgs {
        if let Some(end) = r.take(m) {
            return Some(end);
        }
    }
    None
}

#[test]
fn a_dump_that_ends_with_done_and_no_errno_is_complete() {
    let out = read_all(true, vec![part(9), part(9), done(9, 0, 0, None)])
        .unwrap()
        .unwrap();
    assert_eq!(out.len(), 2);
    // An empty DONE body (no errno at all) is success too.
    let out = read_all(true, vec![part(9), reply(NLMSG_DONE, NLM_F_MULTI, 9, &[])])
        .unwrap()
        .unwrap();
    assert_eq!(out.len(), 1);
}

#[test]
fn a_dump_the_kernel_ended_with_an_errno_is_an_error_not_a_short_list() {
    for errno in [libc::ENOMEM, libc::EMSGSIZE, libc::ENOBUFS, libc::EINVAL] {
        let e = read_all(true, vec![part(9), done(9, -errno, 0, None)])
            .unwrap()
            .unwrap_err();
        assert_eq!(e.errno(), Some(errno), "{e}");
        assert!(
            e.to_string().contains("list set x (the dump failed)"),
            "{e}"
        );
    }
    // The extended ACK text after the errno is kept.
    let e = read_all(
        true,
        vec![part(9), done(9, -libc::ENOMEM, 0, Some("out of memory"))],
    )
    .unwrap()
    .unwrap_err();
    assert!(
        e.to_string().contains("the dump failed: out of memory"),
        "{e}"
    );
    // EINTR in DONE is an interrupted dump: retryable, so `request_retry` asks again.
    let e = read_all(true, vec![part(9), done(9, -libc::EINTR, 0, None)])
        .unwrap()
        .unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINTR));
    assert!(is_retryable(&e));
}

#[test]
fn an_interrupted_dump_is_read_to_its_end_then_fails_with_eintr() {
    // NLM_F_DUMP_INTR on a part: the reader still waits for DONE (nothing is left queued for
    // the next request), then fails.
    let mut r = ReplyReader::new(9, true, "list rules");
    assert!(r.take(part(9)).is_none());
    assert!(r
        .take(reply(
            0x0a07,
            NLM_F_MULTI | NLM_F_DUMP_INTR,
            9,
            &[2, 0, 0, 0]
        ))
        .is_none());
    assert!(r.take(part(9)).is_none());
    let e = r.take(done(9, 0, 0, None)).unwrap().unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINTR));
    assert!(e.to_string().contains("dump interrupted"), "{e}");
    assert!(is_retryable(&e));
    // The flag on DONE alone (set by nl_dump_check_consistent there) counts too.
    let e = read_all(true, vec![part(9), done(9, 0, NLM_F_DUMP_INTR, None)])
        .unwrap()
        .unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINTR));
}

#[test]
fn replies_of_other_requests_are_ignored_and_a_single_get_ends_with_its_reply() {
    // A stale DONE with an error, for an earlier sequence number, is not this dump's.
    let out = read_all(
        true,
        vec![
            done(8, -libc::ENOMEM, 0, None),
            part(9),
            done(9, 0, 0, None),
        ],
    )
    .unwrap()
    .unwrap();
    assert_eq!(out.len(), 1);
    // A GET without NLM_F_DUMP ends with its one reply, whatever its flags.
    let out = read_all(false, vec![part(9)]).unwrap().unwrap();
    assert_eq!(out.len(), 1);
    // NLMSG_ERROR with an errno ends any request with it; with 0 it is an ACK.
    let mut err = (-libc::ENOENT).to_ne_bytes().to_vec();
    err.extend_from_slice(&[0u8; NLMSG_HDRLEN]);
    let e = read_all(true, vec![reply(NLMSG_ERROR, 0, 9, &err)])
        .unwrap()
        .unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOENT));
    let mut ack = 0i32.to_ne_bytes().to_vec();
    ack.extend_from_slice(&[0u8; NLMSG_HDRLEN]);
    let out = read_all(true, vec![part(9), reply(NLMSG_ERROR, 0, 9, &ack)])
        .unwrap()
        .unwrap();
    assert_eq!(out.len(), 1);
}

/// A buffer of `n` messages from `sock`.
fn filled(sock: &mut NfSocket, n: usize) -> MsgBuf {
    let mut b = sock.msgbuf();
    for _ in 0..n {
        b.begin(0x0a00, 0, 1, 0);
        b.end();
    }
    b
}

/// Sequence ranges are sized to each buffer when it is sent: a batch longer than 65,536
/// messages does not run into the next buffer's numbers, the same buffer may go again (a
/// rejected batch), and a buffer built before another was sent is refused, never sent with
/// numbers that are already in use. (An unprivileged netfilter socket; nothing is sent.)
#[test]
fn sequence_ranges_are_sized_to_each_buffer_and_checked() {
    let mut sock = NfSocket::open().expect("open a netfilter netlink socket");
    let big = filled(&mut sock, 70_000);
    sock.claim_seqs(&big).unwrap();
    let next = filled(&mut sock, 3);
    let first = next.seqs()[0].0;
    assert!(
        !big.has_seq(first),
        "the next buffer starts after the 70,000th message"
    );
    assert_eq!(first, big.seqs()[0].0.wrapping_add(70_000));
    sock.claim_seqs(&next).unwrap();
    // The buffer sent last may be resent; an older one, or one built out of turn, may not.
    sock.claim_seqs(&next).unwrap();
    assert!(sock.claim_seqs(&big).is_err());
    let a = filled(&mut sock, 2);
    let b = filled(&mut sock, 2);
    sock.claim_seqs(&a).unwrap();
    let e = sock.claim_seqs(&b).unwrap_err();
    assert!(e.to_string().contains("out of turn"), "{e}");
    // An empty buffer claims nothing.
    let empty = sock.msgbuf();
    sock.claim_seqs(&empty).unwrap();
}

/// A comment's one-byte length is checked where it is written: 254 bytes fit (255 with the
/// NUL), 255 do not, and mark the buffer instead of being sent with a wrapped length.
#[test]
fn a_comment_past_its_length_byte_marks_the_buffer() {
    let mut b = MsgBuf::new(1);
    b.begin(0x0a06, 0, 1, 0);
    let fits = "x".repeat(254);
    b.attr_udata_text(7, 0, &fits);
    b.end();
    assert!(b.unencodable().is_none());
    let msgs = parse_msgs(b.as_bytes());
    let attr = msgs[0].nf_attrs().get(7).unwrap();
    assert_eq!(attr.payload[..2], [0, 255]);
    assert_eq!(attr.payload.len(), 2 + 255);
    assert_eq!(
        MsgBuf::udata_text_attr_size(&fits),
        (4 + attr.payload.len()).next_multiple_of(4)
    );

    let mut b = MsgBuf::new(1);
    b.begin(0x0a06, 0, 1, 0);
    b.attr_udata_text(7, 0, &"x".repeat(255));
    b.end();
    let what = b.unencodable().unwrap();
    assert!(what.contains("255-byte comment"), "{what}");
}

/// io_uring is used for the socket hand-over only when the process provably runs under no
/// seccomp filter and io_uring is not disabled.
#[test]
fn io_uring_is_used_only_without_seccomp_and_when_not_disabled() {
    let status = |mode: &str| {
        format!("Name:\tnatguard\nNoNewPrivs:\t1\nSeccomp:\t{mode}\nSeccomp_filters:\t1\n")
    };
    assert_eq!(io_uring_allowed(Some(&status("0")), None), Ok(()));
    assert_eq!(io_uring_allowed(Some(&status("0")), Some("0\n")), Ok(()));
    for mode in ["1", "2"] {
        assert!(io_uring_allowed(Some(&status(mode)), Some("0\n"))
            .unwrap_err()
            .contains("seccomp"));
    }
    for disabled in ["1\n", "2\n"] {
        assert!(io_uring_allowed(Some(&status("0")), Some(disabled))
            .unwrap_err()
            .contains("io_uring_disabled"));
    }
    assert!(io_uring_allowed(None, None).is_err());
    assert!(io_uring_allowed(Some("Name:\tx\n"), None).is_err());
}
