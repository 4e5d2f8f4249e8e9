//! One placement of a command job: its folder, the rendezvous, the
//! processes, and the wait for the attempt's end (module invariants 2-4).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessel_coordinator::attempt::{self, Record};
use tessel_coordinator::jobs::{FailureKind, JobAssignment};
use tessel_coordinator::{scheduler, Item, Records, Registration};
use tokio::sync::mpsc;

use super::env::{process_env, Placement, Rendezvous};
use super::gang::{describe, Gang};
use super::logs::{Shipper, Tails};
use super::CommandLaunch;
use crate::agent::Worker;
use crate::error::kv_err;
use crate::error::{Result, WorkerError};
use crate::runner::JobError;

/// How long a failed process's last lines may take to arrive.
const TAIL_WAIT: Duration = Duration::from_secs(1);

/// The file a preemption notice is written to, in the attempt's folder.
pub(crate) const PREEMPT_FILE: &str = ".tessel-preempt";

/// The attempt's attempt number (`ID@A` → A; 1 for a bare id).
pub(crate) fn attempt_of(instance: &str) -> u32 {
    instance
        .split_once('@')
        .and_then(|(_, a)| a.parse().ok())
        .unwrap_or(1)
}

/// Writes the shipped files under `dir`, each confined to it.
fn write_files(dir: &Path, files: &[(PathBuf, Vec<u8>)]) -> std::io::Result<()> {
    for (rel, bytes) in files {
        // The spec's validation allows only plain relative paths; checked
        // again here, where a path would be created.
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(std::io::Error::other(format!(
                "{} is not a plain relative path",
                rel.display()
            )));
        }
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes)?;
    }
    Ok(())
}

impl Worker {
    /// Runs this worker's processes of a command job's attempt and waits
    /// for the attempt to end.
    pub(crate) async fn run_command(
        &self,
        a: &JobAssignment,
        reg: &Registration,
        launch: CommandLaunch,
    ) -> Result<()> {
        let instance = &a.attempt;
        let job_id = scheduler::job_of_instance(instance).to_owned();
        let attempt = attempt_of(instance);
        // Invariant 5: an earlier attempt's processes here stop within
        // their grace (and a little for the reaping).
        let lock = self
            .gangs
            .lock()
            .expect("not poisoned")
            .entry(job_id.clone())
            .or_default()
            .clone();
        let _turn = tokio::time::timeout(
            launch.stop_grace + Duration::from_secs(5),
            lock.clone().lock_owned(),
        )
        .await
        .map_err(|_| {
            WorkerError::Internal(format!(
                "the processes of an earlier attempt of {job_id} did not stop"
            ))
        })?;
        let outcome = self.run_attempt(a, reg, launch, &job_id, attempt).await;
        let mut gangs = self.gangs.lock().expect("not poisoned");
        // The map's and this function's: nobody else waits for the job.
        if Arc::strong_count(&lock) == 2 {
            gangs.remove(&job_id);
        }
        outcome
    }

