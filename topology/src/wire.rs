//! The published global topology's stored form: every process of the job
//! reads it, so N processes read N entries each, and its size is the
//! control plane's one N² term (`exchange` invariant 5).
//!
//! Invariants:
//! 1. Columns by process index, each in the form that compresses: numbers
//!    as the difference from the previous process's (0 or 1 in a regular
//!    cluster), each process's devices as an index into the distinct
//!    device lists. Nothing that tells one process from another (worker,
//!    host name, endpoint: `types` invariant 7) is in it, so a regular
//!    cluster's value compresses to a size that does not grow with it.
//! 2. `decode(encode(t)) == t` for every topology [`GlobalTopology::build`]
//!    makes: device ids are rebuilt by its rule (slice, then process, then
//!    local hardware id).
//! 3. Decoding bounds what it rebuilds (processes, devices, text) before
//!    allocating, and ends in [`GlobalTopology::validate`].
//! 4. Values of the forms before this one still decode: the topology as
//!    stored in memory, with each process's boot id (its boot ids become
//!    machines as the builder numbers them, `types` invariant 6), and the
//!    columns with each process's worker, host name and endpoint (those
//!    columns are checked for length and otherwise left unread).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::error::{Result, TopologyError};
use crate::types::{GlobalDevice, GlobalTopology, ProcessEntry};

const MAX_PROCESSES: usize = 1 << 16;
/// The most text a decoded value may rebuild (invariant 3): a device
/// list costs a few bytes of the value each time it is repeated, so the
/// value's own size cap does not bound it.
const MAX_REBUILT: usize = 64 << 20;

/// What a job's global key holds, before compression (postcard: its
/// variants keep their order, new ones go last).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Stored {
    /// The first form (invariant 4).
    Legacy(legacy::Global),
    /// Why the builder could not build the topology.
    Failed(String),
    /// The second form: [`Columns`] and the job's directory (invariant 4).
    Compact(Compact),
    /// The topology (invariant 1).
    Columns(Columns),
}

/// A device as its process lists it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Shape {
    local_hardware_id: i32,
    kind: String,
    memory_bytes: Option<u64>,
}

/// A name as the bytes it shares with the previous one, and the rest (the
/// second form's directory columns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Front(u32, String);

/// The global topology in columns (invariant 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Columns {
    num_slices: u32,
    /// `types` invariant 5: one setting for the job.
    transfer_encrypted: bool,
    /// The distinct device lists, each by local hardware id.
    device_lists: Vec<Vec<Shape>>,
    devices: Vec<i64>,
    slices: Vec<i64>,
    machines: Vec<i64>,
}

/// The second form: the columns, then the job's directory (invariant 4;
/// postcard lays a nested struct's fields out as if they were this one's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Compact {
    columns: Columns,
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

impl Compact {
    /// Invariant 4: the directory's columns must match the processes; the
    /// topology is in the rest.
    pub(crate) fn decode(self) -> Result<GlobalTopology> {
        let n = self.columns.devices.len();
        let directory = [
            self.workers.len(),
            self.hostnames.len(),
            self.endpoints.len(),
        ];
        if directory.iter().any(|&c| c != n) {
            return Err(TopologyError::Invalid(format!(
                "a published topology: columns of {directory:?} entries for {n} processes"
            )));
        }
        self.columns.decode()
    }
}

impl Columns {
    pub(crate) fn encode(t: &GlobalTopology) -> Columns {
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
        Columns {
            num_slices: t.num_slices,
            transfer_encrypted: t.transfer_encrypted(),
            device_lists,
            devices: deltas(lists.into_iter()),
            slices: deltas(t.processes.iter().map(|p| p.slice)),
            machines: deltas(t.processes.iter().map(|p| p.machine)),
        }
    }

