//! Deleting conntrack entries over ctnetlink, with the kernel doing the filtering.
//!
//! A pod's address can carry flows from before the pod's policy existed: entries of the previous
//! owner of the address (IP reuse) and connections opened before natguard's DNAT was installed.
//! Those entries keep their old NAT binding for as long as they live, so they are deleted:
//!
//! * [`flush_addresses`]: every entry whose ORIGINAL source or REPLY source is one of the
//!   addresses (the pod talking out, and anyone talking to the pod, DNATed or not).
//! * [`flush_bypassed_flows`]: TCP flows from the pods to the metadata addresses that did not go
//!   through natguard's DNAT to its proxy (not DNATed, or DNATed elsewhere), for `adopt`.
//!
//! A flush of addresses can be scoped ([`Scope`], [`flush_scoped_on`]) by the conntrack label
//! bit each network sets on the connections entering on its pods' host sides, so that a network
//! whose pods share addresses with another's (overlapping pools) deletes only its own flows at
//! DEL and keeps the other's live pods' flows at ADD. No kernel filter matches labels: a scoped
//! flush takes the dump paths (2, or 3) and checks `CTA_LABELS` here.
//!
//! # Paths
//!
//! 1. **filtered** (`IPCTNL_MSG_CT_DELETE` + `CTA_FILTER`): the kernel walks its table once and
//!    deletes what matches; nothing crosses to userspace. Accepted since the 2024 "flush
//!    filtering" change (6.12 era; 6.18 here), refused before. One walk matches ONE condition:
//!    the orig-tuple and reply-tuple parts of a filter are ANDed, and the family must be concrete
//!    (`ctnetlink_parse_tuple_filter` refuses `AF_UNSPEC` once an address is named), so
//!    "original source X or reply source X" costs two walks per IPv4 address.
//! 2. **dump+delete** (`IPCTNL_MSG_CT_GET` + `NLM_F_DUMP` + `CTA_FILTER`, Linux 5.8+): the same
//!    walks, but the kernel only returns the matching entries, which are then deleted one by one
//!    by exact original tuple and `CTA_ID`.
//! 3. **full-dump**: one unfiltered dump of both families, matched in userspace. Its cost grows
//!    with the table, so it is only the last resort (or forced).
//!
//! [`Path::Auto`] tries 1, and falls back to 2 and then 3 when the kernel refuses a request
//! (`EOPNOTSUPP`/`EINVAL`). The refusal is remembered for the rest of that call. Every path
//! first reads the namespace's entry count (no walk): an empty table needs no walk at all.
//!
//! The path is the caller's choice, a parameter of every flush: this module reads no
//! environment and keeps no process-wide state. The binary maps `NATGUARD_CONNTRACK_PATH`
//! ([`PATH_ENV`], for tests) to a [`Path`] with [`Path::from_override`] where it reads the
//! invocation.
//!
//! The two kinds of walk do not cost the same. The flush walk skips empty buckets and costs
//! about 0.3-0.5 µs per entry in the whole host's table (all namespaces share it). The dump walk
//! locks every one of the 262,144 buckets (about 5 ms even for an empty table) and then copies
//! what matches to userspace. So IPv4 addresses are never served by a dump when the kernel can
//! delete them itself, and one full dump is not cheaper than two filtered deletes even for a
//! small table.
//!
//! # IPv6: the kernel's address filter is inverted
//!
//! `ctnetlink_filter_match_tuple()` compares IPv6 addresses with `!ipv6_addr_cmp(a, b)`, which is
//! true when they are EQUAL, and then skips the entry: an IPv6 address filter selects every entry
//! whose address differs (Linux 5.8 up to at least 6.18, where this was observed). A filtered
//! DELETE naming an IPv6 address would flush the whole IPv6 table except the pod's entries, so no
//! request here carries an IPv6 address in a filter unless the kernel was found to be correct
//! (below). Otherwise IPv6 is served by ONE dump of the IPv6
//! family (the family filter works) that covers every IPv6 address and both directions, matched
//! here and deleted by exact tuple; it runs on its own thread, alongside the IPv4 walks. A
//! dual-stack pod therefore costs three walks: two filtered IPv4 deletes and one IPv6 dump.
//! When no thread can be started (a pids cgroup at its limit: `EAGAIN`), a walk runs on the
//! caller's thread after the others instead: slower, never skipped.
//! Filters on protocol, ports and status are not affected and are still used for IPv6.
//!
//! Kernels whose IPv6 filter is correct (Debian's 6.12) are told apart by a probe in a
//! throwaway network namespace, cached for the boot ([`ipv6_probe`]). There the caller's
//! [`Path::Auto`] becomes [`Path::Ipv6Filtered`] ([`auto_path`]): IPv6 addresses get the same
//! two filtered deletes as IPv4 ones, and the family dump is not needed. The path label is then
//! `filtered`, without `+ipv6-dump`.
//!
//! # Kernel behaviour this relies on (checked on 6.18)
//!
//! * A DELETE with `CTA_FILTER` goes to the flush path, which uses the message's family when a
//!   filter is present (`u3 = version || cda[CTA_FILTER] ? family : UNSPEC`), so `nfgenmsg.version`
//!   0 is fine. Without `CTA_FILTER` and with version 0 the family would be ignored and the
//!   flush would hit both families.
//! * Older kernels read a DELETE that carries `CTA_TUPLE_ORIG`/`CTA_TUPLE_REPLY` as an
//!   exact delete of that tuple. A filtered DELETE here never names a destination address or
//!   port, so such a kernel cannot find a full tuple in it and answers `EINVAL` instead of
//!   deleting anything; and every filtered DELETE carries a tuple, so it can never be read as
//!   the unfiltered "flush everything" request.
//! * Kernels before 5.8 ignore `CTA_FILTER` in dumps (attributes past `CTA_MAX` are skipped) and
//!   return the whole family. Every dumped entry is therefore checked again here before it is
//!   deleted.
//! * Every ctnetlink request, DELETE and GET alike, runs under the ctnetlink subsystem mutex
//!   (`NFNL_CB_MUTEX`), and flushes also take `nf_conntrack_mutex`. Walks on several threads
//!   therefore mostly queue in the kernel; what does overlap is the rest of a dump that returns
//!   many entries (continued from `recvmsg` without the mutex), and the parsing and exact
//!   deletes here. The dump walks still run on one thread and socket each, which costs little
//!   and helps when a dump is large (the IPv6 family dump on an IPv6-heavy node).
//! * A flush of a namespace without entries returns before walking (`cnet->count == 0`); the
//!   same check is made here first, so an empty table costs no walk on any path.
//! * The filtered DELETE does not say how many entries it removed: when it ran, `deleted` is the
//!   drop of the namespace's entry count (`IPCTNL_MSG_CT_GET_STATS`) over the whole flush, which
//!   is exact unless other flows start or expire meanwhile.
//! * The reply to `IPCTNL_MSG_CT_GET_STATS` carries `NLM_F_MULTI` but is not followed by
//!   `NLMSG_DONE`; it is requested with `NLM_F_ACK` so the ACK ends the exchange.
//! * An entry can vanish between dump and delete (timeout, another flush): `ENOENT` then means
//!   done. `CTA_ID` is sent with the exact delete so that a new flow that reused the tuple is not
//!   deleted in its place.

