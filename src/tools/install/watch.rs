//! `natguard install --watch`: keep natguard's entry in the active list while agents of the
//! primary plugin rewrite their lists, until SIGTERM or SIGINT.
//!
//! The watcher waits on inotify for the netconf dir (or the `--conflist` file's dir) and on a
//! self-pipe that the signal handlers write to, with poll(2), so a signal is never lost between
//! two checks. Beside it, on a thread of its own, [`self_repair`] restores natguard's tables
//! within milliseconds when someone else flushes them (off with `--no-adopt` or
//! `--no-repair`). After an event on a config name it waits until the dir has
//! been quiet for a moment (bounded, so the entry is back well within a second) and runs one
//! install pass. Its own writes wake it once and that pass finds nothing to do, so it never
//! loops. Every pass that writes the list runs `natguard adopt`, which brings the pods that
//! started while the entry was missing under policy, and runs it once more ten seconds later for
//! the pods whose ADD was still under way at the first adopt; the first pass adopts whatever it
//! finds, as a one-shot install does. A full pass also runs every minute without events (a lost
//! event, a deleted binary). If the dir itself goes away, the watcher checks once a second for
//! it to come back.
//!
//! With `--metrics-file`, the watcher also rewrites that file with natguard's counters every
//! `--metrics-interval` seconds (and once at start), atomically, for node_exporter's textfile
//! collector. A write that fails (a missing or read-only directory, a full disk) is logged and
//! tried again at the next tick; it never stops the watcher. The ticks share the one poll(2)
//! with the directory events, so a busy directory does not delay them by more than a debounce.
//!
//! With `--config`, the watcher also follows that file: a second inotify watch on its
//! directory, because a ConfigMap volume is updated by swapping the `..data` symlink in that
//! directory, which no watch on the file itself would see. On any event there (and at every
//! resync) the file is read again and built into an entry with the same flags, then checked
//! with the plugin's own config parser. An entry that parses and differs becomes natguard's
//! entry in the active list (the same pass as after an agent's rewrite, adopt included) and the
//! node-wide guard is converged to it; one that does not parse is logged and the entry in the
//! list stays the last good one. The watcher's own log format and the guard that self-repair
//! restores where no list names natguard are the ones of its start.
//!
//! With `--metrics-port`, [`super::serve`] answers `GET /metrics` on a thread of its own.
//!
//! Unless `--no-adopt` is given or natguard's configs say `metadata.serveProxy: false`, the
//! watcher also serves natguard's metadata proxy ([`crate::proxy`]) on the proxy addresses and
//! port, on a thread of its own ([`start_proxy`]).
//!
//! Only one watcher runs per node: it first takes the lock of [`super::record`] (a second
//! watcher waits for it, doing nothing else), then copies the binary and records its
//! directories for the readiness probe.
//!
//! On a signal it exits 0. With `--cleanup-on-exit` it first cuts natguard's entry out of the
//! active list (atomically; the binary and the kernel state stay) and removes the readiness
//! file, so pods created after the watcher is gone start without natguard: the node fails open.

use super::args::MetricsFile;
use super::atomic::parent;
use super::entry::{build_entry, validate_entry};
use super::flow::{
    entry_config, install_binary, install_conflist, place_guard, retrying, run_adopt, set_ready,
    Outcome, Write,
};
use super::netconf_dir::{active_file, entry_present, is_conf_name};
use super::record::{lock_file_beside, take_watch_lock, write_options, Waited};
use super::self_repair;
use super::uninstall::remove_entries;
use super::InstallOpts;
use crate::error::{Error, Result};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::inotify;
use rustix::pipe::PipeFlags;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Quiet period after a directory event before the list is checked again.
const DEBOUNCE_QUIET: Duration = Duration::from_millis(100);
/// Upper bound of the debounce: the entry is back well within a second of a rewrite.
const DEBOUNCE_MAX: Duration = Duration::from_millis(400);
/// Full re-check interval without events (lost events, a deleted binary).
const RESYNC_EVERY: Duration = Duration::from_secs(60);
/// After a pass that wrote the list, adopt runs again this much later: an ADD that had read the
/// list without natguard and was still running at the first adopt has written its CNI cache
/// entry by then.
const ADOPT_AGAIN_AFTER: Duration = Duration::from_secs(10);
/// How often a vanished watch dir is looked for.
const DIR_RETRY: Duration = Duration::from_secs(1);

