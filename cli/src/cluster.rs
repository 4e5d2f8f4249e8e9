//! `tessel cluster status|remove`: the replica set.

use anyhow::Result;
use clap::Subcommand;

use crate::args::{Endpoints, TlsArgs};

#[derive(Subcommand)]
pub(crate) enum ClusterCommand {
    /// Leader, term, members and log indices as each replica sees them.
    Status {
        #[arg(long, value_name = "ADDR[,ADDR..]")]
        coordinator: String,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Remove a replica from the voters.
    Remove {
        #[arg(long, value_name = "ADDR[,ADDR..]")]
        coordinator: String,
        #[command(flatten)]
        tls: TlsArgs,
        id: u64,
    },
}

pub(crate) async fn cluster(cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::Status { coordinator, tls } => {
            let kv = Endpoints::parse(&coordinator)
                .map_err(anyhow::Error::msg)?
                .client(tls.load()?.as_ref())
                .await?;
            println!(
                "{:<22} {:>3}  {:<10} {:>6} {:>6} {:>9} {:>9} {:>9}  MEMBERS",
                "REPLICA", "ID", "STATE", "LEADER", "TERM", "LAST LOG", "APPLIED", "REVISION"
            );
            for (addr, status) in kv.cluster_status().await {
                match status {
                    Ok(s) => {
                        let opt = |v: Option<u64>| v.map_or("-".into(), |x| x.to_string());
                        let members: Vec<String> = s
                            .members
                            .iter()
                            .map(|(id, a)| format!("{id}={a}"))
                            .collect();
                        println!(
                            "{:<22} {:>3}  {:<10} {:>6} {:>6} {:>9} {:>9} {:>9}  {}",
                            addr,
                            s.id,
                            s.state,
                            opt(s.leader),
                            s.term,
                            opt(s.last_log_index),
                            opt(s.applied),
                            s.revision,
                            members.join(",")
                        );
                    }
                    Err(e) => println!("{:<22} unreachable: {e}", addr),
                }
            }
            Ok(())
        }
        ClusterCommand::Remove {
            coordinator,
            tls,
            id,
        } => {
            let kv = Endpoints::parse(&coordinator)
                .map_err(anyhow::Error::msg)?
                .client(tls.load()?.as_ref())
                .await?;
            kv.remove_replica(id).await?;
            println!("removed replica {id}");
            Ok(())
        }
    }
}
