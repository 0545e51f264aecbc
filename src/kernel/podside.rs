//! What the pod's own interface is, as the pod's network namespace sees it: its kind, its
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
//! The namespace is asked about from the node's, without entering it: the node's namespace
//! knows it by an id (assigned if it has none) and rtnetlink answers for it by that id
//! ([`Links::netnsid`], [`Links::link_in`]). That needs `CAP_NET_ADMIN` and that the file be
//! visible, which is all a DaemonSet's container with the node's `/run/netns` mounted has;
//! entering a namespace (`setns`) needs `CAP_SYS_ADMIN` too. Only where the kernel refuses the
//! id (a kernel without it) is the namespace entered instead, on a thread of its own that ends
//! with the lookup (a netlink socket belongs to the namespace it was opened in), so the
//! calling thread never changes namespace. Each reply is awaited at most
//! [`super::link::REPLY_DEADLINE`].
//!
//! Why a namespace cannot be looked into is told apart ([`Unseen`]), because what to do
//! differs: a plain file where the runtime mounted a namespace is what a mount namespace
//! without propagation from the node shows (a DaemonSet's `/run/netns` needs
//! `mountPropagation: HostToContainer`), a refusal is a missing capability.

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

/// Why a path handed to natguard as a network namespace cannot be looked into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unseen {
    /// Not visible from this process's mount namespace: a plain file where the runtime
    /// mounted the namespace (no propagation from the node), or no directory of it at all.
    Hidden,
    /// Something else than a network namespace is at the path (a FIFO, a directory, a device,
    /// another kind of namespace).
    WrongKind,
    /// The kernel refused: a capability is missing.
    Denied,
}

/// Why a path handed to natguard as a network namespace is not one (or cannot be looked into),
/// in words that name the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotANetns(pub String, pub Unseen);

/// What an empty file where a namespace should be means.
const PROPAGATION_HINT: &str = "what a namespace mounted after this process's mount namespace \
     was made looks like without propagation from the node (mountPropagation: HostToContainer)";

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
            let why = if matches!(e, rustix::io::Errno::ACCESS | rustix::io::Errno::PERM) {
                Unseen::Denied
            } else {
                Unseen::WrongKind
            };
            return Err(NotANetns(
                format!("cannot be opened ({})", std::io::Error::from(e)),
                why,
            ));
        }
    };
    let st =
        rustix::fs::fstat(&fd).map_err(|e| NotANetns(format!("fstat: {e}"), Unseen::WrongKind))?;
    let what = match FileType::from_raw_mode(st.st_mode) {
        FileType::Fifo => Some("a FIFO"),
        FileType::Directory => Some("a directory"),
        FileType::CharacterDevice | FileType::BlockDevice => Some("a device"),
        FileType::Socket => Some("a socket"),
        _ => None,
    };
    if let Some(what) = what {
        return Err(NotANetns(
            format!("is {what}, not a network namespace"),
            Unseen::WrongKind,
        ));
    }
    let fs = rustix::fs::fstatfs(&fd)
        .map_err(|e| NotANetns(format!("fstatfs: {e}"), Unseen::WrongKind))?;
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between architectures
    if fs.f_type as u64 != NSFS_MAGIC {
        // What `ip netns add` and the runtimes mount a namespace on, seen without the mount.
        if st.st_size == 0 && FileType::from_raw_mode(st.st_mode) == FileType::RegularFile {
            return Err(NotANetns(
                format!(
                    "is an empty file, not a network namespace (not on nsfs): not visible from \
                     here, {PROPAGATION_HINT}"
                ),
                Unseen::Hidden,
            ));
        }
        return Err(NotANetns(
            "is a file, not a network namespace (not on nsfs)".into(),
            Unseen::WrongKind,
        ));
    }
    Ok(Some(fd))
}

/// Why nothing is at `path`, when that is not because the namespace is gone: its directory is
/// not there either, so this process does not see the node's namespaces at all. `None` when the
/// directory is there (the runtime removed the namespace's file: it is gone) or for an empty
/// path.
pub fn absent_reason(path: &str) -> Option<NotANetns> {
    let dir = std::path::Path::new(path).parent()?;
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return None;
    }
    Some(NotANetns(
        format!(
            "is not visible from here: {} is not there in this mount namespace",
            dir.display()
        ),
        Unseen::Hidden,
    ))
}

impl From<super::link::Link> for PodLink {
    fn from(l: super::link::Link) -> Self {
        PodLink {
            kind: l.kind,
            mac: l.mac,
            index: l.index,
            peer: l.peer,
        }
    }
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
    let by_id = (|| -> crate::error::Result<Option<PodLink>> {
        let mut links = Links::open()?;
        let id = links.netnsid(ns.as_fd())?;
        Ok(links.link_in(Some(id), ifname)?.map(PodLink::from))
    })();
    match by_id {
        Ok(found) => Ok(found),
        // The kernel's answer for a namespace file of another kind (mount, pid, ...).
        Err(e) if e.errno() == Some(libc::EINVAL) => Err(NotANetns(
            "is a namespace of another kind, not a network namespace".into(),
            Unseen::WrongKind,
        )),
        Err(e) => inspect_inside(&ns, ifname, &e.to_string()),
    }
}

/// The lookup from inside the namespace, where asking by id failed (`by_id` says how).
fn inspect_inside(ns: &OwnedFd, ifname: &str, by_id: &str) -> Result<Option<PodLink>, NotANetns> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // Only this thread enters the namespace, and it ends here.
            let entered = rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            );
            match entered {
                Ok(()) => {}
                Err(e) if matches!(e, rustix::io::Errno::PERM | rustix::io::Errno::ACCESS) => {
                    return Err(NotANetns(
                        format!(
                            "cannot be looked into: asking by namespace id failed ({by_id}) \
                             and entering it was refused ({}; it needs CAP_SYS_ADMIN, asking by \
                             id CAP_NET_ADMIN)",
                            std::io::Error::from(e)
                        ),
                        Unseen::Denied,
                    ))
                }
                Err(e) => {
                    // EINVAL: a namespace file of another kind (mount, pid, ...).
                    return Err(NotANetns(
                        format!(
                            "cannot be entered as a network namespace ({})",
                            std::io::Error::from(e)
                        ),
                        Unseen::WrongKind,
                    ));
                }
            }
            let Ok(mut links) = Links::open() else {
                return Ok(None);
            };
            Ok(links.link(ifname).ok().flatten().map(PodLink::from))
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
        // An empty file is where a namespace was mounted, seen without the mount.
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").unwrap();
        let e = inspect(empty.to_str().unwrap(), "eth0").unwrap_err();
        assert_eq!(e.1, Unseen::Hidden, "{e:?}");
        assert!(e.0.contains("HostToContainer"), "{e:?}");
        assert_eq!(
            inspect(file.to_str().unwrap(), "eth0").unwrap_err().1,
            Unseen::WrongKind
        );
        // Another kind of namespace.
        let e = inspect("/proc/self/ns/mnt", "eth0").unwrap_err();
        assert_eq!(e.1, Unseen::WrongKind, "{e:?}");
        // A missing directory is invisibility, a missing file in a directory is a gone one.
        let e = absent_reason("/nonexistent-dir/netns/x").unwrap();
        assert_eq!(e.1, Unseen::Hidden);
        assert!(e.0.contains("/nonexistent-dir/netns"), "{e:?}");
        assert_eq!(absent_reason(dir.join("gone").to_str().unwrap()), None);
        assert!(open_netns("/proc/self/ns/net").unwrap().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
