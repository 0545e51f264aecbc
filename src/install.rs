//! `natguard install` and `natguard uninstall`: put natguard on a node and take it off again.
//!
//! Install copies the running binary into the CNI bin dir and appends natguard's entry to the
//! node's active network list, the first `*.conf`/`*.conflist`/`*.json` file by name in the
//! netconf dir, which is the one kubelet, containerd and libcni pick. Every write is atomic
//! (temporary file in the same directory, fsync, rename, fsync of the directory), and a run that
//! has nothing to change writes nothing. The list is edited as text: natguard's entry is spliced in
//! (or replaced, or cut out) and every other byte of the file is left as it was, so the list's
//! cniVersion, key order, numbers and formatting survive; the result is parsed back and compared
//! with the intended document before it is written. A lone plugin config (`.conf`/`.json`) is
//! turned into a list of the same basename. A directory that cannot be handled safely (no config,
//! an unparsable or symlinked active file, a list natguard cannot run in) is refused with a
//! message that names the file and the reason.
//!
//! `install --watch` keeps the entry in the active list while agents of the primary plugin rewrite
//! their lists: it waits on inotify, re-checks after a short quiet period, and re-inserts the
//! entry. Its own writes wake it once and find nothing to do, so it never loops. It keeps a
//! readiness file that exists exactly while natguard is in the active list.

use crate::cni::SUPPORTED_VERSIONS as SUPPORTED_CNI_VERSIONS;
use serde_json::{Map, Value};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// natguard's plugin type, as it appears in a conflist.
pub const PLUGIN_TYPE: &str = "natguard";
/// Where runtimes look for plugin binaries unless configured otherwise.
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";
/// Where runtimes look for network configs unless configured otherwise.
pub const DEFAULT_NETCONF_DIR: &str = "/etc/cni/net.d";
/// Exists while natguard's entry is in the active network list.
pub const DEFAULT_READY_FILE: &str = "/run/natguard/ready";
/// File extensions libcni's `ConfFiles` (and so kubelet and containerd) consider.
const CONF_EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

/// Quiet period after a directory event before the list is checked again.
const DEBOUNCE_QUIET: Duration = Duration::from_millis(100);
/// Upper bound of the debounce: the entry is back well within a second of a rewrite.
const DEBOUNCE_MAX: Duration = Duration::from_millis(400);
/// Full re-check interval of `--watch` without events (lost events, a deleted binary).
const RESYNC_EVERY: Duration = Duration::from_secs(60);

const INSTALL_USAGE: &str = "\
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
  --cache-dir DIR              CNI result cache passed to `natguard adopt`
  --no-adopt                   do not run `natguard adopt` after installing
  --ready-file PATH            exists while natguard is in the active list (default /run/natguard/ready)
  --watch                      keep the entry in the active list until SIGTERM
  --check                      exit 0 iff the binary is installed and the active list has natguard
Flags override the same fields of --config. With neither, the entry is {\"type\":\"natguard\"}.
";

const UNINSTALL_USAGE: &str = "\
usage: natguard uninstall [options]
  --cni-bin-dir DIR            where plugin binaries live (default /opt/cni/bin)
  --netconf-dir DIR            where network configs live (default /etc/cni/net.d)
  --ready-file PATH            removed (default /run/natguard/ready)
  --keep-kernel-state          leave natguard's nftables table in place
Removes natguard's entry from every list in the netconf dir, then its binary from the bin dir,
then its nftables table (inet natguard) with every pod's entries.
";

fn log(msg: impl AsRef<str>) {
    eprintln!("natguard install: {}", msg.as_ref());
}

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct InstallOpts {
    bin_dir: PathBuf,
    netconf_dir: PathBuf,
    conflist: Option<PathBuf>,
    entry: Value,
    cache_dir: Option<PathBuf>,
    adopt: bool,
    ready_file: PathBuf,
    watch: bool,
    check: bool,
}

/// Pulls `--flag value` / `--flag=value` pairs out of an argument list.
struct Args<'a> {
    args: &'a [String],
    pos: usize,
}

impl<'a> Args<'a> {
    fn new(args: &'a [String]) -> Self {
        Args { args, pos: 0 }
    }

    /// The next flag and, if written as `--flag=value`, its inline value.
    fn next_flag(&mut self) -> Option<(String, Option<String>)> {
        let arg = self.args.get(self.pos)?;
        self.pos += 1;
        match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                Some((flag.to_string(), Some(value.to_string())))
            }
            _ => Some((arg.clone(), None)),
        }
    }

    fn value(&mut self, flag: &str, inline: Option<String>) -> Result<String, String> {
        if let Some(v) = inline {
            return Ok(v);
        }
        let v = self
            .args
            .get(self.pos)
            .ok_or_else(|| format!("{flag} needs a value"))?;
        self.pos += 1;
        Ok(v.clone())
    }
}

fn no_value(flag: &str, inline: &Option<String>) -> Result<(), String> {
    match inline {
        Some(_) => Err(format!("{flag} takes no value")),
        None => Ok(()),
    }
}

/// Fields of natguard's entry given as flags.
#[derive(Debug, Default)]
struct EntryFlags {
    mode: Option<String>,
    proxy_port: Option<u16>,
    proxy_ipv4: Option<String>,
    proxy_ipv6: Option<String>,
    exempt_namespaces: Vec<String>,
    non_masquerade_cidrs: Vec<String>,
    no_masquerade: bool,
}

enum Parsed<T> {
    Run(T),
    Help,
}

