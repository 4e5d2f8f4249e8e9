//! `-o table|wide|json`: how a command prints what it found.
//!
//! Invariants:
//! 1. `-o json` prints exactly one JSON document on stdout, whatever the
//!    outcome it reports (progress and errors go to stderr); its top level
//!    names its `kind` and the `version` of its schema.
//! 2. Field names are stable: each document's schema is
//!    `docs/schemas/<kind>.json` (kebab case), checked against real output
//!    by `cli/tests/output.rs`. A field is added in a new version only.

use anyhow::Result;
use serde::Serialize;

/// The formats a listing command prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Columns for people.
    #[default]
    Table,
    /// The table with every column it has.
    Wide,
    /// One JSON document (schemas in docs/schemas/).
    Json,
}

/// The `-o` flag.
#[derive(clap::Args, Clone, Copy, Debug)]
pub(crate) struct OutputArgs {
    /// Output format: table, wide (more columns) or json (one document;
    /// its schema is in docs/schemas/).
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: Format,
}

impl OutputArgs {
    pub(crate) fn json(self) -> bool {
        self.output == Format::Json
    }

    pub(crate) fn wide(self) -> bool {
        self.output == Format::Wide
    }
}

/// Schema version of every document but those [`version`] names
/// (invariant 2).
pub(crate) const VERSION: u32 = 1;

/// Schema version of a document of `kind` (invariant 2). `WorkerList` 2:
/// `alive_since_unix_ms` in place of `last_heartbeat_unix_ms`, as a
/// heartbeat no longer writes its time (`registry` invariant 5).
pub(crate) fn version(kind: &str) -> u32 {
    match kind {
        "WorkerList" => 2,
        _ => VERSION,
    }
}

/// Prints `body` as a document of `kind` (invariant 1): its fields beside
/// `kind` and `version`.
pub(crate) fn print_document<T: Serialize>(kind: &str, body: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(&document(kind, body)?)?);
    Ok(())
}

fn document<T: Serialize>(kind: &str, body: &T) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(body)?;
    let serde_json::Value::Object(fields) = &mut v else {
        anyhow::bail!("a {kind} document must be an object");
    };
    let mut doc = serde_json::Map::new();
    doc.insert("kind".into(), kind.into());
    doc.insert("version".into(), version(kind).into());
    doc.append(fields);
    Ok(doc.into())
}

/// Prints rows as columns, each as wide as its widest cell.
pub(crate) fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let s: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_names_its_kind_and_version_beside_its_fields() {
        #[derive(Serialize)]
        struct Body {
            jobs: Vec<u32>,
        }
        let d = document("JobList", &Body { jobs: vec![1] }).unwrap();
        assert_eq!(
            d,
            serde_json::json!({"kind": "JobList", "version": VERSION, "jobs": [1]})
        );
        assert!(document("Bad", &3).is_err(), "not an object");
        assert_eq!(
            document("WorkerList", &Body { jobs: vec![] }).unwrap()["version"],
            2
        );
    }
}
