//! Property: a person or CI job gets and keeps an identity from the CLI:
//! certificates carry a validity and renew in place (the same key or a new
//! one) without changing who they name, and a context remembers which
//! cluster and which TLS folder a command means when its flags do not say.

use std::path::Path;
use std::process::{Command, Output};

fn tessel(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(args)
        .env("TESSEL_CONFIG", config)
        .env_remove("TESSEL_CONTEXT")
        .output()
        .expect("run tessel")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "tessel failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn err(out: &Output) -> String {
    failed(out, 1)
}

/// Exits with `code` (docs/operations.md's table); its stderr.
fn failed(out: &Output, code: i32) -> String {
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

#[test]
fn a_certificate_renews_in_place_with_its_key_or_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    let (ca, me) = (dir.path().join("ca"), dir.path().join("alice"));
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    ok(&tessel(&cfg, &["certs", "init", &s(&ca), "--ca-only"]));
    let (ca_s, me_s) = (s(&ca), s(&me));
    let issue = |extra: &[&str]| {
        let mut a = vec![
            "certs", "issue", &ca_s, "--role", "client", "--name", "alice", "--out", &me_s,
        ];
        a.extend_from_slice(extra);
        tessel(&cfg, &a)
    };
    let e = err(&issue(&["--renew"]));
    assert!(e.contains("no node.pem to renew"), "{e}");
    assert!(ok(&issue(&["--days", "7"])).contains("valid 7 days"));
    let (cert, key) = (read(&me.join("node.pem")), read(&me.join("node.key")));
    assert!(ok(&issue(&["--renew", "--days", "30"])).contains("for 30 days"));
    assert_eq!(read(&me.join("node.key")), key, "the same key");
    assert_ne!(read(&me.join("node.pem")), cert);
    ok(&issue(&["--renew", "--new-key"]));
    assert_ne!(read(&me.join("node.key")), key, "a new key");
    let e = err(&issue(&[]));
    assert!(e.contains("refusing to replace"), "{e}");
    let usage = issue(&["--days", "0"]);
    assert_eq!(usage.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&usage.stderr).contains("--days"));
}

#[test]
fn a_context_says_which_cluster_and_folder_a_command_means() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tessel").join("config.toml");
    let (ca, me) = (dir.path().join("ca"), dir.path().join("alice"));
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    ok(&tessel(&cfg, &["certs", "init", &s(&ca), "--ca-only"]));
    ok(&tessel(
        &cfg,
        &[
            "certs",
            "issue",
            &s(&ca),
            "--role",
            "client",
            "--name",
            "alice",
            "--out",
            &s(&me),
        ],
    ));
    // Nothing set: the flags are needed, and the message says how else.
    let e = failed(&tessel(&cfg, &["jobs"]), 2);
    assert!(e.contains("tessel context set"), "{e}");
    // A folder that does not load is refused when the context is set.
    let e = failed(
        &tessel(
            &cfg,
            &[
                "context",
                "set",
                "prod",
                "--coordinator",
                "127.0.0.1:1",
                "--tls-dir",
                "/nonexistent",
            ],
        ),
        2,
    );
    assert!(e.contains("does not exist"), "{e}");
    assert!(!cfg.exists(), "nothing saved");
    let out = ok(&tessel(
        &cfg,
        &[
            "context",
            "set",
            "prod",
            "--coordinator",
            "127.0.0.1:1",
            "--tls-dir",
            &s(&me),
        ],
    ));
    assert!(out.contains("you are client `alice`"), "{out}");
    ok(&tessel(
        &cfg,
        &[
            "context",
            "set",
            "dev",
            "--coordinator",
            "127.0.0.1:2",
            "--insecure",
        ],
    ));
    let list = ok(&tessel(&cfg, &["context", "list"]));
    assert!(list.contains("* prod") && list.contains("  dev"), "{list}");
    // Without flags, a command uses the current context's cluster and
    // folder (nothing listens there: unreachable, 3).
    let e = failed(&tessel(&cfg, &["kv", "try-get", "k"]), 3);
    assert!(e.contains("127.0.0.1:1"), "{e}");
    ok(&tessel(&cfg, &["context", "use", "dev"]));
    let e = failed(&tessel(&cfg, &["kv", "try-get", "k"]), 3);
    assert!(e.contains("127.0.0.1:2"), "{e}");
    // A flag wins over the context.
    let e = failed(
        &tessel(
            &cfg,
            &["kv", "--coordinator", "127.0.0.1:3", "try-get", "k"],
        ),
        3,
    );
    assert!(e.contains("127.0.0.1:3"), "{e}");
    // $TESSEL_CONTEXT picks another, and an unknown one is named.
    let out = Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(["kv", "try-get", "k"])
        .env("TESSEL_CONFIG", &cfg)
        .env("TESSEL_CONTEXT", "staging")
        .output()
        .unwrap();
    let e = failed(&out, 2);
    assert!(e.contains("context `staging` is not in"), "{e}");
    let e = failed(&tessel(&cfg, &["context", "use", "staging"]), 2);
    assert!(e.contains("no context `staging`"), "{e}");
    ok(&tessel(&cfg, &["context", "delete", "dev"]));
    let list = ok(&tessel(&cfg, &["context", "list"]));
    assert!(!list.contains("dev") && !list.contains('*'), "{list}");
}

