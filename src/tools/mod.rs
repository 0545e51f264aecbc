//! The node tools run by hand or by the DaemonSet: `status`, `metrics`, `adopt`/`reconcile`,
//! `install`. They reach kernel state only through the store, and plan pods only through the
//! verbs' preparation. Their command lines are parsed with [`cli`], one way for all of them.

pub mod adopt;
pub(crate) mod cli;
pub use cli::EXIT_USAGE;
pub mod install;
pub mod metrics;
pub(crate) mod report;
pub mod status;
pub(crate) mod watcher;

const VERSION_USAGE: &str = "usage: natguard version
  prints natguard's version and the git revision it was built from
";

/// `natguard version`; returns the exit code.
pub fn version_cli(args: &[String]) -> i32 {
    if let Err(code) =
        cli::options_or_exit("version", VERSION_USAGE, cli::parse_switches(args, &[]))
    {
        return code;
    }
    println!(
        "natguard {} (revision {})",
        env!("CARGO_PKG_VERSION"),
        env!("NATGUARD_GIT_REVISION")
    );
    0
}
