//! Each cloud's metadata API as data: which paths pass, which are concealed and why, which
//! query keys and headers its protocol has. docs/proxy.md shows the same tables with their
//! sources.
//!
//! A path is judged on its canonical segments ([`super::canon`]) by the cloud's [`RULES`] row:
//! the first pattern that matches decides (a concealed subtree is listed before the allowed
//! paths it would otherwise overlap). A pattern's segments are literal words, `*` (one segment),
//! `V` (an API version: `latest` or a date) or a final `**` (the whole subtree). A path on the
//! way to an allowed pattern is a directory listing: it passes, and the listing is filtered
//! line by line with the same judgement ([`filter_listing`]), so a listing never names what is
//! concealed. Everything else is concealed ("not on the allow-list"): an allow-list, not a
//! deny-list, because a cloud adds paths and a new credential path must not leak by default.

use super::canon::Canon;
use crate::clouds::Cloud;

/// The metadata APIs natguard's proxy speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    Aws,
    Gcp,
    Azure,
    Alibaba,
    Openstack,
    Oracle,
    Digitalocean,
    Hetzner,
    Vultr,
    Tencent,
    /// Huawei Cloud: OpenStack's metadata service with a few paths of its own.
    Huawei,
    Exoscale,
    /// Akamai Cloud (Linode): a session token from `PUT /v1/token`, answers in text or JSON.
    Akamai,
    /// Scaleway: the instance in one document, `/conf`, as shell variables or JSON.
    Scaleway,
    /// IBM Cloud VPC: a token from a JSON request, then `Authorization: Bearer`; dated versions.
    Ibm,
}

impl Api {
    /// The API of a cloud's preset: every preset has a table.
    pub fn of(cloud: Cloud) -> Api {
        match cloud {
            Cloud::Aws => Api::Aws,
            Cloud::Gcp => Api::Gcp,
            Cloud::Azure => Api::Azure,
            Cloud::Alibaba => Api::Alibaba,
            Cloud::Openstack => Api::Openstack,
            Cloud::Oracle => Api::Oracle,
            Cloud::Digitalocean => Api::Digitalocean,
            Cloud::Hetzner => Api::Hetzner,
            Cloud::Vultr => Api::Vultr,
            Cloud::Tencent => Api::Tencent,
            Cloud::Huawei => Api::Huawei,
            Cloud::Exoscale => Api::Exoscale,
            Cloud::Akamai => Api::Akamai,
            Cloud::Scaleway => Api::Scaleway,
            Cloud::Ibm => Api::Ibm,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Api::Aws => "aws",
            Api::Gcp => "gcp",
            Api::Azure => "azure",
            Api::Alibaba => "alibaba",
            Api::Openstack => "openstack",
            Api::Oracle => "oracle",
            Api::Digitalocean => "digitalocean",
            Api::Hetzner => "hetzner",
            Api::Vultr => "vultr",
            Api::Tencent => "tencent",
            Api::Huawei => "huawei",
            Api::Exoscale => "exoscale",
            Api::Akamai => "akamai",
            Api::Scaleway => "scaleway",
            Api::Ibm => "ibm",
        }
    }

    /// The API whose rows apply after the cloud's own (Huawei's service is OpenStack's).
    fn base(self) -> Option<Api> {
        match self {
            Api::Huawei => Some(Api::Openstack),
            _ => None,
        }
    }

    /// The headers the upstream is sent on every request: the cloud's own, never the pod's.
    pub fn upstream_headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Api::Gcp => &[("metadata-flavor", "Google")],
            Api::Azure => &[("metadata", "true")],
            Api::Oracle => &[("authorization", "Bearer Oracle")],
            _ => &[],
        }
    }

    /// The query keys the API has, in the order they are re-serialised.
    pub fn query_keys(self) -> &'static [&'static str] {
        match self {
            Api::Gcp => &["alt", "recursive"],
            Api::Azure => &["api-version", "format"],
            Api::Scaleway => &["format"],
            Api::Ibm => &["version"],
            _ => &[],
        }
    }

    /// The session-token protocol: AWS's IMDSv2, Alibaba's hardened mode, Akamai's tokens.
    pub fn token(self) -> Option<TokenProtocol> {
        match self {
            Api::Aws => Some(TokenProtocol {
                paths: &[&["latest", "api", "token"]],
                ttl: Ttl::Header("x-aws-ec2-metadata-token-ttl-seconds"),
                carrier: Carrier::Header("x-aws-ec2-metadata-token"),
                put_headers: &[],
                min_ttl: 1,
                max_ttl: 21600,
                node_ttl: 21600,
            }),
            Api::Alibaba => Some(TokenProtocol {
                paths: &[&["latest", "api", "token"]],
                ttl: Ttl::Header("x-aliyun-ecs-metadata-token-ttl-seconds"),
                carrier: Carrier::Header("x-aliyun-ecs-metadata-token"),
                put_headers: &[],
                min_ttl: 1,
                max_ttl: 21600,
                node_ttl: 21600,
            }),
            // The longest TTL is natguard's own bound (a day): the pod's token is the proxy's,
            // never the cloud's. The node asks for an hour, what Akamai's own clients ask for.
            Api::Akamai => Some(TokenProtocol {
                paths: &[&["v1", "token"]],
                ttl: Ttl::Header("metadata-token-expiry-seconds"),
                carrier: Carrier::Header("metadata-token"),
                put_headers: &[],
                min_ttl: 1,
                max_ttl: 86400,
                node_ttl: 3600,
            }),
            // The identity token: `PUT /instance_identity/v1/token` (and `/identity/v1/token`
            // from version 2025-08-26) with `Metadata-Flavor: ibm` and a JSON body whose
            // `expires_in` is 5 to 3600 s (300 without it); the answer is JSON.
            Api::Ibm => Some(TokenProtocol {
                paths: &[
                    &["instance_identity", "v1", "token"],
                    &["identity", "v1", "token"],
                ],
                ttl: Ttl::JsonBody {
                    key: "expires_in",
                    default: 300,
                },
                carrier: Carrier::Bearer,
                put_headers: &[("metadata-flavor", "ibm")],
                min_ttl: 5,
                max_ttl: 3600,
                node_ttl: 3600,
            }),
            _ => None,
        }
    }

    /// Whether the API answers JSON to `Accept: application/json` (and text otherwise): the
    /// one request header of the pod's that reaches the upstream, as one of two variants.
    pub fn negotiates_json(self) -> bool {
        self == Api::Akamai
    }

    /// Lines removed from the text answers of allowed paths (`key: value` or `KEY=VALUE`
    /// documents that mix what describes the instance with what the user set), by their key
    /// ([`filter_text_lines`]).
    pub fn text_conceal(self) -> &'static [&'static str] {
        match self {
            Api::Akamai => &["tags"],
            Api::Scaleway => &["SSH_PUBLIC_KEYS", "TAGS"],
            _ => &[],
        }
    }

    /// What an answer to `c` is, where the API has two forms: JSON when the pod asked for it
    /// (`accept_json`: Akamai's `Accept: application/json`; Scaleway's `format=json`), else
    /// text; [`Form::Either`] for the APIs that have one form per path.
    pub fn answer_form(self, c: &Canon, accept_json: bool) -> Form {
        match self {
            Api::Akamai if accept_json => Form::Json,
            Api::Akamai => Form::Text,
            Api::Scaleway if c.get("format") == Some("json") => Form::Json,
            Api::Scaleway => Form::Text,
            _ => Form::Either,
        }
    }

    /// Keys removed from JSON answers wherever they appear (documents that mix what
    /// describes the instance with what must stay on the node).
    pub fn json_conceal(self) -> &'static [&'static str] {
        match self {
            Api::Azure => &["userData", "customData"],
            Api::Openstack | Api::Huawei => &["admin_pass", "random_seed", "meta"],
            // `/opc/v2/instance/`: `metadata` and `extendedMetadata` hold user data and SSH
            // keys, the tags are user-set.
            Api::Oracle => &[
                "metadata",
                "extendedMetadata",
                "definedTags",
                "freeformTags",
            ],
            // `/v1/instance`: the tags are user-set.
            Api::Akamai => &["tags"],
            // `/conf?format=json`: the users' SSH keys; the tags are user-set.
            Api::Scaleway => &["ssh_public_keys", "tags"],
            _ => &[],
        }
    }
}

