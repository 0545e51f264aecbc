//! The command lines of `natguard install` and `natguard uninstall`, parsed into options.
//!
//! Parsing is strict and happens before anything on the node is touched: an unknown flag, a
//! malformed value or a natguard entry the plugin's own config parser rejects is an error here,
//! and the caller turns every error of this module into exit code 2 (a usage error, one line:
//! see [`crate::tools::cli`]). natguard's
//! entry is built from `--config` and the flags here too (see `entry`), so the rest of install
//! only ever sees a validated JSON object.

use super::entry::{build_entry, check_cidr, validate_entry, EntryFlags};
use super::{DEFAULT_CNI_BIN_DIR, DEFAULT_NETCONF_DIR, DEFAULT_READY_FILE};
use crate::error::Result;
use crate::log::Format;
use crate::tools::cli::{is_help, no_value, unknown, usage, Args, Parsed};
use serde_json::Value;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub(crate) const INSTALL_USAGE: &str = "\
usage: natguard install [options]
  --cni-bin-dir DIR            where plugin binaries live (default /opt/cni/bin)
  --netconf-dir DIR            where network configs live (default /etc/cni/net.d)
  --conflist FILE              edit this file instead of the active one (a name in the netconf dir, or a path)
  --config FILE.json           natguard's plugin entry (a JSON object, \"type\" optional)
  --mode proxy|deny|off        metadata.mode
  --proxy-port N               metadata.proxyPort
  --proxy-ipv4 ADDR|auto       metadata.proxyIPv4
  --proxy-ipv6 ADDR|auto       metadata.proxyIPv6
  --exempt-namespace NS        metadata.exemptNamespaces (repeatable)
  --non-masquerade-cidr CIDR   masquerade.nonMasqueradeCIDRs (repeatable)
  --no-masquerade              masquerade.enabled = false
  --masquerade-outside         masquerade.masqueradeOutside = true (natguard masquerades everything
                               outside nonMasqueradeCIDRs to the node's address; off by default)
  --cache-dir DIR              CNI result cache passed to `natguard adopt`
  --no-adopt                   do not run `natguard adopt` after installing (with --watch: no
                               self-repair and no metadata proxy either)
  --ready-file PATH            exists while natguard is in the active list (default /run/natguard/ready)
  --watch                      keep the entry in the active list until SIGTERM, restore
                               natguard's tables within milliseconds when someone else flushes them,
                               and serve natguard's metadata proxy (metadata.serveProxy;
                               docs/proxy.md)
  --no-repair                  with --watch: do not restore natguard's tables when someone else
                               flushes them (see docs/self-repair.md)
  --cleanup-on-exit            with --watch: on SIGTERM/SIGINT, remove natguard's entry from the
                               active list (not the binary, not the kernel state); new pods then
                               start without natguard
  --metrics-file PATH          with --watch: keep natguard's counters in PATH (Prometheus text,
                               for node_exporter's textfile collector), rewritten atomically
  --metrics-interval SECONDS   with --metrics-file: how often PATH is rewritten (default 30)
  --metrics-port PORT          with --watch: serve the same metrics over HTTP, GET /metrics on
                               PORT (off by default; docs/operations.md, \"Scrape endpoint\")
  --metrics-address ADDR       with --metrics-port: the address to listen on (default 0.0.0.0)
  --metrics-allow CIDR         with --metrics-port: also serve sources in CIDR that are behind a
                               pod's host side (repeatable; a Prometheus pod on this node, say):
                               by default no pod of this node is served, whatever its CNI
  --metrics-pod-labels         with --metrics-port: the scrape also lists each pod's namespace
                               and name (off by default: pods that can reach the port would read
                               every pod's identity); `natguard metrics` always lists them
  --log-format text|json       log lines as text (default) or one JSON object per line; default:
                               the entry's logFormat
  --create-dirs                create the bin dir and the netconf dir when they do not exist
                               (without it, a directory that does not exist is an error: a
                               mistyped path would install where no runtime looks)
  --check                      exit 0 iff the binary is installed and the active list has natguard;
                               without --cni-bin-dir/--netconf-dir/--conflist it checks the dirs
                               the running `install --watch` recorded beside the ready file;
                               with --config, also that the active list's entry is that config's
  --health                     with --check: also that natguard guards the node (its table, the
                               node-wide guard's chains and sets and every natguard network's
                               shared objects are in the kernel as the config plans them) and
                               that the watcher's self-repair is alive (its heartbeat in
                               repair.json beside the ready file is fresh): the DaemonSet's
                               readiness and liveness probe
  --max-age SECONDS            with --health: the oldest heartbeat that passes (default 60)
Flags override the same fields of --config. With neither, the entry is {\"type\":\"natguard\"}.
With --watch, a change of the --config file (a ConfigMap update too) is validated and, when it
parses, becomes natguard's entry in the active list; a config that does not is logged and the
entry stays as it was.
";

pub(crate) const UNINSTALL_USAGE: &str = "\
usage: natguard uninstall [options]
  --cni-bin-dir DIR            where plugin binaries live (default /opt/cni/bin)
  --netconf-dir DIR            where network configs live (default /etc/cni/net.d)
  --ready-file PATH            removed (default /run/natguard/ready)
  --keep-kernel-state          leave natguard's nftables table in place
  --log-format text|json       log lines as text (default) or one JSON object per line
  --stay                       after a successful uninstall, keep running until SIGTERM (the
                               uninstall DaemonSet: its pods are ready once their node is clean)
  --check                      exit 0 iff no list in the netconf dir has natguard and the bin
                               dir has no natguard binary (the uninstall DaemonSet's probe)
Removes natguard's entry from every list in the netconf dir, then its binary from the bin dir,
then its nftables table (inet natguard) with every pod's entries.
";

/// What `natguard install` was asked to do.
#[derive(Debug, Clone)]
pub(crate) struct InstallOpts {
    pub(crate) bin_dir: PathBuf,
    pub(crate) netconf_dir: PathBuf,
    /// `--conflist`, made absolute against the netconf dir when it is a bare name.
    pub(crate) conflist: Option<PathBuf>,
    /// natguard's entry, validated by the plugin's config parser.
    pub(crate) entry: Value,
    pub(crate) cache_dir: Option<PathBuf>,
    pub(crate) adopt: bool,
    pub(crate) ready_file: PathBuf,
    pub(crate) mode: RunMode,
    /// On SIGTERM/SIGINT, `--watch` takes natguard's entry out of the active list.
    pub(crate) cleanup_on_exit: bool,
    /// `--watch` restores natguard's tables when someone else changes them (not `--no-repair`).
    pub(crate) repair: bool,
    /// `--watch` keeps natguard's metrics in this file.
    pub(crate) metrics: Option<MetricsFile>,
    /// `--create-dirs`: a bin dir or netconf dir that does not exist is created, not refused.
    pub(crate) create_dirs: bool,
    /// `--cni-bin-dir`, `--netconf-dir` or `--conflist` was given: `--check` uses them instead
    /// of the watcher's record (see `super::record`).
    pub(crate) dirs_given: bool,
    /// `--config`: the file `--watch` follows and `--check` compares the entry with.
    pub(crate) config_file: Option<PathBuf>,
    /// The entry's flags, applied again over a reloaded `--config`.
    pub(crate) entry_flags: EntryFlags,
    /// `--metrics-port` and `--metrics-address`: where `--watch` serves its metrics.
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// `--metrics-allow`: sources served even where they are behind a pod's host side.
    pub(crate) metrics_allow: Vec<crate::addr::Cidr>,
    /// `--metrics-pod-labels`: the scrape endpoint's output names pods.
    pub(crate) metrics_pod_labels: bool,
    /// `--log-format`, else the entry's `logFormat`.
    pub(crate) log_format: Format,
    /// `--check --health [--max-age SECONDS]`: also the kernel guard and the watcher's
    /// heartbeat, no older than this.
    pub(crate) health: Option<Duration>,
}

impl InstallOpts {
    /// The CNI cache as given (libcni's default without `--cache-dir`), and where its result
    /// files are ([`crate::restore::results_dir`]: the `results` dir of a cache root).
    pub(crate) fn cache_dirs(&self) -> (PathBuf, PathBuf) {
        let given = self
            .cache_dir
            .clone()
            .unwrap_or_else(|| crate::restore::DEFAULT_CACHE_DIR.into());
        let results = crate::restore::results_dir(&given);
        (given, results)
    }
}

/// `--metrics-file PATH [--metrics-interval SECONDS]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetricsFile {
    pub(crate) path: PathBuf,
    pub(crate) interval: Duration,
}

/// How often the metrics file is rewritten unless `--metrics-interval` says otherwise.
pub(crate) const DEFAULT_METRICS_INTERVAL: Duration = Duration::from_secs(30);
/// The longest `--metrics-interval` (a day): beyond it the file is stale for any alert.
const MAX_METRICS_INTERVAL_SECS: u64 = 86_400;
/// `--max-age` bounds: at least two heartbeats apart (a heartbeat is written every 10 s), at
/// most an hour.
const MIN_MAX_AGE_SECS: u64 = 20;
const MAX_MAX_AGE_SECS: u64 = 3600;

/// The three ways install runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunMode {
    /// Install once and exit.
    Once,
    /// Install, then keep the entry in the active list until a signal.
    Watch,
    /// Only report whether natguard is installed.
    Check,
}

/// What `natguard uninstall` was asked to do.
#[derive(Debug, Clone)]
pub(crate) struct UninstallOpts {
    pub(crate) bin_dir: PathBuf,
    pub(crate) netconf_dir: PathBuf,
    pub(crate) ready_file: PathBuf,
    pub(crate) keep_kernel_state: bool,
    pub(crate) log_format: Format,
    pub(crate) mode: UninstallMode,
}

/// The three ways uninstall runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UninstallMode {
    /// Uninstall and exit.
    Once,
    /// Uninstall, then wait for a signal (`--stay`).
    Stay,
    /// Only report whether anything of natguard is left (`--check`).
    Check,
}