use super::netlink::{
    backoff, is_retryable, Msg, MsgBuf, NfSocket, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP,
    TRANSIENT_RETRIES,
};
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};

/// The environment variable the binary reads to force a path (`filtered`, `fallback` or
/// `full`); see [`Path::from_override`]. The library never reads it.
pub const PATH_ENV: &str = "NATGUARD_CONNTRACK_PATH";

/// How the entries are found and deleted; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Filtered delete, falling back when the kernel refuses it.
    Auto,
    /// Filtered delete only; a refusal is an error. (IPv6 addresses still go through the IPv6
    /// family dump.)
    Filtered,
    /// Filtered dump plus delete by exact tuple (then a full dump if dumps are refused).
    Fallback,
    /// One unfiltered dump, matched here, plus delete by exact tuple.
    FullDump,
    /// [`Path::Auto`] with IPv6 addresses by filtered deletes too. Only for a kernel whose IPv6
    /// filter a probe found correct ([`auto_path`]): on an inverted one it would delete every
    /// IPv6 entry but the pod's.
    Ipv6Filtered,
}

/// What a flush did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushReport {
    /// Entries deleted. Exact on the dump paths; when filtered deletes ran, the drop of the
    /// namespace's entry count over the flush (see the module documentation).
    pub deleted: u64,
    /// Kernel walks of the conntrack table (filtered deletes and dumps).
    pub walks: u32,
    /// How the entries were found: `"filtered"`, `"dump+delete"` or `"full-dump"`, with
    /// `"+ipv6-dump"` appended, or `"ipv6-dump"` alone, when IPv6 addresses were served by the
    /// IPv6 family dump (see the module documentation).
    pub path: &'static str,
}

/// Which of the addresses' entries a flush deletes, by the conntrack label bit that each
/// labelling network sets on the connections entering on its pods' host sides
/// ([`crate::plan::NetNames::label_bit`]). A flow from before a network's rules has no bit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every entry: an ADD no other network shares the addresses with, or a network whose
    /// connections carry no label.
    All,
    /// Only the entries that carry this bit: a DEL's, the deleted attachment's network's own.
    Own(u8),
    /// Only the entries that carry no network's bit (none of bits 64 to 127): the DEL of a
    /// network that labels nothing, which cannot tell its flows from others' but never deletes
    /// a labelling network's.
    Unlabelled,
    /// Every entry except those that carry one of `keep` and not `own`: an ADD's, where
    /// other networks' live attachments hold the addresses (`keep`: their bits). An entry that
    /// carries `own` (this network's earlier flows, or an ambiguous one that carries both) and
    /// an unlabelled one (from before any rule) are deleted, as flushOnAdd promises.
    Except { own: Option<u8>, keep: Vec<u8> },
}

