//! What each role may ask of a replica, decided from the identity in the
//! client's certificate ([`tessel_tls::Identity`]) and the request.
//!
//! Invariants:
//! 1. Raft traffic, forwarded requests, membership changes, guarded
//!    requests and the replicas' own clock and lease writes (`Tick`,
//!    `RenewLeases`, `ExtendLeases`, `HoldLeases`, `ExpireLeases`, and
//!    `RenewMany`, a follower's batch of
//!    keep-alives: a worker sending one could keep every lease alive) come
//!    from coordinators only.
//! 2. A worker writes the registry and assignment keys of its own name
//!    (`workers/{name}/`, `assignments/{name}/`) and the `jobs/` keys of
//!    attempts assigned to it; the last under a [`Guard`] the state machine
//!    checks when it applies the write (`tessel_kv::state::Guard`), so a
//!    worker never writes another attempt's keys, however it races.
//! 3. A client writes what submit, cancel and drain need (`sched/state`,
//!    `sched/jobs/{id}/bundle|cancel`, `workers/{w}/drain`), no other
//!    registry, assignment or job key, and holds no leases.
//! 4. A job's arrays and logs (`jobs/{job}/arrays/`, `jobs/{job}/logs/`)
//!    are read by coordinators, clients and the job's own workers (a
//!    guard again, checked after the read's linearizable wait); every other
//!    key is readable by every role.
//! 5. Keys outside tessel's zones are scratch space any role may write; the
//!    cluster-wide certificate and `--insecure` may do anything.
//!
//! A request on a prefix (`DeletePrefix`, `List`, `Watch`) is allowed only
//! where it would be for every key under the prefix; a batch only where
//! each of its puts would be, under one guard.

use crate::wire::{ClientRequest, WireRequest};
use tessel_kv::state::{Guard, Needed, Op};
use tessel_tls::{Identity, Role};

/// Key spaces that not every role may write.
const ZONES: [&str; 4] = ["workers/", "assignments/", "jobs/", "sched/"];
const JOBS: &str = "jobs/";

/// What a request may do: go ahead, or go ahead under a guard.
pub type Decision = Result<Option<Guard>, String>;

/// `jobs/{job}/{rest}` → `(job, rest)`; `None` for a key (or prefix) that
/// does not name one job.
fn job_key(key: &[u8]) -> Option<(&str, &str)> {
    let rest = std::str::from_utf8(key.strip_prefix(JOBS.as_bytes())?).ok()?;
    let (job, rest) = rest.split_once('/')?;
    tessel_kv::check_path_component("job", job).ok()?;
    Some((job, rest))
}

/// The guard of worker `name`'s access to job `job`'s keys: its assignment
/// to that attempt (`ID@N`), or, for a job-level key (`ID`: checkpoint
/// records, logs, a job run without the scheduler), to any attempt of it.
fn job_guard(name: &str, job: &str) -> Guard {
    let exact = Needed {
        key: format!("assignments/{name}/{job}").into_bytes(),
        prefix: false,
    };
    let any_of = if job.contains('@') {
        vec![exact]
    } else {
        vec![
            exact,
            Needed {
                key: format!("assignments/{name}/{job}@").into_bytes(),
                prefix: true,
            },
        ]
    };
    Guard {
        who: format!("worker `{name}`"),
        any_of,
    }
}

/// Outside every zone, and (for a prefix) covering none of them.
fn outside_zones(key: &[u8], prefix: bool) -> bool {
    !ZONES
        .iter()
        .any(|z| key.starts_with(z.as_bytes()) || (prefix && z.as_bytes().starts_with(key)))
}

/// Invariant 3's exact keys.
fn client_key(key: &[u8]) -> bool {
    let Ok(k) = std::str::from_utf8(key) else {
        return false;
    };
    let one = |s: &str| !s.is_empty() && !s.contains('/');
    if k == "sched/state" {
        return true;
    }
    if let Some(rest) = k.strip_prefix("sched/jobs/") {
        if let Some((id, what)) = rest.split_once('/') {
            return one(id) && (what == "bundle" || what == "cancel");
        }
    }
    k.strip_prefix("workers/")
        .and_then(|r| r.strip_suffix("/drain"))
        .is_some_and(one)
}

/// Invariants 2, 3 and 5 for one written key (or prefix).
fn may_write(role: Role, name: &str, key: &[u8], prefix: bool) -> Decision {
    if outside_zones(key, prefix) {
        return Ok(None);
    }
    let own = |zone: &str| key.starts_with(format!("{zone}/{name}/").as_bytes());
    let allowed = match role {
        Role::Coordinator => return Ok(None),
        Role::Worker if own("workers") || own("assignments") => return Ok(None),
        Role::Worker => match job_key(key) {
            Some((job, _)) => return Ok(Some(job_guard(name, job))),
            None => false,
        },
        Role::Client => !prefix && client_key(key),
    };
    if allowed {
        Ok(None)
    } else {
        Err(format!(
            "write `{}`{}",
            tessel_kv::show_key(key),
            if prefix { " (a prefix)" } else { "" }
        ))
    }
}

/// Whether a read of `key` (or everything under it) may reach a job's
/// arrays or logs.
fn private_rest(rest: &str, prefix: bool) -> bool {
    ["arrays/", "logs/"]
        .iter()
        .any(|p| rest.starts_with(p) || (prefix && p.starts_with(rest)))
}

