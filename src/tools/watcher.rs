//! What `install --watch` leaves for its readers (`status`, `metrics`): the record of its
//! repairs (`repair.json`) and the lock that says whether it still runs (`watch.lock`), both
//! beside the readiness file. The watcher writes them (`install::self_repair`,
//! `install::record`); the readers only read them, so this module sits below both and the
//! node tools do not import each other in a circle.

use serde_json::{json, Value};
use std::fs::{OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Exists while natguard's entry is in the active network list.
pub(crate) const DEFAULT_READY_FILE: &str = "/run/natguard/ready";

/// The directory of `path` (`.` for a bare name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Where the watcher records its repairs, for `status` and `metrics`.
pub const STATE_FILE: &str = "/run/natguard/repair.json";

/// The state file of a watcher whose readiness file is `ready_file`: beside it, so that
/// `--ready-file` moves both (the default is [`STATE_FILE`]).
pub fn state_file_beside(ready_file: &Path) -> PathBuf {
    parent(ready_file).join("repair.json")
}

/// What the watcher has repaired so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RepairStats {
    pub pid: u32,
    /// Repairs: checks that wrote something.
    pub repairs: u64,
    /// Every check (event-driven, after a loss, periodic), repairs included.
    pub checks: u64,
    /// Unix time of the last repair, in seconds.
    pub last_repair: Option<f64>,
    /// From the first notification of the burst to the committed repair.
    pub last_repair_ms: Option<f64>,
    /// Who changed natguard's tables before the last repair.
    pub last_cause: Option<String>,
    /// Unix time the record was last written, in seconds.
    pub updated: Option<f64>,
    /// Cache attachments the last check could not restore, by reason
    /// ([`crate::restore::SKIP_REASONS`]; reasons without one left out).
    pub skipped: Vec<(String, u64)>,
    /// Whether the watcher that wrote the record still runs: filled in by its readers from the
    /// watcher's lock (see [`watcher_running`]), never stored.
    pub running: Option<bool>,
}

impl RepairStats {
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "pid": self.pid,
            "repairs": self.repairs,
            "checks": self.checks,
            "lastRepair": self.last_repair,
            "lastRepairMs": self.last_repair_ms,
            "lastCause": self.last_cause,
            "updated": self.updated,
            "skipped": self
                .skipped
                .iter()
                .map(|(k, n)| (k.clone(), Value::from(*n)))
                .collect::<serde_json::Map<String, Value>>(),
        });
        if let Some(r) = self.running {
            v["running"] = r.into();
        }
        v
    }

    pub fn from_json(v: &Value) -> Option<RepairStats> {
        Some(RepairStats {
            pid: v.get("pid")?.as_u64()? as u32,
            repairs: v.get("repairs")?.as_u64()?,
            checks: v.get("checks")?.as_u64()?,
            last_repair: v.get("lastRepair").and_then(Value::as_f64),
            last_repair_ms: v.get("lastRepairMs").and_then(Value::as_f64),
            last_cause: v
                .get("lastCause")
                .and_then(Value::as_str)
                .map(str::to_string),
            updated: v.get("updated").and_then(Value::as_f64),
            // A record of an older watcher has none.
            skipped: v
                .get("skipped")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, n)| Some((k.clone(), n.as_u64()?)))
                        .collect()
                })
                .unwrap_or_default(),
            running: None,
        })
    }
}

/// The watcher's record, if a watcher has written one; `None` without `--watch` (or when the
/// file is unreadable: it is a report, never an input to policy).
pub fn read_state(path: &Path) -> Option<RepairStats> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() > 64 * 1024 {
        return None;
    }
    RepairStats::from_json(&serde_json::from_slice(&bytes).ok()?)
}

/// `watch.lock` beside the readiness file.
pub(crate) fn lock_file_beside(ready_file: &Path) -> PathBuf {
    parent(ready_file).join("watch.lock")
}

/// Whether a watcher holds the lock beside `ready_file` now; `None` when that cannot be told
/// (the lock file cannot be opened although it is there).
pub fn watcher_running(ready_file: &Path) -> Option<bool> {
    let path = lock_file_beside(ready_file);
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f,
        // Every watcher makes the file: without it, none runs.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(false),
        Err(_) => return None,
    };
    // A shared lock is refused only while a watcher holds its exclusive one.
    match file.try_lock_shared() {
        Ok(()) => Some(false),
        Err(TryLockError::WouldBlock) => Some(true),
        Err(TryLockError::Error(_)) => None,
    }
}
