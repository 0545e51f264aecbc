//! Root tests of `natguard::conntrack` against the running kernel.
//!
//! Each test creates its own network namespace (`common::Harness`), fills that namespace's
//! conntrack table with `IPCTNL_MSG_CT_NEW` batches, and runs the code under test on a thread that
//! joined the namespace with `setns(2)` (`common::in_netns`); the rest of the test process, and
//! the root namespace's conntrack table, are never touched. Tables are compared entry by entry with a dump.

mod common;

use common::{in_netns, Harness, Netns};
use natguard::kernel::conntrack::wire::put_tuple;
use natguard::kernel::conntrack::{self, FlushReport, Path};
use natguard::kernel::netlink::{
    Attrs, NfSocket, NFNL_SUBSYS_CTNETLINK, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const CT_NEW: u16 = (NFNL_SUBSYS_CTNETLINK as u16) << 8;
const CT_GET: u16 = ((NFNL_SUBSYS_CTNETLINK as u16) << 8) | 1;
const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

/// A fresh namespace for one test (deleted with the harness, also on panic).
fn namespace(test: &str) -> (Harness, Netns) {
    let h = Harness::new(&format!("ct-{test}"));
    let ns = h.netns("node");
    (h, ns)
}

/// A conntrack entry: both tuples (same protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Flow {
    proto: u8,
    osrc: IpAddr,
    odst: IpAddr,
    osport: u16,
    odport: u16,
    rsrc: IpAddr,
    rdst: IpAddr,
    rsport: u16,
    rdport: u16,
}

/// A flow without NAT: the reply tuple is the inverse of the original one.
fn plain(proto: u8, src: &str, dst: &str, sport: u16, dport: u16) -> Flow {
    let (s, d) = (ip(src), ip(dst));
    Flow {
        proto,
        osrc: s,
        odst: d,
        osport: sport,
        odport: dport,
        rsrc: d,
        rdst: s,
        rsport: dport,
        rdport: sport,
    }
}

/// A flow whose destination was rewritten to `to:to_port` (DNAT).
fn dnat(proto: u8, src: &str, dst: &str, sport: u16, dport: u16, to: &str, to_port: u16) -> Flow {
    Flow {
        rsrc: ip(to),
        rsport: to_port,
        ..plain(proto, src, dst, sport, dport)
    }
}

/// A flow whose source was rewritten to `to` (SNAT/masquerade).
fn snat(proto: u8, src: &str, dst: &str, sport: u16, dport: u16, to: &str) -> Flow {
    Flow {
        rdst: ip(to),
        ..plain(proto, src, dst, sport, dport)
    }
}

/// An echo request and its reply (protocols without ports).
fn ping(src: &str, dst: &str, id: u16) -> Flow {
    let (s, d) = (ip(src), ip(dst));
    let (proto, request, reply) = if s.is_ipv4() {
        (ICMP, 8, 0)
    } else {
        (ICMPV6, 128, 129)
    };
    Flow {
        proto,
        osrc: s,
        odst: d,
        osport: id,
        odport: request,
        rsrc: d,
        rdst: s,
        rsport: id,
        rdport: reply,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Inserts `flows` with IPCTNL_MSG_CT_NEW, many per write (in the calling thread's namespace).
fn create(flows: &[Flow]) {
    let mut sock = NfSocket::open().unwrap();
    // Each message gets an ACK; 128 of them fit the socket's receive buffer comfortably.
    for chunk in flows.chunks(128) {
        let mut b = sock.msgbuf();
        for f in chunk {
            let family = if f.osrc.is_ipv4() { 2 } else { 10 };
            b.begin(CT_NEW, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, family, 0);
            put_tuple(&mut b, 1, f.proto, f.osrc, f.odst, f.osport, f.odport);
            put_tuple(&mut b, 2, f.proto, f.rsrc, f.rdst, f.rsport, f.rdport);
            b.attr_u32_be(7, 3600); // CTA_TIMEOUT: nothing expires during a test
            if f.proto == TCP {
                let pi = b.nest_begin(4); // CTA_PROTOINFO
                let t = b.nest_begin(1); // CTA_PROTOINFO_TCP
                b.attr_u8(1, 3); // CTA_PROTOINFO_TCP_STATE = ESTABLISHED
                b.nest_end(t);
                b.nest_end(pi);
            }
            b.end();
        }
        sock.transact(&b, &|_| "create conntrack entry".into())
            .unwrap();
    }
}

fn parse_tuple(a: Attrs<'_>, v6: bool) -> (u8, IpAddr, IpAddr, u16, u16) {
    let ipa = a.get(1).unwrap().nested();
    let addr = |ty: u16| -> IpAddr {
        let p = ipa.get(ty).unwrap().payload;
        if v6 {
            IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(p).unwrap()))
        } else {
            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(p).unwrap()))
        }
    };
    let (s, d) = if v6 {
        (addr(3), addr(4))
    } else {
        (addr(1), addr(2))
    };
    let pa = a.get(2).unwrap().nested();
    let proto = pa.get(1).unwrap().payload[0];
    let port = |ty: u16| pa.get(ty).and_then(|x| x.u16_be()).unwrap_or(0);
    let byte = |ty: u16| pa.get(ty).map_or(0, |x| u16::from(x.payload[0]));
    match proto {
        ICMP => (proto, s, d, port(4), byte(5)),
        ICMPV6 => (proto, s, d, port(7), byte(8)),
        _ => (proto, s, d, port(2), port(3)),
    }
}

