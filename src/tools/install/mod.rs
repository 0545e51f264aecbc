//! `natguard install` and `natguard uninstall`: put natguard on a node and take it off again.
//!
//! Install copies the running binary into the CNI bin dir and appends natguard's entry to the
//! node's active network list, the first `*.conf`/`*.conflist`/`*.json` file by name in the
//! netconf dir, which is the one kubelet, containerd and libcni pick. Every write is atomic, and
//! a run that has nothing to change writes nothing. The list is edited as text, so every other
//! byte of it survives. A lone plugin config is turned into a list of the same basename. A
//! directory that cannot be handled safely is refused with a message that names the file and
//! the reason. `--watch` keeps the entry there while the primary plugin's agent rewrites its
//! list; `--check` is the DaemonSet's readiness probe.
//!
//! The parts: [`args`] parses the command lines, [`entry`] builds natguard's entry from
//! `--config` and the flags, [`netconf_dir`] finds and loads the active list, [`splice`] edits
//! it as text, [`atomic`] writes files, [`flow`] is one install pass, [`watch`] the `--watch`
//! loop, [`record`] the files a watcher keeps beside the readiness file, [`serve`] the
//! watcher's scrape endpoint, [`uninstall`] the way back. Exit codes: 0 done, 1 refused or
//! failed (the message says why), 2 a usage error.

mod args;
pub(crate) mod atomic;
mod entry;
mod flow;
mod netconf_dir;
pub(crate) mod record;
pub(crate) mod self_repair;
mod serve;
mod splice;
mod uninstall;
mod watch;

use crate::error::Error;
use crate::tools::cli::options_or_exit;
use args::{InstallOpts, RunMode, UninstallMode, UninstallOpts, INSTALL_USAGE, UNINSTALL_USAGE};
use flow::{install_binary, install_conflist, place_guard, run_adopt, set_ready, Outcome, Write};
use netconf_dir::entry_present;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// natguard's plugin type, as it appears in a conflist.
pub(crate) const PLUGIN_TYPE: &str = "natguard";
/// Where runtimes look for plugin binaries unless configured otherwise.
pub(crate) const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";
pub(crate) use crate::restore::DEFAULT_NETCONF_DIR;
pub(crate) use crate::tools::watcher::DEFAULT_READY_FILE;

const EXIT_OK: i32 = 0;
const EXIT_FAILED: i32 = 1;

/// Log lines of a node tool go to stderr, which is its operator's terminal or its container's
/// log, in `format`, naming the subcommand.
fn start_logging(verb: &str, format: crate::log::Format) {
    crate::log::info_to_stderr();
    crate::log::set_format(format);
    crate::log::set_context(crate::log::Context::component(verb));
}

/// `natguard install ARGS...`; returns the exit code.
pub fn install_cli(args: &[String]) -> i32 {
    let opts = match options_or_exit("install", INSTALL_USAGE, args::parse_install_args(args)) {
        Ok(o) => o,
        Err(code) => return code,
    };
    start_logging("install", opts.log_format);
    entry::warn_about_entry(&opts.entry);
    let result = match opts.mode {
        RunMode::Check => return check(&opts),
        RunMode::Once => dirs_exist(&opts).and_then(|_| install_once(&opts)),
        RunMode::Watch => dirs_exist(&opts).and_then(|_| watch::run(&opts)),
    };
    match result {
        Ok(()) => EXIT_OK,
        Err(e) => {
            crate::warn!("{e}");
            EXIT_FAILED
        }
    }
}

/// The bin dir, the dir of the list to edit and a `--cache-dir` given exist, or are created with
/// `--create-dirs`. A path that does not exist is more often a typo than a wish: installing
/// there would pass the readiness probe while every pod fails with "plugin not found", and a
/// cache dir that is not the runtimes' would leave adopt and self-repair with no pod to find.
fn dirs_exist(opts: &InstallOpts) -> Result<(), Error> {
    let list_dir = match &opts.conflist {
        Some(c) => atomic::parent(c).to_path_buf(),
        None => opts.netconf_dir.clone(),
    };
    for (flag, dir) in [
        ("--cni-bin-dir", opts.bin_dir.as_path()),
        ("--netconf-dir", list_dir.as_path()),
    ] {
        ensure_dir(flag, dir, opts.create_dirs)?;
    }
    if let Some(cache) = &opts.cache_dir {
        // libcni makes its cache (`.../cni/results`) with a node's first pod: on a fresh node
        // the runtimes' own path is not there yet and is taken; any other path must exist.
        let libcni_layout = cache.ends_with("cni/results") || cache.ends_with("cni");
        if libcni_layout && fs::symlink_metadata(cache).is_err() {
            crate::info!(
                "--cache-dir {}: not there yet; libcni makes it with the node's first pod",
                cache.display()
            );
        } else {
            ensure_dir("--cache-dir", cache, opts.create_dirs)?;
        }
    }
    Ok(())
}