const WATCH_MASK: u32 = libc::IN_CLOSE_WRITE
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE
    | libc::IN_CREATE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF;

/// Why a pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// At start, or when the watched dir is back: adopt whatever the list looks like.
    First,
    /// After a relevant directory event.
    Event,
    /// The periodic re-check: silent when nothing changed.
    Resync,
}

/// What ended a wait.
enum Wake {
    Signal,
    /// A config file of the dir changed (or events were lost).
    Changed,
    /// The watched dir was deleted or moved.
    DirGone,
    /// Nothing happened until the timeout.
    Timeout,
    /// Events on names that are not configs.
    Unrelated,
    /// Something happened in the `--config` file's directory.
    Config,
}

/// Runs the watcher until a signal; Err when it cannot start or its cleanup failed.
pub(crate) fn run(given: &InstallOpts) -> Result<()> {
    // The entry changes when `--config` does; everything else stays as given.
    let mut opts = given.clone();
    let dir = match &opts.conflist {
        Some(c) => parent(c).to_path_buf(),
        None => opts.netconf_dir.clone(),
    };
    let sig = signal_pipe().map_err(|e| Error::io("installing signal handlers", e))?;
    // One watcher per node: a second one (a rollout's new pod) waits here for the first to exit.
    let _lock = match take_watch_lock(&opts.ready_file, &mut |t| poll_in(&[sig], Some(t))[0]) {
        Ok(Waited::Held(l)) => l,
        Ok(Waited::Stopped) => {
            crate::info!("stopping; the other watcher was still running");
            return Ok(());
        }
        Err(e) => {
            let lock = lock_file_beside(&opts.ready_file);
            return Err(Error::io(format!("taking {}", lock.display()), e));
        }
    };
    install_binary(&opts.bin_dir)?;
    write_options(&opts);
    // A watcher that will not repair says so at once in the record it takes over.
    if !(opts.adopt && opts.repair) {
        self_repair::disown(&self_repair::state_file_beside(&opts.ready_file));
    }
    let mut ino = Inotify::new().map_err(|e| Error::io("inotify", e))?;
    ino.add(&dir)
        .map_err(|e| Error::io(format!("watching {}", dir.display()), e))?;
    crate::info!("watching {}", dir.display());
    let mut config = watch_config(&opts);
    // The guard before anything else, so that a node whose runtime starts after this
    // process is ready never runs a pod without it. Self-repair keeps it from here on.
    if opts.adopt {
        place_guard(&opts)?;
    }
    // When the follow-up adopt after a write is due.
    let mut adopt_due = reconcile(&opts, Pass::First);
    // Self-repair touches the kernel, as adopt does: `--no-adopt` turns both off.
    if opts.adopt && opts.repair {
        let (given, cache_dir) = opts.cache_dirs();
        if cache_dir != given {
            crate::info!(
                "{} is the CNI cache root; self-repair reads its results in {}",
                given.display(),
                cache_dir.display()
            );
        }
        let adopt_opts = crate::restore::Options {
            cache_dir,
            netconf_dir: opts.netconf_dir.clone(),
            reconcile: true,
            known: Default::default(),
            node_guard: entry_config(&opts),
        };
        self_repair::start(adopt_opts, self_repair::state_file_beside(&opts.ready_file));
    }
    // `--no-adopt` keeps the watcher off the node's network altogether: no proxy either.
    if opts.adopt {
        start_proxy(&opts);
    }
    if let Some(addr) = opts.metrics_listen {
        // A port that cannot be bound is logged; the watcher's work goes on without it.
        if let Err(e) =
            super::serve::start(addr, opts.metrics_pod_labels, opts.metrics_allow.clone())
        {
            crate::warn!("{e}; serving no metrics");
        }
    }
    // A systemd unit of `Type=notify` (deploy/node/natguard.service) orders the container
    // runtime and the kubelet after this point: the guard is in place, the list handled.
    notify_ready();
    let mut resync_due = Instant::now() + RESYNC_EVERY;
    let metrics_file = opts.metrics.clone();
    let mut metrics = metrics_file.as_ref().map(MetricsTicks::new);
    loop {
        if let Some(m) = &mut metrics {
            m.tick();
        }
        if ino.wd.is_none() {
            let timeout = metrics
                .as_ref()
                .map_or(DIR_RETRY, |m| DIR_RETRY.min(until(m.due)));
            if poll_in(&[sig], Some(timeout))[0] {
                break;
            }
            if ino.add(&dir).is_ok() {
                crate::info!("watching {} again", dir.display());
                adopt_due = reconcile(&opts, Pass::First).or(adopt_due);
                resync_due = Instant::now() + RESYNC_EVERY;
            }
            continue;
        }
        let next = [Some(resync_due), adopt_due, metrics.as_ref().map(|m| m.due)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(resync_due);
        match wait_for_change(&mut ino, sig, config.as_mut(), until(next)) {
            Wake::Signal => break,
            Wake::Changed => {
                adopt_due = reconcile(&opts, Pass::Event).or(adopt_due);
                resync_due = Instant::now() + RESYNC_EVERY;
            }
            Wake::Config => {
                adopt_due = reload_config(&mut opts).or(adopt_due);
            }
            // Only the resync's own deadline runs a pass; a metrics tick or a due adopt does
            // not.
            Wake::Timeout if Instant::now() >= resync_due => {
                // A lost event of the config's directory is caught here too.
                adopt_due = reload_config(&mut opts).or(adopt_due);
                adopt_due = reconcile(&opts, Pass::Resync).or(adopt_due);
                resync_due = Instant::now() + RESYNC_EVERY;
            }
            Wake::Timeout | Wake::Unrelated => {}
            Wake::DirGone => {
                ino.wd = None;
                set_ready(&opts.ready_file, None);
            }
        }
        // Checked after every wake, so a busy dir cannot put it off.
        if adopt_due.is_some_and(|due| Instant::now() >= due) {
            crate::info!("adopting again, for pods whose ADD was under way at the last adopt");
            run_adopt(&opts);
            adopt_due = None;
        }
    }
    stop(&opts)
}

/// An inotify watch on the `--config` file's directory, if there is a `--config`. A directory
/// that cannot be watched is logged: the file is then read again at every resync only.
fn watch_config(opts: &InstallOpts) -> Option<Inotify> {
    let file = opts.config_file.as_ref()?;
    let dir = parent(file);
    let watched = Inotify::new().and_then(|mut i| i.add(dir).map(|()| i));
    match watched {
        Ok(i) => {
            crate::info!("following {} for changes", file.display());
            Some(i)
        }
        Err(e) => {
            crate::warn!(
                "cannot watch {} ({e}); {} is read again every {} s only",
                dir.display(),
                file.display(),
                RESYNC_EVERY.as_secs()
            );
            None
        }
    }
}

/// Reads `--config` again. A new entry that the plugin's parser accepts replaces the old one
/// in the active list (a pass like an agent's rewrite) and the node-wide guard is converged to
/// it; a bad one is logged and the old entry kept. Returns when the follow-up adopt is due.
fn reload_config(opts: &mut InstallOpts) -> Option<Instant> {
    let file = opts.config_file.clone()?;
    let built =
        build_entry(Some(&file), &opts.entry_flags).and_then(|e| validate_entry(&e).map(|_| e));
    let entry = match built {
        Ok(e) => e,
        Err(e) => {
            crate::warn!("{}: {e}; keeping natguard's entry as it is", file.display());
            return None;
        }
    };
    if entry == opts.entry {
        return None;
    }
    super::entry::warn_about_entry(&entry);
    crate::info!(
        "{} changed; natguard's entry is now {}",
        file.display(),
        entry
    );
    opts.entry = entry;
    let due = reconcile(opts, Pass::Event);
    if opts.adopt {
        if let Err(e) = place_guard(opts) {
            crate::warn!("{e}");
        }
    }
    due
}

/// Waits for SIGTERM or SIGINT (`uninstall --stay`).
pub(crate) fn wait_for_signal() -> Result<()> {
    let sig = signal_pipe().map_err(|e| Error::io("installing signal handlers", e))?;
    while !poll_in(&[sig], None)[0] {}
    Ok(())
}

/// How long until `t` (zero once it has passed).
fn until(t: Instant) -> Duration {
    t.saturating_duration_since(Instant::now())
}

/// Starts natguard's metadata proxy where natguard's entry (and every natguard network of the
/// netconf dir) has `proxy` endpoints and `metadata.serveProxy` (the default): on each
/// network's proxy addresses and port, resolved as the plan resolves them. Its cloud is
/// `metadata.proxyCloud`, else the entry's preset, else what the DMI strings say.
fn start_proxy(opts: &InstallOpts) {
    use crate::config::EndpointMode;
    let entry = entry_config(opts);
    let mut cfgs: Vec<crate::config::Config> = entry.iter().cloned().collect();
    if let Ok(nets) = crate::restore::natguard_networks(&opts.netconf_dir) {
        cfgs.extend(nets.into_values());
    }
    let mut listen = Vec::new();
    for cfg in cfgs
        .iter()
        .filter(|c| c.metadata.serve_proxy && c.metadata.has(EndpointMode::Proxy))
    {
        let f = crate::node::facts(cfg);
        let port = cfg.metadata.proxy_port;
        for a in [
            f.proxy_v4.map(std::net::IpAddr::V4),
            f.proxy_v6.map(std::net::IpAddr::V6),
        ]
        .into_iter()
        .flatten()
        {
            let sa = std::net::SocketAddr::new(a, port);
            if !listen.contains(&sa) {
                listen.push(sa);
            }
        }
    }
    if listen.is_empty() {
        crate::info!("metadata proxy: not served (no proxy endpoints with metadata.serveProxy)");
        return;
    }
    let cfg = entry.or_else(|| cfgs.first().cloned()).unwrap_or_default();
    let (cloud, why) = match (cfg.metadata.proxy_cloud, &cfg.metadata.preset) {
        (Some(c), _) => (Some(c), "metadata.proxyCloud".to_string()),
        (None, Some(p)) if p.cloud.is_some() => (p.cloud, "metadata.preset".to_string()),
        _ => {
            let d = crate::clouds::detect(&crate::clouds::Dmi::read());
            (d.cloud, d.describe())
        }
    };
    let api = cloud.map(crate::proxy::rules::Api::of);
    let name = match (cloud, api) {
        (Some(c), Some(_)) => format!("{} ({why})", c.as_str()),
        (Some(c), None) => format!("{} (no allow-list: every request refused)", c.as_str()),
        (None, _) => format!("no cloud ({why}): every request refused"),
    };
    let o = crate::proxy::Options {
        listen,
        api,
        cloud: name,
        record: crate::tools::watcher::proxy_file_beside(&opts.ready_file),
    };
    if let Err(e) = crate::proxy::start(o) {
        crate::warn!("metadata proxy: cannot start: {e}");
    }
}

/// The metrics file and when it is next written.
struct MetricsTicks<'a> {
    file: &'a MetricsFile,
    due: Instant,
    /// Why the last write failed: the same failure is logged once, not at every tick, and the
    /// next success is logged, so the log shows the recovery.
    failing: Option<String>,
}

