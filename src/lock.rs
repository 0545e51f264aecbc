//! natguard's node-wide lock: an exclusive flock(2) on `/run/natguard/lock`, held by ADD, DEL
//! and GC from their read of the kernel's state to their commit (about a millisecond).
//!
//! The path and the lock type are an interface: other node tooling may coordinate with natguard
//! on the same file, so neither changes. What this module adds is that waiting is bounded and
//! that nothing at that path can make a verb hang:
//!
//! - **Bounded wait, woken at release.** A waiter blocks in `flock(LOCK_EX)`, which the kernel
//!   wakes when the holder lets go, so a lock released after its usual millisecond is taken at
//!   once and a queue of verbs runs back to back (polling with sleeps left the lock idle between
//!   a release and the next attempt). The wait is bounded by a per-thread timer
//!   (`timer_create` with `SIGEV_THREAD_ID`) that sends [`WAKE_SIGNAL`], whose handler does
//!   nothing and is installed without `SA_RESTART`, so the blocked `flock` returns `EINTR`: first
//!   at the deadline, [`WAIT`] (10 s), then every [`RECHECK`], so a signal that arrives just
//!   before the thread blocks cannot leave it blocked. An invocation holds the lock for about a
//!   millisecond, so even 64 verbs in a queue wait a fraction of a second; 10 s is only reached
//!   when something holds it and does not let go (a stopped process, an operator's `flock`). The
//!   verb then fails with CNI code 11 (try again), which kubelet retries, long before its own
//!   runtime request timeout (2 minutes by default) would kill the plugin with no message at all.
//!   Where no timer can be made, the wait falls back to polling with `LOCK_NB` and short sleeps.
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

/// natguard's record of the networks found intact, in [`run_dir`] (`crate::store`'s).
pub const VERIFIED_FILE: &str = "verified";

/// natguard's runtime directory, the lock file's: the other per-node records live next to it.
pub fn run_dir() -> &'static Path {
    Path::new(LOCK_PATH)
        .parent()
        .unwrap_or(Path::new("/run/natguard"))
}

/// How long a verb waits for the node-wide lock before it fails with code 11.
pub const WAIT: Duration = Duration::from_secs(10);

/// The signal the wait's timer interrupts a blocked `flock` with (its handler does nothing).
pub const WAKE_SIGNAL: libc::c_int = libc::SIGALRM;

/// After the deadline's signal, the timer fires again this often until the wait sees it: a
/// signal delivered between the deadline check and the blocking `flock` is not lost for longer.
const RECHECK: Duration = Duration::from_millis(50);

/// First and longest pause between two attempts of the polling fallback.
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
    let taken = match file.try_lock() {
        Ok(()) => true,
        Err(TryLockError::WouldBlock) => match Timer::arm(wait) {
            Some(timer) => block(&file, start, wait, &timer),
            None => poll(&file, start, wait),
        }
        .map_err(unusable)?,
        Err(TryLockError::Error(e)) if e.kind() == io::ErrorKind::Interrupted => {
            poll(&file, start, wait).map_err(unusable)?
        }
        Err(TryLockError::Error(e)) => return Err(unusable(e)),
    };
    if !taken {
        return Err(LockError::Busy {
            path: path.to_path_buf(),
            waited: wait,
        });
    }
    crate::debug!(
        "lock {} taken after {} ms",
        path.display(),
        start.elapsed().as_millis()
    );
    Ok(Lock { _file: file })
}

