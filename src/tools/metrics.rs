//! `natguard metrics`, the metrics file `natguard install --watch --metrics-file` keeps for
//! node_exporter's textfile collector, and the body `install --watch --metrics-port` serves: the
//! node's [`super::report::NodeReport`] in the Prometheus text exposition format, one text for
//! all three.
//!
//! The file is replaced whole each time (a temporary file in the same directory, renamed over
//! it), so a collector never reads half of it. The temporary file's name starts with a dot and
//! ends in `.tmp`, which the textfile collector (it reads `*.prom`) skips.

use super::report;
use super::status::collect_or_unreadable;
use crate::error::{Error, Result};
use crate::fsutil::{replace, temp_beside, How};
use crate::tools::cli::{options_or_exit, parse_switches};
use std::path::Path;

pub fn cli(args: &[String]) -> i32 {
    if let Err(code) = options_or_exit("metrics", USAGE, parse_switches(args, &[])) {
        return code;
    }
    let (text, code) = exposition();
    print!("{text}");
    code
}

/// The exposition of the calling thread's network namespace, and the exit code `metrics`
/// gives it (non-zero when natguard's state cannot be read: the text then says
/// `natguard_up 0`).
pub(crate) fn exposition() -> (String, i32) {
    let (r, code) = collect_or_unreadable();
    (report::render_prometheus(&r), code)
}

/// What the scrape endpoint serves: the exposition, without the per-pod series (which name
/// every pod) unless `pod_labels`.
pub(crate) fn exposition_for_scrape(pod_labels: bool) -> String {
    let (r, _) = collect_or_unreadable();
    let pods = if pod_labels {
        report::PodSeries::Shown
    } else {
        report::PodSeries::Hidden
    };
    report::render_prometheus_with(&r, pods)
}

const USAGE: &str = "usage: natguard metrics
  prints natguard's counters in the Prometheus text format (see docs/operations.md, \"Metrics\")
";

/// Writes the metrics of the calling thread's network namespace to `path`, atomically. When
/// natguard's state cannot be read, the file says so (`natguard_up 0`) rather than going stale.
pub(crate) fn write_file(path: &Path) -> Result<()> {
    let (text, _) = exposition();
    let how = How {
        durable: true,
        ..How::mode(0o644)
    };
    replace(path, &temp_beside(path), text.as_bytes(), how)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
