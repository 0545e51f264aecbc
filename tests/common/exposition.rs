//! The one Prometheus text parser of the Rust tests: strict, for the subset of the text
//! exposition format 0.0.4 that `natguard metrics` writes (`# HELP`, `# TYPE` counter or gauge,
//! samples without timestamps). It is stricter than the Prometheus project's own parser, which
//! accepts a missing final newline, blank lines, timestamps, a sample without a TYPE, a family's
//! samples apart and a repeated series: output a scraper would merely tolerate fails a test.
//! The report's unit tests (`src/tools/report`, which include this file) read the rendered text
//! with it; tests/counters.rs reads a real node's output with it and checks that the Prometheus project's
//! own parser (`prometheus_client`) reads the same families, samples and values.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

pub type Labels = Vec<(String, String)>;

/// Label pairs as the parser returns them, in the order given.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(l, v)| (l.to_string(), v.to_string()))
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    pub value: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub name: String,
    pub help: Option<String>,
    pub kind: Option<String>,
    pub samples: Vec<Sample>,
}

pub fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

pub fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with("__")
}

pub fn unescape_help(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                other => return Err(format!("bad escape in HELP: \\{other:?}")),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

pub fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => return Ok(f64::INFINITY),
        "-Inf" => return Ok(f64::NEG_INFINITY),
        "NaN" => return Ok(f64::NAN),
        _ => {}
    }
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit() || ".eE+-".contains(c)) {
        return Err(format!("bad value {s:?}"));
    }
    s.parse::<f64>()
        .map_err(|e| format!("bad value {s:?}: {e}"))
}

/// `name{label="value",...} value`, labels optional.
pub fn parse_sample(line: &str) -> Result<(String, Labels, f64), String> {
    let name_end = line.find(['{', ' ']).ok_or("sample without a value")?;
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels: Labels = vec![];
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        if let Some((i, '}')) = chars.peek().copied() {
            rest = &after[i + 1..];
        } else {
            loop {
                let mut label = String::new();
                while let Some((_, c)) =
                    chars.next_if(|&(_, c)| c.is_ascii_alphanumeric() || c == '_')
                {
                    label.push(c);
                }
                if !matches!(chars.next(), Some((_, '='))) || !is_label_name(&label) {
                    return Err(format!("bad label name {label:?}"));
                }
                if labels.iter().any(|(l, _)| *l == label) {
                    return Err(format!("label {label:?} given twice"));
                }
                if !matches!(chars.next(), Some((_, '"'))) {
                    return Err(format!("label {label:?}: value not quoted"));
                }
                let mut value = String::new();
                loop {
                    match chars.next() {
                        Some((_, '"')) => break,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\')) => value.push('\\'),
                            Some((_, '"')) => value.push('"'),
                            Some((_, 'n')) => value.push('\n'),
                            other => return Err(format!("label {label:?}: bad escape {other:?}")),
                        },
                        Some((_, c)) => value.push(c),
                        None => return Err(format!("label {label:?}: unterminated value")),
                    }
                }
                labels.push((label, value));
                match chars.next() {
                    Some((_, ',')) => continue,
                    Some((i, '}')) => {
                        rest = &after[i + 1..];
                        break;
                    }
                    Some((_, c)) => return Err(format!("after a label value: {c:?}")),
                    None => return Err("unterminated label set".into()),
                }
            }
        }
    }
    let value = rest
        .strip_prefix(' ')
        .ok_or_else(|| format!("no single space before the value in {line:?}"))?;
    if value.contains(' ') {
        return Err(format!("trailing fields (timestamp?) in {line:?}"));
    }
    Ok((name.to_string(), labels, parse_value(value)?))
}

pub fn parse_exposition(text: &str) -> Result<Vec<Metric>, String> {
    let body = text
        .strip_suffix('\n')
        .ok_or("does not end with a newline")?;
    let mut metrics: Vec<Metric> = vec![];
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut series: HashSet<(String, Labels)> = HashSet::new();
    let mut current: Option<String> = None;
    for (n, line) in body.split('\n').enumerate() {
        let at = |e: String| format!("line {}: {e}", n + 1);
        if line.is_empty() || line.contains('\r') {
            return Err(at("blank line or carriage return".into()));
        }
        let mut entry = |name: &str| -> usize {
            *index.entry(name.to_string()).or_insert_with(|| {
                metrics.push(Metric {
                    name: name.to_string(),
                    help: None,
                    kind: None,
                    samples: vec![],
                });
                metrics.len() - 1
            })
        };
        if let Some(comment) = line.strip_prefix('#') {
            let (keyword, rest) = if let Some(r) = comment.strip_prefix(" HELP ") {
                ("HELP", r)
            } else if let Some(r) = comment.strip_prefix(" TYPE ") {
                ("TYPE", r)
            } else {
                return Err(at(format!("not a HELP or TYPE line: {line:?}")));
            };
            let (name, arg) = rest
                .split_once(' ')
                .ok_or_else(|| at(format!("{keyword} without text")))?;
            if !is_metric_name(name) {
                return Err(at(format!("bad metric name {name:?}")));
            }
            let i = entry(name);
            let m = &mut metrics[i];
            if !m.samples.is_empty() {
                return Err(at(format!("{keyword} for {name} after its samples")));
            }
            if keyword == "HELP" {
                if m.help.is_some() {
                    return Err(at(format!("second HELP for {name}")));
                }
                m.help = Some(unescape_help(arg).map_err(at)?);
            } else {
                if m.kind.is_some() {
                    return Err(at(format!("second TYPE for {name}")));
                }
                if arg != "counter" && arg != "gauge" {
                    return Err(at(format!("type {arg:?} for {name}")));
                }
                m.kind = Some(arg.to_string());
            }
            continue;
        }
        let (name, labels, value) = parse_sample(line).map_err(at)?;
        let i = entry(&name);
        let m = &mut metrics[i];
        if m.kind.is_none() {
            return Err(at(format!("sample of {name} before its TYPE")));
        }
        if current.as_deref() != Some(name.as_str()) && !m.samples.is_empty() {
            return Err(at(format!("samples of {name} are not together")));
        }
        current = Some(name.clone());
        let mut key = labels.clone();
        key.sort();
        if !series.insert((name.clone(), key)) {
            return Err(at(format!("duplicate series {line:?}")));
        }
        m.samples.push(Sample { labels, value });
    }
    Ok(metrics)
}
