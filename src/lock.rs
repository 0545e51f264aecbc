//! natguard's node-wide lock: an exclusive flock(2) on `/run/natguard/lock`, held by ADD, DEL
//! and GC from their read of the kernel's state to their commit (about a millisecond).
//!
//! The path and the lock type are an interface: other node tooling may coordinate with natguard
//! on the same file, so neither changes. What this module adds is that waiting is bounded and
//! that nothing at that path can make a verb hang:
//!
//! - **Bounded wait.** The lock is polled with `LOCK_NB` and short sleeps for at most [`WAIT`]
//!   (10 s). An invocation holds it for about a millisecond, so even 64 verbs in a queue wait a
//!   fraction of a second; 10 s is only reached when something holds it and does not let go (a
//!   stopped process, an operator's `flock`). The verb then fails with CNI code 11 (try again),
//!   which kubelet retries, long before its own runtime request timeout (2 minutes by default)
//!   would kill the plugin with no message at all.
//! - **Opening never blocks.** `O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC`, then `fstat`:
//!   only a regular file is locked. A FIFO would block `open(2)` forever without `O_NONBLOCK`, a
//!   symlink could point anywhere, and a directory or device is not natguard's. The file is
//!   opened read-only, since flock needs no write access: a read-only `/run/natguard` in which
//!   the file already exists still gives a working lock.
//! - **Busy is not unusable.** [`LockError::Busy`] means someone holds the lock past the wait;
//!   [`LockError::Unusable`] means the path cannot be locked at all (a directory, a symlink,
//!   another kind of file, a read-only or unwritable `/run/natguard` without the file). ADD and
//!   GC fail on either ([`acquire`]): running them unlocked could lose an owner-list update.
//!   DEL goes on without an unusable lock ([`acquire_for_del`]), because a chained DEL that fails
//!   stops the runtime from running the primary plugin's DEL, which leaks the pod's IP and veth.
//!   While the lock is unusable ADD and GC refuse to run, so DEL can race only other DELs; the
//!   worst outcome is an owner left in a list, which GC removes. A busy lock fails DEL too: it
//!   is transient, and the runtime retries DEL.

use crate::error::{Error, Result};
use std::fs::{DirBuilder, File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The node-wide lock file (flock, exclusive), in natguard's runtime directory `/run/natguard`.
pub const LOCK_PATH: &str = "/run/natguard/lock";

/// How long a verb waits for the node-wide lock before it fails with code 11.
pub const WAIT: Duration = Duration::from_secs(10);

/// First and longest pause between two attempts: short enough that a lock released after its
/// usual millisecond is taken within about that, long enough that 64 waiters cost no CPU.
const FIRST_PAUSE: Duration = Duration::from_micros(200);
const LONGEST_PAUSE: Duration = Duration::from_millis(10);

/// Holds a lock while alive; dropping it closes the file, which releases the lock.
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

/// Why a lock was not taken.
#[derive(Debug)]
pub enum LockError {
    /// Someone else held the lock for the whole wait.
    Busy { path: PathBuf, waited: Duration },
    /// The path cannot be locked: it could not be opened, or it is not a regular file.
    Unusable { path: PathBuf, source: io::Error },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Busy { path, waited } => write!(
                f,
                "natguard's node-wide lock {} is busy: another process held it for the whole {} natguard waits; try again",
                path.display(),
                show_wait(*waited)
            ),
            LockError::Unusable { path, source } => write!(
                f,
                "natguard's node-wide lock {} cannot be used: {source}",
                path.display()
            ),
        }
    }
}

impl From<LockError> for Error {
    fn from(e: LockError) -> Error {
        match e {
            busy @ LockError::Busy { .. } => Error::TryAgain(busy.to_string()),
            LockError::Unusable { path, source } => Error::io(
                format!(
                    "natguard's node-wide lock {} cannot be used (ADD and GC do not run without it)",
                    path.display()
                ),
                source,
            ),
        }
    }
}

fn show_wait(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// The node-wide lock for ADD and GC: busy is code 11, unusable is code 5.
pub fn acquire() -> Result<Lock> {
    Ok(acquire_at(Path::new(LOCK_PATH), WAIT)?)
}

/// The node-wide lock for DEL: busy is code 11; unusable is a warning and `None`, and DEL goes
/// on without it (see the module doc).
pub fn acquire_for_del() -> Result<Option<Lock>> {
    match acquire_at(Path::new(LOCK_PATH), WAIT) {
        Ok(l) => Ok(Some(l)),
        Err(e @ LockError::Unusable { .. }) => {
            crate::warn!("{e}; DEL goes on without it so that the primary plugin's DEL still runs");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Takes an exclusive flock on `path` (created with mode 0600 if missing, its directory with
/// 0700), waiting at most `wait`.
pub fn acquire_at(path: &Path, wait: Duration) -> Result<Lock, LockError> {
    if let Some(dir) = path.parent() {
        // A failure here shows up as the open's error, which says more.
        let _ = DirBuilder::new().recursive(true).mode(0o700).create(dir);
    }
    let unusable = |source| LockError::Unusable {
        path: path.to_path_buf(),
        source,
    };
    let file = open_regular(path).map_err(unusable)?;
    let start = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        match file.try_lock() {
            Ok(()) => {
                crate::debug!(
                    "lock {} taken after {} ms",
                    path.display(),
                    start.elapsed().as_millis()
                );
                return Ok(Lock { _file: file });
            }
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(TryLockError::Error(e)) => return Err(unusable(e)),
        }
        let waited = start.elapsed();
        if waited >= wait {
            return Err(LockError::Busy {
                path: path.to_path_buf(),
                waited: wait,
            });
        }
        std::thread::sleep(pause.min(wait - waited));
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// Opens `path` for locking without blocking or following a symlink; only a regular file is
/// returned.
fn open_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .mode(0o600)
        .custom_flags(
            libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::other("it is a symbolic link, which is not followed"),
            Some(libc::EISDIR) => io::Error::other("it is a directory, not a regular file"),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    Err(io::Error::other(format!(
        "it is {}, not a regular file",
        describe(kind)
    )))
}

/// "a directory", "a FIFO", ... for messages about a path that should be a regular file.
pub fn describe(kind: std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "an unknown kind of file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ng-lock-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_held_lock_is_busy_after_the_wait_and_free_after_release() {
        let d = scratch("busy");
        let path = d.join("lock");
        let held = acquire_at(&path, WAIT).expect("a free lock is taken");
        let e = acquire_at(&path, Duration::from_millis(30)).unwrap_err();
        assert!(matches!(e, LockError::Busy { .. }), "{e}");
        let e = Error::from(e);
        assert_eq!(e.code(), code::TRY_AGAIN);
        assert!(e.to_string().contains("is busy"), "{e}");
        assert!(e.to_string().contains(path.to_str().unwrap()), "{e}");
        drop(held);
        acquire_at(&path, Duration::from_millis(30)).expect("a released lock is taken");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_a_regular_file_is_locked() {
        let d = scratch("kinds");
        let dir = d.join("dir");
        std::fs::create_dir(&dir).unwrap();
        let target = d.join("target");
        std::fs::write(&target, "").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for (p, needle) in [
            (&dir, "directory"),
            (&link, "symbolic link"),
            (&fifo, "FIFO"),
        ] {
            let e = acquire_at(p, WAIT).unwrap_err();
            assert!(matches!(e, LockError::Unusable { .. }), "{e}");
            assert!(e.to_string().contains(needle), "{e}");
            assert_eq!(Error::from(e).code(), code::IO_FAILURE);
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