/// A cloud's session-token protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenProtocol {
    /// The token paths' segments (`PUT /latest/api/token`, `PUT /v1/token`); the node asks
    /// the first.
    pub paths: &'static [&'static [&'static str]],
    /// How a token request asks for its TTL.
    pub ttl: Ttl,
    /// How every other request carries the token.
    pub carrier: Carrier,
    /// Headers a token request must carry, exactly (IBM's `Metadata-Flavor: ibm`); the node's
    /// own token requests carry them too.
    pub put_headers: &'static [(&'static str, &'static str)],
    /// The TTLs a pod may ask the proxy for.
    pub min_ttl: u64,
    pub max_ttl: u64,
    /// The TTL the node asks the upstream for its own token.
    pub node_ttl: u64,
}

/// How a token request asks for its TTL in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// In this header, required; the answer carries it back.
    Header(&'static str),
    /// In this key of a JSON body (at most [`MAX_TOKEN_BODY`] bytes), `default` without it;
    /// the answer is a JSON document (IBM's).
    JsonBody { key: &'static str, default: u64 },
}

/// The largest body a token request may have (IBM's `{"expires_in": 3600}` and a few more keys).
pub const MAX_TOKEN_BODY: usize = 1024;

/// How a request carries its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// The token is this header's value.
    Header(&'static str),
    /// `Authorization: Bearer <token>`.
    Bearer,
}

impl Carrier {
    /// The token `header` (a request's headers, lower-case names) carries, if any.
    pub fn token(&self, header: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        match self {
            Carrier::Header(h) => header(h),
            Carrier::Bearer => header("authorization")?
                .strip_prefix("Bearer ")
                .map(|t| t.trim().to_string()),
        }
    }

    /// The header and value that carry `token`.
    pub fn header(&self, token: &str) -> (&'static str, String) {
        match self {
            Carrier::Header(h) => (h, token.to_string()),
            Carrier::Bearer => ("authorization", format!("Bearer {token}")),
        }
    }
}

impl TokenProtocol {
    /// Whether `c` is a token path (exactly: no trailing slash, no query but the API's own).
    pub fn is_token_path(&self, api: Api, c: &Canon) -> bool {
        !c.dir
            && c.query
                .iter()
                .all(|(k, _)| api.query_keys().contains(&k.as_str()))
            && self.paths.iter().any(|p| c.segments == *p)
    }

    /// The node's token path as a request target.
    pub fn target(&self) -> String {
        let mut t = String::new();
        for s in self.paths[0] {
            t.push('/');
            t.push_str(s);
        }
        t
    }
}

/// The form of an answer (see [`Api::answer_form`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Json,
    Text,
    /// Whatever the path answers: JSON documents are filtered where they parse.
    Either,
}

