//! `natguard adopt` and `natguard reconcile`: the command lines over [`crate::restore`], which
//! brings pods that got no ADD from natguard under policy from the runtimes' CNI result cache.
//! Each prints one line per attachment and a summary; the exit code is 1 when any failed. A list
//! whose natguard entry does not parse is named on a line of its own; its network is left as it
//! is and the others are served (exit 0).

use crate::error::Result;
use crate::restore::{results_dir, run, Options};
use crate::tools::cli::{is_help, options_or_exit, unknown, Args, Parsed};

pub(crate) const USAGE_ADOPT: &str = "usage: natguard adopt [--cache-dir DIR] [--netconf-dir DIR]
  brings pods that predate natguard under policy, from the CNI result cache, and deletes
  their metadata flows that bypassed the DNAT
  --cache-dir DIR     the CNI result cache (default /var/lib/cni/results; the cache root
                      /var/lib/cni is read as its results/ directory)
  --netconf-dir DIR   where network configs live (default /etc/cni/net.d)
  --log-format text|json  log lines as text (default) or one JSON object per line
";

pub(crate) const USAGE_RECONCILE: &str =
    "usage: natguard reconcile [--cache-dir DIR] [--netconf-dir DIR]
  restores every pod's entries from the CNI result cache (exempt pods too); touches no flow
  --cache-dir DIR     the CNI result cache (default /var/lib/cni/results; the cache root
                      /var/lib/cni is read as its results/ directory)
  --netconf-dir DIR   where network configs live (default /etc/cni/net.d)
  --log-format text|json  log lines as text (default) or one JSON object per line
";

fn parse_args(args: &[String], reconcile: bool) -> Result<Parsed<(Options, crate::log::Format)>> {
    let mut format = crate::log::Format::Text;
    let mut opts = Options {
        reconcile,
        ..Options::default()
    };
    let mut it = Args::new(args);
    while let Some((flag, inline)) = it.next_flag() {
        match flag.as_str() {
            f if is_help(f) => return Ok(Parsed::Help),
            "--cache-dir" => opts.cache_dir = it.value(&flag, inline)?.into(),
            "--netconf-dir" => opts.netconf_dir = it.value(&flag, inline)?.into(),
            "--log-format" => {
                let v = it.value(&flag, inline)?;
                format = crate::log::Format::from_name(&v).ok_or_else(|| {
                    crate::tools::cli::usage(format!("--log-format {v:?}: expected text or json"))
                })?;
            }
            other => return Err(unknown(other)),
        }
    }
    Ok(Parsed::Run((opts, format)))
}

/// `natguard adopt|reconcile [--cache-dir DIR] [--netconf-dir DIR]`
pub fn cli(args: &[String], reconcile: bool) -> i32 {
    let (verb, usage) = if reconcile {
        ("reconcile", USAGE_RECONCILE)
    } else {
        ("adopt", USAGE_ADOPT)
    };
    let (mut opts, format) = match options_or_exit(verb, usage, parse_args(args, reconcile)) {
        Ok(o) => o,
        Err(code) => return code,
    };
    crate::log::set_format(format);
    crate::log::set_context(crate::log::Context::component(verb));
    let results = results_dir(&opts.cache_dir);
    if results != opts.cache_dir {
        eprintln!(
            "natguard {verb}: {} is the CNI cache root; reading its results in {}",
            opts.cache_dir.display(),
            results.display()
        );
        opts.cache_dir = results;
    }
    match run(&opts) {
        Ok(r) => {
            // A broken list costs its own network only: named here, not a failure of the run.
            for b in &r.broken {
                println!("broken   {b}");
            }
            for e in &r.entries {
                println!("{e}");
            }
            if !reconcile {
                println!(
                    "conntrack: deleted {} metadata flow(s) that bypassed the DNAT",
                    r.conntrack_deleted
                );
            }
            if let Some(e) = &r.conntrack_error {
                println!("conntrack: cleanup failed: {e}");
            }
            let skipped = r.skipped_by_reason();
            let why = if skipped.is_empty() {
                String::new()
            } else {
                format!("; skipped: {}", crate::restore::reasons_in_words(&skipped))
            };
            println!(
                "{verb}: {} attachment(s) brought under policy, {} skipped, {} failed{why}",
                r.adopted(),
                r.entries.len() - r.adopted() - r.failed(),
                r.failed()
            );
            if r.failed() > 0 {
                1
            } else {
                0
            }
        }
        Err(e) => {
            eprintln!("natguard {verb}: {e}");
            1
        }
    }
}
