//! The published global topology's stored form: every process of the job
//! reads it, so N processes read N entries each, and its size is the
//! control plane's one N² term (`exchange` invariant 5).
//!
//! Invariants:
//! 1. Columns by process index, each in the form that compresses: numbers
//!    as the difference from the previous process's (0 or 1 in a regular
//!    cluster), names as the bytes shared with the previous name plus the
//!    rest (`host-0041` after `host-0040`: 8 and `1`), each process's
//!    devices as an index into the distinct device lists.
//! 2. `decode(encode(t)) == t` for every topology [`GlobalTopology::build`]
//!    makes: device ids are rebuilt by its rule (slice, then process, then
//!    local hardware id).
//! 3. Decoding bounds what it rebuilds (processes, devices, name lengths)
//!    before allocating, and ends in [`GlobalTopology::validate`].
//! 4. A value of the form before this one (the topology as stored in
//!    memory, with each process's boot id) still decodes: its boot ids
//!    become machines as the builder numbers them (`types` invariant 6).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::error::{Result, TopologyError};
use crate::types::{GlobalDevice, GlobalTopology, ProcessEntry};

const MAX_PROCESSES: usize = 1 << 16;
const MAX_STRING: usize = 1024;
/// The most text a decoded value may rebuild (invariant 3): a shared
/// prefix or device list costs a few bytes of the value each time it is
/// repeated, so the value's own size cap does not bound it.
const MAX_REBUILT: usize = 64 << 20;

/// What a job's global key holds, before compression (postcard: its
/// variants keep their order, new ones go last).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Stored {
    /// The form before [`Compact`] (invariant 4).
    Legacy(legacy::Global),
    /// Why the builder could not build the topology.
    Failed(String),
    /// The topology (invariant 1).
    Compact(Compact),
}

/// A device as its process lists it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Shape {
    local_hardware_id: i32,
    kind: String,
    memory_bytes: Option<u64>,
}

/// A name as the bytes it shares with the previous one, and the rest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Front(u32, String);

/// The global topology in columns (invariant 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Compact {
    num_slices: u32,
    /// `types` invariant 5: one setting for the job.
    transfer_encrypted: bool,
    /// The distinct device lists, each by local hardware id.
    device_lists: Vec<Vec<Shape>>,
    devices: Vec<i64>,
    slices: Vec<i64>,
    machines: Vec<i64>,
    workers: Vec<Front>,
    hostnames: Vec<Front>,
    endpoints: Vec<Option<Front>>,
}

/// Differences from the previous value (invariant 1).
fn deltas(values: impl Iterator<Item = u32>) -> Vec<i64> {
    let mut prev = 0i64;
    values
        .map(|v| {
            let d = i64::from(v) - prev;
            prev = i64::from(v);
            d
        })
        .collect()
}

