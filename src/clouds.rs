//! The catalogue of cloud credential endpoints, and which cloud a node runs on.
//!
//! Every cloud hands node credentials out over a few well-known addresses, and they need
//! different treatment on the same node: an instance metadata service a node-local proxy can
//! stand in for, an endpoint no pod may ever reach (Azure's WireServer), and an agent pods are
//! meant to use (the EKS Pod Identity agent). [`CATALOGUE`] is that knowledge as data, one row
//! per address, with the default mode of each and where the address is documented;
//! `metadata.preset` expands to a cloud's rows (docs/clouds.md lists them side by side). The
//! same rows are the addresses no proxy may ever be ([`well_known`]), so each endpoint is
//! written down once.
//!
//! `metadata.preset: "auto"` picks the cloud from the machine's DMI strings. Reading them is
//! [`Dmi::read`]; what they mean is the pure [`detect`] over the [`DMI_SIGNS`] table, which
//! says which string decided, so a preset is never picked silently.
//!
//! A row is there only where the address is documented (its `source`: the provider's own page,
//! or for Exoscale, which names none, the cloud-init data source its images use), and
//! docs/clouds.md's table repeats every row with its source: a unit test compares the two both
//! ways, so a preset's addresses cannot change without their documentation.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What natguard does with a pod's TCP to one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointMode {
    /// DNAT it to the network's node-local proxy.
    Proxy,
    /// Reset it.
    Deny,
    /// Leave it alone: an endpoint pods are meant to reach (the guard does not judge it).
    Allow,
}

impl EndpointMode {
    pub const ALL: [EndpointMode; 3] =
        [EndpointMode::Proxy, EndpointMode::Deny, EndpointMode::Allow];

    pub fn as_str(self) -> &'static str {
        match self {
            EndpointMode::Proxy => "proxy",
            EndpointMode::Deny => "deny",
            EndpointMode::Allow => "allow",
        }
    }

    pub fn parse(s: &str) -> Option<EndpointMode> {
        EndpointMode::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

/// The clouds natguard has a preset for. Each preset's name is one lower-case word (the
/// metadata proxy selects its per-cloud rules by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cloud {
    Aws,
    Gcp,
    Azure,
    Alibaba,
    /// OpenStack, and clouds whose metadata service is Nova's at 169.254.169.254 alone.
    Openstack,
    Oracle,
    Scaleway,
    Tencent,
    /// Akamai Cloud, formerly Linode (`linode` is accepted as another name for it).
    Akamai,
    Digitalocean,
    Hetzner,
    /// IBM Cloud VPC (not IBM Cloud classic infrastructure, which has no metadata address).
    Ibm,
    Exoscale,
    Vultr,
    Huawei,
}

impl Cloud {
    pub const ALL: [Cloud; 15] = [
        Cloud::Aws,
        Cloud::Gcp,
        Cloud::Azure,
        Cloud::Alibaba,
        Cloud::Openstack,
        Cloud::Oracle,
        Cloud::Scaleway,
        Cloud::Tencent,
        Cloud::Akamai,
        Cloud::Digitalocean,
        Cloud::Hetzner,
        Cloud::Ibm,
        Cloud::Exoscale,
        Cloud::Vultr,
        Cloud::Huawei,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cloud::Aws => "aws",
            Cloud::Gcp => "gcp",
            Cloud::Azure => "azure",
            Cloud::Alibaba => "alibaba",
            Cloud::Openstack => "openstack",
            Cloud::Oracle => "oracle",
            Cloud::Scaleway => "scaleway",
            Cloud::Tencent => "tencent",
            Cloud::Akamai => "akamai",
            Cloud::Digitalocean => "digitalocean",
            Cloud::Hetzner => "hetzner",
            Cloud::Ibm => "ibm",
            Cloud::Exoscale => "exoscale",
            Cloud::Vultr => "vultr",
            Cloud::Huawei => "huawei",
        }
    }

    /// A preset's name; `linode` is Akamai's former name, kept because its docs and DMI
    /// strings still use it.
    pub fn parse(s: &str) -> Option<Cloud> {
        if s == "linode" {
            return Some(Cloud::Akamai);
        }
        Cloud::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// One known credential endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownEndpoint {
    pub cloud: Cloud,
    pub address: IpAddr,
    pub ports: &'static [u16],
    /// Its mode in the cloud's preset; `None`: known (never a proxy) but not in the preset.
    pub mode: Option<EndpointMode>,
    /// What it is, for error messages and `status`.
    pub what: &'static str,
    /// Where the address (and the anchor's own rule) is documented.
    pub source: &'static str,
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

const fn ec2_v6(last: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, last))
}

