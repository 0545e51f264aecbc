//! Unit tests of the plan: keys, ranges, records.

use super::*;
use crate::config::Cidr;

#[test]
fn owner_keys_are_stable_and_distinct() {
    let a = OwnerKey::new("net", "abc", "eth0");
    assert_eq!(a, OwnerKey::new("net", "abc", "eth0"));
    assert_ne!(a, OwnerKey::new("net", "abc", "eth1"));
    assert_ne!(a, OwnerKey::new("ne", "tabc", "eth0"));
    assert_eq!(OwnerKey::parse_hex(&a.hex()), Some(a));
    // Pinned: changing the hash would orphan every pod on upgrade.
    assert_eq!(fnv1a64(b"natguard"), 7_819_764_532_579_754_049);
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
}

#[test]
fn ranges_merge_and_render_as_prefixes() {
    let m = merge_ranges(vec![(10, 20), (15, 30), (31, 40), (50, 60)]);
    assert_eq!(m, vec![(10, 40), (50, 60)]);
    let c = Cidr::parse("10.0.0.0/8").unwrap().range();
    assert_eq!(
        render_elem(&Elem::Range(Family::V4, c.0, c.1)),
        "10.0.0.0/8"
    );
    let all = Cidr::parse("::/0").unwrap().range();
    assert_eq!(render_elem(&Elem::Range(Family::V6, all.0, all.1)), "::/0");
}

#[test]
fn comments_keep_addresses_first() {
    let pod = PodRef {
        network: "n",
        container_id: &"a".repeat(64),
        ifname: "eth0",
        namespace: Some(&"x".repeat(63)),
        pod_name: Some(&"y".repeat(200)),
        netns: "/run/netns/p",
        annotations: Default::default(),
        host: None,
    };
    let addrs: Vec<IpAddr> = vec![
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff1".parse().unwrap(),
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff2".parse().unwrap(),
        "255.255.255.255".parse().unwrap(),
    ];
    let c = pod_comment(&pod, &addrs);
    assert!(c.len() <= MAX_COMMENT);
    assert_eq!(addrs_from_comment(&c), addrs);
}

#[test]
fn a_digest_follows_every_element_and_rule() {
    let set = |elems: Vec<Elem>| SetSpec {
        kind: SetKind::Exempt(Family::V4),
        name: "n-allow4".into(),
        elements: Some(elems),
    };
    let a = vec![set(vec![Elem::Port(80), Elem::Port(443)])];
    assert_eq!(digest(&a), digest(&a.clone()));
    assert_ne!(digest(&a), digest(&vec![set(vec![Elem::Port(80)])]));
    assert_ne!(
        digest(&a),
        digest(&vec![set(vec![Elem::Port(443), Elem::Port(80)])])
    );
    assert_ne!(
        digest(&a),
        digest(&vec![set(vec![Elem::Port(80), Elem::Port(444)])])
    );
    let rule = |action| Rule {
        chain: ChainKind::Dnat,
        matches: vec![Match::IsTcp],
        action,
        count: None,
    };
    assert_ne!(digest(&rule(Action::Drop)), digest(&rule(Action::Return)));
}

/// A pod of a VLAN bridge network: the IP layer sees it on `cni0.100`, its port is on `cni0`.
/// The exemption, its ARP claims and the redirect are keyed by `cni0.100`, the mark is given on
/// its port (for its own addresses there), and the record keeps both, so DEL releases what ADD
/// took.
#[test]
fn a_pod_behind_a_vlan_device_is_exempt_there_and_marked_on_its_port() {
    let ifn = |s: &str| IfName::new(s).unwrap();
    let host = HostSide {
        iface: ifn("cni0.100"),
        port: Some(ifn("veth1")),
        mac: Some([2, 0, 0, 0, 0, 1]),
        bridge: Some(ifn("cni0")),
    };
    assert_eq!(host.bridge(), Some(ifn("cni0")));
    let a: IpAddr = "10.1.0.5".parse().unwrap();
    let keys = owned_keys(&[a], Some(host));
    let f = Family::V4;
    for (kind, key) in [
        (SetKind::Exempt(f), Key::IfAddr(ifn("cni0.100"), a)),
        (SetKind::Redir(f), Key::IfAddr(ifn("cni0.100"), a)),
        (SetKind::XArp, Key::IfAddr(ifn("cni0.100"), a)),
        (SetKind::NArp, Key::IfAddr(ifn("cni0.100"), a)),
        (SetKind::XVeths, Key::Iface(ifn("veth1"))),
        (SetKind::XSrc(f), Key::IfAddr(ifn("veth1"), a)),
    ] {
        assert!(keys.contains(&(kind, key)), "{kind:?} {key:?} in {keys:?}");
    }
    let c = attach_comment(Some(&host), "/run/netns/p");
    assert!(c.contains(" br=cni0"), "{c}");
    assert_eq!(parse_attach(&c).host(), Some(host));
    // Where the IP layer sees the bridge itself, the record is as it always was.
    let plain = HostSide {
        iface: ifn("cni0"),
        bridge: None,
        ..host
    };
    assert_eq!(plain.bridge(), Some(ifn("cni0")));
    let c = attach_comment(Some(&plain), "/run/netns/p");
    assert_eq!(
        c,
        "if=cni0 port=veth1 mac=02:00:00:00:00:01 netns=/run/netns/p"
    );
    assert_eq!(parse_attach(&c).host(), Some(plain));
    // A routed veth has no bridge.
    let routed = HostSide {
        iface: ifn("veth1"),
        port: None,
        mac: None,
        bridge: None,
    };
    assert_eq!(routed.bridge(), None);
    // Its mark is given on the veth itself.
    assert!(owned_keys(&[a], Some(routed)).contains(&(SetKind::XVeths, Key::Iface(ifn("veth1")))));
}
