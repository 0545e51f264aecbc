//! Logging: warnings and errors to stderr, and lines up to `logLevel` to `logFile` when one is
//! configured. Never to stdout: stdout carries the CNI reply.
//!
//! A verb never waits for its log:
//! - `logFile` is opened with `O_NONBLOCK | O_NOFOLLOW | O_APPEND | O_CLOEXEC` and used only if
//!   `fstat` says it is a regular file. A FIFO without a reader fails the open at once instead
//!   of blocking it, a symlink planted at the path is refused instead of followed, and a FIFO
//!   with a reader, a socket, a device or a directory is refused after the open. Each gives one
//!   warning on stderr; the verb goes on with stderr only.
//! - Lines are filtered by [`Level`]: the file gets the configured level and above (default
//!   `warn`), stderr always gets `warn` and `error` (runtimes copy a plugin's stderr into their
//!   own logs, so only what needs attention goes there).
//!
//! Rotation keeps the file under `logFileMaxSize` with one older file, `PATH.1`. Invocations
//! sharing the file take an flock on the log file itself around each line. Under it a writer
//! checks that its descriptor is still the file at PATH; if another invocation rotated it, the
//! writer reopens PATH and starts over. When the line would take the file past the cap, the
//! writer renames PATH to PATH.1, lets go of the lock only then, and starts over on a new PATH.
//! So one writer rotates a full file, whoever else met the cap at the same time; every line
//! lands in PATH or PATH.1 in the order it was written; and a file exceeds the cap only by a
//! single line longer than the cap itself.
//!
//! **Two formats.** `text` (the default) is one line of `SECONDS.MILLIS natguard[PID] LEVEL
//! CONTEXT: MSG`, as tests and operators' greps read it. `json` (`logFormat: "json"` in the
//! plugin's config, `--log-format json` for the node tools) is one JSON object per line with
//! `time` (RFC 3339, UTC, milliseconds), `level`, `component` (the verb or subcommand), `msg`,
//! `pid`, and `network`, `container`, `ifname` and `pod` where the invocation knows them: what
//! a cluster's log pipeline indexes without a parser of its own. Both outputs of a process,
//! stderr and `logFile`, use the same format, and the format is set before the first line that
//! has a context, so every line a component writes is in one format.
//!
//! The wait for that flock is bounded: [`LOG_LOCK_WAIT`] per line, and once it ran out the
//! invocation stops waiting for it. A line that cannot have the lock is appended without it
//! and without rotating (one note on stderr): the verb never waits on its log, and no line is
//! dropped, at the price of a file that may then pass the cap.

use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How much a line matters; a configured level writes that level and the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    pub const ALL: [Level; 4] = [Level::Error, Level::Warn, Level::Info, Level::Debug];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    /// The level named exactly `s` ("error", "warn", "info", "debug").
    pub fn from_name(s: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// How each line is written: the format of `logFormat` and `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// `SECONDS.MILLIS natguard[PID] LEVEL CONTEXT: MSG`.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl Format {
    pub const ALL: [Format; 2] = [Format::Text, Format::Json];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }

    /// The format named exactly `s` ("text", "json").
    pub fn from_name(s: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

/// What a line is about: the component (a CNI verb or a node tool's subcommand) and, for a
/// CNI verb, the attachment. Text lines name them in this order, separated by spaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// "ADD", "DEL", ..., "install", "uninstall", "adopt".
    pub component: String,
    pub network: Option<String>,
    /// The container ID, cut to 12 characters as runtimes show it.
    pub container: Option<String>,
    pub ifname: Option<String>,
    /// "NAMESPACE/NAME" from CNI_ARGS; in JSON lines only (text lines stay as they were).
    pub pod: Option<String>,
}

impl Context {
    /// A context that names only the component.
    pub fn component(name: impl Into<String>) -> Context {
        Context {
            component: name.into(),
            ..Context::default()
        }
    }