const fn v6(s: [u16; 8]) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(
        s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7],
    ))
}

const IMDS: IpAddr = v4(169, 254, 169, 254);

const GCE_METADATA_V6: IpAddr = v6([0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254]);
const OCI_IMDS_V6: IpAddr = v6([0xfd00, 0xc1, 0, 0, 0, 0, 0xa9fe, 0xa9fe]);
const SCALEWAY_V4: IpAddr = v4(169, 254, 42, 42);
const SCALEWAY_V6: IpAddr = v6([0xfd00, 0x42, 0, 0, 0, 0, 0, 0x42]);
const TENCENT_V4: IpAddr = v4(169, 254, 0, 23);
const AKAMAI_V6: IpAddr = v6([0xfd00, 0xa9fe, 0xa9fe, 0, 0, 0, 0, 1]);

const GCE_SOURCE: &str = "https://cloud.google.com/compute/docs/metadata/querying-metadata";
const OCI_SOURCE: &str =
    "https://docs.oracle.com/en-us/iaas/Content/Compute/Tasks/gettingmetadata.htm";
const SCALEWAY_SOURCE: &str = "https://www.scaleway.com/en/developers/api/instance/user-data";
const AKAMAI_SOURCE: &str = "https://techdocs.akamai.com/cloud-computing/docs/metadata-service-api";
const IBM_SOURCE: &str = "https://cloud.ibm.com/apidocs/vpc-identity";
/// Exoscale's own documentation names no address; cloud-init's Exoscale data source, which
/// Exoscale's images use, documents both servers.
const EXOSCALE_SOURCE: &str =
    "https://docs.cloud-init.io/en/latest/reference/datasources/exoscale.html";

