//! The fake cloud metadata upstreams (`tests/proxy/fake_<cloud>.py`, built on
//! `tests/proxy/fakemeta.py`): one started in the world's cloud namespace in place of its plain
//! server, and the record it keeps of every request (method, target, headers, client, status,
//! whether the answer was a credential), as `tests/proxy.rs` and `tests/proxy_sdks.rs` read it.

use super::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A fake upstream in the world's cloud namespace, on port 80 of the metadata addresses.
pub struct Fake {
    /// Where it records each request (one JSON object a line).
    pub log: PathBuf,
    pid: u32,
}

impl Fake {
    /// `tests/proxy/fake_<name>.py` on port 80 of the cloud namespace, with more arguments.
    pub fn start(w: &World, name: &str, more: &[&str]) -> Fake {
        require_tools(&["python3"]);
        w.h.stop(&w.cloud_http);
        let log = w.dir().join(format!("fake-{name}.jsonl"));
        fs::write(&log, "").unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/proxy")
            .join(format!("fake_{name}.py"));
        let port = HTTP_PORT.to_string();
        let mut args = vec![
            "python3",
            "-u",
            script.to_str().unwrap(),
            "--port",
            &port,
            "--log",
            log.to_str().unwrap(),
        ];
        args.extend_from_slice(more);
        let pid = w.h.spawn(&w.cloud, &format!("fake-{name}"), &args);
        wait_listening(&w.cloud, "tcp", HTTP_PORT, 1);
        Fake { log, pid }
    }

    /// Stops the fake and waits until its port is free.
    pub fn stop(&self, w: &World) {
        w.h.kill(self.pid);
        let end = Instant::now() + deadline(READY_TIMEOUT);
        let listening = || {
            !w.cloud
                .run(&["ss", "-Hltn", &format!("sport = :{HTTP_PORT}")])
                .trim()
                .is_empty()
        };
        while listening() {
            assert!(
                Instant::now() < end,
                "the fake on port {HTTP_PORT} did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every request the fake received, as it recorded them.
    pub fn records(&self) -> Vec<Value> {
        fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("fake log line {l}: {e}")))
            .collect()
    }

    /// How many credential answers it gave.
    pub fn credentials(&self) -> usize {
        self.records()
            .iter()
            .filter(|r| r["credential"] == true)
            .count()
    }

    /// Forgets what was recorded so far.
    pub fn clear(&self) {
        fs::write(&self.log, "").unwrap();
    }

    /// One line a request, for messages: `CLIENT METHOD TARGET -> STATUS`.
    pub fn dump(&self) -> String {
        self.records()
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} -> {}",
                    r["client"], r["method"], r["target"], r["status"]
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
