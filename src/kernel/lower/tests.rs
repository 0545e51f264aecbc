//! Unit tests of the lowering: element lists split across messages, ACK flags.

use super::*;

fn elements(m: &super::super::netlink::Msg) -> Vec<(Vec<u8>, u32)> {
    let list = m.nf_attrs().get(NFTA_SET_ELEM_LIST_ELEMENTS).unwrap();
    list.nested()
        .map(|el| {
            let a = el.nested();
            let key = a.get(NFTA_SET_ELEM_KEY).unwrap().nested();
            let flags = a
                .get(NFTA_SET_ELEM_FLAGS)
                .and_then(|f| f.u32_be())
                .unwrap_or(0);
            (key.get(NFTA_DATA_VALUE).unwrap().payload.to_vec(), flags)
        })
        .collect()
}

#[test]
fn long_element_lists_are_split_and_keep_interval_pairs() {
    // 5,000 non-adjacent /32s: 10,000 interval elements, far past one 16-bit nla_len.
    let data: Vec<ElemData> = (0..5000u128)
        .flat_map(|i| {
            elem_data(
                &Elem::Range(Family::V4, 0x0a00_0000 + 2 * i, 0x0a00_0000 + 2 * i),
                true,
            )
        })
        .collect();
    assert_eq!(data.len(), 10_000);
    let mut b = MsgBuf::new(1);
    let seqs = set_elems(
        &mut b,
        TableFamily::Inet,
        NFT_MSG_NEWSETELEM,
        0,
        "n-nomasq4",
        &data,
    );
    assert!(seqs.len() > 1 && !b.is_oversized());
    let msgs = super::super::netlink::parse_msgs(b.as_bytes());
    assert_eq!(msgs.len(), seqs.len());
    let mut all = Vec::new();
    for m in &msgs {
        let list = m.nf_attrs().get(NFTA_SET_ELEM_LIST_ELEMENTS).unwrap();
        assert!(list.payload.len() <= MAX_ELEMS_BYTES + 64);
        let els = elements(m);
        // A message never starts with an interval's end.
        assert_eq!(els[0].1 & NFT_SET_ELEM_INTERVAL_END, 0);
        all.extend(els);
    }
    let want: Vec<(Vec<u8>, u32)> = data.iter().map(|d| (d.key.clone(), d.flags)).collect();
    assert_eq!(all, want, "every element once, in order");
}

#[test]
fn batch_messages_ask_for_no_ack() {
    let mut b = MsgBuf::new(1);
    new_table(&mut b, TableFamily::Inet);
    flush_set(&mut b, TableFamily::Inet, "s");
    set_elems(
        &mut b,
        TableFamily::Inet,
        NFT_MSG_DELSETELEM,
        0,
        "s",
        &[ElemData {
            key: vec![1, 2, 3, 4],
            flags: 0,
            comment: Some("c".into()),
        }],
    );
    assert_eq!(b.acked_seqs().count(), 0);
    assert_eq!(b.ack_last(), Some(3));
    assert_eq!(b.acked_seqs().collect::<Vec<_>>(), vec![3]);
    let last = super::super::netlink::parse_msgs(b.as_bytes())
        .pop()
        .unwrap();
    assert_ne!(last.flags & NLM_F_ACK, 0);
}
