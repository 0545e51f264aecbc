//! Whether this kernel's ctnetlink IPv6 address filter selects the address it names (correct,
//! Debian's 6.12) or every other address (inverted: 5.8 up to at least 6.18; see
//! `docs/kernel-bug-ctnetlink-ipv6-filter.md`).
//!
//! The answer decides whether IPv6 addresses may be flushed by filtered deletes
//! ([`super::Path::Ipv6Filtered`]), which on an inverted kernel would delete every IPv6 entry
//! except the pod's. So it is never assumed from a version number and never trusted from a
//! file alone: it comes from a probe, run in a throwaway network namespace (a thread that
//! unshares its network namespace, so no table that matters is touched): two IPv6 entries,
//! one dump filtered on the first one's source address. Exactly the first one back is
//! correct, exactly the second one is inverted, anything else is unknown (and treated as
//! inverted).
//!
//! The probe's verdict is cached in a file of the caller's directory (`/run/natguard`, which
//! does not survive a reboot) together with the boot id it was made under
//! (`/proc/sys/kernel/random/boot_id`): a cached verdict of another boot, a file that is not a
//! regular file, or one that does not parse is ignored and the probe runs again. So each boot
//! probes once, and a kernel update (a reboot) is probed anew.

use super::wire::*;
use crate::kernel::netlink::{NfSocket, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

/// The cache file's name in the caller's directory.
pub const CACHE_FILE: &str = "conntrack-ipv6-filter";

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Filter {
    /// The filter selects the named address.
    Correct,
    /// The filter selects every other address.
    Inverted,
    /// The probe could not run or gave neither answer.
    Unknown,
}

impl Ipv6Filter {
    fn word(self) -> &'static str {
        match self {
            Ipv6Filter::Correct => "correct",
            Ipv6Filter::Inverted => "inverted",
            Ipv6Filter::Unknown => "unknown",
        }
    }
}

/// Where a verdict came from, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This boot's cached probe.
    Cache,
    /// A probe run now.
    Probe,
}

/// The verdict for this boot: the cached one if it was made under the current boot id,
/// otherwise a new probe, cached (when it gave an answer) in `cache_dir`.
pub fn ipv6_filter(cache_dir: &Path) -> (Ipv6Filter, Source) {
    let boot = crate::fsutil::boot_id();
    let file = cache_dir.join(CACHE_FILE);
    if let Some(boot) = &boot {
        if let Some(v) = read_cache(&file, boot) {
            return (v, Source::Cache);
        }
    }
    let v = probe();
    if let (Some(boot), Ipv6Filter::Correct | Ipv6Filter::Inverted) = (&boot, v) {
        let _ = crate::fsutil::write_boot_record(&file, boot, v.word());
    }
    (v, Source::Probe)
}

/// `<boot id> <verdict>` from `file`, if it is a regular file of this boot.
fn read_cache(file: &Path, boot: &str) -> Option<Ipv6Filter> {
    verdict_of(&crate::fsutil::read_boot_record(file, boot)?)
}

/// The verdict a whole record `text` holds for boot `boot`.
#[cfg(test)]
fn parse_cache(text: &str, boot: &str) -> Option<Ipv6Filter> {
    verdict_of(crate::fsutil::parse_boot_record(text, boot)?)
}

/// The verdict a record's word names; `unknown` is never recorded.
fn verdict_of(word: &str) -> Option<Ipv6Filter> {
    match word {
        "correct" => Some(Ipv6Filter::Correct),
        "inverted" => Some(Ipv6Filter::Inverted),
        _ => None,
    }
}

/// The probe itself, on a thread of its own in a new network namespace.
pub fn probe() -> Ipv6Filter {
    crate::kernel::in_throwaway_netns("natguard-ct6probe", probe_here)
        .and_then(|r| r.ok())
        .unwrap_or(Ipv6Filter::Unknown)
}

const A: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x6e67, 0, 0, 0, 0, 0, 1);
const B: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x6e67, 0, 0, 0, 0, 0, 2);
const PEER: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x6e67, 0, 0, 0, 0, 0, 9);

/// In a namespace of its own: entries A→PEER and B→PEER, then a dump filtered on source A.
fn probe_here() -> crate::error::Result<Ipv6Filter> {
    let mut sock = NfSocket::open()?;
    for src in [A, B] {
        let mut b = sock.msgbuf();
        b.begin(
            ct_msg(IPCTNL_MSG_CT_NEW),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
            AF_INET6,
            0,
        );
        put_tuple(
            &mut b,
            CTA_TUPLE_ORIG,
            IPPROTO_UDP,
            src.into(),
            PEER.into(),
            40000,
            53,
        );
        put_tuple(
            &mut b,
            CTA_TUPLE_REPLY,
            IPPROTO_UDP,
            PEER.into(),
            src.into(),
            53,
            40000,
        );
        b.attr_u32_be(CTA_TIMEOUT, 60);
        b.end();
        sock.transact(&b, &|_| "conntrack: create an IPv6 probe entry".into())?;
    }
    let msgs = sock.request_retry(
        &|b| {
            b.begin(ct_msg(IPCTNL_MSG_CT_GET), NLM_F_DUMP, AF_INET6, 0);
            let t = b.nest_begin(CTA_TUPLE_ORIG);
            let ip = b.nest_begin(CTA_TUPLE_IP);
            b.attr(CTA_IP_V6_SRC, &A.octets());
            b.nest_end(ip);
            b.nest_end(t);
            let f = b.nest_begin(CTA_FILTER);
            b.attr(
                CTA_FILTER_ORIG_FLAGS,
                &CTA_FILTER_F_CTA_IP_SRC.to_ne_bytes(),
            );
            b.nest_end(f);
            b.end();
        },
        "conntrack: IPv6 filter probe",
    )?;
    let mut srcs = Vec::new();
    for m in msgs
        .iter()
        .filter(|m| m.msg_type == ct_msg(IPCTNL_MSG_CT_NEW))
    {
        srcs.push(Entry::parse(m)?.orig.src);
    }
    Ok(verdict(&srcs))
}

/// The verdict from the original sources the filtered dump returned.
fn verdict(srcs: &[IpAddr]) -> Ipv6Filter {
    match srcs {
        [s] if *s == IpAddr::V6(A) => Ipv6Filter::Correct,
        [s] if *s == IpAddr::V6(B) => Ipv6Filter::Inverted,
        _ => Ipv6Filter::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_verdict_counts_only_for_its_boot() {
        assert_eq!(parse_cache("b1 correct\n", "b1"), Some(Ipv6Filter::Correct));
        assert_eq!(
            parse_cache("b1 inverted\n", "b1"),
            Some(Ipv6Filter::Inverted)
        );
        assert_eq!(parse_cache("b0 correct\n", "b1"), None);
        assert_eq!(parse_cache("b1 unknown\n", "b1"), None);
        assert_eq!(parse_cache("b1 correct extra\n", "b1"), None);
        assert_eq!(parse_cache("", "b1"), None);
    }

    #[test]
    fn the_dump_decides() {
        assert_eq!(verdict(&[IpAddr::V6(A)]), Ipv6Filter::Correct);
        assert_eq!(verdict(&[IpAddr::V6(B)]), Ipv6Filter::Inverted);
        assert_eq!(verdict(&[]), Ipv6Filter::Unknown);
        assert_eq!(
            verdict(&[IpAddr::V6(A), IpAddr::V6(B)]),
            Ipv6Filter::Unknown
        );
    }
}
