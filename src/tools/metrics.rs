//! `natguard metrics`, and the metrics file `natguard install --watch --metrics-file` keeps
//! for node_exporter's textfile collector: the node's [`super::report::NodeReport`] in the
//! Prometheus text exposition format.
//!
//! The file is replaced whole each time (a temporary file in the same directory, renamed over
//! it), so a collector never reads half of it. The temporary file's name starts with a dot and
//! ends in `.tmp`, which the textfile collector (it reads `*.prom`) skips.

use super::install::atomic::write_atomic;
use super::report;
use super::status::collect_or_unreadable;
use crate::error::Result;
use crate::tools::cli::{options_or_exit, parse_switches};
use std::path::Path;

pub fn cli(args: &[String]) -> i32 {
    if let Err(code) = options_or_exit("metrics", USAGE, parse_switches(args, &[])) {
        return code;
    }
    let (r, code) = collect_or_unreadable();
    print!("{}", report::render_prometheus(&r));
    code
}

const USAGE: &str = "usage: natguard metrics
  prints natguard's counters in the Prometheus text format (see docs/operations.md, \"Metrics\")
";

/// Writes the metrics of the calling thread's network namespace to `path`, atomically. When
/// natguard's state cannot be read, the file says so (`natguard_up 0`) rather than going stale.
pub(crate) fn write_file(path: &Path) -> Result<()> {
    let (r, _) = collect_or_unreadable();
    let text = report::render_prometheus(&r);
    write_atomic(path, text.as_bytes(), 0o644, None, &|| true)
}
