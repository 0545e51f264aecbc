//! The watcher's self-repair: natguard's tables restored within milliseconds of someone else
//! deleting, flushing or emptying them, instead of at the next ADD.
//!
//! It runs on a thread of its own, so neither side's debounce delays the other: the directory
//! watch may wait up to 400 ms for a list to settle, a repair should not. The thread waits (with
//! poll(2), never longer than [`CHECK_EVERY`]) on a [`Monitor`] of nf_tables' change
//! notifications. A transaction by someone other than natguard that touched natguard's tables,
//! or a loss of notifications (`ENOBUFS`), opens a burst; the burst ends once no such
//! notification came for [`QUIET`], or [`BURST_MAX`] after it began, whichever is first, and
//! no sooner than [`BURST_MAX`] after the previous repair; then one repair runs. So a storm of
//! flushes costs one repair per [`BURST_MAX`] at most, and other components' writes to their
//! own tables cost a read each and never a repair.
//!
//! A repair is [`restore::repair`]: the shared objects of every network whose conflist lists
//! natguard (pods or not), or the node-wide guard alone from natguard's entry where no conflist
//! lists natguard yet, and the entries of every live pod in the runtimes' result cache, in one
//! batch, as `reconcile` installs them. So a flush never leaves the node unguarded, whether or
//! not the watcher knows a pod. It writes nothing when nothing is missing, so the same call is
//! also the periodic check (every [`CHECK_EVERY`]) that catches what no notification said. Its
//! own notifications carry natguard's name and are ignored.
//!
//! The first check runs at start. Every attachment a check skips is logged with its reason
//! when it is first skipped (not again at every check while it stays skipped), and the last
//! check's skips are counted by reason.
//!
//! What happened is kept in [`STATE_FILE`] (JSON, replaced atomically after every repair or
//! check, and every [`HEARTBEAT_EVERY`] while idle, so its `updated` time is the thread's
//! heartbeat): repairs (checks that wrote something), checks, the time and cause of the last
//! repair and how long it took from the first notification, and the last check's skips by
//! reason. `natguard status` and `natguard metrics`
//! read it; without `--watch` there is no such file and they show nothing of it. A watcher
//! holds the node's watcher lock ([`super::record`]) before it starts here, so the record has
//! one writer, and a new watcher continues its counts: they never go down. Readers tell a
//! record whose watcher has exited by that lock; `uninstall` removes the record.
//!
//! The thread is not joined: on a signal the watcher's main loop exits the process, and a
//! repair cut short is a batch the kernel applied whole or not at all.

use super::atomic::write_atomic;
use crate::kernel::monitor::{Monitor, Verdict};
use crate::restore;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A burst ends after this long without another notification that demands a repair.
pub const QUIET: Duration = Duration::from_millis(10);
/// ... or this long after it began, whatever keeps coming. Two repairs are also at least this
/// far apart, so someone who flushes natguard's table in a loop gets at most one repair per
/// `BURST_MAX`, however their flushes are spaced.
pub const BURST_MAX: Duration = Duration::from_millis(200);
/// The periodic check without notifications: a backstop, as the timers of other agents are.
pub const CHECK_EVERY: Duration = Duration::from_secs(60);
pub use crate::tools::watcher::HEARTBEAT_EVERY;
pub use crate::tools::watcher::{read_state, state_file_beside, RepairStats};

/// A burst of notifications that demand a repair.
#[derive(Debug, Clone, PartialEq)]
struct Burst {
    first: Instant,
    last: Instant,
    cause: Verdict,
}

impl Burst {
    /// When the repair is due: [`QUIET`] after the last notification, at most [`BURST_MAX`]
    /// after the first.
    fn due(&self) -> Instant {
        (self.last + QUIET).min(self.first + BURST_MAX)
    }
}

/// Adds a verdict read at `now` to the burst under way (or opens one).
fn extend(burst: Option<Burst>, v: Verdict, now: Instant) -> Option<Burst> {
    if !v.needs_repair() {
        return burst;
    }
    Some(match burst {
        None => Burst {
            first: now,
            last: now,
            cause: v,
        },
        Some(b) => Burst {
            first: b.first,
            last: now,
            // The first foreign writer names the burst; a loss overrides it.
            cause: if v == Verdict::Lost { v } else { b.cause },
        },
    })
}

