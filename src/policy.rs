//! A pod's effective metadata policy: what its network and namespace impose, tightened (never
//! loosened) by the pod's own annotations.
//!
//! containerd and CRI-O pass a pod's annotations to a plugin that declares the capability
//! `io.kubernetes.cri.pod-annotations`, as `runtimeConfig["io.kubernetes.cri.pod-annotations"]`
//! (an object of strings). natguard reads the keys under its own prefix, `natguard.io/`, and
//! ignores every other annotation. One key is defined (docs/annotations.md):
//!
//! - `natguard.io/metadata: deny`: the pod's metadata TCP is reset, even where its network
//!   proxies it;
//! - `natguard.io/metadata: proxy`: the pod is intercepted, even in an exempt namespace (in a
//!   `deny` network it stays denied: that is stricter still);
//! - `natguard.io/metadata: exempt`: the pod asks for the exemption its namespace grants. It
//!   changes nothing unless the network sets `metadata.exemptRequiresAnnotation`, under which a
//!   pod of an exempt namespace is exempt only with it; outside an exempt namespace it is
//!   ignored.
//!
//! A pod author controls its own annotations, so an annotation can only make a pod stricter
//! than the network and namespace make it: the order is exempt < proxy < deny, and the effective
//! policy is the stricter of what is imposed and what is asked (the exemption is the one thing
//! that must be granted by both). An unknown `natguard.io/` key or value is refused with code 7,
//! naming both: a misspelt `deny` must not silently leave the pod as loose as before. In a
//! network with `metadata.mode: off` natguard installs no metadata rules, so `deny` and `proxy`
//! cannot be honoured there and are refused too (fail closed: the pod does not start without the
//! protection it asked for).
//!
//! Everything here is pure: [`parse`] reads the annotations of a runtimeConfig, [`decide`]
//! returns the effective [`Policy`] and where it came from ([`Source`]). The plan turns it into
//! set membership, so CHECK verifies it, and records the source in the pod's record when an
//! annotation decided, so `status` can say so.

use crate::config::{q, Config, EndpointMode, MetadataMode};
use crate::error::{Error, Result};
use serde_json::Value;

/// The runtimeConfig key (and capability) under which runtimes pass a pod's annotations.
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";
/// natguard's annotation prefix: every key under it must be one natguard knows.
pub const PREFIX: &str = "natguard.io/";
/// The one annotation natguard reads.
pub const METADATA_KEY: &str = "natguard.io/metadata";

/// What a pod asks for with `natguard.io/metadata`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Exempt,
    Proxy,
    Deny,
}

impl Request {
    pub const ALL: [Request; 3] = [Request::Exempt, Request::Proxy, Request::Deny];

    pub fn as_str(self) -> &'static str {
        match self {
            Request::Exempt => "exempt",
            Request::Proxy => "proxy",
            Request::Deny => "deny",
        }
    }
}

/// natguard's annotations of one pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Annotations {
    pub metadata: Option<Request>,
}

/// A pod's effective metadata policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The network installs no metadata rules (`metadata.mode: off`).
    Off,
    /// Reaches the real metadata API, on its own interface only.
    Exempt,
    /// DNATed to the node-local proxy (in a `deny` network: reset, see [`decide`]).
    Proxy,
    /// Reset.
    Deny,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Off => "off",
            Policy::Exempt => "exempt",
            Policy::Proxy => "proxy",
            Policy::Deny => "deny",
        }
    }

    pub fn parse(s: &str) -> Option<Policy> {
        [Policy::Off, Policy::Exempt, Policy::Proxy, Policy::Deny]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// What decided a pod's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The network's `metadata.mode` (and, for a withheld exemption, its
    /// `exemptRequiresAnnotation`).
    Network,
    /// `metadata.exemptNamespaces`.
    Namespace,
    /// The pod's `natguard.io/metadata` annotation.
    Annotation,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Network => "network",
            Source::Namespace => "namespace",
            Source::Annotation => "annotation",
        }
    }

    pub fn parse(s: &str) -> Option<Source> {
        [Source::Network, Source::Namespace, Source::Annotation]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// The effective policy and its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub policy: Policy,
    pub source: Source,
}

impl Decision {
    pub fn is_exempt(&self) -> bool {
        self.policy == Policy::Exempt
    }
}

