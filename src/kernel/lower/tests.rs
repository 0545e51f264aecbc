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
    new_table(&mut b, TableFamily::Inet, Some(0));
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

/// A batch as annotated text: one line per message (its type, family, flags, and the names it
/// carries), then one line per expression of a rule or element of a set, attributes as
/// `type=hex`. Byte-exact: every attribute of every message is printed.
fn annotate(bytes: &[u8]) -> String {
    use super::super::netlink::{parse_msgs, Attrs};
    use std::fmt::Write as _;
    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
    fn attrs_line(a: Attrs<'_>, depth: usize, out: &mut String) {
        for at in a {
            let nested = Attrs::new(at.payload).count() > 0
                && Attrs::new(at.payload)
                    .map(|x| x.payload.len() + 4)
                    .sum::<usize>()
                    .next_multiple_of(4)
                    >= at.payload.len();
            let printable = at.payload.len() > 1
                && at.payload.last() == Some(&0)
                && at.payload[..at.payload.len() - 1]
                    .iter()
                    .all(|c| c.is_ascii_graphic() || *c == b' ');
            let pad = "  ".repeat(depth);
            if printable {
                let s = String::from_utf8_lossy(&at.payload[..at.payload.len() - 1]);
                let _ = writeln!(out, "{pad}{}: {s:?}", at.ty);
            } else if nested && at.payload.len() >= 4 {
                let _ = writeln!(out, "{pad}{}:", at.ty);
                attrs_line(Attrs::new(at.payload), depth + 1, out);
            } else {
                let _ = writeln!(out, "{pad}{}={}", at.ty, hex(at.payload));
            }
        }
    }
    let mut out = String::new();
    for m in parse_msgs(bytes) {
        let name = match m.msg_type & 0xff {
            _ if m.msg_type == NFNL_MSG_BATCH_BEGIN => "BATCH_BEGIN",
            _ if m.msg_type == NFNL_MSG_BATCH_END => "BATCH_END",
            0 => "NEWTABLE",
            2 => "DELTABLE",
            3 => "NEWCHAIN",
            6 => "NEWRULE",
            8 => "DELRULE",
            9 => "NEWSET",
            12 => "NEWSETELEM",
            14 => "DELSETELEM",
            _ => "OTHER",
        };
        let fam = match m.nf_family() {
            NFPROTO_INET => "inet",
            NFPROTO_BRIDGE => "bridge",
            NFPROTO_NETDEV => "netdev",
            _ => "-",
        };
        let _ = writeln!(out, "{name} {fam} flags=0x{:x}", m.flags);
        attrs_line(m.nf_attrs(), 1, &mut out);
    }
    out
}

#[test]
fn converge_batch_matches_its_golden_annotation() {
    use crate::config::Config;
    use crate::plan::NodeFacts;
    let mut cfg = Config::default();
    cfg.metadata.exempt_namespaces = vec!["kube-system".into()];
    cfg.metadata.log_denied = true;
    // Every kind of rule, natguard's own masquerade included.
    cfg.masquerade.masquerade_outside = true;
    let node = NodeFacts {
        proxy_v4: Some("10.0.0.1".parse().unwrap()),
        proxy_v6: Some("fd00::1".parse().unwrap()),
    };
    let plan = crate::plan::plan_shared("net1", &cfg, &node);
    let mut tx = super::super::nft::Tx::for_test();
    tx.converge_shared(&plan, true);
    let got = annotate(&tx.encoded());
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden-batch/converge.txt"
    );
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, &got).unwrap();
    }
    let want = std::fs::read_to_string(path).expect("tests/golden-batch/converge.txt");
    assert!(
        got == want,
        "the encoded converge batch differs from {path}; after an intended change rerun with UPDATE_GOLDEN=1 and review the diff"
    );
    // Only the last message before BATCH_END asks for an ACK.
    let flags: Vec<&str> = got.lines().filter(|l| !l.starts_with(' ')).collect();
    let acked = flags.iter().filter(|l| {
        let f = l.rsplit("flags=0x").next().unwrap();
        u16::from_str_radix(f, 16).unwrap() & NLM_F_ACK != 0
    });
    assert_eq!(acked.count(), 1);
}