impl Scope {
    /// An ADD's scope: [`Scope::All`] unless another network's bit is to be kept.
    pub fn add(own: Option<u8>, keep: &[u8]) -> Scope {
        let mut keep: Vec<u8> = keep
            .iter()
            .copied()
            .filter(|b| Some(*b) != own && *b < 128)
            .collect();
        keep.sort_unstable();
        keep.dedup();
        if keep.is_empty() {
            Scope::All
        } else {
            Scope::Except { own, keep }
        }
    }

    /// Whether an entry with these labels is deleted.
    pub fn deletes(&self, labels: u128) -> bool {
        let has = |b: u8| b < 128 && labels & (1u128 << b) != 0;
        match self {
            Scope::All => true,
            Scope::Own(b) => has(*b),
            Scope::Unlabelled => labels >> 64 == 0,
            Scope::Except { own, keep } => own.is_some_and(has) || !keep.iter().any(|b| has(*b)),
        }
    }

    /// The scope as natguard's runtime records write it: `all`, `own:N`, `unlabelled`,
    /// `except:N:K,K` (`-` for no own bit).
    pub fn name(&self) -> String {
        match self {
            Scope::All => "all".into(),
            Scope::Own(b) => format!("own:{b}"),
            Scope::Unlabelled => "unlabelled".into(),
            Scope::Except { own, keep } => format!(
                "except:{}:{}",
                own.map_or("-".into(), |b| b.to_string()),
                keep.iter().map(u8::to_string).collect::<Vec<_>>().join(",")
            ),
        }
    }

    /// The scope named `s` ([`Scope::name`]).
    pub fn from_name(s: &str) -> Option<Scope> {
        let bit = |t: &str| t.parse::<u8>().ok().filter(|b| *b < 128);
        match s {
            "all" => return Some(Scope::All),
            "unlabelled" => return Some(Scope::Unlabelled),
            _ => {}
        }
        if let Some(b) = s.strip_prefix("own:") {
            return bit(b).map(Scope::Own);
        }
        let (own, keep) = s.strip_prefix("except:")?.split_once(':')?;
        let own = if own == "-" { None } else { Some(bit(own)?) };
        let keep = keep.split(',').map(bit).collect::<Option<Vec<u8>>>()?;
        match Scope::add(own, &keep) {
            Scope::Except { own: o, keep: k } if k == keep => {
                Some(Scope::Except { own: o, keep: k })
            }
            _ => None,
        }
    }
}

const PATH_FILTERED: &str = "filtered";
const PATH_DUMP: &str = "dump+delete";
const PATH_FULL: &str = "full-dump";

/// How the IPv4 part of a flush ran, for [`FlushReport::path`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ran {
    Nothing,
    Filtered,
    Dump,
    Full,
}

fn label(ran: Ran, ipv6_dump: bool, requested: Path) -> &'static str {
    match (ran, ipv6_dump) {
        (Ran::Full, _) => PATH_FULL,
        (Ran::Filtered, false) => PATH_FILTERED,
        (Ran::Dump, false) => PATH_DUMP,
        (Ran::Filtered, true) => "filtered+ipv6-dump",
        (Ran::Dump, true) => "dump+delete+ipv6-dump",
        (Ran::Nothing, true) => "ipv6-dump",
        (Ran::Nothing, false) => match requested {
            Path::Auto | Path::Filtered | Path::Ipv6Filtered => PATH_FILTERED,
            Path::Fallback => PATH_DUMP,
            Path::FullDump => PATH_FULL,
        },
    }
}

impl Path {
    /// The path a [`PATH_ENV`] value asks for: unset, empty or `auto` is [`Path::Auto`].
    /// [`Path::Ipv6Filtered`] is never asked for: only the probe may choose it.
    pub fn from_override(value: Option<&str>) -> Result<Path> {
        match value.map(str::trim) {
            None | Some("") => Ok(Path::Auto),
            Some(v) => match Path::from_name(v) {
                Some(p) if p != Path::Ipv6Filtered => Ok(p),
                _ => Err(Error::InvalidEnv(format!(
                    "{PATH_ENV}={v:?}: expected filtered, fallback or full"
                ))),
            },
        }
    }

