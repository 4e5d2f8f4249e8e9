//! Who each rank of the job is (invariant 13): the sender of a transfer, or
//! of a data channel's request, claims a rank; once the endpoint knows the
//! job's ranks ([`super::TransferEndpoint::bind_ranks`]) that rank must run
//! on the worker the sender's certificate names. Without it a worker of the
//! cluster could deliver arrays as another rank of any job it knew of.

use std::sync::{Arc, RwLock};

use tessel_tls::{Identity, Role};

use super::members::Members;
use crate::error::{Result, TransferError};

/// The worker of each rank, once known.
#[derive(Default)]
pub(super) struct Ranks(RwLock<Option<Bound>>);

#[derive(Clone)]
enum Bound {
    /// Each rank's worker (`None`: not named).
    Table(Arc<[Option<String>]>),
    /// A communicator's members, each looked up when first needed
    /// (`members` invariant 1).
    Members(Arc<Members>),
}

impl Ranks {
    /// The job's ranks: the worker each runs on (`None`: not known).
    pub(super) fn bind(&self, workers: Vec<Option<String>>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(Bound::Table(workers.into()));
    }

    /// The job's ranks as a communicator's members.
    pub(super) fn bind_members(&self, members: Arc<Members>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(Bound::Members(members));
    }

    /// Whether `who` may send as rank `from` (looking the rank up first
    /// where it is a member not yet looked up, and `who` has a name).
    pub(super) async fn admit(&self, from: u32, who: &Identity) -> Result<()> {
        let bound = self.0.read().unwrap_or_else(|p| p.into_inner()).clone();
        let verdict = match bound {
            None => Ok(()),
            Some(Bound::Table(t)) => admits(Some(&t), from, who),
            Some(Bound::Members(_)) if !matches!(who, Identity::Node { .. }) => Ok(()),
            Some(Bound::Members(m)) => {
                let worker = match (from as usize) < m.len() {
                    true => Some(m.worker(from as usize).await?),
                    false => None,
                };
                admits_worker(m.len(), from, worker, who)
            }
        };
        verdict.map_err(TransferError::InvalidHeader)
    }
}

/// The rule, pure: a worker's certificate sends only as a rank of its own
/// worker; ranks are checked once known; the cluster-wide certificate and
/// `--insecure` carry no name to check.
fn admits(
    table: Option<&[Option<String>]>,
    from: u32,
    who: &Identity,
) -> std::result::Result<(), String> {
    let Some(table) = table else {
        return Ok(());
    };
    let worker = table.get(from as usize).map(Option::as_deref);
    admits_worker(table.len(), from, worker, who)
}

/// The rule for rank `from` of `ranks`, whose worker is `worker` (`None`:
/// no such rank; `Some(None)`: its worker is not named).
fn admits_worker(
    ranks: usize,
    from: u32,
    worker: Option<Option<&str>>,
    who: &Identity,
) -> std::result::Result<(), String> {
    let Identity::Node { role, name } = who else {
        return Ok(());
    };
    match worker {
        None => Err(format!("rank {from} is not in this job (of {ranks} ranks)")),
        Some(Some(worker)) if *role != Role::Worker || worker != name => Err(format!(
            "rank {from} runs on worker `{worker}`; the sender's certificate names {who}"
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(name: &str) -> Identity {
        Identity::node(Role::Worker, name)
    }

    #[test]
    fn a_worker_sends_only_as_its_own_ranks_once_they_are_known() {
        let table: Vec<Option<String>> = vec![Some("h4".into()), Some("h6".into()), None];
        let t = Some(&table[..]);
        assert_eq!(admits(t, 0, &worker("h4")), Ok(()));
        assert_eq!(admits(t, 1, &worker("h6")), Ok(()));
        let e = admits(t, 0, &worker("h6")).unwrap_err();
        assert!(
            e.contains("rank 0 runs on worker `h4`") && e.contains("h6"),
            "{e}"
        );
        let e = admits(t, 3, &worker("h4")).unwrap_err();
        assert!(e.contains("rank 3 is not in this job (of 3 ranks)"), "{e}");
        // A rank whose worker the topology does not name.
        assert_eq!(admits(t, 2, &worker("h9")), Ok(()));
        // Not yet known, or no name to check.
        assert_eq!(admits(None, 0, &worker("h6")), Ok(()));
        assert_eq!(admits(t, 0, &Identity::Shared), Ok(()));
        assert_eq!(admits(t, 0, &Identity::Anonymous), Ok(()));
        let coordinator = Identity::node(Role::Coordinator, "h4");
        assert!(admits(t, 0, &coordinator).is_err(), "not a worker");
    }
}