    async fn run_attempt(
        &self,
        a: &JobAssignment,
        reg: &Registration,
        launch: CommandLaunch,
        job_id: &str,
        attempt: u32,
    ) -> Result<()> {
        let instance = &a.attempt;
        let folder = self.cfg.work_dir.join(instance);
        let _cleanup = RemoveOnDrop(folder.clone());
        std::fs::create_dir_all(&folder)
            .and_then(|()| write_files(&folder, &launch.files))
            .map_err(|e| {
                WorkerError::Job(JobError::job(format!(
                    "writing the job's files into {}: {e}",
                    folder.display()
                )))
            })?;
        let dir = launch.workdir.clone().unwrap_or_else(|| folder.clone());
        if !dir.is_dir() {
            return Err(WorkerError::Job(JobError::job(format!(
                "workdir {} does not exist on worker `{}`",
                dir.display(),
                self.cfg.worker_id
            ))));
        }
        let rendezvous = self.rendezvous(a).await?;
        let preempt = folder.join(PREEMPT_FILE);
        let placement = Placement {
            job_id,
            attempt,
            group: a.process_index,
            worker: &self.cfg.worker_id,
            platform: &self.facts.platform,
            work_dir: &folder.display().to_string(),
            preempt_file: &preempt.display().to_string(),
            extra: &self.cfg.command_env,
        };
        let envs = (0..launch.processes_per_worker)
            .map(|local| process_env(&launch, &placement, &rendezvous, local))
            .collect();
        let first_rank = a.process_index * launch.processes_per_worker;
        let shipper = Shipper::new(self.kv.clone(), job_id, attempt, first_rank)
            .echo_lines(self.cfg.echo_job_output);
        let tails = shipper.tails();
        let (lines, rx) = mpsc::channel(1024);
        let shipping = tokio::spawn(shipper.run(rx));
        let started = Instant::now();
        let (mut gang, readers) = Gang::spawn(&launch.argv, envs, &dir, launch.stop_grace, &lines)
            .map_err(|e| WorkerError::Job(JobError::job(e.0)))?;
        drop(lines);
        tracing::info!(job = %instance, processes = launch.processes_per_worker, first_rank, "command started");
        let ms = format!("{:.1}", started.elapsed().as_secs_f64() * 1e3);
        attempt::publish(
            &*self.kv,
            instance,
            a.process_index,
            Record::TransferReady,
            ms.as_bytes(),
        )
        .await?;
        let outcome = tracing::Instrument::instrument(
            self.supervise(a, reg, &mut gang, &tails, first_rank, started, &preempt),
            tracing::info_span!(target: tessel_trace::TARGET, "command", processes = launch.processes_per_worker),
        )
        .await;
        gang.stop().await;
        // Let the last lines reach the store before the attempt's folder goes.
        for r in readers {
            let _ = tokio::time::timeout(TAIL_WAIT, r).await;
        }
        let _ = tokio::time::timeout(TAIL_WAIT * 2, shipping).await;
        outcome
    }