    /// Invariants 2 and 3.
    pub(crate) fn decode(self) -> Result<GlobalTopology> {
        let bad = |m: String| TopologyError::Invalid(format!("a published topology: {m}"));
        let n = self.devices.len();
        if n > MAX_PROCESSES {
            return Err(bad(format!("{n} processes, over {MAX_PROCESSES}")));
        }
        let columns = [self.slices.len(), self.machines.len()];
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
        let processes = device_ids
            .into_iter()
            .enumerate()
            .map(|(i, ids)| ProcessEntry {
                process_index: i as u32,
                machine: machines[i],
                slice: slices[i],
                transfer_encrypted: self.transfer_encrypted,
                device_ids: ids,
            })
            .collect();
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
        .ok_or_else(|| format!("over {MAX_REBUILT} bytes of text"))?;
    Ok(())
}

/// The first stored form (invariant 4): the in-memory topology of its
/// time, field for field.
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
        /// Boot ids become machines (`types` invariant 6); the directory
        /// is left in the local topologies (`types` invariant 7).
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
                        machine,
                        slice: p.slice,
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

        /// `t`, built from `locals`, in this form (tests).
        #[cfg(test)]
        pub(crate) fn from_topology(t: &GlobalTopology, locals: &[LocalTopology]) -> Global {
            Global {
                processes: t
                    .processes
                    .iter()
                    .map(|p| {
                        let l = &locals[p.process_index as usize];
                        Process {
                            process_index: p.process_index,
                            worker: l.worker.clone(),
                            hostname: l.hostname.clone(),
                            boot_id: l.boot_id.clone(),
                            slice: p.slice,
                            transfer_endpoint: l.transfer_endpoint.clone(),
                            transfer_encrypted: p.transfer_encrypted,
                            device_ids: p.device_ids.clone(),
                        }
                    })
                    .collect(),
                devices: t.devices.clone(),
                num_slices: t.num_slices,
            }
        }
    }

    #[cfg(test)]
    use crate::types::LocalTopology;
}