impl<'a> MetricsTicks<'a> {
    fn new(file: &'a MetricsFile) -> Self {
        crate::info!(
            "writing metrics to {} every {} s",
            file.path.display(),
            file.interval.as_secs()
        );
        MetricsTicks {
            file,
            due: Instant::now(),
            failing: None,
        }
    }

    /// Writes the file if it is due; a failure is logged and the next tick tries again.
    fn tick(&mut self) {
        let now = Instant::now();
        if now < self.due {
            return;
        }
        // The next tick counts from this one, so a slow write does not make them bunch up.
        self.due = now + self.file.interval;
        match crate::tools::metrics::write_file(&self.file.path) {
            Ok(()) => {
                if self.failing.take().is_some() {
                    crate::info!("metrics written to {} again", self.file.path.display());
                }
            }
            Err(e) => {
                let e = e.to_string();
                if self.failing.as_deref() != Some(e.as_str()) {
                    crate::warn!(
                        "cannot write metrics: {e}; trying again every {} s",
                        self.file.interval.as_secs()
                    );
                }
                self.failing = Some(e);
            }
        }
    }
}

/// Waits (up to `timeout`) for the next relevant event, then for the dir to be quiet for a
/// moment (bounded). An event in the config's directory is answered at once (its reload reads
/// the file whole and is cheap; a half-swapped ConfigMap wakes it again).
fn wait_for_change(
    ino: &mut Inotify,
    sig: BorrowedFd<'_>,
    config: Option<&mut Inotify>,
    timeout: Duration,
) -> Wake {
    let ready = {
        let mut fds = vec![ino.fd.as_fd(), sig];
        if let Some(c) = &config {
            fds.push(c.fd.as_fd());
        }
        poll_in(&fds, Some(timeout))
    };
    if ready[1] {
        return Wake::Signal;
    }
    if let Some(c) = config.filter(|_| ready.get(2) == Some(&true)) {
        c.drain();
        return Wake::Config;
    }
    if !ready[0] {
        return Wake::Timeout;
    }
    let fds = [ino.fd.as_fd(), sig];
    let (mut relevant, mut gone) = ino.drain();
    let start = Instant::now();
    while relevant && start.elapsed() < DEBOUNCE_MAX {
        let r = poll_in(&fds, Some(DEBOUNCE_QUIET));
        if r[1] {
            return Wake::Signal;
        }
        if !r[0] {
            break;
        }
        let (rel, g) = ino.drain();
        relevant |= rel;
        gone |= g;
    }
    match (gone, relevant) {
        (true, _) => Wake::DirGone,
        (false, true) => Wake::Changed,
        (false, false) => Wake::Unrelated,
    }
}

