//! Property: the `tessel` command does what its help says with real plugins,
//! and every kind of bad input ends in a non-zero exit with a message that
//! names the culprit — never a crash.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tessel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(args)
        // No context of the machine's user decides what a flag left out means.
        .env("TESSEL_CONFIG", "/nonexistent/tessel/config.toml")
        .env_remove("TESSEL_CONTEXT")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("run tessel")
}

fn program(name: &str) -> String {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("pjrt/tests/programs")
        .join(name)
        .display()
        .to_string()
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

/// Refuses bad input: exit code 2 (docs/operations.md), message on stderr.
fn refused(out: &Output) -> String {
    exits(out, 2)
}

/// Fails cleanly: exit code 1 (not a signal), message on stderr.
fn fails(out: &Output) -> String {
    exits(out, 1)
}

/// Exits with `code` (not a signal); its stderr.
fn exits(out: &Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit {code}, got {}",
        out.status
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn plugin_info_lists_version_platform_and_devices() {
    let out = ok(&tessel(&["plugin", "info"]));
    assert!(out.contains("C API       0."), "{out}");
    assert!(out.contains("stablehlo_current_version"), "{out}");
    assert!(out.contains("platform    cpu"), "{out}");
    assert!(out.contains("ID  PROCESS  KIND"), "{out}");
}

#[test]
fn run_prints_outputs_of_a_real_program() {
    let out = ok(&tessel(&[
        "run",
        &program("add.mlir"),
        "--arg",
        "f32[2,2]=1,2,3,4",
        "--arg",
        "f32[2,2]=10",
    ]));
    assert_eq!(out.trim(), "output 0: f32[2, 2] = [[11, 12], [13, 14]]");
}

#[test]
fn run_handles_tuples_loops_and_bytecode() {
    let out = ok(&tessel(&[
        "run",
        &program("while.mlir"),
        "--arg",
        "s32=1000",
    ]));
    assert!(
        out.contains("output 0: s32[] = 1024") && out.contains("output 1: s32[] = 10"),
        "{out}"
    );
    let out = ok(&tessel(&[
        "run",
        &program("add.mlirbc"),
        "--arg",
        "f32[2,2]=1",
        "--arg",
        "f32[2,2]=2",
    ]));
    assert!(out.contains("[[3, 3], [3, 3]]"), "{out}");
}

#[test]
fn spmd_programs_split_arguments_and_gather_results() {
    for file in ["spmd_sum.mlir", "spmd_sum_sdy.mlir"] {
        let out = ok(&tessel(&[
            "run",
            &program(file),
            "--arg",
            "f32[8]=1,2,3,4,5,6,7,8",
        ]));
        assert_eq!(out.trim(), "output 0: f32[] = 36", "{file}");
    }
    let e = fails(&tessel(&[
        "run",
        &program("spmd_sum.mlir"),
        "--partitions",
        "2",
        "--arg",
        "f32[8]=1",
    ]));
    assert!(e.contains("mhlo.num_partitions = 4"), "{e}");
}

#[test]
fn npy_arguments_and_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.npy");
    let arr = tessel::array::parse_literal("f32[2,2]=1,2,3,4").unwrap();
    std::fs::write(&a, tessel::array::write_npy(&arr)).unwrap();
    let out_dir: PathBuf = dir.path().join("out");
    ok(&tessel(&[
        "run",
        &program("add.mlir"),
        "--arg",
        a.to_str().unwrap(),
        "--arg",
        a.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]));
    let back =
        tessel::array::read_npy(&std::fs::read(out_dir.join("output0.npy")).unwrap()).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), vec![2., 4., 6., 8.]);
}

