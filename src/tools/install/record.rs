//! What `install --watch` keeps beside the readiness file: the lock that makes it the node's
//! only watcher (`watch.lock`), and the directories it runs with (`install.json`).
//!
//! **One watcher at a time.** During a DaemonSet rollout the new pod starts before the old one
//! has exited. Two watchers would each count repairs from their own start and overwrite the
//! same record, so the counters would go down and the record's pid flip between them. So the
//! watcher takes an exclusive flock(2) on `watch.lock` before it does anything, and writes its
//! pid into the file; a second one polls for the lock (every [`POLL`], still answering
//! SIGTERM) and says once whom it waits for. The kernel drops the lock when its holder exits,
//! however it exits. A flock needs no shared pid namespace, which is why `status` and `metrics`
//! ask the lock, not `/proc`, whether the record's watcher still runs: the watcher's pid is
//! the one of its container, not of the host.
//!
//! **The directories it runs with.** The readiness probe (`install --check`) runs in the same
//! container as the watcher but does not see the container's args; with a custom
//! `--cni-bin-dir` it would look in the default dir and report not ready. So the watcher writes
//! its bin dir, netconf dir and `--conflist` to `install.json`, and `--check` without any of
//! those flags checks what the watcher installs. Both files are removed by `uninstall`.

use super::args::InstallOpts;
use super::atomic::{parent, write_atomic};
use serde_json::{json, Value};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a second watcher tries the lock again.
pub(crate) const POLL: Duration = Duration::from_secs(1);

pub(crate) use crate::tools::watcher::lock_file_beside;

/// `install.json` beside the readiness file.
pub(crate) fn options_file_beside(ready_file: &Path) -> PathBuf {
    parent(ready_file).join("install.json")
}

/// The watcher's lock, held until the process exits.
pub(crate) struct WatchLock {
    _file: File,
}

/// What ended the wait for the lock.
pub(crate) enum Waited {
    Held(WatchLock),
    /// A signal came first (`stop` said so).
    Stopped,
}

/// Takes the node's watcher lock, waiting while another watcher holds it; `stop` is asked
/// between tries for at most [`POLL`] (the watcher's signal pipe).
pub(crate) fn take_watch_lock(
    ready_file: &Path,
    stop: &mut dyn FnMut(Duration) -> bool,
) -> std::io::Result<Waited> {
    let path = lock_file_beside(ready_file);
    std::fs::create_dir_all(parent(&path))?;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)?;
    let mut said = false;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) => {
                if !said {
                    crate::info!(
                        "another watcher holds {} ({}); waiting for it to exit, serving nothing \
                         meanwhile",
                        path.display(),
                        holder(&mut file).map_or("pid unknown".to_string(), |p| format!("pid {p}"))
                    );
                    said = true;
                }
                if stop(POLL) {
                    return Ok(Waited::Stopped);
                }
            }
            Err(TryLockError::Error(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
    if said {
        crate::info!("the other watcher is gone; {} is mine", path.display());
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    Ok(Waited::Held(WatchLock { _file: file }))
}

/// The pid written in a lock file.
fn holder(file: &mut File) -> Option<u32> {
    let mut s = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

/// The directories `install --watch` runs with, as recorded for `--check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recorded {
    pub(crate) bin_dir: PathBuf,
    pub(crate) netconf_dir: PathBuf,
    pub(crate) conflist: Option<PathBuf>,
}

/// Records `opts`' directories beside the readiness file (logged, not fatal, when it fails).
pub(crate) fn write_options(opts: &InstallOpts) {
    let path = options_file_beside(&opts.ready_file);
    let doc = json!({
        "cniBinDir": opts.bin_dir,
        "netconfDir": opts.netconf_dir,
        "conflist": opts.conflist,
        // Which watcher holds the lock, as its repair record names it (pids repeat across
        // containers): readers tell the record of the running watcher by it.
        "instance": crate::tools::watcher::instance(),
    });
    if let Err(e) = write_atomic(&path, format!("{doc}\n").as_bytes(), 0o644, None, &|| true) {
        crate::warn!("cannot record the watcher's directories for --check: {e}");
    }
}

/// The directories the watcher recorded beside `ready_file`, if it did.
pub(crate) fn read_options(ready_file: &Path) -> Option<Recorded> {
    let bytes = std::fs::read(options_file_beside(ready_file)).ok()?;
    if bytes.len() > 64 * 1024 {
        return None;
    }
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    let path = |k: &str| v.get(k).and_then(Value::as_str).map(PathBuf::from);
    Some(Recorded {
        bin_dir: path("cniBinDir")?,
        netconf_dir: path("netconfDir")?,
        conflist: path("conflist"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::watcher::watcher_running;

    #[test]
    fn a_second_lock_waits_and_the_running_check_sees_the_first() {
        let dir = std::env::temp_dir().join(format!("ng-watch-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ready = dir.join("ready");
        assert_eq!(watcher_running(&ready), Some(false));
        let first = match take_watch_lock(&ready, &mut |_| false).unwrap() {
            Waited::Held(l) => l,
            Waited::Stopped => panic!("the first watcher waited"),
        };
        assert_eq!(watcher_running(&ready), Some(true));
        // flock locks belong to open file descriptions: a second open conflicts in-process too.
        let mut tries = 0;
        let second = take_watch_lock(&ready, &mut |_| {
            tries += 1;
            tries >= 2
        })
        .unwrap();
        assert!(matches!(second, Waited::Stopped) && tries == 2);
        drop(first);
        assert_eq!(watcher_running(&ready), Some(false));
        assert!(matches!(
            take_watch_lock(&ready, &mut |_| true).unwrap(),
            Waited::Held(_)
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
