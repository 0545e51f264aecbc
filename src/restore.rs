//! Attachments from the runtimes' CNI result cache brought under policy: what `natguard adopt`
//! and `natguard reconcile` do, what an ADD that had to rewrite the shared objects does for
//! every other pod, and the watcher's self-repair. It sits in the core, below the verbs and the
//! node tools, which both use it.
//!
//! Pods that were running before natguard was added to a conflist, or whose entries someone
//! flushed, are found in the runtimes' CNI result cache (`/var/lib/cni/results/*`, written by
//! libcni for containerd, CRI-O and podman). Each cache file names the network, container ID,
//! interface, CNI_ARGS and the final result of the list. For every attachment of a network whose
//! conflist in the netconf dir now lists natguard, the same plan ADD would make is applied, using
//! natguard's config from that conflist and the namespace from the cached CNI_ARGS.
//!
//! Each pod's `natguard.io/` annotations are read from the cache's `capabilityArgs` (what the
//! runtime passed as runtimeConfig), so an annotated pod gets the policy its ADD gave it.
//! Pods of exempt namespaces get what ADD gives them (masquerade policy, and their addresses in
//! the network's allow set, so the fail-closed reject of metadata traffic from the pod networks
//! lets them through); their metadata traffic is not intercepted and their flows are left alone.
//! For the other adopted pods, [`run`] then deletes the conntrack entries of their TCP flows to
//! the metadata addresses that bypassed the DNAT to the network's proxy: the flows opened before
//! the rules existed, and flows DNATed elsewhere (another component's DNAT, or a proxy the
//! network no longer has, as after a change to `deny`); other networks' pods with the same
//! addresses keep theirs. That costs one kernel walk per metadata address, however many pods
//! there are.
//! Reconcile installs the same entries and touches no flow. Both are idempotent and report one
//! entry per attachment. [`repair`] is reconcile in one batch, for `install --watch`'s
//! self-repair; [`place_guard`] is the same batch with the node-wide guard planned from
//! natguard's entry where no list names natguard yet.

use crate::cni::{self, CniArgs};
use crate::config::{self, Config, MetadataMode};
use crate::error::{Error, Result};
use crate::kernel::podside::Unseen;
use crate::kernel::Kernel;
use crate::plan::{Elem, OwnerKey, SetKind};
use crate::prepare::{prepare_pod, Identity, Prepared};
use crate::store::{self, Store};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub use crate::cni::DEFAULT_CACHE_DIR;
/// Where runtimes look for network configs unless configured otherwise.
pub const DEFAULT_NETCONF_DIR: &str = "/etc/cni/net.d";
/// Cache files larger than this are not results.
const MAX_CACHE_FILE: u64 = 1 << 20;

#[derive(Debug, Clone)]
pub struct Options {
    pub cache_dir: PathBuf,
    pub netconf_dir: PathBuf,
    /// `reconcile`: restore exempt pods too, and leave conntrack alone.
    pub reconcile: bool,
    /// Networks known besides the conflists in `netconf_dir` (the running ADD's own), by name;
    /// they win over a conflist of the same name.
    pub known: BTreeMap<String, Config>,
    /// natguard's entry as `install` puts it in the active list: where no conflist lists
    /// natguard yet, the node-wide guard is planned from it alone ([`guard_plans`]).
    pub node_guard: Option<Config>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_dir: DEFAULT_CACHE_DIR.into(),
            netconf_dir: DEFAULT_NETCONF_DIR.into(),
            reconcile: false,
            known: BTreeMap::new(),
            node_guard: None,
        }
    }
}

/// What happened to one cache entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Adopted {
        addrs: Vec<IpAddr>,
        /// The namespace, when it is exempt: entries installed, metadata not intercepted,
        /// flows left alone.
        exempt: Option<String>,
    },
    SkippedNetnsGone {
        netns: String,
    },
    /// The network namespace cannot be inspected from here (see docs/bootstrap.md): not
    /// visible, not a network namespace, or not permitted (`why`). Nothing was done for the
    /// attachment.
    SkippedNetnsUnreadable {
        netns: String,
        reason: String,
        why: Unseen,
    },
    SkippedNoNatguard,
    /// Its network's list is broken ([`BrokenList`]): the attachment is left as it is.
    SkippedBrokenList {
        file: String,
    },
    SkippedNoAddress,
    /// natguard's DEL has run for it; the runtime has not removed its cache entry yet.
    SkippedDeleted,
    /// The cache file is not a readable libcni result; nothing was done for it.
    SkippedUnreadable {
        reason: String,
    },
    Failed {
        reason: String,
    },
}

