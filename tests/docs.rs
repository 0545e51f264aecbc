//! The documentation's links lead somewhere: every relative link in README.md and docs/*.md
//! names a file of the repository, and a link with a `#fragment` names a heading of that file
//! (GitHub's anchor rules: lower case, punctuation dropped, spaces to hyphens). No root, no
//! network: links to other sites are not followed.
//!
//! docs/operations.md and the binary agree: every metric the exposition code defines and every
//! key `status --json` prints is documented there, and every `natguard_*` metric it names is
//! one the binary prints. The names are read from the code that prints them (the report module
//! and the self-repair record), since running `natguard metrics` in a world with pods needs
//! root.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// README.md and every Markdown file in docs/.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut docs = vec![root.join("README.md")];
    let mut more: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            out.push(line);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` in a line, inline code spans left out.
fn link_targets(line: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            plain.push(c);
        }
    }
    let mut targets = Vec::new();
    let mut rest = plain.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) => {
                targets.push(after[..j].trim().to_string());
                rest = &after[j + 1..];
            }
            None => break,
        }
    }
    targets
}

/// GitHub's anchor for a heading text.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (duplicates get GitHub's `-1`, `-2` suffixes).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose_lines(text) {
        let Some(heading) = line
            .strip_prefix('#')
            .map(|h| h.trim_start_matches('#'))
            .filter(|h| h.starts_with(' '))
        else {
            continue;
        };
        let base = anchor(heading);
        let mut name = base.clone();
        let mut n = 0;
        while seen.contains(&name) {
            n += 1;
            name = format!("{base}-{n}");
        }
        seen.insert(name);
    }
    seen
}

/// Every broken relative link of one document, as "file: target (why)".
fn broken_links(doc: &Path) -> Vec<String> {
    let text = fs::read_to_string(doc).unwrap();
    let name = doc.strip_prefix(ROOT).unwrap_or(doc).display().to_string();
    let mut broken = Vec::new();
    for line in prose_lines(&text) {
        for target in link_targets(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                doc.to_path_buf()
            } else {
                doc.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            if let Some(fragment) = fragment {
                let linked = fs::read_to_string(&path).unwrap_or_default();
                if !anchors(&linked).contains(fragment) {
                    broken.push(format!("{name}: {target} (no heading #{fragment})"));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_readme_and_docs_names_a_file_and_heading_that_exist() {
    let docs = documents();
    assert!(docs.len() >= 5, "README.md and docs/*.md: {docs:?}");
    let mut links = 0;
    let mut broken = Vec::new();
    for doc in &docs {
        let text = fs::read_to_string(doc).unwrap();
        links += prose_lines(&text)
            .iter()
            .map(|l| link_targets(l).len())
            .sum::<usize>();
        broken.extend(broken_links(doc));
    }
    assert!(
        links >= 10,
        "only {links} links found: is the parser reading the files?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_links_every_document_in_docs() {
    let readme = fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let linked: BTreeSet<String> = prose_lines(&readme)
        .iter()
        .flat_map(|l| link_targets(l))
        .map(|t| t.split('#').next().unwrap().to_string())
        .collect();
    for doc in documents().iter().skip(1) {
        let rel = doc.strip_prefix(ROOT).unwrap().display().to_string();
        assert!(linked.contains(&rel), "README.md does not link {rel}");
    }
}

#[test]
fn the_link_checker_finds_a_broken_file_and_a_broken_anchor() {
    let dir = std::env::temp_dir().join(format!("natguard-docs-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("other.md"),
        "# Other\n\n## A `code` heading: yes\n",
    )
    .unwrap();
    let doc = dir.join("doc.md");
    fs::write(
        &doc,
        "[ok](other.md#a-code-heading-yes) [gone](missing.md) [bad](other.md#nope)\n\
         `[not a link](missing.md)`\n```\n[in code](missing2.md)\n```\n[web](https://example.com/x)\n",
    )
    .unwrap();
    let broken = broken_links(&doc);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(
        broken[0].ends_with("missing.md (no such file)"),
        "{broken:?}"
    );
    assert!(
        broken[1].ends_with("other.md#nope (no heading #nope)"),
        "{broken:?}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// The identifiers made of `[A-Za-z0-9_]` that follow `prefix` in `text`, up to the next
/// character outside that set, where `end` comes next.
fn names_after(text: &str, prefix: &str, end: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let after = &rest[i + prefix.len()..];
        let n = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if n > 0 && after[n..].starts_with(end) {
            out.insert(after[..n].to_string());
        }
        rest = &after[n..];
    }
    out
}

fn source(rel: &str) -> String {
    fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every metric name the exposition code defines (`MetricFamily::new("natguard_...", ...)`).
fn metrics_of_the_binary() -> BTreeSet<String> {
    let code = source("src/tools/report/mod.rs");
    let names: BTreeSet<String> = names_after(&code, "\"natguard_", "\"")
        .into_iter()
        .map(|n| format!("natguard_{n}"))
        .collect();
    assert!(
        names.len() >= 15 && names.contains("natguard_up"),
        "{names:?}"
    );
    names
}

/// Every key of `status --json`: the `json!` keys and the keys set by index in the report's
/// JSON section, and the self-repair record's.
fn json_keys_of_the_binary() -> BTreeSet<String> {
    let report = source("src/tools/report/mod.rs");
    let start = report
        .find("// natguard status --json")
        .expect("the JSON section");
    let end = report
        .find("// natguard metrics")
        .expect("the metrics section");
    let json_part = &report[start..end];
    let record = source("src/tools/watcher.rs");
    let to_json =
        &record[record.find("pub fn to_json").unwrap()..record.find("pub fn from_json").unwrap()];
    let mut keys = BTreeSet::new();
    for part in [json_part, to_json] {
        keys.extend(names_after(part, "\"", "\":"));
        keys.extend(names_after(part, "[\"", "\"]"));
    }
    for k in [
        "version",
        "ready",
        "installed",
        "guarding",
        "guard",
        "selfRepair",
        "running",
        "policy",
    ] {
        assert!(keys.contains(k), "the key scan missed {k}: {keys:?}");
    }
    keys
}

#[test]
fn operations_md_documents_every_metric_and_json_key_of_the_binary() {
    let doc = source("docs/operations.md");
    let metrics = metrics_of_the_binary();
    let missing: Vec<&String> = metrics
        .iter()
        .filter(|m| !doc.contains(m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics not in docs/operations.md: {missing:?}"
    );
    let named: BTreeSet<String> = names_after(&doc, "natguard_", "")
        .into_iter()
        .filter(|n| !n.ends_with('_'))
        .map(|n| format!("natguard_{n}"))
        .collect();
    let unknown: Vec<&String> = named.difference(&metrics).collect();
    assert!(
        unknown.is_empty(),
        "docs/operations.md names metrics the binary does not print: {unknown:?}"
    );

    let keys = json_keys_of_the_binary();
    let documented = |k: &str| {
        [
            format!("`{k}`"),
            format!(".{k}`"),
            format!("\"{k}\""),
            format!("`{k},"),
            format!(" {k}`"),
            format!("`{k}[]"),
        ]
        .iter()
        .any(|form| doc.contains(form.as_str()))
    };
    let missing: Vec<&String> = keys.iter().filter(|k| !documented(k)).collect();
    assert!(
        missing.is_empty(),
        "status --json keys not in docs/operations.md: {missing:?}"
    );
}

