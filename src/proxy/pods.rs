//! Who is asking: the pod behind a connection's source address, from natguard's own records
//! in the kernel ([`crate::store::Store::proxy_view`]), never from the address alone.
//!
//! A thread of its own reads the records once a second and whenever a request comes from an
//! address the last read did not know (a pod that has just started), and publishes each read
//! as a [`Snapshot`]; a read finds nf_tables' generation first and reads nothing more while no
//! writer has committed since the last one. The request waits a bounded time for a read newer than itself; an
//! address natguard still has no live record of is refused (fail closed).

use crate::store::ProxiedNetwork;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the records are read without being asked.
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// How long a request from an unknown address waits for a fresh read.
pub const FRESH_WAIT: Duration = Duration::from_secs(1);

/// One read of natguard's records, indexed by address: a request's lookup costs the same on a
/// node with ten pods and with thousands.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When the records were last found to be what `index` holds.
    pub at: Instant,
    index: Arc<Index>,
}

#[derive(Debug, Default)]
struct Index {
    nets: Vec<ProxiedNetwork>,
    /// Every address's holders: (network, pod) indexes into `nets`.
    holders: HashMap<IpAddr, Vec<(usize, usize)>>,
}

/// What the proxy does for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Serve what describes the instance, conceal the rest (every proxied pod's default).
    Conceal,
    /// Refuse everything (`natguard.io/metadata: deny`).
    Deny,
}

/// The pod a request is from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    /// `namespace/name` of every attachment holding the address, the strictest first.
    pub name: String,
    pub policy: Policy,
}

impl Snapshot {
    pub fn new(at: Instant, nets: Vec<ProxiedNetwork>) -> Snapshot {
        let mut holders: HashMap<IpAddr, Vec<(usize, usize)>> = HashMap::new();
        for (i, n) in nets.iter().enumerate() {
            for (j, p) in n.pods.iter().enumerate() {
                for a in &p.addrs {
                    holders.entry(*a).or_default().push((i, j));
                }
            }
        }
        Snapshot {
            at,
            index: Arc::new(Index { nets, holders }),
        }
    }

    /// The same records, found unchanged at `at`.
    fn again(&self, at: Instant) -> Snapshot {
        Snapshot {
            at,
            index: self.index.clone(),
        }
    }

    /// The pod with source address `src` whose connection was first sent to `dst`: refused
    /// (with why) unless a live record holds `src` in a network whose DNAT redirects `dst`.
    /// Where several attachments hold `src`, the strictest policy wins.
    pub fn lookup(&self, src: IpAddr, dst: Option<SocketAddr>) -> Result<Who, String> {
        let Some(dst) = dst else {
            return Err(
                "the connection was not redirected by natguard (no original destination)".into(),
            );
        };
        let ix = &*self.index;
        let holders: Vec<_> = ix
            .holders
            .get(&src)
            .into_iter()
            .flatten()
            .map(|&(i, j)| (&ix.nets[i], &ix.nets[i].pods[j]))
            .collect();
        if holders.is_empty() {
            return Err(format!(
                "natguard has no live record of the source address {src}"
            ));
        }
        let redirected = holders
            .iter()
            .any(|(n, p)| p.intercepted && n.endpoints.contains(&(dst.ip(), dst.port())));
        if !redirected {
            return Err(format!(
                "the original destination {dst} is not a proxied metadata endpoint of the pod's network"
            ));
        }
        let deny = holders
            .iter()
            .any(|(_, p)| p.policy.as_deref() == Some("deny"));
        let mut names: Vec<&str> = holders
            .iter()
            .filter(|(_, p)| !deny || p.policy.as_deref() == Some("deny"))
            .map(|(_, p)| p.who.as_str())
            .collect();
        names.dedup();
        Ok(Who {
            name: names.join(","),
            policy: if deny { Policy::Deny } else { Policy::Conceal },
        })
    }
}

/// The reader thread's two ends.
#[derive(Clone)]
pub struct Records {
    pub latest: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    ask: mpsc::SyncSender<()>,
}

