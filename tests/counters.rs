//! Root integration tests of natguard's counters: known pods send a known number of
//! connections (proxied, reset, masqueraded, kept their source) over IPv4 and IPv6, and
//! `natguard status --json`, `natguard status` and `natguard metrics` must show exactly those
//! numbers, per network, per family and per pod. Also the `metadata.logDenied` rule and its
//! counter, and the metrics file `natguard install --watch --metrics-file` keeps.
//!
//! What is counted: the nat rules (proxied, masqueraded, kept) see the first packet of each
//! connection, so they count connections. The reset rules see every packet that reaches them,
//! so they count packets: attempts. Each attempt here is one SYN: a connect that is answered
//! with a reset at once, with a timeout well below the kernel's first SYN retransmission (1 s),
//! so no second SYN is ever sent. The kernel log itself is not read: from a test's network
//! namespace that would need a host sysctl (`net.netfilter.nf_log_all_netns`).
//!
//! Topology and servers: `common::World` (a node, the cloud metadata server answering "cloud",
//! the node-local proxy answering "proxy", remote hosts inside and outside the
//! nonMasqueradeCIDRs). Needs root; never skips.

mod common;

use common::exposition::{self, labels, Metric, Sample};
use common::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Below the kernel's initial SYN retransmission timeout (1 s): a connect that is neither
/// answered nor reset within this sent exactly one SYN.
const ONE_SYN: Duration = Duration::from_millis(800);

// ---------------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------------

/// What one single-SYN connect saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Syn {
    Accepted,
    Reset,
    Silent,
}

/// One TCP connect from inside `ns` (from `src` if given) that sends exactly one SYN: the
/// socket is closed after [`ONE_SYN`] if nothing came back.
fn syn_once(ns: &Netns, src: Option<IpAddr>, dst: SocketAddr) -> Syn {
    in_netns(ns, move || {
        let (fam, sa, len) = sockaddr(dst);
        // SAFETY: plain syscalls on a socket this closure owns and closes; the sockaddr
        // buffers are valid for the lengths given.
        unsafe {
            let fd = libc::socket(
                fam,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            );
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            if let Some(src) = src {
                let (_, ssa, slen) = sockaddr(SocketAddr::new(src, 0));
                let rc = libc::bind(fd, ssa.as_ptr().cast(), slen);
                assert_eq!(rc, 0, "bind {src}: {}", std::io::Error::last_os_error());
            }
            let rc = libc::connect(fd, sa.as_ptr().cast(), len);
            let err = std::io::Error::last_os_error().raw_os_error();
            assert!(
                rc == 0 || err == Some(libc::EINPROGRESS),
                "connect {dst}: {err:?}"
            );
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            let n = libc::poll(&mut p, 1, ONE_SYN.as_millis() as libc::c_int);
            let mut so_error: libc::c_int = 0;
            let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut so_error as *mut libc::c_int).cast(),
                &mut l,
            );
            libc::close(fd);
            match (n, so_error) {
                (0, _) => Syn::Silent,
                (_, 0) => Syn::Accepted,
                (_, libc::ECONNREFUSED) | (_, libc::ECONNRESET) => Syn::Reset,
                (_, e) => panic!("connect {dst}: errno {e}"),
            }
        }
    })
}

/// A socket address as the kernel takes it: (family, bytes, length).
fn sockaddr(a: SocketAddr) -> (libc::c_int, Vec<u8>, libc::socklen_t) {
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            let len = std::mem::size_of::<libc::sockaddr_in>();
            // SAFETY: sin is a plain C struct of `len` bytes.
            let b = unsafe {
                std::slice::from_raw_parts((&sin as *const libc::sockaddr_in).cast::<u8>(), len)
            };
            (libc::AF_INET, b.to_vec(), len as libc::socklen_t)
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            let len = std::mem::size_of::<libc::sockaddr_in6>();
            // SAFETY: sin6 is a plain C struct of `len` bytes.
            let b = unsafe {
                std::slice::from_raw_parts((&sin6 as *const libc::sockaddr_in6).cast::<u8>(), len)
            };
            (libc::AF_INET6, b.to_vec(), len as libc::socklen_t)
        }
    }
}

/// `n` HTTP GETs of a metadata address, each its own connection, all answered by `who`.
fn fetch_metadata(pod: &Pod, meta: IpAddr, n: usize, who: &str) {
    for i in 0..n {
        assert_eq!(
            http_get(&pod.ns, sa(meta, HTTP_PORT)),
            body(who),
            "pod {} -> http://{}/ (#{i}) should be answered by {who}",
            pod.att.container_id,
            sa(meta, HTTP_PORT)
        );
    }
}

/// `n` single-SYN attempts to a metadata address, each reset at once.
fn attempts_reset(pod: &Pod, src: Option<IpAddr>, meta: IpAddr, n: usize) {
    for i in 0..n {
        assert_eq!(
            syn_once(&pod.ns, src, sa(meta, HTTP_PORT)),
            Syn::Reset,
            "pod {} (from {src:?}) -> {meta}:80 (#{i}) should be reset at once",
            pod.att.container_id
        );
    }
}

/// `n` TCP connections to the who-am-i server at `remote`, each seeing `expected` as source.
fn connect_remote(pod: &Pod, remote: IpAddr, n: usize, expected: IpAddr) {
    for i in 0..n {
        assert_eq!(
            tcp_whoami(&pod.ns, sa(remote, WHOAMI_PORT)),
            Ok(expected),
            "TCP from pod {} to {remote} (#{i}): the remote should see {expected}",
            pod.att.container_id
        );
    }
}

// ---------------------------------------------------------------------------------------------
// natguard's reports
// ---------------------------------------------------------------------------------------------

/// `natguard ARGS` in the node namespace: stdout, after checking the exit code is 0.
fn natguard_on(node: &Netns, args: &[&str]) -> String {
    common::run::Natguard::new()
        .args(args)
        .no_stdin()
        .run_in(node)
        .succeeded()
        .stdout
}

fn status_json(node: &Netns) -> Value {
    let text = natguard_on(node, &["status", "--json"]);
    assert_eq!(text.matches('\n').count(), 1, "one line of JSON: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("status --json: {e}\n{text}"))
}

fn network<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["networks"]
        .as_array()
        .expect("networks")
        .iter()
        .find(|n| n["name"] == name)
        .unwrap_or_else(|| panic!("no network {name} in {doc:#}"))
}

fn pod_entry<'a>(net: &'a Value, pod: &Pod) -> &'a Value {
    net["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .find(|p| p["containerId"] == pod.att.container_id.as_str())
        .unwrap_or_else(|| panic!("no pod {} in {net:#}", pod.att.container_id))
}

