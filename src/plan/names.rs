//! Names of natguard's kernel objects and of what a pod owns.
//!
//! A network's chains and sets are named `PREFIX-SUFFIX`, where the prefix is the network name
//! when it is short and a cut name plus a hash tag when it is long (nft object names are
//! limited). Everything one attachment owns is keyed by an [`OwnerKey`], a hash of (network,
//! container ID, ifname), so DEL finds it from the CNI environment alone. Both hashes are FNV-1a:
//! stable across releases, so keys written by one version are found by the next.

use super::{ChainKind, SetKind};
use std::hash::Hasher;

/// Network names up to this length are used as they are.
pub const MAX_PLAIN_PREFIX: usize = 40;
/// A longer name keeps this many bytes, then `~` and 16 hex digits: 40 bytes again.
const CUT_PREFIX: usize = MAX_PLAIN_PREFIX - 17;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetNames {
    pub network: String,
    prefix: String,
}

impl NetNames {
    /// Network names are validated by the config parser (alphanumerics, `_`, `.`, `-`), so a
    /// `~` never appears in one. A name longer than [`MAX_PLAIN_PREFIX`] is cut and tagged
    /// with its 64-bit hash, so every object name stays well under nft's limits. Two long
    /// names could still share a prefix in principle; the store refuses the second network's
    /// ADD when the objects it would write carry another network's name.
    pub fn new(network: &str) -> Self {
        let prefix = if network.len() <= MAX_PLAIN_PREFIX {
            network.to_string()
        } else {
            format!(
                "{}~{:016x}",
                &network[..CUT_PREFIX],
                fnv1a64(network.as_bytes())
            )
        };
        NetNames {
            network: network.to_string(),
            prefix,
        }
    }
    /// A network's own objects are `PREFIX-SUFFIX`; the node-wide guard's have no prefix and
    /// no `-`, so no network's name can ever produce one of them.
    pub fn chain(&self, c: ChainKind) -> String {
        if c.is_node() {
            c.suffix().to_string()
        } else {
            format!("{}-{}", self.prefix, c.suffix())
        }
    }
    pub fn set(&self, s: SetKind) -> String {
        if s.is_node() {
            s.suffix()
        } else {
            format!("{}{}", self.prefix_of_sets(), s.suffix())
        }
    }
    /// The conntrack label bit that marks the network's connections (64 to 127: the upper half,
    /// away from the bits tools name in connlabel.conf). The DNAT chain sets it on what enters
    /// on the network's pods' host sides, and the masquerade rules match it, so a network's
    /// masquerade policy acts on its own pods only, also where another network's pod has the
    /// same address: postrouting does not know the input interface, the conntrack entry does.
    /// Two masquerading networks whose names hash to the same bit (1 in 64) are refused at the
    /// second one's converge (the store names both), as names that map to the same objects are.
    pub fn label_bit(&self) -> u8 {
        64 + (fnv1a64(self.network.as_bytes()) % 64) as u8
    }
    /// What every set name of the network starts with.
    pub fn prefix_of_sets(&self) -> String {
        format!("{}-", self.prefix)
    }
    /// The network a natguard chain name belongs to (for `status`), by its `-dnat` suffix.
    pub fn network_of_chain(name: &str) -> Option<&str> {
        name.strip_suffix("-dnat")
    }
}

/// FNV-1a, 64 bit: stable across releases, unlike std's hasher, so keys written by one version
/// of natguard are found by the next.
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h = Fnv1a64::default();
    h.write(data);
    h.finish()
}

/// A digest of a value through its `Hash`: cheaper than hashing a rendering of it. What
/// `Hash` feeds may change between releases, so such a digest is only for what one boot's
/// natguard compares with itself (the verified-network cache), where a changed digest costs
/// one full comparison and nothing else.
pub(crate) fn digest<T: std::hash::Hash + ?Sized>(v: &T) -> u64 {
    let mut h = Fnv1a64::default();
    v.hash(&mut h);
    h.finish()
}

/// FNV-1a as a [`Hasher`].
struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a64 {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= *b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The key of everything one attachment owns: 16 hex digits of a hash of
/// (network, container ID, ifname), stored as an `ifname`-typed (16-byte string) set key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerKey(pub u64);

impl OwnerKey {
    pub fn new(network: &str, container_id: &str, ifname: &str) -> Self {
        let mut buf = Vec::with_capacity(network.len() + container_id.len() + ifname.len() + 2);
        buf.extend_from_slice(network.as_bytes());
        buf.push(0);
        buf.extend_from_slice(container_id.as_bytes());
        buf.push(0);
        buf.extend_from_slice(ifname.as_bytes());
        OwnerKey(fnv1a64(&buf))
    }
    pub fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
    pub fn parse_hex(s: &str) -> Option<Self> {
        (s.len() == 16)
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
            .map(OwnerKey)
    }
}
