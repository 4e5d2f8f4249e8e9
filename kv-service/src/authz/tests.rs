//! Each rule of the module's invariants, a forbidden request of each kind
//! refused with the reason a user reads.

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

fn get(key: &str) -> WireRequest {
    WireRequest::Client(ClientRequest::TryGet { key: key.into() })
}

fn list(prefix: &str) -> WireRequest {
    WireRequest::Client(ClientRequest::List {
        prefix: prefix.into(),
    })
}

fn list_at(prefix: &str) -> WireRequest {
    WireRequest::Client(ClientRequest::ListAt {
        prefix: prefix.into(),
    })
}

/// The alternatives of the guard `req` gets.
fn guard_of(id: &Identity, req: &WireRequest) -> Vec<String> {
    let g = authorize(id, req)
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no guard for {req:?}"));
    g.any_of
        .iter()
        .map(|n| String::from_utf8(n.key.clone()).unwrap() + if n.prefix { "*" } else { "" })
        .collect()
}

#[test]
fn a_worker_writes_its_own_registry_and_its_attempts_keys_under_a_guard() {
    let h4 = node(Role::Worker, "h4");
    assert_eq!(authorize(&h4, &put("workers/h4/alive")), Ok(None));
    assert_eq!(authorize(&h4, &put("assignments/h4/j@1")), Ok(None));
    assert_eq!(authorize(&h4, &put("barrier-or-other")), Ok(None));
    assert_eq!(
        guard_of(&h4, &put("jobs/j@1/processes/00001/result")),
        ["assignments/h4/j@1"]
    );
    assert_eq!(
        guard_of(&h4, &put("jobs/j/checkpoints/000000000004")),
        ["assignments/h4/j", "assignments/h4/j@*"]
    );
    assert_eq!(
        guard_of(&h4, &del_prefix("jobs/j@1/pjrt/")),
        ["assignments/h4/j@1"]
    );
    let e = authorize(&h4, &put("workers/h5/alive")).unwrap_err();
    assert!(
        e.contains("worker `h4` may not write `workers/h5/alive`"),
        "{e}"
    );
    for forbidden in [
        "workers/h4x/alive",
        "assignments/h5/j@1",
        "sched/state",
        "jobs/no-slash",
    ] {
        assert!(authorize(&h4, &put(forbidden)).is_err(), "{forbidden}");
    }
    assert!(authorize(&h4, &del_prefix("workers/")).is_err());
    assert!(authorize(&h4, &del_prefix("jobs/")).is_err(), "every job");
    assert!(
        authorize(&h4, &del_prefix("")).is_err(),
        "covers every zone"
    );
    assert_eq!(authorize(&h4, &del_prefix("workers/h4/jobs/")), Ok(None));
}

#[test]
fn a_worker_reads_arrays_and_logs_of_its_own_jobs_only() {
    let h4 = node(Role::Worker, "h4");
    assert_eq!(
        guard_of(&h4, &get("jobs/j@1/arrays/w")),
        ["assignments/h4/j@1"]
    );
    assert_eq!(
        guard_of(&h4, &list("jobs/j/logs/00001/")),
        ["assignments/h4/j", "assignments/h4/j@*"]
    );
    assert!(
        !guard_of(&h4, &list("jobs/j@1/")).is_empty(),
        "covers arrays"
    );
    let serializable = WireRequest::Client(ClientRequest::GetSerializable {
        key: b"jobs/j@1/arrays/w".to_vec(),
        timeout_ms: 0,
    });
    assert_eq!(
        guard_of(&h4, &serializable),
        ["assignments/h4/j@1"],
        "guarded alike (so served by the leader: `serializable` invariant 3)"
    );
    assert_eq!(authorize(&h4, &get("jobs/j@1/spec")), Ok(None));
    assert_eq!(authorize(&h4, &list("jobs/j@1/topology/local/")), Ok(None));
    assert_eq!(authorize(&h4, &list("workers/")), Ok(None));
    for every_job in ["jobs/", "jobs/j@1", "", "j"] {
        let e = authorize(&h4, &list(every_job)).unwrap_err();
        assert!(e.contains("may not read every job's keys"), "{e}");
        let e = authorize(&h4, &list_at(every_job)).unwrap_err();
        assert!(
            e.contains("may not read every job's keys"),
            "a listing with its revision: {e}"
        );
    }
    assert_eq!(
        guard_of(&h4, &list_at("jobs/j/logs/00001/")),
        ["assignments/h4/j", "assignments/h4/j@*"],
        "a listing with its revision is guarded as a listing"
    );
    let ops = node(Role::Client, "ops");
    assert_eq!(authorize(&ops, &list("jobs/")), Ok(None));
    assert_eq!(authorize(&ops, &get("jobs/j@1/arrays/w")), Ok(None));
}

