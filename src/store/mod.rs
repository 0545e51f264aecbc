//! natguard's state in the kernel, read and written as owner records.
//!
//! The verbs and tools change kernel state only through a [`Store`]. It holds the node-wide
//! lock (`/run/natguard/lock`) from the read of what it will change to the commit, so
//! concurrent invocations cannot interleave into a lost owner, and it turns each verb into one
//! [`Batch`]. It reaches the kernel only through the [`Kernel`] trait, so every rule here (owner
//! lists, pruning, what CHECK compares, what GC removes) is unit-tested against a recording fake.
//!
//! The records ([`crate::plan::record`]): every per-pod address element lists its owners,
//! newest first; an element is deleted only when its last owner leaves, so "ADD A (ip X),
//! ADD B (ip X), DEL A" keeps B's policy in either order. Each attachment has one element in
//! `NET-pods`, keyed by its [`OwnerKey`], recording its addresses: DEL finds everything from the
//! key alone. Idempotency lives in the batch ([`Op::Put`] replaces, never fails with EEXIST);
//! nothing is written where nothing changes.

use crate::error::{Error, Result};
use crate::kernel::conntrack::{FlushReport, Path};
use crate::kernel::{Batch, Kernel, Op, SetRef};
use crate::plan::{self, Family, Key, NetNames, OwnerKey, PodPlan, SetKind, SharedPlan};
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

pub(crate) const RUN_DIR: &str = "/run/natguard";

/// nf_tables' table flag for a dormant table: none of its rules apply.
const NFT_TABLE_F_DORMANT: u32 = 0x1;

/// Holds natguard's node-wide lock while alive.
pub(crate) struct Lock(#[allow(dead_code)] File);

fn lock() -> Result<Lock> {
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(RUN_DIR);
    let path = format!("{RUN_DIR}/lock");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| Error::io(format!("open lock file {path}"), e))?;
    f.lock().map_err(|e| Error::io(format!("lock {path}"), e))?;
    Ok(Lock(f))
}

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

/// The address sets whose elements list their owners, for one family.
fn owned_sets(f: Family) -> [SetKind; 3] {
    [SetKind::Meta(f), SetKind::Masq(f), SetKind::Allow(f)]
}

/// One pod as `NET-pods` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodRecord {
    pub owner: Option<OwnerKey>,
    pub comment: String,
}

/// What `status` shows of one network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NetworkState {
    pub network: String,
    /// (chain, number of rules, the rules' comment)
    pub chains: Vec<(plan::ChainKind, String, Vec<String>)>,
    pub meta_dst: Vec<IpAddr>,
    pub meta_ports: Vec<u16>,
    /// Pod networks of each family, as ranges.
    pub nets: Vec<(Family, Vec<(u128, u128)>)>,
    pub pods: Vec<PodRecord>,
    pub allowed: HashSet<IpAddr>,
}

/// natguard's state in one network namespace's kernel.
pub(crate) struct Store<K: Kernel> {
    k: K,
    locking: Locking,
}

impl<K: Kernel> Store<K> {
    pub fn new(k: K, locking: Locking) -> Self {
        Store { k, locking }
    }

    #[cfg(test)]
    pub fn kernel(&mut self) -> &mut K {
        &mut self.k
    }

    fn lock(&self) -> Result<Option<Lock>> {
        match self.locking {
            Locking::Node => lock().map(Some),
            #[cfg(test)]
            Locking::Unlocked => Ok(None),
        }
    }

    /// Converges the network's shared objects and installs `pod`, releasing what an earlier
    /// ADD of the same attachment owned and no longer should: one locked read-modify-write.
    ///
    /// The shared objects are rewritten only when the kernel's differ from the plan (first ADD
    /// of a network, a config change, someone else's flush), so the common ADD is a handful of
    /// element operations and leaves the network's rules alone.
    pub fn apply_pod(&mut self, shared: &SharedPlan, pod: &PodPlan) -> Result<()> {
        let _lock = self.lock()?;
        let current = self.check_shared(shared).is_ok();
        match self.apply_pod_locked(shared, pod, !current) {
            // The table vanished between the read and the commit (a flush by someone else).
            Err(e) if current && e.errno() == Some(libc::ENOENT) => {
                self.apply_pod_locked(shared, pod, true)
            }
            r => r,
        }
    }

