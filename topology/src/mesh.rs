//! Named axes over the global devices.
//!
//! Devices fill the mesh in global-id order, row-major (the last axis
//! varies fastest). Global ids keep a process's devices contiguous, so a
//! host's devices are contiguous along the innermost axis; [`Mesh::new`]
//! refuses shapes where a row of the innermost axis would straddle hosts
//! unevenly, since collectives along that axis would then cross the network
//! for some rows and not others.

use crate::error::{Result, TopologyError};
use crate::types::GlobalTopology;

/// The most devices a mesh (and so a job) may have: 2^20, far beyond any
/// pod, small enough that every product of sizes fits an `i64`.
pub const MAX_DEVICES: usize = 1 << 20;

/// A device mesh: named axes and the device at every position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
    /// Global device ids, row-major over `axes`.
    devices: Vec<u32>,
}

impl Mesh {
    /// Parses `data=4,model=2`; the axes meet [`Mesh::check_axes`].
    pub fn parse_axes(spec: &str) -> Result<Vec<(String, usize)>> {
        let mut axes = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, size) = part.split_once('=').ok_or_else(|| {
                TopologyError::InvalidMesh(format!("`{part}`: expected NAME=SIZE"))
            })?;
            let size: usize = size.trim().parse().map_err(|_| {
                TopologyError::InvalidMesh(format!(
                    "`{part}`: the size is not a number from 1 to {MAX_DEVICES}"
                ))
            })?;
            axes.push((name.trim().to_owned(), size));
        }
        Mesh::check_axes(&axes)?;
        Ok(axes)
    }

    /// Every rule axes meet, checked once here so that no caller forms a
    /// product that wraps or divides by zero; returns the device count.
    ///
    /// 1. At least one axis; each `NAME=SIZE` with NAME a letter or `_`,
    ///    then letters, digits or `_` (at most 64), and SIZE at least 1.
    /// 2. No name twice.
    /// 3. The sizes multiply to at most [`MAX_DEVICES`], checked step by
    ///    step before the product is formed.
    pub fn check_axes(axes: &[(String, usize)]) -> Result<usize> {
        let bad = |m: String| Err(TopologyError::InvalidMesh(m));
        if axes.is_empty() {
            return bad("a mesh needs an axis, e.g. `data=4`".into());
        }
        let mut total: usize = 1;
        for (i, (name, size)) in axes.iter().enumerate() {
            let ident = name.len() <= 64
                && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ident {
                return bad(format!(
                    "axis `{}`: a name is a letter or `_`, then letters, digits or `_` (at most 64)",
                    name.escape_debug()
                ));
            }
            if *size == 0 {
                return bad(format!("axis `{name}` of size 0: at least 1"));
            }
            if axes[..i].iter().any(|(n, _)| n == name) {
                return bad(format!("axis `{name}` named twice"));
            }
            match total.checked_mul(*size).filter(|&t| t <= MAX_DEVICES) {
                Some(t) => total = t,
                None => {
                    return bad(format!(
                        "more than {MAX_DEVICES} devices (the most a job can have) by axis `{name}`"
                    ))
                }
            }
        }
        Ok(total)
    }

    /// A mesh of `axes` over every device of `topology`.
    pub fn new(topology: &GlobalTopology, axes: &[(String, usize)]) -> Result<Mesh> {
        let total = Mesh::check_axes(axes)?;
        let n = topology.devices.len();
        if total != n {
            return Err(TopologyError::InvalidMesh(format!(
                "{} = {total} devices, but the job has {n}",
                axes.iter()
                    .map(|(a, s)| format!("{a}={s}"))
                    .collect::<Vec<_>>()
                    .join(" × ")
            )));
        }
        let inner = axes.last().expect("checked non-empty").1;
        for p in &topology.processes {
            let per_host = p.device_ids.len();
            let fits = per_host == 0 || per_host % inner == 0 || inner % per_host == 0;
            if !fits {
                return Err(TopologyError::InvalidMesh(format!(
                    "the innermost axis has {inner} devices and process {} has {per_host}: \
                     one must divide the other so a host's devices stay together",
                    p.process_index
                )));
            }
        }
        Ok(Mesh {
            axes: axes.to_vec(),
            devices: (0..n as u32).collect(),
        })
    }

    /// The axes (name, size), outermost first.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    /// Global device ids in mesh order (row-major), which is the device
    /// assignment for a compile with `devices().len()` partitions.
    pub fn devices(&self) -> &[u32] {
        &self.devices
    }

    fn axis_index(&self, axis: &str) -> Result<usize> {
        self.axes
            .iter()
            .position(|(a, _)| a == axis)
            .ok_or_else(|| TopologyError::InvalidMesh(format!("no axis `{axis}`")))
    }

    /// The coordinates of the device at mesh position `i`.
    pub fn coords(&self, mut i: usize) -> Vec<usize> {
        let mut c = vec![0; self.axes.len()];
        for (k, (_, size)) in self.axes.iter().enumerate().rev() {
            c[k] = i % size;
            i /= size;
        }
        c
    }

    /// The groups of devices that differ only along `axis` (the cliques of
    /// a collective over that axis), each in axis order.
    pub fn groups_along(&self, axis: &str) -> Result<Vec<Vec<u32>>> {
        let k = self.axis_index(axis)?;
        let mut groups: std::collections::BTreeMap<Vec<usize>, Vec<u32>> = Default::default();
        for (i, &d) in self.devices.iter().enumerate() {
            let mut c = self.coords(i);
            c[k] = 0;
            groups.entry(c).or_default().push(d);
        }
        Ok(groups.into_values().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::tests::local;

    fn topo(processes: u32, per: usize) -> GlobalTopology {
        let locals: Vec<_> = (0..processes)
            .map(|i| local(i, processes, "b", per))
            .collect();
        GlobalTopology::build(processes, &locals).unwrap()
    }

    #[test]
    fn hosts_stay_contiguous_along_the_innermost_axis() {
        let t = topo(4, 2);
        let m = Mesh::new(&t, &Mesh::parse_axes("data=4,model=2").unwrap()).unwrap();
        let model = m.groups_along("model").unwrap();
        assert_eq!(model, vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]);
        for g in &model {
            let hosts: Vec<u32> = g.iter().map(|&d| t.process_of(d).unwrap()).collect();
            assert!(hosts.windows(2).all(|w| w[0] == w[1]), "one host per group");
        }
        let data = m.groups_along("data").unwrap();
        assert_eq!(data, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        assert_eq!(m.coords(5), vec![2, 1]);
    }

    #[test]
    fn bad_meshes_say_why() {
        let t = topo(4, 2);
        for (spec, want) in [
            ("data=3,model=2", "8"),
            ("data=8,data=1", "twice"),
            ("data=0,model=8", "size 0"),
            ("data=4,data=1", "twice"),
            ("data=18446744073709551615", "more than 1048576 devices"),
            ("data=4294967296,model=4294967296", "more than"),
            ("data=-1", "not a number"),
            ("data-parallel=8", "a name is"),
            ("9x=8", "a name is"),
            ("", "needs an axis"),
            (" , ", "needs an axis"),
            ("x=2,model=3", "devices"),
            ("model", "NAME=SIZE"),
        ] {
            let e = Mesh::parse_axes(spec).and_then(|a| Mesh::new(&t, &a));
            let s = e.unwrap_err().to_string();
            assert!(s.contains(want), "{spec}: {s}");
        }
        let t3 = topo(2, 3);
        let e = Mesh::new(&t3, &Mesh::parse_axes("a=3,b=2").unwrap()).unwrap_err();
        assert!(e.to_string().contains("divide"), "{e}");
    }
}