/// Every cloud credential endpoint natguard knows, by cloud. A preset is its cloud's rows that
/// have a mode; every row's address is refused as a proxy.
pub const CATALOGUE: &[KnownEndpoint] = &[
    KnownEndpoint {
        cloud: Cloud::Aws,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "AWS instance metadata (IMDS)",
        source:
            "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html",
    },
    KnownEndpoint {
        cloud: Cloud::Aws,
        address: ec2_v6(0x254),
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "AWS instance metadata (IMDS, IPv6 on Nitro)",
        source:
            "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html",
    },
    KnownEndpoint {
        cloud: Cloud::Aws,
        address: v4(169, 254, 170, 23),
        ports: &[80],
        mode: Some(EndpointMode::Allow),
        what: "AWS EKS Pod Identity agent",
        source: "https://docs.aws.amazon.com/eks/latest/userguide/pod-id-agent-setup.html",
    },
    KnownEndpoint {
        cloud: Cloud::Aws,
        address: ec2_v6(0x23),
        ports: &[80],
        mode: Some(EndpointMode::Allow),
        what: "AWS EKS Pod Identity agent (IPv6)",
        source: "https://docs.aws.amazon.com/eks/latest/userguide/pod-id-agent-setup.html",
    },
    KnownEndpoint {
        cloud: Cloud::Aws,
        address: v4(169, 254, 170, 2),
        ports: &[80],
        mode: None,
        what: "AWS ECS task credentials",
        source: "https://docs.aws.amazon.com/AmazonECS/latest/developerguide/task-iam-roles.html",
    },
    KnownEndpoint {
        cloud: Cloud::Gcp,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "GCP metadata server (metadata.google.internal)",
        source: GCE_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Gcp,
        address: GCE_METADATA_V6,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "GCP metadata server (IPv6)",
        source: GCE_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Gcp,
        address: v4(169, 254, 169, 252),
        ports: &[988, 987],
        mode: Some(EndpointMode::Allow),
        what: "GKE metadata server (Workload Identity)",
        source: "https://cloud.google.com/kubernetes-engine/docs/concepts/workload-identity",
    },
    KnownEndpoint {
        cloud: Cloud::Azure,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Azure instance metadata (IMDS)",
        source: "https://learn.microsoft.com/azure/virtual-machines/instance-metadata-service",
    },
    KnownEndpoint {
        cloud: Cloud::Azure,
        address: v4(168, 63, 129, 16),
        ports: &[80, 32526],
        mode: Some(EndpointMode::Deny),
        what: "Azure WireServer",
        source:
            "https://learn.microsoft.com/azure/virtual-network/what-is-ip-address-168-63-129-16",
    },
    KnownEndpoint {
        cloud: Cloud::Alibaba,
        address: v4(100, 100, 100, 200),
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Alibaba Cloud instance metadata",
        source: "https://www.alibabacloud.com/help/en/ecs/user-guide/manage-instance-metadata",
    },
    KnownEndpoint {
        cloud: Cloud::Openstack,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "OpenStack metadata service",
        source: "https://docs.openstack.org/nova/latest/user/metadata.html",
    },
    KnownEndpoint {
        cloud: Cloud::Oracle,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Oracle Cloud instance metadata (IMDS)",
        source: OCI_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Oracle,
        address: OCI_IMDS_V6,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Oracle Cloud instance metadata (IMDS, IPv6)",
        source: OCI_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Scaleway,
        address: SCALEWAY_V4,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Scaleway instance metadata",
        source: SCALEWAY_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Scaleway,
        address: SCALEWAY_V6,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Scaleway instance metadata (IPv6)",
        source: SCALEWAY_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Tencent,
        address: TENCENT_V4,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Tencent Cloud instance metadata (metadata.tencentyun.com)",
        source: "https://www.tencentcloud.com/document/product/213/4934",
    },
    KnownEndpoint {
        cloud: Cloud::Akamai,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Akamai (Linode) metadata service",
        source: AKAMAI_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Akamai,
        address: AKAMAI_V6,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Akamai (Linode) metadata service (IPv6)",
        source: AKAMAI_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Digitalocean,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "DigitalOcean droplet metadata",
        source: "https://docs.digitalocean.com/reference/api/metadata/",
    },
    KnownEndpoint {
        cloud: Cloud::Hetzner,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Hetzner Cloud server metadata",
        source: "https://docs.hetzner.cloud/#server-metadata",
    },
    KnownEndpoint {
        cloud: Cloud::Ibm,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "IBM Cloud VPC metadata service (api.metadata.cloud.ibm.com, HTTP)",
        source: IBM_SOURCE,
    },
    // The secure protocol serves the same tokens over TLS for IBM's own name: a node-local
    // proxy cannot answer it, so pods are reset there instead.
    KnownEndpoint {
        cloud: Cloud::Ibm,
        address: IMDS,
        ports: &[443],
        mode: Some(EndpointMode::Deny),
        what: "IBM Cloud VPC metadata service (api.metadata.cloud.ibm.com, HTTPS)",
        source: IBM_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Exoscale,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Exoscale metadata server",
        source: EXOSCALE_SOURCE,
    },
    // The password server hands out the instance's password once and is told it was saved:
    // nothing a pod may read or acknowledge, and nothing a proxy could stand in for.
    KnownEndpoint {
        cloud: Cloud::Exoscale,
        address: IMDS,
        ports: &[8080],
        mode: Some(EndpointMode::Deny),
        what: "Exoscale password server",
        source: EXOSCALE_SOURCE,
    },
    KnownEndpoint {
        cloud: Cloud::Vultr,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Vultr instance metadata",
        source: "https://www.vultr.com/metadata/",
    },
    KnownEndpoint {
        cloud: Cloud::Huawei,
        address: IMDS,
        ports: &[80],
        mode: Some(EndpointMode::Proxy),
        what: "Huawei Cloud ECS metadata",
        source: "https://support.huaweicloud.com/intl/en-us/usermanual-ecs/ecs_03_0166.html",
    },
];

/// A cloud's preset: its endpoints with a mode, in catalogue order.
pub fn preset(cloud: Cloud) -> impl Iterator<Item = (&'static KnownEndpoint, EndpointMode)> {
    CATALOGUE
        .iter()
        .filter(move |e| e.cloud == cloud)
        .filter_map(|e| e.mode.map(|m| (e, m)))
}