    /// The path's name, as [`PATH_ENV`] and natguard's runtime records write it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Auto => "auto",
            Path::Filtered => "filtered",
            Path::Fallback => "fallback",
            Path::FullDump => "full",
            Path::Ipv6Filtered => "ipv6-filtered",
        }
    }

    /// The path named `s` ([`Path::name`]).
    pub fn from_name(s: &str) -> Option<Path> {
        [
            Path::Auto,
            Path::Filtered,
            Path::Fallback,
            Path::FullDump,
            Path::Ipv6Filtered,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
}

/// The path to flush `addrs` along: `path` itself, except that [`Path::Auto`] becomes
/// [`Path::Ipv6Filtered`] when `addrs` hold an IPv6 address and this boot's probe
/// ([`ipv6_probe::ipv6_filter`], cached in `cache_dir`) found the kernel's IPv6 filter correct.
/// The choice is logged at debug level.
pub fn auto_path(path: Path, addrs: &[IpAddr], cache_dir: &std::path::Path) -> Path {
    if path != Path::Auto || !addrs.iter().any(|a| a.to_canonical().is_ipv6()) {
        return path;
    }
    let (v, from) = ipv6_probe::ipv6_filter(cache_dir);
    let chosen = if v == ipv6_probe::Ipv6Filter::Correct {
        Path::Ipv6Filtered
    } else {
        Path::Auto
    };
    crate::debug!(
        "conntrack: the kernel's IPv6 address filter is {v:?} ({}); IPv6 addresses by {}",
        match from {
            ipv6_probe::Source::Cache => "probed earlier this boot",
            ipv6_probe::Source::Probe => "probed now",
        },
        if chosen == Path::Ipv6Filtered {
            "filtered deletes"
        } else {
            "one dump of the IPv6 family"
        }
    );
    chosen
}

/// Requests the kernel refused during one flush, so each is asked at most once per call.
#[derive(Debug, Default)]
struct Refused {
    filtered_dump: AtomicBool,
}

/// Deletes every entry whose original source is one of `addrs` and every entry whose reply
/// source is one of them, in both families, in the calling thread's network namespace.
pub fn flush_addresses(addrs: &[IpAddr]) -> Result<FlushReport> {
    flush_addresses_with(addrs, Path::Auto)
}

/// [`flush_addresses`] along a chosen path.
pub fn flush_addresses_with(addrs: &[IpAddr], path: Path) -> Result<FlushReport> {
    let mut sock = NfSocket::open().map_err(|e| e.context("conntrack"))?;
    flush_addresses_on(&mut sock, addrs, path)
}

/// [`flush_addresses_with`] on a netfilter socket the caller already has (the plugin reuses
/// the one of its nf_tables transaction).
pub fn flush_addresses_on(
    sock: &mut NfSocket,
    addrs: &[IpAddr],
    path: Path,
) -> Result<FlushReport> {
    flush_scoped_on(sock, addrs, path, &Scope::All)
}

/// [`flush_addresses_on`], deleting only the entries `scope` deletes. A scope other than
/// [`Scope::All`] needs the entries' labels, which no kernel filter matches: the addresses'
/// entries are found by filtered dumps (or the full dump where `path` asks for it or the
/// kernel refuses those) and the labels are checked here, so the count is exact.
pub fn flush_scoped_on(
    sock: &mut NfSocket,
    addrs: &[IpAddr],
    path: Path,
    scope: &Scope,
) -> Result<FlushReport> {
    let refused = Refused::default();
    let addrs = normalize(addrs);
    let v6_filtered = path == Path::Ipv6Filtered;
    // The filtered wants: IPv4 addresses, and IPv6 ones where the kernel's filter is correct.
    let wants4: Vec<Want> = addrs
        .iter()
        .flat_map(|a| {
            [Dir::Orig, Dir::Reply].map(|dir| match *a {
                IpAddr::V4(addr) => Some(Want::Source4 { addr, dir }),
                IpAddr::V6(addr) if v6_filtered => Some(Want::Source6 { addr, dir }),
                IpAddr::V6(_) => None,
            })
        })
        .flatten()
        .collect();
    let v6: Vec<IpAddr> = if v6_filtered {
        Vec::new()
    } else {
        addrs.iter().copied().filter(IpAddr::is_ipv6).collect()
    };
    let want6 = (!v6.is_empty()).then_some(Want::Sources6 { addrs: &v6 });
    let mut report = FlushReport {
        deleted: 0,
        walks: 0,
        path: label(Ran::Nothing, false, path),
    };
    if wants4.is_empty() && want6.is_none() {
        return Ok(report);
    }
    let before = entry_count(sock)?;
    if before == 0 {
        return Ok(report);
    }
    let all: Vec<Want> = wants4.iter().copied().chain(want6).collect();
    let path_if_scoped = match path {
        Path::FullDump => Path::FullDump,
        _ => Path::Fallback,
    };
    let path = if *scope == Scope::All {
        path
    } else {
        path_if_scoped
    };
    match path {
        Path::FullDump => {
            full_dump_delete(sock, &all, &mut report, scope)?;
            report.path = PATH_FULL;
            return Ok(report);
        }
        Path::Fallback => {
            let ran = dump_delete(sock, &all, &mut report, &refused, scope)?;
            report.path = label(ran, ran == Ran::Dump && want6.is_some(), path);
            return Ok(report);
        }
        Path::Auto | Path::Filtered | Path::Ipv6Filtered => {}
    }

    // IPv4 by filtered deletes on this thread; meanwhile the IPv6 family dump on its own thread
    // and socket, so that its transfer overlaps the IPv4 walks (or after them, on this thread,
    // when no thread can be started).
    let (r4, r6) = std::thread::scope(|s| {
        let h6 = want6
            .as_ref()
            .map(|w| (w, spawn_walk(s, w, "natguard-ct6", scope)));
        let r4 = filtered_delete_all(sock, &wants4, path != Path::Filtered);
        (r4, h6.map(|(w, h)| finish_walk(h, sock, w, scope)))
    });
    let done = r4?;
    report.walks += done as u32;
    let mut exact = 0;
    if let Some(r6) = r6 {
        exact += r6?;
        report.walks += 1;
    }
    let mut ran = if wants4.is_empty() {
        Ran::Nothing
    } else {
        Ran::Filtered
    };
    if done < wants4.len() {
        // The kernel refused the filtered delete: the rest by dump.
        let mut sub = FlushReport {
            deleted: 0,
            walks: 0,
            path: "",
        };
        ran = dump_delete(sock, &wants4[done..], &mut sub, &refused, scope)?;
        report.walks += sub.walks;
        exact += sub.deleted;
    }
    report.deleted = if done > 0 {
        // The filtered deletes do not report what they removed: count the table instead.
        before.saturating_sub(entry_count(sock)?)
    } else {
        exact
    };
    report.path = label(ran, want6.is_some(), path);
    Ok(report)
}

/// Deletes the conntrack entries of TCP flows from any of `srcs` to any of `dsts` on a port in
/// `dports` that did not go through natguard's DNAT to one of `proxies` (the network's proxy
/// addresses and port, none in `deny` mode): flows that were not DNATed (reply source address
/// and port equal the original destination), and flows DNATed anywhere else (another
/// component's DNAT, or a proxy that is no longer the network's). A flow DNATed to a proxy is
/// the pod talking to it and stays. One kernel walk per IPv4 destination and one for all IPv6
/// destinations, whatever the number of sources. An empty list matches nothing.
///
/// Such a flow cannot be left to the guard's reject: the guard judges it after the DNAT, and
/// where the bridge hands frames to netfilter (`br_netfilter`, on every Kubernetes node) the
/// kernel sends the reset straight out of the pod's port without undoing the DNAT, from the
/// address the pod never dialled, so the pod ignores it and waits out its own timeout. Deleted,
/// the flow's next packet is judged before any DNAT and reset from the address the pod dialled.
///
/// `scope` keeps the flows of other networks' pods that hold the same addresses (their label
/// bits), as an ADD's flush does ([`Scope::Except`]).
///
/// There is no filtered delete for this: the sources are a set, which a kernel filter cannot
/// express, so it is a filtered dump (destination, TCP) and the match on sources, ports, the
/// reply's source and the labels happens here.
pub fn flush_bypassed_flows(
    srcs: &[IpAddr],
    dsts: &[IpAddr],
    dports: &[u16],
    proxies: &[(IpAddr, u16)],
) -> Result<FlushReport> {
    let mut sock = NfSocket::open().map_err(|e| e.context("conntrack"))?;
    flush_bypassed_flows_on(&mut sock, srcs, dsts, dports, proxies)
}

/// [`flush_bypassed_flows`] on a netfilter socket the caller already has.
pub fn flush_bypassed_flows_on(
    sock: &mut NfSocket,
    srcs: &[IpAddr],
    dsts: &[IpAddr],
    dports: &[u16],
    proxies: &[(IpAddr, u16)],
) -> Result<FlushReport> {
    flush_bypassed_flows_with(sock, srcs, dsts, dports, proxies, Path::Auto, &Scope::All)
}

/// [`flush_bypassed_flows_on`] along a chosen path: [`Path::FullDump`] makes it one unfiltered
/// dump; any other path is a filtered dump (there is no filtered delete for this).
pub fn flush_bypassed_flows_with(
    sock: &mut NfSocket,
    srcs: &[IpAddr],
    dsts: &[IpAddr],
    dports: &[u16],
    proxies: &[(IpAddr, u16)],
    path: Path,
    scope: &Scope,
) -> Result<FlushReport> {
    let refused = Refused::default();
    let srcs = normalize(srcs);
    let dsts = normalize(dsts);
    let mut dports = dports.to_vec();
    dports.sort_unstable();
    dports.dedup();
    let mut report = FlushReport {
        deleted: 0,
        walks: 0,
        path: if path == Path::FullDump {
            PATH_FULL
        } else {
            PATH_DUMP
        },
    };
    let has_src = |v6: bool| srcs.iter().any(|s| s.is_ipv6() == v6);
    let dsts6: Vec<IpAddr> = dsts
        .iter()
        .copied()
        .filter(|d| d.is_ipv6() && has_src(true))
        .collect();
    let mut wants: Vec<Want> = dsts
        .iter()
        .filter(|d| d.is_ipv4() && has_src(false))
        .map(|d| Want::Bypassed {
            family: AF_INET,
            dsts: std::slice::from_ref(d),
            srcs: &srcs,
            dports: &dports,
            proxies,
        })
        .collect();
    if !dsts6.is_empty() {
        wants.push(Want::Bypassed {
            family: AF_INET6,
            dsts: &dsts6,
            srcs: &srcs,
            dports: &dports,
            proxies,
        });
    }
    if wants.is_empty() || dports.is_empty() {
        return Ok(report);
    }
    if entry_count(sock)? == 0 {
        return Ok(report);
    }
    let ran = if path == Path::FullDump {
        full_dump_delete(sock, &wants, &mut report, scope)?;
        Ran::Full
    } else {
        dump_delete(sock, &wants, &mut report, &refused, scope)?
    };
    report.path = if ran == Ran::Full {
        PATH_FULL
    } else {
        PATH_DUMP
    };
    Ok(report)
}

/// Ok when ctnetlink answers in this network namespace (one `IPCTNL_MSG_CT_GET_STATS`, which
/// walks nothing).
pub fn probe() -> Result<()> {
    let mut sock = NfSocket::open().map_err(|e| e.context("conntrack"))?;
    probe_on(&mut sock)
}

/// [`probe`] on a netfilter socket the caller already has.
pub fn probe_on(sock: &mut NfSocket) -> Result<()> {
    entry_count(sock).map(|_| ())
}

/// The number of entries in the calling thread's network namespace.
pub fn count_entries() -> Result<u64> {
    let mut sock = NfSocket::open().map_err(|e| e.context("conntrack"))?;
    entry_count(&mut sock)
}

/// [`count_entries`] on a netfilter socket the caller already has.
pub fn count_entries_on(sock: &mut NfSocket) -> Result<u64> {
    entry_count(sock)
}

/// IPv4-mapped IPv6 addresses become IPv4 (conntrack tracks those flows as IPv4); duplicates go.
fn normalize(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = addrs.iter().map(|a| a.to_canonical()).collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Orig,
    Reply,
}

/// The entries one kernel walk is after.
#[derive(Debug, Clone, Copy)]
enum Want<'a> {
    /// IPv4 entries whose `dir` tuple has source `addr` (the kernel matches the address).
    Source4 { addr: Ipv4Addr, dir: Dir },
    /// The same for IPv6, only on a kernel whose IPv6 filter is correct ([`Path::Ipv6Filtered`]).
    Source6 { addr: Ipv6Addr, dir: Dir },
    /// IPv6 entries whose original or reply source is one of `addrs`. The kernel only narrows
    /// to the IPv6 family: its IPv6 address match is inverted (see the module documentation).
    Sources6 { addrs: &'a [IpAddr] },
    /// TCP flows of `family` from one of `srcs` to one of `dsts` on one of `dports` whose
    /// reply does not come from one of `proxies` (not DNATed, or DNATed elsewhere). The kernel
    /// matches the destination only for a single IPv4 one.
    Bypassed {
        family: u8,
        dsts: &'a [IpAddr],
        srcs: &'a [IpAddr],
        dports: &'a [u16],
        proxies: &'a [(IpAddr, u16)],
    },
}

impl Want<'_> {
    fn family(&self) -> u8 {
        match *self {
            Want::Source4 { .. } => AF_INET,
            Want::Source6 { .. } | Want::Sources6 { .. } => AF_INET6,
            Want::Bypassed { family, .. } => family,
        }
    }

    /// Writes the kernel-side filter: tuple attributes holding the values, `CTA_FILTER` saying
    /// which of their fields count, and a status match. An IPv6 address only for
    /// [`Want::Source6`] (a kernel whose IPv6 filter is correct).
    fn write_filter(&self, b: &mut MsgBuf) {
        match *self {
            Want::Source4 { dir, .. } | Want::Source6 { dir, .. } => {
                let (tuple, flags) = match dir {
                    Dir::Orig => (CTA_TUPLE_ORIG, CTA_FILTER_ORIG_FLAGS),
                    Dir::Reply => (CTA_TUPLE_REPLY, CTA_FILTER_REPLY_FLAGS),
                };
                let t = b.nest_begin(tuple);
                let ip = b.nest_begin(CTA_TUPLE_IP);
                match *self {
                    Want::Source4 { addr, .. } => b.attr(CTA_IP_V4_SRC, &addr.octets()),
                    Want::Source6 { addr, .. } => b.attr(CTA_IP_V6_SRC, &addr.octets()),
                    _ => unreachable!(),
                }
                b.nest_end(ip);
                b.nest_end(t);
                let f = b.nest_begin(CTA_FILTER);
                // Host byte order: the kernel reads these with nla_get_u32.
                b.attr(flags, &CTA_FILTER_F_CTA_IP_SRC.to_ne_bytes());
                b.nest_end(f);
            }
            // The family in nfgenmsg is the whole filter.
            Want::Sources6 { .. } => {}
            Want::Bypassed {
                family,
                dsts,
                dports,
                ..
            } => {
                let mut flags = CTA_FILTER_F_CTA_PROTO_NUM;
                let t = b.nest_begin(CTA_TUPLE_ORIG);
                if let (AF_INET, [IpAddr::V4(dst)]) = (family, dsts) {
                    let ip = b.nest_begin(CTA_TUPLE_IP);
                    b.attr(CTA_IP_V4_DST, &dst.octets());
                    b.nest_end(ip);
                    flags |= CTA_FILTER_F_CTA_IP_DST;
                }
                let p = b.nest_begin(CTA_TUPLE_PROTO);
                b.attr_u8(CTA_PROTO_NUM, IPPROTO_TCP);
                // A filter holds one port; with several, ports are matched here.
                if let [port] = dports {
                    b.attr_u16_be(CTA_PROTO_DST_PORT, *port);
                    flags |= CTA_FILTER_F_CTA_PROTO_DST_PORT;
                }
                b.nest_end(p);
                b.nest_end(t);
                let f = b.nest_begin(CTA_FILTER);
                b.attr(CTA_FILTER_ORIG_FLAGS, &flags.to_ne_bytes());
                b.nest_end(f);
                // DNATed or not: a flow DNATed elsewhere than a proxy goes too, so no status
                // match; the reply source is checked here.
            }
        }
    }

    /// The whole condition, checked in userspace on a dumped entry.
    fn matches(&self, e: &Entry) -> bool {
        if e.family != self.family() {
            return false;
        }
        match *self {
            Want::Source4 { addr, dir } => {
                let t = if dir == Dir::Orig { &e.orig } else { &e.reply };
                t.src == IpAddr::V4(addr)
            }
            Want::Source6 { addr, dir } => {
                let t = if dir == Dir::Orig { &e.orig } else { &e.reply };
                t.src == IpAddr::V6(addr)
            }
            Want::Sources6 { addrs } => addrs.contains(&e.orig.src) || addrs.contains(&e.reply.src),
            Want::Bypassed {
                dsts,
                srcs,
                dports,
                proxies,
                ..
            } => {
                e.orig.proto == IPPROTO_TCP
                    && dsts.contains(&e.orig.dst)
                    && srcs.contains(&e.orig.src)
                    && e.orig.dport.is_some_and(|p| dports.contains(&p))
                    && !e
                        .reply
                        .sport
                        .is_some_and(|p| proxies.contains(&(e.reply.src, p)))
            }
        }
    }
}