fn parse_install_args(args: &[String]) -> Result<Parsed<InstallOpts>, String> {
    let mut bin_dir = PathBuf::from(DEFAULT_CNI_BIN_DIR);
    let mut netconf_dir = PathBuf::from(DEFAULT_NETCONF_DIR);
    let mut conflist = None;
    let mut config_file: Option<PathBuf> = None;
    let mut cache_dir = None;
    let mut adopt = true;
    let mut ready_file = PathBuf::from(DEFAULT_READY_FILE);
    let mut watch = false;
    let mut check = false;
    let mut flags = EntryFlags::default();

    let mut it = Args::new(args);
    while let Some((flag, inline)) = it.next_flag() {
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--cni-bin-dir" => bin_dir = it.value(&flag, inline)?.into(),
            "--netconf-dir" => netconf_dir = it.value(&flag, inline)?.into(),
            "--conflist" => conflist = Some(PathBuf::from(it.value(&flag, inline)?)),
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
            "--check" => {
                no_value(&flag, &inline)?;
                check = true
            }
            "--mode" => {
                let v = it.value(&flag, inline)?;
                if !matches!(v.as_str(), "proxy" | "deny" | "off") {
                    return Err(format!("--mode {v:?}: expected proxy, deny or off"));
                }
                flags.mode = Some(v)
            }
            "--proxy-port" => {
                let v = it.value(&flag, inline)?;
                match v.parse::<u16>() {
                    Ok(p) if p > 0 => flags.proxy_port = Some(p),
                    _ => return Err(format!("--proxy-port {v:?}: expected a port 1-65535")),
                }
            }
            "--proxy-ipv4" => {
                let v = it.value(&flag, inline)?;
                if v != "auto" && v.parse::<Ipv4Addr>().is_err() {
                    return Err(format!(
                        "--proxy-ipv4 {v:?}: expected an IPv4 address or auto"
                    ));
                }
                flags.proxy_ipv4 = Some(v)
            }
            "--proxy-ipv6" => {
                let v = it.value(&flag, inline)?;
                if v != "auto" && v.parse::<Ipv6Addr>().is_err() {
                    return Err(format!(
                        "--proxy-ipv6 {v:?}: expected an IPv6 address or auto"
                    ));
                }
                flags.proxy_ipv6 = Some(v)
            }
            "--exempt-namespace" => {
                let v = it.value(&flag, inline)?;
                if v.is_empty() {
                    return Err("--exempt-namespace: empty namespace".into());
                }
                flags.exempt_namespaces.push(v)
            }
            "--non-masquerade-cidr" => {
                let v = it.value(&flag, inline)?;
                check_cidr(&v).map_err(|e| format!("--non-masquerade-cidr {v:?}: {e}"))?;
                flags.non_masquerade_cidrs.push(v)
            }
            "--no-masquerade" => {
                no_value(&flag, &inline)?;
                flags.no_masquerade = true
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if watch && check {
        return Err("--check and --watch exclude each other".into());
    }
    // --check only looks; the entry is not needed, but a bad --config is still an error.
    let entry = build_entry(config_file.as_deref(), &flags)?;
    validate_entry(&entry)?;
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
        watch,
        check,
    }))
}

fn check_cidr(s: &str) -> Result<(), String> {
    let (addr, len) = s
        .split_once('/')
        .ok_or_else(|| "expected ADDRESS/PREFIX".to_string())?;
    let addr: IpAddr = addr.parse().map_err(|_| "bad address".to_string())?;
    let len: u8 = len.parse().map_err(|_| "bad prefix length".to_string())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(format!("prefix length {len} > {max}"));
    }
    Ok(())
}

/// natguard's entry: `{"type":"natguard"}`, then the keys of `--config` in their order, then the
/// flags, each overriding the field it names.
fn build_entry(config_file: Option<&Path>, flags: &EntryFlags) -> Result<Value, String> {
    let mut entry = Map::new();
    entry.insert("type".into(), Value::String(PLUGIN_TYPE.into()));
    if let Some(path) = config_file {
        let text =
            fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| format!("--config {}: not JSON: {e}", path.display()))?;
        let Value::Object(obj) = value else {
            return Err(format!(
                "--config {}: expected a JSON object (natguard's plugin entry)",
                path.display()
            ));
        };
        for (k, v) in obj {
            match k.as_str() {
                "type" if v != Value::String(PLUGIN_TYPE.into()) => {
                    return Err(format!(
                        "--config {}: \"type\" is {v}, expected \"natguard\"",
                        path.display()
                    ))
                }
                "type" => {}
                "plugins" | "name" | "cniVersion" => {
                    return Err(format!(
                        "--config {}: has {k:?}; give natguard's plugin entry only, the list's \
                         name and cniVersion are kept",
                        path.display()
                    ))
                }
                _ => {
                    entry.insert(k, v);
                }
            }
        }
    }
    let section = |entry: &mut Map<String, Value>, name: &str| -> Result<(), String> {
        match entry
            .entry(name.to_string())
            .or_insert_with(|| Value::Object(Map::new()))
        {
            Value::Object(_) => Ok(()),
            other => Err(format!("\"{name}\" is {other}, expected an object")),
        }
    };
    let mut meta = Vec::new();
    if let Some(m) = &flags.mode {
        meta.push(("mode", Value::String(m.clone())));
    }
    if let Some(p) = flags.proxy_port {
        meta.push(("proxyPort", Value::from(p)));
    }
    if let Some(a) = &flags.proxy_ipv4 {
        meta.push(("proxyIPv4", Value::String(a.clone())));
    }
    if let Some(a) = &flags.proxy_ipv6 {
        meta.push(("proxyIPv6", Value::String(a.clone())));
    }
    if !flags.exempt_namespaces.is_empty() {
        meta.push((
            "exemptNamespaces",
            Value::from(flags.exempt_namespaces.clone()),
        ));
    }
    let mut masq = Vec::new();
    if flags.no_masquerade {
        masq.push(("enabled", Value::Bool(false)));
    }
    if !flags.non_masquerade_cidrs.is_empty() {
        masq.push((
            "nonMasqueradeCIDRs",
            Value::from(flags.non_masquerade_cidrs.clone()),
        ));
    }
    for (name, fields) in [("metadata", meta), ("masquerade", masq)] {
        if fields.is_empty() {
            continue;
        }
        section(&mut entry, name)?;
        if let Some(Value::Object(obj)) = entry.get_mut(name) {
            for (k, v) in fields {
                obj.insert(k.to_string(), v);
            }
        }
    }
    Ok(Value::Object(entry))
}