    /// The text form: "ADD net1 abc123 eth0", "install", or "" before any context is set.
    fn text(&self) -> String {
        [
            Some(&self.component).filter(|c| !c.is_empty()),
            self.network.as_ref(),
            self.container.as_ref(),
            self.ifname.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(" ")
    }
}

/// `logLevel` when the config names none.
pub const DEFAULT_LEVEL: Level = Level::Warn;
/// `logFileMaxSize` when the config names none: 10 MiB.
pub const DEFAULT_MAX_SIZE: u64 = 10 << 20;
/// Smallest `logFileMaxSize`: a page, a few dozen lines.
pub const MIN_MAX_SIZE: u64 = 4096;
/// Largest `logFileMaxSize`: 1 GiB.
pub const MAX_MAX_SIZE: u64 = 1 << 30;
/// Longest wait for the log file's flock for one line, however many rotations happen
/// meanwhile; once it ran out, the invocation no longer waits for that lock.
pub const LOG_LOCK_WAIT: Duration = Duration::from_millis(100);

/// The log file of this invocation.
struct Sink {
    path: PathBuf,
    /// `None` once the file became unusable; lines then go to stderr only.
    file: Option<File>,
    max_size: u64,
    /// [`LOG_LOCK_WAIT`], but for the unit tests.
    lock_wait: Duration,
    /// The log lock stayed busy past `lock_wait` once: later lines do not wait for it.
    lock_gave_up: bool,
    /// PATH could not be renamed to PATH.1 once: noted on stderr, not again.
    rotate_failed: bool,
}

struct State {
    level: Level,
    format: Format,
    context: Context,
    sink: Option<Sink>,
}

static STATE: Mutex<State> = Mutex::new(State {
    level: DEFAULT_LEVEL,
    format: Format::Text,
    context: Context {
        component: String::new(),
        network: None,
        container: None,
        ifname: None,
        pod: None,
    },
    sink: None,
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Applies the config's log settings: `logFile` (if any), `logLevel`, `logFileMaxSize`. A log
/// file that cannot be used is reported on stderr and logging goes on there.
pub fn configure(file: Option<&Path>, level: Level, max_size: u64) {
    let sink = file.and_then(|path| match open_regular(path) {
        Ok(f) => Some(Sink {
            path: path.to_path_buf(),
            file: Some(f),
            max_size,
            lock_wait: LOG_LOCK_WAIT,
            lock_gave_up: false,
            rotate_failed: false,
        }),
        Err(why) => {
            note(&format!("logFile {} is not used: {why}", path.display()));
            None
        }
    });
    let mut st = state();
    st.level = level;
    st.sink = sink;
}

/// Sends info lines to stderr as well: for the node tools (`install`, `uninstall`), whose stderr
/// is an operator's terminal or a DaemonSet's container log, not a runtime's log.
pub fn info_to_stderr() {
    INFO_TO_STDERR.store(true, std::sync::atomic::Ordering::Relaxed);
}

static INFO_TO_STDERR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What every line of this invocation is about (in text, its prefix: "ADD net1 abc123 eth0").
pub fn set_context(ctx: Context) {
    state().context = ctx;
}

/// The format of every line from here on, on stderr and in `logFile`.
pub fn set_format(format: Format) {
    state().format = format;
}

/// The format lines are written in.
pub fn format() -> Format {
    state().format
}

/// Writes one line at `level`: to stderr if it is a warning or an error, to the log file if the
/// configured level includes it.
pub fn log(level: Level, msg: &str) {
    let mut st = state();
    let to_stderr = level <= Level::Warn
        || (level == Level::Info && INFO_TO_STDERR.load(std::sync::atomic::Ordering::Relaxed));
    let to_file = level <= st.level && st.sink.is_some();
    if !to_stderr && !to_file {
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let line = render(st.format, now, level, &st.context, msg);
    if to_stderr {
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
    if to_file {
        if let Some(sink) = st.sink.as_mut() {
            sink.append(line.as_bytes());
        }
    }
}

/// [`log`] with the level by name, for callers outside the macros (main's error line). An
/// unknown name is logged as an error.
pub fn write(level: &str, msg: &str) {
    log(Level::from_name(level).unwrap_or(Level::Error), msg);
}

/// One line in `format`, with its newline. `now` is the time since the Unix epoch.
fn render(format: Format, now: Duration, level: Level, ctx: &Context, msg: &str) -> String {
    match format {
        Format::Text => {
            // A line before any context is set reads "error: MSG", never "error : MSG".
            let ctx = ctx.text();
            let sep = if ctx.is_empty() { "" } else { " " };
            format!(
                "{}.{:03} natguard[{}] {}{sep}{ctx}: {msg}\n",
                now.as_secs(),
                now.subsec_millis(),
                std::process::id(),
                level.as_str(),
            )
        }
        Format::Json => {
            let mut o = serde_json::Map::new();
            o.insert("time".into(), rfc3339_utc(now).into());
            o.insert("level".into(), level.as_str().into());
            o.insert("component".into(), ctx.component.clone().into());
            for (k, v) in [
                ("network", &ctx.network),
                ("container", &ctx.container),
                ("ifname", &ctx.ifname),
                ("pod", &ctx.pod),
            ] {
                if let Some(v) = v {
                    o.insert(k.into(), v.clone().into());
                }
            }
            o.insert("pid".into(), std::process::id().into());
            o.insert("msg".into(), msg.into());
            format!("{}\n", serde_json::Value::Object(o))
        }
    }
}

/// `now` (since the Unix epoch) as RFC 3339 in UTC with milliseconds:
/// `2026-12-04T21:04:47.775Z`. The civil date comes from the day count by Howard Hinnant's
/// `civil_from_days`, which is exact for the proleptic Gregorian calendar.
pub fn rfc3339_utc(now: Duration) -> String {
    let secs = now.as_secs();
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        now.subsec_millis()
    )
}

/// The (year, month, day) of a count of days since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`: exact for the proleptic Gregorian calendar, negative days included).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// A note about the log itself: stderr only. In text it has no context (there may be none
/// yet); in JSON it is a warning of the component "log".
fn note(msg: &str) {
    let format = state().format;
    match format {
        Format::Text => {
            let _ = writeln!(std::io::stderr(), "natguard: {msg}");
        }
        Format::Json => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let line = render(format, now, Level::Warn, &Context::component("log"), msg);
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

/// Opens a log file without blocking or following a symlink; only a regular file is returned.
fn open_regular(path: &Path) -> Result<File, String> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "it is a symbolic link, which is not followed".to_string(),
            Some(libc::EISDIR) => "it is a directory, not a regular file".to_string(),
            // O_NONBLOCK turns "a FIFO nobody reads" into ENXIO (and a socket gives it too).
            Some(libc::ENXIO) => format!("it is a FIFO without a reader or a socket ({e})"),
            _ => e.to_string(),
        })?;
    let kind = f.metadata().map_err(|e| e.to_string())?.file_type();
    if kind.is_file() {
        Ok(f)
    } else {
        Err(format!(
            "it is {}, not a regular file",
            crate::lock::describe(kind)
        ))
    }
}

/// `PATH.1`.
fn rotated_path(path: &Path) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(".1");
    PathBuf::from(s)
}

/// Whether `f` is still the file at `path`, and its size.
enum Current {
    Yes(u64),
    /// Someone rotated or removed it: reopen `path`.
    Stale,
}

fn current(f: &File, path: &Path) -> Current {
    let (Ok(mine), Ok(there)) = (f.metadata(), std::fs::symlink_metadata(path)) else {
        return Current::Stale;
    };
    if mine.dev() == there.dev() && mine.ino() == there.ino() {
        Current::Yes(mine.len())
    } else {
        Current::Stale
    }
}

/// Takes the flock on `f`, waiting until `deadline`; after the wait ran out once in this
/// invocation (`gave_up`), only tries once.
fn lock_until(
    f: &File,
    deadline: Instant,
    gave_up: &mut bool,
    path: &Path,
    wait: Duration,
) -> bool {
    let mut pause = Duration::from_micros(20);
    loop {
        match f.try_lock() {
            Ok(()) => return true,
            Err(TryLockError::WouldBlock) if !*gave_up => {}
            Err(_) => return false,
        }
        let now = Instant::now();
        if now >= deadline {
            *gave_up = true;
            note(&format!(
                "logFile {}: its lock stayed busy for {} ms; writing without it (and without rotating)",
                path.display(),
                wait.as_millis()
            ));
            return false;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_micros(500));
    }
}

impl Sink {
    fn append(&mut self, line: &[u8]) {
        // One wait for the whole line, however many times others rotate meanwhile.
        let deadline = Instant::now() + self.lock_wait;
        loop {
            let Some(f) = self.file.take() else { return };
            let locked = lock_until(
                &f,
                deadline,
                &mut self.lock_gave_up,
                &self.path,
                self.lock_wait,
            );
            match current(&f, &self.path) {
                Current::Stale => {
                    // Closing the descriptor releases its lock.
                    drop(f);
                    self.reopen();
                    if !locked || Instant::now() >= deadline {
                        // No lock to wait for any more: append to the file now at PATH.
                        if let Some(mut f) = self.file.as_ref() {
                            let _ = f.write_all(line);
                        }
                        return;
                    }
                }
                Current::Yes(size) => {
                    let full = size > 0 && size + line.len() as u64 > self.max_size;
                    if full && locked && !self.rotate_failed {
                        // Only the holder of the lock on the file at PATH rotates, and it lets
                        // go only after the rename: the writers waiting for that lock then find
                        // their descriptor stale and reopen PATH.
                        self.rotate();
                        drop(f);
                        self.reopen();
                        continue;
                    }
                    let _ = (&f).write_all(line);
                    if locked {
                        let _ = f.unlock();
                    }
                    self.file = Some(f);
                    return;
                }
            }
        }
    }

    fn rotate(&mut self) {
        let to = rotated_path(&self.path);
        if let Err(e) = std::fs::rename(&self.path, &to) {
            self.rotate_failed = true;
            note(&format!(
                "logFile {}: cannot rotate to {}: {e}; the file grows past logFileMaxSize",
                self.path.display(),
                to.display()
            ));
        }
    }

    fn reopen(&mut self) {
        match open_regular(&self.path) {
            Ok(f) => self.file = Some(f),
            Err(why) => {
                note(&format!(
                    "logFile {} is no longer used: {why}",
                    self.path.display()
                ));
                self.file = None;
            }
        }
    }
}

#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { $crate::log::log($crate::log::Level::Debug, &format!($($t)*)) };
}

#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::log::log($crate::log::Level::Info, &format!($($t)*)) };
}