/// Tells systemd that the watcher is ready (`READY=1` on `$NOTIFY_SOCKET`), when it runs as a
/// unit of `Type=notify`; nothing otherwise. A socket name starting with `@` is in the
/// abstract namespace.
fn notify_ready() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(&path),
    };
    let sent = addr.and_then(|a| UnixDatagram::unbound()?.send_to_addr(b"READY=1", &a));
    match sent {
        Ok(_) => crate::info!("told systemd: ready"),
        Err(e) => crate::warn!("NOTIFY_SOCKET {}: {e}", path.to_string_lossy()),
    }
}

/// One pass: binary present, entry present, readiness file, adopt after a write. Returns when the
/// follow-up adopt is due if this pass wrote the list.
fn reconcile(opts: &InstallOpts, pass: Pass) -> Option<Instant> {
    if let Err(e) = install_binary(&opts.bin_dir) {
        crate::warn!("error: {e}");
    }
    match install_conflist(opts, Write::Yes) {
        Ok(Outcome::UpToDate(p)) => {
            if pass != Pass::Resync {
                crate::info!("natguard is in {}; nothing to write", p.display());
            }
            set_ready(&opts.ready_file, Some(&p));
            if opts.adopt && pass == Pass::First {
                run_adopt(opts);
            }
            None
        }
        Ok(Outcome::Wrote(p)) => {
            set_ready(&opts.ready_file, Some(&p));
            if !opts.adopt {
                return None;
            }
            run_adopt(opts);
            Some(Instant::now() + ADOPT_AGAIN_AFTER)
        }
        Err(e) => {
            crate::warn!("cannot insert natguard: {e}; waiting for the next change");
            set_ready(&opts.ready_file, entry_present(opts).ok().as_deref());
            None
        }
    }
}

