//! One install pass: the binary into the bin dir, natguard's entry into the active list, the
//! readiness file, and `natguard adopt` for the pods that started without natguard.
//!
//! The order matters. The binary is copied before the list names it, so no runtime ever execs a
//! plugin that is not there. A pass that finds everything in place writes nothing (the list
//! keeps its inode, the binary its bytes), so running it again, or from `--watch` after each
//! directory event, is cheap and never loops on its own writes. A list rewritten by its agent
//! between natguard's read and its rename is read again, a bounded number of times. A lone
//! plugin config is converted into a list of the same basename, and such a conversion is redone
//! when the agent writes its config again.

use super::atomic::{is_concurrent_change, parent, same_bytes, sync_dir, write_atomic};
use super::netconf_dir::{
    active_file, check_list, check_single, conf_files, is_list_path, is_natguard, load, Loaded,
};
use super::splice::{checked_text, pretty, splice_entry};
use super::{InstallOpts, PLUGIN_TYPE};
use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How often a write that lost a race with an agent is tried again.
const ATTEMPTS: u32 = 5;

/// What one pass over the netconf dir did.
#[derive(Debug, PartialEq)]
pub(crate) enum Outcome {
    /// natguard's entry was already there with this config.
    UpToDate(PathBuf),
    /// The list was written (entry inserted or its config replaced).
    Wrote(PathBuf),
}

/// Whether a pass writes or only checks that it could.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    Yes,
    /// Every check is made and nothing is written.
    DryRun,
}

/// Runs `attempt` again while it fails because a file changed under it.
pub(crate) fn retrying<T>(mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut n = 1;
    loop {
        match attempt() {
            Err(e) if n < ATTEMPTS && is_concurrent_change(&e) => {
                crate::warn!("{e}; trying again");
                n += 1;
            }
            r => return r,
        }
    }
}

/// Puts natguard's entry into the active list; writes nothing when it is already there.
pub(crate) fn install_conflist(opts: &InstallOpts, write: Write) -> Result<Outcome> {
    retrying(|| install_conflist_once(opts, write))
}

fn install_conflist_once(opts: &InstallOpts, write: Write) -> Result<Outcome> {
    let path = active_file(opts)?;
    let l = load(&path)?;
    if !is_list_path(&path) {
        return convert_single(opts, &l, write).map(Outcome::Wrote);
    }
    if let Some(single) = rewritten_single(&l) {
        return convert_single(opts, &single, write).map(Outcome::Wrote);
    }
    let plugins = check_list(&l)?;
    let existing = plugins.iter().position(is_natguard);
    if let Some(i) = existing {
        if plugins[i] == opts.entry {
            return Ok(Outcome::UpToDate(path));
        }
    }
    let mut want = l.doc.clone();
    if let Some(Value::Array(p)) = want.get_mut("plugins") {
        match existing {
            Some(i) => p[i] = opts.entry.clone(),
            None => p.push(opts.entry.clone()),
        }
    }
    let want = Value::Object(want);
    let text = checked_text(splice_entry(&l.text, &opts.entry, existing), &want);
    if write == Write::DryRun {
        return Ok(Outcome::Wrote(path));
    }
    let old = l.text.as_bytes();
    write_atomic(&path, text.as_bytes(), 0o644, Some(&l.meta), &|| {
        same_bytes(&path, old)
    })?;
    let verb = if existing.is_some() {
        "updated"
    } else {
        "added"
    };
    crate::info!("{verb} natguard's entry in {}", path.display());
    Ok(Outcome::Wrote(path))
}

/// Whether `list` is natguard's conversion of a `.json` config of the same basename that its agent
/// has written again since; that config then has to be converted again, or the stale list would
/// shadow it (`x.conflist` sorts before `x.json`). A `.conf` sorts before its list and is found as
/// the active file anyway.
fn rewritten_single(list: &Loaded) -> Option<Loaded> {
    let sibling = list.path.with_extension("json");
    if !fs::symlink_metadata(&sibling).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let single = load(&sibling).ok()?;
    converted_from(list, &single).then_some(single)
}

/// Whether `list` has the shape natguard gives a converted single config: same name, the plugin,
/// then natguard.
fn converted_from(list: &Loaded, single: &Loaded) -> bool {
    list.doc.get("name").is_some()
        && list.doc.get("name") == single.doc.get("name")
        && matches!(list.doc.get("plugins"), Some(Value::Array(p))
            if p.len() == 2 && is_natguard(&p[1]))
}