/// What `address` is, if it is a known credential endpoint of any cloud.
pub fn well_known(address: IpAddr) -> Option<&'static str> {
    CATALOGUE
        .iter()
        .find(|e| e.address == address)
        .map(|e| e.what)
}

/// The DMI strings `auto` reads (`/sys/class/dmi/id/*`), each trimmed; empty when unreadable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dmi {
    pub sys_vendor: String,
    pub product_name: String,
    pub bios_vendor: String,
    pub chassis_asset_tag: String,
}

/// Which DMI string a sign reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmiField {
    SysVendor,
    ProductName,
    BiosVendor,
    ChassisAssetTag,
}

impl DmiField {
    pub fn file(self) -> &'static str {
        match self {
            DmiField::SysVendor => "sys_vendor",
            DmiField::ProductName => "product_name",
            DmiField::BiosVendor => "bios_vendor",
            DmiField::ChassisAssetTag => "chassis_asset_tag",
        }
    }
    fn of(self, d: &Dmi) -> &str {
        match self {
            DmiField::SysVendor => &d.sys_vendor,
            DmiField::ProductName => &d.product_name,
            DmiField::BiosVendor => &d.bios_vendor,
            DmiField::ChassisAssetTag => &d.chassis_asset_tag,
        }
    }
}

/// The DMI values that name a cloud, first match wins. A value is compared whole (after
/// trimming); one ending in `*` matches every value that begins with the rest (Exoscale's
/// product name carries the platform's generation after its name). Azure's VMs carry a fixed
/// chassis asset tag (their vendor string is Hyper-V's, shared with every Hyper-V guest), and
/// so do Oracle's and Huawei's (their vendor strings are QEMU's or OpenStack's); the others
/// name themselves in the system vendor or product name. Tags come before OpenStack's product
/// name, which Huawei's VMs also carry. docs/clouds.md gives each value's source.
pub const DMI_SIGNS: &[(DmiField, &str, Cloud)] = &[
    (
        DmiField::ChassisAssetTag,
        "7783-7084-3265-9085-8269-3286-77",
        Cloud::Azure,
    ),
    (DmiField::ChassisAssetTag, "OracleCloud.com", Cloud::Oracle),
    (DmiField::ChassisAssetTag, "HUAWEICLOUD", Cloud::Huawei),
    (DmiField::SysVendor, "Amazon EC2", Cloud::Aws),
    (DmiField::BiosVendor, "Amazon EC2", Cloud::Aws),
    (DmiField::SysVendor, "Google", Cloud::Gcp),
    (DmiField::ProductName, "Google Compute Engine", Cloud::Gcp),
    (DmiField::SysVendor, "Alibaba Cloud", Cloud::Alibaba),
    (DmiField::ProductName, "Alibaba Cloud ECS", Cloud::Alibaba),
    (DmiField::SysVendor, "Scaleway", Cloud::Scaleway),
    (DmiField::SysVendor, "Tencent Cloud", Cloud::Tencent),
    (DmiField::SysVendor, "Akamai", Cloud::Akamai),
    (DmiField::SysVendor, "Linode", Cloud::Akamai),
    (DmiField::SysVendor, "DigitalOcean", Cloud::Digitalocean),
    (DmiField::SysVendor, "Hetzner", Cloud::Hetzner),
    (DmiField::ProductName, "Exoscale*", Cloud::Exoscale),
    (DmiField::SysVendor, "Vultr", Cloud::Vultr),
    (
        DmiField::SysVendor,
        "OpenStack Foundation",
        Cloud::Openstack,
    ),
    (DmiField::ProductName, "OpenStack Nova", Cloud::Openstack),
];

/// Whether a DMI string (trimmed) is what a sign says: the whole value, or for a sign ending
/// in `*`, a value that begins with the rest.
fn sign_matches(sign: &str, value: &str) -> bool {
    match sign.strip_suffix('*') {
        Some(prefix) => value.starts_with(prefix),
        None => value == sign,
    }
}

/// Where the DMI strings live.
pub const DMI_DIR: &str = "/sys/class/dmi/id";

