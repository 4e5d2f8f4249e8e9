//! One `execute` step: each input placed on the program's devices as the
//! program's shardings ask (reusing what is already there), donated where
//! the program donates and the step overwrites the array, and each output
//! kept on the devices as pieces of the process's block.

use std::collections::BTreeMap;

use tessel_pjrt::{Buffer, Client, ElementType, ExecuteArg, HostBuffer};

use super::resident::{Piece, Slot, Traffic, Want};
use crate::job::ShardingSpec;
use crate::program::CompiledProgram;

/// An array as a step sees it: its slot, and where the process's block sits
/// in the global array.
pub(super) struct Held {
    pub(super) slot: Slot,
    pub(super) sharding: ShardingSpec,
}

/// One input of a step: an array, or a built-in scalar made for the step.
pub(super) enum Input {
    Array(String),
    Scalar(i32),
}

/// What a program sees of an array and where this process's block starts:
/// the block itself (a process-local program) or the global array (a
/// global program), and the block's offset in what it sees.
pub(super) struct View {
    pub(super) dims: Vec<i64>,
    pub(super) offset: Vec<i64>,
}

/// Runs `prog` on `inputs`, replacing `outputs` in `arrays`. `view(name,
/// sharding, block dims)` tells what the program sees of an array. With
/// `host_staged`, outputs are copied to the host and dropped from the
/// devices (how every step ran before arrays stayed on their devices; a
/// benchmark's baseline).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    prog: &CompiledProgram,
    client: &Client,
    arrays: &mut BTreeMap<String, Held>,
    traffic: &mut Traffic,
    inputs: &[Input],
    outputs: &[(String, ShardingSpec, ElementType, Vec<i64>)],
    view: &dyn Fn(&str, &ShardingSpec, &[i64]) -> View,
    host_staged: bool,
) -> Result<(), String> {
    let devices = prog.devices();
    // Built-in scalars live for this step only.
    let mut scalars: Vec<Slot> = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let (slot, v) = match input {
            Input::Array(name) => {
                let held = arrays
                    .get_mut(name)
                    .ok_or_else(|| format!("no array `{name}`"))?;
                let v = view(name, &held.sharding, held.slot.dims());
                (&mut held.slot, v)
            }
            Input::Scalar(x) => {
                scalars.push(Slot::on_host(HostBuffer::scalar(*x)));
                let slot = scalars.last_mut().expect("pushed");
                (
                    slot,
                    View {
                        dims: vec![],
                        offset: vec![],
                    },
                )
            }
        };
        let tiling = prog.tiling(i, false, &v.dims).map_err(|e| e.to_string())?;
        let mut want = Vec::with_capacity(devices.len());
        for (k, device) in devices.iter().enumerate() {
            let (start, shape) = tiling.tile(&v.dims, prog.partition_of(k)).ok_or_else(|| {
                format!(
                    "input {i}: shape {:?} does not split evenly into tiles {:?}",
                    v.dims, tiling.tiles
                )
            })?;
            if let Some(expected) = prog.parameter_dims(i) {
                if expected != shape.as_slice() {
                    return Err(format!(
                        "input {i}: each device expects {expected:?}, the sharding gives {shape:?}"
                    ));
                }
            }
            let start = start.iter().zip(&v.offset).map(|(s, o)| s - o).collect();
            want.push(Want {
                device,
                start,
                shape,
            });
        }
        slot.place(client, &want, traffic)?;
    }
    // Donate an input the program donates when the step overwrites it and
    // passes it once: its old value is not needed after the call.
    let mut donated: BTreeMap<usize, Vec<Option<Buffer>>> = BTreeMap::new();
    for (i, input) in inputs.iter().enumerate() {
        let Input::Array(name) = input else { continue };
        let once = inputs
            .iter()
            .filter(|x| matches!(x, Input::Array(n) if n == name))
            .count()
            == 1;
        if prog.donates(i) && once && outputs.iter().any(|(o, ..)| o == name) {
            let pieces = arrays.get_mut(name).expect("placed").slot.take_pieces();
            donated.insert(i, pieces.into_iter().map(|p| Some(p.buffer)).collect());
        }
    }
    let mut scalar_at = 0;
    let mut sources: Vec<Option<&Slot>> = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.iter().enumerate() {
        sources.push(match input {
            _ if donated.contains_key(&i) => None,
            Input::Array(name) => Some(&arrays[name].slot),
            Input::Scalar(_) => {
                scalar_at += 1;
                Some(&scalars[scalar_at - 1])
            }
        });
    }
    let mut lists: Vec<Vec<ExecuteArg<'_>>> = Vec::with_capacity(devices.len());
    for k in 0..devices.len() {
        let mut list = Vec::with_capacity(inputs.len());
        for (i, source) in sources.iter().enumerate() {
            list.push(match source {
                Some(slot) => ExecuteArg::Borrow(&slot.pieces()[k].buffer),
                None => ExecuteArg::Donate(
                    donated.get_mut(&i).expect("donated")[k]
                        .take()
                        .expect("each piece donated once"),
                ),
            });
        }
        lists.push(list);
    }
    let mut results = prog.launch(lists).map_err(|e| e.to_string())?;
    drop(sources);
    if host_staged {
        for input in inputs {
            if let Input::Array(name) = input {
                let slot = &mut arrays.get_mut(name).expect("placed").slot;
                slot.host(traffic)?;
                slot.take_pieces();
            }
        }
    }

    let mut per_output: Vec<Vec<Buffer>> = outputs.iter().map(|_| Vec::new()).collect();
    for device_results in results.iter_mut() {
        if device_results.len() != outputs.len() {
            return Err(format!(
                "the program returned {} results, the step names {}",
                device_results.len(),
                outputs.len()
            ));
        }
        for (r, b) in device_results.drain(..).enumerate() {
            per_output[r].push(b);
        }
    }
    for (r, ((name, sharding, ty, block), buffers)) in outputs.iter().zip(per_output).enumerate() {
        let v = view(name, sharding, block);
        let tiling = prog.tiling(r, true, &v.dims).map_err(|e| e.to_string())?;
        let mut pieces = Vec::with_capacity(buffers.len());
        for (k, buffer) in buffers.into_iter().enumerate() {
            let (start, _) = tiling
                .tile(&v.dims, prog.partition_of(k))
                .ok_or_else(|| format!("output {r}: uneven tiles"))?;
            pieces.push(Piece {
                device: devices[k].id().map_err(|e| e.to_string())?,
                start: start.iter().zip(&v.offset).map(|(s, o)| s - o).collect(),
                buffer,
            });
        }
        let mut slot = Slot::on_devices(*ty, block.clone(), pieces);
        if host_staged {
            slot.host(traffic)?;
            slot.take_pieces();
        }
        arrays.insert(
            name.clone(),
            Held {
                slot,
                sharding: sharding.clone(),
            },
        );
    }
    Ok(())
}
