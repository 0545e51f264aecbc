//! Root tests of large nf_tables batches and of the netlink exchange itself: what the kernel
//! answers, how long natguard waits for it, and what it does when replies are missing.
//!
//! Each test runs in network namespaces of its own (`common::Harness`). Large states (thousands
//! of pods, thousands of interval elements) are set up in-process with the library, on a thread
//! that joined the test's namespace; the verbs under test run as the real binary, with a CNI
//! environment and a synthetic dual-stack prevResult, the way a runtime runs them. Every
//! invocation has a bound (a bound for failure reports, not a speed assertion): a verb that
//! never returns fails the test instead of hanging it. Needs root; never skips.

mod common;

use common::*;
use natguard::config::{MAX_METADATA_PORTS, MAX_NON_MASQUERADE_CIDRS};
use natguard::kernel::netlink::{BatchError, MsgBuf, NfSocket, NFNL_SUBSYS_CTNETLINK};
use natguard::kernel::{lower as encode, nft};
use natguard::plan::{Family, Key, NetNames, OwnerKey, SetKind, TableFamily};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The network of every test here.
const NET: &str = "bnet";
/// Upper bound for one invocation; far above what any of them needs.
const BOUND: Duration = Duration::from_secs(120);

/// What one invocation did.
struct Inv {
    what: String,
    exit: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Inv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> exit {:?}\nstdout: {}\nstderr: {}",
            self.what,
            self.exit,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

impl Inv {
    fn ok(&self) {
        assert_eq!(self.exit, Some(0), "expected success: {self}");
    }

    /// A CNI error with `code` whose message mentions each of `needles`.
    fn fails_with(&self, code: u64, needles: &[&str]) {
        assert_eq!(self.exit, Some(1), "expected a CNI error: {self}");
        let r: Value = serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self}"));
        assert_eq!(r["code"].as_u64(), Some(code), "wrong code: {self}");
        let text = format!("{} {}", r["msg"], r["details"]);
        for n in needles {
            assert!(text.contains(n), "the error should mention {n:?}: {self}");
        }
    }
}

/// Runs natguard in `ns` with exactly `env` and `stdin`; kills it and panics after [`BOUND`].
fn exec(ns: &Netns, env: &[(String, String)], stdin: &[u8]) -> Inv {
    let nsfile = File::open(ns.path()).unwrap_or_else(|e| panic!("open {}: {e}", ns.path()));
    let fd = nsfile.as_raw_fd();
    let mut cmd = Command::new(natguard_bin());
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only setns runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let what = format!(
        "natguard [{}] in {}",
        env.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        ns.name
    );
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {what}: {e}"));
    drop(nsfile);
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    // Large configs exceed a pipe buffer: write from a thread.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let ereader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("natguard did not return within {BOUND:?}: {what}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let _ = writer.join();
    Inv {
        what,
        exit: status.code(),
        stdout: reader.join().unwrap_or_default(),
        stderr: ereader.join().unwrap_or_default(),
    }
}

/// A pod as natguard sees it.
#[derive(Clone, Debug)]
struct Pod {
    cid: String,
    k8s_ns: &'static str,
    v4: IpAddr,
    v6: IpAddr,
    prefix4: u8,
    prefix6: u8,
}

impl Pod {
    /// Pod `i`: every fifth one in the exempt namespace, so the allow sets are used too.
    fn new(tag: &str, i: u32) -> Pod {
        Pod {
            cid: format!("{tag}{i:05}"),
            k8s_ns: if i.is_multiple_of(5) {
                "kube-system"
            } else {
                "default"
            },
            v4: IpAddr::V4(Ipv4Addr::new(
                10,
                64 + (i >> 16) as u8,
                (i >> 8) as u8,
                i as u8,
            )),
            v6: IpAddr::V6(Ipv6Addr::new(
                0xfd00,
                7,
                0,
                0,
                0,
                0,
                (i >> 16) as u16,
                i as u16,
            )),
            prefix4: 10,
            prefix6: 64,
        }
    }

    fn owner(&self) -> OwnerKey {
        OwnerKey::new(NET, &self.cid, "eth0")
    }

    fn result(&self) -> Value {
        json!({
            "cniVersion": "1.1.0",
            "interfaces": [{ "name": "eth0", "sandbox": "/run/netns/gone" }],
            "ips": [
                { "address": format!("{}/{}", self.v4, self.prefix4), "interface": 0 },
                { "address": format!("{}/{}", self.v6, self.prefix6), "interface": 0 }
            ]
        })
    }