fn ensure_dir(flag: &str, dir: &Path, create: bool) -> Result<(), Error> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::Command(format!(
            "{flag} {}: not a directory",
            dir.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("{flag} {}: creating it", dir.display()), e))?;
            crate::info!("created {} (--create-dirs)", dir.display());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Command(format!(
            "{flag} {}: no such directory; check the path, or pass --create-dirs to create it",
            dir.display()
        ))),
        Err(e) => Err(Error::io(format!("{flag} {}", dir.display()), e)),
    }
}

/// A one-shot install: refuse before anything is copied, then the binary, then the list.
fn install_once(opts: &InstallOpts) -> Result<(), Error> {
    // The guard first, whatever the lists say: pods may start at any moment from here on.
    // `--no-adopt` keeps install off the kernel altogether.
    if opts.adopt {
        place_guard(opts)?;
    }
    // The binary goes first (the list must never name a plugin that is not there), but only
    // once the list is known to be editable.
    // A refusal changes nothing, the readiness file included: it still says what the node's
    // lists say (a `--conflist` that names no list says nothing about them).
    let refused = install_conflist(opts, Write::DryRun)
        .err()
        .map(|e| e.context("refusing"));
    if let Some(e) = refused {
        return Err(e);
    }
    install_binary(&opts.bin_dir)?;
    match install_conflist(opts, Write::Yes) {
        Ok(outcome) => {
            let path = match outcome {
                Outcome::UpToDate(p) => {
                    crate::info!("natguard is already in {}", p.display());
                    p
                }
                Outcome::Wrote(p) => p,
            };
            set_ready(&opts.ready_file, Some(&path));
            // Adopt on every run: it is idempotent, and an earlier run may have failed in it.
            if opts.adopt {
                run_adopt(opts);
            }
            Ok(())
        }
        Err(e) => Err(e.context("refusing")),
    }
}

/// `--check`: the readiness probe; one line on stdout, exit 0 iff ready. Without directory
/// flags it checks the directories the watcher recorded (see [`record`]). With `--config`
/// (the DaemonSet's ConfigMap), natguard's entry in the active list must also be the one that
/// file gives: a pod is not ready until the watcher has applied the config it mounts.
fn check(opts: &InstallOpts) -> i32 {
    let mut opts = opts.clone();
    if !opts.dirs_given {
        if let Some(r) = record::read_options(&opts.ready_file) {
            opts.bin_dir = r.bin_dir;
            opts.netconf_dir = r.netconf_dir;
            opts.conflist = r.conflist;
        }
    }
    let bin = opts.bin_dir.join(PLUGIN_TYPE);
    let bin_ok = fs::metadata(&bin).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0);
    if !bin_ok {
        println!("not ready: {} is missing", bin.display());
        return EXIT_FAILED;
    }
    match entry_present(&opts) {
        Ok(p) if opts.config_file.is_some() && !entry_is(&p, &opts.entry) => {
            println!(
                "not ready: natguard's entry in {} is not the one {} gives (yet)",
                p.display(),
                opts.config_file
                    .as_deref()
                    .unwrap_or(Path::new(""))
                    .display()
            );
            EXIT_FAILED
        }
        Ok(p) => {
            // A broken list costs only its own network: ready, and the line says which.
            let broken: Vec<String> = crate::restore::scan_networks(&opts.netconf_dir)
                .map(|n| n.broken.iter().map(|b| b.to_string()).collect())
                .unwrap_or_default();
            let broken = if broken.is_empty() {
                String::new()
            } else {
                format!("; BROKEN LIST(S): {}", broken.join("; "))
            };
            match opts.health.map(|max_age| health(&opts, max_age)) {
                Some(Err(why)) => {
                    println!("not ready: {why}{broken}");
                    EXIT_FAILED
                }
                Some(Ok(what)) => {
                    println!("ready: natguard is in {}; {what}{broken}", p.display());
                    EXIT_OK
                }
                None => {
                    println!("ready: natguard is in {}{broken}", p.display());
                    EXIT_OK
                }
            }
        }
        Err(e) => {
            println!("not ready: {e}");
            EXIT_FAILED
        }
    }
}