/// Every entry of the calling thread's namespace, both families.
fn dump() -> BTreeSet<Flow> {
    let mut sock = NfSocket::open().unwrap();
    let mut b = sock.msgbuf();
    b.begin(CT_GET, NLM_F_DUMP, 0, 0);
    b.end();
    let mut out = BTreeSet::new();
    for m in sock.request(&b, "dump conntrack").unwrap() {
        let v6 = m.nf_family() == 10;
        let a = m.nf_attrs();
        let (proto, osrc, odst, osport, odport) = parse_tuple(a.get(1).unwrap().nested(), v6);
        let (_, rsrc, rdst, rsport, rdport) = parse_tuple(a.get(2).unwrap().nested(), v6);
        assert!(out.insert(Flow {
            proto,
            osrc,
            odst,
            osport,
            odport,
            rsrc,
            rdst,
            rsport,
            rdport,
        }));
    }
    out
}

/// `n` unrelated entries, a quarter of them IPv6, half UDP and half TCP, all distinct.
fn background(n: u32) -> Vec<Flow> {
    (0..n)
        .map(|i| {
            let proto = if i % 2 == 0 { UDP } else { TCP };
            let sport = 1024 + (i % 60000) as u16;
            let dport = if proto == UDP { 53 } else { 443 };
            if i % 4 == 0 {
                let s = IpAddr::V6(Ipv6Addr::from(0xfd00_00bb_u128 << 96 | i as u128));
                let d = IpAddr::V6(Ipv6Addr::from(
                    0xfd00_0099_u128 << 96 | (i % 200 + 1) as u128,
                ));
                plain_addrs(proto, s, d, sport, dport)
            } else {
                // 10.128.0.0 + i: far from the test pods' 10.1.0.0/24.
                let s = IpAddr::V4(Ipv4Addr::from(0x0a80_0000 + i));
                let d = IpAddr::V4(Ipv4Addr::new(11, 0, 0, (i % 200 + 1) as u8));
                plain_addrs(proto, s, d, sport, dport)
            }
        })
        .collect()
}

fn plain_addrs(proto: u8, s: IpAddr, d: IpAddr, sport: u16, dport: u16) -> Flow {
    Flow {
        proto,
        osrc: s,
        odst: d,
        osport: sport,
        odport: dport,
        rsrc: d,
        rdst: s,
        rsport: dport,
        rdport: sport,
    }
}

const POD4: &str = "10.1.0.5";
const POD6: &str = "fd00:1::5";

