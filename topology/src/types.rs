//! Local and global topologies, and the pure builder.
//!
//! Invariants of [`GlobalTopology::build`]:
//! 1. It depends only on the set of local topologies, not on their order of
//!    arrival: every process that builds from the same set gets the same
//!    bytes.
//! 2. Global device ids are 0..D, ordered by slice, then process index,
//!    then local hardware id; a process's devices are contiguous.
//! 3. Slices come from the explicit slice index when every process has one,
//!    else from the boot id (processes on one boot of one machine form a
//!    slice), numbered in order of their lowest process index.
//! 4. Every process index 0..N appears exactly once.
//! 5. Every process encrypts its transfers, or none does: a job never mixes
//!    the two data planes.
//! 6. Processes with one boot id run on one machine; machines are numbered
//!    in order of their lowest process index. The boot ids stay in the
//!    local topologies: the global one, read by every process, holds only
//!    the equality they stand for (16 random bytes a process were the
//!    largest part of it, `exchange` invariant 5).
//! 7. What tells one process from another (its worker, host name,
//!    transfer endpoint and boot id: the job's directory) stays in the
//!    local topologies too, read by the processes that need a given peer
//!    (`exchange::peer`): the global topology holds only what every
//!    process needs, which for a regular cluster does not grow with the
//!    processes once compressed (`exchange` invariant 5).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TopologyError};

/// Upper bounds on decoded topologies (they come from the network).
const MAX_DEVICES_PER_PROCESS: usize = 4096;
const MAX_PROCESSES: usize = 1 << 16;
const MAX_STRING: usize = 1024;
const MAX_ATTRIBUTES: usize = 64;

/// One device as its process sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceDescription {
    /// The plugin's local hardware id (or its device id where it has none).
    pub local_hardware_id: i32,
    /// The plugin's device kind (`cpu`, `NVIDIA H100 80GB HBM3`, …).
    pub kind: String,
    /// Bytes of device memory, where the plugin says.
    pub memory_bytes: Option<u64>,
    /// Other attributes, as `name=value` text, sorted by name.
    pub attributes: Vec<(String, String)>,
}

/// What one process of a job has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalTopology {
    /// The process's index in the job.
    pub process_index: u32,
    /// How many processes this process was told the job has.
    pub num_processes: u32,
    /// The worker that runs the process (empty where there is none).
    pub worker: String,
    /// The host's name.
    pub hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: equal on processes of one boot.
    pub boot_id: String,
    /// An explicit slice (e.g. a TPU slice or a GPU rack), if known.
    pub slice_index: Option<u32>,
    /// The devices the plugin gives it.
    pub devices: Vec<DeviceDescription>,
    /// Where this process's transfer endpoint listens (`HOST:PORT`).
    pub transfer_endpoint: Option<String>,
    /// Whether its transfer endpoint encrypts network payloads (off: data
    /// channels of plain TCP; invariant 5).
    pub transfer_encrypted: bool,
}

/// A device with its global id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalDevice {
    /// The global id (dense, from 0).
    pub id: u32,
    /// The process that owns it.
    pub process_index: u32,
    /// The slice it is in.
    pub slice: u32,
    /// The plugin's id for it within its process.
    pub local_hardware_id: i32,
    /// Its kind (`cpu`, `H100`, ...).
    pub kind: String,
    /// Its memory, when the plugin reports it.
    pub memory_bytes: Option<u64>,
}

/// A process of the job, as the global topology lists it: its place, not
/// its name or address (invariant 7: those are in its local topology).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEntry {
    /// The process's index.
    pub process_index: u32,
    /// The machine it runs on (invariant 6): equal for processes that
    /// share a boot (and so shared memory).
    pub machine: u32,
    /// The slice it is in.
    pub slice: u32,
    /// Whether its network transfers are encrypted (invariant 5).
    pub transfer_encrypted: bool,
    /// Global ids of this process's devices, ascending and contiguous.
    pub device_ids: Vec<u32>,
}

/// Every process and device of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalTopology {
    /// By process index.
    pub processes: Vec<ProcessEntry>,
    /// By global id.
    pub devices: Vec<GlobalDevice>,
    /// How many slices the processes form.
    pub num_slices: u32,
}

fn check_len(what: &str, s: &str) -> Result<()> {
    if s.len() > MAX_STRING {
        return Err(TopologyError::Invalid(format!(
            "{what} is {} bytes, over {MAX_STRING}",
            s.len()
        )));
    }
    Ok(())
}

