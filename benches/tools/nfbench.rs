//! nfbench: the benchmark's netfilter work, done with natguard's own kernel layer
//! (`natguard::kernel`: its netlink socket, message buffer, ctnetlink numbers and nf_tables
//! lowering), so that no second netlink encoder lives in the benchmark's Python.
//!
//!   nfbench ct-create             stdin: lines `SRC DST SPORT DPORT`; creates each as an
//!                                 ESTABLISHED TCP entry (both tuples, timeout one hour), many
//!                                 per write; any failure fails the whole command
//!   nfbench ct-delete             stdin: the same lines; deletes each entry by its exact
//!                                 original tuple (a hash lookup, no walk); gone ones are fine
//!   nfbench ct-flush              deletes every entry of the namespace
//!   nfbench ct-walk SRC REPS      REPS filtered deletes of the entries whose original source is
//!                                 SRC, each timed from send to ACK on an already open socket:
//!                                 one kernel walk of the table; prints ms per line, or
//!                                 `refused` when the kernel refuses the filter (5.10, 6.1)
//!   nfbench nft-close DELAY_MS REPS
//!                                 per rep: on a fresh socket, one batch that adds and deletes
//!                                 a table, a pause of DELAY_MS, then the time close() takes (ms)
//!   nfbench nft-release add|delete N
//!                                 N commits 2 ms apart, each on a fresh socket then released on
//!                                 another thread, each adding (or deleting) one element of a
//!                                 scratch set; prints each commit's ms
//!
//! Everything happens in the caller's network namespace. The ct-* commands refuse the root
//! one (see `not_root`); the nft-* commands create and delete natguard's table, so they refuse a
//! namespace that has it: scripts/bench.sh runs them under `unshare --net`.
//!
//! Built from the crate as a cargo example (benches/tools/build.sh), static like the plugin,
//! so that scripts/kernels.sh can carry it into its VMs.

use natguard::kernel::conntrack::wire::*;
use natguard::kernel::lower::{begin_batch, del_table, end_batch, new_set, new_table};
use natguard::kernel::netlink::{MsgBuf, NfSocket, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL};
use natguard::kernel::nft::{self, Tx};
use natguard::plan::{Family, SetKind, TableFamily};
use std::io::BufRead;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

// ctnetlink's TCP state (enum ctattr_protoinfo, ctattr_protoinfo_tcp, tcp_conntrack): natguard
// itself never creates entries, so its wire module does not carry these.
const CTA_PROTOINFO: u16 = 4;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const TCP_CONNTRACK_ESTABLISHED: u8 = 3;
/// Entry creations per write: each asks for an ACK, and 400 of them fit the receive buffer.
const CREATE_CHUNK: usize = 400;
const SCRATCH_SET: &str = "ngbench";

type Res<T> = Result<T, String>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Err(e) = run(&a) {
        eprintln!("nfbench: {e}");
        std::process::exit(1);
    }
}

fn run(a: &[&str]) -> Res<()> {
    match a {
        ["ct-create"] => {
            not_root()?;
            ct_create(&read_flows()?)
        }
        ["ct-delete"] => {
            not_root()?;
            ct_delete(&read_flows()?)
        }
        ["ct-flush"] => {
            not_root()?;
            ct_flush()
        }
        ["ct-walk", src, reps] => {
            not_root()?;
            ct_walk(ip(src)?, num(reps)?)
        }
        ["nft-close", delay, reps] => nft_close(num(delay)?, num(reps)?),
        ["nft-release", how @ ("add" | "delete"), n] => nft_release(*how == "delete", num(n)?),
        _ => Err("usage: see benches/tools/nfbench.rs".into()),
    }
}

fn ip(s: &str) -> Res<IpAddr> {
    s.parse().map_err(|_| format!("bad address {s:?}"))
}

fn num<T: std::str::FromStr>(s: &str) -> Res<T> {
    s.parse().map_err(|_| format!("bad number {s:?}"))
}

fn e2s(e: natguard::error::Error) -> String {
    e.to_string()
}

/// The ct-* commands change a whole namespace's conntrack table: never the machine's. The root
/// namespace is PID 1's, or, where that is not readable (a sandbox), the one whose inode
/// `NFBENCH_ROOT_NETNS_INO` names (scripts/bench.sh passes the namespace it was started in).
fn not_root() -> Res<()> {
    let ino = |p: &str| std::fs::metadata(p).map(|m| m.ino());
    let here = ino("/proc/self/ns/net").map_err(|e| format!("/proc/self/ns/net: {e}"))?;
    let root = match std::env::var("NFBENCH_ROOT_NETNS_INO") {
        Ok(v) => num(&v)?,
        Err(_) => ino("/proc/1/ns/net").map_err(|e| {
            format!("/proc/1/ns/net: {e}; set NFBENCH_ROOT_NETNS_INO to the root namespace's inode")
        })?,
    };
    if here == root {
        return Err("refusing to change the root network namespace's conntrack table".into());
    }
    Ok(())
}