#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::log::log($crate::log::Level::Warn, &format!($($t)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ng-log-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn sink(path: &Path, max_size: u64) -> Sink {
        Sink {
            path: path.to_path_buf(),
            file: Some(open_regular(path).unwrap()),
            max_size,
            // The concurrency tests saturate the lock far beyond what invocations do; they
            // test the locked protocol, not the give-up path.
            lock_wait: Duration::from_secs(30),
            lock_gave_up: false,
            rotate_failed: false,
        }
    }

    #[test]
    fn rfc3339_times_are_the_civil_utc_date() {
        let t = |s: u64, ms: u32| rfc3339_utc(Duration::new(s, ms * 1_000_000));
        assert_eq!(t(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(t(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(t(1_796_414_287, 775), "2026-12-04T19:58:07.775Z");
        assert_eq!(t(4_107_542_399, 999), "2100-02-28T23:59:59.999Z");
        assert_eq!(t(4_107_542_400, 0), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn text_lines_keep_their_shape_and_json_lines_name_the_context() {
        let now = Duration::new(1_796_414_287, 775_000_000);
        let ctx = Context {
            component: "ADD".into(),
            network: Some("net1".into()),
            container: Some("abc123".into()),
            ifname: Some("eth0".into()),
            pod: Some("default/web".into()),
        };
        let pid = std::process::id();
        assert_eq!(
            render(Format::Text, now, Level::Warn, &ctx, "m"),
            format!("1796414287.775 natguard[{pid}] warn ADD net1 abc123 eth0: m\n")
        );
        assert_eq!(
            render(Format::Text, now, Level::Error, &Context::default(), "m"),
            format!("1796414287.775 natguard[{pid}] error: m\n")
        );
        let line = render(Format::Json, now, Level::Info, &ctx, "say \"hi\"\n");
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"time": "2026-12-04T19:58:07.775Z", "level": "info",
                "component": "ADD", "network": "net1", "container": "abc123", "ifname": "eth0",
                "pod": "default/web", "pid": pid, "msg": "say \"hi\"\n"})
        );
        let v: serde_json::Value = serde_json::from_str(&render(
            Format::Json,
            now,
            Level::Warn,
            &Context::component("install"),
            "m",
        ))
        .unwrap();
        assert_eq!(
            v.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["time", "level", "component", "pid", "msg"]
        );
        assert_eq!(Format::from_name("json"), Some(Format::Json));
        assert_eq!(Format::from_name("JSON"), None);
    }

    #[test]
    fn levels_are_ordered_and_named() {
        for l in Level::ALL {
            assert_eq!(Level::from_name(l.as_str()), Some(l));
        }
        assert!(Level::Error < Level::Warn && Level::Warn < Level::Info);
        assert!(Level::Info < Level::Debug);
        assert_eq!(Level::from_name("WARN"), None);
        assert_eq!(Level::from_name("verbose"), None);
    }

    /// Two writers sharing the file, as two invocations do: one rotation at the cap, and the
    /// other writer follows the new file instead of appending to the rotated one.
    #[test]
    fn rotation_moves_the_full_file_and_writers_follow() {
        let d = scratch("rotate");
        let path = d.join("n.log");
        let mut a = sink(&path, 100);
        let mut b = sink(&path, 100);
        let line = |c: char| format!("{}\n", c.to_string().repeat(39));
        a.append(line('a').as_bytes());
        b.append(line('b').as_bytes());
        // 80 bytes: the next line would take the file past 100.
        b.append(line('c').as_bytes());
        a.append(line('d').as_bytes());
        let old = std::fs::read_to_string(rotated_path(&path)).unwrap();
        let new = std::fs::read_to_string(&path).unwrap();
        assert_eq!(old, line('a') + &line('b'));
        assert_eq!(new, line('c') + &line('d'));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_line_longer_than_the_cap_is_written_whole_into_an_empty_file() {
        let d = scratch("long");
        let path = d.join("n.log");
        let mut s = sink(&path, 10);
        s.append(b"0123456789abcdef\n");
        s.append(b"x\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x\n");
        assert_eq!(
            std::fs::read_to_string(rotated_path(&path)).unwrap(),
            "0123456789abcdef\n"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Runs `writers` threads, each with a descriptor of its own (as invocations have), each
    /// appending `lines` numbered lines to `path`; the main thread samples both files' sizes
    /// meanwhile. Returns (largest PATH, largest PATH.1, smallest PATH.1) seen.
    fn race(path: &Path, max_size: u64, writers: usize, lines: usize) -> (u64, u64, u64) {
        let rotated = rotated_path(path);
        let done = std::sync::atomic::AtomicUsize::new(0);
        let barrier = std::sync::Barrier::new(writers);
        std::thread::scope(|s| {
            for w in 0..writers {
                let (done, barrier) = (&done, &barrier);
                s.spawn(move || {
                    // Counted as done also when the writer panics, so the sampler stops.
                    struct Done<'a>(&'a std::sync::atomic::AtomicUsize);
                    impl Drop for Done<'_> {
                        fn drop(&mut self) {
                            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    let _done = Done(done);
                    let mut sink = sink(path, max_size);
                    barrier.wait();
                    for i in 0..lines {
                        sink.append(format!("w{w:02} {i:05} {}\n", "x".repeat(20)).as_bytes());
                    }
                    assert!(!sink.lock_gave_up, "writer {w} gave up on the log lock");
                });
            }
            let (mut max_log, mut max_rot, mut min_rot) = (0, 0, u64::MAX);
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst) == writers;
                if let Ok(m) = std::fs::symlink_metadata(path) {
                    max_log = max_log.max(m.len());
                }
                if let Ok(m) = std::fs::symlink_metadata(&rotated) {
                    max_rot = max_rot.max(m.len());
                    min_rot = min_rot.min(m.len());
                }
                if finished {
                    return (max_log, max_rot, min_rot);
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        })
    }

    /// Every writer meets the cap at once: one rotation, the file as it was at the cap in
    /// PATH.1, every line of every writer in PATH in its order.
    #[test]
    fn concurrent_writers_meeting_the_cap_rotate_once_and_lose_no_line() {
        let d = scratch("race-once");
        let path = d.join("n.log");
        let cap = 1 << 20;
        let mut filler: String = (0..cap / 10).map(|i| format!("{i:09}\n")).collect();
        filler.truncate(cap as usize - 11);
        filler.push('\n');
        let filler = &filler[..];
        std::fs::write(&path, filler).unwrap();
        let (max_log, max_rot, _) = race(&path, cap, 16, 300);
        assert!(max_log <= cap && max_rot <= cap, "{max_log} {max_rot}");
        assert!(
            std::fs::read_to_string(rotated_path(&path)).unwrap() == filler,
            "PATH.1 is not the file as it was at the cap"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        for w in 0..16 {
            let got: Vec<usize> = text
                .lines()
                .filter(|l| l.starts_with(&format!("w{w:02} ")))
                .map(|l| l[4..9].parse().unwrap())
                .collect();
            assert_eq!(got, (0..300).collect::<Vec<_>>(), "writer {w}");
        }
        assert_eq!(text.lines().count(), 16 * 300);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Many rotations: neither file ever exceeds the cap, PATH.1 is always a file that was
    /// full, and what is left of each writer is the end of what it wrote.
    #[test]
    fn concurrent_writers_keep_both_files_within_the_cap() {
        let d = scratch("race-many");
        let path = d.join("n.log");
        let cap = 4096;
        let line = 30;
        let (max_log, max_rot, min_rot) = race(&path, cap, 16, 2000);
        assert!(max_log <= cap && max_rot <= cap, "{max_log} {max_rot}");
        assert!(
            min_rot > cap - line,
            "PATH.1 was once not full: {min_rot} bytes"
        );
        let both = std::fs::read_to_string(rotated_path(&path)).unwrap()
            + &std::fs::read_to_string(&path).unwrap();
        for w in 0..16 {
            let got: Vec<usize> = both
                .lines()
                .filter(|l| l.starts_with(&format!("w{w:02} ")))
                .map(|l| l[4..9].parse().unwrap())
                .collect();
            let from = 2000 - got.len();
            assert_eq!(got, (from..2000).collect::<Vec<_>>(), "writer {w}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_busy_log_lock_delays_one_line_only_and_loses_none() {
        let d = scratch("busy");
        let path = d.join("n.log");
        let mut s = sink(&path, 1 << 20);
        s.lock_wait = Duration::from_millis(50);
        let holder = File::open(&path).unwrap();
        holder.lock().unwrap();
        s.append(b"one\n");
        s.append(b"two\n");
        assert!(s.lock_gave_up);
        drop(holder);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        let _ = std::fs::remove_dir_all(&d);
    }
}
