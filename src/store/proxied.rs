//! What the metadata proxy needs to know of the kernel's state: for each network, the
//! endpoints its DNAT redirects (`NET-mproxy4/6`) and its pods' records (`NET-pods`), with
//! whether each pod is intercepted (`NET-redir4/6`) and the policy an annotation
//! recorded. Read without the node lock, as `status` reads: it only reads.

use super::{set_ref, Store};
use crate::error::Result;
use crate::kernel::Kernel;
use crate::plan::{self, Family, IfName, Key, NetNames, SetKind};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// One pod record as the proxy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxiedPod {
    /// `namespace/name` as ADD recorded it.
    pub who: String,
    pub addrs: Vec<IpAddr>,
    /// Whether the network intercepts the pod's addresses (not exempt).
    pub intercepted: bool,
    /// The policy an annotation recorded (`deny`), if any.
    pub policy: Option<String>,
}

/// One network as the proxy sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxiedNetwork {
    pub network: String,
    /// The `proxy` endpoints (address, port) its DNAT redirects.
    pub endpoints: Vec<(IpAddr, u16)>,
    pub pods: Vec<ProxiedPod>,
}

impl<K: Kernel> Store<K> {
    /// nf_tables' generation, and [`Store::proxy_view`] unless the generation is `seen` (no
    /// writer committed since: the view would be the same). The generation is read first, so
    /// a commit during the read shows as a change at the next call, never as a missed one. No
    /// generation known: the view is read.
    pub fn proxy_view_since(
        &mut self,
        seen: Option<u32>,
    ) -> Result<(Option<u32>, Option<Vec<ProxiedNetwork>>)> {
        self.k.begin_read()?;
        let generation = self.k.read_generation();
        if generation.is_some() && generation == seen {
            return Ok((generation, None));
        }
        Ok((generation, Some(self.proxy_view()?)))
    }

    /// Every network's proxied endpoints and pod records.
    pub fn proxy_view(&mut self) -> Result<Vec<ProxiedNetwork>> {
        let mut out = Vec::new();
        for net in self.networks()?.unwrap_or_default() {
            let names = NetNames::new(&net);
            let mut n = ProxiedNetwork {
                network: net.clone(),
                ..Default::default()
            };
            // Intercepted is per identity: the host side the pod's attachment records, with
            // each of its addresses.
            let mut redir: HashSet<(IfName, IpAddr)> = HashSet::new();
            for f in Family::ALL {
                for e in self.k.dump(&set_ref(&names, SetKind::MProxy(f)))? {
                    if let Key::AddrPort(a, p) = e.key {
                        n.endpoints.push((a, p));
                    }
                }
                for e in self.k.dump(&set_ref(&names, SetKind::Redir(f)))? {
                    if let Key::IfAddr(i, a) = e.key {
                        redir.insert((i, a));
                    }
                }
            }
            let hosts: HashMap<Key, Option<IfName>> = self
                .k
                .dump(&set_ref(&names, SetKind::Att))?
                .into_iter()
                .map(|e| {
                    let iface = plan::parse_attach(e.comment.as_deref().unwrap_or("")).iface;
                    (e.key, iface)
                })
                .collect();
            for e in self.k.dump(&set_ref(&names, SetKind::Pods))? {
                let comment = e.comment.unwrap_or_default();
                let addrs = plan::addrs_from_comment(&comment);
                let host = hosts.get(&e.key).copied().flatten();
                n.pods.push(ProxiedPod {
                    who: plan::who_from_comment(&comment).to_string(),
                    intercepted: host
                        .is_some_and(|i| addrs.iter().any(|a| redir.contains(&(i, *a)))),
                    policy: plan::policy_from_comment(&comment).map(str::to_string),
                    addrs,
                });
            }
            out.push(n);
        }
        Ok(out)
    }
}