    fn apply_pod_locked(
        &mut self,
        shared: &SharedPlan,
        pod: &PodPlan,
        converge: bool,
    ) -> Result<()> {
        let names = &shared.names;
        let mut batch = Batch::default();
        if converge {
            batch.push(Op::Converge(Box::new(shared.clone())));
        }
        let pods = set_ref(names, SetKind::Pods);
        let old = self.k.get(&pods, &Key::Owner(pod.owner))?;
        if let Some(old) = &old {
            let stale: Vec<IpAddr> = plan::addrs_from_comment(old.comment.as_deref().unwrap_or(""))
                .into_iter()
                .filter(|a| !pod.addrs.contains(a))
                .collect();
            self.release_addrs(&mut batch, names, pod.owner, &stale)?;
        }
        self.stage_pod(&mut batch, names, pod)?;
        if old.as_ref().and_then(|o| o.comment.as_deref()) != Some(pod.comment.as_str()) {
            batch.push(Op::Put {
                set: pods,
                key: Key::Owner(pod.owner),
                comment: pod.comment.clone(),
            });
        }
        self.k.commit(&batch)
    }

    /// Adds to `batch` what makes the kernel's address elements match `pod`: the pod becomes
    /// the newest owner of every (set, address) it needs, and leaves those it must not own.
    fn stage_pod(&mut self, batch: &mut Batch, names: &NetNames, pod: &PodPlan) -> Result<()> {
        let wanted = pod.present.iter().map(|p| (p, true));
        let unwanted = pod.absent.iter().map(|p| (p, false));
        for ((kind, ip), want) in wanted.chain(unwanted) {
            self.stage_owner(batch, &set_ref(names, *kind), ip, pod.owner, want)?;
        }
        for f in Family::ALL {
            let mine: Vec<(u128, u128)> = pod
                .nets
                .iter()
                .filter(|c| Family::of(&c.addr) == f)
                .map(|c| c.range())
                .collect();
            if mine.is_empty() {
                continue;
            }
            let set = set_ref(names, SetKind::Nets(f));
            let have = self.k.dump_ranges(&set)?;
            let want = plan::merge_ranges(have.iter().copied().chain(mine).collect());
            if want != have {
                batch.push(Op::Intervals { set, ranges: want });
            }
        }
        Ok(())
    }

    /// Adds to `batch` what makes `owner` the newest owner of `ip` in `set` (`want`), or no
    /// owner of it. An element is deleted when its last owner leaves.
    fn stage_owner(
        &mut self,
        batch: &mut Batch,
        set: &SetRef,
        ip: &IpAddr,
        owner: OwnerKey,
        want: bool,
    ) -> Result<()> {
        let key = Key::Addr(*ip);
        let cur = self.k.get(set, &key)?;
        let owners = cur
            .as_ref()
            .map(|e| plan::owners_from_comment(e.comment.as_deref().unwrap_or("")))
            .unwrap_or_default();
        let mut next: Vec<OwnerKey> = owners.iter().copied().filter(|o| *o != owner).collect();
        if want {
            next.insert(0, owner);
        }
        next.truncate(plan::MAX_OWNERS);
        stage_owners(batch, set, key, cur.is_some(), &owners, &next);
        Ok(())
    }

    /// Adds to `batch` the removal of `owner` from the address elements of `addrs`.
    fn release_addrs(
        &mut self,
        batch: &mut Batch,
        names: &NetNames,
        owner: OwnerKey,
        addrs: &[IpAddr],
    ) -> Result<()> {
        for a in addrs {
            for kind in owned_sets(Family::of(a)) {
                self.stage_owner(batch, &set_ref(names, kind), a, owner, false)?;
            }
        }
        Ok(())
    }

