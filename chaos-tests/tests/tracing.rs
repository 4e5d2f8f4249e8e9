//! One trace per job across every process that served it, exported over
//! OTLP to a receiver on the official protobuf definitions: a 4-process
//! MLP job submitted with the CLI, a worker SIGKILLed mid-job, the job
//! restarted from its checkpoint. The standard `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is all the processes are given.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessel::client::Client;
use tessel_chaos_tests::mlp::mlp_dir;
use tessel_chaos_tests::{spawn_worker, KvCluster, WorkerProc};
use tessel_coordinator::scheduler::JobState;
use tessel_coordinator::{Item, Records};
use tessel_kv::KvStore;
use tessel_trace::receiver::{ReceivedSpan, Receiver};

/// The MLP example with 600 steps, 2 restarts and checkpoints every 100
/// steps under `ckpt`, as a spec file in `dir` (the example's files linked
/// beside it).
fn spec_file(dir: &Path, ckpt: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for f in std::fs::read_dir(mlp_dir()).unwrap() {
        let f = f.unwrap().path();
        std::os::unix::fs::symlink(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    let text = std::fs::read_to_string(mlp_dir().join("job.toml")).unwrap();
    assert!(text.contains("\nsteps = 1000\n"));
    let text = format!(
        "max_restarts = 2\n{}\n[checkpoint]\ndir = {:?}\nevery = 100\n",
        text.replace("\nsteps = 1000\n", "\nsteps = 600\n"),
        ckpt.display().to_string()
    );
    let path = dir.join("traced.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn spans_named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_job_is_one_trace_from_every_process_that_served_it() {
    let receiver = Receiver::start().await.unwrap();
    // Every process started from here on exports to it.
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
    let cluster = KvCluster::start(3, &[]);
    let ckpt = cluster.dir.path().join("ckpt");
    let root = ckpt.display().to_string();
    let mut ws: BTreeMap<String, WorkerProc> = (0..5)
        .map(|i| {
            let id = format!("w{i}");
            let flags = [
                "--heartbeat-ms",
                "300",
                "--ttl-ms",
                "1500",
                "--devices",
                "1",
                "--checkpoint-root",
                &root,
            ];
            let w = spawn_worker(&cluster, &id, &flags);
            (id, w)
        })
        .collect();
    let kv: Arc<dyn KvStore> = Arc::new(cluster.client());
    let client = Client::from_store(kv.clone());

    let spec = spec_file(&cluster.dir.path().join("spec"), &ckpt);
    let out = cluster.cli(&["submit", spec.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    Records::new(&*kv, &id)
        .wait(Item::Report(299), Duration::from_secs(120))
        .await
        .expect("the job reached step 300");
    let first = client.job(&id).await.unwrap().placement;
    let victim = first[1].clone();
    ws.get_mut(&victim).unwrap().kill();
    let end = client.wait(&id).await.unwrap();
    assert_eq!(end.state, JobState::Succeeded, "{:?}", end.reason);
    assert_eq!((end.restarts, end.attempt), (1, 2));

    // The last spans reach the receiver within the export interval.
    let by = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let all = receiver.spans();
        let done = all
            .iter()
            .any(|s| s.name == "job" && s.attributes.get("tessel.job.id") == Some(&id))
            && spans_named(&all, "job_process")
                .iter()
                .filter(|s| s.attributes.get("attempt").map(String::as_str) == Some("2"))
                .count()
                == 4;
        if done {
            break all;
        }
        assert!(
            Instant::now() < by,
            "spans missing: {:?}",
            all.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // One trace: the root span names the job; everything of the job is in it.
    let job = spans_named(&spans, "job");
    assert_eq!(job.len(), 1);
    let job = job[0];
    assert_eq!(job.parent_span_id, "");
    assert_eq!(job.attributes["tessel.state"], "Succeeded");
    let trace: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.trace_id == job.trace_id)
        .collect();
    assert!(spans
        .iter()
        .filter(|s| s.attributes.get("job") == Some(&id)
            || s.attributes.get("tessel.job.id") == Some(&id))
        .all(|s| s.trace_id == job.trace_id));
    let services: BTreeSet<&str> = trace.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(
        services,
        BTreeSet::from(["tessel", "tessel-coordinator", "tessel-worker"])
    );
    let under = |parent: &str| -> Vec<&ReceivedSpan> {
        trace
            .iter()
            .copied()
            .filter(|s| s.parent_span_id == parent)
            .collect()
    };
    let names =
        |v: &[&ReceivedSpan]| -> BTreeSet<String> { v.iter().map(|s| s.name.clone()).collect() };
    assert_eq!(
        names(&under(&job.span_id)),
        BTreeSet::from(["submit", "queued", "attempt", "restart"].map(String::from))
    );
    // Both attempts, the first ended by the loss (an error), the restart
    // between them visible as such.
    let attempts: BTreeMap<String, &ReceivedSpan> = spans_named(
        &trace.iter().copied().cloned().collect::<Vec<_>>(),
        "attempt",
    )
    .into_iter()
    .map(|s| {
        (
            s.attributes["tessel.attempt"].clone(),
            trace
                .iter()
                .copied()
                .find(|t| t.span_id == s.span_id)
                .unwrap(),
        )
    })
    .collect();
    assert_eq!(attempts.len(), 2);
    let cause = attempts["1"]
        .attributes
        .get("tessel.cause")
        .unwrap_or_else(|| panic!("{:#?}", attempts["1"]));
    assert!(cause == "worker_lost" || cause == "peer_lost", "{cause}");
    assert!(attempts["1"].error.is_some());
    assert_eq!(attempts["2"].attributes["tessel.end"], "Succeeded");
    assert!(attempts["2"].error.is_none());
    let restart = spans_named(&spans, "restart");
    assert_eq!(restart.len(), 1);
    assert!(restart[0].start_unix_ns >= attempts["1"].end_unix_ns - 1_000_000);
    assert!(restart[0].end_unix_ns <= attempts["2"].start_unix_ns + 1_000_000);
    // Every process of attempt 2, and every surviving one of attempt 1,
    // under its attempt's span, from the worker that ran it.
    for (attempt, placement) in [("1", &first), ("2", &end.placement)] {
        let processes = under(&attempts[attempt].span_id);
        let ran: BTreeMap<String, String> = processes
            .iter()
            .filter(|s| s.name == "job_process")
            .map(|s| {
                (
                    s.attributes["process"].clone(),
                    s.attributes["worker"].clone(),
                )
            })
            .collect();
        for (i, w) in placement.iter().enumerate() {
            if attempt == "1" && *w == victim {
                continue;
            }
            assert_eq!(
                ran.get(&i.to_string()),
                Some(w),
                "attempt {attempt}: {ran:?}"
            );
        }
    }
    // Inside a process of attempt 2: its stages, and the plan's.
    let p = under(&attempts["2"].span_id)
        .into_iter()
        .find(|s| s.name == "job_process" && s.attributes["process"] == "0")
        .unwrap();
    let stages = under(&p.span_id);
    assert_eq!(
        names(&stages),
        BTreeSet::from(
            [
                "create_client",
                "topology_exchange",
                "transfer_barrier",
                "plan"
            ]
            .map(String::from)
        )
    );
    let plan = stages.iter().find(|s| s.name == "plan").unwrap();
    let inner = under(&plan.span_id);
    for want in ["compile", "restore", "steps", "checkpoint"] {
        assert!(
            inner.iter().any(|s| s.name == want),
            "no `{want}` in {:?}",
            names(&inner)
        );
    }
    let batches = inner.iter().filter(|s| s.name == "steps").count();
    assert!(
        (2..=10).contains(&batches),
        "{batches} step batches for ≤ 400 steps"
    );
    drop(ws);
}
