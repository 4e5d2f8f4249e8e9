//! `tessel logs`: a command job's output, each line prefixed with its
//! process; and `tessel local` for a command job, which follows it.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use futures::StreamExt;
use tessel::client::{Client, JobUpdate};
use tessel::job::ValidatedJob;
use tessel::local::LocalCluster;
use tessel_coordinator::scheduler::JobState;

/// How often `--follow` looks for new lines.
const POLL: Duration = Duration::from_millis(250);

/// `tessel logs ID [--process N] [--attempt A] [--follow]`.
#[derive(clap::Args)]
pub(crate) struct LogsArgs {
    /// The job's id.
    pub id: String,
    /// Only this process's lines.
    #[arg(long)]
    pub process: Option<u32>,
    /// This attempt's lines (default: the current attempt; with
    /// `--follow`, each new attempt's as it starts).
    #[arg(long)]
    pub attempt: Option<u32>,
    /// Keep printing new lines until the job ends.
    #[arg(long, short)]
    pub follow: bool,
    #[command(flatten)]
    pub target: crate::args::KvTargetArgs,
}

pub(crate) async fn logs(args: LogsArgs) -> Result<()> {
    let client = crate::jobs::client(&args.target).await?;
    print_logs(&client, &args.id, args.attempt, args.process, args.follow).await
}

/// Prints the logs; with `follow`, until the job ended and every line of
/// its last attempt is out.
async fn print_logs(
    client: &Client,
    id: &str,
    attempt: Option<u32>,
    process: Option<u32>,
    follow: bool,
) -> Result<()> {
    let mut after: BTreeMap<u32, u64> = BTreeMap::new();
    let mut shown: Option<u32> = None;
    loop {
        let ended = client.job(id).await?.state.is_terminal();
        let (att, chunks) = client.logs(id, attempt, process, &after).await?;
        if shown.is_some_and(|s| s != att) {
            // A new attempt: its processes' chunks count from 0 again.
            after.clear();
            shown = Some(att);
            if att > 1 {
                println!("--- attempt {att} ---");
            }
            continue;
        }
        shown = Some(att);
        let quiet = chunks.is_empty();
        for c in chunks {
            for line in c.text.lines() {
                println!("[{}] {line}", c.process);
            }
            after.insert(c.process, c.seq);
        }
        if !follow || (ended && quiet) {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `tessel local JOB.toml` for a command job: one worker per placement,
/// the job's output on stdout, its state changes on stderr; an error
/// unless it succeeded.
pub(crate) async fn run_command_local(
    cluster: &mut LocalCluster,
    coordinators: u64,
    job: &ValidatedJob,
) -> Result<()> {
    let s = &job.spec;
    cluster.start_coordinators(coordinators)?;
    let kv = cluster.client()?;
    if let Some(c) = &s.checkpoint {
        cluster.checkpoint_roots = vec![c.dir.clone()];
    }
    cluster.start_workers(
        s.placements(),
        &s.plugin,
        s.devices_per_placement() as usize,
    )?;
    eprintln!(
        "{} processes ({} per worker) of `{}`",
        s.processes,
        s.processes_per_worker,
        s.command.join(" ")
    );
    let client = Client::from_store(std::sync::Arc::new(kv));
    let id = client.submit(job).await?;
    let states = async {
        let mut updates = client.events(&id).await?;
        while let Some(u) = updates.next().await {
            if let JobUpdate::State(e) = u? {
                eprintln!("{}", crate::jobs::state_line(&id, &e));
            }
        }
        anyhow::Ok(())
    };
    let (a, b) = tokio::join!(states, print_logs(&client, &id, None, None, true));
    a?;
    b?;
    let rec = client.wait(&id).await?;
    if rec.state != JobState::Succeeded {
        bail!(
            "job `{id}` ended {}: {}",
            rec.state,
            rec.reason.unwrap_or_else(|| "no reason recorded".into())
        );
    }
    Ok(())
}
