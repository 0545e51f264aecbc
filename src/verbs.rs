//! The CNI verbs: parse → plan → one store transaction → reply.
//!
//! Each verb validates its input completely before touching the kernel, plans with
//! [`crate::plan`], and hands the plan to the [`Store`], the only way to kernel state. ADD and
//! `natguard adopt` share [`prepare_pod`], so a cached result goes through exactly the checks a
//! live ADD does. Conntrack work happens after the store's commit and outside its lock, and its
//! failures are logged, never returned: the pod's policy is already in force.

use crate::cni::{self, CniVersion, Command, Env, NetConf};
use crate::config::Config;
use crate::ctpass;
use crate::error::{Error, Result};
use crate::kernel::conntrack::{Path, Scope};
use crate::kernel::{self, Kernel};
use crate::plan::{NetNames, OwnerKey};
use crate::prepare::{not_a_pod_address_here, prepare_pod, Identity};
use crate::store::{self, Store};
use crate::{info, warn};
use serde_json::Value;
use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The reply of a successful invocation, if it prints one.
pub type Reply = Option<Value>;

/// Runs one CNI invocation. `stdin` is the raw network configuration.
pub fn run(
    command: Command,
    env_get: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
) -> Result<Reply> {
    if command == Command::Version {
        // No config needed: podman sends only {"cniVersion":"1.0.0"}, with dummy env.
        let requested = cni::netconf::decode_stdin(stdin)
            .ok()
            .and_then(|v| cni::netconf::cni_version_of(&v).ok().flatten());
        return Ok(Some(cni::version_reply(requested)));
    }
    let env = Env::from_lookup(command, env_get)?;
    let conf = match cni::netconf::parse_netconf(stdin) {
        Ok(c) => c,
        // DEL must clean up even under a config that no longer parses.
        Err(e @ (Error::InvalidConfig(_) | Error::Decode(_))) if command == Command::Del => {
            match cni::netconf::netconf_for_del(stdin) {
                Ok(c) => {
                    warn!("DEL with an invalid configuration, removing by name only: {e}");
                    c
                }
                Err(_) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    crate::log::configure(
        conf.natguard.log_file.as_deref(),
        conf.natguard.log_level,
        conf.natguard.log_file_max_size,
    );
    crate::log::set_format(conf.natguard.log_format);
    crate::log::set_context(crate::log::Context {
        component: command.as_str().to_string(),
        network: Some(conf.name.clone()),
        container: Some(cni::truncate(&env.container_id, 12).to_string()),
        ifname: Some(env.ifname.clone()),
        pod: match (&env.args.pod_namespace, &env.args.pod_name) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            _ => None,
        },
    });
    let ct_path = conntrack_path(env_get)?;
    match command {
        Command::Add => cmd_add(&env, &conf, ct_path).map(Some),
        Command::Del => cmd_del(&env, &conf, ct_path).map(|_| None),
        Command::Check => {
            if !conf.cni_version.supports_check() {
                return Err(Error::IncompatibleVersion(format!(
                    "cniVersion: {} does not support CHECK (0.4.0 or later does)",
                    conf.cni_version.as_str()
                )));
            }
            cmd_check(&env, &conf).map(|_| None)
        }
        Command::Gc => {
            require_1_1(conf.cni_version, "GC")?;
            cmd_gc(&conf).map(|_| None)
        }
        Command::Status => {
            require_1_1(conf.cni_version, "STATUS")?;
            cmd_status().map(|_| None)
        }
        Command::Version => unreachable!("handled above"),
    }
}

fn conntrack_path(env_get: &dyn Fn(&str) -> Option<String>) -> Result<Path> {
    Path::from_override(env_get(crate::kernel::conntrack::PATH_ENV).as_deref())
}

fn require_1_1(v: CniVersion, verb: &str) -> Result<()> {
    if v.supports_gc_status() {
        Ok(())
    } else {
        Err(Error::IncompatibleVersion(format!(
            "cniVersion: {} does not support {verb} (1.1.0 or later does)",
            v.as_str()
        )))
    }
}

fn identity<'a>(env: &'a Env, conf: &'a NetConf) -> Identity<'a> {
    Identity {
        network: &conf.name,
        container_id: &env.container_id,
        ifname: &env.ifname,
        netns: &env.netns,
        netns_from: "CNI_NETNS",
        args: &env.args,
        annotations: conf.annotations,
    }
}

fn cmd_add(env: &Env, conf: &NetConf, ct_path: Path) -> Result<Value> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        Error::InvalidConfig(
            "prevResult: missing; natguard is a chained plugin and must follow a primary plugin (bridge, ptp, Calico, ...) in a conflist".into(),
        )
    })?;
    let cfg = &conf.natguard;
    let who = identity(env, conf);
    let p = prepare_pod(cfg, &who, prev, crate::prepare::inspect(&who)?)?;
    for w in &p.shared.warnings {
        warn!("{w}");
    }
    if p.addrs.is_empty() {
        warn!(
            "prevResult has no address on {}; only the shared objects are installed",
            env.ifname
        );
    }
    if p.pod.host.is_none() {
        warn!(
            "no host side of {} was established: the pod's metadata traffic is neither proxied nor exempted, and the node-wide guard resets it",
            env.ifname
        );
    }
    crate::deleted::forget(p.pod.owner);
    let mut store = store::open()?;
    let converged = store.apply_pod(&p.shared, &p.pod)?;
    info!(
        "installed {} for {}",
        p.pod.owner.hex(),
        p.addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    if cfg.conntrack.flush_on_add && !p.addrs.is_empty() {
        let scope = store.add_scope(&p.shared.names, cfg, &p.addrs);
        flush_conntrack(&mut store, &p.addrs, ct_path, &scope, "ADD");
    }
    if converged == store::Converged::Yes {
        drop(store);
        restore_cached_pods(&conf.name, cfg);
    }
    Ok(cni::passthrough(prev, conf.cni_version))
}

