//! One conntrack pass for every invocation that is waiting to flush.
//!
//! After its commit every ADD (and DEL) deletes its addresses' conntrack entries. Each IPv4
//! address costs two kernel walks of the whole host table, each dual-stack pod one dump of the
//! IPv6 family, and ctnetlink runs them one at a time (`NFNL_CB_MUTEX`): in a burst of 32 pod
//! starts the walks queue, and the median ADD waits for most of the others' walks before it
//! replies. Walks of invocations that are waiting at the same moment can be shared: one IPv6
//! family dump matches every waiting pod's IPv6 addresses, and once several IPv4 addresses wait
//! in a large table, one dump of the whole table matched here costs less than two walks each.
//!
//! The protocol, in natguard's runtime directory (`/run/natguard`):
//!
//! 1. After its commit an invocation writes its request, its addresses, its [`Path`] and its
//!    [`Scope`] (which of the addresses' entries: a DEL's network's own, say), to
//!    `ct/<pid>-<start time>`, through a dot-file and a rename, so a reader never sees half a
//!    request.
//! 2. It takes `ct.lock` (an exclusive flock, waited for at most [`WAIT`]).
//! 3. If its request was renamed `<name>.done`, a pass that began after the request was written
//!    served it: it removes the marker and is done.
//! 4. Otherwise it runs the pass: it reads every request, removes those of processes that are
//!    gone (pid and start time), flushes the union of the addresses of the requests made in its
//!    own network namespace (one flush per kind of path and scope, normally one), and renames each
//!    request it served to `.done`. Another namespace's requests wait for a pass of their own.
//! 5. If the lock stays busy past the deadline, or the directory cannot be used, it flushes
//!    its own addresses alone. A flush is never skipped.
//!
//! Why this stays exact: a request is written after its pod's policy was committed, and a pass
//! reads it after it took the lock, so every walk of the pass starts after the policy of every
//! pod it serves was in force, the same order as a flush of its own. A request is marked served
//! only when the flush that covered it succeeded; a failed pass leaves the others' requests,
//! and each of them then runs a pass of its own.
//!
//! Nothing here grows with history: a request lives only while its invocation does, and every
//! pass removes the files of processes that are gone. The kernel side is the caller's
//! ([`Flusher`]), so the protocol is unit-tested against a recording fake.

use crate::error::Result;
use crate::kernel::conntrack::{FlushReport, Path, Scope};
use std::fs;
use std::net::IpAddr;
use std::path::{Path as FsPath, PathBuf};
use std::time::Duration;

/// The requests' directory, in natguard's runtime directory.
pub(crate) const DIR: &str = "ct";
/// The pass's lock, in natguard's runtime directory.
pub(crate) const LOCK: &str = "ct.lock";
/// How long an invocation waits for a pass before it flushes alone.
pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// A pass serves its IPv4 addresses (and IPv6 ones the kernel can filter) with one full dump
/// once at least this many wait ...
pub(crate) const FULL_DUMP_ADDRS: usize = 4;
/// ... in a table of at least this many entries. Below, two filtered walks per address, which
/// skip empty buckets, cost less than a dump, which locks every bucket and copies every entry.
pub(crate) const FULL_DUMP_ENTRIES: u64 = 20_000;

const DONE: &str = ".done";

/// What the kernel side does for a pass.
pub(crate) trait Flusher {
    /// The entries of the calling thread's network namespace (no walk).
    fn entries(&mut self) -> Result<u64>;
    fn flush(&mut self, addrs: &[IpAddr], path: Path, scope: &Scope) -> Result<FlushReport>;
}

/// How an invocation's addresses were flushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// This invocation ran the pass for `served` invocations (itself included); `reports`
    /// holds one report per flush of the pass.
    Ran {
        reports: Vec<FlushReport>,
        served: usize,
    },
    /// Another invocation's pass covered these addresses.
    Served,
    /// Flushed alone, because of `why`.
    Alone { report: FlushReport, why: String },
}

