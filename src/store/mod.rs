//! natguard's state in the kernel, read and written as owner records.
//!
//! The verbs and tools change kernel state only through a [`Store`]. It holds the node-wide
//! lock (`/run/natguard/lock`) from the read of what it will change to the commit, so
//! concurrent invocations cannot interleave into a lost owner, and it turns each verb into one
//! [`Batch`]. It reaches the kernel only through the [`Kernel`] trait, so every rule here (owner
//! lists, pruning, what CHECK compares, what GC removes) is unit-tested against a recording fake.
//!
//! The records ([`crate::plan::record`]): every per-pod element lists its owners, newest
//! first; an element is deleted only when its last owner leaves, so "ADD A (ip X), ADD B
//! (ip X), DEL A" keeps B's policy in either order. No live owner is ever dropped to make room:
//! an ADD that would need an eighth owner fails (code 11) after the owners whose network
//! namespace is provably gone have been pruned. Each attachment has one element in `NET-pods`
//! (its addresses) and one in `NET-att` (its host-side interface and network namespace), both
//! keyed by its [`OwnerKey`]: DEL finds everything from the key alone. Interface elements
//! count the pods behind them and go with the last one, so the table holds what is alive, not
//! what has been.
//!
//! Each verb reads what it touches into a [`view::View`], changes it there, and commits the
//! difference as one batch; nothing is written where nothing changes. An element read as absent
//! is added ([`Op::Add`]), one read as present is replaced ([`Op::Put`]): a replace is a delete
//! and an add, and a deletion leaves the kernel work that any netfilter socket's release then
//! waits for, holding the commit mutex (docs/kernel-bug-nftables-release-stall.md). The read
//! is trusted because it happens under the node lock and the batch carries the generation it
//! was read at: if anyone committed in between, the kernel refuses the batch and the verb reads
//! again.

mod check;
mod proxied;
pub use check::Installation;
pub(crate) use proxied::ProxiedNetwork;
#[cfg(test)]
pub(crate) use proxied::ProxiedPod;
/// The file next to the node lock that records which networks were last found intact.
mod verified;
mod view;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::kernel::conntrack::{FlushReport, Path, Scope};
use crate::kernel::{Batch, Kernel, Op, SetRef};
use crate::lock::Lock;
use crate::plan::{
    self, IfName, Key, NetNames, OwnerKey, PodPlan, SetKind, SharedPlan, TableFamily,
};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// How a store serialises its read-modify-writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Locking {
    /// The node-wide flock: every real invocation.
    Node,
    /// None: a unit test's private fake kernel.
    #[cfg(test)]
    Unlocked,
}

fn set_ref(names: &NetNames, kind: SetKind) -> SetRef {
    SetRef {
        name: names.set(kind),
        kind,
    }
}

/// Every (set, key) an attachment with these addresses and this host side can own.
fn owners_of(comment: Option<&str>) -> Vec<OwnerKey> {
    plan::owners_from_comment(comment.unwrap_or(""))
}

/// Whether an ADD had to rewrite the shared objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Converged {
    Yes,
    No,
}

/// One pod as the store records it, for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodRecord {
    pub owner: OwnerKey,
    pub comment: String,
    pub attach: plan::AttachRecord,
    /// Every address is exempt: allowed on the pod's own interface, intercepted by nobody.
    pub exempt: bool,
    /// Connections of its addresses DNATed to the proxy; `None` without per-pod counters.
    pub proxied: Option<u64>,
    /// Metadata attempts of its addresses reset; `None` without per-pod counters.
    pub reset: Option<u64>,
}

/// What `status` shows of one network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NetworkState {
    pub network: String,
    /// `proxy` (DNAT rules), `deny` (metadata addresses but no DNAT), `off`, or `unknown`.
    pub mode: &'static str,
    /// Whether the network's pods' denied attempts are logged.
    pub log_denied: bool,
    /// (chain, name, its rules)
    pub chains: Vec<(plan::ChainKind, String, Vec<crate::kernel::RuleRead>)>,
    /// The network's counters, summed by what they measure: its own rules' for what it
    /// intercepts and masquerades, its pods' per-pod counters for resets.
    pub counts: std::collections::BTreeMap<plan::Count, u64>,
    /// Whether the counted sets' elements carry counters on this kernel.
    pub per_pod_counters: bool,
    pub guarded_addrs: Vec<IpAddr>,
    pub guarded_ports: Vec<u16>,
    /// Interfaces of the network's pods, with how many pods sit behind each.
    pub ifaces: Vec<(IfName, u32)>,
    pub pods: Vec<PodRecord>,
}

/// natguard's state in one network namespace's kernel.
pub(crate) struct Store<K: Kernel> {
    k: K,
    locking: Locking,
    /// Whether a recorded network namespace path still exists (a unit test stubs it).
    netns_exists: fn(&str) -> bool,
    /// Which networks were last found intact, at which generation ([`verified`]).
    verified: verified::Cache,
}

fn path_exists(p: &str) -> bool {
    std::path::Path::new(p).exists()
}

impl<K: Kernel> Store<K> {
    pub fn new(k: K, locking: Locking) -> Self {
        Store {
            k,
            locking,
            netns_exists: path_exists,
            verified: verified::Cache::default(),
        }
    }

