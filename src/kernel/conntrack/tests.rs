//! Unit tests of the conntrack module: messages, filters, parsing, labels.

use super::*;
use crate::kernel::netlink::{parse_msgs, Attrs};

#[test]
fn override_values_name_a_path() {
    assert_eq!(Path::from_override(None).unwrap(), Path::Auto);
    assert_eq!(Path::from_override(Some("")).unwrap(), Path::Auto);
    assert_eq!(Path::from_override(Some("auto")).unwrap(), Path::Auto);
    assert_eq!(
        Path::from_override(Some("filtered")).unwrap(),
        Path::Filtered
    );
    assert_eq!(
        Path::from_override(Some("fallback")).unwrap(),
        Path::Fallback
    );
    assert_eq!(Path::from_override(Some("full")).unwrap(), Path::FullDump);
    let e = Path::from_override(Some("fast")).unwrap_err();
    assert_eq!(e.code(), crate::error::code::INVALID_ENV);
    assert!(e.to_string().contains(PATH_ENV));
}

#[test]
fn normalize_maps_v4_in_v6_and_dedups() {
    let a: Vec<IpAddr> = ["::ffff:10.0.0.1", "10.0.0.1", "fd00::1"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(
        normalize(&a),
        vec![
            "10.0.0.1".parse::<IpAddr>().unwrap(),
            "fd00::1".parse().unwrap()
        ]
    );
}

#[test]
fn parses_and_matches_entries() {
    let pod: IpAddr = "10.1.0.5".parse().unwrap();
    let meta: IpAddr = "169.254.169.254".parse().unwrap();
    let proxy: IpAddr = "10.1.0.1".parse().unwrap();
    let mut b = MsgBuf::new(1);
    // Not DNATed: the reply comes from the metadata address itself.
    b.begin(ct_msg(IPCTNL_MSG_CT_NEW), 0, AF_INET, 0);
    put_tuple(&mut b, CTA_TUPLE_ORIG, IPPROTO_TCP, pod, meta, 40000, 80);
    put_tuple(&mut b, CTA_TUPLE_REPLY, IPPROTO_TCP, meta, pod, 80, 40000);
    b.attr_u32_be(CTA_ID, 7);
    b.end();
    // DNATed to the proxy.
    b.begin(ct_msg(IPCTNL_MSG_CT_NEW), 0, AF_INET, 0);
    put_tuple(&mut b, CTA_TUPLE_ORIG, IPPROTO_TCP, pod, meta, 40001, 80);
    put_tuple(
        &mut b,
        CTA_TUPLE_REPLY,
        IPPROTO_TCP,
        proxy,
        pod,
        8181,
        40001,
    );
    b.end();
    let msgs = parse_msgs(b.as_bytes());
    let plain = Entry::parse(&msgs[0]).unwrap();
    let dnat = Entry::parse(&msgs[1]).unwrap();
    assert_eq!(plain.id, Some(7));
    assert_eq!(plain.orig.dport, Some(80));
    let srcs = [pod];
    let dsts = [meta];
    let proxies = [(proxy, 8181)];
    let bypassed = Want::Bypassed {
        family: AF_INET,
        dsts: &dsts,
        srcs: &srcs,
        dports: &[80],
        proxies: &proxies,
    };
    assert!(bypassed.matches(&plain));
    assert!(!bypassed.matches(&dnat));
    // DNATed to the same address on another port, or with no proxy at all (`deny`): bypassed.
    for other in [&[(proxy, 8182)][..], &[]] {
        let elsewhere = Want::Bypassed {
            family: AF_INET,
            dsts: &dsts,
            srcs: &srcs,
            dports: &[80],
            proxies: other,
        };
        assert!(elsewhere.matches(&plain) && elsewhere.matches(&dnat));
    }
    let other_port = Want::Bypassed {
        family: AF_INET,
        dsts: &dsts,
        srcs: &srcs,
        dports: &[443],
        proxies: &proxies,
    };
    assert!(!other_port.matches(&plain));
    let by_reply = Want::Source4 {
        addr: "10.1.0.1".parse().unwrap(),
        dir: Dir::Reply,
    };
    assert!(by_reply.matches(&dnat) && !by_reply.matches(&plain));
    let by_orig = Want::Source4 {
        addr: "10.1.0.5".parse().unwrap(),
        dir: Dir::Orig,
    };
    assert!(by_orig.matches(&plain) && by_orig.matches(&dnat));
    let v6 = ["fd00::5".parse().unwrap()];
    assert!(!Want::Sources6 { addrs: &v6 }.matches(&plain));
}

#[test]
fn malformed_entries_are_errors_not_panics() {
    let mut b = MsgBuf::new(1);
    b.begin(ct_msg(IPCTNL_MSG_CT_NEW), 0, AF_INET, 0);
    let t = b.nest_begin(CTA_TUPLE_ORIG);
    let ip = b.nest_begin(CTA_TUPLE_IP);
    b.attr(CTA_IP_V4_SRC, &[10, 0, 0]); // short address
    b.nest_end(ip);
    b.nest_end(t);
    b.end();
    b.begin(ct_msg(IPCTNL_MSG_CT_NEW), 0, 99, 0);
    b.end();
    b.begin(ct_msg(IPCTNL_MSG_CT_NEW), 0, AF_INET6, 0);
    b.attr(CTA_TUPLE_ORIG | NLA_F_NESTED, &[0xff, 0xff, 1, 0]);
    b.end();
    for m in parse_msgs(b.as_bytes()) {
        assert!(matches!(Entry::parse(&m), Err(Error::Protocol(_))));
    }
}

fn filter_of(want: Want) -> Vec<u8> {
    let mut b = MsgBuf::new(1);
    b.begin(ct_msg(IPCTNL_MSG_CT_DELETE), NLM_F_ACK, want.family(), 0);
    want.write_filter(&mut b);
    b.end();
    parse_msgs(b.as_bytes())[0].body.clone()
}

fn tuple_ips(body: &[u8]) -> Vec<u16> {
    let attrs = Attrs::new(&body[4..]);
    [CTA_TUPLE_ORIG, CTA_TUPLE_REPLY]
        .into_iter()
        .filter_map(|t| attrs.get(t))
        .filter_map(|t| t.nested().get(CTA_TUPLE_IP))
        .flat_map(|ip| ip.nested().map(|a| a.ty).collect::<Vec<_>>())
        .collect()
}

#[test]
fn filters_name_no_full_tuple_and_no_ipv6_address() {
    // A kernel without filtered flush reads CTA_TUPLE_* as an exact tuple; with only a
    // source address it must refuse rather than delete one entry.
    for dir in [Dir::Orig, Dir::Reply] {
        let body = filter_of(Want::Source4 {
            addr: "10.1.0.5".parse().unwrap(),
            dir,
        });
        assert_eq!(tuple_ips(&body), vec![CTA_IP_V4_SRC]);
        assert!(Attrs::new(&body[4..]).get(CTA_FILTER).is_some());
    }
    // The kernel's IPv6 address match is inverted: never send an IPv6 address.
    let v6 = ["fd00::5".parse().unwrap()];
    assert!(tuple_ips(&filter_of(Want::Sources6 { addrs: &v6 })).is_empty());
    let srcs = ["fd00::7".parse().unwrap()];
    let six = Want::Bypassed {
        family: AF_INET6,
        dsts: &v6,
        srcs: &srcs,
        dports: &[80],
        proxies: &[],
    };
    assert!(tuple_ips(&filter_of(six)).is_empty());
}

#[test]
fn labels() {
    assert_eq!(label(Ran::Filtered, true, Path::Auto), "filtered+ipv6-dump");
    assert_eq!(label(Ran::Nothing, false, Path::Fallback), "dump+delete");
    assert_eq!(label(Ran::Full, true, Path::Auto), "full-dump");
}

/// An entry with the labels `ct label set` writes (bit N in byte N/8) reads them back as bit N
/// of the u128; an entry without CTA_LABELS, or with a short one, has none.
#[test]
fn entries_carry_their_label_bits() {
    let pod: IpAddr = "10.1.0.5".parse().unwrap();
    let out: IpAddr = "11.0.0.2".parse().unwrap();
    let mut b = MsgBuf::new(1);
    for labels in [Some(vec![0u8; 16]), None, Some(vec![1u8; 8])] {
        b.begin(ct_msg(IPCTNL_MSG_CT_NEW), 0, AF_INET, 0);
        put_tuple(&mut b, CTA_TUPLE_ORIG, IPPROTO_TCP, pod, out, 40000, 80);
        put_tuple(&mut b, CTA_TUPLE_REPLY, IPPROTO_TCP, out, pod, 80, 40000);
        if let Some(mut l) = labels {
            if l.len() == 16 {
                l[70 / 8] |= 1 << (70 % 8);
                l[0] |= 1;
            }
            b.attr(CTA_LABELS, &l);
        }
        b.end();
    }
    let msgs = parse_msgs(b.as_bytes());
    let got: Vec<u128> = msgs
        .iter()
        .map(|m| Entry::parse(m).unwrap().labels)
        .collect();
    assert_eq!(got, vec![(1u128 << 70) | 1, 0, 0]);
}

#[test]
fn scopes_delete_what_they_promise() {
    let l = |bits: &[u8]| bits.iter().fold(0u128, |a, b| a | (1u128 << b));
    let (own, other, third) = (70u8, 99u8, 65u8);
    // Every entry.
    for bits in [&[][..], &[own], &[other], &[own, other]] {
        assert!(Scope::All.deletes(l(bits)), "{bits:?}");
    }
    // DEL: only what carries the network's own bit.
    let del = Scope::Own(own);
    assert!(del.deletes(l(&[own])) && del.deletes(l(&[own, other])));
    assert!(
        !del.deletes(0),
        "a flow from before the rules is not the DEL's"
    );
    assert!(!del.deletes(l(&[other])) && !del.deletes(l(&[1])));
    // DEL of a network that labels nothing: never a labelling network's flow.
    let plain = Scope::Unlabelled;
    assert!(plain.deletes(0) && plain.deletes(l(&[1, 63])));
    assert!(!plain.deletes(l(&[own])) && !plain.deletes(l(&[64])) && !plain.deletes(l(&[127])));
    // ADD where another network's live pod shares the address: its flows stay, the rest goes.
    let add = Scope::add(Some(own), &[other]);
    assert_eq!(
        add,
        Scope::Except {
            own: Some(own),
            keep: vec![other]
        }
    );
    assert!(
        add.deletes(0),
        "a flow from before the rules goes (flushOnAdd)"
    );
    assert!(
        add.deletes(l(&[own])),
        "this network's earlier flows go (IP reuse)"
    );
    assert!(
        add.deletes(l(&[third])),
        "a network that holds no address here keeps nothing"
    );
    assert!(add.deletes(l(&[own, other])), "an ambiguous flow goes");
    assert!(!add.deletes(l(&[other])) && !add.deletes(l(&[other, third])));
    // A network without a label of its own keeps the others' too.
    let unlabelled = Scope::add(None, &[other]);
    assert!(unlabelled.deletes(0) && !unlabelled.deletes(l(&[other])));
    // Nothing to keep (or only the network's own bit, a collision): every entry.
    assert_eq!(Scope::add(Some(own), &[]), Scope::All);
    assert_eq!(Scope::add(Some(own), &[own]), Scope::All);
    assert_eq!(Scope::add(None, &[200]), Scope::All);
}

#[test]
fn scopes_round_trip_their_names_and_refuse_others() {
    for s in [
        Scope::All,
        Scope::Own(64),
        Scope::Own(127),
        Scope::Unlabelled,
        Scope::add(Some(70), &[99, 65, 99]),
        Scope::add(None, &[65]),
    ] {
        assert_eq!(Scope::from_name(&s.name()), Some(s.clone()), "{}", s.name());
    }
    assert_eq!(Scope::add(Some(70), &[99, 65]).name(), "except:70:65,99");
    for bad in [
        "",
        "own:",
        "own:128",
        "own:x",
        "except:70",
        "except:70:",
        "except:x:65",
        "except:70:70",
        "except:70:99,65",
        "except:70:65,65",
        "some",
    ] {
        assert_eq!(Scope::from_name(bad), None, "{bad}");
    }
}
