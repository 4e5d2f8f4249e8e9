//! One program on this host: `tessel run`, `plugin info`, `validate`,
//! `compare`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use tessel::array::{format_array, parse_literal, read_npy, write_npy};
use tessel::pjrt::{Client, ClientOptions, HostBuffer, Plugin};
use tessel::program::{run_program, RunRequest};

use crate::output::{print_document, print_table, OutputArgs};

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

/// A plugin as `plugin info -o json` shows it (docs/schemas/plugin-info.json).
#[derive(serde::Serialize)]
struct PluginInfo {
    path: String,
    api_version: [i32; 2],
    attributes: BTreeMap<String, String>,
    platform: String,
    platform_version: String,
    process_index: i32,
    addressable_devices: usize,
    devices: Vec<PluginDevice>,
}

#[derive(serde::Serialize)]
struct PluginDevice {
    id: i32,
    process_index: i32,
    kind: String,
    local_hardware_id: i32,
    memories: Vec<String>,
    description: String,
    attributes: BTreeMap<String, String>,
}

/// What the plugin says of itself, then what its client says: `before`
/// sees the first part before the client is created (a plugin that loads
/// but cannot create a client, as libtpu without a TPU, still shows it).
fn describe_plugin(plugin: &Plugin, before: impl FnOnce(&PluginInfo)) -> Result<PluginInfo> {
    let (major, minor) = plugin.api_version();
    let attributes = plugin
        .attributes()?
        .iter()
        .map(|a| (a.name.clone(), a.value.to_string()))
        .collect();
    let mut info = PluginInfo {
        path: plugin.path().display().to_string(),
        api_version: [major, minor],
        attributes,
        platform: String::new(),
        platform_version: String::new(),
        process_index: 0,
        addressable_devices: 0,
        devices: Vec::new(),
    };
    before(&info);
    let client = Client::create(plugin, ClientOptions::default())?;
    let devices = client
        .devices()?
        .iter()
        .map(|d| -> Result<PluginDevice> {
            Ok(PluginDevice {
                id: d.id()?,
                process_index: d.process_index()?,
                kind: d.kind()?,
                local_hardware_id: d.local_hardware_id()?,
                memories: d
                    .memories()?
                    .iter()
                    .map(|m| m.kind())
                    .collect::<Result<_, _>>()?,
                description: d.debug_string()?,
                attributes: d
                    .attributes()?
                    .iter()
                    .map(|a| (a.name.clone(), a.value.to_string()))
                    .collect(),
            })
        })
        .collect::<Result<_>>()?;
    info.platform = client.platform_name()?;
    info.platform_version = client.platform_version()?;
    info.process_index = client.process_index()?;
    info.addressable_devices = client.addressable_devices()?.len();
    info.devices = devices;
    Ok(info)
}

pub(crate) fn plugin_info(plugin: &Plugin, output: OutputArgs) -> Result<()> {
    let info = describe_plugin(plugin, |info| {
        if output.json() {
            return;
        }
        println!("plugin      {}", info.path);
        println!(
            "C API       {}.{}",
            info.api_version[0], info.api_version[1]
        );
        println!("attributes");
        for (name, value) in &info.attributes {
            println!("  {name:<28} {value}");
        }
    })?;
    if output.json() {
        return print_document("PluginInfo", &info);
    }
    println!("platform    {} ({})", info.platform, info.platform_version);
    println!("process     {}", info.process_index);
    println!(
        "devices     {} ({} addressable)",
        info.devices.len(),
        info.addressable_devices
    );
    let rows: Vec<Vec<String>> = info
        .devices
        .iter()
        .map(|d| {
            vec![
                d.id.to_string(),
                d.process_index.to_string(),
                d.kind.clone(),
                d.local_hardware_id.to_string(),
                d.memories.join(","),
                d.description.clone(),
            ]
        })
        .collect();
    print_table(
        &["ID", "PROCESS", "KIND", "LOCAL", "MEMORIES", "DESCRIPTION"],
        &rows,
    );
    for d in &info.devices {
        if !d.attributes.is_empty() {
            let list: Vec<String> = d
                .attributes
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            println!("  device {} attributes: {}", d.id, list.join(" "));
        }
    }
    Ok(())
}