/// Checks natguard's entry with the plugin's own parser before it is written into a list, so
/// that a bad value fails here rather than at every pod's ADD.
fn validate_entry(entry: &Value) -> Result<(), String> {
    crate::config::parse_plugin_config(entry)
        .map(drop)
        .map_err(|e| format!("natguard's entry: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Finding and loading the active network config
// ---------------------------------------------------------------------------------------------

fn is_conf_name(name: &OsStr) -> bool {
    // Go's filepath.Ext: from the last dot of the name.
    let b = name.as_bytes();
    match b.iter().rposition(|&c| c == b'.') {
        Some(i) => CONF_EXTENSIONS.iter().any(|e| &b[i + 1..] == e.as_bytes()),
        None => false,
    }
}

/// The config files of `dir` in the order libcni's `ConfFiles` returns them: every non-directory
/// entry with a `.conf`, `.conflist` or `.json` extension, sorted by name byte-wise.
fn conf_files(dir: &Path) -> io::Result<Vec<OsString>> {
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

fn is_list_path(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "conflist")
}

#[derive(Debug)]
struct Loaded {
    path: PathBuf,
    text: String,
    doc: Map<String, Value>,
    meta: fs::Metadata,
}

/// Reads a config file that install is about to edit, refusing what it cannot edit safely.
fn load(path: &Path) -> Result<Loaded, String> {
    let shown = path.display();
    let meta = fs::symlink_metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if meta.file_type().is_symlink() {
        let target = fs::read_link(path)
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "?".into());
        return Err(format!(
            "{shown} is a symbolic link (to {target}); natguard edits regular files only: \
             writing through the link would change a file outside the netconf dir, and \
             replacing it would cut it off from whatever maintains it; pass the target with \
             --conflist or make the active config a regular file"
        ));
    }
    if !meta.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| format!("{shown}: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        format!("{shown} is not UTF-8 JSON; runtimes cannot use it either; fix or remove it")
    })?;
    let doc = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(o)) => o,
        Ok(_) => {
            return Err(format!(
                "{shown} is not a JSON object; runtimes cannot use it either; fix or remove it"
            ))
        }
        Err(e) => {
            return Err(format!(
                "{shown} is not valid JSON ({e}); it sorts first, so runtimes either fail on it \
                 (containerd) or skip it (kubelet) and natguard cannot tell which network is \
                 active: fix or remove it"
            ))
        }
    };
    Ok(Loaded {
        path: path.to_path_buf(),
        text,
        doc,
        meta,
    })
}

fn is_natguard(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// Checks that a network list is one natguard can run in; returns its plugins.
fn check_list(l: &Loaded) -> Result<&Vec<Value>, String> {
    let shown = l.path.display();
    match l.doc.get("name") {
        Some(Value::String(n)) if !n.is_empty() => {}
        _ => {
            return Err(format!(
                "{shown}: the list has no \"name\"; runtimes reject it"
            ))
        }
    }
    check_version(l)?;
    let plugins = match l.doc.get("plugins") {
        Some(Value::Array(p)) => p,
        _ => return Err(format!("{shown}: no \"plugins\" list")),
    };
    for (i, p) in plugins.iter().enumerate() {
        if !p.get("type").is_some_and(Value::is_string) {
            return Err(format!("{shown}: plugins[{i}] has no \"type\""));
        }
    }
    let ours = plugins.iter().filter(|p| is_natguard(p)).count();
    if ours > 1 {
        return Err(format!(
            "{shown}: natguard is listed {ours} times; remove all but one by hand"
        ));
    }
    if plugins.len() == ours {
        return Err(format!(
            "{shown}: no primary plugin in the list; natguard is a chained plugin and runs after one"
        ));
    }
    Ok(plugins)
}

fn check_version(l: &Loaded) -> Result<(), String> {
    let shown = l.path.display();
    match l.doc.get("cniVersion") {
        Some(Value::String(v)) if SUPPORTED_CNI_VERSIONS.contains(&v.as_str()) => Ok(()),
        Some(v) => Err(format!(
            "{shown}: cniVersion {v} is not one natguard supports ({}); every pod's ADD would fail",
            SUPPORTED_CNI_VERSIONS.join(", ")
        )),
        None => Err(format!(
            "{shown}: no \"cniVersion\"; natguard needs one of {}",
            SUPPORTED_CNI_VERSIONS.join(", ")
        )),
    }
}

/// Checks that a lone plugin config can become a list.
fn check_single(l: &Loaded) -> Result<(), String> {
    let shown = l.path.display();
    if l.doc.contains_key("plugins") {
        return Err(format!(
            "{shown}: a network list in a file runtimes read as a single plugin config; \
             rename it to .conflist first"
        ));
    }
    match l.doc.get("type").and_then(Value::as_str) {
        None | Some("") => return Err(format!("{shown}: no \"type\"; runtimes reject it")),
        Some(PLUGIN_TYPE) => {
            return Err(format!(
                "{shown}: natguard alone is not a network; it runs after a primary plugin"
            ))
        }
        Some(_) => {}
    }
    match l.doc.get("name") {
        Some(Value::String(n)) if !n.is_empty() => {}
        _ => return Err(format!("{shown}: no \"name\"; runtimes reject it")),
    }
    check_version(l)
}

// ---------------------------------------------------------------------------------------------
// Editing a list as text
// ---------------------------------------------------------------------------------------------

/// Byte spans of a JSON text that is already known to be valid.
struct Spans<'a> {
    b: &'a [u8],
}

