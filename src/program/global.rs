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
        let found = plugin
            .iter()
            .position(|d| d.process_index == process as i32 && d.local_hardware_id == local);
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
