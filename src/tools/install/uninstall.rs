//! `natguard uninstall`, and cutting natguard's entry out of a list (also used by
//! `install --watch --cleanup-on-exit`).
//!
//! Uninstall undoes install in the order that keeps a node consistent: first natguard's entries
//! in every list of the netconf dir, so no new pod calls natguard; then the readiness file, the
//! watcher's record and recorded directories beside it, and the binary; last natguard's nftables table, once nothing can add to it. Each step goes on
//! when an earlier one failed, and the exit code says whether any did. An entry is cut out of
//! the list's text with its separator, so a list natguard spliced into is byte for byte what it
//! was before; files that are not lists, are symlinks or do not parse are left alone, since
//! install never writes to those.
//!
//! `--check` is the uninstall DaemonSet's readiness probe: a node is clean when no list of its
//! netconf dir names natguard and its bin dir has no natguard binary. With `--stay` the pod
//! then keeps running (the image has nothing but natguard to sleep with), so `kubectl rollout
//! status` tells the operator when every node is clean; a failed step exits 1 instead and the
//! kubelet runs uninstall again.

use super::atomic::{same_bytes, sync_dir, write_atomic};
use super::netconf_dir::{conf_files, is_list_path, is_natguard, load};
use super::record::options_file_beside;
use super::self_repair::state_file_beside;
use super::splice::{checked_text, cut_entry};
use super::{UninstallOpts, PLUGIN_TYPE};
use crate::error::{Error, Result};
use serde_json::Value;
use std::fs;
use std::io;
use std::path::Path;

