//! `tessel-bench kv --etcd` against a real 3-member etcd. Built only with
//! `--features etcd`; needs the `tessel` binary beside `tessel-bench`.
#![cfg(feature = "etcd")]

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessel-bench"))
        .args(args)
        .output()
        .expect("run tessel-bench")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `tessel-bench kv --etcd` measures each figure on tessel and then on
/// etcd, pair by pair (its module docs), and every line is one JSON object
/// naming its system and figure.
#[test]
fn bench_kv_measures_each_figure_on_tessel_then_on_etcd() {
    let out = bench(&[
        "kv",
        "--etcd",
        "--sequential",
        "20",
        "--seconds",
        "1",
        "--keys",
        "200",
    ]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let figure = |v: &serde_json::Value| format!("{}/{}", v["figure"], v["clients"]);
    assert_eq!(lines.len(), 14, "seven figures on each system: {lines:?}");
    for pair in lines.chunks(2) {
        assert_eq!(pair[0]["system"], "tessel", "{pair:?}");
        assert_eq!(pair[1]["system"], "etcd", "{pair:?}");
        assert_eq!(figure(&pair[0]), figure(&pair[1]), "{pair:?}");
    }
    let figures: Vec<String> = lines.iter().step_by(2).map(figure).collect();
    assert_eq!(
        figures,
        [
            "\"sequential_put\"/null",
            "\"sequential_linearizable_read\"/null",
            "\"concurrent_put\"/1",
            "\"concurrent_put\"/16",
            "\"concurrent_put\"/64",
            "\"blocking_get_wakeup\"/null",
            "\"memory\"/null",
        ]
    );
    for l in &lines {
        if l["figure"] == "memory" {
            assert_eq!(l["keys"], 200, "{l}");
        }
    }
}