/// One family's counters as the JSON has them, in a fixed order for assertions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Fam {
    proxied: u64,
    reset: u64,
    masqueraded: u64,
    kept: u64,
    logged: u64,
}

fn fam_of(net: &Value, family: &str) -> Fam {
    let f = &net["families"][family];
    let n = |k: &str| {
        f[k].as_u64()
            .unwrap_or_else(|| panic!("families.{family}.{k} in {net:#}"))
    };
    Fam {
        proxied: n("proxied"),
        reset: n("reset"),
        masqueraded: n("masqueraded"),
        kept: n("keptSource"),
        logged: n("logged"),
    }
}

/// The packet counters of the rules of `nft list table inet natguard` whose comment ends with
/// `tag` (e.g. `logged4`), added up: natguard's own reading is checked against nft's.
/// natguard's inet table with its counters' values (`nft list`, not the stateless listing
/// the other tests compare).
fn table_with_counters(w: &World) -> String {
    w.node.run(&["nft", "list", "table", "inet", "natguard"])
}

fn nft_count(table: &str, network: &str, tag: &str) -> u64 {
    table
        .lines()
        .filter(|l| {
            l.contains(&format!("comment \"natguard {network} "))
                && l.contains(&format!(" {tag}\""))
        })
        .map(|l| {
            let after = l
                .split("counter packets ")
                .nth(1)
                .unwrap_or_else(|| panic!("no counter: {l}"));
            after.split(' ').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Reading `natguard metrics`: with the tests' strict parser (tests/common/exposition.rs), and
// with an independent one that must read the same, the Prometheus project's own Python client
// (`prometheus_client.parser`, Debian's python3-prometheus-client), not natguard's code
// ---------------------------------------------------------------------------------------------

/// The exposition as `prometheus_client.parser.text_string_to_metric_families` reads it, one
/// metric per family, named as written (a counter family's name gets its `_total` back).
const PROM_PARSER: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    name = fam.name + ("_total" if fam.type == "counter" and not fam.name.endswith("_total") else "")
    out.append({"name": name, "help": fam.documentation, "kind": fam.type,
                "samples": [{"labels": sorted(s.labels.items()), "value": s.value}
                            for s in fam.samples if s.name == name]})
print(json.dumps(out))
"#;

fn prometheus_client_reading(text: &str) -> Result<Vec<Metric>, String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-c", PROM_PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("run /usr/bin/python3 (python3-prometheus-client): {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "prometheus_client rejects the exposition: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(v.as_array()
        .unwrap()
        .iter()
        .map(|m| Metric {
            name: m["name"].as_str().unwrap().to_string(),
            help: m["help"].as_str().map(str::to_string),
            kind: m["kind"].as_str().map(str::to_string),
            samples: m["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| Sample {
                    labels: s["labels"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| {
                            (
                                p[0].as_str().unwrap().to_string(),
                                p[1].as_str().unwrap().to_string(),
                            )
                        })
                        .collect(),
                    value: s["value"].as_f64().unwrap(),
                })
                .collect(),
        })
        .collect())
}

/// `natguard metrics` output as the strict parser reads it, once the Prometheus project's parser
/// has read the same families, HELP texts, types, series and values (labels compared as sets;
/// it reads a missing HELP as an empty one).
fn parse_exposition(text: &str) -> Result<Vec<Metric>, String> {
    let strict = exposition::parse_exposition(text)?;
    let reference = prometheus_client_reading(text)?;
    let comparable = |metrics: &[Metric]| -> Vec<String> {
        metrics
            .iter()
            .map(|m| {
                let mut samples: Vec<String> = m
                    .samples
                    .iter()
                    .map(|s| {
                        let mut labels = s.labels.clone();
                        labels.sort();
                        format!("{labels:?} {:?}", s.value)
                    })
                    .collect();
                samples.sort();
                format!(
                    "{} {:?} {:?} {samples:?}",
                    m.name,
                    m.help.as_deref().unwrap_or(""),
                    m.kind
                )
            })
            .collect()
    };
    let (ours, theirs) = (comparable(&strict), comparable(&reference));
    if ours != theirs {
        return Err(format!(
            "the strict parser and prometheus_client read different metrics:\n{ours:#?}\n{theirs:#?}"
        ));
    }
    Ok(strict)
}

#[test]
fn the_independent_parser_reads_and_rejects_what_it_should() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{network=\"n\",family=\"ipv4\"} 3\n# HELP g G.\n# TYPE g gauge\n";
    let m = prometheus_client_reading(ok).unwrap();
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(m[0].name, "a_total");
    assert_eq!(m[0].kind.as_deref(), Some("counter"));
    assert_eq!(m[0].samples[0].value, 3.0);
    assert_eq!(
        m[0].samples[0].labels,
        [
            ("family".into(), "ipv4".into()),
            ("network".into(), "n".into())
        ]
    );
    assert!(m[1].samples.is_empty());
    assert!(prometheus_client_reading("a_total{network=\"n\" 3\n").is_err());
}

#[test]
fn the_strict_parser_reads_the_format() {
    let text = "# HELP a_total Something \\\\ with\\nlines.\n\
                # TYPE a_total counter\n\
                a_total{x=\"1\",y=\"q\\\"\\\\\\n\u{e9}\"} 3\n\
                a_total{x=\"2\"} 1.5e3\n\
                # TYPE b gauge\n\
                b +Inf\n\
                b{} NaN\n";
    // `b` and `b{}` are the same series.
    assert!(exposition::parse_exposition(text)
        .unwrap_err()
        .contains("duplicate series"));
    let text = text.replace("b{} NaN\n", "b{k=\"\"} -0.5\n");
    let m = exposition::parse_exposition(&text).unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(m[0].help.as_deref(), Some("Something \\ with\nlines."));
    assert_eq!(m[0].kind.as_deref(), Some("counter"));
    assert_eq!(
        m[0].samples[0].labels,
        labels(&[("x", "1"), ("y", "q\"\\\n\u{e9}")])
    );
    assert_eq!(m[0].samples[1].value, 1500.0);
    assert_eq!(m[1].help, None);
    assert_eq!(m[1].samples[0].value, f64::INFINITY);
    assert_eq!(m[1].samples[1].value, -0.5);
}

#[test]
fn the_strict_parser_rejects_what_natguard_must_never_write() {
    let head = "# HELP m_total Help.\n# TYPE m_total counter\n";
    let bad: &[(&str, &str)] = &[
        ("m_total 1", "newline"),
        ("m_total 1\n\n", "blank"),
        ("m_total 1\r\n", "carriage"),
        (
            "m_total{a=\"1\"} 1\nm_total{a=\"1\"} 2\n",
            "duplicate series",
        ),
        (
            "m_total{a=\"1\",b=\"2\"} 1\nm_total{b=\"2\",a=\"1\"} 2\n",
            "duplicate series",
        ),
        ("m_total{a=\"1\",a=\"2\"} 1\n", "twice"),
        ("m_total{a=1} 1\n", "not quoted"),
        ("m_total{a=\"1} 1\n", "unterminated"),
        ("m_total{a=\"x\"y\"} 1\n", "after a label value"),
        ("m_total{a=\"\\t\"} 1\n", "bad escape"),
        ("m_total{a=\"1\",} 1\n", "bad label name"),
        ("m_total{1a=\"1\"} 1\n", "bad label name"),
        ("m_total{__name__=\"x\"} 1\n", "bad label name"),
        ("m_total{a-b=\"1\"} 1\n", "bad label name"),
        ("m_total{a=\"1\"\n", "unterminated"),
        ("m_total one\n", "bad value"),
        ("m_total 0x10\n", "bad value"),
        ("m_total inf\n", "bad value"),
        ("m_total 1..2\n", "bad value"),
        ("m_total\n", "without a value"),
        ("m_total  1\n", "trailing fields"),
        ("m_total 1 1700000000000\n", "timestamp"),
        ("m_total{a=\"1\"}1\n", "single space"),
        ("0m 1\n", "bad metric name"),
        ("m-x 1\n", "bad metric name"),
        ("other 1\n", "before its TYPE"),
        ("m_total 1\n# TYPE m_total counter\n", "after its samples"),
        ("m_total 1\n# HELP m_total Again.\n", "after its samples"),
        ("# HELP m_total Again.\nm_total 1\n", "second HELP"),
        ("# TYPE m_total gauge\nm_total 1\n", "second TYPE"),
        ("# TYPE h histogram\nh 1\n", "type"),
        ("# TYPE g\n", "without text"),
        ("# TYPE 9g gauge\n", "bad metric name"),
        ("# HELP g bad \\t escape\n", "bad escape"),
        ("# just a comment\n", "not a HELP or TYPE"),
        ("#HELP m_total x\n", "not a HELP or TYPE"),
        (
            "m_total{a=\"1\"} 1\n# TYPE g gauge\ng 1\nm_total{a=\"2\"} 1\n",
            "not together",
        ),
    ];
    for (tail, why) in bad {
        let text = format!("{head}{tail}");
        match exposition::parse_exposition(&text) {
            Ok(m) => panic!("accepted {text:?}: {m:?}"),
            Err(e) => assert!(e.contains(why), "{text:?}: {e} (wanted {why:?})"),
        }
    }
    assert!(exposition::parse_exposition(&format!("{head}m_total 1\n")).is_ok());
}

/// The metric `name`'s sample with exactly these labels.
fn sample(metrics: &[Metric], name: &str, pairs: &[(&str, &str)]) -> f64 {
    let m = metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no metric {name}"));
    let mut want = labels(pairs);
    want.sort();
    m.samples
        .iter()
        .find(|s| {
            let mut got = s.labels.clone();
            got.sort();
            got == want
        })
        .unwrap_or_else(|| panic!("{name}: no series {pairs:?} in {:?}", m.samples))
        .value
}

fn metrics_of(node: &Netns) -> Vec<Metric> {
    let text = natguard_on(node, &["metrics"]);
    parse_exposition(&text).unwrap_or_else(|e| panic!("natguard metrics: {e}\n{text}"))
}

/// Every per-network counter metric of one (network, family), in [`Fam`]'s order.
fn fam_metrics(metrics: &[Metric], network: &str, family: &str) -> Fam {
    let v = |name: &str| sample(metrics, name, &[("network", network), ("family", family)]) as u64;
    Fam {
        proxied: v("natguard_proxied_connections_total"),
        reset: v("natguard_reset_attempts_total"),
        masqueraded: v("natguard_masqueraded_connections_total"),
        kept: v("natguard_kept_source_connections_total"),
        logged: v("natguard_logged_attempts_total"),
    }
}

fn pod_labels<'a>(
    network: &'a str,
    pod: &'a Pod,
    k8s_namespace: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("network", network),
        ("namespace", k8s_namespace),
        ("pod", pod.ns.name.rsplit('-').next().unwrap()),
        ("container_id", pod.att.container_id.as_str()),
        ("ifname", pod.att.ifname.as_str()),
    ]
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

