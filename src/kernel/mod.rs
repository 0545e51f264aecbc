//! The kernel layer: everything natguard says to netfilter goes through here.
//!
//! - [`netlink`]: a small synchronous netfilter netlink socket (messages, attributes, replies).
//! - `lower`: the plan's objects lowered to nf_tables messages; the only reader of the plan's
//!   rules and sets, and the only place that knows the kernel's numbers for them.
//! - `nft`: one transaction per invocation, and the reads that CHECK, DEL, GC and `status` need.
//! - [`conntrack`]: ctnetlink deletes of a pod's flows.
//! - `link`: rtnetlink facts: an interface's bridge and ports, a veth's peer, the route to an
//!   address, whether an address is the node's own, every address of the namespace.
//! - `podside`: the pod's own interface, read from inside its network namespace.
//! - [`monitor`]: nf_tables change notifications, told apart by writer (`install --watch`).
//!
//! `lower` and `nft` are public only so root tests can check nfnetlink's reply semantics on
//! hand-built batches; the store above reaches all of it through the narrow [`Kernel`] trait: typed keys and
//! operations in, typed records out, no bytes. [`Netfilter`] is the real implementation; the
//! store's unit tests use a recording fake of the same trait, so the owner-list logic is tested
//! without root.

pub mod conntrack;
#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod link;
pub mod lower;
pub mod monitor;
pub mod netlink;
pub mod nft;
pub(crate) mod podside;

use crate::error::{Error, Result};
use crate::plan::{IfName, Key, SetKind, SharedPlan, TableFamily};
use conntrack::FlushReport;
use netlink::NfSocket;
use std::collections::HashMap;
use std::net::IpAddr;

/// A set of natguard's table: its name and its kind (which fixes the key's shape).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SetRef {
    pub name: String,
    pub kind: SetKind,
}

/// One element as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub key: Key,
    pub comment: Option<String>,
    /// Its counter, in a counted set on a kernel with set-element counters.
    pub packets: Option<u64>,
}

pub(crate) use nft::{RuleRead, NFT_TABLE_F_DORMANT};

/// One change of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Create the table and the network's chains and sets if missing, rewrite every rule and
    /// every shared set's contents; per-pod sets are created but never flushed.
    Converge(Box<SharedPlan>),
    /// Make sure `key` is in `set` carrying `comment`, replacing any earlier comment.
    Put {
        set: SetRef,
        key: Key,
        comment: String,
    },
    /// Add `key`, carrying `comment`, to `set`: an element known to be absent (read under the
    /// lock in this invocation). Unlike a replace, it leaves the kernel nothing to free.
    Add {
        set: SetRef,
        key: Key,
        comment: String,
    },
    /// Delete an element known to exist (read under the lock in this invocation).
    Del { set: SetRef, key: Key },
    /// Create (or rewrite whole) the ingress chain of an exempt pod's own veth in the netdev
    /// table, which gives the veth's frames [`crate::plan::EXEMPT_MARK`].
    VethChain(IfName),
    /// Delete a chain with its rules: an earlier version's, or a veth chain whose pod left.
    DeleteChain(TableFamily, String),
    /// Delete a set that nothing refers to any more (after its chains went).
    DeleteSet(TableFamily, String),
    /// Delete one of natguard's tables.
    DeleteTable(TableFamily),
}

/// The operations of one transaction, committed whole or not at all.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    pub ops: Vec<Op>,
}

impl Batch {
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }
    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

