//! natguard's record of the attachments whose DEL it has run, for as long as the runtime's
//! cache entry of them is still there: what keeps a deleted pod deleted.
//!
//! libcni runs a list's DEL in reverse order (natguard first, then the primary plugin) and
//! removes the attachment's cache entry only after the last one. Adopt, reconcile and the
//! watcher's self-repair restore pods from that cache, so in the gap (a slow primary, a DEL
//! that failed and will be retried) a flush or a ConfigMap change would reinstall a pod that
//! natguard has already removed. So DEL first writes a tombstone, an empty file named by the
//! attachment's owner key (network, container ID, ifname) in `deleted/` beside the node lock,
//! before it removes the pod's entries; whoever restores from the cache skips the attachments
//! that have one, and a restore that was planned before the tombstone appeared takes back what
//! it installed (see [`crate::restore::repair`]). An ADD of the same attachment removes it.
//!
//! The record is bounded by the cache, not by history: a tombstone is written only while the
//! runtime's cache entry exists (libcni's default cache, `/var/lib/cni/results`, which
//! containerd, CRI-O and podman use), every DEL removes the tombstones whose entry is gone,
//! and every restore removes those whose attachment has no entry in its cache ([`prune`]);
//! the directory goes with its last tombstone.
//! It lives under `/run`, so a reboot (which also empties the runtime's state) forgets it.
//! A tombstone that cannot be written (a read-only `/run/natguard`) is logged, and DEL goes on.

use crate::plan::OwnerKey;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The directory of tombstones, beside the node lock.
pub fn dir() -> PathBuf {
    crate::lock::run_dir().join("deleted")
}

/// libcni's cache entry of an attachment in the runtimes' default cache:
/// `<cache>/<network>-<container ID>-<ifname>`.
fn cache_entry(network: &str, container_id: &str, ifname: &str) -> PathBuf {
    Path::new(crate::cni::DEFAULT_CACHE_DIR).join(format!("{network}-{container_id}-{ifname}"))
}

/// Records that natguard's DEL runs for `owner`; called before the attachment's entries are
/// removed. Only while the runtime's cache entry of it exists: without one nothing can
/// restore it. The tombstone names that entry, and every DEL removes the tombstones whose
/// entry is gone, so without a watcher too the record holds only attachments in the gap.
pub(crate) fn record(owner: OwnerKey, network: &str, container_id: &str, ifname: &str) {
    prune_gone();
    let entry = cache_entry(network, container_id, ifname);
    if !entry.exists() {
        return;
    }
    let d = dir();
    let name = entry
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    // A restore or another DEL removes the directory when it finds it empty: between our
    // create and our write it may have, so the write is tried again (a bounded number of times).
    // Written whole under a temporary name, then renamed: a DEL pruning beside it never reads
    // a tombstone half written (empty, which it would take for one whose entry is gone).
    let write = || {
        let tmp = d.join(format!(".{}.new", owner.hex()));
        std::fs::create_dir_all(&d)
            .and_then(|()| std::fs::write(&tmp, format!("{name}\n")))
            .and_then(|()| std::fs::rename(&tmp, d.join(owner.hex())))
    };
    let mut r = write();
    for _ in 0..3 {
        match &r {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => r = write(),
            _ => break,
        }
    }
    if let Err(e) = r {
        crate::warn!(
            "cannot record the DEL of {} in {} ({e}): a restore from the runtime's cache before \
             its entry is removed may reinstall it",
            owner.hex(),
            d.display()
        );
    }
}

/// Forgets `owner`'s tombstone: an ADD of the attachment makes it live again.
pub(crate) fn forget(owner: OwnerKey) {
    let path = dir().join(owner.hex());
    match std::fs::remove_file(&path) {
        Ok(()) => {
            crate::debug!("{}: added again", path.display());
            remove_dir_if_empty();
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => crate::warn!("{}: {e}", path.display()),
    }
}

/// Whether natguard's DEL has run for `owner` (its tombstone is there). The store asks under
/// the node lock, before it installs a restored pod: DEL writes the tombstone before it takes
/// the lock, so a restore either sees it or installs before DEL's removal.
pub(crate) fn is_deleted(owner: OwnerKey) -> bool {
    dir().join(owner.hex()).exists()
}

/// The attachments natguard has deleted and the runtime may still have in its cache.
pub(crate) fn read() -> HashSet<OwnerKey> {
    let Ok(rd) = std::fs::read_dir(dir()) else {
        return HashSet::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| OwnerKey::parse_hex(e.file_name().to_str()?))
        .collect()
}

/// Removes the tombstones of attachments that are not in `cached` (the cache's attachments,
/// as just read): the runtime has removed their entry, nothing can restore them any more.
pub(crate) fn prune(cached: &HashSet<OwnerKey>) {
    for owner in read() {
        if !cached.contains(&owner) {
            let _ = std::fs::remove_file(dir().join(owner.hex()));
        }
    }
    remove_dir_if_empty();
}

/// Removes the tombstones whose cache entry (the name they hold) is gone from the default
/// cache.
fn prune_gone() {
    let Ok(rd) = std::fs::read_dir(dir()) else {
        return;
    };
    for e in rd.flatten() {
        // Another DEL's tombstone being written; one a killed DEL left goes after a minute.
        if e.file_name().to_string_lossy().starts_with('.') {
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(60));
            if stale {
                let _ = std::fs::remove_file(e.path());
            }
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let name = text.trim();
        let gone = name.is_empty()
            || name.contains('/')
            || !Path::new(crate::cni::DEFAULT_CACHE_DIR).join(name).exists();
        if gone {
            let _ = std::fs::remove_file(e.path());
        }
    }
    remove_dir_if_empty();
}

/// The directory goes with its last tombstone: natguard's runtime directory holds files of
/// fixed names only, none per pod, when no pod is being deleted.
fn remove_dir_if_empty() {
    // Fails while a tombstone is there (or another DEL just made one): then it stays.
    let _ = std::fs::remove_dir(dir());
}
