//! `tessel cluster status|remove`: the replica set.
//!
//! `status` exits 0 only when every replica answered and all agree on one
//! leader that is a voter; [`Verdict`] names the other outcomes, each with
//! its own exit code, so that a probe or `helm test` fails with quorum lost.

use anyhow::Result;
use clap::Subcommand;
use tessel_kv_service::wire::ReplicaStatus;

use crate::args::{Endpoints, KvService, KvTargetArgs, TlsArgs};
use crate::exit::Exit;
use crate::output::{print_document, print_table, OutputArgs};

/// What `cluster status` concludes from the replicas' answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every replica answered, and all name the same leader, a voter.
    Healthy { leader: u64 },
    /// One leader agreed by every replica that answered, but these did not
    /// answer (exit 3): the cluster serves while a majority remains.
    Unreachable { leader: u64, replicas: Vec<String> },
    /// No leader that every answering replica agrees on (exit 4): no
    /// quorum, an election under way, or a split view.
    NoLeader { why: String },
}

impl Verdict {
    /// Exit code 3: a replica did not answer.
    pub(crate) const EXIT_UNREACHABLE: u8 = crate::exit::UNREACHABLE;
    /// Exit code 4: no agreed leader.
    pub(crate) const EXIT_NO_LEADER: u8 = crate::exit::NO_LEADER;