fn front(prev: &mut String, s: &str) -> Front {
    let shared = prev
        .bytes()
        .zip(s.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    // A cut inside a character is moved back to its start.
    let shared = (0..=shared)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    *prev = s.to_owned();
    Front(shared as u32, s[shared..].to_owned())
}

impl Compact {
    pub(crate) fn encode(t: &GlobalTopology) -> Compact {
        let mut ids: HashMap<Vec<Shape>, u32> = HashMap::new();
        let mut device_lists = Vec::new();
        let mut lists = Vec::with_capacity(t.processes.len());
        for p in &t.processes {
            let list: Vec<Shape> = p
                .device_ids
                .iter()
                .map(|&d| {
                    let d = &t.devices[d as usize];
                    Shape {
                        local_hardware_id: d.local_hardware_id,
                        kind: d.kind.clone(),
                        memory_bytes: d.memory_bytes,
                    }
                })
                .collect();
            let next = ids.len() as u32;
            let id = *ids.entry(list.clone()).or_insert_with(|| {
                device_lists.push(list);
                next
            });
            lists.push(id);
        }
        let (mut w, mut h, mut e) = (String::new(), String::new(), String::new());
        Compact {
            num_slices: t.num_slices,
            transfer_encrypted: t.transfer_encrypted(),
            device_lists,
            devices: deltas(lists.into_iter()),
            slices: deltas(t.processes.iter().map(|p| p.slice)),
            machines: deltas(t.processes.iter().map(|p| p.machine)),
            workers: t
                .processes
                .iter()
                .map(|p| front(&mut w, &p.worker))
                .collect(),
            hostnames: t
                .processes
                .iter()
                .map(|p| front(&mut h, &p.hostname))
                .collect(),
            endpoints: t
                .processes
                .iter()
                .map(|p| p.transfer_endpoint.as_deref().map(|s| front(&mut e, s)))
                .collect(),
        }
    }

    /// Invariants 2 and 3.
    pub(crate) fn decode(self) -> Result<GlobalTopology> {
        let bad = |m: String| TopologyError::Invalid(format!("a published topology: {m}"));
        let n = self.devices.len();
        if n > MAX_PROCESSES {
            return Err(bad(format!("{n} processes, over {MAX_PROCESSES}")));
        }
        let columns = [
            self.slices.len(),
            self.machines.len(),
            self.workers.len(),
            self.hostnames.len(),
            self.endpoints.len(),
        ];
        if columns.iter().any(|&c| c != n) {
            return Err(bad(format!(
                "columns of {columns:?} entries for {n} processes"
            )));
        }
        let lists = undelta(&self.devices, "device list").map_err(bad)?;
        let mut total = 0usize;
        let mut budget = MAX_REBUILT;
        for &l in &lists {
            let list = self
                .device_lists
                .get(l as usize)
                .ok_or_else(|| bad(format!("device list {l} of {}", self.device_lists.len())))?;
            total += list.len();
            if total > crate::MAX_DEVICES {
                return Err(bad(format!("over {} devices", crate::MAX_DEVICES)));
            }
            for s in list {
                spend(&mut budget, s.kind.len()).map_err(bad)?;
            }
        }
        let slices = undelta(&self.slices, "slice").map_err(bad)?;
        let machines = undelta(&self.machines, "machine").map_err(bad)?;
        let workers = unfront(self.workers.iter(), "worker", &mut budget).map_err(bad)?;
        let hostnames = unfront(self.hostnames.iter(), "hostname", &mut budget).map_err(bad)?;
        let endpoints = unfront_optional(&self.endpoints, &mut budget).map_err(bad)?;
        // Invariant 2: device ids by slice, then process.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| (slices[i], i));
        let mut device_ids = vec![Vec::new(); n];
        let mut devices = Vec::with_capacity(total);
        for i in order {
            for s in &self.device_lists[lists[i] as usize] {
                let id = devices.len() as u32;
                device_ids[i].push(id);
                devices.push(GlobalDevice {
                    id,
                    process_index: i as u32,
                    slice: slices[i],
                    local_hardware_id: s.local_hardware_id,
                    kind: s.kind.clone(),
                    memory_bytes: s.memory_bytes,
                });
            }
        }
        let mut processes = Vec::with_capacity(n);
        let fields = workers.into_iter().zip(hostnames).zip(endpoints);
        for (i, (((worker, hostname), transfer_endpoint), ids)) in
            fields.zip(device_ids).enumerate()
        {
            processes.push(ProcessEntry {
                process_index: i as u32,
                worker,
                hostname,
                machine: machines[i],
                slice: slices[i],
                transfer_endpoint,
                transfer_encrypted: self.transfer_encrypted,
                device_ids: ids,
            });
        }
        let t = GlobalTopology {
            processes,
            devices,
            num_slices: self.num_slices,
        };
        t.validate()?;
        Ok(t)
    }
}

fn undelta(deltas: &[i64], what: &str) -> std::result::Result<Vec<u32>, String> {
    let mut prev = 0i64;
    deltas
        .iter()
        .map(|d| {
            prev = prev
                .checked_add(*d)
                .filter(|v| (0..=i64::from(u32::MAX)).contains(v))
                .ok_or_else(|| format!("a {what} out of range"))?;
            Ok(prev as u32)
        })
        .collect()
}

/// Invariant 3: `n` more bytes rebuilt, within [`MAX_REBUILT`].
fn spend(budget: &mut usize, n: usize) -> std::result::Result<(), String> {
    *budget = budget
        .checked_sub(n)
        .ok_or_else(|| format!("over {MAX_REBUILT} bytes of names"))?;
    Ok(())
}

fn unfront<'a>(
    names: impl Iterator<Item = &'a Front>,
    what: &str,
    budget: &mut usize,
) -> std::result::Result<Vec<String>, String> {
    let mut prev = String::new();
    names
        .map(|Front(shared, rest)| {
            let shared = *shared as usize;
            if shared > prev.len() || !prev.is_char_boundary(shared) {
                return Err(format!("a {what} shares {shared} bytes of `{prev}`"));
            }
            if shared + rest.len() > MAX_STRING {
                return Err(format!("a {what} over {MAX_STRING} bytes"));
            }
            spend(budget, shared + rest.len())?;
            prev.truncate(shared);
            prev.push_str(rest);
            Ok(prev.clone())
        })
        .collect()
}

/// Endpoints: a process without one is skipped by the front coding.
fn unfront_optional(
    names: &[Option<Front>],
    budget: &mut usize,
) -> std::result::Result<Vec<Option<String>>, String> {
    let present = unfront(names.iter().flatten(), "transfer endpoint", budget)?;
    let mut present = present.into_iter();
    Ok(names
        .iter()
        .map(|n| n.as_ref().and_then(|_| present.next()))
        .collect())
}