/// Runs `op` again on "try again" errnos, a bounded number of times.
fn retry<T>(mut op: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempt = 0;
    loop {
        match op() {
            Err(e) if is_retryable(&e) && attempt < TRANSIENT_RETRIES => {
                attempt += 1;
                backoff(attempt);
            }
            r => return r,
        }
    }
}

/// The kernel does not know the request (older kernel): try the next path.
fn is_refusal(e: &Error) -> bool {
    matches!(e.errno(), Some(libc::EOPNOTSUPP | libc::EINVAL))
}

fn entry_count(sock: &mut NfSocket) -> Result<u64> {
    let msgs = sock.request_retry(
        &|b| {
            // NLM_F_ACK: see the module documentation (the stats reply has no NLMSG_DONE).
            b.begin(ct_msg(IPCTNL_MSG_CT_GET_STATS), NLM_F_ACK, 0, 0);
            b.end();
        },
        "conntrack: read entry count",
    )?;
    msgs.iter()
        .find(|m| m.msg_type == ct_msg(IPCTNL_MSG_CT_GET_STATS))
        .and_then(|m| m.nf_attrs().get(CTA_STATS_GLOBAL_ENTRIES))
        .and_then(|a| a.u32_be())
        .map(u64::from)
        .ok_or_else(|| Error::Protocol("conntrack: malformed statistics reply".into()))
}