/// Two networks on one node: "ngcnt" (proxy mode, kube-system exempt) with pods web and creds,
/// "ngdeny" (deny mode) with pod miner. Every counter natguard reports is driven to a known
/// value, different per network, family and pod, and read back from all three outputs.
#[test]
fn counts_every_connection_per_network_family_and_pod() {
    let w = World::new("cnt");
    let proxy_net = w.chain(w.list(
        "ngcnt",
        "1.0.0",
        0,
        Some(w.natguard(json!({ "metadata": { "exemptNamespaces": ["kube-system"] } }))),
    ));
    let deny_net = w.chain(w.list(
        "ngdeny",
        "1.0.0",
        1,
        Some(w.natguard(json!({ "metadata": { "mode": "deny" } }))),
    ));
    let web = w.add_pod(&proxy_net, "web", "default");
    let creds = w.add_pod(&proxy_net, "creds", "kube-system");
    let miner = w.add_pod(&deny_net, "miner", "default");

    // Before any traffic every counter is zero, both families, both networks.
    let doc = status_json(&w.node);
    for (net, f) in [
        ("ngcnt", "ipv4"),
        ("ngcnt", "ipv6"),
        ("ngdeny", "ipv4"),
        ("ngdeny", "ipv6"),
    ] {
        assert_eq!(
            fam_of(network(&doc, net), f),
            Fam::default(),
            "{net} {f} before traffic"
        );
    }

    // ngcnt, web: proxied 3 + 2, masqueraded 4 + 2, kept its source 3 + 2.
    fetch_metadata(&web, META4, 3, "proxy");
    fetch_metadata(&web, META6, 2, "proxy");
    connect_remote(&web, REMOTE_OUT4, 4, NODE_OUT4);
    connect_remote(&web, REMOTE_OUT6, 2, NODE_OUT6);
    connect_remote(&web, REMOTE_IN4, 3, web.v4);
    connect_remote(&web, REMOTE_IN6, 2, web.v6);
    // ngcnt: 2 IPv4 attempts from an address web added to its own interface, which natguard
    // never saw: reset by the node-wide guard, counted there, for no pod and no network.
    let stolen: IpAddr = "10.244.0.250".parse().unwrap();
    web.ns
        .ip(&format!("addr add {stolen}/24 dev {}", web.att.ifname));
    attempts_reset(&web, Some(stolen), META4, 2);
    // ngcnt, creds (exempt): the real API, once; 169.254.0.0/16 keeps the pod's source.
    fetch_metadata(&creds, META4, 1, "cloud");
    // ngdeny, miner: 3 + 2 attempts reset, 1 connection masqueraded.
    attempts_reset(&miner, None, META4, 3);
    attempts_reset(&miner, None, META6, 2);
    connect_remote(&miner, REMOTE_OUT4, 1, NODE_OUT4);

    let want = [
        (
            "ngcnt",
            "ipv4",
            Fam {
                proxied: 3,
                reset: 0,
                masqueraded: 4,
                kept: 3 + 1,
                logged: 0,
            },
        ),
        (
            "ngcnt",
            "ipv6",
            Fam {
                proxied: 2,
                reset: 0,
                masqueraded: 2,
                kept: 2,
                logged: 0,
            },
        ),
        (
            "ngdeny",
            "ipv4",
            Fam {
                proxied: 0,
                reset: 3,
                masqueraded: 1,
                kept: 0,
                logged: 0,
            },
        ),
        (
            "ngdeny",
            "ipv6",
            Fam {
                proxied: 0,
                reset: 2,
                masqueraded: 0,
                kept: 0,
                logged: 0,
            },
        ),
    ];
    // (pod, network, namespace, proxied, reset), both families together.
    let pods = [
        (&web, "ngcnt", "default", 5, 0),
        (&creds, "ngcnt", "kube-system", 0, 0),
        (&miner, "ngdeny", "default", 0, 5),
    ];

    // status --json
    let doc = status_json(&w.node);
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["ready"], true, "{doc:#}");
    assert!(doc["notReadyReason"].is_null());
    assert_eq!(
        doc["perPodCounters"], true,
        "this kernel keeps set-element counters"
    );
    let names: Vec<&str> = doc["networks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ngcnt", "ngdeny"]);
    for (net, f, counts) in want {
        assert_eq!(
            fam_of(network(&doc, net), f),
            counts,
            "status --json: {net} {f}"
        );
    }
    let cnt = network(&doc, "ngcnt");
    let deny = network(&doc, "ngdeny");
    assert_eq!(
        (cnt["mode"].as_str(), deny["mode"].as_str()),
        (Some("proxy"), Some("deny"))
    );
    assert_eq!(
        (cnt["logDenied"].as_bool(), deny["logDenied"].as_bool()),
        (Some(false), Some(false))
    );
    assert_eq!(
        cnt["metadataAddresses"],
        json!([META4.to_string(), META6.to_string()])
    );
    assert_eq!(cnt["metadataPorts"], json!([80]));
    assert_eq!(cnt["podInterfaces"], json!([{ "name": "cni0", "pods": 2 }]));
    assert_eq!(
        deny["podInterfaces"],
        json!([{ "name": "cni1", "pods": 1 }])
    );
    assert_eq!(cnt["pods"].as_array().unwrap().len(), 2);
    assert_eq!(deny["pods"].as_array().unwrap().len(), 1);
    for (pod, net, k8s_ns, proxied, reset) in pods {
        let p = pod_entry(network(&doc, net), pod);
        let role = pod.ns.name.rsplit('-').next().unwrap();
        assert_eq!(p["namespace"], k8s_ns, "{p:#}");
        assert_eq!(p["name"], role, "{p:#}");
        assert_eq!(p["ifname"], "eth0", "{p:#}");
        assert_eq!(
            p["interface"],
            attack::host_veth(pod),
            "the pod's bridge port: {p:#}"
        );
        assert_eq!(
            p["addresses"],
            json!([pod.v4.to_string(), pod.v6.to_string()]),
            "{p:#}"
        );
        assert_eq!(p["exempt"], k8s_ns == "kube-system", "{p:#}");
        assert_eq!(
            (p["proxied"].as_u64(), p["reset"].as_u64()),
            (Some(proxied), Some(reset)),
            "{role}: {p:#}"
        );
    }

    // natguard metrics
    let metrics = metrics_of(&w.node);
    assert_eq!(sample(&metrics, "natguard_up", &[]), 1.0);
    assert_eq!(
        sample(&metrics, "natguard_per_pod_counters_available", &[]),
        1.0
    );
    assert_eq!(sample(&metrics, "natguard_networks", &[]), 2.0);
    assert_eq!(
        sample(&metrics, "natguard_pods", &[("network", "ngcnt")]),
        2.0
    );
    assert_eq!(
        sample(&metrics, "natguard_pods", &[("network", "ngdeny")]),
        1.0
    );
    for (net, f, counts) in want {
        assert_eq!(fam_metrics(&metrics, net, f), counts, "metrics: {net} {f}");
    }
    for (pod, net, k8s_ns, proxied, reset) in pods {
        let l = pod_labels(net, pod, k8s_ns);
        assert_eq!(
            sample(&metrics, "natguard_pod_proxied_connections_total", &l),
            proxied as f64,
            "{l:?}"
        );
        assert_eq!(
            sample(&metrics, "natguard_pod_reset_attempts_total", &l),
            reset as f64,
            "{l:?}"
        );
    }
    let per_pod_series = |name: &str| {
        metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap()
            .samples
            .len()
    };
    assert_eq!(per_pod_series("natguard_pod_reset_attempts_total"), 3);
    assert_eq!(per_pod_series("natguard_pod_proxied_connections_total"), 3);

    // natguard status (text): the counters in words, the pod with resets first.
    let text = natguard_on(&w.node, &["status"]);
    assert!(
        text.starts_with(
            "natguard: guarding (the node-wide metadata guard is in place; nf_tables and conntrack netlink answer), 2 network(s)\n"
        ),
        "{text}"
    );
    assert!(text.contains(
        "\n  ipv4: 3 connection(s) sent to the proxy, 0 attempt(s) to reach the real metadata API reset, \
         4 connection(s) masqueraded, 4 connection(s) kept the pod's source address\n"
    ), "{text}");
    assert!(
        text.contains(&format!(
        "\n    default/miner {}, {} via {} [cid=cid-miner if=eth0]: 5 attempt(s) to reach the real \
         metadata API reset, 0 connection(s) sent to the proxy\n",
        miner.v4, miner.v6, attack::host_veth(&miner)
    )),
        "{text}"
    );
    assert!(text.contains(" metadata-exempt: 0 attempt(s)"), "{text}");
    // One exempt pod: its veth marks its frames.
    assert!(
        text.lines().nth(1)
            == Some("exempt veths: 1 (each exempt pod's own veth marks its frames; only what crosses it is exempt)"),
        "{text}"
    );
    assert!(
        text.contains("  pods: 1 (1 with reset attempts)\n"),
        "{text}"
    );
    // The guard's own counters: every reset, the 2 of the address web gave itself included,
    // which are no pod's.
    assert!(
        text.contains(
            "guard (node-wide, every network): metadata attempts reset: ipv4 5, ipv6 2\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("\n  2 reset attempt(s) came from sources of no pod listed below"),
        "{text}"
    );
    assert_eq!(text.matches("of no pod listed below").count(), 1, "{text}");
    let guard = &doc["guard"]["families"];
    assert_eq!(
        guard[0],
        json!({ "family": "ipv4", "reset": 5, "logged": 0 }),
        "{doc:#}"
    );
    assert_eq!(
        guard[1],
        json!({ "family": "ipv6", "reset": 2, "logged": 0 }),
        "{doc:#}"
    );

    // The outputs agree with nft's own counters.
    let table = table_with_counters(&w);
    for (net, f, counts) in want {
        let fam = if f == "ipv4" { "4" } else { "6" };
        assert_eq!(
            nft_count(&table, net, &format!("proxied{fam}")),
            counts.proxied,
            "{net} {f}\n{table}"
        );
    }
    assert_eq!(nft_count(&table, "~node", "reset4"), 5, "{table}");
    assert_eq!(nft_count(&table, "~node", "reset6"), 2, "{table}");

    for (pod, chain) in [
        (&web, &proxy_net),
        (&creds, &proxy_net),
        (&miner, &deny_net),
    ] {
        chain
            .del(&pod.att)
            .unwrap_or_else(|e| panic!("DEL {}: {e}", pod.att.container_id));
    }
    let metrics = metrics_of(&w.node);
    assert_eq!(
        sample(&metrics, "natguard_pods", &[("network", "ngcnt")]),
        0.0
    );
    assert_eq!(
        metrics
            .iter()
            .find(|m| m.name == "natguard_pod_reset_attempts_total")
            .unwrap()
            .samples
            .len(),
        0,
        "no per-pod series once the pods are gone"
    );
}

