//! The elements one read-modify-write touches: read from the kernel once (under the lock),
//! changed in memory, then emitted as the smallest batch that turns what was read into what
//! is wanted. Every rule of the store (owner lists, pruning, counting) works on this view, so
//! a change made early in a verb is seen by everything after it, and an element changed twice
//! is written once.
//!
//! The node lock keeps natguard's own invocations apart, but other programs write nf_tables
//! too (kube-proxy in nftables mode, firewalld, Calico, `nft`). So a read-modify-write starts
//! by noting the nf_tables generation ([`Kernel::begin_read`]) and its batch carries it: if
//! anyone committed between the read and the commit, the kernel refuses the batch whole
//! (`ERESTART`) and [`Store::read_modify_write`] reads and builds it again, at most
//! [`STALE_RETRIES`] times and within [`STALE_DEADLINE`], then fails with code 11.

use super::Store;
use crate::error::{Error, Result};
use crate::kernel::{is_stale, Batch, Kernel, Op, SetRef};
use crate::plan::Key;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How many times a read-modify-write is read and built again after another writer committed
/// between its read and its commit.
pub(crate) const STALE_RETRIES: usize = 8;

/// How long after its first read a read-modify-write may still start again: well inside the
/// node lock's wait, so a verb stays bounded by a few seconds however busy the other writers.
pub(crate) const STALE_DEADLINE: Duration = Duration::from_secs(3);

