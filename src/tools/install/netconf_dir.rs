//! The netconf dir as runtimes read it: which file is the active network, and whether natguard
//! can edit it safely.
//!
//! The active network is the first `*.conf`/`*.conflist`/`*.json` entry by byte-wise name that is
//! not a directory, which is what libcni's `ConfFiles` returns first and so what kubelet,
//! containerd and CRI-O use. Loading a file for editing refuses what install must not touch: a
//! symbolic link (writing through it edits a file outside the dir, replacing it cuts it off from
//! whatever maintains it), a non-UTF-8 or unparsable file, a list runtimes would reject or in
//! which natguard cannot run. Each refusal names the file and says what to do.

use super::{InstallOpts, PLUGIN_TYPE};
use crate::cni::SUPPORTED_VERSIONS;
use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// File extensions libcni's `ConfFiles` (and so kubelet and containerd) consider.
const CONF_EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

fn refuse(msg: impl Into<String>) -> Error {
    Error::Command(msg.into())
}

pub(crate) fn is_conf_name(name: &OsStr) -> bool {
    // Go's filepath.Ext: from the last dot of the name.
    let b = name.as_bytes();
    match b.iter().rposition(|&c| c == b'.') {
        Some(i) => CONF_EXTENSIONS.iter().any(|e| &b[i + 1..] == e.as_bytes()),
        None => false,
    }
}

/// The config files of `dir` in the order libcni's `ConfFiles` returns them: every non-directory
/// entry with a `.conf`, `.conflist` or `.json` extension, sorted by name byte-wise.
pub(crate) fn conf_files(dir: &Path) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        if !is_conf_name(&name) {
            continue;
        }
        // ReadDir in Go lstat()s: a symlink counts as a file whatever it points to.
        if e.file_type()?.is_dir() {
            continue;
        }
        names.push(name);
    }
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
}

pub(crate) fn is_list_path(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "conflist")
}

/// A config file read for editing: its exact text, its parsed document, its metadata (mode and
/// owner are kept when it is rewritten).
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) path: PathBuf,
    pub(crate) text: String,
    pub(crate) doc: Map<String, Value>,
    pub(crate) meta: fs::Metadata,
}

/// Reads a config file that install is about to edit, refusing what it cannot edit safely.
pub(crate) fn load(path: &Path) -> Result<Loaded> {
    let shown = path.display();
    let meta = fs::symlink_metadata(path).map_err(|e| Error::io(shown.to_string(), e))?;
    if meta.file_type().is_symlink() {
        let target = fs::read_link(path)
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "?".into());
        return Err(refuse(format!(
            "{shown} is a symbolic link (to {target}); natguard edits regular files only: \
             writing through the link would change a file outside the netconf dir, and \
             replacing it would cut it off from whatever maintains it; pass the target with \
             --conflist or make the active config a regular file"
        )));
    }
    if !meta.is_file() {
        return Err(refuse(format!("{shown} is not a regular file")));
    }
    let bytes = fs::read(path).map_err(|e| Error::io(shown.to_string(), e))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        refuse(format!(
            "{shown} is not UTF-8 JSON; runtimes cannot use it either; fix or remove it"
        ))
    })?;
    let doc = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(o)) => o,
        Ok(_) => {
            return Err(refuse(format!(
                "{shown} is not a JSON object; runtimes cannot use it either; fix or remove it"
            )))
        }
        Err(e) => {
            return Err(refuse(format!(
                "{shown} is not valid JSON ({e}); it sorts first, so runtimes either fail on it \
                 (containerd) or skip it (kubelet) and natguard cannot tell which network is \
                 active: fix or remove it"
            )))
        }
    };
    Ok(Loaded {
        path: path.to_path_buf(),
        text,
        doc,
        meta,
    })
}