/// After an ADD that had to rewrite the shared objects (the first of a network, a config
/// change, or a flushed ruleset), every other pod's entries are restored from the runtimes'
/// result cache, as `natguard reconcile` does: after `nft flush ruleset`, the next ADD repairs
/// every pod, not only its own. Idempotent for pods whose entries are intact; a failure is
/// logged, never returned: this pod's policy is in force.
fn restore_cached_pods(network: &str, cfg: &Config) {
    let opts = crate::restore::Options {
        reconcile: true,
        known: [(network.to_string(), cfg.clone())].into_iter().collect(),
        ..Default::default()
    };
    match crate::restore::run(&opts) {
        Ok(r) if r.adopted() > 0 || r.failed() > 0 => info!(
            "shared objects were rewritten: restored {} cached attachment(s), {} failed",
            r.adopted(),
            r.failed()
        ),
        Ok(_) => {}
        Err(e) => {
            warn!("shared objects were rewritten; restoring the cached attachments failed: {e}")
        }
    }
}

/// Which of the deleted pod's addresses' entries its DEL deletes. Where another network's live
/// attachment holds one of the addresses (overlapping ranges), only this network's flows (its
/// label bit; a network that labels nothing: the unlabelled ones, never a labelling network's),
/// so the other pod keeps its connections and a DEL with no flow of its own deletes nothing.
/// Otherwise the address is this pod's alone and every entry of it goes, flows towards the pod
/// included, by the kernel's filtered deletes: a scoped flush has to dump, which a DEL on a busy
/// table would pay for nothing. If the other networks cannot be read, the scoped flush.
fn del_scope<K: Kernel>(
    store: &mut Store<K>,
    names: &NetNames,
    cfg: &Config,
    addrs: &[IpAddr],
) -> Scope {
    if matches!(store.conntrack_entries(), Ok(0)) {
        return Scope::All;
    }
    let own = store::own_label(names, cfg).map_or(Scope::Unlabelled, Scope::Own);
    match store.label_holders(names, addrs) {
        Ok(holders) if holders.is_empty() => Scope::All,
        Ok(_) => own,
        Err(e) => {
            warn!("cannot read which other networks hold the pod's addresses, so only this network's flows are deleted: {e}");
            own
        }
    }
}