impl LocalTopology {
    /// Checks bounds and internal consistency (used on every decoded value).
    pub fn validate(&self) -> Result<()> {
        if self.num_processes == 0 || self.num_processes as usize > MAX_PROCESSES {
            return Err(TopologyError::Invalid(format!(
                "a job of {} processes",
                self.num_processes
            )));
        }
        if self.process_index >= self.num_processes {
            return Err(TopologyError::ProcessIndexOutOfRange {
                index: self.process_index,
                num_processes: self.num_processes,
            });
        }
        check_len("worker", &self.worker)?;
        check_len("hostname", &self.hostname)?;
        check_len("boot id", &self.boot_id)?;
        if let Some(e) = &self.transfer_endpoint {
            check_len("transfer endpoint", e)?;
        }
        if self.devices.len() > MAX_DEVICES_PER_PROCESS {
            return Err(TopologyError::Invalid(format!(
                "process {} has {} devices, over {MAX_DEVICES_PER_PROCESS}",
                self.process_index,
                self.devices.len()
            )));
        }
        let mut ids: Vec<i32> = self.devices.iter().map(|d| d.local_hardware_id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(TopologyError::Invalid(format!(
                "process {} lists a local hardware id twice",
                self.process_index
            )));
        }
        for d in &self.devices {
            check_len("device kind", &d.kind)?;
            if d.attributes.len() > MAX_ATTRIBUTES {
                return Err(TopologyError::Invalid("too many device attributes".into()));
            }
            for (k, v) in &d.attributes {
                check_len("attribute", k)?;
                check_len("attribute", v)?;
            }
        }
        Ok(())
    }

    /// The wire form (postcard).
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a local topology always encodes")
    }

    /// Decodes and validates.
    pub fn decode(bytes: &[u8]) -> Result<LocalTopology> {
        let t: LocalTopology = postcard::from_bytes(bytes).map_err(|e| TopologyError::Decode {
            what: "a local topology".into(),
            reason: e.to_string(),
        })?;
        t.validate()?;
        Ok(t)
    }
}

impl GlobalTopology {
    /// Builds the global topology of `num_processes` processes from their
    /// local topologies, in any order (invariants 1–4).
    pub fn build(num_processes: u32, locals: &[LocalTopology]) -> Result<GlobalTopology> {
        let mut by_index: BTreeMap<u32, &LocalTopology> = BTreeMap::new();
        for l in locals {
            l.validate()?;
            if l.num_processes != num_processes {
                return Err(TopologyError::WrongProcessCount {
                    index: l.process_index,
                    declared: l.num_processes,
                    num_processes,
                });
            }
            if let Some(prev) = by_index.insert(l.process_index, l) {
                if prev != l {
                    return Err(TopologyError::ConflictingLocalTopology {
                        index: l.process_index,
                        existing_host: prev.hostname.clone(),
                        existing_boot: prev.boot_id.clone(),
                        host: l.hostname.clone(),
                        boot: l.boot_id.clone(),
                    });
                }
            }
        }
        let missing: Vec<u32> = (0..num_processes)
            .filter(|i| !by_index.contains_key(i))
            .collect();
        if !missing.is_empty() {
            return Err(TopologyError::Invalid(format!(
                "no local topology from processes {missing:?}"
            )));
        }
        // Invariant 5.
        let (on, off): (Vec<&LocalTopology>, Vec<&LocalTopology>) =
            by_index.values().partition(|l| l.transfer_encrypted);
        if !on.is_empty() && !off.is_empty() {
            let ids = |v: &[&LocalTopology]| v.iter().map(|l| l.process_index).collect();
            return Err(TopologyError::MixedTransferEncryption {
                on: ids(&on),
                off: ids(&off),
            });
        }
        // Invariant 3: slice keys, numbered by lowest process index.
        let explicit = by_index.values().all(|l| l.slice_index.is_some());
        if !explicit && by_index.values().any(|l| l.slice_index.is_some()) {
            return Err(TopologyError::Invalid(
                "some processes give a slice index and others do not".into(),
            ));
        }
        let slice_key = |l: &LocalTopology| -> String {
            match l.slice_index {
                Some(s) if explicit => format!("{s:010}"),
                _ => l.boot_id.clone(),
            }
        };
        let mut slice_of_key: BTreeMap<String, u32> = BTreeMap::new();
        if explicit {
            // Explicit slices keep their numeric order.
            for l in by_index.values() {
                slice_of_key.entry(slice_key(l)).or_insert(0);
            }
            for (n, v) in slice_of_key.values_mut().enumerate() {
                *v = n as u32;
            }
        } else {
            for l in by_index.values() {
                let next = slice_of_key.len() as u32;
                slice_of_key.entry(slice_key(l)).or_insert(next);
            }
        }
        // Invariant 6.
        let mut machine_of_boot: BTreeMap<&str, u32> = BTreeMap::new();
        for l in by_index.values() {
            let next = machine_of_boot.len() as u32;
            machine_of_boot.entry(l.boot_id.as_str()).or_insert(next);
        }
        let mut order: Vec<&LocalTopology> = by_index.values().copied().collect();
        order.sort_by_key(|l| (slice_of_key[&slice_key(l)], l.process_index));

        let mut processes: Vec<ProcessEntry> = Vec::with_capacity(order.len());
        let mut devices: Vec<GlobalDevice> = Vec::new();
        for l in order {
            let slice = slice_of_key[&slice_key(l)];
            let mut local: Vec<&DeviceDescription> = l.devices.iter().collect();
            local.sort_by_key(|d| d.local_hardware_id);
            let mut ids = Vec::with_capacity(local.len());
            for d in local {
                let id = devices.len() as u32;
                ids.push(id);
                devices.push(GlobalDevice {
                    id,
                    process_index: l.process_index,
                    slice,
                    local_hardware_id: d.local_hardware_id,
                    kind: d.kind.clone(),
                    memory_bytes: d.memory_bytes,
                });
            }
            processes.push(ProcessEntry {
                process_index: l.process_index,
                machine: machine_of_boot[l.boot_id.as_str()],
                slice,
                transfer_encrypted: l.transfer_encrypted,
                device_ids: ids,
            });
        }
        processes.sort_by_key(|p| p.process_index);
        Ok(GlobalTopology {
            processes,
            devices,
            num_slices: slice_of_key.len() as u32,
        })
    }