fn cause_text(v: &Verdict) -> String {
    match v {
        Verdict::Foreign { writer, objects } => {
            format!("{writer} changed {objects} object(s) of natguard's tables")
        }
        Verdict::Lost => "nf_tables notifications were lost (receive buffer overflow)".into(),
        Verdict::Quiet => "periodic check".into(),
    }
}

/// Starts the repair thread; false (logged) when nf_tables notifications are unavailable.
pub fn start(opts: restore::Options, state_file: PathBuf) -> bool {
    // The thread keeps the process's name, which is how its own writes are told apart.
    let (tx, rx) = std::sync::mpsc::channel();
    let rcvbuf = std::env::var(crate::kernel::monitor::RCVBUF_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let spawned = std::thread::Builder::new().spawn(move || match Monitor::open(rcvbuf) {
        Ok(m) => {
            let _ = tx.send(true);
            run(m, &opts, &state_file)
        }
        Err(e) => {
            crate::warn!("self-repair is off: cannot subscribe to nf_tables notifications: {e}");
            let _ = tx.send(false);
        }
    });
    if let Err(e) = spawned {
        crate::warn!("self-repair is off: cannot start its thread: {e}");
        return false;
    }
    rx.recv_timeout(Duration::from_secs(5)).unwrap_or(false)
}

fn run(mut m: Monitor, opts: &restore::Options, state_file: &Path) {
    // The watcher lock is held: whoever wrote a record has exited. Its counts go on from there,
    // so the counters a monitor scrapes never go down across a restart or a rollout.
    let previous = read_state(state_file);
    if let Some(p) = &previous {
        crate::info!(
            "self-repair: continuing the record of pid {} ({} repair(s) in {} check(s))",
            p.pid,
            p.repairs,
            p.checks
        );
    }
    let mut stats = RepairStats {
        pid: std::process::id(),
        instance: Some(crate::tools::watcher::instance().to_string()),
        repairing: true,
        ..previous.unwrap_or_default()
    };
    write_state(state_file, &mut stats);
    crate::info!(
        "self-repair: watching nf_tables notifications; a change of natguard's tables by anyone else is repaired within {} ms of the last one (at most {} ms into a burst)",
        QUIET.as_millis(),
        BURST_MAX.as_millis()
    );
    let mut burst: Option<Burst> = None;
    let mut broken_seen = Vec::new();
    let mut memo = restore::Memo::default();
    // At once: what is skipped is told (and counted) from the start.
    let mut check_due = Instant::now();
    let mut skipped = Skipped::default();
    let mut heartbeat_due = Instant::now() + HEARTBEAT_EVERY;
    // When the last repair ended: the next one waits until BURST_MAX after it.
    let mut last_end: Option<Instant> = None;
    let due = |b: &Burst, last_end: Option<Instant>| match last_end {
        Some(e) => b.due().max(e + BURST_MAX),
        None => b.due(),
    };
    loop {
        let deadline = burst
            .as_ref()
            .map_or(check_due, |b| due(b, last_end))
            .min(check_due)
            .min(heartbeat_due);
        if wait_readable(m.fd(), deadline.saturating_duration_since(Instant::now())) {
            let v = m.drain();
            burst = extend(burst, v, Instant::now());
        }
        let now = Instant::now();
        let cause = match &burst {
            Some(b) if now >= due(b, last_end) => Some((b.cause.clone(), b.first)),
            None if now >= check_due => Some((Verdict::Quiet, now)),
            _ => None,
        };
        let Some((cause, since)) = cause else {
            if now >= heartbeat_due {
                write_state(state_file, &mut stats);
                heartbeat_due = Instant::now() + HEARTBEAT_EVERY;
            }
            continue;
        };
        burst = None;
        check_due = Instant::now() + CHECK_EVERY;
        if repair_once(
            opts,
            &cause,
            since,
            &mut stats,
            &mut broken_seen,
            &mut memo,
            &mut skipped,
        ) {
            last_end = Some(Instant::now());
        }
        write_state(state_file, &mut stats);
        heartbeat_due = Instant::now() + HEARTBEAT_EVERY;
    }
}

/// The skips of the last check, by report line: a skip is logged when it first appears.
#[derive(Debug, Default)]
struct Skipped(std::collections::BTreeSet<String>);

impl Skipped {
    /// Logs the skips of `r` that the last check did not have, and counts them by reason.
    fn note(&mut self, r: &restore::Repair, stats: &mut RepairStats) {
        let now: std::collections::BTreeSet<String> =
            r.skipped.iter().map(|(_, line)| line.clone()).collect();
        for line in now.difference(&self.0) {
            crate::warn!("self-repair: {line}");
        }
        if now != self.0 && !now.is_empty() {
            let counts = restore::count_reasons(r.skipped.iter().map(|(k, _)| *k));
            crate::warn!(
                "self-repair: {} cached attachment(s) not restored: {}",
                now.len(),
                restore::reasons_in_words(&counts)
            );
        }
        self.0 = now;
        stats.skipped = restore::count_reasons(r.skipped.iter().map(|(k, _)| *k))
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect();
    }
}

/// One repair (or check): logged, counted. Whether it wrote something.
fn repair_once(
    opts: &restore::Options,
    cause: &Verdict,
    since: Instant,
    stats: &mut RepairStats,
    broken_seen: &mut Vec<String>,
    memo: &mut restore::Memo,
    skipped: &mut Skipped,
) -> bool {
    stats.checks += 1;
    let result = restore::repair_with(opts, memo);
    if let Ok(r) = &result {
        note_broken(&r.broken, broken_seen);
        skipped.note(r, stats);
    }
    match result {
        Ok(r) if r.ops > 0 => {
            let committed = r.committed.unwrap_or_else(Instant::now);
            let took = committed.saturating_duration_since(since).as_secs_f64() * 1000.0;
            stats.repairs += 1;
            stats.last_repair = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs_f64());
            stats.last_repair_ms = Some(took);
            stats.last_cause = Some(cause_text(cause));
            crate::info!(
                "self-repair: {}; restored {} with one batch ({} change(s)), committed {took:.1} ms after the first notification",
                cause_text(cause),
                what_was_checked(&r),
                r.ops
            );
            for f in &r.failed {
                crate::warn!("self-repair: {f}");
            }
            true
        }
        Ok(r) => {
            if *cause != Verdict::Quiet {
                crate::info!(
                    "self-repair: {}; {} intact, nothing written",
                    cause_text(cause),
                    what_was_checked(&r)
                );
            }
            for f in &r.failed {
                crate::warn!("self-repair: {f}");
            }
            false
        }
        Err(e) => {
            crate::warn!("self-repair: {}: repair failed: {e}", cause_text(cause));
            false
        }
    }
}