/// Entries of the previous owner of POD4/POD6, in every shape flush_addresses must remove.
fn pod_flows() -> Vec<Flow> {
    vec![
        // The pod as original source: to the outside (masqueraded) and inside the cluster.
        snat(UDP, POD4, "11.0.0.1", 40000, 53, "192.168.0.2"),
        snat(TCP, POD4, "11.0.0.1", 40001, 443, "192.168.0.2"),
        plain(UDP, POD4, "10.1.0.7", 40002, 5353),
        plain(TCP, POD4, "10.1.0.7", 40003, 8080),
        // A flow the pod opened to the metadata address before any DNAT existed.
        plain(TCP, POD4, "169.254.169.254", 40004, 80),
        // The pod as reply source: someone connected to it directly, or through a service VIP.
        plain(TCP, "10.1.0.7", POD4, 50000, 8080),
        plain(UDP, "10.1.0.7", POD4, 50001, 53),
        dnat(TCP, "10.1.0.8", "10.96.0.10", 50002, 80, POD4, 8080),
        dnat(UDP, "10.1.0.8", "10.96.0.10", 50003, 53, POD4, 53),
        ping(POD4, "11.0.0.1", 7),
        ping("10.1.0.7", POD4, 8),
        // The same for IPv6.
        snat(UDP, POD6, "fd00:99::1", 40000, 53, "fd00:ff::2"),
        snat(TCP, POD6, "fd00:99::1", 40001, 443, "fd00:ff::2"),
        plain(TCP, POD6, "fd00:ec2::254", 40004, 80),
        plain(TCP, "fd00:1::7", POD6, 50000, 8080),
        plain(UDP, "fd00:1::7", POD6, 50001, 53),
        dnat(TCP, "fd00:1::8", "fd00:96::10", 50002, 80, POD6, 8080),
        ping(POD6, "fd00:99::1", 7),
        ping("fd00:1::7", POD6, 8),
    ]
}

/// Entries that mention the pod's addresses, or nearly, but neither as original nor as reply
/// source: they must survive.
fn near_misses() -> Vec<Flow> {
    vec![
        // Addressed to the pod's address but DNATed elsewhere: reply source is the other host.
        dnat(TCP, "10.1.0.7", POD4, 50010, 80, "10.1.0.9", 8080),
        dnat(TCP, "fd00:1::7", POD6, 50010, 80, "fd00:1::9", 8080),
        // SNATed to the pod's address: it is only the reply destination.
        snat(UDP, "10.1.0.9", "11.0.0.2", 40010, 53, POD4),
        snat(UDP, "fd00:1::9", "fd00:99::2", 40010, 53, POD6),
        // Neighbouring addresses.
        plain(TCP, "10.1.0.50", "11.0.0.1", 40011, 443),
        plain(TCP, "11.0.0.1", "10.1.0.50", 40012, 22),
        plain(TCP, "10.1.0.4", "11.0.0.1", 40013, 443),
        plain(TCP, "fd00:1::50", "fd00:99::1", 40011, 443),
        plain(TCP, "fd00:1::5:0", "fd00:99::1", 40012, 443),
        ping("10.1.0.7", "10.1.0.9", 7),
        ping("fd00:1::7", "fd00:1::9", 7),
    ]
}

/// Whether this kernel deletes by filter (6.12 and later); the kernel test layer says so for the
/// kernels it boots (`ct_delete=dump` on 5.10 and 6.1, which refuse it with EINVAL), and the
/// host's own kernel does.
fn filtered_delete_accepted() -> bool {
    common::kernel_expects("ct_delete").as_deref() != Some("dump")
}

fn pod_addrs() -> [IpAddr; 2] {
    [ip(POD4), ip(POD6)]
}

/// The calling thread's namespace holds exactly `keep`: nothing of it was deleted, nothing
/// else (the pods' entries) is left. Returns the table.
fn assert_left_exactly(keep: &[Flow]) -> BTreeSet<Flow> {
    let after = dump();
    let want: BTreeSet<Flow> = keep.iter().copied().collect();
    let gone: Vec<&Flow> = want.difference(&after).collect();
    assert!(gone.is_empty(), "unrelated entries deleted: {gone:?}");
    let left: Vec<&Flow> = after.difference(&want).collect();
    assert!(left.is_empty(), "pods' entries left: {left:?}");
    after
}

/// Fills a fresh namespace, flushes the pod's addresses along `path`, and checks that exactly
/// the pod's entries are gone. Returns the report and the table left behind.
fn flush_case(test: &str, background_n: u32, path: Path) -> (FlushReport, BTreeSet<Flow>) {
    let (_h, ns) = namespace(test);
    in_netns(&ns, || {
        let pod = pod_flows();
        let mut keep = background(background_n);
        keep.extend(near_misses());
        create(&keep);
        create(&pod);
        let before = dump();
        assert_eq!(before.len(), keep.len() + pod.len(), "entries created");
        assert_eq!(
            conntrack::count_entries().unwrap(),
            before.len() as u64,
            "kernel entry count"
        );

        let report = conntrack::flush_addresses_with(&pod_addrs(), path).unwrap();

        let after = assert_left_exactly(&keep);
        assert_eq!(after.len(), keep.len(), "exact count after the flush");
        assert_eq!(report.deleted, pod.len() as u64, "{report:?}");
        (report, after)
    })
}