/// natguard's annotations from a network configuration's `runtimeConfig` (absent: none).
/// Keys outside [`PREFIX`] are the cluster's and are ignored; under it, only [`METADATA_KEY`]
/// with one of its values is accepted.
pub fn parse(runtime_config: Option<&Value>) -> Result<Annotations> {
    let field = format!("runtimeConfig[{}]", q(POD_ANNOTATIONS_CAPABILITY));
    let Some(rc) = runtime_config else {
        return Ok(Annotations::default());
    };
    let Some(rc) = rc.as_object() else {
        // runtimeConfig is the runtime's; natguard only reads its own key from it.
        return Ok(Annotations::default());
    };
    let anns = match rc.get(POD_ANNOTATIONS_CAPABILITY) {
        None | Some(Value::Null) => return Ok(Annotations::default()),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(Error::InvalidConfig(format!(
                "{field}: expected an object of pod annotations, got {}",
                crate::config::type_name(other)
            )))
        }
    };
    let mut out = Annotations::default();
    for (k, v) in anns {
        if !k.starts_with(PREFIX) {
            continue;
        }
        let at = format!("pod annotation {}", q(k));
        if k != METADATA_KEY {
            return Err(Error::InvalidConfig(format!(
                "{at} (in {field}): unknown natguard annotation; the only one is {} (values {})",
                q(METADATA_KEY),
                values()
            )));
        }
        let Some(s) = v.as_str() else {
            return Err(Error::InvalidConfig(format!(
                "{at} (in {field}): expected a string, got {}",
                crate::config::type_name(v)
            )));
        };
        out.metadata = Some(
            Request::ALL
                .into_iter()
                .find(|r| r.as_str() == s)
                .ok_or_else(|| {
                    Error::InvalidConfig(format!("{at}: {} is not one of {}", q(s), values()))
                })?,
        );
    }
    Ok(out)
}