/// A TCP flow `src:sport -> dst:dport`.
struct Flow {
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
}

fn read_flows() -> Res<Vec<Flow>> {
    let mut out = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            [] => continue,
            [s, d, sp, dp] => {
                let f = Flow {
                    src: ip(s)?,
                    dst: ip(d)?,
                    sport: num(sp)?,
                    dport: num(dp)?,
                };
                if f.src.is_ipv4() != f.dst.is_ipv4() {
                    return Err(format!("mixed families: {line}"));
                }
                out.push(f);
            }
            _ => return Err(format!("want `SRC DST SPORT DPORT`, got {line:?}")),
        }
    }
    Ok(out)
}

fn family(a: IpAddr) -> u8 {
    if a.is_ipv4() {
        AF_INET
    } else {
        AF_INET6
    }
}

fn octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// CTA_TUPLE_IP with the source and, when given, the destination.
fn put_addrs(b: &mut MsgBuf, src: IpAddr, dst: Option<IpAddr>) {
    let (s, d) = if src.is_ipv4() {
        (CTA_IP_V4_SRC, CTA_IP_V4_DST)
    } else {
        (CTA_IP_V6_SRC, CTA_IP_V6_DST)
    };
    let ip = b.nest_begin(CTA_TUPLE_IP);
    b.attr(s, &octets(src));
    if let Some(dst) = dst {
        b.attr(d, &octets(dst));
    }
    b.nest_end(ip);
}

impl Flow {
    /// The entry's original tuple, or (`CTA_TUPLE_REPLY`) its reply: the same flow reversed.
    fn put(&self, b: &mut MsgBuf, ty: u16) {
        if ty == CTA_TUPLE_ORIG {
            put_tuple(
                b,
                ty,
                IPPROTO_TCP,
                self.src,
                self.dst,
                self.sport,
                self.dport,
            );
        } else {
            put_tuple(
                b,
                ty,
                IPPROTO_TCP,
                self.dst,
                self.src,
                self.dport,
                self.sport,
            );
        }
    }
}

fn ct_create(flows: &[Flow]) -> Res<()> {
    let mut sock = NfSocket::open().map_err(e2s)?;
    for chunk in flows.chunks(CREATE_CHUNK) {
        let mut b = sock.msgbuf();
        for f in chunk {
            b.begin(
                ct_msg(IPCTNL_MSG_CT_NEW),
                NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
                family(f.src),
                0,
            );
            f.put(&mut b, CTA_TUPLE_ORIG);
            f.put(&mut b, CTA_TUPLE_REPLY);
            b.attr_u32_be(CTA_TIMEOUT, 3600);
            let pi = b.nest_begin(CTA_PROTOINFO);
            let tcp = b.nest_begin(CTA_PROTOINFO_TCP);
            b.attr_u8(CTA_PROTOINFO_TCP_STATE, TCP_CONNTRACK_ESTABLISHED);
            b.nest_end(tcp);
            b.nest_end(pi);
            b.end();
        }
        sock.transact(&b, &|_| "create a conntrack entry".into())
            .map_err(|e| format!("{} entries: {e}", flows.len()))?;
    }
    Ok(())
}

