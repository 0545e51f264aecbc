//! natguard's entry spliced into a conflist as text, so every other byte of the file survives.
//!
//! Re-serializing a list would change what its owner wrote: key order, number spellings such as
//! `1.44e3`, escapes, indentation. Instead a small scanner finds the byte spans of the top-level
//! `plugins` array and its elements in a text already known to be valid JSON, and the entry is
//! appended after the last element (or replaces one, or is cut out with its separator), rendered
//! in the layout the list already uses: compact lists stay compact, pretty ones get the same
//! indent unit. The scanner only has to be right on valid JSON; its result is parsed back and
//! compared with the intended document by `checked_text`, which falls back to a fresh
//! serialization of that document if the splice ever disagrees with it.

use serde_json::Value;

/// Byte spans of a JSON text that is already known to be valid.
struct Spans<'a> {
    b: &'a [u8],
}

impl Spans<'_> {
    fn ws(&self, mut i: usize) -> usize {
        while i < self.b.len() && matches!(self.b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    /// End (exclusive) of the value starting at `i`.
    fn value_end(&self, i: usize) -> usize {
        let b = self.b;
        match b[i] {
            b'"' => self.string_end(i),
            b'{' | b'[' => {
                let mut depth = 0usize;
                let mut j = i;
                while j < b.len() {
                    match b[j] {
                        b'"' => {
                            j = self.string_end(j);
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return j + 1;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                j
            }
            _ => {
                let mut j = i;
                while j < b.len()
                    && !matches!(b[j], b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
                {
                    j += 1;
                }
                j
            }
        }
    }

    fn string_end(&self, i: usize) -> usize {
        let mut j = i + 1;
        while j < self.b.len() {
            match self.b[j] {
                b'\\' => j += 2,
                b'"' => return j + 1,
                _ => j += 1,
            }
        }
        j
    }

    /// (key start, value start, value end) of each member of the object starting at `i`.
    fn members(&self, i: usize) -> Vec<(usize, usize, usize, String)> {
        let mut out = Vec::new();
        let mut j = self.ws(i + 1);
        while j < self.b.len() && self.b[j] == b'"' {
            let key_end = self.string_end(j);
            let key: String = std::str::from_utf8(&self.b[j..key_end])
                .ok()
                .and_then(|k| serde_json::from_str(k).ok())
                .unwrap_or_default();
            let colon = self.ws(key_end);
            let vs = self.ws(colon + 1);
            let ve = self.value_end(vs);
            out.push((j, vs, ve, key));
            j = self.ws(ve);
            if j < self.b.len() && self.b[j] == b',' {
                j = self.ws(j + 1);
            }
        }
        out
    }

    /// (start, end) of each element of the array starting at `i`.
    fn elements(&self, i: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut j = self.ws(i + 1);
        while j < self.b.len() && self.b[j] != b']' {
            let e = self.value_end(j);
            out.push((j, e));
            j = self.ws(e);
            if j < self.b.len() && self.b[j] == b',' {
                j = self.ws(j + 1);
            }
        }
        out
    }
}

/// Where the `plugins` array of a list text is: (indent unit, array start, element spans).
struct PluginsText {
    unit: String,
    start: usize,
    end: usize,
    elements: Vec<(usize, usize)>,
}

fn plugins_text(text: &str) -> Option<PluginsText> {
    let s = Spans { b: text.as_bytes() };
    let top = s.ws(0);
    if s.b.get(top) != Some(&b'{') {
        return None;
    }
    // With duplicate keys the last one is the one that counts, as for every JSON decoder here.
    let (key_start, vs, ve, _) = s.members(top).into_iter().rfind(|m| m.3 == "plugins")?;
    if s.b[vs] != b'[' {
        return None;
    }
    let unit = indent_before(text, key_start)
        .filter(|u| !u.is_empty())
        .unwrap_or("  ")
        .to_string();
    Some(PluginsText {
        unit,
        start: vs,
        end: ve,
        elements: s.elements(vs),
    })
}

/// The whitespace between the start of the line and `pos`, if only whitespace precedes `pos` on
/// its line.
fn indent_before(text: &str, pos: usize) -> Option<&str> {
    let line_start = text[..pos].rfind('\n')? + 1;
    let ind = &text[line_start..pos];
    ind.chars().all(|c| c == ' ' || c == '\t').then_some(ind)
}

/// natguard's entry as text for a list laid out like `text`, at `indent`.
fn render_entry(entry: &Value, pretty: bool, indent: &str, unit: &str) -> String {
    if !pretty {
        return serde_json::to_string(entry).expect("a JSON value serializes");
    }
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(unit.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    serde::Serialize::serialize(entry, &mut ser).expect("a JSON value serializes");
    String::from_utf8(buf)
        .expect("serde_json writes UTF-8")
        .replace('\n', &format!("\n{indent}"))
}

/// `text` with natguard's entry appended to `plugins` (or `replace`d at that index).
pub(crate) fn splice_entry(text: &str, entry: &Value, replace: Option<usize>) -> Option<String> {
    let p = plugins_text(text)?;
    let (last_start, last_end) = *p.elements.last()?;
    let pretty = text[p.start + 1..p.elements[0].0].contains('\n');
    let mut out = String::with_capacity(text.len() + 256);
    match replace {
        Some(i) => {
            let (s, e) = *p.elements.get(i)?;
            let indent = indent_before(text, s).unwrap_or("");
            out.push_str(&text[..s]);
            out.push_str(&render_entry(entry, pretty, indent, &p.unit));
            out.push_str(&text[e..]);
        }
        None => {
            let indent = indent_before(text, last_start).unwrap_or("");
            let sep = if pretty {
                format!(",\n{indent}")
            } else if p.elements.len() > 1 {
                // Copy the separator the list already uses, e.g. ", ".
                let prev_end = p.elements[p.elements.len() - 2].1;
                text[prev_end..last_start].to_string()
            } else {
                ",".to_string()
            };
            out.push_str(&text[..last_end]);
            out.push_str(&sep);
            out.push_str(&render_entry(entry, pretty, indent, &p.unit));
            out.push_str(&text[last_end..]);
        }
    }
    Some(out)
}

/// `text` without the plugin at index `i`, with its separator.
pub(crate) fn cut_entry(text: &str, i: usize) -> Option<String> {
    let p = plugins_text(text)?;
    let n = p.elements.len();
    let (s, e) = match (i, n) {
        (_, 0) => return None,
        (0, 1) => (p.start + 1, p.end - 1),
        (0, _) => (p.elements[0].0, p.elements[1].0),
        _ if i < n => (p.elements[i - 1].1, p.elements[i].1),
        _ => return None,
    };
    Some(format!("{}{}", &text[..s], &text[e..]))
}

/// Serializes a whole document the way natguard writes new files.
pub(crate) fn pretty(doc: &Value) -> String {
    let mut s = serde_json::to_string_pretty(doc).expect("a JSON value serializes");
    s.push('\n');
    s
}

/// The edited text if it parses back to exactly `want`; otherwise `want` serialized afresh (the
/// meaning is what matters, and it is checked again here).
pub(crate) fn checked_text(edited: Option<String>, want: &Value) -> String {
    if let Some(t) = edited {
        if serde_json::from_str::<Value>(&t).ok().as_ref() == Some(want) {
            return t;
        }
    }
    pretty(want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn splice_keeps_layout_and_appends() {
        let text = "{\n    \"cniVersion\": \"0.3.1\",\n    \"name\": \"k8s\",\n    \"plugins\": [\n        {\n            \"type\": \"calico\", \"mtu\": 1.50e3\n        },\n        {\"type\": \"portmap\"}\n    ]\n}\n";
        let entry = json!({"type": "natguard", "metadata": {"mode": "deny"}});
        let out = splice_entry(text, &entry, None).unwrap();
        assert!(out.starts_with(&text[..text.find("    ]").unwrap() - 1]));
        assert!(out.contains("1.50e3"));
        assert!(out.contains(
            ",\n        {\n            \"type\": \"natguard\",\n            \"metadata\": {\n                \"mode\": \"deny\"\n            }\n        }\n    ]\n}\n"
        ), "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["plugins"][2], entry);
    }

    #[test]
    fn splice_compact() {
        let text = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}, {"type":"portmap"}]}"#;
        let out = splice_entry(text, &json!({"type":"natguard"}), None).unwrap();
        assert_eq!(
            out,
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}, {"type":"portmap"}, {"type":"natguard"}]}"#
        );
        let back = cut_entry(&out, 2).unwrap();
        assert_eq!(back, text);
        let first = r#"{"name":"n","plugins":[{"type":"natguard"},{"type":"bridge"}]}"#;
        assert_eq!(
            cut_entry(first, 0).unwrap(),
            r#"{"name":"n","plugins":[{"type":"bridge"}]}"#
        );
    }

    #[test]
    fn strings_with_brackets_do_not_confuse_the_scanner() {
        let text =
            r#"{"name":"a]b","x":{"plugins":"no"},"plugins":[{"type":"bridge","s":"}]\"["}]}"#;
        let out = splice_entry(text, &json!({"type":"natguard"}), None).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["plugins"][1]["type"], "natguard");
        assert_eq!(v["plugins"][0]["s"], "}]\"[");
    }
}