/// Why attachments are skipped, as the `reason` label of the skip counts (`status`,
/// `metrics`): every reason an [`Outcome`] can skip for, in the order they are shown.
pub const SKIP_REASONS: [&str; 9] = [
    "netns_gone",
    "netns_not_visible",
    "not_a_netns",
    "not_permitted",
    "no_natguard",
    "no_address",
    "unreadable_cache",
    "broken_list",
    "deleted",
];

impl Outcome {
    /// The skip's reason ([`SKIP_REASONS`]); `None` for an attachment adopted or failed.
    pub fn skip_reason(&self) -> Option<&'static str> {
        Some(match self {
            Outcome::SkippedNetnsGone { .. } => "netns_gone",
            Outcome::SkippedNetnsUnreadable { why, .. } => match why {
                Unseen::Hidden => "netns_not_visible",
                Unseen::WrongKind => "not_a_netns",
                Unseen::Denied => "not_permitted",
            },
            Outcome::SkippedNoNatguard => "no_natguard",
            Outcome::SkippedNoAddress => "no_address",
            Outcome::SkippedUnreadable { .. } => "unreadable_cache",
            Outcome::SkippedBrokenList { .. } => "broken_list",
            Outcome::SkippedDeleted => "deleted",
            Outcome::Adopted { .. } | Outcome::Failed { .. } => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub file: String,
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub who: String,
    pub outcome: Outcome,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = format!(
            "{} {} {} ({})",
            self.network,
            cni::truncate(&self.container_id, 12),
            self.ifname,
            self.who
        );
        match &self.outcome {
            Outcome::Adopted { addrs, exempt } => {
                let a: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
                write!(f, "adopted  {id}: {}", a.join(", "))?;
                match exempt {
                    Some(ns) => write!(
                        f,
                        " (namespace {ns} is exempt: not intercepted, flows untouched)"
                    ),
                    None => Ok(()),
                }
            }
            Outcome::SkippedNetnsGone { netns } => {
                write!(
                    f,
                    "skipped  {id}: network namespace {netns} no longer exists (its file is gone; the pod has ended)"
                )
            }
            Outcome::SkippedNetnsUnreadable { netns, reason, why } => {
                let hint = match why {
                    Unseen::Hidden => "run natguard where the node's network namespaces are visible (the node, or a container with the node's /run/netns and /var/run/netns mounted with mountPropagation: HostToContainer)",
                    Unseen::Denied => "natguard needs CAP_NET_ADMIN to look into a pod's network namespace",
                    Unseen::WrongKind => "the runtime's cached sandbox path names something else than the pod's network namespace",
                };
                write!(
                    f,
                    "skipped  {id}: network namespace {netns} {reason}; {hint}"
                )
            }
            Outcome::SkippedNoNatguard => {
                write!(f, "skipped  {id}: its network does not list natguard")
            }
            Outcome::SkippedBrokenList { file } => {
                write!(
                    f,
                    "skipped  {id}: natguard's entry in {file} does not parse; left as it is"
                )
            }
            Outcome::SkippedDeleted => {
                write!(
                    f,
                    "skipped  {id}: natguard's DEL has run for it (the runtime's cache entry is not removed yet)"
                )
            }
            Outcome::SkippedNoAddress => {
                write!(f, "skipped  {id}: the cached result has no address on it")
            }
            Outcome::SkippedUnreadable { reason } => {
                write!(f, "skipped  cache file {}: {reason}", self.file)
            }
            Outcome::Failed { reason } => write!(f, "failed   {id} ({}): {reason}", self.file),
        }
    }
}

#[derive(Debug, Default)]
pub struct Report {
    pub entries: Vec<Entry>,
    /// The lists whose networks were left alone.
    pub broken: Vec<BrokenList>,
    pub conntrack_deleted: u64,
    pub conntrack_error: Option<String>,
}

impl Report {
    pub fn adopted(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Adopted { .. }))
            .count()
    }
    pub fn failed(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Failed { .. }))
            .count()
    }
    /// Skipped entries by reason, in [`SKIP_REASONS`] order, reasons without one left out.
    pub fn skipped_by_reason(&self) -> Vec<(&'static str, u64)> {
        count_reasons(self.entries.iter().filter_map(|e| e.outcome.skip_reason()))
    }
}