/// A coordinator on loopback, `--insecure`; killed when dropped (its data
/// folder removed after it).
struct Coordinator {
    child: std::process::Child,
    addr: String,
    _data: tempfile::TempDir,
}

impl Coordinator {
    fn start() -> Coordinator {
        use std::io::{BufRead, BufReader};
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessel"))
            .args(["coordinator", "--id", "1", "--listen", "127.0.0.1:0"])
            .args(["--peers", "1=127.0.0.1:0", "--insecure", "--data-dir"])
            .arg(dir.path().join("data"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next().expect("a readiness line").unwrap();
        let Some(tessel_harness::Ready::Coordinator { listen, .. }) =
            tessel_harness::Ready::parse(&line)
        else {
            panic!("not a coordinator's readiness line: {line}");
        };
        Coordinator {
            child,
            addr: listen.to_string(),
            _data: dir,
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the cluster is comes from the flag, else the environment (the
/// variables a worker exports to its job processes among them), else the
/// context: each step is tried against a live coordinator and a dead
/// address, so only the right precedence succeeds.
#[test]
fn the_environment_stands_between_the_flags_and_the_context() {
    let live = Coordinator::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    let dead = "127.0.0.1:1";
    ok(&tessel(
        &cfg,
        &[
            "context",
            "set",
            "gone",
            "--coordinator",
            dead,
            "--insecure",
        ],
    ));
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tessel"));
        c.args(args)
            .env("TESSEL_CONFIG", &cfg)
            .env_remove("TESSEL_CONTEXT");
        for v in [
            "TESSEL_COORDINATOR",
            "TESSEL_COORDINATORS",
            "TESSEL_KV",
            "TESSEL_TLS_DIR",
            "TESSEL_TLS_CA",
            "TESSEL_INSECURE",
        ] {
            c.env_remove(v);
        }
        c.envs(env.iter().copied()).output().unwrap()
    };
    // The environment over the context, in either spelling.
    for var in ["TESSEL_COORDINATOR", "TESSEL_COORDINATORS"] {
        ok(&run(
            &[(var, &live.addr), ("TESSEL_INSECURE", "1")],
            &["jobs"],
        ));
    }
    // The flag over the environment.
    ok(&run(
        &[("TESSEL_COORDINATOR", dead), ("TESSEL_INSECURE", "1")],
        &["jobs", "--coordinator", &live.addr],
    ));
    // A contradiction or a bad value is refused at once, naming it.
    let e = failed(&run(&[("TESSEL_INSECURE", "yes")], &["jobs"]), 2);
    assert!(e.contains("TESSEL_INSECURE"), "{e}");
    let e = failed(
        &run(
            &[
                ("TESSEL_COORDINATOR", &live.addr),
                ("TESSEL_KV", "etcd://e:1"),
            ],
            &["jobs"],
        ),
        2,
    );
    assert!(e.contains("TESSEL_KV"), "{e}");
}
