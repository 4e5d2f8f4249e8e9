//! The environment of a command job's process, pure: JAX's variables
//! (`JAX_COORDINATOR_ADDRESS`, `JAX_LOCAL_DEVICE_IDS`, which
//! `jax.distributed.initialize()` reads by itself, plus the process count
//! and id it must be given), torchrun's, and tessel's own.

use super::CommandLaunch;

/// Every variable tessel sets; a job's `env` may not set these.
pub const SET_BY_TESSEL: &[&str] = &[
    "JAX_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "JAX_LOCAL_DEVICE_IDS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TESSEL_JOB_ID",
    "TESSEL_ATTEMPT",
    "TESSEL_PROCESS_INDEX",
    "TESSEL_NUM_PROCESSES",
    "TESSEL_LOCAL_RANK",
    "TESSEL_WORKER_ID",
    "TESSEL_CHECKPOINT_DIR",
    "TESSEL_PREEMPT_FILE",
    "TESSEL_WORK_DIR",
    "TESSEL_COORDINATORS",
    "TESSEL_TLS_DIR",
];

/// Where an attempt's processes meet: process 0's host, and a free port
/// there for each framework's own rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    /// An address of process 0's host the other hosts reach.
    pub host: String,
    /// For JAX's coordination service.
    pub jax_port: u16,
    /// For `torch.distributed`'s store.
    pub torch_port: u16,
}

impl Rendezvous {
    /// `host jax_port torch_port`, as published in the key-value service.
    pub fn encode(&self) -> String {
        format!("{} {} {}", self.host, self.jax_port, self.torch_port)
    }

    /// The published form, checked.
    pub fn decode(text: &str) -> Option<Rendezvous> {
        let mut it = text.split(' ');
        let r = Rendezvous {
            host: it.next().filter(|h| !h.is_empty())?.to_owned(),
            jax_port: it.next()?.parse().ok()?,
            torch_port: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(r)
    }

    /// `host:port`, bracketing an IPv6 address.
    fn addr(&self, port: u16) -> String {
        if self.host.contains(':') {
            format!("[{}]:{port}", self.host)
        } else {
            format!("{}:{port}", self.host)
        }
    }
}

/// What a placement knows about where it runs.
#[derive(Debug, Clone)]
pub struct Placement<'a> {
    /// The job's id (`NAME.N`).
    pub job_id: &'a str,
    /// The attempt (1, 2, ...).
    pub attempt: u32,
    /// This placement's index among the attempt's placements.
    pub group: u32,
    /// The worker's id.
    pub worker: &'a str,
    /// The worker's platform (`cpu`, `cuda`, `tpu`).
    pub platform: &'a str,
    /// The attempt's folder on this host.
    pub work_dir: &'a str,
    /// The file a preemption notice appears at.
    pub preempt_file: &'a str,
    /// The worker's own additions (`TESSEL_COORDINATORS`, `TESSEL_TLS_DIR`).
    pub extra: &'a [(String, String)],
}

