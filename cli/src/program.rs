//! One program on this host: `tessel run`, `plugin info`, `validate`,
//! `compare`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use tessel::array::{format_array, parse_literal, read_npy, write_npy};
use tessel::pjrt::{Client, ClientOptions, HostBuffer, Plugin};
use tessel::program::{run_program, RunRequest};

/// `tessel run`: compile, feed, execute, print (and write) the outputs.
pub(crate) fn run(
    program: &Path,
    plugin: &crate::args::PluginArg,
    devices: Option<usize>,
    partitions: Option<usize>,
    args: &[String],
    out: Option<&Path>,
) -> Result<()> {
    let code =
        std::fs::read(program).with_context(|| format!("cannot read {}", program.display()))?;
    let args = args
        .iter()
        .map(|s| parse_arg(s))
        .collect::<Result<Vec<_>>>()?;
    let loaded = plugin.load()?;
    let request = RunRequest {
        program: code,
        devices,
        partitions,
        args,
        options: plugin.options_with(true)?,
    };
    let outputs =
        run_program(&loaded, &request).with_context(|| format!("running {}", program.display()))?;
    for (i, o) in outputs.iter().enumerate() {
        println!(
            "output {i}: {}{:?} = {}",
            o.element_type(),
            o.dims(),
            format_array(o)
        );
    }
    if let Some(dir) = out {
        write_outputs(dir, &outputs)?;
    }
    Ok(())
}

pub(crate) fn validate_spec(path: &Path) -> Result<()> {
    let v = tessel::job::JobSpec::load(path)?;
    let s = &v.spec;
    if s.is_command() {
        println!(
            "{}: command job `{}` is valid — {} processes ({} per worker) of `{}`, {} files shipped ({} bytes){}",
            path.display(),
            s.name,
            s.processes,
            s.processes_per_worker,
            s.command.join(" "),
            v.files.len(),
            v.files.values().map(Vec::len).sum::<usize>(),
            s.workdir
                .as_ref()
                .map(|d| format!(", runs in {}", d.display()))
                .unwrap_or_default()
        );
        return Ok(());
    }
    println!(
        "{}: job `{}` is valid — {} processes × {} devices, mesh {}, {} steps of {} operations",
        path.display(),
        s.name,
        s.processes,
        s.devices_per_process,
        s.mesh,
        s.steps,
        s.plan.len()
    );
    for (name, t) in &v.local_types {
        println!("  {name}: {t} per process");
    }
    Ok(())
}

pub(crate) fn compare_arrays(a: &Path, b: &Path, atol: f64) -> Result<()> {
    let load = |p: &Path| -> Result<HostBuffer> {
        let data = std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?;
        read_npy(&data).with_context(|| p.display().to_string())
    };
    let (x, y) = (load(a)?, load(b)?);
    if x.element_type() != y.element_type() || x.dims() != y.dims() {
        bail!(
            "{} is {}{:?}, {} is {}{:?}",
            a.display(),
            x.element_type(),
            x.dims(),
            b.display(),
            y.element_type(),
            y.dims()
        );
    }
    let (xs, ys) = (tessel::array::to_f64(&x), tessel::array::to_f64(&y));
    let (mut worst, mut at) = (0.0f64, 0usize);
    for (i, (p, q)) in xs.iter().zip(&ys).enumerate() {
        let d = (p - q).abs();
        if d > worst || d.is_nan() {
            (worst, at) = (d, i);
        }
    }
    let name = a.file_name().unwrap_or_default().to_string_lossy();
    println!(
        "{name}: {}{:?}, max |a - b| = {worst:.3e} (element {at}), tolerance {atol:.1e}",
        x.element_type(),
        x.dims()
    );
    if worst > atol || worst.is_nan() {
        bail!(
            "{} and {} differ by {worst:e} > {atol:e}",
            a.display(),
            b.display()
        );
    }
    Ok(())
}

/// `--arg`: an existing file is read as `.npy`, anything else is a literal.
fn parse_arg(spec: &str) -> Result<HostBuffer> {
    let path = Path::new(spec);
    if path.is_file() {
        let data = std::fs::read(path).with_context(|| format!("cannot read {spec}"))?;
        return read_npy(&data).with_context(|| format!("--arg {spec}"));
    }
    if spec.ends_with(".npy") && !spec.contains('=') {
        bail!("--arg {spec}: no such file");
    }
    parse_literal(spec).with_context(|| format!("--arg {spec}"))
}

fn write_outputs(dir: &Path, outputs: &[HostBuffer]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (i, o) in outputs.iter().enumerate() {
        let path = dir.join(format!("output{i}.npy"));
        std::fs::write(&path, write_npy(o))
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

pub(crate) fn plugin_info(plugin: &Plugin) -> Result<()> {
    let (major, minor) = plugin.api_version();
    println!("plugin      {}", plugin.path().display());
    println!("C API       {major}.{minor}");
    println!("attributes");
    for a in plugin.attributes()? {
        println!("  {:<28} {}", a.name, a.value);
    }
    let client = Client::create(plugin, ClientOptions::default())?;
    println!(
        "platform    {} ({})",
        client.platform_name()?,
        client.platform_version()?
    );
    println!("process     {}", client.process_index()?);
    let devices = client.devices()?;
    let addressable = client.addressable_devices()?.len();
    println!("devices     {} ({addressable} addressable)", devices.len());
    let rows: Vec<[String; 6]> = devices
        .iter()
        .map(|d| -> Result<[String; 6]> {
            let memories: Vec<String> = d
                .memories()?
                .iter()
                .map(|m| m.kind())
                .collect::<Result<_, _>>()?;
            Ok([
                d.id()?.to_string(),
                d.process_index()?.to_string(),
                d.kind()?,
                d.local_hardware_id()?.to_string(),
                memories.join(","),
                d.debug_string()?,
            ])
        })
        .collect::<Result<_>>()?;
    let header = ["ID", "PROCESS", "KIND", "LOCAL", "MEMORIES", "DESCRIPTION"];
    let widths: Vec<usize> = (0..6)
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 6]| {
        let s: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("  {}", s.join("  ").trim_end());
    };
    line(header);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
    }
    for d in &devices {
        let attrs = d.attributes()?;
        if !attrs.is_empty() {
            let list: Vec<String> = attrs
                .iter()
                .map(|a| format!("{}={}", a.name, a.value))
                .collect();
            println!("  device {} attributes: {}", d.id()?, list.join(" "));
        }
    }
    Ok(())
}