    fn env(&self, verb: &str) -> Vec<(String, String)> {
        vec![
            ("CNI_COMMAND".into(), verb.into()),
            ("CNI_CONTAINERID".into(), self.cid.clone()),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_NETNS".into(), "/run/netns/gone".into()),
            ("CNI_PATH".into(), "/opt/cni/bin".into()),
            (
                "CNI_ARGS".into(),
                format!(
                    "K8S_POD_NAMESPACE={};K8S_POD_NAME=p-{}",
                    self.k8s_ns, self.cid
                ),
            ),
        ]
    }
}

/// natguard's entry with fixed proxy addresses (no route lookups), `patch` merged in.
fn cfg(patch: Value) -> Value {
    let mut c = json!({
        "type": "natguard",
        "metadata": {
            "proxyIPv4": "10.0.0.1",
            "proxyIPv6": "fd00::1",
            "exemptNamespaces": ["kube-system"]
        }
    });
    merge(&mut c, &patch);
    c
}

fn stdin_of(cfg: &Value, prev: Option<Value>) -> Vec<u8> {
    let mut c = cfg.clone();
    c["cniVersion"] = json!("1.1.0");
    c["name"] = json!(NET);
    if let Some(p) = prev {
        c["prevResult"] = p;
    }
    serde_json::to_vec(&c).unwrap()
}

fn add(ns: &Netns, cfg: &Value, p: &Pod) -> Inv {
    exec(ns, &p.env("ADD"), &stdin_of(cfg, Some(p.result())))
}

fn gc(ns: &Netns, cfg: &Value, keep: &[&Pod]) -> Inv {
    let mut c = cfg.clone();
    c["cni.dev/valid-attachments"] = json!(keep
        .iter()
        .map(|p| json!({ "containerID": p.cid, "ifname": "eth0" }))
        .collect::<Vec<_>>());
    let env = vec![
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), "/opt/cni/bin".to_string()),
    ];
    exec(ns, &env, &stdin_of(&c, None))
}

fn set(kind: SetKind) -> String {
    NetNames::new(NET).set(kind)
}

/// Every key of set `kind` in `ns`, read with the library.
fn elements(ns: &Netns, kind: SetKind) -> Vec<Key> {
    let name = set(kind);
    in_netns(ns, move || {
        let mut sock = NfSocket::open().expect("open netfilter socket");
        nft::dump_set(&mut sock, kind.table(), &name)
            .expect("dump set")
            .iter()
            .filter_map(|e| encode::key_of(kind, &e.key))
            .collect()
    })
}

/// The addresses a set's keys hold (`iifname . addr` keys count by their address).
fn addrs_of(ns: &Netns, kind: SetKind) -> BTreeSet<IpAddr> {
    elements(ns, kind)
        .iter()
        .filter_map(|k| match k {
            Key::Addr(a) | Key::IfAddr(_, a) => Some(*a),
            _ => None,
        })
        .collect()
}

/// ADDs `pods`, 16 invocations at a time.
fn add_all(ns: &Netns, cfg: &Value, pods: Vec<Pod>) {
    for chunk in pods.chunks(16) {
        std::thread::scope(|sc| {
            for p in chunk {
                sc.spawn(move || add(ns, cfg, p).ok());
            }
        });
    }
}