/// How many of `reasons` each reason is, in [`SKIP_REASONS`] order, zeros left out.
pub fn count_reasons<'a>(reasons: impl Iterator<Item = &'a str>) -> Vec<(&'static str, u64)> {
    let mut n = [0u64; SKIP_REASONS.len()];
    for r in reasons {
        if let Some(i) = SKIP_REASONS.iter().position(|k| *k == r) {
            n[i] += 1;
        }
    }
    SKIP_REASONS
        .iter()
        .zip(n)
        .filter(|(_, c)| *c > 0)
        .map(|(k, c)| (*k, c))
        .collect()
}

/// Skip counts in words: `2 netns_not_visible, 1 no_natguard`.
pub fn reasons_in_words(counts: &[(&str, u64)]) -> String {
    counts
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A network config natguard cannot read its entry from: not JSON (half-written, say), or a
/// natguard entry that does not parse. Its network is left as it is; every other network is
/// served as usual, so one list's typo never disarms the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenList {
    pub file: PathBuf,
    /// The list's network, when the file could be read that far.
    pub network: Option<String>,
    /// Why, naming the field where there is one.
    pub reason: String,
}

impl fmt::Display for BrokenList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.network {
            Some(n) => write!(
                f,
                "{} (network {n}): {}; its network is left as it is",
                self.file.display(),
                self.reason
            ),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

/// What the netconf dir says: natguard's config of every network whose list names natguard, by
/// network name, and the configs that could not be read.
#[derive(Debug, Clone, Default)]
pub struct Networks {
    pub configs: BTreeMap<String, Config>,
    pub broken: Vec<BrokenList>,
}

impl Networks {
    /// Whether the attachments of `network` are left alone: its list is broken.
    fn is_broken(&self, network: &str) -> bool {
        self.broken
            .iter()
            .any(|b| b.network.as_deref() == Some(network))
    }
}

/// natguard's config for every network whose conflist lists natguard, by network name; the
/// lists that cannot be read are left out (see [`scan_networks`]).
pub fn natguard_networks(netconf_dir: &Path) -> Result<BTreeMap<String, Config>> {
    scan_networks(netconf_dir).map(|n| n.configs)
}

/// Reads every network config of `netconf_dir`. A file that is not JSON, or whose natguard
/// entry does not parse, is reported in [`Networks::broken`] and costs only its own network;
/// only a directory that cannot be listed is an error.
pub fn scan_networks(netconf_dir: &Path) -> Result<Networks> {
    let mut out = Networks::default();
    let rd = match std::fs::read_dir(netconf_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(format!("read {}", netconf_dir.display()), e)),
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("conflist" | "conf" | "json")
            )
        })
        .collect();
    files.sort();
    for path in files {
        let broken = |network: Option<&str>, reason: String| BrokenList {
            file: path.clone(),
            network: network.map(str::to_string),
            reason,
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            // Gone between the listing and the read: a rename under way.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                out.broken
                    .push(broken(None, format!("cannot read it: {e}")));
                continue;
            }
        };
        let v = match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => v,
            Err(e) => {
                out.broken.push(broken(
                    None,
                    format!("not JSON (half-written or corrupt): {e}"),
                ));
                continue;
            }
        };
        let Some(name) = v.get("name").and_then(Value::as_str) else {
            continue;
        };
        let Some(plugins) = v.get("plugins").and_then(Value::as_array) else {
            continue;
        };
        if out.configs.contains_key(name) || out.is_broken(name) {
            continue; // the first file by name wins, as in libcni
        }
        if let Some(entry) = plugins
            .iter()
            .find(|p| p.get("type").and_then(Value::as_str) == Some("natguard"))
        {
            match config::parse_plugin_config(entry) {
                Ok(cfg) => {
                    out.configs.insert(name.to_string(), cfg);
                }
                Err(e) => out
                    .broken
                    .push(broken(Some(name), format!("natguard entry: {e}"))),
            }
        }
    }
    Ok(out)
}