/// Filtered deletes of IPv4 wants, one walk each, in order. Returns how many were done; stops
/// (when `may_fall_back`) at the first one the kernel refuses, leaving the rest to a fallback.
fn filtered_delete_all(sock: &mut NfSocket, wants: &[Want], may_fall_back: bool) -> Result<usize> {
    for (done, want) in wants.iter().enumerate() {
        if !matches!(want, Want::Source4 { .. } | Want::Source6 { .. }) {
            // A set of addresses or sources is no kernel filter.
            return Err(Error::Protocol(format!(
                "conntrack: no filtered delete for {want:?}"
            )));
        }
        let r = retry(|| {
            let mut b = sock.msgbuf();
            b.begin(ct_msg(IPCTNL_MSG_CT_DELETE), NLM_F_ACK, want.family(), 0);
            want.write_filter(&mut b);
            b.end();
            sock.transact(&b, &|_| format!("conntrack: filtered delete of {want:?}"))
        });
        match r {
            Ok(()) => {}
            Err(e) if may_fall_back && is_refusal(&e) => {
                return Ok(done);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(wants.len())
}

type Walk<'scope> = std::io::Result<std::thread::ScopedJoinHandle<'scope, Result<u64>>>;

/// Starts the dump walk of `want` on a new thread with its own socket. The thread shares the
/// caller's network namespace, so its socket sees the same table.
fn spawn_walk<'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    want: &'scope Want<'scope>,
    name: &str,
    scope: &'scope Scope,
) -> Walk<'scope> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn_scoped(s, move || {
            let mut sock = NfSocket::open().map_err(|e| e.context("conntrack"))?;
            dump_delete_one(&mut sock, want, scope)
        })
}

