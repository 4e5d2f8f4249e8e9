//! Property: every struct tessel hands to a plugin has exactly the layout of
//! the installed plugin's `pjrt_c_api.h` — the same `STRUCT_SIZE` and the
//! same offset for every field we declare, and every `PJRT_Api` entry we
//! read sits where the header puts it.
//!
//! The header is not copied into the repository: a C program that includes
//! the wheel's header prints the layouts, and we compare.

mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::process::Command;

use tessel_pjrt::ffi::{self, StructLayout, API_LAYOUT, LAYOUTS};

fn c_layouts(layouts: &[StructLayout], with_size: &[bool]) -> HashMap<String, usize> {
    let dir = tempfile::tempdir().unwrap();
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"pjrt_c_api.h\"\nint main(void) {\n",
    );
    writeln!(src, "  printf(\"PJRT_API_MAJOR %d\\n\", PJRT_API_MAJOR);").unwrap();
    writeln!(src, "  printf(\"PJRT_API_MINOR %d\\n\", PJRT_API_MINOR);").unwrap();
    for (l, &size) in layouts.iter().zip(with_size) {
        if size {
            writeln!(
                src,
                "  printf(\"{0} %zu\\n\", (size_t){0}_STRUCT_SIZE);",
                l.name
            )
            .unwrap();
        }
        for (field, _) in l.fields {
            writeln!(
                src,
                "  printf(\"{0}.{1} %zu\\n\", offsetof({0}, {1}));",
                l.name, field
            )
            .unwrap();
        }
    }
    src.push_str("  return 0;\n}\n");
    let c = dir.path().join("layouts.c");
    let exe = dir.path().join("layouts");
    std::fs::write(&c, src).unwrap();
    common::cc(&c, &exe, false);
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn declarations_follow_the_installed_header_version() {
    let c = c_layouts(&[], &[]);
    assert_eq!(c["PJRT_API_MAJOR"], ffi::PJRT_API_MAJOR as usize);
    assert_eq!(
        c["PJRT_API_MINOR"],
        ffi::PJRT_API_MINOR as usize,
        "the declarations must be checked against the header they follow"
    );
}

#[test]
fn every_declared_struct_matches_the_header() {
    let c = c_layouts(LAYOUTS, &vec![true; LAYOUTS.len()]);
    let mut mismatches = Vec::new();
    for l in LAYOUTS {
        if c[l.name] != l.struct_size {
            mismatches.push(format!(
                "{}: STRUCT_SIZE {} in C, {} in Rust",
                l.name, c[l.name], l.struct_size
            ));
        }
        for (field, offset) in l.fields {
            let key = format!("{}.{}", l.name, field);
            if c[&key] != *offset {
                mismatches.push(format!("{key}: offset {} in C, {offset} in Rust", c[&key]));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
    assert!(
        LAYOUTS.len() >= 60,
        "all structs we use are declared and checked"
    );
}

#[test]
fn every_function_table_entry_we_read_is_where_the_header_puts_it() {
    // Our PJRT_Api stops at the last entry we use, so only offsets compare.
    let c = c_layouts(&[API_LAYOUT], &[false]);
    for (field, offset) in API_LAYOUT.fields {
        assert_eq!(c[&format!("PJRT_Api.{field}")], *offset, "PJRT_Api.{field}");
    }
}
