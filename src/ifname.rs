//! Interface names as the kernel stores them.
//!
//! The configuration (`metadata.allowInterfaces`), the plan (set elements keyed by interface),
//! the lowering of those elements to nf_tables messages and the node facts (the pod's host-side
//! interfaces) all handle interface names. This type is the one check of what the kernel
//! accepts. It sits at the bottom of the layers, so that each of them can use it without
//! depending on another (the plan re-exports it as `plan::IfName`).

/// An interface name as the kernel stores it: at most 15 bytes, NUL-padded to 16.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IfName([u8; 16]);

impl IfName {
    /// `None` for a name the kernel would not accept (empty, or longer than 15 bytes).
    pub fn new(name: &str) -> Option<IfName> {
        let b = name.as_bytes();
        if b.is_empty() || b.len() > 15 || b.contains(&0) {
            return None;
        }
        let mut buf = [0u8; 16];
        buf[..b.len()].copy_from_slice(b);
        Some(IfName(buf))
    }
    pub fn from_bytes(b: &[u8]) -> Option<IfName> {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        IfName::new(std::str::from_utf8(&b[..end]).ok()?)
    }
    pub fn bytes(&self) -> &[u8; 16] {
        &self.0
    }
    pub fn as_str(&self) -> &str {
        let end = self.0.iter().position(|&c| c == 0).unwrap_or(16);
        std::str::from_utf8(&self.0[..end]).unwrap_or("")
    }
}

impl std::fmt::Debug for IfName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl std::fmt::Display for IfName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