    /// Records verified generations in `dir` (the node lock's directory).
    pub fn with_verified_in(mut self, dir: &std::path::Path) -> Self {
        self.verified = verified::Cache::at(dir);
        self
    }

    #[cfg(test)]
    pub fn kernel(&mut self) -> &mut K {
        &mut self.k
    }

    #[cfg(test)]
    pub fn with_netns_check(mut self, f: fn(&str) -> bool) -> Self {
        self.netns_exists = f;
        self
    }

    /// Whether natguard's DEL has run for `owner` ([`crate::deleted`]); asked under the node lock.
    /// Only the node's real store keeps such records.
    fn deleted(&self, owner: OwnerKey) -> bool {
        matches!(self.locking, Locking::Node) && crate::deleted::is_deleted(owner)
    }

    /// The node-wide lock, waited for at most [`crate::lock::WAIT`] (then code 11).
    fn lock(&self) -> Result<Option<Lock>> {
        match self.locking {
            Locking::Node => crate::lock::acquire().map(Some),
            #[cfg(test)]
            Locking::Unlocked => Ok(None),
        }
    }

    /// DEL's lock: when the lock file cannot be used at all, DEL goes on without it (logged),
    /// because a failed chained DEL would leak the primary plugin's IP and veth.
    fn lock_for_del(&self) -> Result<Option<Lock>> {
        match self.locking {
            Locking::Node => crate::lock::acquire_for_del(),
            #[cfg(test)]
            Locking::Unlocked => Ok(None),
        }
    }

    /// Converges the network's shared objects and installs `pod`, releasing what an earlier
    /// ADD of the same attachment owned and no longer should: one locked read-modify-write.
    ///
    /// The shared objects are rewritten only when the kernel's differ from the plan (first ADD
    /// of a network, a config change, someone else's flush), so the common ADD is a handful of
    /// element operations and leaves the network's rules alone. Returns whether they were:
    /// then other pods' entries may have gone with them, and the caller restores them.
    pub fn apply_pod(&mut self, shared: &SharedPlan, pod: &PodPlan) -> Result<Converged> {
        let _lock = self.lock()?;
        if self.deleted(pod.owner) {
            return Ok(Converged::No);
        }
        // Before the exemption exists: an ADD that cannot pin the MAC fails with nothing
        // applied.
        if let Some((port, mac)) = mac_pin_of(pod) {
            self.k.pin_mac(port, mac, true)?;
        }
        // Someone else's commit after the read (a flush, a deleted table) makes the kernel
        // refuse the batch; it is then read and built again (`view`).
        // The comparison is skipped when nothing has committed since a verb found this
        // network's objects intact (`verified`).
        self.read_modify_write("ADD", |s| {
            let read = s.k.read_generation();
            let entry = verified_entry(shared);
            // Read once: only a verb holding the lock writes it.
            let prior = read.and_then(|_| s.verified.read());
            if read.is_some_and(|g| s.verified.holds_in(prior.as_ref(), g, &entry))
                || s.check_shared(shared).is_ok()
            {
                let changed = s.apply_pod_locked(shared, pod, false)?;
                if let Some(g) = read {
                    s.verified
                        .after_from(prior, g, changed > 0, Some(entry), true);
                }
                return Ok(Converged::No);
            }
            s.refuse_foreign_objects(shared)?;
            let full = s.with_other_networks(shared)?;
            s.apply_pod_locked(&full, pod, true)?;
            if let Some(g) = read {
                s.verified.after(g, true, Some(entry), false);
            }
            Ok(Converged::Yes)
        })
    }

    /// `shared` with the node-wide union sets filled from every network: this one's plan,
    /// and the records (metadata addresses and ports, proxy targets) of each other network
    /// the table holds. Derived at each converge, so nothing is kept that no network declares.
    fn with_other_networks(&mut self, shared: &SharedPlan) -> Result<SharedPlan> {
        let mut full = shared.clone();
        let own = shared.names.prefix_of_sets();
        let prefixes: Vec<String> = match self.k.table_flags(TableFamily::Inet)? {
            None => Vec::new(),
            Some(_) => self
                .k
                .chain_names(TableFamily::Inet)?
                .iter()
                .filter_map(|c| NetNames::network_of_chain(c).map(|p| format!("{p}-")))
                .filter(|p| *p != own)
                .collect(),
        };
        let existing: HashSet<String> = if prefixes.is_empty() {
            HashSet::new()
        } else {
            self.k.set_names(TableFamily::Inet)?.into_iter().collect()
        };
        for spec in full.sets.iter_mut().filter(|s| s.kind.is_union()) {
            let elems = spec.elements.get_or_insert_with(Vec::new);
            for prefix in &prefixes {
                for src in spec.kind.union_source().iter() {
                    let name = format!("{prefix}{}", src.suffix());
                    if !existing.contains(&name) {
                        continue;
                    }
                    for e in self.k.dump(&SetRef { name, kind: *src })? {
                        let elem = match e.key {
                            Key::Addr(a) => plan::Elem::Addr(a),
                            Key::Port(p) => plan::Elem::Port(p),
                            Key::AddrPort(a, p) => plan::Elem::AddrPort(a, p),
                            Key::Iface(i) => plan::Elem::Iface(i),
                            _ => continue,
                        };
                        if !elems.contains(&elem) {
                            elems.push(elem);
                        }
                    }
                }
            }
            elems.sort();
        }
        Ok(full)
    }