pub(crate) fn parse_install_args(args: &[String]) -> Result<Parsed<InstallOpts>> {
    let mut bin_dir = PathBuf::from(DEFAULT_CNI_BIN_DIR);
    let mut netconf_dir = PathBuf::from(DEFAULT_NETCONF_DIR);
    let mut conflist = None;
    let mut config_file: Option<PathBuf> = None;
    let mut cache_dir = None;
    let mut adopt = true;
    let mut ready_file = PathBuf::from(DEFAULT_READY_FILE);
    let mut watch = false;
    let mut check = false;
    let mut cleanup_on_exit = false;
    let mut repair = true;
    let mut metrics_file: Option<PathBuf> = None;
    let mut metrics_interval: Option<Duration> = None;
    let mut flags = EntryFlags::default();
    let mut dirs_given = false;
    let mut create_dirs = false;
    let mut metrics_port: Option<u16> = None;
    let mut metrics_pod_labels = false;
    let mut metrics_allow = Vec::new();
    let mut metrics_address: Option<IpAddr> = None;
    let mut log_format: Option<Format> = None;
    let mut health = false;
    let mut max_age: Option<Duration> = None;

    let mut it = Args::new(args);
    while let Some((flag, inline)) = it.next_flag() {
        match flag.as_str() {
            f if is_help(f) => return Ok(Parsed::Help),
            "--cni-bin-dir" => {
                bin_dir = it.value(&flag, inline)?.into();
                dirs_given = true
            }
            "--netconf-dir" => {
                netconf_dir = it.value(&flag, inline)?.into();
                dirs_given = true
            }
            "--conflist" => {
                conflist = Some(PathBuf::from(it.value(&flag, inline)?));
                dirs_given = true
            }
            "--create-dirs" => {
                no_value(&flag, &inline)?;
                create_dirs = true
            }
            "--config" => config_file = Some(it.value(&flag, inline)?.into()),
            "--cache-dir" => cache_dir = Some(PathBuf::from(it.value(&flag, inline)?)),
            "--ready-file" => ready_file = it.value(&flag, inline)?.into(),
            "--no-adopt" => {
                no_value(&flag, &inline)?;
                adopt = false
            }
            "--watch" => {
                no_value(&flag, &inline)?;
                watch = true
            }
            "--cleanup-on-exit" => {
                no_value(&flag, &inline)?;
                cleanup_on_exit = true
            }
            "--no-repair" => {
                no_value(&flag, &inline)?;
                repair = false
            }
            "--check" => {
                no_value(&flag, &inline)?;
                check = true
            }
            "--health" => {
                no_value(&flag, &inline)?;
                health = true
            }
            "--max-age" => {
                let v = it.value(&flag, inline)?;
                match v.parse::<u64>() {
                    Ok(n) if (MIN_MAX_AGE_SECS..=MAX_MAX_AGE_SECS).contains(&n) => {
                        max_age = Some(Duration::from_secs(n))
                    }
                    _ => {
                        return Err(usage(format!(
                            "--max-age {v:?}: expected whole seconds, {MIN_MAX_AGE_SECS} to {MAX_MAX_AGE_SECS}"
                        )))
                    }
                }
            }
            "--metrics-pod-labels" => {
                no_value(&flag, &inline)?;
                metrics_pod_labels = true
            }
            "--metrics-file" => {
                let v = it.value(&flag, inline)?;
                if v.is_empty() || v.ends_with('/') {
                    return Err(usage(format!("--metrics-file {v:?}: expected a file path")));
                }
                metrics_file = Some(v.into())
            }
            "--metrics-interval" => {
                let v = it.value(&flag, inline)?;
                match v.parse::<u64>() {
                    Ok(n) if (1..=MAX_METRICS_INTERVAL_SECS).contains(&n) => {
                        metrics_interval = Some(Duration::from_secs(n))
                    }
                    _ => {
                        return Err(usage(format!(
                            "--metrics-interval {v:?}: expected whole seconds, 1 to {MAX_METRICS_INTERVAL_SECS}"
                        )))
                    }
                }
            }
            "--metrics-port" => {
                let v = it.value(&flag, inline)?;
                match v.parse::<u16>() {
                    Ok(p) if p > 0 => metrics_port = Some(p),
                    _ => {
                        return Err(usage(format!(
                            "--metrics-port {v:?}: expected a port 1-65535"
                        )))
                    }
                }
            }
            "--metrics-allow" => {
                let v = it.value(&flag, inline)?;
                match crate::addr::Cidr::parse(&v) {
                    Some(c) => metrics_allow.push(c),
                    None => {
                        return Err(usage(format!(
                            "--metrics-allow {v:?}: expected a CIDR (10.0.5.0/24, fd00::/64)"
                        )))
                    }
                }
            }
            "--metrics-address" => {
                let v = it.value(&flag, inline)?;
                match v.parse::<IpAddr>() {
                    Ok(a) => metrics_address = Some(a),
                    Err(_) => {
                        return Err(usage(format!(
                            "--metrics-address {v:?}: expected an IPv4 or IPv6 address"
                        )))
                    }
                }
            }
            "--log-format" => log_format = Some(parse_log_format(&it.value(&flag, inline)?)?),
            "--mode" => {
                let v = it.value(&flag, inline)?;
                if !matches!(v.as_str(), "proxy" | "deny" | "off") {
                    return Err(usage(format!("--mode {v:?}: expected proxy, deny or off")));
                }
                flags.mode = Some(v)
            }
            "--proxy-port" => {
                let v = it.value(&flag, inline)?;
                match v.parse::<u16>() {
                    Ok(p) if p > 0 => flags.proxy_port = Some(p),
                    _ => {
                        return Err(usage(format!(
                            "--proxy-port {v:?}: expected a port 1-65535"
                        )))
                    }
                }
            }
            "--proxy-ipv4" => {
                let v = it.value(&flag, inline)?;
                if v != "auto" && v.parse::<Ipv4Addr>().is_err() {
                    return Err(usage(format!(
                        "--proxy-ipv4 {v:?}: expected an IPv4 address or auto"
                    )));
                }
                flags.proxy_ipv4 = Some(v)
            }
            "--proxy-ipv6" => {
                let v = it.value(&flag, inline)?;
                if v != "auto" && v.parse::<Ipv6Addr>().is_err() {
                    return Err(usage(format!(
                        "--proxy-ipv6 {v:?}: expected an IPv6 address or auto"
                    )));
                }
                flags.proxy_ipv6 = Some(v)
            }
            "--exempt-namespace" => {
                let v = it.value(&flag, inline)?;
                if v.is_empty() {
                    return Err(usage("--exempt-namespace: empty namespace"));
                }
                flags.exempt_namespaces.push(v)
            }
            "--non-masquerade-cidr" => {
                let v = it.value(&flag, inline)?;
                check_cidr(&v).map_err(|e| e.context(format!("--non-masquerade-cidr {v:?}")))?;
                flags.non_masquerade_cidrs.push(v)
            }
            "--no-masquerade" => {
                no_value(&flag, &inline)?;
                flags.no_masquerade = true
            }
            "--masquerade-outside" => {
                no_value(&flag, &inline)?;
                flags.masquerade_outside = true
            }
            other => return Err(unknown(other)),
        }
    }
    let mode = match (watch, check) {
        (true, true) => return Err(usage("--check and --watch exclude each other")),
        (true, false) => RunMode::Watch,
        (false, true) => RunMode::Check,
        (false, false) => RunMode::Once,
    };
    if cleanup_on_exit && mode != RunMode::Watch {
        return Err(usage(
            "--cleanup-on-exit needs --watch: it acts when the watcher is stopped",
        ));
    }
    if !repair && mode != RunMode::Watch {
        return Err(usage(
            "--no-repair needs --watch: only the watcher repairs natguard's tables",
        ));
    }
    if metrics_file.is_some() && mode != RunMode::Watch {
        return Err(usage(
            "--metrics-file needs --watch: the watcher is what keeps the file up to date",
        ));
    }
    if create_dirs && mode == RunMode::Check {
        return Err(usage(
            "--create-dirs and --check exclude each other: a probe creates nothing",
        ));
    }
    if health && mode != RunMode::Check {
        return Err(usage("--health needs --check: it is a probe"));
    }
    if max_age.is_some() && !health {
        return Err(usage("--max-age needs --health"));
    }
    let health = health.then(|| max_age.unwrap_or(crate::tools::watcher::HEARTBEAT_MAX_AGE));
    if metrics_interval.is_some() && metrics_file.is_none() {
        return Err(usage("--metrics-interval needs --metrics-file"));
    }
    if metrics_port.is_some() && mode != RunMode::Watch {
        return Err(usage(
            "--metrics-port needs --watch: the watcher is what serves the metrics",
        ));
    }
    if metrics_pod_labels && metrics_port.is_none() {
        return Err(usage("--metrics-pod-labels needs --metrics-port"));
    }
    if metrics_address.is_some() && metrics_port.is_none() {
        return Err(usage("--metrics-address needs --metrics-port"));
    }
    if !metrics_allow.is_empty() && metrics_port.is_none() {
        return Err(usage("--metrics-allow needs --metrics-port"));
    }
    let metrics_listen = metrics_port.map(|port| {
        SocketAddr::new(
            metrics_address.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            port,
        )
    });
    let metrics = metrics_file.map(|path| MetricsFile {
        path,
        interval: metrics_interval.unwrap_or(DEFAULT_METRICS_INTERVAL),
    });
    // --check only looks; the entry is not needed, but a bad --config is still an error.
    let entry = build_entry(config_file.as_deref(), &flags)?;
    let entry_config = validate_entry(&entry)?;
    let log_format = log_format.unwrap_or(entry_config.log_format);
    let conflist = conflist.map(|c| {
        if c.components().count() == 1 && !c.is_absolute() {
            netconf_dir.join(c)
        } else {
            c
        }
    });
    Ok(Parsed::Run(InstallOpts {
        bin_dir,
        netconf_dir,
        conflist,
        entry,
        cache_dir,
        adopt,
        ready_file,
        mode,
        cleanup_on_exit,
        repair,
        metrics,
        create_dirs,
        dirs_given,
        config_file,
        entry_flags: flags,
        metrics_listen,
        metrics_allow,
        metrics_pod_labels,
        log_format,
        health,
    }))
}

