//! The node tools run by hand or by the DaemonSet: `status`, `adopt`/`reconcile`, `install`.
//! They reach kernel state only through the store, and plan pods only through the verbs'
//! preparation.

pub mod adopt;
pub mod install;
pub mod status;