/// Runs uninstall; Err when some step failed (each failure is logged as it happens).
pub(crate) fn run(opts: &UninstallOpts) -> Result<()> {
    let mut failed = 0;
    let mut fail = |e: Error| {
        crate::warn!("error: {e}");
        failed += 1;
    };
    let dir = &opts.netconf_dir;
    match conf_files(dir) {
        Ok(files) => {
            for f in files {
                let path = dir.join(&f);
                match remove_entries(&path) {
                    Ok(true) => crate::info!("removed natguard's entry from {}", path.display()),
                    Ok(false) => {}
                    Err(e) => fail(e),
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => fail(Error::io(dir.display().to_string(), e)),
    }
    // The readiness file and what a watcher keeps beside it: its self-repair and proxy records
    // (or `status` would go on reporting a watcher that has exited) and its directories. The
    // watcher lock stays: removing it under a running watcher would let a second one in.
    for file in [
        opts.ready_file.clone(),
        state_file_beside(&opts.ready_file),
        crate::tools::watcher::proxy_file_beside(&opts.ready_file),
        options_file_beside(&opts.ready_file),
    ] {
        match fs::remove_file(&file) {
            Ok(()) => crate::info!("removed {}", file.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => crate::warn!("{}: {e}", file.display()),
        }
    }
    let bin = opts.bin_dir.join(PLUGIN_TYPE);
    match fs::remove_file(&bin) {
        Ok(()) => {
            let _ = sync_dir(&opts.bin_dir);
            crate::info!("removed {}", bin.display())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => fail(Error::io(bin.display().to_string(), e)),
    }
    if !opts.keep_kernel_state {
        match crate::store::delete_all() {
            Ok(()) => crate::info!("removed natguard's nftables table"),
            Err(e) if crate::kernel::is_unavailable(&e) => {}
            Err(e) => fail(e.context("deleting natguard's nftables table")),
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(Error::Command(format!("{n} step(s) of uninstall failed"))),
    }
}

/// What of natguard is left on the node, in words; `None` when nothing is.
pub(crate) fn left_over(opts: &UninstallOpts) -> Option<String> {
    let dir = &opts.netconf_dir;
    let mut left = Vec::new();
    if let Ok(files) = conf_files(dir) {
        for f in files {
            let path = dir.join(&f);
            let listed = load(&path).ok().is_some_and(|l| {
                matches!(l.doc.get("plugins"), Some(Value::Array(p)) if p.iter().any(is_natguard))
            });
            if listed {
                left.push(format!("natguard is in {}", path.display()));
            }
        }
    }
    let bin = opts.bin_dir.join(PLUGIN_TYPE);
    if fs::symlink_metadata(&bin).is_ok() {
        left.push(format!("{} exists", bin.display()));
    }
    (!left.is_empty()).then(|| left.join("; "))
}

/// Removes every natguard entry from one config file; Ok(false) when it has none (or is not a
/// list natguard could be in).
pub(crate) fn remove_entries(path: &Path) -> Result<bool> {
    if !is_list_path(path) {
        return Ok(false);
    }
    let meta = fs::symlink_metadata(path).map_err(|e| Error::io(path.display().to_string(), e))?;
    if !meta.is_file() {
        // A symlink or something else: install never edits those, so natguard is not there.
        return Ok(false);
    }
    let Ok(l) = load(path) else {
        return Ok(false);
    };
    let mut want = l.doc.clone();
    let Some(Value::Array(plugins)) = want.get_mut("plugins") else {
        return Ok(false);
    };
    if !plugins.iter().any(is_natguard) {
        return Ok(false);
    }
    plugins.retain(|p| !is_natguard(p));
    if restore_converted(path, &l, &want)? {
        return Ok(true);
    }
    want.remove(super::flow::CONVERTED_FROM);
    let text = checked_text(cut_all(&l.text), &Value::Object(want));
    let old = l.text.as_bytes();
    write_atomic(path, text.as_bytes(), 0o644, Some(&l.meta), &|| {
        same_bytes(path, old)
    })?;
    Ok(true)
}

/// A list natguard converted from a lone config (it keeps the config's name and bytes) that is,
/// without natguard's entry, still that config: the config is written back byte for byte under
/// its own name and the list removed. Ok(false) when the list is not such a conversion (or the
/// agent changed it since), and it then stays a list.
fn restore_converted(
    path: &Path,
    l: &super::netconf_dir::Loaded,
    without: &serde_json::Map<String, Value>,
) -> Result<bool> {
    let Some(from) = without.get(super::flow::CONVERTED_FROM) else {
        return Ok(false);
    };
    let (Some(file), Some(text)) = (
        from.get("file").and_then(Value::as_str),
        from.get("text").and_then(Value::as_str),
    ) else {
        return Ok(false);
    };
    // A plain file name of a config, beside the list.
    if file.contains('/') || !(file.ends_with(".conf") || file.ends_with(".json")) {
        return Ok(false);
    }
    let Ok(Value::Object(single)) = serde_json::from_str::<Value>(text) else {
        return Ok(false);
    };
    let mut list = serde_json::Map::new();
    let mut plugin = serde_json::Map::new();
    for (k, v) in &single {
        match k.as_str() {
            "cniVersion" | "name" => list.insert(k.clone(), v.clone()),
            _ => plugin.insert(k.clone(), v.clone()),
        };
    }
    list.insert("plugins".into(), Value::Array(vec![Value::Object(plugin)]));
    let mut now = without.clone();
    now.remove(super::flow::CONVERTED_FROM);
    if now != list {
        return Ok(false);
    }
    let dir = super::atomic::parent(path);
    let target = dir.join(file);
    if fs::symlink_metadata(&target).is_ok() {
        return Ok(false);
    }
    let old = l.text.as_bytes();
    write_atomic(&target, text.as_bytes(), 0o644, Some(&l.meta), &|| {
        same_bytes(path, old)
    })?;
    fs::remove_file(path).map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
    super::atomic::sync_dir(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
    crate::info!(
        "restored {} from {} as it was before natguard converted it",
        target.display(),
        path.display()
    );
    Ok(true)
}

/// `text` with every natguard entry cut out, one at a time, re-reading the layout after each
/// cut; None if the text stops parsing as a list on the way (the caller then serializes afresh).
fn cut_all(text: &str) -> Option<String> {
    let mut text = text.to_string();
    loop {
        let Ok(Value::Object(doc)) = serde_json::from_str::<Value>(&text) else {
            return None;
        };
        let idx = match doc.get("plugins") {
            Some(Value::Array(p)) => p.iter().position(is_natguard),
            _ => None,
        };
        match idx {
            Some(i) => text = cut_entry(&text, i)?,
            None => return Some(text),
        }
    }
}
