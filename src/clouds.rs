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

/// The clouds natguard has a preset for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cloud {
    Aws,
    Gcp,
    Azure,
    Alibaba,
    /// OpenStack, and every cloud whose only endpoint is an OpenStack-style metadata service
    /// at 169.254.169.254 (Oracle Cloud, DigitalOcean).
    Openstack,
}

impl Cloud {
    pub const ALL: [Cloud; 5] = [
        Cloud::Aws,
        Cloud::Gcp,
        Cloud::Azure,
        Cloud::Alibaba,
        Cloud::Openstack,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cloud::Aws => "aws",
            Cloud::Gcp => "gcp",
            Cloud::Azure => "azure",
            Cloud::Alibaba => "alibaba",
            Cloud::Openstack => "openstack",
        }
    }

    pub fn parse(s: &str) -> Option<Cloud> {
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

const IMDS: IpAddr = v4(169, 254, 169, 254);

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
        source: "https://cloud.google.com/compute/docs/metadata/querying-metadata",
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
        what: "OpenStack metadata service (also Oracle Cloud, DigitalOcean)",
        source: "https://docs.openstack.org/nova/latest/user/metadata.html",
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

/// The DMI values that name a cloud, compared whole (after trimming), first match wins.
/// Azure's VMs carry a fixed chassis asset tag (their vendor string is Hyper-V's, shared with
/// every Hyper-V guest); the others name themselves in the system vendor or product name.
pub const DMI_SIGNS: &[(DmiField, &str, Cloud)] = &[
    (
        DmiField::ChassisAssetTag,
        "7783-7084-3265-9085-8269-3286-77",
        Cloud::Azure,
    ),
    (DmiField::SysVendor, "Amazon EC2", Cloud::Aws),
    (DmiField::BiosVendor, "Amazon EC2", Cloud::Aws),
    (DmiField::SysVendor, "Google", Cloud::Gcp),
    (DmiField::ProductName, "Google Compute Engine", Cloud::Gcp),
    (DmiField::SysVendor, "Alibaba Cloud", Cloud::Alibaba),
    (DmiField::ProductName, "Alibaba Cloud ECS", Cloud::Alibaba),
    (
        DmiField::SysVendor,
        "OpenStack Foundation",
        Cloud::Openstack,
    ),
    (DmiField::ProductName, "OpenStack Nova", Cloud::Openstack),
];

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
        .find(|(field, value, _)| field.of(d).trim() == *value)
        .map(|(field, value, cloud)| PresetChoice {
            cloud: Some(*cloud),
            why: PresetReason::Detected {
                field: *field,
                value: value.to_string(),
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
        }
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
}
