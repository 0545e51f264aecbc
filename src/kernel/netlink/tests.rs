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