impl Records {
    /// Starts the reader thread.
    pub fn start() -> std::io::Result<Records> {
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(Snapshot::new(
            Instant::now() - REFRESH_EVERY,
            Vec::new(),
        )));
        let (ask, asked) = mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("proxy-records".into())
            .spawn(move || {
                let mut store = None;
                let mut failing = false;
                // The nf_tables generation of the last read: nothing committed since, nothing
                // to read again (the records are all in nf_tables).
                let mut seen = None;
                loop {
                    if store.is_none() {
                        store = crate::store::open().ok();
                        seen = None;
                    }
                    let read = store.as_mut().map(|s| s.proxy_view_since(seen));
                    match read {
                        Some(Ok((generation, view))) => {
                            failing = false;
                            let now = Instant::now();
                            let snap = match view {
                                Some(nets) => Snapshot::new(now, nets),
                                None => tx.borrow().again(now),
                            };
                            seen = generation;
                            if tx.send(Arc::new(snap)).is_err() {
                                return;
                            }
                        }
                        other => {
                            if !failing {
                                let why = match other {
                                    Some(Err(e)) => e.to_string(),
                                    _ => "cannot open netlink".into(),
                                };
                                crate::warn!("metadata proxy: reading natguard's records: {why}");
                                failing = true;
                            }
                            store = None;
                        }
                    }
                    match asked.recv_timeout(REFRESH_EVERY) {
                        Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(Records { latest: rx, ask })
    }

    /// Who `src` is, reading the records again (bounded by [`FRESH_WAIT`]) when the last read
    /// does not know it.
    pub async fn lookup(&self, src: IpAddr, dst: Option<SocketAddr>) -> Result<Who, String> {
        let asked_at = Instant::now();
        let first = self.latest.borrow().clone();
        match first.lookup(src, dst) {
            Ok(w) => return Ok(w),
            Err(e) if first.at >= asked_at => return Err(e),
            Err(_) => {}
        }
        let _ = self.ask.try_send(());
        let mut rx = self.latest.clone();
        let fresh = tokio::time::timeout(FRESH_WAIT, async {
            loop {
                if rx.borrow_and_update().at >= asked_at {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        let snap = rx.borrow().clone();
        match fresh {
            Ok(()) => snap.lookup(src, dst),
            Err(_) => snap
                .lookup(src, dst)
                .map_err(|e| format!("{e} (natguard's records could not be read again in time)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ProxiedPod;

    fn pod(who: &str, addr: &str, intercepted: bool, policy: Option<&str>) -> ProxiedPod {
        ProxiedPod {
            who: who.into(),
            addrs: vec![addr.parse().unwrap()],
            intercepted,
            policy: policy.map(str::to_string),
        }
    }

    #[test]
    fn only_redirected_live_pods_are_served_and_the_strictest_wins() {
        let ep: SocketAddr = "169.254.169.254:80".parse().unwrap();
        let snap = Snapshot::new(
            Instant::now(),
            vec![
                ProxiedNetwork {
                    network: "a".into(),
                    endpoints: vec![(ep.ip(), 80)],
                    pods: vec![
                        pod("default/web", "10.0.0.2", true, None),
                        pod("kube-system/dns", "10.0.0.3", false, None),
                        pod("x/shared", "10.0.0.9", true, None),
                    ],
                },
                ProxiedNetwork {
                    network: "b".into(),
                    endpoints: vec![(ep.ip(), 80)],
                    pods: vec![pod("y/strict", "10.0.0.9", false, Some("deny"))],
                },
            ],
        );
        let ip = |s: &str| s.parse().unwrap();
        assert_eq!(
            snap.lookup(ip("10.0.0.2"), Some(ep)),
            Ok(Who {
                name: "default/web".into(),
                policy: Policy::Conceal
            })
        );
        // Unknown address, not redirected, another destination, an exempt pod (never DNATed).
        assert!(snap.lookup(ip("10.0.0.7"), Some(ep)).is_err());
        assert!(snap.lookup(ip("10.0.0.2"), None).is_err());
        assert!(snap
            .lookup(ip("10.0.0.2"), Some("10.1.1.1:8181".parse().unwrap()))
            .is_err());
        assert!(snap.lookup(ip("10.0.0.3"), Some(ep)).is_err());
        // Two attachments hold the address: the deny one wins.
        assert_eq!(
            snap.lookup(ip("10.0.0.9"), Some(ep)).unwrap().policy,
            Policy::Deny
        );
    }
}