/// `--check --health`: natguard guards the node as its config plans it, and the watcher that
/// keeps it so is alive. The guard is compared with the plans a repair would apply (every
/// natguard network's shared objects, each with the node-wide guard, or the guard alone from
/// the entry where no conflist lists natguard yet), so a table someone deleted or emptied, a
/// chain unhooked or a set gone fails it; the watcher's heartbeat (its self-repair record,
/// rewritten every [`crate::tools::watcher::HEARTBEAT_EVERY`]) must be younger than
/// `max_age`, so a watcher frozen (SIGSTOP) or wedged fails it too, while the guard is still
/// there. Both pass again once the watcher has repaired the tables or been restarted.
fn health(opts: &InstallOpts, max_age: std::time::Duration) -> Result<String, String> {
    use crate::tools::watcher::{age_of, read_state, state_file_beside, watcher_running};
    let mut store =
        crate::store::open().map_err(|e| format!("cannot read natguard's state: {e}"))?;
    match store.installation() {
        Ok(crate::store::Installation::Guarding) => {}
        Ok(crate::store::Installation::NoTable) => {
            return Err("NOT GUARDING: no natguard table on this node".into())
        }
        Ok(crate::store::Installation::Incomplete { missing }) => {
            return Err(format!(
                "NOT GUARDING: table inet natguard lacks the node-wide guard's chain(s) {}",
                missing.join(", ")
            ))
        }
        Err(e) => return Err(format!("cannot read natguard's state: {e}")),
    }
    let networks = crate::restore::natguard_networks(&opts.netconf_dir).map_err(|e| {
        format!(
            "cannot read the conflists of {}: {e}",
            opts.netconf_dir.display()
        )
    })?;
    // Where no conflist lists natguard yet, the guard alone is planned from the entry: only
    // with --config is that the entry the watcher placed (without it, the liveness probe's
    // way, the chains above are what is checked).
    let entry = opts
        .config_file
        .as_ref()
        .and_then(|_| flow::entry_config(opts));
    let plans = crate::restore::guard_plans(&networks, entry.as_ref());
    for plan in &plans {
        store
            .check_shared(plan)
            .map_err(|e| format!("NOT GUARDING as configured: {e}"))?;
    }
    let state_file = state_file_beside(&opts.ready_file);
    let Some(record) = read_state(&state_file) else {
        return Err(format!(
            "no self-repair record at {}: no `install --watch` with self-repair runs here",
            state_file.display()
        ));
    };
    if watcher_running(&opts.ready_file) != Some(true) {
        return Err(format!(
            "the watcher (pid {}) is not running: nothing repairs natguard's tables",
            record.pid
        ));
    }
    let age = record.updated.map_or(f64::INFINITY, age_of);
    if age > max_age.as_secs_f64() {
        return Err(format!(
            "the watcher (pid {}) runs but its last heartbeat was {age:.0} s ago (more than {} s): \
             it is frozen or wedged, and would not repair a flush",
            record.pid,
            max_age.as_secs()
        ));
    }
    Ok(format!(
        "guarding ({} natguard network(s), as configured); watcher pid {} alive (heartbeat {age:.0} s ago)",
        networks.len(),
        record.pid
    ))
}

/// Whether natguard's entry in the list at `path` is `entry`.
fn entry_is(path: &Path, entry: &serde_json::Value) -> bool {
    netconf_dir::load(path)
        .ok()
        .and_then(|l| {
            netconf_dir::check_list(&l)
                .ok()?
                .iter()
                .find(|p| netconf_dir::is_natguard(p))
                .map(|p| p == entry)
        })
        .unwrap_or(false)
}

/// `natguard uninstall ARGS...`; returns the exit code.
pub fn uninstall_cli(args: &[String]) -> i32 {
    let opts: UninstallOpts = match options_or_exit(
        "uninstall",
        UNINSTALL_USAGE,
        args::parse_uninstall_args(args),
    ) {
        Ok(o) => o,
        Err(code) => return code,
    };
    start_logging("uninstall", opts.log_format);
    if opts.mode == UninstallMode::Check {
        return match uninstall::left_over(&opts) {
            None => {
                println!("clean: natguard is in no list and not in the bin dir");
                EXIT_OK
            }
            Some(what) => {
                println!("not clean: {what}");
                EXIT_FAILED
            }
        };
    }
    match uninstall::run(&opts) {
        Ok(()) if opts.mode == UninstallMode::Stay => {
            crate::info!("natguard is off this node; staying until SIGTERM (--stay)");
            match watch::wait_for_signal() {
                Ok(()) => EXIT_OK,
                Err(e) => {
                    crate::warn!("{e}");
                    EXIT_FAILED
                }
            }
        }
        Ok(()) => EXIT_OK,
        Err(e) => {
            crate::warn!("{e}");
            EXIT_FAILED
        }
    }
}