/// What the log says of a scope.
fn describe_scope(scope: &Scope) -> String {
    match scope {
        Scope::All => String::new(),
        Scope::Own(b) => format!("; only flows labelled {b}"),
        Scope::Unlabelled => "; only unlabelled flows".into(),
        Scope::Except { keep, .. } => format!(
            "; kept the flows labelled {} (other networks' pods with these addresses)",
            keep.iter().map(u8::to_string).collect::<Vec<_>>().join(",")
        ),
    }
}

/// Deletes the addresses' conntrack entries that `scope` deletes, in one pass with every
/// invocation that waits to do the same ([`crate::ctpass`]); a failure is logged, never
/// returned. The log line gives the time spent in conntrack's kernel calls, so what an ADD
/// costs besides them can be read from each ADD (the benchmark does).
fn flush_conntrack<K: Kernel>(
    store: &mut Store<K>,
    addrs: &[IpAddr],
    path: Path,
    scope: &Scope,
    verb: &str,
) {
    let run_dir = crate::lock::run_dir();
    let path = crate::kernel::conntrack::auto_path(path, addrs, run_dir);
    let mut timed = Timed {
        store,
        kernel: Duration::ZERO,
    };
    let outcome = crate::ctpass::flush(run_dir, addrs, path, scope, &mut timed);
    let ms = timed.kernel.as_secs_f64() * 1e3;
    let scoped = describe_scope(scope);
    match outcome {
        Ok(ctpass::Outcome::Ran { reports, served }) => info!(
            "conntrack: deleted {} entries in {} kernel walks ({}{scoped}) for {served} invocation(s); {ms:.3} ms in the kernel",
            reports.iter().map(|r| r.deleted).sum::<u64>(),
            reports.iter().map(|r| r.walks).sum::<u32>(),
            reports
                .iter()
                .map(|r| r.path)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        Ok(ctpass::Outcome::Served) => info!("conntrack: deleted by another invocation's pass"),
        Ok(ctpass::Outcome::Alone { report: r, why }) => info!(
            "conntrack: deleted {} entries in {} kernel walks ({}{scoped}) alone: {why}; {ms:.3} ms in the kernel",
            r.deleted, r.walks, r.path
        ),
        Err(e) => warn!("conntrack cleanup at {verb} failed (policy is installed): {e}"),
    }
}

/// The store as the conntrack pass's kernel side, adding up the time its calls take.
struct Timed<'a, K: Kernel> {
    store: &'a mut Store<K>,
    kernel: Duration,
}

impl<K: Kernel> ctpass::Flusher for Timed<'_, K> {
    fn entries(&mut self) -> Result<u64> {
        let t = Instant::now();
        let r = self.store.conntrack_entries();
        self.kernel += t.elapsed();
        r
    }
    fn flush(
        &mut self,
        addrs: &[IpAddr],
        path: Path,
        scope: &Scope,
    ) -> Result<crate::kernel::conntrack::FlushReport> {
        let t = Instant::now();
        let r = self.store.flush_conntrack(addrs, path, scope);
        self.kernel += t.elapsed();
        r
    }
}

