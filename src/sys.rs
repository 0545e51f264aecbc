//! Reading the kernel's small files (procfs, sysfs): the one helper every layer may use, the
//! kernel layer included, so none of them reaches up into another for it.

/// A small file of the kernel's (procfs, sysfs) read whole into a buffer of `cap` bytes made
/// up front: procfs gives no size, and growing a buffer from 32 bytes costs a read each step.
pub(crate) fn read_small(path: &str, cap: usize) -> Option<String> {
    use std::io::Read as _;
    let mut s = String::with_capacity(cap);
    std::fs::File::open(path)
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}
