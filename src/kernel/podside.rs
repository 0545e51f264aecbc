//! What the pod's own interface is, asked inside the pod's network namespace: its kind and its
//! MAC.
//!
//! natguard can only enforce what crosses this node's netfilter. A pod whose interface is a
//! veth does: its packets leave through the host-side peer. A macvlan, ipvlan, a host device
//! moved into the pod or an SR-IOV VF does not: its packets go straight to the wire, so a
//! pod behind one would be reported as guarded and be open. ADD asks, and refuses such a pod
//! unless the operator accepts it (`metadata.acceptUnenforced`). The MAC is what the bridge
//! guard pins an exempt pod's identity to.
//!
//! The lookup runs on a thread of its own that enters the namespace (a netlink socket belongs
//! to the namespace it was opened in) and ends with the lookup, so the calling thread never
//! changes namespace. Each reply is awaited at most [`super::link::REPLY_DEADLINE`].

use super::link::Links;
use std::os::fd::AsRawFd;

/// The pod's interface as its own namespace sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLink {
    /// `IFLA_INFO_KIND`; `None` for a device without one (a NIC, an SR-IOV VF).
    pub kind: Option<String>,
    pub mac: Option<[u8; 6]>,
}

impl PodLink {
    /// Whether the pod's traffic crosses the node's netfilter: only a veth's does for sure.
    pub fn crosses_the_node(&self) -> bool {
        self.kind.as_deref() == Some("veth")
    }
}

/// Looks `ifname` up inside the network namespace at `netns`. `None` when that cannot be told
/// (no such namespace or interface, or the namespace cannot be entered): the caller then goes
/// by what the primary plugin reported.
pub fn inspect(netns: &str, ifname: &str) -> Option<PodLink> {
    if netns.is_empty() {
        return None;
    }
    let ns = std::fs::File::open(netns).ok()?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a valid namespace fd affects only this thread, which ends here.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return None;
            }
            let mut links = Links::open().ok()?;
            let l = links.link(ifname).ok()??;
            Some(PodLink {
                kind: l.kind,
                mac: l.mac,
            })
        })
        .join()
        .ok()
        .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_veth_crosses_the_node() {
        let l = |k: Option<&str>| PodLink {
            kind: k.map(str::to_string),
            mac: None,
        };
        assert!(l(Some("veth")).crosses_the_node());
        for k in [Some("macvlan"), Some("ipvlan"), Some("dummy"), None] {
            assert!(!l(k).crosses_the_node(), "{k:?}");
        }
    }

    #[test]
    fn an_unknown_namespace_tells_nothing() {
        assert_eq!(inspect("", "eth0"), None);
        assert_eq!(inspect("/nonexistent/netns/x", "eth0"), None);
    }
}
