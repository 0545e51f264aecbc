//! `install --watch --metrics-port`: natguard's metrics over HTTP, for a Prometheus scrape (a
//! PodMonitor, a ServiceMonitor or a static scrape config), next to the textfile of
//! `--metrics-file`.
//!
//! The server is the metadata proxy's HTTP serving ([`crate::proxy::http`]): hyper on a
//! current-thread runtime of a thread of its own, so nothing it does (a slow client, a scrape
//! of a node with many pods) ever holds up the watcher's loop, its self-repair or the proxy.
//! Connections are served concurrently, each a task: an idle client holds a descriptor, not
//! the server, so a pod holding connections open never delays a scrape. [`LIMITS`] caps them
//! in all and per source (a connection over a cap is closed at once); each request head must
//! arrive within [`IO_TIMEOUT`] and fit in [`MAX_REQUEST`] bytes; one request per connection.
//! Only `GET /metrics` (and `HEAD`) is served, with `200` and the same text `natguard metrics`
//! prints, less the per-pod series unless `--metrics-pod-labels` asks for them (they name every
//! pod); any other path is `404`, any other method `405`. The metrics are collected at each
//! scrape on tokio's blocking pool, as the `metrics` command does, so a scrape sees the
//! kernel's counters of that moment.
//!
//! Pods are not served ([`pod_side`]): a request whose source the node routes back to through
//! a veth or a bridge (a pod's host side or pods' bridge, whatever the CNI) that carries none
//! of the node's default routes is answered `403`, unless `--metrics-allow` names the source;
//! the node itself (loopback, its own addresses) and whatever lies beyond its uplinks (the
//! interfaces of its default routes, a veth or a bridge too on a node that is a container or
//! bridges its NIC), NICs, tunnels and VLANs (other nodes, a remote Prometheus) are served. The route back is
//! what the source's TCP handshake went through, so a pod cannot pass for a remote source by
//! spoofing one: the handshake's answer would not reach it. A source whose route cannot be
//! looked up is refused (fail closed).

use crate::addr::Cidr;
use crate::error::{Error, Result};
use crate::kernel::link::Links;
use crate::proxy::http::{self, text, Limits};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// How long a client may take to send its request head.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request head read; a scrape sends a few hundred bytes.
pub(crate) const MAX_REQUEST: usize = 8 * 1024;
/// The Prometheus text format's content type.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The scrape endpoint's bounds: a few scrapers, never starved by one source.
const LIMITS: Limits = Limits {
    max_conns: 1024,
    per_source: 64,
    header_timeout: IO_TIMEOUT,
    lifetime: Duration::from_secs(60),
    max_head: MAX_REQUEST,
    // One scrape per connection (`Connection: close`), as scrapers expect of a small endpoint.
    keep_alive: false,
};

/// Binds `addr` and answers scrapes on a thread of its own from then on; sources in `allow`
/// are served wherever they are.
pub(crate) fn start(addr: SocketAddr, pod_labels: bool, allow: Vec<Cidr>) -> Result<()> {
    // Bound here, so a port that is taken is the caller's error at once.
    let std_listener = std::net::TcpListener::bind(addr)
        .map_err(|e| Error::io(format!("--metrics-port: listening on {addr}"), e))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("--metrics-port: a non-blocking listener", e))?;
    let bound = std_listener.local_addr().unwrap_or(addr);
    http::spawn("metrics-http", move || async move {
        let listener = match tokio::net::TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                crate::warn!("metrics endpoint: {e}");
                return;
            }
        };
        let allow = Arc::new(allow);
        let handler: http::Handler = Arc::new(move |req, conn| {
            Box::pin(answer(
                req.method().clone(),
                req.uri().path().to_string(),
                pod_labels,
                conn.peer,
                allow.clone(),
            ))
        });
        http::serve(listener, LIMITS, handler, |_| None).await;
    })
    .map_err(|e| Error::io("--metrics-port: starting its thread", e))?;
    crate::info!("serving metrics on http://{bound}/metrics");
    Ok(())
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    MethodNotAllowed,
}

fn route(method: &str, path: &str) -> Route {
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics { head_only: false },
        ("HEAD", "/metrics") => Route::Metrics { head_only: true },
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::MethodNotAllowed,
    }
}

/// Why `peer` is refused as a pod, or `None` when it is served: see the module's docs.
fn pod_side(from: SocketAddr, allow: &[Cidr]) -> Option<String> {
    let peer = match from.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(from.ip(), IpAddr::V4),
        v4 => v4,
    };
    // An IPv6 link-local source is routed by the interface it came in on (its scope), not
    // by the routing table.
    let scope = match from {
        SocketAddr::V6(v6) if v6.ip().segments()[0] & 0xffc0 == 0xfe80 => Some(v6.scope_id()),
        _ => None,
    };
    if peer.is_loopback()
        || allow
            .iter()
            .any(|c| crate::addr::contains(c.addr, c.prefix, peer))
    {
        return None;
    }
    let look = || -> Result<Option<String>> {
        let mut links = Links::open()?;
        let oif = match scope {
            Some(index) => match links.link_by_index(index)? {
                Some((name, _)) => Some(name),
                None => return Ok(Some(format!("{peer}'s interface (index {index}) is gone"))),
            },
            None if links.is_local(peer)? => return Ok(None),
            None => links.route_oif(peer)?,
        };
        let Some(oif) = oif else {
            return Ok(Some(format!("the node has no route back to {peer}")));
        };
        let Some(link) = links.link(&oif)? else {
            return Ok(Some(format!("{oif}, the way back to {peer}, is gone")));
        };
        // The node's default routes leave by its uplinks: a bridge that carries one (a NIC
        // enslaved to it) or a veth that does (a node that is a container) is the way to the
        // network, not to pods.
        let uplinks = links.default_route_oifs()?;
        Ok(judge_way_back(
            peer,
            &oif,
            link.kind.as_deref(),
            link.is_bridge,
            &uplinks,
        ))
    };
    match look() {
        Ok(why) => why,
        Err(e) => Some(format!("cannot tell whether {peer} is a pod ({e})")),
    }
}