#[test]
fn wrong_arguments_name_the_parameter() {
    let e = fails(&tessel(&[
        "run",
        &program("add.mlir"),
        "--arg",
        "f32[2,2]=1",
    ]));
    assert!(
        e.contains("takes 2 arguments") && e.contains("%arg1: f32[2, 2]"),
        "{e}"
    );
    let e = fails(&tessel(&[
        "run",
        &program("add.mlir"),
        "--arg",
        "f32[2,2]=1",
        "--arg",
        "s32[2,2]=1",
    ]));
    assert!(
        e.contains("argument 1 (%arg1): expected f32[2, 2], got s32[2, 2]"),
        "{e}"
    );
    let e = fails(&tessel(&[
        "run",
        &program("add.mlir"),
        "--arg",
        "f32[2,2]=1",
        "--arg",
        "f32[4]=1",
    ]));
    assert!(e.contains("argument 1 (%arg1)"), "{e}");
    let e = fails(&tessel(&[
        "run",
        &program("add.mlir"),
        "--arg",
        "f32[2,2]=1,2",
        "--arg",
        "f32[2,2]=1",
    ]));
    assert!(
        e.contains("--arg f32[2,2]=1,2") && e.contains("4 elements but 2 values"),
        "{e}"
    );
    let e = fails(&tessel(&[
        "run",
        &program("add.mlir"),
        "--arg",
        "missing.npy",
        "--arg",
        "f32[2,2]=1",
    ]));
    assert!(e.contains("missing.npy: no such file"), "{e}");
}

#[test]
fn malformed_programs_report_the_compiler_message() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.mlir");
    std::fs::write(
        &bad,
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = stablehlo.bogus %a\n}\n",
    )
    .unwrap();
    let e = fails(&tessel(&[
        "run",
        bad.to_str().unwrap(),
        "--arg",
        "f32[2]=1",
    ]));
    assert!(
        e.contains("PJRT_Client_Compile") && e.contains("stablehlo.bogus"),
        "{e}"
    );
    let e = fails(&tessel(&["run", "/nonexistent.mlir"]));
    assert!(e.contains("cannot read /nonexistent.mlir"), "{e}");
    std::fs::write(&bad, [0xff, 0xfe, 0x00]).unwrap();
    let e = fails(&tessel(&["run", bad.to_str().unwrap()]));
    assert!(e.contains("neither MLIR bytecode nor UTF-8"), "{e}");
}

#[test]
fn a_missing_plugin_prints_the_command_that_installs_it() {
    // No python3 on PATH and no plugin folder with the CUDA wheel.
    let out = Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(["plugin", "info", "--plugin", "cuda"])
        .env("PATH", "")
        .env_remove("TESSEL_PLUGIN_DIR")
        .output()
        .unwrap();
    let e = fails(&out);
    assert!(
        e.contains("python3 -m pip install --no-deps --target .tessel/plugins jax-cuda13-pjrt"),
        "{e}"
    );
    let e = fails(&tessel(&[
        "plugin",
        "info",
        "--plugin",
        "/no/such/plugin.so",
    ]));
    assert!(e.contains("/no/such/plugin.so"), "{e}");
}