/// `body` (a text answer) without the lines whose key is one of `keys` or starts with one of
/// them and then `.`, `[` or `_`: `key: value`, `key.sub: value`, `key[0]: value` (Akamai),
/// `KEY=VALUE`, `KEY_0_SUB=VALUE` (Scaleway). The key is what comes before the line's first
/// `:` or `=`.
pub fn filter_text_lines(body: &str, keys: &[&str]) -> String {
    body.split_inclusive('\n')
        .filter(|line| {
            let key = line.split([':', '=']).next().unwrap_or("").trim();
            !keys.iter().any(|k| {
                key.strip_prefix(k)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[', '_']))
            })
        })
        .collect()
}

/// What a path gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Passes as it is; `subtree`: the path is inside an allowed subtree, so a recursive
    /// answer reveals nothing concealed.
    Pass { subtree: bool },
    /// A directory on the way to allowed paths: passes, its listing filtered.
    Listing,
    /// Concealed, by this rule.
    Conceal(&'static str),
}

/// What a pattern does.
#[derive(Debug, Clone, Copy)]
enum Act {
    Allow,
    Conceal(&'static str),
}

use Act::{Allow, Conceal};

const NOT_LISTED: &str = "not on the allow-list";

/// Per API: (pattern, what it does), first match wins.
const RULES: &[(Api, &[(&str, Act)])] = &[
    (
        Api::Aws,
        &[
            ("V/meta-data/iam/**", Conceal("iam: instance profile and role credentials")),
            ("V/meta-data/identity-credentials/**", Conceal("identity-credentials: the instance's own credentials")),
            ("V/user-data/**", Conceal("user-data")),
            ("V/dynamic/instance-identity/pkcs7", Conceal("signed instance identity document (pkcs7)")),
            ("V/dynamic/instance-identity/signature", Conceal("signed instance identity document (signature)")),
            ("V/dynamic/instance-identity/rsa2048", Conceal("signed instance identity document (rsa2048)")),
            ("V/dynamic/instance-identity/document", Allow),
            ("V/meta-data/ami-id", Allow),
            ("V/meta-data/ami-launch-index", Allow),
            ("V/meta-data/ami-manifest-path", Allow),
            ("V/meta-data/block-device-mapping/**", Allow),
            ("V/meta-data/hostname", Allow),
            ("V/meta-data/instance-id", Allow),
            ("V/meta-data/instance-life-cycle", Allow),
            ("V/meta-data/instance-type", Allow),
            ("V/meta-data/local-hostname", Allow),
            ("V/meta-data/local-ipv4", Allow),
            ("V/meta-data/mac", Allow),
            ("V/meta-data/network/interfaces/macs/**", Allow),
            ("V/meta-data/placement/**", Allow),
            ("V/meta-data/public-hostname", Allow),
            ("V/meta-data/public-ipv4", Allow),
            ("V/meta-data/reservation-id", Allow),
            ("V/meta-data/security-groups", Allow),
            ("V/meta-data/services/**", Allow),
        ],
    ),
    (
        Api::Gcp,
        &[
            ("computeMetadata/v1/instance/service-accounts/**", Conceal("service-accounts: access and identity tokens, account names")),
            ("computeMetadata/v1/instance/id", Allow),
            ("computeMetadata/v1/instance/name", Allow),
            ("computeMetadata/v1/instance/hostname", Allow),
            ("computeMetadata/v1/instance/zone", Allow),
            ("computeMetadata/v1/instance/machine-type", Allow),
            ("computeMetadata/v1/instance/cpu-platform", Allow),
            ("computeMetadata/v1/instance/image", Allow),
            ("computeMetadata/v1/instance/tags", Allow),
            ("computeMetadata/v1/instance/maintenance-event", Allow),
            ("computeMetadata/v1/instance/preempted", Allow),
            ("computeMetadata/v1/instance/network-interfaces/**", Allow),
            ("computeMetadata/v1/instance/attributes/cluster-name", Allow),
            ("computeMetadata/v1/instance/attributes/cluster-location", Allow),
            ("computeMetadata/v1/instance/attributes/cluster-uid", Allow),
            ("computeMetadata/v1/instance/attributes/*", Conceal("instance attributes not on the allow-list (kube-env, startup-script, user-data, ssh-keys, ...)")),
            ("computeMetadata/v1/project/project-id", Allow),
            ("computeMetadata/v1/project/numeric-project-id", Allow),
            ("computeMetadata/v1/project/attributes/google-compute-default-region", Allow),
            ("computeMetadata/v1/project/attributes/google-compute-default-zone", Allow),
            ("computeMetadata/v1/project/attributes/*", Conceal("project attributes not on the allow-list (ssh-keys, startup scripts, ...)")),
        ],
    ),
    (
        Api::Azure,
        &[
            ("metadata/identity/**", Conceal("identity: managed identity tokens")),
            ("metadata/attested/**", Conceal("attested: signed instance data")),
            ("metadata/instance/compute/userData", Conceal("userData")),
            ("metadata/instance/compute/customData", Conceal("customData")),
            ("metadata/versions", Allow),
            ("metadata/instance", Allow),
            ("metadata/instance/compute/**", Allow),
            ("metadata/instance/network/**", Allow),
        ],
    ),
    (
        Api::Alibaba,
        &[
            ("V/meta-data/ram/**", Conceal("ram/security-credentials: RAM role credentials")),
            ("V/user-data/**", Conceal("user-data")),
            ("V/dynamic/instance-identity/pkcs7", Conceal("signed instance identity document (pkcs7)")),
            ("V/dynamic/instance-identity/document", Allow),
            ("V/meta-data/region-id", Allow),
            ("V/meta-data/zone-id", Allow),
            ("V/meta-data/instance-id", Allow),
            ("V/meta-data/instance/**", Allow),
            ("V/meta-data/hostname", Allow),
            ("V/meta-data/image-id", Allow),
            ("V/meta-data/mac", Allow),
            ("V/meta-data/network-type", Allow),
            ("V/meta-data/private-ipv4", Allow),
            ("V/meta-data/eipv4", Allow),
            ("V/meta-data/vpc-id", Allow),
            ("V/meta-data/vswitch-id", Allow),
            ("V/meta-data/vpc-cidr-block", Allow),
            ("V/meta-data/vswitch-cidr-block", Allow),
            ("V/meta-data/serial-number", Allow),
            ("V/meta-data/network/interfaces/macs/**", Allow),
            ("V/meta-data/dns-conf/**", Allow),
            ("V/meta-data/ntp-conf/**", Allow),
        ],
    ),
    (
        Api::Openstack,
        &[
            ("openstack/V/user_data", Conceal("user_data")),
            ("openstack/V/password", Conceal("password: the instance's encrypted admin password")),
            ("openstack/V/vendor_data.json", Conceal("vendor_data: may carry secrets")),
            ("openstack/V/vendor_data2.json", Conceal("vendor_data2: may carry secrets")),
            ("V/user-data/**", Conceal("user-data")),
            ("openstack/V/meta_data.json", Allow),
            ("openstack/V/network_data.json", Allow),
            ("V/meta-data/ami-id", Allow),
            ("V/meta-data/block-device-mapping/**", Allow),
            ("V/meta-data/hostname", Allow),
            ("V/meta-data/instance-id", Allow),
            ("V/meta-data/instance-type", Allow),
            ("V/meta-data/local-hostname", Allow),
            ("V/meta-data/local-ipv4", Allow),
            ("V/meta-data/placement/**", Allow),
            ("V/meta-data/public-hostname", Allow),
            ("V/meta-data/public-ipv4", Allow),
            ("V/meta-data/reservation-id", Allow),
            ("V/meta-data/security-groups", Allow),
        ],
    ),
    (
        Api::Oracle,
        &[
            ("opc/v2/identity/**", Conceal("identity: instance principal certificates and private key")),
            ("opc/v2/instance/metadata/**", Conceal("metadata: user data, SSH keys and user-set metadata")),
            ("opc/v2/instance", Allow),
            ("opc/v2/instance/availabilityDomain", Allow),
            ("opc/v2/instance/canonicalRegionName", Allow),
            ("opc/v2/instance/compartmentId", Allow),
            ("opc/v2/instance/displayName", Allow),
            ("opc/v2/instance/faultDomain", Allow),
            ("opc/v2/instance/hostname", Allow),
            ("opc/v2/instance/id", Allow),
            ("opc/v2/instance/image", Allow),
            ("opc/v2/instance/ociAdName", Allow),
            ("opc/v2/instance/region", Allow),
            ("opc/v2/instance/regionInfo/**", Allow),
            ("opc/v2/instance/shape", Allow),
            ("opc/v2/instance/shapeConfig/**", Allow),
            ("opc/v2/instance/state", Allow),
            ("opc/v2/instance/tenantId", Allow),
            ("opc/v2/instance/timeCreated", Allow),
            ("opc/v2/vnics/**", Allow),
        ],
    ),
    (
        Api::Digitalocean,
        &[
            ("metadata/v1/user-data", Conceal("user-data")),
            ("metadata/v1/vendor-data", Conceal("vendor-data")),
            ("metadata/v1.json", Conceal("v1.json: the whole document, user-data and vendor-data included")),
            ("metadata/v1/id", Allow),
            ("metadata/v1/hostname", Allow),
            ("metadata/v1/region", Allow),
            ("metadata/v1/interfaces/**", Allow),
            ("metadata/v1/dns/**", Allow),
            ("metadata/v1/floating_ip/**", Allow),
            ("metadata/v1/reserved_ip/**", Allow),
            ("metadata/v1/tags/**", Allow),
            ("metadata/v1/features/**", Allow),
        ],
    ),
    (
        Api::Hetzner,
        &[
            ("hetzner/v1/userdata", Conceal("userdata")),
            ("hetzner/v1/metadata", Conceal("the whole metadata document: public keys and vendor_data included")),
            ("hetzner/v1/metadata/hostname", Allow),
            ("hetzner/v1/metadata/instance-id", Allow),
            ("hetzner/v1/metadata/public-ipv4", Allow),
            ("hetzner/v1/metadata/private-networks", Allow),
            ("hetzner/v1/metadata/availability-zone", Allow),
            ("hetzner/v1/metadata/region", Allow),
        ],
    ),
    (
        Api::Vultr,
        &[
            ("v1.json", Conceal("v1.json: the whole document, public keys included")),
            ("user-data/**", Conceal("user-data")),
            ("latest/user-data", Conceal("user-data")),
            ("v1/hostname", Allow),
            ("v1/instanceid", Allow),
            ("v1/instance-v2-id", Allow),
            ("v1/region/**", Allow),
            ("v1/interfaces/**", Allow),
        ],
    ),
    (
        Api::Tencent,
        &[
            ("V/meta-data/cam/**", Conceal("cam/security-credentials: CAM role credentials")),
            ("V/user-data/**", Conceal("user-data")),
            ("V/meta-data/instance-id", Allow),
            ("V/meta-data/uuid", Allow),
            ("V/meta-data/instance-name", Allow),
            ("V/meta-data/mac", Allow),
            ("V/meta-data/local-ipv4", Allow),
            ("V/meta-data/public-ipv4", Allow),
            ("V/meta-data/placement/**", Allow),
            ("V/meta-data/network/interfaces/macs/**", Allow),
            ("V/meta-data/payment/**", Allow),
        ],
    ),
    (
        Api::Huawei,
        &[
            ("openstack/V/securitykey", Conceal("securitykey: temporary AK/SK of the instance's agency")),
        ],
    ),
    (
        Api::Exoscale,
        &[
            ("*/user-data/**", Conceal("user-data")),
            ("*/meta-data/availability-zone", Allow),
            ("*/meta-data/cloud-identifier", Allow),
            ("*/meta-data/instance-id", Allow),
            ("*/meta-data/local-hostname", Allow),
            ("*/meta-data/local-ipv4", Allow),
            ("*/meta-data/public-hostname", Allow),
            ("*/meta-data/public-ipv4", Allow),
            ("*/meta-data/service-offering", Allow),
            ("*/meta-data/vm-id", Allow),
        ],
    ),
    (
        Api::Ibm,
        &[
            ("instance_identity/**", Conceal("instance_identity: IAM tokens and the instance's certificates")),
            ("identity/**", Conceal("identity: IAM tokens and the instance's certificates")),
            ("metadata/v1/instance/initialization/**", Conceal("initialization: the SSH keys, user accounts and default trusted profile the instance was created with")),
            ("metadata/v1/keys/**", Conceal("keys: the SSH keys the instance was created with")),
            ("metadata/v1/instance", Allow),
            ("metadata/v1/instance/network_interfaces/**", Allow),
            ("metadata/v1/instance/network_attachments/**", Allow),
            ("metadata/v1/instance/volume_attachments/**", Allow),
            ("metadata/v1/placement_groups/**", Allow),
        ],
    ),
    (
        Api::Scaleway,
        &[
            ("user_data/**", Conceal("user_data: user data (cloud-init and the user's keys)")),
            ("conf", Allow),
        ],
    ),
    (
        Api::Akamai,
        &[
            ("v1/user-data/**", Conceal("user-data")),
            ("v1/ssh-keys/**", Conceal("ssh-keys: the users allowed to log in and their public keys")),
            ("v1/instance", Allow),
            ("v1/network", Allow),
        ],
    ),
];

/// The first version of IBM's metadata API with identity tokens.
pub const IBM_FIRST_VERSION: &str = "2022-03-01";

/// A date `YYYY-MM-DD` (IBM's `version`).
fn is_dated_version(s: &str) -> bool {
    s != "latest" && is_version(s)
}

/// `latest` or a dated API version (`2021-03-23`).
fn is_version(s: &str) -> bool {
    let b = s.as_bytes();
    s == "latest"
        || (b.len() == 10
            && b.iter().enumerate().all(|(i, c)| {
                if i == 4 || i == 7 {
                    *c == b'-'
                } else {
                    c.is_ascii_digit()
                }
            }))
}

/// Whether `seg` is what `pat` names; with `fold`, letters of either case are the same.
fn seg_matches(pat: &str, seg: &str, fold: bool) -> bool {
    match pat {
        "*" => true,
        "V" => is_version(seg),
        p if fold => p.eq_ignore_ascii_case(seg),
        p => p == seg,
    }
}

/// How `segs` relates to `pat`.
#[derive(Debug, PartialEq, Eq)]
enum Fit {
    /// The pattern matches; `true` where a final `**` covered part of the path (or the
    /// subtree's root itself).
    Match(bool),
    /// `segs` is a directory on the way to what the pattern matches.
    Ancestor,
    None,
}

fn fit(pat: &str, segs: &[String], fold: bool) -> Fit {
    let mut n = 0;
    for ps in pat.split('/') {
        if ps == "**" {
            return Fit::Match(true);
        }
        match segs.get(n) {
            None => return Fit::Ancestor,
            Some(s) if seg_matches(ps, s, fold) => {}
            Some(_) => return Fit::None,
        }
        n += 1;
    }
    if segs.len() == n {
        Fit::Match(false)
    } else {
        Fit::None
    }
}

fn own_rules(api: Api) -> &'static [(&'static str, Act)] {
    RULES
        .iter()
        .find(|(a, _)| *a == api)
        .map(|(_, r)| *r)
        .unwrap_or(&[])
}

