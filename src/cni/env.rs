//! The `CNI_*` environment of one invocation and `CNI_ARGS`, validated for the verb.

use super::Command;
use crate::error::{truncate, Error, Result};
use std::collections::HashMap;

/// The `CNI_*` environment of one invocation, validated for its verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: CniArgs,
}

/// `CNI_ARGS`, as the set of keys natguard uses. Unknown keys are ignored: kubelet and CRI
/// send `IgnoreUnknown=1;K8S_POD_NAMESPACE=…;…` in random order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
}

const MAX_ID_LEN: usize = 1024;

/// Container IDs: an alphanumeric then alphanumerics, `_`, `.`, `-` (spec 1.0).
pub fn is_container_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Interface names as the kernel accepts them.
pub fn is_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|c| c.is_ascii_graphic() && c != b'/' && c != b':')
}

impl CniArgs {
    /// Parses `K=V;K=V`. Pairs without `=` and repeated keys that natguard uses are errors,
    /// because a pod must not be able to look exempt through an ambiguous namespace.
    pub fn parse(s: &str) -> Result<CniArgs> {
        let mut seen: HashMap<&str, &str> = HashMap::new();
        for pair in s.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                Error::InvalidEnv(format!(
                    "CNI_ARGS: {:?} is not a KEY=VALUE pair",
                    truncate(pair, 64)
                ))
            })?;
            if matches!(k, "K8S_POD_NAMESPACE" | "K8S_POD_NAME") {
                if let Some(prev) = seen.insert(k, v) {
                    if prev != v {
                        return Err(Error::InvalidEnv(format!(
                            "CNI_ARGS: {k} is given twice ({:?} and {:?})",
                            truncate(prev, 64),
                            truncate(v, 64)
                        )));
                    }
                }
            }
        }
        let ns = seen.get("K8S_POD_NAMESPACE").map(|s| s.to_string());
        if let Some(n) = &ns {
            if !crate::config::is_dns_label(n) {
                return Err(Error::InvalidEnv(format!(
                    "CNI_ARGS: K8S_POD_NAMESPACE={:?} is not a Kubernetes namespace name",
                    truncate(n, 64)
                )));
            }
        }
        let name = seen.get("K8S_POD_NAME").map(|s| s.to_string());
        if let Some(n) = &name {
            if n.len() > 253 || !n.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::InvalidEnv(format!(
                    "CNI_ARGS: K8S_POD_NAME={:?} is not a Kubernetes object name",
                    truncate(n, 64)
                )));
            }
        }
        Ok(CniArgs {
            pod_namespace: ns,
            pod_name: name,
        })
    }
}

impl Env {
    /// Reads and validates the environment for `command`, from a lookup function so tests need
    /// not touch the process environment.
    pub fn from_lookup(command: Command, get: &dyn Fn(&str) -> Option<String>) -> Result<Env> {
        let need_ids = matches!(command, Command::Add | Command::Del | Command::Check);
        let var = |k: &str| get(k).unwrap_or_default();
        let container_id = var("CNI_CONTAINERID");
        let ifname = var("CNI_IFNAME");
        let netns = var("CNI_NETNS");
        if need_ids {
            if container_id.is_empty() {
                return Err(Error::InvalidEnv(format!(
                    "CNI_CONTAINERID: must be set for {}",
                    command.as_str()
                )));
            }
            if !is_container_id(&container_id) {
                return Err(Error::InvalidEnv(format!(
                    "CNI_CONTAINERID: {:?} is not a valid container ID",
                    truncate(&container_id, 80)
                )));
            }
            if ifname.is_empty() {
                return Err(Error::InvalidEnv(format!(
                    "CNI_IFNAME: must be set for {}",
                    command.as_str()
                )));
            }
            if !is_ifname(&ifname) {
                return Err(Error::InvalidEnv(format!(
                    "CNI_IFNAME: {:?} is not a valid interface name",
                    truncate(&ifname, 80)
                )));
            }
        }
        if matches!(command, Command::Add | Command::Check) {
            if netns.is_empty() {
                return Err(Error::InvalidEnv(format!(
                    "CNI_NETNS: must be set for {}",
                    command.as_str()
                )));
            }
            if get("CNI_PATH").unwrap_or_default().is_empty() {
                return Err(Error::InvalidEnv(format!(
                    "CNI_PATH: must be set for {}",
                    command.as_str()
                )));
            }
        }
        let raw_args = var("CNI_ARGS");
        let args = match CniArgs::parse(&raw_args) {
            Ok(a) => a,
            // DEL must not fail on what ADD would have refused: it only needs the IDs.
            Err(_) if command == Command::Del => CniArgs::default(),
            Err(e) => return Err(e),
        };
        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            args,
        })
    }
}