#[test]
fn a_client_writes_only_what_submit_cancel_and_drain_need() {
    let ops = node(Role::Client, "ops");
    for key in [
        "sched/state",
        "sched/jobs/j.1/bundle",
        "sched/jobs/j.1/cancel",
        "workers/h4/drain",
        "my/own/key",
    ] {
        assert_eq!(authorize(&ops, &put(key)), Ok(None), "{key}");
    }
    for key in [
        "workers/h4/incarnation",
        "assignments/h4/x",
        "jobs/x/done",
        "sched/jobs/j.1/events/000000000001",
        "sched/jobs/j.1/bundle/x",
    ] {
        let e = authorize(&ops, &put(key)).unwrap_err();
        assert!(e.contains("client `ops` may not write"), "{e}");
    }
    assert!(authorize(&ops, &del_prefix("sched/")).is_err());
    let grant = WireRequest::Client(ClientRequest::Write(Op::LeaseGrant { ttl_ms: 5000 }));
    assert!(authorize(&ops, &grant).is_err());
}

#[test]
fn only_coordinators_join_forward_or_guard() {
    let ops = node(Role::Client, "ops");
    let join = WireRequest::Client(ClientRequest::AddReplica {
        id: 9,
        addr: "10.0.0.9:7000".into(),
    });
    assert!(authorize(&ops, &join).is_err());
    assert!(authorize(&node(Role::Worker, "h4"), &join).is_err());
    assert_eq!(authorize(&node(Role::Coordinator, "2"), &join), Ok(None));
    assert!(authorize(&ops, &WireRequest::Forwarded(ClientRequest::Revision)).is_err());
    let forged = WireRequest::Client(ClientRequest::Write(Op::Guarded {
        guard: Guard {
            who: "worker `h4`".into(),
            any_of: vec![],
        },
        op: Box::new(Op::Delete {
            key: b"jobs/j@1/done".to_vec(),
        }),
    }));
    let e = authorize(&node(Role::Worker, "h4"), &forged).unwrap_err();
    assert!(e.contains("guarded request"), "{e}");
}

#[test]
fn only_coordinators_advance_the_clock_or_renew_leases_in_bulk() {
    let internal = [
        Op::Tick,
        Op::RenewLeases,
        Op::ExtendLeases {
            renewed: vec![(7, u64::MAX)],
        },
        Op::HoldLeases { ids: vec![7] },
        Op::ExpireLeases { ids: vec![7] },
    ];
    for op in internal {
        let req = WireRequest::Client(ClientRequest::Write(op));
        for who in [node(Role::Worker, "h4"), node(Role::Client, "ops")] {
            let e = authorize(&who, &req).unwrap_err();
            assert!(e.contains("renew others' leases"), "{e}");
        }
        assert_eq!(authorize(&node(Role::Coordinator, "1"), &req), Ok(None));
    }
}

#[test]
fn the_shared_certificate_and_insecure_peers_may_do_anything() {
    for id in [Identity::Shared, Identity::Anonymous] {
        assert_eq!(authorize(&id, &put("workers/h5/alive")), Ok(None));
        assert_eq!(authorize(&id, &put("sched/state")), Ok(None));
        assert_eq!(authorize(&id, &list("jobs/")), Ok(None));
    }
}