#[test]
fn ip_reuse_flush_removes_only_the_pods_entries() {
    let (report, _) = flush_case("reuse", 100_000, Path::Auto);
    // IPv4: original source and reply source, one filtered delete each (a filtered dump each
    // where the kernel refuses the filtered delete). IPv6: one dump of the family (the kernel's
    // IPv6 address filter cannot be used).
    if filtered_delete_accepted() {
        assert_eq!(report.path, "filtered+ipv6-dump");
    } else {
        assert_eq!(report.path, "dump+delete+ipv6-dump");
    }
    assert_eq!(report.walks, 3);
}

#[test]
fn fallback_and_full_dump_paths_give_the_filtered_result() {
    if !filtered_delete_accepted() {
        // The kernel refuses the filtered delete: forced, it is an error (EINVAL), and the
        // fallback and the full dump still agree.
        let (_h, ns) = namespace("pathr");
        in_netns(&ns, || {
            create(&pod_flows());
            let e = conntrack::flush_addresses_with(&pod_addrs(), Path::Filtered).unwrap_err();
            assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
        });
        let (fallback, left_fallback) = flush_case("pathd", 20_000, Path::Fallback);
        let (full, left_full) = flush_case("pathu", 20_000, Path::FullDump);
        assert_eq!(left_full, left_fallback);
        assert_eq!(
            (fallback.path, full.path),
            ("dump+delete+ipv6-dump", "full-dump")
        );
        assert_eq!((fallback.walks, full.walks), (3, 1));
        assert_eq!(fallback.deleted, full.deleted);
        return;
    }
    let (filtered, left_filtered) = flush_case("pathf", 20_000, Path::Filtered);
    let (fallback, left_fallback) = flush_case("pathd", 20_000, Path::Fallback);
    let (full, left_full) = flush_case("pathu", 20_000, Path::FullDump);
    assert_eq!(left_fallback, left_filtered);
    assert_eq!(left_full, left_filtered);
    assert_eq!(
        (filtered.path, fallback.path, full.path),
        ("filtered+ipv6-dump", "dump+delete+ipv6-dump", "full-dump")
    );
    assert_eq!((filtered.walks, fallback.walks, full.walks), (3, 3, 1));
    assert_eq!(filtered.deleted, fallback.deleted);
    assert_eq!(filtered.deleted, full.deleted);
}

#[test]
fn auto_path_flushes_and_empty_input_does_nothing() {
    let (_h, ns) = namespace("auto");
    in_netns(&ns, || {
        conntrack::probe().unwrap();
        // Empty table: nothing to walk.
        let r = conntrack::flush_addresses(&pod_addrs()).unwrap();
        assert_eq!((r.deleted, r.walks), (0, 0), "{r:?}");

        let pod = pod_flows();
        let keep = near_misses();
        create(&pod);
        create(&keep);
        let r = conntrack::flush_addresses(&[]).unwrap();
        assert_eq!((r.deleted, r.walks), (0, 0), "{r:?}");
        // Only IPv4 given: the IPv6 entries of the pod stay.
        let r = conntrack::flush_addresses(&[ip(POD4)]).unwrap();
        let v4 = pod.iter().filter(|f| f.osrc.is_ipv4()).count();
        assert_eq!(r.deleted, v4 as u64, "{r:?}");
        let want = if filtered_delete_accepted() {
            "filtered"
        } else {
            "dump+delete"
        };
        assert_eq!((r.walks, r.path), (2, want), "{r:?}");
        let r = conntrack::flush_addresses(&[ip(POD6)]).unwrap();
        assert_eq!(r.deleted, (pod.len() - v4) as u64, "{r:?}");
        assert_eq!((r.walks, r.path), (1, "ipv6-dump"), "{r:?}");
        let want: BTreeSet<Flow> = keep.iter().copied().collect();
        assert_eq!(dump(), want);
    });
}

