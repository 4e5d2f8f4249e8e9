//! What the monitor keeps of the registry, and its decisions: which jobs
//! fail for each listing and event (pure; the I/O is in [`super`]).

use std::collections::HashMap;

use tessel_kv::{Event, KeyValue};

use crate::keys;

/// A job to fail: a worker incarnation it joined is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lost {
    /// The job.
    pub(crate) job: String,
    /// The worker.
    pub(crate) worker: String,
    /// The incarnation that joined the job, where the key says.
    pub(crate) incarnation: Option<u64>,
    /// [`super::LOST_LEASE`] or [`super::RESTARTED`].
    pub(crate) reason: &'static str,
}

/// One worker as the monitor sees it.
#[derive(Default)]
struct Seen {
    /// The incarnation whose alive key exists (`None`: none does).
    alive: Option<u64>,
    /// Its alive key was deleted since the monitor started: a job joined
    /// now was joined by a dead worker (invariant 1's race).
    dead: bool,
    /// Jobs joined (and not left), with the joining incarnation.
    jobs: HashMap<String, Option<u64>>,
}

/// The registry's workers, alive keys and joined jobs: listed once, then
/// kept from the watch (invariant 4).
pub(crate) struct Index {
    workers: HashMap<String, Seen>,
    /// Until the watch passes `listed_through`, its events may be older
    /// than the listing: the listing's revision of each key, to skip those
    /// (invariant 2). Dropped once passed.
    listed: Option<(u64, HashMap<Vec<u8>, u64>)>,
}

/// A registry key the monitor follows.
enum Key<'a> {
    Alive(&'a str),
    Job(&'a str, &'a str),
}

fn parse(key: &[u8]) -> Option<Key<'_>> {
    if let Some(w) = keys::parse_alive(key) {
        return Some(Key::Alive(w));
    }
    keys::parse_worker_job(key).map(|(w, j)| Key::Job(w, j))
}

