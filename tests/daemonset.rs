//! scripts/daemonset.yaml, parsed: the fields that make natguard's installer work on real nodes
//! with no more privilege than it needs.
//!
//! The file is read with a strict parser for the subset of YAML it is written in (block maps and
//! sequences, flow sequences of scalars, plain and double-quoted scalars, comments). Anything
//! outside that subset (tabs, anchors, block scalars, flow maps) fails the test instead of being
//! misread, so a change to the file's style shows up here first.

use serde_json::{json, Map, Value};
use std::process::Command;

const DAEMONSET: &str = include_str!("../scripts/daemonset.yaml");

/// A line of the document: its indent and its text without the comment.
struct Line<'a> {
    indent: usize,
    text: &'a str,
    no: usize,
}

fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    let b = line.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'"' if i == 0 || b[i - 1] != b'\\' => quoted = !quoted,
            b'#' if !quoted && (i == 0 || b[i - 1] == b' ') => return line[..i].trim_end(),
            _ => {}
        }
    }
    line.trim_end()
}

fn lines(doc: &str) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    for (no, raw) in doc.lines().enumerate() {
        assert!(!raw.contains('\t'), "line {}: a tab", no + 1);
        let text = strip_comment(raw);
        let trimmed = text.trim_start();
        if trimmed.is_empty() {
            continue;
        }
        out.push(Line {
            indent: text.len() - trimmed.len(),
            text: trimmed,
            no: no + 1,
        });
    }
    out
}

fn scalar(s: &str, no: usize) -> Value {
    let s = s.trim();
    assert!(
        !s.starts_with(['&', '*', '|', '>', '{', '\'', '!']),
        "line {no}: {s:?} is outside the YAML subset this test reads"
    );
    if s.starts_with('[') {
        let inner = s
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or_else(|| panic!("line {no}: unterminated flow sequence {s:?}"));
        return Value::Array(split_flow(inner).iter().map(|x| scalar(x, no)).collect());
    }
    if s.starts_with('"') {
        return serde_json::from_str(s).unwrap_or_else(|e| panic!("line {no}: {s}: {e}"));
    }
    match s {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => s
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(s.to_string())),
    }
}

/// The items of a flow sequence's inside, split at commas outside quotes.
fn split_flow(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c)
            }
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

/// `key: value` or `key:`; None if the text is not a map entry.
fn map_entry(text: &str) -> Option<(&str, &str)> {
    if text.starts_with('"') || text.starts_with('[') {
        return None;
    }
    match text.split_once(": ") {
        Some((k, v)) => Some((k, v)),
        None => text.strip_suffix(':').map(|k| (k, "")),
    }
}

/// Parses the block starting at `lines[*i]`, whose lines have indent `indent`.
fn block(lines: &mut Vec<Line<'_>>, i: &mut usize, indent: usize) -> Value {
    let first = &lines[*i];
    if first.text == "-" || first.text.starts_with("- ") {
        let mut seq = Vec::new();
        while *i < lines.len() && lines[*i].indent == indent && lines[*i].text.starts_with('-') {
            let l = &lines[*i];
            let rest = l.text[1..].trim_start();
            if rest.is_empty() {
                *i += 1;
                let child = lines[*i].indent;
                assert!(child > indent, "line {}: empty item", l.no);
                seq.push(block(lines, i, child));
            } else if map_entry(rest).is_some() {
                // "- key: v": a map whose first key sits where the text starts.
                let col = indent + (l.text.len() - rest.len());
                let (no, text) = (l.no, rest);
                lines[*i] = Line {
                    indent: col,
                    text,
                    no,
                };
                seq.push(block(lines, i, col));
            } else {
                seq.push(scalar(rest, l.no));
                *i += 1;
            }
        }
        return Value::Array(seq);
    }
    let mut map = Map::new();
    while *i < lines.len() && lines[*i].indent == indent {
        let l = &lines[*i];
        let (no, text) = (l.no, l.text);
        let (key, value) =
            map_entry(text).unwrap_or_else(|| panic!("line {no}: {text:?} is not `key: value`"));
        assert!(!map.contains_key(key), "line {no}: duplicate key {key}");
        *i += 1;
        let v = if !value.is_empty() {
            scalar(value, no)
        } else if *i < lines.len()
            && (lines[*i].indent > indent
                || (lines[*i].indent == indent && lines[*i].text.starts_with('-')))
        {
            let child = lines[*i].indent;
            block(lines, i, child)
        } else {
            Value::Null
        };
        map.insert(key.to_string(), v);
    }
    if *i < lines.len() {
        assert!(
            lines[*i].indent < indent,
            "line {}: bad indentation",
            lines[*i].no
        );
    }
    Value::Object(map)
}