/// `metadata.logDenied: true`: a rate-limited log rule before each reset, whose counter (the
/// `logged` tag) counts the denied attempts, below the rate limit every one of them.
#[test]
fn log_denied_rules_count_the_denied_attempts() {
    let w = World::new("cntlog");
    let chain = w.chain(w.list(
        "nglog",
        "1.0.0",
        0,
        Some(w.natguard(json!({ "metadata": { "mode": "deny", "logDenied": true } }))),
    ));
    let pod = w.add_pod(&chain, "noisy", "default");
    let table = table_with_counters(&w);
    assert!(table.contains("log prefix \"natguard denied \""), "{table}");
    assert_eq!(nft_count(&table, "~node", "logged4"), 0, "{table}");

    // Fewer than the burst (20), in well under a second: every attempt is logged.
    attempts_reset(&pod, None, META4, 3);
    attempts_reset(&pod, None, META6, 2);

    let table = table_with_counters(&w);
    assert_eq!(nft_count(&table, "~node", "logged4"), 3, "{table}");
    assert_eq!(nft_count(&table, "~node", "logged6"), 2, "{table}");
    let doc = status_json(&w.node);
    let net = network(&doc, "nglog");
    assert_eq!(net["logDenied"], true);
    assert_eq!(net["mode"], "deny");
    assert_eq!(
        fam_of(net, "ipv4"),
        Fam {
            reset: 3,
            logged: 3,
            ..Fam::default()
        }
    );
    assert_eq!(
        fam_of(net, "ipv6"),
        Fam {
            reset: 2,
            logged: 2,
            ..Fam::default()
        }
    );
    assert_eq!(pod_entry(net, &pod)["reset"], 5);
    let metrics = metrics_of(&w.node);
    assert_eq!(
        fam_metrics(&metrics, "nglog", "ipv4"),
        Fam {
            reset: 3,
            logged: 3,
            ..Fam::default()
        }
    );
    assert_eq!(
        fam_metrics(&metrics, "nglog", "ipv6"),
        Fam {
            reset: 2,
            logged: 2,
            ..Fam::default()
        }
    );
    let text = natguard_on(&w.node, &["status"]);
    assert!(
        text.contains("`journalctl -k | grep 'natguard denied '`"),
        "{text}"
    );
    assert!(text.contains(", 3 denied attempt(s) logged\n"), "{text}");
    chain.del(&pod.att).unwrap();
}