#[test]
fn metadata_flows_that_bypassed_the_proxy_are_deleted_and_proxied_ones_stay() {
    let (_h, ns) = namespace("adopt");
    in_netns(&ns, || {
        let (a, b, c) = ("10.1.0.11", "10.1.0.12", "10.1.0.13");
        let (a6, c6) = ("fd00:1::11", "fd00:1::13");
        let meta4 = "169.254.169.254";
        let meta6 = "fd00:ec2::254";
        let bypassed = vec![
            plain(TCP, a, meta4, 41000, 80),
            plain(TCP, a, meta4, 41001, 80),
            plain(TCP, b, meta4, 41000, 80),
            plain(TCP, a6, meta6, 41000, 80),
            // DNATed, but not to the proxy: another component's DNAT, or a proxy port the
            // network no longer has.
            dnat(TCP, a, meta4, 41100, 80, "10.1.0.99", 9999),
            dnat(TCP, b, meta4, 41101, 80, "10.1.0.1", 8182),
            dnat(TCP, a6, meta6, 41100, 80, "fd00:1::99", 9999),
        ];
        let on_8080 = plain(TCP, b, meta4, 41002, 8080);
        // Went through the DNAT to the node-local proxy: what `deny` deletes too.
        let proxied = vec![
            dnat(TCP, a, meta4, 42000, 80, "10.1.0.1", 8181),
            dnat(TCP, b, meta4, 42000, 80, "10.1.0.1", 8181),
            dnat(TCP, a6, meta6, 42000, 80, "fd00:1::1", 8181),
        ];
        let mut keep = vec![
            // Sources that are not being adopted, DNATed or not.
            plain(TCP, c, meta4, 43000, 80),
            plain(TCP, c6, meta6, 43000, 80),
            dnat(TCP, c, meta4, 43001, 80, "10.1.0.99", 9999),
            // Other ports, protocols and destinations of the adopted pods.
            plain(TCP, a, meta4, 44000, 443),
            plain(UDP, a, meta4, 44001, 80),
            plain(TCP, a, "10.9.9.9", 44002, 80),
            plain(TCP, a6, "fd00:9::9", 44002, 80),
            // The metadata address answering a connection it opened to the pod.
            plain(TCP, meta4, a, 80, 44003),
        ];
        keep.extend(background(1000));
        create(&bypassed);
        create(&[on_8080]);
        create(&proxied);
        create(&keep);
        let srcs = [ip(a), ip(b), ip(a6)];
        let dsts = [ip(meta4), ip(meta6)];
        let proxies = [(ip("10.1.0.1"), 8181), (ip("fd00:1::1"), 8181)];

        let r = conntrack::flush_bypassed_flows(&srcs, &dsts, &[80], &proxies).unwrap();
        assert_eq!(r.deleted, bypassed.len() as u64, "{r:?}");
        // One walk for the IPv4 destination, one for all IPv6 destinations.
        assert_eq!(r.walks, 2, "{r:?}");
        // Several ports: the port is matched in userspace, still one walk per destination.
        let r = conntrack::flush_bypassed_flows(&srcs, &dsts, &[80, 8080], &proxies).unwrap();
        assert_eq!((r.deleted, r.walks), (1, 2), "{r:?}");
        // Nothing left to do; empty lists match nothing.
        let r = conntrack::flush_bypassed_flows(&srcs, &dsts, &[80, 8080], &proxies).unwrap();
        assert_eq!(r.deleted, 0, "{r:?}");
        let r = conntrack::flush_bypassed_flows(&srcs, &dsts, &[], &proxies).unwrap();
        assert_eq!((r.deleted, r.walks), (0, 0), "{r:?}");
        let mut want: BTreeSet<Flow> = keep.iter().copied().collect();
        want.extend(proxied.iter().copied());
        assert_eq!(dump(), want);

        // `deny`: no proxy, so the proxied flows bypass it too.
        let r = conntrack::flush_bypassed_flows(&srcs, &dsts, &[80], &[]).unwrap();
        assert_eq!(r.deleted, proxied.len() as u64, "{r:?}");
        let want: BTreeSet<Flow> = keep.iter().copied().collect();
        assert_eq!(dump(), want);
    });
}

