//! Which networks' shared objects were last found intact, and at which nf_tables generation.
//!
//! An ADD must not install a pod over shared objects someone else rewrote, so it compares them
//! with its plan before it writes ([`super::Store::check_shared`]): every rule, set and
//! declared element of the network and of the node-wide guard, some thirty netlink dumps under
//! the node lock. In a burst of pod starts those comparisons are most of what the lock
//! serialises, and they compare what the previous ADD has just found intact.
//!
//! nf_tables says whether anything changed since: its generation moves on with every commit of
//! every writer (nft, iptables-nft, kube-proxy, natguard), exactly once per commit. A batch that
//! carries generation `G` (`NFNL_BATCH_GENID`) is applied only if the namespace is still at
//! `G`, and leaves it at `G + 1`. So when an ADD found the shared objects intact at `G` and
//! committed only element changes, they are still intact at `G + 1`, and the next verb that
//! reads `G + 1` may skip the comparison: nothing else can have written in between. Any other
//! writer's commit moves the generation past what is recorded, and the full comparison runs
//! again; so does a commit that converged a network (the node-wide union sets it rewrote are
//! part of other networks' plans).
//!
//! The record is a small file next to the node lock, read and written only under it, and
//! replaced by rename so a crash leaves the old record or the new one. It names the network
//! namespace (device and inode of `/proc/self/ns/net`), because generations of different
//! namespaces are unrelated, and each network's plan fingerprints, so a changed configuration
//! is compared in full. A missing, unreadable or foreign record means "compare"; a record
//! never holds more than the networks that are configured on the node.

use std::fmt::Write as _;
use std::path::PathBuf;

/// The record's file, next to the node lock.
pub const FILE: &str = crate::lock::VERIFIED_FILE;

/// One network whose shared objects matched its plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub network: String,
    pub fingerprint: String,
    pub node_fingerprint: String,
}

/// The record: at `generation` of the namespace `netns`, these networks were intact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub netns: (u64, u64),
    pub generation: u32,
    pub entries: Vec<Entry>,
}

/// The generation a successful commit of a batch carrying `g` leaves the namespace at
/// (nf_tables skips 0 when it wraps).
pub(crate) fn after_commit(g: u32) -> u32 {
    match g.wrapping_add(1) {
        0 => 1,
        n => n,
    }
}

impl Record {
    fn encode(&self) -> String {
        let mut s = format!(
            "natguard-verified 1 {} {} {}\n",
            self.netns.0, self.netns.1, self.generation
        );
        for e in &self.entries {
            let _ = writeln!(s, "{} {} {}", e.network, e.fingerprint, e.node_fingerprint);
        }
        s
    }

    fn decode(text: &str) -> Option<Record> {
        let mut lines = text.lines();
        let mut head = lines.next()?.split(' ');
        if head.next()? != "natguard-verified" || head.next()? != "1" {
            return None;
        }
        let netns = (head.next()?.parse().ok()?, head.next()?.parse().ok()?);
        let generation = head.next()?.parse().ok()?;
        if head.next().is_some() {
            return None;
        }
        let mut entries = Vec::new();
        for l in lines {
            let mut f = l.split(' ');
            let (network, fingerprint, node_fingerprint) = (f.next()?, f.next()?, f.next()?);
            if f.next().is_some() || network.is_empty() {
                return None;
            }
            entries.push(Entry {
                network: network.into(),
                fingerprint: fingerprint.into(),
                node_fingerprint: node_fingerprint.into(),
            });
        }
        Some(Record {
            netns,
            generation,
            entries,
        })
    }

    /// Whether `e` was intact at `generation` of `netns`.
    pub fn holds(&self, netns: (u64, u64), generation: u32, e: &Entry) -> bool {
        self.netns == netns && self.generation == generation && self.entries.contains(e)
    }
}

/// Where the record lives; `None` in unit tests of the store, which never skip the comparison
/// unless they give a directory.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cache {
    dir: Option<PathBuf>,
    /// The calling thread's network namespace (device, inode).
    netns: Option<(u64, u64)>,
}

