//! What a script sees: every `-o json` document against its schema in
//! docs/schemas/, and every exit code of docs/operations.md's table, on a
//! real cluster (a coordinator and two workers as processes).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use tessel_harness::LocalCluster;

/// A coordinator and two CPU workers with two devices each; commands
/// reach it through the environment alone (`TESSEL_COORDINATOR`,
/// `TESSEL_TLS_DIR`), as a job process or a laptop would.
struct Cluster {
    local: LocalCluster,
    config: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let mut local = LocalCluster::new(env!("CARGO_BIN_EXE_tessel").into()).unwrap();
        local.start_coordinators(1).unwrap();
        local.start_workers(2, "cpu", 2).unwrap();
        Cluster {
            local,
            config: tempfile::tempdir().unwrap(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tessel"));
        c.args(args)
            .env("TESSEL_COORDINATOR", self.local.addrs[0].to_string())
            .env("TESSEL_TLS_DIR", self.local.tls_dir())
            // No context of the user's may answer for the environment.
            .env("TESSEL_CONFIG", self.config.path().join("none.toml"))
            .env_remove("TESSEL_CONTEXT")
            .env_remove("TESSEL_COORDINATORS")
            .env_remove("TESSEL_INSECURE");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// A command job of `processes` processes running `script` (Python),
    /// with no restarts; its spec's path.
    fn command_job(&self, name: &str, processes: u32, script: &str) -> PathBuf {
        let dir = self.local.dir().join("specs").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("job.py"), script).unwrap();
        let spec = dir.join("job.toml");
        std::fs::write(
            &spec,
            format!("name = \"{name}\"\nprocesses = {processes}\ncommand = [\"python3\", \"job.py\"]\nfiles = [\"job.py\"]\n"),
        )
        .unwrap();
        spec
    }
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `out`'s stdout as one JSON document that `schema` accepts.
fn document(out: &Output, schema: &str) -> Value {
    assert_eq!(code(out), 0, "{}", stderr(out));
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{}", stdout(out)));
    let schemas = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/schemas"));
    let mut options = jsonschema::options();
    for entry in std::fs::read_dir(schemas).unwrap() {
        let path = entry.unwrap().path();
        let s: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let id = s["$id"].as_str().unwrap().to_owned();
        options = options.with_resource(id, jsonschema::Resource::from_contents(s));
    }
    let s: Value = serde_json::from_slice(&std::fs::read(schemas.join(schema)).unwrap()).unwrap();
    let validator = options.build(&s).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{schema}: {errors:#?}\n{doc:#}");
    doc
}

/// Every command with `-o json` prints one document its schema (with
/// `additionalProperties: false` throughout) accepts, with the values the
/// cluster holds; `-o wide` adds columns to the table.
#[test]
fn every_json_document_follows_its_schema() {
    let c = Cluster::start();
    let spec = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("examples/mlp-data-parallel/job-2x2.toml");
    let out = c.run(&["submit", spec.to_str().unwrap(), "--wait"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let id = stdout(&out).lines().next().unwrap().to_owned();

    let jobs = document(&c.run(&["jobs", "-o", "json"]), "job-list.json");
    assert_eq!(jobs["jobs"][0]["id"], id.as_str());
    assert_eq!(jobs["jobs"][0]["state"], "Succeeded");
    let job = document(&c.run(&["job", &id, "-o", "json"]), "job.json");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(job["attempts"][0]["end"], "Succeeded");
    assert!(!job["reports"].as_array().unwrap().is_empty(), "{job:#}");
    let workers = document(&c.run(&["workers", "-o", "json"]), "worker-list.json");
    let states: Vec<&str> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["alive", "alive"]);
    let topo = document(
        &c.run(&["topology", "--job", &id, "-o", "json"]),
        "topology.json",
    );
    assert_eq!(topo["topology"]["devices"].as_array().unwrap().len(), 4);
    assert_eq!(topo["job"], format!("{id}@1").as_str());
    // Each process's boot id is its worker's (read from the local
    // topologies: the global one holds machines).
    let boot_of = |w: &str| {
        workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == w)
            .map(|x| x["boot_id"].clone())
    };
    for p in topo["topology"]["processes"].as_array().unwrap() {
        let boot = boot_of(p["worker"].as_str().unwrap());
        assert!(boot.is_some_and(|b| b == p["boot_id"]), "{topo:#}");
    }
    let status = document(
        &c.run(&["cluster", "status", "-o", "json"]),
        "cluster-status.json",
    );
    assert_eq!(status["verdict"], "healthy");
    let plugin = document(
        &c.run(&["plugin", "info", "--plugin", "cpu", "-o", "json"]),
        "plugin-info.json",
    );
    assert!(!plugin["devices"].as_array().unwrap().is_empty());

    for cmd in [&["jobs"][..], &["workers"], &["topology", "--job", &id]] {
        let columns = |o: &str| {
            let out = c.run(&[cmd, &["-o", o][..]].concat());
            assert_eq!(code(&out), 0, "{}", stderr(&out));
            stdout(&out)
                .lines()
                .next()
                .unwrap()
                .split_whitespace()
                .count()
        };
        assert!(columns("wide") > columns("table"), "{cmd:?}");
    }
}

/// Each exit code of the table, as a script running the command sees it:
/// 0 succeeded (a command job's output streamed by process, and `tessel
/// jobs` run inside it with only its environment), 1 other, 2 bad input,
/// 3 unreachable or refused, 5 failed, 6 cancelled, 7 timed out. (4, no
/// agreed leader, needs replicas lost: chaos-tests' `kv_replicas`.)
#[test]
fn every_exit_code_of_the_table_is_what_a_script_sees() {
    let c = Cluster::start();
    // 0, with the output streamed and tessel reachable from inside a job.
    let inside = c.command_job(
        "inside",
        2,
        &format!(
            "import os, subprocess\nprint('rank', os.environ['TESSEL_PROCESS_INDEX'], flush=True)\n\
             if os.environ['TESSEL_PROCESS_INDEX'] == '0':\n    \
             print(subprocess.run([{:?}, 'jobs', '-o', 'json'], check=True, capture_output=True, text=True).stdout.replace('\\n', ' '), flush=True)\n",
            env!("CARGO_BIN_EXE_tessel")
        ),
    );
    let out = c.run(&["submit", inside.to_str().unwrap(), "--wait"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("[0] rank 0") && text.contains("[1] rank 1"),
        "{text}"
    );
    let listed = text
        .lines()
        .find_map(|l| l.strip_prefix("[0] {"))
        .unwrap_or_else(|| panic!("no JobList from inside the job:\n{text}\n{}", stderr(&out)));
    let own = format!("\"id\": \"{}\"", text.lines().next().unwrap());
    assert!(
        listed.contains("\"JobList\"") && listed.contains(&own),
        "{listed}"
    );

    // 5: the job failed.
    let fails = c.command_job("fails", 1, "raise SystemExit(3)\n");
    let out = c.run(&["submit", fails.to_str().unwrap(), "--wait"]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("exited with code 3"),
        "{}",
        stderr(&out)
    );

    // 7: a bounded wait ran out (the job runs on), then 6: cancelled.
    let sleeps = c.command_job(
        "sleeps",
        1,
        "import time\nprint('up', flush=True)\ntime.sleep(600)\n",
    );
    let started = Instant::now();
    let out = c.run(&[
        "submit",
        sleeps.to_str().unwrap(),
        "--wait",
        "--timeout",
        "3s",
    ]);
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(30));
    let id = stdout(&out).lines().next().unwrap().to_owned();
    let job = serde_json::from_slice::<Value>(&c.run(&["job", &id, "-o", "json"]).stdout).unwrap();
    assert!(
        !job["job"]["state"].as_str().unwrap().ends_with("ed"),
        "it runs on: {job:#}"
    );
    let waiting = c
        .command(&["submit", sleeps.to_str().unwrap(), "--wait"])
        .spawn();
    let mut waiting = waiting.unwrap();
    let by = Instant::now() + Duration::from_secs(60);
    let second = loop {
        let jobs: Value = serde_json::from_slice(&c.run(&["jobs", "-o", "json"]).stdout).unwrap();
        let found =
            jobs["jobs"].as_array().unwrap().iter().find(|j| {
                j["name"] == "sleeps" && j["id"] != id.as_str() && j["state"] == "Running"
            });
        if let Some(j) = found {
            break j["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < by, "the second job never ran");
        std::thread::sleep(Duration::from_millis(200));
    };
    // 1: anything else (an array of a job that has not finished).
    let out = c.run(&["fetch", &second, "w", "--out", "/dev/null"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    for j in [&id, &second] {
        assert_eq!(code(&c.run(&["cancel", j])), 0);
    }
    let status = waiting.wait().unwrap();
    assert_eq!(status.code(), Some(6));

    // 2: bad input, each kind.
    assert_eq!(code(&c.run(&["job"])), 2, "no id");
    assert_eq!(code(&c.run(&["jobs", "-o", "yaml"])), 2, "no such format");
    assert_eq!(code(&c.run(&["job", "nosuch.9"])), 2, "no such job");
    let bad = c.local.dir().join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\nprocesses = 0\n").unwrap();
    let out = c.run(&["submit", bad.to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let out = c
        .command(&["jobs"])
        .env_remove("TESSEL_COORDINATOR")
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "no cluster named: {}", stderr(&out));

    // 3: nobody answers, or the cluster refuses our certificate.
    let out = c.run(&["jobs", "--coordinator", "127.0.0.1:1"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let stranger = c.config.path().join("stranger");
    let out = c.run(&[
        "certs",
        "init",
        stranger.to_str().unwrap(),
        "--hosts",
        "127.0.0.1",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = c
        .command(&["jobs"])
        .env("TESSEL_TLS_DIR", &stranger)
        .output()
        .unwrap();
    assert_eq!(code(&out), 3, "{}", stderr(&out));
}

/// A process killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `--log-format json`: every line a worker writes is one JSON object, and
/// the lines of a job process carry its job, attempt, process and worker.
#[test]
fn a_workers_json_log_lines_carry_the_job_attempt_and_process() {
    let c = Cluster::start();
    let log = c.config.path().join("worker.log");
    let mut cmd = c.local.worker_command("wj", "cpu", 2);
    cmd.args(["--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let _worker = Killed(cmd.spawn().unwrap());
    let by = Instant::now() + Duration::from_secs(60);
    while !stdout(&c.run(&["workers"])).contains("wj ") {
        assert!(Instant::now() < by, "wj never registered");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Three processes: one lands on wj.
    let spec = c.command_job("logged", 3, "print('hello', flush=True)\n");
    let out = c.run(&["submit", spec.to_str().unwrap(), "--wait"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let id = stdout(&out).lines().next().unwrap().to_owned();
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines
        .iter()
        .all(|l| l["level"].is_string() && l["timestamp"].is_string()));
    let in_job = lines
        .iter()
        .filter_map(|l| l["spans"].as_array())
        .flatten()
        .find(|s| s["name"] == "job_process")
        .unwrap_or_else(|| panic!("no line inside a job process:\n{text}"));
    assert_eq!(in_job["job"], id.as_str());
    assert_eq!(in_job["attempt"], 1);
    assert_eq!(in_job["worker"], "wj");
    assert!(
        in_job["process"].as_u64().is_some_and(|p| p < 3),
        "{in_job}"
    );
}