    /// Watches the gang until every process exited 0 (then publishes the
    /// result and waits for the attempt's end), one failed (then fails the
    /// job), a preemption notice came (the notice file, then SIGTERM after
    /// its grace; the attempt restarts), or the job ended or failed
    /// elsewhere.
    #[allow(clippy::too_many_arguments)]
    async fn supervise(
        &self,
        a: &JobAssignment,
        reg: &Registration,
        gang: &mut Gang,
        tails: &Tails,
        first_rank: u32,
        started: Instant,
        preempt_file: &Path,
    ) -> Result<()> {
        let mut codes = Vec::new();
        let mut notice: Option<(tokio::time::Instant, String)> = None;
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        while !gang.is_empty() {
            tokio::select! {
                n = self.notice(&a.attempt), if notice.is_none() => {
                    let (grace, reason) = n;
                    tracing::info!(job = %a.attempt, reason, grace_ms = grace.as_millis() as u64, "preemption notice");
                    if let Err(e) = std::fs::write(preempt_file, format!("{reason}\n")) {
                        tracing::warn!(error = %e, "could not write the preemption notice");
                    }
                    notice = Some((tokio::time::Instant::now() + grace, reason));
                }
                () = tokio::time::sleep_until(notice.as_ref().map_or(far, |n| n.0)), if notice.is_some() => {
                    gang.stop().await;
                }
                exit = gang.next_exit() => {
                    let Some((local, status)) = exit else { break };
                    let status = status.map_err(|e| WorkerError::Internal(format!("waiting for a process: {e}")))?;
                    if notice.is_some() {
                        // Checkpointed and gone, as asked: not a failure.
                        continue;
                    }
                    if status.success() {
                        codes.push(0);
                        continue;
                    }
                    // Its last lines may still be in the pipe.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let tail = tails
                        .lock()
                        .expect("not poisoned")
                        .get(&local)
                        .map(|t| t.iter().map(|l| format!("\n  | {l}")).collect::<String>())
                        .unwrap_or_default();
                    let e = WorkerError::Job(JobError {
                        kind: FailureKind::Exited,
                        message: format!(
                            "process {} {}{}",
                            first_rank + local,
                            describe(status),
                            if tail.is_empty() { String::new() } else { format!("; its last lines:{tail}") }
                        ),
                    });
                    // Recorded before the others stop, so every other
                    // placement hears of it at once.
                    self.record_failure(a, reg, &e).await;
                    return Err(e);
                }
                f = self.job_failed(&a.attempt) => {
                    f?;
                    gang.stop().await;
                    return self.wait_for_end(a, reg).await;
                }
                d = self.job_done(&a.attempt) => {
                    d?;
                    tracing::info!(job = %a.attempt, "job ended; stopping its processes");
                    gang.stop().await;
                    return self.wait_for_end(a, reg).await;
                }
            }
        }
        if let Some((deadline, reason)) = notice {
            // Processes elsewhere may still be checkpointing: the attempt
            // ends at the notice's deadline, not at the first gang done.
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                _ = self.job_failed(&a.attempt) => return self.wait_for_end(a, reg).await,
                _ = self.job_done(&a.attempt) => return self.wait_for_end(a, reg).await,
            }
            let e = WorkerError::Job(JobError {
                kind: FailureKind::Suspended,
                message: format!("suspended for a preemption notice: {reason}"),
            });
            self.record_failure(a, reg, &e).await;
            return Err(e);
        }
        let result = serde_json::json!({
            "exit_codes": codes,
            "seconds": started.elapsed().as_secs_f64(),
        });
        let result = result.to_string();
        attempt::publish(
            &*self.kv,
            &a.attempt,
            a.process_index,
            Record::Result,
            result.as_bytes(),
        )
        .await?;
        self.wait_for_end(a, reg).await
    }

    /// Placement 0 picks two free ports on its host and publishes them;
    /// the others read them, within the topology deadline.
    async fn rendezvous(&self, a: &JobAssignment) -> Result<Rendezvous> {
        let records = Records::new(&*self.kv, &a.attempt);
        if a.process_index == 0 {
            let port = || -> Result<u16> {
                let l = std::net::TcpListener::bind((self.cfg.transfer_ip, 0))
                    .map_err(|e| WorkerError::Internal(format!("choosing a port: {e}")))?;
                Ok(l.local_addr()
                    .map_err(|e| WorkerError::Internal(e.to_string()))?
                    .port())
            };
            // Both listeners closed before either port is handed out; the
            // kernel does not hand a just-closed port out again at once.
            let r = Rendezvous {
                host: self.cfg.transfer_ip.to_string(),
                jax_port: port()?,
                torch_port: port()?,
            };
            // A worker that came back to the same attempt keeps the first.
            records
                .first(Item::Rendezvous, r.encode().as_bytes())
                .await
                .map_err(kv_err("publishing the rendezvous"))?;
        }
        let timeout = Duration::from_millis(a.topology_timeout_ms);
        let bytes = records
            .wait(Item::Rendezvous, timeout)
            .await
            .map_err(kv_err("waiting for process 0's rendezvous address"))?;
        Rendezvous::decode(&String::from_utf8_lossy(&bytes)).ok_or_else(|| {
            WorkerError::Internal(format!(
                "bad rendezvous value {:?}",
                String::from_utf8_lossy(&bytes)
            ))
        })
    }
}

/// Removes an attempt's folder when its placement ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_land_inside_the_folder_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), &[("a/b.py".into(), b"x".to_vec())]).unwrap();
        assert_eq!(std::fs::read(dir.path().join("a/b.py")).unwrap(), b"x");
        for bad in ["../escape", "/etc/passwd", "a/../../x", "./a"] {
            assert!(
                write_files(dir.path(), &[(bad.into(), b"x".to_vec())]).is_err(),
                "{bad}"
            );
        }
        assert_eq!(attempt_of("j.1@3"), 3);
        assert_eq!(attempt_of("j.1"), 1);
    }
}