fn ct_delete(flows: &[Flow]) -> Res<()> {
    let mut sock = NfSocket::open().map_err(e2s)?;
    // One message per exchange: an entry already gone (ENOENT) must not hide the others.
    for f in flows {
        let mut b = sock.msgbuf();
        b.begin(ct_msg(IPCTNL_MSG_CT_DELETE), NLM_F_ACK, family(f.src), 0);
        f.put(&mut b, CTA_TUPLE_ORIG);
        b.end();
        match sock.transact(&b, &|_| "delete a conntrack entry".into()) {
            Ok(()) => {}
            Err(e) if e.errno() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

fn ct_flush() -> Res<()> {
    let mut sock = NfSocket::open().map_err(e2s)?;
    let mut b = sock.msgbuf();
    // No tuple, no filter, family 0: every entry of the namespace, both families.
    b.begin(ct_msg(IPCTNL_MSG_CT_DELETE), NLM_F_ACK, 0, 0);
    b.end();
    sock.transact(&b, &|_| "flush the conntrack table".into())
        .map_err(e2s)
}

fn ct_walk(src: IpAddr, reps: usize) -> Res<()> {
    let mut sock = NfSocket::open().map_err(e2s)?;
    let mut out = String::new();
    for _ in 0..reps {
        let mut b = sock.msgbuf();
        b.begin(ct_msg(IPCTNL_MSG_CT_DELETE), NLM_F_ACK, family(src), 0);
        let t = b.nest_begin(CTA_TUPLE_ORIG);
        put_addrs(&mut b, src, None);
        b.nest_end(t);
        let f = b.nest_begin(CTA_FILTER);
        b.attr(
            CTA_FILTER_ORIG_FLAGS,
            &CTA_FILTER_F_CTA_IP_SRC.to_ne_bytes(),
        );
        b.attr(CTA_FILTER_REPLY_FLAGS, &0u32.to_ne_bytes());
        b.nest_end(f);
        b.end();
        let t0 = Instant::now();
        let r = sock.transact(&b, &|_| "filtered conntrack delete".into());
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        match r {
            // ENOENT: nothing matched, still a whole walk
            Ok(()) => {}
            Err(e) if e.errno() == Some(libc::ENOENT) => {}
            Err(e) if e.errno() == Some(libc::EINVAL) => {
                println!("refused");
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        }
        out.push_str(&format!("{ms:.4}\n"));
    }
    print!("{out}");
    Ok(())
}

/// nf_tables batches made by natguard's own lowering, in a namespace that must not hold
/// natguard's table (the scratch table has its name).
fn scratch_namespace() -> Res<()> {
    let mut sock = NfSocket::open().map_err(e2s)?;
    if nft::table_flags(&mut sock, TableFamily::Inet)
        .map_err(e2s)?
        .is_some()
    {
        return Err("this namespace has natguard's table: run under `unshare --net`".into());
    }
    Ok(())
}

fn commit_batch(sock: &mut NfSocket, build: impl FnOnce(&mut MsgBuf)) -> Res<f64> {
    let mut b = sock.msgbuf();
    begin_batch(&mut b);
    build(&mut b);
    b.ack_last();
    end_batch(&mut b);
    let t0 = Instant::now();
    sock.transact_batch(&b, &|_| "scratch batch".into())
        .map_err(|e| format!("{e:?}"))?;
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

fn nft_close(delay_ms: u64, reps: usize) -> Res<()> {
    scratch_namespace()?;
    let mut out = String::new();
    for _ in 0..reps {
        let mut s = NfSocket::open().map_err(e2s)?;
        commit_batch(&mut s, |b| {
            new_table(b, TableFamily::Inet, Some(0));
            del_table(b, TableFamily::Inet);
        })?;
        std::thread::sleep(Duration::from_millis(delay_ms));
        let t0 = Instant::now();
        drop(s);
        out.push_str(&format!("{:.4}\n", t0.elapsed().as_secs_f64() * 1e3));
    }
    print!("{out}");
    Ok(())
}

fn elem_key(i: u32) -> Vec<u8> {
    (0x0a00_0000 + i).to_be_bytes().to_vec()
}

fn nft_release(delete: bool, n: u32) -> Res<()> {
    scratch_namespace()?;
    let t = TableFamily::Inet;
    let mut keep = NfSocket::open().map_err(e2s)?;
    commit_batch(&mut keep, |b| {
        new_table(b, t, Some(0));
        new_set(b, t, SCRATCH_SET, SetKind::Masq(Family::V4), 1, false);
    })?;
    if delete {
        let mut tx = Tx::new(&mut keep, None);
        for i in 0..n {
            tx.add_elem(t, SCRATCH_SET, elem_key(i), "bench".into(), "element");
        }
        tx.commit(&mut keep).map_err(e2s)?;
    }
    std::thread::sleep(Duration::from_millis(50));
    let mut out = String::new();
    let mut releases = Vec::new();
    for i in 0..n {
        let mut s = NfSocket::open().map_err(e2s)?;
        let mut tx = Tx::new(&mut s, None);
        if delete {
            tx.delete_elem(t, SCRATCH_SET, elem_key(i), "element");
        } else {
            tx.add_elem(t, SCRATCH_SET, elem_key(i), "bench".into(), "element");
        }
        let t0 = Instant::now();
        tx.commit(&mut s).map_err(e2s)?;
        out.push_str(&format!("{:.4}\n", t0.elapsed().as_secs_f64() * 1e3));
        // released on another thread, as the kernel worker releases natguard's sockets
        releases.push(std::thread::spawn(move || drop(s)));
        std::thread::sleep(Duration::from_millis(2));
    }
    for r in releases {
        r.join().map_err(|_| "release thread panicked")?;
    }
    commit_batch(&mut keep, |b| {
        del_table(b, t);
    })?;
    print!("{out}");
    Ok(())
}
