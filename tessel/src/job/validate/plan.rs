//! The plan's checks (module invariants 3 and 6 of [`crate::job`]): each
//! step in order, with every array's process-local type and layout as the
//! runner will have it at that step.

use std::collections::BTreeMap;

use tessel_pjrt::ElementType;

use super::Validation;
use crate::job::spec::*;
use crate::program::mlir::{Signature, TensorType};

impl Validation {
    /// Invariant 3: the plan's steps in order, twice, with each array's
    /// process-local type as the runner will have it; an error that only
    /// the second pass finds says so.
    pub(super) fn check_plan(&mut self, s: &JobSpec) {
        let mut current = Layouts {
            types: self.local_types.clone(),
            shardings: s
                .arrays
                .iter()
                .map(|(n, a)| (n.clone(), a.sharding.clone()))
                .collect(),
        };
        for (i, step) in s.plan.iter().enumerate() {
            self.check_step(s, i, step, &mut current);
        }
        let first = std::mem::take(&mut self.errors);
        for (i, step) in s.plan.iter().enumerate() {
            self.check_step(s, i, step, &mut current);
        }
        let second = std::mem::replace(&mut self.errors, first);
        for e in second {
            if !self.errors.contains(&e) {
                self.err(
                    e.field,
                    format!(
                        "{} (from the second step on, with the layouts the plan leaves)",
                        e.message
                    ),
                );
            }
        }
    }

    /// One step against `current` (each array's local type at this point
    /// of the plan), which it updates.
    fn check_step(&mut self, s: &JobSpec, i: usize, step: &PlanStep, current: &mut Layouts) {
        let field = format!("plan[{i}]");
        let known = |a: &str| s.arrays.contains_key(a);
        match step {
            PlanStep::Execute {
                program,
                inputs,
                outputs,
            } => {
                if !s.programs.contains_key(program) {
                    self.err(
                        format!("{field}.program"),
                        format!("unknown program `{program}`"),
                    );
                    return;
                }
                let Some(sig) = self.signatures.get(program).cloned() else {
                    return; // its file was already reported
                };
                let global = s.programs[program].global;
                if inputs.len() != sig.parameters.len() {
                    self.err(
                        format!("{field}.inputs"),
                        format!(
                            "`{program}` takes {} parameters, {} given",
                            sig.parameters.len(),
                            inputs.len()
                        ),
                    );
                }
                for (j, (name, param)) in inputs.iter().zip(&sig.parameters).enumerate() {
                    let at = format!("{field}.inputs[{j}]");
                    let got = if BUILTINS.contains(&name.as_str()) {
                        TensorType {
                            element_type: ElementType::S32,
                            dims: vec![],
                        }
                    } else if let (true, Some(t), Some(a)) =
                        (global, current.types.get(name), s.arrays.get(name))
                    {
                        TensorType {
                            element_type: t.element_type,
                            dims: a.shape.clone(),
                        }
                    } else if let Some(t) = current.types.get(name) {
                        t.clone()
                    } else {
                        if !known(name) {
                            self.err(at, format!("unknown array `{name}`"));
                        }
                        continue;
                    };
                    let per = if global { "globally" } else { "per process" };
                    if got != param.ty {
                        self.err(
                            at,
                            format!(
                                "`{name}` is {got} {per}, `{program}` parameter {} ({}) is {}",
                                j, param.name, param.ty
                            ),
                        );
                    } else if global && !BUILTINS.contains(&name.as_str()) {
                        let sharding = current.shardings[name].clone();
                        self.check_global_value(s, &at, &sig, j, false, &param.ty, &sharding);
                    }
                }
                if outputs.len() != sig.results.len() {
                    self.err(
                        format!("{field}.outputs"),
                        format!(
                            "`{program}` returns {} results, {} named",
                            sig.results.len(),
                            outputs.len()
                        ),
                    );
                }
                for (j, (name, result)) in outputs.iter().zip(&sig.results).enumerate() {
                    let at = format!("{field}.outputs[{j}]");
                    let declared = match (global, self.local_types.get(name), s.arrays.get(name)) {
                        (true, Some(t), Some(a)) => Some(TensorType {
                            element_type: t.element_type,
                            dims: a.shape.clone(),
                        }),
                        (_, t, _) => t.cloned(),
                    };
                    let per = if global { "globally" } else { "per process" };
                    match declared {
                        None if !known(name) => self.err(
                            at,
                            format!("unknown array `{name}` (declare it under [arrays])"),
                        ),
                        Some(t) if t != result.ty => self.err(
                            at,
                            format!(
                                "`{name}` is {t} {per}, `{program}` result {j} is {}",
                                result.ty
                            ),
                        ),
                        Some(t) if global => {
                            let sharding = s.arrays[name].sharding.clone();
                            self.check_global_value(s, &at, &sig, j, true, &t, &sharding);
                        }
                        _ => {}
                    }
                    // The runner gives an output its declared sharding.
                    if let (Some(t), Some(a)) = (self.local_types.get(name), s.arrays.get(name)) {
                        current.types.insert(name.clone(), t.clone());
                        current.shardings.insert(name.clone(), a.sharding.clone());
                    }
                }
            }
            PlanStep::AllReduce { array, reduce } => {
                if !known(array) {
                    self.err(format!("{field}.array"), format!("unknown array `{array}`"));
                } else if let Some(t) = self.local_types.get(array) {
                    if let Err(e) = tessel_transfer::reduce::check_reducible(t.element_type) {
                        self.err(format!("{field}.array"), e.to_string());
                    }
                }
                if tessel_transfer::ReduceOp::parse(reduce).is_none() {
                    self.err(
                        format!("{field}.reduce"),
                        format!("unknown reduction `{reduce}` (sum, mean, max, min)"),
                    );
                }
            }
            PlanStep::AllGather { array } => match s.arrays.get(array) {
                None => self.err(format!("{field}.array"), format!("unknown array `{array}`")),
                Some(a) => current.relayout(array, a.shape.clone(), ShardingSpec::Replicated),
            },
            PlanStep::Reshard { array, sharding } => match s.arrays.get(array) {
                None => self.err(format!("{field}.array"), format!("unknown array `{array}`")),
                Some(a) => {
                    let at = format!("{field}.sharding");
                    match self.local_shape(s, &at, &a.shape, sharding) {
                        Some(local) => current.relayout(array, local, sharding.clone()),
                        None => self.err(
                            at,
                            format!("cannot reshard `{array}` to {}", sharding.describe()),
                        ),
                    }
                }
            },
        }
    }
}