/// Flushes the entries of `addrs` that `scope` deletes, along `path`, in one pass with every
/// invocation waiting at the same time.
pub(crate) fn flush(
    run_dir: &FsPath,
    addrs: &[IpAddr],
    path: Path,
    scope: &Scope,
    k: &mut dyn Flusher,
) -> Result<Outcome> {
    let alone = |k: &mut dyn Flusher, why: String| {
        k.flush(addrs, path, scope)
            .map(|report| Outcome::Alone { report, why })
    };
    let (Some(me), Some(netns)) = (Requester::own(), crate::node::netns_id()) else {
        return alone(
            k,
            "the process start time or network namespace is unreadable".into(),
        );
    };
    let own = Request::new(addrs, path, netns).scoped(scope);
    let dir = run_dir.join(DIR);
    if let Err(e) = me.write(&dir, &own) {
        return alone(
            k,
            format!("cannot write a request in {}: {e}", dir.display()),
        );
    }
    let lock = crate::lock::acquire_at(&run_dir.join(LOCK), WAIT);
    if me.take_done(&dir) {
        return Ok(Outcome::Served);
    }
    let _lock = match lock {
        Ok(l) => l,
        Err(e) => {
            me.remove(&dir);
            return alone(k, e.to_string());
        }
    };
    let mut requests = vec![(me, own)];
    // Another namespace's entries are not in this one's table: those wait for their own pass.
    requests.extend(
        waiting(&dir, &me)
            .into_iter()
            .filter(|(_, r)| r.netns == netns),
    );
    let result = run_pass(&requests, k);
    me.remove(&dir);
    let reports = result?;
    // Only now are the others told: their flows are gone.
    for (r, _) in &requests[1..] {
        r.mark_done(&dir);
    }
    Ok(Outcome::Ran {
        reports,
        served: requests.len(),
    })
}

/// One flush per kind of path and scope the requests ask for.
fn run_pass(requests: &[(Requester, Request)], k: &mut dyn Flusher) -> Result<Vec<FlushReport>> {
    let mut groups: Vec<(Path, Vec<IpAddr>, &Scope)> = Vec::new();
    for (_, r) in requests {
        let key = group_of(r.path);
        let i = match groups
            .iter()
            .position(|(p, _, s)| group_of(*p) == key && **s == r.scope)
        {
            Some(i) => i,
            None => {
                groups.push((r.path, Vec::new(), &r.scope));
                groups.len() - 1
            }
        };
        let g = &mut groups[i];
        // A kernel whose IPv6 filter is correct serves the whole group so (the probe's
        // verdict is the boot's, so an automatic request with IPv6 addresses is never in
        // the same group as one that found it correct).
        if r.path == Path::Ipv6Filtered {
            g.0 = Path::Ipv6Filtered;
        }
        for a in &r.addrs {
            if !g.1.contains(a) {
                g.1.push(*a);
            }
        }
    }
    let mut reports = Vec::with_capacity(groups.len());
    for (path, addrs, scope) in groups {
        let path = match path {
            Path::Auto | Path::Ipv6Filtered
                if walked_one_by_one(&addrs, path) >= FULL_DUMP_ADDRS =>
            {
                if k.entries()? >= FULL_DUMP_ENTRIES {
                    Path::FullDump
                } else {
                    path
                }
            }
            p => p,
        };
        reports.push(k.flush(&addrs, path, scope)?);
    }
    Ok(reports)
}

/// Automatic paths share a flush; a forced one (tests) is kept apart.
fn group_of(p: Path) -> Path {
    match p {
        Path::Auto | Path::Ipv6Filtered => Path::Auto,
        p => p,
    }
}

/// The addresses that cost two filtered walks each along `path`.
fn walked_one_by_one(addrs: &[IpAddr], path: Path) -> usize {
    addrs
        .iter()
        .filter(|a| a.to_canonical().is_ipv4() || path == Path::Ipv6Filtered)
        .count()
}

