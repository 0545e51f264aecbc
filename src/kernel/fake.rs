//! A recording fake of [`Kernel`] for unit tests without root: an in-memory natguard table that
//! applies batches the way nf_tables does (whole or not at all; deleting a missing element or
//! writing into a missing set fails the batch with ENOENT) and records every batch committed.

use super::conntrack::{FlushReport, Path, Scope};
use super::{Batch, Kernel, Op, RuleRead, SetRef, Stored};
use crate::error::{Error, Result};
use crate::plan::{Elem, Key, SetKind, TableFamily};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FakeSet {
    pub kind: Option<SetKind>,
    pub elems: BTreeMap<Key, Option<String>>,
    pub ranges: Vec<(u128, u128)>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Fake {
    /// Flags of each table that exists.
    pub tables: BTreeMap<TableFamily, u32>,
    pub sets: BTreeMap<String, FakeSet>,
    /// Chain name → its table and the comment of each rule.
    pub chains: BTreeMap<String, (TableFamily, Vec<String>)>,
    /// Every batch committed, in order (failed ones included).
    pub commits: Vec<Batch>,
    /// The address lists of every conntrack flush.
    pub flushed: Vec<Vec<IpAddr>>,
    /// Make the next commit fail with this errno before applying anything.
    pub fail_next_commit: Option<i32>,
    /// How many of the next commits fail with ERESTART, as when another writer commits
    /// between each read and its commit.
    pub stale_commits: usize,
    /// What the other writer changed, applied when a stale commit is refused.
    pub other_writer: Option<fn(&mut Fake)>,
    /// How many read-modify-writes were begun (`begin_read`).
    pub reads_begun: usize,
    /// The table's generation: moved on by every commit, natguard's and the other writer's.
    pub generation: u32,
    /// The generation the last `begin_read` noted, until a commit uses it up.
    pub read_at: Option<u32>,
    /// MACs pinned to bridge ports.
    pub pinned: std::collections::BTreeSet<(crate::plan::IfName, [u8; 6])>,
    /// Interfaces that do not exist (every other name does).
    pub gone_links: std::collections::BTreeSet<String>,
    /// Every interface asked about (`link_exists`), in order.
    pub links_asked: Vec<String>,
}

fn enoent(what: String) -> Error {
    Error::netlink(what, libc::ENOENT)
}

fn eexist(what: String) -> Error {
    Error::netlink(what, libc::EEXIST)
}

impl Fake {
    /// The elements of a set, by name, as (key, comment).
    pub fn elems(&self, set: &str) -> Vec<(Key, Option<String>)> {
        self.sets
            .get(set)
            .map(|s| s.elems.iter().map(|(k, c)| (*k, c.clone())).collect())
            .unwrap_or_default()
    }

    pub(crate) fn apply(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::Converge(plan) => {
                // As the lowering: each table is created, or woken if someone made it dormant.
                for t in TableFamily::ALL {
                    self.tables.insert(t, 0);
                }
                for spec in &plan.sets {
                    let set = self.sets.entry(spec.name.clone()).or_default();
                    set.kind = Some(spec.kind);
                    if let Some(elems) = &spec.elements {
                        set.elems.clear();
                        set.ranges.clear();
                        for e in elems {
                            match (e, spec.kind.is_interval()) {
                                (Elem::Addr(a), false) => {
                                    set.elems.insert(Key::Addr(*a), None);
                                }
                                (Elem::Port(p), _) => {
                                    set.elems.insert(Key::Port(*p), None);
                                }
                                (Elem::AddrPort(a, p), _) => {
                                    set.elems.insert(Key::AddrPort(*a, *p), None);
                                }
                                (Elem::Addr(a), true) => {
                                    let v = crate::addr::ip_to_u128(*a);
                                    set.ranges.push((v, v));
                                }
                                (Elem::Range(_, s, e), _) => set.ranges.push((*s, *e)),
                                (Elem::Iface(i), _) => {
                                    set.elems.insert(Key::Iface(*i), None);
                                }
                            }
                        }
                    }
                }
                for c in plan.chains() {
                    let comments = plan.rules_of(c).map(|r| plan.comment_of(r)).collect();
                    self.chains
                        .insert(plan.names.chain(c), (c.table(), comments));
                }
            }
            Op::Put { set, key, comment } => {
                let s = self.set_mut(set)?;
                s.elems.insert(*key, Some(comment.clone()));
            }
            Op::Add { set, key, comment } => {
                let s = self.set_mut(set)?;
                if s.elems.contains_key(key) {
                    return Err(eexist(format!("add {key:?} to {}", set.name)));
                }
                s.elems.insert(*key, Some(comment.clone()));
            }
            Op::Del { set, key } => {
                let s = self.set_mut(set)?;
                if s.elems.remove(key).is_none() {
                    return Err(enoent(format!("remove {key:?} from {}", set.name)));
                }
            }
            Op::VethChain(veth) => {
                self.tables.entry(TableFamily::Netdev).or_insert(0);
                let comments = crate::plan::veth_rules()
                    .iter()
                    .map(|r| r.comment.to_string())
                    .collect();
                self.chains
                    .insert(veth.as_str().to_string(), (TableFamily::Netdev, comments));
            }
            Op::DeleteChain(_, name) => {
                if self.chains.remove(name).is_none() {
                    return Err(enoent(format!("delete chain {name}")));
                }
            }
            Op::DeleteSet(_, name) => {
                if self.sets.remove(name).is_none() {
                    return Err(enoent(format!("delete set {name}")));
                }
            }
            Op::DeleteTable(t) => {
                if self.tables.remove(t).is_none() {
                    return Err(enoent("delete table".into()));
                }
                self.sets
                    .retain(|_, s| s.kind.is_some_and(|k| k.table() != *t));
                self.chains.retain(|_, (ct, _)| ct != t);
            }
        }
        Ok(())
    }

    fn set_mut(&mut self, set: &SetRef) -> Result<&mut FakeSet> {
        if !self.tables.contains_key(&set.kind.table()) {
            return Err(enoent(format!("set {}: no table", set.name)));
        }
        self.sets
            .get_mut(&set.name)
            .ok_or_else(|| enoent(format!("set {} does not exist", set.name)))
    }
}