/// Each array's process-local type and layout at a point of the plan.
struct Layouts {
    types: BTreeMap<String, TensorType>,
    shardings: BTreeMap<String, ShardingSpec>,
}

impl Layouts {
    /// `array` now has the process-local `dims` (its dtype stays) under
    /// `sharding`.
    fn relayout(&mut self, array: &str, dims: Vec<i64>, sharding: ShardingSpec) {
        if let Some(t) = self.types.get_mut(array) {
            t.dims = dims;
            self.shardings.insert(array.to_owned(), sharding);
        }
    }
}

impl Validation {
    /// A global program's parameter (or result) `j` of type `ty` against
    /// the array's layout `sharding` (invariant 6).
    #[allow(clippy::too_many_arguments)]
    fn check_global_value(
        &mut self,
        s: &JobSpec,
        at: &str,
        sig: &Signature,
        j: usize,
        result: bool,
        ty: &TensorType,
        sharding: &ShardingSpec,
    ) {
        let devices = s.processes as usize * s.devices_per_process as usize;
        let v = if result {
            &sig.results[j]
        } else {
            &sig.parameters[j]
        };
        let tiling = match crate::program::sharding::Tiling::from_annotation(
            v.sharding.as_ref(),
            ty.dims.len(),
            devices,
            &sig.meshes,
        ) {
            Ok(t) => t,
            Err(e) => return self.err(at, e.to_string()),
        };
        if let Err(e) = crate::job::global::check_pieces(
            &self.mesh,
            s.processes as usize,
            s.devices_per_process as usize,
            &ty.dims,
            &tiling,
            sharding,
            result,
        ) {
            self.err(at, e);
        }
    }
}
