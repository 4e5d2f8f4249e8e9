//! `tessel logs`: a command job's output, each line prefixed with its
//! process (also what `tessel local` prints for a command job).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use tessel::client::Client;

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
pub(crate) async fn print_logs(
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
