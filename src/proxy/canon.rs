//! The canonical request: what the proxy decides on is exactly what the upstream will see.
//!
//! A pod's request target is read once, strictly, into [`Canon`]: its path segments and its
//! query pairs, percent-decoded once. Anything that two parsers could read two ways is refused
//! here rather than normalised: an encoded slash, dot, percent (double encoding) or control
//! byte, a backslash, non-ASCII, an empty segment (`//`), a dot segment (`.` or `..`), a
//! fragment, a repeated query key. Paths of every cloud's metadata API are plain ASCII words,
//! so nothing a client legitimately sends is lost. The upstream request is then re-serialised
//! from [`Canon`] ([`Canon::target`]), never copied from the client's bytes.

/// The characters a path segment or query value may hold once decoded: what metadata APIs'
/// paths are made of (RFC 3986's unreserved set, plus `,` `:` `=` `@` `+` seen in GCP
/// attribute and Azure names).
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b',' | b':' | b'@' | b'+')
}

/// A request target read into segments and query pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canon {
    /// The path's segments, decoded; `[]` for `/`.
    pub segments: Vec<String>,
    /// The path ends in `/` (a directory listing on the clouds that have them).
    pub dir: bool,
    /// The query's pairs in the client's order, decoded; keys are unique.
    pub query: Vec<(String, String)>,
}

impl Canon {
    /// The path as the upstream will see it.
    pub fn path(&self) -> String {
        let mut p = String::from("/");
        p.push_str(&self.segments.join("/"));
        if self.dir && !self.segments.is_empty() {
            p.push('/');
        }
        p
    }

    /// The value of query key `k`.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    /// Path and query, re-serialised (query keys in the order given by `order`; the caller has
    /// already refused keys it does not know).
    pub fn target(&self, order: &[&str]) -> String {
        let mut t = self.path();
        let mut first = true;
        for k in order {
            if let Some(v) = self.get(k) {
                t.push(if first { '?' } else { '&' });
                first = false;
                t.push_str(k);
                t.push('=');
                t.push_str(v);
            }
        }
        t
    }
}

/// Decodes `%XX` once; the decoded byte must be [`plain`] but not `.` (an encoded dot is how
/// dot segments are smuggled), so `%2F`, `%2E`, `%25`, `%00` and every other encoded byte that
/// could mean something else is refused.
fn decode(raw: &str, what: &str) -> Result<String, String> {
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            let hex = |x: u8| (x as char).to_digit(16);
            let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) else {
                return Err(format!("a malformed percent-encoding in the {what}"));
            };
            let d = (h * 16 + l) as u8;
            if !plain(d) || d == b'.' {
                return Err(format!(
                    "an encoded byte 0x{d:02x} in the {what} (encoded slashes, dots, percents and control bytes are refused)"
                ));
            }
            out.push(d);
            i += 3;
        } else if plain(c) {
            out.push(c);
            i += 1;
        } else {
            return Err(format!(
                "the byte 0x{c:02x} in the {what} (only letters, digits and -._~,:=@+ are accepted)"
            ));
        }
    }
    // Only ASCII went in.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// Reads an origin-form request target (`/path?query`). `Err` says why it is refused.
pub fn parse(target: &str) -> Result<Canon, String> {
    if !target.starts_with('/') {
        return Err("the request target is not origin-form (absolute-form, authority-form and * are refused)".into());
    }
    if target.len() > 1024 {
        return Err("the request target is longer than 1024 bytes".into());
    }
    if target.contains('#') {
        return Err("a fragment in the request target".into());
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let mut segments = Vec::new();
    let inner = &path[1..];
    let dir = inner.ends_with('/');
    let inner = inner.strip_suffix('/').unwrap_or(inner);
    if !inner.is_empty() {
        for raw in inner.split('/') {
            if raw.is_empty() {
                return Err("an empty path segment (//)".into());
            }
            let s = decode(raw, "path")?;
            if s == "." || s == ".." {
                return Err("a dot segment in the path".into());
            }
            segments.push(s);
        }
    } else if dir {
        // "//": an empty segment.
        return Err("an empty path segment (//)".into());
    }
    let mut pairs: Vec<(String, String)> = Vec::new();
    if let Some(q) = query {
        if q.is_empty() {
            return Err("an empty query".into());
        }
        for part in q.split('&') {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            if k.is_empty() {
                return Err("an empty query key".into());
            }
            if v.contains('=') {
                return Err("a query value with '='".into());
            }
            let k = decode(k, "query")?;
            let v = decode(v, "query")?;
            if pairs.iter().any(|(key, _)| *key == k) {
                return Err(format!("the query key {k:?} given twice"));
            }
            pairs.push((k, v));
        }
    }
    Ok(Canon {
        segments,
        dir,
        query: pairs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_targets_read_back_as_they_were() {
        for t in [
            "/",
            "/latest/meta-data/",
            "/latest/meta-data/placement/region",
            "/computeMetadata/v1/instance/zone?alt=json",
            "/metadata/instance/compute/location?api-version=2021-02-01&format=text",
            "/openstack/latest/meta_data.json",
        ] {
            let c = parse(t).unwrap();
            let order: Vec<&str> = c.query.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(c.target(&order), t, "{t}");
        }
        let c = parse("/a/b/").unwrap();
        assert_eq!((c.segments.len(), c.dir), (2, true));
        // An encoded letter is decoded once and re-serialised plainly.
        assert_eq!(parse("/l%61test/").unwrap().path(), "/latest/");
    }

    #[test]
    fn ambiguous_targets_are_refused() {
        for t in [
            "http://169.254.169.254/latest/",
            "169.254.169.254:80",
            "*",
            "",
            "//latest",
            "/latest//meta-data",
            "//",
            "/latest/./meta-data",
            "/latest/../user-data",
            "/latest/%2e%2e/user-data",
            "/latest/%2E/x",
            "/latest%2fmeta-data",
            "/latest/%252e%252e/",
            "/latest/%00",
            "/latest/%",
            "/latest/%g0",
            "/latest\\meta-data",
            "/latest/meta-data#x",
            "/latest/m\u{e9}ta",
            "/a b",
            "/a?",
            "/a?x=1&x=2",
            "/a?=1",
            "/a?x=1=2",
            "/a?x=%2f",
            "/a;b",
        ] {
            assert!(parse(t).is_err(), "{t:?} was accepted: {:?}", parse(t));
        }
    }
}
