//! Root integration tests for the startup race and `natguard adopt` (issue: conntrack and
//! pods that predate natguard).
//!
//! - [`established_metadata_connection_moves_to_proxy_after_adopt`]: the race as users hit it. A
//!   pod attached without natguard keeps one keep-alive HTTP connection to the real metadata
//!   server, tracked in the node's conntrack; natguard is then added to the network's conflist
//!   and `natguard adopt` brings the pod under policy. The same client is answered by the
//!   node-local proxy after at most one reconnect, never by the real server again.
//! - [`adopt_reports_every_cache_entry_and_installs_only_what_it_should`]: `adopt` over a cache
//!   with pods of several networks, an exempt namespace, a vanished netns and corrupt files.
//! - [`adopt_and_reconcile_with_net_admin_only`]: `adopt`, a flush and `reconcile` with
//!   `CAP_NET_ADMIN` as the only capability (the shipped DaemonSet's container): pods are
//!   inspected without entering their namespaces, and what cannot be seen is skipped with the
//!   true reason.
//!
//! Needs root; never skips. Every wait is bounded; nothing is asserted about time.

mod common;

use common::run::{Invocation, Natguard};
use common::*;
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// A long-lived keep-alive HTTP client inside a pod
// ---------------------------------------------------------------------------------------------

/// Pause between two requests of the client (pacing only; nothing is asserted about it).
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Upper bound for waiting on the client's events; reaching it fails the test with every event
/// seen so far. A bound for failure reports, never an assertion on speed.
const EVENT_WAIT: Duration = Duration::from_secs(60);

/// What the client did. `epoch` is the test's phase (see [`KeepAliveClient::set_epoch`]) read
/// right before the client connected or wrote the request.
#[derive(Clone, Debug)]
// Some fields are only read through `Debug`, in the history a failing assertion prints.
#[allow(dead_code)]
enum Event {
    /// A new connection (`conn` counts from 1) from local port `port`.
    Connected { conn: u32, port: u16, epoch: u32 },
    /// Connecting failed.
    ConnectFailed { epoch: u32, error: String },
    /// An answer on connection `conn`; `body` is trimmed.
    Answer { conn: u32, epoch: u32, body: String },
    /// A request on connection `conn` failed (reset, close, timeout); the client reconnects.
    Lost {
        conn: u32,
        epoch: u32,
        error: String,
    },
}

/// A client in a pod that polls `GET /` every [`POLL_INTERVAL`] over one keep-alive
/// connection, as the AWS SDKs and exporters do, reconnecting only when the connection fails.
/// Runs on a thread that joined the pod's network namespace.
struct KeepAliveClient {
    target: SocketAddr,
    stop: Arc<AtomicBool>,
    epoch: Arc<AtomicU32>,
    rx: mpsc::Receiver<Event>,
    seen: Vec<Event>,
    handle: Option<JoinHandle<()>>,
}