/// What the store needs from the kernel.
pub(crate) trait Kernel {
    /// The flags of natguard's table of family `t`; `None` when there is no such table.
    fn table_flags(&mut self, t: TableFamily) -> Result<Option<u32>>;
    fn set_names(&mut self, t: TableFamily) -> Result<Vec<String>>;
    fn chain_names(&mut self, t: TableFamily) -> Result<Vec<String>>;
    /// Every rule of natguard's table of family `t`, by chain, in order.
    fn rules(&mut self, t: TableFamily) -> Result<HashMap<String, Vec<RuleRead>>>;
    /// The rules of one chain of that table, in order; `None` when it has none (or there is no
    /// such chain).
    fn chain_rules(&mut self, t: TableFamily, chain: &str) -> Result<Option<Vec<RuleRead>>> {
        Ok(self.rules(t)?.remove(chain))
    }
    /// One element; `None` when it, its set or the table does not exist.
    fn get(&mut self, set: &SetRef, key: &Key) -> Result<Option<Stored>>;
    /// Every element of a non-interval set; empty when the set does not exist.
    fn dump(&mut self, set: &SetRef) -> Result<Vec<Stored>>;
    /// The ranges of an interval set; empty when the set does not exist.
    fn dump_ranges(&mut self, set: &SetRef) -> Result<Vec<(u128, u128)>>;
    /// Starts a read-modify-write: notes the nf_tables generation, so that the next `commit`
    /// lands only if no writer committed since (else it fails with `ERESTART`,
    /// [`is_stale`]). Call it before the first read the batch is built from.
    fn begin_read(&mut self) -> Result<()>;
    /// The generation the last [`Kernel::begin_read`] noted, until the commit uses it up.
    fn read_generation(&self) -> Option<u32>;
    /// Commits a batch whole or not at all. An empty batch sends nothing. After
    /// [`Kernel::begin_read`], the batch carries the generation read there (once: the commit
    /// uses it up).
    fn commit(&mut self, batch: &Batch) -> Result<()>;
    /// Pins `mac` to bridge port `port` (`pin`), the bridge's static, sticky forwarding entry,
    /// or removes that pin. Nothing to do where the port does not exist.
    fn pin_mac(&mut self, port: IfName, mac: [u8; 6], pin: bool) -> Result<()>;
    /// Whether `mac` is pinned to `port`; `None` when the port does not exist.
    fn mac_pinned(&mut self, port: IfName, mac: [u8; 6]) -> Result<Option<bool>>;
    /// Whether interface `name` exists in the namespace. When the kernel cannot be asked, it
    /// is taken to exist: what is then built for it is refused by the kernel if it does not.
    fn link_exists(&mut self, name: &str) -> bool;
    /// Whether nf_tables and ctnetlink answer.
    fn probe(&mut self) -> Result<()>;
    /// The conntrack entries of the namespace (no walk).
    fn conntrack_entries(&mut self) -> Result<u64>;
    /// Deletes the conntrack entries of `addrs` (original or reply source) that `scope`
    /// deletes.
    fn flush_conntrack(
        &mut self,
        addrs: &[IpAddr],
        path: conntrack::Path,
        scope: &conntrack::Scope,
    ) -> Result<FlushReport>;
    /// Deletes the TCP flows from `srcs` to `dsts`:`dports` that were not destination-NATed
    /// to one of `proxies` ([`conntrack::flush_bypassed_flows`]).
    fn flush_bypassed(
        &mut self,
        srcs: &[IpAddr],
        dsts: &[IpAddr],
        dports: &[u16],
        proxies: &[(IpAddr, u16)],
        path: conntrack::Path,
        scope: &conntrack::Scope,
    ) -> Result<FlushReport>;
}

/// Runs `f` on a thread of its own in a new network namespace, which dies with the thread;
/// `None` when the thread or the namespace cannot be had.
pub(crate) fn in_throwaway_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // SAFETY: unshare affects only this thread's network namespace, which dies with it.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return None;
            }
            Some(f())
        })
        .ok()
        .and_then(|h| h.join().ok())
        .flatten()
}

/// The real kernel, over one netfilter netlink socket of the calling thread's namespace.
pub(crate) struct Netfilter {
    sock: NfSocket,
    /// Give counted sets per-element counters; off once the kernel refused them.
    set_counters: bool,
    /// The generation read by `begin_read`, for the next commit.
    generation: Option<u32>,
    /// The rtnetlink socket of the same namespace, opened when first needed (an exempt pod's
    /// veth and MAC pin): most verbs never need it.
    links: Option<link::Links>,
}

impl Netfilter {
    pub fn open() -> Result<Self> {
        Ok(Netfilter {
            sock: NfSocket::open()?,
            set_counters: true,
            generation: None,
            links: None,
        })
    }

    fn links(&mut self) -> Result<&mut link::Links> {
        match &mut self.links {
            Some(l) => Ok(l),
            slot => Ok(slot.insert(link::Links::open()?)),
        }
    }

    fn commit_once(
        &mut self,
        batch: &Batch,
        generation: Option<u32>,
    ) -> std::result::Result<(), nft::Refused> {
        let mut tx = nft::Tx::new(&mut self.sock, generation);
        for op in &batch.ops {
            match op {
                Op::Converge(plan) => tx.converge_shared(plan, self.set_counters),
                Op::Put { set, key, comment } => tx.ensure_elem(
                    set.kind.table(),
                    &set.name,
                    lower::key_bytes(key),
                    comment.clone(),
                    &describe(key),
                ),
                Op::Add { set, key, comment } => tx.add_elem(
                    set.kind.table(),
                    &set.name,
                    lower::key_bytes(key),
                    comment.clone(),
                    &describe(key),
                ),
                Op::Del { set, key } => tx.delete_elem(
                    set.kind.table(),
                    &set.name,
                    lower::key_bytes(key),
                    &describe(key),
                ),
                Op::VethChain(veth) => tx.veth_chain(veth.as_str()),
                Op::DeleteChain(t, name) => tx.delete_chain(*t, name),
                Op::DeleteSet(t, name) => tx.delete_set(*t, name),
                Op::DeleteTable(t) => tx.delete_table(*t),
            }
        }
        tx.commit_checked(&mut self.sock)
    }
}