/// Blocks in `flock(LOCK_EX)` until the lock is taken (`true`) or `wait` has passed since
/// `start` (`false`); `timer` interrupts the block (see the module doc).
fn block(file: &File, start: Instant, wait: Duration, _timer: &Timer) -> io::Result<bool> {
    use rustix::fs::{flock, FlockOperation};
    loop {
        if start.elapsed() >= wait {
            return Ok(false);
        }
        // Bounded: `timer` is armed (only `Timer::arm` makes one), and its signal, whose
        // handler has no SA_RESTART, ends this call with EINTR at the deadline and every
        // RECHECK after it; the check above then returns.
        match flock(file, FlockOperation::LockExclusive) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The fallback without a timer: `LOCK_NB` attempts with growing pauses, until `wait` has passed.
fn poll(file: &File, start: Instant, wait: Duration) -> io::Result<bool> {
    let mut pause = FIRST_PAUSE;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(TryLockError::Error(e)) => return Err(e),
        }
        let waited = start.elapsed();
        if waited >= wait {
            return Ok(false);
        }
        std::thread::sleep(pause.min(wait - waited));
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// A POSIX timer that sends [`WAKE_SIGNAL`] to the calling thread after the wait, then every
/// [`RECHECK`], with the signal unblocked in this thread; deleted (and the thread's signal mask
/// restored) on drop.
struct Timer {
    id: libc::timer_t,
    old_mask: libc::sigset_t,
}

impl Timer {
    fn arm(wait: Duration) -> Option<Timer> {
        install_wake_handler()?;
        // SAFETY: plain syscalls on values owned here; the sigevent is zeroed, then the fields
        // the kernel reads for SIGEV_THREAD_ID are set.
        unsafe {
            let mut ev: libc::sigevent = std::mem::zeroed();
            ev.sigev_notify = libc::SIGEV_THREAD_ID;
            ev.sigev_signo = WAKE_SIGNAL;
            ev.sigev_notify_thread_id = libc::gettid();
            let mut id: libc::timer_t = std::ptr::null_mut();
            if libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut id) != 0 {
                return None;
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old_mask: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, WAKE_SIGNAL);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, &mut old_mask);
            let t = Timer { id, old_mask };
            let spec = libc::itimerspec {
                it_value: timespec(wait.max(Duration::from_millis(1))),
                it_interval: timespec(RECHECK),
            };
            if libc::timer_settime(id, 0, &spec, std::ptr::null_mut()) != 0 {
                return None; // t is dropped: timer deleted, mask restored
            }
            Some(t)
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: the timer was created by Timer::arm and is deleted once; the mask is the one
        // this thread had before.
        unsafe {
            libc::timer_delete(self.id);
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old_mask, std::ptr::null_mut());
        }
    }
}

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// Installs the do-nothing handler of [`WAKE_SIGNAL`] once per process, without `SA_RESTART`
/// so that it interrupts a blocked `flock`. It stays installed: a timer's signal still pending
/// after the wait then does nothing, instead of the default action (ending the process).
/// `None` if the handler could not be installed (the wait then polls).
fn install_wake_handler() -> Option<()> {
    static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    extern "C" fn wake(_: libc::c_int) {}
    let ok = *INSTALLED.get_or_init(|| {
        // SAFETY: a handler that does nothing is async-signal-safe; sigaction is given a fully
        // initialised struct.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = wake as *const () as libc::sighandler_t;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(WAKE_SIGNAL, &sa, std::ptr::null_mut()) == 0
        }
    });
    ok.then_some(())
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

    /// A waiter blocked on the lock takes it when the holder lets go, long before its deadline,
    /// and the deadline holds while the lock is kept.
    #[test]
    fn a_waiter_takes_the_lock_when_it_is_released() {
        let d = scratch("wake");
        let path = d.join("lock");
        let held = acquire_at(&path, WAIT).unwrap();
        let p = path.clone();
        let waiter = std::thread::spawn(move || acquire_at(&p, WAIT).map(|_| ()));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !waiter.is_finished(),
            "the waiter must wait while the lock is held"
        );
        drop(held);
        // A deadline for the test, not a timing claim: the waiter returns, with the lock.
        waiter
            .join()
            .unwrap()
            .expect("the released lock is taken by the waiter");
        let held = acquire_at(&path, WAIT).unwrap();
        let start = Instant::now();
        let e = acquire_at(&path, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, LockError::Busy { .. }), "{e}");
        assert!(start.elapsed() >= Duration::from_millis(200));
        drop(held);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The race the RECHECK signals are for: the timer's first signal arrives after the deadline
    /// check but before the thread blocks in `flock`, so it interrupts nothing. Here it is made
    /// certain: the timer fires while the thread sleeps, then the thread blocks on a lock that
    /// is never released, with a deadline not yet passed. Only a later signal can end that
    /// block; the test's own deadline fails if none comes.
    #[test]
    fn a_wake_signal_spent_before_the_block_does_not_leave_it_blocked() {
        let d = scratch("race");
        let path = d.join("lock");
        let held = acquire_at(&path, WAIT).unwrap();
        let p = path.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let file = open_regular(&p).unwrap();
            let timer = Timer::arm(Duration::from_millis(1)).expect("a timer");
            std::thread::sleep(Duration::from_millis(30)); // the first signal comes and goes
            let r = block(&file, Instant::now(), Duration::from_millis(5), &timer);
            tx.send(r.map_err(|e| e.to_string())).unwrap();
        });
        let r = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a block whose first wake signal was spent never came back");
        assert_eq!(r, Ok(false), "the held lock must not be taken");
        drop(held);
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
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
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