#[test]
fn a_write_sent_once_is_judged_as_the_write_inside() {
    let once = |req: WireRequest| match req {
        WireRequest::Client(ClientRequest::Write(op)) => {
            let inner = Op::Once {
                client: 1,
                seq: 2,
                floor: 2,
                op: Box::new(op),
            };
            // Twice wrapped: the state refuses it, authorization looks inside.
            WireRequest::Client(ClientRequest::Write(Op::Once {
                client: 1,
                seq: 3,
                floor: 3,
                op: Box::new(inner),
            }))
        }
        other => other,
    };
    let h4 = node(Role::Worker, "h4");
    assert_eq!(authorize(&h4, &once(put("workers/h4/alive"))), Ok(None));
    assert_eq!(
        guard_of(&h4, &once(put("jobs/j@1/processes/00001/result"))),
        ["assignments/h4/j@1"]
    );
    let e = authorize(&h4, &once(put("workers/h5/alive"))).unwrap_err();
    assert!(e.contains("may not write `workers/h5/alive`"), "{e}");
    let tick = WireRequest::Client(ClientRequest::Write(Op::Tick));
    let e = authorize(&h4, &once(tick)).unwrap_err();
    assert!(e.contains("renew others' leases"), "{e}");
    let grant = WireRequest::Client(ClientRequest::Write(Op::LeaseGrant { ttl_ms: 5 }));
    let e = authorize(&node(Role::Client, "ops"), &once(grant)).unwrap_err();
    assert!(e.contains("hold leases"), "{e}");
}

#[test]
fn a_keep_alive_stream_is_opened_by_those_who_hold_leases() {
    let stream = WireRequest::Client(ClientRequest::KeepAliveStream);
    let e = authorize(&node(Role::Client, "ops"), &stream).unwrap_err();
    assert!(e.contains("hold leases"), "{e}");
    assert_eq!(authorize(&node(Role::Worker, "h4"), &stream), Ok(None));
    assert_eq!(authorize(&node(Role::Coordinator, "c1"), &stream), Ok(None));
}

#[test]
fn only_replicas_renew_leases_in_batches() {
    let many = ClientRequest::RenewMany { leases: vec![7, 9] };
    for role in [Role::Worker, Role::Client] {
        let e = authorize(&node(role, "h4"), &WireRequest::Client(many.clone())).unwrap_err();
        assert!(e.contains("renew others' leases"), "{e}");
    }
    let relayed = WireRequest::Forwarded(many);
    assert_eq!(
        authorize(&node(Role::Coordinator, "c2"), &relayed),
        Ok(None)
    );
}

#[test]
fn a_batch_is_judged_put_by_put_under_one_guard() {
    let batch = |keys: &[&str]| {
        WireRequest::Client(ClientRequest::Write(Op::PutBatch {
            puts: keys
                .iter()
                .map(|k| tessel_kv::BatchPut::new(k.as_bytes(), b"", None))
                .collect(),
        }))
    };
    let h4 = node(Role::Worker, "h4");
    assert_eq!(
        authorize(&h4, &batch(&["workers/h4/info", "workers/h4/alive"])),
        Ok(None)
    );
    assert_eq!(
        guard_of(&h4, &batch(&["workers/h4/jobs/j@1", "jobs/j@1/members/h4"])),
        ["assignments/h4/j@1"]
    );
    let e = authorize(&h4, &batch(&["workers/h4/info", "workers/h5/alive"])).unwrap_err();
    assert!(e.contains("may not write `workers/h5/alive`"), "{e}");
    // Two jobs' keys would need two guards: one would go unchecked.
    let e = authorize(&h4, &batch(&["jobs/j@1/members/h4", "jobs/k@1/members/h4"])).unwrap_err();
    assert!(e.contains("in a batch with another job's keys"), "{e}");
}

#[test]
fn a_registration_grants_a_lease_and_writes_only_its_own_workers_keys() {
    let register = |worker: &str| {
        let put = |k: &str| {
            tessel_kv::BatchPut::new(format!("workers/{worker}/{k}").as_bytes(), b"", Some(7))
        };
        WireRequest::Client(ClientRequest::Write(Op::GrantPutBatch {
            lease: 7,
            ttl_ms: 5000,
            puts: vec![put("info"), put("alive")],
        }))
    };
    let h4 = node(Role::Worker, "h4");
    assert_eq!(authorize(&h4, &(register("h4"))), Ok(None));
    let e = authorize(&h4, &(register("h5"))).unwrap_err();
    assert!(e.contains("may not write `workers/h5/"), "{e}");
    let e = authorize(&node(Role::Client, "ops"), &(register("ops"))).unwrap_err();
    assert!(e.contains("hold leases"), "{e}");
}