    /// Judges the answers, one per replica address.
    pub(crate) fn of<E: std::fmt::Display>(
        answers: &[(String, Result<ReplicaStatus, E>)],
    ) -> Verdict {
        let answered: Vec<&ReplicaStatus> = answers
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok())
            .collect();
        let unreachable: Vec<String> = answers
            .iter()
            .filter(|(_, r)| r.is_err())
            .map(|(a, _)| a.clone())
            .collect();
        if answered.is_empty() {
            return Verdict::NoLeader {
                why: "no replica answered".into(),
            };
        }
        // A leader needs a majority of the voters behind it: fewer answering
        // voters than that cannot be a serving cluster, whatever they
        // remember.
        let voters: Vec<u64> = answered
            .iter()
            .max_by_key(|s| s.term)
            .map(|s| s.members.iter().map(|(id, _)| *id).collect())
            .unwrap_or_default();
        let up = answered.iter().filter(|s| voters.contains(&s.id)).count();
        if up <= voters.len() / 2 {
            return Verdict::NoLeader {
                why: format!("only {up} of {} voters answered: no quorum", voters.len()),
            };
        }
        let mut leaders: Vec<Option<u64>> = answered.iter().map(|s| s.leader).collect();
        leaders.sort_unstable();
        leaders.dedup();
        let leader = match leaders.as_slice() {
            [Some(l)] => *l,
            [None] => {
                return Verdict::NoLeader {
                    why: "no replica knows a leader".into(),
                }
            }
            _ => {
                return Verdict::NoLeader {
                    why: format!("the replicas name different leaders: {leaders:?}"),
                }
            }
        };
        // The leader must be a voter in some answering replica's view and
        // answer itself as leader if it was reached.
        if !answered
            .iter()
            .any(|s| s.members.iter().any(|(id, _)| *id == leader))
        {
            return Verdict::NoLeader {
                why: format!("leader {leader} is not a voter"),
            };
        }
        if let Some(s) = answered.iter().find(|s| s.id == leader) {
            if s.state != "Leader" {
                return Verdict::NoLeader {
                    why: format!("replica {leader} is named leader but is {}", s.state),
                };
            }
        }
        if unreachable.is_empty() {
            Verdict::Healthy { leader }
        } else {
            Verdict::Unreachable {
                leader,
                replicas: unreachable,
            }
        }
    }

    /// `Ok` when healthy, else the error that exits with its code.
    pub(crate) fn into_result(self) -> Result<()> {
        match self {
            Verdict::Healthy { .. } => Ok(()),
            Verdict::Unreachable { leader, replicas } => Err(Exit::new(
                Self::EXIT_UNREACHABLE,
                format!(
                    "leader {leader} agreed, but {} did not answer: {}",
                    if replicas.len() == 1 {
                        "a replica"
                    } else {
                        "replicas"
                    },
                    replicas.join(", ")
                ),
            )
            .into()),
            Verdict::NoLeader { why } => {
                Err(Exit::new(Self::EXIT_NO_LEADER, format!("no agreed leader: {why}")).into())
            }
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum ClusterCommand {
    /// Leader, term, members and log indices as each replica sees them.
    /// Exit 0 when every replica answered and all agree on one leader; 3
    /// when a replica did not answer; 4 when no leader is agreed.
    Status {
        #[command(flatten)]
        target: KvTargetArgs,
        #[command(flatten)]
        output: OutputArgs,
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
        ClusterCommand::Status { target, output } => {
            let KvService::Replicas(endpoints) = target.service()? else {
                return Err(Exit::bad_input(
                    "`cluster status` reads tessel's replicas; for etcd use `etcdctl endpoint status`",
                )
                .into());
            };
            let kv = endpoints.client(target.tls.load()?.as_ref()).await?;
            let answers = kv.cluster_status().await;
            let verdict = Verdict::of(&answers);
            if output.json() {
                print_document("ClusterStatus", &status_view(&answers, &verdict))?;
            } else {
                status_table(&answers, output.wide());
                if let Verdict::Healthy { leader } = &verdict {
                    println!("healthy: every replica answered; leader {leader}");
                }
            }
            verdict.into_result()
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

fn status_table<E: std::fmt::Display>(answers: &[(String, Result<ReplicaStatus, E>)], wide: bool) {
    let mut header = vec![
        "REPLICA", "ID", "STATE", "LEADER", "TERM", "LAST LOG", "APPLIED", "REVISION", "MEMBERS",
    ];
    if wide {
        header.extend(["LEARNERS", "SNAPSHOT", "PURGED", "KEYS"]);
    }
    let opt = |v: Option<u64>| v.map_or("-".into(), |x| x.to_string());
    let list = |m: &[(u64, String)]| {
        m.iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let rows: Vec<Vec<String>> = answers
        .iter()
        .map(|(addr, status)| match status {
            Ok(s) => {
                let mut row = vec![
                    addr.clone(),
                    s.id.to_string(),
                    s.state.clone(),
                    opt(s.leader),
                    s.term.to_string(),
                    opt(s.last_log_index),
                    opt(s.applied),
                    s.revision.to_string(),
                    list(&s.members),
                ];
                if wide {
                    row.extend([
                        list(&s.learners),
                        opt(s.snapshot),
                        opt(s.purged),
                        s.keys.to_string(),
                    ]);
                }
                row
            }
            Err(e) => vec![addr.clone(), "-".into(), format!("unreachable: {e}")],
        })
        .collect();
    print_table(&header, &rows);
}

/// `cluster status -o json` (docs/schemas/cluster-status.json).
fn status_view<E: std::fmt::Display>(
    answers: &[(String, Result<ReplicaStatus, E>)],
    verdict: &Verdict,
) -> serde_json::Value {
    let members = |m: &[(u64, String)]| -> Vec<serde_json::Value> {
        m.iter()
            .map(|(id, a)| serde_json::json!({ "id": id, "address": a }))
            .collect()
    };
    let replicas: Vec<serde_json::Value> = answers
        .iter()
        .map(|(addr, status)| match status {
            Ok(s) => serde_json::json!({
                "address": addr,
                "reachable": true,
                "error": null,
                "status": {
                    "id": s.id,
                    "state": s.state,
                    "leader": s.leader,
                    "term": s.term,
                    "members": members(&s.members),
                    "learners": members(&s.learners),
                    "last_log_index": s.last_log_index,
                    "applied": s.applied,
                    "snapshot": s.snapshot,
                    "purged": s.purged,
                    "revision": s.revision,
                    "keys": s.keys,
                },
            }),
            Err(e) => serde_json::json!({
                "address": addr,
                "reachable": false,
                "error": e.to_string(),
                "status": null,
            }),
        })
        .collect();
    let (name, leader, why) = match verdict {
        Verdict::Healthy { leader } => ("healthy", Some(*leader), None),
        Verdict::Unreachable { leader, replicas } => (
            "replica_unreachable",
            Some(*leader),
            Some(format!("did not answer: {}", replicas.join(", "))),
        ),
        Verdict::NoLeader { why } => ("no_leader", None, Some(why.clone())),
    };
    serde_json::json!({ "verdict": name, "leader": leader, "why": why, "replicas": replicas })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: u64, state: &str, leader: Option<u64>) -> ReplicaStatus {
        ReplicaStatus {
            id,
            state: state.into(),
            leader,
            term: 2,
            members: (1..=3).map(|i| (i, format!("c{i}:7000"))).collect(),
            learners: vec![],
            last_log_index: Some(9),
            applied: Some(9),
            snapshot: None,
            purged: None,
            revision: 4,
            keys: 0,
        }
    }

    fn answers(
        v: Vec<Result<ReplicaStatus, &'static str>>,
    ) -> Vec<(String, Result<ReplicaStatus, &'static str>)> {
        v.into_iter()
            .enumerate()
            .map(|(i, r)| (format!("c{}:7000", i + 1), r))
            .collect()
    }

    #[test]
    fn every_replica_agreeing_on_a_voter_leader_is_healthy() {
        let a = answers(vec![
            Ok(replica(1, "Leader", Some(1))),
            Ok(replica(2, "Follower", Some(1))),
            Ok(replica(3, "Follower", Some(1))),
        ]);
        assert_eq!(Verdict::of(&a), Verdict::Healthy { leader: 1 });
        assert!(Verdict::of(&a).into_result().is_ok());
    }

    #[test]
    fn an_unreachable_replica_exits_3_even_with_a_leader() {
        let a = answers(vec![
            Ok(replica(1, "Leader", Some(1))),
            Ok(replica(2, "Follower", Some(1))),
            Err("timed out"),
        ]);
        let v = Verdict::of(&a);
        assert_eq!(
            v,
            Verdict::Unreachable {
                leader: 1,
                replicas: vec!["c3:7000".into()]
            }
        );
        let e = v.into_result().unwrap_err();
        assert_eq!(e.downcast_ref::<Exit>().unwrap().code, 3);
    }

    #[test]
    fn quorum_lost_or_split_views_exit_4() {
        // Two of three stopped: the survivor knows no leader, or still
        // remembers the old one; either way there is no quorum.
        for survivor in [
            replica(1, "Candidate", None),
            replica(1, "Follower", Some(2)),
        ] {
            let lost = answers(vec![Ok(survivor), Err("x"), Err("y")]);
            assert!(matches!(Verdict::of(&lost), Verdict::NoLeader { .. }));
            let e = Verdict::of(&lost).into_result().unwrap_err();
            assert_eq!(e.downcast_ref::<Exit>().unwrap().code, 4);
            assert!(e.to_string().contains("no quorum"), "{e}");
        }
        // A stale follower still naming the old leader, which stepped down.
        let stale = answers(vec![
            Ok(replica(1, "Follower", Some(2))),
            Ok(replica(2, "Candidate", Some(2))),
        ]);
        assert!(matches!(Verdict::of(&stale), Verdict::NoLeader { .. }));
        let split = answers(vec![
            Ok(replica(1, "Leader", Some(1))),
            Ok(replica(2, "Follower", Some(3))),
        ]);
        assert!(matches!(Verdict::of(&split), Verdict::NoLeader { .. }));
        let none: Vec<(String, Result<ReplicaStatus, &str>)> = answers(vec![Err("a"), Err("b")]);
        assert!(matches!(Verdict::of(&none), Verdict::NoLeader { .. }));
    }
}