/// The stored form before [`Compact`] (invariant 4): the in-memory
/// topology of its time, field for field.
pub(crate) mod legacy {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub(crate) struct Process {
        process_index: u32,
        worker: String,
        hostname: String,
        boot_id: String,
        slice: u32,
        transfer_endpoint: Option<String>,
        transfer_encrypted: bool,
        device_ids: Vec<u32>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub(crate) struct Global {
        processes: Vec<Process>,
        devices: Vec<GlobalDevice>,
        num_slices: u32,
    }

    impl Global {
        /// Boot ids become machines (`types` invariant 6).
        pub(crate) fn decode(self) -> Result<GlobalTopology> {
            let mut machine_of_boot: BTreeMap<String, u32> = BTreeMap::new();
            let processes = self
                .processes
                .into_iter()
                .map(|p| {
                    let next = machine_of_boot.len() as u32;
                    let machine = *machine_of_boot.entry(p.boot_id).or_insert(next);
                    ProcessEntry {
                        process_index: p.process_index,
                        worker: p.worker,
                        hostname: p.hostname,
                        machine,
                        slice: p.slice,
                        transfer_endpoint: p.transfer_endpoint,
                        transfer_encrypted: p.transfer_encrypted,
                        device_ids: p.device_ids,
                    }
                })
                .collect();
            let t = GlobalTopology {
                processes,
                devices: self.devices,
                num_slices: self.num_slices,
            };
            t.validate()?;
            Ok(t)
        }