/// The requests of other live invocations; the files of processes that are gone are removed.
fn waiting(dir: &FsPath, me: &Requester) -> Vec<(Requester, Request)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((r, kind)) = Requester::parse(name) else {
            continue;
        };
        if r == *me {
            continue;
        }
        if !r.alive() {
            let _ = fs::remove_file(e.path());
            continue;
        }
        if kind != Kind::Request {
            continue;
        }
        if let Some(req) = fs::read_to_string(e.path())
            .ok()
            .and_then(|t| Request::decode(&t))
        {
            out.push((r, req));
        }
    }
    out
}

/// What an invocation asks a pass for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    addrs: Vec<IpAddr>,
    path: Path,
    /// The network namespace (device, inode) whose table holds the entries: a pass serves only
    /// the requests of its own namespace.
    netns: (u64, u64),
    /// Which entries of the addresses: requests of different scopes are flushed apart.
    scope: Scope,
}

impl Request {
    fn new(addrs: &[IpAddr], path: Path, netns: (u64, u64)) -> Self {
        Request {
            addrs: addrs.to_vec(),
            path,
            netns,
            scope: Scope::All,
        }
    }

    fn scoped(mut self, scope: &Scope) -> Self {
        self.scope = scope.clone();
        self
    }

    /// Version 1 is a request for every entry of the addresses, as earlier releases write and
    /// read it; version 2 adds the scope (an earlier release's pass leaves it to its writer).
    fn encode(&self) -> String {
        let mut s = format!(
            "natguard-ct {} {} {} {}",
            if self.scope == Scope::All { 1 } else { 2 },
            self.path.name(),
            self.netns.0,
            self.netns.1
        );
        if self.scope != Scope::All {
            s.push(' ');
            s.push_str(&self.scope.name());
        }
        s.push('\n');
        for a in &self.addrs {
            s.push_str(&a.to_string());
            s.push('\n');
        }
        s
    }

    fn decode(text: &str) -> Option<Request> {
        let mut lines = text.lines();
        let mut head = lines.next()?.split(' ');
        if head.next()? != "natguard-ct" {
            return None;
        }
        let version = head.next()?;
        if version != "1" && version != "2" {
            return None;
        }
        let path = Path::from_name(head.next()?)?;
        let netns = (head.next()?.parse().ok()?, head.next()?.parse().ok()?);
        let scope = if version == "2" {
            Scope::from_name(head.next()?).filter(|s| *s != Scope::All)?
        } else {
            Scope::All
        };
        if head.next().is_some() {
            return None;
        }
        let addrs = lines.map(|l| l.parse().ok()).collect::<Option<Vec<_>>>()?;
        Some(Request {
            addrs,
            path,
            netns,
            scope,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `<pid>-<start>`: waiting.
    Request,
    /// `<pid>-<start>.done`: served.
    Done,
    /// `.<pid>-<start>`: being written.
    Partial,
}

/// An invocation: its pid and the start time of that pid (clock ticks since boot, field 22 of
/// `/proc/<pid>/stat`), so a reused pid is not taken for the same process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Requester {
    pid: u32,
    start: u64,
}

impl Requester {
    fn own() -> Option<Requester> {
        let pid = std::process::id();
        Some(Requester {
            pid,
            start: start_time(pid)?,
        })
    }

    fn name(&self) -> String {
        format!("{}-{}", self.pid, self.start)
    }

    fn parse(name: &str) -> Option<(Requester, Kind)> {
        let (name, kind) = if let Some(n) = name.strip_prefix('.') {
            (n, Kind::Partial)
        } else if let Some(n) = name.strip_suffix(DONE) {
            (n, Kind::Done)
        } else {
            (name, Kind::Request)
        };
        let (pid, start) = name.split_once('-')?;
        let r = Requester {
            pid: pid.parse().ok()?,
            start: start.parse().ok()?,
        };
        (r.name() == name).then_some((r, kind))
    }

    fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }

    fn write(&self, dir: &FsPath, r: &Request) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // The dot-file is named for this process too, so a pass removes it if the process dies.
        let partial = dir.join(format!(".{}", self.name()));
        crate::fsutil::replace(
            &self.file(dir),
            &partial,
            r.encode().as_bytes(),
            crate::fsutil::How::mode(0o644),
        )
    }

