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

/// How often the self-repair thread rewrites its record while idle: the record's `updated`
/// is the watcher's heartbeat.
pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// How old a running watcher's heartbeat may be before `install --check --health` (the
/// DaemonSet's probes) and `status` call the watcher stuck: six missed beats, so a slow node
/// or a long repair never trips it.
pub const HEARTBEAT_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Seconds since `updated` (a Unix time), never negative.
pub fn age_of(updated: f64) -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_secs_f64() - updated).max(0.0))
        .unwrap_or(0.0)
}

/// What the watcher has repaired so far.
#[derive(Debug, Clone, PartialEq)]
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
    /// Unix time the record was last written, in seconds: the watcher's heartbeat (it is
    /// rewritten at least every [`HEARTBEAT_EVERY`] while the watcher runs).
    pub updated: Option<f64>,
    /// The writer's [`instance`]: the lock holder is the writer only if the instance it
    /// records beside its lock (`install.json`) is the same (pids repeat across containers: a
    /// DaemonSet's watcher is often pid 1).
    pub instance: Option<String>,
    /// Whether the writer repairs: a watcher started with `--no-repair` (or `--no-adopt`) that
    /// took over an earlier watcher's record says it does not.
    pub repairing: bool,
    /// Cache attachments the last check could not restore, by reason
    /// ([`crate::restore::SKIP_REASONS`]; reasons without one left out).
    pub skipped: Vec<(String, u64)>,
    /// Whether self-repair runs: the watcher that holds the lock wrote the record and repairs.
    /// Filled in by its readers ([`RepairStats::with_running`]), never stored.
    pub running: Option<bool>,
}

impl Default for RepairStats {
    fn default() -> Self {
        RepairStats {
            pid: 0,
            repairs: 0,
            checks: 0,
            last_repair: None,
            last_repair_ms: None,
            last_cause: None,
            updated: None,
            instance: None,
            repairing: true,
            skipped: Vec::new(),
            running: None,
        }
    }
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
            "instance": self.instance,
            "repairing": self.repairing,
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
            instance: v
                .get("instance")
                .and_then(Value::as_str)
                .map(str::to_string),
            // Records of watchers that always repaired have no such key.
            repairing: v.get("repairing").and_then(Value::as_bool).unwrap_or(true),
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

    /// The record with [`RepairStats::running`] filled in from the watcher lock beside
    /// `ready_file`: self-repair runs when the lock's holder is the record's writer and that
    /// writer repairs. A record without an instance (an older watcher's) is taken to be the
    /// holder's.
    pub fn with_running(mut self, ready_file: &Path) -> RepairStats {
        self.running = match lock_holder(ready_file) {
            Holder::Unknown => None,
            Holder::None => Some(false),
            Holder::Held(holder) => Some(
                self.repairing
                    && match (&self.instance, holder) {
                        (Some(mine), Some(theirs)) => *mine == theirs,
                        (None, _) => true,
                        (Some(_), None) => false,
                    },
            ),
        };
        self
    }
}

/// This process's identity as a watcher: its pid and start time, written beside the lock it
/// holds (`install.json`) and into the record it writes.
pub fn instance() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("{}-{t}", std::process::id())
    })
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

/// Who holds the watcher lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Cannot be told (the lock file cannot be opened although it is there).
    Unknown,
    /// No watcher runs.
    None,
    /// A watcher holds it, with the [`instance`] its lock file names, if any.
    Held(Option<String>),
}

/// Who holds the watcher lock beside `ready_file` now.
pub fn lock_holder(ready_file: &Path) -> Holder {
    match watcher_running(ready_file) {
        None => Holder::Unknown,
        Some(false) => Holder::None,
        // The holder records its instance in `install.json` once it holds the lock.
        Some(true) => Holder::Held(
            std::fs::read(parent(ready_file).join("install.json"))
                .ok()
                .filter(|b| b.len() <= 64 * 1024)
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|v| v.get("instance")?.as_str().map(str::to_string)),
        ),
    }
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

/// Where the watcher's metadata proxy records what it serves, for `status` and `metrics`.
pub const PROXY_FILE: &str = "/run/natguard/proxy.json";

/// The proxy record of a watcher whose readiness file is `ready_file`.
pub fn proxy_file_beside(ready_file: &Path) -> PathBuf {
    parent(ready_file).join("proxy.json")
}

pub use crate::proxy::record::{read_proxy, ProxyRecord};
