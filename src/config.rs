//! natguard's configuration: the plugin's entry in a conflist, parsed strictly once.
//!
//! This module parses natguard's own sections of the network configuration (`metadata`,
//! `masquerade`, `conntrack`, and the log fields `logFile`, `logLevel`, `logFileMaxSize`, `logFormat`); the
//! CNI keys around them are [`crate::cni::netconf`]'s. Every natguard field is optional and has
//! the default documented in the README. Unknown keys inside natguard's sections are rejected,
//! because a misspelt `nonMasqueradeCidrs` silently falling back to defaults would change who
//! gets masqueraded.
//!
//! The metadata endpoints are one list of (address, ports, mode) whatever the config says:
//! today's `addresses` × `ports` with one `mode`, or a cloud preset ([`crate::clouds`])
//! overridden by explicit `endpoints`, so the plan has one shape to turn into sets. Conflicts
//! (one address and port with two modes, a proxy that is an endpoint) are refused here.
//!
//! Errors name the field path and the offending value; downstream code never re-validates.

pub use crate::addr::Cidr;
use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

/// The most entries natguard accepts in each config list (README, "Limits"). Every ADD reads
/// the network's shared sets back to compare them with the config, so their size is paid on
/// every pod start: at these limits about 8 ms more than with the defaults (measured on 2
/// vCPUs), with room far beyond real configs. Element lists of any of these sizes are split
/// across netlink messages (`kernel::lower::set_elems`). A longer list is refused with code 7,
/// naming the field and the limit.
pub const MAX_NON_MASQUERADE_CIDRS: usize = 4096;
pub const MAX_METADATA_PORTS: usize = 1024;
pub const MAX_METADATA_ADDRESSES: usize = 64;
pub const MAX_EXEMPT_NAMESPACES: usize = 1024;
/// At most this many `metadata.allowInterfaces`.
pub const MAX_ALLOW_INTERFACES: usize = 64;

/// At most this many address and port pairs in a network's endpoint list (`metadata.addresses`
/// times `metadata.ports`, or the ports of every `metadata.endpoints` entry): each pair is one
/// element of the network's and the node's endpoint sets.
pub const MAX_METADATA_PAIRS: usize = 4096;

pub use crate::clouds::{Cloud, EndpointMode, PresetChoice};

/// Why `proxy` can never be a network's proxy, if it cannot: one of the network's own
/// endpoints, or a known cloud credential endpoint ([`crate::clouds::CATALOGUE`]).
pub fn not_a_proxy(proxy: IpAddr, addresses: &[IpAddr]) -> Option<String> {
    if addresses.contains(&proxy) {
        return Some("is one of the network's metadata endpoints (metadata.addresses, metadata.endpoints or metadata.preset)".into());
    }
    crate::clouds::well_known(proxy).map(|what| format!("is a metadata endpoint ({what})"))
}

/// Refuses a list longer than `max`, before its entries are parsed.
fn check_len(path: &str, arr: &[Value], max: usize) -> Result<()> {
    if arr.len() > max {
        return Err(cfg_err(format!(
            "{path}: {} entries are more than natguard accepts (at most {max})",
            arr.len()
        )));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataMode {
    /// DNAT metadata TCP traffic to the node-local proxy.
    Proxy,
    /// Reject metadata TCP traffic with a TCP reset.
    Deny,
    /// Leave metadata traffic alone.
    Off,
}

impl MetadataMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MetadataMode::Proxy => "proxy",
            MetadataMode::Deny => "deny",
            MetadataMode::Off => "off",
        }
    }
}

/// A proxy address: the node's own primary address of the family, or a fixed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyAddr<T> {
    Auto,
    Fixed(T),
}

impl<T> ProxyAddr<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> ProxyAddr<U> {
        match self {
            ProxyAddr::Auto => ProxyAddr::Auto,
            ProxyAddr::Fixed(a) => ProxyAddr::Fixed(f(a)),
        }
    }
}

fn fixed<T>(p: ProxyAddr<T>) -> Option<T> {
    match p {
        ProxyAddr::Fixed(a) => Some(a),
        ProxyAddr::Auto => None,
    }
}

/// One credential endpoint of a network: an address, its TCP ports, and what natguard does
/// with a pod's TCP to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub address: IpAddr,
    pub ports: Vec<u16>,
    pub mode: EndpointMode,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// `off` switches every endpoint off; `deny` makes every endpoint that would be proxied
    /// denied; `proxy` leaves each endpoint its own mode. It is also the mode of the
    /// `addresses` × `ports` list and of an `endpoints` entry that names none.
    pub mode: MetadataMode,
    /// Every endpoint address (derived from `endpoints`): a pod may not have one, and a proxy
    /// may not be one.
    pub addresses: Vec<IpAddr>,
    /// Every endpoint port (derived from `endpoints`).
    pub ports: Vec<u16>,
    /// The endpoints and their modes: `metadata.addresses` × `metadata.ports` with
    /// `metadata.mode` (today's fields), or `metadata.preset` overridden by
    /// `metadata.endpoints`.
    pub endpoints: Vec<Endpoint>,
    /// `metadata.preset`, and for `auto` what the DMI strings said.
    pub preset: Option<PresetChoice>,
    pub proxy_port: u16,
    pub proxy_ipv4: ProxyAddr<Ipv4Addr>,
    pub proxy_ipv6: ProxyAddr<Ipv6Addr>,
    pub exempt_namespaces: Vec<String>,
    /// `exemptRequiresAnnotation`: a pod of an exempt namespace is exempt only if it also
    /// carries `natguard.io/metadata: exempt` (see [`crate::policy`]).
    pub exempt_requires_annotation: bool,
    /// Log denied attempts to the kernel log, rate-limited, with a fixed prefix.
    pub log_denied: bool,
    /// `acceptUnenforced`: ADD accepts a pod whose interface is not a veth (macvlan, ipvlan,
    /// a moved host device, an SR-IOV VF), whose traffic never crosses this node's netfilter,
    /// so natguard cannot enforce anything for it. Off by default: such a pod is refused.
    pub accept_unenforced: bool,
    /// `allowInterfaces`: interfaces whose metadata TCP the node-wide guard lets through to
    /// the real API (containers on a bridge no CNI network manages). Empty by default.
    pub allow_interfaces: Vec<crate::ifname::IfName>,
    /// `serveProxy`: `install --watch` serves natguard's own metadata proxy at the proxy
    /// addresses and port (on by default); `false` leaves the port to an external proxy.
    pub serve_proxy: bool,
    /// `proxyCloud`: whose metadata API the proxy speaks; `None` (`auto`): the preset's
    /// cloud, else the one the DMI strings name.
    pub proxy_cloud: Option<Cloud>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masquerade {
    /// `enabled`: the exceptions. Traffic of the network's pods to `nonMasqueradeCIDRs` keeps
    /// the pod's address, even where another component would masquerade it.
    pub enabled: bool,
    /// `masqueradeOutside`: natguard's own MASQUERADE of everything else (to the node's
    /// address, as ip-masq-agent does). Off by default: installing natguard changes no pod's
    /// egress beyond the exceptions; the primary plugin and other components decide.
    pub masquerade_outside: bool,
    pub non_masquerade_cidrs: Vec<Cidr>,
    pub masq_link_local: bool,
    pub masq_link_local_ipv6: bool,
    pub random_fully: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conntrack {
    pub flush_on_add: bool,
}

/// natguard's own configuration, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub metadata: Metadata,
    pub masquerade: Masquerade,
    pub conntrack: Conntrack,
    pub log_file: Option<PathBuf>,
    /// `logLevel`: the lowest level written to `logFile`.
    pub log_level: crate::log::Level,
    /// `logFileMaxSize`: bytes after which `logFile` is rotated to `logFile.1`.
    pub log_file_max_size: u64,
    /// `logFormat`: `text` (default) or `json` lines, in `logFile` and on stderr.
    pub log_format: crate::log::Format,
}

