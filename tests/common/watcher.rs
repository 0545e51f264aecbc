//! A running `natguard install --watch` in a world's node namespace, stopped on drop: the real
//! binary in a private mount namespace with a directory of the test over `/run/natguard` (its
//! lock and its records), with the test's netconf dir (`net.d`), bin dir (`bin`) and CNI cache.

use super::run::{Access, Natguard};
use super::World;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Which `/run/natguard` a watcher has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunDir {
    /// A directory of its own (`run-natguard` in the test's directory).
    Own,
    /// The node's, which the CNI invocations of the node share (natguard's records of
    /// deleted attachments, its lock), as a DaemonSet's hostPath mount gives it.
    Node,
}

pub struct Watcher {
    pub child: Child,
    /// Its `/run/natguard`.
    pub run_dir: PathBuf,
    /// Its netconf dir.
    pub netd: PathBuf,
    pub log: PathBuf,
}

impl Watcher {
    /// Starts the watcher with natguard's `entry` as `--config`, the CNI cache `cache_dir`,
    /// more environment `env`, its log in `log_name`; does not wait for it. The netconf dir is
    /// whatever the test put in `net.d` of its directory (made here when missing).
    pub fn spawn(
        w: &World,
        entry: &Value,
        cache_dir: &Path,
        env: &[(&str, &str)],
        log_name: &str,
    ) -> Watcher {
        Watcher::launch(w, entry, cache_dir, env, log_name, &[], RunDir::Own, false)
    }

    /// [`Watcher::spawn`], with `CAP_NET_ADMIN` as its only capability where `net_admin_only`
    /// (the shipped DaemonSet's container).
    pub fn spawn_as(
        w: &World,
        entry: &Value,
        cache_dir: &Path,
        env: &[(&str, &str)],
        log_name: &str,
        net_admin_only: bool,
    ) -> Watcher {
        Watcher::launch(
            w,
            entry,
            cache_dir,
            env,
            log_name,
            &[],
            RunDir::Own,
            net_admin_only,
        )
    }

    /// [`Watcher::spawn`] with more arguments `extra` (`--no-repair`, say), and the
    /// `/run/natguard` of `run`.
    pub fn spawn_with(
        w: &World,
        entry: &Value,
        cache_dir: &Path,
        env: &[(&str, &str)],
        log_name: &str,
        extra: &[&str],
        run: RunDir,
    ) -> Watcher {
        Watcher::launch(w, entry, cache_dir, env, log_name, extra, run, false)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        w: &World,
        entry: &Value,
        cache_dir: &Path,
        env: &[(&str, &str)],
        log_name: &str,
        extra: &[&str],
        run: RunDir,
        net_admin_only: bool,
    ) -> Watcher {
        let dir = w.dir();
        let netd = dir.join("net.d");
        let bin = dir.join("bin");
        let run_dir = match run {
            RunDir::Own => dir.join("run-natguard"),
            RunDir::Node => super::run::node_dir(&w.node).join("run/natguard"),
        };
        for d in [&netd, &bin, &run_dir] {
            fs::create_dir_all(d).unwrap();
        }
        let entry_file = dir.join("natguard-entry.json");
        fs::write(&entry_file, serde_json::to_vec(entry).unwrap()).unwrap();
        let log = dir.join(log_name);
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "install".as_ref(),
            "--watch".as_ref(),
            "--cni-bin-dir".as_ref(),
            bin.as_os_str(),
            "--netconf-dir".as_ref(),
            netd.as_os_str(),
            "--cache-dir".as_ref(),
            cache_dir.as_os_str(),
            "--config".as_ref(),
            entry_file.as_os_str(),
        ];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        let mut inv = Natguard::new();
        if net_admin_only {
            inv = inv.net_admin_only();
        }
        let mut inv = inv
            .args(&args)
            .env(&[("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")])
            .env(env);
        if run == RunDir::Own {
            inv = inv.bind_mount(&run_dir, "/run/natguard", Access::ReadWrite);
        }
        let child = inv.spawn_in(&w.node, &log);
        Watcher {
            child,
            run_dir,
            netd,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The watcher's record (`/run/natguard/repair.json` inside its mount namespace).
    pub fn state(&self) -> Option<Value> {
        let bytes = fs::read(self.run_dir.join("repair.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Polls `f` until it holds; fails the test with the watcher's log after `deadline`.
    pub fn wait_for(&self, what: &str, deadline: Duration, mut f: impl FnMut() -> bool) {
        let end = Instant::now() + deadline;
        while !f() {
            assert!(
                Instant::now() < end,
                "timed out waiting for {what}; watcher log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // SAFETY: plain syscall on our own child, not reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