/// A `natguard install --watch` child in a namespace, stopped with SIGTERM (killed on drop).
struct Watcher(Child);

impl Watcher {
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "watcher ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (bounded) until `f` gives something.
fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `install --watch --metrics-file`: the file appears once its directory does (the failed
/// writes before are logged and retried, the watcher goes on), parses, follows the counters,
/// and is replaced whole each time, never leaving a temporary file behind.
#[test]
fn watch_keeps_the_metrics_file() {
    let w = World::new("cntwatch");
    let chain = w.chain(w.list("ngwatch", "1.0.0", 0, Some(w.natguard(json!({})))));
    let pod = w.add_pod(&chain, "web", "default");
    let dir = w.dir().join("install");
    fs::create_dir_all(dir.join("net.d")).unwrap();
    fs::create_dir_all(dir.join("bin")).unwrap();
    fs::write(
        dir.join("net.d/10-ngwatch.conflist"),
        serde_json::to_string_pretty(&w.list("ngwatch", "1.0.0", 0, None)).unwrap(),
    )
    .unwrap();
    let textfile_dir = dir.join("textfile");
    let prom = textfile_dir.join("natguard.prom");
    let log = dir.join("watch.log");
    let watcher = spawn_watcher(
        &w,
        &dir,
        &[
            "--metrics-file",
            prom.to_str().unwrap(),
            "--metrics-interval",
            "1",
        ],
    );
    let logged = || fs::read_to_string(&log).unwrap_or_default();

    // The directory does not exist yet: the write fails, is logged once, and is retried.
    wait_for(
        "the failed write in the log",
        Duration::from_secs(10),
        || logged().contains("cannot write metrics").then_some(()),
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        logged().matches("cannot write metrics").count(),
        1,
        "{}",
        logged()
    );
    fs::create_dir_all(&textfile_dir).unwrap();
    let first = wait_for("the metrics file", Duration::from_secs(10), || {
        fs::read_to_string(&prom).ok()
    });
    let metrics = parse_exposition(&first).unwrap_or_else(|e| panic!("{e}\n{first}"));
    assert_eq!(sample(&metrics, "natguard_up", &[]), 1.0);
    assert_eq!(sample(&metrics, "natguard_networks", &[]), 1.0);
    assert_eq!(
        sample(&metrics, "natguard_pods", &[("network", "ngwatch")]),
        1.0
    );
    assert_eq!(fam_metrics(&metrics, "ngwatch", "ipv4"), Fam::default());
    let inode = fs::metadata(&prom).unwrap().ino();
    wait_for("the recovery in the log", Duration::from_secs(5), || {
        logged().contains("metrics written to").then_some(())
    });

    // New traffic shows up at a later rewrite; each rewrite is a new file renamed into place.
    fetch_metadata(&pod, META4, 2, "proxy");
    fetch_metadata(&pod, META6, 1, "proxy");
    let metrics = wait_for(
        "a rewrite with the new counters",
        Duration::from_secs(10),
        || {
            let text = fs::read_to_string(&prom).ok()?;
            let m = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            (fam_metrics(&m, "ngwatch", "ipv4").proxied == 2).then_some(m)
        },
    );
    assert_eq!(fam_metrics(&metrics, "ngwatch", "ipv6").proxied, 1);
    let l = pod_labels("ngwatch", &pod, "default");
    assert_eq!(
        sample(&metrics, "natguard_pod_proxied_connections_total", &l),
        3.0
    );
    assert_ne!(
        fs::metadata(&prom).unwrap().ino(),
        inode,
        "rewritten by rename, not in place"
    );
    let names: HashSet<String> = fs::read_dir(&textfile_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        HashSet::from(["natguard.prom".to_string()]),
        "no temporary file left"
    );
    assert_eq!(fs::metadata(&prom).unwrap().mode() & 0o777, 0o644);

    // A write that fails later (the directory gone again) does not stop the watcher either.
    fs::remove_dir_all(&textfile_dir).unwrap();
    wait_for(
        "the second failure in the log",
        Duration::from_secs(10),
        || (logged().matches("cannot write metrics").count() == 2).then_some(()),
    );
    fs::create_dir_all(&textfile_dir).unwrap();
    wait_for("the file again", Duration::from_secs(10), || {
        fs::read_to_string(&prom).ok()
    });

    let status = watcher.stop();
    assert!(status.success(), "watcher exit {status:?}\n{}", logged());
    chain.del(&pod.att).unwrap();
}

/// One HTTP/1.1 request from `ns` to `addr`, read to the end (the server closes): the status
/// code, the headers (names in lower case) and the body.
fn http_request(
    ns: &Netns,
    addr: SocketAddr,
    request: &str,
) -> (u16, Vec<(String, String)>, String) {
    use std::io::{Read, Write};
    let raw = in_netns(ns, || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        String::from_utf8(raw).unwrap()
    });
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head: {raw:?}"));
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap();
    assert!(status.starts_with("HTTP/1.1 "), "{status}");
    let code = status[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse().unwrap())
        .expect("a Content-Length");
    assert_eq!(
        body.len(),
        len,
        "the body is as long as Content-Length says"
    );
    (code, headers, body.to_string())
}

/// Starts `install --watch --no-adopt` with `more` in the node, its directories under `dir`
/// (whose `net.d` and `bin` exist), logging to `dir/watch.log`.
fn spawn_watcher(w: &World, dir: &std::path::Path, more: &[&str]) -> Watcher {
    let bin = natguard_bin();
    let mut cmd = w.node.cmd(bin.to_str().unwrap());
    // In the node's own /run: the watcher's lock and record are never the host's.
    common::run::in_node_state(&mut cmd, &w.node);
    cmd.args(["install", "--watch", "--no-adopt"])
        .arg("--netconf-dir")
        .arg(dir.join("net.d"))
        .arg("--cni-bin-dir")
        .arg(dir.join("bin"))
        .arg("--ready-file")
        .arg(dir.join("ready"))
        .args(more)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(dir.join("watch.log")).unwrap());
    Watcher(cmd.spawn().unwrap())
}