/// Whether a commit was refused because another writer committed after its
/// [`Kernel::begin_read`]: nothing of it was applied, and it must be read and built again.
pub(crate) fn is_stale(e: &Error) -> bool {
    nft::is_stale(e)
}

/// Errors that mean "nf_tables is not there at all", so there is nothing of natguard's to
/// remove either.
pub(crate) fn is_unavailable(e: &Error) -> bool {
    nft::is_unavailable(e)
}

impl Kernel for Netfilter {
    fn table_flags(&mut self, t: TableFamily) -> Result<Option<u32>> {
        nft::table_flags(&mut self.sock, t)
    }
    fn set_names(&mut self, t: TableFamily) -> Result<Vec<String>> {
        nft::set_names(&mut self.sock, t)
    }
    fn chain_names(&mut self, t: TableFamily) -> Result<Vec<String>> {
        nft::chain_names(&mut self.sock, t)
    }
    fn rules(&mut self, t: TableFamily) -> Result<HashMap<String, Vec<RuleRead>>> {
        nft::rules_by_chain(&mut self.sock, t, None)
    }
    fn chain_rules(&mut self, t: TableFamily, chain: &str) -> Result<Option<Vec<RuleRead>>> {
        Ok(nft::rules_by_chain(&mut self.sock, t, Some(chain))?.remove(chain))
    }
    fn get(&mut self, set: &SetRef, key: &Key) -> Result<Option<Stored>> {
        let t = set.kind.table();
        let found = nft::get_element(&mut self.sock, t, &set.name, &lower::key_bytes(key))?;
        Ok(found.and_then(|e| stored(set.kind, e)))
    }
    fn dump(&mut self, set: &SetRef) -> Result<Vec<Stored>> {
        Ok(nft::dump_set(&mut self.sock, set.kind.table(), &set.name)?
            .into_iter()
            .filter_map(|e| stored(set.kind, e))
            .collect())
    }
    fn dump_ranges(&mut self, set: &SetRef) -> Result<Vec<(u128, u128)>> {
        Ok(nft::ranges_of(&nft::dump_set(
            &mut self.sock,
            set.kind.table(),
            &set.name,
        )?))
    }
    fn begin_read(&mut self) -> Result<()> {
        self.generation = Some(nft::generation(&mut self.sock)?);
        Ok(())
    }
    fn read_generation(&self) -> Option<u32> {
        self.generation
    }
    fn commit(&mut self, batch: &Batch) -> Result<()> {
        let generation = self.generation.take();
        if batch.ops.is_empty() {
            return Ok(());
        }
        #[cfg(debug_assertions)]
        if generation.is_some() {
            test_hooks::pause_before_commit();
        }
        // A refused batch changed nothing, so the fallback is still built from that generation.
        match self.commit_once(batch, generation) {
            Err(r) if self.set_counters && r.means_no_set_counters() => {
                crate::warn!(
                    "the kernel cannot give set {} element counters ({}); per-pod counters are unavailable, per-network counters still count",
                    r.counted_set.as_deref().unwrap_or(""),
                    r.error
                );
                self.set_counters = false;
                self.commit_once(batch, generation).map_err(|r| r.error)
            }
            r => r.map_err(|r| r.error),
        }
    }
    fn pin_mac(&mut self, port: IfName, mac: [u8; 6], pin: bool) -> Result<()> {
        let links = self.links()?;
        if pin {
            links.pin_mac(port.as_str(), mac).map(|_| ())
        } else {
            links.unpin_mac(port.as_str(), mac)
        }
    }
    fn mac_pinned(&mut self, port: IfName, mac: [u8; 6]) -> Result<Option<bool>> {
        self.links()?.mac_pinned(port.as_str(), mac)
    }
    fn link_exists(&mut self, name: &str) -> bool {
        match self.links().and_then(|l| l.link(name)) {
            Ok(found) => found.is_some(),
            Err(_) => true,
        }
    }
    fn probe(&mut self) -> Result<()> {
        nft::probe(&mut self.sock)
            .map_err(|e| Error::NotReady(format!("nf_tables is not usable: {e}")))?;
        conntrack::probe_on(&mut self.sock)
            .map_err(|e| Error::NotReady(format!("conntrack netlink is not usable: {e}")))
    }
    fn conntrack_entries(&mut self) -> Result<u64> {
        conntrack::count_entries_on(&mut self.sock)
    }
    fn flush_conntrack(
        &mut self,
        addrs: &[IpAddr],
        path: conntrack::Path,
        scope: &conntrack::Scope,
    ) -> Result<FlushReport> {
        conntrack::flush_scoped_on(&mut self.sock, addrs, path, scope)
    }
    fn flush_bypassed(
        &mut self,
        srcs: &[IpAddr],
        dsts: &[IpAddr],
        dports: &[u16],
        proxies: &[(IpAddr, u16)],
        path: conntrack::Path,
        scope: &conntrack::Scope,
    ) -> Result<FlushReport> {
        conntrack::flush_bypassed_flows_with(
            &mut self.sock,
            srcs,
            dsts,
            dports,
            proxies,
            path,
            scope,
        )
    }
}

