//! The checks a global program adds (invariant 6 of [`crate::job`]), and the
//! rule for plugin option names. Pure.

use crate::layout::{process_block, MeshAxes};
use crate::program::sharding::Tiling;

use super::ShardingSpec;

/// Plugins that cannot run one program across processes: their clients
/// take no `num_nodes`, and their collectives stay inside one process.
pub const SINGLE_PROCESS_PLUGINS: [&str; 3] = ["cpu", "cpu-lammps", "cpu-fastatomstruct"];

/// The message for a global program on such a plugin with several processes.
pub fn single_process_refusal(plugin: &str) -> String {
    format!(
        "plugin `{plugin}` cannot run one program across processes (its clients take no \
         num_nodes: CPU plugins have no cross-process collectives); run a global program \
         with processes = 1, or per-process programs with all_reduce steps"
    )
}

/// A plugin option's name: 1–64 lowercase letters, digits and `_`, and not
/// one tessel sets itself.
pub fn check_plugin_option_name(name: &str) -> Result<(), String> {
    let good = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if name.is_empty() || name.len() > 64 || !name.chars().all(good) {
        return Err(format!(
            "`{}`: 1-64 lowercase letters, digits or `_`",
            name.escape_debug()
        ));
    }
    if ["num_nodes", "node_id", "cpu_device_count"].contains(&name) {
        return Err(format!(
            "`{name}` is set by tessel for each process (devices_per_process, the job's processes)"
        ));
    }
    Ok(())
}

/// `[lo, hi)` of each dimension of process `p`'s block of an array of
/// `shape` laid out as `sharding`.
fn block(
    mesh: &MeshAxes,
    per_process: usize,
    p: usize,
    shape: &[i64],
    sharding: &ShardingSpec,
) -> Result<Vec<(i64, i64)>, String> {
    let mut ranges: Vec<(i64, i64)> = shape.iter().map(|&d| (0, d)).collect();
    if let ShardingSpec::Split { split, dim } = sharding {
        let k = mesh
            .iter()
            .position(|(a, _)| a == split)
            .ok_or_else(|| format!("unknown mesh axis `{split}`"))?;
        let (first, count) = process_block(mesh, per_process, p, k)?;
        let chunk = shape[*dim] / mesh[k].1 as i64;
        ranges[*dim] = (first as i64 * chunk, (first + count) as i64 * chunk);
    }
    Ok(ranges)
}