fn incarnation(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

impl Index {
    /// The index of a listing of `workers/` read no later than revision
    /// `listed_through`, and the jobs to fail for what it shows: every job
    /// of a worker with no alive key, and the jobs an older incarnation
    /// joined of one that registered again (losses while no monitor ran).
    pub(crate) fn listed(pairs: &[KeyValue], listed_through: u64) -> (Index, Vec<Lost>) {
        let mut index = Index {
            workers: HashMap::new(),
            listed: Some((
                listed_through,
                pairs
                    .iter()
                    .map(|p| (p.key.clone(), p.mod_revision))
                    .collect(),
            )),
        };
        for p in pairs {
            match parse(&p.key) {
                Some(Key::Alive(w)) => {
                    index.worker(w).alive = keys::parse_alive_value(&p.value).map(|(i, _)| i);
                }
                Some(Key::Job(w, j)) => {
                    index
                        .worker(w)
                        .jobs
                        .insert(j.to_owned(), incarnation(&p.value));
                }
                None => {}
            }
        }
        let mut lost = Vec::new();
        for (w, seen) in &index.workers {
            let reason = match seen.alive {
                None => super::LOST_LEASE,
                Some(_) => super::RESTARTED,
            };
            lost.extend(fail(w, seen, seen.alive, reason));
        }
        (index, lost)
    }

    /// Worker `w`'s entry; its name is copied only for a new one.
    fn worker(&mut self, w: &str) -> &mut Seen {
        if !self.workers.contains_key(w) {
            self.workers.insert(w.to_owned(), Seen::default());
        }
        self.workers.get_mut(w).expect("inserted")
    }

    /// Applies one event of the watch; returns the jobs to fail.
    pub(crate) fn apply(&mut self, event: &Event) -> Vec<Lost> {
        if let Some((through, revisions)) = &self.listed {
            if event.revision() > *through {
                self.listed = None;
            } else if revisions
                .get(event.key())
                .is_some_and(|&r| r >= event.revision())
            {
                // The listing holds this key as of this event or later.
                return Vec::new();
            }
        }
        match (parse(event.key()), event) {
            (Some(Key::Alive(w)), Event::Put(p)) => {
                let Some((inc, _)) = keys::parse_alive_value(&p.value) else {
                    return Vec::new();
                };
                let seen = self.worker(w);
                seen.dead = false;
                if seen.alive.replace(inc) == Some(inc) {
                    // The same incarnation written again: nothing new.
                    return Vec::new();
                }
                fail(w, seen, Some(inc), super::RESTARTED)
            }
            (Some(Key::Alive(w)), Event::Delete { .. }) => {
                let seen = self.worker(w);
                seen.alive = None;
                seen.dead = true;
                fail(w, seen, None, super::LOST_LEASE)
            }
            (Some(Key::Job(w, j)), Event::Put(p)) => {
                let inc = incarnation(&p.value);
                let seen = self.worker(w);
                seen.jobs.insert(j.to_owned(), inc);
                if seen.dead {
                    vec![lost(w, j, inc, super::LOST_LEASE)]
                } else {
                    Vec::new()
                }
            }
            (Some(Key::Job(w, j)), Event::Delete { .. }) => {
                if let Some(seen) = self.workers.get_mut(w) {
                    seen.jobs.remove(j);
                    if seen.jobs.is_empty() && seen.alive.is_none() {
                        self.workers.remove(w);
                    }
                }
                Vec::new()
            }
            (None, _) => Vec::new(),
        }
    }
}

fn lost(worker: &str, job: &str, incarnation: Option<u64>, reason: &'static str) -> Lost {
    Lost {
        job: job.to_owned(),
        worker: worker.to_owned(),
        incarnation,
        reason,
    }
}

/// The jobs of `seen` joined by an incarnation older than `alive` (every
/// one where `alive` is `None`).
fn fail(worker: &str, seen: &Seen, alive: Option<u64>, reason: &'static str) -> Vec<Lost> {
    let mut out: Vec<Lost> = seen
        .jobs
        .iter()
        .filter(|(_, inc)| match (inc, alive) {
            (Some(inc), Some(alive)) => *inc < alive,
            _ => alive.is_none(),
        })
        .map(|(job, &inc)| lost(worker, job, inc, reason))
        .collect();
    out.sort_by(|a, b| a.job.cmp(&b.job));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(key: String, value: &str, rev: u64) -> KeyValue {
        KeyValue {
            key: key.into_bytes(),
            value: value.as_bytes().to_vec(),
            create_revision: rev,
            mod_revision: rev,
            lease: None,
        }
    }

    fn alive(w: &str, inc: u64, rev: u64) -> KeyValue {
        pair(keys::alive(w), &keys::alive_value(inc, 1), rev)
    }

    fn joined(w: &str, job: &str, inc: u64, rev: u64) -> KeyValue {
        pair(keys::worker_job(w, job), &inc.to_string(), rev)
    }

    fn delete(key: String, revision: u64) -> Event {
        Event::Delete {
            key: key.into_bytes(),
            revision,
        }
    }

    fn jobs(lost: &[Lost]) -> Vec<(&str, &str, &'static str)> {
        lost.iter()
            .map(|l| (l.job.as_str(), l.worker.as_str(), l.reason))
            .collect()
    }

    /// Invariant 1: a deleted alive key fails every job its worker joined;
    /// a heartbeat's rewrite fails nothing.
    #[test]
    fn a_lost_worker_fails_every_job_it_joined_and_a_beat_fails_none() {
        let listing = [
            alive("a", 1, 1),
            joined("a", "j", 1, 2),
            joined("a", "k", 1, 3),
        ];
        let (mut index, lost) = Index::listed(&listing, 3);
        assert!(lost.is_empty(), "{lost:?}");
        assert!(index.apply(&Event::Put(alive("a", 1, 4))).is_empty());
        let lost = index.apply(&delete(keys::alive("a"), 5));
        assert_eq!(
            jobs(&lost),
            [
                ("j", "a", super::super::LOST_LEASE),
                ("k", "a", super::super::LOST_LEASE)
            ]
        );
        assert_eq!(lost[0].incarnation, Some(1));
    }

    /// Invariant 1: a new incarnation fails the jobs of older ones only.
    #[test]
    fn a_new_incarnation_fails_only_the_jobs_older_ones_joined() {
        let (mut index, _) = Index::listed(&[alive("a", 1, 1), joined("a", "old", 1, 2)], 2);
        assert!(index.apply(&Event::Put(alive("a", 2, 3))).len() == 1);
        assert!(index
            .apply(&Event::Put(joined("a", "new", 2, 4)))
            .is_empty());
        let lost = index.apply(&Event::Put(alive("a", 3, 5)));
        assert_eq!(
            jobs(&lost),
            [
                ("new", "a", super::super::RESTARTED),
                ("old", "a", super::super::RESTARTED)
            ]
        );
        // Left jobs are forgotten.
        index.apply(&delete(keys::worker_job("a", "old"), 6));
        index.apply(&delete(keys::worker_job("a", "new"), 7));
        assert!(index.apply(&delete(keys::alive("a"), 8)).is_empty());
    }

    /// Invariant 1: a join applied after its worker's alive key was
    /// deleted (the join checks the incarnation, then writes) fails the
    /// job; a registration again ends that.
    #[test]
    fn a_join_after_its_worker_died_fails_the_job() {
        let (mut index, _) = Index::listed(&[alive("a", 1, 1)], 1);
        assert!(index.apply(&delete(keys::alive("a"), 2)).is_empty());
        let lost = index.apply(&Event::Put(joined("a", "j", 1, 3)));
        assert_eq!(jobs(&lost), [("j", "a", super::super::LOST_LEASE)]);
        index.apply(&Event::Put(alive("a", 2, 4)));
        assert!(index.apply(&Event::Put(joined("a", "k", 2, 5))).is_empty());
    }

    /// Invariant 2: events older than the listing are skipped: a replayed
    /// deletion of an alive key the listing holds newer fails nothing.
    #[test]
    fn an_event_older_than_the_listing_is_skipped() {
        // Listed at 10: `a` registered again (incarnation 2) at 8 and
        // joined `j` at 9; the watch replays the old incarnation's end (5).
        let listing = [alive("a", 2, 8), joined("a", "j", 2, 9)];
        let (mut index, lost) = Index::listed(&listing, 10);
        assert!(lost.is_empty());
        assert!(index.apply(&delete(keys::alive("a"), 5)).is_empty());
        assert!(index.apply(&Event::Put(alive("a", 1, 3))).is_empty());
        // Past the listing, every event counts.
        let lost = index.apply(&delete(keys::alive("a"), 11));
        assert_eq!(jobs(&lost), [("j", "a", super::super::LOST_LEASE)]);
    }

    /// Invariant 2: losses while no monitor ran show in the listing.
    #[test]
    fn the_listing_fails_the_jobs_of_workers_lost_while_no_monitor_ran() {
        let listing = [
            joined("dead", "j", 1, 1),
            alive("again", 2, 4),
            joined("again", "k", 1, 2),
            joined("again", "l", 2, 5),
            alive("fine", 1, 3),
            joined("fine", "m", 1, 6),
        ];
        let (_, mut lost) = Index::listed(&listing, 6);
        lost.sort_by(|a, b| a.job.cmp(&b.job));
        assert_eq!(
            jobs(&lost),
            [
                ("j", "dead", super::super::LOST_LEASE),
                ("k", "again", super::super::RESTARTED)
            ]
        );
    }
}
