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
