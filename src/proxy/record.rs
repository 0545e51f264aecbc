//! The record the watcher's metadata proxy keeps beside the watcher's readiness file
//! (`proxy.json`): where it serves, whose API, and its counters, for `status` and `metrics`,
//! which read it from another process.

use serde_json::{json, Value};
use std::path::Path;

/// What the watcher's metadata proxy serves, and its counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProxyRecord {
    pub pid: u32,
    /// The addresses it listens on.
    pub serving: Vec<std::net::SocketAddr>,
    /// Whose API it speaks, and how that was chosen.
    pub cloud: String,
    pub served: u64,
    pub concealed: u64,
    pub refused: u64,
    pub upstream_error: u64,
    /// Whether the watcher that wrote the record still runs: filled in by its readers.
    pub running: Option<bool>,
}

impl ProxyRecord {
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "pid": self.pid,
            "serving": self.serving.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            "cloud": self.cloud,
            "requests": {
                "served": self.served,
                "concealed": self.concealed,
                "refused": self.refused,
                "upstreamError": self.upstream_error,
            },
        });
        if let Some(r) = self.running {
            v["running"] = r.into();
        }
        v
    }

    pub fn from_json(v: &Value) -> Option<ProxyRecord> {
        let r = v.get("requests")?;
        Some(ProxyRecord {
            pid: v.get("pid")?.as_u64()? as u32,
            serving: v
                .get("serving")?
                .as_array()?
                .iter()
                .filter_map(|a| a.as_str()?.parse().ok())
                .collect(),
            cloud: v.get("cloud")?.as_str()?.to_string(),
            served: r.get("served")?.as_u64()?,
            concealed: r.get("concealed")?.as_u64()?,
            refused: r.get("refused")?.as_u64()?,
            upstream_error: r.get("upstreamError")?.as_u64()?,
            running: None,
        })
    }

    /// Writes the record atomically (a report: a failure is not an error of the proxy).
    pub fn write(&self, path: &Path) {
        let how = crate::fsutil::How::mode(0o644);
        let _ = crate::fsutil::replace(
            path,
            &crate::fsutil::temp_beside(path),
            self.to_json().to_string().as_bytes(),
            how,
        );
    }
}

/// The proxy's record, if a watcher serves one.
pub fn read_proxy(path: &Path) -> Option<ProxyRecord> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() > 64 * 1024 {
        return None;
    }
    ProxyRecord::from_json(&serde_json::from_slice(&bytes).ok()?)
}