/// The cloud's own rows, then its base API's.
fn rules(api: Api) -> impl Iterator<Item = &'static (&'static str, Act)> {
    own_rules(api)
        .iter()
        .chain(api.base().map(own_rules).unwrap_or(&[]).iter())
}

/// The verdict for a path of `api`. A concealed path is concealed in every case of its
/// letters: a server that ignores case would read `USERDATA` as `userData` (and an allowed
/// subtree such as Azure's `compute` would otherwise pass it), and where a server does not,
/// the variant names nothing worth passing.
pub fn judge(api: Api, segs: &[String]) -> Verdict {
    let mut ancestor = false;
    for (pat, act) in rules(api) {
        match (fit(pat, segs, matches!(act, Conceal(_))), act) {
            (Fit::Match(subtree), Allow) => return Verdict::Pass { subtree },
            (Fit::Match(_), Conceal(rule)) => return Verdict::Conceal(rule),
            (Fit::Ancestor, Allow) => ancestor = true,
            _ => {}
        }
    }
    if ancestor {
        Verdict::Listing
    } else {
        Verdict::Conceal(NOT_LISTED)
    }
}

/// A directory listing (one name a line, `/` after a directory's name) with only the lines
/// whose path passes; a line that is not a plain name is dropped.
pub fn filter_listing(api: Api, dir: &[String], body: &str) -> String {
    let mut out = String::new();
    for line in body.lines() {
        let name = line.strip_suffix('/').unwrap_or(line);
        if name.is_empty()
            || name == "."
            || name == ".."
            || !name.bytes().all(|b| {
                b.is_ascii_alphanumeric()
                    || matches!(b, b'-' | b'.' | b'_' | b'~' | b',' | b':' | b'@' | b'+')
            })
        {
            continue;
        }
        let mut child = dir.to_vec();
        child.push(name.to_string());
        if !matches!(judge(api, &child), Verdict::Conceal(_)) {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(line);
        }
    }
    if body.ends_with('\n') && !out.is_empty() {
        out.push('\n');
    }
    out
}

/// Removes `keys` wherever they appear in a JSON value.
pub fn filter_json(v: &mut serde_json::Value, keys: &[&str]) {
    match v {
        serde_json::Value::Object(o) => {
            for k in keys {
                o.remove(*k);
            }
            for (_, x) in o.iter_mut() {
                filter_json(x, keys);
            }
        }
        serde_json::Value::Array(a) => {
            for x in a {
                filter_json(x, keys);
            }
        }
        _ => {}
    }
}

/// Azure's documented `api-version`s of the instance endpoint
/// (https://learn.microsoft.com/en-us/azure/virtual-machines/instance-metadata-service#supported-api-versions).
pub const AZURE_API_VERSIONS: &[&str] = &[
    "2017-03-01",
    "2017-04-02",
    "2017-08-01",
    "2017-10-01",
    "2017-12-01",
    "2018-02-01",
    "2018-04-02",
    "2018-10-01",
    "2019-02-01",
    "2019-03-11",
    "2019-04-30",
    "2019-06-01",
    "2019-06-04",
    "2019-08-01",
    "2019-08-15",
    "2019-11-01",
    "2020-06-01",
    "2020-07-15",
    "2020-09-01",
    "2020-10-01",
    "2020-12-01",
    "2021-01-01",
    "2021-02-01",
    "2021-03-01",
    "2021-05-01",
    "2021-10-01",
    "2021-11-01",
    "2021-11-15",
    "2021-12-13",
    "2023-07-01",
    "2023-11-15",
    "2024-03-15",
    "2024-07-17",
    "2025-04-07",
];

/// A refusal: an HTTP status and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: String,
}

fn refuse(status: u16, reason: impl Into<String>) -> Refusal {
    Refusal {
        status,
        reason: reason.into(),
    }
}