pub(crate) fn is_natguard(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// Checks that a network list is one natguard can run in; returns its plugins.
pub(crate) fn check_list(l: &Loaded) -> Result<&Vec<Value>> {
    let shown = l.path.display();
    match l.doc.get("name") {
        Some(Value::String(n)) if !n.is_empty() => {}
        _ => {
            return Err(refuse(format!(
                "{shown}: the list has no \"name\"; runtimes reject it"
            )))
        }
    }
    check_version(l)?;
    let plugins = match l.doc.get("plugins") {
        Some(Value::Array(p)) => p,
        _ => return Err(refuse(format!("{shown}: no \"plugins\" list"))),
    };
    for (i, p) in plugins.iter().enumerate() {
        if !p.get("type").is_some_and(Value::is_string) {
            return Err(refuse(format!("{shown}: plugins[{i}] has no \"type\"")));
        }
    }
    let ours = plugins.iter().filter(|p| is_natguard(p)).count();
    if ours > 1 {
        return Err(refuse(format!(
            "{shown}: natguard is listed {ours} times; remove all but one by hand"
        )));
    }
    if plugins.len() == ours {
        return Err(refuse(format!(
            "{shown}: no primary plugin in the list; natguard is a chained plugin and runs after one"
        )));
    }
    Ok(plugins)
}

fn check_version(l: &Loaded) -> Result<()> {
    let shown = l.path.display();
    match l.doc.get("cniVersion") {
        Some(Value::String(v)) if SUPPORTED_VERSIONS.contains(&v.as_str()) => Ok(()),
        Some(v) => Err(refuse(format!(
            "{shown}: cniVersion {v} is not one natguard supports ({}); every pod's ADD would fail",
            SUPPORTED_VERSIONS.join(", ")
        ))),
        None => Err(refuse(format!(
            "{shown}: no \"cniVersion\"; natguard needs one of {}",
            SUPPORTED_VERSIONS.join(", ")
        ))),
    }
}

/// Checks that a lone plugin config can become a list.
pub(crate) fn check_single(l: &Loaded) -> Result<()> {
    let shown = l.path.display();
    if l.doc.contains_key("plugins") {
        return Err(refuse(format!(
            "{shown}: a network list in a file runtimes read as a single plugin config; \
             rename it to .conflist first"
        )));
    }
    match l.doc.get("type").and_then(Value::as_str) {
        None | Some("") => return Err(refuse(format!("{shown}: no \"type\"; runtimes reject it"))),
        Some(PLUGIN_TYPE) => {
            return Err(refuse(format!(
                "{shown}: natguard alone is not a network; it runs after a primary plugin"
            )))
        }
        Some(_) => {}
    }
    match l.doc.get("name") {
        Some(Value::String(n)) if !n.is_empty() => {}
        _ => return Err(refuse(format!("{shown}: no \"name\"; runtimes reject it"))),
    }
    check_version(l)
}

/// The file install edits: `--conflist`, or the first config file by name.
pub(crate) fn active_file(opts: &InstallOpts) -> Result<PathBuf> {
    if let Some(c) = &opts.conflist {
        return Ok(c.clone());
    }
    let dir = &opts.netconf_dir;
    let files = conf_files(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
    match files.first() {
        Some(f) => Ok(dir.join(f)),
        None => Err(refuse(format!(
            "no network config (*.conflist, *.conf, *.json) in {}: install the primary CNI \
             plugin first; natguard is a chained plugin and runs after it",
            dir.display()
        ))),
    }
}

/// The active list (or `--conflist`) if natguard's entry is in it.
pub(crate) fn entry_present(opts: &InstallOpts) -> Result<PathBuf> {
    let path = active_file(opts)?;
    let l = load(&path)?;
    if !is_list_path(&path) {
        return Err(refuse(format!(
            "{} is a single plugin config",
            path.display()
        )));
    }
    if check_list(&l)?.iter().any(is_natguard) {
        Ok(path)
    } else {
        Err(refuse(format!("natguard is not in {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_names() {
        for n in ["10-a.conf", "a.conflist", "x.json", ".conf"] {
            assert!(is_conf_name(OsStr::new(n)), "{n}");
        }
        for n in [
            "a.conf.bak",
            ".a.conflist.natguard-1.tmp",
            "conf",
            "a.cilium_bak",
        ] {
            assert!(!is_conf_name(OsStr::new(n)), "{n}");
        }
    }
}