/// `--log-format`'s value.
pub(crate) fn parse_log_format(v: &str) -> Result<Format> {
    Format::from_name(v).ok_or_else(|| usage(format!("--log-format {v:?}: expected text or json")))
}

pub(crate) fn parse_uninstall_args(args: &[String]) -> Result<Parsed<UninstallOpts>> {
    let mut opts = UninstallOpts {
        bin_dir: PathBuf::from(DEFAULT_CNI_BIN_DIR),
        netconf_dir: PathBuf::from(DEFAULT_NETCONF_DIR),
        ready_file: PathBuf::from(DEFAULT_READY_FILE),
        keep_kernel_state: false,
        log_format: Format::Text,
        mode: UninstallMode::Once,
    };
    let mut it = Args::new(args);
    while let Some((flag, inline)) = it.next_flag() {
        match flag.as_str() {
            f if is_help(f) => return Ok(Parsed::Help),
            "--cni-bin-dir" => opts.bin_dir = it.value(&flag, inline)?.into(),
            "--netconf-dir" => opts.netconf_dir = it.value(&flag, inline)?.into(),
            "--ready-file" => opts.ready_file = it.value(&flag, inline)?.into(),
            "--keep-kernel-state" => {
                no_value(&flag, &inline)?;
                opts.keep_kernel_state = true
            }
            "--log-format" => opts.log_format = parse_log_format(&it.value(&flag, inline)?)?,
            "--stay" | "--check" => {
                no_value(&flag, &inline)?;
                let mode = if flag == "--stay" {
                    UninstallMode::Stay
                } else {
                    UninstallMode::Check
                };
                if opts.mode != UninstallMode::Once && opts.mode != mode {
                    return Err(usage("--stay and --check exclude each other"));
                }
                opts.mode = mode
            }
            other => return Err(unknown(other)),
        }
    }
    Ok(Parsed::Run(opts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleanup_on_exit_needs_watch() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(parse_install_args(&args(&["--cleanup-on-exit"])).is_err());
        assert!(parse_install_args(&args(&["--check", "--cleanup-on-exit"])).is_err());
        match parse_install_args(&args(&["--watch", "--cleanup-on-exit"])) {
            Ok(Parsed::Run(o)) => assert!(o.cleanup_on_exit && o.mode == RunMode::Watch),
            _ => panic!("--watch --cleanup-on-exit should parse"),
        }
    }

    #[test]
    fn metrics_file_needs_watch_and_a_sane_interval() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let metrics = |a: &[&str]| match parse_install_args(&args(a)) {
            Ok(Parsed::Run(o)) => Ok(o.metrics),
            Ok(Parsed::Help) => panic!("help"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(
            metrics(&["--watch", "--metrics-file", "/m/natguard.prom"]),
            Ok(Some(MetricsFile {
                path: "/m/natguard.prom".into(),
                interval: Duration::from_secs(30)
            }))
        );
        assert_eq!(
            metrics(&[
                "--watch",
                "--metrics-file=/m/n.prom",
                "--metrics-interval=1"
            ])
            .unwrap()
            .unwrap()
            .interval,
            Duration::from_secs(1)
        );
        assert_eq!(metrics(&["--watch"]), Ok(None));
        for (bad, why) in [
            (&["--metrics-file", "/m/n.prom"][..], "needs --watch"),
            (
                &["--check", "--metrics-file", "/m/n.prom"][..],
                "needs --watch",
            ),
            (
                &["--watch", "--metrics-interval", "5"][..],
                "needs --metrics-file",
            ),
            (
                &[
                    "--watch",
                    "--metrics-file",
                    "/m/n.prom",
                    "--metrics-interval",
                    "0",
                ][..],
                "1 to",
            ),
            (
                &[
                    "--watch",
                    "--metrics-file",
                    "/m/n.prom",
                    "--metrics-interval",
                    "-1",
                ][..],
                "1 to",
            ),
            (
                &[
                    "--watch",
                    "--metrics-file",
                    "/m/n.prom",
                    "--metrics-interval",
                    "2.5",
                ][..],
                "1 to",
            ),
            (
                &[
                    "--watch",
                    "--metrics-file",
                    "/m/n.prom",
                    "--metrics-interval",
                    "86401",
                ][..],
                "1 to",
            ),
            (&["--watch", "--metrics-file", "/m/"][..], "a file path"),
            (&["--watch", "--metrics-file"][..], "needs a value"),
        ] {
            let e = metrics(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn metrics_allow_takes_cidrs_and_needs_metrics_port() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let allow = |a: &[&str]| match parse_install_args(&args(a)) {
            Ok(Parsed::Run(o)) => Ok(o.metrics_allow),
            Ok(Parsed::Help) => panic!("help"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(
            allow(&[
                "--watch",
                "--metrics-port",
                "9118",
                "--metrics-allow",
                "10.0.5.7/32",
                "--metrics-allow=fd00:5::/64",
            ]),
            Ok(vec![
                crate::addr::Cidr::parse("10.0.5.7/32").unwrap(),
                crate::addr::Cidr::parse("fd00:5::/64").unwrap(),
            ])
        );
        for (bad, why) in [
            (
                &["--watch", "--metrics-allow", "10.0.5.7/32"][..],
                "needs --metrics-port",
            ),
            (
                &[
                    "--watch",
                    "--metrics-port",
                    "9118",
                    "--metrics-allow",
                    "10.0.5.7",
                ][..],
                "--metrics-allow \"10.0.5.7\": expected a CIDR",
            ),
            (
                &[
                    "--watch",
                    "--metrics-port",
                    "9118",
                    "--metrics-allow",
                    "10.0.5.0/33",
                ][..],
                "expected a CIDR",
            ),
        ] {
            let e = allow(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