    /// Removes everything `owner` owns in a network; returns the number of elements changed
    /// and extends `addrs` with the addresses the kernel had recorded.
    pub fn remove_pod(
        &mut self,
        names: &NetNames,
        owner: OwnerKey,
        addrs: &mut Vec<IpAddr>,
    ) -> Result<usize> {
        let _lock = self.lock()?;
        let pods = set_ref(names, SetKind::Pods);
        let mut batch = Batch::default();
        if let Some(e) = self.k.get(&pods, &Key::Owner(owner))? {
            for a in plan::addrs_from_comment(e.comment.as_deref().unwrap_or("")) {
                if !addrs.contains(&a) {
                    addrs.push(a);
                }
            }
            batch.push(Op::Del {
                set: pods,
                key: Key::Owner(owner),
            });
        }
        self.release_addrs(&mut batch, names, owner, addrs)?;
        let n = batch.len();
        self.k.commit(&batch)?;
        Ok(n)
    }

    /// Compares the kernel's shared objects of a network with the plan.
    pub fn check_shared(&mut self, shared: &SharedPlan) -> Result<()> {
        let names = &shared.names;
        match self.k.table_flags()? {
            None => {
                return Err(Error::CheckFailed(format!(
                    "table inet {} is missing, and with it chain {} and every set of network {}",
                    plan::TABLE,
                    names.chain(plan::ChainKind::Dnat),
                    names.network
                )))
            }
            Some(f) if f & NFT_TABLE_F_DORMANT != 0 => {
                return Err(Error::CheckFailed(format!(
                    "table inet {} is dormant: none of its rules apply",
                    plan::TABLE
                )))
            }
            Some(_) => {}
        }
        let sets: HashSet<String> = self.k.set_names()?.into_iter().collect();
        for s in &shared.sets {
            if !sets.contains(&s.name) {
                return Err(Error::CheckFailed(format!(
                    "set inet {} {} is missing",
                    plan::TABLE,
                    s.name
                )));
            }
            // The shared sets' contents are policy too: an emptied metadata or CIDR set would
            // switch interception or the masquerade exceptions off for the whole network.
            let Some(elems) = &s.elements else { continue };
            let set = SetRef {
                name: s.name.clone(),
                kind: s.kind,
            };
            let (want, got) = if s.kind.is_interval() {
                let want: Vec<(u128, u128)> =
                    plan::merge_ranges(elems.iter().filter_map(plan::Elem::range).collect());
                (
                    want.len(),
                    (want == self.k.dump_ranges(&set)?).then_some(want.len()),
                )
            } else {
                let mut want: Vec<Key> = elems.iter().filter_map(plan::Elem::key).collect();
                let mut got: Vec<Key> = self.k.dump(&set)?.into_iter().map(|e| e.key).collect();
                want.sort();
                got.sort();
                (want.len(), (want == got).then_some(got.len()))
            };
            if got.is_none() {
                return Err(Error::CheckFailed(format!(
                    "set {} differs from the config ({want} elements expected); the next ADD on this network rewrites it",
                    s.name
                )));
            }
        }
        let expected = shared.rule_comment();
        let chains: HashSet<String> = self.k.chain_names()?.into_iter().collect();
        let mut rules = self.k.rule_comments()?;
        for c in plan::ChainKind::ALL {
            let chain = names.chain(c);
            let want = shared.rules_of(c).count();
            if !chains.contains(&chain) {
                return Err(Error::CheckFailed(format!(
                    "chain inet {} {chain} is missing",
                    plan::TABLE
                )));
            }
            let got = rules.remove(&chain).unwrap_or_default();
            if got.len() != want || got.iter().any(|g| *g != expected) {
                return Err(Error::CheckFailed(format!(
                    "chain {chain} differs from the config: expected {want} rules commented {expected:?}, found {} ({got:?}); the next ADD on this network rewrites it",
                    got.len()
                )));
            }
        }
        Ok(())
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
        for (kind, ip) in &pod.present {
            let set = set_ref(names, *kind);
            match self.k.get(&set, &Key::Addr(*ip))? {
                None => {
                    return Err(Error::CheckFailed(format!(
                        "address {ip} is missing from set {}",
                        set.name
                    )))
                }
                Some(e) => {
                    let c = e.comment.unwrap_or_default();
                    if !plan::owners_from_comment(&c).contains(&pod.owner) {
                        return Err(Error::CheckFailed(format!(
                            "address {ip} in set {} is owned by {c:?}, not by this pod ({owner})",
                            set.name
                        )));
                    }
                }
            }
        }
        for (kind, ip) in &pod.absent {
            let set = set_ref(names, *kind);
            if let Some(e) = self.k.get(&set, &Key::Addr(*ip))? {
                if plan::owners_from_comment(e.comment.as_deref().unwrap_or(""))
                    .contains(&pod.owner)
                {
                    return Err(Error::CheckFailed(format!(
                        "address {ip} must not be in set {} on behalf of this pod ({owner})",
                        set.name
                    )));
                }
            }
        }
        for c in &pod.nets {
            let set = set_ref(names, SetKind::Nets(Family::of(&c.addr)));
            let have = self.k.dump_ranges(&set)?;
            let (lo, hi) = c.range();
            if !have.iter().any(|&(a, b)| a <= lo && hi <= b) {
                return Err(Error::CheckFailed(format!(
                    "pod network {c} is missing from set {}",
                    set.name
                )));
            }
        }
        Ok(())
    }

