//! Property: every reference to a numbered invariant in the workspace's
//! sources names one that exists. Modules number their invariants in
//! their docs (`//! Invariants:` then `//! 1. …`, up to a heading); code and comments cite
//! them as "invariant N" (the module's own, or an enclosing module's),
//! "`wal` invariant N" or "invariant N of the endpoint" (the module
//! named). A renumbered list or a moved module that leaves a citation
//! dangling fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Words that may stand before "invariant N" without naming a module.
const NOT_MODULES: &[&str] = &[
    "the", "of", "by", "and", "its", "this", "a", "module", "whose", "see", "keeps", "every",
    "same", "that", "per", "as", "with", "in", "their", "our", "one", "is", "an", "to",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "fuzz" {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// The highest number of a module's `Invariants:` list (0 without one).
fn invariants(text: &str) -> u32 {
    let (mut n, mut inside) = (0, false);
    for l in text.lines() {
        let Some(t) = l.strip_prefix("//!") else {
            if inside {
                break;
            }
            continue;
        };
        let t = t.trim();
        if inside && t.starts_with('#') {
            // A heading ends the list (the module's longer story follows).
            break;
        }
        if t.starts_with("Invariant") {
            inside = true;
        } else if inside {
            if let Some((num, _)) = t.split_once(". ") {
                if let Ok(k) = num.parse::<u32>() {
                    n = n.max(k);
                }
            }
        }
    }
    n
}

/// A file's module name: `a/b.rs` → `b`, `a/b/mod.rs` → `b`.
fn module_name(p: &Path) -> String {
    let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
    if stem == "mod" || stem == "lib" || stem == "main" {
        p.parent()
            .and_then(|d| d.file_name())
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or(stem)
    } else {
        stem
    }
}

/// The file itself, then the modules that enclose it.
fn enclosing(p: &Path, counts: &BTreeMap<PathBuf, u32>) -> Vec<u32> {
    let mut out = vec![counts[p]];
    let mut dir = p.parent();
    while let Some(d) = dir {
        for c in [d.join("mod.rs"), d.with_extension("rs"), d.join("lib.rs")] {
            if c != p {
                if let Some(n) = counts.get(&c) {
                    out.push(*n);
                }
            }
        }
        dir = d.parent();
    }
    out
}

/// The comment text of a file, comment markers dropped and each comment
/// block joined into one line (a citation may wrap).
fn comment_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (i, l) in text.lines().enumerate() {
        let t = l.trim_start();
        let body = ["//!", "///", "//"]
            .iter()
            .find_map(|m| t.strip_prefix(m))
            .or_else(|| l.find("// ").map(|k| &l[k + 2..]));
        match body {
            Some(b) if open => {
                let last = out.last_mut().unwrap();
                last.1.push(' ');
                last.1.push_str(b.trim());
            }
            Some(b) => out.push((i + 1, b.trim().to_owned())),
            None => {}
        }
        open = body.is_some() && (t.starts_with("//"));
    }
    out
}

#[test]
fn every_cited_invariant_exists() {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let texts: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|f| (f.clone(), std::fs::read_to_string(f).unwrap()))
        .collect();
    let counts: BTreeMap<PathBuf, u32> = texts
        .iter()
        .map(|(f, t)| (f.clone(), invariants(t)))
        .collect();
    let mut by_name: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (f, n) in &counts {
        by_name.entry(module_name(f)).or_default().push(*n);
    }
    let mut cited = 0;
    let mut dangling = Vec::new();
    for (f, text) in &texts {
        for (line, block) in comment_blocks(text) {
            let words: Vec<&str> = block.split_whitespace().collect();
            for (i, raw) in words.iter().enumerate() {
                let w = raw
                    .trim_matches(|c: char| !c.is_alphanumeric())
                    .to_lowercase();
                // "Invariants:" or "Invariants (…" heads a list; it cites nothing.
                let heading =
                    raw.ends_with(':') || words.get(i + 1).is_some_and(|n| n.starts_with('('));
                if !(w == "invariant" || w == "invariants") || heading {
                    continue;
                }
                let Some(num) = words.get(i + 1) else {
                    continue;
                };
                // "3", "3,", "3)", "2-4", "1–3": the highest number cited.
                let highest = num
                    .split(['-', '–'])
                    .filter_map(|p| {
                        p.trim_matches(|c: char| !c.is_ascii_digit())
                            .parse::<u32>()
                            .ok()
                    })
                    .max();
                let Some(n) = highest else { continue };
                cited += 1;
                // "X invariant N" names module X; "(invariant N)", "…,
                // invariant N" and a sentence's "Invariant N" cite the
                // enclosing module's.
                let of = match (words.get(i + 2), words.get(i + 3), words.get(i + 4)) {
                    (Some(&"of"), Some(&"the"), Some(m)) | (Some(&"of"), Some(m), _) => Some(*m),
                    _ => None,
                };
                let qualifier = i
                    .checked_sub(1)
                    .filter(|_| of.is_none())
                    .filter(|k| {
                        !raw.starts_with('(') && !words[*k].ends_with([',', '.', ';', ':', '('])
                    })
                    .map(|k| words[k])
                    .or(of)
                    .map(|q| {
                        q.trim_matches(|c: char| !c.is_alphanumeric() && c != '_')
                            .trim_end_matches("'s")
                            .rsplit("::")
                            .next()
                            .unwrap_or("")
                            .to_lowercase()
                    })
                    .filter(|q| !q.is_empty() && !NOT_MODULES.contains(&q.as_str()));
                let found = match qualifier.as_deref().and_then(|q| by_name.get(q)) {
                    Some(modules) => modules.iter().any(|m| *m >= n),
                    None => enclosing(f, &counts).iter().any(|m| *m >= n),
                };
                if !found {
                    dangling.push(format!(
                        "{}:{line}: `{} invariant {n}`",
                        f.strip_prefix(root).unwrap().display(),
                        qualifier.unwrap_or_default()
                    ));
                }
            }
        }
    }
    assert!(
        cited > 100,
        "only {cited} citations found: the scan is broken"
    );
    assert!(
        dangling.is_empty(),
        "citations of invariants that do not exist:\n{}",
        dangling.join("\n")
    );
}