/// After a signal: with `--cleanup-on-exit`, natguard's entry out of the active list.
fn stop(opts: &InstallOpts) -> Result<()> {
    if !opts.cleanup_on_exit {
        crate::info!("stopping; natguard's entry stays in the active list");
        return Ok(());
    }
    crate::info!("stopping; --cleanup-on-exit: removing natguard's entry from the active list");
    match retrying(|| remove_from_active(opts)) {
        Ok(Some(p)) => crate::info!("removed natguard's entry from {}", p.display()),
        Ok(None) => crate::info!("natguard is not in the active list; nothing to remove"),
        // The entry may still be listed: the readiness file stays true to that.
        Err(e) => return Err(e.context("--cleanup-on-exit")),
    }
    set_ready(&opts.ready_file, None);
    Ok(())
}

/// Cuts natguard's entry out of the active list; Ok(None) when there is no list or no entry.
fn remove_from_active(opts: &InstallOpts) -> Result<Option<PathBuf>> {
    let path = match active_file(opts) {
        Ok(p) => p,
        // No config in the dir (the only refusal active_file makes), or no dir.
        Err(Error::Command(_)) => return Ok(None),
        Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    if let Err(e) = fs::symlink_metadata(&path) {
        if e.kind() == io::ErrorKind::NotFound {
            return Ok(None);
        }
    }
    Ok(remove_entries(&path)?.then_some(path))
}

/// The signal pipe's (read, write) ends, made once per process and kept for its life.
static SIGNAL_PIPE: OnceLock<(OwnedFd, OwnedFd)> = OnceLock::new();

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: reading a OnceLock that is set is an atomic load, and write(2) is one
    // syscall.
    if let Some((_, w)) = SIGNAL_PIPE.get() {
        let _ = rustix::io::write(w, b"x");
    }
}