/// A global program's parameter (or, with `exact`, result) laid out by
/// `tiling` over the job's devices: every piece a process's devices take
/// must lie inside its block of the array under `sharding` (with `exact`,
/// the pieces must also cover the block: the outputs are all a process
/// keeps).
pub(super) fn check_pieces(
    mesh: &MeshAxes,
    processes: usize,
    per_process: usize,
    shape: &[i64],
    tiling: &Tiling,
    sharding: &ShardingSpec,
    exact: bool,
) -> Result<(), String> {
    for p in 0..processes {
        let ranges = block(mesh, per_process, p, shape, sharding)?;
        let mut starts = std::collections::BTreeSet::new();
        let mut covered = 0i64;
        for q in p * per_process..(p + 1) * per_process {
            let (start, tile) = tiling.tile(shape, q).ok_or_else(|| {
                format!("{shape:?} does not split evenly into {:?}", tiling.tiles)
            })?;
            let inside = (0..shape.len())
                .all(|d| start[d] >= ranges[d].0 && start[d] + tile[d] <= ranges[d].1);
            if !inside {
                let piece: Vec<(i64, i64)> = (0..shape.len())
                    .map(|d| (start[d], start[d] + tile[d]))
                    .collect();
                return Err(format!(
                    "device {q} takes {piece:?}, outside process {p}'s block {ranges:?} ({}); \
                     lay the array out as the program does",
                    sharding.describe()
                ));
            }
            if starts.insert(start) {
                covered += tile.iter().product::<i64>();
            }
        }
        let volume: i64 = ranges.iter().map(|(lo, hi)| hi - lo).product();
        if exact && covered != volume {
            return Err(format!(
                "process {p}'s devices hold {covered} of the {volume} elements of its block ({}); \
                 lay the array out as the program does",
                sharding.describe()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(n: usize) -> Vec<(String, usize)> {
        vec![("data".to_owned(), n)]
    }

    fn rows(n: usize) -> Tiling {
        Tiling {
            tiles: vec![n, 1],
            coords: (0..n).map(|q| vec![q, 0]).collect(),
        }
    }

    #[test]
    fn pieces_must_lie_in_and_cover_each_process_block() {
        let split = ShardingSpec::Split {
            split: "data".into(),
            dim: 0,
        };
        // 2 processes × 2 devices, rows split 4 ways: each process's two
        // devices take its half.
        assert_eq!(
            check_pieces(&mesh(4), 2, 2, &[8, 3], &rows(4), &split, true),
            Ok(())
        );
        // Held whole on every process, the pieces lie inside but a result
        // would not cover it.
        let whole = ShardingSpec::Replicated;
        assert_eq!(
            check_pieces(&mesh(4), 2, 2, &[8, 3], &rows(4), &whole, false),
            Ok(())
        );
        let e = check_pieces(&mesh(4), 2, 2, &[8, 3], &rows(4), &whole, true).unwrap_err();
        assert!(e.contains("hold 12 of the 24"), "{e}");
        // Replicated pieces of a split array fall outside the block.
        let e = check_pieces(
            &mesh(4),
            2,
            2,
            &[8, 3],
            &Tiling::replicated(2, 4),
            &split,
            false,
        )
        .unwrap_err();
        assert!(e.contains("outside process 0's block"), "{e}");
    }

    /// A global step over `data=4`: w replicated, x's rows split.
    const STEP: &str = r#"module @m attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=4]>
  func.func public @main(%arg0: tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>, tf.aliasing_output = 0 : i32}, %arg1: tensor<64x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}) -> (tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) {
    return %arg0 : tensor<8x4xf32>
  }
}
"#;

    fn spec(processes: u32, plugin: &str, x_sharding: &str, extra: &str) -> String {
        format!(
            r#"
name = "g"
processes = {processes}
devices_per_process = {per}
mesh = "data=4"
plugin = "{plugin}"
steps = 2
{extra}
[programs.step]
file = "step.mlir"
global = true

[arrays.w]
dtype = "f32"
shape = [8, 4]

[arrays.x]
dtype = "f32"
shape = [64, 8]
sharding = {x_sharding}

[[plan]]
op = "execute"
program = "step"
inputs = ["w", "x"]
outputs = ["w"]
"#,
            per = 4 / processes
        )
    }

    fn check(text: &str) -> Result<crate::job::ValidatedJob, Vec<crate::job::FieldError>> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("step.mlir"), STEP).unwrap();
        let path = dir.path().join("job.toml");
        std::fs::write(&path, text).unwrap();
        match crate::job::JobSpec::load(&path) {
            Ok(v) => Ok(v),
            Err(crate::job::JobSpecError::Invalid(e)) => Err(e),
            Err(e) => panic!("{e}"),
        }
    }

    const ROWS: &str = r#"{ split = "data", dim = 0 }"#;

    #[test]
    fn a_global_program_takes_global_arrays_laid_out_as_it_splits_them() {
        let v = check(&spec(1, "cpu", ROWS, "")).unwrap();
        assert!(v.spec.programs["step"].global);
        // On a multi-node plugin the same program may span processes.
        check(&spec(2, "cuda", ROWS, "")).unwrap();
        // x held whole by each of 2 processes still contains its pieces...
        check(&spec(2, "cuda", r#""replicated""#, "")).unwrap();
    }

    #[test]
    fn cpu_plugins_refuse_a_global_program_across_processes() {
        for plugin in SINGLE_PROCESS_PLUGINS {
            let e = check(&spec(4, plugin, ROWS, "")).unwrap_err();
            assert!(
                e.iter().any(|e| e.field == "programs.step.global"
                    && e.message
                        .contains("cannot run one program across processes")
                    && e.message.contains("all_reduce")),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_mesh_or_shape_that_does_not_fit_the_job_is_named() {
        let text = spec(1, "cpu", ROWS, "").replace("mesh = \"data=4\"", "mesh = \"model=4\"");
        let text = text.replace(ROWS, r#"{ split = "model", dim = 0 }"#);
        let e = check(&text).unwrap_err();
        assert!(
            e.iter()
                .any(|e| e.message.contains("mesh @mesh is `data=4`")),
            "{e:?}"
        );
        let text = spec(1, "cpu", ROWS, "").replace("shape = [64, 8]", "shape = [32, 8]");
        let e = check(&text).unwrap_err();
        assert!(
            e.iter()
                .any(|e| e.field == "plan[0].inputs[1]" && e.message.contains("globally")),
            "{e:?}"
        );
    }

    #[test]
    fn plugin_options_are_typed_and_named_by_the_rule() {
        let v = check(&spec(
            1,
            "cpu",
            ROWS,
            "[plugin_options]\nmemory_fraction = 0.5\npreallocate = false\nvisible_devices = [0, 1]\nallocator = \"platform\"\n",
        ))
        .unwrap();
        let o = &v.spec.plugin_options;
        use crate::job::PluginOption::*;
        assert_eq!(o["memory_fraction"], Float(0.5));
        assert_eq!(o["preallocate"], Bool(false));
        assert_eq!(o["visible_devices"], Ints(vec![0, 1]));
        assert_eq!(o["allocator"], Text("platform".into()));
        assert_eq!(
            o["memory_fraction"].to_value(),
            tessel_pjrt::Value::Float(0.5)
        );
        let e = check(&spec(1, "cpu", ROWS, "[plugin_options]\nnum_nodes = 2\n")).unwrap_err();
        assert!(
            e.iter().any(|e| e.field == "plugin_options.num_nodes"),
            "{e:?}"
        );
        // The command line's spelling gives the same types.
        let p = crate::job::PluginOption::parse;
        assert_eq!(p("0.5"), Ok(Float(0.5)));
        assert_eq!(p("8"), Ok(Int(8)));
        assert_eq!(p("\"8\""), Ok(Text("8".into())));
        assert_eq!(p("[0,1]"), Ok(Ints(vec![0, 1])));
        assert_eq!(p("true"), Ok(Bool(true)));
        assert_eq!(p("2x1x1"), Ok(Text("2x1x1".into())));
        assert!(p("[0,x]").is_err());
    }

    #[test]
    fn option_names_follow_one_rule() {
        assert!(check_plugin_option_name("memory_fraction").is_ok());
        assert!(check_plugin_option_name("Memory").is_err());
        assert!(check_plugin_option_name("").is_err());
        assert!(check_plugin_option_name("num_nodes")
            .unwrap_err()
            .contains("set by tessel"));
    }
}