/// [`spawn_watcher`] with `--metrics-port PORT` and `more`, once it serves.
fn metrics_watcher(w: &World, dir: &std::path::Path, port: u16, more: &[&str]) -> Watcher {
    let log = dir.join("watch.log");
    let port_arg = port.to_string();
    let mut args = vec!["--metrics-port", port_arg.as_str()];
    args.extend_from_slice(more);
    let watcher = spawn_watcher(w, dir, &args);
    wait_for("the endpoint in the log", Duration::from_secs(10), || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(&format!(":{port}/metrics"))
            .then_some(())
    });
    watcher
}

/// The scrape endpoint is no pod's: bound to every address, it answers `403` to pods behind a
/// bridge (natguard's network) and behind a routed veth (a `ptp` network natguard is not in),
/// on both families, and to a pod that spoofs a remote source the handshake never completes;
/// it serves the node itself, a scraper beyond the node's uplink and one through a VXLAN
/// tunnel, and a pod `--metrics-allow` names. Against the same watcher, one scrape each.
#[test]
fn the_scrape_endpoint_serves_no_pod_but_the_node_and_what_lies_beyond_it() {
    let w = World::new("cntpods");
    let chain = w.chain(w.list("ngscrape", "1.0.0", 0, Some(w.natguard(json!({})))));
    let pod = w.add_pod(&chain, "web", "default");
    let prom = w.add_pod(&chain, "prom", "monitoring");
    // A network natguard is not in: a routed veth per pod.
    let other =
        w.chain(json!({"cniVersion": "1.0.0", "name": "other", "plugins": [w.ptp("other", 1)]}));
    let routed = w.add_pod(&other, "routed", "default");
    run(w.node.cmd("ip").args(["link", "set", "lo", "up"]));
    // A scraper through a VXLAN tunnel over the link to remote-in (as flannel's flannel.1).
    for (ns, local, remote, addr) in [
        (&w.node, NODE_IN4, REMOTE_IN4, "10.99.0.1/24"),
        (&w.remote_in, REMOTE_IN4, NODE_IN4, "10.99.0.2/24"),
    ] {
        let dev = if std::ptr::eq(ns, &w.node) {
            "to-rin"
        } else {
            "eth0"
        };
        ns.run(&[
            "ip",
            "link",
            "add",
            "ngvx",
            "type",
            "vxlan",
            "id",
            "42",
            "dstport",
            "4789",
            "local",
            &local.to_string(),
            "remote",
            &remote.to_string(),
            "dev",
            dev,
        ]);
        ns.addr("ngvx", addr);
        ns.run(&["ip", "link", "set", "ngvx", "up"]);
    }
    let dir = w.dir().join("install");
    fs::create_dir_all(dir.join("net.d")).unwrap();
    fs::create_dir_all(dir.join("bin")).unwrap();
    let port = 19120;
    let (p4, p6) = (format!("{}/32", prom.v4), format!("{}/128", prom.v6));
    let watcher = metrics_watcher(
        &w,
        &dir,
        port,
        &[
            "--metrics-address",
            "::",
            "--metrics-allow",
            &p4,
            "--metrics-allow",
            &p6,
        ],
    );
    let get = "GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n";
    let scrape = |ns: &Netns, to: IpAddr| http_request(ns, SocketAddr::new(to, port), get);
    for to in [NODE_OUT4, NODE_OUT6] {
        for (who, ns, way) in [("web", &pod.ns, "cni0"), ("routed", &routed.ns, "a veth")] {
            let (code, _, body) = scrape(ns, to);
            assert_eq!(code, 403, "{who} to {to}: {body}");
            assert!(
                body.contains("natguard serves its metrics to no pod") && body.contains(way),
                "{who} to {to}: {body}"
            );
            assert!(!body.contains("natguard_"), "{who} read metrics: {body}");
        }
        let (code, _, body) = scrape(&prom.ns, to);
        assert_eq!(code, 200, "the pod --metrics-allow names, to {to}: {body}");
        assert!(body.contains("natguard_up 1"), "{body}");
        // Beyond the node's uplink (its default routes leave by to-rout).
        let (code, _, body) = scrape(&w.remote_out, to);
        assert_eq!(code, 200, "remote-out to {to}: {body}");
        // remote-in's link is a veth without a default route: as a pod's would be.
        assert_eq!(scrape(&w.remote_in, to).0, 403, "remote-in to {to}");
    }
    let (code, _, body) = scrape(&w.remote_in, "10.99.0.1".parse().unwrap());
    assert_eq!(code, 200, "through the tunnel: {body}");
    // The node's link-local address on the pods' bridge, from a pod (routed by its scope,
    // the interface it came in on, not by the table).
    let link_local = |ns: &Netns, dev: &str| -> Option<std::net::Ipv6Addr> {
        let out = ns.run(&[
            "ip", "-6", "-o", "addr", "show", "dev", dev, "scope", "link",
        ]);
        if out.contains("tentative") {
            return None;
        }
        let a = out
            .split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)?;
        a.split('/').next()?.parse().ok()
    };
    let bridge_ll = wait_for("cni0's link-local address", Duration::from_secs(10), || {
        link_local(&w.node, "cni0")
    });
    wait_for(
        "the pod's link-local address",
        Duration::from_secs(10),
        || link_local(&pod.ns, "eth0"),
    );
    let index: u32 = pod
        .ns
        .run(&["ip", "-o", "link", "show", "eth0"])
        .split(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .expect("the pod's eth0 index");
    let to = SocketAddr::V6(std::net::SocketAddrV6::new(bridge_ll, port, 0, index));
    let (code, _, body) = http_request(&pod.ns, to, get);
    assert_eq!(code, 403, "a pod to the node's link-local address: {body}");
    assert!(body.contains("cni0"), "{body}");
    assert_eq!(scrape(&w.node, "127.0.0.1".parse().unwrap()).0, 200);
    assert_eq!(
        scrape(&w.node, NODE_OUT4).0,
        200,
        "the node from its own address"
    );

    // A pod that takes a remote source: the node answers that address through its uplink,
    // so the handshake never completes in the pod and nothing is read.
    pod.ns.addr("eth0", &format!("{REMOTE_OUT4}/32"));
    let probe = format!(
        "import socket; s = socket.socket(); s.settimeout(3); s.bind(('{REMOTE_OUT4}', 0)); \
         s.connect(('{NODE_OUT4}', {port})); s.sendall(b'GET /metrics HTTP/1.0\\r\\n\\r\\n'); \
         print(s.recv(4096))"
    );
    let spoofed = output(pod.ns.cmd("python3").args(["-c", &probe]));
    let said = String::from_utf8_lossy(&spoofed.stdout);
    assert!(
        !spoofed.status.success() && !said.contains("natguard_"),
        "a spoofed remote source connected: {said}"
    );

    let status = watcher.stop();
    assert!(status.success(), "watcher exit {status:?}");
    chain.del(&pod.att).unwrap();
    chain.del(&prom.att).unwrap();
    other.del(&routed.att).unwrap();
}

