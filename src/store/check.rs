//! What CHECK compares and what `status` reads: the store's read-only side.

use super::{owners_of, set_ref, NetworkState, PodRecord, Store};
use crate::error::{Error, Result};
use crate::kernel::{Kernel, SetRef};
use crate::plan::{
    self, ChainKind, Family, Key, NetNames, PodPlan, SetKind, SharedPlan, TableFamily,
};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// What of natguard is on the node (`status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installation {
    /// No `inet natguard` table: natguard never ran an ADD here, or was uninstalled.
    NoTable,
    /// The table without some of the node-wide guard's chains (named): someone removed them.
    Incomplete { missing: Vec<String> },
    /// The table and the node-wide guard's chains.
    Guarding,
}

pub(super) use crate::kernel::NFT_TABLE_F_DORMANT;

impl<K: Kernel> Store<K> {
    /// How many exempt pods' veths have their chain; `None` without the netdev table.
    pub fn exempt_veths(&mut self) -> Result<Option<usize>> {
        let t = TableFamily::Netdev;
        if self.k.table_flags(t)?.is_none() {
            return Ok(None);
        }
        Ok(Some(self.k.chain_names(t)?.len()))
    }

    /// Compares the netdev table's veth chains with `xveths`: each exempt pod's veth that
    /// exists has its chain, with its one rule, and no chain is left for a veth no exempt pod
    /// has. A difference is repaired by a converge ([`super::settle_veth_chains`]).
    fn check_veth_chains(&mut self) -> Result<()> {
        let t = TableFamily::Netdev;
        let set = SetRef {
            name: SetKind::XVeths.suffix(),
            kind: SetKind::XVeths,
        };
        let mut rules = self.k.rules(t)?;
        for e in self.k.dump(&set)? {
            let Key::Iface(veth) = e.key else { continue };
            let got: Option<Vec<String>> = rules
                .remove(veth.as_str())
                .map(|r| r.into_iter().map(|r| r.comment).collect());
            let what = match got {
                Some(got) if got == plan::veth_rule_comments() => continue,
                Some(got) => format!("differs (rules commented {got:?})"),
                None if !self.k.link_exists(veth.as_str()) => continue,
                None => "is missing".to_string(),
            };
            return Err(Error::CheckFailed(format!(
                "chain {} {} {veth} of an exempt pod's veth {what}: its frames are not marked as the exempt pod's own",
                t.nft(),
                plan::TABLE
            )));
        }
        if let Some(stray) = rules.keys().min() {
            return Err(Error::CheckFailed(format!(
                "chain {} {} {stray} marks a veth that no exempt pod has",
                t.nft(),
                plan::TABLE
            )));
        }
        Ok(())
    }