        /// `t` in the old form, process `i` on boot `boots[i]` (tests).
        #[cfg(test)]
        pub(crate) fn from_topology(t: &GlobalTopology, boots: &[&str]) -> Global {
            Global {
                processes: t
                    .processes
                    .iter()
                    .map(|p| Process {
                        process_index: p.process_index,
                        worker: p.worker.clone(),
                        hostname: p.hostname.clone(),
                        boot_id: boots[p.process_index as usize].into(),
                        slice: p.slice,
                        transfer_endpoint: p.transfer_endpoint.clone(),
                        transfer_encrypted: p.transfer_encrypted,
                        device_ids: p.device_ids.clone(),
                    })
                    .collect(),
                devices: t.devices.clone(),
                num_slices: t.num_slices,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::tests::local;
    use crate::types::LocalTopology;

    /// A host's boot id as the kernel makes them: 128 random bits.
    fn boot(i: u32) -> String {
        let r = u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
        format!("{r:032x}")
    }

    fn cluster(n: u32, per_host: u32, devices: usize) -> Vec<LocalTopology> {
        (0..n)
            .map(|i| {
                let mut l = local(i, n, &boot(i / per_host), devices);
                l.worker = format!("tessel-worker-{}", i / per_host);
                l.hostname = format!("node-{:04}.pod.example", i / per_host);
                l.transfer_endpoint = Some(format!(
                    "10.{}.{}.{}:7470",
                    (i / per_host) >> 16,
                    ((i / per_host) >> 8) & 255,
                    (i / per_host) & 255
                ));
                l
            })
            .collect()
    }

    fn round_trip(t: &GlobalTopology) {
        let bytes = postcard::to_allocvec(&Compact::encode(t)).unwrap();
        let back: Compact = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(&back.decode().unwrap(), t);
    }

    /// Invariant 2, on slices, shared machines, device lists of several
    /// shapes, names that share part of a character, missing endpoints.
    #[test]
    fn every_built_topology_reads_back_from_its_columns() {
        round_trip(&GlobalTopology::build(64, &cluster(64, 8, 8)).unwrap());
        let mut odd = cluster(6, 2, 2);
        odd[1].devices.pop();
        odd[2].devices[0].kind = "H100 80GB".into();
        odd[2].devices[1].memory_bytes = Some(80 << 30);
        odd[3].hostname = "hôte-é".into();
        odd[4].hostname = "hôte-ê".into();
        odd[5].transfer_endpoint = None;
        odd[0].transfer_endpoint = None;
        for (l, s) in odd.iter_mut().zip([4, 1, 4, 1, 2, 2]) {
            l.slice_index = Some(s);
        }
        let t = GlobalTopology::build(6, &odd).unwrap();
        assert_eq!(t.num_slices, 3);
        round_trip(&t);
        round_trip(&GlobalTopology::build(1, &cluster(1, 1, 0)).unwrap());
    }

    /// Invariant 4: the form before, with boot ids, reads as the builder
    /// would number its machines.
    #[test]
    fn a_value_of_the_form_before_reads_with_its_boot_ids_as_machines() {
        let t = GlobalTopology::build(8, &cluster(8, 2, 1)).unwrap();
        let boots: Vec<String> = (0..8).map(|i| boot(i / 2)).collect();
        let boots: Vec<&str> = boots.iter().map(|b| b.as_str()).collect();
        let old = legacy::Global::from_topology(&t, &boots);
        assert_eq!(old.decode().unwrap(), t);
        let machines: Vec<u32> = t.processes.iter().map(|p| p.machine).collect();
        assert_eq!(machines, vec![0, 0, 1, 1, 2, 2, 3, 3]);
    }

    /// Exchange invariant 5: at 4,096 hosts with random boot ids the
    /// value every process reads is a fraction of the form before
    /// (compressed alike), and 16,384 hosts of eight devices fit well
    /// within a value.
    #[test]
    fn the_value_of_4096_hosts_is_a_fraction_of_the_form_before() {
        let compressed = |s: &Stored| {
            let plain = postcard::to_allocvec(s).unwrap();
            zstd::bulk::compress(&plain, 3).unwrap().len()
        };
        let t = GlobalTopology::build(4096, &cluster(4096, 1, 1)).unwrap();
        let boots: Vec<String> = (0..4096).map(boot).collect();
        let boots: Vec<&str> = boots.iter().map(|b| b.as_str()).collect();
        let before = compressed(&Stored::Legacy(legacy::Global::from_topology(&t, &boots)));
        let now = compressed(&Stored::Compact(Compact::encode(&t)));
        assert!(now * 8 < before, "{now} bytes against {before} before");
        // Endpoints at random addresses and ports still leave it a
        // quarter: their entropy is all that is left.
        let mut random = cluster(4096, 1, 1);
        for (i, l) in random.iter_mut().enumerate() {
            let r = boot((i as u32 + 1) << 20);
            let b = |k: usize| u8::from_str_radix(&r[k..k + 2], 16).unwrap();
            let port = 1024 + u16::from_str_radix(&r[8..12], 16).unwrap() % 60000;
            l.transfer_endpoint = Some(format!("10.{}.{}.{}:{port}", b(0), b(2), b(4)));
        }
        let t = GlobalTopology::build(4096, &random).unwrap();
        let before = compressed(&Stored::Legacy(legacy::Global::from_topology(&t, &boots)));
        let now = compressed(&Stored::Compact(Compact::encode(&t)));
        assert!(now * 4 < before, "{now} bytes against {before} before");
        let big = GlobalTopology::build(16384, &cluster(16384, 1, 8)).unwrap();
        let big = compressed(&Stored::Compact(Compact::encode(&big)));
        assert!(big < 256 << 10, "{big} bytes at 16,384 hosts of 8 devices");
    }

    /// Invariant 3.
    #[test]
    fn decoding_refuses_what_it_cannot_rebuild() {
        let t = GlobalTopology::build(4, &cluster(4, 1, 2)).unwrap();
        let good = Compact::encode(&t);
        let refused = |f: &dyn Fn(&mut Compact), why: &str| {
            let mut c = good.clone();
            f(&mut c);
            let e = c.decode().unwrap_err().to_string();
            assert!(e.contains(why), "{e} (expected: {why})");
        };
        refused(
            &|c| {
                c.slices.pop();
            },
            "columns",
        );
        refused(&|c| c.devices[1] = 5, "device list");
        refused(&|c| c.machines[2] = -9, "machine out of range");
        refused(&|c| c.workers[1].0 = 99, "shares 99 bytes");
        refused(&|c| c.machines[1] = 3, "machine");
        refused(&|c| c.slices[3] = 5, "slice 7 of 4");
        // A shared prefix repeated, and a device list repeated, rebuild
        // far more than the value holds: both are bounded.
        let mut names = good.clone();
        names.workers = vec![Front(0, "x".repeat(1000))];
        names
            .workers
            .extend((1..4).map(|_| Front(1000, "y".into())));
        assert!(names.decode().is_ok(), "a few long names are fine");
        let mut bomb = good.clone();
        let n = MAX_PROCESSES;
        bomb.devices = vec![0; n];
        bomb.slices = vec![0; n];
        bomb.machines = vec![0; n];
        bomb.endpoints = vec![None; n];
        bomb.hostnames = vec![Front(0, String::new()); n];
        bomb.workers = vec![Front(0, "w".repeat(1000))];
        bomb.workers
            .extend((1..n).map(|_| Front(1000, String::new())));
        bomb.hostnames = bomb.workers.clone();
        let e = bomb.clone().decode().unwrap_err().to_string();
        assert!(e.contains("bytes of names"), "{e}");
        bomb.workers = vec![Front(0, String::new()); n];
        bomb.hostnames = bomb.workers.clone();
        let list = &good.device_lists[0];
        bomb.device_lists[0] = list.iter().cycle().take(list.len() * 20).cloned().collect();
        let e = bomb.decode().unwrap_err().to_string();
        assert!(e.contains("devices"), "{e}");
    }
}