pub const DEFAULT_NON_MASQUERADE_CIDRS: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "240.0.0.0/4",
];

impl Default for Config {
    fn default() -> Self {
        Config {
            metadata: Metadata {
                mode: MetadataMode::Proxy,
                addresses: vec![
                    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
                    "fd00:ec2::254".parse().unwrap(),
                ],
                ports: vec![80],
                endpoints: default_endpoints(MetadataMode::Proxy),
                preset: None,
                proxy_port: 8181,
                proxy_ipv4: ProxyAddr::Auto,
                proxy_ipv6: ProxyAddr::Auto,
                exempt_namespaces: Vec::new(),
                exempt_requires_annotation: false,
                log_denied: false,
                accept_unenforced: false,
                allow_interfaces: Vec::new(),
                serve_proxy: true,
                proxy_cloud: None,
            },
            masquerade: Masquerade {
                enabled: true,
                masquerade_outside: false,
                non_masquerade_cidrs: DEFAULT_NON_MASQUERADE_CIDRS
                    .iter()
                    .map(|s| Cidr::parse(s).unwrap())
                    .collect(),
                masq_link_local: false,
                masq_link_local_ipv6: false,
                random_fully: true,
            },
            conntrack: Conntrack { flush_on_add: true },
            log_file: None,
            log_level: crate::log::DEFAULT_LEVEL,
            log_file_max_size: crate::log::DEFAULT_MAX_SIZE,
            log_format: crate::log::Format::Text,
        }
    }
}

/// The endpoints of a config that names none: the instance metadata service on both families.
fn default_endpoints(mode: MetadataMode) -> Vec<Endpoint> {
    legacy_endpoints(
        &[
            IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
        ],
        &[80],
        mode,
    )
}

/// `metadata.addresses` × `metadata.ports`, all with `metadata.mode`.
fn legacy_endpoints(addresses: &[IpAddr], ports: &[u16], mode: MetadataMode) -> Vec<Endpoint> {
    addresses
        .iter()
        .map(|a| Endpoint {
            address: *a,
            ports: ports.to_vec(),
            mode: endpoint_mode(mode),
        })
        .collect()
}

/// The endpoint mode a network's `metadata.mode` gives an endpoint that names none (`off`
/// switches every endpoint off, whatever its mode).
fn endpoint_mode(mode: MetadataMode) -> EndpointMode {
    match mode {
        MetadataMode::Deny => EndpointMode::Deny,
        MetadataMode::Proxy | MetadataMode::Off => EndpointMode::Proxy,
    }
}

impl Metadata {
    /// Whether any endpoint has `mode` (and the network is not `off`).
    pub fn has(&self, mode: EndpointMode) -> bool {
        self.mode != MetadataMode::Off && self.endpoints.iter().any(|e| e.mode == mode)
    }
    /// The (address, port) pairs of the endpoints with one of `modes` (none when `off`).
    pub fn pairs<'a>(
        &'a self,
        modes: &'a [EndpointMode],
    ) -> impl Iterator<Item = (IpAddr, u16)> + 'a {
        self.endpoints
            .iter()
            .filter(move |e| self.mode != MetadataMode::Off && modes.contains(&e.mode))
            .flat_map(|e| e.ports.iter().map(move |p| (e.address, *p)))
    }
}

/// A user string quoted for an error message, cut so replies stay small whatever the input.
pub(crate) fn q(s: &str) -> String {
    format!("{:?}", crate::error::truncate(s, 80))
}

pub(crate) fn cfg_err(msg: String) -> Error {
    Error::InvalidConfig(msg)
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A short, printable rendering of a bad value for error messages.
pub(crate) fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let mut cut = 77;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}...", &s[..cut])
    } else {
        s
    }
}

pub(crate) fn expect_bool(path: &str, v: &Value) -> Result<bool> {
    v.as_bool().ok_or_else(|| {
        cfg_err(format!(
            "{path}: expected true or false, got {} {}",
            type_name(v),
            show(v)
        ))
    })
}

pub(crate) fn expect_str<'a>(path: &str, v: &'a Value) -> Result<&'a str> {
    v.as_str().ok_or_else(|| {
        cfg_err(format!(
            "{path}: expected a string, got {} {}",
            type_name(v),
            show(v)
        ))
    })
}

pub(crate) fn expect_array<'a>(path: &str, v: &'a Value) -> Result<&'a Vec<Value>> {
    v.as_array().ok_or_else(|| {
        cfg_err(format!(
            "{path}: expected an array, got {} {}",
            type_name(v),
            show(v)
        ))
    })
}

pub(crate) fn expect_port(path: &str, v: &Value) -> Result<u16> {
    match v.as_u64() {
        Some(p) if (1..=65535).contains(&p) => Ok(p as u16),
        _ => Err(cfg_err(format!(
            "{path}: {} is not a valid port (an integer from 1 to 65535)",
            show(v)
        ))),
    }
}

pub(crate) fn expect_object<'a>(path: &str, v: &'a Value) -> Result<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| {
        cfg_err(format!(
            "{path}: expected an object, got {} {}",
            type_name(v),
            show(v)
        ))
    })
}