/// The key of a converted list that keeps the lone config it was made from: `file` (its name)
/// and `text` (its bytes).
pub(crate) const CONVERTED_FROM: &str = "natguard.io/convertedFrom";

/// Turns a lone plugin config into a list of the same basename with natguard after it.
fn convert_single(opts: &InstallOpts, l: &Loaded, write: Write) -> Result<PathBuf> {
    check_single(l)?;
    let path = &l.path;
    let new_path = path.with_extension("conflist");
    let shown = new_path.display();
    // The list replaces the conf only if nothing sorts between them; otherwise a third file
    // would become the active one.
    if opts.conflist.is_none() {
        let dir = parent(path);
        let files = conf_files(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
        let old_name = path.file_name().unwrap_or_default();
        let new_name = new_path.file_name().unwrap_or_default();
        let first_other = files
            .iter()
            .find(|f| f.as_os_str() != old_name && f.as_os_str() != new_name);
        if let Some(other) = first_other {
            if other.as_bytes() < new_name.as_bytes() {
                return Err(Error::Command(format!(
                    "{} is a single plugin config; as {} it would sort after {} and that \
                     file would become the active network: convert it by hand or pass \
                     --conflist",
                    path.display(),
                    shown,
                    other.to_string_lossy()
                )));
            }
        }
    }
    if fs::symlink_metadata(&new_path).is_ok() {
        // Only a list that natguard made from this very config may be replaced: the agent
        // wrote its config again after an earlier conversion.
        let prev = load(&new_path)?;
        if !converted_from(&prev, l) {
            return Err(Error::Command(format!(
                "{} is a single plugin config and {} already exists and is not natguard's \
                 conversion of it; resolve by hand",
                path.display(),
                shown
            )));
        }
    }
    let mut list = Map::new();
    let mut plugin = Map::new();
    for (k, v) in &l.doc {
        match k.as_str() {
            "cniVersion" | "name" => list.insert(k.clone(), v.clone()),
            _ => plugin.insert(k.clone(), v.clone()),
        };
    }
    list.insert(
        "plugins".into(),
        Value::Array(vec![Value::Object(plugin), opts.entry.clone()]),
    );
    // The config as it was, for `uninstall` to put back byte for byte (runtimes ignore a list's
    // keys they do not know).
    list.insert(
        CONVERTED_FROM.into(),
        serde_json::json!({
            "file": path.file_name().unwrap_or_default().to_string_lossy(),
            "text": l.text,
        }),
    );
    if write == Write::DryRun {
        return Ok(new_path);
    }
    let text = pretty(&Value::Object(list));
    let old = l.text.as_bytes();
    write_atomic(&new_path, text.as_bytes(), 0o644, Some(&l.meta), &|| {
        same_bytes(path, old)
    })?;
    fs::remove_file(path).map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
    let dir = parent(path);
    sync_dir(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
    crate::info!(
        "converted {} into {shown} with natguard's entry",
        path.display()
    );
    Ok(new_path)
}

/// Copies the running binary to `<bin dir>/natguard` unless the same bytes are there already.
pub(crate) fn install_binary(bin_dir: &Path) -> Result<bool> {
    let src = std::env::current_exe().map_err(|e| Error::io("finding the running binary", e))?;
    let dst = bin_dir.join(PLUGIN_TYPE);
    let bytes = fs::read(&src).map_err(|e| Error::io(format!("reading {}", src.display()), e))?;
    if same_bytes(&dst, &bytes) {
        return Ok(false);
    }
    fs::create_dir_all(bin_dir).map_err(|e| Error::io(bin_dir.display().to_string(), e))?;
    write_atomic(&dst, &bytes, 0o755, None, &|| true)?;
    crate::info!("installed {}", dst.display());
    Ok(true)
}

/// natguard's entry as a plugin config: what the node-wide guard is planned from while no
/// conflist lists natguard yet. The entry was validated when the arguments were parsed.
pub(crate) fn entry_config(opts: &InstallOpts) -> Option<crate::config::Config> {
    crate::config::parse_plugin_config(&opts.entry).ok()
}

/// The name of the network whose list install writes, when that list lists natguard already.
fn listed_network(opts: &InstallOpts) -> Option<String> {
    let l = load(&active_file(opts).ok()?).ok()?;
    let lists = l
        .doc
        .get("plugins")
        .and_then(Value::as_array)
        .is_some_and(|p| p.iter().any(is_natguard));
    lists
        .then(|| {
            l.doc
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .flatten()
}

/// Puts the node-wide guard in place: the shared objects of every network whose conflist
/// lists natguard, or, where none does yet, the guard alone from natguard's entry, with the
/// entries of the running pods in the same batch (a converged network never lacks them). From
/// then on metadata TCP of every pod natguard has not seen is reset, on a node that has no pod
/// and no natguard network yet. Nothing is written when it is intact.
///
/// The network of the list install writes, where that list lists natguard already (another
/// release's entry, an edited ConfigMap), is planned with the entry install puts there, not
/// with the one it replaces: adopt converges to that entry right after the list is written, and
/// a converge to the old entry's meaning in between would give the pods another policy for
/// that instant (0.2.0's entry read by a release whose masquerade default changed left their
/// connections of that instant unmasqueraded).
pub(crate) fn place_guard(opts: &InstallOpts) -> Result<()> {
    let cfg = entry_config(opts);
    let (_, cache_dir) = opts.cache_dirs();
    let mut next = std::collections::BTreeMap::new();
    if let (Some(c), Some(network)) = (&cfg, listed_network(opts)) {
        next.insert(network, c.clone());
    }
    let n = crate::restore::place_guard(&opts.netconf_dir, &cache_dir, cfg.as_ref(), next)
        .map_err(|e| e.context("putting the node-wide metadata guard in place"))?;
    if n > 0 {
        crate::info!("the node-wide metadata guard is in place ({n} change(s) committed)");
    } else {
        crate::info!("the node-wide metadata guard is in place (intact, nothing written)");
    }
    Ok(())
}

/// Runs the installed binary's `adopt`, which brings pods that got no ADD from natguard under
/// policy; a failure is reported and does not fail the install. With JSON logs, adopt logs in
/// JSON too and its report lines (stdout) and other output become this process's log lines, so
/// every line the watcher's container writes is one JSON object.
pub(crate) fn run_adopt(opts: &InstallOpts) {
    let bin = opts.bin_dir.join(PLUGIN_TYPE);
    let mut cmd = Command::new(&bin);
    cmd.arg("adopt").arg("--netconf-dir").arg(&opts.netconf_dir);
    if let Some(c) = &opts.cache_dir {
        cmd.arg("--cache-dir").arg(c);
    }
    let status = match opts.log_format {
        crate::log::Format::Text => cmd.status(),
        crate::log::Format::Json => {
            cmd.args(["--log-format", "json"]);
            cmd.output().map(|out| {
                relog_json(&out.stdout, crate::log::Level::Info);
                relog_json(&out.stderr, crate::log::Level::Warn);
                out.status
            })
        }
    };
    match status {
        Ok(s) if s.success() => crate::info!("natguard adopt: done"),
        Ok(s) => crate::warn!(
            "`{} adopt` failed ({s}); pods started without natguard's ADD may lack its policy \
             until they are recreated",
            bin.display()
        ),
        Err(e) => crate::warn!("running `{} adopt`: {e}", bin.display()),
    }
}

/// A child's output as log lines: a JSON object line as it is (the child's own log line),
/// any other line as a line of this process at `level`.
fn relog_json(output: &[u8], level: crate::log::Level) {
    use std::io::Write as _;
    for line in String::from_utf8_lossy(output).lines() {
        if line.trim().is_empty() {
            continue;
        }
        if serde_json::from_str::<Map<String, Value>>(line).is_ok() {
            let _ = writeln!(std::io::stderr(), "{line}");
        } else {
            crate::log::log(level, line.trim_start());
        }
    }
}

/// Makes the readiness file exist (naming the list) exactly when `active` is given.
pub(crate) fn set_ready(ready_file: &Path, active: Option<&Path>) {
    match active {
        Some(list) => {
            let text = format!("{}\n", list.display());
            if same_bytes(ready_file, text.as_bytes()) {
                return;
            }
            let dir = parent(ready_file);
            let r = fs::create_dir_all(dir)
                .map_err(|e| Error::io(dir.display().to_string(), e))
                .and_then(|_| write_atomic(ready_file, text.as_bytes(), 0o644, None, &|| true));
            if let Err(e) = r {
                crate::warn!("{}: {e}", ready_file.display());
            }
        }
        None => match fs::remove_file(ready_file) {
            Ok(()) => crate::info!("removed {}", ready_file.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => crate::warn!("{}: {e}", ready_file.display()),
        },
    }
}