/// The result of a walk started by [`spawn_walk`]; if no thread could be started, the walk
/// runs here, on the caller's socket.
fn finish_walk(h: Walk<'_>, sock: &mut NfSocket, want: &Want, scope: &Scope) -> Result<u64> {
    match h {
        Ok(h) => h
            .join()
            .unwrap_or_else(|_| Err(Error::Protocol("conntrack: walk thread panicked".into()))),
        Err(_) => dump_delete_one(sock, want, scope),
    }
}

/// Filtered dumps plus exact deletes, one thread and socket per walk, concurrently. Falls back
/// to one full dump if the kernel refuses filtered dumps. Returns which path ran.
fn dump_delete(
    sock: &mut NfSocket,
    wants: &[Want],
    report: &mut FlushReport,
    refused: &Refused,
    scope: &Scope,
) -> Result<Ran> {
    if refused.filtered_dump.load(Ordering::Relaxed) {
        full_dump_delete(sock, wants, report, scope)?;
        return Ok(Ran::Full);
    }
    let results: Vec<Result<u64>> = match wants {
        [] => Vec::new(),
        [want] => vec![dump_delete_one(sock, want, scope)],
        _ => std::thread::scope(|s| {
            let walks: Vec<(&Want, Walk)> = wants
                .iter()
                .map(|w| (w, spawn_walk(s, w, "natguard-ct", scope)))
                .collect();
            walks
                .into_iter()
                .map(|(w, h)| finish_walk(h, sock, w, scope))
                .collect()
        }),
    };
    let mut was_refused = false;
    let mut first_err = None;
    for r in results {
        match r {
            Ok(n) => {
                report.walks += 1;
                report.deleted += n;
            }
            Err(e) if is_refusal(&e) => was_refused = true,
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if was_refused {
        refused.filtered_dump.store(true, Ordering::Relaxed);
        // Wants whose dump did run are matched again and find nothing left.
        full_dump_delete(sock, wants, report, scope)?;
        return Ok(Ran::Full);
    }
    Ok(Ran::Dump)
}

fn dump_delete_one(sock: &mut NfSocket, want: &Want, scope: &Scope) -> Result<u64> {
    let msgs = sock.request_retry(
        &|b| {
            b.begin(ct_msg(IPCTNL_MSG_CT_GET), NLM_F_DUMP, want.family(), 0);
            want.write_filter(b);
            b.end();
        },
        &format!("conntrack: dump for {want:?}"),
    )?;
    delete_matching(sock, &msgs, std::slice::from_ref(want), scope)
}

/// One unfiltered dump of both families, matched here.
fn full_dump_delete(
    sock: &mut NfSocket,
    wants: &[Want],
    report: &mut FlushReport,
    scope: &Scope,
) -> Result<()> {
    let msgs = sock.request_retry(
        &|b| {
            b.begin(ct_msg(IPCTNL_MSG_CT_GET), NLM_F_DUMP, 0, 0);
            b.end();
        },
        "conntrack: dump",
    )?;
    report.walks += 1;
    report.deleted += delete_matching(sock, &msgs, wants, scope)?;
    Ok(())
}

/// Deletes, by exact tuple, each dumped entry that one of `wants` matches and `scope` deletes.
/// Returns how many were deleted (entries already gone do not count).
fn delete_matching(
    sock: &mut NfSocket,
    msgs: &[Msg],
    wants: &[Want],
    scope: &Scope,
) -> Result<u64> {
    let mut deleted = 0;
    for m in msgs {
        if m.msg_type != ct_msg(IPCTNL_MSG_CT_NEW) {
            return Err(Error::Protocol(format!(
                "conntrack: unexpected message type {:#x} in a dump",
                m.msg_type
            )));
        }
        let e = Entry::parse(m)?;
        if wants.iter().any(|w| w.matches(&e)) && scope.deletes(e.labels) && delete_exact(sock, &e)?
        {
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Deletes one entry by its original tuple (and id and zone). False if it was already gone.
fn delete_exact(sock: &mut NfSocket, e: &Entry) -> Result<bool> {
    let r = retry(|| {
        let mut b = sock.msgbuf();
        b.begin(ct_msg(IPCTNL_MSG_CT_DELETE), NLM_F_ACK, e.family, 0);
        // The dumped tuple is sent back as it came, so any protocol and zone round-trips.
        b.attr(CTA_TUPLE_ORIG | NLA_F_NESTED, e.orig_raw);
        if let Some(id) = e.id {
            b.attr_u32_be(CTA_ID, id);
        }
        if let Some(zone) = e.zone {
            b.attr(CTA_ZONE, zone);
        }
        b.end();
        sock.transact(&b, &|_| {
            format!(
                "conntrack: delete {} {} -> {}",
                e.orig.proto, e.orig.src, e.orig.dst
            )
        })
    });
    match r {
        Ok(()) => Ok(true),
        Err(err) if err.errno() == Some(libc::ENOENT) => Ok(false),
        Err(err) => Err(err),
    }
}

pub mod ipv6_probe;
pub mod wire;
use wire::*;

#[cfg(test)]
mod tests;