/// Whether the way back to `peer`, interface `oif` (of `kind`), is a pod's host side.
fn judge_way_back(
    peer: IpAddr,
    oif: &str,
    kind: Option<&str>,
    is_bridge: bool,
    uplinks: &[String],
) -> Option<String> {
    if uplinks.iter().any(|u| u == oif) {
        return None;
    }
    if kind == Some("veth") {
        return Some(format!(
            "{peer} is behind {oif}, a veth that carries none of the node's default routes: a pod's host side"
        ));
    }
    if is_bridge {
        return Some(format!(
            "{peer} is behind {oif}, a bridge that carries none of the node's default routes: pods' bridge"
        ));
    }
    None
}

async fn answer(
    method: hyper::Method,
    path: String,
    pod_labels: bool,
    peer: SocketAddr,
    allow: Arc<Vec<Cidr>>,
) -> http::Reply {
    let refused = tokio::task::spawn_blocking(move || pod_side(peer, &allow))
        .await
        .unwrap_or_else(|_| Some(format!("cannot tell whether {} is a pod", peer.ip())));
    if let Some(why) = refused {
        return text(
            403,
            format!(
                "natguard serves its metrics to no pod ({why}; --metrics-allow admits a source)\n"
            ),
        );
    }
    match route(method.as_str(), &path) {
        Route::Metrics { head_only } => {
            let body = tokio::task::spawn_blocking(move || {
                crate::tools::metrics::exposition_for_scrape(pod_labels)
            })
            .await
            .unwrap_or_default();
            let len = body.len();
            let mut r = text(200, if head_only { String::new() } else { body });
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(CONTENT_TYPE),
            );
            if head_only {
                r.headers_mut()
                    .insert(hyper::header::CONTENT_LENGTH, len.into());
            }
            r
        }
        Route::NotFound => text(404, "natguard serves GET /metrics only\n"),
        Route::MethodNotAllowed => {
            let mut r = text(405, "natguard serves GET /metrics only\n");
            r.headers_mut().insert(
                hyper::header::ALLOW,
                hyper::header::HeaderValue::from_static("GET, HEAD"),
            );
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_metrics_is_served() {
        assert_eq!(
            route("GET", "/metrics"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route("HEAD", "/metrics"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(route("GET", "/"), Route::NotFound);
        assert_eq!(route("GET", "/metricsx"), Route::NotFound);
        assert_eq!(route("POST", "/metrics"), Route::MethodNotAllowed);
    }

    #[test]
    fn pods_host_sides_are_refused_and_the_ways_beyond_the_node_are_served() {
        let p: IpAddr = "10.1.2.3".parse().unwrap();
        let up = ["eth0".to_string(), "br0".to_string()];
        // A veth is a pod's host side, whatever the CNI calls it.
        for oif in ["veth1234", "cali5678", "lxcabc", "eni9"] {
            assert!(judge_way_back(p, oif, Some("veth"), false, &up).is_some());
        }
        // A bridge without a default route is pods' bridge; one with it is the uplink.
        assert!(judge_way_back(p, "cni0", Some("bridge"), true, &up)
            .is_some_and(|w| w.contains("cni0")));
        assert!(judge_way_back(p, "br0", Some("bridge"), true, &up).is_none());
        // A node that is a container: its uplink is a veth.
        let kind_node = ["eth0".to_string()];
        assert!(judge_way_back(p, "eth0", Some("veth"), false, &kind_node).is_none());
        assert!(judge_way_back(p, "veth1", Some("veth"), false, &kind_node).is_some());
        // NICs, VLANs, tunnels: beyond the node.
        for (oif, kind) in [
            ("eth0", None),
            ("eth0.100", Some("vlan")),
            ("flannel.1", Some("vxlan")),
            ("tunl0", Some("ipip")),
            ("wg0", Some("wireguard")),
        ] {
            assert_eq!(judge_way_back(p, oif, kind, false, &up), None, "{oif}");
        }
        // Loopback and allowed sources need no lookup.
        let at = |a: &str| SocketAddr::new(a.parse().unwrap(), 40000);
        assert_eq!(pod_side(at("127.0.0.1"), &[]), None);
        assert_eq!(pod_side(at("::ffff:127.0.0.1"), &[]), None);
        let allowed = [Cidr::parse("10.1.2.0/24").unwrap()];
        assert_eq!(pod_side(SocketAddr::new(p, 40000), &allowed), None);
        // A link-local source without its interface cannot be placed: refused.
        assert!(pod_side(at("fe80::1"), &[]).is_some_and(|w| w.contains("fe80::1")));
    }
}