/// The shared objects that must be on the node whatever pods it has: those of every network
/// in `networks` (each with the node-wide guard), or, where there is none, the guard alone
/// planned from `node_guard`. So the guard exists from `natguard install` on, and a repair
/// restores it on a node that has no pod yet.
pub fn guard_plans(
    networks: &BTreeMap<String, Config>,
    node_guard: Option<&Config>,
) -> Vec<crate::plan::SharedPlan> {
    if networks.is_empty() {
        return node_guard
            .map(|cfg| crate::plan::plan_node_guard(cfg, &crate::node::facts(cfg)))
            .into_iter()
            .collect();
    }
    networks
        .iter()
        .map(|(name, cfg)| crate::plan::plan_shared(name, cfg, &crate::node::facts(cfg)))
        .collect()
}

/// Puts the shared objects of [`guard_plans`] in place (a converge where they differ, nothing
/// written where they are intact) and, in the same batch, the entries of every live attachment
/// of the CNI cache `cache_dir` ([`repair`]): a network whose objects are converged (another
/// release's, a changed entry) is never left without its running pods' entries, not even for
/// the instant before the adopt that follows. Returns the number of operations committed.
pub fn place_guard(
    netconf_dir: &Path,
    cache_dir: &Path,
    node_guard: Option<&Config>,
    known: BTreeMap<String, Config>,
) -> Result<usize> {
    let r = repair(&Options {
        cache_dir: cache_dir.to_path_buf(),
        netconf_dir: netconf_dir.to_path_buf(),
        node_guard: node_guard.cloned(),
        known,
        ..Options::default()
    })?;
    for b in &r.broken {
        crate::warn!("{b}");
    }
    Ok(r.ops)
}

/// One libcni cache entry (`cniCacheV1`).
#[derive(Debug, Clone)]
struct CacheEntry {
    network: String,
    container_id: String,
    ifname: String,
    args: Vec<(String, String)>,
    /// `capabilityArgs`: what the runtime passed as runtimeConfig (pod annotations among it).
    cap_args: Option<Value>,
    result: Value,
}

fn read_cache_entry(path: &Path) -> std::result::Result<CacheEntry, String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_CACHE_FILE {
        return Err(format!(
            "{} bytes is too large for a CNI result",
            meta.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let s = |k: &str| -> std::result::Result<String, String> {
        v.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("{k}: missing or not a string"))
    };
    if v.get("kind").and_then(Value::as_str) != Some("cniCacheV1") {
        return Err("kind: not a cniCacheV1 result".into());
    }
    let args = match v.get("cniArgs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|p| {
                let p = p.as_array()?;
                Some((
                    p.first()?.as_str()?.to_string(),
                    p.get(1)?.as_str()?.to_string(),
                ))
            })
            .collect(),
        Some(_) => return Err("cniArgs: not an array of pairs".into()),
    };
    let result = v
        .get("result")
        .filter(|r| r.is_object())
        .cloned()
        .ok_or("result: missing or not an object")?;
    Ok(CacheEntry {
        network: s("networkName")?,
        container_id: s("containerId")?,
        ifname: s("ifName")?,
        args,
        cap_args: v.get("capabilityArgs").cloned(),
        result,
    })
}