impl Spans<'_> {
    fn ws(&self, mut i: usize) -> usize {
        while i < self.b.len() && matches!(self.b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    /// End (exclusive) of the value starting at `i`.
    fn value_end(&self, i: usize) -> usize {
        let b = self.b;
        match b[i] {
            b'"' => self.string_end(i),
            b'{' | b'[' => {
                let mut depth = 0usize;
                let mut j = i;
                while j < b.len() {
                    match b[j] {
                        b'"' => {
                            j = self.string_end(j);
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return j + 1;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                j
            }
            _ => {
                let mut j = i;
                while j < b.len()
                    && !matches!(b[j], b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
                {
                    j += 1;
                }
                j
            }
        }
    }

    fn string_end(&self, i: usize) -> usize {
        let mut j = i + 1;
        while j < self.b.len() {
            match self.b[j] {
                b'\\' => j += 2,
                b'"' => return j + 1,
                _ => j += 1,
            }
        }
        j
    }

    /// (key start, value start, value end) of each member of the object starting at `i`.
    fn members(&self, i: usize) -> Vec<(usize, usize, usize, String)> {
        let mut out = Vec::new();
        let mut j = self.ws(i + 1);
        while j < self.b.len() && self.b[j] == b'"' {
            let key_end = self.string_end(j);
            let key: String = std::str::from_utf8(&self.b[j..key_end])
                .ok()
                .and_then(|k| serde_json::from_str(k).ok())
                .unwrap_or_default();
            let colon = self.ws(key_end);
            let vs = self.ws(colon + 1);
            let ve = self.value_end(vs);
            out.push((j, vs, ve, key));
            j = self.ws(ve);
            if j < self.b.len() && self.b[j] == b',' {
                j = self.ws(j + 1);
            }
        }
        out
    }

    /// (start, end) of each element of the array starting at `i`.
    fn elements(&self, i: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut j = self.ws(i + 1);
        while j < self.b.len() && self.b[j] != b']' {
            let e = self.value_end(j);
            out.push((j, e));
            j = self.ws(e);
            if j < self.b.len() && self.b[j] == b',' {
                j = self.ws(j + 1);
            }
        }
        out
    }
}

/// Where the `plugins` array of a list text is: (indent unit, array start, element spans).
struct PluginsText {
    unit: String,
    start: usize,
    end: usize,
    elements: Vec<(usize, usize)>,
}

fn plugins_text(text: &str) -> Option<PluginsText> {
    let s = Spans { b: text.as_bytes() };
    let top = s.ws(0);
    if s.b.get(top) != Some(&b'{') {
        return None;
    }
    // With duplicate keys the last one is the one that counts, as for every JSON decoder here.
    let (key_start, vs, ve, _) = s.members(top).into_iter().rfind(|m| m.3 == "plugins")?;
    if s.b[vs] != b'[' {
        return None;
    }
    let unit = indent_before(text, key_start)
        .filter(|u| !u.is_empty())
        .unwrap_or("  ")
        .to_string();
    Some(PluginsText {
        unit,
        start: vs,
        end: ve,
        elements: s.elements(vs),
    })
}

/// The whitespace between the start of the line and `pos`, if only whitespace precedes `pos` on
/// its line.
fn indent_before(text: &str, pos: usize) -> Option<&str> {
    let line_start = text[..pos].rfind('\n')? + 1;
    let ind = &text[line_start..pos];
    ind.chars().all(|c| c == ' ' || c == '\t').then_some(ind)
}

/// natguard's entry as text for a list laid out like `text`, at `indent`.
fn render_entry(entry: &Value, pretty: bool, indent: &str, unit: &str) -> String {
    if !pretty {
        return serde_json::to_string(entry).expect("a JSON value serializes");
    }
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(unit.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    serde::Serialize::serialize(entry, &mut ser).expect("a JSON value serializes");
    String::from_utf8(buf)
        .expect("serde_json writes UTF-8")
        .replace('\n', &format!("\n{indent}"))
}

/// `text` with natguard's entry appended to `plugins` (or `replace`d at that index).
fn splice_entry(text: &str, entry: &Value, replace: Option<usize>) -> Option<String> {
    let p = plugins_text(text)?;
    let (last_start, last_end) = *p.elements.last()?;
    let pretty = text[p.start + 1..p.elements[0].0].contains('\n');
    let mut out = String::with_capacity(text.len() + 256);
    match replace {
        Some(i) => {
            let (s, e) = *p.elements.get(i)?;
            let indent = indent_before(text, s).unwrap_or("");
            out.push_str(&text[..s]);
            out.push_str(&render_entry(entry, pretty, indent, &p.unit));
            out.push_str(&text[e..]);
        }
        None => {
            let indent = indent_before(text, last_start).unwrap_or("");
            let sep = if pretty {
                format!(",\n{indent}")
            } else if p.elements.len() > 1 {
                // Copy the separator the list already uses, e.g. ", ".
                let prev_end = p.elements[p.elements.len() - 2].1;
                text[prev_end..last_start].to_string()
            } else {
                ",".to_string()
            };
            out.push_str(&text[..last_end]);
            out.push_str(&sep);
            out.push_str(&render_entry(entry, pretty, indent, &p.unit));
            out.push_str(&text[last_end..]);
        }
    }
    Some(out)
}

/// `text` without the plugin at index `i`, with its separator.
fn cut_entry(text: &str, i: usize) -> Option<String> {
    let p = plugins_text(text)?;
    let n = p.elements.len();
    let (s, e) = match (i, n) {
        (_, 0) => return None,
        (0, 1) => (p.start + 1, p.end - 1),
        (0, _) => (p.elements[0].0, p.elements[1].0),
        _ if i < n => (p.elements[i - 1].1, p.elements[i].1),
        _ => return None,
    };
    Some(format!("{}{}", &text[..s], &text[e..]))
}

/// Serializes a whole document the way natguard writes new files.
fn pretty(doc: &Value) -> String {
    let mut s = serde_json::to_string_pretty(doc).expect("a JSON value serializes");
    s.push('\n');
    s
}

/// The edited text if it parses back to exactly `want`; otherwise `want` serialized afresh (the
/// meaning is what matters, and it is checked again here).
fn checked_text(edited: Option<String>, want: &Value) -> String {
    if let Some(t) = edited {
        if serde_json::from_str::<Value>(&t).ok().as_ref() == Some(want) {
            return t;
        }
    }
    pretty(want)
}

// ---------------------------------------------------------------------------------------------
// Atomic file writes
// ---------------------------------------------------------------------------------------------

fn tmp_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    // A dot in front and ".tmp" at the end: no runtime ever takes it for a config or a plugin.
    path.with_file_name(format!(".{name}.natguard-{}.tmp", std::process::id()))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename,
/// fsync of the directory. `mode` and owner come from `like` when given. `unchanged` is checked
/// just before the rename, so a concurrent rewrite by another agent is not overwritten with a
/// version based on what it replaced.
fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    like: Option<&fs::Metadata>,
    unchanged: &dyn Fn() -> bool,
) -> io::Result<()> {
    let tmp = tmp_path(path);
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        let mode = like.map(|m| m.mode() & 0o7777).unwrap_or(mode);
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        if let Some(m) = like {
            // Keep the owner; only root may give a file away, and then it is root doing it.
            let _ = std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()));
        }
        f.sync_all()?;
        drop(f);
        if !unchanged() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                format!("{} changed while natguard was editing it", path.display()),
            ));
        }
        fs::rename(&tmp, path)?;
        sync_dir(parent(path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn same_bytes(path: &Path, expected: &[u8]) -> bool {
    fs::read(path).map(|b| b == expected).unwrap_or(false)
}

// ---------------------------------------------------------------------------------------------
// Install
// ---------------------------------------------------------------------------------------------

/// What one pass over the netconf dir did.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// natguard's entry was already there with this config.
    UpToDate(PathBuf),
    /// The list was written (entry inserted or its config replaced).
    Wrote(PathBuf),
}

/// The file install edits: `--conflist`, or the first config file by name.
fn active_file(opts: &InstallOpts) -> Result<PathBuf, String> {
    if let Some(c) = &opts.conflist {
        return Ok(c.clone());
    }
    let dir = &opts.netconf_dir;
    let files = conf_files(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    match files.first() {
        Some(f) => Ok(dir.join(f)),
        None => Err(format!(
            "no network config (*.conflist, *.conf, *.json) in {}: install the primary CNI \
             plugin first; natguard is a chained plugin and runs after it",
            dir.display()
        )),
    }
}

/// Puts natguard's entry into the active list; writes nothing when it is already there.
fn install_conflist(opts: &InstallOpts, dry: bool) -> Result<Outcome, String> {
    // A rename by another agent between reading and writing aborts the write; try again.
    let mut attempts = 0;
    loop {
        attempts += 1;
        match install_conflist_once(opts, dry) {
            Err(Retry::Again(e)) if attempts < 5 => log(format!("{e}; trying again")),
            Err(Retry::Again(e)) | Err(Retry::Fail(e)) => return Err(e),
            Ok(o) => return Ok(o),
        }
    }
}

enum Retry {
    Again(String),
    Fail(String),
}

impl From<String> for Retry {
    fn from(s: String) -> Self {
        Retry::Fail(s)
    }
}

fn io_retry(path: &Path, e: io::Error) -> Retry {
    let msg = format!("writing {}: {e}", path.display());
    if e.kind() == io::ErrorKind::Interrupted {
        Retry::Again(msg)
    } else {
        Retry::Fail(msg)
    }
}

/// One attempt; with `dry`, every check is made and nothing is written.
fn install_conflist_once(opts: &InstallOpts, dry: bool) -> Result<Outcome, Retry> {
    let path = active_file(opts)?;
    let l = load(&path)?;
    if is_list_path(&path) {
        if let Some(single) = rewritten_single(&l) {
            return convert_single(opts, &single, dry).map(Outcome::Wrote);
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
        if dry {
            return Ok(Outcome::Wrote(path));
        }
        let old = l.text.as_bytes();
        write_atomic(&path, text.as_bytes(), 0o644, Some(&l.meta), &|| {
            same_bytes(&path, old)
        })
        .map_err(|e| io_retry(&path, e))?;
        log(format!(
            "{} natguard's entry in {}",
            if existing.is_some() {
                "updated"
            } else {
                "added"
            },
            path.display()
        ));
        Ok(Outcome::Wrote(path))
    } else {
        convert_single(opts, &l, dry).map(Outcome::Wrote)
    }
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

/// Turns a lone plugin config into a list of the same basename with natguard after it.
fn convert_single(opts: &InstallOpts, l: &Loaded, dry: bool) -> Result<PathBuf, Retry> {
    check_single(l)?;
    let path = &l.path;
    let new_path = path.with_extension("conflist");
    let shown = new_path.display();
    // The list replaces the conf only if nothing sorts between them; otherwise a third file
    // would become the active one.
    if opts.conflist.is_none() {
        let dir = parent(path);
        let files = conf_files(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let old_name = path.file_name().unwrap_or_default();
        let new_name = new_path.file_name().unwrap_or_default();
        let first_other = files
            .iter()
            .find(|f| f.as_os_str() != old_name && f.as_os_str() != new_name);
        if let Some(other) = first_other {
            if other.as_bytes() < new_name.as_bytes() {
                return Err(Retry::Fail(format!(
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
            return Err(Retry::Fail(format!(
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
            "cniVersion" | "name" => {
                list.insert(k.clone(), v.clone());
            }
            _ => {
                plugin.insert(k.clone(), v.clone());
            }
        }
    }
    list.insert(
        "plugins".into(),
        Value::Array(vec![Value::Object(plugin), opts.entry.clone()]),
    );
    if dry {
        return Ok(new_path);
    }
    let text = pretty(&Value::Object(list));
    let old = l.text.as_bytes();
    write_atomic(&new_path, text.as_bytes(), 0o644, Some(&l.meta), &|| {
        same_bytes(path, old)
    })
    .map_err(|e| io_retry(&new_path, e))?;
    fs::remove_file(path).map_err(|e| format!("removing {}: {e}", path.display()))?;
    sync_dir(parent(path)).map_err(|e| format!("{}: {e}", parent(path).display()))?;
    log(format!(
        "converted {} into {} with natguard's entry",
        path.display(),
        shown
    ));
    Ok(new_path)
}

/// Copies the running binary to `<bin dir>/natguard` unless the same bytes are there already.
fn install_binary(bin_dir: &Path) -> Result<bool, String> {
    let src = std::env::current_exe().map_err(|e| format!("finding the running binary: {e}"))?;
    let dst = bin_dir.join(PLUGIN_TYPE);
    let bytes = fs::read(&src).map_err(|e| format!("reading {}: {e}", src.display()))?;
    if same_bytes(&dst, &bytes) {
        return Ok(false);
    }
    fs::create_dir_all(bin_dir).map_err(|e| format!("{}: {e}", bin_dir.display()))?;
    write_atomic(&dst, &bytes, 0o755, None, &|| true)
        .map_err(|e| format!("writing {}: {e}", dst.display()))?;
    log(format!("installed {}", dst.display()));
    Ok(true)
}

fn run_adopt(opts: &InstallOpts) {
    let bin = opts.bin_dir.join(PLUGIN_TYPE);
    let mut cmd = Command::new(&bin);
    cmd.arg("adopt").arg("--netconf-dir").arg(&opts.netconf_dir);
    if let Some(c) = &opts.cache_dir {
        cmd.arg("--cache-dir").arg(c);
    }
    match cmd.status() {
        Ok(s) if s.success() => log("natguard adopt: done"),
        Ok(s) => log(format!(
            "warning: `{} adopt` failed ({s}); pods started before natguard was installed may \
             lack its policy until they are recreated",
            bin.display()
        )),
        Err(e) => log(format!("warning: running `{} adopt`: {e}", bin.display())),
    }
}

/// Whether natguard's entry is in the active list (or `--conflist`).
fn entry_present(opts: &InstallOpts) -> Result<PathBuf, String> {
    let path = active_file(opts)?;
    let l = load(&path)?;
    if !is_list_path(&path) {
        return Err(format!("{} is a single plugin config", path.display()));
    }
    if check_list(&l)?.iter().any(is_natguard) {
        Ok(path)
    } else {
        Err(format!("natguard is not in {}", path.display()))
    }
}

fn set_ready(ready_file: &Path, active: Option<&Path>) {
    match active {
        Some(list) => {
            let text = format!("{}\n", list.display());
            if same_bytes(ready_file, text.as_bytes()) {
                return;
            }
            let r = fs::create_dir_all(parent(ready_file))
                .and_then(|_| write_atomic(ready_file, text.as_bytes(), 0o644, None, &|| true));
            if let Err(e) = r {
                log(format!("warning: {}: {e}", ready_file.display()));
            }
        }
        None => match fs::remove_file(ready_file) {
            Ok(()) => log(format!("removed {}", ready_file.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => log(format!("warning: {}: {e}", ready_file.display())),
        },
    }
}

/// `natguard install ARGS...`; returns the exit code.
pub fn install_cli(args: &[String]) -> i32 {
    let opts = match parse_install_args(args) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            print!("{INSTALL_USAGE}");
            return 0;
        }
        Err(e) => {
            log(format!("error: {e}"));
            eprint!("{INSTALL_USAGE}");
            return 2;
        }
    };
    if opts.check {
        return check(&opts);
    }
    if !opts.watch {
        // Refuse before anything is copied; --watch waits for a usable config instead.
        if let Err(e) = install_conflist(&opts, true) {
            log(format!("refusing: {e}"));
            set_ready(&opts.ready_file, entry_present(&opts).ok().as_deref());
            return 1;
        }
    }
    // The binary goes first: the list must never name a plugin that is not there.
    if let Err(e) = install_binary(&opts.bin_dir) {
        log(format!("error: {e}"));
        return 1;
    }
    if opts.watch {
        return watch(&opts);
    }
    match install_conflist(&opts, false) {
        Ok(outcome) => {
            let path = match outcome {
                Outcome::UpToDate(p) => {
                    log(format!("natguard is already in {}", p.display()));
                    p
                }
                Outcome::Wrote(p) => p,
            };
            set_ready(&opts.ready_file, Some(&path));
            // Adopt on every run: it is idempotent, and an earlier run may have failed in it.
            if opts.adopt {
                run_adopt(&opts);
            }
            0
        }
        Err(e) => {
            log(format!("refusing: {e}"));
            set_ready(&opts.ready_file, entry_present(&opts).ok().as_deref());
            1
        }
    }
}

fn check(opts: &InstallOpts) -> i32 {
    let bin = opts.bin_dir.join(PLUGIN_TYPE);
    let bin_ok = fs::metadata(&bin).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0);
    if !bin_ok {
        println!("not ready: {} is missing", bin.display());
        return 1;
    }
    match entry_present(opts) {
        Ok(p) => {
            println!("ready: natguard is in {}", p.display());
            0
        }
        Err(e) => {
            println!("not ready: {e}");
            1
        }
    }
}

// ---------------------------------------------------------------------------------------------
// --watch
// ---------------------------------------------------------------------------------------------

static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; the buffer is a static byte.
        unsafe {
            libc::write(fd, b"x".as_ptr().cast(), 1);
        }
    }
}

/// A pipe that becomes readable when SIGTERM or SIGINT arrives.
fn signal_pipe() -> io::Result<libc::c_int> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a zeroed sigaction with a handler that only calls write(2).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(fds[0])
}

struct Inotify {
    fd: File,
    wd: Option<libc::c_int>,
}

const WATCH_MASK: u32 = libc::IN_CLOSE_WRITE
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE
    | libc::IN_CREATE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF;

impl Inotify {
    fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the returned descriptor is owned by the File below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { <File as std::os::unix::io::FromRawFd>::from_raw_fd(fd) };
        Ok(Inotify { fd, wd: None })
    }

    fn add(&mut self, dir: &Path) -> io::Result<()> {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: c is a valid NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                WATCH_MASK | libc::IN_ONLYDIR,
            )
        };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        self.wd = Some(wd);
        Ok(())
    }

    /// Reads all pending events; returns (relevant to the configs, the watch is gone).
    fn drain(&mut self) -> (bool, bool) {
        let mut relevant = false;
        let mut gone = false;
        let mut buf = [0u8; 8192];
        loop {
            let n = match self.fd.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break, // EAGAIN: nothing more
            };
            let mut off = 0;
            while off + 16 <= n {
                let u32_at = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().unwrap());
                let mask = u32_at(off + 4);
                let len = u32_at(off + 12) as usize;
                let name_bytes = &buf[off + 16..(off + 16 + len).min(n)];
                let name_end = name_bytes.iter().position(|&c| c == 0).unwrap_or(len);
                let name = OsStr::from_bytes(&name_bytes[..name_end.min(name_bytes.len())]);
                if mask & (libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0 {
                    gone = true;
                }
                if mask & libc::IN_Q_OVERFLOW != 0 || is_conf_name(name) {
                    relevant = true;
                }
                off += 16 + len;
            }
        }
        (relevant, gone)
    }
}

/// poll(2) on the descriptors for reading; returns which are readable.
fn poll_in(fds: &[libc::c_int], timeout: Option<Duration>) -> Vec<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
    // SAFETY: pfds is a valid array of pollfd of the given length.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if r <= 0 {
        return vec![false; fds.len()];
    }
    pfds.iter().map(|p| p.revents != 0).collect()
}

/// One pass of `--watch`: binary present, entry present, readiness file, adopt after a write.
fn reconcile(opts: &InstallOpts, quiet: bool) {
    if let Err(e) = install_binary(&opts.bin_dir) {
        log(format!("error: {e}"));
    }
    match install_conflist(opts, false) {
        Ok(Outcome::UpToDate(p)) => {
            if !quiet {
                log(format!("natguard is in {}; nothing to write", p.display()));
            }
            set_ready(&opts.ready_file, Some(&p));
        }
        Ok(Outcome::Wrote(p)) => {
            set_ready(&opts.ready_file, Some(&p));
            if opts.adopt {
                run_adopt(opts);
            }
        }
        Err(e) => {
            log(format!(
                "cannot insert natguard: {e}; waiting for the next change"
            ));
            set_ready(&opts.ready_file, entry_present(opts).ok().as_deref());
        }
    }
}

fn watch(opts: &InstallOpts) -> i32 {
    let dir = match &opts.conflist {
        Some(c) => parent(c).to_path_buf(),
        None => opts.netconf_dir.clone(),
    };
    let sig = match signal_pipe() {
        Ok(fd) => fd,
        Err(e) => {
            log(format!("error: signal handlers: {e}"));
            return 1;
        }
    };
    let mut ino = match Inotify::new() {
        Ok(i) => i,
        Err(e) => {
            log(format!("error: inotify: {e}"));
            return 1;
        }
    };
    let _ = fs::create_dir_all(&dir);
    if let Err(e) = ino.add(&dir) {
        log(format!("error: watching {}: {e}", dir.display()));
        return 1;
    }
    log(format!("watching {}", dir.display()));
    reconcile(opts, false);
    let fds = [ino.fd.as_raw_fd(), sig];
    loop {
        if ino.wd.is_none() {
            // The directory went away: wait for it to come back, checking once a second.
            if poll_in(&[sig], Some(Duration::from_secs(1)))[0] {
                break;
            }
            if ino.add(&dir).is_ok() {
                log(format!("watching {} again", dir.display()));
                reconcile(opts, false);
            }
            continue;
        }
        let ready = poll_in(&fds, Some(RESYNC_EVERY));
        if ready[1] {
            break;
        }
        if !ready[0] {
            reconcile(opts, true);
            continue;
        }
        let (mut relevant, mut gone) = ino.drain();
        // Debounce: wait until the directory has been quiet for a moment (bounded).
        let start = Instant::now();
        while relevant && start.elapsed() < DEBOUNCE_MAX {
            let r = poll_in(&fds, Some(DEBOUNCE_QUIET));
            if r[1] {
                return stop();
            }
            if !r[0] {
                break;
            }
            let (rel, g) = ino.drain();
            relevant |= rel;
            gone |= g;
        }
        if gone {
            ino.wd = None;
            set_ready(&opts.ready_file, None);
            continue;
        }
        if relevant {
            reconcile(opts, false);
        }
    }
    stop()
}

fn stop() -> i32 {
    log("stopping");
    0
}

// ---------------------------------------------------------------------------------------------
// Uninstall
// ---------------------------------------------------------------------------------------------

/// `natguard uninstall ARGS...`; returns the exit code.
pub fn uninstall_cli(args: &[String]) -> i32 {
    let mut bin_dir = PathBuf::from(DEFAULT_CNI_BIN_DIR);
    let mut netconf_dir = PathBuf::from(DEFAULT_NETCONF_DIR);
    let mut ready_file = PathBuf::from(DEFAULT_READY_FILE);
    let mut keep_kernel_state = false;
    let mut it = Args::new(args);
    let parsed: Result<(), String> = (|| {
        while let Some((flag, inline)) = it.next_flag() {
            match flag.as_str() {
                "-h" | "--help" => return Err(String::new()),
                "--cni-bin-dir" => bin_dir = it.value(&flag, inline)?.into(),
                "--netconf-dir" => netconf_dir = it.value(&flag, inline)?.into(),
                "--ready-file" => ready_file = it.value(&flag, inline)?.into(),
                "--keep-kernel-state" => {
                    no_value(&flag, &inline)?;
                    keep_kernel_state = true
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(())
    })();
    match parsed {
        Ok(()) => {}
        Err(e) if e.is_empty() => {
            print!("{UNINSTALL_USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("natguard uninstall: error: {e}");
            eprint!("{UNINSTALL_USAGE}");
            return 2;
        }
    }
    let say = |m: String| eprintln!("natguard uninstall: {m}");
    let mut failed = false;

    // First the entries, so no new pod calls natguard; then the readiness file and the binary;
    // last the kernel state, once nothing can add to it any more.
    match conf_files(&netconf_dir) {
        Ok(files) => {
            for f in files {
                let path = netconf_dir.join(&f);
                match remove_entries(&path) {
                    Ok(true) => say(format!("removed natguard's entry from {}", path.display())),
                    Ok(false) => {}
                    Err(e) => {
                        say(format!("error: {e}"));
                        failed = true;
                    }
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            say(format!("error: {}: {e}", netconf_dir.display()));
            failed = true;
        }
    }
    match fs::remove_file(&ready_file) {
        Ok(()) => say(format!("removed {}", ready_file.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => say(format!("warning: {}: {e}", ready_file.display())),
    }
    let bin = bin_dir.join(PLUGIN_TYPE);
    match fs::remove_file(&bin) {
        Ok(()) => {
            let _ = sync_dir(&bin_dir);
            say(format!("removed {}", bin.display()))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            say(format!("error: {}: {e}", bin.display()));
            failed = true;
        }
    }
    if !keep_kernel_state {
        match crate::store::delete_all() {
            Ok(()) => say("removed natguard's nftables table".into()),
            Err(e) if crate::kernel::is_unavailable(&e) => {}
            Err(e) => {
                say(format!("error: deleting natguard's nftables table: {e}"));
                failed = true;
            }
        }
    }
    i32::from(failed)
}

/// Removes every natguard entry from one config file; Ok(false) when it has none (or is not a
/// list natguard could be in).
fn remove_entries(path: &Path) -> Result<bool, String> {
    if !is_list_path(path) {
        return Ok(false);
    }
    let meta = fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        // A symlink or something else: install never edits those, so natguard is not there.
        return Ok(false);
    }
    let Ok(l) = load(path) else {
        return Ok(false);
    };
    let mut text = l.text.clone();
    let mut want = l.doc.clone();
    let Some(Value::Array(plugins)) = want.get_mut("plugins") else {
        return Ok(false);
    };
    if !plugins.iter().any(is_natguard) {
        return Ok(false);
    }
    plugins.retain(|p| !is_natguard(p));
    // Cut the entries out one at a time, re-reading the layout after each cut.
    let mut edited = Some(text.clone());
    while let Some(t) = edited.take() {
        text = t;
        let Ok(Value::Object(doc)) = serde_json::from_str::<Value>(&text) else {
            break;
        };
        let idx = match doc.get("plugins") {
            Some(Value::Array(p)) => p.iter().position(is_natguard),
            _ => None,
        };
        match idx {
            Some(i) => match cut_entry(&text, i) {
                Some(t) => edited = Some(t),
                None => break,
            },
            None => {
                edited = Some(text.clone());
                break;
            }
        }
    }
    let text = checked_text(edited, &Value::Object(want));
    let old = l.text.as_bytes();
    write_atomic(path, text.as_bytes(), 0o644, Some(&l.meta), &|| {
        same_bytes(path, old)
    })
    .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn splice_keeps_layout_and_appends() {
        let text = "{\n    \"cniVersion\": \"0.3.1\",\n    \"name\": \"k8s\",\n    \"plugins\": [\n        {\n            \"type\": \"calico\", \"mtu\": 1.50e3\n        },\n        {\"type\": \"portmap\"}\n    ]\n}\n";
        let entry = json!({"type": "natguard", "metadata": {"mode": "deny"}});
        let out = splice_entry(text, &entry, None).unwrap();
        assert!(out.starts_with(&text[..text.find("    ]").unwrap() - 1]));
        assert!(out.contains("1.50e3"));
        assert!(out.contains(
            ",\n        {\n            \"type\": \"natguard\",\n            \"metadata\": {\n                \"mode\": \"deny\"\n            }\n        }\n    ]\n}\n"
        ), "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["plugins"][2], entry);
    }

    #[test]
    fn splice_compact() {
        let text = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}, {"type":"portmap"}]}"#;
        let out = splice_entry(text, &json!({"type":"natguard"}), None).unwrap();
        assert_eq!(
            out,
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}, {"type":"portmap"}, {"type":"natguard"}]}"#
        );
        let back = cut_entry(&out, 2).unwrap();
        assert_eq!(back, text);
        let first = r#"{"name":"n","plugins":[{"type":"natguard"},{"type":"bridge"}]}"#;
        assert_eq!(
            cut_entry(first, 0).unwrap(),
            r#"{"name":"n","plugins":[{"type":"bridge"}]}"#
        );
    }

    #[test]
    fn strings_with_brackets_do_not_confuse_the_scanner() {
        let text =
            r#"{"name":"a]b","x":{"plugins":"no"},"plugins":[{"type":"bridge","s":"}]\"["}]}"#;
        let out = splice_entry(text, &json!({"type":"natguard"}), None).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["plugins"][1]["type"], "natguard");
        assert_eq!(v["plugins"][0]["s"], "}]\"[");
    }

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

    #[test]
    fn flags_build_the_entry() {
        let flags = EntryFlags {
            mode: Some("deny".into()),
            proxy_port: Some(9000),
            exempt_namespaces: vec!["kube-system".into(), "creds".into()],
            no_masquerade: true,
            ..Default::default()
        };
        let e = build_entry(None, &flags).unwrap();
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"natguard","metadata":{"mode":"deny","proxyPort":9000,"exemptNamespaces":["kube-system","creds"]},"masquerade":{"enabled":false}}"#
        );
        validate_entry(&e).unwrap();
        assert!(validate_entry(&json!({"type":"natguard","metadata":{"mode":"allow"}})).is_err());
        assert!(validate_entry(
            &json!({"type":"natguard","masquerade":{"nonMasqueradeCIDRs":["10.0.0.0/33"]}})
        )
        .is_err());
    }
}
