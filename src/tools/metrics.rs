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
use std::path::Path;

pub fn cli(args: &[String]) -> i32 {
    match args {
        [] => {}
        [a] if a == "-h" || a == "--help" => {
            println!("usage: natguard metrics\n  prints natguard's counters in the Prometheus text format");
            return 0;
        }
        [a, ..] => {
            eprintln!("natguard metrics: unexpected argument {a:?}\nusage: natguard metrics");
            return 2;
        }
    }
    let (r, code) = collect_or_unreadable();
    print!("{}", report::render_prometheus(&r));
    code
}

/// Writes the metrics of the calling thread's network namespace to `path`, atomically. When
/// natguard's state cannot be read, the file says so (`natguard_up 0`) rather than going stale.
pub(crate) fn write_file(path: &Path) -> Result<()> {
    let (r, _) = collect_or_unreadable();
    let text = report::render_prometheus(&r);
    write_atomic(path, text.as_bytes(), 0o644, None, &|| true)
}