    /// The wire form (postcard).
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a global topology always encodes")
    }

    /// Decodes and checks the invariants a reader relies on.
    pub fn decode(bytes: &[u8]) -> Result<GlobalTopology> {
        let t: GlobalTopology = postcard::from_bytes(bytes).map_err(|e| TopologyError::Decode {
            what: "a global topology".into(),
            reason: e.to_string(),
        })?;
        t.validate()?;
        Ok(t)
    }

    /// The invariants a reader relies on ([`GlobalTopology::decode`]
    /// checks them).
    pub(crate) fn validate(&self) -> Result<()> {
        if self.processes.len() > MAX_PROCESSES {
            return Err(TopologyError::Invalid("too many processes".into()));
        }
        // Invariant 6: each machine is numbered where it first appears.
        let mut machines = 0u32;
        for (i, p) in self.processes.iter().enumerate() {
            if p.process_index as usize != i {
                return Err(TopologyError::Invalid(format!(
                    "process {i} is listed as {}",
                    p.process_index
                )));
            }
            match p.machine.cmp(&machines) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => machines += 1,
                std::cmp::Ordering::Greater => {
                    return Err(TopologyError::Invalid(format!(
                        "process {i} is on machine {}, after only {machines} machines",
                        p.machine
                    )))
                }
            }
            if p.slice >= self.num_slices {
                return Err(TopologyError::Invalid(format!(
                    "process {i} is in slice {} of {}",
                    p.slice, self.num_slices
                )));
            }
            for &d in &p.device_ids {
                let ok = self
                    .devices
                    .get(d as usize)
                    .is_some_and(|g| g.process_index == p.process_index);
                if !ok {
                    return Err(TopologyError::Invalid(format!(
                        "process {i} lists device {d}, which is not its own"
                    )));
                }
            }
        }
        for (i, d) in self.devices.iter().enumerate() {
            if d.id as usize != i || d.process_index as usize >= self.processes.len() {
                return Err(TopologyError::Invalid(format!(
                    "device {i} is inconsistent"
                )));
            }
        }
        Ok(())
    }

    /// How many processes.
    pub fn num_processes(&self) -> u32 {
        self.processes.len() as u32
    }

    /// How many devices.
    pub fn num_devices(&self) -> u32 {
        self.devices.len() as u32
    }

    /// Whether the job's network transfers are encrypted (invariant 5:
    /// every process agrees).
    pub fn transfer_encrypted(&self) -> bool {
        self.processes.iter().all(|p| p.transfer_encrypted)
    }

    /// The process that owns global device `id`.
    pub fn process_of(&self, id: u32) -> Option<u32> {
        self.devices.get(id as usize).map(|d| d.process_index)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn local(index: u32, n: u32, boot: &str, devices: usize) -> LocalTopology {
        LocalTopology {
            process_index: index,
            num_processes: n,
            worker: format!("w{index}"),
            hostname: format!("host-{boot}"),
            boot_id: boot.into(),
            slice_index: None,
            devices: (0..devices)
                .rev()
                .map(|i| DeviceDescription {
                    local_hardware_id: i as i32,
                    kind: "cpu".into(),
                    memory_bytes: None,
                    attributes: vec![],
                })
                .collect(),
            transfer_endpoint: Some(format!("127.0.0.1:{}", 7000 + index)),
            transfer_encrypted: true,
        }
    }

    #[test]
    fn a_job_that_mixes_encrypted_and_plain_transfers_is_refused() {
        let mut locals: Vec<_> = (0..4).map(|i| local(i, 4, "b", 1)).collect();
        locals[1].transfer_encrypted = false;
        locals[3].transfer_encrypted = false;
        let e = GlobalTopology::build(4, &locals).unwrap_err();
        assert_eq!(
            e,
            TopologyError::MixedTransferEncryption {
                on: vec![0, 2],
                off: vec![1, 3]
            }
        );
        assert!(e.to_string().contains("on for processes [0, 2]"), "{e}");
        for l in &mut locals {
            l.transfer_encrypted = false;
        }
        assert!(!GlobalTopology::build(4, &locals)
            .unwrap()
            .transfer_encrypted());
    }

    #[test]
    fn the_order_of_arrival_does_not_matter() {
        let locals: Vec<_> = (0..4).map(|i| local(i, 4, "b", 4)).collect();
        let a = GlobalTopology::build(4, &locals).unwrap();
        let mut rev = locals.clone();
        rev.reverse();
        let b = GlobalTopology::build(4, &rev).unwrap();
        assert_eq!(a.encode(), b.encode());
        assert_eq!(a.num_devices(), 16);
        let ids: Vec<u32> = a.devices.iter().map(|d| d.id).collect();
        assert_eq!(ids, (0..16).collect::<Vec<_>>());
        assert_eq!(a.processes[2].device_ids, vec![8, 9, 10, 11]);
        assert_eq!(a.devices[9].local_hardware_id, 1, "local ids ascend");
    }

    #[test]
    fn slices_come_first_then_processes() {
        // Processes 0 and 2 share a boot, 1 and 3 another.
        let locals = vec![
            local(0, 4, "x", 2),
            local(1, 4, "y", 2),
            local(2, 4, "x", 2),
            local(3, 4, "y", 2),
        ];
        let g = GlobalTopology::build(4, &locals).unwrap();
        assert_eq!(g.num_slices, 2);
        let owners: Vec<u32> = g.devices.iter().map(|d| d.process_index).collect();
        assert_eq!(owners, vec![0, 0, 2, 2, 1, 1, 3, 3]);
        assert_eq!(g.processes[1].slice, 1);
        // Invariant 6: machines by boot, numbered where they first appear.
        let machines: Vec<u32> = g.processes.iter().map(|p| p.machine).collect();
        assert_eq!(machines, vec![0, 1, 0, 1]);
        // Explicit slice indices win over boot ids and keep numeric order.
        let mut explicit = locals.clone();
        for (l, s) in explicit.iter_mut().zip([7, 3, 7, 3]) {
            l.slice_index = Some(s);
        }
        let g = GlobalTopology::build(4, &explicit).unwrap();
        let owners: Vec<u32> = g.devices.iter().map(|d| d.process_index).collect();
        assert_eq!(owners, vec![1, 1, 3, 3, 0, 0, 2, 2]);
    }

    #[test]
    fn bad_sets_are_refused_with_the_reason() {
        let e = GlobalTopology::build(3, &[local(0, 3, "a", 1), local(1, 3, "a", 1)]);
        assert!(matches!(e, Err(TopologyError::Invalid(m)) if m.contains("[2]")));
        let e = GlobalTopology::build(2, &[local(0, 2, "a", 1), local(1, 3, "a", 1)]);
        assert!(matches!(
            e,
            Err(TopologyError::WrongProcessCount {
                index: 1,
                declared: 3,
                num_processes: 2
            })
        ));
        let mut dup = local(1, 2, "b", 1);
        dup.hostname = "other".into();
        let e = GlobalTopology::build(2, &[local(0, 2, "a", 1), local(1, 2, "a", 1), dup]);
        assert!(matches!(
            e,
            Err(TopologyError::ConflictingLocalTopology { index: 1, .. })
        ));
        assert!(matches!(
            GlobalTopology::build(2, &[local(0, 2, "a", 1), local(2, 2, "a", 1)]),
            Err(TopologyError::ProcessIndexOutOfRange { index: 2, .. })
        ));
    }

    #[test]
    fn decoding_validates() {
        let g = GlobalTopology::build(2, &[local(0, 2, "a", 2), local(1, 2, "a", 2)]).unwrap();
        assert_eq!(GlobalTopology::decode(&g.encode()).unwrap(), g);
        let mut bad = g.clone();
        bad.processes[1].device_ids = vec![0];
        assert!(GlobalTopology::decode(&bad.encode()).is_err());
        let mut bad = g.clone();
        bad.processes[0].machine = 1;
        assert!(GlobalTopology::decode(&bad.encode()).is_err());
        assert!(GlobalTopology::decode(&[0xff; 7]).is_err());
        let mut l = local(0, 1, "a", 1);
        l.devices.push(l.devices[0].clone());
        assert!(LocalTopology::decode(&l.encode()).is_err());
    }
}