impl<K: Kernel> Store<K> {
    /// Runs `once` (reads, then one commit) as a read-modify-write bound to the nf_tables
    /// generation it read; when another writer committed in between, runs it again from a
    /// fresh read. `once` must be safe to repeat: it rebuilds its batch from what it reads.
    pub(super) fn read_modify_write<T>(
        &mut self,
        what: &str,
        mut once: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut restarts = 0;
        loop {
            self.k.begin_read()?;
            match once(self) {
                Err(e) if is_stale(&e) => {
                    restarts += 1;
                    if restarts > STALE_RETRIES || start.elapsed() >= STALE_DEADLINE {
                        return Err(Error::TryAgain(format!(
                            "{what}: another nf_tables writer committed between natguard's read and its commit {restarts} times in a row (within {:.1} s); nothing was applied: {e}",
                            start.elapsed().as_secs_f32()
                        )));
                    }
                    crate::info!(
                        "{what}: another nf_tables writer committed between natguard's read and its commit; reading again (restart {restarts} of at most {STALE_RETRIES})"
                    );
                    crate::kernel::netlink::backoff(restarts.min(3));
                }
                r => return r,
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Slot {
    /// The comment as read (`None`: no such element).
    before: Option<String>,
    /// The comment as it will be.
    after: Option<String>,
}

pub(crate) struct View<'k, K: Kernel> {
    pub k: &'k mut K,
    slots: HashMap<(SetRef, Key), Slot>,
    /// First-touch order, so batches are deterministic.
    order: Vec<(SetRef, Key)>,
    /// Sets the batch deletes and creates again: empty whatever the kernel holds now.
    emptied: HashSet<String>,
}

impl<'k, K: Kernel> View<'k, K> {
    pub fn new(k: &'k mut K) -> Self {
        View {
            k,
            slots: HashMap::new(),
            order: Vec::new(),
            emptied: HashSet::new(),
        }
    }

    /// The view of a batch that deletes `sets` and creates them again before any element of
    /// theirs is written: they are read as empty.
    pub fn emptied(mut self, sets: Vec<String>) -> Self {
        self.emptied.extend(sets);
        self
    }

    /// Loads every element of `set` with one dump (GC reads whole sets).
    pub fn preload(&mut self, set: &SetRef) -> Result<Vec<Key>> {
        let mut keys = Vec::new();
        let found = if self.emptied.contains(&set.name) {
            Vec::new()
        } else {
            self.k.dump(set)?
        };
        for e in found {
            let id = (set.clone(), e.key);
            if !self.slots.contains_key(&id) {
                self.order.push(id.clone());
                self.slots.insert(
                    id,
                    Slot {
                        before: Some(e.comment.clone().unwrap_or_default()),
                        after: Some(e.comment.unwrap_or_default()),
                    },
                );
            }
            keys.push(e.key);
        }
        Ok(keys)
    }

    /// The element's comment as it stands in this view; `None` when it does not exist.
    pub fn get(&mut self, set: &SetRef, key: &Key) -> Result<Option<String>> {
        let id = (set.clone(), *key);
        if let Some(s) = self.slots.get(&id) {
            return Ok(s.after.clone());
        }
        let now = if self.emptied.contains(&set.name) {
            None
        } else {
            self.k.get(set, key)?.map(|e| e.comment.unwrap_or_default())
        };
        self.order.push(id.clone());
        self.slots.insert(
            id,
            Slot {
                before: now.clone(),
                after: now.clone(),
            },
        );
        Ok(now)
    }

    /// Sets the element's comment (`None`: the element is to be deleted).
    pub fn set(&mut self, set: &SetRef, key: &Key, comment: Option<String>) -> Result<()> {
        self.get(set, key)?;
        if let Some(s) = self.slots.get_mut(&(set.clone(), *key)) {
            s.after = comment;
        }
        Ok(())
    }

    /// Whether this view changes an element of `set`.
    pub fn changes(&self, set: &SetRef) -> bool {
        self.slots
            .iter()
            .any(|((s, _), slot)| s == set && slot.before != slot.after)
    }

    /// The keys of `set` this view holds an element for.
    pub fn keys_in(&self, set: &SetRef) -> Vec<Key> {
        self.order
            .iter()
            .filter(|(s, k)| s == set && self.slots[&(s.clone(), *k)].after.is_some())
            .map(|(_, k)| *k)
            .collect()
    }

    /// Appends what turns the elements as read into the elements as wanted.
    pub fn emit(self, batch: &mut Batch) {
        for id in self.order {
            let slot = &self.slots[&id];
            if slot.before == slot.after {
                continue;
            }
            let (set, key) = id;
            // An element read as absent is added, not replaced: a replace deletes, and a
            // deletion leaves the kernel work that other sockets' releases wait for.
            match (&slot.before, &slot.after) {
                (None, Some(comment)) => batch.push(Op::Add {
                    set,
                    key,
                    comment: comment.clone(),
                }),
                (Some(_), Some(comment)) => batch.push(Op::Put {
                    set,
                    key,
                    comment: comment.clone(),
                }),
                (_, None) => batch.push(Op::Del { set, key }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Locking;
    use super::*;
    use crate::config::Config;
    use crate::kernel::fake::Fake;
    use crate::plan::{self, ChainKind, NodeFacts, PodRef, SetKind};

    fn plans(cid: &str, addr: &str) -> (plan::SharedPlan, plan::PodPlan) {
        let cfg = Config::default();
        let facts = NodeFacts {
            proxy_v4: Some("10.0.0.1".parse().unwrap()),
            proxy_v6: None,
        };
        let r = PodRef {
            network: "net1",
            container_id: cid,
            ifname: "eth0",
            namespace: Some("default"),
            pod_name: Some(cid),
            netns: "/run/netns/live",
            annotations: Default::default(),
            host: None,
        };
        (
            plan::plan_shared("net1", &cfg, &facts),
            plan::plan_pod(&cfg, &r, &[addr.parse().unwrap()]),
        )
    }

    fn store() -> Store<Fake> {
        Store::new(Fake::default(), Locking::Unlocked).with_netns_check(|_| true)
    }

    /// Someone flushed natguard's chains between the read and the commit.
    fn flush_chains(k: &mut Fake) {
        for (_, rules) in k.chains.values_mut() {
            rules.clear();
        }
    }

    #[test]
    fn a_stale_commit_is_read_and_built_again_from_what_the_other_writer_left() {
        let (sh, a) = plans("a", "10.1.0.5");
        let (_, b) = plans("b", "10.1.0.6");
        let mut s = store();
        s.apply_pod(&sh, &a).unwrap();
        s.kernel().commits.clear();
        s.kernel().reads_begun = 0;
        // B's read finds the shared objects current, so its first batch holds elements only;
        // the flush in between makes it stale, and the second read converges again.
        s.kernel().stale_commits = 1;
        s.kernel().other_writer = Some(flush_chains);
        s.apply_pod(&sh, &b).unwrap();
        let k = s.kernel();
        assert_eq!(k.reads_begun, 2);
        assert_eq!(k.commits.len(), 2);
        let converges = |b: &Batch| b.ops.iter().any(|o| matches!(o, Op::Converge(_)));
        assert!(!converges(&k.commits[0]), "{:?}", k.commits[0]);
        assert!(converges(&k.commits[1]), "{:?}", k.commits[1]);
        let dnat = sh.names.chain(ChainKind::Dnat);
        assert!(!k.chains[&dnat].1.is_empty(), "the flushed rules are back");
        let masq = sh.names.set(SetKind::Masq(plan::Family::V4));
        assert_eq!(k.elems(&masq).len(), 2, "both pods: {:?}", k.elems(&masq));
    }

    #[test]
    fn a_commit_that_stays_stale_fails_with_code_11_after_bounded_restarts() {
        let (sh, a) = plans("a", "10.1.0.5");
        let mut s = store();
        s.kernel().stale_commits = usize::MAX;
        let e = s.apply_pod(&sh, &a).unwrap_err();
        assert_eq!(e.code(), crate::error::code::TRY_AGAIN, "{e}");
        assert!(e.to_string().contains("another nf_tables writer"), "{e}");
        assert_eq!(s.kernel().commits.len(), STALE_RETRIES + 1);
        assert_eq!(s.kernel().reads_begun, STALE_RETRIES + 1);
        assert!(s.kernel().tables.is_empty(), "nothing was applied");
        // DEL and GC restart the same way.
        let mut s = store();
        s.apply_pod(&sh, &a).unwrap();
        s.kernel().stale_commits = 1;
        let mut addrs = vec!["10.1.0.5".parse().unwrap()];
        assert!(s.remove_pod(&sh.names, a.owner, &mut addrs).unwrap() > 0);
        assert_eq!(
            addrs.len(),
            1,
            "addresses are not collected twice: {addrs:?}"
        );
        assert_eq!(s.kernel().stale_commits, 0);
        assert!(s
            .kernel()
            .elems(&sh.names.set(SetKind::Masq(plan::Family::V4)))
            .is_empty());
    }
}
