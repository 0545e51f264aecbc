//! The node tools run by hand or by the installer: `status`, `adopt`/`reconcile`. They reach
//! kernel state only through the store, and plan pods only through the verbs' preparation.

pub mod adopt;
pub mod status;
