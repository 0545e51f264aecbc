//! Logging: warnings to stderr, everything to `logFile` when one is configured. Never to stdout: stdout carries the CNI
//! reply.
//!
//! The log file is opened with O_NOFOLLOW and O_APPEND, so a symlink planted at its path is
//! refused instead of followed, and concurrent invocations append whole lines.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static LOG_FILE: Mutex<Option<File>> = Mutex::new(None);
static CONTEXT: Mutex<String> = Mutex::new(String::new());
static INFO_TO_STDERR: AtomicBool = AtomicBool::new(false);

/// Opens the log file; a failure is reported on stderr and logging goes on there.
pub fn set_file(path: &Path) {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    match f {
        Ok(f) => *LOG_FILE.lock().unwrap_or_else(|e| e.into_inner()) = Some(f),
        Err(e) => eprintln!("natguard: cannot open logFile {}: {e}", path.display()),
    }
}

/// Sends info lines to stderr as well: for the node tools (`install`, `uninstall`), whose stderr
/// is an operator's terminal or a DaemonSet's container log, not a runtime's log.
pub fn info_to_stderr() {
    INFO_TO_STDERR.store(true, Ordering::Relaxed);
}

/// Prefix for every line of this invocation, e.g. "ADD net1 abc123 eth0".
pub fn set_context(ctx: String) {
    *CONTEXT.lock().unwrap_or_else(|e| e.into_inner()) = ctx;
}

pub fn write(level: &str, msg: &str) {
    let ctx = CONTEXT.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let line = format!(
        "{}.{:03} natguard[{}] {level} {ctx}: {msg}\n",
        now.as_secs(),
        now.subsec_millis(),
        std::process::id()
    );
    // Runtimes copy a plugin's stderr into their own logs: only what needs attention goes there.
    if level != "info" || INFO_TO_STDERR.load(Ordering::Relaxed) {
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
    if let Some(f) = LOG_FILE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        let _ = f.write_all(line.as_bytes());
    }
}

#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::log::write("info", &format!($($t)*)) };
}

#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::log::write("warn", &format!($($t)*)) };
}
