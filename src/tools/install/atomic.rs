//! Atomic file writes for the netconf dir, the bin dir and the readiness file.
//!
//! A runtime may read a conflist, or exec the plugin binary, at any moment; it must see the old
//! file or the new one, never a half-written one. So every write goes to a temporary file in
//! the same directory (named so that no runtime takes it for a config or a plugin), is fsynced,
//! renamed over the target and followed by an fsync of the directory. Agents of the primary
//! plugin rewrite their lists concurrently: the caller passes a check that runs just before the
//! rename, and a write whose source changed meanwhile is abandoned with
//! `io::ErrorKind::Interrupted` instead of overwriting the agent's newer file.

use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn tmp_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // A dot in front and ".tmp" at the end: no runtime ever takes it for a config or a plugin.
    path.with_file_name(format!(".{name}.natguard-{}.tmp", std::process::id()))
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

pub(crate) fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename,
/// fsync of the directory. `mode` and owner come from `like` when given. `unchanged` is checked
/// just before the rename, so a concurrent rewrite by another agent is not overwritten with a
/// version based on what it replaced.
pub(crate) fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    like: Option<&fs::Metadata>,
    unchanged: &dyn Fn() -> bool,
) -> Result<()> {
    let tmp = tmp_path(path);
    let _ = fs::remove_file(&tmp);
    let result = (|| -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        let mode = like.map(|m| m.mode() & 0o7777).unwrap_or(mode);
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        if let Some(m) = like {
            // Keep the owner; only root may give a file away, and then it is root doing it.
            let _ = std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()));
        }
        f.sync_all()?;
        drop(f);
        if !unchanged() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                format!("{} changed while natguard was editing it", path.display()),
            ));
        }
        fs::rename(&tmp, path)?;
        sync_dir(parent(path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Whether a write failed because its source changed under it (see [`write_atomic`]); the
/// caller reads the file again and retries.
pub(crate) fn is_concurrent_change(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == io::ErrorKind::Interrupted)
}

pub(crate) fn same_bytes(path: &Path, expected: &[u8]) -> bool {
    fs::read(path).map(|b| b == expected).unwrap_or(false)
}