/// `install --watch --metrics-port`: GET /metrics answers 200 with the Prometheus text format
/// that `natguard metrics` prints, less the per-pod series (they name pods; opt-in with
/// `--metrics-pod-labels`), read with the Prometheus client's parser, and follows the
/// counters; other paths are 404, other methods 405; and 30 clients that connect and send
/// nothing delay neither the watcher's work on the conflist nor the next scrape.
#[test]
fn watch_serves_metrics_over_http() {
    let w = World::new("cnthttp");
    let chain = w.chain(w.list("nghttp", "1.0.0", 0, Some(w.natguard(json!({})))));
    let pod = w.add_pod(&chain, "web", "default");
    run(w.node.cmd("ip").args(["link", "set", "lo", "up"]));
    let dir = w.dir().join("install");
    fs::create_dir_all(dir.join("net.d")).unwrap();
    fs::create_dir_all(dir.join("bin")).unwrap();
    let list = dir.join("net.d/10-nghttp.conflist");
    let template = serde_json::to_string_pretty(&w.list("nghttp", "1.0.0", 0, None)).unwrap();
    fs::write(&list, &template).unwrap();
    let log = dir.join("watch.log");
    let port = 19118;
    let watcher = metrics_watcher(&w, &dir, port, &["--metrics-address", "127.0.0.1"]);
    let logged = || fs::read_to_string(&log).unwrap_or_default();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let get = "GET /metrics HTTP/1.1\r\nHost: node\r\nAccept: text/plain\r\n\r\n";

    let (code, headers, body) = http_request(&w.node, addr, get);
    assert_eq!(code, 200, "{body}");
    let header =
        |h: &[(String, String)], k: &str| h.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(
        header(&headers, "content-type").as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let metrics = parse_exposition(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    assert_eq!(sample(&metrics, "natguard_up", &[]), 1.0);
    assert_eq!(
        sample(&metrics, "natguard_pods", &[("network", "nghttp")]),
        1.0
    );
    // The same families as `natguard metrics` prints.
    let cli = common::run::Natguard::new()
        .args(&["metrics"])
        .run_in(&w.node);
    let cli = parse_exposition(&cli.stdout).unwrap();
    let names = |m: &[Metric]| {
        m.iter()
            .map(|m| m.name.clone())
            .filter(|n| !n.starts_with("natguard_pod_"))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&metrics), names(&cli));
    assert!(
        !body.contains("namespace=") && !body.contains("pod=\""),
        "no pod identities by default: {body}"
    );

    // A scrape sees the counters of its moment.
    fetch_metadata(&pod, META4, 2, "proxy");
    let (_, _, body) = http_request(&w.node, addr, get);
    let metrics = parse_exposition(&body).unwrap();
    assert_eq!(fam_metrics(&metrics, "nghttp", "ipv4").proxied, 2);

    let (code, _, _) = http_request(&w.node, addr, "GET / HTTP/1.1\r\nHost: node\r\n\r\n");
    assert_eq!(code, 404);
    let (code, headers, _) = http_request(
        &w.node,
        addr,
        "POST /metrics HTTP/1.1\r\nHost: node\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(code, 405);
    assert_eq!(header(&headers, "allow").as_deref(), Some("GET, HEAD"));

    // 30 clients that send nothing: the watcher still puts natguard back into a rewritten list
    // at once, and the next scrape is answered at once (each connection is a task of the
    // server, not a turn).
    let idle: Vec<_> = in_netns(&w.node, || {
        (0..30)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect()
    });
    let start = Instant::now();
    fs::write(&list, &template).unwrap();
    wait_for("natguard back in the list", Duration::from_secs(10), || {
        fs::read_to_string(&list)
            .ok()
            .filter(|t| t.contains("\"natguard\""))
    });
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the watcher waited for the idle client: {:?}",
        start.elapsed()
    );
    let (code, _, _) = http_request(&w.node, addr, get);
    assert_eq!(code, 200);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "a scrape waited {:?} behind 30 idle clients",
        start.elapsed()
    );
    drop(idle);

    // A head over the bound (8 KiB) is refused and never answered with metrics.
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: node\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let answer = in_netns(&w.node, || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = s.write_all(big.as_bytes());
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        String::from_utf8_lossy(&raw).into_owned()
    });
    assert!(
        !answer.starts_with("HTTP/1.1 200") && !answer.contains("natguard_up"),
        "a 64 KiB head was answered: {answer:?}"
    );
    // A head trickled a byte every 200 ms, never complete, is cut off at the head's deadline
    // (2 s; the test waits at most 30), and a scrape meanwhile is answered.
    let trickle = std::thread::spawn({
        let node = w.node.clone();
        move || {
            in_netns(&node, || {
                use std::io::Write;
                let mut s =
                    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\nX-Slow: ");
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(30) {
                    std::thread::sleep(Duration::from_millis(200));
                    if s.write_all(b"a").is_err() {
                        return Some(start.elapsed());
                    }
                }
                None
            })
        }
    });
    let (code, _, _) = http_request(&w.node, addr, get);
    assert_eq!(code, 200, "a scrape while a head trickles in");
    let cut = trickle.join().expect("the trickling client");
    assert!(cut.is_some(), "a head trickled for 30 s was never cut off");

    let status = watcher.stop();
    assert!(status.success(), "watcher exit {status:?}\n{}", logged());
    chain.del(&pod.att).unwrap();
}

