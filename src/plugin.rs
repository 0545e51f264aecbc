//! The CNI verbs: parse → plan → one transaction → reply.
//!
//! Every verb that writes (ADD, DEL, GC) first reads what it will change: the network's shared
//! objects, and the owner lists of the pod's address elements. It holds an exclusive lock on
//! `/run/natguard/lock` from that read to the commit, so concurrent invocations cannot
//! interleave into a lost owner ("ADD A (ip X), ADD B (ip X), DEL A" keeps B's policy). The lock
//! is held for about a millisecond; conntrack work happens after it is released, and the
//! netlink sockets are released after the reply (see `netlink::defer_release`).

use crate::cni::{self, CniVersion, Command, Env};
use crate::config::{self, NetConf};
use crate::error::{Error, Result};
use crate::netlink::NfSocket;
use crate::nft::{self, encode, Tx};
use crate::plan::{self, Family, NetNames, OwnerKey, PodRef, SetKind, SharedPlan};
use crate::{info, warn};
use serde_json::Value;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

pub const RUN_DIR: &str = "/run/natguard";

/// Holds natguard's node-wide lock while alive.
pub struct Lock(#[allow(dead_code)] File);

pub fn lock() -> Result<Lock> {
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(RUN_DIR);
    let path = format!("{RUN_DIR}/lock");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| Error::io(format!("open lock file {path}"), e))?;
    f.lock().map_err(|e| Error::io(format!("lock {path}"), e))?;
    Ok(Lock(f))
}

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
        let requested = config::decode_stdin(stdin)
            .ok()
            .and_then(|v| config::cni_version_of(&v).ok().flatten());
        return Ok(Some(cni::version_reply(requested)));
    }
    let env = Env::from_lookup(command, env_get)?;
    let conf = match config::parse_netconf(stdin) {
        Ok(c) => c,
        // DEL must clean up even under a config that no longer parses.
        Err(e @ (Error::InvalidConfig(_) | Error::Decode(_))) if command == Command::Del => {
            match config::netconf_for_del(stdin) {
                Ok(c) => {
                    warn!("DEL with an invalid configuration, removing by name only: {e}");
                    c
                }
                Err(_) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    if let Some(path) = &conf.natguard.log_file {
        crate::log::set_file(path);
    }
    crate::log::set_context(format!(
        "{} {} {} {}",
        command.as_str(),
        conf.name,
        cni::truncate(&env.container_id, 12),
        env.ifname
    ));
    // The conntrack path is forced from the environment for tests; the library never reads it.
    let ct_path =
        crate::conntrack::Path::from_override(env_get(crate::conntrack::PATH_ENV).as_deref())
            .unwrap_or_else(|e| {
                warn!("{e}; using the automatic conntrack path");
                crate::conntrack::Path::Auto
            });
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

fn pod_ref<'a>(env: &'a Env, conf: &'a NetConf) -> PodRef<'a> {
    PodRef {
        network: &conf.name,
        container_id: &env.container_id,
        ifname: &env.ifname,
        namespace: env.args.pod_namespace.as_deref(),
        pod_name: env.args.pod_name.as_deref(),
    }
}

fn check_addr_count(addrs: &[IpAddr], ifname: &str) -> Result<()> {
    let len: usize = addrs.iter().map(|a| a.to_string().len() + 1).sum();
    if len > 120 {
        return Err(Error::InvalidConfig(format!(
            "prevResult: {} addresses on {ifname} ({}{}) are more than natguard records per interface (at most {} IPv6 addresses)",
            addrs.len(),
            addrs.iter().take(4).map(|a| a.to_string()).collect::<Vec<_>>().join(", "),
            if addrs.len() > 4 { ", ..." } else { "" },
            plan::MAX_POD_ADDRS
        )));
    }
    Ok(())
}

fn cmd_add(env: &Env, conf: &NetConf, ct_path: crate::conntrack::Path) -> Result<Value> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        Error::InvalidConfig(
            "prevResult: missing; natguard is a chained plugin and must follow a primary plugin (bridge, ptp, Calico, ...) in a conflist".into(),
        )
    })?;
    let addrs = cni::validate_prev_result(prev, &env.ifname)?;
    check_addr_count(&addrs, &env.ifname)?;
    let cidrs = cni::pod_cidrs(prev, &env.ifname)?;
    let cfg = &conf.natguard;
    let node = crate::node::facts(cfg);
    let shared = plan::plan_shared(&conf.name, cfg, &node);
    for w in &shared.warnings {
        warn!("{w}");
    }
    let pod = plan::plan_pod(cfg, &pod_ref(env, conf), &addrs).with_networks(&cidrs);
    if addrs.is_empty() {
        warn!(
            "prevResult has no address on {}; only the shared objects are installed",
            env.ifname
        );
    }
    let mut sock = NfSocket::open()?;
    apply_pod(&mut sock, &shared, &pod)?;
    info!(
        "installed {} for {}",
        pod.owner.hex(),
        addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    if cfg.conntrack.flush_on_add && !addrs.is_empty() {
        flush_conntrack(&mut sock, &addrs, "ADD", ct_path);
    }
    drop(sock);
    Ok(cni::passthrough(prev, conf.cni_version))
}

/// One locked read-modify-write: converge the network's shared objects and install `pod`,
/// removing what an earlier ADD of the same attachment owned and no longer should.
///
/// The shared objects are rewritten only when the kernel's differ from the plan (first ADD of a
/// network, a config change, someone else's flush): the common ADD is a handful of element
/// operations and leaves the network's rules, and the kernel's rule-release work, untouched.
///
/// The caller owns the socket: closing a netfilter netlink socket right after a commit waits
/// for the kernel to free the transaction (an RCU grace period, several milliseconds), so ADD
/// keeps it open across its conntrack walks, which hide that wait.
pub fn apply_pod(sock: &mut NfSocket, shared: &SharedPlan, pod: &plan::PodPlan) -> Result<()> {
    let _lock = lock()?;
    let current = check_shared(sock, shared).is_ok();
    match apply_pod_locked(sock, shared, pod, !current) {
        // The table vanished between the read and the commit (a flush by someone else).
        Err(e) if current && e.errno() == Some(libc::ENOENT) => {
            apply_pod_locked(sock, shared, pod, true)
        }
        r => r,
    }
}

fn apply_pod_locked(
    sock: &mut NfSocket,
    shared: &SharedPlan,
    pod: &plan::PodPlan,
    converge: bool,
) -> Result<()> {
    let names = &shared.names;
    let mut tx = Tx::new(sock);
    if converge {
        tx.converge_shared(shared);
    }
    // An earlier ADD of this attachment with other addresses: release what it owned.
    let pods_set = names.set(SetKind::Pods);
    let pod_key = encode::owner_key_bytes(&pod.owner.hex());
    let old = nft::get_element(sock, &pods_set, &pod_key)?;
    if let Some(old) = &old {
        let stale: Vec<IpAddr> = plan::addrs_from_comment(old.comment.as_deref().unwrap_or(""))
            .into_iter()
            .filter(|a| !pod.addrs.contains(a))
            .collect();
        release_addrs(sock, &mut tx, names, pod.owner, &stale)?;
    }
    stage_pod(sock, &mut tx, names, pod)?;
    if old.as_ref().and_then(|o| o.comment.as_deref()) != Some(pod.comment.as_str()) {
        tx.ensure_elem(
            &pods_set,
            pod_key,
            pod.comment.clone(),
            &format!("pod {}", pod.owner.hex()),
        );
    }
    tx.commit(sock)
}

/// Adds to `tx` what makes the kernel's address elements match `pod`: the pod becomes the
/// newest owner of every (set, address) it needs, and leaves those it must not own. An element
/// is deleted only when its last owner leaves, so two attachments with one address (a leaked
/// IP, a runtime retry) never strip each other's policy. Nothing is written where nothing
/// changes.
fn stage_pod(
    sock: &mut NfSocket,
    tx: &mut Tx,
    names: &NetNames,
    pod: &plan::PodPlan,
) -> Result<()> {
    let wanted = pod.present.iter().map(|p| (p, true));
    let unwanted = pod.absent.iter().map(|p| (p, false));
    for ((kind, ip), want) in wanted.chain(unwanted) {
        stage_owner(sock, tx, &names.set(*kind), ip, pod.owner, want)?;
    }
    for f in Family::ALL {
        let mine: Vec<(u128, u128)> = pod
            .nets
            .iter()
            .filter(|c| Family::of(&c.addr) == f)
            .map(|c| c.range())
            .collect();
        if mine.is_empty() {
            continue;
        }
        let set = names.set(SetKind::Nets(f));
        let have = nft::ranges_of(&nft::dump_set(sock, &set)?);
        let want = plan::merge_ranges(have.iter().copied().chain(mine).collect());
        if want != have {
            tx.rewrite_intervals(&set, f, &want);
        }
    }
    Ok(())
}

/// Adds to `tx` what makes `owner` the newest owner of `ip` in `set` (`want`), or no owner of
/// it. An element is deleted when its last owner leaves; nothing is written where nothing
/// changes.
fn stage_owner(
    sock: &mut NfSocket,
    tx: &mut Tx,
    set: &str,
    ip: &IpAddr,
    owner: OwnerKey,
    want: bool,
) -> Result<()> {
    let cur = nft::get_element(sock, set, &encode::ip_bytes(ip))?;
    let owners = cur.as_ref().map(|e| e.owners()).unwrap_or_default();
    let mut next: Vec<OwnerKey> = owners.iter().copied().filter(|o| *o != owner).collect();
    if want {
        next.insert(0, owner);
    }
    next.truncate(plan::MAX_OWNERS);
    let unchanged = match &cur {
        None => next.is_empty(),
        Some(_) => next == owners,
    };
    if !unchanged {
        tx.set_owners(set, ip, cur.is_some(), &next);
    }
    Ok(())
}

/// Adds to `tx` the removal of `owner` from the address elements of `addrs`.
fn release_addrs(
    sock: &mut NfSocket,
    tx: &mut Tx,
    names: &NetNames,
    owner: OwnerKey,
    addrs: &[IpAddr],
) -> Result<()> {
    for a in addrs {
        let f = Family::of(a);
        for kind in [SetKind::Meta(f), SetKind::Masq(f), SetKind::Allow(f)] {
            stage_owner(sock, tx, &names.set(kind), a, owner, false)?;
        }
    }
    Ok(())
}

/// Deletes the addresses' conntrack entries on the invocation's own netfilter socket; a failure
/// is logged, never returned.
fn flush_conntrack(
    sock: &mut NfSocket,
    addrs: &[IpAddr],
    verb: &str,
    path: crate::conntrack::Path,
) {
    match crate::conntrack::flush_addresses_on(sock, addrs, path) {
        Ok(r) => info!(
            "conntrack: deleted {} entries in {} kernel walks ({})",
            r.deleted, r.walks, r.path
        ),
        Err(e) => warn!("conntrack cleanup at {verb} failed (policy is installed): {e}"),
    }
}

fn cmd_del(env: &Env, conf: &NetConf, ct_path: crate::conntrack::Path) -> Result<()> {
    let names = NetNames::new(&conf.name);
    let owner = OwnerKey::new(&conf.name, &env.container_id, &env.ifname);
    // prevResult is optional on DEL (0.3.x lists send none); when present and usable it adds
    // its addresses to the ones recorded in the kernel.
    let mut addrs: Vec<IpAddr> = conf
        .prev_result
        .as_ref()
        .and_then(|p| cni::pod_addresses(p, &env.ifname).ok())
        .unwrap_or_default();
    let mut sock = match NfSocket::open() {
        Ok(s) => Some(s),
        Err(e) if nft::is_unavailable(&e) => None,
        Err(e) => return Err(e),
    };
    let released = match sock
        .as_mut()
        .map(|s| remove_owner(s, &names, owner, &mut addrs))
    {
        None => 0,
        Some(r) => match r {
            Ok(n) => n,
            Err(e) if nft::is_unavailable(&e) => {
                warn!("nf_tables is not available, nothing to remove: {e}");
                0
            }
            Err(e) => return Err(e),
        },
    };
    info!("removed {} entries of {}", released, owner.hex());
    if let (Some(sock), false) = (sock.as_mut(), addrs.is_empty()) {
        flush_conntrack(sock, &addrs, "DEL", ct_path);
    }
    drop(sock);
    Ok(())
}

/// Removes everything `owner` owns in a network; returns the number of elements removed and
/// extends `addrs` with the addresses the kernel had recorded.
pub fn remove_owner(
    sock: &mut NfSocket,
    names: &NetNames,
    owner: OwnerKey,
    addrs: &mut Vec<IpAddr>,
) -> Result<usize> {
    let _lock = lock()?;
    let pods_set = names.set(SetKind::Pods);
    let key = encode::owner_key_bytes(&owner.hex());
    let mut tx = Tx::new(sock);
    let mut removed = 0;
    if let Some(e) = nft::get_element(sock, &pods_set, &key)? {
        for a in plan::addrs_from_comment(e.comment.as_deref().unwrap_or("")) {
            if !addrs.contains(&a) {
                addrs.push(a);
            }
        }
        tx.delete_elem(&pods_set, key, &format!("pod {}", owner.hex()));
        removed += 1;
    }
    let before = tx.len();
    release_addrs(sock, &mut tx, names, owner, addrs)?;
    removed += tx.len() - before;
    tx.commit(sock)?;
    Ok(removed)
}

fn cmd_check(env: &Env, conf: &NetConf) -> Result<()> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        Error::InvalidConfig("prevResult: missing; CHECK needs the cached result of ADD".into())
    })?;
    let addrs = cni::validate_prev_result(prev, &env.ifname)?;
    let cfg = &conf.natguard;
    let node = crate::node::facts(cfg);
    let shared = plan::plan_shared(&conf.name, cfg, &node);
    let pod = plan::plan_pod(cfg, &pod_ref(env, conf), &addrs)
        .with_networks(&cni::pod_cidrs(prev, &env.ifname)?);
    let mut sock = NfSocket::open()?;
    check_shared(&mut sock, &shared)?;
    check_pod(&mut sock, &shared.names, &pod)
}

