//! The node tools run by hand or by the DaemonSet: `status`, `metrics`, `adopt`/`reconcile`,
//! `install`. They reach kernel state only through the store, and plan pods only through the
//! verbs' preparation.

pub mod adopt;
pub mod install;
pub mod metrics;
pub(crate) mod report;
pub mod status;
