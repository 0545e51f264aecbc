//! The session tokens the proxy mints for pods (`PUT /latest/api/token`), as IMDSv2 does:
//! random, with the TTL the pod asked for, valid only from the address that asked. Their
//! number is bounded per source and in all; the oldest goes first.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

pub const MAX_TOKENS: usize = 8192;
pub const MAX_PER_SOURCE: usize = 64;

#[derive(Default)]
pub struct Tokens {
    held: HashMap<String, (Instant, Instant, IpAddr)>,
}

impl Tokens {
    /// A new token for `src`, valid for `ttl`.
    pub fn mint(&mut self, src: IpAddr, ttl: Duration) -> String {
        let now = Instant::now();
        self.held.retain(|_, (_, until, _)| *until > now);
        let oldest = |held: &HashMap<String, (Instant, Instant, IpAddr)>, only: Option<IpAddr>| {
            held.iter()
                .filter(|(_, (_, _, a))| only.is_none_or(|o| o == *a))
                .min_by_key(|(_, (made, _, _))| *made)
                .map(|(k, _)| k.clone())
        };
        if self.held.values().filter(|(_, _, a)| *a == src).count() >= MAX_PER_SOURCE {
            if let Some(k) = oldest(&self.held, Some(src)) {
                self.held.remove(&k);
            }
        }
        if self.held.len() >= MAX_TOKENS {
            if let Some(k) = oldest(&self.held, None) {
                self.held.remove(&k);
            }
        }
        let token = random_token();
        self.held.insert(token.clone(), (now, now + ttl, src));
        token
    }

    /// Whether `token` is live and was minted for `src`.
    pub fn valid(&self, token: &str, src: IpAddr) -> bool {
        self.held
            .get(token)
            .is_some_and(|(_, until, a)| *a == src && *until > Instant::now())
    }
}

/// 32 random bytes from the kernel, base64url without padding (43 characters).
fn random_token() -> String {
    let mut b = [0u8; 32];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: writes at most the remaining bytes of `b`.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n > 0 {
            got += n as usize;
        }
    }
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(43);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for x in b {
        acc = (acc << 8) | x as u32;
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(A[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(A[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_bound_to_their_source_and_bounded() {
        let mut t = Tokens::default();
        let a: IpAddr = "10.0.0.2".parse().unwrap();
        let b: IpAddr = "10.0.0.3".parse().unwrap();
        let x = t.mint(a, Duration::from_secs(60));
        assert_eq!(x.len(), 43);
        assert!(t.valid(&x, a));
        assert!(!t.valid(&x, b));
        assert!(!t.valid("nope", a));
        let gone = t.mint(a, Duration::from_secs(0));
        assert!(!t.valid(&gone, a));
        for _ in 0..MAX_PER_SOURCE + 5 {
            t.mint(a, Duration::from_secs(60));
        }
        assert!(t.held.values().filter(|(_, _, s)| *s == a).count() <= MAX_PER_SOURCE);
        assert!(!t.valid(&x, a), "the oldest token goes first");
    }
}
