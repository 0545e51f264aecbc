//! `natguard adopt` and `natguard reconcile`.
pub fn cli(_args: &[String], _reconcile: bool) -> i32 {
    eprintln!("natguard adopt: not available yet");
    1
}