/// Logs the broken lists a repair left alone when they differ from the last check's (`seen`),
/// so a list that stays broken is not logged every minute.
fn note_broken(broken: &[restore::BrokenList], seen: &mut Vec<String>) {
    let now: Vec<String> = broken.iter().map(|b| b.to_string()).collect();
    if now != *seen {
        for b in &now {
            crate::warn!("self-repair: {b}");
        }
        if now.is_empty() && !seen.is_empty() {
            crate::info!("self-repair: every network list parses again");
        }
    }
    *seen = now;
}

/// What a repair covered, in words: the shared objects it checked and the pods.
fn what_was_checked(r: &restore::Repair) -> String {
    let shared = match r.networks.as_slice() {
        [] => "no shared objects (no conflist lists natguard)".to_string(),
        [n] if n == crate::plan::NODE => {
            "the node-wide metadata guard (no conflist lists natguard yet)".to_string()
        }
        nets => format!(
            "the node-wide metadata guard and the shared objects of network(s) {}",
            nets.join(", ")
        ),
    };
    match r.skipped.len() {
        0 => format!("{shared} and {} cached pod(s)", r.pods),
        n => {
            let counts = restore::count_reasons(r.skipped.iter().map(|(k, _)| *k));
            format!(
                "{shared} and {} cached pod(s) ({n} skipped: {})",
                r.pods,
                restore::reasons_in_words(&counts)
            )
        }
    }
}