/// The environment of local process `local` of placement `p`: the job's
/// own variables, then tessel's (which win).
pub fn process_env(
    l: &CommandLaunch,
    p: &Placement<'_>,
    r: &Rendezvous,
    local: u32,
) -> Vec<(String, String)> {
    let k = l.processes_per_worker;
    let rank = p.group * k + local;
    let groups = l.processes / k.max(1);
    let restarts = p.attempt.saturating_sub(1);
    let mut env: Vec<(String, String)> = l.env.clone();
    let mut set = |k: &str, v: String| env.push((k.to_owned(), v));
    set("JAX_COORDINATOR_ADDRESS", r.addr(r.jax_port));
    set("JAX_NUM_PROCESSES", l.processes.to_string());
    set("JAX_PROCESS_ID", rank.to_string());
    if p.platform != "cpu" {
        // This process's share of the worker's devices (CPU devices are
        // the process's own: nothing to choose).
        let d = l.devices_per_process;
        let ids: Vec<String> = (local * d..(local + 1) * d)
            .map(|i| i.to_string())
            .collect();
        set("JAX_LOCAL_DEVICE_IDS", ids.join(","));
    }
    set("MASTER_ADDR", r.host.clone());
    set("MASTER_PORT", r.torch_port.to_string());
    set("RANK", rank.to_string());
    set("WORLD_SIZE", l.processes.to_string());
    set("LOCAL_RANK", local.to_string());
    set("LOCAL_WORLD_SIZE", k.to_string());
    set("GROUP_RANK", p.group.to_string());
    set("GROUP_WORLD_SIZE", groups.to_string());
    set("ROLE_RANK", rank.to_string());
    set("ROLE_WORLD_SIZE", l.processes.to_string());
    set("ROLE_NAME", "default".into());
    set("TORCHELASTIC_RESTART_COUNT", restarts.to_string());
    set("TORCHELASTIC_MAX_RESTARTS", l.max_restarts.to_string());
    set("TORCHELASTIC_RUN_ID", p.job_id.to_owned());
    set("TESSEL_JOB_ID", p.job_id.to_owned());
    set("TESSEL_ATTEMPT", p.attempt.to_string());
    set("TESSEL_PROCESS_INDEX", rank.to_string());
    set("TESSEL_NUM_PROCESSES", l.processes.to_string());
    set("TESSEL_LOCAL_RANK", local.to_string());
    set("TESSEL_WORKER_ID", p.worker.to_owned());
    set("TESSEL_WORK_DIR", p.work_dir.to_owned());
    set("TESSEL_PREEMPT_FILE", p.preempt_file.to_owned());
    if let Some(dir) = &l.checkpoint_dir {
        set("TESSEL_CHECKPOINT_DIR", dir.display().to_string());
    }
    for (k, v) in p.extra {
        set(k, v.clone());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::time::Duration;

    fn launch(processes: u32, per_worker: u32) -> CommandLaunch {
        CommandLaunch {
            argv: vec!["python3".into()],
            env: vec![("STEPS".into(), "5".into())],
            workdir: None,
            files: Vec::new(),
            processes,
            processes_per_worker: per_worker,
            devices_per_process: 2,
            checkpoint_dir: Some("/ckpt/j".into()),
            stop_grace: Duration::from_secs(1),
            max_restarts: 3,
        }
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> &'a str {
        env.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{k} unset"))
    }

    #[test]
    fn ranks_cover_the_job_once_and_every_process_meets_at_one_address() {
        let l = launch(6, 2);
        let r = Rendezvous {
            host: "10.0.0.1".into(),
            jax_port: 4001,
            torch_port: 4002,
        };
        let mut ranks = BTreeSet::new();
        for group in 0..3 {
            for local in 0..2 {
                let p = Placement {
                    job_id: "train.4",
                    attempt: 3,
                    group,
                    worker: "w",
                    platform: "cuda",
                    work_dir: "/w",
                    preempt_file: "/w/preempt",
                    extra: &[],
                };
                let env = process_env(&l, &p, &r, local);
                assert!(ranks.insert(get(&env, "RANK").to_owned()));
                assert_eq!(get(&env, "RANK"), get(&env, "JAX_PROCESS_ID"));
                assert_eq!(get(&env, "RANK"), get(&env, "ROLE_RANK"));
                assert_eq!(get(&env, "RANK"), (group * 2 + local).to_string());
                assert_eq!(get(&env, "WORLD_SIZE"), "6");
                assert_eq!(get(&env, "GROUP_RANK"), group.to_string());
                assert_eq!(get(&env, "GROUP_WORLD_SIZE"), "3");
                assert_eq!(get(&env, "LOCAL_WORLD_SIZE"), "2");
                assert_eq!(get(&env, "MASTER_ADDR"), "10.0.0.1");
                assert_eq!(get(&env, "MASTER_PORT"), "4002");
                assert_eq!(get(&env, "JAX_COORDINATOR_ADDRESS"), "10.0.0.1:4001");
                assert_eq!(get(&env, "TORCHELASTIC_RESTART_COUNT"), "2");
                assert_eq!(get(&env, "STEPS"), "5");
                // Two devices per process, this process's two.
                let first = local * 2;
                assert_eq!(
                    get(&env, "JAX_LOCAL_DEVICE_IDS"),
                    format!("{first},{}", first + 1)
                );
            }
        }
        assert_eq!(ranks.len(), 6);
    }

    #[test]
    fn rendezvous_round_trips_and_bad_text_is_refused() {
        let r = Rendezvous {
            host: "::1".into(),
            jax_port: 1,
            torch_port: 2,
        };
        assert_eq!(Rendezvous::decode(&r.encode()), Some(r.clone()));
        assert_eq!(r.addr(1), "[::1]:1");
        for bad in ["", "h 1", "h 1 x", "h 1 2 3", " 1 2", "h 70000 1"] {
            assert_eq!(Rendezvous::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn every_variable_tessel_sets_is_reserved() {
        let l = launch(2, 1);
        let r = Rendezvous {
            host: "h".into(),
            jax_port: 1,
            torch_port: 2,
        };
        let p = Placement {
            job_id: "j.1",
            attempt: 1,
            group: 0,
            worker: "w",
            platform: "cuda",
            work_dir: "/w",
            preempt_file: "/p",
            extra: &[
                ("TESSEL_COORDINATORS".into(), "a".into()),
                ("TESSEL_TLS_DIR".into(), "/t".into()),
            ],
        };
        for (k, _) in process_env(&l, &p, &r, 0) {
            assert!(k == "STEPS" || SET_BY_TESSEL.contains(&k.as_str()), "{k}");
        }
    }
}