/// Hooks for root tests, compiled into debug builds only.
#[cfg(debug_assertions)]
pub mod test_hooks {
    use std::path::PathBuf;
    use std::sync::Mutex;

    static PAUSE: Mutex<Option<PathBuf>> = Mutex::new(None);

    /// Makes the first commit that carries a generation pause after its reads: it creates
    /// `PATH.read`, then waits (at most 10 s) until `PATH.go` exists, so a test can commit as
    /// another writer in between. `main` sets it from `NATGUARD_TEST_PAUSE_BEFORE_COMMIT`.
    pub fn set_pause_before_commit(path: PathBuf) {
        *PAUSE.lock().unwrap_or_else(|e| e.into_inner()) = Some(path);
    }

    pub(crate) fn pause_before_commit() {
        let Some(p) = PAUSE.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let with = |ext: &str| {
            let mut s = p.clone().into_os_string();
            s.push(ext);
            PathBuf::from(s)
        };
        let _ = std::fs::write(with(".read"), b"");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !with(".go").exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

fn describe(key: &Key) -> String {
    crate::plan::render_key(key)
}

/// An element read back, with its key decoded for the set's kind; `None` for a key of another
/// shape (not natguard's).
fn stored(kind: SetKind, e: nft::ElemRead) -> Option<Stored> {
    Some(Stored {
        key: lower::key_of(kind, &e.key)?,
        comment: e.comment,
        packets: e.packets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::NodeFacts;

    fn converge() -> Op {
        let facts = NodeFacts {
            proxy_v4: None,
            proxy_v6: None,
        };
        Op::Converge(Box::new(crate::plan::plan_shared(
            "net1",
            &crate::config::Config::default(),
            &facts,
        )))
    }

    /// Only `EOPNOTSUPP` in answer to a NEWSET that declares element counters means "no set
    /// counters on this kernel"; `EINVAL` there (a malformed attribute), or any error on
    /// another message (a refused element, a missing table, a busy kernel), is not.
    #[test]
    fn only_eopnotsupp_on_a_counted_newset_means_no_set_counters() {
        let refused = |errno: i32, counted: bool| nft::Refused {
            error: Error::netlink("commit", errno),
            counted_set: counted.then(|| "net1-cntp4".to_string()),
        };
        assert!(refused(libc::EOPNOTSUPP, true).means_no_set_counters());
        for errno in [
            libc::EINVAL,
            libc::ENOENT,
            libc::EBUSY,
            libc::ENOBUFS,
            libc::EPERM,
        ] {
            assert!(
                !refused(errno, true).means_no_set_counters(),
                "errno {errno}"
            );
        }
        for errno in [libc::EOPNOTSUPP, libc::EINVAL] {
            assert!(
                !refused(errno, false).means_no_set_counters(),
                "errno {errno}"
            );
        }
        let decode = nft::Refused {
            error: Error::Protocol("short reply".into()),
            counted_set: Some("net1-cntp4".into()),
        };
        assert!(!decode.means_no_set_counters());
    }

    /// The converge batch knows which of its messages are the NEWSETs that declare element
    /// counters, so a refusal is matched to its message by sequence number: exactly the
    /// counted sets, and none when counters are off.
    #[test]
    fn the_converge_batch_marks_the_newsets_that_carry_counters() {
        let Op::Converge(plan) = converge() else {
            unreachable!()
        };
        let counted = plan.sets.iter().filter(|s| s.kind.is_counted()).count();
        assert!(counted >= 2, "{counted}");
        let mut tx = nft::Tx::for_test();
        tx.converge_shared(&plan, true);
        assert_eq!(tx.counted_set_seqs().len(), counted);
        let mut tx = nft::Tx::for_test();
        tx.converge_shared(&plan, false);
        assert!(tx.counted_set_seqs().is_empty());
    }
}