/// `t`, built from `locals`, in the second form (tests).
#[cfg(test)]
fn second_form(t: &GlobalTopology, locals: &[LocalTopology]) -> Compact {
    let front = |prev: &mut String, s: &str| {
        let shared = prev
            .bytes()
            .zip(s.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let shared = (0..=shared)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        *prev = s.to_owned();
        Front(shared as u32, s[shared..].to_owned())
    };
    let (mut w, mut h, mut e) = (String::new(), String::new(), String::new());
    Compact {
        columns: Columns::encode(t),
        workers: locals.iter().map(|l| front(&mut w, &l.worker)).collect(),
        hostnames: locals.iter().map(|l| front(&mut h, &l.hostname)).collect(),
        endpoints: locals
            .iter()
            .map(|l| l.transfer_endpoint.as_deref().map(|s| front(&mut e, s)))
            .collect(),
    }
}

#[cfg(test)]
use crate::types::LocalTopology;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::tests::local;

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

    /// Random addresses and ports, as pods get them (the directory's
    /// entropy).
    fn randomly_addressed(n: u32) -> Vec<LocalTopology> {
        let mut locals = cluster(n, 1, 1);
        for (i, l) in locals.iter_mut().enumerate() {
            let r = boot((i as u32 + 1) << 20);
            let b = |k: usize| u8::from_str_radix(&r[k..k + 2], 16).unwrap();
            let port = 1024 + u16::from_str_radix(&r[8..12], 16).unwrap() % 60000;
            l.transfer_endpoint = Some(format!("10.{}.{}.{}:{port}", b(0), b(2), b(4)));
        }
        locals
    }

    fn round_trip(t: &GlobalTopology) {
        let bytes = postcard::to_allocvec(&Columns::encode(t)).unwrap();
        let back: Columns = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(&back.decode().unwrap(), t);
    }

    /// Invariant 2, on slices, shared machines, device lists of several
    /// shapes.
    #[test]
    fn every_built_topology_reads_back_from_its_columns() {
        round_trip(&GlobalTopology::build(64, &cluster(64, 8, 8)).unwrap());
        let mut odd = cluster(6, 2, 2);
        odd[1].devices.pop();
        odd[2].devices[0].kind = "H100 80GB".into();
        odd[2].devices[1].memory_bytes = Some(80 << 30);
        for (l, s) in odd.iter_mut().zip([4, 1, 4, 1, 2, 2]) {
            l.slice_index = Some(s);
        }
        let t = GlobalTopology::build(6, &odd).unwrap();
        assert_eq!(t.num_slices, 3);
        round_trip(&t);
        round_trip(&GlobalTopology::build(1, &cluster(1, 1, 0)).unwrap());
    }

    /// Invariant 4: the first form, with boot ids, reads as the builder
    /// would number its machines; the second, with the directory, reads
    /// as its columns; a second form whose directory does not match its
    /// processes is refused.
    #[test]
    fn values_of_the_forms_before_read_as_the_topology_they_hold() {
        let locals = cluster(8, 2, 1);
        let t = GlobalTopology::build(8, &locals).unwrap();
        let old = legacy::Global::from_topology(&t, &locals);
        assert_eq!(old.decode().unwrap(), t);
        let machines: Vec<u32> = t.processes.iter().map(|p| p.machine).collect();
        assert_eq!(machines, vec![0, 0, 1, 1, 2, 2, 3, 3]);
        assert_eq!(second_form(&t, &locals).decode().unwrap(), t);
        // Its bytes begin with the columns' own (postcard nests flat).
        let columns = postcard::to_allocvec(&Columns::encode(&t)).unwrap();
        let second = postcard::to_allocvec(&second_form(&t, &locals)).unwrap();
        assert!(second.starts_with(&columns) && second.len() > columns.len());
        let mut short = second_form(&t, &locals);
        short.endpoints.pop();
        let e = short.decode().unwrap_err().to_string();
        assert!(e.contains("columns of [8, 8, 7] entries"), "{e}");
    }

    /// Exchange invariant 5: the value every process reads does not grow
    /// with a regular cluster once compressed (1,024 and 16,384 hosts with
    /// random addresses and ports, whose entropy the form before carried
    /// to every process), and 16,384 hosts of eight devices fit well
    /// within a value.
    #[test]
    fn the_value_every_process_reads_does_not_grow_with_a_regular_cluster() {
        let compressed = |s: &Stored| {
            let plain = postcard::to_allocvec(s).unwrap();
            zstd::bulk::compress(&plain, 3).unwrap().len()
        };
        let size = |n: u32| {
            let locals = randomly_addressed(n);
            let t = GlobalTopology::build(n, &locals).unwrap();
            let now = compressed(&Stored::Columns(Columns::encode(&t)));
            let before = compressed(&Stored::Compact(second_form(&t, &locals)));
            (now, before)
        };
        let (small, small_before) = size(1024);
        let (large, large_before) = size(16384);
        assert!(
            large < 2 * small + 64,
            "{large} bytes at 16,384 against {small} at 1,024"
        );
        assert!(large < 512, "{large} bytes at 16,384 hosts");
        assert!(
            large_before > 3 * small_before,
            "the form before grew with the cluster: {small_before}, {large_before}"
        );
        let big = GlobalTopology::build(16384, &cluster(16384, 1, 8)).unwrap();
        let big = compressed(&Stored::Columns(Columns::encode(&big)));
        assert!(big < 1024, "{big} bytes at 16,384 hosts of 8 devices");
    }

    /// Invariant 3.
    #[test]
    fn decoding_refuses_what_it_cannot_rebuild() {
        let t = GlobalTopology::build(4, &cluster(4, 1, 2)).unwrap();
        let good = Columns::encode(&t);
        let refused = |f: &dyn Fn(&mut Columns), why: &str| {
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
        refused(&|c| c.machines[1] = 3, "machine");
        refused(&|c| c.slices[3] = 5, "slice 7 of 4");
        // A device list repeated rebuilds far more than the value holds:
        // bounded.
        let mut bomb = good.clone();
        let n = MAX_PROCESSES;
        bomb.devices = vec![0; n];
        bomb.slices = vec![0; n];
        bomb.machines = vec![0; n];
        let list = &good.device_lists[0];
        bomb.device_lists[0] = list.iter().cycle().take(list.len() * 20).cloned().collect();
        let e = bomb.clone().decode().unwrap_err().to_string();
        assert!(e.contains("devices"), "{e}");
        bomb.device_lists[0] = vec![Shape {
            local_hardware_id: 0,
            kind: "k".repeat(2000),
            memory_bytes: None,
        }];
        let e = bomb.decode().unwrap_err().to_string();
        assert!(e.contains("bytes of text"), "{e}");
    }
}