/// A GC of many stale dual-stack attachments is one batch of thousands of messages. It used
/// to ask for an ACK per message: from about 60 attachments the ACKs overflowed the receive
/// buffer, the batch that had been committed was sent again, and GC waited forever for the
/// lost ACKs, holding the node lock; past the send buffer's size the batch was refused with
/// EMSGSIZE. It must return, and leave exactly the pods it was told to keep.
fn gc_of_stale_attachments(test: &str, stale: u32) {
    let h = Harness::new(test);
    let ns = h.netns("node");
    let c = cfg(json!({}));
    let pods: Vec<Pod> = (0..stale + 2).map(|i| Pod::new("gc", i)).collect();
    add_all(&ns, &c, pods.clone());
    assert_eq!(elements(&ns, SetKind::Pods).len(), pods.len());

    let keep = [&pods[1], &pods[2]];
    gc(&ns, &c, &keep).ok();

    let owners: BTreeSet<OwnerKey> = elements(&ns, SetKind::Pods)
        .iter()
        .filter_map(|k| match k {
            Key::Owner(o) => Some(*o),
            _ => None,
        })
        .collect();
    let want: BTreeSet<OwnerKey> = keep.iter().map(|p| p.owner()).collect();
    assert_eq!(owners, want, "pods left after GC");
    let kept_addrs = |f: &dyn Fn(&Pod) -> bool, fam: Family| -> BTreeSet<IpAddr> {
        keep.iter()
            .filter(|p| f(p))
            .map(|p| if fam == Family::V4 { p.v4 } else { p.v6 })
            .collect()
    };
    for fam in Family::ALL {
        assert_eq!(
            addrs_of(&ns, SetKind::Masq(fam)),
            kept_addrs(&|_| true, fam),
            "masq {fam:?}"
        );
        assert_eq!(
            addrs_of(&ns, SetKind::Meta(fam)),
            kept_addrs(&|p| p.k8s_ns != "kube-system", fam),
            "meta {fam:?}"
        );
        assert_eq!(
            addrs_of(&ns, SetKind::Allow(fam)),
            kept_addrs(&|p| p.k8s_ns == "kube-system", fam),
            "allow {fam:?}"
        );
    }
    // And a second GC with nothing stale is a no-op that succeeds.
    gc(&ns, &c, &keep).ok();
}

#[test]
fn gc_of_300_stale_dual_stack_attachments_returns_and_leaves_none() {
    gc_of_stale_attachments("batch-gc300", 300);
}

#[test]
fn gc_of_5000_stale_dual_stack_attachments_returns_and_leaves_none() {
    gc_of_stale_attachments("batch-gc5000", 5000);
}

/// `count` non-adjacent IPv4 /25 prefixes, as config strings and as ranges.
fn cidrs(count: usize) -> (Vec<String>, Vec<(u128, u128)>) {
    let mut text = Vec::new();
    let mut ranges = Vec::new();
    for i in 0..count {
        let (b, c) = (16 + i / 256, i % 256);
        text.push(format!("172.{b}.{c}.0/25"));
        let start = u32::from(Ipv4Addr::new(172, b as u8, c as u8, 0)) as u128;
        ranges.push((start, start + 127));
    }
    (text, ranges)
}

/// Long config lists are installed whole up to their documented limit and refused with code 7
/// above it, never with a kernel error (code 100) for their size.
#[test]
fn long_config_lists_work_up_to_the_limit_and_are_refused_above_it() {
    let h = Harness::new("batch-lists");
    let ns = h.netns("node");
    let nomasq4 = set(SetKind::NoMasq(Family::V4));
    let ranges_in = |ns: &Netns| {
        let name = nomasq4.clone();
        in_netns(ns, move || {
            let mut sock = NfSocket::open().expect("open netfilter socket");
            nft::ranges_of(&nft::dump_set(&mut sock, TableFamily::Inet, &name).expect("dump"))
        })
    };
    for (i, count) in [1700, MAX_NON_MASQUERADE_CIDRS].into_iter().enumerate() {
        let (text, ranges) = cidrs(count);
        let c = cfg(json!({ "masquerade": { "nonMasqueradeCIDRs": text, "masqLinkLocal": true } }));
        add(&ns, &c, &Pod::new("cidr", i as u32 + 1)).ok();
        let have = ranges_in(&ns);
        assert_eq!(have, ranges, "{count} nonMasqueradeCIDRs in the kernel");
    }
    let (text, _) = cidrs(MAX_NON_MASQUERADE_CIDRS + 1);
    let c = cfg(json!({ "masquerade": { "nonMasqueradeCIDRs": text } }));
    add(&ns, &c, &Pod::new("cidr", 9)).fails_with(
        7,
        &[
            "masquerade.nonMasqueradeCIDRs",
            &MAX_NON_MASQUERADE_CIDRS.to_string(),
        ],
    );

    let ports: Vec<u16> = (1..=MAX_METADATA_PORTS as u16).collect();
    let c = cfg(json!({ "metadata": { "ports": ports } }));
    add(&ns, &c, &Pod::new("port", 1)).ok();
    let have: BTreeSet<u16> = elements(&ns, SetKind::MetaPorts)
        .iter()
        .filter_map(|k| match k {
            Key::Port(p) => Some(*p),
            _ => None,
        })
        .collect();
    assert_eq!(have, ports.iter().copied().collect(), "ports in the kernel");
    let many: Vec<u32> = (1..=5000).collect();
    let c = cfg(json!({ "metadata": { "ports": many } }));
    add(&ns, &c, &Pod::new("port", 2))
        .fails_with(7, &["metadata.ports", &MAX_METADATA_PORTS.to_string()]);
}