/// A pipe that becomes readable when SIGTERM or SIGINT arrives.
fn signal_pipe() -> io::Result<BorrowedFd<'static>> {
    let (r, _) = match SIGNAL_PIPE.get() {
        Some(pipe) => pipe,
        None => {
            let pair = rustix::pipe::pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC)?;
            SIGNAL_PIPE.get_or_init(|| pair)
        }
    };
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a zeroed sigaction with a handler that is async-signal-safe (it reads the
        // pipe, already set, and calls write(2)); no dependency wraps sigaction.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(r.as_fd())
}

/// An inotify instance watching one directory.
struct Inotify {
    fd: File,
    wd: Option<i32>,
}

impl Inotify {
    fn new() -> io::Result<Self> {
        let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)?;
        Ok(Inotify {
            fd: File::from(fd),
            wd: None,
        })
    }

    fn add(&mut self, dir: &Path) -> io::Result<()> {
        let mask = inotify::WatchFlags::from_bits_retain(WATCH_MASK | libc::IN_ONLYDIR);
        self.wd = Some(inotify::add_watch(&self.fd, dir, mask)?);
        Ok(())
    }

    /// Reads all pending events; returns (relevant to the configs, the watch is gone).
    fn drain(&self) -> (bool, bool) {
        let mut relevant = false;
        let mut gone = false;
        let mut buf = [0u8; 8192];
        loop {
            let n = match (&self.fd).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break, // EAGAIN: nothing more
            };
            let mut off = 0;
            while off + 16 <= n {
                let u32_at = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().unwrap());
                let mask = u32_at(off + 4);
                let len = u32_at(off + 12) as usize;
                let name_bytes = &buf[off + 16..(off + 16 + len).min(n)];
                let name_end = name_bytes.iter().position(|&c| c == 0).unwrap_or(len);
                let name = OsStr::from_bytes(&name_bytes[..name_end.min(name_bytes.len())]);
                if mask & (libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0 {
                    gone = true;
                }
                if mask & libc::IN_Q_OVERFLOW != 0 || is_conf_name(name) {
                    relevant = true;
                }
                off += 16 + len;
            }
        }
        (relevant, gone)
    }
}

/// poll(2) on the descriptors for reading; returns which are readable.
fn poll_in(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> Vec<bool> {
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|&fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
        .collect();
    // Whole milliseconds, as poll(2) takes them.
    let t = timeout.map(|t| {
        let ms = t.as_millis().min(i32::MAX as u128) as i64;
        Timespec {
            tv_sec: ms / 1000,
            tv_nsec: (ms % 1000) * 1_000_000,
        }
    });
    match poll(&mut pfds, t.as_ref()) {
        Ok(n) if n > 0 => pfds.iter().map(|p| !p.revents().is_empty()).collect(),
        _ => vec![false; fds.len()],
    }
}
