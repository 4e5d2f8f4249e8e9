//! One program over every device of every process: which plugin device
//! runs which partition. Pure; the plan compiles with what it returns.
//!
//! Invariants:
//! 1. Partition `g` runs on the device at position `g` of the job's mesh:
//!    tessel's global device `g` (ordered by slice, process, local hardware
//!    id), found among the plugin's devices by process index and local
//!    hardware id — never by assuming the plugin numbers devices
//!    `process × local + i` (XLA numbers them by fabric and proximity).
//! 2. Every device of the plugin that the job's topology names is used
//!    exactly once; a topology device the plugin does not show is an error.
//! 3. Another process's devices may have no local hardware id (PJRT gives
//!    -1 where it is not addressable): those are matched by rank, the
//!    process's k-th device by plugin id taking its k-th local id.

/// A device as the plugin's client lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginDevice {
    /// The plugin's global device id.
    pub id: i32,
    /// The process (node) that can address it.
    pub process_index: i32,
    /// Its id within that process.
    pub local_hardware_id: i32,
}

/// The device assignment of a global program: the plugin's device id for
/// each partition, in mesh order (invariant 1). `mesh_devices` lists the
/// job's devices in mesh order as `(process index, local hardware id)`.
pub fn device_assignment(
    mesh_devices: &[(u32, i32)],
    plugin: &[PluginDevice],
) -> Result<Vec<i64>, String> {
    let mut used = vec![false; plugin.len()];
    let mut out = Vec::with_capacity(mesh_devices.len());
    for (g, &(process, local)) in mesh_devices.iter().enumerate() {
        let p = process as i32;
        let mine: Vec<usize> = (0..plugin.len())
            .filter(|&i| plugin[i].process_index == p)
            .collect();
        let found = if mine.iter().all(|&i| plugin[i].local_hardware_id >= 0) {
            mine.into_iter()
                .find(|&i| plugin[i].local_hardware_id == local)
        } else {
            // Invariant 3: by rank among the process's devices.
            let mut locals: Vec<i32> = mesh_devices
                .iter()
                .filter(|(q, _)| *q == process)
                .map(|&(_, l)| l)
                .collect();
            locals.sort_unstable();
            let mut by_id = mine;
            by_id.sort_by_key(|&i| plugin[i].id);
            locals
                .iter()
                .position(|&l| l == local)
                .and_then(|k| by_id.get(k).copied())
        };
        match found {
            Some(i) if !used[i] => {
                used[i] = true;
                out.push(i64::from(plugin[i].id));
            }
            Some(_) => {
                return Err(format!(
                    "device {g} of the mesh (process {process}, local device {local}) appears twice"
                ))
            }
            None => {
                return Err(format!(
                    "the plugin's client shows no device {local} of process {process} (mesh device {g}); \
                     it lists {} devices: is every process's client created with the job's num_nodes?",
                    plugin.len()
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: i32, process_index: i32, local_hardware_id: i32) -> PluginDevice {
        PluginDevice {
            id,
            process_index,
            local_hardware_id,
        }
    }

    #[test]
    fn devices_of_other_processes_without_local_ids_are_matched_by_rank() {
        // One GPU per process: the other process's device is not
        // addressable here and has no local hardware id.
        let plugin = [dev(1, 1, -1), dev(0, 0, 0)];
        let mesh = [(0, 0), (1, 0)];
        assert_eq!(device_assignment(&mesh, &plugin), Ok(vec![0, 1]));
        let plugin = [dev(4, 1, -1), dev(6, 1, -1), dev(0, 0, 0), dev(2, 0, 1)];
        let mesh = [(0, 0), (0, 1), (1, 0), (1, 1)];
        assert_eq!(device_assignment(&mesh, &plugin), Ok(vec![0, 2, 4, 6]));
        // A process with fewer devices than the mesh gives it.
        assert!(device_assignment(&[(0, 0), (1, 0), (1, 1), (1, 2)], &plugin).is_err());
    }

    #[test]
    fn partitions_follow_the_mesh_not_the_plugins_numbering() {
        // Two nodes of two GPUs, numbered by the plugin out of node order.
        let plugin = [dev(7, 1, 0), dev(3, 0, 1), dev(5, 1, 1), dev(2, 0, 0)];
        let mesh = [(0, 0), (0, 1), (1, 0), (1, 1)];
        assert_eq!(device_assignment(&mesh, &plugin), Ok(vec![2, 3, 7, 5]));
    }

    #[test]
    fn one_process_takes_its_devices_in_local_order() {
        let plugin: Vec<PluginDevice> = (0..4).map(|i| dev(i, 0, i)).collect();
        let mesh: Vec<(u32, i32)> = (0..4).map(|i| (0, i)).collect();
        assert_eq!(device_assignment(&mesh, &plugin), Ok(vec![0, 1, 2, 3]));
    }

    #[test]
    fn a_device_the_plugin_does_not_show_is_named() {
        let plugin = [dev(0, 0, 0)];
        let e = device_assignment(&[(0, 0), (1, 0)], &plugin).unwrap_err();
        assert!(e.contains("no device 0 of process 1"), "{e}");
        let e = device_assignment(&[(0, 0), (0, 0)], &plugin).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }
}
