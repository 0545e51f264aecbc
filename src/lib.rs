//! natguard: a CNI chained plugin that puts every new pod under the node's metadata-interception
//! and masquerade policy before any of its containers start, and removes stale conntrack flows of
//! the pod's addresses.
//!
//! The binary (`main.rs`) only reads the invocation and prints the reply; everything else lives
//! here so tests can call it: [`cni`] parses the protocol, [`config`] the plugin's configuration,
//! [`plan`] turns (config, pod) into desired kernel objects without touching the kernel, [`nft`]
//! lowers a plan to one nf_tables netlink batch and reads state back, [`conntrack`] deletes flows
//! over ctnetlink.

pub mod adopt;
pub mod cni;
pub mod config;
pub mod conntrack;
pub mod error;
pub mod install;
pub mod lock;
pub mod log;
pub mod netlink;
pub mod nft;
pub mod node;
pub mod plan;
pub mod plugin;
pub mod status;