pub(crate) fn reject_unknown(path: &str, obj: &Map<String, Value>, known: &[&str]) -> Result<()> {
    for k in obj.keys() {
        if !known.contains(&k.as_str()) {
            return Err(cfg_err(format!(
                "{path}.{k}: unknown field (known fields: {})",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

/// Kubernetes namespace names are DNS-1123 labels.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Parses natguard's sections out of a plugin entry (the whole stdin object or a conflist
/// entry). Top-level keys other than natguard's are ignored.
pub fn parse_plugin_config(v: &Value) -> Result<Config> {
    parse_plugin_config_with(v, &crate::clouds::Dmi::read)
}

/// [`parse_plugin_config`] with the node's DMI strings from `dmi`, which is called only for
/// `metadata.preset: "auto"`.
pub fn parse_plugin_config_with(v: &Value, dmi: &dyn Fn() -> crate::clouds::Dmi) -> Result<Config> {
    let obj = expect_object("config", v)?;
    let mut c = Config::default();
    if let Some(m) = obj.get("metadata") {
        parse_metadata(m, &mut c.metadata, dmi)?;
    }
    if let Some(m) = obj.get("masquerade") {
        parse_masquerade(m, &mut c.masquerade)?;
    }
    if let Some(ct) = obj.get("conntrack") {
        let o = expect_object("conntrack", ct)?;
        reject_unknown("conntrack", o, &["flushOnAdd"])?;
        if let Some(f) = o.get("flushOnAdd") {
            c.conntrack.flush_on_add = expect_bool("conntrack.flushOnAdd", f)?;
        }
    }
    if let Some(l) = obj.get("logFile") {
        let s = expect_str("logFile", l)?;
        if !s.is_empty() {
            if !s.starts_with('/') || s.contains('\0') {
                return Err(cfg_err(format!(
                    "logFile: {} is not an absolute path",
                    q(s)
                )));
            }
            c.log_file = Some(PathBuf::from(s));
        }
    }
    if let Some(l) = obj.get("logLevel") {
        c.log_level = l
            .as_str()
            .and_then(crate::log::Level::from_name)
            .ok_or_else(|| {
                cfg_err(format!(
                    "logLevel: {} is not one of error, warn, info, debug",
                    show(l)
                ))
            })?;
    }
    if let Some(f) = obj.get("logFormat") {
        c.log_format = f
            .as_str()
            .and_then(crate::log::Format::from_name)
            .ok_or_else(|| cfg_err(format!("logFormat: {} is not one of text, json", show(f))))?;
    }
    if let Some(m) = obj.get("logFileMaxSize") {
        use crate::log::{MAX_MAX_SIZE, MIN_MAX_SIZE};
        c.log_file_max_size = m
            .as_u64()
            .filter(|n| (MIN_MAX_SIZE..=MAX_MAX_SIZE).contains(n))
            .ok_or_else(|| {
                cfg_err(format!(
                    "logFileMaxSize: {} is not a valid size (an integer number of bytes from {MIN_MAX_SIZE} to {MAX_MAX_SIZE})",
                    show(m)
                ))
            })?;
    }
    Ok(c)
}

/// A metadata address: any unicast address but loopback, and no v4-mapped IPv6 form.
fn parse_metadata_address(p: &str, a: &Value) -> Result<IpAddr> {
    let s = expect_str(p, a)?;
    let ip: IpAddr = s
        .parse()
        .map_err(|_| cfg_err(format!("{p}: {} is not an IP address", q(s))))?;
    if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
        return Err(cfg_err(format!(
            "{p}: {} cannot be a metadata address",
            q(s)
        )));
    }
    // A v4-mapped form never appears on the wire: matching it would intercept nothing.
    if let IpAddr::V6(v6) = ip {
        if let Some(v4) = v6.to_ipv4_mapped() {
            return Err(cfg_err(format!(
                "{p}: {} is an IPv4-mapped IPv6 address, which no packet carries; write the IPv4 address {v4}",
                q(s)
            )));
        }
    }
    Ok(ip)
}

/// A list of ports, deduplicated, at most [`MAX_METADATA_PORTS`].
fn parse_ports(path: &str, x: &Value) -> Result<Vec<u16>> {
    let arr = expect_array(path, x)?;
    check_len(path, arr, MAX_METADATA_PORTS)?;
    let mut out = Vec::new();
    for (i, p) in arr.iter().enumerate() {
        let port = expect_port(&format!("{path}[{i}]"), p)?;
        if !out.contains(&port) {
            out.push(port);
        }
    }
    Ok(out)
}

/// One `metadata.endpoints` entry: `address` (required), `ports` (default `[80]`) and `mode`
/// (default: the network's `metadata.mode`).
fn parse_endpoint(path: &str, v: &Value, net: MetadataMode) -> Result<Endpoint> {
    let o = expect_object(path, v)?;
    reject_unknown(path, o, &["address", "ports", "mode"])?;
    let address = match o.get("address") {
        Some(a) => parse_metadata_address(&format!("{path}.address"), a)?,
        None => return Err(cfg_err(format!("{path}.address: missing"))),
    };
    let ports = match o.get("ports") {
        Some(x) => parse_ports(&format!("{path}.ports"), x)?,
        None => vec![80],
    };
    if ports.is_empty() {
        return Err(cfg_err(format!(
            "{path}.ports: must list at least one port"
        )));
    }
    let mode = match o.get("mode") {
        None => endpoint_mode(net),
        Some(x) => {
            let s = expect_str(&format!("{path}.mode"), x)?;
            let mode = EndpointMode::parse(s).ok_or_else(|| {
                cfg_err(format!(
                    "{path}.mode: {} is not one of \"proxy\", \"deny\", \"allow\"",
                    q(s)
                ))
            })?;
            if mode == EndpointMode::Proxy && net == MetadataMode::Deny {
                return Err(cfg_err(format!(
                    "{path}.mode: \"proxy\" conflicts with metadata.mode \"deny\", which proxies nothing"
                )));
            }
            mode
        }
    };
    Ok(Endpoint {
        address,
        ports,
        mode,
    })
}

/// `metadata.preset` and `metadata.endpoints`: the preset's endpoints (in a `deny` network,
/// the proxied ones denied), each replaced by an explicit entry for the same address, then the
/// explicit entries. The same address and port with two modes is refused, naming both entries.
fn parse_endpoint_list(
    o: &Map<String, Value>,
    m: &mut Metadata,
    dmi: &dyn Fn() -> crate::clouds::Dmi,
) -> Result<()> {
    for k in ["addresses", "ports"] {
        if o.contains_key(k) {
            return Err(cfg_err(format!(
                "metadata.{k}: cannot be combined with metadata.preset or metadata.endpoints; give each address its ports in metadata.endpoints"
            )));
        }
    }
    let mut list: Vec<Endpoint> = Vec::new();
    if let Some(x) = o.get("preset") {
        let s = expect_str("metadata.preset", x)?;
        let choice = if s == "auto" {
            crate::clouds::detect(&dmi())
        } else {
            let cloud = Cloud::parse(s).ok_or_else(|| {
                let names: Vec<String> = Cloud::ALL
                    .iter()
                    .map(|c| format!("\"{}\"", c.as_str()))
                    .collect();
                cfg_err(format!(
                    "metadata.preset: {} is not one of {}, \"auto\"",
                    q(s),
                    names.join(", ")
                ))
            })?;
            PresetChoice {
                cloud: Some(cloud),
                why: crate::clouds::PresetReason::Explicit,
            }
        };
        list = match choice.cloud {
            Some(c) => crate::clouds::preset(c)
                .map(|(e, mode)| Endpoint {
                    address: e.address,
                    ports: e.ports.to_vec(),
                    mode: match mode {
                        EndpointMode::Proxy => endpoint_mode(m.mode),
                        other => other,
                    },
                })
                .collect(),
            None => default_endpoints(m.mode),
        };
        m.preset = Some(choice);
    }
    if let Some(x) = o.get("endpoints") {
        let arr = expect_array("metadata.endpoints", x)?;
        check_len("metadata.endpoints", arr, MAX_METADATA_ADDRESSES)?;
        let mut explicit: Vec<Endpoint> = Vec::new();
        for (i, v) in arr.iter().enumerate() {
            let path = format!("metadata.endpoints[{i}]");
            let e = parse_endpoint(&path, v, m.mode)?;
            for (j, earlier) in explicit.iter().enumerate() {
                let shared = e.ports.iter().find(|p| earlier.ports.contains(p));
                if let (true, Some(port), true) =
                    (earlier.address == e.address, shared, earlier.mode != e.mode)
                {
                    return Err(cfg_err(format!(
                        "{path}: {} port {port} is {:?} here but {:?} in metadata.endpoints[{j}]; an endpoint has one mode",
                        e.address,
                        e.mode.as_str(),
                        earlier.mode.as_str()
                    )));
                }
            }
            explicit.push(e);
        }
        list.retain(|p| !explicit.iter().any(|e| e.address == p.address));
        list.extend(explicit);
    }
    let pairs: usize = list.iter().map(|e| e.ports.len()).sum();
    if pairs > MAX_METADATA_PAIRS {
        return Err(cfg_err(format!(
            "metadata.endpoints: {pairs} address and port pairs are more than natguard accepts (at most {MAX_METADATA_PAIRS})"
        )));
    }
    if list.is_empty() && m.mode != MetadataMode::Off {
        return Err(cfg_err(
            "metadata.endpoints: must list at least one endpoint unless metadata.mode is \"off\""
                .into(),
        ));
    }
    m.endpoints = list;
    Ok(())
}

fn parse_metadata(v: &Value, m: &mut Metadata, dmi: &dyn Fn() -> crate::clouds::Dmi) -> Result<()> {
    let o = expect_object("metadata", v)?;
    reject_unknown(
        "metadata",
        o,
        &[
            "mode",
            "addresses",
            "ports",
            "proxyPort",
            "proxyIPv4",
            "proxyIPv6",
            "exemptNamespaces",
            "exemptRequiresAnnotation",
            "logDenied",
            "acceptUnenforced",
            "allowInterfaces",
            "endpoints",
            "preset",
            "serveProxy",
            "proxyCloud",
        ],
    )?;
    if let Some(x) = o.get("mode") {
        m.mode = match expect_str("metadata.mode", x)? {
            "proxy" => MetadataMode::Proxy,
            "deny" => MetadataMode::Deny,
            "off" => MetadataMode::Off,
            other => {
                return Err(cfg_err(format!(
                    "metadata.mode: {} is not one of \"proxy\", \"deny\", \"off\"",
                    q(other)
                )))
            }
        };
    }
    if let Some(x) = o.get("addresses") {
        let arr = expect_array("metadata.addresses", x)?;
        check_len("metadata.addresses", arr, MAX_METADATA_ADDRESSES)?;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, a) in arr.iter().enumerate() {
            let ip = parse_metadata_address(&format!("metadata.addresses[{i}]"), a)?;
            if seen.insert(ip) {
                out.push(ip);
            }
        }
        m.addresses = out;
    }
    if let Some(x) = o.get("ports") {
        let out = parse_ports("metadata.ports", x)?;
        if out.is_empty() && m.mode != MetadataMode::Off {
            return Err(cfg_err(
                "metadata.ports: must list at least one port unless metadata.mode is \"off\""
                    .into(),
            ));
        }
        m.ports = out;
    }
    if let Some(x) = o.get("proxyPort") {
        m.proxy_port = expect_port("metadata.proxyPort", x)?;
    }
    if let Some(x) = o.get("proxyIPv4") {
        let s = expect_str("metadata.proxyIPv4", x)?;
        m.proxy_ipv4 = if s == "auto" {
            ProxyAddr::Auto
        } else {
            match s.parse::<Ipv4Addr>() {
                Ok(a)
                    if !a.is_unspecified()
                        && !a.is_multicast()
                        && !a.is_broadcast()
                        && !a.is_loopback() =>
                {
                    ProxyAddr::Fixed(a)
                }
                _ => {
                    return Err(cfg_err(format!(
                        "metadata.proxyIPv4: {} is not \"auto\" or a unicast, non-loopback IPv4 address", q(s)
                    )))
                }
            }
        };
    }
    if let Some(x) = o.get("proxyIPv6") {
        let s = expect_str("metadata.proxyIPv6", x)?;
        m.proxy_ipv6 = if s == "auto" {
            ProxyAddr::Auto
        } else {
            match s.parse::<Ipv6Addr>() {
                Ok(a)
                    if !a.is_unspecified()
                        && !a.is_multicast()
                        && !a.is_loopback()
                        && a.to_ipv4_mapped().is_none() =>
                {
                    ProxyAddr::Fixed(a)
                }
                _ => {
                    return Err(cfg_err(format!(
                        "metadata.proxyIPv6: {} is not \"auto\" or a unicast, non-loopback IPv6 address", q(s)
                    )))
                }
            }
        };
    }
    if let Some(x) = o.get("serveProxy") {
        m.serve_proxy = expect_bool("metadata.serveProxy", x)?;
    }
    if let Some(x) = o.get("proxyCloud") {
        let s = expect_str("metadata.proxyCloud", x)?;
        m.proxy_cloud = if s == "auto" {
            None
        } else {
            Some(Cloud::parse(s).ok_or_else(|| {
                let names: Vec<String> = Cloud::ALL
                    .iter()
                    .map(|c| format!("\"{}\"", c.as_str()))
                    .collect();
                cfg_err(format!(
                    "metadata.proxyCloud: {} is not one of {}, \"auto\"",
                    q(s),
                    names.join(", ")
                ))
            })?)
        };
    }
    if let Some(x) = o.get("logDenied") {
        m.log_denied = expect_bool("metadata.logDenied", x)?;
    }
    if let Some(x) = o.get("acceptUnenforced") {
        m.accept_unenforced = expect_bool("metadata.acceptUnenforced", x)?;
    }
    if let Some(x) = o.get("allowInterfaces") {
        let arr = expect_array("metadata.allowInterfaces", x)?;
        check_len("metadata.allowInterfaces", arr, MAX_ALLOW_INTERFACES)?;
        for (i, n) in arr.iter().enumerate() {
            let p = format!("metadata.allowInterfaces[{i}]");
            let s = expect_str(&p, n)?;
            let name = crate::ifname::IfName::new(s).ok_or_else(|| {
                cfg_err(format!(
                    "{p}: {} is not an interface name (1 to 15 bytes, no NUL)",
                    q(s)
                ))
            })?;
            if !m.allow_interfaces.contains(&name) {
                m.allow_interfaces.push(name);
            }
        }
    }
    if let Some(x) = o.get("exemptRequiresAnnotation") {
        m.exempt_requires_annotation = expect_bool("metadata.exemptRequiresAnnotation", x)?;
    }
    if let Some(x) = o.get("exemptNamespaces") {
        let arr = expect_array("metadata.exemptNamespaces", x)?;
        check_len("metadata.exemptNamespaces", arr, MAX_EXEMPT_NAMESPACES)?;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, n) in arr.iter().enumerate() {
            let p = format!("metadata.exemptNamespaces[{i}]");
            let s = expect_str(&p, n)?;
            if !is_dns_label(s) {
                return Err(cfg_err(format!(
                    "{p}: {} is not a Kubernetes namespace name",
                    q(s)
                )));
            }
            if seen.insert(s) {
                out.push(s.to_string());
            }
        }
        m.exempt_namespaces = out;
    }
    if o.contains_key("preset") || o.contains_key("endpoints") {
        parse_endpoint_list(o, m, dmi)?;
    } else {
        let pairs = m.addresses.len() * m.ports.len();
        if pairs > MAX_METADATA_PAIRS {
            return Err(cfg_err(format!(
                "metadata.addresses, metadata.ports: {} addresses times {} ports are {pairs} pairs, more than natguard accepts (at most {MAX_METADATA_PAIRS})",
                m.addresses.len(),
                m.ports.len()
            )));
        }
        m.endpoints = legacy_endpoints(&m.addresses, &m.ports, m.mode);
    }
    m.addresses = Vec::new();
    m.ports = Vec::new();
    for e in &m.endpoints {
        if !m.addresses.contains(&e.address) {
            m.addresses.push(e.address);
        }
        for p in &e.ports {
            if !m.ports.contains(p) {
                m.ports.push(*p);
            }
        }
    }
    for (field, proxy) in [
        ("metadata.proxyIPv4", fixed(m.proxy_ipv4.map(IpAddr::V4))),
        ("metadata.proxyIPv6", fixed(m.proxy_ipv6.map(IpAddr::V6))),
    ] {
        if let Some((p, why)) = proxy.and_then(|p| not_a_proxy(p, &m.addresses).map(|w| (p, w))) {
            return Err(cfg_err(format!(
                "{field}: \"{p}\" {why}: the proxy must be another address, or intercepted traffic would go to the real metadata API and the guard would let it through"
            )));
        }
    }
    if m.mode != MetadataMode::Off && m.addresses.is_empty() {
        return Err(cfg_err(
            "metadata.addresses: must list at least one address unless metadata.mode is \"off\""
                .into(),
        ));
    }
    Ok(())
}

fn parse_masquerade(v: &Value, m: &mut Masquerade) -> Result<()> {
    let o = expect_object("masquerade", v)?;
    reject_unknown(
        "masquerade",
        o,
        &[
            "enabled",
            "masqueradeOutside",
            "nonMasqueradeCIDRs",
            "masqLinkLocal",
            "masqLinkLocalIPv6",
            "randomFully",
        ],
    )?;
    if let Some(x) = o.get("enabled") {
        m.enabled = expect_bool("masquerade.enabled", x)?;
    }
    if let Some(x) = o.get("masqueradeOutside") {
        m.masquerade_outside = expect_bool("masquerade.masqueradeOutside", x)?;
    }
    if let Some(x) = o.get("nonMasqueradeCIDRs") {
        let arr = expect_array("masquerade.nonMasqueradeCIDRs", x)?;
        check_len(
            "masquerade.nonMasqueradeCIDRs",
            arr,
            MAX_NON_MASQUERADE_CIDRS,
        )?;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, c) in arr.iter().enumerate() {
            let p = format!("masquerade.nonMasqueradeCIDRs[{i}]");
            let s = expect_str(&p, c)?;
            let cidr = Cidr::parse(s).ok_or_else(|| {
                cfg_err(format!(
                    "{p}: {} is not a CIDR such as \"10.0.0.0/8\"",
                    q(s)
                ))
            })?;
            if seen.insert(cidr) {
                out.push(cidr);
            }
        }
        m.non_masquerade_cidrs = out;
    }
    if let Some(x) = o.get("masqLinkLocal") {
        m.masq_link_local = expect_bool("masquerade.masqLinkLocal", x)?;
    }
    if let Some(x) = o.get("masqLinkLocalIPv6") {
        m.masq_link_local_ipv6 = expect_bool("masquerade.masqLinkLocalIPv6", x)?;
    }
    if let Some(x) = o.get("randomFully") {
        m.random_fully = expect_bool("masquerade.randomFully", x)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::netconf::*;
    use serde_json::json;

    fn conf(extra: Value) -> Value {
        let mut base = json!({"cniVersion":"1.0.0","name":"net1","type":"natguard"});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    }

    #[test]
    fn the_proxy_fields_are_read() {
        let c = parse_plugin_config(
            &json!({"type":"natguard","metadata":{"serveProxy":false,"proxyCloud":"gcp"}}),
        )
        .unwrap();
        assert!(!c.metadata.serve_proxy);
        assert_eq!(c.metadata.proxy_cloud, Some(Cloud::Gcp));
        let c = parse_plugin_config(&json!({"type":"natguard","metadata":{"proxyCloud":"auto"}}))
            .unwrap();
        assert_eq!(c.metadata.proxy_cloud, None);
    }

    #[test]
    fn defaults_match_the_documented_interface() {
        let c = netconf_from_value(&conf(json!({}))).unwrap().natguard;
        assert_eq!(c, Config::default());
        assert_eq!(c.metadata.mode, MetadataMode::Proxy);
        assert_eq!(c.metadata.ports, vec![80]);
        assert_eq!(c.metadata.proxy_port, 8181);
        assert!(c.metadata.serve_proxy);
        assert_eq!(c.metadata.proxy_cloud, None);
        assert_eq!(c.masquerade.non_masquerade_cidrs.len(), 11);
        assert!(c.masquerade.random_fully && c.masquerade.enabled);
        assert!(
            !c.masquerade.masquerade_outside,
            "natguard masquerades nothing outside the exceptions unless asked"
        );
        assert!(c.conntrack.flush_on_add);
        assert_eq!(c.log_file, None);
        assert_eq!(c.log_level, crate::log::Level::Warn);
        assert_eq!(c.log_file_max_size, 10_485_760);
        assert_eq!(c.log_format, crate::log::Format::Text);
        let j = parse_plugin_config(&json!({"logFormat": "json"})).unwrap();
        assert_eq!(j.log_format, crate::log::Format::Json);
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        let cases = [
            (
                json!({"metadata":{"ports":[80, 70000]}}),
                "metadata.ports[1]",
                "70000",
            ),
            (
                json!({"metadata":{"mode":"block"}}),
                "metadata.mode",
                "block",
            ),
            (
                json!({"metadata":{"proxyIPv4":"1.2.3"}}),
                "metadata.proxyIPv4",
                "1.2.3",
            ),
            (
                json!({"metadata":{"addresses":["x"]}}),
                "metadata.addresses[0]",
                "x",
            ),
            (
                json!({"metadata":{"exemptNamespaces":["Kube_System"]}}),
                "metadata.exemptNamespaces[0]",
                "Kube_System",
            ),
            (
                json!({"masquerade":{"nonMasqueradeCIDRs":["10.0.0.0/33"]}}),
                "masquerade.nonMasqueradeCIDRs[0]",
                "10.0.0.0/33",
            ),
            (
                json!({"masquerade":{"enabled":"yes"}}),
                "masquerade.enabled",
                "yes",
            ),
            (
                json!({"masquerade":{"nonMasqueradeCidrs":[]}}),
                "masquerade.nonMasqueradeCidrs",
                "unknown field",
            ),
            (
                json!({"conntrack":{"flush":true}}),
                "conntrack.flush",
                "unknown field",
            ),
            (json!({"logFile":"relative.log"}), "logFile", "relative.log"),
            (
                json!({"logLevel":"verbose"}),
                "logLevel: \"verbose\" is not one of error, warn, info, debug",
                "verbose",
            ),
            (json!({"logLevel":"WARN"}), "logLevel", "WARN"),
            (
                json!({"logFormat":"yaml"}),
                "logFormat: \"yaml\" is not one of text, json",
                "yaml",
            ),
            (json!({"logFormat":true}), "logFormat", "true"),
            (json!({"logLevel":2}), "logLevel", "2"),
            (json!({"logFileMaxSize":0}), "logFileMaxSize", "0"),
            (json!({"logFileMaxSize":-1}), "logFileMaxSize", "-1"),
            (
                json!({"logFileMaxSize":"4096"}),
                "logFileMaxSize",
                "\"4096\"",
            ),
            (json!({"logFileMaxSize":4096.5}), "logFileMaxSize", "4096.5"),
            (json!({"logFileMaxSize":4095}), "logFileMaxSize", "4095"),
            (
                json!({"logFileMaxSize":1073741825u64}),
                "logFileMaxSize",
                "1073741825",
            ),
            (
                json!({"metadata":{"proxyPort":0}}),
                "metadata.proxyPort",
                "0",
            ),
            (
                json!({"metadata":{"serveProxy":"yes"}}),
                "metadata.serveProxy",
                "string",
            ),
            (
                json!({"metadata":{"proxyCloud":"oracle-ish"}}),
                "metadata.proxyCloud",
                "\"oracle-ish\"",
            ),
            (
                json!({"metadata":{"addresses":["169.254.170.2"],"proxyIPv4":"169.254.169.254","proxyPort":80}}),
                "metadata.proxyIPv4: \"169.254.169.254\" is a metadata endpoint",
                "169.254.169.254",
            ),
            (
                json!({"metadata":{"proxyIPv4":"169.254.169.254"}}),
                "metadata.proxyIPv4: \"169.254.169.254\" is one of the network's metadata endpoints",
                "169.254.169.254",
            ),
            (
                json!({"metadata":{"addresses":["169.254.169.254"],"proxyIPv6":"fd00:ec2::23"}}),
                "metadata.proxyIPv6",
                "fd00:ec2::23",
            ),
            (
                json!({"metadata":{"proxyIPv4":"168.63.129.16"}}),
                "metadata.proxyIPv4",
                "Azure WireServer",
            ),
        ];
        for (extra, field, value) in cases {
            let e = netconf_from_value(&conf(extra.clone())).unwrap_err();
            assert_eq!(e.code(), 7, "{extra}: {e}");
            let m = e.to_string();
            assert!(m.contains(field) && m.contains(value), "{extra}: {m}");
        }
    }

    fn endpoints_of(extra: Value) -> Vec<(String, Vec<u16>, &'static str)> {
        let c = netconf_from_value(&conf(extra)).unwrap().natguard;
        c.metadata
            .endpoints
            .iter()
            .map(|e| (e.address.to_string(), e.ports.clone(), e.mode.as_str()))
            .collect()
    }

    #[test]
    fn today_s_fields_are_the_endpoint_list_when_nothing_else_is_given() {
        assert_eq!(
            endpoints_of(json!({})),
            vec![
                ("169.254.169.254".into(), vec![80], "proxy"),
                ("fd00:ec2::254".into(), vec![80], "proxy"),
            ]
        );
        assert_eq!(
            endpoints_of(
                json!({"metadata":{"mode":"deny","addresses":["100.100.100.200"],"ports":[80,8080]}})
            ),
            vec![("100.100.100.200".into(), vec![80, 8080], "deny")]
        );
        let c = netconf_from_value(&conf(json!({}))).unwrap().natguard;
        assert_eq!(c.metadata.preset, None);
    }

    #[test]
    fn a_preset_expands_to_its_cloud_s_endpoints_and_explicit_entries_override_it() {
        assert_eq!(
            endpoints_of(json!({"metadata":{"preset":"azure"}})),
            vec![
                ("169.254.169.254".into(), vec![80], "proxy"),
                ("168.63.129.16".into(), vec![80, 32526], "deny"),
            ]
        );
        // An explicit entry replaces the preset's for its address; a new one is added.
        assert_eq!(
            endpoints_of(json!({"metadata":{"preset":"aws","endpoints":[
                {"address":"169.254.169.254","mode":"deny"},
                {"address":"10.9.9.9","ports":[8080],"mode":"allow"}
            ]}})),
            vec![
                ("fd00:ec2::254".into(), vec![80], "proxy"),
                ("169.254.170.23".into(), vec![80], "allow"),
                ("fd00:ec2::23".into(), vec![80], "allow"),
                ("169.254.169.254".into(), vec![80], "deny"),
                ("10.9.9.9".into(), vec![8080], "allow"),
            ]
        );
        // A deny network proxies nothing: the preset's proxied endpoints are denied.
        assert_eq!(
            endpoints_of(json!({"metadata":{"preset":"alibaba","mode":"deny"}})),
            vec![("100.100.100.200".into(), vec![80], "deny")]
        );
        // An entry without ports or mode: port 80, the network's mode.
        assert_eq!(
            endpoints_of(json!({"metadata":{"endpoints":[{"address":"168.63.129.16"}]}})),
            vec![("168.63.129.16".into(), vec![80], "proxy")]
        );
        let c = netconf_from_value(&conf(json!({"metadata":{"preset":"gcp"}})))
            .unwrap()
            .natguard;
        assert_eq!(
            c.metadata.preset.unwrap().describe(),
            "preset gcp (from the config)"
        );
        assert_eq!(
            c.metadata.addresses,
            vec![
                "169.254.169.254".parse::<IpAddr>().unwrap(),
                "fd20:ce::254".parse().unwrap(),
                "169.254.169.252".parse().unwrap()
            ]
        );
    }

    #[test]
    fn every_cloud_s_preset_parses_by_its_name() {
        type Endpoints = Vec<(String, Vec<u16>, &'static str)>;
        let cases: [(&str, Endpoints); 12] = [
            (
                "oracle",
                vec![
                    ("169.254.169.254".into(), vec![80], "proxy"),
                    ("fd00:c1::a9fe:a9fe".into(), vec![80], "proxy"),
                ],
            ),
            (
                "scaleway",
                vec![
                    ("169.254.42.42".into(), vec![80], "proxy"),
                    ("fd00:42::42".into(), vec![80], "proxy"),
                ],
            ),
            ("tencent", vec![("169.254.0.23".into(), vec![80], "proxy")]),
            (
                "akamai",
                vec![
                    ("169.254.169.254".into(), vec![80], "proxy"),
                    ("fd00:a9fe:a9fe::1".into(), vec![80], "proxy"),
                ],
            ),
            (
                "linode",
                vec![
                    ("169.254.169.254".into(), vec![80], "proxy"),
                    ("fd00:a9fe:a9fe::1".into(), vec![80], "proxy"),
                ],
            ),
            (
                "digitalocean",
                vec![("169.254.169.254".into(), vec![80], "proxy")],
            ),
            (
                "hetzner",
                vec![("169.254.169.254".into(), vec![80], "proxy")],
            ),
            (
                "ibm",
                vec![
                    ("169.254.169.254".into(), vec![80], "proxy"),
                    ("169.254.169.254".into(), vec![443], "deny"),
                ],
            ),
            (
                "exoscale",
                vec![
                    ("169.254.169.254".into(), vec![80], "proxy"),
                    ("169.254.169.254".into(), vec![8080], "deny"),
                ],
            ),
            ("vultr", vec![("169.254.169.254".into(), vec![80], "proxy")]),
            (
                "huawei",
                vec![("169.254.169.254".into(), vec![80], "proxy")],
            ),
            (
                "gcp",
                vec![
                    ("169.254.169.254".into(), vec![80], "proxy"),
                    ("fd20:ce::254".into(), vec![80], "proxy"),
                    ("169.254.169.252".into(), vec![988, 987], "allow"),
                ],
            ),
        ];
        for (name, want) in cases {
            assert_eq!(
                endpoints_of(json!({"metadata":{"preset":name}})),
                want,
                "preset {name}"
            );
        }
        // `linode` is Akamai's preset under its former name, and says so.
        let c = netconf_from_value(&conf(json!({"metadata":{"preset":"linode"}})))
            .unwrap()
            .natguard;
        assert_eq!(
            c.metadata.preset.unwrap().describe(),
            "preset akamai (from the config)"
        );
        // A deny network denies the proxied port and keeps the denied one denied.
        assert_eq!(
            endpoints_of(json!({"metadata":{"preset":"ibm","mode":"deny"}})),
            vec![
                ("169.254.169.254".into(), vec![80], "deny"),
                ("169.254.169.254".into(), vec![443], "deny"),
            ]
        );
        // An explicit entry for the address replaces both of the preset's rows for it.
        assert_eq!(
            endpoints_of(json!({"metadata":{"preset":"exoscale","endpoints":[
                {"address":"169.254.169.254","ports":[80,8080],"mode":"deny"}]}})),
            vec![("169.254.169.254".into(), vec![80, 8080], "deny")]
        );
        // Every new cloud's address is refused as a proxy, whatever the network's preset.
        for (field, addr, what) in [
            ("proxyIPv6", "fd20:ce::254", "GCP metadata server (IPv6)"),
            ("proxyIPv6", "fd00:c1::a9fe:a9fe", "Oracle Cloud"),
            ("proxyIPv4", "169.254.42.42", "Scaleway"),
            ("proxyIPv6", "fd00:42::42", "Scaleway"),
            ("proxyIPv4", "169.254.0.23", "Tencent Cloud"),
            ("proxyIPv6", "fd00:a9fe:a9fe::1", "Akamai"),
        ] {
            let err = netconf_from_value(&conf(json!({"metadata":{field: addr}})))
                .err()
                .unwrap_or_else(|| panic!("{field} {addr} accepted as a proxy"))
                .to_string();
            assert!(
                err.contains(&format!("metadata.{field}")) && err.contains(what),
                "{field} {addr}: {err}"
            );
        }
    }

    #[test]
    fn auto_reads_the_dmi_strings_and_says_what_decided() {
        let parse = |dmi: crate::clouds::Dmi| {
            parse_plugin_config_with(&json!({"metadata":{"preset":"auto"}}), &move || dmi.clone())
                .unwrap()
                .metadata
        };
        let m = parse(crate::clouds::Dmi {
            chassis_asset_tag: "7783-7084-3265-9085-8269-3286-77".into(),
            ..Default::default()
        });
        assert_eq!(m.preset.as_ref().unwrap().cloud, Some(Cloud::Azure));
        assert!(m.endpoints.iter().any(|e| e.mode == EndpointMode::Deny));
        // Oracle's asset tag: its preset, with the IPv6 address of its IMDS.
        let m = parse(crate::clouds::Dmi {
            sys_vendor: "QEMU".into(),
            chassis_asset_tag: "OracleCloud.com".into(),
            ..Default::default()
        });
        assert_eq!(
            m.preset.as_ref().unwrap().describe(),
            "preset oracle (auto, from chassis_asset_tag \"OracleCloud.com\")"
        );
        assert_eq!(
            m.addresses,
            vec![
                "169.254.169.254".parse::<IpAddr>().unwrap(),
                "fd00:c1::a9fe:a9fe".parse().unwrap()
            ]
        );
        // Nothing recognized: today's default endpoints, and the choice says so.
        let m = parse(crate::clouds::Dmi::default());
        assert_eq!(m.endpoints, Config::default().metadata.endpoints);
        assert!(m.preset.unwrap().describe().contains("no cloud recognized"));
        // Without `auto` the DMI strings are never read.
        parse_plugin_config_with(&json!({"metadata":{"preset":"aws"}}), &|| {
            panic!("read DMI without auto")
        })
        .unwrap();
    }

    #[test]
    fn endpoint_conflicts_are_config_errors_naming_the_field() {
        let cases = [
            (
                json!({"metadata":{"endpoints":[
                    {"address":"168.63.129.16","ports":[80,32526],"mode":"deny"},
                    {"address":"168.63.129.16","ports":[32526],"mode":"proxy"}]}}),
                "metadata.endpoints[1]: 168.63.129.16 port 32526 is \"proxy\" here but \"deny\" in metadata.endpoints[0]",
            ),
            (
                json!({"metadata":{"preset":"azure","proxyIPv4":"168.63.129.16"}}),
                "metadata.proxyIPv4: \"168.63.129.16\" is one of the network's metadata endpoints",
            ),
            (
                json!({"metadata":{"endpoints":[{"address":"10.9.9.9","mode":"allow"}],"proxyIPv4":"10.9.9.9"}}),
                "metadata.proxyIPv4: \"10.9.9.9\"",
            ),
            (
                json!({"metadata":{"preset":"openstack","proxyIPv4":"100.100.100.200"}}),
                "Alibaba Cloud instance metadata",
            ),
            (
                json!({"metadata":{"preset":"azure","addresses":["169.254.169.254"]}}),
                "metadata.addresses: cannot be combined with metadata.preset",
            ),
            (
                json!({"metadata":{"endpoints":[],"ports":[80]}}),
                "metadata.ports: cannot be combined",
            ),
            (json!({"metadata":{"preset":"Azure"}}), "metadata.preset: \"Azure\""),
            (
                json!({"metadata":{"preset":"ovh"}}),
                "metadata.preset: \"ovh\" is not one of \"aws\", \"gcp\", \"azure\", \"alibaba\", \"openstack\", \"oracle\", \"scaleway\", \"tencent\", \"akamai\", \"digitalocean\", \"hetzner\", \"ibm\", \"exoscale\", \"vultr\", \"huawei\", \"auto\"",
            ),
            (
                json!({"metadata":{"endpoints":[{"address":"168.63.129.16","mode":"block"}]}}),
                "metadata.endpoints[0].mode: \"block\" is not one of",
            ),
            (
                json!({"metadata":{"endpoints":[{"ports":[80]}]}}),
                "metadata.endpoints[0].address: missing",
            ),
            (
                json!({"metadata":{"endpoints":[{"address":"::ffff:168.63.129.16"}]}}),
                "metadata.endpoints[0].address",
            ),
            (
                json!({"metadata":{"endpoints":[{"address":"168.63.129.16","ports":[0]}]}}),
                "metadata.endpoints[0].ports[0]: 0",
            ),
            (
                json!({"metadata":{"endpoints":[{"address":"168.63.129.16","ports":[]}]}}),
                "metadata.endpoints[0].ports: must list at least one port",
            ),
            (
                json!({"metadata":{"endpoints":[{"address":"168.63.129.16","port":80}]}}),
                "metadata.endpoints[0].port: unknown field",
            ),
            (
                json!({"metadata":{"mode":"deny","endpoints":[{"address":"168.63.129.16","mode":"proxy"}]}}),
                "metadata.endpoints[0].mode: \"proxy\" conflicts with metadata.mode \"deny\"",
            ),
            (
                json!({"metadata":{"endpoints":[]}}),
                "metadata.endpoints: must list at least one endpoint",
            ),
            (
                json!({"metadata":{"addresses":(1..=64).map(|i| format!("10.9.0.{i}")).collect::<Vec<_>>(),
                    "ports":(1..=65).collect::<Vec<u64>>()}}),
                "at most 4096",
            ),
        ];
        for (extra, needle) in cases {
            let e = netconf_from_value(&conf(extra.clone())).unwrap_err();
            assert_eq!(e.code(), 7, "{extra}: {e}");
            assert!(e.to_string().contains(needle), "{extra}: {e}");
        }
        // The same endpoint twice with one mode is no conflict.
        endpoints_of(json!({"metadata":{"endpoints":[
            {"address":"168.63.129.16","ports":[80],"mode":"deny"},
            {"address":"168.63.129.16","ports":[80,32526],"mode":"deny"}]}}));
        // `off` with an empty list is fine: nothing is installed.
        endpoints_of(json!({"metadata":{"mode":"off","endpoints":[]}}));
    }

    #[test]
    fn lists_up_to_their_limit_parse_and_longer_ones_name_the_limit() {
        let cidrs = |n: usize| -> Vec<String> {
            (0..n)
                .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
                .collect()
        };
        let ports = |n: usize| -> Vec<u64> { (1..=n as u64).collect() };
        let addrs = |n: usize| -> Vec<String> { (1..=n).map(|i| format!("10.9.0.{i}")).collect() };
        let nss = |n: usize| -> Vec<String> { (0..n).map(|i| format!("ns-{i}")).collect() };
        let cases = [
            (
                "masquerade.nonMasqueradeCIDRs",
                MAX_NON_MASQUERADE_CIDRS,
                json!({"masquerade":{"nonMasqueradeCIDRs": cidrs(MAX_NON_MASQUERADE_CIDRS)}}),
                json!({"masquerade":{"nonMasqueradeCIDRs": cidrs(MAX_NON_MASQUERADE_CIDRS + 1)}}),
            ),
            (
                "metadata.ports",
                MAX_METADATA_PORTS,
                json!({"metadata":{"ports": ports(MAX_METADATA_PORTS)}}),
                json!({"metadata":{"ports": ports(MAX_METADATA_PORTS + 1)}}),
            ),
            (
                "metadata.addresses",
                MAX_METADATA_ADDRESSES,
                json!({"metadata":{"addresses": addrs(MAX_METADATA_ADDRESSES)}}),
                json!({"metadata":{"addresses": addrs(MAX_METADATA_ADDRESSES + 1)}}),
            ),
            (
                "metadata.exemptNamespaces",
                MAX_EXEMPT_NAMESPACES,
                json!({"metadata":{"exemptNamespaces": nss(MAX_EXEMPT_NAMESPACES)}}),
                json!({"metadata":{"exemptNamespaces": nss(MAX_EXEMPT_NAMESPACES + 1)}}),
            ),
        ];
        for (field, max, at, over) in cases {
            netconf_from_value(&conf(at)).unwrap_or_else(|e| panic!("{field} at {max}: {e}"));
            let e = netconf_from_value(&conf(over)).unwrap_err();
            assert_eq!(e.code(), 7, "{field}: {e}");
            let m = e.to_string();
            assert!(
                m.contains(field) && m.contains(&format!("at most {max}")),
                "{m}"
            );
        }
    }

    #[test]
    fn cidrs_are_normalised() {
        let c = Cidr::parse("10.1.2.3/8").unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert_eq!(c.range(), (0x0a00_0000, 0x0aff_ffff));
        let c6 = Cidr::parse("fd00::1/64").unwrap();
        assert_eq!(c6.to_string(), "fd00::/64");
        assert!(Cidr::parse("10.0.0.0/+8").is_none());
        assert!(Cidr::parse("10.0.0.0").is_none());
        assert_eq!(Cidr::parse("::/0").unwrap().range(), (0, u128::MAX));
    }

    #[test]
    fn version_and_name_are_required() {
        let e = netconf_from_value(&json!({"name":"n"})).unwrap_err();
        assert_eq!(e.code(), 1);
        let e = netconf_from_value(&json!({"cniVersion":"9.9.9","name":"n"})).unwrap_err();
        assert_eq!(e.code(), 1);
        let e = netconf_from_value(&json!({"cniVersion":"1.0.0"})).unwrap_err();
        assert!(e.to_string().contains("name"));
        let e = netconf_from_value(&json!({"cniVersion":"1.0.0","name":"a b"})).unwrap_err();
        assert_eq!(e.code(), 7);
    }

    #[test]
    fn decode_errors_use_code_6() {
        assert_eq!(decode_stdin(b"{").unwrap_err().code(), 6);
        assert_eq!(decode_stdin(b"[]").unwrap_err().code(), 6);
        assert_eq!(decode_stdin(&[0xff, 0xfe]).unwrap_err().code(), 6);
        let big = vec![b' '; MAX_STDIN + 1];
        assert_eq!(decode_stdin(&big).unwrap_err().code(), 6);
    }

    /// A GC names every valid attachment of the node: 100,000 of the longest kind fit stdin.
    #[test]
    fn a_gc_of_100000_attachments_fits_stdin() {
        let n = 100_000;
        let list: Vec<Value> = (0..n)
            .map(|i| json!({"containerID": format!("{i:064x}"), "ifname": "eth0-very-long"}))
            .collect();
        let mut conf = json!({"cniVersion": "1.1.0", "name": "n", "type": "natguard"});
        conf["cni.dev/valid-attachments"] = Value::Array(list);
        let bytes = serde_json::to_vec(&conf).unwrap();
        assert!(
            bytes.len() <= MAX_STDIN && bytes.len() > 10_000_000,
            "{}",
            bytes.len()
        );
        let v = decode_stdin(&bytes).unwrap();
        let nc = netconf_from_value(&v).unwrap();
        assert_eq!(nc.valid_attachments.unwrap().len(), n);
    }
}
