//! What the pod's own interface is, asked inside the pod's network namespace: its kind, its
//! MAC, its index and, for a veth, its peer's index on the node.
//!
//! natguard can only enforce what crosses this node's netfilter. A pod whose interface is a
//! veth does: its packets leave through the host-side peer. A macvlan, ipvlan, a host device
//! moved into the pod or an SR-IOV VF does not: its packets go straight to the wire, so a
//! pod behind one would be reported as guarded and be open. ADD asks, and refuses such a pod
//! unless the operator accepts it (`metadata.acceptUnenforced`). The MAC is what the bridge
//! guard pins an exempt pod's identity to. The peer's index is how the node's side is told
//! from the kernel rather than from the primary plugin's report ([`crate::node::host_side`]).
//!
//! The path a runtime hands natguard (`CNI_NETNS`) is opened without blocking
//! (`O_NONBLOCK`: a FIFO at the path would otherwise block the open until a writer came) and
//! used only if it is an nsfs file of a network namespace: what a bind mount under
//! `/run/netns` or a `/proc/PID/ns/net` link gives. Symlinks are followed, since
//! `/proc/PID/ns/net` is one.
//!
//! The lookup runs on a thread of its own that enters the namespace (a netlink socket belongs
//! to the namespace it was opened in) and ends with the lookup, so the calling thread never
//! changes namespace. Each reply is awaited at most [`super::link::REPLY_DEADLINE`].

use super::link::Links;
use rustix::fs::{FileType, Mode, OFlags};
use std::os::fd::{AsFd, OwnedFd};

/// `statfs`'s `f_type` of the kernel's namespace files (`NSFS_MAGIC`, linux/magic.h).
const NSFS_MAGIC: u64 = 0x6e73_6673;

/// The pod's interface as its own namespace sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLink {
    /// `IFLA_INFO_KIND`; `None` for a device without one (a NIC, an SR-IOV VF).
    pub kind: Option<String>,
    pub mac: Option<[u8; 6]>,
    /// Its index in the pod's namespace.
    pub index: u32,
    /// A veth's peer: its index in the namespace the peer lives in (the node's, for a pod of
    /// this node).
    pub peer: Option<u32>,
}

/// Why a path handed to natguard as a network namespace is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotANetns(pub String);

/// Opens `path` as a network namespace without blocking. `Ok(None)` when there is nothing at
/// the path (a sandbox that is gone); an error saying what the path is when it is there but not
/// a network namespace (a FIFO, a directory, a device, a regular file, another kind of
/// namespace) or cannot be opened.
pub fn open_netns(path: &str) -> Result<Option<OwnedFd>, NotANetns> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = match rustix::fs::open(path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) if e == rustix::io::Errno::NOENT => return Ok(None),
        Err(e) => {
            return Err(NotANetns(format!(
                "cannot be opened ({})",
                std::io::Error::from(e)
            )))
        }
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| NotANetns(format!("fstat: {e}")))?;
    let what = match FileType::from_raw_mode(st.st_mode) {
        FileType::Fifo => Some("a FIFO"),
        FileType::Directory => Some("a directory"),
        FileType::CharacterDevice | FileType::BlockDevice => Some("a device"),
        FileType::Socket => Some("a socket"),
        _ => None,
    };
    if let Some(what) = what {
        return Err(NotANetns(format!("is {what}, not a network namespace")));
    }
    let fs = rustix::fs::fstatfs(&fd).map_err(|e| NotANetns(format!("fstatfs: {e}")))?;
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between architectures
    if fs.f_type as u64 != NSFS_MAGIC {
        return Err(NotANetns(
            "is a file, not a network namespace (not on nsfs)".into(),
        ));
    }
    Ok(Some(fd))
}

impl PodLink {
    /// Whether the pod's traffic crosses the node's netfilter: only a veth's does for sure.
    pub fn crosses_the_node(&self) -> bool {
        self.kind.as_deref() == Some("veth")
    }
}

/// Looks `ifname` up inside the network namespace at `netns`. `Ok(None)` when that cannot be
/// told (no namespace given, nothing at the path, no such interface): the caller then cannot
/// tell the pod's host side. An error when `netns` is there but is not a network namespace
/// ([`open_netns`]).
pub fn inspect(netns: &str, ifname: &str) -> Result<Option<PodLink>, NotANetns> {
    if netns.is_empty() {
        return Ok(None);
    }
    let Some(ns) = open_netns(netns)? else {
        return Ok(None);
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            // Only this thread enters the namespace, and it ends here.
            let entered = rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            );
            if let Err(e) = entered {
                // EINVAL: a namespace file of another kind (mount, pid, ...).
                return Err(NotANetns(format!(
                    "cannot be entered as a network namespace ({})",
                    std::io::Error::from(e)
                )));
            }
            let Ok(mut links) = Links::open() else {
                return Ok(None);
            };
            Ok(links.link(ifname).ok().flatten().map(|l| PodLink {
                kind: l.kind,
                mac: l.mac,
                index: l.index,
                peer: l.peer,
            }))
        })
        .join()
        .unwrap_or(Ok(None))
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
            index: 2,
            peer: None,
        };
        assert!(l(Some("veth")).crosses_the_node());
        for k in [Some("macvlan"), Some("ipvlan"), Some("dummy"), None] {
            assert!(!l(k).crosses_the_node(), "{k:?}");
        }
    }

    #[test]
    fn an_unknown_namespace_tells_nothing() {
        assert_eq!(inspect("", "eth0"), Ok(None));
        assert_eq!(inspect("/nonexistent/netns/x", "eth0"), Ok(None));
    }

    #[test]
    fn a_path_that_is_no_network_namespace_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("natguard-podside-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let file = dir.join("file");
        std::fs::write(&file, b"x").unwrap();
        for (path, word) in [
            (&fifo, "FIFO"),
            (&dir, "directory"),
            (&file, "not a network namespace"),
        ] {
            let p = path.to_str().unwrap();
            let e = inspect(p, "eth0").unwrap_err();
            assert!(e.0.contains(word), "{p}: {e:?}");
        }
        assert!(open_netns("/proc/self/ns/net").unwrap().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
