//! One command line on every host of a Slurm job step: coordinators in
//! containers (the image of `./scripts/test`) on a private Docker network,
//! each a "node" with its own hostname and only Slurm's variables to tell
//! them apart, derive their ids and peers (`--peers-from-env`) and form one
//! cluster. Everything the test starts is removed however it ends.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use tessel_chaos_tests::docker::{docker, image, Cleanup};
use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;

/// The variables `srun --nodes=3 --ntasks-per-node=1` gives task `rank`
/// of a job step on node[1-3] of a four-node job.
fn slurm_env(rank: usize) -> Vec<String> {
    [
        ("SLURM_JOB_ID", "4242".to_owned()),
        ("SLURM_JOB_NODELIST", "node[1-4]".to_owned()),
        ("SLURM_STEP_NODELIST", "node[1-3]".to_owned()),
        ("SLURM_STEP_TASKS_PER_NODE", "1(x3)".to_owned()),
        ("SLURM_PROCID", rank.to_string()),
        ("SLURM_NODEID", rank.to_string()),
        ("SLURMD_NODENAME", format!("node{}", rank + 1)),
    ]
    .into_iter()
    .flat_map(|(k, v)| ["-e".to_owned(), format!("{k}={v}")])
    .collect()
}

const COMMAND: [&str; 9] = [
    "coordinator",
    "--listen",
    "0.0.0.0:7000",
    "--peers-from-env",
    "--data-dir",
    "/data/raft",
    "--insecure",
    "--metrics-listen",
    "0.0.0.0:9100",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slurm_step_forms_one_cluster_from_one_command_line() {
    let image = image();
    let net = format!("tesselslurm{}", std::process::id());
    let mut cleanup = Cleanup::default();
    docker(&["network", "create", &net]);
    cleanup.networks.push(net.clone());
    let mut addrs = Vec::new();
    for rank in 0..3 {
        let node = format!("node{}", rank + 1);
        let name = format!("{net}-{node}");
        cleanup.containers.push(name.clone());
        let mut args: Vec<String> = ["run", "-d", "--name", &name, "--hostname", &node]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["--network", &net, "--network-alias", &node].map(String::from));
        args.extend(slurm_env(rank));
        args.push(image.clone());
        args.extend(COMMAND.map(String::from));
        docker(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let ip = docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &name,
        ]);
        addrs.push(format!("{}:7000", ip.trim()).parse().unwrap());
    }
    let kv = RaftKv::connect(addrs, None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let members = loop {
        let statuses = kv.cluster_status().await;
        let leaders: Vec<u64> = statuses
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok().and_then(|s| s.leader))
            .collect();
        if leaders.len() == 3 && leaders.iter().all(|l| *l == leaders[0]) {
            let s = statuses[0].1.as_ref().unwrap();
            break s.members.iter().cloned().collect::<BTreeMap<u64, String>>();
        }
        assert!(
            Instant::now() < deadline,
            "no agreed leader after 60 s: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let want: BTreeMap<u64, String> = (1..=3).map(|i| (i, format!("node{i}:7000"))).collect();
    assert_eq!(members, want);
    kv.put(b"slurm/step", b"formed").await.unwrap();
    assert_eq!(kv.try_get(b"slurm/step").await.unwrap(), b"formed");

    // Two tasks on one node would share its port: refused, with the fix.
    let mut env = slurm_env(1);
    env.extend(["-e".into(), "SLURM_STEP_TASKS_PER_NODE=2(x3)".into()]);
    let out = Command::new("docker")
        .args(["run", "--rm", "--network", &net])
        .args(&env)
        .arg(&image)
        .args(COMMAND)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--ntasks-per-node=1"), "{err}");
}