impl Dmi {
    /// Reads the node's DMI strings; a file that cannot be read is empty (a VM without DMI).
    pub fn read() -> Dmi {
        let get = |f: DmiField| {
            std::fs::read(format!("{DMI_DIR}/{}", f.file()))
                .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                .unwrap_or_default()
        };
        Dmi {
            sys_vendor: get(DmiField::SysVendor),
            product_name: get(DmiField::ProductName),
            bios_vendor: get(DmiField::BiosVendor),
            chassis_asset_tag: get(DmiField::ChassisAssetTag),
        }
    }
}

/// Which preset `metadata.preset` chose, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetChoice {
    /// `None`: `auto` recognized no cloud (the endpoints are then today's defaults).
    pub cloud: Option<Cloud>,
    pub why: PresetReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresetReason {
    /// Named in the config.
    Explicit,
    /// `auto`, decided by this DMI string.
    Detected { field: DmiField, value: String },
    /// `auto`, and no DMI string matched.
    NotRecognized,
}

impl PresetChoice {
    /// One line for logs and `status`: `preset azure (from chassis_asset_tag "...")`.
    pub fn describe(&self) -> String {
        match (&self.cloud, &self.why) {
            (Some(c), PresetReason::Explicit) => format!("preset {} (from the config)", c.as_str()),
            (Some(c), PresetReason::Detected { field, value }) => format!(
                "preset {} (auto, from {} {:?})",
                c.as_str(),
                field.file(),
                value
            ),
            _ => "preset auto: no cloud recognized (the default endpoints apply)".into(),
        }
    }
}