#[test]
fn a_coordinator_without_tls_or_insecure_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let e = refused(&tessel(&[
        "coordinator",
        "--id",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--peers",
        "1=127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ]));
    assert!(e.contains("--tls-dir") && e.contains("--insecure"), "{e}");
    assert!(!data.exists(), "nothing was created");
    let e = refused(&tessel(&[
        "kv",
        "--coordinator",
        "127.0.0.1:1",
        "try-get",
        "k",
    ]));
    assert!(e.contains("--tls-dir"), "clients need it too: {e}");
}

#[test]
fn certs_init_refuses_to_replace_a_cluster_ca() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    ok(&tessel(&[
        "certs",
        "init",
        tls.to_str().unwrap(),
        "--hosts",
        "127.0.0.1,example.internal",
    ]));
    for f in ["ca.pem", "ca.key", "node.pem", "node.key"] {
        assert!(tls.join(f).is_file(), "{f}");
    }
    let e = fails(&tessel(&["certs", "init", tls.to_str().unwrap()]));
    assert!(e.contains("refusing to replace"), "{e}");
}

#[cfg(not(feature = "etcd"))]
#[test]
fn an_etcd_url_without_the_etcd_feature_says_how_to_get_it() {
    let out = tessel(&["kv", "--kv", "etcd://127.0.0.1:2379", "try-get", "k"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--features etcd"), "{err}");
}

#[test]
fn validate_accepts_the_example_job_and_names_every_bad_field() {
    let out = ok(&tessel(&[
        "validate",
        "examples/linear-regression/job.toml",
    ]));
    assert!(out.contains("is valid"), "{out}");
    assert!(out.contains("x: f32[256, 8] per process"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let example =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("examples/linear-regression");
    let spec = std::fs::read_to_string(example.join("job.toml"))
        .unwrap()
        .replace(
            "file = \"train.mlir\"",
            &format!("file = {:?}", example.join("train.mlir")),
        )
        .replace("\"w0.npy\"", &format!("{:?}", example.join("w0.npy")))
        .replace("\"x.npy\"", &format!("{:?}", example.join("x.npy")))
        .replace("\"y.npy\"", "\"missing.npy\"")
        .replace("mesh = \"data=4\"", "mesh = \"data=2\"")
        .replace(
            "inputs = [\"w\", \"x\", \"y\"]",
            "inputs = [\"w\", \"x\", \"z\"]",
        );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, spec).unwrap();
    let err = refused(&tessel(&["validate", path.to_str().unwrap()]));
    for want in [
        "mesh: `data=2` has 2 devices, the job has 4",
        "arrays.y.init.file: cannot read",
        "plan[0].inputs[2]: unknown array `z`",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

#[test]
fn a_global_program_across_processes_is_refused_on_cpu_plugins() {
    let out = ok(&tessel(&["validate", "examples/mlp-global-spmd/job.toml"]));
    assert!(out.contains("is valid"), "{out}");
    let err = refused(&tessel(&[
        "validate",
        "examples/mlp-global-spmd/job-4x1.toml",
    ]));
    assert!(
        err.contains("programs.step.global: plugin `cpu` cannot run one program across processes")
            && err.contains("all_reduce"),
        "{err}"
    );
}

#[test]
fn plugin_options_are_checked_before_anything_runs() {
    for (option, words) in [
        ("memory_fraction", "expected NAME=VALUE"),
        ("Bad=1", "lowercase"),
        ("cpu_device_count=2", "set by tessel"),
        ("visible_devices=[0,x]", "not an integer"),
    ] {
        let err = fails(&tessel(&[
            "run",
            "examples/linear-regression/train.mlir",
            "--plugin-option",
            option,
        ]));
        assert!(err.contains(words), "{option}: {err}");
    }
}

#[test]
fn compare_checks_type_shape_and_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, v: &[f32], dims: &[i64]| {
        let a = tessel::pjrt::HostBuffer::from_slice(v, dims).unwrap();
        let p = dir.path().join(name);
        std::fs::write(&p, tessel::array::write_npy(&a)).unwrap();
        p.display().to_string()
    };
    let a = write("a.npy", &[1.0, 2.0], &[2]);
    let b = write("b.npy", &[1.0, 2.00001], &[2]);
    let c = write("c.npy", &[1.0, 2.0], &[1, 2]);
    let out = ok(&tessel(&["compare", &a, &b, "--atol", "1e-4"]));
    assert!(out.contains("max |a - b| = 1.001e-5 (element 1)"), "{out}");
    let err = fails(&tessel(&["compare", &a, &b]));
    assert!(err.contains("differ by"), "{err}");
    let err = fails(&tessel(&["compare", &a, &c]));
    assert!(
        err.contains("is f32[2]") && err.contains("is f32[1, 2]"),
        "{err}"
    );
}

#[test]
fn local_refuses_a_bad_spec_before_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.toml");
    std::fs::write(&path, "name = \"bad name\"\nprocesses = 0\nmesh = \"data=1\"\nsteps = 1\nplan = []\n[programs]\n[arrays]\n").unwrap();
    let err = refused(&tessel(&["local", path.to_str().unwrap()]));
    assert!(err.contains("name: `bad name`: 1-64 letters"), "{err}");
    assert!(err.contains("processes: at least 1"), "{err}");
    assert!(!err.contains("listening"), "nothing was started: {err}");
}

/// `--metrics-listen`: a replica serves its metrics in Prometheus's text
/// format, the log's counters move with a write, and bad requests get an
/// error status without stopping the listener.
#[test]
fn a_coordinator_serves_its_metrics() {
    use std::io::{BufRead, BufReader, Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(["coordinator", "--id", "1", "--listen", "127.0.0.1:0"])
        .args(["--peers", "1=127.0.0.1:0", "--insecure"])
        .args(["--metrics-listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The readiness line names both addresses.
    let line = lines.next().expect("a line").unwrap();
    let Some(tessel_harness::Ready::Coordinator {
        listen,
        metrics: Some(metrics),
        ..
    }) = tessel_harness::Ready::parse(&line)
    else {
        panic!("not a coordinator's readiness line: {line}");
    };
    let (replica, metrics) = (listen.to_string(), metrics.to_string());
    let get = |request: &[u8]| {
        let mut s = std::net::TcpStream::connect(&metrics).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let _ = s.write_all(request);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let counter = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    for i in 0..3 {
        ok(&tessel(&[
            "kv",
            "--coordinator",
            &replica,
            "--insecure",
            "put",
            &format!("k{i}"),
            "v",
        ]));
    }
    let text = get(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(
        counter(&text, "tessel_kv_log_appends_total ") >= 3.0,
        "three puts, three appends at least: {text}"
    );
    assert!(text.contains("tessel_kv_log_sync_seconds_bucket"), "{text}");
    let nope = get(b"GET /other HTTP/1.1\r\n\r\n");
    assert!(nope.starts_with("HTTP/1.1 404"), "{nope}");
    let post = get(b"POST /metrics HTTP/1.1\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    let huge = get(&vec![b'G'; 64 << 10]);
    assert!(huge.starts_with("HTTP/1.1 400"), "{huge}");
    let again = get(b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(
        again.starts_with("HTTP/1.1 200 OK"),
        "still serving: {again}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A coordinator whose peer's name does not resolve stays up, says so and
/// keeps retrying; with no quorum it is alive but not ready, and `tessel
/// health` tells the two apart. A single replica becomes ready.
#[test]
fn an_unresolvable_peer_is_retried_and_readiness_follows_the_leader() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let start = |peers: &str, data: &str| {
        let stderr = dir.path().join(format!("{data}.err"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessel"))
            .args(["coordinator", "--id", "1", "--listen", "127.0.0.1:0"])
            .args(["--peers", peers, "--insecure"])
            .args(["--metrics-listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join(data))
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let line = BufReader::new(child.stdout.take().unwrap())
            .lines()
            .next()
            .expect("a readiness line")
            .unwrap();
        let Some(tessel_harness::Ready::Coordinator {
            metrics: Some(metrics),
            ..
        }) = tessel_harness::Ready::parse(&line)
        else {
            panic!("not a coordinator's readiness line: {line}");
        };
        (child, metrics.to_string(), stderr)
    };
    let (mut lonely, metrics, stderr) = start("1=127.0.0.1:0,2=no-such-peer.invalid:7000", "a");
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert!(lonely.try_wait().unwrap().is_none(), "it keeps running");
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(
        log.contains("cannot resolve no-such-peer.invalid:7000"),
        "{log}"
    );
    ok(&tessel(&["health", &metrics]));
    let err = fails(&tessel(&["health", &metrics, "--ready"]));
    assert!(err.contains("not ready: no leader known"), "{err}");
    lonely.kill().unwrap();
    let (mut alone, metrics, _) = start("1=127.0.0.1:0", "b");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !tessel(&["health", &metrics, "--ready"]).status.success() {
        assert!(
            std::time::Instant::now() < deadline,
            "a lone replica never became ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    alone.kill().unwrap();
}

/// `tessel completions SHELL` writes a script that names the subcommands,
/// and bash (always here) and zsh and fish (where installed) parse it.
#[test]
fn completions_for_bash_zsh_and_fish_parse_and_name_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, check) in [("bash", "-n"), ("zsh", "-n"), ("fish", "--no-execute")] {
        let script = ok(&tessel(&["completions", shell]));
        assert!(
            script.contains("submit") && script.contains("completions"),
            "{shell}: {script}"
        );
        let file = dir.path().join(shell);
        std::fs::write(&file, &script).unwrap();
        match Command::new(shell).arg(check).arg(&file).output() {
            Ok(out) => assert!(
                out.status.success(),
                "{shell} {check}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(_) if shell != "bash" => eprintln!("{shell} is not installed: not parsed"),
            Err(e) => panic!("bash: {e}"),
        }
    }
    let bad = tessel(&["completions", "powershell-9"]);
    assert_eq!(bad.status.code(), Some(2), "a usage error");
}