    /// Two networks whose names map to the same object names would overwrite each other's
    /// policy: refuse to converge over chains whose rules carry another network's name.
    /// Likewise two networks whose names give the same conntrack label bit: their masquerade
    /// rules could not tell their pods apart by the label, so the second is refused too.
    fn refuse_foreign_objects(&mut self, shared: &SharedPlan) -> Result<()> {
        let names = &shared.names;
        let bit = names.label_bit();
        for t in TableFamily::ALL {
            let rules = self.k.rules(t)?;
            for c in plan::ChainKind::ALL
                .into_iter()
                .filter(|c| c.table() == t && !c.is_node())
            {
                let chain = names.chain(c);
                for rule in rules.get(&chain).into_iter().flatten() {
                    if let Some(other) = plan::network_of_rule_comment(&rule.comment) {
                        if other != names.network {
                            return Err(Error::InvalidConfig(format!(
                                "name: networks {:?} and {:?} map to the same nftables object names ({chain}, ...); rename one of them",
                                names.network, other
                            )));
                        }
                    }
                }
            }
            // Only networks that masquerade use their label (their snat chain has rules).
            let labels = shared
                .rules
                .iter()
                .any(|r| matches!(r.action, plan::Action::SetCtLabel(_)));
            if !labels {
                continue;
            }
            for (chain, chain_rules) in &rules {
                if !chain.ends_with("-snat") {
                    continue;
                }
                for rule in chain_rules {
                    let Some(other) = plan::network_of_rule_comment(&rule.comment) else {
                        continue;
                    };
                    if other != names.network
                        && other != plan::NODE
                        && NetNames::new(other).label_bit() == bit
                    {
                        return Err(Error::InvalidConfig(format!(
                            "name: networks {:?} and {:?} map to the same conntrack label bit ({bit}) that tells their pods apart for masquerading; rename one of them",
                            names.network, other
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Returns the number of operations committed.
    fn apply_pod_locked(
        &mut self,
        shared: &SharedPlan,
        pod: &PodPlan,
        converge: bool,
    ) -> Result<usize> {
        let mut batch = Batch::default();
        let mut emptied = Vec::new();
        let found = if converge {
            let found = Found::read(&mut self.k)?;
            emptied = push_converge(&mut batch, shared, &found);
            Some(found)
        } else {
            None
        };
        let netns_exists = self.netns_exists;
        let mut v = view::View::new(&mut self.k).emptied(emptied);
        stage_pod(&mut v, &shared.names, pod, netns_exists)?;
        emit_settled(v, &mut batch, found.as_ref())?;
        self.k.commit(&batch)?;
        Ok(batch.len())
    }

    /// Installs many attachments at once (the watcher's repair after someone else's flush,
    /// adopt, install): converges every network of `shared` and of the pods whose shared
    /// objects differ from its plan and installs every pod, under one lock, in ONE batch.
    /// Networks in `shared` are put in place whether or not a pod of theirs is given: every
    /// network whose conflist lists natguard (so the node-wide guard exists from `natguard
    /// install` on, before the first ADD), or the guard alone ([`plan::plan_node_guard`])
    /// where no network lists natguard yet. Returns the number of operations committed: 0
    /// when everything was in place, in which case nothing is written.
    pub fn apply(
        &mut self,
        shared: &[&SharedPlan],
        pods: &[(&SharedPlan, &PodPlan)],
    ) -> Result<usize> {
        let _lock = self.lock()?;
        // Restored pods whose DEL natguard has run meanwhile stay deleted.
        let pods: Vec<(&SharedPlan, &PodPlan)> = pods
            .iter()
            .copied()
            .filter(|(_, p)| !self.deleted(p.owner))
            .collect();
        let pods = pods.as_slice();
        // A repair must not stop at one pod: an exempt pod whose MAC cannot be pinned (its
        // port going away) is logged, and CHECK names it while it lives.
        for (_, p) in pods {
            if let Some((port, mac)) = mac_pin_of(p) {
                if let Err(e) = self.k.pin_mac(port, mac, true) {
                    crate::warn!(
                        "exempt pod {}: pinning its MAC to bridge port {port}: {e}",
                        p.owner.hex()
                    );
                }
            }
        }
        let mut networks: Vec<&SharedPlan> = Vec::new();
        for s in shared.iter().copied().chain(pods.iter().map(|(s, _)| *s)) {
            if !networks.iter().any(|n| n.names.network == s.names.network) {
                networks.push(s);
            }
        }
        // Another writer's commit between the read and this batch is refused by the kernel;
        // everything is then read and built again (`view`).
        self.read_modify_write("repair", |st| {
            let mut stale: Vec<&SharedPlan> = Vec::new();
            for s in &networks {
                if st.check_shared(s).is_err() {
                    st.refuse_foreign_objects(s)?;
                    stale.push(s);
                }
            }
            st.apply_pods_locked(&stale, pods)
        })
    }

    fn apply_pods_locked(
        &mut self,
        converge: &[&SharedPlan],
        pods: &[(&SharedPlan, &PodPlan)],
    ) -> Result<usize> {
        let mut batch = Batch::default();
        // Every network converged in this batch fills the node-wide union sets: each with the
        // union over all of them and the networks the table still records.
        let mut full = Vec::with_capacity(converge.len());
        for s in converge {
            full.push(self.with_other_networks(s)?);
        }
        let mut union: HashMap<SetKind, Vec<plan::Elem>> = HashMap::new();
        for p in &full {
            for spec in p.sets.iter().filter(|s| s.kind.is_union()) {
                let into = union.entry(spec.kind).or_default();
                for e in spec.elements.iter().flatten() {
                    if !into.contains(e) {
                        into.push(e.clone());
                    }
                }
            }
        }
        for p in &mut full {
            for spec in p.sets.iter_mut().filter(|s| s.kind.is_union()) {
                let mut elems = union.get(&spec.kind).cloned().unwrap_or_default();
                elems.sort();
                spec.elements = Some(elems);
            }
        }
        let found = if full.is_empty() {
            None
        } else {
            Some(Found::read(&mut self.k)?)
        };
        let mut emptied = Vec::new();
        if let Some(found) = &found {
            for s in &full {
                emptied.extend(push_converge(&mut batch, s, found));
            }
        }
        let netns_exists = self.netns_exists;
        let mut v = view::View::new(&mut self.k).emptied(emptied);
        for (s, p) in pods {
            stage_pod(&mut v, &s.names, p, netns_exists)?;
        }
        emit_settled(v, &mut batch, found.as_ref())?;
        let n = batch.len();
        self.k.commit(&batch)?;
        Ok(n)
    }

    /// Removes everything `owner` owns in a network; returns the number of elements changed
    /// and extends `addrs` with the addresses the kernel had recorded.
    pub fn remove_pod(
        &mut self,
        names: &NetNames,
        owner: OwnerKey,
        addrs: &mut Vec<IpAddr>,
    ) -> Result<usize> {
        let lock = self.lock_for_del()?;
        // Without the lock (unusable, DEL goes on) other DELs may write the record at the same
        // moment: this one forgets it instead, and the next locked verb compares in full.
        let record = lock.is_some() || !matches!(self.locking, Locking::Node);
        let given = addrs.len();
        self.read_modify_write("DEL", |s| {
            addrs.truncate(given);
            let mut v = view::View::new(&mut s.k);
            let pinned = exempt_mac_of(&mut v, names, owner)?;
            let recorded = remove_attachment(&mut v, names, owner, addrs)?;
            for a in recorded {
                if !addrs.contains(&a) {
                    addrs.push(a);
                }
            }
            let mut batch = Batch::default();
            emit_settled(v, &mut batch, None)?;
            let n = batch.len();
            let read = s.k.read_generation();
            s.k.commit(&batch)?;
            if let Some((port, mac)) = pinned {
                // The port goes with the pod anyway, and its entries with it.
                if let Err(e) = s.k.pin_mac(port, mac, false) {
                    crate::debug!("unpinning MAC from bridge port {port}: {e}");
                }
            }
            // Element changes only: what was intact before is intact after.
            match read {
                Some(g) if record => s.verified.after(g, n > 0, None, true),
                _ => s.verified.clear(),
            }
            Ok(n)
        })
    }

    /// Removes every attachment of a network that is not in `valid`, every owner not in
    /// `valid` from the per-pod elements, and recounts the interfaces from the attachments
    /// that remain. Reads each set once, writes one batch. Returns the number of elements
    /// changed.
    pub fn gc(&mut self, names: &NetNames, valid: &HashSet<OwnerKey>) -> Result<usize> {
        let _lock = self.lock()?;
        self.read_modify_write("GC", |s| s.gc_once(names, valid))
    }

    fn gc_once(&mut self, names: &NetNames, valid: &HashSet<OwnerKey>) -> Result<usize> {
        let mut v = view::View::new(&mut self.k);
        let pods = set_ref(names, SetKind::Pods);
        let att = set_ref(names, SetKind::Att);
        let mut owners_seen: Vec<Key> = v.preload(&pods)?;
        owners_seen.extend(v.preload(&att)?);
        for kind in SetKind::ALL.into_iter().filter(|k| k.is_owned()) {
            v.preload(&set_ref(names, kind))?;
        }
        let ifs = set_ref(names, SetKind::Ifs);
        v.preload(&ifs)?;
        for key in owners_seen.clone() {
            if let Key::Owner(o) = key {
                if !valid.contains(&o) {
                    v.set(&pods, &key, None)?;
                    v.set(&att, &key, None)?;
                }
            }
        }
        let ours: HashSet<OwnerKey> = owners_seen
            .iter()
            .filter_map(|k| match k {
                Key::Owner(o) => Some(*o),
                _ => None,
            })
            .collect();
        for kind in SetKind::ALL.into_iter().filter(|k| k.is_owned()) {
            let set = set_ref(names, kind);
            for key in v.keys_in(&set) {
                let owners = owners_of(v.get(&set, &key)?.as_deref());
                // A node-wide set holds every network's pods: this network's GC judges only
                // its own attachments there.
                let live: Vec<OwnerKey> = owners
                    .iter()
                    .copied()
                    .filter(|o| valid.contains(o) || (kind.is_node() && !ours.contains(o)))
                    .collect();
                if live != owners || live.is_empty() {
                    let next = (!live.is_empty()).then(|| plan::owners_comment(&live));
                    v.set(&set, &key, next)?;
                }
            }
        }
        let mut counts: HashMap<IfName, u32> = HashMap::new();
        for key in v.keys_in(&att) {
            let rec = plan::parse_attach(&v.get(&att, &key)?.unwrap_or_default());
            if let Some(i) = rec.iface {
                *counts.entry(i).or_default() += 1;
            }
        }
        for key in v.keys_in(&ifs) {
            if let Key::Iface(i) = key {
                let n = counts.remove(&i).unwrap_or(0);
                v.set(&ifs, &key, (n > 0).then(|| plan::iface_comment(n)))?;
            }
        }
        for (i, n) in counts {
            v.set(&ifs, &Key::Iface(i), Some(plan::iface_comment(n)))?;
        }
        let mut batch = Batch::default();
        emit_settled(v, &mut batch, None)?;
        let n = batch.len();
        self.k.commit(&batch)?;
        Ok(n)
    }

    /// Whether nf_tables and ctnetlink answer (STATUS).
    pub fn probe(&mut self) -> Result<()> {
        self.k.probe()
    }

    /// Deletes natguard's tables (uninstall). A missing table is not an error.
    pub fn delete_all(&mut self) -> Result<()> {
        let _lock = self.lock()?;
        for t in TableFamily::EVERY {
            if self.k.table_flags(t)?.is_none() {
                continue;
            }
            let batch = Batch {
                ops: vec![Op::DeleteTable(t)],
            };
            match self.k.commit(&batch) {
                Err(e) if e.errno() == Some(libc::ENOENT) => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// The namespace's conntrack entries, on the store's socket (no walk).
    pub fn conntrack_entries(&mut self) -> Result<u64> {
        self.k.conntrack_entries()
    }

    /// Deletes the conntrack entries of `addrs` that `scope` deletes.
    pub fn flush_conntrack(
        &mut self,
        addrs: &[IpAddr],
        path: Path,
        scope: &Scope,
    ) -> Result<FlushReport> {
        self.k.flush_conntrack(addrs, path, scope)
    }

    /// Which entries of `addrs` an ADD (or an adopt) of `names`' network deletes: all of them
    /// (flushOnAdd: no flow from before the pod's rules survives into its life), except the
    /// flows of other networks' live attachments that hold one of the addresses (overlapping
    /// ranges), which carry their own network's label bit. When the table is empty, or the
    /// other networks cannot be read, every entry goes, as before scopes existed.
    pub fn add_scope(&mut self, names: &NetNames, cfg: &Config, addrs: &[IpAddr]) -> Scope {
        if matches!(self.conntrack_entries(), Ok(0)) {
            return Scope::All;
        }
        match self.label_holders(names, addrs) {
            Ok(keep) => Scope::add(own_label(names, cfg), &keep),
            Err(e) => {
                crate::warn!("cannot read which other networks hold the pod's addresses, so none of their flows are kept: {e}");
                Scope::All
            }
        }
    }

    /// The conntrack label bits of the other labelling networks (those whose DNAT chain marks
    /// their connections, see [`NetNames::label_bit`]) that hold one of `addrs` in their
    /// masquerade sets, owned by an attachment whose network namespace exists: networks with a
    /// live attachment that has the address, whose flows an ADD of `names`' network keeps.
    /// Read without the lock: a pod that comes or goes meanwhile
    /// is one whose flows this ADD keeps or deletes a moment early, as with any timing.
    pub fn label_holders(&mut self, names: &NetNames, addrs: &[IpAddr]) -> Result<Vec<u8>> {
        let mut bits = Vec::new();
        if addrs.is_empty() {
            return Ok(bits);
        }
        let rules = self.k.rules(TableFamily::Inet)?;
        let mut others: Vec<&str> = Vec::new();
        for chain_rules in rules.values() {
            for rule in chain_rules {
                let Some(other) = plan::network_of_rule_comment(&rule.comment) else {
                    continue;
                };
                if other != names.network
                    && other != plan::NODE
                    && !others.contains(&other)
                    // A network that masquerades labels its connections (its snat chain has
                    // rules, as in refuse_foreign_objects).
                    && rules
                        .get(&NetNames::new(other).chain(plan::ChainKind::Snat))
                        .is_some_and(|r| !r.is_empty())
                {
                    others.push(other);
                }
            }
        }
        let netns_exists = self.netns_exists;
        let mut v = view::View::new(&mut self.k);
        for other in others {
            let on = NetNames::new(other);
            'addrs: for a in addrs {
                let a = a.to_canonical();
                let set = set_ref(&on, SetKind::Masq(plan::Family::of(&a)));
                let Some(comment) = v.get(&set, &Key::Addr(a))? else {
                    continue;
                };
                // A holder whose network namespace is gone (a sandbox that vanished without a
                // DEL) has no connections to keep: its flows go, as an earlier owner's.
                let owners = owners_of(Some(&comment));
                let mut live = owners.is_empty();
                for o in owners {
                    live |= !attachment_gone(&mut v, &on, o, netns_exists)?;
                }
                if live {
                    bits.push(on.label_bit());
                    break 'addrs;
                }
            }
        }
        Ok(bits)
    }

    /// Deletes metadata flows from `srcs` that bypassed the DNAT to one of `proxies`.
    pub fn flush_bypassed(
        &mut self,
        srcs: &[IpAddr],
        dsts: &[IpAddr],
        dports: &[u16],
        proxies: &[(IpAddr, u16)],
        path: Path,
        scope: &Scope,
    ) -> Result<FlushReport> {
        self.k
            .flush_bypassed(srcs, dsts, dports, proxies, path, scope)
    }
}

/// The conntrack label bit a network's connections carry: masquerading networks label what
/// enters on their pods' host sides (see [`NetNames::label_bit`]); others label nothing.
pub fn own_label(names: &NetNames, cfg: &Config) -> Option<u8> {
    cfg.masquerade.enabled.then(|| names.label_bit())
}

/// natguard's tables as a converging batch finds them, read once per batch however many
/// networks it converges: each existing table's flags, chains and sets.
struct Found(Vec<FoundTable>);

struct FoundTable {
    family: TableFamily,
    chains: HashSet<String>,
    sets: HashSet<String>,
}

impl Found {
    fn read<K: Kernel>(k: &mut K) -> Result<Found> {
        let mut tables = Vec::new();
        for family in TableFamily::EVERY {
            if k.table_flags(family)?.is_some() {
                tables.push(FoundTable {
                    family,
                    chains: k.chain_names(family)?.into_iter().collect(),
                    sets: k.set_names(family)?.into_iter().collect(),
                });
            }
        }
        Ok(Found(tables))
    }

    fn table(&self, t: TableFamily) -> Option<&FoundTable> {
        self.0.iter().find(|f| f.family == t)
    }
}

/// The converge of a network's shared objects, then what an earlier version left: its
/// per-network guard chains first (their rules refer to the sets), then the sets. Before the
/// converge, the renamed sets that an earlier release's converge left stale
/// ([`plan::RENAMED_SETS`]) are deleted; their names are returned, so the view reads them as
/// the converge leaves them: empty.
fn push_converge(batch: &mut Batch, shared: &SharedPlan, found: &Found) -> Vec<String> {
    let prefix = shared.names.prefix_of_sets();
    let mut emptied = Vec::new();
    for f in &found.0 {
        for (_, scope, old, new) in plan::RENAMED_SETS.iter().filter(|r| r.0 == f.family) {
            let p = match scope {
                plan::Scope::Network => prefix.as_str(),
                plan::Scope::Node => "",
            };
            let (old, new) = (format!("{p}{old}"), format!("{p}{new}"));
            // The earlier release's rules use the earlier set, none this one: it can go.
            let op = Op::DeleteSet(f.family, new.clone());
            if f.sets.contains(&old) && f.sets.contains(&new) && !batch.ops.contains(&op) {
                batch.push(op);
                emptied.push(new);
            }
        }
    }
    // An earlier version's bridge guard goes whole, before this version's objects are
    // written (once per batch, however many networks converge in it).
    let legacy = Op::DeleteTable(TableFamily::Bridge);
    if found.table(TableFamily::Bridge).is_some() && !batch.ops.contains(&legacy) {
        batch.push(legacy);
    }
    batch.push(Op::Converge(Box::new(shared.clone())));
    for f in &found.0 {
        for (_, suffix) in plan::LEGACY_CHAIN_SUFFIXES
            .iter()
            .filter(|(lt, _)| *lt == f.family)
        {
            let name = format!("{prefix}{suffix}");
            if f.chains.contains(&name) {
                batch.push(Op::DeleteChain(f.family, name));
            }
        }
    }
    for f in &found.0 {
        for (_, suffix) in plan::LEGACY_SET_SUFFIXES
            .iter()
            .filter(|(lt, _)| *lt == f.family)
        {
            let name = format!("{prefix}{suffix}");
            if f.sets.contains(&name) {
                batch.push(Op::DeleteSet(f.family, name));
            }
        }
        // Node-wide: once per batch, however many networks converge in it.
        for (_, name) in plan::LEGACY_NODE_SETS
            .iter()
            .filter(|(lt, _)| *lt == f.family)
        {
            let op = Op::DeleteSet(f.family, name.to_string());
            if f.sets.contains(*name) && !batch.ops.contains(&op) {
                batch.push(op);
            }
        }
    }
    emptied
}

/// Appends the view's changes to `batch`, then what keeps the exempt pods' veth chains to
/// `xveths` ([`settle_veth_chains`]): in the same commit, so an exemption never exists without
/// the chain that marks its pod's frames, nor a chain without its pod.
fn emit_settled<K: Kernel>(
    mut v: view::View<'_, K>,
    batch: &mut Batch,
    found: Option<&Found>,
) -> Result<()> {
    let veth_chains = settle_veth_chains(&mut v, found)?;
    v.emit(batch);
    batch.ops.extend(veth_chains);
    Ok(())
}

/// The bridge port and MAC an exempt pod pins: exempt (its veth marks its frames), on a
/// bridge, its MAC known.
fn mac_pin_of(pod: &PodPlan) -> Option<(IfName, [u8; 6])> {
    let h = pod.host?;
    let (port, mac) = (h.port?, h.mac?);
    pod.present
        .contains(&(SetKind::XVeths, Key::Iface(port)))
        .then_some((port, mac))
}

/// The bridge port and MAC an attachment pinned, as recorded: its port in `xveths` (it is
/// exempt) and its MAC known.
fn exempt_mac_of<K: Kernel>(
    v: &mut view::View<'_, K>,
    names: &NetNames,
    owner: OwnerKey,
) -> Result<Option<(IfName, [u8; 6])>> {
    let att = set_ref(names, SetKind::Att);
    let Some(host) = v
        .get(&att, &Key::Owner(owner))?
        .and_then(|c| plan::parse_attach(&c).host())
    else {
        return Ok(None);
    };
    let (Some(port), Some(mac)) = (host.port, host.mac) else {
        return Ok(None);
    };
    let xveths = set_ref(names, SetKind::XVeths);
    let owners = owners_of(v.get(&xveths, &Key::Iface(port))?.as_deref());
    Ok(owners.contains(&owner).then_some((port, mac)))
}

/// The veth chains that make the netdev table's chains what `xveths` holds after the view's
/// changes: one per exempt pod's own veth, none for a veth no exempt pod has. Only a batch that
/// converges (`found`) or changes `xveths` (the ADD, DEL or GC of an exempt pod) reads them. A
/// converge rewrites every chain it keeps, so a rule someone changed is put back, and deletes
/// the chain of a veth that is gone. A chain is created only where its veth exists: older
/// kernels refuse a netdev chain for a device that is not there (and delete the chain with its
/// device), newer ones keep it unhooked; a pod whose veth is gone is leaving, and its DEL or GC
/// takes its element.
fn settle_veth_chains<K: Kernel>(
    v: &mut view::View<'_, K>,
    found: Option<&Found>,
) -> Result<Vec<Op>> {
    let set = SetRef {
        name: SetKind::XVeths.suffix(),
        kind: SetKind::XVeths,
    };
    let t = TableFamily::Netdev;
    let converges = found.is_some();
    if !converges && !v.changes(&set) {
        return Ok(Vec::new());
    }
    let table = match found {
        Some(f) => f.table(t).map(|n| n.chains.clone()),
        None if v.k.table_flags(t)?.is_some() => Some(v.k.chain_names(t)?.into_iter().collect()),
        None => None,
    };
    // Without the table there is neither a set to read nor a chain.
    let chains: HashSet<String> = match table {
        Some(chains) => {
            v.preload(&set)?;
            chains
        }
        None => HashSet::new(),
    };
    let want: HashSet<IfName> = v
        .keys_in(&set)
        .into_iter()
        .filter_map(|k| match k {
            Key::Iface(i) => Some(i),
            _ => None,
        })
        .collect();
    let mut ops = Vec::new();
    let mut sorted: Vec<&IfName> = want.iter().collect();
    sorted.sort();
    // The veths asked about that are gone: each is asked once.
    let mut vanished: HashSet<&str> = HashSet::new();
    for veth in sorted {
        let have = chains.contains(veth.as_str());
        if converges || !have {
            if v.k.link_exists(veth.as_str()) {
                ops.push(Op::VethChain(*veth));
            } else {
                vanished.insert(veth.as_str());
            }
        }
    }
    // A converge also deletes the chain of a veth that is gone (a kernel that keeps a netdev
    // chain without its device): the pod is leaving, and its DEL or GC takes its element. (A
    // converge asked about every veth `xveths` names, above.)
    let mut gone: Vec<&String> = chains
        .iter()
        .filter(|c| !want.iter().any(|w| w.as_str() == c.as_str()) || vanished.contains(c.as_str()))
        .collect();
    gone.sort();
    for c in gone {
        ops.push(Op::DeleteChain(t, c.clone()));
    }
    Ok(ops)
}

/// Stages one attachment in a view: releases what an earlier ADD of the same attachment
/// owned and this one does not, and takes ownership of every element of `pod`.
fn stage_pod<K: Kernel>(
    v: &mut view::View<'_, K>,
    names: &NetNames,
    pod: &PodPlan,
    netns_exists: fn(&str) -> bool,
) -> Result<()> {
    let me = pod.owner;
    let pods = set_ref(names, SetKind::Pods);
    let att = set_ref(names, SetKind::Att);
    let old_rec = v.get(&pods, &Key::Owner(me))?;
    let old_att = v
        .get(&att, &Key::Owner(me))?
        .map(|c| plan::parse_attach(&c));
    // Release what an earlier ADD of this attachment owned and this one does not.
    let old_addrs = plan::addrs_from_comment(old_rec.as_deref().unwrap_or(""));
    let old_host = old_att.as_ref().and_then(|a| a.host());
    let wanted: HashSet<(SetKind, Key)> = pod.present.iter().copied().collect();
    let mut release = plan::owned_keys(&old_addrs, old_host);
    release.extend(pod.absent.iter().copied());
    for (kind, key) in release {
        if !wanted.contains(&(kind, key)) {
            leave(v, &set_ref(names, kind), &key, me)?;
        }
    }
    for (kind, key) in &pod.present {
        let set = set_ref(names, *kind);
        let mut owners = owners_of(v.get(&set, key)?.as_deref());
        // Owners whose network namespace is gone are pruned before any is refused.
        for o in owners.clone() {
            if o != me && attachment_gone(v, names, o, netns_exists)? {
                remove_attachment(v, names, o, &[])?;
            }
        }
        owners = owners_of(v.get(&set, key)?.as_deref());
        owners.retain(|o| *o != me);
        if owners.len() >= plan::MAX_OWNERS {
            return Err(Error::TryAgain(format!(
                    "{} in set {} already has {} live owners ({}); natguard records at most {} and drops none of them: DEL or GC the stale attachments, then retry",
                    plan::render_key(key),
                    set.name,
                    owners.len(),
                    plan::owners_comment(&owners),
                    plan::MAX_OWNERS
                )));
        }
        owners.insert(0, me);
        v.set(&set, key, Some(plan::owners_comment(&owners)))?;
    }
    let old_iface = old_att.as_ref().and_then(|a| a.iface);
    let new_iface = pod.host.map(|h| h.iface);
    if old_iface != new_iface {
        if let Some(i) = old_iface {
            count_iface(v, names, i, -1)?;
        }
        if let Some(i) = new_iface {
            count_iface(v, names, i, 1)?;
        }
    }
    v.set(&pods, &Key::Owner(me), Some(pod.comment.clone()))?;
    v.set(&att, &Key::Owner(me), Some(pod.attach.clone()))?;
    Ok(())
}

/// Takes `owner` out of the owner list of one element; the element goes with its last owner.
fn leave<K: Kernel>(
    v: &mut view::View<'_, K>,
    set: &SetRef,
    key: &Key,
    owner: OwnerKey,
) -> Result<()> {
    let Some(comment) = v.get(set, key)? else {
        return Ok(());
    };
    let owners = owners_of(Some(&comment));
    if !owners.contains(&owner) && !owners.is_empty() {
        return Ok(());
    }
    let rest: Vec<OwnerKey> = owners.into_iter().filter(|o| *o != owner).collect();
    v.set(
        set,
        key,
        (!rest.is_empty()).then(|| plan::owners_comment(&rest)),
    )
}

/// Adds `delta` to the pod count of an interface element; it goes when the count reaches 0.
fn count_iface<K: Kernel>(
    v: &mut view::View<'_, K>,
    names: &NetNames,
    i: IfName,
    delta: i64,
) -> Result<()> {
    let set = set_ref(names, SetKind::Ifs);
    let key = Key::Iface(i);
    let n = v
        .get(&set, &key)?
        .map(|c| plan::iface_pods(&c))
        .unwrap_or(0) as i64;
    let next = (n + delta).max(0) as u32;
    v.set(&set, &key, (next > 0).then(|| plan::iface_comment(next)))
}

/// Whether `owner`'s attachment is provably gone: its recorded network namespace no longer
/// exists. An attachment without a record of its namespace is never judged gone.
fn attachment_gone<K: Kernel>(
    v: &mut view::View<'_, K>,
    names: &NetNames,
    owner: OwnerKey,
    netns_exists: fn(&str) -> bool,
) -> Result<bool> {
    let att = set_ref(names, SetKind::Att);
    let Some(c) = v.get(&att, &Key::Owner(owner))? else {
        return Ok(false);
    };
    Ok(plan::parse_attach(&c)
        .netns
        .is_some_and(|p| !netns_exists(&p)))
}

/// Removes an attachment: its records, its ownership of every element its recorded
/// addresses (and `extra`) and host side give it, and its interface count. Returns the
/// addresses the record held.
fn remove_attachment<K: Kernel>(
    v: &mut view::View<'_, K>,
    names: &NetNames,
    owner: OwnerKey,
    extra: &[IpAddr],
) -> Result<Vec<IpAddr>> {
    let pods = set_ref(names, SetKind::Pods);
    let att = set_ref(names, SetKind::Att);
    let rec = v.get(&pods, &Key::Owner(owner))?;
    let attach = v
        .get(&att, &Key::Owner(owner))?
        .map(|c| plan::parse_attach(&c));
    let recorded = plan::addrs_from_comment(rec.as_deref().unwrap_or(""));
    let mut addrs = recorded.clone();
    for a in extra {
        if !addrs.contains(a) {
            addrs.push(*a);
        }
    }
    let host = attach.as_ref().and_then(|a| a.host());
    for (kind, key) in plan::owned_keys(&addrs, host) {
        leave(v, &set_ref(names, kind), &key, owner)?;
    }
    if let Some(i) = attach.as_ref().and_then(|a| a.iface) {
        count_iface(v, names, i, -1)?;
    }
    v.set(&pods, &Key::Owner(owner), None)?;
    v.set(&att, &Key::Owner(owner), None)?;
    Ok(recorded)
}

/// The store of the calling thread's network namespace, on a real netfilter socket.
pub(crate) fn open() -> Result<Store<crate::kernel::Netfilter>> {
    Ok(Store::new(crate::kernel::Netfilter::open()?, Locking::Node)
        .with_verified_in(crate::lock::run_dir()))
}

/// What [`verified`] records of a network found intact. The rules' fingerprints do not cover
/// the declared elements of the shared sets (an `allowInterfaces` change alters only those),
/// so the entry names a digest of everything [`Store::check_shared`] compares: the sets with
/// their elements, and the rules.
fn verified_entry(shared: &SharedPlan) -> verified::Entry {
    let whole = plan::digest(&(&shared.sets, &shared.rules));
    verified::Entry {
        network: shared.names.network.clone(),
        fingerprint: format!("{}-{whole:016x}", shared.fingerprint),
        node_fingerprint: shared.node_fingerprint.clone(),
    }
}

/// Deletes natguard's whole table in the calling thread's namespace (uninstall).
pub(crate) fn delete_all() -> Result<()> {
    open()?.delete_all()
}

#[cfg(test)]
mod tests;