    fn file(&self, dir: &FsPath) -> PathBuf {
        dir.join(self.name())
    }

    fn done_file(&self, dir: &FsPath) -> PathBuf {
        dir.join(format!("{}{DONE}", self.name()))
    }

    /// Whether a pass served this request; the marker is removed.
    fn take_done(&self, dir: &FsPath) -> bool {
        fs::remove_file(self.done_file(dir)).is_ok()
    }

    fn mark_done(&self, dir: &FsPath) {
        // The requester may have given up waiting and removed its request: nothing to mark.
        let _ = fs::rename(self.file(dir), self.done_file(dir));
    }

    fn remove(&self, dir: &FsPath) {
        let _ = fs::remove_file(self.file(dir));
    }
}

/// Field 22 of `/proc/<pid>/stat`, after the command name (which may hold spaces and ')').
fn start_time(pid: u32) -> Option<u64> {
    let stat = crate::sys::read_small(&format!("/proc/{pid}/stat"), 2048)?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// Records every flush; `fail` makes them fail.
    #[derive(Default)]
    struct Recorder {
        entries: u64,
        flushes: Vec<(Vec<IpAddr>, Path)>,
        scopes: Vec<Scope>,
        fail: bool,
    }

    impl Flusher for Recorder {
        fn entries(&mut self) -> Result<u64> {
            Ok(self.entries)
        }
        fn flush(&mut self, addrs: &[IpAddr], path: Path, scope: &Scope) -> Result<FlushReport> {
            self.flushes.push((addrs.to_vec(), path));
            self.scopes.push(scope.clone());
            if self.fail {
                return Err(Error::Protocol("refused".into()));
            }
            Ok(FlushReport {
                deleted: addrs.len() as u64,
                walks: 1,
                path: "filtered",
            })
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn tmp(label: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("natguard-ctpass-{label}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// A live process other than this one: the parent (the test harness's, always alive).
    fn live_other() -> Requester {
        let pid = rustix::process::getppid().map_or(0, |p| p.as_raw_pid() as u32);
        Requester {
            pid,
            start: start_time(pid).unwrap(),
        }
    }

    /// [`live_other`] waiting with a request for 10.0.0.2 made in `netns`.
    fn waiting_other(dir: &FsPath, netns: (u64, u64)) -> Requester {
        let other = live_other();
        other
            .write(dir, &Request::new(&[ip("10.0.0.2")], Path::Auto, netns))
            .unwrap();
        other
    }

    #[test]
    fn a_request_round_trips_and_a_torn_or_foreign_one_is_refused() {
        let r = Request::new(&[ip("10.0.0.1"), ip("fd00::1")], Path::Ipv6Filtered, (4, 9));
        assert_eq!(Request::decode(&r.encode()), Some(r.clone()));
        let text = r.encode();
        assert_eq!(Request::decode(&text[..text.len() - 3]), None, "torn");
        assert_eq!(Request::decode("natguard-ct 2 auto 4 9\n"), None);
        assert_eq!(Request::decode("natguard-ct 1 sideways 4 9\n"), None);
        assert_eq!(Request::decode(""), None);
    }

    #[test]
    fn names_parse_only_in_their_exact_form() {
        let r = Requester { pid: 42, start: 7 };
        assert_eq!(Requester::parse("42-7"), Some((r, Kind::Request)));
        assert_eq!(Requester::parse("42-7.done"), Some((r, Kind::Done)));
        assert_eq!(Requester::parse(".42-7"), Some((r, Kind::Partial)));
        for bad in ["42", "42-", "-7", "042-7", "42-7.tmp", "x-7", "42-7-1"] {
            assert_eq!(Requester::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_pass_serves_every_live_request_in_one_flush_and_marks_them_done() {
        let run = tmp("serve");
        let dir = run.join(DIR);
        let other = waiting_other(&dir, crate::node::netns_id().unwrap());
        let mut k = Recorder::default();
        let out = flush(&run, &[ip("10.0.0.1")], Path::Auto, &Scope::All, &mut k).unwrap();
        assert!(matches!(out, Outcome::Ran { served: 2, .. }), "{out:?}");
        assert_eq!(
            k.flushes,
            vec![(vec![ip("10.0.0.1"), ip("10.0.0.2")], Path::Auto)]
        );
        assert!(other.done_file(&dir).exists(), "the other is told");
        assert!(!Requester::own().unwrap().file(&dir).exists());
        // The other invocation, once it has the lock, finds its request served.
        assert!(other.take_done(&dir));
        assert!(!other.take_done(&dir), "the marker is taken once");
        fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn a_failed_pass_tells_no_one_it_was_served() {
        let run = tmp("fail");
        let dir = run.join(DIR);
        let other = waiting_other(&dir, crate::node::netns_id().unwrap());
        let mut k = Recorder {
            fail: true,
            ..Recorder::default()
        };
        assert!(flush(&run, &[ip("10.0.0.1")], Path::Auto, &Scope::All, &mut k).is_err());
        assert!(
            other.file(&dir).exists(),
            "the request waits for its own pass"
        );
        assert!(!other.done_file(&dir).exists());
        fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn a_request_of_another_network_namespace_is_left_for_its_own_pass() {
        let run = tmp("netns");
        let dir = run.join(DIR);
        let (dev, ino) = crate::node::netns_id().unwrap();
        let other = waiting_other(&dir, (dev, ino + 1));
        let mut k = Recorder::default();
        let out = flush(&run, &[ip("10.0.0.1")], Path::Auto, &Scope::All, &mut k).unwrap();
        assert!(matches!(out, Outcome::Ran { served: 1, .. }), "{out:?}");
        assert_eq!(k.flushes, vec![(vec![ip("10.0.0.1")], Path::Auto)]);
        assert!(other.file(&dir).exists() && !other.done_file(&dir).exists());
        fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn requests_of_processes_that_are_gone_are_removed_not_served() {
        let run = tmp("gone");
        let dir = run.join(DIR);
        let me = Requester::own().unwrap();
        // This pid with another start time: a process that is gone and whose pid was reused.
        let gone = Requester {
            pid: me.pid,
            start: me.start + 1,
        };
        gone.write(
            &dir,
            &Request::new(
                &[ip("10.9.9.9")],
                Path::Auto,
                crate::node::netns_id().unwrap(),
            ),
        )
        .unwrap();
        fs::write(dir.join(format!(".{}", gone.name())), "natguard-ct 1 au").unwrap();
        fs::write(gone.done_file(&dir), "").unwrap();
        fs::write(dir.join("not-ours"), "kept").unwrap();
        let mut k = Recorder::default();
        flush(&run, &[ip("10.0.0.1")], Path::Auto, &Scope::All, &mut k).unwrap();
        assert_eq!(k.flushes, vec![(vec![ip("10.0.0.1")], Path::Auto)]);
        let left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec!["not-ours".to_string()]);
        fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn many_ipv4_addresses_in_a_large_table_take_one_full_dump() {
        for (entries, v4, want) in [
            (FULL_DUMP_ENTRIES, FULL_DUMP_ADDRS, Path::FullDump),
            (FULL_DUMP_ENTRIES - 1, FULL_DUMP_ADDRS, Path::Auto),
            (FULL_DUMP_ENTRIES, FULL_DUMP_ADDRS - 1, Path::Auto),
        ] {
            let reqs: Vec<(Requester, Request)> = (0..v4)
                .map(|i| {
                    (
                        Requester {
                            pid: i as u32,
                            start: 0,
                        },
                        Request::new(
                            &[ip(&format!("10.0.0.{i}")), ip("fd00::1")],
                            Path::Auto,
                            (4, 9),
                        ),
                    )
                })
                .collect();
            let mut k = Recorder {
                entries,
                ..Recorder::default()
            };
            run_pass(&reqs, &mut k).unwrap();
            assert_eq!(k.flushes.len(), 1);
            assert_eq!(k.flushes[0].1, want, "{entries} entries, {v4} IPv4");
            assert_eq!(k.flushes[0].0.len(), v4 + 1, "the IPv6 address once");
        }
    }

    #[test]
    fn forced_paths_are_flushed_apart_and_a_correct_ipv6_filter_serves_its_group() {
        let req = |pid, a: &str, p| {
            (
                Requester { pid, start: 0 },
                Request::new(&[ip(a)], p, (4, 9)),
            )
        };
        let reqs = vec![
            req(1, "10.0.0.1", Path::Auto),
            req(2, "fd00::2", Path::Ipv6Filtered),
            req(3, "10.0.0.3", Path::Fallback),
        ];
        let mut k = Recorder::default();
        let reports = run_pass(&reqs, &mut k).unwrap();
        assert_eq!(reports.len(), 2);
        assert_eq!(
            k.flushes,
            vec![
                (vec![ip("10.0.0.1"), ip("fd00::2")], Path::Ipv6Filtered),
                (vec![ip("10.0.0.3")], Path::Fallback),
            ]
        );
    }
    #[test]
    fn a_scoped_request_round_trips_and_an_unscoped_one_stays_version_1() {
        let all = Request::new(&[ip("10.0.0.1")], Path::Auto, (4, 9));
        assert!(all.encode().starts_with("natguard-ct 1 auto 4 9\n"));
        for scope in [
            Scope::Own(70),
            Scope::add(Some(70), &[65, 99]),
            Scope::add(None, &[65]),
        ] {
            let r = all.clone().scoped(&scope);
            assert!(r.encode().starts_with("natguard-ct 2 "), "{scope:?}");
            assert_eq!(Request::decode(&r.encode()), Some(r), "{scope:?}");
        }
        for bad in [
            "natguard-ct 2 auto 4 9\n",
            "natguard-ct 2 auto 4 9 all\n",
            "natguard-ct 2 auto 4 9 own:128\n",
            "natguard-ct 2 auto 4 9 except:70:\n",
            "natguard-ct 2 auto 4 9 except:70:70\n",
            "natguard-ct 2 auto 4 9 own:70 x\n",
            "natguard-ct 1 auto 4 9 own:70\n",
        ] {
            assert_eq!(Request::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn requests_of_one_scope_share_a_flush_and_other_scopes_are_flushed_apart() {
        let req = |pid, a: &str, scope: Scope| {
            (
                Requester { pid, start: 0 },
                Request::new(&[ip(a)], Path::Auto, (4, 9)).scoped(&scope),
            )
        };
        let reqs = vec![
            req(1, "10.0.0.1", Scope::All),
            req(2, "10.0.0.2", Scope::Own(70)),
            req(3, "10.0.0.3", Scope::All),
            req(4, "10.0.0.4", Scope::Own(70)),
            req(5, "10.0.0.5", Scope::Own(71)),
        ];
        let mut k = Recorder::default();
        run_pass(&reqs, &mut k).unwrap();
        assert_eq!(
            k.flushes.iter().map(|f| f.0.clone()).collect::<Vec<_>>(),
            vec![
                vec![ip("10.0.0.1"), ip("10.0.0.3")],
                vec![ip("10.0.0.2"), ip("10.0.0.4")],
                vec![ip("10.0.0.5")],
            ]
        );
        assert_eq!(k.scopes, vec![Scope::All, Scope::Own(70), Scope::Own(71)]);
    }
}
