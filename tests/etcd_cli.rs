//! `tessel kv --kv etcd://…` against a real 3-member etcd cluster. Built only
//! with `--features etcd`.
#![cfg(feature = "etcd")]

use std::process::{Command, Output};

use tessel_kvstore::etcd::local::LocalEtcd;

fn tessel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(args)
        .output()
        .expect("run tessel")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_commands_work_against_etcd() {
    let etcd = LocalEtcd::start(3).await.unwrap();
    let url = etcd.url();
    let kv = |rest: &[&str]| {
        let mut a = vec!["kv", "--kv", url.as_str()];
        a.extend_from_slice(rest);
        tessel(&a)
    };
    let o = kv(&["insert", "jobs/a", "1"]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).starts_with("revision "));
    let dup = kv(&["insert", "jobs/a", "2"]);
    assert_eq!(dup.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&dup.stderr).contains("already exists"),
        "{dup:?}"
    );
    assert_eq!(
        stdout(&kv(&["get", "jobs/a", "--timeout-ms", "1000"])),
        "1\n"
    );
    assert_eq!(stdout(&kv(&["incr", "jobs/n", "5"])), "5\n");
    let list = stdout(&kv(&["list", "jobs/"]));
    assert!(
        list.contains("jobs/a\t1") && list.contains("jobs/n\t5"),
        "{list}"
    );
    let missing = kv(&["get", "jobs/none", "--timeout-ms", "300"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("deadline"));
}

#[test]
fn a_malformed_etcd_url_is_refused() {
    let o = tessel(&["kv", "--kv", "http://127.0.0.1:2379", "try-get", "k"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("etcd://"),
        "{o:?}"
    );
}
