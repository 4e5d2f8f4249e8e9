//! Who each rank of the job is (invariant 13): the sender of a transfer, or
//! of a data channel's request, claims a rank; once the endpoint knows the
//! job's ranks ([`super::TransferEndpoint::bind_ranks`]) that rank must run
//! on the worker the sender's certificate names. Without it a worker of the
//! cluster could deliver arrays as another rank of any job it knew of.

use std::sync::{Arc, RwLock};

use tessel_tls::{Identity, Role};

use crate::error::{Result, TransferError};

/// The worker of each rank, once known.
#[derive(Default)]
pub(super) struct Ranks(RwLock<Option<Arc<[Option<String>]>>>);

impl Ranks {
    /// The job's ranks: the worker each runs on (`None`: not known).
    pub(super) fn bind(&self, workers: Vec<Option<String>>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(workers.into());
    }

    /// Whether `who` may send as rank `from`.
    pub(super) fn admit(&self, from: u32, who: &Identity) -> Result<()> {
        let table = self.0.read().unwrap_or_else(|p| p.into_inner()).clone();
        admits(table.as_deref(), from, who).map_err(TransferError::InvalidHeader)
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
    let (Some(table), Identity::Node { role, name }) = (table, who) else {
        return Ok(());
    };
    match table.get(from as usize) {
        None => Err(format!(
            "rank {from} is not in this job (of {} ranks)",
            table.len()
        )),
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
