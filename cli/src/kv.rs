//! `tessel kv`: read and write the key-value service.

use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};
use futures::StreamExt;
use tessel_kv::{show_key, Event};

use crate::args::KvTargetArgs;

#[derive(Args)]
pub(crate) struct KvArgs {
    #[command(flatten)]
    pub target: KvTargetArgs,
    #[command(subcommand)]
    pub op: KvOp,
}

#[derive(Subcommand)]
pub(crate) enum KvOp {
    /// Write, overwriting.
    Put { key: String, value: String },
    /// Write unless the key exists.
    Insert { key: String, value: String },
    /// Wait for a key (blocking get).
    Get {
        key: String,
        #[arg(long, default_value_t = 0)]
        timeout_ms: u64,
    },
    /// Read a key now.
    TryGet { key: String },
    /// Every pair under a prefix.
    List { prefix: String },
    /// Delete a key, or with --prefix everything under it.
    Del {
        key: String,
        #[arg(long)]
        prefix: bool,
    },
    /// Print changes under a prefix.
    Watch {
        prefix: String,
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Stop after N events.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Add to a counter (missing = 0).
    Incr {
        key: String,
        #[arg(default_value_t = 1, allow_hyphen_values = true)]
        delta: i64,
    },
}

fn show(bytes: &[u8]) -> String {
    show_key(bytes)
}

pub(crate) async fn kv(args: KvArgs) -> Result<()> {
    let kv = args.target.connect().await?;
    match args.op {
        KvOp::Put { key, value } => println!(
            "revision {}",
            kv.put(key.as_bytes(), value.as_bytes()).await?
        ),
        KvOp::Insert { key, value } => println!(
            "revision {}",
            kv.insert(key.as_bytes(), value.as_bytes()).await?
        ),
        KvOp::Get { key, timeout_ms } => {
            println!(
                "{}",
                show(
                    &kv.get(key.as_bytes(), Duration::from_millis(timeout_ms))
                        .await?
                )
            )
        }
        KvOp::TryGet { key } => println!("{}", show(&kv.try_get(key.as_bytes()).await?)),
        KvOp::List { prefix } => {
            for e in kv.list(prefix.as_bytes()).await? {
                println!(
                    "{}\t{}\t(revision {})",
                    show(&e.key),
                    show(&e.value),
                    e.mod_revision
                );
            }
        }
        KvOp::Del { key, prefix } => {
            let n = if prefix {
                kv.delete_prefix(key.as_bytes()).await?
            } else {
                kv.delete(key.as_bytes()).await?
            };
            println!("deleted {n}");
        }
        KvOp::Incr { key, delta } => println!("{}", kv.increment(key.as_bytes(), delta).await?),
        KvOp::Watch {
            prefix,
            from,
            count,
        } => {
            let mut events = kv.watch(prefix.as_bytes(), from).await?;
            let mut seen = 0;
            while count.is_none_or(|c| seen < c) {
                let Some(e) = events.next().await else { break };
                match e? {
                    Event::Put(kv) => println!(
                        "{} put {} {}",
                        kv.mod_revision,
                        show(&kv.key),
                        show(&kv.value)
                    ),
                    Event::Delete { key, revision } => println!("{revision} delete {}", show(&key)),
                }
                seen += 1;
            }
        }
    }
    Ok(())
}