fn parse(doc: &str) -> Value {
    let mut ls = lines(doc);
    let mut i = 0;
    let v = block(&mut ls, &mut i, 0);
    assert_eq!(
        i,
        ls.len(),
        "line {}: not parsed",
        ls.get(i).map_or(0, |l| l.no)
    );
    v
}

#[test]
fn the_subset_parser_reads_what_it_claims() {
    let v = parse("a: 1\nb:\n  - x\n  - k: \"v # not a comment\"\n    n: true # comment\nc: [\"p\", q]\nd:\n- e\n");
    assert_eq!(
        v,
        json!({"a": 1, "b": ["x", {"k": "v # not a comment", "n": true}], "c": ["p", "q"], "d": ["e"]})
    );
}

#[test]
fn the_daemonset_runs_the_installer_with_what_it_needs_and_no_more() {
    let ds = parse(DAEMONSET);
    assert_eq!(ds["kind"], "DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], "kube-system");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(pod["automountServiceAccountToken"], false);
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(
        c["image"],
        format!("natguard:{}", env!("CARGO_PKG_VERSION"))
    );
    // The image's entrypoint runs alone: `install --watch`, natguard's default entry.
    assert!(c.get("args").is_none() && c.get("command").is_none(), "{c}");

    let sc = &c["securityContext"];
    assert_eq!(
        sc,
        &json!({
            "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false,
            "privileged": false, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
            "seccompProfile": {"type": "RuntimeDefault"},
            // What CNI installers run as on SELinux-enforcing nodes, to write the host's CNI dirs.
            "seLinuxOptions": {"type": "spc_t"},
        })
    );
    assert_eq!(
        c["readinessProbe"]["exec"]["command"],
        json!(["/natguard", "install", "--check"])
    );

    // The host dirs: the CNI bin and netconf dirs, the CNI cache read-only, natguard's run dir.
    let mut mounts: Vec<(String, String, bool)> = Vec::new();
    for m in c["volumeMounts"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let vol = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"));
        let host = vol["hostPath"]["path"].as_str().unwrap();
        assert_eq!(
            m["mountPath"], host,
            "{name} is mounted elsewhere than on the host"
        );
        mounts.push((host.to_string(), name.to_string(), m["readOnly"] == true));
    }
    mounts.sort();
    let want = [
        ("/etc/cni/net.d", "cni-netconf", false),
        ("/opt/cni/bin", "cni-bin", false),
        ("/run/natguard", "run-natguard", false),
        ("/var/lib/cni", "cni-state", true),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(h, n, ro)| (h.to_string(), n.to_string(), *ro))
        .collect();
    assert_eq!(mounts, want);
}

#[test]
fn cleanup_on_exit_is_a_commented_opt_in_the_binary_knows() {
    let line = DAEMONSET
        .lines()
        .find(|l| l.contains("--cleanup-on-exit"))
        .expect("the DaemonSet mentions --cleanup-on-exit");
    assert_eq!(line.trim(), r#"# args: ["--cleanup-on-exit"]"#);
    let out = Command::new(env!("CARGO_BIN_EXE_natguard"))
        .args(["install", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--cleanup-on-exit"));
}
