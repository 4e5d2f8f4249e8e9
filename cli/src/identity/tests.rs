use super::*;
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

fn peers(pairs: &[(&str, &str)]) -> Result<Vec<(u64, String)>, String> {
    env_peers(&env(pairs), 7000)
        .map(|(p, _)| p.into_iter().collect())
        .map_err(|e| e.to_string())
}

#[test]
fn flags_then_kubernetes_then_slurm() {
    let k8s_sts = env(&[
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("HOSTNAME", "tessel-coordinator-2"),
    ]);
    assert_eq!(replica_id(Some(7), &k8s_sts).unwrap().0, 7);
    assert_eq!(replica_id(None, &k8s_sts).unwrap().0, 3);
    let indexed = env(&[
        ("JOB_COMPLETION_INDEX", "4"),
        ("KUBERNETES_SERVICE_HOST", "x"),
        ("HOSTNAME", "w-9"),
    ]);
    assert_eq!(env_index(&indexed).unwrap().unwrap().index, 4);
    let slurm = env(&[
        ("SLURM_JOB_ID", "77"),
        ("SLURM_PROCID", "1"),
        ("SLURM_NODELIST", "n[1-3]"),
    ]);
    assert_eq!(
        replica_id(None, &slurm).unwrap(),
        (2, "SLURM_PROCID + 1".into())
    );
    // A hostname ordinal counts only inside Kubernetes.
    assert_eq!(env_index(&env(&[("HOSTNAME", "box-3")])).unwrap(), None);
    assert_eq!(replica_id(None, &env(&[])), Err(IdentityError::NoIndex));
    assert!(env_index(&env(&[("JOB_COMPLETION_INDEX", "x")]))
        .unwrap_err()
        .to_string()
        .contains("not a number"));
}

#[test]
fn a_statefulset_pod_names_every_replica_of_its_set() {
    let got = peers(&[
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("HOSTNAME", "tessel-coordinator-1"),
        ("TESSEL_REPLICAS", "3"),
        ("TESSEL_PEER_DOMAIN", "tessel-peers.ml.svc."),
    ])
    .unwrap();
    assert_eq!(
        got,
        (0..3)
            .map(|i| (
                i + 1,
                format!("tessel-coordinator-{i}.tessel-peers.ml.svc:7000")
            ))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_statefulset_pod_without_its_set_size_or_domain_is_told_which_to_set() {
    let base = [
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("HOSTNAME", "tessel-coordinator-3"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut all = base.to_vec();
        all.extend_from_slice(extra);
        peers(&all).unwrap_err()
    };
    assert!(with(&[("TESSEL_PEER_DOMAIN", "d")]).contains("TESSEL_REPLICAS"));
    assert!(with(&[("TESSEL_REPLICAS", "5")]).contains("TESSEL_PEER_DOMAIN"));
    let small = with(&[("TESSEL_REPLICAS", "3"), ("TESSEL_PEER_DOMAIN", "d")]);
    assert!(small.contains("not below TESSEL_REPLICAS=3"), "{small}");
    assert!(peers(&[]).unwrap_err().contains("give --peers"));
}

#[test]
fn a_slurm_step_names_its_nodes_one_replica_each() {
    let step = [
        ("SLURM_JOB_ID", "77"),
        ("SLURM_PROCID", "2"),
        ("SLURM_JOB_NODELIST", "gpu[01-08]"),
        ("SLURM_STEP_NODELIST", "gpu[01-02,05]"),
        ("SLURM_STEP_TASKS_PER_NODE", "1(x3)"),
        ("SLURMD_NODENAME", "gpu05"),
    ];
    let got = peers(&step).unwrap();
    assert_eq!(
        got,
        vec![
            (1, "gpu01:7000".to_owned()),
            (2, "gpu02:7000".to_owned()),
            (3, "gpu05:7000".to_owned())
        ]
    );
    let mut with_domain = step.to_vec();
    with_domain.push(("TESSEL_PEER_DOMAIN", "ib.cluster"));
    assert_eq!(peers(&with_domain).unwrap()[0].1, "gpu01.ib.cluster:7000");
    // No step list (sbatch's own shell): the job's nodes.
    let job = [
        ("SLURM_JOB_ID", "77"),
        ("SLURM_PROCID", "0"),
        ("SLURM_JOB_NODELIST", "n[1-3]"),
    ];
    assert_eq!(peers(&job).unwrap().len(), 3);
}

#[test]
fn a_slurm_step_with_several_tasks_per_node_or_misplaced_tasks_is_refused() {
    let mut two = vec![
        ("SLURM_JOB_ID", "77"),
        ("SLURM_PROCID", "1"),
        ("SLURM_STEP_NODELIST", "n[1-3]"),
    ];
    two.push(("SLURM_STEP_TASKS_PER_NODE", "2,1"));
    assert!(peers(&two).unwrap_err().contains("--ntasks-per-node=1"));
    two.pop();
    two.push(("SLURMD_NODENAME", "n3"));
    assert!(peers(&two).unwrap_err().contains("runs on n3"));
    two.pop();
    two[1] = ("SLURM_PROCID", "3");
    assert!(peers(&two).unwrap_err().contains("has 3 nodes"));
    two[1] = ("SLURM_PROCID", "0");
    two[2] = ("SLURM_STEP_NODELIST", "n[1-");
    assert!(peers(&two).unwrap_err().contains("hostlist"));
}

#[test]
fn tasks_per_node_counts_are_read_as_slurm_writes_them() {
    assert!(one_task_per_node("1(x3)"));
    assert!(one_task_per_node("1,1"));
    assert!(one_task_per_node("1"));
    assert!(!one_task_per_node("2(x3)"));
    assert!(!one_task_per_node("1(x2),4"));
}