impl Kernel for Fake {
    fn pin_mac(&mut self, port: crate::plan::IfName, mac: [u8; 6], pin: bool) -> Result<()> {
        if pin {
            self.pinned.insert((port, mac));
        } else {
            self.pinned.remove(&(port, mac));
        }
        Ok(())
    }
    fn mac_pinned(&mut self, port: crate::plan::IfName, mac: [u8; 6]) -> Result<Option<bool>> {
        Ok(Some(self.pinned.contains(&(port, mac))))
    }
    fn link_exists(&mut self, name: &str) -> bool {
        self.links_asked.push(name.to_string());
        !self.gone_links.contains(name)
    }
    fn table_flags(&mut self, t: TableFamily) -> Result<Option<u32>> {
        Ok(self.tables.get(&t).copied())
    }
    fn set_names(&mut self, t: TableFamily) -> Result<Vec<String>> {
        Ok(self
            .sets
            .iter()
            .filter(|(_, s)| s.kind.is_some_and(|k| k.table() == t))
            .map(|(n, _)| n.clone())
            .collect())
    }
    fn chain_names(&mut self, t: TableFamily) -> Result<Vec<String>> {
        Ok(self
            .chains
            .iter()
            .filter(|(_, (ct, _))| *ct == t)
            .map(|(n, _)| n.clone())
            .collect())
    }
    fn rules(&mut self, t: TableFamily) -> Result<HashMap<String, Vec<RuleRead>>> {
        Ok(self
            .chains
            .iter()
            .filter(|(_, (ct, _))| *ct == t)
            .map(|(k, (_, v))| {
                let rules = v
                    .iter()
                    .map(|c| RuleRead {
                        comment: c.clone(),
                        packets: None,
                    })
                    .collect();
                (k.clone(), rules)
            })
            .collect())
    }
    fn get(&mut self, set: &SetRef, key: &Key) -> Result<Option<Stored>> {
        Ok(self
            .sets
            .get(&set.name)
            .and_then(|s| s.elems.get(key))
            .map(|c| Stored {
                key: *key,
                comment: c.clone(),
                packets: None,
            }))
    }
    fn dump(&mut self, set: &SetRef) -> Result<Vec<Stored>> {
        Ok(self
            .elems(&set.name)
            .into_iter()
            .map(|(key, comment)| Stored {
                key,
                comment,
                packets: None,
            })
            .collect())
    }
    fn dump_ranges(&mut self, set: &SetRef) -> Result<Vec<(u128, u128)>> {
        Ok(self
            .sets
            .get(&set.name)
            .map(|s| s.ranges.clone())
            .unwrap_or_default())
    }
    fn begin_read(&mut self) -> Result<()> {
        self.reads_begun += 1;
        self.read_at = Some(self.generation);
        Ok(())
    }
    fn read_generation(&self) -> Option<u32> {
        self.read_at
    }
    fn commit(&mut self, batch: &Batch) -> Result<()> {
        let read_at = self.read_at.take();
        if batch.ops.is_empty() {
            return Ok(());
        }
        self.commits.push(batch.clone());
        if self.stale_commits > 0 {
            self.stale_commits -= 1;
            if let Some(w) = self.other_writer {
                w(self);
            }
            self.generation += 1;
            return Err(Error::netlink("fake commit", libc::ERESTART));
        }
        if read_at.is_some_and(|g| g != self.generation) {
            return Err(Error::netlink("fake commit", libc::ERESTART));
        }
        if let Some(errno) = self.fail_next_commit.take() {
            return Err(Error::netlink("fake commit", errno));
        }
        let mut next = self.clone();
        for op in &batch.ops {
            next.apply(op)?;
        }
        *self = next;
        self.generation += 1;
        Ok(())
    }
    fn probe(&mut self) -> Result<()> {
        Ok(())
    }
    fn conntrack_entries(&mut self) -> Result<u64> {
        Ok(0)
    }
    fn flush_conntrack(
        &mut self,
        addrs: &[IpAddr],
        _path: Path,
        _scope: &Scope,
    ) -> Result<FlushReport> {
        self.flushed.push(addrs.to_vec());
        Ok(FlushReport {
            deleted: 0,
            walks: 0,
            path: "fake",
        })
    }
    fn flush_bypassed(
        &mut self,
        srcs: &[IpAddr],
        _dsts: &[IpAddr],
        _dports: &[u16],
        _proxies: &[(IpAddr, u16)],
        _path: Path,
        _scope: &crate::kernel::conntrack::Scope,
    ) -> Result<FlushReport> {
        self.flushed.push(srcs.to_vec());
        Ok(FlushReport {
            deleted: 0,
            walks: 0,
            path: "fake",
        })
    }
}