/// What a GET or HEAD of `c` must carry and may ask for, in `api`'s protocol, with the
/// request's headers read by `header` (lower-case names; `None` when absent).
pub fn check_request(
    api: Api,
    c: &Canon,
    verdict: &Verdict,
    header: &dyn Fn(&str) -> Option<String>,
) -> Result<(), Refusal> {
    for (k, _) in &c.query {
        if !api.query_keys().contains(&k.as_str()) {
            return Err(refuse(
                400,
                format!(
                    "the query key {k:?} is not part of the {} metadata API",
                    api.as_str()
                ),
            ));
        }
    }
    match api {
        Api::Gcp => {
            if header("x-forwarded-for").is_some() {
                return Err(refuse(
                    403,
                    "X-Forwarded-For is refused, as the GCE metadata server does",
                ));
            }
            if header("metadata-flavor").as_deref() != Some("Google") {
                return Err(refuse(403, "Missing Metadata-Flavor:Google header"));
            }
            match c.get("alt") {
                None | Some("json" | "text") => {}
                Some(v) => return Err(refuse(400, format!("alt={v} is not json or text"))),
            }
            let recursive = match c.get("recursive") {
                None | Some("false") => false,
                Some("true") => true,
                Some(v) => return Err(refuse(400, format!("recursive={v} is not true or false"))),
            };
            let whole = matches!(verdict, Verdict::Pass { subtree: true });
            if recursive && !whole {
                return Err(refuse(
                    403,
                    "recursive=true outside an allowed subtree (it would reveal what is concealed)",
                ));
            }
            if c.get("alt") == Some("json") && *verdict == Verdict::Listing {
                return Err(refuse(403, "alt=json on a filtered directory listing"));
            }
        }
        Api::Azure => {
            if header("x-forwarded-for").is_some() {
                return Err(refuse(
                    400,
                    "X-Forwarded-For is refused, as Azure's IMDS does",
                ));
            }
            if header("metadata").as_deref() != Some("true") {
                return Err(refuse(
                    400,
                    "Required metadata header not specified (Metadata: true)",
                ));
            }
            if c.dir {
                return Err(refuse(400, "Azure IMDS paths have no trailing slash"));
            }
            let versions = c.segments == ["metadata", "versions"];
            match c.get("api-version") {
                None if versions => {}
                None => {
                    return Err(refuse(
                        400,
                        "Bad request. api-version was not specified in the request",
                    ))
                }
                Some(v) if AZURE_API_VERSIONS.contains(&v) => {}
                Some(v) => {
                    return Err(refuse(
                        400,
                        format!("api-version {v} is not one natguard knows the meaning of"),
                    ))
                }
            }
            match c.get("format") {
                None | Some("json" | "text") => {}
                Some(v) => return Err(refuse(400, format!("format={v} is not json or text"))),
            }
        }
        Api::Ibm => match c.get("version") {
            Some(v) if is_dated_version(v) && v >= IBM_FIRST_VERSION => {}
            Some(v) => {
                return Err(refuse(
                    400,
                    format!("version={v} is not a date from {IBM_FIRST_VERSION} on (YYYY-MM-DD)"),
                ))
            }
            None => return Err(refuse(400, "version=YYYY-MM-DD is required")),
        },
        Api::Scaleway => match c.get("format") {
            None | Some("json") => {}
            Some(v) => return Err(refuse(400, format!("format={v} is not json"))),
        },
        Api::Oracle => {
            for f in ["forwarded", "x-forwarded-for", "x-forwarded-host"] {
                if header(f).is_some() {
                    return Err(refuse(
                        403,
                        format!("a request with {f} is refused, as Oracle's IMDSv2 does"),
                    ));
                }
            }
            if header("authorization").as_deref() != Some("Bearer Oracle") {
                return Err(refuse(
                    401,
                    "IMDSv2 requires the header Authorization: Bearer Oracle",
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::canon::parse;

    fn v(api: Api, path: &str) -> Verdict {
        judge(api, &parse(path).unwrap().segments)
    }

    #[test]
    fn a_concealed_path_is_concealed_in_every_case_of_its_letters() {
        for (api, p) in [
            (Api::Azure, "/metadata/instance/compute/USERDATA"),
            (Api::Azure, "/metadata/instance/compute/userdata"),
            (Api::Azure, "/metadata/instance/compute/CustomData"),
            (Api::Azure, "/METADATA/identity/oauth2/token"),
            (Api::Aws, "/latest/meta-data/IAM/security-credentials/role"),
            (
                Api::Gcp,
                "/computeMetadata/v1/instance/Service-Accounts/default/token",
            ),
        ] {
            assert!(matches!(v(api, p), Verdict::Conceal(_)), "{api:?} {p}");
        }
        // Allowed paths keep their case: a variant of one is not on the allow-list.
        assert!(matches!(
            v(Api::Azure, "/metadata/instance/compute/location"),
            Verdict::Pass { .. }
        ));
    }

    #[test]
    fn what_describes_the_instance_passes() {
        for (api, p) in [
            (Api::Aws, "/latest/meta-data/placement/region"),
            (Api::Aws, "/latest/meta-data/placement/availability-zone"),
            (Api::Aws, "/2021-07-15/meta-data/instance-id"),
            (Api::Aws, "/latest/dynamic/instance-identity/document"),
            (
                Api::Aws,
                "/latest/meta-data/network/interfaces/macs/02:00:00:00:00:01/vpc-id",
            ),
            (Api::Gcp, "/computeMetadata/v1/instance/zone"),
            (Api::Gcp, "/computeMetadata/v1/project/project-id"),
            (
                Api::Gcp,
                "/computeMetadata/v1/instance/attributes/cluster-name",
            ),
            (Api::Azure, "/metadata/instance/compute/location"),
            (Api::Azure, "/metadata/instance"),
            (Api::Alibaba, "/latest/meta-data/region-id"),
            (Api::Openstack, "/openstack/latest/meta_data.json"),
        ] {
            assert!(matches!(v(api, p), Verdict::Pass { .. }), "{api:?} {p}");
        }
        assert_eq!(v(Api::Aws, "/latest/meta-data/"), Verdict::Listing);
        assert_eq!(v(Api::Aws, "/"), Verdict::Listing);
        assert_eq!(
            v(Api::Gcp, "/computeMetadata/v1/instance/network-interfaces/"),
            Verdict::Pass { subtree: true }
        );
    }

    #[test]
    fn credentials_and_secrets_are_concealed() {
        for (api, p) in [
            (Api::Aws, "/latest/meta-data/iam/security-credentials/"),
            (Api::Aws, "/latest/meta-data/iam/security-credentials/role"),
            (Api::Aws, "/latest/meta-data/iam"),
            (
                Api::Aws,
                "/latest/meta-data/identity-credentials/ec2/security-credentials/ec2-instance",
            ),
            (Api::Aws, "/latest/user-data"),
            (Api::Aws, "/2009-04-04/user-data"),
            (Api::Aws, "/latest/dynamic/instance-identity/pkcs7"),
            (Api::Aws, "/latest/dynamic/instance-identity/signature"),
            (Api::Aws, "/latest/dynamic/instance-identity/rsa2048"),
            (Api::Aws, "/latest/meta-data/IAM/security-credentials/"),
            (Api::Aws, "/latest/meta-data/tags/instance/x"),
            (Api::Aws, "/Latest/meta-data/placement/region"),
            (
                Api::Gcp,
                "/computeMetadata/v1/instance/service-accounts/default/token",
            ),
            (
                Api::Gcp,
                "/computeMetadata/v1/instance/service-accounts/default/identity",
            ),
            (Api::Gcp, "/computeMetadata/v1/instance/service-accounts/"),
            (Api::Gcp, "/computeMetadata/v1/instance/attributes/kube-env"),
            (
                Api::Gcp,
                "/computeMetadata/v1/instance/attributes/startup-script",
            ),
            (
                Api::Gcp,
                "/computeMetadata/v1/instance/attributes/user-data",
            ),
            (
                Api::Gcp,
                "/computeMetadata/v1beta1/instance/service-accounts/default/token",
            ),
            (
                Api::Gcp,
                "/computeMetadata/V1/instance/service-accounts/default/token",
            ),
            (Api::Azure, "/metadata/identity/oauth2/token"),
            (Api::Azure, "/metadata/attested/document"),
            (Api::Azure, "/metadata/instance/compute/userData"),
            (Api::Azure, "/metadata/Identity/oauth2/token"),
            (
                Api::Alibaba,
                "/latest/meta-data/ram/security-credentials/role",
            ),
            (Api::Alibaba, "/latest/user-data"),
            (Api::Openstack, "/openstack/latest/user_data"),
            (Api::Openstack, "/openstack/2012-08-10/password"),
            (Api::Openstack, "/openstack/latest/vendor_data2.json"),
        ] {
            assert!(
                matches!(v(api, p), Verdict::Conceal(_)),
                "{api:?} {p}: {:?}",
                v(api, p)
            );
        }
    }

    #[test]
    fn listings_never_name_what_is_concealed() {
        let dir = parse("/latest/meta-data/").unwrap().segments;
        let body =
            "ami-id\nhostname\niam/\nidentity-credentials/\nplacement/\nuser-data\ntags/\n../\n";
        assert_eq!(
            filter_listing(Api::Aws, &dir, body),
            "ami-id\nhostname\nplacement/\n"
        );
        let root = parse("/latest/").unwrap().segments;
        assert_eq!(
            filter_listing(Api::Aws, &root, "dynamic\nmeta-data\nuser-data"),
            "dynamic\nmeta-data"
        );
        let attrs = parse("/computeMetadata/v1/instance/attributes/")
            .unwrap()
            .segments;
        assert_eq!(
            v(Api::Gcp, "/computeMetadata/v1/instance/attributes/"),
            Verdict::Listing
        );
        assert_eq!(
            filter_listing(Api::Gcp, &attrs, "cluster-name\nkube-env\nstartup-script\n"),
            "cluster-name\n"
        );
        let mut j = serde_json::json!({"compute":{"location":"x","userData":"s","osProfile":{"customData":"c"}}});
        filter_json(&mut j, Api::Azure.json_conceal());
        assert_eq!(
            j,
            serde_json::json!({"compute":{"location":"x","osProfile":{}}})
        );
    }

    #[test]
    fn protocols_are_checked() {
        let h = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let chk = |api, t: &str, hs: &dyn Fn(&str) -> Option<String>| {
            let c = parse(t).unwrap();
            let verdict = judge(api, &c.segments);
            check_request(api, &c, &verdict, hs).map_err(|r| r.status)
        };
        let gcp = h(&[("metadata-flavor", "Google")]);
        assert_eq!(
            chk(Api::Gcp, "/computeMetadata/v1/instance/zone", &gcp),
            Ok(())
        );
        assert_eq!(
            chk(Api::Gcp, "/computeMetadata/v1/instance/zone", &h(&[])),
            Err(403)
        );
        assert_eq!(
            chk(
                Api::Gcp,
                "/computeMetadata/v1/instance/zone",
                &h(&[
                    ("metadata-flavor", "Google"),
                    ("x-forwarded-for", "1.2.3.4")
                ])
            ),
            Err(403)
        );
        assert_eq!(
            chk(
                Api::Gcp,
                "/computeMetadata/v1/instance/?recursive=true",
                &gcp
            ),
            Err(403)
        );
        assert_eq!(
            chk(Api::Gcp, "/computeMetadata/v1/?recursive=true", &gcp),
            Err(403)
        );
        assert_eq!(
            chk(
                Api::Gcp,
                "/computeMetadata/v1/instance/network-interfaces/?recursive=true&alt=json",
                &gcp
            ),
            Ok(())
        );
        assert_eq!(
            chk(Api::Gcp, "/computeMetadata/v1/instance/zone?x=1", &gcp),
            Err(400)
        );
        let az = h(&[("metadata", "true")]);
        assert_eq!(
            chk(Api::Azure, "/metadata/instance?api-version=2021-02-01", &az),
            Ok(())
        );
        assert_eq!(
            chk(Api::Azure, "/metadata/instance?api-version=2099-01-01", &az),
            Err(400)
        );
        assert_eq!(chk(Api::Azure, "/metadata/instance", &az), Err(400));
        assert_eq!(
            chk(
                Api::Azure,
                "/metadata/instance?api-version=2021-02-01",
                &h(&[])
            ),
            Err(400)
        );
        assert_eq!(chk(Api::Azure, "/metadata/versions", &az), Ok(()));
        assert_eq!(chk(Api::Aws, "/latest/meta-data/?x=1", &h(&[])), Err(400));
    }

    #[test]
    fn every_preset_has_a_table() {
        for c in Cloud::ALL {
            let api = Api::of(c);
            assert!(!own_rules(api).is_empty(), "{c:?}");
            assert_eq!(api.as_str(), c.as_str());
        }
    }

    #[test]
    fn the_new_clouds_pass_what_describes_the_instance() {
        for (api, p) in [
            (Api::Oracle, "/opc/v2/instance/"),
            (Api::Oracle, "/opc/v2/instance/region"),
            (Api::Oracle, "/opc/v2/instance/canonicalRegionName"),
            (Api::Oracle, "/opc/v2/instance/availabilityDomain"),
            (Api::Oracle, "/opc/v2/instance/faultDomain"),
            (Api::Oracle, "/opc/v2/instance/id"),
            (Api::Oracle, "/opc/v2/instance/shape"),
            (Api::Oracle, "/opc/v2/instance/displayName"),
            (Api::Oracle, "/opc/v2/instance/regionInfo/realmKey"),
            (Api::Oracle, "/opc/v2/vnics/"),
            (Api::Digitalocean, "/metadata/v1/id"),
            (Api::Digitalocean, "/metadata/v1/region"),
            (Api::Digitalocean, "/metadata/v1/hostname"),
            (
                Api::Digitalocean,
                "/metadata/v1/interfaces/public/0/ipv4/address",
            ),
            (Api::Hetzner, "/hetzner/v1/metadata/instance-id"),
            (Api::Hetzner, "/hetzner/v1/metadata/hostname"),
            (Api::Hetzner, "/hetzner/v1/metadata/region"),
            (Api::Hetzner, "/hetzner/v1/metadata/availability-zone"),
            (Api::Hetzner, "/hetzner/v1/metadata/private-networks"),
            (Api::Vultr, "/v1/instanceid"),
            (Api::Vultr, "/v1/region/regioncode"),
            (Api::Vultr, "/v1/interfaces/0/ipv4/address"),
            (Api::Tencent, "/latest/meta-data/placement/region"),
            (Api::Tencent, "/latest/meta-data/placement/zone"),
            (Api::Tencent, "/latest/meta-data/instance-id"),
            (Api::Tencent, "/latest/meta-data/payment/charge-type"),
            (Api::Huawei, "/openstack/latest/meta_data.json"),
            (Api::Huawei, "/openstack/latest/network_data.json"),
            (Api::Huawei, "/latest/meta-data/instance-id"),
            (Api::Exoscale, "/1.0/meta-data/availability-zone"),
            (Api::Exoscale, "/latest/meta-data/instance-id"),
            (Api::Exoscale, "/1.0/meta-data/service-offering"),
        ] {
            assert!(
                matches!(v(api, p), Verdict::Pass { .. }),
                "{api:?} {p}: {:?}",
                v(api, p)
            );
        }
        for (api, p) in [
            (Api::Oracle, "/opc/v2/"),
            (Api::Digitalocean, "/metadata/v1/"),
            (Api::Hetzner, "/hetzner/v1/"),
            (Api::Vultr, "/v1/"),
            (Api::Tencent, "/latest/meta-data/"),
            (Api::Huawei, "/openstack/latest/"),
            (Api::Exoscale, "/1.0/meta-data/"),
        ] {
            assert_eq!(v(api, p), Verdict::Listing, "{api:?} {p}");
        }
    }

    #[test]
    fn the_new_clouds_conceal_credentials_and_user_data() {
        for (api, p) in [
            (Api::Oracle, "/opc/v2/identity/cert.pem"),
            (Api::Oracle, "/opc/v2/identity/key.pem"),
            (Api::Oracle, "/opc/v2/identity/intermediate.pem"),
            (Api::Oracle, "/opc/v2/identity/"),
            (Api::Oracle, "/opc/v2/instance/metadata/"),
            (Api::Oracle, "/opc/v2/instance/metadata/user_data"),
            (Api::Oracle, "/opc/v2/instance/metadata/ssh_authorized_keys"),
            (Api::Oracle, "/opc/v2/instance/freeformTags"),
            (Api::Oracle, "/opc/v2/volumeAttachments/"),
            (Api::Oracle, "/opc/v1/instance/"),
            (Api::Oracle, "/opc/v2/Identity/key.pem"),
            (Api::Digitalocean, "/metadata/v1/user-data"),
            (Api::Digitalocean, "/metadata/v1/vendor-data"),
            (Api::Digitalocean, "/metadata/v1.json"),
            (Api::Digitalocean, "/metadata/v1/public-keys"),
            (Api::Hetzner, "/hetzner/v1/userdata"),
            (Api::Hetzner, "/hetzner/v1/metadata"),
            (Api::Hetzner, "/hetzner/v1/metadata/public-keys"),
            (Api::Vultr, "/v1.json"),
            (Api::Vultr, "/user-data/user-data"),
            (Api::Vultr, "/latest/user-data"),
            (Api::Vultr, "/v1/public-keys"),
            (
                Api::Tencent,
                "/latest/meta-data/cam/security-credentials/role",
            ),
            (Api::Tencent, "/latest/meta-data/cam/"),
            (Api::Tencent, "/latest/user-data"),
            (Api::Huawei, "/openstack/latest/securitykey"),
            (Api::Huawei, "/openstack/latest/user_data"),
            (Api::Huawei, "/openstack/latest/password"),
            (Api::Huawei, "/openstack/latest/vendor_data2.json"),
            (Api::Exoscale, "/1.0/user-data"),
            (Api::Exoscale, "/latest/user-data"),
            (Api::Exoscale, "/1.0/meta-data/public-keys"),
        ] {
            assert!(
                matches!(v(api, p), Verdict::Conceal(_)),
                "{api:?} {p}: {:?}",
                v(api, p)
            );
        }
        assert_eq!(
            v(Api::Huawei, "/openstack/latest/securitykey"),
            Verdict::Conceal("securitykey: temporary AK/SK of the instance's agency")
        );
    }

    #[test]
    fn the_new_clouds_listings_never_name_what_is_concealed() {
        let seg = |p: &str| parse(p).unwrap().segments;
        assert_eq!(
            filter_listing(
                Api::Digitalocean,
                &seg("/metadata/v1/"),
                "id\nhostname\nuser-data\nvendor-data\npublic-keys\nregion\ninterfaces/\ndns/\nfloating_ip/\nreserved_ip/\ntags/\nfeatures/\n"
            ),
            "id\nhostname\nregion\ninterfaces/\ndns/\nfloating_ip/\nreserved_ip/\ntags/\nfeatures/\n"
        );
        assert_eq!(
            filter_listing(Api::Hetzner, &seg("/hetzner/v1/"), "metadata\nuserdata\n"),
            ""
        );
        assert_eq!(
            filter_listing(
                Api::Vultr,
                &seg("/v1/"),
                "bgp/\nhostname\ninstanceid\ninterfaces/\npublic-keys\nregion/\ntags/\n"
            ),
            "hostname\ninstanceid\ninterfaces/\nregion/\n"
        );
        assert_eq!(
            filter_listing(
                Api::Tencent,
                &seg("/latest/meta-data/"),
                "cam/\ninstance-id\nplacement/\napp-id\n"
            ),
            "instance-id\nplacement/\n"
        );
        assert_eq!(
            filter_listing(
                Api::Huawei,
                &seg("/openstack/latest/"),
                "meta_data.json\nnetwork_data.json\nsecuritykey\nuser_data\npassword\n"
            ),
            "meta_data.json\nnetwork_data.json\n"
        );
        assert_eq!(
            filter_listing(
                Api::Exoscale,
                &seg("/1.0/meta-data/"),
                "availability-zone\ninstance-id\npublic-keys\nvm-id\n"
            ),
            "availability-zone\ninstance-id\nvm-id\n"
        );
        assert_eq!(
            filter_listing(
                Api::Oracle,
                &seg("/opc/v2/"),
                "instance/\nidentity/\nvnics/\nvolumeAttachments/\n"
            ),
            "instance/\nvnics/\n"
        );
        let mut j = serde_json::json!({
            "id": "ocid1.instance.oc1.x",
            "region": "phx",
            "metadata": {"user_data": "c2VjcmV0", "ssh_authorized_keys": "ssh-rsa A"},
            "extendedMetadata": {"k": "v"},
            "definedTags": {"ns": {"k": "v"}},
            "freeformTags": {"k": "v"}
        });
        filter_json(&mut j, Api::Oracle.json_conceal());
        assert_eq!(
            j,
            serde_json::json!({"id": "ocid1.instance.oc1.x", "region": "phx"})
        );
        let mut j = serde_json::json!({"uuid": "u", "meta": {"k": "secret"}, "admin_pass": "p"});
        filter_json(&mut j, Api::Huawei.json_conceal());
        assert_eq!(j, serde_json::json!({"uuid": "u"}));
    }

    #[test]
    fn oracle_protocol_is_checked() {
        let chk = |pairs: &'static [(&'static str, &'static str)]| {
            let c = parse("/opc/v2/instance/region").unwrap();
            let verdict = judge(Api::Oracle, &c.segments);
            let h = move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            };
            check_request(Api::Oracle, &c, &verdict, &h).map_err(|r| r.status)
        };
        assert_eq!(chk(&[("authorization", "Bearer Oracle")]), Ok(()));
        assert_eq!(chk(&[]), Err(401));
        assert_eq!(chk(&[("authorization", "Bearer oracle")]), Err(401));
        assert_eq!(chk(&[("authorization", "")]), Err(401));
        for f in ["forwarded", "x-forwarded-for", "x-forwarded-host"] {
            let hs: &'static [(&'static str, &'static str)] = match f {
                "forwarded" => &[
                    ("authorization", "Bearer Oracle"),
                    ("forwarded", "for=1.2.3.4"),
                ],
                "x-forwarded-for" => &[
                    ("authorization", "Bearer Oracle"),
                    ("x-forwarded-for", "1.2.3.4"),
                ],
                _ => &[
                    ("authorization", "Bearer Oracle"),
                    ("x-forwarded-host", "h"),
                ],
            };
            assert_eq!(chk(hs), Err(403), "{f}");
        }
        assert_eq!(
            Api::Oracle.upstream_headers(),
            &[("authorization", "Bearer Oracle")]
        );
        let c = parse("/opc/v2/instance/?x=1").unwrap();
        let verdict = judge(Api::Oracle, &c.segments);
        let auth = |k: &str| (k == "authorization").then(|| "Bearer Oracle".to_string());
        assert_eq!(
            check_request(Api::Oracle, &c, &verdict, &auth).map_err(|r| r.status),
            Err(400)
        );
        // The clouds with plain GETs and no session tokens.
        for api in [
            Api::Digitalocean,
            Api::Hetzner,
            Api::Vultr,
            Api::Tencent,
            Api::Huawei,
            Api::Exoscale,
        ] {
            assert_eq!(api.token(), None, "{api:?}");
            assert!(api.query_keys().is_empty(), "{api:?}");
            assert!(api.upstream_headers().is_empty(), "{api:?}");
        }
    }

    #[test]
    fn akamai_passes_the_instance_and_network_and_conceals_user_data_and_ssh_keys() {
        assert_eq!(
            v(Api::Akamai, "/v1/instance"),
            Verdict::Pass { subtree: false }
        );
        assert_eq!(
            v(Api::Akamai, "/v1/network"),
            Verdict::Pass { subtree: false }
        );
        for p in [
            "/v1/user-data",
            "/v1/ssh-keys",
            "/v1/ssh-keys/root",
            "/v1/token",
            "/v2/instance",
        ] {
            assert!(matches!(v(Api::Akamai, p), Verdict::Conceal(_)), "{p}");
        }
        // A listing of `/v1/` would name only what passes.
        assert_eq!(v(Api::Akamai, "/v1/"), Verdict::Listing);
        assert_eq!(
            filter_listing(
                Api::Akamai,
                &["v1".to_string()],
                "instance\nnetwork\nssh-keys\nuser-data\n"
            ),
            "instance\nnetwork\n"
        );
        // Its token path is Akamai's own, and only exactly that.
        let p = Api::Akamai.token().unwrap();
        assert_eq!(p.target(), "/v1/token");
        assert!(p.is_token_path(Api::Akamai, &parse("/v1/token").unwrap()));
        assert!(
            parse("/v1//token").is_err(),
            "ambiguous: refused before any judgement"
        );
        for t in [
            "/v1/token/",
            "/v1/token?x=1",
            "/latest/api/token",
            "/v1/tokens",
        ] {
            assert!(!p.is_token_path(Api::Akamai, &parse(t).unwrap()), "{t}");
        }
        assert_eq!(Api::Aws.token().unwrap().target(), "/latest/api/token");
        assert!(Api::Akamai.negotiates_json() && !Api::Aws.negotiates_json());
    }

    #[test]
    fn text_lines_of_a_concealed_key_are_removed_whatever_their_form() {
        let doc = "id: 1\nlabel: node-0\ntags: team-a\ntags: secret\ntags.0: x\ntags[1]: y\n\
                   tagsx: kept\nregion: us-ord\nspecs.vcpus: 2\n";
        assert_eq!(
            filter_text_lines(doc, &["tags"]),
            "id: 1\nlabel: node-0\ntagsx: kept\nregion: us-ord\nspecs.vcpus: 2\n"
        );
        assert_eq!(filter_text_lines("tags: a", &["tags"]), "");
        assert_eq!(filter_text_lines("a: 1\nb: 2", &[]), "a: 1\nb: 2");
    }

    #[test]
    fn scaleway_passes_conf_without_keys_and_tags_and_conceals_user_data() {
        assert_eq!(v(Api::Scaleway, "/conf"), Verdict::Pass { subtree: false });
        for p in ["/user_data", "/user_data/cloud-init", "/state", "/conf/x"] {
            assert!(matches!(v(Api::Scaleway, p), Verdict::Conceal(_)), "{p}");
        }
        let text = "COMMERCIAL_TYPE=DEV1-S\nSSH_PUBLIC_KEYS=1\nSSH_PUBLIC_KEYS_0_KEY='ssh-ed25519 AAAA= u'\n\
                    SSH_PUBLIC_KEYS_0_FINGERPRINT=256 MD5:aa:bb\nTAGS=1\nTAGS_0=team\nZONE=fr-par-1\n\
                    IPV6_ADDRESS=2001:bc8::1\n";
        assert_eq!(
            filter_text_lines(text, Api::Scaleway.text_conceal()),
            "COMMERCIAL_TYPE=DEV1-S\nZONE=fr-par-1\nIPV6_ADDRESS=2001:bc8::1\n"
        );
        let conf = parse("/conf").unwrap();
        let json = parse("/conf?format=json").unwrap();
        assert_eq!(Api::Scaleway.answer_form(&conf, true), Form::Text);
        assert_eq!(Api::Scaleway.answer_form(&json, false), Form::Json);
        assert_eq!(Api::Akamai.answer_form(&conf, true), Form::Json);
        assert_eq!(Api::Aws.answer_form(&json, true), Form::Either);
        let h = |_: &str| None;
        assert!(check_request(Api::Scaleway, &json, &Verdict::Pass { subtree: false }, &h).is_ok());
        let bad = parse("/conf?format=yaml").unwrap();
        assert_eq!(
            check_request(Api::Scaleway, &bad, &Verdict::Pass { subtree: false }, &h)
                .map_err(|r| r.status),
            Err(400)
        );
        let other = parse("/conf?recursive=true").unwrap();
        assert!(
            check_request(Api::Scaleway, &other, &Verdict::Pass { subtree: false }, &h).is_err()
        );
    }

    #[test]
    fn ibm_passes_the_instance_and_conceals_identity_keys_and_initialization() {
        for p in [
            "/metadata/v1/instance",
            "/metadata/v1/instance/network_interfaces",
            "/metadata/v1/instance/volume_attachments/0717-x",
            "/metadata/v1/placement_groups",
        ] {
            assert!(matches!(v(Api::Ibm, p), Verdict::Pass { .. }), "{p}");
        }
        for p in [
            "/metadata/v1/instance/initialization",
            "/metadata/v1/keys",
            "/metadata/v1/keys/r010-key",
            "/instance_identity/v1/iam_token",
            "/identity/v1/certificates",
            "/user-data",
        ] {
            assert!(matches!(v(Api::Ibm, p), Verdict::Conceal(_)), "{p}");
        }
        let h = |_: &str| None;
        let ok = Verdict::Pass { subtree: false };
        let chk =
            |t: &str| check_request(Api::Ibm, &parse(t).unwrap(), &ok, &h).map_err(|r| r.status);
        assert_eq!(chk("/metadata/v1/instance?version=2022-03-01"), Ok(()));
        assert_eq!(chk("/metadata/v1/instance?version=2026-01-28"), Ok(()));
        for bad in [
            "/metadata/v1/instance",
            "/metadata/v1/instance?version=2021-12-31",
            "/metadata/v1/instance?version=latest",
            "/metadata/v1/instance?version=2024-1-1",
            "/metadata/v1/instance?version=2024-01-01&limit=5",
        ] {
            assert_eq!(chk(bad), Err(400), "{bad}");
        }
        let p = Api::Ibm.token().unwrap();
        assert_eq!(p.target(), "/instance_identity/v1/token");
        for t in [
            "/instance_identity/v1/token?version=2024-01-01",
            "/identity/v1/token",
        ] {
            assert!(p.is_token_path(Api::Ibm, &parse(t).unwrap()), "{t}");
        }
        assert!(!p.is_token_path(Api::Ibm, &parse("/instance_identity/v1/token?x=1").unwrap()));
        let auth = |k: &str| (k == "authorization").then(|| "Bearer abc".to_string());
        assert_eq!(p.carrier.token(&auth), Some("abc".to_string()));
        let basic = |k: &str| (k == "authorization").then(|| "Basic abc".to_string());
        assert_eq!(p.carrier.token(&basic), None);
        assert_eq!(
            p.carrier.header("t1"),
            ("authorization", "Bearer t1".to_string())
        );
    }
}