/// The README's count of `unsafe` blocks is the count in `src/`, and the libc functions its
/// Dependencies section names are ones `src/` calls.
#[test]
fn the_readme_counts_what_the_code_has() {
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    rust_files(&Path::new(ROOT).join("src"), &mut files);
    let code: String = files
        .iter()
        .map(|f| fs::read_to_string(f).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    // Blocks, not comments that mention them.
    let blocks = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.matches("unsafe {").count())
        .sum::<usize>();
    let readme = fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let deps = readme
        .split("## Dependencies")
        .nth(1)
        .expect("README.md has a Dependencies section");
    let deps = deps.split("\n## ").next().unwrap();
    assert!(
        deps.contains(&format!("{blocks} blocks in `src/`")),
        "src/ has {blocks} unsafe blocks; README.md's Dependencies section says otherwise"
    );
    let libc_row = deps
        .lines()
        .find(|l| l.starts_with("| `libc`"))
        .expect("a libc row");
    for name in names_after(libc_row, "(`", "`") {
        assert!(
            code.contains(&format!("libc::{name}")),
            "README.md's libc row names {name}, which src/ does not call"
        );
    }
}

/// scripts/test.sh's header lists every layer the script runs (each `layer` that starts one;
/// the set-up before them is not a layer, and `layer ""` ends the last).
#[test]
fn test_sh_lists_every_layer_it_runs() {
    let text = fs::read_to_string(Path::new(ROOT).join("scripts/test.sh")).unwrap();
    let header: String = text
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let layers: Vec<&str> = text
        .lines()
        // A layer starts at the top level.
        .filter_map(|l| l.strip_prefix("layer \""))
        .map(|l| l.split('"').next().unwrap())
        .filter(|l| !l.is_empty() && !l.starts_with("set-up"))
        .collect();
    assert!(layers.len() >= 9, "{layers:?}");
    for layer in &layers {
        // The layer's name: what its line says before the first ':' or '(' .
        let name = layer.split([':', '(']).next().unwrap().trim();
        assert!(
            header.contains(name),
            "scripts/test.sh runs the layer {layer:?} but its header does not list {name:?}"
        );
    }
    let numbered = header
        .lines()
        .filter(|l| {
            let t = l.trim_start_matches('#').trim_start();
            t.split_once(". ")
                .is_some_and(|(n, _)| n.parse::<u32>().is_ok())
        })
        .count();
    assert_eq!(
        numbered,
        layers.len(),
        "the header's numbered list: {header}"
    );
}