// ---------------------------------------------------------------------------------------------

/// Without CAP_NET_ADMIN natguard's state cannot be read: all three outputs say so (exit 1),
/// and none of them reports networks or counters it could not see. Usage errors exit 2.
#[test]
fn unreadable_state_is_reported_not_guessed() {
    let h = Harness::new("cntperm");
    require_tools(&["setpriv"]);
    let ns = h.netns("node");
    // A copy nobody may execute, wherever the build directory is.
    let bin = h.dir().join("natguard");
    fs::copy(natguard_bin(), &bin).unwrap();
    fs::set_permissions(h.dir(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let as_nobody = |args: &[&str]| {
        let out = output(
            common::run::in_node_state(&mut ns.cmd("setpriv"), &ns)
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(&bin)
                .args(args),
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = as_nobody(&["status"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.starts_with("natguard: NOT READY: cannot read natguard's state: "),
        "{text}"
    );
    assert!(text.contains("EPERM"), "{text}");
    assert!(!text.contains("network"), "no claim about networks: {text}");
    let (code, json) = as_nobody(&["status", "--json"]);
    assert_eq!(code, Some(1), "{json}");
    let doc: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["ready"], false);
    assert!(
        doc["notReadyReason"].as_str().unwrap().contains("EPERM"),
        "{doc}"
    );
    assert_eq!(doc["networks"], json!([]));
    let (code, text) = as_nobody(&["metrics"]);
    assert_eq!(code, Some(1), "{text}");
    let metrics = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(sample(&metrics, "natguard_up", &[]), 0.0);
    let samples = |name: &str| {
        metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap()
            .samples
            .len()
    };
    assert_eq!(samples("natguard_networks"), 0, "{text}");
    assert_eq!(samples("natguard_per_pod_counters_available"), 0, "{text}");
    for args in [
        &["status", "--yaml"][..],
        &["status", "--json", "x"],
        &["metrics", "--json"],
    ] {
        let out =
            output(common::run::in_node_state(&mut ns.cmd(bin.to_str().unwrap()), &ns).args(args));
        assert_eq!(out.status.code(), Some(2), "natguard {args:?}");
        assert!(out.stdout.is_empty(), "natguard {args:?} printed a report");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("unknown argument") && err.contains("--help`") && err.lines().count() == 1,
            "natguard {args:?}: {err}"
        );
    }
}

/// Kernel APIs that answer are not natguard being installed: on a node without natguard's
/// table, `status` says "not installed", not "ready ... 0 network(s)", exits 1 (the node is
/// not guarded), and the JSON says `installed: false`; `ready` (and `natguard_up`) still say
/// the kernel answers, `natguard_guarded` says 0.
#[test]
fn a_node_without_natguard_is_not_installed() {
    let h = Harness::new("cntnone");
    let ns = h.netns("node");
    let tool = |args: &[&str]| common::run::Natguard::new().args(args).run_in(&ns);
    let out = tool(&["status"]);
    assert_eq!(out.exit, Some(1), "{}", out.stdout);
    let metrics = tool(&["metrics"]).stdout;
    assert!(metrics.lines().any(|l| l == "natguard_up 1"), "{metrics}");
    assert!(
        metrics.lines().any(|l| l == "natguard_guarded 0"),
        "{metrics}"
    );
    assert_eq!(
        out.stdout.lines().next(),
        Some(
            "natguard: not installed: no natguard table on this node (nf_tables and conntrack \
             netlink answer)"
        ),
        "{}",
        out.stdout
    );
    let doc: Value = serde_json::from_str(&tool(&["status", "--json"]).stdout).unwrap();
    assert_eq!(
        (&doc["ready"], &doc["installed"], &doc["guarding"]),
        (&json!(true), &json!(false), &json!(false))
    );
}