impl Cache {
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        let netns = crate::node::netns_id();
        Cache {
            dir: netns.map(|_| dir.into()),
            netns,
        }
    }

    /// Whether `e` was recorded intact at generation `g` of this namespace.
    #[cfg(test)]
    pub fn holds(&self, g: u32, e: &Entry) -> bool {
        self.holds_in(self.read().as_ref(), g, e)
    }

    /// [`Cache::holds`] in a record the caller has read ([`Cache::read`]), so that an ADD
    /// reads the file once for its check and its [`Cache::after_from`].
    pub fn holds_in(&self, r: Option<&Record>, g: u32, e: &Entry) -> bool {
        matches!((self.netns, r), (Some(ns), Some(r)) if r.holds(ns, g, e))
    }

    /// Records the generation a commit read at `read` left the namespace at (`changed`: the
    /// batch was not empty). `intact`: the network found intact before the commit, if any;
    /// `keep`: whether the record's other networks still hold (the batch changed only
    /// elements), which needs the record to be of `read` itself.
    pub fn after(&self, read: u32, changed: bool, intact: Option<Entry>, keep: bool) {
        self.after_from(self.read(), read, changed, intact, keep);
    }

    /// [`Cache::after`] from the record `prior` the caller read under the same lock, before
    /// its commit (nothing else writes the file meanwhile).
    pub fn after_from(
        &self,
        prior: Option<Record>,
        read: u32,
        changed: bool,
        intact: Option<Entry>,
        keep: bool,
    ) {
        let Some(netns) = self.netns else { return };
        let mut entries = match prior {
            Some(r) if keep && r.netns == netns && r.generation == read => r.entries,
            _ => Vec::new(),
        };
        if let Some(e) = intact {
            entries.retain(|x| x.network != e.network);
            entries.push(e);
        }
        if entries.is_empty() {
            return self.clear();
        }
        self.write(&Record {
            netns,
            generation: if changed { after_commit(read) } else { read },
            entries,
        });
    }

    pub fn read(&self) -> Option<Record> {
        let dir = self.dir.as_ref()?;
        let text = std::fs::read_to_string(dir.join(FILE)).ok()?;
        Record::decode(&text)
    }

    /// Replaces the record; a failure only means the next verb compares in full.
    pub fn write(&self, r: &Record) {
        let Some(dir) = &self.dir else { return };
        // One name for every writer: they write only under the node lock, so a crash leaves
        // at most this one file behind, which the next write replaces.
        let tmp = dir.join(format!(".{FILE}.tmp"));
        let how = crate::fsutil::How::mode(0o644);
        if let Err(e) = crate::fsutil::replace(&dir.join(FILE), &tmp, r.encode().as_bytes(), how) {
            crate::debug!("could not record the verified generation: {e}");
        }
    }

    /// Forgets the record (after a commit whose outcome is not known).
    pub fn clear(&self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_file(dir.join(FILE));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: &str) -> Entry {
        Entry {
            network: n.into(),
            fingerprint: "00112233aabbccdd".into(),
            node_fingerprint: "ffee".into(),
        }
    }

    #[test]
    fn a_record_round_trips_and_holds_only_for_its_namespace_and_generation() {
        let r = Record {
            netns: (4, 4026531840),
            generation: 77,
            entries: vec![entry("a"), entry("b")],
        };
        let back = Record::decode(&r.encode()).unwrap();
        assert_eq!(back, r);
        assert!(back.holds((4, 4026531840), 77, &entry("b")));
        assert!(!back.holds((4, 4026531840), 78, &entry("b")));
        assert!(!back.holds((4, 1), 77, &entry("b")));
        assert!(!back.holds((4, 4026531840), 77, &entry("c")));
        let mut other_fp = entry("a");
        other_fp.fingerprint = "0".into();
        assert!(!back.holds((4, 4026531840), 77, &other_fp));
    }

    #[test]
    fn torn_or_foreign_records_are_not_trusted() {
        let good = Record {
            netns: (1, 2),
            generation: 3,
            entries: vec![entry("a")],
        }
        .encode();
        for bad in [
            "",
            "natguard-verified 2 1 2 3\n",
            "natguard-verified 1 1 2\n",
            "natguard-verified 1 1 2 3 4\n",
            "natguard-verified 1 1 2 3\na b\n",
            "natguard-verified 1 1 2 3\na b c d\n",
            "something else\n",
        ] {
            assert_eq!(Record::decode(bad), None, "{bad:?}");
        }
        assert!(Record::decode(&good).is_some());
    }

    #[test]
    fn a_record_read_once_serves_the_check_and_the_update_alike() {
        let dir = std::env::temp_dir().join(format!("ng-verified-once-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Cache::at(&dir);
        c.after(9, true, Some(entry("a")), true);
        let prior = c.read();
        assert!(c.holds_in(prior.as_ref(), 10, &entry("a")));
        assert!(!c.holds_in(prior.as_ref(), 11, &entry("a")));
        assert!(!c.holds_in(None, 10, &entry("a")));
        // b's ADD read the record at 10 and committed elements: a is carried, b added.
        c.after_from(prior, 10, true, Some(entry("b")), true);
        assert!(c.holds(11, &entry("a")) && c.holds(11, &entry("b")));
        // A prior of another generation carries nothing forward.
        let stale = c.read();
        c.after_from(stale, 30, true, Some(entry("c")), true);
        assert!(c.holds(31, &entry("c")) && !c.holds(31, &entry("a")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_generation_after_a_commit_skips_zero() {
        assert_eq!(after_commit(5), 6);
        assert_eq!(after_commit(u32::MAX), 1);
    }

    #[test]
    fn the_file_is_replaced_whole_and_forgotten_on_clear() {
        let dir = std::env::temp_dir().join(format!("ng-verified-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Cache::at(&dir);
        assert_eq!(c.read(), None);
        assert!(!c.holds(9, &entry("a")));
        // An ADD of network a found it intact at 9 and committed: intact at 10.
        c.after(9, true, Some(entry("a")), true);
        assert!(c.holds(10, &entry("a")) && !c.holds(9, &entry("a")));
        // b's ADD at 10, elements only: a is kept, b added, both at 11.
        c.after(10, true, Some(entry("b")), true);
        assert!(c.holds(11, &entry("a")) && c.holds(11, &entry("b")));
        // A DEL read at 11 with nothing to change: still 11.
        c.after(11, false, None, true);
        assert!(c.holds(11, &entry("a")));
        // A converge of b: the others are dropped.
        c.after(11, true, Some(entry("b")), false);
        assert!(c.holds(12, &entry("b")) && !c.holds(12, &entry("a")));
        // A record of another generation is not carried forward by a commit read elsewhere.
        c.after(40, true, Some(entry("a")), true);
        assert!(c.holds(41, &entry("a")) && !c.holds(41, &entry("b")));
        // Nothing found intact and nothing kept: forgotten.
        c.after(7, true, None, true);
        assert_eq!(c.read(), None);
        let r = Record {
            netns: (1, 2),
            generation: 9,
            entries: vec![entry("a")],
        };
        c.write(&r);
        assert_eq!(c.read(), Some(r));
        assert!(!c.holds(9, &entry("a")), "another namespace's record");
        c.clear();
        assert_eq!(c.read(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