#[test]
fn entries_vanishing_between_dump_and_delete_are_not_errors() {
    // Two dump+delete flushes of the same addresses race: each entry is deleted by one of them,
    // and the other finds it gone (ENOENT) or never sees it. Both succeed, and the exact counts
    // of the dump path add up.
    let (_h, ns) = namespace("race");
    in_netns(&ns, || {
        let mut pod: Vec<Flow> = (0..1500)
            .map(|i| plain(UDP, POD4, "11.0.0.1", 20000 + i, 53))
            .collect();
        pod.extend((0..1500).map(|i| plain(TCP, "fd00:99::1", POD6, 20000 + i, 443)));
        let keep = near_misses();
        create(&pod);
        create(&keep);
        let barrier = std::sync::Barrier::new(2);
        let (a, b) = std::thread::scope(|s| {
            let run = || {
                barrier.wait();
                conntrack::flush_addresses_with(&pod_addrs(), Path::Fallback)
            };
            let a = s.spawn(run);
            let b = s.spawn(run);
            (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
        });
        assert_eq!(a.deleted + b.deleted, pod.len() as u64, "{a:?} {b:?}");
        let want: BTreeSet<Flow> = keep.iter().copied().collect();
        assert_eq!(dump(), want);
    });
}

/// The kernel's IPv6 address filter, checked by this test on its own: two IPv6 entries in the
/// test's namespace, one dump filtered on the first one's original source. `true` when exactly
/// that entry comes back (a correct kernel), `false` when exactly the other one does (inverted).
fn ipv6_filter_is_correct_here() -> bool {
    let a = ip("fd00:7::1");
    let b = ip("fd00:7::2");
    create(&[
        plain(UDP, "fd00:7::1", "fd00:7::9", 1000, 53),
        plain(UDP, "fd00:7::2", "fd00:7::9", 1000, 53),
    ]);
    let mut sock = NfSocket::open().unwrap();
    let mut m = sock.msgbuf();
    m.begin(CT_GET, NLM_F_DUMP, 10, 0);
    let t = m.nest_begin(1); // CTA_TUPLE_ORIG
    let n = m.nest_begin(1); // CTA_TUPLE_IP
    let IpAddr::V6(a6) = a else { unreachable!() };
    m.attr(3, &a6.octets()); // CTA_IP_V6_SRC
    m.nest_end(n);
    m.nest_end(t);
    let f = m.nest_begin(25); // CTA_FILTER
    m.attr(1, &1u32.to_ne_bytes()); // ORIG_FLAGS: CTA_FILTER_F_CTA_IP_SRC
    m.nest_end(f);
    m.end();
    let srcs: Vec<IpAddr> = sock
        .request(&m, "filtered IPv6 dump")
        .unwrap()
        .iter()
        .map(|m| parse_tuple(m.nf_attrs().get(1).unwrap().nested(), true).1)
        .collect();
    match srcs.as_slice() {
        [s] if *s == a => true,
        [s] if *s == b => false,
        other => panic!("a filtered IPv6 dump returned {other:?}: neither correct nor inverted"),
    }
}

/// natguard's probe (in a throwaway namespace of its own) agrees with the test's own check; its
/// verdict is cached for this boot only: a cached verdict of another boot id is ignored and
/// replaced, a verdict of this boot is used.
#[test]
fn the_ipv6_filter_probe_matches_the_kernel_and_is_cached_per_boot() {
    use conntrack::ipv6_probe::{ipv6_filter, Ipv6Filter, Source, CACHE_FILE};
    let (_h, ns) = namespace("v6probe");
    let correct = in_netns(&ns, ipv6_filter_is_correct_here);
    let want = if correct {
        Ipv6Filter::Correct
    } else {
        Ipv6Filter::Inverted
    };
    let dir = std::env::temp_dir().join(format!("ng-ct6-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(CACHE_FILE);
    // Another boot's verdict, the opposite of the truth: not trusted.
    let lie = if correct { "inverted" } else { "correct" };
    std::fs::write(
        &file,
        format!("00000000-0000-0000-0000-000000000000 {lie}\n"),
    )
    .unwrap();
    assert_eq!(ipv6_filter(&dir), (want, Source::Probe));
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let cached = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        cached.split_whitespace().next(),
        Some(boot.trim()),
        "{cached}"
    );
    assert_eq!(ipv6_filter(&dir), (want, Source::Cache));
    // The choice of path follows the verdict, and only for IPv6 addresses.
    let chosen = conntrack::auto_path(Path::Auto, &pod_addrs(), &dir);
    assert_eq!(
        chosen,
        if correct {
            Path::Ipv6Filtered
        } else {
            Path::Auto
        }
    );
    assert_eq!(
        conntrack::auto_path(Path::Auto, &[ip(POD4)], &dir),
        Path::Auto
    );
    assert_eq!(
        conntrack::auto_path(Path::Fallback, &pod_addrs(), &dir),
        Path::Fallback
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// On a kernel whose IPv6 filter is correct, the filtered IPv6 deletes remove exactly the pod's
/// entries in four walks and no family dump; on an inverted one natguard never takes that path
/// (checked above), and this test checks instead that the family dump is what Auto does.
#[test]
fn ipv6_filtered_deletes_are_exact_where_the_kernel_filter_is_correct() {
    let (_h, ns) = namespace("v6check");
    if in_netns(&ns, ipv6_filter_is_correct_here) {
        let (report, _) = flush_case("v6filtered", 20_000, Path::Ipv6Filtered);
        assert_eq!((report.path, report.walks), ("filtered", 4), "{report:?}");
    } else {
        // The IPv4 half takes the filtered delete where the kernel accepts it, the dump+delete
        // where it refuses it (5.10, 6.1); the kernel layer says which this kernel must take.
        let (report, _) = flush_case("v6inverted", 20_000, Path::Auto);
        let want = match common::kernel_expects("ct_delete").as_deref() {
            Some("dump") => "dump+delete+ipv6-dump",
            _ => "filtered+ipv6-dump",
        };
        assert_eq!((report.path, report.walks), (want, 3), "{report:?}");
    }
}

/// Pod `i` of the burst below: its addresses, and the entries of their previous owner.
fn burst_pod(i: u32) -> (common::synthetic::SynPod, Vec<Flow>) {
    let (v4, v6) = (
        format!("10.1.0.{}", 20 + i),
        format!("fd00:1::{:x}", 0x20 + i),
    );
    let pod = common::synthetic::SynPod::new("ctpass", &format!("ctpass{i:04}"), ip(&v4), ip(&v6));
    let port = 40000 + i as u16;
    let flows = vec![
        snat(TCP, &v4, "11.0.0.1", port, 443, "192.168.0.2"),
        plain(TCP, &v4, "169.254.169.254", port, 80),
        plain(UDP, "10.1.0.7", &v4, port, 53),
        dnat(TCP, "10.1.0.8", "10.96.0.10", port, 80, &v4, 8080),
        ping(&v4, "11.0.0.1", port),
        snat(UDP, &v6, "fd00:99::1", port, 53, "fd00:ff::2"),
        plain(TCP, &v6, "fd00:ec2::254", port, 80),
        plain(TCP, "fd00:1::7", &v6, port, 8080),
    ];
    (pod, flows)
}

/// The pass tests' setup: a private `/run/natguard` (`run`, to bind-mount), a config that logs
/// at info to `log_name`, and the pass lock (`run/ct.lock`) taken by the test and held while
/// the returned file lives.
fn pass_lock_held(
    h: &common::Harness,
    log_name: &str,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    serde_json::Value,
    std::fs::File,
) {
    let run = h.dir().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let log = h.dir().join(log_name);
    let cfg = common::synthetic::fixed_proxy_cfg(serde_json::json!({
        "metadata": { "mode": "proxy" },
        "logFile": log,
        "logLevel": "info"
    }));
    let held = std::fs::File::create(run.join("ct.lock")).unwrap();
    held.lock().unwrap();
    (run, log, cfg, held)
}

/// A burst of ADDs shares one conntrack pass, and the pass is exact. The test holds the pass's
/// lock (`ct.lock` in the private `/run/natguard`) while 8 dual-stack ADDs commit and write
/// their requests, then lets go: the first to take the lock flushes all 8 pods' addresses in one
/// pass (a full dump, since 8 IPv4 addresses wait in a table of 30,000 entries), the other 7
/// reply without a walk of their own, and what is left is exactly the background and the near
/// misses, with no request file behind.
#[test]
fn one_pass_serves_every_waiting_add_and_deletes_exactly_their_entries() {
    use common::run::{parallel, Access, Invocation};
    use std::time::{Duration, Instant};
    const PODS: u32 = 8;
    let (h, ns) = namespace("pass");
    let pods: Vec<_> = (0..PODS).map(burst_pod).collect();
    let mut keep = background(30_000);
    keep.extend(near_misses());
    // Addressed to a pod, but DNATed elsewhere: the pod is neither source.
    keep.push(dnat(
        TCP,
        "10.1.0.7",
        "10.1.0.20",
        50020,
        80,
        "10.1.0.9",
        8080,
    ));
    let stale: Vec<Flow> = pods.iter().flat_map(|(_, f)| f.clone()).collect();
    in_netns(&ns, || {
        create(&keep);
        create(&stale);
        assert_eq!(dump().len(), keep.len() + stale.len(), "entries created");
    });

    let (run, log, cfg, held) = pass_lock_held(&h, "pass.log");
    let requests = || -> usize {
        std::fs::read_dir(run.join("ct")).map_or(0, |d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    !n.starts_with('.') && !n.ends_with(".done")
                })
                .count()
        })
    };
    let outcomes = std::thread::scope(|s| {
        let adds = s.spawn(|| {
            let jobs: Vec<Box<dyn FnOnce() -> Invocation + Send + '_>> = pods
                .iter()
                .map(|(p, _)| {
                    let (cfg, run, ns) = (&cfg, &run, &ns);
                    Box::new(move || {
                        p.invocation("ADD", cfg)
                            .bind_mount(run, "/run/natguard", Access::ReadWrite)
                            .bound(Duration::from_secs(60))
                            .run_in(ns)
                    }) as Box<dyn FnOnce() -> Invocation + Send>
                })
                .collect();
            parallel(jobs)
        });
        // A deadline against a hang; the ADDs wait up to 10 s for the lock, then go alone.
        let deadline = Instant::now() + Duration::from_secs(8);
        while requests() < PODS as usize {
            assert!(
                Instant::now() < deadline,
                "only {} of {PODS} requests were written while the pass lock was held",
                requests()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        held.unlock().unwrap();
        adds.join().unwrap()
    });
    for inv in outcomes {
        inv.succeeded();
    }

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("conntrack: ")).collect();
    let ran: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains(&format!("for {PODS} invocation(s)")))
        .collect();
    let served = lines
        .iter()
        .filter(|l| l.contains("deleted by another invocation's pass"))
        .count();
    assert_eq!(
        (ran.len(), served),
        (1, PODS as usize - 1),
        "one pass for all, the others served by it:\n{}",
        lines.join("\n")
    );
    assert!(
        ran[0].contains(&format!("deleted {} entries", stale.len()))
            && ran[0].contains("(full-dump)"),
        "one full dump, exact: {}",
        ran[0]
    );
    in_netns(&ns, || assert_left_exactly(&keep));
    let left: Vec<String> = std::fs::read_dir(run.join("ct"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "requests left behind: {left:?}");
}

/// A pass lock that someone holds and never lets go (a stopped natguard, an operator's
/// `flock`) does not wedge the ADD: after the pass's deadline it flushes its own addresses
/// alone, exactly, and replies.
#[test]
fn a_pass_lock_held_forever_costs_a_bounded_wait_and_the_flush_still_runs() {
    use common::run::Access;
    use std::time::Duration;
    let (h, ns) = namespace("pass-held");
    let (pod, stale) = burst_pod(0);
    let keep = near_misses();
    in_netns(&ns, || {
        create(&keep);
        create(&stale);
    });
    let (run, log, cfg, held) = pass_lock_held(&h, "held.log");
    // natguard's pass waits 10 s; the bound only keeps a hang from hanging the test.
    pod.invocation("ADD", &cfg)
        .bind_mount(&run, "/run/natguard", Access::ReadWrite)
        .bound(Duration::from_secs(60))
        .run_in(&ns)
        .succeeded();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines().any(|l| l.contains("conntrack: deleted")
            && l.contains(&format!("deleted {} entries", stale.len()))
            && l.contains(" alone: ")),
        "the ADD flushed alone after the deadline:\n{text}"
    );
    in_netns(&ns, || assert_left_exactly(&keep));
    let left: Vec<_> = std::fs::read_dir(run.join("ct"))
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "the request stayed behind: {left:?}");
    drop(held);
}
