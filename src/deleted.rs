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
//! The record is bounded by the cache, not by history: every restore removes the tombstones
//! whose attachment has no cache entry left ([`prune`]); the watcher checks every minute.
//! It lives under `/run`, so a reboot (which also empties the runtime's state) forgets it.
//! A tombstone that cannot be written (a read-only `/run/natguard`) is logged, and DEL goes on.

use crate::plan::OwnerKey;
use std::collections::HashSet;
use std::path::PathBuf;

/// The directory of tombstones, beside the node lock.
pub fn dir() -> PathBuf {
    crate::lock::run_dir().join("deleted")
}

/// Records that natguard's DEL runs for `owner` (`who` is written into the file for the
/// operator); called before the attachment's entries are removed.
pub(crate) fn record(owner: OwnerKey, who: &str) {
    let d = dir();
    let r = std::fs::create_dir_all(&d)
        .and_then(|()| std::fs::write(d.join(owner.hex()), format!("{who}\n")));
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
        Ok(()) => crate::debug!("{}: added again", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => crate::warn!("{}: {e}", path.display()),
    }
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
}
