//! [`Chain`]: drives a conflist the way libcni does (ADD in order with prevResult threading, DEL
//! in reverse with the cached result, CHECK, GC, STATUS, VERSION), running every plugin in the
//! node namespace with [`super::run`] (the same runner the synthetic tests use), and keeps
//! libcni's result cache in the test's directory. [`Attachment`] is libcni's RuntimeConf.

use super::run::Natguard;
use super::*;

/// One attachment of a network to a container (libcni's RuntimeConf).
#[derive(Clone, Debug)]
pub struct Attachment {
    pub container_id: String,
    /// `CNI_NETNS` (a path, or empty).
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS` pairs in the order they are sent.
    pub args: Vec<(String, String)>,
    /// Capability arguments; each plugin gets the ones it declares in `capabilities` as
    /// `runtimeConfig`.
    pub cap_args: Map<String, Value>,
}

impl Attachment {
    pub fn new(container_id: &str, pod: &Netns) -> Attachment {
        Attachment {
            container_id: container_id.to_string(),
            netns: pod.path(),
            ifname: "eth0".to_string(),
            args: Vec::new(),
            cap_args: Map::new(),
        }
    }

    /// The CNI_ARGS a kubelet/CRI runtime sends, deliberately not in alphabetical order and with
    /// `IgnoreUnknown=1` in the middle (CRI sends them in random order).
    pub fn k8s(mut self, namespace: &str, pod: &str) -> Attachment {
        let cid = self.container_id.clone();
        self.args = vec![
            ("K8S_POD_NAME".into(), pod.into()),
            ("K8S_POD_INFRA_CONTAINER_ID".into(), cid.clone()),
            ("IgnoreUnknown".into(), "1".into()),
            ("K8S_POD_NAMESPACE".into(), namespace.into()),
            ("K8S_POD_UID".into(), format!("uid-{cid}")),
        ];
        self
    }

    pub fn cni_args(&self) -> String {
        self.args
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";")
    }
}

/// A CNI error from one plugin of the chain.
#[derive(Clone, Debug)]
pub struct CniError {
    pub plugin: String,
    pub command: String,
    /// Exit code of the plugin (`None` if killed by a signal or if it never ran).
    pub exit: Option<i32>,
    /// `code` of the error JSON on stdout, if any.
    pub code: Option<u64>,
    pub msg: String,
    pub details: String,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} failed (exit {:?}, code {:?}): {} {}\nstdout: {}\nstderr: {}",
            self.plugin,
            self.command,
            self.exit,
            self.code,
            self.msg,
            self.details,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

/// Results of the chain driver (the error is boxed: it carries the plugin's whole output).
pub type CniResult<T> = Result<T, Box<CniError>>;

/// One plugin invocation, as recorded by the driver.
#[derive(Clone, Debug)]
pub struct Call {
    pub plugin: String,
    pub command: String,
    pub env: Vec<(String, String)>,
    pub stdin: Value,
    pub stdout: String,
    pub stderr: String,
    pub exit: Option<i32>,
}

/// prevResult handling for DEL.
#[derive(Clone, Debug, Default)]
pub enum PrevResult {
    /// libcni: the cached result for cniVersion >= 0.4.0, none for 0.3.x.
    #[default]
    Libcni,
    /// No prevResult at all (what 0.3.x lists and lost caches give).
    Omit,
    /// This value.
    Given(Value),
}

/// Options for [`Chain::del_with`].
#[derive(Clone, Debug, Default)]
pub struct DelOpts {
    pub prev_result: PrevResult,
    /// Overrides `CNI_NETNS` (e.g. `Some(String::new())`: CRI's second DEL, ctr's DEL).
    pub netns: Option<String>,
}

/// The type of a test plugin (`tests/common/pod_iface_only.py`) that passes the prevResult on
/// without its host-side interfaces, as routed primary plugins report it.
pub const POD_IFACE_ONLY: &str = "pod-iface-only";

/// Compares dotted CNI versions.
pub fn version_at_least(v: &str, min: &str) -> bool {
    let parse = |s: &str| -> Vec<u32> { s.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(v) >= parse(min)
}

/// Drives one conflist like libcni 1.2 does, with every plugin run inside the node namespace.
///
/// Differences from libcni, all deliberate:
/// - The result cache lives in `<cache_dir>/results/<net>-<cid>-<ifname>` in libcni's
///   `cniCacheV1` format, under the test's directory instead of /var/lib/cni.
/// - Debian 12's reference plugins (1.1.1) stop at spec 1.0.0. For a 1.1.0 list, a plugin that
///   does not support 1.1.0 but supports 1.0.0 gets cniVersion 1.0.0 (the 1.1.0 result format is
///   the 1.0.0 one) and its result is relabelled 1.1.0 before it is passed on; GC and STATUS,
///   which such a plugin does not know, are sent only to plugins that support the list's
///   version. natguard always gets the list's version.
/// - Prior results are threaded as raw JSON, so unknown fields reach the next plugin unchanged.
pub struct Chain {
    pub list: Value,
    node: Netns,
    cache_dir: PathBuf,
    versions: Mutex<HashMap<String, Vec<String>>>,
    calls: Mutex<Vec<Call>>,
}

impl Chain {
    pub fn new(node: &Netns, list: Value, cache_dir: &Path) -> Chain {
        assert!(
            list["plugins"].is_array(),
            "conflist without plugins: {list}"
        );
        Chain {
            list,
            node: node.clone(),
            cache_dir: cache_dir.to_path_buf(),
            versions: Mutex::new(HashMap::new()),
            calls: Mutex::new(Vec::new()),
        }
    }

    pub fn name(&self) -> &str {
        self.list["name"].as_str().expect("conflist name")
    }

    pub fn version(&self) -> &str {
        self.list["cniVersion"].as_str().unwrap_or("0.1.0")
    }

    pub fn plugins(&self) -> Vec<Value> {
        self.list["plugins"].as_array().cloned().unwrap_or_default()
    }

    /// Every call made so far.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    /// Calls made so far to plugins of type `plugin`.
    pub fn calls_to(&self, plugin: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.plugin == plugin)
            .collect()
    }

    /// Binary of a plugin type.
    pub fn plugin_bin(plugin: &str) -> PathBuf {
        if plugin == "natguard" {
            return natguard_bin();
        }
        if plugin == POD_IFACE_ONLY {
            return Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/pod_iface_only.py");
        }
        let p = Path::new(CNI_BIN_DIR).join(plugin);
        assert!(
            p.exists(),
            "CNI plugin {} is missing (apt-get install containernetworking-plugins)",
            p.display()
        );
        p
    }

    fn cni_path() -> String {
        let ng = natguard_bin();
        let ng_dir = ng.parent().expect("natguard dir");
        format!("{CNI_BIN_DIR}:{}", ng_dir.display())
    }

    /// The `CNI_*` environment libcni sets (all variables, empty when not applicable).
    pub fn env(
        command: &str,
        att: Option<&Attachment>,
        netns_override: Option<&str>,
    ) -> Vec<(String, String)> {
        vec![
            ("CNI_COMMAND".into(), command.into()),
            (
                "CNI_CONTAINERID".into(),
                att.map(|a| a.container_id.clone()).unwrap_or_default(),
            ),
            (
                "CNI_NETNS".into(),
                netns_override
                    .map(str::to_string)
                    .or_else(|| att.map(|a| a.netns.clone()))
                    .unwrap_or_default(),
            ),
            (
                "CNI_IFNAME".into(),
                att.map(|a| a.ifname.clone()).unwrap_or_default(),
            ),
            (
                "CNI_ARGS".into(),
                att.map(Attachment::cni_args).unwrap_or_default(),
            ),
            ("CNI_PATH".into(), Self::cni_path()),
        ]
    }

    /// Invocation of plugin `plugin` with `command`, stdin `conf` and libcni's `CNI_*` values,
    /// inside the node namespace. Returns the parsed stdout (if any) or the error.
    pub fn invoke(
        &self,
        plugin: &str,
        command: &str,
        conf: &Value,
        att: Option<&Attachment>,
        netns_override: Option<&str>,
    ) -> CniResult<Option<Value>> {
        self.exec(plugin, conf, Self::env(command, att, netns_override))
    }

    /// Runs a recorded call again, with the same stdin and environment (e.g. a second ADD of
    /// natguard with the prevResult it got the first time).
    pub fn replay(&self, call: &Call) -> CniResult<Option<Value>> {
        self.exec(&call.plugin, &call.stdin, call.env.clone())
    }

    /// The last recorded call of `command` to `plugin` for container `cid`.
    pub fn last_call(&self, plugin: &str, command: &str, cid: &str) -> Option<Call> {
        self.calls().into_iter().rev().find(|c| {
            c.plugin == plugin
                && c.command == command
                && c.env
                    .iter()
                    .any(|(k, v)| k == "CNI_CONTAINERID" && v == cid)
        })
    }

    /// Lowest level: run `plugin` with exactly this stdin and `CNI_*` environment (the rest of
    /// the environment is inherited) inside the node namespace ([`super::run`]).
    pub fn exec(
        &self,
        plugin: &str,
        conf: &Value,
        env: Vec<(String, String)>,
    ) -> CniResult<Option<Value>> {
        let bin = Self::plugin_bin(plugin);
        let command = env
            .iter()
            .find(|(k, _)| k == "CNI_COMMAND")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let stdin = serde_json::to_vec(conf).expect("serialize conf");
        let path = std::env::var("PATH").unwrap_or_default();
        let out = Natguard::new()
            .plugin(&bin)
            .env(&env)
            // The reference plugins run iptables; make sure sbin is on PATH.
            .env(&[("PATH", format!("{path}:/usr/sbin:/sbin:/usr/bin:/bin"))])
            .stdin(&stdin)
            .run_in(&self.node);
        let (stdout, stderr) = (out.stdout.clone(), out.stderr.clone());
        lock(&self.calls).push(Call {
            plugin: plugin.to_string(),
            command: command.clone(),
            env,
            stdin: conf.clone(),
            stdout: stdout.clone(),
            stderr: stderr.clone(),
            exit: out.exit,
        });
        let parsed: Option<Value> = if stdout.trim().is_empty() {
            None
        } else {
            serde_json::from_str(&stdout).ok()
        };
        let err = |msg: String, code: Option<u64>, details: String| -> Box<CniError> {
            Box::new(CniError {
                plugin: plugin.to_string(),
                command: command.clone(),
                exit: out.exit,
                code,
                msg,
                details,
                stdout: stdout.clone(),
                stderr: stderr.clone(),
            })
        };
        if out.exit != Some(0) {
            let (code, msg, details) = match &parsed {
                Some(v) => (
                    v["code"].as_u64(),
                    v["msg"].as_str().unwrap_or("").to_string(),
                    v["details"].as_str().unwrap_or("").to_string(),
                ),
                None => (None, "no error JSON on stdout".to_string(), String::new()),
            };
            return Err(err(msg, code, details));
        }
        if !stdout.trim().is_empty() && parsed.is_none() {
            return Err(err("stdout is not JSON".to_string(), None, String::new()));
        }
        Ok(parsed)
    }

    /// The versions a plugin supports (CNI VERSION, asked once per plugin type).
    pub fn supported_versions(&self, plugin: &str) -> Vec<String> {
        if let Some(v) = lock(&self.versions).get(plugin) {
            return v.clone();
        }
        let conf = json!({ "cniVersion": self.version() });
        let reply = self
            .invoke(plugin, "VERSION", &conf, None, None)
            .unwrap_or_else(|e| panic!("VERSION of {plugin}: {e}"))
            .unwrap_or_else(|| panic!("VERSION of {plugin} printed nothing"));
        let v: Vec<String> = reply["supportedVersions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        lock(&self.versions).insert(plugin.to_string(), v.clone());
        v
    }

    /// The cniVersion a plugin of the list is given (see the type's documentation).
    fn version_for(&self, plugin: &str) -> String {
        let list_v = self.version().to_string();
        if plugin == "natguard" || list_v != "1.1.0" {
            return list_v;
        }
        let sup = self.supported_versions(plugin);
        if !sup.contains(&list_v) && sup.iter().any(|v| v == "1.0.0") {
            "1.0.0".to_string()
        } else {
            list_v
        }
    }

    fn plugin_type(plugin: &Value) -> String {
        plugin["type"]
            .as_str()
            .unwrap_or_else(|| panic!("plugin without type: {plugin}"))
            .to_string()
    }

    /// libcni's buildOneConfig: inject name, cniVersion, prevResult and runtimeConfig.
    fn build(
        &self,
        plugin: &Value,
        prev: Option<&Value>,
        att: Option<&Attachment>,
        extra: &[(&str, Value)],
    ) -> Value {
        let ty = Self::plugin_type(plugin);
        let version = self.version_for(&ty);
        let mut conf = plugin.as_object().cloned().expect("plugin object");
        conf.insert("name".into(), json!(self.name()));
        conf.insert("cniVersion".into(), json!(version));
        if let Some(prev) = prev {
            let mut prev = prev.clone();
            if prev.get("cniVersion").is_some() {
                prev["cniVersion"] = json!(version);
            }
            conf.insert("prevResult".into(), prev);
        }
        if let (Some(att), Some(caps)) = (att, plugin["capabilities"].as_object()) {
            let mut rc = Map::new();
            for (k, on) in caps {
                if on.as_bool() == Some(true) {
                    if let Some(v) = att.cap_args.get(k) {
                        rc.insert(k.clone(), v.clone());
                    }
                }
            }
            if !rc.is_empty() {
                conf.insert("runtimeConfig".into(), Value::Object(rc));
            }
        }
        for (k, v) in extra {
            conf.insert((*k).to_string(), v.clone());
        }
        Value::Object(conf)
    }

    fn relabel(&self, mut result: Value) -> Value {
        if result.get("cniVersion").is_some() {
            result["cniVersion"] = json!(self.version());
        }
        result
    }

    /// ADD every plugin in order, threading each result into the next plugin's prevResult;
    /// caches and returns the final result. Stops at the first error (libcni does not DEL
    /// on failure; the runtime does).
    pub fn add(&self, att: &Attachment) -> CniResult<Value> {
        let mut prev: Option<Value> = None;
        for plugin in self.plugins() {
            let ty = Self::plugin_type(&plugin);
            let conf = self.build(&plugin, prev.as_ref(), Some(att), &[]);
            let result = self.invoke(&ty, "ADD", &conf, Some(att), None)?;
            let result = result.ok_or_else(|| {
                Box::new(CniError {
                    plugin: ty.clone(),
                    command: "ADD".into(),
                    exit: Some(0),
                    code: None,
                    msg: "ADD printed no result".into(),
                    details: String::new(),
                    stdout: String::new(),
                    stderr: String::new(),
                })
            })?;
            prev = Some(self.relabel(result));
        }
        let result = prev.unwrap_or_else(|| json!({ "cniVersion": self.version() }));
        self.write_cache(att, &result);
        Ok(result)
    }

    /// DEL with libcni's defaults.
    pub fn del(&self, att: &Attachment) -> CniResult<()> {
        self.del_with(att, &DelOpts::default())
    }

    /// DEL every plugin in reverse order; removes the cached result when every plugin succeeded.
    pub fn del_with(&self, att: &Attachment, opts: &DelOpts) -> CniResult<()> {
        let prev = match &opts.prev_result {
            PrevResult::Libcni if version_at_least(self.version(), "0.4.0") => {
                self.cached_result(att)
            }
            PrevResult::Libcni | PrevResult::Omit => None,
            PrevResult::Given(v) => Some(v.clone()),
        };
        for plugin in self.plugins().iter().rev() {
            let ty = Self::plugin_type(plugin);
            let conf = self.build(plugin, prev.as_ref(), Some(att), &[]);
            self.invoke(&ty, "DEL", &conf, Some(att), opts.netns.as_deref())?;
        }
        let _ = fs::remove_file(self.cache_path(att));
        Ok(())
    }

    /// [`Chain::del`], with `between(plugin type)` called after each plugin's DEL: before the
    /// next plugin's DEL and before the cache entry is removed, the gap in which a restore from
    /// the cache sees an attachment that an earlier DEL removed.
    pub fn del_pausing(&self, att: &Attachment, between: &mut dyn FnMut(&str)) -> CniResult<()> {
        let prev = if version_at_least(self.version(), "0.4.0") {
            self.cached_result(att)
        } else {
            None
        };
        for plugin in self.plugins().iter().rev() {
            let ty = Self::plugin_type(plugin);
            let conf = self.build(plugin, prev.as_ref(), Some(att), &[]);
            self.invoke(&ty, "DEL", &conf, Some(att), None)?;
            between(&ty);
        }
        let _ = fs::remove_file(self.cache_path(att));
        Ok(())
    }

    /// CHECK every plugin in order with the cached result (libcni: cniVersion >= 0.4.0 and a
    /// cached result are required; `disableCheck` skips it).
    pub fn check(&self, att: &Attachment) -> CniResult<()> {
        let fail = |msg: String| {
            Box::new(CniError {
                plugin: "libcni".into(),
                command: "CHECK".into(),
                exit: None,
                code: None,
                msg,
                details: String::new(),
                stdout: String::new(),
                stderr: String::new(),
            })
        };
        if !version_at_least(self.version(), "0.4.0") {
            return Err(fail(format!(
                "configuration version {:?} does not support the CHECK command",
                self.version()
            )));
        }
        if self.list["disableCheck"].as_bool() == Some(true) {
            return Ok(());
        }
        let prev = self
            .cached_result(att)
            .ok_or_else(|| fail("no cached result for this attachment".into()))?;
        for plugin in self.plugins() {
            let ty = Self::plugin_type(&plugin);
            let conf = self.build(&plugin, Some(&prev), Some(att), &[]);
            self.invoke(&ty, "CHECK", &conf, Some(att), None)?;
        }
        Ok(())
    }

    fn gc_stale_dels(&self, valid: &[&Attachment]) -> Vec<CniError> {
        let mut errors = Vec::new();
        for cached in self.cached_attachments() {
            let keep = valid
                .iter()
                .any(|v| v.container_id == cached.container_id && v.ifname == cached.ifname);
            if !keep {
                if let Err(e) = self.del(&cached) {
                    errors.push(*e);
                }
            }
        }
        errors
    }

    /// libcni's GCNetworkList: DEL every cached attachment of this network that is not in
    /// `valid`, then (cniVersion >= 1.1.0) GC every plugin with `cni.dev/valid-attachments`.
    pub fn gc(&self, valid: &[&Attachment]) -> Result<(), Vec<CniError>> {
        let mut errors = self.gc_stale_dels(valid);
        if let Err(mut e) = self.gc_plugins(valid) {
            errors.append(&mut e);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// Only the plugin GC step of [`Chain::gc`] (no DEL of stale cached attachments), so that a
    /// test sees what the plugins' own GC does.
    pub fn gc_plugins(&self, valid: &[&Attachment]) -> Result<(), Vec<CniError>> {
        if !version_at_least(self.version(), "1.1.0") {
            return Ok(());
        }
        let attachments: Vec<Value> = valid
            .iter()
            .map(|a| json!({ "containerID": a.container_id, "ifname": a.ifname }))
            .collect();
        let mut errors = Vec::new();
        for plugin in self.plugins() {
            let ty = Self::plugin_type(&plugin);
            if !self.speaks_list_version(&ty) {
                continue;
            }
            let conf = self.build(
                &plugin,
                None,
                None,
                &[(
                    "cni.dev/valid-attachments",
                    Value::Array(attachments.clone()),
                )],
            );
            if let Err(e) = self.invoke(&ty, "GC", &conf, None, None) {
                errors.push(*e);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// libcni's GetStatusNetworkList (cniVersion >= 1.1.0; stops at the first error).
    pub fn status(&self) -> CniResult<()> {
        if !version_at_least(self.version(), "1.1.0") {
            return Ok(());
        }
        for plugin in self.plugins() {
            let ty = Self::plugin_type(&plugin);
            if !self.speaks_list_version(&ty) {
                continue;
            }
            let conf = self.build(&plugin, None, None, &[]);
            self.invoke(&ty, "STATUS", &conf, None, None)?;
        }
        Ok(())
    }

    fn speaks_list_version(&self, plugin: &str) -> bool {
        plugin == "natguard"
            || self
                .supported_versions(plugin)
                .iter()
                .any(|v| v == self.version())
    }

    /// VERSION of a plugin with an arbitrary stdin (podman sends `{"cniVersion":"1.0.0"}` with
    /// dummy `CNI_*` values).
    pub fn version_call(&self, plugin: &str, stdin: &Value) -> CniResult<Option<Value>> {
        self.invoke(plugin, "VERSION", stdin, None, None)
    }

    // --- the result cache (libcni cniCacheV1) ---

    pub fn cache_path(&self, att: &Attachment) -> PathBuf {
        self.cache_dir.join("results").join(format!(
            "{}-{}-{}",
            self.name(),
            att.container_id,
            att.ifname
        ))
    }

    fn write_cache(&self, att: &Attachment, result: &Value) {
        let path = self.cache_path(att);
        fs::create_dir_all(path.parent().expect("cache dir")).expect("create cache dir");
        let list_bytes = serde_json::to_vec(&self.list).expect("serialize list");
        let mut entry = json!({
            "kind": "cniCacheV1",
            "containerId": att.container_id,
            "config": base64(&list_bytes),
            "ifName": att.ifname,
            "networkName": self.name(),
            "result": result,
        });
        if !att.netns.is_empty() {
            entry["netns"] = json!(att.netns);
        }
        if !att.args.is_empty() {
            entry["cniArgs"] = json!(att
                .args
                .iter()
                .map(|(k, v)| [k.clone(), v.clone()])
                .collect::<Vec<_>>());
        }
        if !att.cap_args.is_empty() {
            entry["capabilityArgs"] = Value::Object(att.cap_args.clone());
        }
        fs::write(&path, serde_json::to_vec(&entry).expect("serialize cache"))
            .expect("write cache");
    }

    /// The cached result of an attachment, if any.
    pub fn cached_result(&self, att: &Attachment) -> Option<Value> {
        let text = fs::read(self.cache_path(att)).ok()?;
        let entry: Value = serde_json::from_slice(&text).ok()?;
        entry.get("result").cloned()
    }

    /// Removes the cached result of an attachment (simulates a lost cache).
    pub fn forget(&self, att: &Attachment) {
        let _ = fs::remove_file(self.cache_path(att));
    }

    /// The attachments of this network found in the cache.
    pub fn cached_attachments(&self) -> Vec<Attachment> {
        let dir = self.cache_dir.join("results");
        let mut out = Vec::new();
        let Ok(entries) = fs::read_dir(&dir) else {
            return out;
        };
        for e in entries.flatten() {
            let Ok(bytes) = fs::read(e.path()) else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            if v["networkName"].as_str() != Some(self.name()) {
                continue;
            }
            let args = v["cniArgs"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| {
                            Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Attachment {
                container_id: v["containerId"].as_str().unwrap_or("").to_string(),
                netns: v["netns"].as_str().unwrap_or("").to_string(),
                ifname: v["ifName"].as_str().unwrap_or("").to_string(),
                args,
                cap_args: v["capabilityArgs"].as_object().cloned().unwrap_or_default(),
            });
        }
        out
    }
}

/// Standard base64 (what Go's encoding/json does with []byte).
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The addresses of interface `ifname` in a CNI result (any version >= 0.3.0).
pub fn result_ips(result: &Value, ifname: &str) -> Vec<IpAddr> {
    let ifaces = result["interfaces"].as_array().cloned().unwrap_or_default();
    let mut ips = Vec::new();
    for ip in result["ips"].as_array().cloned().unwrap_or_default() {
        if let Some(idx) = ip["interface"].as_u64() {
            let name = ifaces
                .get(idx as usize)
                .and_then(|i| i["name"].as_str())
                .unwrap_or("");
            if name != ifname {
                continue;
            }
        }
        if let Some(addr) = ip["address"].as_str() {
            let a = addr.split('/').next().unwrap_or(addr);
            ips.push(
                a.parse()
                    .unwrap_or_else(|e| panic!("bad address {addr}: {e}")),
            );
        }
    }
    ips
}