    /// Compares the kernel's shared objects of a network (all three tables) with the plan.
    pub fn check_shared(&mut self, shared: &SharedPlan) -> Result<()> {
        let names = &shared.names;
        for t in TableFamily::ALL {
            match self.k.table_flags(t)? {
                None => {
                    let chain = ChainKind::ALL
                        .into_iter()
                        .find(|c| c.table() == t)
                        .map(|c| format!("chain {} and ", names.chain(c)))
                        .unwrap_or_default();
                    return Err(Error::CheckFailed(format!(
                        "table {} {} is missing, and with it {chain}every set of network {} there",
                        t.nft(),
                        plan::TABLE,
                        names.network
                    )));
                }
                Some(f) if f & NFT_TABLE_F_DORMANT != 0 => {
                    return Err(Error::CheckFailed(format!(
                        "table {} {} is dormant: none of its rules apply",
                        t.nft(),
                        plan::TABLE
                    )));
                }
                Some(_) => {}
            }
            let sets: HashSet<String> = self.k.set_names(t)?.into_iter().collect();
            for s in shared.sets.iter().filter(|s| s.kind.table() == t) {
                if !sets.contains(&s.name) {
                    return Err(Error::CheckFailed(format!(
                        "set {} {} {} is missing",
                        t.nft(),
                        plan::TABLE,
                        s.name
                    )));
                }
                // The shared sets' contents are policy too: an emptied metadata or CIDR set
                // would switch interception or the masquerade exceptions off for the network.
                let Some(elems) = &s.elements else { continue };
                let set = SetRef {
                    name: s.name.clone(),
                    kind: s.kind,
                };
                let (want, same) = if s.kind.is_interval() {
                    let want =
                        plan::merge_ranges(elems.iter().filter_map(plan::Elem::range).collect());
                    (want.len(), want == self.k.dump_ranges(&set)?)
                } else if s.kind.is_union() {
                    // Every network's part is in the node-wide union: this network's must be.
                    let want: Vec<Key> = elems.iter().filter_map(plan::Elem::key).collect();
                    let got: HashSet<Key> = self.k.dump(&set)?.into_iter().map(|e| e.key).collect();
                    (want.len(), want.iter().all(|k| got.contains(k)))
                } else {
                    let mut want: Vec<Key> = elems.iter().filter_map(plan::Elem::key).collect();
                    let mut got: Vec<Key> = self.k.dump(&set)?.into_iter().map(|e| e.key).collect();
                    want.sort();
                    got.sort();
                    (want.len(), want == got)
                };
                if !same {
                    return Err(Error::CheckFailed(format!(
                        "set {} differs from the config ({want} elements expected); the next ADD on this network rewrites it",
                        s.name
                    )));
                }
            }
            let chains: HashSet<String> = self.k.chain_names(t)?.into_iter().collect();
            for (_, suffix) in plan::LEGACY_CHAIN_SUFFIXES
                .iter()
                .filter(|(lt, _)| *lt == t)
            {
                let old = format!("{}{suffix}", names.prefix_of_sets());
                if chains.contains(&old) {
                    return Err(Error::CheckFailed(format!(
                        "chain {} {} {old} of an earlier version is still there; the next ADD on this network removes it",
                        t.nft(),
                        plan::TABLE
                    )));
                }
            }
            let mut rules = self.k.rules(t)?;
            for c in shared.chains().filter(|c| c.table() == t) {
                let chain = names.chain(c);
                let want: Vec<String> = shared.rules_of(c).map(|r| shared.comment_of(r)).collect();
                if !chains.contains(&chain) {
                    return Err(Error::CheckFailed(format!(
                        "chain {} {} {chain} is missing",
                        t.nft(),
                        plan::TABLE
                    )));
                }
                let got: Vec<String> = rules
                    .remove(&chain)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| r.comment)
                    .collect();
                if got != want {
                    return Err(Error::CheckFailed(format!(
                        "chain {chain} differs from the config: expected {} rules commented {:?}, found {} ({got:?}); the next ADD on this network rewrites it",
                        want.len(),
                        shared.rule_comment(),
                        got.len()
                    )));
                }
            }
        }
        self.check_veth_chains()
    }

    /// Compares a pod's elements with its plan.
    pub fn check_pod(&mut self, names: &NetNames, pod: &PodPlan) -> Result<()> {
        let owner = pod.owner.hex();
        let pods = set_ref(names, SetKind::Pods);
        let rec = self.k.get(&pods, &Key::Owner(pod.owner))?.ok_or_else(|| {
            Error::CheckFailed(format!(
                "pod entry {owner} is missing from set {}",
                pods.name
            ))
        })?;
        let mut recorded = plan::addrs_from_comment(rec.comment.as_deref().unwrap_or(""));
        let mut want = pod.addrs.clone();
        recorded.sort();
        want.sort();
        if recorded != want {
            return Err(Error::CheckFailed(format!(
                "pod {owner} is recorded with addresses {recorded:?}, prevResult has {want:?}"
            )));
        }
        let att = set_ref(names, SetKind::Att);
        let host = self
            .k
            .get(&att, &Key::Owner(pod.owner))?
            .map(|e| plan::parse_attach(e.comment.as_deref().unwrap_or("")).host());
        match host {
            None => {
                return Err(Error::CheckFailed(format!(
                    "pod entry {owner} is missing from set {}",
                    att.name
                )))
            }
            Some(h) if h != pod.host => {
                return Err(Error::CheckFailed(format!(
                    "pod {owner} is recorded on host interface {:?}, it is attached through {:?}",
                    h.map(|h| h.iface.to_string()),
                    pod.host.map(|h| h.iface.to_string())
                )))
            }
            Some(_) => {}
        }
        for (kind, key) in &pod.present {
            let set = set_ref(names, *kind);
            let shown = plan::render_key(key);
            match self.k.get(&set, key)? {
                None => {
                    return Err(Error::CheckFailed(format!(
                        "{shown} is missing from set {}",
                        set.name
                    )))
                }
                Some(e) if !owners_of(e.comment.as_deref()).contains(&pod.owner) => {
                    return Err(Error::CheckFailed(format!(
                        "{shown} in set {} is owned by {:?}, not by this pod ({owner})",
                        set.name,
                        e.comment.unwrap_or_default()
                    )))
                }
                Some(_) => {}
            }
        }
        for (kind, key) in &pod.absent {
            let set = set_ref(names, *kind);
            if let Some(e) = self.k.get(&set, key)? {
                if owners_of(e.comment.as_deref()).contains(&pod.owner) {
                    return Err(Error::CheckFailed(format!(
                        "{} must not be in set {} on behalf of this pod ({owner})",
                        plan::render_key(key),
                        set.name
                    )));
                }
            }
        }
        // An exempt pod's veth chain: what marks its frames as its own.
        for (kind, key) in &pod.present {
            let (SetKind::XVeths, Key::Iface(veth)) = (kind, key) else {
                continue;
            };
            let t = TableFamily::Netdev;
            let rules = self.k.chain_rules(t, veth.as_str())?;
            let got: Option<Vec<&str>> = rules
                .as_ref()
                .map(|r| r.iter().map(|r| r.comment.as_str()).collect());
            match got {
                None => {
                    return Err(Error::CheckFailed(format!(
                        "chain {} {} {veth} is missing: the exempt pod's frames are not marked as its own, so the guard does not exempt them",
                        t.nft(),
                        plan::TABLE
                    )))
                }
                Some(got) if got != plan::veth_rule_comments() => {
                    return Err(Error::CheckFailed(format!(
                        "chain {} {} {veth} differs: expected rules commented {:?}, found {got:?}",
                        t.nft(),
                        plan::TABLE,
                        plan::veth_rule_comments()
                    )))
                }
                Some(_) => {}
            }
        }
        if let Some((port, mac)) = super::mac_pin_of(pod) {
            if self.k.mac_pinned(port, mac)? != Some(true) {
                return Err(Error::CheckFailed(format!(
                    "the exempt pod's MAC {} is not pinned to its bridge port {port}: another port could take it over",
                    plan::render_mac(&mac)
                )));
            }
        }
        if let Some(h) = pod.host {
            let ifs = set_ref(names, SetKind::Ifs);
            if self.k.get(&ifs, &Key::Iface(h.iface))?.is_none() {
                return Err(Error::CheckFailed(format!(
                    "interface {} is missing from set {}",
                    h.iface, ifs.name
                )));
            }
        }
        Ok(())
    }

    /// The networks natguard's table holds, by the names in their rules' comments (a network
    /// whose chains have no rule is listed by its object prefix); `None` when there is no table.
    pub fn networks(&mut self) -> Result<Option<Vec<String>>> {
        if self.k.table_flags(TableFamily::Inet)?.is_none() {
            return Ok(None);
        }
        let rules = self.k.rules(TableFamily::Inet)?;
        let mut nets: Vec<String> = Vec::new();
        for chain in self.k.chain_names(TableFamily::Inet)? {
            let Some(prefix) = NetNames::network_of_chain(&chain) else {
                continue;
            };
            let named = ChainKind::ALL
                .iter()
                .filter(|c| c.table() == TableFamily::Inet)
                .flat_map(|c| rules.get(&format!("{prefix}-{}", c.suffix())))
                .flatten()
                .find_map(|r| plan::network_of_rule_comment(&r.comment));
            nets.push(named.unwrap_or(prefix).to_string());
        }
        nets.sort();
        nets.dedup();
        Ok(Some(nets))
    }

    /// Whether natguard is on this node at all: no table, a table without the node-wide
    /// guard's chains (`guard_fwd`, `guard_in`, `guard_out`, `judge4`, `judge6`), or both, which
    /// is what every ADD leaves and what guards pods.
    pub fn installation(&mut self) -> Result<Installation> {
        if self.k.table_flags(TableFamily::Inet)?.is_none() {
            return Ok(Installation::NoTable);
        }
        let chains: HashSet<String> = self.k.chain_names(TableFamily::Inet)?.into_iter().collect();
        let missing: Vec<String> = ChainKind::ALL
            .into_iter()
            .filter(|c| c.is_node() && c.table() == TableFamily::Inet)
            .map(|c| c.suffix().to_string())
            .filter(|name| !chains.contains(name))
            .collect();
        Ok(if missing.is_empty() {
            Installation::Guarding
        } else {
            Installation::Incomplete { missing }
        })
    }

    /// The node-wide guard's rule counters, summed by what they measure.
    pub fn node_counts(&mut self) -> Result<std::collections::BTreeMap<plan::Count, u64>> {
        let mut out = std::collections::BTreeMap::new();
        for t in TableFamily::ALL {
            if self.k.table_flags(t)?.is_none() {
                continue;
            }
            let rules = self.k.rules(t)?;
            for c in ChainKind::ALL
                .into_iter()
                .filter(|c| c.is_node() && c.table() == t)
            {
                for r in rules.get(c.suffix()).into_iter().flatten() {
                    if let (Some(what), Some(n)) =
                        (plan::count_of_rule_comment(&r.comment), r.packets)
                    {
                        *out.entry(what).or_insert(0) += n;
                    }
                }
            }
        }
        Ok(out)
    }

    /// What one network holds, for `status`. The node-wide guard's counters are counted
    /// per network from the per-pod counters of the network's own pods (by the interface and
    /// source the attempts came in with); its rule counters are the node's, over every source.
    pub fn network_state(&mut self, network: &str) -> Result<NetworkState> {
        let names = NetNames::new(network);
        let mut chains = Vec::new();
        let mut counts = std::collections::BTreeMap::new();
        let mut node_counts = std::collections::BTreeMap::new();
        for t in TableFamily::ALL {
            let mut rules = self.k.rules(t)?;
            for c in ChainKind::ALL.into_iter().filter(|c| c.table() == t) {
                let name = names.chain(c);
                let rules = rules.remove(&name).unwrap_or_default();
                for r in &rules {
                    if let (Some(what), Some(n)) =
                        (plan::count_of_rule_comment(&r.comment), r.packets)
                    {
                        let into = if c.is_node() {
                            &mut node_counts
                        } else {
                            &mut counts
                        };
                        *into.entry(what).or_insert(0) += n;
                    }
                }
                if !c.is_node() {
                    chains.push((c, name, rules));
                }
            }
        }
        // Per pod: the counters of the pod's addresses in the counted sets.
        let mut per_pod_counters = true;
        let mut proxied: HashMap<(plan::IfName, IpAddr), u64> = HashMap::new();
        let mut resets: HashMap<(plan::IfName, IpAddr), u64> = HashMap::new();
        let mut logged: HashSet<(plan::IfName, IpAddr)> = HashSet::new();
        for f in Family::ALL {
            for e in self.k.dump(&set_ref(&names, SetKind::RedirCount(f)))? {
                match (e.key, e.packets) {
                    (Key::IfAddr(i, a), Some(n)) => {
                        proxied.insert((i, a), n);
                    }
                    (Key::IfAddr(..), None) => per_pod_counters = false,
                    _ => {}
                }
            }
            for e in self.k.dump(&set_ref(&names, SetKind::Resets(f)))? {
                match (e.key, e.packets) {
                    (Key::IfAddr(i, a), Some(n)) => {
                        resets.insert((i, a), n);
                    }
                    (Key::IfAddr(..), None) => per_pod_counters = false,
                    _ => {}
                }
            }
            for e in self.k.dump(&set_ref(&names, SetKind::DenyLog(f)))? {
                if let Key::IfAddr(i, a) = e.key {
                    logged.insert((i, a));
                }
            }
        }
        // The endpoints the guard judges for this network (`proxy` and `deny`).
        let mut guarded_addrs = Vec::new();
        let mut guarded_ports = Vec::new();
        for f in Family::ALL {
            for e in self.k.dump(&set_ref(&names, SetKind::MGuard(f)))? {
                if let Key::AddrPort(a, p) = e.key {
                    if !guarded_addrs.contains(&a) {
                        guarded_addrs.push(a);
                    }
                    if !guarded_ports.contains(&p) {
                        guarded_ports.push(p);
                    }
                }
            }
        }
        let ifaces = self
            .k
            .dump(&set_ref(&names, SetKind::Ifs))?
            .into_iter()
            .filter_map(|e| match e.key {
                Key::Iface(i) => Some((i, plan::iface_pods(e.comment.as_deref().unwrap_or("")))),
                _ => None,
            })
            .collect();
        let mut allowed: HashSet<(plan::IfName, IpAddr)> = HashSet::new();
        let mut intercepted: HashSet<(plan::IfName, IpAddr)> = HashSet::new();
        for f in Family::ALL {
            for e in self.k.dump(&set_ref(&names, SetKind::Exempt(f)))? {
                if let Key::IfAddr(i, a) = e.key {
                    allowed.insert((i, a));
                }
            }
            for e in self.k.dump(&set_ref(&names, SetKind::Redir(f)))? {
                if let Key::IfAddr(i, a) = e.key {
                    intercepted.insert((i, a));
                }
            }
        }
        let atts: std::collections::HashMap<Key, String> = self
            .k
            .dump(&set_ref(&names, SetKind::Att))?
            .into_iter()
            .map(|e| (e.key, e.comment.unwrap_or_default()))
            .collect();
        let mut pods = Vec::new();
        let mut log_denied = false;
        for e in self.k.dump(&set_ref(&names, SetKind::Pods))? {
            let Key::Owner(owner) = e.key else { continue };
            let comment = e.comment.unwrap_or_default();
            let attach = plan::parse_attach(atts.get(&e.key).map(String::as_str).unwrap_or(""));
            let addrs = plan::addrs_from_comment(&comment);
            let exempt = !addrs.is_empty()
                && attach.iface.is_some_and(|i| {
                    addrs
                        .iter()
                        .all(|a| allowed.contains(&(i, *a)) && !intercepted.contains(&(i, *a)))
                });
            let of = |a: &IpAddr| attach.iface.map(|i| (i, *a));
            let reset_of = |a: &IpAddr| of(a).and_then(|id| resets.get(&id).copied());
            for a in &addrs {
                *counts.entry(plan::Count::Reset(Family::of(a))).or_insert(0) +=
                    reset_of(a).unwrap_or(0);
            }
            log_denied |= addrs
                .iter()
                .any(|a| of(a).is_some_and(|id| logged.contains(&id)));
            pods.push(PodRecord {
                owner,
                comment,
                exempt,
                proxied: per_pod_counters
                    .then(|| addrs.iter().filter_map(|a| proxied.get(&of(a)?)).sum()),
                reset: per_pod_counters.then(|| addrs.iter().filter_map(reset_of).sum()),
                attach,
            });
        }
        if log_denied {
            for f in Family::ALL {
                if let Some(n) = node_counts.get(&plan::Count::Logged(f)) {
                    counts.insert(plan::Count::Logged(f), *n);
                }
            }
        }
        // The DNAT chain also marks the network's connections (a conntrack label, see
        // `plan_shared`): only a rule that counts redirects is a DNAT.
        let has_dnat = chains.iter().any(|(c, _, rules)| {
            *c == ChainKind::Dnat
                && rules.iter().any(|r| {
                    matches!(
                        plan::count_of_rule_comment(&r.comment),
                        Some(plan::Count::Proxied(_))
                    )
                })
        });
        let mode = if has_dnat {
            "proxy"
        } else if !guarded_addrs.is_empty() {
            "deny"
        } else if chains.iter().any(|(_, _, r)| !r.is_empty()) || !pods.is_empty() {
            "off"
        } else {
            "unknown"
        };
        Ok(NetworkState {
            network: network.to_string(),
            mode,
            log_denied,
            chains,
            counts,
            per_pod_counters,
            guarded_addrs,
            guarded_ports,
            ifaces,
            pods,
        })
    }
}