/// Compares the kernel's shared objects of a network with the plan.
pub fn check_shared(sock: &mut NfSocket, shared: &SharedPlan) -> Result<()> {
    let names = &shared.names;
    match nft::table_flags(sock)? {
        None => {
            return Err(Error::CheckFailed(format!(
                "table inet {} is missing, and with it chain {} and every set of network {}",
                plan::TABLE,
                names.chain(plan::ChainKind::Dnat),
                names.network
            )))
        }
        Some(f) if f & 1 != 0 => {
            return Err(Error::CheckFailed(format!(
                "table inet {} is dormant: none of its rules apply",
                plan::TABLE
            )))
        }
        Some(_) => {}
    }
    let sets: HashSet<String> = nft::set_names(sock)?.into_iter().collect();
    for s in &shared.sets {
        if !sets.contains(&s.name) {
            return Err(Error::CheckFailed(format!(
                "set inet {} {} is missing",
                plan::TABLE,
                s.name
            )));
        }
        // The shared sets' contents are policy too: an emptied metadata or CIDR set would
        // switch interception or the masquerade exceptions off for the whole network.
        if let Some(elems) = &s.elements {
            let mut want: Vec<(Vec<u8>, u32)> = elems
                .iter()
                .flat_map(|e| encode::elem_data(e, s.kind.is_interval()))
                .map(|d| (d.key, d.flags))
                .collect();
            let mut got: Vec<(Vec<u8>, u32)> = nft::dump_set(sock, &s.name)?
                .into_iter()
                .map(|e| (e.key, e.flags & encode::NFT_SET_ELEM_INTERVAL_END))
                .collect();
            want.sort();
            got.sort();
            if want != got {
                return Err(Error::CheckFailed(format!(
                    "set {} differs from the config ({} elements expected, {} found); the next ADD on this network rewrites it",
                    s.name,
                    want.len(),
                    got.len()
                )));
            }
        }
    }
    let expected = shared.rule_comment();
    let chains: HashSet<String> = nft::chain_names(sock)?.into_iter().collect();
    let mut rules = nft::rule_comments_by_chain(sock)?;
    for c in plan::ChainKind::ALL {
        let chain = names.chain(c);
        let want = shared.rules_of(c).count();
        let got = if chains.contains(&chain) {
            Some(rules.remove(&chain).unwrap_or_default())
        } else {
            None
        };
        match got {
            None => {
                return Err(Error::CheckFailed(format!(
                    "chain inet {} {chain} is missing",
                    plan::TABLE
                )))
            }
            Some(got) => {
                if got.len() != want || got.iter().any(|g| *g != expected) {
                    let seen: Vec<&str> = got.iter().map(|s| s.as_str()).collect();
                    return Err(Error::CheckFailed(format!(
                        "chain {chain} differs from the config: expected {want} rules commented {expected:?}, found {} ({seen:?}); the next ADD on this network rewrites it",
                        got.len()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Compares a pod's elements with its plan.
pub fn check_pod(sock: &mut NfSocket, names: &NetNames, pod: &plan::PodPlan) -> Result<()> {
    let owner = pod.owner.hex();
    let rec = nft::get_element(
        sock,
        &names.set(SetKind::Pods),
        &encode::owner_key_bytes(&owner),
    )?
    .ok_or_else(|| {
        Error::CheckFailed(format!(
            "pod entry {owner} is missing from set {}",
            names.set(SetKind::Pods)
        ))
    })?;
    let mut recorded = plan::addrs_from_comment(rec.comment.as_deref().unwrap_or(""));
    let mut want = pod.addrs.clone();
    recorded.sort();
    want.sort();
    if recorded != want {
        return Err(Error::CheckFailed(format!(
            "pod {owner} is recorded with addresses {recorded:?}, prevResult has {want:?}"
        )));
    }
    for (kind, ip) in &pod.present {
        let set = names.set(*kind);
        match nft::get_element(sock, &set, &encode::ip_bytes(ip))? {
            None => {
                return Err(Error::CheckFailed(format!(
                    "address {ip} is missing from set {set}"
                )))
            }
            Some(e) if !e.owners().contains(&pod.owner) => {
                return Err(Error::CheckFailed(format!(
                    "address {ip} in set {set} is owned by {:?}, not by this pod ({owner})",
                    e.comment.unwrap_or_default()
                )))
            }
            Some(_) => {}
        }
    }
    for (kind, ip) in &pod.absent {
        let set = names.set(*kind);
        if let Some(e) = nft::get_element(sock, &set, &encode::ip_bytes(ip))? {
            if e.owners().contains(&pod.owner) {
                return Err(Error::CheckFailed(format!(
                    "address {ip} must not be in set {set} on behalf of this pod ({owner})"
                )));
            }
        }
    }
    for c in &pod.nets {
        let f = Family::of(&c.addr);
        let set = names.set(SetKind::Nets(f));
        let have = nft::ranges_of(&nft::dump_set(sock, &set)?);
        let (lo, hi) = c.range();
        if !have.iter().any(|&(a, b)| a <= lo && hi <= b) {
            return Err(Error::CheckFailed(format!(
                "pod network {c} is missing from set {set}"
            )));
        }
    }
    Ok(())
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
    let removed = match gc_network(&names, &valid) {
        Err(e) if nft::is_unavailable(&e) => 0,
        r => r?,
    };
    info!("GC removed {removed} elements");
    Ok(())
}

/// Removes every pod entry of a network whose owner is not in `valid`, and every address
/// element whose owner is not. Returns the number of elements removed.
pub fn gc_network(names: &NetNames, valid: &HashSet<OwnerKey>) -> Result<usize> {
    let mut sock = NfSocket::open()?;
    let _lock = lock()?;
    let mut tx = Tx::new(&mut sock);
    let pods_set = names.set(SetKind::Pods);
    for e in nft::dump_set(&mut sock, &pods_set)? {
        if !e.owner().is_some_and(|o| valid.contains(&o)) {
            tx.delete_elem(&pods_set, e.key.clone(), "stale pod");
        }
    }
    for f in Family::ALL {
        for kind in [SetKind::Meta(f), SetKind::Masq(f), SetKind::Allow(f)] {
            let set = names.set(kind);
            for e in nft::dump_set(&mut sock, &set)? {
                let (Some(ip), owners) = (e.addr(), e.owners()) else {
                    continue;
                };
                let live: Vec<OwnerKey> = owners
                    .iter()
                    .copied()
                    .filter(|o| valid.contains(o))
                    .collect();
                if live != owners || owners.is_empty() {
                    tx.set_owners(&set, &ip, true, &live);
                }
            }
        }
    }
    let n = tx.len();
    tx.commit(&mut sock)?;
    Ok(n)
}

fn cmd_status() -> Result<()> {
    let mut sock = NfSocket::open().map_err(|e| {
        Error::NotReady(format!(
            "nf_tables is not usable: cannot open a netfilter netlink socket: {e}"
        ))
    })?;
    nft::probe(&mut sock).map_err(|e| Error::NotReady(format!("nf_tables is not usable: {e}")))?;
    crate::conntrack::probe_on(&mut sock)
        .map_err(|e| Error::NotReady(format!("conntrack netlink is not usable: {e}")))?;
    Ok(())
}
