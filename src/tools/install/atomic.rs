//! Atomic file writes for the netconf dir, the bin dir and the readiness file.
//!
//! A runtime may read a conflist, or exec the plugin binary, at any moment; it must see the old
//! file or the new one, never a half-written one, and after a power loss the one it saw last:
//! every write here is [`crate::fsutil::replace`]'s durable one (temporary file, fsync, rename,
//! fsync of the directory). Agents of the primary plugin rewrite their lists concurrently: the
//! caller passes a check that runs just before the rename, and a write whose source changed
//! meanwhile is abandoned with `io::ErrorKind::Interrupted` instead of overwriting the agent's
//! newer file.

use crate::error::{Error, Result};
pub(crate) use crate::fsutil::{parent, sync_dir};
use crate::fsutil::{replace, temp_beside, How};
use std::fs;
use std::io;
use std::path::Path;

/// Writes `bytes` to `path` atomically and durably. `mode` and owner come from `like` when
/// given. `unchanged` is checked just before the rename, so a concurrent rewrite by another
/// agent is not overwritten with a version based on what it replaced.
pub(crate) fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    like: Option<&fs::Metadata>,
    unchanged: &dyn Fn() -> bool,
) -> Result<()> {
    let how = How {
        mode,
        like,
        durable: true,
        unchanged: Some(unchanged),
    };
    replace(path, &temp_beside(path), bytes, how)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Whether a write failed because its source changed under it (see [`write_atomic`]); the
/// caller reads the file again and retries.
pub(crate) fn is_concurrent_change(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == io::ErrorKind::Interrupted)
}

pub(crate) fn same_bytes(path: &Path, expected: &[u8]) -> bool {
    fs::read(path).map(|b| b == expected).unwrap_or(false)
}
