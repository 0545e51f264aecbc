//! natguard: a CNI chained plugin that puts every new pod under the node's metadata-interception
//! and masquerade policy before any of its containers start, and removes stale conntrack flows of
//! the pod's addresses.
//!
//! The code reads top-down, each layer using only the ones below it:
//! - [`verbs`] (ADD, DEL, CHECK, GC, STATUS) and [`tools`] (`status`, `adopt`, `install`, ...):
//!   parse, plan, hand the plan to the store, reply; an ADD that rewrote the shared objects
//!   restores the other pods with `adopt`; DEL leaves a tombstone (`deleted`) so that no restore
//!   from the runtimes' cache brings a deleted pod back;
//! - `prepare`: one attachment validated and planned, the same for ADD and for `adopt`'s cached
//!   results;
//! - [`cni`]: the protocol (verbs, versions, environment, CNI_ARGS, the network configuration,
//!   prevResult, replies);
//! - `store`: natguard's state as owner records, under the node-wide lock, reaching the kernel
//!   only through the narrow `kernel::Kernel` trait (a recording fake tests it without root);
//! - [`kernel`]: the netlink socket, the lowering of plan objects to nf_tables messages, reads,
//!   transactions, conntrack deletes, and rtnetlink facts about interfaces;
//! - [`plan`]: pure; (config, node facts, pod) → desired objects, their names and the record
//!   format, rendered as nft text; [`policy`]: pure, a pod's effective metadata policy from its
//!   network, namespace and `natguard.io/` annotations;
//! - [`config`] (natguard's own sections), `addr` (address arithmetic and the rules for a pod's
//!   address), `ifname` (interface names as the kernel stores them), [`node`] (facts looked up
//!   before planning), `sys` (the kernel's small procfs and sysfs files), `fsutil` (the one
//!   atomic file write), [`lock`] (the node lock with its deadline), [`log`] (levels,
//!   rotation, never blocking), [`error`] (one error type and its CNI codes).
//!
//! `main.rs` only dispatches. What tests and the fuzzer need is `pub`; the rest is `pub(crate)`.

pub(crate) mod addr;
pub mod clouds;
pub mod cni;
pub mod config;
pub(crate) mod ctpass;
pub(crate) mod deleted;
pub mod error;
pub(crate) mod fsutil;
pub(crate) mod ifname;
pub mod kernel;
pub mod lock;
pub mod log;
pub mod node;
pub mod plan;
pub mod policy;
pub(crate) mod prepare;
pub(crate) mod proxy;
pub mod restore;
pub(crate) mod store;
pub(crate) mod sys;
pub mod tools;
pub mod verbs;