/// A watcher that does not repair (`--no-repair`, `--no-adopt`) takes over the record an
/// earlier watcher left, if any: its counts stay, and it says that no self-repair runs now.
/// Without a record there is nothing to say: no file is made.
pub fn disown(state_file: &Path) {
    let Some(previous) = read_state(state_file) else {
        return;
    };
    crate::info!(
        "self-repair is off; the record of pid {} stays, marked as not repairing",
        previous.pid
    );
    let mut stats = RepairStats {
        pid: std::process::id(),
        instance: Some(crate::tools::watcher::instance().to_string()),
        repairing: false,
        ..previous
    };
    write_state(state_file, &mut stats);
}

fn write_state(path: &Path, stats: &mut RepairStats) {
    stats.updated = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs_f64());
    let text = format!("{}\n", stats.to_json());
    if let Err(e) = write_atomic(path, text.as_bytes(), 0o644, None, &|| true) {
        crate::debug!("self-repair: {}: {e}", path.display());
    }
}

/// poll(2) on one descriptor, at most `timeout`; whether it is readable.
fn wait_readable(fd: std::os::fd::BorrowedFd<'_>, timeout: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut pfd = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    // Whole milliseconds, rounded up, so a due time is never missed by a sub-millisecond early
    // wake.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i64;
    let t = Timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    };
    matches!(poll(&mut pfd, Some(&t)), Ok(n) if n > 0) && !pfd[0].revents().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::watcher::STATE_FILE;
    use serde_json::json;

    fn foreign(w: &str) -> Verdict {
        Verdict::Foreign {
            writer: w.into(),
            objects: 1,
        }
    }

    #[test]
    fn a_burst_ends_when_quiet_or_at_its_bound() {
        let t0 = Instant::now();
        let b = extend(None, foreign("nft"), t0).unwrap();
        assert_eq!(b.due(), t0 + QUIET);
        // Quiet verdicts neither open nor extend a burst.
        assert_eq!(extend(None, Verdict::Quiet, t0), None);
        let b2 = extend(Some(b.clone()), Verdict::Quiet, t0 + QUIET).unwrap();
        assert_eq!(b2, b);
        // Notifications every 10 ms keep it open, but never past BURST_MAX.
        let mut b = Some(b);
        let mut t = t0;
        while t < t0 + BURST_MAX * 3 {
            t += Duration::from_millis(10);
            b = extend(b, foreign("other"), t);
        }
        let b = b.unwrap();
        assert_eq!(b.due(), t0 + BURST_MAX);
        assert_eq!(b.cause, foreign("nft"), "the first writer names the burst");
        let lost = extend(Some(b), Verdict::Lost, t).unwrap();
        assert_eq!(lost.cause, Verdict::Lost);
    }

    #[test]
    fn the_state_round_trips() {
        let s = RepairStats {
            pid: 7,
            repairs: 2,
            checks: 5,
            last_repair: Some(1.5e9),
            last_repair_ms: Some(23.5),
            last_cause: Some("nft (pid 9) changed 3 object(s) of natguard's tables".into()),
            updated: Some(1.6e9),
            instance: Some("7-1600000000000000000".into()),
            repairing: false,
            skipped: vec![("netns_not_visible".into(), 2), ("no_natguard".into(), 1)],
            running: None,
        };
        assert_eq!(RepairStats::from_json(&s.to_json()), Some(s));
        // A record of a watcher from before skips were counted has none.
        let old = json!({"pid": 1, "repairs": 0, "checks": 1});
        assert_eq!(RepairStats::from_json(&old).unwrap().skipped, vec![]);
        let fresh = RepairStats::default();
        assert_eq!(RepairStats::from_json(&fresh.to_json()), Some(fresh));
        assert_eq!(RepairStats::from_json(&json!({"repairs": 1})), None);
        assert_eq!(read_state(Path::new("/nonexistent/repair.json")), None);
        assert_eq!(
            state_file_beside(Path::new(super::super::DEFAULT_READY_FILE)),
            Path::new(STATE_FILE)
        );
    }
}