/// Invariant 4 for a worker's read.
fn may_read(name: &str, key: &[u8], prefix: bool) -> Decision {
    match job_key(key) {
        Some((job, rest)) if private_rest(rest, prefix) => Ok(Some(job_guard(name, job))),
        Some(_) => Ok(None),
        // A prefix over several jobs' keys reaches arrays a worker may not read.
        None if prefix
            && (key.starts_with(JOBS.as_bytes()) || JOBS.as_bytes().starts_with(key)) =>
        {
            Err(format!(
                "read every job's keys (`{}`); only its own jobs' arrays and logs",
                tessel_kv::show_key(key)
            ))
        }
        None => Ok(None),
    }
}

fn written(op: &Op) -> Vec<(&[u8], bool)> {
    match op {
        Op::Put { key, .. }
        | Op::Insert { key, .. }
        | Op::Delete { key }
        | Op::Increment { key, .. }
        | Op::CompareAndSwap { key, .. } => vec![(key, false)],
        Op::DeletePrefix { prefix } => vec![(prefix, true)],
        Op::BarrierArrive { id, .. } | Op::BarrierCancel { id, .. } => vec![(id, false)],
        Op::LeaseGrant { .. } | Op::LeaseKeepAlive { .. } | Op::LeaseRevoke { .. } => vec![],
        // Refused before (`authorize`).
        Op::Tick
        | Op::RenewLeases
        | Op::ExtendLeases { .. }
        | Op::HoldLeases { .. }
        | Op::ExpireLeases { .. }
        | Op::Guarded { .. } => vec![],
        Op::Once { op, .. } => written(op),
        Op::PutBatch { puts } | Op::GrantPutBatch { puts, .. } => {
            puts.iter().map(|p| (&p.key[..], false)).collect()
        }
    }
}

/// The write inside any [`Op::Once`]: what authorization judges.
fn sent_once(mut op: &Op) -> &Op {
    while let Op::Once { op: inner, .. } = op {
        op = inner;
    }
    op
}

/// Invariants 1-5: `Ok(None)` to serve `req` as it is, `Ok(Some(guard))`
/// to serve it under `guard`, or why `identity` may not make it.
pub fn authorize(identity: &Identity, req: &WireRequest) -> Decision {
    let (role, name) = match identity {
        Identity::Shared | Identity::Anonymous => return Ok(None),
        Identity::Node { role, name } => (*role, name.as_str()),
    };
    let refuse = |what: String| Err(format!("{identity} may not {what}"));
    let c = match req {
        WireRequest::AppendEntries(_) | WireRequest::Vote(_) | WireRequest::InstallSnapshot(_) => {
            return match role {
                Role::Coordinator => Ok(None),
                _ => refuse("take part in Raft".into()),
            }
        }
        WireRequest::Forwarded(_) if role != Role::Coordinator => {
            return refuse("forward requests".into())
        }
        WireRequest::Forwarded(c) | WireRequest::Client(c) => c,
    };
    if role == Role::Coordinator {
        return Ok(None);
    }
    let write = match c {
        ClientRequest::Write(op) => Some(sent_once(op)),
        _ => None,
    };
    match (c, write) {
        (ClientRequest::AddReplica { .. } | ClientRequest::RemoveReplica { .. }, _) => {
            refuse("change the replica set".into())
        }
        (ClientRequest::Guarded { .. }, _) | (_, Some(Op::Guarded { .. })) => {
            refuse("send a guarded request (the replicas add guards)".into())
        }
        (
            _,
            Some(
                Op::Tick
                | Op::RenewLeases
                | Op::ExtendLeases { .. }
                | Op::HoldLeases { .. }
                | Op::ExpireLeases { .. },
            ),
        )
        | (ClientRequest::RenewMany { .. }, _) => {
            refuse("advance the replicas' clock or renew others' leases".into())
        }
        (
            _,
            Some(
                Op::LeaseGrant { .. }
                | Op::GrantPutBatch { .. }
                | Op::LeaseKeepAlive { .. }
                | Op::LeaseRevoke { .. },
            ),
        )
        | (ClientRequest::KeepAliveStream, _)
            if role == Role::Client =>
        {
            refuse("hold leases".into())
        }
        (ClientRequest::Write(op), _) => {
            let mut guard: Option<Guard> = None;
            for (key, prefix) in written(op) {
                match may_write(role, name, key, prefix) {
                    Err(what) => return refuse(what),
                    // One guard a request: a batch over two jobs' keys
                    // would pass on the first job's assignment alone.
                    Ok(Some(g)) if guard.as_ref().is_some_and(|have| *have != g) => {
                        return refuse(format!(
                            "write `{}` in a batch with another job's keys",
                            tessel_kv::show_key(key)
                        ))
                    }
                    Ok(g) => guard = guard.or(g),
                }
            }
            Ok(guard)
        }
        (
            ClientRequest::Get { key, .. }
            | ClientRequest::GetSerializable { key, .. }
            | ClientRequest::TryGet { key },
            _,
        ) if role == Role::Worker => may_read(name, key, false).or_else(refuse),
        (
            ClientRequest::List { prefix }
            | ClientRequest::ListAt { prefix }
            | ClientRequest::Watch { prefix, .. },
            _,
        ) if role == Role::Worker => may_read(name, prefix, true).or_else(refuse),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests;
