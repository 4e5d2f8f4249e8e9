//! What each role may ask of a replica, decided from the identity in the
//! client's certificate ([`tessel_net::tls::Identity`]) and the request.
//!
//! Invariants:
//! 1. Raft traffic, forwarded requests and membership changes come from
//!    coordinators only.
//! 2. A worker writes the registry and assignment keys of its own name
//!    only (`workers/{name}/`, `assignments/{name}/`), never the
//!    scheduler's (`sched/`): its certificate is its worker id.
//! 3. A client writes no registry, assignment or job keys and holds no
//!    leases: it cannot register as a worker, nor act for one.
//! 4. Reads are open to every role; the cluster-wide certificate and
//!    `--insecure` may do anything.
//!
//! A write to a prefix (`DeletePrefix`) is allowed only where every key
//! under the prefix would be.

use crate::wire::{ClientRequest, WireRequest};
use tessel_kv::state::Op;
use tessel_net::tls::{Identity, Role};

/// Key spaces that not every role may write.
const ZONES: [&str; 4] = ["workers/", "assignments/", "jobs/", "sched/"];

/// Where a writer of `role` called `name` may write: the allowed zone
/// prefixes (beside keys outside every zone).
fn allowed(role: Role, name: &str) -> Vec<String> {
    match role {
        Role::Coordinator => ZONES.iter().map(|z| z.to_string()).collect(),
        Role::Worker => vec![
            format!("workers/{name}/"),
            format!("assignments/{name}/"),
            "jobs/".into(),
        ],
        Role::Client => vec!["sched/".into()],
    }
}

/// Whether `role`/`name` may write `key` (or, `prefix`, everything under it).
fn may_write(role: Role, name: &str, key: &[u8], prefix: bool) -> bool {
    let scopes = allowed(role, name);
    if scopes.iter().any(|s| key.starts_with(s.as_bytes())) {
        return true;
    }
    // Outside every zone, and (for a prefix) covering none of them.
    !ZONES
        .iter()
        .any(|z| key.starts_with(z.as_bytes()) || (prefix && z.as_bytes().starts_with(key)))
}

fn op_keys(op: &Op) -> Vec<(&[u8], bool)> {
    match op {
        Op::Put { key, .. }
        | Op::Insert { key, .. }
        | Op::Delete { key }
        | Op::Increment { key, .. }
        | Op::CompareAndSwap { key, .. } => vec![(key, false)],
        Op::DeletePrefix { prefix } => vec![(prefix, true)],
        Op::BarrierArrive { id, .. } | Op::BarrierCancel { id, .. } => vec![(id, false)],
        _ => vec![],
    }
}

/// Invariants 1-4: `Ok` or why `identity` may not make `req`.
pub fn authorize(identity: &Identity, req: &WireRequest) -> Result<(), String> {
    let (role, name) = match identity {
        Identity::Shared | Identity::Anonymous => return Ok(()),
        Identity::Node { role, name } => (*role, name.as_str()),
    };
    let refuse = |what: String| Err(format!("{identity} may not {what}"));
    let c = match req {
        WireRequest::AppendEntries(_) | WireRequest::Vote(_) | WireRequest::InstallSnapshot(_) => {
            return match role {
                Role::Coordinator => Ok(()),
                _ => refuse("take part in Raft".into()),
            }
        }
        WireRequest::Forwarded(_) if role != Role::Coordinator => {
            return refuse("forward requests".into())
        }
        WireRequest::Forwarded(c) | WireRequest::Client(c) => c,
    };
    match c {
        ClientRequest::AddReplica { .. } | ClientRequest::RemoveReplica { .. }
            if role != Role::Coordinator =>
        {
            refuse("change the replica set".into())
        }
        ClientRequest::Write(
            Op::LeaseGrant { .. } | Op::LeaseKeepAlive { .. } | Op::LeaseRevoke { .. },
        ) if role == Role::Client => refuse("hold leases".into()),
        ClientRequest::Write(op) => {
            for (key, prefix) in op_keys(op) {
                if !may_write(role, name, key, prefix) {
                    return refuse(format!(
                        "write `{}`{}",
                        tessel_kv::show_key(key),
                        if prefix { " (a prefix)" } else { "" }
                    ));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(role: Role, name: &str) -> Identity {
        Identity::node(role, name)
    }

    fn put(key: &str) -> WireRequest {
        WireRequest::Client(ClientRequest::Write(Op::Put {
            key: key.into(),
            value: vec![],
            lease: None,
        }))
    }

    fn del_prefix(prefix: &str) -> WireRequest {
        WireRequest::Client(ClientRequest::Write(Op::DeletePrefix {
            prefix: prefix.into(),
        }))
    }

    #[test]
    fn a_worker_writes_only_its_own_registry_and_assignments() {
        let h4 = node(Role::Worker, "h4");
        assert!(authorize(&h4, &put("workers/h4/alive")).is_ok());
        assert!(authorize(&h4, &put("assignments/h4/j@1")).is_ok());
        assert!(authorize(&h4, &put("jobs/j@1/failure")).is_ok());
        assert!(authorize(&h4, &put("barrier-or-other")).is_ok());
        let e = authorize(&h4, &put("workers/h5/alive")).unwrap_err();
        assert!(
            e.contains("worker `h4` may not write `workers/h5/alive`"),
            "{e}"
        );
        assert!(
            authorize(&h4, &put("workers/h4x/alive")).is_err(),
            "a name prefix"
        );
        assert!(authorize(&h4, &put("assignments/h5/j@1")).is_err());
        assert!(authorize(&h4, &put("sched/state")).is_err());
        assert!(authorize(&h4, &del_prefix("workers/")).is_err());
        assert!(
            authorize(&h4, &del_prefix("")).is_err(),
            "covers every zone"
        );
        assert!(authorize(&h4, &del_prefix("workers/h4/jobs/")).is_ok());
    }

    #[test]
    fn a_client_cannot_register_hold_leases_or_take_part_in_raft() {
        let ops = node(Role::Client, "ops");
        assert!(authorize(&ops, &put("sched/jobs/j.1/cancel")).is_ok());
        assert!(authorize(&ops, &put("my/own/key")).is_ok());
        for key in ["workers/h4/incarnation", "assignments/h4/x", "jobs/x/done"] {
            assert!(authorize(&ops, &put(key)).is_err(), "{key}");
        }
        let grant = WireRequest::Client(ClientRequest::Write(Op::LeaseGrant { ttl_ms: 5000 }));
        assert!(authorize(&ops, &grant).is_err());
        let join = WireRequest::Client(ClientRequest::AddReplica {
            id: 9,
            addr: "10.0.0.9:7000".into(),
        });
        assert!(authorize(&ops, &join).is_err());
        assert!(authorize(&node(Role::Worker, "h4"), &join).is_err());
        assert!(authorize(&node(Role::Coordinator, "2"), &join).is_ok());
        let read = WireRequest::Client(ClientRequest::List {
            prefix: b"workers/".to_vec(),
        });
        assert!(authorize(&ops, &read).is_ok());
        assert!(authorize(&ops, &WireRequest::Forwarded(ClientRequest::Revision)).is_err());
    }

    #[test]
    fn the_shared_certificate_and_insecure_peers_may_do_anything() {
        for id in [Identity::Shared, Identity::Anonymous] {
            assert!(authorize(&id, &put("workers/h5/alive")).is_ok());
            assert!(authorize(&id, &put("sched/state")).is_ok());
        }
    }
}