/// The cloud the DMI strings name, and the string that decided.
pub fn detect(d: &Dmi) -> PresetChoice {
    DMI_SIGNS
        .iter()
        .find(|(field, sign, _)| sign_matches(sign, field.of(d).trim()))
        .map(|(field, _, cloud)| PresetChoice {
            cloud: Some(*cloud),
            why: PresetReason::Detected {
                field: *field,
                value: field.of(d).trim().to_string(),
            },
        })
        .unwrap_or(PresetChoice {
            cloud: None,
            why: PresetReason::NotRecognized,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_holds_the_endpoints_of_its_cloud() {
        let of = |c: Cloud| -> Vec<(String, Vec<u16>, EndpointMode)> {
            preset(c)
                .map(|(e, m)| (e.address.to_string(), e.ports.to_vec(), m))
                .collect()
        };
        use EndpointMode::*;
        assert_eq!(
            of(Cloud::Azure),
            vec![
                ("169.254.169.254".into(), vec![80], Proxy),
                ("168.63.129.16".into(), vec![80, 32526], Deny),
            ]
        );
        assert_eq!(
            of(Cloud::Aws),
            vec![
                ("169.254.169.254".into(), vec![80], Proxy),
                ("fd00:ec2::254".into(), vec![80], Proxy),
                ("169.254.170.23".into(), vec![80], Allow),
                ("fd00:ec2::23".into(), vec![80], Allow),
            ]
        );
        assert_eq!(
            of(Cloud::Gcp),
            vec![
                ("169.254.169.254".into(), vec![80], Proxy),
                ("fd20:ce::254".into(), vec![80], Proxy),
                ("169.254.169.252".into(), vec![988, 987], Allow),
            ]
        );
        assert_eq!(
            of(Cloud::Alibaba),
            vec![("100.100.100.200".into(), vec![80], Proxy)]
        );
        assert_eq!(
            of(Cloud::Openstack),
            vec![("169.254.169.254".into(), vec![80], Proxy)]
        );
        assert_eq!(
            of(Cloud::Oracle),
            vec![
                ("169.254.169.254".into(), vec![80], Proxy),
                ("fd00:c1::a9fe:a9fe".into(), vec![80], Proxy),
            ]
        );
        assert_eq!(
            of(Cloud::Scaleway),
            vec![
                ("169.254.42.42".into(), vec![80], Proxy),
                ("fd00:42::42".into(), vec![80], Proxy),
            ]
        );
        assert_eq!(
            of(Cloud::Tencent),
            vec![("169.254.0.23".into(), vec![80], Proxy)]
        );
        assert_eq!(
            of(Cloud::Akamai),
            vec![
                ("169.254.169.254".into(), vec![80], Proxy),
                ("fd00:a9fe:a9fe::1".into(), vec![80], Proxy),
            ]
        );
        assert_eq!(
            of(Cloud::Ibm),
            vec![
                ("169.254.169.254".into(), vec![80], Proxy),
                ("169.254.169.254".into(), vec![443], Deny),
            ]
        );
        assert_eq!(
            of(Cloud::Exoscale),
            vec![
                ("169.254.169.254".into(), vec![80], Proxy),
                ("169.254.169.254".into(), vec![8080], Deny),
            ]
        );
        for c in [
            Cloud::Digitalocean,
            Cloud::Hetzner,
            Cloud::Vultr,
            Cloud::Huawei,
        ] {
            assert_eq!(
                of(c),
                vec![("169.254.169.254".into(), vec![80], Proxy)],
                "{c:?}"
            );
        }
        // Every cloud has a preset, and a preset never lists one address and port twice.
        for c in Cloud::ALL {
            let pairs: Vec<(IpAddr, u16)> = preset(c)
                .flat_map(|(e, _)| e.ports.iter().map(move |p| (e.address, *p)))
                .collect();
            assert!(!pairs.is_empty(), "{c:?} has no preset");
            let unique: std::collections::BTreeSet<_> = pairs.iter().collect();
            assert_eq!(unique.len(), pairs.len(), "{c:?}: {pairs:?}");
        }
        for e in CATALOGUE {
            assert!(e.source.starts_with("https://"), "{e:?}");
            assert!(!e.ports.is_empty(), "{e:?}");
            assert!(well_known(e.address).is_some());
        }
        // The ECS endpoint is known (never a proxy) but in no preset.
        assert_eq!(
            well_known("169.254.170.2".parse().unwrap()),
            Some("AWS ECS task credentials")
        );
        for c in Cloud::ALL {
            assert_eq!(Cloud::parse(c.as_str()), Some(c));
            let name = c.as_str();
            assert!(
                !name.is_empty() && name.chars().all(|ch| ch.is_ascii_lowercase()),
                "a preset's name is one lower-case word: {name:?}"
            );
        }
        assert_eq!(Cloud::parse("linode"), Some(Cloud::Akamai));
        assert_eq!(Cloud::parse("Oracle"), None);
        assert_eq!(Cloud::parse("auto"), None);
    }

    #[test]
    fn detection_names_the_string_that_decided() {
        let azure = Dmi {
            sys_vendor: "Microsoft Corporation".into(),
            product_name: "Virtual Machine".into(),
            bios_vendor: "Microsoft Corporation".into(),
            chassis_asset_tag: "7783-7084-3265-9085-8269-3286-77".into(),
        };
        let d = detect(&azure);
        assert_eq!(d.cloud, Some(Cloud::Azure));
        assert_eq!(
            d.describe(),
            "preset azure (auto, from chassis_asset_tag \"7783-7084-3265-9085-8269-3286-77\")"
        );
        // A Hyper-V guest elsewhere carries the vendor but not the tag.
        let hyperv = Dmi {
            chassis_asset_tag: "".into(),
            ..azure
        };
        assert_eq!(detect(&hyperv).cloud, None);
        assert_eq!(
            detect(&hyperv).describe(),
            "preset auto: no cloud recognized (the default endpoints apply)"
        );
        let cases = [
            ("Amazon EC2", "", "", Cloud::Aws),
            ("", "", "Amazon EC2", Cloud::Aws),
            ("Google", "Google Compute Engine", "Google", Cloud::Gcp),
            ("Alibaba Cloud", "Alibaba Cloud ECS", "", Cloud::Alibaba),
            (
                "OpenStack Foundation",
                "OpenStack Nova",
                "",
                Cloud::Openstack,
            ),
            ("", "OpenStack Nova", "SeaBIOS", Cloud::Openstack),
        ];
        for (sys, product, bios, cloud) in cases {
            let d = Dmi {
                sys_vendor: sys.into(),
                product_name: product.into(),
                bios_vendor: bios.into(),
                chassis_asset_tag: String::new(),
            };
            assert_eq!(detect(&d).cloud, Some(cloud), "{d:?}");
        }
        // A look-alike is not the cloud: values are compared whole.
        let d = Dmi {
            sys_vendor: "Googleplex Labs".into(),
            ..Dmi::default()
        };
        assert_eq!(detect(&d).cloud, None);
    }

    fn dmi(sys: &str, product: &str, bios: &str, tag: &str) -> Dmi {
        Dmi {
            sys_vendor: sys.into(),
            product_name: product.into(),
            bios_vendor: bios.into(),
            chassis_asset_tag: tag.into(),
        }
    }

    /// Each cloud added for the IPv6 and regional metadata addresses, from the strings its VMs
    /// carry (docs/clouds.md names each one's source): the deciding field and value, with the
    /// other fields as such VMs show them, so a match on the wrong field would show.
    #[test]
    fn detection_recognizes_every_cloud_with_a_dmi_sign() {
        let cases = [
            // Oracle: QEMU's vendor strings, the asset tag cloud-init's Oracle source reads.
            (
                dmi(
                    "QEMU",
                    "Standard PC (i440FX + PIIX, 1996)",
                    "SeaBIOS",
                    "OracleCloud.com",
                ),
                Cloud::Oracle,
                "chassis_asset_tag \"OracleCloud.com\"",
            ),
            // Huawei: OpenStack's product name, decided by the tag before OpenStack's sign.
            (
                dmi(
                    "OpenStack Foundation",
                    "OpenStack Nova",
                    "SeaBIOS",
                    "HUAWEICLOUD",
                ),
                Cloud::Huawei,
                "chassis_asset_tag \"HUAWEICLOUD\"",
            ),
            (
                dmi("Scaleway", "SCW-PRO2-XS", "SeaBIOS", ""),
                Cloud::Scaleway,
                "sys_vendor \"Scaleway\"",
            ),
            (
                dmi("Tencent Cloud", "CVM", "SeaBIOS", ""),
                Cloud::Tencent,
                "sys_vendor \"Tencent Cloud\"",
            ),
            (
                dmi("Linode", "Compute Instance", "SeaBIOS", ""),
                Cloud::Akamai,
                "sys_vendor \"Linode\"",
            ),
            (
                dmi("Akamai", "Compute Instance", "SeaBIOS", ""),
                Cloud::Akamai,
                "sys_vendor \"Akamai\"",
            ),
            (
                dmi("DigitalOcean", "Droplet", "DigitalOcean", ""),
                Cloud::Digitalocean,
                "sys_vendor \"DigitalOcean\"",
            ),
            (
                dmi("Hetzner", "vServer", "Hetzner", ""),
                Cloud::Hetzner,
                "sys_vendor \"Hetzner\"",
            ),
            (
                dmi("Exoscale", "Exoscale Compute Platform", "SeaBIOS", ""),
                Cloud::Exoscale,
                "product_name \"Exoscale Compute Platform\"",
            ),
            (
                dmi("Vultr", "VC2", "SeaBIOS", ""),
                Cloud::Vultr,
                "sys_vendor \"Vultr\"",
            ),
        ];
        for (d, cloud, because) in cases {
            let got = detect(&d);
            assert_eq!(got.cloud, Some(cloud), "{d:?}");
            assert_eq!(
                got.describe(),
                format!("preset {} (auto, from {because})", cloud.as_str()),
                "{d:?}"
            );
        }
        // Trailing whitespace (as sysfs has a newline) is not part of the value.
        assert_eq!(
            detect(&dmi("", "", "", "OracleCloud.com \n")).cloud,
            Some(Cloud::Oracle)
        );
        // Neither a prefix of a whole-value sign nor a value that only contains a prefix sign.
        for d in [
            dmi("", "", "", "OracleCloud"),
            dmi("", "", "", "huaweicloud"),
            dmi("Hetzner Online GmbH", "", "", ""),
            dmi("", "Not Exoscale", "", ""),
            dmi("QEMU", "Standard PC (Q35 + ICH9, 2009)", "SeaBIOS", ""),
            // IBM Cloud VPC: no DMI string documented or seen, so `auto` does not guess.
            dmi("IBM", "", "", ""),
        ] {
            assert_eq!(detect(&d).cloud, None, "{d:?}");
        }
    }

    /// One row of docs/clouds.md's preset table, in the catalogue's terms.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
    struct Row {
        preset: String,
        address: IpAddr,
        ports: Vec<u16>,
        mode: Option<EndpointMode>,
        source: String,
    }

    /// The rows of the preset table in docs/clouds.md (the table whose header starts with
    /// `| preset | endpoint |`): preset (`(none)` for a row in no preset), the address that
    /// opens the endpoint cell, the ports, the mode's first word, and the first link of the
    /// source cell, or the row above's where the cell says `same`.
    fn doc_rows(md: &str) -> Vec<Row> {
        let mut rows = Vec::new();
        let mut in_table = false;
        let mut last_source = String::new();
        for line in md.lines() {
            if line.starts_with("| preset | endpoint |") {
                in_table = true;
                continue;
            }
            if !in_table {
                continue;
            }
            if !line.starts_with('|') {
                break;
            }
            if line.starts_with("|---") {
                continue;
            }
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            assert!(cells.len() >= 6, "docs/clouds.md row: {line}");
            let address = cells[1]
                .split_whitespace()
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("docs/clouds.md row without an address: {line}"));
            let ports = cells[2]
                .split(',')
                .map(|p| {
                    p.trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("docs/clouds.md port {p:?}: {line}"))
                })
                .collect();
            let mode = EndpointMode::parse(cells[3].split_whitespace().next().unwrap_or(""));
            let source = if cells[5] == "same" {
                last_source.clone()
            } else {
                let start = cells[5]
                    .find("](")
                    .unwrap_or_else(|| panic!("docs/clouds.md row without a source link: {line}"));
                let rest = &cells[5][start + 2..];
                rest[..rest.find(')').expect("a closed link")].to_string()
            };
            last_source = source.clone();
            rows.push(Row {
                preset: cells[0].trim_matches('`').to_string(),
                address,
                ports,
                mode,
                source,
            });
        }
        rows.sort();
        rows
    }

    fn catalogue_rows() -> Vec<Row> {
        let mut rows: Vec<Row> = CATALOGUE
            .iter()
            .map(|e| Row {
                preset: match e.mode {
                    Some(_) => e.cloud.as_str().to_string(),
                    None => "(none)".into(),
                },
                address: e.address,
                ports: e.ports.to_vec(),
                mode: e.mode,
                source: e.source.to_string(),
            })
            .collect();
        rows.sort();
        rows
    }

    /// docs/clouds.md's table and the catalogue are the same rows, both ways: an address,
    /// port, mode or source changed in one and not the other fails here.
    #[test]
    fn the_docs_table_lists_exactly_the_catalogue_with_its_sources() {
        let md = include_str!("../docs/clouds.md");
        let docs = doc_rows(md);
        let code = catalogue_rows();
        let missing: Vec<&Row> = code.iter().filter(|r| !docs.contains(r)).collect();
        let extra: Vec<&Row> = docs.iter().filter(|r| !code.contains(r)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "docs/clouds.md and CATALOGUE differ.\nIn the code, not the docs: {missing:#?}\nIn the docs, not the code: {extra:#?}"
        );
        // The comparison itself: a row dropped from the docs, or a port changed, is seen.
        let dropped = md.replacen(
            "| `oracle` | fd00:c1::a9fe:a9fe",
            "| `oracle` | fd00:c1::1",
            1,
        );
        assert_ne!(doc_rows(&dropped), code);
        let ported = md.replacen("| 80, 32526 |", "| 80 |", 1);
        assert_ne!(doc_rows(&ported), code);
        // Every DMI sign is in the auto table, by field and value.
        for (field, sign, cloud) in DMI_SIGNS {
            let row = md.lines().find(|l| {
                l.starts_with('|')
                    && l.contains(&format!("`{}`", field.file()))
                    && l.contains(&format!("`{sign}`"))
                    && l.contains(&format!("`{}`", cloud.as_str()))
            });
            assert!(
                row.is_some(),
                "docs/clouds.md's auto table has no row for {} {sign:?} -> {}",
                field.file(),
                cloud.as_str()
            );
        }
    }
}