impl KeepAliveClient {
    fn start(ns: &Netns, target: SocketAddr) -> KeepAliveClient {
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Arc::new(AtomicU32::new(0));
        let (tx, rx) = mpsc::channel();
        let ns = ns.clone();
        let (stop2, epoch2) = (stop.clone(), epoch.clone());
        let handle = std::thread::spawn(move || {
            join_netns(&ns);
            let send = |e: Event| {
                let _ = tx.send(e);
            };
            let mut conn: Option<(TcpStream, u32)> = None;
            let mut count = 0;
            while !stop2.load(Ordering::SeqCst) {
                if conn.is_none() {
                    let epoch = epoch2.load(Ordering::SeqCst);
                    let connected = TcpStream::connect_timeout(&target, IO_TIMEOUT).and_then(|s| {
                        s.set_read_timeout(Some(IO_TIMEOUT))?;
                        s.set_write_timeout(Some(IO_TIMEOUT))?;
                        let port = s.local_addr()?.port();
                        Ok((s, port))
                    });
                    match connected {
                        Ok((s, port)) => {
                            count += 1;
                            send(Event::Connected {
                                conn: count,
                                port,
                                epoch,
                            });
                            conn = Some((s, count));
                        }
                        Err(e) => {
                            send(Event::ConnectFailed {
                                epoch,
                                error: e.to_string(),
                            });
                            std::thread::sleep(POLL_INTERVAL);
                            continue;
                        }
                    }
                }
                let (s, n) = conn.as_mut().expect("connected");
                let n = *n;
                let epoch = epoch2.load(Ordering::SeqCst);
                let answer = s
                    .write_all(
                        format!(
                            "GET / HTTP/1.1\r\nHost: {target}\r\nUser-Agent: natguard-test\r\n\
                             Connection: keep-alive\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .and_then(|_| read_response(s));
                match answer {
                    Ok(body) => send(Event::Answer {
                        conn: n,
                        epoch,
                        body,
                    }),
                    Err(e) => {
                        send(Event::Lost {
                            conn: n,
                            epoch,
                            error: e.to_string(),
                        });
                        conn = None;
                        continue; // reconnect at once, as an SDK retrying a failed call does
                    }
                }
                std::thread::sleep(POLL_INTERVAL);
            }
        });
        KeepAliveClient {
            target,
            stop,
            epoch,
            rx,
            seen: Vec::new(),
            handle: Some(handle),
        }
    }

    /// Sets the phase the following connects and requests are tagged with.
    fn set_epoch(&self, epoch: u32) {
        self.epoch.store(epoch, Ordering::SeqCst);
    }

    /// Every event so far, one a line.
    fn history(&self) -> String {
        self.seen
            .iter()
            .map(|e| format!("  {e:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Collects events until `done` holds for all seen so far; fails after [`EVENT_WAIT`].
    fn wait_until(&mut self, what: &str, done: impl Fn(&[Event]) -> bool) {
        let start = Instant::now();
        while !done(&self.seen) {
            let left = EVENT_WAIT.saturating_sub(start.elapsed());
            match self.rx.recv_timeout(left) {
                Ok(e) => self.seen.push(e),
                Err(_) => panic!(
                    "client to {}: gave up waiting for {what}; events so far:\n{}",
                    self.target,
                    self.history()
                ),
            }
        }
    }

    /// Answers to requests written in `epoch`.
    fn answers(&self, epoch: u32) -> Vec<(u32, String)> {
        self.seen
            .iter()
            .filter_map(|e| match e {
                Event::Answer {
                    conn,
                    epoch: p,
                    body,
                } if *p == epoch => Some((*conn, body.clone())),
                _ => None,
            })
            .collect()
    }

    /// Connections opened so far: (number, local port).
    fn connections(&self) -> Vec<(u32, u16)> {
        self.seen
            .iter()
            .filter_map(|e| match e {
                Event::Connected { conn, port, .. } => Some((*conn, *port)),
                _ => None,
            })
            .collect()
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.seen.extend(self.rx.try_iter());
    }
}

impl Drop for KeepAliveClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn count_answers(events: &[Event], epoch: u32) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::Answer { epoch: p, .. } if *p == epoch))
        .count()
}

// ---------------------------------------------------------------------------------------------
// conntrack entries, natguard adopt
// ---------------------------------------------------------------------------------------------

/// One `conntrack -L` line: state and the original and reply tuples.
#[derive(Debug)]
struct CtEntry {
    state: String,
    orig_src: IpAddr,
    orig_sport: u16,
    reply_src: IpAddr,
    reply_sport: u16,
    line: String,
}

fn parse_ct(line: &str) -> Option<CtEntry> {
    let mut src = Vec::new();
    let mut sport = Vec::new();
    for tok in line.split_whitespace() {
        if let Some(v) = tok.strip_prefix("src=") {
            src.push(v.parse::<IpAddr>().ok()?);
        } else if let Some(v) = tok.strip_prefix("sport=") {
            sport.push(v.parse::<u16>().ok()?);
        }
    }
    let state = line
        .split_whitespace()
        .find(|t| t.chars().all(|c| c.is_ascii_uppercase() || c == '_') && t.len() > 3)
        .unwrap_or("")
        .to_string();
    Some(CtEntry {
        state,
        orig_src: *src.first()?,
        orig_sport: *sport.first()?,
        reply_src: *src.get(1)?,
        reply_sport: *sport.get(1)?,
        line: line.to_string(),
    })
}

/// The node's conntrack entries of TCP flows towards `meta`.
fn metadata_flows(node: &Netns, meta: IpAddr) -> Vec<CtEntry> {
    let fam = if meta.is_ipv4() { "ipv4" } else { "ipv6" };
    conntrack_list(
        node,
        &["-f", fam, "-p", "tcp", "--orig-dst", &meta.to_string()],
    )
    .iter()
    .map(|l| parse_ct(l).unwrap_or_else(|| panic!("cannot parse conntrack line {l:?}")))
    .collect()
}

fn show(flows: &[CtEntry]) -> String {
    flows
        .iter()
        .map(|f| format!("  {}", f.line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `natguard <verb> --cache-dir … --netconf-dir …` in the node namespace.
fn natguard_cli(node: &Netns, verb: &str, cache_dir: &Path, netconf_dir: &Path) -> Invocation {
    natguard_cli_as(Natguard::new(), node, verb, cache_dir, netconf_dir)
}

/// [`natguard_cli`] as `inv` describes the process (its capabilities).
fn natguard_cli_as(
    inv: Natguard,
    node: &Netns,
    verb: &str,
    cache_dir: &Path,
    netconf_dir: &Path,
) -> Invocation {
    inv.args(&[
        OsStr::new(verb),
        OsStr::new("--cache-dir"),
        cache_dir.as_os_str(),
        OsStr::new("--netconf-dir"),
        netconf_dir.as_os_str(),
    ])
    .run_in(node)
}

/// `natguard adopt` that must exit 0; returns its stdout.
fn adopt(w: &World, cache_dir: &Path, netconf_dir: &Path) -> String {
    let out = natguard_cli(&w.node, "adopt", cache_dir, netconf_dir);
    assert!(
        out.exit == Some(0),
        "natguard adopt failed ({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    assert!(
        !out.stderr.contains("panicked"),
        "natguard adopt panicked:\n{}",
        out.stderr
    );
    out.stdout
}

/// The report line of container `cid` (exactly one).
fn line_of<'a>(report: &'a str, cid: &str) -> &'a str {
    let lines: Vec<&str> = report.lines().filter(|l| mentions(l, cid)).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one report line for {cid}, got {lines:?}; report:\n{report}"
    );
    lines[0]
}

/// Writes `lists` as `<dir>/NN-<name>.conflist` (a node's /etc/cni/net.d); returns the dir.
fn netconf_dir(w: &World, lists: &[&Value]) -> PathBuf {
    let dir = w.dir().join("net.d");
    std::fs::create_dir_all(&dir).expect("create netconf dir");
    for (i, list) in lists.iter().enumerate() {
        let name = list["name"].as_str().expect("conflist name");
        std::fs::write(
            dir.join(format!("{:02}-{name}.conflist", 10 + i)),
            serde_json::to_vec_pretty(list).expect("serialize conflist"),
        )
        .expect("write conflist");
    }
    dir
}

/// Where [`World::chain`] caches results (libcni's `/var/lib/cni/results`).
fn cache_dir(w: &World) -> PathBuf {
    w.cache_dir().join("results")
}

/// The elements line of set `set` of table inet natguard in the node.
fn set_elements(w: &World, set: &str) -> String {
    w.node
        .run(&["nft", "list", "set", "inet", "natguard", set])
        .lines()
        .filter(|l| !l.contains("type ") && !l.contains("flags "))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------------
// The race itself
// ---------------------------------------------------------------------------------------------

/// Phases the client's requests are tagged with.
const BEFORE: u32 = 0;
const ADOPTING: u32 = 1;
const ADOPTED: u32 = 2;
const ADOPTING_AGAIN: u32 = 3;
const ADOPTED_AGAIN: u32 = 4;

/// Requests observed after adopt; every one must be answered by the proxy.
const OBSERVED: usize = 10;

#[test]
fn established_metadata_connection_moves_to_proxy_after_adopt() {
    let mut w = World::new("race");
    w.use_keepalive_servers();
    // The node tracks connections before natguard exists, as any node with kube-proxy does
    // (this is kube-proxy's masquerade rule; it matches nothing here). Without a conntrack user
    // the pod's flow would not be in the table at all, and there would be no race to show.
    w.on_node("iptables-nft -t nat -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE");
    w.on_node("ip6tables-nft -t nat -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE");

    // 1. A pod attached by a conflist without natguard.
    let plain = w.list("racenet", "1.0.0", 0, None);
    let pod = w.add_pod(&w.chain(plain), "pod", "default");
    assert_eq!(w.table(), None, "natguard must not exist yet");

    // 2. Its long-lived clients talk to the real metadata server over one connection each.
    let mut clients: Vec<(IpAddr, IpAddr, KeepAliveClient)> =
        [(META4, pod.v4, NODE_OUT4), (META6, pod.v6, NODE_OUT6)]
            .into_iter()
            .map(|(meta, src, proxy)| {
                (
                    src,
                    proxy,
                    KeepAliveClient::start(&pod.ns, sa(meta, HTTP_PORT)),
                )
            })
            .collect();
    for (_, _, c) in clients.iter_mut() {
        c.wait_until("three answers before natguard", |ev| {
            count_answers(ev, BEFORE) >= 3
        });
        let answers = c.answers(BEFORE);
        assert!(
            answers.iter().all(|(n, b)| *n == 1 && b == "cloud"),
            "before natguard, {} must be answered by the real server over one connection:\n{}",
            c.target,
            c.history()
        );
    }
    // The race's precondition: the flow is ESTABLISHED in the node's conntrack, not DNATed.
    for (src, _, c) in &clients {
        let (_, port) = c.connections()[0];
        let flows = metadata_flows(&w.node, c.target.ip());
        assert!(
            flows.iter().any(|f| f.orig_src == *src
                && f.orig_sport == port
                && f.state == "ESTABLISHED"
                && f.reply_src == c.target.ip()),
            "no ESTABLISHED un-NATed entry {src}:{port} -> {} in the node's conntrack:\n{}",
            c.target,
            show(&flows)
        );
    }

    // 3. natguard is added to the network's conflist, and adopts the running pod.
    let with_natguard = w.list("racenet", "1.0.0", 0, Some(w.natguard(json!({}))));
    let netconf = netconf_dir(&w, &[&with_natguard]);
    let cache = cache_dir(&w);
    assert!(
        w.chain(with_natguard.clone()).cache_path(&pod.att).exists(),
        "the chain driver did not cache the pod's result in {}",
        cache.display()
    );
    for (_, _, c) in &clients {
        c.set_epoch(ADOPTING);
    }
    let report = adopt(&w, &cache, &netconf);
    for (_, _, c) in &clients {
        c.set_epoch(ADOPTED);
    }
    let line = line_of(&report, &pod.att.container_id);
    assert!(
        line.starts_with("adopted")
            && line.contains("racenet")
            && line.contains("default/pod")
            && mentions(line, &pod.v4.to_string())
            && mentions(line, &pod.v6.to_string()),
        "unexpected report line {line:?}; report:\n{report}"
    );
    assert!(
        report
            .lines()
            .any(|l| l
                .starts_with("adopt: 1 attachment(s) brought under policy, 0 skipped, 0 failed")),
        "unexpected summary; report:\n{report}"
    );
    let table = w.table().expect("adopt created table inet natguard");

    // 4. The same clients are answered by the proxy after at most one reconnect, never again
    //    by the real server.
    for (src, proxy, c) in clients.iter_mut() {
        c.wait_until("answers after adopt", |ev| {
            count_answers(ev, ADOPTED) >= OBSERVED
        });
        let after = c.answers(ADOPTED);
        assert!(
            after.iter().take(OBSERVED).all(|(_, b)| b == "proxy"),
            "after adopt, every request to {} must be answered by the proxy:\n{}",
            c.target,
            c.history()
        );
        let conns = c.connections();
        assert!(
            conns.len() <= 2,
            "{} reconnected {} times (at most once allowed):\n{}",
            c.target,
            conns.len() - 1,
            c.history()
        );
        let first_proxy = c
            .seen
            .iter()
            .position(|e| matches!(e, Event::Answer { body, .. } if body == "proxy"))
            .expect("a proxy answer");
        assert!(
            !c.seen[first_proxy..]
                .iter()
                .any(|e| matches!(e, Event::Answer { body, .. } if body == "cloud")),
            "{} was answered by the real server after the proxy had answered:\n{}",
            c.target,
            c.history()
        );
        // The connection in use now is DNATed to the proxy in the node's conntrack.
        let (conn, port) = *conns.last().expect("a connection");
        assert!(
            after.iter().all(|(n, _)| *n == conn),
            "answers after adopt came over several connections:\n{}",
            c.history()
        );
        let flows = metadata_flows(&w.node, c.target.ip());
        let current: Vec<&CtEntry> = flows
            .iter()
            .filter(|f| f.orig_src == *src && f.orig_sport == port)
            .collect();
        assert!(
            current.len() == 1
                && current[0].state == "ESTABLISHED"
                && current[0].reply_src == *proxy
                && current[0].reply_sport == PROXY_PORT,
            "the entry of {src}:{port} -> {} must be ESTABLISHED and DNATed to {}:{PROXY_PORT}:\n{}",
            c.target,
            sa(*proxy, PROXY_PORT),
            show(&flows)
        );
        // No flow of the pod to the real server is still open.
        let bypass: Vec<&CtEntry> = flows
            .iter()
            .filter(|f| f.orig_src == *src && f.reply_src == c.target.ip())
            .filter(|f| f.state == "ESTABLISHED")
            .collect();
        assert!(
            bypass.is_empty(),
            "an ESTABLISHED flow of the pod still bypasses the DNAT:\n{}",
            show(&flows)
        );
    }

    for (_, _, c) in &clients {
        eprintln!("client to {} after adopt:\n{}", c.target, c.history());
    }

    // 5. adopt is idempotent: same report, same table, and the DNATed connection survives it.
    for (_, _, c) in &clients {
        c.set_epoch(ADOPTING_AGAIN);
    }
    let again = adopt(&w, &cache, &netconf);
    for (_, _, c) in &clients {
        c.set_epoch(ADOPTED_AGAIN);
    }
    let line2 = line_of(&again, &pod.att.container_id);
    assert_eq!(line2, line, "second adopt reports differently:\n{again}");
    assert_eq!(
        w.table().as_deref(),
        Some(table.as_str()),
        "a second adopt changed table inet natguard"
    );
    for (_, _, c) in clients.iter_mut() {
        let before = c.connections().len();
        c.wait_until("answers after the second adopt", |ev| {
            count_answers(ev, ADOPTED_AGAIN) >= 3
        });
        c.stop();
        assert!(
            c.answers(ADOPTED_AGAIN).iter().all(|(_, b)| b == "proxy"),
            "after the second adopt {} must still be answered by the proxy:\n{}",
            c.target,
            c.history()
        );
        assert_eq!(
            c.connections().len(),
            before,
            "the second adopt broke the DNATed connection to {}:\n{}",
            c.target,
            c.history()
        );
    }

    // 6. The runtime's DEL, now through the list with natguard, removes what adopt installed.
    w.chain(with_natguard)
        .del(&pod.att)
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    let table = w.table().unwrap_or_default();
    for ip in pod.ips() {
        assert!(
            !mentions(&table, &ip.to_string()),
            "after DEL the table still mentions {ip}:\n{table}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// adopt over a mixed cache
// ---------------------------------------------------------------------------------------------

#[test]
fn adopt_reports_every_cache_entry_and_installs_only_what_it_should() {
    let w = World::new("adopt-cache");
    // Network "ngnet" gets natguard (kube-system exempt) in its conflist; "plainnet" does not.
    let ng_plain = w.list("ngnet", "1.0.0", 1, None);
    let ng_list = w.list(
        "ngnet",
        "1.0.0",
        1,
        Some(w.natguard(json!({ "metadata": { "exemptNamespaces": ["kube-system"] } }))),
    );
    let other = w.list("plainnet", "1.0.0", 2, None);
    let ng_chain = w.chain(ng_plain);
    let other_chain = w.chain(other.clone());

    // Pods running before natguard: attached without it.
    let web = w.add_pod(&ng_chain, "web", "default");
    let creds = w.add_pod(&ng_chain, "creds", "kube-system");
    let gone = w.add_pod(&ng_chain, "gone", "default");
    let elsewhere = w.add_pod(&other_chain, "other", "default");
    // A pod whose netns vanished without a DEL (node crash): its cache entry stays.
    w.h.delete_netns(&gone.ns);
    assert!(!Path::new(&gone.ns.path()).exists());
    // Corrupt cache files.
    let cache = cache_dir(&w);
    std::fs::write(cache.join("garbage"), b"{\"kind\": \"cniCacheV1\", trunc").unwrap();
    let mut wrong = json!({
        "kind": "cniCacheV2",
        "containerId": "cid-wrongkind",
        "ifName": "eth0",
        "networkName": "ngnet",
        "result": web.result.clone(),
    });
    wrong["cniArgs"] = json!([["K8S_POD_NAMESPACE", "default"]]);
    std::fs::write(cache.join("wrongkind"), serde_json::to_vec(&wrong).unwrap()).unwrap();

    let netconf = netconf_dir(&w, &[&ng_list, &other]);
    let report = adopt(&w, &cache, &netconf);

    let expect = |cid: &str, start: &str, text: &str| {
        let line = line_of(&report, cid);
        assert!(
            line.starts_with(start) && line.contains(text),
            "report line of {cid} should start with {start:?} and say {text:?}, got {line:?}; report:\n{report}"
        );
    };
    expect(&web.att.container_id, "adopted", "ngnet");
    let web_line = line_of(&report, &web.att.container_id);
    assert!(
        mentions(web_line, &web.v4.to_string()) && mentions(web_line, &web.v6.to_string()),
        "adopted line should list {} and {}: {web_line:?}",
        web.v4,
        web.v6
    );
    // An exempt pod gets what ADD gives it: masquerade policy and the allow set, so the
    // fail-closed reject of unknown pod-network sources lets it through; no interception.
    expect(
        &creds.att.container_id,
        "adopted",
        "namespace kube-system is exempt: not intercepted",
    );
    expect(&gone.att.container_id, "skipped", "no longer exists");
    expect(&gone.att.container_id, "skipped", &gone.ns.path());
    expect(
        &elsewhere.att.container_id,
        "skipped",
        "its network does not list natguard",
    );
    for (file, why) in [
        ("garbage", "not valid JSON"),
        ("wrongkind", "kind: not a cniCacheV1 result"),
    ] {
        let head = format!("skipped  cache file {file}: ");
        let lines: Vec<&str> = report.lines().filter(|l| l.starts_with(&head)).collect();
        assert!(
            lines.len() == 1 && lines[0].contains(why),
            "expected one line {head:?} saying {why:?}; report:\n{report}"
        );
    }
    assert!(
        !report.lines().any(|l| l.starts_with("failed")),
        "no entry may fail; report:\n{report}"
    );
    let summary = "adopt: 2 attachment(s) brought under policy, 4 skipped, 0 failed; skipped: 1 netns_gone, 1 no_natguard, 2 unreadable_cache";
    assert!(
        report.lines().any(|l| l == summary),
        "expected {summary:?}; report:\n{report}"
    );
    // One line per cache file, plus the conntrack and summary lines.
    let files = std::fs::read_dir(&cache).unwrap().count();
    assert_eq!(files, 6);
    assert_eq!(
        report.lines().count(),
        files + 2,
        "one line per cache file expected; report:\n{report}"
    );

    // Only the adopted pod's addresses are in the sets.
    let table = w.table().expect("table inet natguard after adopt");
    for (set, ip) in [
        ("ngnet-redir4", web.v4),
        ("ngnet-masq4", web.v4),
        ("ngnet-redir6", web.v6),
        ("ngnet-masq6", web.v6),
    ] {
        let elems = set_elements(&w, set);
        assert!(
            mentions(&elems, &ip.to_string()),
            "{set} lacks {ip}:\n{elems}"
        );
    }
    for (set, ip) in [("exempt4", creds.v4), ("exempt6", creds.v6)] {
        let elems = set_elements(&w, set);
        assert!(
            mentions(&elems, &ip.to_string()),
            "{set} lacks {ip}:\n{elems}"
        );
    }
    for set in ["ngnet-redir4", "ngnet-redir6"] {
        let elems = set_elements(&w, set);
        for ip in creds.ips() {
            assert!(
                !mentions(&elems, &ip.to_string()),
                "exempt {ip} must not be intercepted ({set}):\n{elems}"
            );
        }
    }
    for p in [&gone, &elsewhere] {
        for ip in p.ips() {
            assert!(
                !mentions(&table, &ip.to_string()),
                "{ip} of {} must not be in the table:\n{table}",
                p.att.container_id
            );
        }
        assert!(
            !mentions(&table, &p.att.container_id),
            "{} must not be in the table:\n{table}",
            p.att.container_id
        );
    }
    assert!(
        !table.contains("plainnet"),
        "the network without natguard must have no chains or sets:\n{table}"
    );
    assert!(
        !table.contains("wrongkind"),
        "nothing of the wrong-kind cache file may be installed:\n{table}"
    );

    // The data path agrees. The pod of the network without natguard is no pod natguard knows:
    // the node-wide guard resets it, as any source natguard has not admitted.
    for (p, who) in [(&web, "proxy"), (&creds, "cloud")] {
        for meta in [META4, META6] {
            assert_eq!(
                http_get(&p.ns, sa(meta, HTTP_PORT)),
                body(who),
                "{} -> http://{}/ after adopt",
                p.att.container_id,
                sa(meta, HTTP_PORT)
            );
        }
    }
    for meta in [META4, META6] {
        assert_eq!(
            http_get(&elsewhere.ns, sa(meta, HTTP_PORT)),
            Outcome::Refused,
            "{} -> http://{}/ after adopt: a pod natguard never saw is reset",
            elsewhere.att.container_id,
            sa(meta, HTTP_PORT)
        );
    }

    // Idempotent: the same report, the same table.
    let again = adopt(&w, &cache, &netconf);
    let strip = |r: &str| -> Vec<String> {
        r.lines()
            .filter(|l| !l.starts_with("conntrack:"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        strip(&again),
        strip(&report),
        "second adopt reports differently"
    );
    assert_eq!(
        w.table().as_deref(),
        Some(table.as_str()),
        "a second adopt changed the table"
    );
}

/// A copy of `pod`'s cache entry as container `cid`, whose sandbox is `sandbox` instead.
fn cache_copy(cache: &Path, pod: &Pod, cid: &str, sandbox: &str) {
    let file = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            mentions(
                &std::fs::read_to_string(p).unwrap_or_default(),
                &pod.att.container_id,
            )
        })
        .expect("the pod's cache file");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    v["containerId"] = json!(cid);
    for i in v["result"]["interfaces"].as_array_mut().unwrap() {
        if i.get("sandbox").is_some() {
            i["sandbox"] = json!(sandbox);
        }
    }
    std::fs::write(
        cache.join(format!("copy-{cid}")),
        serde_json::to_vec(&v).unwrap(),
    )
    .unwrap();
}

/// The shipped DaemonSet's container has `CAP_NET_ADMIN` alone. `adopt` there looks into each
/// pod's namespace by its id from the node's (no `setns`, which needs `CAP_SYS_ADMIN`): pods
/// are adopted, the exempt one is answered by the REAL metadata server and the other by the
/// proxy; after `nft flush ruleset`, `reconcile` with the same capability restores both. What
/// cannot be seen is skipped with the true reason: a namespace gone, a path whose directory
/// this mount namespace lacks, and an empty file where a namespace was mounted (what a
/// mount namespace without propagation shows of a namespace mounted after it was made).
#[test]
fn adopt_and_reconcile_with_net_admin_only() {
    let w = World::new("adopt-netadmin");
    // The capabilities are what the test says: a process of the same setup reports them.
    let caps = Natguard::new()
        .plugin(Path::new("/bin/cat"))
        .args(&["/proc/self/status"])
        .net_admin_only()
        .run_in(&w.node);
    let eff = caps
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap());
    assert_eq!(eff, Some(1 << 12), "CAP_NET_ADMIN alone: {caps}");

    let plain = w.list("ngnet", "1.0.0", 1, None);
    let ng_list = w.list(
        "ngnet",
        "1.0.0",
        1,
        Some(w.natguard(json!({ "metadata": { "exemptNamespaces": ["kube-system"] } }))),
    );
    let chain = w.chain(plain);
    let web = w.add_pod(&chain, "web", "default");
    let creds = w.add_pod(&chain, "creds", "kube-system");
    let gone = w.add_pod(&chain, "gone", "default");
    w.h.delete_netns(&gone.ns);
    let cache = cache_dir(&w);
    let empty = w.dir().join("netns-unpropagated");
    std::fs::write(&empty, b"").unwrap();
    cache_copy(&cache, &web, "cid-noprop", empty.to_str().unwrap());
    cache_copy(&cache, &web, "cid-nodir", "/nonexistent-netns-dir/cni-1234");
    let netconf = netconf_dir(&w, &[&ng_list]);

    let run = |verb: &str| {
        let inv = natguard_cli_as(
            Natguard::new().net_admin_only(),
            &w.node,
            verb,
            &cache,
            &netconf,
        );
        assert_eq!(inv.exit, Some(0), "{inv}");
        inv.stdout
    };
    let report = run("adopt");
    let expect = |report: &str, cid: &str, start: &str, texts: &[&str]| {
        let line = line_of(report, cid);
        for text in texts {
            assert!(
                line.starts_with(start) && line.contains(text),
                "report line of {cid} should start with {start:?} and say {text:?}, got {line:?}; report:\n{report}"
            );
        }
    };
    expect(&report, &web.att.container_id, "adopted", &["ngnet"]);
    expect(
        &report,
        &creds.att.container_id,
        "adopted",
        &["kube-system is exempt"],
    );
    expect(
        &report,
        &gone.att.container_id,
        "skipped",
        &["no longer exists"],
    );
    expect(
        &report,
        "cid-noprop",
        "skipped",
        &["empty file", "not visible", "HostToContainer"],
    );
    expect(
        &report,
        "cid-nodir",
        "skipped",
        &["/nonexistent-netns-dir is not there", "not visible"],
    );
    for cid in ["cid-noprop", "cid-nodir"] {
        assert!(
            !line_of(&report, cid).contains("no longer exists"),
            "an invisible namespace is not a gone one:\n{report}"
        );
    }
    let summary = "adopt: 2 attachment(s) brought under policy, 3 skipped, 0 failed; skipped: 1 netns_gone, 2 netns_not_visible";
    assert!(
        report.lines().any(|l| l == summary),
        "expected {summary:?}; report:\n{report}"
    );
    let check_datapath = |when: &str| {
        for (p, who) in [(&web, "proxy"), (&creds, "cloud")] {
            for meta in [META4, META6] {
                assert_eq!(
                    http_get(&p.ns, sa(meta, HTTP_PORT)),
                    body(who),
                    "{} -> http://{}/ {when}",
                    p.att.container_id,
                    sa(meta, HTTP_PORT)
                );
            }
        }
    };
    check_datapath("after adopt with CAP_NET_ADMIN only");

    // A flush, then the repair with the same capability.
    w.node.run(&["nft", "flush", "ruleset"]);
    assert_eq!(
        http_get(&web.ns, sa(META4, HTTP_PORT)),
        body("cloud"),
        "after the flush the real server answers: what the repair must close"
    );
    let report = run("reconcile");
    assert!(
        report.contains("reconcile: 2 attachment(s) brought under policy, 3 skipped, 0 failed"),
        "{report}"
    );
    check_datapath("after a flush and reconcile with CAP_NET_ADMIN only");
}