    /// Removes every pod entry of a network whose owner is not in `valid`, and every owner not
    /// in `valid` from the address elements. Returns the number of elements changed.
    pub fn gc(&mut self, names: &NetNames, valid: &HashSet<OwnerKey>) -> Result<usize> {
        let _lock = self.lock()?;
        let mut batch = Batch::default();
        let pods = set_ref(names, SetKind::Pods);
        for e in self.k.dump(&pods)? {
            if !matches!(e.key, Key::Owner(o) if valid.contains(&o)) {
                batch.push(Op::Del {
                    set: pods.clone(),
                    key: e.key,
                });
            }
        }
        for f in Family::ALL {
            for kind in owned_sets(f) {
                let set = set_ref(names, kind);
                for e in self.k.dump(&set)? {
                    let owners = plan::owners_from_comment(e.comment.as_deref().unwrap_or(""));
                    let live: Vec<OwnerKey> = owners
                        .iter()
                        .copied()
                        .filter(|o| valid.contains(o))
                        .collect();
                    if live.is_empty() {
                        batch.push(Op::Del {
                            set: set.clone(),
                            key: e.key,
                        });
                    } else if live != owners {
                        stage_owners(&mut batch, &set, e.key, true, &owners, &live);
                    }
                }
            }
        }
        let n = batch.len();
        self.k.commit(&batch)?;
        Ok(n)
    }

    /// Whether nf_tables and ctnetlink answer (STATUS).
    pub fn probe(&mut self) -> Result<()> {
        self.k.probe()
    }

    /// Deletes natguard's whole table (uninstall). A missing table is not an error.
    pub fn delete_all(&mut self) -> Result<()> {
        let _lock = self.lock()?;
        if self.k.table_flags()?.is_none() {
            return Ok(());
        }
        let batch = Batch {
            ops: vec![Op::DeleteTable],
        };
        match self.k.commit(&batch) {
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
            r => r,
        }
    }

    /// Deletes the conntrack entries of `addrs`.
    pub fn flush_conntrack(&mut self, addrs: &[IpAddr], path: Path) -> Result<FlushReport> {
        self.k.flush_conntrack(addrs, path)
    }