fn values() -> String {
    Request::ALL
        .iter()
        .map(|r| format!("\"{}\"", r.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Refuses an annotation that asks for protection the network cannot give (`deny` or `proxy`
/// where `metadata.mode` is `off`): code 7, naming the annotation.
pub fn refuse_unenforceable(cfg: &Config, ann: &Annotations) -> Result<()> {
    match ann.metadata {
        Some(r @ (Request::Deny | Request::Proxy)) if cfg.metadata.mode == MetadataMode::Off => {
            Err(Error::InvalidConfig(format!(
                "pod annotation {}: {} cannot be honoured: this network's metadata.mode is \"off\", so natguard installs no metadata rules for it",
                q(METADATA_KEY),
                q(r.as_str())
            )))
        }
        _ => Ok(()),
    }
}

/// The effective policy of a pod of `namespace` with `ann` in a network configured by `cfg`.
///
/// | network | namespace exempt | annotation | policy (source) |
/// |---|---|---|---|
/// | off | any | none, exempt | off (network) |
/// | proxy/deny | no | none, exempt | proxy/deny (network) |
/// | proxy/deny | yes | none | exempt (namespace), or the network's with `exemptRequiresAnnotation` |
/// | proxy/deny | yes | exempt | exempt (namespace) |
/// | proxy | any | proxy | proxy (annotation) |
/// | deny | any | proxy | deny (network if not exempt, else annotation) |
/// | proxy/deny | any | deny | deny (annotation, or network where the network already denies) |
///
/// (`deny` or `proxy` in an `off` network is refused by [`refuse_unenforceable`]; here it is
/// `off`.)
pub fn decide(cfg: &Config, namespace: Option<&str>, ann: &Annotations) -> Decision {
    let d = |policy, source| Decision { policy, source };
    // A network proxies only if one of its endpoints is `proxy`; with `deny` and `allow`
    // endpoints alone, what it imposes on a pod is `deny` (allow endpoints are not judged).
    let network = match cfg.metadata.mode {
        MetadataMode::Off => return d(Policy::Off, Source::Network),
        MetadataMode::Proxy if cfg.metadata.has(EndpointMode::Proxy) => Policy::Proxy,
        MetadataMode::Proxy | MetadataMode::Deny => Policy::Deny,
    };
    let ns_exempt =
        namespace.is_some_and(|ns| cfg.metadata.exempt_namespaces.iter().any(|e| e == ns));
    let imposed = if ns_exempt
        && (!cfg.metadata.exempt_requires_annotation || ann.metadata == Some(Request::Exempt))
    {
        d(Policy::Exempt, Source::Namespace)
    } else {
        d(network, Source::Network)
    };
    let asked = match ann.metadata {
        None | Some(Request::Exempt) => return imposed,
        Some(Request::Proxy) => Policy::Proxy,
        Some(Request::Deny) => Policy::Deny,
    };
    // The network's mode caps what proxying can mean: a deny network resets instead.
    let asked = if asked == Policy::Proxy && network == Policy::Deny {
        Policy::Deny
    } else {
        asked
    };
    if rank(asked) > rank(imposed.policy) {
        d(asked, Source::Annotation)
    } else {
        imposed
    }
}

fn rank(p: Policy) -> u8 {
    match p {
        Policy::Off => 0,
        Policy::Exempt => 1,
        Policy::Proxy => 2,
        Policy::Deny => 3,
    }
}

/// The token a pod's record carries when an annotation decided its policy (`pol=deny`), so
/// `status` can tell it from the network's; `None` otherwise (the record is then as before).
pub fn record_token(d: &Decision) -> Option<String> {
    (d.source == Source::Annotation).then(|| format!("pol={}", d.policy.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(mode: MetadataMode, requires: bool) -> Config {
        let mut c = Config::default();
        c.metadata.mode = mode;
        c.metadata.exempt_namespaces = vec!["kube-system".into()];
        c.metadata.exempt_requires_annotation = requires;
        c
    }

    fn ann(r: Option<Request>) -> Annotations {
        Annotations { metadata: r }
    }

    fn rc(anns: Value) -> Value {
        json!({ "portMappings": [], POD_ANNOTATIONS_CAPABILITY: anns })
    }

    #[test]
    fn annotations_parse_strictly_under_the_prefix_only() {
        assert_eq!(parse(None).unwrap(), Annotations::default());
        assert_eq!(parse(Some(&json!({}))).unwrap(), Annotations::default());
        assert_eq!(parse(Some(&json!("x"))).unwrap(), Annotations::default());
        let a = parse(Some(&rc(json!({
            "io.kubernetes.pod.name": "web",
            "natguard.iox/whatever": "x",
            "natguard.io/metadata": "deny",
        }))))
        .unwrap();
        assert_eq!(a.metadata, Some(Request::Deny));
        for r in Request::ALL {
            let a = parse(Some(&rc(json!({ METADATA_KEY: r.as_str() })))).unwrap();
            assert_eq!(a.metadata, Some(r));
        }
        let refused = [
            (
                json!({"natguard.io/metadata": "Deny"}),
                "\"Deny\" is not one of",
            ),
            (json!({"natguard.io/metadata": "allow"}), "\"allow\""),
            (json!({"natguard.io/metadata": true}), "expected a string"),
            (
                json!({"natguard.io/metdata": "deny"}),
                "\"natguard.io/metdata\"",
            ),
            (
                json!({"natguard.io/": "deny"}),
                "unknown natguard annotation",
            ),
        ];
        for (anns, needle) in refused {
            let e = parse(Some(&rc(anns.clone()))).unwrap_err();
            assert_eq!(e.code(), 7, "{anns}: {e}");
            let m = e.to_string();
            assert!(m.contains(needle), "{anns}: {m}");
            assert!(m.contains("pod annotation"), "{anns}: {m}");
        }
        let e = parse(Some(&rc(json!(["natguard.io/metadata"])))).unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains(POD_ANNOTATIONS_CAPABILITY), "{e}");
    }

    #[test]
    fn annotations_tighten_and_never_loosen() {
        use MetadataMode::{Deny as MD, Off as MO, Proxy as MP};
        use Policy::*;
        use Request as R;
        use Source::*;
        // (mode, requires annotation, namespace, annotation) -> (policy, source)
        type Row = (MetadataMode, bool, &'static str, Option<R>, Policy, Source);
        let table: &[Row] = &[
            (MP, false, "default", None, Proxy, Network),
            (MP, false, "default", Some(R::Exempt), Proxy, Network),
            (MP, false, "default", Some(R::Proxy), Proxy, Network),
            (MP, false, "default", Some(R::Deny), Deny, Annotation),
            (MP, false, "kube-system", None, Exempt, Namespace),
            (MP, false, "kube-system", Some(R::Exempt), Exempt, Namespace),
            (MP, false, "kube-system", Some(R::Proxy), Proxy, Annotation),
            (MP, false, "kube-system", Some(R::Deny), Deny, Annotation),
            (MP, true, "kube-system", None, Proxy, Network),
            (MP, true, "kube-system", Some(R::Exempt), Exempt, Namespace),
            (MP, true, "default", Some(R::Exempt), Proxy, Network),
            (MD, false, "default", None, Deny, Network),
            (MD, false, "default", Some(R::Proxy), Deny, Network),
            (MD, false, "default", Some(R::Deny), Deny, Network),
            (MD, false, "kube-system", None, Exempt, Namespace),
            (MD, false, "kube-system", Some(R::Proxy), Deny, Annotation),
            (MD, true, "kube-system", None, Deny, Network),
            (MO, false, "default", None, Off, Network),
            (MO, false, "kube-system", Some(R::Exempt), Off, Network),
        ];
        for &(mode, requires, ns, a, policy, source) in table {
            let d = decide(&cfg(mode, requires), Some(ns), &ann(a));
            assert_eq!(
                (d.policy, d.source),
                (policy, source),
                "{mode:?} requires={requires} {ns} {a:?}"
            );
        }
        // No namespace (podman, ctr): never exempt.
        let d = decide(&cfg(MP, false), None, &ann(Some(R::Exempt)));
        assert_eq!((d.policy, d.source), (Proxy, Network));
        // Loosening is impossible: for every input, the annotated policy is at least as
        // strict as the unannotated one (off networks aside).
        for mode in [MP, MD] {
            for requires in [false, true] {
                for ns in ["default", "kube-system"] {
                    let c = cfg(mode, requires);
                    let base = decide(&c, Some(ns), &ann(None)).policy;
                    for r in [R::Proxy, R::Deny] {
                        let p = decide(&c, Some(ns), &ann(Some(r))).policy;
                        assert!(rank(p) >= rank(base), "{mode:?} {ns} {r:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn tightening_an_off_network_is_refused() {
        let c = cfg(MetadataMode::Off, false);
        for r in [Request::Deny, Request::Proxy] {
            let e = refuse_unenforceable(&c, &ann(Some(r))).unwrap_err();
            assert_eq!(e.code(), 7);
            assert!(e.to_string().contains(METADATA_KEY), "{e}");
            assert!(e.to_string().contains(r.as_str()), "{e}");
        }
        refuse_unenforceable(&c, &ann(Some(Request::Exempt))).unwrap();
        refuse_unenforceable(&cfg(MetadataMode::Proxy, false), &ann(Some(Request::Deny))).unwrap();
    }

    #[test]
    fn only_an_annotation_s_decision_is_recorded() {
        let d = |policy, source| Decision { policy, source };
        assert_eq!(
            record_token(&d(Policy::Deny, Source::Annotation)).as_deref(),
            Some("pol=deny")
        );
        assert_eq!(record_token(&d(Policy::Exempt, Source::Namespace)), None);
        assert_eq!(record_token(&d(Policy::Proxy, Source::Network)), None);
        for p in ["off", "exempt", "proxy", "deny"] {
            assert_eq!(Policy::parse(p).unwrap().as_str(), p);
        }
        for s in ["network", "namespace", "annotation"] {
            assert_eq!(Source::parse(s).unwrap().as_str(), s);
        }
    }
    #[test]
    fn the_plan_follows_the_decision_and_records_it() {
        use crate::plan::{
            plan_pod, policy_from_comment, who_from_comment, Family, HostSide, IfName, Key, PodRef,
            SetKind,
        };
        let c = cfg(MetadataMode::Proxy, false);
        let a: std::net::IpAddr = "10.1.0.5".parse().unwrap();
        let plan = |ns: &str, r: Option<Request>| {
            plan_pod(
                &c,
                &PodRef {
                    network: "n",
                    container_id: "cid",
                    ifname: "eth0",
                    namespace: Some(ns),
                    pod_name: Some("p"),
                    netns: "/run/netns/p",
                    annotations: ann(r),
                    host: Some(HostSide {
                        iface: IfName::new("cni0").unwrap(),
                        port: None,
                        mac: None,
                        bridge: None,
                    }),
                },
                &[a],
            )
        };
        let meta = (
            SetKind::Redir(Family::V4),
            Key::IfAddr(IfName::new("cni0").unwrap(), a),
        );
        let has = |p: &crate::plan::PodPlan, kind: fn(Family) -> SetKind| {
            p.present.iter().any(|(k, _)| *k == kind(Family::V4))
        };
        // deny in a proxy network: neither DNATed nor exempt, recorded.
        let p = plan("default", Some(Request::Deny));
        assert!(
            p.absent.contains(&meta) && !has(&p, SetKind::Exempt),
            "{p:?}"
        );
        assert!(!has(&p, SetKind::RedirCount));
        assert_eq!(policy_from_comment(&p.comment), Some("deny"));
        assert_eq!(who_from_comment(&p.comment), "default/p");
        // proxy in an exempt namespace: intercepted, not exempt.
        let p = plan("kube-system", Some(Request::Proxy));
        assert!(
            p.present.contains(&meta) && !has(&p, SetKind::Exempt),
            "{p:?}"
        );
        assert_eq!(policy_from_comment(&p.comment), Some("proxy"));
        // No annotation: as before, nothing recorded.
        let p = plan("kube-system", None);
        assert!(has(&p, SetKind::Exempt) && p.absent.contains(&meta));
        assert_eq!(policy_from_comment(&p.comment), None);
        assert_eq!(p.comment, "10.1.0.5 kube-system/p cid=cid if=eth0");
    }
}
