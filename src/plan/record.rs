//! The record format: what natguard writes into set-element comments, and how it reads it back.
//!
//! This is the one module that both writes and parses the comments, so the format cannot drift
//! between ADD (which writes), DEL and GC (which read owners and addresses back) and `status`.
//! - A `NET-pods` element's comment: `ADDRS WHO [pol=POLICY] cid=CID if=IFNAME` (`pol=` only
//!   when the pod's annotation decided its policy), addresses first (DEL parses
//!   them; they are never cut), cut to nft's comment limit.
//! - A `NET-att` element's comment: the attachment's host side and network namespace.
//! - An address element's comment: its owners' keys, newest first, comma-separated.
//! - A `NET-ifs` element's comment: how many pods sit behind the interface.

use super::{HostSide, IfName, OwnerKey, PodRef};
use std::fmt::Write as _;
use std::net::IpAddr;

/// nft keeps comments up to 128 bytes, NUL included.
pub const MAX_COMMENT: usize = 127;

/// addresses come first and are never cut (callers refuse addresses that do not
/// [`addrs_fit`]).
pub fn pod_comment(pod: &PodRef<'_>, addrs: &[IpAddr]) -> String {
    let ips: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let mut s = if ips.is_empty() {
        "-".to_string()
    } else {
        ips.join(",")
    };
    let who = match (pod.namespace, pod.pod_name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (Some(ns), None) => format!("{ns}/-"),
        (None, Some(n)) => format!("-/{n}"),
        (None, None) => "-/-".into(),
    };
    let cid: String = pod.container_id.chars().take(12).collect();
    let _ = write!(s, " {who} cid={cid} if={}", pod.ifname);
    if s.len() > MAX_COMMENT {
        let mut cut = MAX_COMMENT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// A pod comment with a policy token (`pol=deny`, see `crate::policy::record_token`) after
/// its WHO, still within nft's comment limit; unchanged without a token.
pub fn with_policy(comment: String, token: Option<String>) -> String {
    let Some(t) = token else { return comment };
    let mut parts: Vec<&str> = comment.splitn(3, ' ').collect();
    parts.insert(parts.len().min(2), &t);
    let mut s = parts.join(" ");
    if s.len() > MAX_COMMENT {
        let mut cut = MAX_COMMENT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// The policy token of a `NET-pods` element comment (`deny` for `pol=deny`), if any.
pub fn policy_from_comment(comment: &str) -> Option<&str> {
    comment
        .split(' ')
        .skip(2)
        .find_map(|p| p.strip_prefix("pol="))
}

/// How many owners an address element records (7 keys of 16 hex digits fit in a comment).
pub const MAX_OWNERS: usize = 7;

/// The owners an address element's comment lists, newest first.
pub fn owners_from_comment(comment: &str) -> Vec<OwnerKey> {
    comment.split(',').filter_map(OwnerKey::parse_hex).collect()
}

pub fn owners_comment(owners: &[OwnerKey]) -> String {
    owners
        .iter()
        .take(MAX_OWNERS)
        .map(|o| o.hex())
        .collect::<Vec<_>>()
        .join(",")
}

/// The addresses in a `NET-pods` element comment.
pub fn addrs_from_comment(comment: &str) -> Vec<IpAddr> {
    comment
        .split(' ')
        .next()
        .unwrap_or("")
        .split(',')
        .filter_map(|a| a.parse().ok())
        .collect()
}

/// The namespace/name part of a `NET-pods` element comment.
pub fn who_from_comment(comment: &str) -> &str {
    comment.split(' ').nth(1).unwrap_or("-/-")
}

/// How many addresses always fit in a pod comment (with the longest IPv6 form).
pub const MAX_POD_ADDRS: usize = 3;

/// Bytes of a pod comment the addresses may take ("A,B,C" plus the separator), leaving room
/// for who the pod is.
const MAX_RECORD_ADDRS_LEN: usize = 120;

/// Whether a pod record holds every one of `addrs`: callers refuse a pod whose addresses do
/// not fit, because a cut address list would make DEL act on an address that is not the pod's.
pub fn addrs_fit(addrs: &[IpAddr]) -> bool {
    let len: usize = addrs.iter().map(|a| a.to_string().len() + 1).sum();
    len <= MAX_RECORD_ADDRS_LEN
}

/// An attachment's host side as `NET-att` records it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttachRecord {
    pub iface: Option<IfName>,
    pub port: Option<IfName>,
    /// The pod's MAC, when known (its bridge pins are keyed by it).
    pub mac: Option<[u8; 6]>,
    /// The port's bridge, where `iface` is another device of it ([`HostSide::bridge`]).
    pub bridge: Option<IfName>,
    /// `None` when unknown or too long to record: such an attachment is never judged gone.
    pub netns: Option<String>,
}

impl AttachRecord {
    pub fn host(&self) -> Option<HostSide> {
        self.iface.map(|iface| HostSide {
            iface,
            port: self.port,
            mac: self.mac,
            bridge: self.bridge,
        })
    }
}

/// "if=cni0 port=veth1a2b3c mac=0a:… netns=/var/run/netns/cni-…"; `-` for what is not known;
/// ` br=cni0` after the port where `if` is another device of the port's bridge. A network
/// namespace path that does not fit is left out (recorded as `-`).
pub fn attach_comment(host: Option<&HostSide>, netns: &str) -> String {
    let name = |n: Option<IfName>| n.map(|n| n.to_string()).unwrap_or_else(|| "-".into());
    let mac = host
        .and_then(|h| h.mac)
        .map(|m| format!(" mac={}", super::render_mac(&m)))
        .unwrap_or_default();
    let bridge = host
        .and_then(|h| h.bridge)
        .map(|b| format!(" br={b}"))
        .unwrap_or_default();
    let head = format!(
        "if={} port={}{bridge}{mac} netns=",
        name(host.map(|h| h.iface)),
        name(host.and_then(|h| h.port))
    );
    let fits = !netns.is_empty()
        && head.len() + netns.len() <= MAX_COMMENT
        && !netns.contains(' ')
        && netns.starts_with('/');
    format!("{head}{}", if fits { netns } else { "-" })
}

/// Parses [`attach_comment`]'s format.
pub fn parse_attach(comment: &str) -> AttachRecord {
    let mut r = AttachRecord::default();
    for part in comment.split(' ') {
        let Some((k, v)) = part.split_once('=') else {
            continue;
        };
        match (k, v) {
            (_, "-") => {}
            ("if", v) => r.iface = IfName::new(v),
            ("port", v) => r.port = IfName::new(v),
            ("br", v) => r.bridge = IfName::new(v),
            ("mac", v) => r.mac = parse_mac(v),
            ("netns", v) => r.netns = Some(v.to_string()),
            _ => {}
        }
    }
    r
}

/// The comment of a `NET-ifs` element: how many of the network's pods sit behind it.
pub fn iface_comment(pods: u32) -> String {
    format!("pods={pods}")
}

/// The pod count of a `NET-ifs` element (0 when unreadable: the element is then rewritten).
pub fn iface_pods(comment: &str) -> u32 {
    comment
        .strip_prefix("pods=")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A MAC in the form [`super::render_mac`] writes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in out.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}
