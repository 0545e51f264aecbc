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
//! loop, [`uninstall`] the way back. Exit codes: 0 done, 1 refused or failed (the message says
//! why), 2 a usage error.

mod args;
pub(crate) mod atomic;
mod entry;
mod flow;
mod netconf_dir;
pub(crate) mod self_repair;
mod splice;
mod uninstall;
mod watch;

use crate::error::Error;
use args::{InstallOpts, Parsed, RunMode, UninstallOpts, INSTALL_USAGE, UNINSTALL_USAGE};
use flow::{install_binary, install_conflist, place_guard, run_adopt, set_ready, Outcome, Write};
use netconf_dir::entry_present;
use std::fs;
use std::os::unix::fs::MetadataExt;

/// natguard's plugin type, as it appears in a conflist.
pub(crate) const PLUGIN_TYPE: &str = "natguard";
/// Where runtimes look for plugin binaries unless configured otherwise.
pub(crate) const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";
/// Where runtimes look for network configs unless configured otherwise.
pub(crate) const DEFAULT_NETCONF_DIR: &str = "/etc/cni/net.d";
/// Exists while natguard's entry is in the active network list.
pub(crate) const DEFAULT_READY_FILE: &str = "/run/natguard/ready";

const EXIT_OK: i32 = 0;
const EXIT_FAILED: i32 = 1;
const EXIT_USAGE: i32 = 2;

/// Log lines of a node tool go to stderr, which is its operator's terminal or its container's
/// log, prefixed with the subcommand.
fn start_logging(verb: &str) {
    crate::log::info_to_stderr();
    crate::log::set_context(verb.to_string());
}

/// `natguard install ARGS...`; returns the exit code.
pub fn install_cli(args: &[String]) -> i32 {
    start_logging("install");
    let opts = match args::parse_install_args(args) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            print!("{INSTALL_USAGE}");
            return EXIT_OK;
        }
        Err(e) => {
            crate::warn!("error: {e}");
            eprint!("{INSTALL_USAGE}");
            return EXIT_USAGE;
        }
    };
    let result = match opts.mode {
        RunMode::Check => return check(&opts),
        RunMode::Once => install_once(&opts),
        RunMode::Watch => install_binary(&opts.bin_dir).and_then(|_| watch::run(&opts)),
    };
    match result {
        Ok(()) => EXIT_OK,
        Err(e) => {
            crate::warn!("{e}");
            EXIT_FAILED
        }
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
    let refused = install_conflist(opts, Write::DryRun)
        .err()
        .map(|e| e.context("refusing"));
    if let Some(e) = refused {
        set_ready(&opts.ready_file, entry_present(opts).ok().as_deref());
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
        Err(e) => {
            set_ready(&opts.ready_file, entry_present(opts).ok().as_deref());
            Err(e.context("refusing"))
        }
    }
}

/// `--check`: the readiness probe; one line on stdout, exit 0 iff ready.
fn check(opts: &InstallOpts) -> i32 {
    let bin = opts.bin_dir.join(PLUGIN_TYPE);
    let bin_ok = fs::metadata(&bin).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0);
    if !bin_ok {
        println!("not ready: {} is missing", bin.display());
        return EXIT_FAILED;
    }
    match entry_present(opts) {
        Ok(p) => {
            println!("ready: natguard is in {}", p.display());
            EXIT_OK
        }
        Err(e) => {
            println!("not ready: {e}");
            EXIT_FAILED
        }
    }
}

/// `natguard uninstall ARGS...`; returns the exit code.
pub fn uninstall_cli(args: &[String]) -> i32 {
    start_logging("uninstall");
    let opts: UninstallOpts = match args::parse_uninstall_args(args) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            print!("{UNINSTALL_USAGE}");
            return EXIT_OK;
        }
        Err(e) => {
            crate::warn!("error: {e}");
            eprint!("{UNINSTALL_USAGE}");
            return EXIT_USAGE;
        }
    };
    match uninstall::run(&opts) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            crate::warn!("{e}");
            EXIT_FAILED
        }
    }
}