/// What nfnetlink answers, as `netlink`'s module documentation states it: a batch message
/// without NLM_F_ACK gets a reply only if it fails; any failure aborts the whole batch; the
/// ACK of the last message ends a successful one.
#[test]
fn nfnetlink_reports_errors_without_ack_and_aborts_the_whole_batch() {
    let h = Harness::new("batch-acks");
    let ns = h.netns("node");
    in_netns(&ns, || {
        let mut sock = NfSocket::open().unwrap();
        // A batch whose middle message fails: reported without asking, nothing applied.
        let mut b = sock.msgbuf();
        encode::begin_batch(&mut b);
        encode::new_table(&mut b, TableFamily::Inet);
        let bad = encode::flush_set(&mut b, TableFamily::Inet, "no-such-set");
        encode::new_set(
            &mut b,
            TableFamily::Inet,
            "bnet-pods",
            SetKind::Pods,
            1,
            false,
        );
        b.ack_last();
        encode::end_batch(&mut b);
        assert_eq!(b.acked_seqs().count(), 1);
        let what = |seq: u32| {
            if seq == bad {
                "flush the missing set".to_string()
            } else {
                format!("message {seq}")
            }
        };
        match sock.transact_batch(&b, &what) {
            Err(BatchError::Rejected(e)) => {
                assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");
                assert!(e.to_string().contains("flush the missing set"), "{e}");
            }
            other => panic!("expected the batch to be rejected: {other:?}"),
        }
        assert!(
            nft::table_flags(&mut sock, TableFamily::Inet)
                .unwrap()
                .is_none(),
            "nothing applied"
        );
        // The same batch without the failing message: one ACK, committed.
        let mut b = sock.msgbuf();
        encode::begin_batch(&mut b);
        encode::new_table(&mut b, TableFamily::Inet);
        encode::new_set(
            &mut b,
            TableFamily::Inet,
            "bnet-pods",
            SetKind::Pods,
            1,
            false,
        );
        b.ack_last();
        encode::end_batch(&mut b);
        sock.transact_batch(&b, &|s| format!("message {s}"))
            .expect("commit");
        assert!(nft::table_flags(&mut sock, TableFamily::Inet)
            .unwrap()
            .is_some());
    });
}

/// Every wait for a reply has a deadline. A batch the kernel drops without a word (a second
/// BATCH_BEGIN makes nfnetlink discard it silently) and a request that succeeds without a
/// reply (a ctnetlink flush of an empty table, no NLM_F_ACK) both end with "try again" (code
/// 11) and a message saying no reply came, instead of blocking.
#[test]
fn a_missing_reply_ends_with_try_again_instead_of_blocking() {
    let h = Harness::new("batch-deadline");
    let ns = h.netns("node");
    in_netns(&ns, || {
        let mut sock = NfSocket::open().unwrap();
        sock.set_reply_timeout(Duration::from_millis(300));
        let mut b = sock.msgbuf();
        encode::begin_batch(&mut b);
        encode::begin_batch(&mut b);
        encode::new_table(&mut b, TableFamily::Inet);
        b.ack_last();
        encode::end_batch(&mut b);
        match sock.transact_batch(&b, &|s| format!("message {s}")) {
            Err(BatchError::Unknown(e)) => {
                assert_eq!(e.code(), 11, "{e}");
                assert!(e.to_string().contains("no reply"), "{e}");
                assert!(e.to_string().contains("not resent"), "{e}");
            }
            other => panic!("expected an unknown outcome: {other:?}"),
        }
        assert!(nft::table_flags(&mut sock, TableFamily::Inet)
            .unwrap()
            .is_none());

        let mut b: MsgBuf = sock.msgbuf();
        b.begin(
            ((NFNL_SUBSYS_CTNETLINK as u16) << 8) | 2, // IPCTNL_MSG_CT_DELETE
            0,
            libc::AF_INET as u8,
            0,
        );
        b.end();
        let e = sock.request(&b, "flush an empty table").unwrap_err();
        assert_eq!(e.code(), 11, "{e}");
        assert!(e.to_string().contains("no reply"), "{e}");
        // The socket still works afterwards.
        nft::probe(&mut sock).expect("a GETGEN after the timeout");
    });
}