/// The sandbox path the result records for `ifname`, if any.
fn sandbox_of(result: &Value, ifname: &str) -> Option<String> {
    result
        .get("interfaces")?
        .as_array()?
        .iter()
        .find(|i| i.get("name").and_then(Value::as_str) == Some(ifname))?
        .get("sandbox")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The natguard networks of `opts.netconf_dir`, with `opts.known` winning over a list of the
/// same name (and its breakage, if it was broken).
fn networks_of(opts: &Options) -> Result<Networks> {
    let mut networks = scan_networks(&opts.netconf_dir)?;
    for (name, cfg) in &opts.known {
        networks.broken.retain(|b| b.network.as_ref() != Some(name));
        networks.configs.insert(name.clone(), cfg.clone());
    }
    Ok(networks)
}

/// Runs adopt (or reconcile) over the cache.
pub fn run(opts: &Options) -> Result<Report> {
    let networks = networks_of(opts)?;
    let mut report = Report {
        broken: networks.broken.clone(),
        ..Report::default()
    };
    let ct_path = crate::kernel::conntrack::Path::from_override(
        std::env::var(crate::kernel::conntrack::PATH_ENV)
            .ok()
            .as_deref(),
    )?;
    let mut store = store::open()?;
    // The networks' shared objects (and with them the node-wide guard) first, pods or not.
    let plans = guard_plans(&networks.configs, opts.node_guard.as_ref());
    if !plans.is_empty() {
        store.apply(&plans.iter().collect::<Vec<_>>(), &[])?;
    }
    let files = cache_files(&opts.cache_dir)?;
    let deleted = crate::deleted::read();
    let mut cached = HashSet::new();
    let mut installed: Vec<Installed> = Vec::new();
    // Metadata flows to delete, per network config.
    let mut flows: Vec<Bypassed> = Vec::new();
    for path in files {
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let entry = match read_cache_entry(&path) {
            Ok(e) => e,
            Err(reason) => {
                report.entries.push(Entry {
                    file,
                    network: String::new(),
                    container_id: String::new(),
                    ifname: String::new(),
                    who: String::new(),
                    outcome: Outcome::SkippedUnreadable { reason },
                });
                continue;
            }
        };
        let owner = OwnerKey::new(&entry.network, &entry.container_id, &entry.ifname);
        cached.insert(owner);
        let outcome = if deleted.contains(&owner) {
            Outcome::SkippedDeleted
        } else {
            adopt_entry(&mut store, &entry, &networks, &mut flows)
        };
        if matches!(outcome, Outcome::Adopted { .. }) {
            installed.push(Installed {
                network: entry.network.clone(),
                owner,
                cache_file: path.clone(),
            });
        }
        report.entries.push(entry_of(file, entry, outcome));
    }
    take_back_deleted(&mut store, &installed, &deleted);
    crate::deleted::prune(&cached);
    if !opts.reconcile {
        for f in flows {
            match store.flush_bypassed(&f.srcs, &f.dsts, &f.ports, &f.proxies, ct_path, &f.scope) {
                Ok(r) => report.conntrack_deleted += r.deleted,
                Err(e) => report.conntrack_error = Some(e.to_string()),
            }
        }
    }
    Ok(report)
}

/// The report entry of cache file `file`.
fn entry_of(file: String, entry: CacheEntry, outcome: Outcome) -> Entry {
    let args = CniArgs::parse(&join_args(&entry.args)).unwrap_or_default();
    Entry {
        file,
        network: entry.network,
        container_id: entry.container_id,
        ifname: entry.ifname,
        who: format!(
            "{}/{}",
            args.pod_namespace.as_deref().unwrap_or("-"),
            args.pod_name.as_deref().unwrap_or("-")
        ),
        outcome,
    }
}

fn join_args(args: &[(String, String)]) -> String {
    args.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// One cache entry, validated and planned exactly as a live ADD would: the plan, and the
/// namespace when it is exempt. `Err` is the outcome to report instead.
fn prepare_entry(
    entry: &CacheEntry,
    networks: &Networks,
) -> std::result::Result<(Prepared, Option<String>), Outcome> {
    let Some(cfg) = networks.configs.get(&entry.network) else {
        if let Some(b) = networks
            .broken
            .iter()
            .find(|b| b.network.as_ref() == Some(&entry.network))
        {
            return Err(Outcome::SkippedBrokenList {
                file: b.file.display().to_string(),
            });
        }
        return Err(Outcome::SkippedNoNatguard);
    };
    let fail = |reason: String| Outcome::Failed { reason };
    if !cni::netconf::is_network_name(&entry.network)
        || !cni::is_container_id(&entry.container_id)
        || !cni::is_ifname(&entry.ifname)
    {
        return Err(fail(
            "the cache entry's network, container ID or ifname is malformed".into(),
        ));
    }
    let args = CniArgs::parse(&join_args(&entry.args))
        .map_err(|e| fail(format!("cached CNI_ARGS: {e}")))?;
    let netns = sandbox_of(&entry.result, &entry.ifname).unwrap_or_default();
    if !netns.is_empty() && !Path::new(&netns).exists() {
        // A namespace is gone when its file is, in a directory this process sees.
        return Err(match crate::kernel::podside::absent_reason(&netns) {
            Some(e) => Outcome::SkippedNetnsUnreadable {
                netns,
                reason: e.0,
                why: e.1,
            },
            None => Outcome::SkippedNetnsGone { netns },
        });
    }
    // The pod's identity comes from its own interface. Where this process cannot look at it
    // (a mount namespace the runtime's later netns mounts never reached, no right to ask),
    // the attachment is left as it is: planned without its host side it would lose what its
    // ADD recorded.
    let pod_link = match crate::kernel::podside::inspect(&netns, &entry.ifname) {
        Ok(link) => link,
        Err(e) => {
            return Err(Outcome::SkippedNetnsUnreadable {
                netns,
                reason: e.0,
                why: e.1,
            })
        }
    };
    // The runtime's runtimeConfig, as libcni cached it: the pod's annotations apply as at ADD.
    let annotations = crate::policy::parse(entry.cap_args.as_ref())
        .map_err(|e| fail(format!("cached capabilityArgs: {e}")))?;
    let decision = crate::policy::decide(cfg, args.pod_namespace.as_deref(), &annotations);
    let exempt = args.pod_namespace.clone().filter(|_| decision.is_exempt());
    let who = Identity {
        network: &entry.network,
        container_id: &entry.container_id,
        ifname: &entry.ifname,
        netns: &netns,
        netns_from: crate::prepare::CACHED_SANDBOX,
        args: &args,
        annotations,
    };
    // Exactly the checks and plan of a live ADD.
    let p = prepare_pod(cfg, &who, &entry.result, pod_link)
        .map_err(|e| fail(format!("cached result: {e}")))?;
    if p.addrs.is_empty() {
        return Err(Outcome::SkippedNoAddress);
    }
    Ok((p, exempt))
}

/// An adopted pod's metadata flows that bypassed natguard's DNAT: TCP from `srcs` to `dsts` on
/// `ports`, not DNATed to one of `proxies` (the network's proxy addresses and port; none where
/// no endpoint is proxied).
struct Bypassed {
    srcs: Vec<IpAddr>,
    dsts: Vec<IpAddr>,
    ports: Vec<u16>,
    proxies: Vec<(IpAddr, u16)>,
    /// Other networks' pods with the same addresses keep their flows.
    scope: crate::kernel::conntrack::Scope,
}

fn adopt_entry<K: Kernel>(
    store: &mut Store<K>,
    entry: &CacheEntry,
    networks: &Networks,
    flows: &mut Vec<Bypassed>,
) -> Outcome {
    let (p, exempt) = match prepare_entry(entry, networks) {
        Ok(x) => x,
        Err(o) => return o,
    };
    if let Err(e) = store.apply_pod(&p.shared, &p.pod) {
        return Outcome::Failed {
            reason: format!("installing entries: {e}"),
        };
    }
    let cfg = &networks.configs[&entry.network];
    if exempt.is_none() && cfg.metadata.mode != MetadataMode::Off {
        // The network's proxy targets as its plan installs them (empty in `deny` mode): a
        // flow DNATed there is the pod talking to the proxy; any other is deleted.
        let proxies = p
            .shared
            .sets
            .iter()
            .filter(|s| matches!(s.kind, SetKind::Pxy(_)))
            .flat_map(|s| s.elements.iter().flatten())
            .filter_map(|e| match e {
                Elem::AddrPort(a, port) => Some((*a, *port)),
                _ => None,
            })
            .collect();
        let scope = store.add_scope(&p.shared.names, cfg, &p.addrs);
        flows.push(Bypassed {
            scope,
            srcs: p.addrs.clone(),
            dsts: cfg.metadata.addresses.clone(),
            ports: cfg.metadata.ports.clone(),
            proxies,
        });
    }
    Outcome::Adopted {
        addrs: p.addrs,
        exempt,
    }
}

/// An attachment a restore installed, and the cache file it was read from.
struct Installed {
    network: String,
    owner: OwnerKey,
    cache_file: PathBuf,
}

/// Removes again what a restore installed for attachments whose DEL ran meanwhile: DEL writes
/// its tombstone before it removes the entries, so an attachment tombstoned now that was not
/// when the restore was planned may have had its DEL's removal before the restore's install.
/// Its tombstone may be gone already: the runtime removes the cache file once every plugin's
/// DEL has run, and the next DEL or restore then prunes the tombstone, all within a slow
/// restore's planning. So an attachment whose cache file is gone is removed again too: its
/// DEL has run to the end.
fn take_back_deleted<K: Kernel>(
    store: &mut Store<K>,
    installed: &[Installed],
    before: &HashSet<OwnerKey>,
) {
    if installed.is_empty() {
        return;
    }
    let now = crate::deleted::read();
    for i in installed {
        let (network, owner) = (&i.network, &i.owner);
        let tombstoned = now.contains(owner) && !before.contains(owner);
        if tombstoned || !i.cache_file.exists() {
            let names = crate::plan::NetNames::new(network);
            match store.remove_pod(&names, *owner, &mut Vec::new()) {
                Ok(_) => crate::info!(
                    "{network} {}: deleted while it was being restored; removed again",
                    owner.hex()
                ),
                Err(e) => crate::warn!("{network} {}: removing it again: {e}", owner.hex()),
            }
        }
    }
}

/// What one repair did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Repair {
    /// Attachments of the cache that were checked (and restored where needed).
    pub pods: usize,
    /// The shared objects checked (and restored where needed) whatever the pods: every
    /// natguard network's by name, or [`crate::plan::NODE`] for the node-wide guard alone.
    pub networks: Vec<String>,
    /// Operations committed: 0 when everything was in place and nothing was written.
    pub ops: usize,
    /// Cache entries skipped: each one's reason ([`SKIP_REASONS`]) and its report line.
    pub skipped: Vec<(&'static str, String)>,
    /// Why attachments could not be planned or installed.
    pub failed: Vec<String>,
    /// The lists whose networks were left as they are.
    pub broken: Vec<BrokenList>,
    /// When the batch was committed (before the socket's release, which waits for the kernel's
    /// cleanup): the moment the policy was back.
    pub committed: Option<std::time::Instant>,
}

/// The watcher's repair after someone else changed natguard's tables: the shared objects of
/// every network and the entries of every live pod of the cache (exempt ones included), as
/// `reconcile` installs them, in ONE batch; flows are left alone. When the batch cannot be
/// committed (one attachment over its owner limit, say), the pods are installed one by one,
/// so one bad entry does not keep the others unprotected.
pub fn repair(opts: &Options) -> Result<Repair> {
    repair_with(opts, &mut Memo::default())
}

/// What the watcher's repairs keep from one to the next: each cached attachment's plan,
/// reused while its cache file (device, inode, mtime, size), its network's entry, the node
/// facts its plan was made with and its network namespace are as they were. Planning a pod
/// asks the kernel about its interface from inside its network namespace, its host side and
/// the node's addresses; after a flush every pod is planned again, so on a node with a
/// hundred pods that is most of a repair's CPU, and under a CPU quota most of its time. An
/// ADD of the same attachment rewrites its cache file, so it is planned afresh. Bounded by
/// the cache: entries whose file is gone are dropped at every repair.
#[derive(Debug, Default)]
pub struct Memo {
    plans: std::collections::HashMap<PathBuf, Memoized>,
}

#[derive(Debug)]
struct Memoized {
    stamp: (u64, u64, i64, i64, u64),
    owner: OwnerKey,
    network: String,
    netns: String,
    cfg: Config,
    facts: crate::plan::NodeFacts,
    prepared: Prepared,
}

fn stamp_of(path: &Path) -> Option<(u64, u64, i64, i64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

/// [`repair`] with the plans of earlier repairs ([`Memo`]).
pub fn repair_with(opts: &Options, memo: &mut Memo) -> Result<Repair> {
    let networks = networks_of(opts)?;
    let facts: BTreeMap<&String, crate::plan::NodeFacts> = networks
        .configs
        .iter()
        .map(|(n, cfg)| (n, crate::node::facts(cfg)))
        .collect();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    let mut out = Repair {
        broken: networks.broken.clone(),
        ..Repair::default()
    };
    let mut prepared: Vec<Prepared> = Vec::new();
    // The cache file of each of `prepared`, in the same order.
    let mut files: Vec<PathBuf> = Vec::new();
    let deleted = crate::deleted::read();
    let mut cached = HashSet::new();
    for path in cache_files(&opts.cache_dir)? {
        seen.insert(path.clone());
        let stamp = stamp_of(&path);
        if let Some(m) = memo.plans.get(&path).filter(|m| {
            Some(m.stamp) == stamp
                && networks.configs.get(&m.network) == Some(&m.cfg)
                && facts.get(&m.network) == Some(&m.facts)
                && (m.netns.is_empty() || Path::new(&m.netns).exists())
        }) {
            // A deleted attachment is gone on purpose: not restored, and no skip to report.
            cached.insert(m.owner);
            if !deleted.contains(&m.owner) {
                prepared.push(m.prepared.clone());
                files.push(path.clone());
            }
            continue;
        }
        memo.plans.remove(&path);
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let entry = match read_cache_entry(&path) {
            Ok(e) => e,
            Err(reason) => {
                let e = Entry {
                    file,
                    network: String::new(),
                    container_id: String::new(),
                    ifname: String::new(),
                    who: String::new(),
                    outcome: Outcome::SkippedUnreadable { reason },
                };
                out.skipped.push(("unreadable_cache", e.to_string()));
                continue;
            }
        };
        let owner = OwnerKey::new(&entry.network, &entry.container_id, &entry.ifname);
        cached.insert(owner);
        if deleted.contains(&owner) {
            continue;
        }
        match prepare_entry(&entry, &networks) {
            Ok((p, _)) => {
                if let (Some(stamp), Some(cfg), Some(f)) = (
                    stamp,
                    networks.configs.get(&entry.network),
                    facts.get(&entry.network),
                ) {
                    memo.plans.insert(
                        path.clone(),
                        Memoized {
                            stamp,
                            owner,
                            network: entry.network.clone(),
                            netns: sandbox_of(&entry.result, &entry.ifname).unwrap_or_default(),
                            cfg: cfg.clone(),
                            facts: *f,
                            prepared: p.clone(),
                        },
                    );
                }
                prepared.push(p);
                files.push(path.clone());
            }
            Err(Outcome::Failed { reason }) => out.failed.push(format!(
                "{} {} {}: {reason}",
                entry.network, entry.container_id, entry.ifname
            )),
            Err(outcome) => {
                let reason = outcome.skip_reason().unwrap_or("unreadable_cache");
                let e = entry_of(file, entry, outcome);
                out.skipped.push((reason, e.to_string()));
            }
        }
    }
    crate::deleted::prune(&cached);
    memo.plans.retain(|p, _| seen.contains(p));
    out.pods = prepared.len();
    // Every network's shared objects, pods or not: after a flush on a node whose networks
    // have no pod yet, the node-wide guard comes back too.
    let plans = guard_plans(&networks.configs, opts.node_guard.as_ref());
    out.networks = plans.iter().map(|p| p.names.network.clone()).collect();
    if prepared.is_empty() && plans.is_empty() {
        return Ok(out);
    }
    let mut store = store::open()?;
    let all: Vec<_> = prepared.iter().map(|p| (&p.shared, &p.pod)).collect();
    let shared: Vec<_> = plans.iter().collect();
    match store.apply(&shared, &all) {
        Ok(n) => {
            out.ops = n;
            out.committed = Some(std::time::Instant::now());
        }
        Err(e) => {
            crate::warn!("repair in one batch failed ({e}); installing pod by pod");
            for p in &prepared {
                match store.apply_pod(&p.shared, &p.pod) {
                    Ok(_) => {
                        out.ops += 1;
                        out.committed = Some(std::time::Instant::now());
                    }
                    Err(e) => out.failed.push(format!("{}: {e}", p.pod.comment)),
                }
            }
        }
    }
    let installed: Vec<Installed> = prepared
        .iter()
        .zip(files)
        .map(|(p, cache_file)| Installed {
            network: p.shared.names.network.clone(),
            owner: p.pod.owner,
            cache_file,
        })
        .collect();
    take_back_deleted(&mut store, &installed, &deleted);
    Ok(out)
}

/// The cache's files, by name.
fn cache_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Error::io(format!("read {}", dir.display()), e)),
    };
    files.sort();
    Ok(files)
}

/// Where the cache's files are when the operator names `dir`: `dir` itself, or `dir/results`
/// when `dir` is libcni's cache root (it has a `results` directory and no files of its own).
/// `--cache-dir /var/lib/cni` is an easy mistake, and read literally it finds no pod, which
/// would leave adopt and self-repair with nothing to do and no error.
pub fn results_dir(dir: &Path) -> PathBuf {
    let results = dir.join("results");
    if !results.is_dir() {
        return dir.to_path_buf();
    }
    let has_files = std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.filter_map(|e| e.ok())
            .any(|e| e.file_type().is_ok_and(|t| t.is_file()))
    });
    if has_files {
        dir.to_path_buf()
    } else {
        results
    }
}