fn cmd_del(env: &Env, conf: &NetConf, ct_path: Path) -> Result<()> {
    let names = NetNames::new(&conf.name);
    let owner = OwnerKey::new(&conf.name, &env.container_id, &env.ifname);
    // prevResult is optional on DEL (0.3.x lists send none); when present and usable it adds
    // its addresses to the ones recorded in the kernel.
    // Only what could be a pod's address: a broken prevResult must not make DEL flush the
    // node's own flows.
    let ips = conf
        .prev_result
        .as_ref()
        .and_then(|p| cni::prev_result::pod_ips(p, &env.ifname).ok())
        .unwrap_or_default();
    let own = crate::node::own_among(&ips.iter().map(|ip| ip.addr).collect::<Vec<_>>());
    let mut addrs: Vec<IpAddr> = ips
        .iter()
        .filter(|ip| not_a_pod_address_here(&conf.natguard, &own, ip).is_none())
        .map(|ip| ip.addr)
        .collect();
    // Before the entries go: a restore from the runtime's cache, which keeps the attachment
    // until every plugin's DEL has run, must not bring them back.
    crate::deleted::record(owner, &conf.name, &env.container_id, &env.ifname);
    let mut store = match store::open() {
        Ok(s) => s,
        Err(e) if kernel::is_unavailable(&e) => {
            warn!("nf_tables is not available, nothing to remove: {e}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let removed = match store.remove_pod(&names, owner, &mut addrs) {
        Ok(n) => n,
        Err(e) if kernel::is_unavailable(&e) => {
            warn!("nf_tables is not available, nothing to remove: {e}");
            0
        }
        Err(e) => return Err(e),
    };
    info!("removed {} entries of {}", removed, owner.hex());
    if !addrs.is_empty() {
        let scope = del_scope(&mut store, &names, &conf.natguard, &addrs);
        flush_conntrack(&mut store, &addrs, ct_path, &scope, "DEL");
    }
    Ok(())
}

fn cmd_check(env: &Env, conf: &NetConf) -> Result<()> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        Error::InvalidConfig("prevResult: missing; CHECK needs the cached result of ADD".into())
    })?;
    let who = identity(env, conf);
    let link = crate::prepare::inspect(&who)?;
    let mut store = store::open()?;
    match check_against(&mut store, &conf.natguard, &who, prev, link.clone()) {
        // A ConfigMap change converges running pods (the watcher's adopt), while a runtime
        // may CHECK with the list of the pod's ADD: a pod that matches natguard's entry of
        // its network in the node's list as it is now is where natguard put it.
        Err(Error::CheckFailed(why)) => {
            let Some((dir, current)) = current_entry(&conf.name) else {
                return Err(Error::CheckFailed(why));
            };
            match check_against(&mut store, &current, &who, prev, link) {
                Ok(()) => {
                    info!(
                        "CHECK: the pod follows natguard's entry of network {} in {} as it is now, \
                         not the configuration given ({why})",
                        conf.name,
                        dir.display()
                    );
                    Ok(())
                }
                Err(_) => Err(Error::CheckFailed(why)),
            }
        }
        r => r,
    }
}

/// CHECK of one pod against the plan of `cfg`.
fn check_against<K: Kernel>(
    store: &mut Store<K>,
    cfg: &Config,
    who: &Identity<'_>,
    prev: &Value,
    link: Option<kernel::podside::PodLink>,
) -> Result<()> {
    let p = prepare_pod(cfg, who, prev, link)?;
    store.check_shared(&p.shared)?;
    store.check_pod(&p.shared.names, &p.pod)
}

/// natguard's entry of `network` in the node's netconf dir (the one the watcher records beside
/// its readiness file, else the default) and that dir; `None` where no list of it names
/// natguard or its entry does not parse.
fn current_entry(network: &str) -> Option<(std::path::PathBuf, Config)> {
    let ready = std::path::Path::new(crate::tools::watcher::DEFAULT_READY_FILE);
    let dir = crate::tools::install::record::read_options(ready)
        .map(|r| r.netconf_dir)
        .unwrap_or_else(|| crate::restore::DEFAULT_NETCONF_DIR.into());
    let cfg = crate::restore::natguard_networks(&dir)
        .ok()?
        .remove(network)?;
    Some((dir, cfg))
}

fn cmd_gc(conf: &NetConf) -> Result<()> {
    let names = NetNames::new(&conf.name);
    // Without the list, "keep nothing" would strip every running pod's policy: do nothing.
    let Some(attachments) = conf.valid_attachments.as_deref() else {
        warn!("GC without cni.dev/valid-attachments: nothing is removed");
        return Ok(());
    };
    let valid: HashSet<OwnerKey> = attachments
        .iter()
        .map(|a| OwnerKey::new(&conf.name, &a.container_id, &a.ifname))
        .collect();
    let removed = match store::open().and_then(|mut s| s.gc(&names, &valid)) {
        Err(e) if kernel::is_unavailable(&e) => 0,
        r => r?,
    };
    info!("GC removed {removed} elements");
    Ok(())
}

fn cmd_status() -> Result<()> {
    let mut store = store::open().map_err(|e| {
        Error::NotReady(format!(
            "nf_tables is not usable: cannot open a netfilter netlink socket: {e}"
        ))
    })?;
    store.probe()
}