    /// Deletes metadata flows from `srcs` that bypassed the DNAT.
    pub fn flush_undnatted(
        &mut self,
        srcs: &[IpAddr],
        dsts: &[IpAddr],
        dports: &[u16],
    ) -> Result<FlushReport> {
        self.k.flush_undnatted(srcs, dsts, dports)
    }

    /// The networks natguard's table holds; `None` when there is no table.
    pub fn networks(&mut self) -> Result<Option<Vec<String>>> {
        if self.k.table_flags()?.is_none() {
            return Ok(None);
        }
        let mut nets: Vec<String> = self
            .k
            .chain_names()?
            .iter()
            .filter_map(|c| NetNames::network_of_chain(c).map(str::to_string))
            .collect();
        nets.sort();
        Ok(Some(nets))
    }

    /// What one network holds, for `status`.
    pub fn network_state(&mut self, network: &str) -> Result<NetworkState> {
        let names = NetNames::new(network);
        let mut rules: HashMap<String, Vec<String>> = self.k.rule_comments()?;
        let chains = plan::ChainKind::ALL
            .iter()
            .map(|&c| {
                let name = names.chain(c);
                let comments = rules.remove(&name).unwrap_or_default();
                (c, name, comments)
            })
            .collect();
        let mut meta_dst = Vec::new();
        for f in Family::ALL {
            for e in self.k.dump(&set_ref(&names, SetKind::MetaDst(f)))? {
                if let Key::Addr(a) = e.key {
                    meta_dst.push(a);
                }
            }
        }
        let meta_ports = self
            .k
            .dump(&set_ref(&names, SetKind::MetaPorts))?
            .into_iter()
            .filter_map(|e| match e.key {
                Key::Port(p) => Some(p),
                _ => None,
            })
            .collect();
        let mut nets = Vec::new();
        for f in Family::ALL {
            nets.push((f, self.k.dump_ranges(&set_ref(&names, SetKind::Nets(f)))?));
        }
        let pods = self
            .k
            .dump(&set_ref(&names, SetKind::Pods))?
            .into_iter()
            .map(|e| PodRecord {
                owner: match e.key {
                    Key::Owner(o) => Some(o),
                    _ => None,
                },
                comment: e.comment.unwrap_or_default(),
            })
            .collect();
        let mut allowed = HashSet::new();
        for f in Family::ALL {
            for e in self.k.dump(&set_ref(&names, SetKind::Allow(f)))? {
                if let Key::Addr(a) = e.key {
                    allowed.insert(a);
                }
            }
        }
        Ok(NetworkState {
            network: network.to_string(),
            chains,
            meta_dst,
            meta_ports,
            nets,
            pods,
            allowed,
        })
    }
}

/// Adds to `batch` what turns an element with `owners` into one with `next`: nothing when they
/// are the same, a delete when `next` is empty, otherwise a put with the new owner list.
fn stage_owners(
    batch: &mut Batch,
    set: &SetRef,
    key: Key,
    exists: bool,
    owners: &[OwnerKey],
    next: &[OwnerKey],
) {
    let unchanged = if exists {
        next == owners
    } else {
        next.is_empty()
    };
    if unchanged {
        return;
    }
    if next.is_empty() {
        batch.push(Op::Del {
            set: set.clone(),
            key,
        });
    } else {
        batch.push(Op::Put {
            set: set.clone(),
            key,
            comment: plan::owners_comment(next),
        });
    }
}

/// The store of the calling thread's network namespace, on a real netfilter socket.
pub(crate) fn open() -> Result<Store<crate::kernel::Netfilter>> {
    Ok(Store::new(crate::kernel::Netfilter::open()?, Locking::Node))
}

/// Deletes natguard's whole table in the calling thread's namespace (uninstall).
pub(crate) fn delete_all() -> Result<()> {
    open()?.delete_all()
}

#[cfg(test)]
mod tests;
